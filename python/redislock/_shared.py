"""Shared holds, for the sync and the asyncio package alike: a read-write
lock (``ReadWriteLock``: ``read_lock()`` and ``write_lock()``, each shaped
like ``Lock``) and a counting semaphore (``Semaphore``) whose permits are
leased holds, each with its own token, fence, renewal and ``lost``.

The server keeps one first-come-first-served queue for both modes: readers
at its head are granted together, a writer waits for every reader to end,
and readers behind a waiting writer wait behind it. A semaphore is a shared
lock with a ``LIMIT``: at most that many permits are held at once, and a
permit whose holder dies ends with its lease. A transport module subclasses
these with its own ``Lock`` class (``_Lock``) and its own ``acquire``.
"""

import threading
from typing import Any, Callable, Optional

from ._common import shared_mode


class ReadWriteLockBase:
    """A read-write lock on ``name``. The options are ``Lock``'s, and apply
    to both sides: ``timeout`` is each hold's lease (None: renewed
    automatically while the process lives), ``blocking``/``blocking_timeout``
    how long an acquisition waits."""

    _Lock: Any  # the transport's Lock class

    def __init__(
        self,
        redis: Any,
        name: Any,
        timeout: Optional[float] = None,
        sleep: float = 0.1,
        blocking: bool = True,
        blocking_timeout: Optional[float] = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
        *,
        auto_renewal: Optional[bool] = None,
        on_lost: Optional[Callable[[Any], Any]] = None,
        ephemeral: bool = False,
    ):
        self.redis = redis
        self.name = name
        options = dict(
            ephemeral=ephemeral,
            timeout=timeout,
            sleep=sleep,
            blocking=blocking,
            blocking_timeout=blocking_timeout,
            thread_local=thread_local,
            raise_on_release_error=raise_on_release_error,
            auto_renewal=auto_renewal,
            on_lost=on_lost,
        )
        self._read = self._Lock(redis, name, **options)
        self._read._mode = shared_mode()
        self._write = self._Lock(redis, name, **options)
        # One owner for both sides (per thread where per-thread): the writer
        # reenters when it reads, and a reader asking to write is refused.
        self._read._sibling = self._write
        self._write._sibling = self._read

    def read_lock(self) -> Any:
        """The read side: held by any number of readers at once, never
        beside the writer. The same object every time (its tokens are per
        thread, as a ``Lock``'s), so ``with rw.read_lock():`` works anywhere.
        The writer may also take the read side: that reenters its hold."""
        return self._read

    def write_lock(self) -> Any:
        """The write side: held alone. A reader asking for it is refused
        at once with ``LockUpgradeError`` (two readers upgrading would wait
        on each other forever): release the read side first."""
        return self._write


class SemaphoreBase:
    """A counting semaphore of ``limit`` permits on ``name``. Each permit is
    a hold of its own: ``timeout`` is its lease (None: renewed automatically
    while the process lives, and ended at most 30 s after it dies),
    ``blocking``/``blocking_timeout`` how long ``acquire`` waits by default.
    Every semaphore on a name must use the same ``limit`` while permits are
    held or requested (the server refuses another with an error)."""

    _Lock: Any  # the transport's Lock class (a permit is one)

    def __init__(
        self,
        redis: Any,
        name: Any,
        limit: int,
        timeout: Optional[float] = None,
        blocking: bool = True,
        blocking_timeout: Optional[float] = None,
        *,
        auto_renewal: Optional[bool] = None,
        on_lost: Optional[Callable[[Any], Any]] = None,
        ephemeral: bool = False,
    ):
        self._mode = shared_mode(limit)
        self.ephemeral = ephemeral
        self.redis = redis
        self.name = name
        self.limit = limit
        self.timeout = timeout
        self.blocking = blocking
        self.blocking_timeout = blocking_timeout
        self.auto_renewal = auto_renewal
        self.on_lost = on_lost
        # Why this thread's last acquire came back without a permit.
        self._refusal = threading.local()

    @property
    def not_acquired_reason(self) -> Optional[str]:
        """Why this thread's last ``acquire`` returned None: ``held`` (a
        single try found every permit taken), ``timeout`` or ``quarantine``
        (as ``Lock.not_acquired_reason``); None after it returned a permit."""
        return getattr(self._refusal, "reason", None)

    def _permit(self, permits: int = 1) -> Any:
        whole = isinstance(permits, int) and not isinstance(permits, bool)
        if not whole or not 1 <= permits <= self.limit:
            raise ValueError(
                f"a semaphore's request takes 1 to its limit ({self.limit}) of permits, "
                f"not {permits!r}"
            )
        permit = self._Lock(
            self.redis,
            self.name,
            timeout=self.timeout,
            blocking=self.blocking,
            blocking_timeout=self.blocking_timeout,
            thread_local=False,
            auto_renewal=self.auto_renewal,
            on_lost=self.on_lost,
            ephemeral=self.ephemeral,
        )
        # One permit is the server's default: servers that predate PERMITS
        # keep serving single permits.
        permit._mode = self._mode if permits == 1 else (*self._mode, "PERMITS", permits)
        return permit
