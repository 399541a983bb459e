"""What only the asyncio lock does: a cancelled acquire, a coroutine as
``on_lost``. (What it shares with the sync lock is tested on both, in the
other modules.) Each test runs its own event loop (asyncio.run), so no
pytest plugin is needed."""

import asyncio
import time

import pytest
import redis.asyncio

from redislock._common import parse_info
from redislock.asyncio import Lock


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


async def _is(awaitable, value):
    return await awaitable == value


async def queued_behind_a_holder(client, name):
    """A holder, and a task whose acquire waits in the queue behind it."""
    holder = Lock(client, name, timeout=10)
    await holder.acquire()
    waiter = Lock(client, name, timeout=10)
    task = asyncio.create_task(waiter.acquire())
    await eventually(lambda: _is(waiters(client, name), 1), what="a waiter")
    return holder, waiter, task


def test_a_cancelled_wait_leaves_the_queue(server, r, name):
    async def main():
        client = redis.asyncio.Redis(host="127.0.0.1", port=server.port)
        holder, waiter, task = await queued_behind_a_holder(client, name)
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
        holder, waiter, task = await queued_behind_a_holder(client, name)
        r.execute_command("LOCK.RELEASE", name, holder.token)  # blocks this loop
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # Released in the background (the cancel is not held up by it),
        # long before the lease would end.
        deadline = time.monotonic() + 3
        while True:
            info = parse_info(await client.execute_command("LOCK.INFO", name))
            if info is None or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.01)
        await client.aclose()
        return info, waiter.token

    info, token = asyncio.run(main())
    assert token is None
    assert info is None, f"held after the cancelled acquire: {info}"


def test_on_lost_may_be_a_coroutine_function(server, r, name):
    async def main():
        client = redis.asyncio.Redis(host="127.0.0.1", port=server.port)
        calls = []

        async def on_lost(lock):
            calls.append(lock)

        lock = Lock(client, name, timeout=0.6, auto_renewal=True, on_lost=on_lost)
        await lock.acquire()
        await client.delete(name)
        await asyncio.wait_for(lock.lost.wait(), 2)
        await eventually(lambda: _is(asyncio.sleep(0, len(calls)), 1), 2, "on_lost")
        await client.aclose()
        return calls, lock

    calls, lock = asyncio.run(main())
    assert calls == [lock]


def test_a_cancelled_ephemeral_acquire_during_its_confirming_renew_returns_the_connection(
    server, r, name
):
    # Regression: the hold's own connection stayed out of the pool when the
    # acquire was cancelled while the renew confirming a late grant was in
    # flight.
    async def main():
        client = redis.asyncio.Redis(host="127.0.0.1", port=server.port)
        pool = client.connection_pool
        r.execute_command("LOCK.ACQUIRE", name, "holder", 10000)
        waiter = Lock(client, name, timeout=0.6, ephemeral=True)
        task = asyncio.create_task(waiter.acquire())
        await eventually(lambda: _is(waiters(client, name), 1), what="a waiter")
        await asyncio.sleep(0.3)  # past a third of the lease: the grant is confirmed
        # The release grants the waiter, and the pause that comes with it
        # holds back its confirming renew (a write).
        both = r.pipeline(transaction=False)
        both.execute_command("LOCK.RELEASE", name, "holder")
        both.execute_command("CLIENT", "PAUSE", 1500, "WRITE")
        both.execute()
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.to_thread(r.execute_command, "CLIENT", "UNPAUSE")

        async def returned():
            return not pool._in_use_connections

        await eventually(returned, 5, "every connection back in the pool")

        async def free():
            return parse_info(await client.execute_command("LOCK.INFO", name)) is None

        await eventually(free, 5, "the lock free")
        await client.aclose()

    asyncio.run(main())
