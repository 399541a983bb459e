"""Automatic renewal: a daemon thread (asyncio: a task) renews every third of
the lease; ``lost`` and ``on_lost`` report a hold that ended under it; nothing
is renewed after a release. Each test runs on both APIs (the ``api`` fixture).

Some of these tests must show that something does *not* happen for a while
(no renewal after release): they watch the server's command counts over a
fixed span of several renewal periods."""

import time

from conftest import commandstat, lock_info
from redislock import LockNotOwnedError

LEASE = 0.6  # seconds: a renewal every 0.2 s (margin for a loaded machine)


def renewing(api, name, **kwargs):
    calls = []
    lock = api.Lock(
        api.client(), name, timeout=LEASE, auto_renewal=True, on_lost=calls.append, **kwargs
    )
    return lock, calls


def test_renewal_keeps_the_lock_past_its_lease(api, r, name):
    lock, lost_calls = renewing(api, name)
    assert api.run(lock.acquire())
    fence = lock.fence
    api.sleep(4 * LEASE)
    assert api.run(lock.owned())
    assert lock_info(r, name)["fence"] == fence  # the same hold throughout
    assert commandstat(r, "lock.renew") >= 6
    assert not lock.lost.is_set() and lost_calls == []
    api.run(lock.release())


def test_no_renewal_after_release(api, r, name):
    lock, lost_calls = renewing(api, name)
    for _ in range(3):  # several holds, each released
        assert api.run(lock.acquire())
        api.wait_until(lambda: commandstat(r, "lock.renew") >= 1, what="a renewal")
        api.run(lock.release())
        renewals = commandstat(r, "lock.renew")
        api.sleep(4 * LEASE / 3)  # four renewal periods
        assert commandstat(r, "lock.renew") == renewals
        assert not api.run(lock.locked())
        r.config_resetstat()
    assert not lock.lost.is_set() and lost_calls == []


def test_no_renewal_after_a_reentrant_hold_is_fully_released(api, r, name):
    lock, _ = renewing(api, name)
    api.run(lock.acquire(token="t"))
    api.run(lock.acquire(token="t"))
    api.run(lock.release())
    api.wait_until(lambda: commandstat(r, "lock.renew") >= 2, what="renewals while count is 1")
    api.run(lock.release())
    renewals = commandstat(r, "lock.renew")
    api.sleep(4 * LEASE / 3)
    assert commandstat(r, "lock.renew") == renewals


def test_deleting_the_key_fires_lost(api, r, name):
    lock, lost_calls = renewing(api, name)
    api.run(lock.acquire())
    r.delete(name)
    assert api.wait(lock.lost, 2)
    api.wait_until(lambda: lost_calls == [lock], 2, "on_lost, after the signal")
    refusals = commandstat(r, "lock.renew")
    api.sleep(4 * LEASE / 3)
    assert commandstat(r, "lock.renew") == refusals  # it stopped renewing
    assert lock_info(r, name) is None
    try:
        api.run(lock.release())
    except LockNotOwnedError:
        pass
    else:
        raise AssertionError("release after loss should be refused")


def test_a_paused_server_past_the_lease_fires_lost(api, r, name):
    """CLIENT PAUSE holds the renewal in the server; the lease the client knows
    of runs out first, and ``lost`` fires while the pause still lasts."""
    lock, lost_calls = renewing(api, name)
    api.run(lock.acquire())
    api.wait_until(lambda: commandstat(r, "lock.renew") >= 1, what="a renewal")
    pause = 2.0
    paused_at = time.monotonic()
    r.client_pause(int(pause * 1000), all=False)  # WRITE: renewals wait
    try:
        assert api.wait(lock.lost, pause)
        assert time.monotonic() - paused_at < pause
        api.wait_until(lambda: lost_calls == [lock], 2, "on_lost, after the signal")
    finally:
        r.client_unpause()
    api.wait_until(lambda: lock_info(r, name) is None, what="the lease ended")


def test_the_renewer_never_shortens_an_extended_lease(api, r, name):
    lock, _ = renewing(api, name)
    api.run(lock.acquire())
    api.run(lock.extend(5))
    api.wait_until(lambda: commandstat(r, "lock.renew") >= 1, what="the extend")
    api.sleep(4 * LEASE / 3)
    assert r.pttl(name) > 4000
    api.run(lock.release())


def test_a_value_written_over_the_lock_fires_lost_at_the_next_renewal(api, r, name):
    """A SET over the lock replaced it: the hold is gone, whatever happens to
    the key later. The first renewal's WRONGTYPE says so; the loss must not
    wait for the lease to run out while renewals keep failing."""
    lease = 3.0  # a renewal after 1 s; the lease would end after 3 s
    calls = []
    lock = api.Lock(api.client(), name, timeout=lease, auto_renewal=True, on_lost=calls.append)
    api.run(lock.acquire())
    r.set(name, "x")
    assert api.wait(lock.lost, lease / 3 + 0.7), "lost did not fire at the first renewal"
    api.wait_until(lambda: calls == [lock], 2, "on_lost, after the signal")
    assert commandstat(r, "lock.renew") == 1  # one refusal, no retries
    assert r.get(name) == b"x"


def test_a_late_grant_never_signals_loss_after_the_servers_lease_end(api, r, name):
    """The grant's reply is held back by a slow command pipelined after the
    release that handed the lock over, until most of the lease has passed.
    The client must not count its lease from that reply: with renewals stuck
    (a write pause), ``lost`` fires no later than the server's lease ends."""
    lease = 1.2
    holder = api.Lock(api.client(), name, timeout=10)
    api.run(holder.acquire())
    lock = api.Lock(api.client(), name, timeout=lease, auto_renewal=True, thread_local=False)
    waiter = api.spawn(lock.acquire)
    api.wait_waiters(r, name, 1)
    handover = r.pipeline(transaction=False)
    handover.execute_command("LOCK.RELEASE", name, holder.token)
    handover.execute_command("DEBUG", "SLEEP", lease - 0.3)
    api.blocking(handover.execute)
    waiter.join(5)
    assert waiter.result is True, waiter.result
    r.client_pause(3000, all=False)  # WRITE: renewals wait, reads go on
    try:
        ends = time.monotonic() + max(0, r.pttl(name)) / 1000
        assert api.wait(lock.lost, 3), "lost never fired"
        late = time.monotonic() - ends
    finally:
        r.client_unpause()
    assert late < 0.2, f"lost fired {late:.3f} s after the server's lease ended"


def test_a_grant_that_ended_before_its_reply_came_is_not_reported_held(api, r, name):
    """The grant's reply is held back past the whole lease: the hold is over
    when the reply arrives. acquire must not return True for it; a blocking
    one queues again (the lock is free by then, so it gets a new hold)."""
    lease = 0.6
    holder = api.Lock(api.client(), name, timeout=10)
    api.run(holder.acquire())
    lock = api.Lock(api.client(), name, timeout=lease, thread_local=False)
    waiter = api.spawn(lock.acquire)
    api.wait_waiters(r, name, 1)
    handover = r.pipeline(transaction=False)
    handover.execute_command("LOCK.RELEASE", name, holder.token)
    handover.execute_command("DEBUG", "SLEEP", lease + 0.3)
    api.blocking(handover.execute)
    waiter.join(5)
    assert waiter.result is True, waiter.result
    info = lock_info(r, name)
    assert info is not None and info["owner"] == lock.token, f"acquire said held; server: {info}"
    assert commandstat(r, "lock.acquire") == 3  # the holder's, the late grant, the new one


# -- a new ttl, renewal stopped, a hold continued elsewhere ----------------------


def test_renew_with_a_new_ttl_is_the_lease_from_then_on(api, r, name):
    lock = api.Lock(api.client(), name, timeout=10, auto_renewal=True)
    assert api.run(lock.acquire())
    api.run(lock.renew(0.9))
    assert 0 < r.pttl(name) <= 900
    r.config_resetstat()
    api.sleep(1.5)  # past the new lease: the watchdog renews to it
    assert commandstat(r, "lock.renew") >= 3
    assert 0 < r.pttl(name) <= 900
    assert lock.held and not lock.lost.is_set()
    api.run(lock.release())


def test_an_extend_to_a_shorter_lease_is_kept_by_the_watchdog(api, r, name):
    lock = api.Lock(api.client(), name, timeout=6, auto_renewal=True)
    assert api.run(lock.acquire())
    api.run(lock.extend(0.6, replace_ttl=True))
    assert r.pttl(name) <= 600
    api.sleep(1.0)  # the watchdog renewed a third into the 0.6 s lease
    assert lock.held and api.run(lock.owned())
    assert r.pttl(name) > 600  # back to the lock's lease
    api.run(lock.release())


def test_stop_renewal_keeps_the_hold_until_its_lease_ends(api, r, name):
    lock, lost_calls = renewing(api, name)
    assert api.run(lock.acquire())
    api.wait_until(lambda: commandstat(r, "lock.renew") >= 1, what="a renewal")
    lock.stop_renewal()
    renewals = commandstat(r, "lock.renew")
    assert lock_info(r, name) is not None and lock.held  # not released
    assert api.wait(lock.lost, 2 * LEASE)
    assert lock.lost_reason == "expired" and not lock.held
    assert commandstat(r, "lock.renew") == renewals
    api.wait_until(lambda: lock_info(r, name) is None, 2, "the lease's end")


def test_a_hold_is_resumed_elsewhere_by_its_token(api, r, name):
    scheduler = api.Lock(api.client(), name, timeout=10, thread_local=False)
    assert api.run(scheduler.acquire())
    token, fence = scheduler.token, scheduler.fence
    worker = api.Lock(api.client(), name, timeout=5, thread_local=False)
    api.run(worker.resume(token, fence))
    assert worker.held and worker.fence == fence and worker.token == token
    assert 0 < r.pttl(name) <= 5000  # renewed to the worker's lease
    api.run(worker.release())
    assert lock_info(r, name) is None
    stranger = api.Lock(api.client(), name, timeout=5, thread_local=False)
    try:
        api.run(stranger.resume(token))
    except LockNotOwnedError:
        pass
    else:
        raise AssertionError("a token that holds nothing was resumed")
    assert not stranger.held
