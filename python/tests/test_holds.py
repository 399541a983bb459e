"""A hold's own state: its loss belongs to it (another thread's acquire on
the same object never clears it), is raised no later than the server's lease
end whatever the application's threads do, and a release that did not
complete leaves a lock that no longer reports held. ``r`` looks at the
server from the side."""

import threading
import time

import pytest
from redis.backoff import NoBackoff
from redis.exceptions import TimeoutError
from redis.retry import Retry

from conftest import lock_info, wait_until


def test_one_threads_acquire_does_not_clear_anothers_loss(server, r, name):
    # Regression: `lost` was one Event per Lock object, cleared by every fresh
    # acquire; thread A read `lost == False` while thread B held the lock.
    import redislock

    client = server.client()
    lock = redislock.Lock(client, name, timeout=0.6, auto_renewal=True)
    a_lost = threading.Event()
    b_done = threading.Event()
    seen = {}

    def thread_a():
        assert lock.acquire()
        wait_until(lambda: lock.lost.is_set(), 5, "A's loss")
        a_lost.set()
        b_done.wait(10)
        seen["a"] = lock.lost.is_set()

    def thread_b():
        a_lost.wait(10)
        assert lock.acquire(blocking_timeout=5)
        seen["b"] = lock.lost.is_set()
        b_done.set()
        lock.release()

    workers = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for w in workers:
        w.start()
    wait_until(lambda: lock_info(r, name), 5, "A's hold")
    r.delete(name)  # A's hold ends on the server
    for w in workers:
        w.join(15)
    client.close()
    assert seen == {"a": True, "b": False}


def test_a_readers_loss_is_its_own_on_a_shared_read_side(server, r, name):
    import redislock

    client = server.client()
    rw = redislock.ReadWriteLock(client, name, timeout=0.6, auto_renewal=True)
    reader = rw.read_lock()
    a_lost = threading.Event()
    b_done = threading.Event()
    seen = {}

    def thread_a():
        assert reader.acquire()
        wait_until(lambda: reader.lost.is_set(), 5, "A's loss")
        a_lost.set()
        b_done.wait(10)
        seen["a"] = reader.lost.is_set()

    def thread_b():
        a_lost.wait(10)
        assert reader.acquire(blocking_timeout=5)
        seen["b"] = reader.lost.is_set()
        b_done.set()
        reader.release()

    workers = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for w in workers:
        w.start()
    wait_until(lambda: lock_info(r, name), 5, "A's hold")
    r.delete(name)
    for w in workers:
        w.join(15)
    client.close()
    assert seen == {"a": True, "b": False}


def test_loss_is_raised_before_the_server_lease_ends_while_threads_run_python(server, r, name):
    # Regression: the deadline had no drift margin and waited on a timer
    # thread that needs the GIL; `lost` came after another client's grant.
    import redislock

    stop = threading.Event()

    def spin():
        while not stop.is_set():
            sum(range(200))

    spinners = [threading.Thread(target=spin, daemon=True) for _ in range(2)]
    for s in spinners:
        s.start()
    late = []
    trials = 0
    client = server.client()
    try:
        for _attempt in range(6):
            if trials == 3:
                break
            r.delete(name)
            lock = redislock.Lock(client, name, timeout=1.0, auto_renewal=True)
            assert lock.acquire()
            r.execute_command("ACL", "SETUSER", "default", "-lock.renew")  # renewals refused
            ends_ms = r.execute_command("PEXPIRETIME", name)
            if ends_ms < 0:  # a machine so loaded the lease ended already: try again
                r.execute_command("ACL", "SETUSER", "default", "+@all")
                continue
            trials += 1
            lost = lock.lost
            while True:  # the application thread runs Python code
                read_ms = time.time() * 1000
                if lost.is_set():
                    break
                if read_ms > ends_ms:  # read after the server's lease end: too late
                    late.append(read_ms - ends_ms)
                    break
                sum(range(200))
            r.execute_command("ACL", "SETUSER", "default", "+@all")
    finally:
        stop.set()
        r.execute_command("ACL", "SETUSER", "default", "+@all")
        client.close()
    assert trials >= 2, "no trial where the lease outlived the setup"
    assert late == []


def test_loss_reads_as_set_at_the_deadline_even_if_nothing_else_ran(api, r, name):
    lock = api.Lock(api.client(), name, timeout=0.3, auto_renewal=False)
    assert api.run(lock.acquire())
    lost = lock.lost
    assert not lost.is_set()
    time.sleep(0.35)  # blocks an event loop too: no timer or task runs meanwhile
    assert lost.is_set()
    assert not lock.held
    assert lock.lost_reason == "expired"


def test_a_release_that_did_not_complete_is_a_loss_retried_in_the_background(
    server, r, name
):
    import redislock

    # No retries by the client: the release's one attempt times out.
    client = server.client(socket_timeout=0.2, retry=Retry(NoBackoff(), 0))
    lock = redislock.Lock(client, name, timeout=10)
    assert lock.acquire()
    r.execute_command("CLIENT", "PAUSE", 2500, "WRITE")
    try:
        with pytest.raises(TimeoutError):
            lock.release()
        assert lock.lost.is_set() and lock.lost_reason == "release-unconfirmed"
        assert not lock.held
    finally:
        r.execute_command("CLIENT", "UNPAUSE")
    wait_until(lambda: lock_info(r, name) is None, 5, "the release retried")
    client.close()


def test_a_cancelled_release_is_a_loss_retried_in_the_background(server, r, name):
    import asyncio

    import redis.asyncio

    import redislock.asyncio

    async def main():
        client = redis.asyncio.Redis(host="127.0.0.1", port=server.port)
        lock = redislock.asyncio.Lock(client, name, timeout=10)
        assert await lock.acquire()
        await asyncio.to_thread(r.execute_command, "CLIENT", "PAUSE", 2000, "WRITE")
        releasing = asyncio.create_task(lock.release())
        await asyncio.sleep(0.2)
        releasing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await releasing
        assert lock.lost.is_set() and lock.lost_reason == "release-unconfirmed"
        assert not lock.held
        await asyncio.to_thread(r.execute_command, "CLIENT", "UNPAUSE")
        deadline = time.monotonic() + 5
        while lock_info(r, name) is not None:
            assert time.monotonic() < deadline, "the release was not retried"
            await asyncio.sleep(0.02)
        await client.aclose()

    asyncio.run(main())


def test_a_lease_of_2_to_the_40_ms_holds_without_overflow(api, r, name):
    lock = api.Lock(api.client(), name, timeout=2**40 / 1000, auto_renewal=True)
    assert api.run(lock.acquire())
    assert lock.held and not lock.lost.is_set()
    assert lock_info(r, name)["ttl"] > 2**39
    api.run(lock.release())
    assert lock_info(r, name) is None


def test_an_ephemeral_release_that_did_not_complete_is_a_loss_and_ends_the_hold(server, r, name):
    import redislock

    client = server.client(socket_timeout=0.2)
    lock = redislock.Lock(client, name, timeout=10, ephemeral=True)
    assert lock.acquire()
    r.execute_command("CLIENT", "PAUSE", 1500, "WRITE")
    try:
        with pytest.raises(TimeoutError):
            lock.release()  # on the hold's own connection, which times out
        assert lock.lost.is_set() and lock.lost_reason == "release-unconfirmed"
        assert not lock.held
    finally:
        r.execute_command("CLIENT", "UNPAUSE")
    # Its connection is closed: the server ends the hold.
    wait_until(lambda: lock_info(r, name) is None, 5, "the hold ended")
    client.close()
