"""The asyncio twin: redis-py's ``redis.asyncio.lock.Lock`` interface on ``LOCK.*``.

``from redislock.asyncio import Lock``; use it with ``redis.asyncio.Redis``
or ``redis.asyncio.RedisCluster`` (``r.lock(name, lock_class=Lock)``).

The logic is the sync lock's, in ``_core``; this module performs its steps
by awaiting and looks after each hold with a timer, a renewal task and,
for an ephemeral hold, the connection's protocol.

Token storage is redis-py's: with ``thread_local=True`` (the default) the
token lives in a ``threading.local``, so tasks of one event loop that share
one Lock *instance* share its token, exactly as with redis-py's asyncio lock.
Give each task its own instance (``r.lock(...)`` makes a new one per call);
then no task can release, extend or renew another task's hold, since each
hold has its own random token checked by the server.
"""

import asyncio
import contextlib
import inspect
import logging
import math
import time
from functools import partial
from typing import Any, Awaitable, Callable, Literal, NamedTuple, Optional, Set

from redis.exceptions import LockError, ResponseError, TimeoutError

from ._common import EXPIRED, read_timeout
from ._core import (
    Acquire,
    Background,
    Call,
    CallOn,
    Cleanup,
    Hold,
    LockCore,
    RefreshSlots,
    Run,
    Sleep,
    Steps,
    Unbind,
    ticking,
)
from ._multi import MultiLockBase
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
# A hold's keeper: deadline, renewal, connection watch
# ---------------------------------------------------------------------------

# Every background task of this module is named with this prefix
# (``running()`` counts them, and the deadline timers armed).
TASK_PREFIX = "redislock-"
_armed: Set["_Keeper"] = set()


def running() -> int:
    """Background tasks of this module still alive (renewals, releases
    retried) and deadline timers armed, across every lock."""
    tasks = sum(1 for t in asyncio.all_tasks() if t.get_name().startswith(TASK_PREFIX))
    return tasks + len(_armed)


class _Signal(asyncio.Event):
    """A hold's ``lost``: an ``asyncio.Event`` that also compares the hold's
    deadline whenever it is read or awaited, so a loss is seen on time even
    while the loop is busy elsewhere and its timer has not run."""

    def __init__(self, hold: Optional[Hold]):
        super().__init__()
        self.hold = hold

    def is_set(self) -> bool:
        if super().is_set():
            return True
        # The hold's reason is set just before the Event: a loss another
        # thread is signalling right now reads as set already.
        return self.hold is not None and self.hold.check() is not None

    async def wait(self) -> Literal[True]:
        while not self.is_set():
            hold = self.hold
            if hold is None or hold.reason is not None or hold.ended:
                return await super().wait()
            try:
                await asyncio.wait_for(super().wait(), max(0.0, hold.deadline - time.monotonic()))
            except asyncio.TimeoutError:
                pass
        return True


class _Watch(asyncio.Protocol):
    """Stands in front of an ephemeral hold's connection's protocol to hear
    of its close at once (the server has then ended the hold): the loop
    reads the socket all the time, so nothing else has to."""

    def __init__(self, inner: Any, closed: Callable[[], None]):
        self.inner = inner
        self.closed = closed

    def connection_made(self, transport: Any) -> None:
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> Optional[bool]:
        self.closed()
        return self.inner.eof_received()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.closed()
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


class _Keeper:
    """What looks after one hold: a ``call_later`` on its deadline (always),
    a renewal task (with automatic renewal) and, for an ephemeral hold, a
    watch on its own connection. ``mutex`` is held while a ``LOCK.RENEW`` is
    in flight and while the owner changes the lease or releases."""

    def __init__(self, lock: "Lock", hold: Hold):
        self.lock = lock
        self.hold = hold
        self.loop = asyncio.get_running_loop()
        self.mutex = asyncio.Lock()
        self.changed = asyncio.Event()  # the deadline changed, or renewing ended
        self.stopped = False
        self.renewing = lock.auto_renewal
        self.timer: Optional[asyncio.TimerHandle] = None
        self.task: Optional["asyncio.Task[Any]"] = None
        self.rearm()
        if lock.auto_renewal:
            self.task = self.loop.create_task(
                self._renewing(), name=f"{TASK_PREFIX}renew:{lock.name!r}"
            )
        self.transport = None
        if hold.binding is not None:
            self._watch(hold.binding.conn)

    def _watch(self, conn: Any) -> None:
        writer = getattr(conn, "_writer", None)
        transport = None if writer is None else writer.transport
        if transport is None or transport.is_closing():
            self.loop.call_soon(self._closed)
            return
        self.transport = transport
        transport.set_protocol(_Watch(transport.get_protocol(), self._closed))

    def _unwatch(self) -> None:
        transport, self.transport = self.transport, None
        if transport is not None:
            watch = transport.get_protocol()
            if isinstance(watch, _Watch):
                transport.set_protocol(watch.inner)

    def _closed(self) -> None:
        if not self.stopped:
            self.hold.disconnected()

    def rearm(self) -> None:
        self.changed.set()
        if self.stopped:
            return
        if self.timer is not None:
            self.timer.cancel()
        delay = max(0.0, self.hold.deadline - _TIMER_LEAD - time.monotonic())
        self.timer = self.loop.call_later(delay, self._deadline_passed)
        _armed.add(self)

    def _deadline_passed(self) -> None:
        self.timer = None
        _armed.discard(self)
        if self.stopped:
            return
        if time.monotonic() < self.hold.deadline - _TIMER_LEAD:
            self.rearm()  # renewed meanwhile
            return
        self.hold.lose(EXPIRED, "the lease ended before a renewal got through")

    def stop_renewing(self) -> None:
        self.renewing = False
        self.changed.set()

    def stop(self, report: Optional[str] = None) -> None:
        """Stop everything; ``report``: a loss to log and call ``on_lost``
        about soon (so the code that noticed it goes on)."""
        if report is not None and not self.stopped:
            self.loop.call_soon(self.hold.report, report)
        self.stopped = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        _armed.discard(self)
        self._unwatch()
        self.renewing = False
        self.changed.set()

    def called_back(self, result: Any) -> None:
        if asyncio.iscoroutine(result):
            task = self.loop.create_task(result)
            _shielded.add(task)
            task.add_done_callback(_shielded.discard)

    async def _renewing(self) -> None:
        hold = self.hold
        while self.renewing:
            left = hold.renew_at - time.monotonic()
            if left > 0:
                self.changed.clear()
                try:
                    await asyncio.wait_for(self.changed.wait(), left)
                except asyncio.TimeoutError:
                    pass
                continue
            async with self.mutex:
                if not self.renewing or not await self.lock._drive(ticking(hold)):
                    return


# An event loop's callbacks are not kept waiting for the GIL as threads
# are, but another thread of the application may hold it: the timer wakes
# a little early (see the sync lock's ``_timer_lead``).
_TIMER_LEAD = 0.01


# ---------------------------------------------------------------------------
# The lock
# ---------------------------------------------------------------------------


class Lock(LockCore):
    """redis-py's asyncio ``Lock`` interface on the module; see
    ``redislock.Lock`` for what differs from redis-py. ``lost`` is an
    ``asyncio.Event``; ``on_lost`` may be a plain function or a coroutine
    function."""

    _Signal = _Signal
    _Keeper = _Keeper
    _Mutex = contextlib.nullcontext  # the loop runs one step at a time
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
        if isinstance(step, Background):
            task = asyncio.ensure_future(self._drive(step.steps))
            task.set_name(f"{TASK_PREFIX}release:{self.name!r}")
            _shielded.add(task)
            task.add_done_callback(_shielded.discard)
            return None
        if isinstance(step, CallOn):
            conn = step.binding.conn
            await conn.send_command(*step.args)
            return await conn.read_response()
        if isinstance(step, Unbind):
            await step.binding.conn.disconnect()
            return await _maybe_await(step.binding.release(step.binding.conn))
        raise TypeError(f"not a step: {step!r}")

    async def _paused(self, hold: Hold, operation: Callable[[], Steps]) -> Any:
        """Drive ``operation()`` with ``hold``'s renewal held still."""
        async with hold.keeper.mutex:
            return await self._drive(operation())

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
        """As ``redislock.Lock.release``: cancelled, it leaves the lock
        reporting not held, lost with reason ``release-unconfirmed``, and
        the release retried in the background."""
        hold = self._releasable()
        await self._paused(hold, partial(self._releasing, hold))

    # Not coroutine functions, as in redis-py: the checks of local state
    # raise at the call, the round trips happen when awaited.

    def extend(
        self, additional_time: float, replace_ttl: bool = False
    ) -> Awaitable[Literal[True]]:
        hold = self._renewable("extend")
        return self._paused(hold, partial(self._extending, hold, additional_time, replace_ttl))

    def reacquire(self) -> Awaitable[Literal[True]]:
        hold = self._renewable("reacquire")
        return self._paused(hold, partial(self._renewing, hold, self.lease, "reacquire"))

    def renew(self, ttl: Optional[float] = None) -> Awaitable[Literal[True]]:
        """As ``redislock.Lock.renew``."""
        hold = self._renewable("renew", need_timeout=False)
        return self._paused(hold, partial(self._renewing, hold, ttl, "renew"))

    async def resume(
        self, token: Any, fence: Optional[int] = None, ttl: Optional[float] = None
    ) -> Literal[True]:
        """As ``redislock.Lock.resume``."""
        return await self._drive(self._resuming(token, fence, ttl))


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


class MultiLock(MultiLockBase, Lock):
    __doc__ = MultiLockBase.__doc__

    async def __aenter__(self) -> "MultiLock":
        if await self.acquire():
            return self
        raise self._not_acquired()


class Semaphore(SemaphoreBase):
    __doc__ = SemaphoreBase.__doc__
    _Lock = Permit

    async def acquire(
        self,
        blocking: Optional[bool] = None,
        blocking_timeout: Optional[float] = None,
        *,
        permits: int = 1,
    ) -> Optional[Permit]:
        """As ``redislock.Semaphore.acquire``; cancelled, it leaves no permit
        behind."""
        permit = self._permit(permits)
        acquired = await permit.acquire(blocking=blocking, blocking_timeout=blocking_timeout)
        self._refusal.reason = permit.not_acquired_reason
        return permit if acquired else None
