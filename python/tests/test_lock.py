"""What redislock's Lock adds to redis-py's Lock, and how it waits: each test
runs on the sync lock and on the asyncio one (the ``api`` fixture). ``r`` is a
sync client that looks at the server from the side."""

import time

import pytest
import redis

from conftest import commandstat, lock_info
from redislock import LockError, LockNotOwnedError, ModuleNotLoadedError

# -- fences ------------------------------------------------------------------


def test_fence_rises_with_each_fresh_acquisition(api, r, name):
    lock = api.Lock(api.client(), name, timeout=10)
    assert lock.fence is None
    fences = []
    for _ in range(5):
        assert api.run(lock.acquire())
        fences.append(lock.fence)
        assert lock_info(r, name)["fence"] == lock.fence
        api.run(lock.release())
        assert lock.fence is None
    assert all(isinstance(f, int) and f > 0 for f in fences)
    assert fences == sorted(set(fences)), fences


def test_fence_of_a_hand_off_is_above_the_previous_holders(api, r, name):
    client = api.client()
    first = api.Lock(client, name, timeout=10)
    second = api.Lock(client, name, timeout=10, thread_local=False)  # acquired in the background
    api.run(first.acquire())
    waiter = api.spawn(second.acquire)
    api.wait_waiters(r, name, 1)
    held_fence = first.fence
    api.run(first.release())
    waiter.join(5)
    assert waiter.result is True
    assert second.fence > held_fence


# -- reentrancy ----------------------------------------------------------------


def test_same_token_reenters_and_each_release_undoes_one(api, r, name):
    client = api.client()
    lock = api.Lock(client, name, timeout=10)
    assert api.run(lock.acquire(token="me"))
    fence = lock.fence
    assert api.run(lock.acquire(token="me", blocking=False))
    assert lock.fence == fence  # a reentry issues no new fence
    assert lock_info(r, name)["count"] == 2
    # Another instance with the same token reenters too (the server counts).
    twin = api.Lock(client, name, timeout=10)
    assert api.run(twin.acquire(token="me"))
    assert twin.fence == fence
    assert lock_info(r, name)["count"] == 3
    api.run(twin.release())
    api.run(lock.release())
    assert api.run(lock.owned()) and lock.fence == fence
    assert lock_info(r, name)["count"] == 1
    api.run(lock.release())
    assert not api.run(lock.locked())
    assert lock.token is None
    with pytest.raises(LockError):
        api.run(lock.release())


def test_a_fresh_token_does_not_reenter(api, name):
    client = api.client()
    lock = api.Lock(client, name, timeout=10)
    assert api.run(lock.acquire(token="me"))
    other = api.Lock(client, name, timeout=10)
    assert not api.run(other.acquire(blocking=False))
    assert not api.run(other.acquire(token="you", blocking=False))


# -- waiting in the server's queue ---------------------------------------------


def test_waiters_are_served_in_arrival_order(api, r, name):
    client = api.client()
    holder = api.Lock(client, name, timeout=10)
    api.run(holder.acquire())
    order, fences = [], []

    def waiter(i):
        lock = api.Lock(client, name, timeout=10)

        def record():
            order.append(i)
            fences.append(lock.fence)

        # Each waiter releases as soon as it is served, in the background.
        return api.spawn(lambda: lock.acquire(blocking_timeout=10), record, lock.release)

    waiters = []
    for i in range(6):
        waiters.append(waiter(i))
        api.wait_waiters(r, name, i + 1)  # i + 1 queued: arrival order is known
    api.run(holder.release())
    for w in waiters:
        w.join(10)
        assert not w.is_alive() and w.result is None, w.result  # released without error
    assert order == list(range(6))
    assert fences == sorted(fences)
    # One acquisition command each: nobody polled.
    assert commandstat(r, "lock.acquire") == 7


def test_a_blocking_timeout_is_one_wait_of_that_length(api, r, name):
    client = api.client()
    holder = api.Lock(client, name, timeout=10)
    api.run(holder.acquire())
    timeouts = int(r.info("lock")["lock_wait_timeouts"])  # CONFIG RESETSTAT keeps it
    lock = api.Lock(client, name, timeout=10, blocking_timeout=0.3)
    start = time.monotonic()
    assert not api.run(lock.acquire())
    elapsed = time.monotonic() - start
    assert 0.29 <= elapsed < 1.5, elapsed
    assert commandstat(r, "lock.acquire") == 2
    assert int(r.info("lock")["lock_wait_timeouts"]) == timeouts + 1
    # blocking_timeout=0 (as in redis-py) is a single attempt.
    start = time.monotonic()
    assert not api.run(lock.acquire(blocking_timeout=0))
    assert time.monotonic() - start < 0.2


def test_a_wait_outlives_the_clients_socket_timeout(api, r, name):
    """redis-py 8 defaults socket_timeout to 5 s; a wait must not be cut (and
    requeued) by it. Here socket_timeout is 0.3 s and the wait lasts ~1 s."""
    client = api.client(socket_timeout=0.3)
    holder = api.Lock(client, name, timeout=10)
    api.run(holder.acquire())
    for blocking_timeout in (5, None):
        lock = api.Lock(client, name, timeout=10, blocking_timeout=blocking_timeout,
                        thread_local=False)  # acquired in the background, released here
        waiter = api.spawn(lock.acquire)
        api.wait_waiters(r, name, 1)
        api.sleep(1.0)  # three socket timeouts
        assert lock_info(r, name)["waiters"] == 1  # still queued, never re-sent
        api.run(holder.release())
        waiter.join(5)
        assert waiter.result is True, waiter.result
        holder = lock
    assert commandstat(r, "lock.acquire") == 3


def test_an_acquire_that_fails_after_its_grant_leaves_nothing_held(api, r, name):
    """The grant's reply is held back (a slow command pipelined after the
    release that handed the lock over) past the waiting acquire's read
    timeout: acquire raises, and the hold it was granted must not outlive it
    (nobody would know its token to release it)."""
    holder = api.Lock(api.client(), name, timeout=10)
    api.run(holder.acquire())
    client = api.client(socket_timeout=0.5)
    lock = api.Lock(client, name, timeout=10, blocking_timeout=0.3, thread_local=False)
    waiter = api.spawn(lock.acquire)  # reads its reply for 0.3 + 0.5 s at most
    api.wait_waiters(r, name, 1)
    handover = r.pipeline(transaction=False)
    handover.execute_command("LOCK.RELEASE", name, holder.token)
    handover.execute_command("DEBUG", "SLEEP", 1.0)
    api.blocking(handover.execute)
    waiter.join(5)
    assert isinstance(waiter.result, redis.exceptions.TimeoutError), waiter.result
    assert lock.token is None
    # Released in the background, long before the 10 s lease would end.
    api.wait_until(lambda: lock_info(r, name) is None, 3, "the grant released")


def test_a_blocking_acquire_on_a_value_of_another_type_waits_until_it_is_gone(api, r, name):
    """In redis-py's terms a key holding anything is a taken lock: a blocking
    acquire keeps trying (every ``sleep``) instead of failing on WRONGTYPE."""
    r.set(name, "x")
    lock = api.Lock(api.client(), name, timeout=10, sleep=0.02, thread_local=False)
    waiter = api.spawn(lambda: lock.acquire(blocking_timeout=10))
    api.wait_until(lambda: commandstat(r, "lock.acquire") >= 2 or not waiter.is_alive(),
                   what="a second try")
    assert waiter.is_alive(), waiter.result
    r.delete(name)
    waiter.join(5)
    assert waiter.result is True, waiter.result
    assert api.run(lock.owned())
    api.run(lock.release())


def test_lease_is_the_timeout(api, r, name):
    lock = api.Lock(api.client(), name, timeout=2.5)
    api.run(lock.acquire())
    assert 2000 < r.pttl(name) <= 2500
    assert 2000 < lock_info(r, name)["ttl"] <= 2500


def test_no_timeout_means_a_renewed_lease(api, r, name):
    """redis-py's timeout=None never expires; ours holds a lease of
    no_timeout_lease seconds (30 by default) renewed every third of it."""
    lock = api.Lock(api.client(), name)
    api.run(lock.acquire())
    assert 29000 < r.pttl(name) <= 30000
    api.run(lock.release())
    lock.no_timeout_lease = 0.6
    api.run(lock.acquire())
    api.sleep(1.5)  # two and a half leases
    assert api.run(lock.owned()) and not lock.lost.is_set()
    assert commandstat(r, "lock.renew") >= 3
    api.run(lock.release())


# -- errors --------------------------------------------------------------------


def test_release_by_another_owner_is_refused(api, r, name):
    client = api.client()
    lock, thief = api.Lock(client, name, timeout=10), api.Lock(client, name, timeout=10)
    api.run(lock.acquire())
    r.delete(name)
    api.run(thief.acquire())
    with pytest.raises(LockNotOwnedError):
        api.run(lock.release())
    assert api.run(thief.owned())
    assert lock_info(r, name)["count"] == 1


def test_a_server_without_the_module_gives_a_clear_error(api, bare_server, name):
    lock = api.Lock(api.client(bare_server), name, timeout=10)
    for call in (
        lambda: lock.acquire(blocking=False),
        lambda: lock.acquire(blocking_timeout=1),
        lock.acquire,
        lock.locked,
    ):
        with pytest.raises(ModuleNotLoadedError) as caught:
            api.run(call())
        assert isinstance(caught.value, LockError)
        assert "module" in str(caught.value)


def test_replica_sees_the_hold_and_refuses_to_grant(api, replica_pair, name):
    master, replica = replica_pair
    s = replica.client()
    lock = api.Lock(api.client(master), name, timeout=10)
    api.run(lock.acquire())
    # WAIT counts the writes of its own connection, and the acquire had one
    # of its own: watch the replica instead.
    api.wait_until(lambda: lock_info(s, name) is not None, what="the hold replicated")
    on_replica = api.Lock(api.client(replica), name, timeout=10)
    assert api.run(on_replica.locked())
    assert lock_info(s, name)["fence"] == lock.fence
    assert lock_info(s, name)["owner"] == lock.token
    with pytest.raises(redis.exceptions.ReadOnlyError):
        api.run(on_replica.acquire(blocking=False))
    with pytest.raises(redis.exceptions.ReadOnlyError):
        api.run(on_replica.acquire(blocking_timeout=1))
    api.run(lock.release())
    api.wait_until(lambda: not api.run(on_replica.locked()), what="release replicated")
