"""The synchronous Lock: redis-py's ``redis.lock.Lock`` interface on ``LOCK.*``.

The logic is in ``_core``; this module performs its steps with blocking I/O
and renews with threads. Layout: the transport helpers (a blocking wait on a
connection of its own, plain and cluster), the ``_Renewer`` (one daemon
thread per hold), then ``Lock`` itself.
"""

import logging
import threading
import time
from functools import partial
from types import TracebackType
from typing import Any, Callable, Literal, NamedTuple, Optional, Type

from redis.exceptions import LockError, ResponseError

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
# Automatic renewal
# ---------------------------------------------------------------------------


class _Renewer(Renewal):
    """A daemon thread renewing one hold, a ``threading.Timer`` on its
    deadline (see ``Renewal``). ``mutex`` is held while a ``LOCK.RENEW`` is
    in flight and while the owner changes the lease or releases: so no
    renewal is ever sent after a release."""

    def __init__(self, lock: "Lock", token: bytes, lease: float, start: float):
        self.mutex = threading.RLock()
        self.state = threading.Lock()  # guards stopped, deadline, timer
        self.wake = threading.Event()
        super().__init__(lock, token, lease, start)
        self.thread = threading.Thread(
            target=self._run, name=f"redislock-renew:{lock.name!r}", daemon=True
        )
        self.thread.start()

    def _timer(self, delay: float) -> threading.Timer:
        timer = threading.Timer(delay, self.deadline_passed)
        timer.daemon = True
        timer.start()
        return timer

    def confirmed(self, deadline: float) -> None:
        # Under mutex, so confirmations arrive in command order.
        with self.mutex:
            super().confirmed(deadline)

    def _run(self) -> None:
        delay = self.interval
        while delay is not None and not self.wake.wait(delay):
            with self.mutex:
                delay = self.lock._drive(self.tick())


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
      it; ``lost`` (an Event) and ``on_lost(lock)`` report a hold that ended
      under it (a renewal refused, or its lease ran out unrenewed).
    """

    _Event = threading.Event
    _Renewer = _Renewer
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
        if isinstance(step, CallOn):
            conn = step.binding.conn
            conn.send_command(*step.args)
            return conn.read_response()
        if isinstance(step, Unbind):
            step.binding.conn.disconnect()
            return step.binding.pool.release(step.binding.conn)
        raise TypeError(f"not a step: {step!r}")

    def _paused(self, operation: Callable[[Optional[Renewal]], Steps]) -> Any:
        """Drive ``operation(renewer)`` with this thread's renewer (if any)
        held still."""
        renewer = self._renewer()
        if renewer is None:
            return self._drive(operation(None))
        with renewer.mutex:
            return self._drive(operation(renewer))

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
        when the server says the token no longer holds the lock."""
        token = self._releasable()
        self._paused(lambda renewer: self._releasing(token))

    def extend(self, additional_time: float, replace_ttl: bool = False) -> Literal[True]:
        """Add ``additional_time`` seconds to the lease left (or, with
        ``replace_ttl``, make the lease exactly that long)."""
        token = self._renewable("extend")
        return self._paused(partial(self._extending, token, additional_time, replace_ttl))

    def reacquire(self) -> Literal[True]:
        """Reset the lease to ``timeout`` from now."""
        token = self._renewable("reacquire")
        return self._paused(partial(self._reacquiring, token))


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


class Semaphore(SemaphoreBase):
    __doc__ = SemaphoreBase.__doc__
    _Lock = Permit

    def acquire(
        self, blocking: Optional[bool] = None, blocking_timeout: Optional[float] = None
    ) -> Optional[Permit]:
        """A permit (use it in a ``with`` block, or ``release`` it), or None
        if none came within the time allowed; the defaults are the
        semaphore's."""
        permit = self._permit()
        acquired = permit.acquire(blocking=blocking, blocking_timeout=blocking_timeout)
        return permit if acquired else None
