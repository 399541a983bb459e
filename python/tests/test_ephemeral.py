"""Ephemeral holds from Python: ``Lock(..., ephemeral=True)`` takes the hold
on a connection of its own, kept out of the pool for the hold's life; the
server ends the hold when that connection closes, and ``lost`` fires. Each
test runs on the sync package and on the asyncio one."""

from conftest import lock_info


def hold_connections(r):
    """Client ids of connections whose last command was a lock command
    other than LOCK.INFO (the hold's own connection acquires and renews)."""
    return [
        c["id"]
        for c in r.client_list()
        if c.get("cmd") in ("lock.acquire", "lock.renew")
    ]


def test_a_closed_hold_connection_ends_the_hold_and_fires_lost(api, r, name):
    lock = api.Lock(api.client(), name, timeout=0.6, auto_renewal=True, ephemeral=True)
    assert api.run(lock.acquire())
    info = lock_info(r, name)
    assert info["holders"][0]["ephemeral"] == 1
    ids = hold_connections(r)
    assert len(ids) == 1, ids
    r.client_kill_filter(_id=ids[0])
    assert lock_info(r, name) is None  # ended at once, not at the lease end
    assert api.wait(lock.lost, 2)


def test_release_gives_the_connection_back_and_the_lock_is_free(api, r, name):
    client = api.client()
    lock = api.Lock(client, name, timeout=10, ephemeral=True)
    for _ in range(3):
        assert api.run(lock.acquire())
        assert lock_info(r, name)["holders"][0]["ephemeral"] == 1
        api.run(lock.release())
        assert lock_info(r, name) is None
    assert not lock.lost.is_set()


def test_a_reentry_keeps_the_first_connection(api, r, name):
    lock = api.Lock(api.client(), name, timeout=10, ephemeral=True)
    assert api.run(lock.acquire(token="me"))
    first = hold_connections(r)
    assert api.run(lock.acquire(token="me", blocking=False))
    assert lock_info(r, name)["count"] == 2
    api.run(lock.release())
    assert lock_info(r, name)["count"] == 1
    r.client_kill_filter(_id=first[0])
    assert lock_info(r, name) is None  # bound to the first connection


def test_a_waiting_ephemeral_acquire_is_bound_to_its_own_connection(api, r, name):
    client = api.client()
    holder = api.Lock(client, name, timeout=10)
    waiter = api.Lock(client, name, timeout=10, ephemeral=True, thread_local=False)
    assert api.run(holder.acquire())
    waiting = api.spawn(waiter.acquire)
    api.wait_waiters(r, name, 1)
    api.run(holder.release())
    waiting.join(5)
    assert waiting.result is True
    assert lock_info(r, name)["holders"][0]["ephemeral"] == 1
    api.run(waiter.release())
    assert lock_info(r, name) is None


def test_a_release_works_with_the_pool_used_up(api, r, name):
    # Regression: renewals used the hold's own connection but the release
    # asked the pool for one, which `max_connections=1` had none left of.
    client = api.client(max_connections=1)
    lock = api.Lock(client, name, timeout=10, ephemeral=True)
    assert api.run(lock.acquire())
    api.run(lock.release())
    assert lock_info(r, name) is None
    assert api.run(lock.acquire())  # the connection went back to the pool
    api.run(lock.release())


def test_a_closed_hold_connection_is_noticed_within_milliseconds(api, r, name):
    # Regression: noticed only at the next renewal (a third of the lease).
    lock = api.Lock(api.client(), name, timeout=3, auto_renewal=True, ephemeral=True)
    assert api.run(lock.acquire())
    ids = hold_connections(r)
    assert len(ids) == 1, ids
    r.client_kill_filter(_id=ids[0])
    assert api.wait(lock.lost, 0.5)  # a renewal would come after 1 s
    assert lock.lost_reason == "disconnected" and not lock.held


def test_a_closed_hold_connection_is_noticed_without_renewal(api, r, name):
    lock = api.Lock(api.client(), name, timeout=30, auto_renewal=False, ephemeral=True)
    assert api.run(lock.acquire())
    r.client_kill_filter(_id=hold_connections(r)[0])
    assert api.wait(lock.lost, 0.5)
