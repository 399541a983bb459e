"""The synchronous Lock: redis-py's ``redis.lock.Lock`` interface on ``LOCK.*``.

Layout: the transport helpers (a blocking wait on a connection of its own,
plain and cluster), the ``_Renewer`` (one daemon thread per hold), then
``Lock`` itself.
"""

import logging
import threading
import time
import uuid
from contextlib import contextmanager
from types import SimpleNamespace, TracebackType
from typing import Any, Callable, Dict, Iterator, Literal, Optional, Type

from redis.exceptions import (
    AskError,
    ConnectionError,
    LockError,
    LockNotOwnedError,
    MovedError,
    ResponseError,
    TimeoutError,
)

from ._common import (
    NO_TIMEOUT_LEASE,
    OTHER_VALUE,
    Budget,
    acquire_args,
    hold_is_gone,
    is_wrongtype,
    needs_confirmation,
    owned_by,
    parse_info,
    seconds_to_ms,
    translate,
)

logger = logging.getLogger(__name__)

# How soon the renewer tries again after a transport error (it keeps trying
# until the lease it knows of has ended).
RETRY_DELAY = 0.1


# ---------------------------------------------------------------------------
# Transport: a server-side wait outlives the client's socket_timeout
# ---------------------------------------------------------------------------


def _read_timeout(connection: Any, wait: Optional[int]) -> Optional[float]:
    """How long to read the reply to an acquisition with ``WAIT wait`` (None:
    no WAIT): the wait plus the connection's own socket timeout as margin, or
    no limit for ``WAIT 0`` or a connection without a timeout. redis-py 8 sets
    socket_timeout to 5 s by default, which would otherwise cut any longer
    wait (and its retry would requeue us at the back of the line)."""
    margin = getattr(connection, "socket_timeout", None)
    if margin is None or wait == 0:
        return None
    return (wait or 0) / 1000 + margin


def _acquire_on_pool(pool: Any, args: tuple, wait: Optional[int], asking: bool = False) -> Any:
    """Send one ``LOCK.ACQUIRE`` on a connection taken from ``pool`` and read
    its reply with a timeout that fits its wait. Any failure while waiting
    closes that connection: the server then drops us from the queue
    and no late reply can land on a pooled connection.

    Never retried (redis-py's execute_command retries after a connection
    error): if the first attempt had been granted and only its reply lost, a
    retry with the same token would be counted as a reentry, and one release
    would then leave the lock held."""
    conn = pool.get_connection()
    try:
        if asking:
            conn.send_command("ASKING")
            conn.read_response()
        conn.send_command(*args)
        return conn.read_response(timeout=_read_timeout(conn, wait))
    except ResponseError:
        raise  # a well-formed error reply: the connection is fine
    except BaseException:
        conn.disconnect()
        raise
    finally:
        pool.release(conn)


def _acquire_call(client: Any, name: Any, args: tuple, wait: Optional[int]) -> Any:
    """Run a ``LOCK.ACQUIRE`` on a plain or cluster client."""
    if not hasattr(client, "nodes_manager"):
        return _acquire_on_pool(client.connection_pool, args, wait)
    # RedisCluster: go to the node that owns the key's slot; follow a MOVED
    # (slots changed: refresh the map) or an ASK (slot being migrated: the
    # lock already lives on the target, which serves the wait) a few times.
    target = None
    for _ in range(5):
        node = target or client.get_node_from_key(name)
        pool = client.get_redis_connection(node).connection_pool
        try:
            return _acquire_on_pool(pool, args, wait, asking=target is not None)
        except MovedError:
            client.nodes_manager.initialize()
            target = None
        except AskError as e:
            target = client.get_node(host=e.host, port=e.port)
            if target is None:
                client.nodes_manager.initialize()
    raise LockError("too many cluster redirections for LOCK.ACQUIRE", lock_name=name)


# ---------------------------------------------------------------------------
# Automatic renewal
# ---------------------------------------------------------------------------


class _Renewer:
    """Renews one hold every third of its lease until stopped.

    ``mutex`` is held while a ``LOCK.RENEW`` is in flight and while the owner
    sends ``LOCK.RELEASE``: so no renewal is ever sent after a release. The
    loss deadline (the end of the last lease the server confirmed, measured
    from when that command was sent) is watched by a timer, not by the
    renewing thread, because that thread may be stuck in a paused server."""

    def __init__(self, lock: "Lock", token: bytes, lease: float, start: float):
        self.lock = lock
        self.token = token
        self.lease = lease
        self.mutex = threading.RLock()
        self.state = threading.Lock()  # guards stopped, deadline, timer
        self.stopped = False
        self.deadline = start + lease
        self.timer: Optional[threading.Timer] = None
        self.wake = threading.Event()
        with self.state:
            self._arm()
        self.thread = threading.Thread(
            target=self._run, name=f"redislock-renew:{lock.name!r}", daemon=True
        )
        self.thread.start()

    def _arm(self) -> None:
        # Caller holds self.state.
        if self.timer is not None:
            self.timer.cancel()
        self.timer = threading.Timer(
            max(0.0, self.deadline - time.monotonic()), self._deadline_passed
        )
        self.timer.daemon = True
        self.timer.start()

    def confirmed(self, deadline: float) -> None:
        """The server confirmed a lease ending at ``deadline`` (monotonic).
        Callers hold ``mutex``, so confirmations arrive in command order."""
        with self.state:
            if self.stopped:
                return
            self.deadline = deadline
            self._arm()

    def stop(self) -> None:
        with self.state:
            self.stopped = True
            if self.timer is not None:
                self.timer.cancel()
        self.wake.set()

    def _run(self) -> None:
        interval = self.lease / 3
        delay = interval
        lease_ms = seconds_to_ms(self.lease)
        while not self.wake.wait(delay):
            with self.mutex:
                if self.stopped:
                    return
                sent = time.monotonic()
                if self.deadline - sent > self.lease:
                    delay = interval  # extend() gave more than a renewal would
                    continue
                try:
                    self.lock._renew(self.token, lease_ms)
                except ResponseError as e:
                    if hold_is_gone(e):
                        self._lose(f"the server refused a renewal ({str(e).split()[0]})")
                        return
                    logger.warning("renewing %r failed: %s", self.lock.name, e)
                    delay = RETRY_DELAY
                    continue
                except (ConnectionError, TimeoutError, OSError) as e:
                    logger.warning("renewing %r failed, retrying: %s", self.lock.name, e)
                    delay = RETRY_DELAY
                    continue
                self.confirmed(sent + self.lease)
                delay = interval

    def _deadline_passed(self) -> None:
        with self.state:
            if self.stopped or time.monotonic() < self.deadline:
                return
        self._lose("the lease ended before a renewal got through")

    def _lose(self, why: str) -> None:
        with self.state:
            if self.stopped:
                return
            self.stopped = True
            if self.timer is not None:
                self.timer.cancel()
        self.wake.set()
        logger.warning("lock %r lost: %s", self.lock.name, why)
        self.lock.lost.set()
        if self.lock.on_lost is not None:
            try:
                self.lock.on_lost(self.lock)
            except Exception:
                logger.exception("on_lost callback of lock %r failed", self.lock.name)


# ---------------------------------------------------------------------------
# The lock
# ---------------------------------------------------------------------------


class Lock:
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

    no_timeout_lease: float = NO_TIMEOUT_LEASE

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
        on_lost: Optional[Callable[["Lock"], Any]] = None,
    ):
        self.redis = redis
        self.name = name
        self.timeout = timeout
        self.sleep = sleep  # waiting is server-side, but a value of another type is polled
        self.blocking = blocking
        self.blocking_timeout = blocking_timeout
        self.thread_local = bool(thread_local)
        self.raise_on_release_error = raise_on_release_error
        # None: renew exactly when redis-py would never expire the lock.
        self.auto_renewal = (not timeout) if auto_renewal is None else bool(auto_renewal)
        self.on_lost = on_lost
        self.lost = threading.Event()
        # Per thread (as in redis-py): token, fence and renewer of this hold.
        self.local = threading.local() if self.thread_local else SimpleNamespace()
        self.local.token = None

    # -- context manager (as redis-py) ---------------------------------------

    def __enter__(self) -> "Lock":
        if self.acquire():
            return self
        raise LockError(
            "Unable to acquire lock within the time specified", lock_name=self.name
        )

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc_value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        try:
            self.release()
        except LockError:
            if self.raise_on_release_error:
                raise
            logger.warning(
                "Lock was unlocked or no longer owned when exiting context manager."
            )

    # -- state ----------------------------------------------------------------

    @property
    def token(self) -> Optional[bytes]:
        """This thread's token while it holds the lock, else None."""
        return getattr(self.local, "token", None)

    @property
    def fence(self) -> Optional[int]:
        """The fencing token of the current hold (None when not held): pass it
        to the resource you protect, which rejects a lower one than it saw."""
        return getattr(self.local, "fence", None) if self.token is not None else None

    @property
    def lease(self) -> float:
        """The lease in seconds each acquisition and renewal asks for."""
        return float(self.timeout) if self.timeout else float(self.no_timeout_lease)

    # -- commands -------------------------------------------------------------

    def _execute(self, *args: Any) -> Any:
        try:
            return self.redis.execute_command(*args)
        except ResponseError as e:
            raise translate(e, self.name) from None

    def _renew(self, token: bytes, ttl_ms: int) -> Any:
        return self._execute("LOCK.RENEW", self.name, token, ttl_ms)

    def _encode(self, value: Any) -> bytes:
        return self.redis.get_encoder().encode(value)

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
        token = uuid.uuid4().hex.encode() if token is None else self._encode(token)
        if sleep is None:
            sleep = self.sleep
        if blocking is None:
            blocking = self.blocking
        if blocking_timeout is None:
            blocking_timeout = self.blocking_timeout
        budget = Budget(blocking, blocking_timeout, time.monotonic())
        while True:
            sent = time.monotonic()
            try:
                fence = self._try_acquire(token, budget.wait(sent))
            except ResponseError as e:
                if not is_wrongtype(e):
                    raise translate(e, self.name) from None
                # Taken, in redis-py's terms, by a value the server queues
                # nobody on: try again later, as redis-py polls.
                if not budget.again(time.monotonic(), sleep):
                    return False
                time.sleep(sleep)
                continue
            if fence is None:
                return False
            if self.token != token and needs_confirmation(time.monotonic() - sent, self.lease):
                sent = time.monotonic()
                if not self._confirm(token):
                    # Granted, but over before we knew: queue again if time is left.
                    if budget.again(time.monotonic()):
                        continue
                    return False
            self._held(token, int(fence), sent)
            return True

    def _try_acquire(self, token: bytes, wait: Optional[int]) -> Any:
        """One ``LOCK.ACQUIRE``: the fence, or None. An error reply granted
        nothing; any other failure (a timeout, a lost connection, Ctrl-C) may
        have crossed a grant, so that is released before the failure goes on."""
        args = acquire_args(self.name, token, seconds_to_ms(self.lease), wait)
        try:
            return _acquire_call(self.redis, self.name, args, wait)
        except ResponseError:
            raise
        except BaseException:
            self._abandon(token)
            raise

    def _confirm(self, token: bytes) -> bool:
        """Renew a fresh grant whose reply came late (see needs_confirmation):
        False if its hold has ended already. Failures as in _try_acquire."""
        try:
            self._renew(token, seconds_to_ms(self.lease))
        except ResponseError as e:
            if hold_is_gone(e):
                return False
            self._abandon(token)
            raise
        except BaseException:
            self._abandon(token)
            raise
        return True

    def _abandon(self, token: bytes) -> None:
        """Release what an interrupted acquisition may have been granted: a
        hold whose token nobody knows keeps everyone out for its whole lease.
        Not for this thread's own token: that acquisition was a reentry that
        may or may not have counted, and a release could end the hold itself."""
        if token == self.token:
            return
        self._release_abandoned(token)

    def _release_abandoned(self, token: bytes) -> None:
        try:
            self._execute("LOCK.RELEASE", self.name, token)
        except Exception as e:  # the caller sees the failure that brought us here
            if not (isinstance(e, ResponseError) and hold_is_gone(e)):
                logger.warning("releasing %r after a failed acquire failed: %s", self.name, e)

    def _held(self, token: bytes, fence: int, start: float) -> None:
        """Record a successful acquisition in this thread's state. ``start``:
        when the command that granted (or confirmed) the lease was sent. The
        server started the lease later, so the loss deadline counted from
        here can come early, never late."""
        renewer = getattr(self.local, "renewer", None)
        if self.token == token:  # a reentry: the lease was reset, same hold
            if renewer is not None:
                with renewer.mutex:
                    renewer.confirmed(start + self.lease)
            return
        if renewer is not None:
            renewer.stop()  # a hold this thread forgot about (new token)
        self.local.token = token
        self.local.fence = fence
        self.lost.clear()
        self.local.renewer = (
            _Renewer(self, token, self.lease, start) if self.auto_renewal else None
        )

    def _forget(self) -> None:
        renewer = getattr(self.local, "renewer", None)
        if renewer is not None:
            renewer.stop()
        self.local.renewer = None
        self.local.token = None
        self.local.fence = None

    def _info(self) -> Optional[Dict[str, Any]]:
        """The lock's ``LOCK.INFO`` fields (None: free); ``OTHER_VALUE`` when
        the key holds a value of another type."""
        try:
            return parse_info(self._execute("LOCK.INFO", self.name))
        except ResponseError as e:
            if not is_wrongtype(e):
                raise
            return OTHER_VALUE

    def locked(self) -> bool:
        """True if anyone holds the lock (or the key holds another value)."""
        return self._info() is not None

    def owned(self) -> bool:
        """True if this thread's token holds the lock."""
        token = self.token
        return owned_by(self._info(), token, self._encode)

    def release(self) -> None:
        """Undo one acquisition; the lock is free when the count reaches 0.

        Raises LockError when this thread holds no token, LockNotOwnedError
        when the server says the token no longer holds the lock."""
        token = self.token
        if token is None:
            raise LockError(
                "Cannot release a lock that's not owned or is already unlocked.",
                lock_name=self.name,
            )
        # With the renewer held: no renewal can be in flight during, or be
        # sent after, the release.
        with self._renewal_paused():
            try:
                remaining = self._execute("LOCK.RELEASE", self.name, token)
            except LockError:
                raise
            except ResponseError as e:
                if not hold_is_gone(e):
                    raise
                self._forget()
                raise LockNotOwnedError(
                    "Cannot release a lock that's no longer owned", lock_name=self.name
                ) from None
            if int(remaining) == 0:
                self._forget()

    def extend(self, additional_time: float, replace_ttl: bool = False) -> Literal[True]:
        """Add ``additional_time`` seconds to the lease left (or, with
        ``replace_ttl``, make the lease exactly that long)."""
        token = self.token
        if token is None:
            raise LockError("Cannot extend an unlocked lock", lock_name=self.name)
        if self.timeout is None:
            raise LockError("Cannot extend a lock with no timeout", lock_name=self.name)
        with self._renewal_paused() as renewer:
            return self._extend(token, additional_time, replace_ttl, renewer)

    def _extend(
        self, token: bytes, additional_time: float, replace_ttl: bool, renewer: Any
    ) -> Literal[True]:
        sent = time.monotonic()
        ttl_ms = int(additional_time * 1000)
        if not replace_ttl:
            # The module renews to a ttl from now, so read what is left first.
            # RENEW checks ownership again: a lock lost in between is refused.
            info = self._info()
            if not owned_by(info, token, self._encode):
                raise LockNotOwnedError(
                    "Cannot extend a lock that's no longer owned", lock_name=self.name
                )
            ttl_ms += int(info["ttl"])
        ttl_ms = max(1, ttl_ms)
        self._renew_or_raise(token, ttl_ms, "extend")
        if renewer is not None:
            renewer.confirmed(sent + ttl_ms / 1000)
        return True

    def reacquire(self) -> Literal[True]:
        """Reset the lease to ``timeout`` from now."""
        token = self.token
        if token is None:
            raise LockError("Cannot reacquire an unlocked lock", lock_name=self.name)
        if self.timeout is None:
            raise LockError(
                "Cannot reacquire a lock with no timeout", lock_name=self.name
            )
        with self._renewal_paused() as renewer:
            sent = time.monotonic()
            self._renew_or_raise(token, seconds_to_ms(self.lease), "reacquire")
            if renewer is not None:
                renewer.confirmed(sent + self.lease)
        return True

    @contextmanager
    def _renewal_paused(self) -> Iterator[Optional[_Renewer]]:
        """Hold this thread's renewer (if any) still: no renewal is in flight
        while the caller changes the lease or releases."""
        renewer = getattr(self.local, "renewer", None)
        if renewer is None:
            yield None
            return
        with renewer.mutex:
            yield renewer

    def _renew_or_raise(self, token: bytes, ttl_ms: int, verb: str) -> None:
        try:
            self._renew(token, ttl_ms)
        except LockError:
            raise
        except ResponseError as e:
            if not hold_is_gone(e):
                raise
            raise LockNotOwnedError(
                f"Cannot {verb} a lock that's no longer owned", lock_name=self.name
            ) from None
