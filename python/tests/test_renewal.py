"""Automatic renewal: a daemon thread renews every third of the lease; ``lost``
and ``on_lost`` report a hold that ended under it; nothing is renewed after
a release.

Some of these tests must show that something does *not* happen for a while
(no renewal after release): they watch the server's command counts over a
fixed span of several renewal periods."""

import time

from redislock import Lock, LockNotOwnedError

from conftest import commandstat, in_thread, lock_info, wait_until, wait_waiters

LEASE = 0.6  # seconds: a renewal every 0.2 s (margin for a loaded machine)


def renewing(r, name, **kwargs):
    calls = []
    lock = Lock(r, name, timeout=LEASE, auto_renewal=True, on_lost=calls.append, **kwargs)
    return lock, calls


def test_renewal_keeps_the_lock_past_its_lease(r, name):
    lock, lost_calls = renewing(r, name)
    assert lock.acquire()
    fence = lock.fence
    time.sleep(4 * LEASE)
    assert lock.owned()
    assert lock_info(r, name)["fence"] == fence  # the same hold throughout
    assert commandstat(r, "lock.renew") >= 6
    assert not lock.lost.is_set() and lost_calls == []
    lock.release()


def test_no_renewal_after_release(r, name):
    lock, lost_calls = renewing(r, name)
    for _ in range(3):  # several holds, each released
        assert lock.acquire()
        wait_until(lambda: commandstat(r, "lock.renew") >= 1, what="a renewal")
        lock.release()
        renewals = commandstat(r, "lock.renew")
        time.sleep(4 * LEASE / 3)  # four renewal periods
        assert commandstat(r, "lock.renew") == renewals
        assert not lock.locked()
        r.config_resetstat()
    assert not lock.lost.is_set() and lost_calls == []


def test_no_renewal_after_a_reentrant_hold_is_fully_released(r, name):
    lock, _ = renewing(r, name)
    lock.acquire(token="t")
    lock.acquire(token="t")
    lock.release()
    wait_until(lambda: commandstat(r, "lock.renew") >= 2, what="renewals while count is 1")
    lock.release()
    renewals = commandstat(r, "lock.renew")
    time.sleep(4 * LEASE / 3)
    assert commandstat(r, "lock.renew") == renewals


def test_deleting_the_key_fires_lost(r, name):
    lock, lost_calls = renewing(r, name)
    lock.acquire()
    r.delete(name)
    assert lock.lost.wait(2)
    assert lost_calls == [lock]
    refusals = commandstat(r, "lock.renew")
    time.sleep(4 * LEASE / 3)
    assert commandstat(r, "lock.renew") == refusals  # it stopped renewing
    assert lock_info(r, name) is None
    try:
        lock.release()
    except LockNotOwnedError:
        pass
    else:
        raise AssertionError("release after loss should be refused")


def test_a_paused_server_past_the_lease_fires_lost(server, r, name):
    """CLIENT PAUSE holds the renewal in the server; the lease the client knows
    of runs out first, and ``lost`` fires while the pause still lasts."""
    lock, lost_calls = renewing(r, name)
    lock.acquire()
    wait_until(lambda: commandstat(r, "lock.renew") >= 1, what="a renewal")
    pause = 2.0
    paused_at = time.monotonic()
    r.client_pause(int(pause * 1000), all=False)  # WRITE: renewals wait
    try:
        assert lock.lost.wait(pause)
        assert time.monotonic() - paused_at < pause
        assert lost_calls == [lock]
    finally:
        r.client_unpause()
    wait_until(lambda: lock_info(r, name) is None, what="the lease ended")


def test_the_renewer_never_shortens_an_extended_lease(r, name):
    lock, _ = renewing(r, name)
    lock.acquire()
    lock.extend(5)
    wait_until(lambda: commandstat(r, "lock.renew") >= 1, what="the extend")
    time.sleep(4 * LEASE / 3)
    assert r.pttl(name) > 4000
    lock.release()


def test_a_value_written_over_the_lock_fires_lost_at_the_next_renewal(r, name):
    """A SET over the lock replaced it: the hold is gone, whatever happens to
    the key later. The first renewal's WRONGTYPE says so; the loss must not
    wait for the lease to run out while renewals keep failing."""
    lease = 3.0  # a renewal after 1 s; the lease would end after 3 s
    calls = []
    lock = Lock(r, name, timeout=lease, auto_renewal=True, on_lost=calls.append)
    lock.acquire()
    r.set(name, "x")
    assert lock.lost.wait(lease / 3 + 0.7), "lost did not fire at the first renewal"
    assert calls == [lock]
    assert commandstat(r, "lock.renew") == 1  # one refusal, no retries
    assert r.get(name) == b"x"


def test_a_late_grant_never_signals_loss_after_the_servers_lease_end(server, r, name):
    """The grant's reply is held back by a slow command pipelined after the
    release that handed the lock over, until most of the lease has passed.
    The client must not count its lease from that reply: with renewals stuck
    (a write pause), ``lost`` fires no later than the server's lease ends."""
    lease = 1.2
    holder = Lock(r, name, timeout=10)
    holder.acquire()
    lock = Lock(server.client(), name, timeout=lease, auto_renewal=True, thread_local=False)
    waiter = in_thread(lock.acquire)
    wait_waiters(r, name, 1)
    handover = r.pipeline(transaction=False)
    handover.execute_command("LOCK.RELEASE", name, holder.token)
    handover.execute_command("DEBUG", "SLEEP", lease - 0.3)
    handover.execute()
    waiter.join(5)
    assert waiter.result is True, waiter.result
    r.client_pause(3000, all=False)  # WRITE: renewals wait, reads go on
    try:
        ends = time.monotonic() + max(0, r.pttl(name)) / 1000
        assert lock.lost.wait(3), "lost never fired"
        late = time.monotonic() - ends
    finally:
        r.client_unpause()
    assert late < 0.2, f"lost fired {late:.3f} s after the server's lease ended"


def test_a_grant_that_ended_before_its_reply_came_is_not_reported_held(server, r, name):
    """The grant's reply is held back past the whole lease: the hold is over
    when the reply arrives. acquire must not return True for it; a blocking
    one queues again (the lock is free by then, so it gets a new hold)."""
    lease = 0.6
    holder = Lock(r, name, timeout=10)
    holder.acquire()
    lock = Lock(server.client(), name, timeout=lease, thread_local=False)
    waiter = in_thread(lock.acquire)
    wait_waiters(r, name, 1)
    handover = r.pipeline(transaction=False)
    handover.execute_command("LOCK.RELEASE", name, holder.token)
    handover.execute_command("DEBUG", "SLEEP", lease + 0.3)
    handover.execute()
    waiter.join(5)
    assert waiter.result is True, waiter.result
    info = lock_info(r, name)
    assert info is not None and info["owner"] == lock.token, f"acquire said held; server: {info}"
    assert commandstat(r, "lock.acquire") == 3  # the holder's, the late grant, the new one
