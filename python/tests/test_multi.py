"""Several at once from Python: ``MultiLock`` (several keys, all or none,
one renewal for all of them, lost when any is lost) and a ``Semaphore``'s
``acquire(permits=k)``. Each test runs on the sync package and on the
asyncio one (the ``api`` fixture); ``r`` looks at the server from the side."""

import pytest

from conftest import commandstat, lock_info


def keys_of(name):
    return [f"{name}:a", f"{name}:b", f"{name}:c"]


def test_every_key_is_taken_with_a_fence_each_and_released_together(api, r, name):
    keys = keys_of(name)
    lock = api.MultiLock(api.client(), keys, timeout=10)
    assert api.run(lock.acquire(blocking=False))
    fences = lock.fences
    assert len(fences) == 3 and fences == sorted(fences) and lock.fence == max(fences)
    for key, fence in zip(keys, fences, strict=True):
        info = lock_info(r, key)
        assert info["fence"] == fence
        assert info["owner"] in (lock.token, lock.token.decode())
    assert api.run(lock.owned()) and api.run(lock.locked())
    api.run(lock.release())
    assert all(lock_info(r, key) is None for key in keys)
    assert lock.fences is None and not api.run(lock.locked())


def test_a_try_with_one_key_held_elsewhere_holds_no_key(api, r, name):
    keys = keys_of(name)
    r.execute_command("LOCK.ACQUIRE", keys[1], "other", 10000)
    lock = api.MultiLock(api.client(), keys, timeout=10)
    assert not api.run(lock.acquire(blocking=False))
    assert lock.not_acquired_reason == "held"
    assert lock_info(r, keys[0]) is None and lock_info(r, keys[2]) is None


def test_a_wait_gets_every_key_once_the_last_is_freed(api, r, name):
    keys = keys_of(name)
    r.execute_command("LOCK.ACQUIRE", keys[2], "other", 10000)
    lock = api.MultiLock(api.client(), keys, timeout=10, thread_local=False)
    waiting = api.spawn(lambda: lock.acquire(blocking_timeout=10))
    api.wait_waiters(r, keys[2], 1)
    assert lock_info(r, keys[0]) is None  # nothing held while it waits
    r.execute_command("LOCK.RELEASE", keys[2], "other")
    waiting.join(10)
    assert waiting.result is True
    assert all(lock_info(r, key) is not None for key in keys)
    api.run(lock.release())
    assert all(lock_info(r, key) is None for key in keys)


def test_locks_on_the_same_keys_in_crossing_orders_both_complete(api, r, name):
    keys = keys_of(name)
    r.execute_command("LOCK.ACQUIRE", keys[0], "other", 10000)
    forward = api.MultiLock(api.client(), keys, timeout=10, thread_local=False)
    backward = api.MultiLock(api.client(), keys[::-1], timeout=10, thread_local=False)
    first = api.spawn(lambda: forward.acquire(blocking_timeout=10))
    api.wait_waiters(r, keys[0], 1)
    second = api.spawn(lambda: backward.acquire(blocking_timeout=10))
    api.wait_waiters(r, keys[0], 2)
    r.execute_command("LOCK.RELEASE", keys[0], "other")
    first.join(10)
    assert first.result is True and second.is_alive()
    api.run(forward.release())
    second.join(10)
    assert second.result is True
    api.run(backward.release())


def test_one_renewal_keeps_every_key_and_a_lost_key_loses_the_lock(api, r, name):
    keys = keys_of(name)
    lock = api.MultiLock(api.client(), keys, timeout=1.5, auto_renewal=True)
    renewals = commandstat(r, "lock.mrenew")
    assert api.run(lock.acquire(blocking=False))
    api.sleep(2.5)
    assert lock.held and all(lock_info(r, key) is not None for key in keys)
    assert commandstat(r, "lock.mrenew") >= renewals + 2
    r.delete(keys[1])
    assert api.wait(lock.lost, 5)
    assert lock.lost_reason == "not-owner" and not lock.held


def test_reentry_counts_on_every_key(api, r, name):
    keys = keys_of(name)
    lock = api.MultiLock(api.client(), keys, timeout=10, thread_local=False)
    assert api.run(lock.acquire(blocking=False))
    # The same token reenters, as a Lock's does: every key counts one more.
    assert api.run(lock.acquire(blocking=False, token=lock.token))
    assert all(lock_info(r, key)["count"] == 2 for key in keys)
    api.run(lock.release())
    assert all(lock_info(r, key)["count"] == 1 for key in keys)
    api.run(lock.release())
    assert all(lock_info(r, key) is None for key in keys)


def test_bad_key_lists_are_refused_before_anything_is_sent(api):
    client = api.client()
    with pytest.raises(ValueError):
        api.MultiLock(client, [])
    with pytest.raises(ValueError):
        api.MultiLock(client, ["a", "b", "a"])
    with pytest.raises(TypeError):
        api.MultiLock(client, "ab")


def test_permits_are_counted_and_a_big_request_is_not_overtaken(api, r, name):
    client = api.client()
    sem = api.Semaphore(client, name, 4, timeout=10)
    first = api.run(sem.acquire(permits=2))
    assert first is not None
    big = api.spawn(lambda: sem.acquire(permits=3, blocking_timeout=10))
    api.wait_waiters(r, name, 1)
    # Two permits are free, but the big request came first.
    assert api.run(sem.acquire(blocking=False)) is None
    small = api.spawn(lambda: sem.acquire(permits=1, blocking_timeout=10))
    api.wait_waiters(r, name, 2)
    api.run(first.release())
    big.join(10)
    small.join(10)
    assert big.result is not None and small.result is not None
    held = sorted(int(h.get("permits", 1)) for h in lock_info(r, name)["holders"])
    assert held == [1, 3]
    api.run(big.result.release())
    api.run(small.result.release())
    assert lock_info(r, name) is None
    with pytest.raises(ValueError):
        api.run(sem.acquire(permits=5))
