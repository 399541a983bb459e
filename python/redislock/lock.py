"""The synchronous Lock: redis-py's ``redis.lock.Lock`` interface on ``LOCK.*``.

The logic is in ``_core``; this module performs its steps with blocking I/O
and looks after each hold with daemon threads. Layout: the transport helpers
(a blocking wait on a connection of its own, plain and cluster), a hold's
``_Signal`` (its ``lost``) and ``_Keeper`` (deadline timer, renewal and
connection watch threads), then ``Lock`` itself.
"""

import heapq
import itertools
import logging
import os
import select
import sys
import threading
import time
from functools import partial
from types import TracebackType
from typing import Any, Callable, Literal, NamedTuple, Optional, Type

from redis.exceptions import LockError, ResponseError

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


# ---------------------------------------------------------------------------
# Transport: a server-side wait outlives the client's socket_timeout
# ---------------------------------------------------------------------------


class _Binding(NamedTuple):
    """An ephemeral hold's own connection and the pool it goes back to."""

    conn: Any
    pool: Any


def _acquire_on(pool: Any, step: Acquire) -> Any:
    """Perform an ``Acquire`` step on a connection taken from ``pool``. With
    ``keep`` a granted hold keeps the connection: (reply, binding)."""
    conn = pool.get_connection()
    kept = False
    try:
        if step.asking:
            conn.send_command("ASKING")
            conn.read_response()
        conn.send_command(*step.args)
        reply = conn.read_response(timeout=read_timeout(conn, step.wait))
        if not step.keep:
            return reply
        kept = reply is not None
        return reply, _Binding(conn, pool) if kept else None
    except ResponseError:
        raise  # a well-formed error reply: the connection is fine
    except BaseException:
        conn.disconnect()
        raise
    finally:
        if not kept:
            pool.release(conn)


# ---------------------------------------------------------------------------
# A hold's keeper: deadline, renewal, connection watch
# ---------------------------------------------------------------------------

# Every background thread of this module is named with this prefix
# (``running()`` counts them).
THREAD_PREFIX = "redislock-"

# Linux reports a peer's close as POLLRDHUP without reporting data as well.
_CLOSED = getattr(select, "POLLRDHUP", 0x2000) | select.POLLHUP | select.POLLERR


def _timer_lead() -> float:
    """How much before a deadline its timer wakes: a thread waking from a
    wait needs the GIL back, which the application's threads hand over only
    every switch interval (5 ms by default); two of them leave room."""
    return 2 * sys.getswitchinterval()


def _start(target: Callable[[], Any], what: str, name: Any) -> threading.Thread:
    thread = threading.Thread(target=target, name=f"{THREAD_PREFIX}{what}:{name!r}", daemon=True)
    thread.start()
    return thread


def running() -> int:
    """Background threads of this module still alive (renewals, deadline
    timers, connection watches, releases retried), across every lock."""
    return sum(1 for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX))


class _Signal(threading.Event):
    """A hold's ``lost``: a ``threading.Event`` that also compares the hold's
    deadline whenever it is read or waited on, so a loss is seen on time
    even while the timer thread waits for the GIL."""

    def __init__(self, hold: Optional[Hold]):
        super().__init__()
        self.hold = hold

    def is_set(self) -> bool:
        if super().is_set():
            return True
        # The hold's reason is set just before the Event: a loss another
        # thread is signalling right now reads as set already.
        return self.hold is not None and self.hold.check() is not None

    isSet = is_set

    def wait(self, timeout: Optional[float] = None) -> bool:
        end = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            now = time.monotonic()
            left = None if end is None else end - now
            if left is not None and left <= 0:
                return False
            hold = self.hold
            if hold is not None and hold.reason is None and not hold.ended:
                until = max(0.0, hold.deadline - now)
                left = until if left is None else min(left, until)
            super().wait(None if left is None else min(left, threading.TIMEOUT_MAX))
        return True


class _Deadlines:
    """One daemon thread that fires the deadline of every hold of the
    process (a thread per hold would cost a thread start per acquire). It
    only sets signals, which cannot block; logging and ``on_lost`` run on a
    thread of their own. It ends after a moment with nothing to watch."""

    IDLE = 0.5  # seconds with no deadline before the thread ends

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.heap: list = []  # (when, sequence, keeper)
        self.sequence = itertools.count()
        self.thread: Optional[threading.Thread] = None

    def arm(self, keeper: "_Keeper", when: float) -> None:
        with self.cond:
            heapq.heappush(self.heap, (when, next(self.sequence), keeper))
            if self.thread is None:
                self.thread = _start(self._run, "deadlines", "every lock")
            elif self.heap[0][2] is keeper:
                self.cond.notify()

    def drop(self) -> None:
        """A keeper stopped: let the thread drop its entry (and end when
        none is left) instead of sleeping until that deadline."""
        with self.cond:
            self.cond.notify()

    def _run(self) -> None:
        self.cond.acquire()
        try:
            while True:
                if not self.heap:
                    if not self.cond.wait(self.IDLE) and not self.heap:
                        self.thread = None
                        return
                    continue
                when, _, keeper = self.heap[0]
                if keeper.stopped or keeper.when != when:  # stale
                    heapq.heappop(self.heap)
                    continue
                left = when - time.monotonic()
                if left > 0:
                    self.cond.wait(min(left, threading.TIMEOUT_MAX))
                    continue
                heapq.heappop(self.heap)
                self.cond.release()
                try:
                    keeper.due()
                finally:
                    self.cond.acquire()
        finally:
            self.cond.release()


_deadlines = _Deadlines()


class _Keeper:
    """What looks after one hold: its deadline (on the shared ``_Deadlines``
    thread), a renewal thread (with automatic renewal) and, for an ephemeral
    hold, a thread watching its own connection. ``mutex`` is held while a
    ``LOCK.RENEW`` is in flight and while the owner changes the lease or
    releases: so no renewal is ever sent after a release."""

    def __init__(self, lock: "Lock", hold: Hold):
        self.lock = lock
        self.hold = hold
        self.mutex = threading.RLock()
        # Guards stopped, renewing and the pipe; notified when any of them or
        # the hold's deadline changes.
        self.cond = threading.Condition()
        self.stopped = False
        self.renewing = lock.auto_renewal
        self.when = 0.0  # the deadline timer armed last
        self.rearm()
        if self.renewing:
            _start(self._renewing, "renew", lock.name)
        self.pipe: Optional[tuple] = None
        if hold.binding is not None:
            self.pipe = os.pipe()
            _start(self._watching, "watch", lock.name)

    def rearm(self) -> None:
        with self.cond:
            self.cond.notify_all()
            if self.stopped:
                return
            # A little before the deadline: ``_timer_lead``.
            self.when = self.hold.deadline - _timer_lead()
        _deadlines.arm(self, self.when)

    def due(self) -> None:
        """The deadline timer fired (on the shared thread)."""
        if self.stopped:
            return
        if time.monotonic() < self.hold.deadline - _timer_lead():
            self.rearm()  # renewed meanwhile
            return
        self.hold.lose(EXPIRED, "the lease ended before a renewal got through", defer=True)

    def stop_renewing(self) -> None:
        with self.cond:
            self.renewing = False
            self.cond.notify_all()

    def stop(self, report: Optional[str] = None) -> None:
        """Stop everything; ``report``: a loss to log and call ``on_lost``
        about on a thread of its own (so the thread that noticed it goes on)."""
        with self.cond:
            first = not self.stopped
            self.stopped = True
            self.renewing = False
            self.cond.notify_all()
            if self.pipe is not None:
                os.write(self.pipe[1], b"x")
        if first:
            _deadlines.drop()
        if report is not None and first:
            _start(partial(self.hold.report, report), "lost", self.lock.name)

    def called_back(self, result: Any) -> None:
        pass

    def _renewing(self) -> None:
        hold = self.hold
        while True:
            with self.cond:
                while self.renewing:
                    left = hold.renew_at - time.monotonic()
                    if left <= 0:
                        break
                    self.cond.wait(min(left, threading.TIMEOUT_MAX))
                if not self.renewing:
                    return
            with self.mutex:
                if not self.renewing or not self.lock._drive(ticking(hold)):
                    return

    def _watching(self) -> None:
        """Block until the hold's own connection closes (or the keeper
        stops): the server has ended the hold then, so it is lost at once."""
        assert self.pipe is not None
        sock = getattr(self.hold.binding.conn, "_sock", None)
        closed = sock is None
        if not closed:
            poller = select.poll()
            poller.register(sock.fileno(), _CLOSED)
            poller.register(self.pipe[0], select.POLLIN)
            events = poller.poll()
            closed = any(fd != self.pipe[0] for fd, _ in events)
        with self.cond:
            stopped = self.stopped
            os.close(self.pipe[0])
            os.close(self.pipe[1])
            self.pipe = None
        if closed and not stopped:
            self.hold.disconnected()


# ---------------------------------------------------------------------------
# The lock
# ---------------------------------------------------------------------------


class Lock(LockCore):
    """A distributed lock with redis-py's ``Lock`` interface, on ``LOCK.*``.

    Differences from redis-py (the rest keeps its meaning):

    - A blocking ``acquire`` waits in the server's queue (first come, first
      served) instead of polling; ``sleep`` only paces the tries while the
      key holds a value of another type, which the server queues nobody on.
    - ``timeout=None`` (or 0), "no expiry" in redis-py, holds a lease of
      ``no_timeout_lease`` seconds (30) renewed automatically by a daemon
      thread: the lock stays held while the process lives and frees itself
      at most 30 s after it dies.
    - ``fence`` holds the fencing token of the current hold.
    - Acquiring again with the same ``token`` reenters (the server counts);
      each ``release`` undoes one acquisition.
    - ``auto_renewal=True`` renews a lock with a ``timeout`` every third of
      it; ``lost`` (an Event, this thread's last hold's) and ``on_lost(lock)``
      report a hold that ended under it (a renewal refused, its lease ran out
      unrenewed, its ephemeral connection closed, its release did not
      complete), never after the server's lease end; ``lost_reason`` says
      why and ``held`` whether this thread still holds it.
    - ``renew(ttl)`` renews with a new lease, ``stop_renewal()`` stops the
      automatic renewal without releasing, ``resume(token, fence)``
      continues a hold another process took.
    """

    _Signal = _Signal
    _Keeper = _Keeper
    _Mutex = threading.Lock
    _log = logger
    _names_errors = True

    # -- performing the core's steps -------------------------------------------

    def _drive(self, steps: Steps) -> Any:
        """Run one of the core's operations to its result, performing each
        step it yields. Any exception, Ctrl-C included, goes back to
        the operation: it may have to release a grant first."""
        run = Run(steps)
        while not run.done:
            try:
                reply = self._perform(run.step)
            except BaseException as error:
                run.failed(error)
            else:
                run.replied(reply)
        return run.result

    def _perform(self, step: Any) -> Any:
        if isinstance(step, Call):
            return self.redis.execute_command(*step.args)
        if isinstance(step, Acquire):
            node = self.redis if step.node is None else self.redis.get_redis_connection(step.node)
            return _acquire_on(node.connection_pool, step)
        if isinstance(step, RefreshSlots):
            return self.redis.nodes_manager.initialize()
        if isinstance(step, Sleep):
            return time.sleep(step.seconds)
        if isinstance(step, Cleanup):
            return self._drive(step.steps)
        if isinstance(step, Background):
            _start(partial(self._drive, step.steps), "release", self.name)
            return None
        if isinstance(step, CallOn):
            conn = step.binding.conn
            conn.send_command(*step.args)
            return conn.read_response()
        if isinstance(step, Unbind):
            step.binding.conn.disconnect()
            return step.binding.pool.release(step.binding.conn)
        raise TypeError(f"not a step: {step!r}")

    def _paused(self, hold: Hold, operation: Callable[[], Steps]) -> Any:
        """Drive ``operation()`` with ``hold``'s renewal held still."""
        with hold.keeper.mutex:
            return self._drive(operation())

    # -- context manager (as redis-py) ---------------------------------------

    def __enter__(self) -> "Lock":
        if self.acquire():
            return self
        raise self._not_acquired()

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc_value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        try:
            self.release()
        except LockError:
            if not self._exit_tolerates():
                raise

    # -- commands -------------------------------------------------------------

    def acquire(
        self,
        sleep: Optional[float] = None,
        blocking: Optional[bool] = None,
        blocking_timeout: Optional[float] = None,
        token: Optional[Any] = None,
    ) -> bool:
        """Take the lock; True once held, False if not within the time allowed.

        ``blocking=False``: one attempt. Blocking: wait in the server's queue
        for at most ``blocking_timeout`` seconds (None: without a limit).
        ``token``: the owner string to use (default: a random one); the
        current owner's token reenters. ``sleep``: the pause between tries
        while the key holds a value of another type (taken, in redis-py's
        terms, but nothing the server can queue us on).

        An exception (or Ctrl-C) leaves no hold behind: a grant that crossed
        it is released (if the server can still be reached)."""
        return self._drive(self._acquiring(sleep, blocking, blocking_timeout, token))

    def locked(self) -> bool:
        """True if anyone holds the lock (or the key holds another value)."""
        return self._drive(self._locked())

    def owned(self) -> bool:
        """True if this thread's token holds the lock."""
        return self._drive(self._owned())

    def release(self) -> None:
        """Undo one acquisition; the lock is free when the count reaches 0.

        Raises LockError when this thread holds no token, LockNotOwnedError
        when the hold was lost (``lost_reason`` says why). A release that did not
        complete (an exception, Ctrl-C) leaves the lock reporting not held,
        lost with reason ``release-unconfirmed``, and is retried in the
        background until it lands or the lease ends."""
        hold = self._releasable()
        self._paused(hold, partial(self._releasing, hold))

    def extend(self, additional_time: float, replace_ttl: bool = False) -> Literal[True]:
        """Add ``additional_time`` seconds to the lease left (or, with
        ``replace_ttl``, make the lease exactly that long: the hold's lease
        from now on, which automatic renewal and ``reacquire`` then use)."""
        hold = self._renewable("extend")
        return self._paused(hold, partial(self._extending, hold, additional_time, replace_ttl))

    def reacquire(self) -> Literal[True]:
        """Reset the lease to the hold's lease (``timeout``, or the last
        ``extend(..., replace_ttl=True)``/``renew(ttl)``) from now."""
        hold = self._renewable("reacquire")
        return self._paused(hold, partial(self._renewing, hold, self.lease, "reacquire"))

    def renew(self, ttl: Optional[float] = None) -> Literal[True]:
        """Renew this thread's hold now: its lease becomes ``ttl`` seconds
        (None: the hold's current lease) from now, and stays that (automatic
        renewal renews to it). Works for any hold, ``timeout=None`` too.
        Raises LockNotOwnedError if the hold was lost."""
        hold = self._renewable("renew", need_timeout=False)
        return self._paused(hold, partial(self._renewing, hold, ttl, "renew"))

    def resume(
        self, token: Any, fence: Optional[int] = None, ttl: Optional[float] = None
    ) -> Literal[True]:
        """Continue in this thread a hold another process took under
        ``token`` (its ``fence`` too, if known: else it is read from the
        server): renewed to ``ttl`` seconds (None: ``timeout``) at once,
        which confirms it is still held, then looked after as if acquired
        here (automatic renewal, ``lost``, ``release``). Raises
        LockNotOwnedError if ``token`` holds nothing. Not for ephemeral
        holds: they end with the connection that took them."""
        return self._drive(self._resuming(token, fence, ttl))


# ---------------------------------------------------------------------------
# Shared holds
# ---------------------------------------------------------------------------


class ReadWriteLock(ReadWriteLockBase):
    __doc__ = ReadWriteLockBase.__doc__
    _Lock = Lock


class Permit(Lock):
    """One permit of a ``Semaphore``: a ``Lock`` already held (``fence``,
    ``release``, ``extend``, ``lost``), released when its ``with`` block
    ends."""

    def __enter__(self) -> "Permit":
        if self.token is not None or self.acquire():
            return self
        raise self._not_acquired()


class MultiLock(MultiLockBase, Lock):
    __doc__ = MultiLockBase.__doc__

    def __enter__(self) -> "MultiLock":
        if self.acquire():
            return self
        raise self._not_acquired()


class Semaphore(SemaphoreBase):
    __doc__ = SemaphoreBase.__doc__
    _Lock = Permit

    def acquire(
        self,
        blocking: Optional[bool] = None,
        blocking_timeout: Optional[float] = None,
        *,
        permits: int = 1,
    ) -> Optional[Permit]:
        """A permit (use it in a ``with`` block, or ``release`` it), or None
        if none came within the time allowed; the defaults are the
        semaphore's. ``permits=k`` takes k of the semaphore's permits as one
        hold (one fence, one lease, one release), first come first served:
        a request for more permits than are free waits at the head of the
        queue, and smaller ones behind it wait behind it."""
        permit = self._permit(permits)
        acquired = permit.acquire(blocking=blocking, blocking_timeout=blocking_timeout)
        self._refusal.reason = permit.not_acquired_reason
        return permit if acquired else None
