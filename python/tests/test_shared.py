"""Shared holds from Python: ``ReadWriteLock`` (read and write sides shaped
like ``Lock``) and ``Semaphore`` (permits with their own fence, renewal and
``lost``). Each test runs on the sync package and on the asyncio one (the
``api`` fixture); ``r`` looks at the server from the side."""

import time

import pytest
from redis.exceptions import ResponseError

from conftest import lock_info


def holders(r, name):
    info = lock_info(r, name)
    return [] if info is None else [h["owner"] for h in info["holders"]]


# -- read-write lock -------------------------------------------------------------


def test_readers_share_and_a_writer_waits_for_all_of_them(api, r, name):
    rw = api.ReadWriteLock(api.client(), name, timeout=10, thread_local=False)
    other = api.ReadWriteLock(api.client(), name, timeout=10, thread_local=False)
    assert api.run(rw.read_lock().acquire())
    assert api.run(other.read_lock().acquire(blocking=False))
    info = lock_info(r, name)
    assert info["mode"] in (b"shared", "shared") and info["count"] == 2
    read_fences = [rw.read_lock().fence, other.read_lock().fence]
    assert read_fences[0] != read_fences[1]
    # The writer finds readers: nothing at once, then it waits for both.
    writer = api.ReadWriteLock(api.client(), name, timeout=10, thread_local=False)
    assert not api.run(writer.write_lock().acquire(blocking=False))
    waiting = api.spawn(writer.write_lock().acquire)
    api.wait_waiters(r, name, 1)
    api.run(rw.read_lock().release())
    assert waiting.is_alive()  # one reader still holds
    api.run(other.read_lock().release())
    waiting.join(5)
    assert waiting.result is True
    assert writer.write_lock().fence > max(read_fences)
    assert lock_info(r, name)["mode"] in (b"exclusive", "exclusive")
    api.run(writer.write_lock().release())
    assert lock_info(r, name) is None


def test_a_reader_behind_a_waiting_writer_waits_behind_it(api, r, name):
    client = api.client()
    first = api.ReadWriteLock(client, name, timeout=10, thread_local=False)
    writer = api.ReadWriteLock(client, name, timeout=10, thread_local=False)
    late = api.ReadWriteLock(client, name, timeout=10, thread_local=False)
    assert api.run(first.read_lock().acquire())
    w = api.spawn(writer.write_lock().acquire)
    api.wait_waiters(r, name, 1)
    # No barging past the writer, even though only readers hold.
    assert not api.run(late.read_lock().acquire(blocking=False))
    reader = api.spawn(late.read_lock().acquire)
    api.wait_waiters(r, name, 2)
    api.run(first.read_lock().release())
    w.join(5)
    assert w.result is True and reader.is_alive()
    writer_fence = writer.write_lock().fence
    api.run(writer.write_lock().release())
    reader.join(5)
    assert reader.result is True
    assert late.read_lock().fence > writer_fence
    api.run(late.read_lock().release())


def test_the_writer_may_read_and_a_reader_may_not_upgrade(api, r, name):
    rw = api.ReadWriteLock(api.client(), name, timeout=10)
    assert api.run(rw.write_lock().acquire(token="me"))
    fence = rw.write_lock().fence
    assert api.run(rw.read_lock().acquire(token="me", blocking=False))
    assert rw.read_lock().fence == fence  # a reentry of the exclusive hold
    assert lock_info(r, name)["count"] == 2
    api.run(rw.read_lock().release())
    api.run(rw.write_lock().release())
    assert lock_info(r, name) is None

    assert api.run(rw.read_lock().acquire(token="reader"))
    with pytest.raises(ResponseError):
        api.run(rw.write_lock().acquire(token="reader", blocking=False))
    assert holders(r, name) == [b"reader"]
    api.run(rw.read_lock().release())


def test_read_lock_context_manager_and_owned(api, r, name):
    rw = api.ReadWriteLock(api.client(), name, timeout=10)
    read = rw.read_lock()
    with api.entered(read):
        assert api.run(read.owned())
        assert api.run(read.locked())
        assert api.run(read.extend(5))  # adds to this reader's own lease
        assert lock_info(r, name)["holders"][0]["ttl"] > 10_000
    assert lock_info(r, name) is None


# -- semaphore ---------------------------------------------------------------------


def test_a_semaphore_holds_at_most_its_limit_and_serves_in_order(api, r, name):
    client = api.client()
    sem = api.Semaphore(client, name, 2, timeout=10)
    a = api.run(sem.acquire())
    b = api.run(sem.acquire())
    assert a is not None and b is not None and a.fence != b.fence
    assert api.run(sem.acquire(blocking=False)) is None
    waiter = api.spawn(sem.acquire)
    api.wait_waiters(r, name, 1)
    assert lock_info(r, name)["limit"] == 2
    api.run(a.release())
    waiter.join(5)
    c = waiter.result
    assert c is not None and c.fence > b.fence
    assert sorted(holders(r, name)) == sorted([b.token, c.token])
    for permit in (b, c):
        api.run(permit.release())
    assert lock_info(r, name) is None


def test_a_permit_is_a_context_manager_and_renews_itself(api, r, name):
    sem = api.Semaphore(api.client(), name, 3, timeout=0.3, auto_renewal=True)
    permit = api.run(sem.acquire())
    with api.entered(permit) as held:
        assert held is permit
        api.sleep(0.8)  # past two leases: renewed, not lost
        assert not permit.lost.is_set()
        assert holders(r, name) == [permit.token]
    assert lock_info(r, name) is None


def test_a_permit_whose_hold_is_gone_reports_the_loss(api, r, name):
    sem = api.Semaphore(api.client(), name, 3, timeout=0.3, auto_renewal=True)
    permit = api.run(sem.acquire())
    r.execute_command("LOCK.RELEASE", name, permit.token)  # someone ends it
    assert api.wait(permit.lost, 2)


def test_limits_are_checked_before_and_by_the_server(api, r, name):
    client = api.client()
    for bad in (0, -1, 1_000_001, 2.5, True, "3"):
        with pytest.raises(ValueError):
            api.Semaphore(client, name, bad)
    held = api.run(api.Semaphore(client, name, 2, timeout=10).acquire())
    # Another limit while permits are held: an error, nothing changes.
    with pytest.raises(ResponseError):
        api.run(api.Semaphore(client, name, 3, timeout=10).acquire(blocking=False))
    assert holders(r, name) == [held.token]
    api.run(held.release())
    # Free again: a new limit may be used.
    fresh = api.run(api.Semaphore(client, name, 3, timeout=10).acquire())
    assert lock_info(r, name)["limit"] == 3
    api.run(fresh.release())


# -- one owner for both sides of a handle ------------------------------------------


def test_the_writer_may_take_the_read_side(api, r, name):
    # Regression: the two sides had separate tokens, so the writer's read
    # waited behind its own write hold.
    rw = api.ReadWriteLock(api.client(), name, timeout=10)
    with api.entered(rw.write_lock()):
        assert api.run(rw.read_lock().acquire(blocking_timeout=2))
        assert lock_info(r, name)["count"] == 2
        api.run(rw.read_lock().release())
    assert lock_info(r, name) is None


def test_a_reader_asking_for_the_write_side_is_refused_at_once(api, r, name):
    rw = api.ReadWriteLock(api.client(), name, timeout=10)
    with api.entered(rw.read_lock()):
        started = time.monotonic()
        with pytest.raises(ResponseError) as refused:
            api.run(rw.write_lock().acquire(blocking_timeout=2))
        assert type(refused.value).__name__ == "LockUpgradeError"
        assert time.monotonic() - started < 1
        assert lock_info(r, name)["waiters"] == 0
    assert lock_info(r, name) is None
