"""What redislock.Lock adds to redis-py's Lock, and how it waits."""

import threading
import time

import pytest
import redis

from redislock import Lock, LockError, LockNotOwnedError, ModuleNotLoadedError

from conftest import commandstat, in_thread, lock_info, wait_until, wait_waiters


# -- fences ------------------------------------------------------------------


def test_fence_rises_with_each_fresh_acquisition(r, name):
    lock = Lock(r, name, timeout=10)
    assert lock.fence is None
    fences = []
    for _ in range(5):
        assert lock.acquire()
        fences.append(lock.fence)
        assert lock_info(r, name)["fence"] == lock.fence
        lock.release()
        assert lock.fence is None
    assert all(isinstance(f, int) and f > 0 for f in fences)
    assert fences == sorted(set(fences)), fences


def test_fence_of_a_hand_off_is_above_the_previous_holders(r, name):
    first = Lock(r, name, timeout=10)
    second = Lock(r, name, timeout=10, thread_local=False)  # acquired in a thread
    first.acquire()
    waiter = in_thread(second.acquire)
    wait_waiters(r, name, 1)
    held_fence = first.fence
    first.release()
    waiter.join(5)
    assert waiter.result is True
    assert second.fence > held_fence


# -- reentrancy ----------------------------------------------------------------


def test_same_token_reenters_and_each_release_undoes_one(r, name):
    lock = Lock(r, name, timeout=10)
    assert lock.acquire(token="me")
    fence = lock.fence
    assert lock.acquire(token="me", blocking=False)
    assert lock.fence == fence  # a reentry issues no new fence
    assert lock_info(r, name)["count"] == 2
    # Another instance with the same token reenters too (the server counts).
    twin = Lock(r, name, timeout=10)
    assert twin.acquire(token="me")
    assert twin.fence == fence
    assert lock_info(r, name)["count"] == 3
    twin.release()
    lock.release()
    assert lock.owned() and lock.fence == fence
    assert lock_info(r, name)["count"] == 1
    lock.release()
    assert not lock.locked()
    assert lock.token is None
    with pytest.raises(LockError):
        lock.release()


def test_a_fresh_token_does_not_reenter(r, name):
    lock = Lock(r, name, timeout=10)
    assert lock.acquire(token="me")
    other = Lock(r, name, timeout=10)
    assert not other.acquire(blocking=False)
    assert not other.acquire(token="you", blocking=False)


# -- waiting in the server's queue ---------------------------------------------


def test_waiters_are_served_in_arrival_order(r, name):
    holder = Lock(r, name, timeout=10)
    holder.acquire()
    order, fences = [], []
    guard = threading.Lock()

    def waiter(i):
        def body():
            lock = Lock(r, name, timeout=10)
            assert lock.acquire(blocking_timeout=10)
            with guard:
                order.append(i)
                fences.append(lock.fence)
            lock.release()
            return True

        return body

    threads = []
    for i in range(6):
        threads.append(in_thread(waiter(i)))
        wait_waiters(r, name, i + 1)  # i + 1 queued: arrival order is known
    holder.release()
    for t in threads:
        t.join(10)
        assert t.result is True, t.result
    assert order == list(range(6))
    assert fences == sorted(fences)
    # One acquisition command each: nobody polled.
    assert commandstat(r, "lock.acquire") == 7


def test_a_blocking_timeout_is_one_wait_of_that_length(r, name):
    holder = Lock(r, name, timeout=10)
    holder.acquire()
    timeouts = int(r.info("lock")["lock_wait_timeouts"])  # CONFIG RESETSTAT keeps it
    lock = Lock(r, name, timeout=10, blocking_timeout=0.3)
    start = time.monotonic()
    assert not lock.acquire()
    elapsed = time.monotonic() - start
    assert 0.29 <= elapsed < 1.5, elapsed
    assert commandstat(r, "lock.acquire") == 2
    assert int(r.info("lock")["lock_wait_timeouts"]) == timeouts + 1
    # blocking_timeout=0 (as in redis-py) is a single attempt.
    start = time.monotonic()
    assert not lock.acquire(blocking_timeout=0)
    assert time.monotonic() - start < 0.2


def test_a_wait_outlives_the_clients_socket_timeout(server, r, name):
    """redis-py 8 defaults socket_timeout to 5 s; a wait must not be cut (and
    requeued) by it. Here socket_timeout is 0.3 s and the wait lasts ~1 s."""
    client = server.client(socket_timeout=0.3)
    holder = Lock(client, name, timeout=10)
    holder.acquire()
    for blocking_timeout in (5, None):
        lock = Lock(client, name, timeout=10, blocking_timeout=blocking_timeout,
                    thread_local=False)  # acquired in a thread, released here
        waiter = in_thread(lock.acquire)
        wait_waiters(r, name, 1)
        time.sleep(1.0)  # three socket timeouts
        assert lock_info(r, name)["waiters"] == 1  # still queued, never re-sent
        holder.release()
        waiter.join(5)
        assert waiter.result is True, waiter.result
        holder = lock
    assert commandstat(r, "lock.acquire") == 3


def test_an_acquire_that_fails_after_its_grant_leaves_nothing_held(server, r, name):
    """The grant's reply is held back (a slow command pipelined after the
    release that handed the lock over) past the waiting acquire's read
    timeout: acquire raises, and the hold it was granted must not outlive it
    (nobody would know its token to release it)."""
    holder = Lock(r, name, timeout=10)
    holder.acquire()
    client = server.client(socket_timeout=0.5)
    lock = Lock(client, name, timeout=10, blocking_timeout=0.3, thread_local=False)
    waiter = in_thread(lock.acquire)  # reads its reply for 0.3 + 0.5 s at most
    wait_waiters(r, name, 1)
    handover = r.pipeline(transaction=False)
    handover.execute_command("LOCK.RELEASE", name, holder.token)
    handover.execute_command("DEBUG", "SLEEP", 1.0)
    handover.execute()
    waiter.join(5)
    assert isinstance(waiter.result, redis.exceptions.TimeoutError), waiter.result
    assert lock.token is None
    assert lock_info(r, name) is None


def test_a_blocking_acquire_on_a_value_of_another_type_waits_until_it_is_gone(r, name):
    """In redis-py's terms a key holding anything is a taken lock: a blocking
    acquire keeps trying (every ``sleep``) instead of failing on WRONGTYPE."""
    r.set(name, "x")
    lock = Lock(r, name, timeout=10, sleep=0.02, thread_local=False)
    waiter = in_thread(lambda: lock.acquire(blocking_timeout=10))
    wait_until(lambda: commandstat(r, "lock.acquire") >= 2 or not waiter.is_alive(),
               what="a second try")
    assert waiter.is_alive(), waiter.result
    r.delete(name)
    waiter.join(5)
    assert waiter.result is True, waiter.result
    assert lock.owned()
    lock.release()


def test_lease_is_the_timeout(r, name):
    lock = Lock(r, name, timeout=2.5)
    lock.acquire()
    assert 2000 < r.pttl(name) <= 2500
    assert 2000 < lock_info(r, name)["ttl"] <= 2500


def test_no_timeout_means_a_renewed_lease(r, name):
    """redis-py's timeout=None never expires; ours holds a lease of
    no_timeout_lease seconds (30 by default) renewed every third of it."""
    lock = Lock(r, name)
    lock.acquire()
    assert 29000 < r.pttl(name) <= 30000
    lock.release()
    lock.no_timeout_lease = 0.6
    lock.acquire()
    time.sleep(1.5)  # two and a half leases
    assert lock.owned() and not lock.lost.is_set()
    assert commandstat(r, "lock.renew") >= 3
    lock.release()


# -- errors --------------------------------------------------------------------


def test_release_by_another_owner_is_refused(r, name):
    lock, thief = Lock(r, name, timeout=10), Lock(r, name, timeout=10)
    lock.acquire()
    r.delete(name)
    thief.acquire()
    with pytest.raises(LockNotOwnedError):
        lock.release()
    assert thief.owned()
    assert lock_info(r, name)["count"] == 1


def test_a_server_without_the_module_gives_a_clear_error(bare_server, name):
    client = bare_server.client()
    lock = Lock(client, name, timeout=10)
    for call in (
        lambda: lock.acquire(blocking=False),
        lambda: lock.acquire(blocking_timeout=1),
        lock.acquire,
        lock.locked,
    ):
        with pytest.raises(ModuleNotLoadedError) as caught:
            call()
        assert isinstance(caught.value, LockError)
        assert "module" in str(caught.value)


def test_replica_sees_the_hold_and_refuses_to_grant(replica_pair, name):
    master, replica = replica_pair
    m, s = master.client(), replica.client()
    lock = Lock(m, name, timeout=10)
    lock.acquire()
    assert m.execute_command("WAIT", 1, 5000) == 1
    on_replica = Lock(s, name, timeout=10)
    assert on_replica.locked()
    assert lock_info(s, name)["fence"] == lock.fence
    assert lock_info(s, name)["owner"] == lock.token
    with pytest.raises(redis.exceptions.ReadOnlyError):
        on_replica.acquire(blocking=False)
    with pytest.raises(redis.exceptions.ReadOnlyError):
        on_replica.acquire(blocking_timeout=1)
    lock.release()
    wait_until(lambda: not on_replica.locked(), what="release replicated")
