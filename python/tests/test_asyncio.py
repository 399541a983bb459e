"""The asyncio twin, against redis.asyncio clients. Each test runs its own
event loop (asyncio.run), so no pytest plugin is needed."""

import asyncio
import time

import pytest
import redis.asyncio
import redis.asyncio.lock

from redislock import LockError, LockNotOwnedError, ModuleNotLoadedError
from redislock._common import parse_info
from redislock.asyncio import Lock

from conftest import commandstat


async def eventually(check, timeout=10.0, what=""):
    """Await ``check()`` until truthy, without blocking the loop."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


async def waiters(client, name):
    info = parse_info(await client.execute_command("LOCK.INFO", name))
    return (info or {}).get("waiters", 0)


async def attempt(awaitable_fn):
    try:
        return ("ok", await awaitable_fn())
    except Exception as e:
        return ("raise", type(e).__name__, str(e))


async def scenario(client, key, cls):
    """One compatibility scenario, run with redis-py's lock and ours."""
    a, b = cls(client, key, timeout=10), cls(client, key, timeout=10, blocking_timeout=0.2)
    seen = [await a.acquire(blocking=False), await a.locked(), await a.owned()]
    seen += [await b.acquire(), await b.owned()]
    seen += [await a.extend(5), 14000 < await client.pttl(key) <= 15000]
    seen += [await a.extend(2, replace_ttl=True), 1000 < await client.pttl(key) <= 2000]
    seen += [await a.reacquire(), 9000 < await client.pttl(key) <= 10000]
    seen += [await attempt(a.release), await a.locked(), await attempt(a.release)]

    async def lost_in_context():
        async with cls(client, key, timeout=10) as held:
            seen.append(await held.owned())
            await client.delete(key)

    seen += [await attempt(lost_in_context)]
    return seen


def test_same_observations_as_redis_py_asyncio(server, r):
    async def main():
        client = redis.asyncio.Redis(host="127.0.0.1", port=server.port)
        try:
            seen = {}
            for label, cls in (("redis-py", redis.asyncio.lock.Lock), ("ours", Lock)):
                seen[label] = await attempt(lambda: scenario(client, f"async:{label}", cls))
            return seen
        finally:
            await client.aclose()

    seen = asyncio.run(main())
    assert seen["ours"] == seen["redis-py"]
    assert seen["ours"][1][-1][:2] == ("raise", "LockNotOwnedError")


def test_tasks_are_served_in_arrival_order_with_rising_fences(server, r, name):
    async def main():
        client = redis.asyncio.Redis(host="127.0.0.1", port=server.port, socket_timeout=0.3)
        holder = client.lock(name, timeout=10, lock_class=Lock)
        await holder.acquire()
        order, fences = [], []

        async def worker(i):
            lock = client.lock(name, timeout=10, lock_class=Lock)
            async with lock:
                order.append(i)
                fences.append(lock.fence)

        tasks = []
        for i in range(5):
            tasks.append(asyncio.create_task(worker(i)))
            await eventually(lambda: _is(waiters(client, name), i + 1), what=f"{i + 1} waiters")
        await asyncio.sleep(1.0)  # past the 0.3 s socket_timeout: still queued
        assert await waiters(client, name) == 5
        await holder.release()
        await asyncio.gather(*tasks)
        await client.aclose()
        return order, fences, holder

    order, fences, holder = asyncio.run(main())
    assert order == list(range(5))
    assert fences == sorted(fences) and fences[0] > 0
    assert commandstat(r, "lock.acquire") == 6


async def _is(awaitable, value):
    return await awaitable == value


def test_a_cancelled_wait_leaves_the_queue(server, r, name):
    async def main():
        client = redis.asyncio.Redis(host="127.0.0.1", port=server.port)
        holder = Lock(client, name, timeout=10)
        await holder.acquire()
        waiter = Lock(client, name, timeout=10)
        task = asyncio.create_task(waiter.acquire())
        await eventually(lambda: _is(waiters(client, name), 1), what="a waiter")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await eventually(lambda: _is(waiters(client, name), 0), what="the waiter gone")
        await holder.release()
        free = not await waiter.locked()
        await client.aclose()
        return free, waiter.token

    free, token = asyncio.run(main())
    assert free and token is None


def test_a_wait_cancelled_after_the_grant_leaves_nothing_held(server, r, name):
    """The lock is handed over while this event loop is busy (a blocking
    call), and the waiting task is cancelled before it could read its grant:
    the hold it was granted must not outlive the cancelled acquire."""
    async def main():
        client = redis.asyncio.Redis(host="127.0.0.1", port=server.port)
        holder = Lock(client, name, timeout=10)
        await holder.acquire()
        waiter = Lock(client, name, timeout=10)
        task = asyncio.create_task(waiter.acquire())
        await eventually(lambda: _is(waiters(client, name), 1), what="a waiter")
        r.execute_command("LOCK.RELEASE", name, holder.token)  # blocks this loop
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        info = parse_info(await client.execute_command("LOCK.INFO", name))
        await client.aclose()
        return info, waiter.token

    info, token = asyncio.run(main())
    assert token is None
    assert info is None, f"held after the cancelled acquire: {info}"


def test_a_late_grant_never_signals_loss_after_the_servers_lease_end(server, r, name):
    """As the sync test: the grant's reply is held back until most of the
    lease has passed; with renewals stuck, ``lost`` fires no later than the
    server's lease ends."""
    lease = 1.2

    async def main():
        client = redis.asyncio.Redis(host="127.0.0.1", port=server.port)
        other = redis.asyncio.Redis(host="127.0.0.1", port=server.port)
        holder = Lock(client, name, timeout=10)
        await holder.acquire()
        lock = Lock(client, name, timeout=lease, auto_renewal=True)
        task = asyncio.create_task(lock.acquire())
        await eventually(lambda: _is(waiters(client, name), 1), what="a waiter")
        handover = other.pipeline(transaction=False)
        handover.execute_command("LOCK.RELEASE", name, holder.token)
        handover.execute_command("DEBUG", "SLEEP", lease - 0.3)
        await handover.execute()
        assert await asyncio.wait_for(task, 5) is True
        await other.client_pause(3000, all=False)  # WRITE: renewals wait, reads go on
        try:
            ends = time.monotonic() + max(0, await other.pttl(name)) / 1000
            await asyncio.wait_for(lock.lost.wait(), 3)
            late = time.monotonic() - ends
        finally:
            await other.client_unpause()
        await client.aclose()
        await other.aclose()
        return late

    late = asyncio.run(main())
    assert late < 0.2, f"lost fired {late:.3f} s after the server's lease ended"


async def overwritten(client, key, cls):
    """redis-py's own lock tests fake another holder with a plain SET."""
    lock = cls(client, key, timeout=10)
    await lock.acquire()
    await client.set(key, "x")
    seen = [await attempt(lock.owned), await attempt(lock.locked)]
    seen += [await attempt(lambda: lock.extend(1)), await attempt(lambda: lock.extend(1, True))]
    seen += [await attempt(lock.reacquire)]
    seen += [await attempt(lock.release), lock.local.token, await attempt(lock.release)]
    other = cls(client, key, timeout=10, blocking_timeout=0.2)
    seen += [await attempt(lambda: other.acquire(blocking=False)), await attempt(other.acquire)]
    await client.delete(key)
    seen += [await other.acquire(blocking=False), await attempt(other.release)]
    return seen


def test_a_value_written_over_the_lock_as_redis_py_asyncio(server, r):
    async def main():
        client = redis.asyncio.Redis(host="127.0.0.1", port=server.port)
        try:
            seen = {}
            for label, cls in (("redis-py", redis.asyncio.lock.Lock), ("ours", Lock)):
                seen[label] = await attempt(lambda: overwritten(client, f"async:{label}", cls))
            return seen
        finally:
            await client.aclose()

    seen = asyncio.run(main())
    assert seen["ours"] == seen["redis-py"]


def test_a_value_written_over_a_renewing_lock_fires_lost_at_the_next_renewal(server, r, name):
    lease = 3.0  # a renewal after 1 s; the lease would end after 3 s

    async def main():
        client = redis.asyncio.Redis(host="127.0.0.1", port=server.port)
        lock = Lock(client, name, timeout=lease, auto_renewal=True)
        await lock.acquire()
        await client.set(name, "x")
        try:
            await asyncio.wait_for(lock.lost.wait(), lease / 3 + 0.7)
        except asyncio.TimeoutError:
            raise AssertionError("lost did not fire at the first renewal") from None
        finally:
            await client.aclose()

    asyncio.run(main())
    assert commandstat(r, "lock.renew") == 1  # one refusal, no retries


def test_a_blocking_acquire_on_a_value_of_another_type_waits_until_it_is_gone(server, r, name):
    async def main():
        client = redis.asyncio.Redis(host="127.0.0.1", port=server.port)
        await client.set(name, "x")
        lock = Lock(client, name, timeout=10, sleep=0.02)
        task = asyncio.create_task(lock.acquire(blocking_timeout=10))

        async def retried():
            return commandstat(r, "lock.acquire") >= 2 or task.done()

        await eventually(retried, what="a second try")
        assert not task.done(), task.exception()
        await client.delete(name)
        assert await asyncio.wait_for(task, 5) is True
        assert await lock.owned()
        await lock.release()
        await client.aclose()

    asyncio.run(main())


def test_reentrancy_and_release_errors(server, r, name):
    async def main():
        client = redis.asyncio.Redis(host="127.0.0.1", port=server.port, protocol=2)
        lock = Lock(client, name, timeout=10)
        assert await lock.acquire(token="me")
        fence = lock.fence
        assert await lock.acquire(token="me") and lock.fence == fence
        await lock.release()
        assert await lock.owned()
        await lock.release()
        assert not await lock.locked()
        with pytest.raises(LockError):
            await lock.release()
        await lock.acquire()
        await client.delete(name)
        with pytest.raises(LockNotOwnedError):
            await lock.release()
        await client.aclose()

    asyncio.run(main())


def test_auto_renewal_loss_and_no_renewal_after_release(server, r, name):
    async def main():
        client = redis.asyncio.Redis(host="127.0.0.1", port=server.port)
        calls = []

        async def on_lost(lock):
            calls.append(lock)

        # A 0.6 s lease: a renewal every 0.2 s.
        lock = Lock(client, name, timeout=0.6, auto_renewal=True, on_lost=on_lost)
        await lock.acquire()
        await asyncio.sleep(1.5)  # two and a half leases
        assert await lock.owned() and not lock.lost.is_set()
        assert commandstat(r, "lock.renew") >= 5
        await lock.release()
        renewals = commandstat(r, "lock.renew")
        await asyncio.sleep(0.8)  # four renewal periods
        assert commandstat(r, "lock.renew") == renewals
        # Loss: the key deleted under a renewing hold.
        await lock.acquire()
        await client.delete(name)
        await asyncio.wait_for(lock.lost.wait(), 2)
        await asyncio.sleep(0)  # let the coroutine callback run
        assert calls == [lock]
        # timeout=None: a renewed lease of no_timeout_lease seconds.
        forever = Lock(client, name + ":forever")
        forever.no_timeout_lease = 0.6
        await forever.acquire()
        await asyncio.sleep(1.5)
        assert await forever.owned()
        await forever.release()
        await client.aclose()

    asyncio.run(main())


def test_module_missing_asyncio(bare_server, name):
    async def main():
        client = redis.asyncio.Redis(host="127.0.0.1", port=bare_server.port)
        lock = Lock(client, name, timeout=10)
        for call in (lambda: lock.acquire(blocking=False), lock.acquire, lock.locked):
            with pytest.raises(ModuleNotLoadedError):
                await call()
        await client.aclose()

    asyncio.run(main())
