"""The lock's logic, written once and free of I/O: the sync ``Lock``
(``lock.py``, threads) and the asyncio one (``asyncio.py``, tasks) drive it.

Every operation that talks to the server (acquire, release, extend,
reacquire, renew, resume, locked, owned, one renewal) is a generator here.
It yields each piece of I/O it needs as a *step* (``Call``, ``Acquire``,
``CallOn``, ``Unbind``, ``RefreshSlots``, ``Sleep``, ``Cleanup``,
``Background``), is sent the reply or has the failure thrown in, and returns
the operation's result. A transport performs the steps, blocking or
awaiting, and looks after each ``Hold`` (its deadline timer, its renewal, its
connection) with a keeper of its kind; it holds nothing else: the token,
fence and lease bookkeeping, the deadline and loss rules, the argument and
state checks, what
each reply or error means (cluster redirections included) and how errors
are translated cannot drift between the two. (psycopg 3 shares its protocol
code between its sync and async connections in the same way.)
"""

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
    DISCONNECTED,
    EXPIRED,
    HELD,
    NO_TIMEOUT_LEASE,
    NOT_OWNER,
    OTHER_VALUE,
    QUARANTINE,
    RELEASE_UNCONFIRMED,
    TIMEOUT,
    Budget,
    acquire_args,
    drift_margin,
    hold_is_gone,
    is_wrongtype,
    needs_confirmation,
    own_hold,
    owned_by,
    parse_info,
    quarantine_left,
    seconds_to_ms,
    translate,
)

# How soon a renewal is tried again after a transport error (it keeps trying
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


class Background(NamedTuple):
    """Start ``steps`` in the background (a daemon thread, or a task) and
    go on at once: a release retried after one that did not complete."""

    steps: Steps


# ---------------------------------------------------------------------------
# One hold: its lease, its deadline, its loss
# ---------------------------------------------------------------------------


class Hold:
    """One hold of a lock, from its grant to its release or loss: the token
    it was taken under, its fence, its lease and the deadline by which the
    client stops calling it held, and its own loss signal (``lost``). A loss
    belongs to the hold it happened to: a later acquire, by this thread or
    another, makes a new ``Hold`` and never clears this one's signal.

    The deadline is counted from when the command that granted or renewed
    the lease was sent (the server started it later), less a drift margin
    (``drift_margin``): so the loss is raised early, never after the
    server's lease end. It is checked when the signal is read, not only by
    the keeper's timer, which may be kept waiting for the GIL (or an event
    loop busy elsewhere) by the application's own code.

    ``keeper`` (the transport's) arms that timer, renews when the lock
    renews automatically, and watches an ephemeral hold's connection.
    ``state`` guards ``reason``, ``ended`` and ``deadline`` where threads
    share them."""

    keeper: Any = None

    def __init__(
        self,
        lock: "LockCore",
        token: bytes,
        fence: int,
        lease: float,
        sent: float,
        binding: Any,
    ):
        self.lock = lock
        self.token = token
        self.fence = fence
        self.lease = lease
        self.binding = binding
        # Acquisitions through this lock object not yet released (a reentry
        # by the same object counts up; another object's does not).
        self.count = 1
        self.state = lock._Mutex()
        self.reason: Optional[str] = None
        self.ended = False  # released or forgotten: its loss is no longer watched
        self.releasing = False  # a release is in flight
        self.lease_end = sent + lease
        self.deadline = sent + lease - drift_margin(lease)
        # When automatic renewal renews next: a third into the last lease
        # confirmed (sooner after a failed try).
        self.renew_at = sent + lease / 3
        self.lost = lock._Signal(self)

    def confirmed(self, sent: float, ttl: float, lease: Optional[float] = None) -> None:
        """The server confirmed a lease of ``ttl`` seconds counted from
        ``sent`` (monotonic); ``lease``: the hold's new lease from now on."""
        with self.state:
            if lease is not None:
                self.lease = lease
            if self.reason is not None or self.ended:
                return
            self.lease_end = sent + ttl
            self.deadline = sent + ttl - drift_margin(ttl)
            self.renew_at = sent + ttl / 3
        if self.keeper is not None:
            self.keeper.rearm()

    def check(self) -> Optional[str]:
        """The reason this hold is lost, or None: past its deadline, it is
        lost now, whoever noticed first."""
        if self.reason is None and not self.ended and time.monotonic() >= self.deadline:
            # Noticed by a reader of the signal: the logging and ``on_lost``
            # are left to the keeper, so the reader goes on at once.
            self.lose(EXPIRED, "the lease ended before a renewal got through", defer=True)
        return self.reason

    def lose(self, reason: str, why: str, defer: bool = False) -> None:
        """Signal the loss, once, before anything else is done about it."""
        with self.state:
            if self.reason is not None or self.ended:  # a timer and a refusal may race
                return
            self.reason = reason
        self.lost.set()
        if self.keeper is None:
            self.report(why)
        elif defer:
            self.keeper.stop(report=why)
        else:
            self.keeper.stop()
            self.report(why)

    def disconnected(self) -> None:
        """An ephemeral hold's own connection closed: the server ended the
        hold. During a release that is a release not confirmed (the client
        gave up on it, or it was cut off), otherwise a plain disconnection."""
        if self.releasing:
            self.lose(RELEASE_UNCONFIRMED, "the connection closed during the release")
        else:
            self.lose(DISCONNECTED, "the ephemeral hold's connection closed")

    def report(self, why: str) -> None:
        """Log the loss and call ``on_lost``."""
        lock = self.lock
        lock._log.warning("lock %r lost (%s): %s", lock.name, self.reason, why)
        if lock.on_lost is not None:
            try:
                result = lock.on_lost(lock)
                if self.keeper is not None:
                    self.keeper.called_back(result)
            except Exception:
                lock._log.exception("on_lost callback of lock %r failed", lock.name)

    def end(self) -> None:
        """The hold is over for its lock object (released, or forgotten):
        stop its keeper; a loss it already had stays signalled."""
        with self.state:
            self.ended = True
        if self.keeper is not None:
            self.keeper.stop()


def ticking(hold: Hold) -> Steps:
    """One automatic renewal, due at ``hold.renew_at``: True to go on, False
    once renewing is over (the hold ended or was lost). A refusal (NOTOWNER,
    or WRONGTYPE: the hold is gone for good) loses the hold at once; any
    other failure is retried soon, until the deadline (the keeper's timer)."""
    if hold.check() is not None or hold.ended:
        return False
    lock = hold.lock
    sent = time.monotonic()
    lease = hold.lease
    try:
        yield from lock._hold_call(hold, *lock._renew_args(hold.token, seconds_to_ms(lease)))
    except ResponseError as e:
        if hold_is_gone(e):
            hold.lose(NOT_OWNER, f"the server refused a renewal ({str(e).split()[0]})")
            return False
        lock._log.warning("renewing %r failed: %s", lock.name, e)
        hold.renew_at = time.monotonic() + RETRY_DELAY
        return True
    except (ConnectionError, TimeoutError, OSError) as e:
        if hold.binding is not None:
            # Its own connection failed: the server ends the hold with it.
            hold.lose(DISCONNECTED, "the ephemeral hold's connection closed")
            return False
        lock._log.warning("renewing %r failed, retrying: %s", lock.name, e)
        hold.renew_at = time.monotonic() + RETRY_DELAY
        return True
    hold.confirmed(sent, lease)
    return True


# ---------------------------------------------------------------------------
# The lock
# ---------------------------------------------------------------------------


class LockCore:
    """What the sync and the asyncio ``Lock`` share: redis-py's constructor,
    this thread's hold (a ``Hold``), the checks of local state and every
    operation, as generators of steps. A transport subclass sets the class
    attributes below, performs the steps and gives the public methods their
    sync or async form."""

    no_timeout_lease: float = NO_TIMEOUT_LEASE
    # What LOCK.ACQUIRE asks for after the lease: () exclusive, or a shared
    # mode (``_common.shared_mode``) in read locks and semaphore permits.
    _mode: tuple = ()
    # The other side of a read-write handle, whose hold in this thread (if
    # any) gives this side its owner token.
    _sibling: Optional["LockCore"] = None

    # Set by each transport.
    _Signal: Callable[[Optional[Hold]], Any]  # the type of ``lost``
    _Keeper: Callable[["LockCore", Hold], Any]
    _Mutex: Callable[[], ContextManager[Any]]  # guards a Hold's state
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
        # Per thread (as in redis-py): this thread's hold, its token (redis-py's
        # attribute, kept for code that reads it) and the loss signal of its
        # last hold, which outlives the hold.
        self.local = threading.local() if self.thread_local else SimpleNamespace()
        self.local.token = None

    # -- state ----------------------------------------------------------------

    def _hold(self) -> Optional[Hold]:
        """This thread's hold (lost or not) until it is released or forgotten."""
        return getattr(self.local, "hold", None)

    @property
    def token(self) -> Optional[bytes]:
        """This thread's token while it holds the lock, else None."""
        hold = self._hold()
        return None if hold is None else hold.token

    @property
    def fence(self) -> Optional[int]:
        """The fencing token of the current hold (None when not held): pass it
        to the resource you protect, which rejects a lower one than it saw."""
        hold = self._hold()
        return None if hold is None else hold.fence

    @property
    def lost(self) -> Any:
        """The loss signal of this thread's last hold (an Event): set once
        that hold is lost, and never cleared; a new hold has a new one."""
        signal = getattr(self.local, "signal", None)
        if signal is None:
            signal = self.local.signal = self._Signal(None)
        return signal

    @property
    def lost_reason(self) -> Optional[str]:
        """Why this thread's last hold was lost (``expired``, ``not-owner``,
        ``disconnected``, ``release-unconfirmed``), or None."""
        hold = self.lost.hold
        return None if hold is None else hold.check()

    @property
    def not_acquired_reason(self) -> Optional[str]:
        """Why this thread's last ``acquire`` returned False: ``held`` (a
        single try found another owner holding it), ``timeout`` (the wait
        ran out), or ``quarantine`` (the lock is free but the server begins
        no hold during its quarantine, ``lock.max-ttl`` after a start or a
        promotion: try again, or wait, which it serves when that ends). None
        after an acquisition that succeeded."""
        return getattr(self.local, "refused", None)

    @property
    def held(self) -> bool:
        """True while this thread holds the lock as far as the client knows:
        acquired, not released, not lost, its deadline not passed. (``owned()``
        asks the server.)"""
        hold = self._hold()
        return hold is not None and hold.check() is None

    @property
    def lease(self) -> float:
        """The lease in seconds a fresh acquisition asks for."""
        return float(self.timeout) if self.timeout else float(self.no_timeout_lease)

    def _encode(self, value: Any) -> bytes:
        return self.redis.get_encoder().encode(value)

    # -- the commands, by the keys they name (``MultiLock`` names several) ------

    def _keys(self) -> tuple:
        """The keys this lock holds, in order."""
        return (self.name,)

    def _acquire_args(self, token: bytes, wait: Optional[int]) -> tuple:
        return acquire_args(
            self.name, token, seconds_to_ms(self.lease), wait, self._mode, self.ephemeral
        )

    def _renew_args(self, token: bytes, ttl_ms: int) -> tuple:
        return ("LOCK.RENEW", self.name, token, ttl_ms)

    def _release_args(self, token: bytes, *everything: str) -> tuple:
        return ("LOCK.RELEASE", self.name, token, *everything)

    def _granted(self, reply: Any) -> int:
        """The hold's fence, from a grant's reply."""
        return int(reply)

    def _left(self, reply: Any) -> int:
        """The holds left, from a release's reply."""
        return int(reply)

    def _error(self, cls: Type[LockError], message: str, named: bool = False) -> LockError:
        return cls(message, lock_name=self.name if named or self._names_errors else None)

    def _lost_error(self, verb: str) -> LockError:
        """What a call about a lost hold raises: redis-py's exception and
        message (``lost_reason`` tells why)."""
        return self._error(LockNotOwnedError, f"Cannot {verb} a lock that's no longer owned")

    def _owner_token(self) -> bytes:
        """The token a fresh acquisition without one of its own uses: a new
        random one, or, on a side of a read-write handle, the one this
        thread holds either side under (both sides are one owner)."""
        if self._sibling is not None:
            for side in (self._sibling, self):
                hold = side._hold()
                if hold is not None and hold.reason is None:
                    return hold.token
        return uuid.uuid4().hex.encode()

    def _adopt(self, token: bytes, fence: int, sent: float, binding: Any) -> Steps:
        """Make a fresh grant this thread's hold. ``sent``: when the command
        that granted (or confirmed) the lease was sent."""
        previous = self._hold()
        if previous is not None:  # a hold this thread forgot about (new token)
            yield from self._forget(previous)
        hold = Hold(self, token, fence, self.lease, sent, binding)
        self.local.hold = hold
        self.local.token = token
        self.local.signal = hold.lost
        hold.keeper = self._Keeper(self, hold)

    def _forget(self, hold: Hold) -> Steps:
        """Forget ``hold`` (and close its own connection)."""
        hold.end()
        if self._hold() is hold:
            self.local.hold = None
            self.local.token = None
        if hold.binding is not None:
            yield Unbind(hold.binding)

    def _hold_call(self, hold: Hold, *args: Any) -> Steps:
        """A command about ``hold``: on its own connection if it has one (an
        ephemeral hold never needs a pooled connection), else through the
        client."""
        if hold.binding is None:
            return (yield from self._call(*args))
        try:
            return (yield CallOn(hold.binding, args))
        except ResponseError as e:
            raise translate(e, self.name) from None

    # -- checks of local state, before any I/O ----------------------------------

    def _releasable(self) -> Hold:
        """The hold a release undoes an acquisition of."""
        hold = self._hold()
        if hold is None:
            raise self._error(
                LockError,
                "Cannot release a lock that's not owned or is already unlocked.",
                named=True,
            )
        return hold

    def _renewable(self, verb: str, need_timeout: bool = True) -> Hold:
        """The hold ``extend``, ``reacquire`` or ``renew`` (``verb``) renews."""
        hold = self._hold()
        if hold is None:
            raise self._error(LockError, f"Cannot {verb} an unlocked lock")
        if need_timeout and self.timeout is None:
            raise self._error(LockError, f"Cannot {verb} a lock with no timeout")
        if hold.check() is not None:
            raise self._lost_error(verb)
        return hold

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

    def stop_renewal(self) -> None:
        """Stop renewing this thread's hold automatically, without releasing
        it: it stays held until its lease ends (then ``lost`` is set with
        reason ``expired``), or until ``renew``/``extend`` or a release."""
        hold = self._hold()
        if hold is not None and hold.keeper is not None:
            hold.keeper.stop_renewing()

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
        token = self._owner_token() if token is None else self._encode(token)
        if sleep is None:
            sleep = self.sleep
        if blocking is None:
            blocking = self.blocking
        if blocking_timeout is None:
            blocking_timeout = self.blocking_timeout
        budget = Budget(blocking, blocking_timeout, time.monotonic())
        current = self._hold()
        reentry = current is not None and current.token == token and current.reason is None
        # Held under this token already (this side or, on a read-write
        # handle, the other): the server counts a grant as a reentry, which
        # an interrupted acquire must not release.
        known = reentry or token == self._owner_token()
        self.local.refused = None
        while True:
            sent = time.monotonic()
            wait = budget.wait(sent)
            try:
                fence = yield from self._granting(token, wait, known)
            except ResponseError as e:
                if not is_wrongtype(e):
                    raise translate(e, self.name) from None
                # Taken, in redis-py's terms, by a value the server queues
                # nobody on: try again later, as redis-py polls.
                if not budget.again(time.monotonic(), sleep):
                    return self._refused(HELD if wait is None else TIMEOUT)
                yield Sleep(sleep)
                continue
            binding = None
            if self.ephemeral:
                fence, binding = fence
            if fence is None:
                if wait is not None:
                    return self._refused(TIMEOUT)
                reason = yield from self._why_refused()
                return self._refused(reason)
            try:
                if not reentry and needs_confirmation(time.monotonic() - sent, self.lease):
                    sent = time.monotonic()
                    confirmed = yield from self._confirming(token, binding, known)
                    if not confirmed:
                        # Granted, but over before we knew (a failover, say):
                        # not a hold. Queue again if time is left.
                        if binding is not None:
                            yield Unbind(binding)
                            binding = None
                        if budget.again(time.monotonic()):
                            continue
                        return self._refused(TIMEOUT)
            except GeneratorExit:
                raise
            except BaseException:
                if binding is not None:  # closing it ends the grant on the server
                    yield Cleanup(self._unbinding(binding))
                raise
            if reentry:
                if binding is not None:
                    # A reentry binds nothing new: the hold keeps its connection.
                    yield Unbind(binding)
                current.count += 1
                current.confirmed(sent, self.lease, self.lease)
                return True
            yield from self._adopt(token, self._granted(fence), sent, binding)
            return True

    def _refused(self, reason: str) -> bool:
        """``acquire``'s False, its reason kept for this thread."""
        self.local.refused = reason
        return False

    def _why_refused(self) -> Steps:
        """Why a single try was answered nil: ``quarantine`` if the lock is
        free and the server is in its quarantine, else ``held`` (also when
        the question itself fails)."""
        try:
            for key in self._keys():
                if (yield from self._call("LOCK.INFO", key)) is not None:
                    return HELD
            stats = yield from self._call("INFO", "lock")
        except (ResponseError, ConnectionError, TimeoutError, OSError):
            return HELD
        return QUARANTINE if quarantine_left(stats) else HELD

    def _unbinding(self, binding: Any) -> Steps:
        yield Unbind(binding)

    def _granting(self, token: bytes, wait: Optional[int], known: bool) -> Steps:
        """One ``LOCK.ACQUIRE``: the fence, or None. An error reply granted
        nothing; any other failure (a timeout, a lost connection, Ctrl-C, a
        cancel) may have crossed a grant, so that is released before the
        failure goes on."""
        args = self._acquire_args(token, wait)
        try:
            return (yield from self._sending_acquire(args, wait))
        except (ResponseError, GeneratorExit):
            raise
        except BaseException:
            if not known:
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
            node = target or client.get_node_from_key(self._keys()[0])
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

    def _confirming(self, token: bytes, binding: Any, known: bool) -> Steps:
        """Renew a fresh grant whose reply came late (see needs_confirmation):
        False if its hold has ended already. An ephemeral grant is renewed on
        its own connection (closing which, on a failure, ends it); any other
        failure releases the grant, as in _granting."""
        args = self._renew_args(token, seconds_to_ms(self.lease))
        try:
            if binding is None:
                yield from self._call(*args)
            else:
                yield CallOn(binding, args)
        except GeneratorExit:
            raise
        except BaseException as e:
            if isinstance(e, ResponseError) and hold_is_gone(e):
                return False
            if binding is None and not known:
                yield from self._abandon(token)
            raise
        return True

    def _abandon(self, token: bytes) -> Steps:
        """Release what an interrupted acquisition may have been granted: a
        hold whose token nobody knows keeps everyone out for its whole lease.
        In the background, so the interruption is not held up by a server
        that is slow to answer (the acquiring connection is closed already,
        so no grant can come after this release). Not for a reentry: it may
        or may not have counted, and a release could end the hold itself."""
        yield Background(self._releasing_abandoned(token))

    def _releasing_abandoned(self, token: bytes) -> Steps:
        lease_end = time.monotonic() + self.lease
        while True:
            try:
                yield from self._call(*self._release_args(token, "ALL"))
                return
            except ResponseError as e:
                if not hold_is_gone(e):
                    self._log.warning("releasing %r after a failed acquire: %s", self.name, e)
                return
            except Exception as e:
                if time.monotonic() >= lease_end:
                    self._log.warning("releasing %r after a failed acquire: %s", self.name, e)
                    return
            yield Sleep(RETRY_DELAY)

    def _reading_info(self) -> Steps:
        """The lock's ``LOCK.INFO`` fields (None: free); ``OTHER_VALUE`` when
        the key holds a value of another type."""
        try:
            return parse_info((yield from self._call("LOCK.INFO", self._keys()[0])))
        except ResponseError as e:
            if not is_wrongtype(e):
                raise
            return OTHER_VALUE

    def _locked(self) -> Steps:
        return (yield from self._reading_info()) is not None

    def _owned(self) -> Steps:
        token = self.token
        return owned_by((yield from self._reading_info()), token, self._encode)

    # The operations below run with this hold's renewal held still (the
    # transport's ``_paused``): no renewal is in flight while the lease
    # changes or the lock is released, and none is sent after the release.

    def _releasing(self, hold: Hold) -> Steps:
        lost = hold.check()
        hold.releasing = True
        try:
            remaining = yield from self._hold_call(hold, *self._release_args(hold.token))
        except GeneratorExit:
            raise
        except ResponseError as e:
            if not hold_is_gone(e):
                raise
            hold.lose(NOT_OWNER, f"the server refused the release ({str(e).split()[0]})")
            yield from self._forget(hold)
            raise self._lost_error("release") from None
        except BaseException:
            # Sent or not, landed or not: unknown. The lock no longer
            # reports it held; the release is retried until it lands or the
            # lease ends (an ephemeral hold ends with its connection).
            hold.lose(RELEASE_UNCONFIRMED, "the release did not complete")
            yield from self._forget(hold)
            if hold.binding is None:
                yield Background(self._retrying_release(hold))
            raise
        finally:
            hold.releasing = False
        hold.count -= 1
        if self._left(remaining) == 0 or hold.count <= 0 or lost is not None:
            yield from self._forget(hold)
        if lost is not None:
            raise self._lost_error("release")

    def _retrying_release(self, hold: Hold) -> Steps:
        """Release ``hold`` on the server (all its count) until the release
        lands, the server says it is gone, or its lease ends."""
        while time.monotonic() < hold.lease_end:
            try:
                yield from self._call(*self._release_args(hold.token, "ALL"))
                return
            except ResponseError as e:
                if hold_is_gone(e):
                    return
                self._log.warning("releasing %r again failed: %s", self.name, e)
            except Exception as e:
                self._log.warning("releasing %r again failed, retrying: %s", self.name, e)
            yield Sleep(RETRY_DELAY)

    def _extending(self, hold: Hold, additional_time: float, replace_ttl: bool) -> Steps:
        sent = time.monotonic()
        ttl_ms = int(additional_time * 1000)
        if not replace_ttl:
            # The module renews to a ttl from now, so read what is left first.
            # RENEW checks ownership again: a lock lost in between is refused.
            own = own_hold((yield from self._reading_info()), hold.token, self._encode)
            if own is None:
                hold.lose(NOT_OWNER, "the lock is no longer held by this token")
                raise self._lost_error("extend")
            ttl_ms += int(own["ttl"])
        ttl_ms = max(1, ttl_ms)
        yield from self._renewing_or_raise(hold, ttl_ms, "extend")
        # This lease only: automatic renewal renews a third into it, back to
        # the hold's lease (``renew(ttl)`` changes that).
        hold.confirmed(sent, ttl_ms / 1000)
        return True

    def _renewing(self, hold: Hold, ttl: Optional[float], verb: str) -> Steps:
        """Renew to ``ttl`` seconds (None: the hold's lease), which becomes
        the hold's lease: what automatic renewal renews to from then on."""
        sent = time.monotonic()
        lease = hold.lease if ttl is None else float(ttl)
        ttl_ms = seconds_to_ms(lease)
        yield from self._renewing_or_raise(hold, ttl_ms, verb)
        hold.confirmed(sent, ttl_ms / 1000, ttl_ms / 1000)
        return True

    def _renewing_or_raise(self, hold: Hold, ttl_ms: int, verb: str) -> Steps:
        try:
            yield from self._hold_call(hold, *self._renew_args(hold.token, ttl_ms))
        except ResponseError as e:
            if not hold_is_gone(e):
                raise
            hold.lose(NOT_OWNER, f"the server refused a renewal ({str(e).split()[0]})")
            raise self._lost_error(verb) from None

    def _not_resumable(self) -> LockError:
        return self._error(LockNotOwnedError, "Cannot resume a lock that's not owned by this token")

    def _resuming(
        self, token: Any, fence: Optional[int], ttl: Optional[float]
    ) -> Steps:
        """Continue a hold taken elsewhere (another process) under ``token``:
        renew it to ``ttl`` (None: this lock's lease), which confirms it
        exists, and make it this thread's hold."""
        if self.ephemeral:
            raise self._error(
                LockError, "an ephemeral hold lives on its connection: it cannot be resumed"
            )
        if self._hold() is not None:
            raise self._error(LockError, "this thread already holds this lock")
        token = self._encode(token)
        lease = self.lease if ttl is None else float(ttl)
        sent = time.monotonic()
        try:
            yield from self._call("LOCK.RENEW", self.name, token, seconds_to_ms(lease))
        except ResponseError as e:
            if not hold_is_gone(e):
                raise
            raise self._not_resumable() from None
        if fence is None:
            own = own_hold((yield from self._reading_info()), token, self._encode)
            if own is None:
                raise self._not_resumable()
            fence = int(own["fence"])
        yield from self._adopt(token, int(fence), sent, None)
        hold = self._hold()
        hold.confirmed(sent, lease, lease)
        return True
