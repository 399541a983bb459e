"""The asyncio twin: redis-py's ``redis.asyncio.lock.Lock`` interface on ``LOCK.*``.

``from redislock.asyncio import Lock``; use it with ``redis.asyncio.Redis``
or ``redis.asyncio.RedisCluster`` (``r.lock(name, lock_class=Lock)``).

The logic is the sync lock's, in ``_core``; this module performs its steps
by awaiting and renews with tasks.

Token storage is redis-py's: with ``thread_local=True`` (the default) the
token lives in a ``threading.local``, so tasks of one event loop that share
one Lock *instance* share its token, exactly as with redis-py's asyncio lock.
Give each task its own instance (``r.lock(...)`` makes a new one per call);
then no task can release, extend or renew another task's hold, since each
hold has its own random token checked by the server.
"""

import asyncio
import inspect
import logging
import math
from functools import partial
from typing import Any, Awaitable, Callable, Literal, NamedTuple, Optional, Set

from redis.exceptions import LockError, ResponseError, TimeoutError

from ._common import read_timeout
from ._core import (
    Acquire,
    Call,
    CallOn,
    Cleanup,
    LockCore,
    RefreshSlots,
    Renewal,
    Run,
    Sleep,
    Steps,
    Unbind,
)
from ._shared import ReadWriteLockBase, SemaphoreBase

logger = logging.getLogger(__name__)

# Releases that must finish even if their caller is cancelled again: the loop
# keeps only weak references to tasks.
_shielded: Set["asyncio.Task[Any]"] = set()


# ---------------------------------------------------------------------------
# Transport: a server-side wait outlives the client's socket_timeout
# ---------------------------------------------------------------------------


async def _acquire_on(conn: Any, step: Acquire) -> Any:
    """Perform an ``Acquire`` step on ``conn``; a cancel counts as a failure."""
    try:
        if step.asking:
            await conn.send_command("ASKING")
            await conn.read_response()
        await conn.send_command(*step.args)
        return await _read_reply(conn, step.wait)
    except ResponseError:
        raise
    except BaseException:
        await conn.disconnect(nowait=True)
        raise


async def _read_reply(conn: Any, wait: Optional[int]) -> Any:
    """The reply to a ``LOCK.ACQUIRE … WAIT wait``, read for as long as
    ``read_timeout`` says. redis.asyncio's ``read_response(timeout=t)``
    returns None when ``t`` runs out, which reads as a nil reply (not
    granted) while the grant may still come, onto a connection back in the
    pool. So the limit is ours, and running out of it raises, as a socket
    timeout does in the sync lock (then the grant is released and the
    connection closed)."""
    timeout = read_timeout(conn, wait)
    # math.inf is redis.asyncio's "no limit".
    reading = conn.read_response(timeout=math.inf)
    if timeout is None:
        return await reading
    try:
        return await asyncio.wait_for(reading, timeout)
    except asyncio.TimeoutError:
        raise TimeoutError(f"no reply to LOCK.ACQUIRE within {timeout:.3f} s") from None


class _Binding(NamedTuple):
    """An ephemeral hold's own connection and how it goes back (awaitable
    or not: a pool's release is a coroutine, a cluster node's is not)."""

    conn: Any
    release: Callable[[Any], Any]


async def _acquire(client: Any, step: Acquire) -> Any:
    """Perform an ``Acquire`` step; with ``keep`` a granted hold keeps its
    connection: (reply, binding)."""
    if step.node is None:
        pool = client.connection_pool
        conn = await pool.get_connection()
        release = pool.release
    else:
        conn = step.node.acquire_connection()
        release = step.node.release
    kept = False
    try:
        reply = await _acquire_on(conn, step)
        if not step.keep:
            return reply
        kept = reply is not None
        return reply, _Binding(conn, release) if kept else None
    finally:
        if not kept:
            await _maybe_await(release(conn))


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


# ---------------------------------------------------------------------------
# Automatic renewal
# ---------------------------------------------------------------------------


class _Renewer(Renewal):
    """A task renewing one hold, a ``call_later`` on the loop for its
    deadline (see ``Renewal``). ``mutex`` is held while a ``LOCK.RENEW`` is
    in flight and while the owner changes the lease or releases. The loop
    runs one step at a time, so ``state`` needs no lock here."""

    def __init__(self, lock: "Lock", token: bytes, lease: float, start: float):
        self.mutex = asyncio.Lock()
        self.loop = asyncio.get_running_loop()
        self.wake = asyncio.Event()
        super().__init__(lock, token, lease, start)
        self.task = self.loop.create_task(self._run(), name=f"redislock-renew:{lock.name!r}")

    def _timer(self, delay: float) -> asyncio.TimerHandle:
        return self.loop.call_later(delay, self.deadline_passed)

    def _called_back(self, result: Any) -> None:
        if asyncio.iscoroutine(result):
            self.loop.create_task(result)

    async def _sleep(self, delay: float) -> bool:
        """Sleep ``delay`` seconds; True if stopped meanwhile."""
        try:
            await asyncio.wait_for(self.wake.wait(), delay)
            return True
        except asyncio.TimeoutError:
            return False

    async def _run(self) -> None:
        delay = self.interval
        while delay is not None and not await self._sleep(delay):
            async with self.mutex:
                delay = await self.lock._drive(self.tick())


# ---------------------------------------------------------------------------
# The lock
# ---------------------------------------------------------------------------


class Lock(LockCore):
    """redis-py's asyncio ``Lock`` interface on the module; see
    ``redislock.Lock`` for what differs from redis-py. ``lost`` is an
    ``asyncio.Event``; ``on_lost`` may be a plain function or a coroutine
    function."""

    _Event = asyncio.Event
    _Renewer = _Renewer
    _log = logger
    _names_errors = False

    # -- performing the core's steps -------------------------------------------

    async def _drive(self, steps: Steps) -> Any:
        """Run one of the core's operations to its result, awaiting each
        step it yields. Any exception, a cancel included, goes back to
        the operation: it may have to release a grant first."""
        run = Run(steps)
        while not run.done:
            try:
                reply = await self._perform(run.step)
            except BaseException as error:
                run.failed(error)
            else:
                run.replied(reply)
        return run.result

    async def _perform(self, step: Any) -> Any:
        if isinstance(step, Call):
            return await self.redis.execute_command(*step.args)
        if isinstance(step, Acquire):
            return await _acquire(self.redis, step)
        if isinstance(step, RefreshSlots):
            return await self.redis.nodes_manager.initialize()
        if isinstance(step, Sleep):
            return await asyncio.sleep(step.seconds)
        if isinstance(step, Cleanup):
            cleanup = asyncio.ensure_future(self._drive(step.steps))
            _shielded.add(cleanup)
            cleanup.add_done_callback(_shielded.discard)
            return await asyncio.shield(cleanup)
        if isinstance(step, CallOn):
            conn = step.binding.conn
            await conn.send_command(*step.args)
            return await conn.read_response()
        if isinstance(step, Unbind):
            await step.binding.conn.disconnect()
            return await _maybe_await(step.binding.release(step.binding.conn))
        raise TypeError(f"not a step: {step!r}")

    async def _paused(self, operation: Callable[[Optional[Renewal]], Steps]) -> Any:
        """Drive ``operation(renewer)`` with this hold's renewer (if any)
        held still."""
        renewer = self._renewer()
        if renewer is None:
            return await self._drive(operation(None))
        async with renewer.mutex:
            return await self._drive(operation(renewer))

    # -- context manager (as redis-py) ---------------------------------------

    async def __aenter__(self) -> "Lock":
        if await self.acquire():
            return self
        raise self._not_acquired()

    async def __aexit__(self, exc_type, exc_value, traceback) -> None:
        try:
            await self.release()
        except LockError:
            if not self._exit_tolerates():
                raise

    # -- commands -------------------------------------------------------------

    async def acquire(
        self,
        blocking: Optional[bool] = None,
        blocking_timeout: Optional[float] = None,
        token: Optional[Any] = None,
    ) -> bool:
        """As ``redislock.Lock.acquire`` (redis-py's asyncio signature, which
        has no ``sleep``: ``self.sleep`` paces the polling). Cancelled, it
        leaves no hold behind: a grant that crossed the cancel is released."""
        return await self._drive(self._acquiring(None, blocking, blocking_timeout, token))

    async def locked(self) -> bool:
        return await self._drive(self._locked())

    async def owned(self) -> bool:
        return await self._drive(self._owned())

    async def release(self) -> None:
        token = self._releasable()
        await self._paused(lambda renewer: self._releasing(token))

    # Not coroutine functions, as in redis-py: the checks of local state
    # raise at the call, the round trips happen when awaited.

    def extend(
        self, additional_time: float, replace_ttl: bool = False
    ) -> Awaitable[Literal[True]]:
        token = self._renewable("extend")
        return self._paused(partial(self._extending, token, additional_time, replace_ttl))

    def reacquire(self) -> Awaitable[Literal[True]]:
        token = self._renewable("reacquire")
        return self._paused(partial(self._reacquiring, token))


# ---------------------------------------------------------------------------
# Shared holds
# ---------------------------------------------------------------------------


class ReadWriteLock(ReadWriteLockBase):
    __doc__ = ReadWriteLockBase.__doc__
    _Lock = Lock


class Permit(Lock):
    """One permit of a ``Semaphore`` (as ``redislock.Permit``), released when
    its ``async with`` block ends."""

    async def __aenter__(self) -> "Permit":
        if self.token is not None or await self.acquire():
            return self
        raise self._not_acquired()


class Semaphore(SemaphoreBase):
    __doc__ = SemaphoreBase.__doc__
    _Lock = Permit

    async def acquire(
        self, blocking: Optional[bool] = None, blocking_timeout: Optional[float] = None
    ) -> Optional[Permit]:
        """As ``redislock.Semaphore.acquire``; cancelled, it leaves no permit
        behind."""
        permit = self._permit()
        acquired = await permit.acquire(blocking=blocking, blocking_timeout=blocking_timeout)
        return permit if acquired else None
