"""The lock's logic, written once and free of I/O: the sync ``Lock``
(``lock.py``, threads) and the asyncio one (``asyncio.py``, tasks) drive it.

Every operation that talks to the server (acquire, release, extend,
reacquire, locked, owned, one renewal) is a generator here. It yields each
piece of I/O it needs as a *step* (``Call``, ``Acquire``, ``RefreshSlots``,
``Sleep``, ``Cleanup``), is sent the reply or has the failure thrown in, and
returns the operation's result. A transport performs the steps, blocking or
awaiting, and holds nothing else: the token, fence and lease bookkeeping,
the renewer's deadline and loss rules, the argument and state checks, what
each reply or error means (cluster redirections included) and how errors
are translated cannot drift between the two. (psycopg 3 shares its protocol
code between its sync and async connections in the same way.)
"""

import contextlib
import logging
import threading
import time
import uuid
from types import SimpleNamespace
from typing import Any, Callable, ContextManager, Generator, NamedTuple, Optional, Type

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
    own_hold,
    owned_by,
    parse_info,
    seconds_to_ms,
    translate,
)

# How soon the renewer tries again after a transport error (it keeps trying
# until the lease it knows of has ended).
RETRY_DELAY = 0.1

# An operation: yields steps, is sent their replies, returns its result.
Steps = Generator[Any, Any, Any]


# ---------------------------------------------------------------------------
# Steps: the I/O an operation asks its transport for
# ---------------------------------------------------------------------------


class Call(NamedTuple):
    """Send a command through the client's ``execute_command`` (so through
    its retries); the reply comes back, or the client's exception."""

    args: tuple


class Acquire(NamedTuple):
    """Send ``LOCK.ACQUIRE`` on a connection of its own, taken from the
    client's pool or, on a cluster, from ``node`` (after ``ASKING`` if
    ``asking``), and read the reply with a timeout that fits ``wait`` (None:
    no WAIT). Never retried: if a first attempt had been granted and only
    its reply lost, a retry with the same token would count as a reentry,
    and one release would then leave the lock held. Any failure while
    waiting closes that connection, so the server drops us from its queue
    and no late reply lands on a pooled one."""

    args: tuple
    wait: Optional[int]
    node: Any = None
    asking: bool = False
    # An ephemeral hold: the reply comes back as (reply, binding), and a
    # granted hold's connection stays out of the pool (see ``CallOn``).
    keep: bool = False


class CallOn(NamedTuple):
    """Send a command on an ephemeral hold's own connection (``binding``,
    from an ``Acquire`` with ``keep``); a closed connection raises."""

    binding: Any
    args: tuple


class Unbind(NamedTuple):
    """Close an ephemeral hold's own connection and give it back to its pool."""

    binding: Any


class RefreshSlots(NamedTuple):
    """Reload a cluster client's map of which node owns which slot."""


class Sleep(NamedTuple):
    seconds: float


class Cleanup(NamedTuple):
    """Run ``steps`` to their end even if the caller is interrupted again
    meanwhile (asyncio: a second cancel stops the wait for them, not them)."""

    steps: Steps


class Run:
    """One operation as its transport drives it: perform ``step``, hand back
    the reply (``replied``) or the exception (``failed``), until ``done``;
    then ``result`` holds what the operation returned. An exception the
    operation raises comes out of ``replied``/``failed``."""

    def __init__(self, steps: Steps):
        self.steps = steps
        self.done = False
        self.result: Any = None
        self.step: Any = None
        self._resume(steps.send, None)

    def replied(self, reply: Any) -> None:
        self._resume(self.steps.send, reply)

    def failed(self, error: BaseException) -> None:
        self._resume(self.steps.throw, error)

    def _resume(self, resume: Callable[[Any], Any], value: Any) -> None:
        try:
            self.step = resume(value)
        except StopIteration as finished:
            self.done, self.step, self.result = True, None, finished.value


# ---------------------------------------------------------------------------
# Automatic renewal
# ---------------------------------------------------------------------------


class Renewal:
    """The rules of one hold's automatic renewal: renew every third of the
    lease; after a refusal (NOTOWNER, or WRONGTYPE: the hold is gone for
    good) the hold is lost at once; after any other failure retry soon,
    until the lease the client knows of ends, which is a loss too. That
    deadline is the end of the last lease the server confirmed, counted from
    when the confirming command was sent, so it comes early, never late.

    A transport subclass supplies the thread or task that sleeps the delay
    ``tick`` returns between ticks, ``wake`` (an Event of its kind) that ends
    that sleep at once, ``_timer`` to call ``deadline_passed`` at the
    deadline (a timer, not the renewing thread or task, watches it, because
    a renewal may be stuck in a paused server), and ``state``, which guards
    ``stopped``, ``deadline`` and the timer where threads share them."""

    state: ContextManager[Any] = contextlib.nullcontext()
    wake: Any
    timer: Any = None  # the last ``_timer``

    def __init__(self, lock: "LockCore", token: bytes, lease: float, start: float):
        self.lock = lock
        self.token = token
        self.lease = lease
        self.interval = lease / 3
        self.command = ("LOCK.RENEW", lock.name, token, seconds_to_ms(lease))
        # An ephemeral hold's own connection, renewed on (read here, in the
        # thread that holds: the lock's state is per thread).
        self.binding = lock._binding()
        self.stopped = False
        self.deadline = start + lease
        with self.state:
            self._rearm()

    # -- transport hooks ------------------------------------------------------

    def _timer(self, delay: float) -> Any:
        """Start a timer that calls ``deadline_passed`` in ``delay`` seconds;
        return it (it has ``cancel()``)."""
        raise NotImplementedError

    def _called_back(self, result: Any) -> None:
        """What ``on_lost`` returned (asyncio runs a coroutine)."""

    # -- rules ----------------------------------------------------------------

    def _rearm(self) -> None:
        self._disarm()
        self.timer = self._timer(max(0.0, self.deadline - time.monotonic()))

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()

    def confirmed(self, deadline: float) -> None:
        """The server confirmed a lease ending at ``deadline`` (monotonic)."""
        with self.state:
            if self.stopped:
                return
            self.deadline = deadline
            self._rearm()

    def stop(self) -> None:
        with self.state:
            self.stopped = True
            self._disarm()
        self.wake.set()

    def tick(self) -> Steps:
        """One renewal period: renew unless an ``extend`` gave more than a
        renewal would. Returns the delay to the next tick, or None once
        renewing is over (stopped, or the hold lost)."""
        if self.stopped:
            return None
        sent = time.monotonic()
        if self.deadline - sent > self.lease:
            return self.interval
        log = self.lock._log
        binding = self.binding
        try:
            if binding is None:
                yield from self.lock._call(*self.command)
            else:
                # Renewed on the hold's own connection: if it closed, the
                # server has ended the hold already.
                try:
                    yield CallOn(binding, self.command)
                except (ConnectionError, TimeoutError, OSError):
                    self._lose("the ephemeral hold's connection closed")
                    return None
        except ResponseError as e:
            if hold_is_gone(e):
                self._lose(f"the server refused a renewal ({str(e).split()[0]})")
                return None
            log.warning("renewing %r failed: %s", self.lock.name, e)
            return RETRY_DELAY
        except (ConnectionError, TimeoutError, OSError) as e:
            log.warning("renewing %r failed, retrying: %s", self.lock.name, e)
            return RETRY_DELAY
        self.confirmed(sent + self.lease)
        return self.interval

    def deadline_passed(self) -> None:
        with self.state:
            if self.stopped or time.monotonic() < self.deadline:
                return
        self._lose("the lease ended before a renewal got through")

    def _lose(self, why: str) -> None:
        with self.state:
            if self.stopped:  # the timer and a refusal may race: one loss
                return
            self.stopped = True
            self._disarm()
        self.wake.set()
        lock = self.lock
        lock._log.warning("lock %r lost: %s", lock.name, why)
        lock.lost.set()
        if lock.on_lost is not None:
            try:
                self._called_back(lock.on_lost(lock))
            except Exception:
                lock._log.exception("on_lost callback of lock %r failed", lock.name)


# ---------------------------------------------------------------------------
# The lock
# ---------------------------------------------------------------------------


class LockCore:
    """What the sync and the asyncio ``Lock`` share: redis-py's constructor,
    this thread's hold (token, fence, renewer), the checks of local state and
    every operation, as generators of steps. A transport subclass sets the
    class attributes below, performs the steps and gives the public methods
    their sync or async form."""

    no_timeout_lease: float = NO_TIMEOUT_LEASE
    # What LOCK.ACQUIRE asks for after the lease: () exclusive, or a shared
    # mode (``_common.shared_mode``) in read locks and semaphore permits.
    _mode: tuple = ()

    # Set by each transport.
    _Event: Callable[[], Any]  # the type of ``lost``
    _Renewer: Type[Renewal]
    _log: logging.Logger
    # redis-py's sync lock names the lock in each error it raises; its asyncio
    # lock only when a release finds no token. Each twin keeps its original's.
    _names_errors: bool

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
        self.timeout = timeout
        self.sleep = sleep  # waiting is server-side, but a value of another type is polled
        self.blocking = blocking
        self.blocking_timeout = blocking_timeout
        self.thread_local = bool(thread_local)
        self.raise_on_release_error = raise_on_release_error
        # None: renew exactly when redis-py would never expire the lock.
        self.auto_renewal = (not timeout) if auto_renewal is None else bool(auto_renewal)
        self.on_lost = on_lost
        # The hold lives on a connection of its own, kept until the release;
        # the server ends it when that connection closes.
        self.ephemeral = bool(ephemeral)
        self.lost = self._Event()
        # Per thread (as in redis-py): token, fence and renewer of this hold.
        self.local = threading.local() if self.thread_local else SimpleNamespace()
        self.local.token = None

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

    def _renewer(self) -> Optional[Renewal]:
        return getattr(self.local, "renewer", None)

    def _encode(self, value: Any) -> bytes:
        return self.redis.get_encoder().encode(value)

    def _error(self, cls: Type[LockError], message: str, named: bool = False) -> LockError:
        return cls(message, lock_name=self.name if named or self._names_errors else None)

    def _held(self, token: bytes, fence: int, start: float) -> None:
        """Record a successful acquisition in this thread's state. ``start``:
        when the command that granted (or confirmed) the lease was sent. The
        server started the lease later, so the loss deadline counted from
        here can come early, never late."""
        renewer = self._renewer()
        if self.token == token:  # a reentry: the lease was reset, same hold
            if renewer is not None:
                renewer.confirmed(start + self.lease)
            return
        if renewer is not None:
            renewer.stop()  # a hold this thread forgot about (new token)
        self.local.token = token
        self.local.fence = fence
        self.lost.clear()
        self.local.renewer = (
            self._Renewer(self, token, self.lease, start) if self.auto_renewal else None
        )

    def _binding(self) -> Any:
        """This thread's ephemeral hold's own connection, if any."""
        return getattr(self.local, "binding", None) if self.token is not None else None

    def _forget(self) -> Steps:
        """Forget this thread's hold (and close its own connection)."""
        renewer = self._renewer()
        if renewer is not None:
            renewer.stop()
        binding = self._binding()
        self.local.renewer = None
        self.local.token = None
        self.local.fence = None
        self.local.binding = None
        if binding is not None:
            yield Unbind(binding)

    # -- checks of local state, before any I/O ----------------------------------

    def _releasable(self) -> bytes:
        """The token a release undoes an acquisition of."""
        token = self.token
        if token is None:
            raise self._error(
                LockError,
                "Cannot release a lock that's not owned or is already unlocked.",
                named=True,
            )
        return token

    def _renewable(self, verb: str) -> bytes:
        """The token ``extend`` or ``reacquire`` (``verb``) renews."""
        token = self.token
        if token is None:
            raise self._error(LockError, f"Cannot {verb} an unlocked lock")
        if self.timeout is None:
            raise self._error(LockError, f"Cannot {verb} a lock with no timeout")
        return token

    def _not_acquired(self) -> LockError:
        """What entering a ``with`` block raises when acquire returned False."""
        return self._error(LockError, "Unable to acquire lock within the time specified")

    def _exit_tolerates(self) -> bool:
        """Whether leaving a ``with`` block may swallow the LockError its
        release raised (then only logged)."""
        if self.raise_on_release_error:
            return False
        self._log.warning("Lock was unlocked or no longer owned when exiting context manager.")
        return True

    # -- operations -------------------------------------------------------------

    def _call(self, *args: Any) -> Steps:
        """One command through the client; a server error comes back
        translated (the module missing: ModuleNotLoadedError)."""
        try:
            return (yield Call(args))
        except ResponseError as e:
            raise translate(e, self.name) from None

    def _acquiring(
        self,
        sleep: Optional[float],
        blocking: Optional[bool],
        blocking_timeout: Optional[float],
        token: Optional[Any],
    ) -> Steps:
        """``acquire``: True once held, False if not within the time allowed.
        Unset arguments come from the constructor's."""
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
                fence = yield from self._granting(token, budget.wait(sent))
            except ResponseError as e:
                if not is_wrongtype(e):
                    raise translate(e, self.name) from None
                # Taken, in redis-py's terms, by a value the server queues
                # nobody on: try again later, as redis-py polls.
                if not budget.again(time.monotonic(), sleep):
                    return False
                yield Sleep(sleep)
                continue
            binding = None
            if self.ephemeral:
                fence, binding = fence
            if fence is None:
                return False
            if self.token != token and needs_confirmation(time.monotonic() - sent, self.lease):
                sent = time.monotonic()
                if not (yield from self._confirming(token)):
                    if binding is not None:
                        yield Unbind(binding)
                    # Granted, but over before we knew: queue again if time is left.
                    if budget.again(time.monotonic()):
                        continue
                    return False
            if binding is not None and self.token == token:
                # A reentry binds nothing new: the hold keeps its connection.
                yield Unbind(binding)
                binding = None
            if self.token != token:
                forgotten = self._binding()  # a hold this thread forgot about
                self.local.binding = binding
                if forgotten is not None:
                    yield Unbind(forgotten)
            self._held(token, int(fence), sent)
            return True

    def _granting(self, token: bytes, wait: Optional[int]) -> Steps:
        """One ``LOCK.ACQUIRE``: the fence, or None. An error reply granted
        nothing; any other failure (a timeout, a lost connection, Ctrl-C, a
        cancel) may have crossed a grant, so that is released before the
        failure goes on."""
        args = acquire_args(
            self.name, token, seconds_to_ms(self.lease), wait, self._mode, self.ephemeral
        )
        try:
            return (yield from self._sending_acquire(args, wait))
        except (ResponseError, GeneratorExit):
            raise
        except BaseException:
            yield from self._abandon(token)
            raise

    def _sending_acquire(self, args: tuple, wait: Optional[int]) -> Steps:
        client = self.redis
        if not hasattr(client, "nodes_manager"):
            return (yield Acquire(args, wait, keep=self.ephemeral))
        # A cluster: go to the node that owns the key's slot; follow a MOVED
        # (slots changed: refresh the map) or an ASK (slot being migrated: the
        # lock already lives on the target, which serves the wait) a few times.
        target = None
        for _ in range(5):
            node = target or client.get_node_from_key(self.name)
            try:
                return (
                    yield Acquire(args, wait, node, asking=target is not None, keep=self.ephemeral)
                )
            except MovedError:
                yield RefreshSlots()
                target = None
            except AskError as e:
                target = client.get_node(host=e.host, port=e.port)
                if target is None:
                    yield RefreshSlots()
        raise LockError("too many cluster redirections for LOCK.ACQUIRE", lock_name=self.name)

    def _confirming(self, token: bytes) -> Steps:
        """Renew a fresh grant whose reply came late (see needs_confirmation):
        False if its hold has ended already. Failures as in _granting."""
        try:
            yield from self._call("LOCK.RENEW", self.name, token, seconds_to_ms(self.lease))
        except GeneratorExit:
            raise
        except BaseException as e:
            if isinstance(e, ResponseError) and hold_is_gone(e):
                return False
            yield from self._abandon(token)
            raise
        return True

    def _abandon(self, token: bytes) -> Steps:
        """Release what an interrupted acquisition may have been granted: a
        hold whose token nobody knows keeps everyone out for its whole lease.
        Not for this thread's own token: that acquisition was a reentry that
        may or may not have counted, and a release could end the hold itself."""
        if token != self.token:
            yield Cleanup(self._releasing_abandoned(token))

    def _releasing_abandoned(self, token: bytes) -> Steps:
        try:
            yield from self._call("LOCK.RELEASE", self.name, token)
        except Exception as e:  # the caller sees the failure that brought us here
            if not (isinstance(e, ResponseError) and hold_is_gone(e)):
                self._log.warning("releasing %r after a failed acquire failed: %s", self.name, e)

    def _reading_info(self) -> Steps:
        """The lock's ``LOCK.INFO`` fields (None: free); ``OTHER_VALUE`` when
        the key holds a value of another type."""
        try:
            return parse_info((yield from self._call("LOCK.INFO", self.name)))
        except ResponseError as e:
            if not is_wrongtype(e):
                raise
            return OTHER_VALUE

    def _locked(self) -> Steps:
        return (yield from self._reading_info()) is not None

    def _owned(self) -> Steps:
        token = self.token
        return owned_by((yield from self._reading_info()), token, self._encode)

    # The three below run with this hold's renewer (if any) held still (the
    # transport's ``_paused``): no renewal is in flight while the lease
    # changes or the lock is released, and none is sent after the release.

    def _releasing(self, token: bytes) -> Steps:
        try:
            remaining = yield from self._call("LOCK.RELEASE", self.name, token)
        except ResponseError as e:
            if not hold_is_gone(e):
                raise
            yield from self._forget()
            raise self._error(
                LockNotOwnedError, "Cannot release a lock that's no longer owned"
            ) from None
        if int(remaining) == 0:
            yield from self._forget()

    def _extending(
        self,
        token: bytes,
        additional_time: float,
        replace_ttl: bool,
        renewer: Optional[Renewal],
    ) -> Steps:
        sent = time.monotonic()
        ttl_ms = int(additional_time * 1000)
        if not replace_ttl:
            # The module renews to a ttl from now, so read what is left first.
            # RENEW checks ownership again: a lock lost in between is refused.
            hold = own_hold((yield from self._reading_info()), token, self._encode)
            if hold is None:
                raise self._error(LockNotOwnedError, "Cannot extend a lock that's no longer owned")
            ttl_ms += int(hold["ttl"])
        ttl_ms = max(1, ttl_ms)
        yield from self._renewing_or_raise(token, ttl_ms, "extend")
        if renewer is not None:
            renewer.confirmed(sent + ttl_ms / 1000)
        return True

    def _reacquiring(self, token: bytes, renewer: Optional[Renewal]) -> Steps:
        sent = time.monotonic()
        yield from self._renewing_or_raise(token, seconds_to_ms(self.lease), "reacquire")
        if renewer is not None:
            renewer.confirmed(sent + self.lease)
        return True

    def _renewing_or_raise(self, token: bytes, ttl_ms: int, verb: str) -> Steps:
        try:
            yield from self._call("LOCK.RENEW", self.name, token, ttl_ms)
        except ResponseError as e:
            if not hold_is_gone(e):
                raise
            raise self._error(
                LockNotOwnedError, f"Cannot {verb} a lock that's no longer owned"
            ) from None
