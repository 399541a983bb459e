"""What the sync and asyncio locks share: argument conversion, reply
parsing and the mapping of server errors to redis-py's lock exceptions."""

from typing import Any, Dict, Optional

from redis.exceptions import LockError, ResponseError


class ModuleNotLoadedError(LockError):
    """The server does not know the ``LOCK.*`` commands: load the module
    (``loadmodule /path/to/libredislock.so`` or ``MODULE LOAD``)."""


# Why a hold was lost (``Lock.lost_reason``).
EXPIRED = "expired"  # its lease ended before a renewal got through
NOT_OWNER = "not-owner"  # the server refused it (NOTOWNER, or WRONGTYPE over the key)
DISCONNECTED = "disconnected"  # an ephemeral hold's own connection closed
RELEASE_UNCONFIRMED = "release-unconfirmed"  # a release did not complete

# Why an acquisition returned False (``Lock.not_acquired_reason``).
HELD = "held"  # a single try found another owner holding it
TIMEOUT = "timeout"  # the wait ran out first
QUARANTINE = "quarantine"  # free, but the server begins no hold for now: try again


def quarantine_left(stats: Any) -> bool:
    """Whether ``INFO lock`` (a dict as redis-py parses it, or its text)
    shows the server in its quarantine (``lock_quarantine_ms`` above 0)."""
    if isinstance(stats, dict):
        value = stats.get("lock_quarantine_ms", 0)
    else:
        if isinstance(stats, bytes):
            stats = stats.decode(errors="replace")
        value = 0
        for line in str(stats).splitlines():
            if line.strip().startswith("lock_quarantine_ms:"):
                value = line.strip().split(":", 1)[1]
    try:
        return int(value) > 0
    except (TypeError, ValueError):
        return False


class LockUpgradeError(LockError, ResponseError):
    """A reader asked for the write side of the lock it reads: refused at
    once (two readers upgrading would wait on each other forever). Release
    the read side first. Also a ``ResponseError``: the server's reply."""


def drift_margin(lease: float) -> float:
    """What a hold's loss deadline keeps back from its lease (seconds): 1%
    of it, for clocks that run at slightly different rates, plus 2 ms."""
    return lease * 0.01 + 0.002


def is_upgrade(error: ResponseError) -> bool:
    return "holds the lock shared" in str(error)


# The lease used when ``timeout`` is None or 0, which in redis-py means "no
# expiry". The module requires a lease, so such a lock gets this one and is
# renewed automatically every third of it: held as long as the process lives,
# freed at most this long after it dies.
NO_TIMEOUT_LEASE = 30.0


def seconds_to_ms(seconds: float) -> int:
    """Seconds (int or float) to whole milliseconds, at least 1: the module
    refuses 0, and a tiny positive duration must not become one."""
    return max(1, int(seconds * 1000))


def wait_ms(blocking: bool, blocking_timeout: Optional[float]) -> Optional[int]:
    """The ``WAIT`` argument for an acquisition, or None for a single attempt.

    redis-py semantics: not blocking, or a blocking_timeout of 0 or less, is one
    try; no blocking_timeout waits forever (``WAIT 0``)."""
    if not blocking:
        return None
    if blocking_timeout is None:
        return 0
    if blocking_timeout <= 0:
        return None
    return seconds_to_ms(blocking_timeout)


class Budget:
    """The time one ``acquire()`` may spend, across its tries: redis-py's
    ``blocking``/``blocking_timeout``. One ``LOCK.ACQUIRE … WAIT`` usually
    spends it all; another try is needed while the key holds a value of
    another type (polled, as redis-py polls) or after a grant that ended
    before it could be confirmed. ``now`` is ``time.monotonic()``."""

    def __init__(self, blocking: bool, blocking_timeout: Optional[float], now: float):
        self.first_wait = wait_ms(blocking, blocking_timeout)
        # None: a single try (first_wait None) or no limit (first_wait 0).
        self.ends = now + blocking_timeout if self.first_wait else None

    def wait(self, now: float) -> Optional[int]:
        """The ``WAIT`` argument for a try sent at ``now``."""
        if self.ends is None:
            return self.first_wait
        return seconds_to_ms(self.ends - now)

    def again(self, now: float, pause: float = 0.0) -> bool:
        """Whether another try fits after ``pause`` seconds (redis-py gives up
        when its next try would start past ``blocking_timeout``)."""
        if self.first_wait is None:
            return False
        return self.ends is None or now + pause <= self.ends


def needs_confirmation(elapsed: float, lease: float) -> bool:
    """Whether a fresh grant whose reply took ``elapsed`` seconds is renewed at
    once. The lease began at the grant, somewhere between the send and the
    reply, so it is counted from the send: never later than the server's.
    After a long wait (or a reply held back by a slow command) that leaves
    too little of it known; the renew then tells whether the hold still
    exists and restarts the count from its own send. The Rust client uses the
    same threshold; a reply that came at once costs no second round trip."""
    return elapsed > lease / 3


def read_timeout(connection: Any, wait: Optional[int]) -> Optional[float]:
    """How long to read the reply to an acquisition with ``WAIT wait`` (None:
    no WAIT): the wait plus the connection's own socket timeout as margin, or
    no limit (None) for ``WAIT 0`` or a connection without a timeout. redis-py
    8 sets socket_timeout to 5 s by default, which would otherwise cut any
    longer wait (and its retry would requeue us at the back of the line)."""
    margin = getattr(connection, "socket_timeout", None)
    if margin is None or wait == 0:
        return None
    return (wait or 0) / 1000 + margin


def acquire_args(
    name: Any,
    token: bytes,
    ttl_ms: int,
    wait: Optional[int],
    mode: tuple = (),
    ephemeral: bool = False,
) -> tuple:
    """``mode``: () for an exclusive hold, ``("SHARED",)`` for a read hold,
    ``("SHARED", "LIMIT", n)`` for one of ``n`` permits."""
    args = ("LOCK.ACQUIRE", name, token, ttl_ms, *mode)
    if ephemeral:
        args = (*args, "EPHEMERAL")
    if wait is None:
        return args
    return (*args, "WAIT", wait)


def shared_mode(limit: Optional[int] = None) -> tuple:
    """The ``mode`` of ``acquire_args`` for a shared hold; ``limit`` checked
    here (1..=1,000,000, as the server does) so a bad one fails before any I/O."""
    if limit is None:
        return ("SHARED",)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"a semaphore's limit is an integer from 1 to {MAX_LIMIT}, not {limit!r}")
    return ("SHARED", "LIMIT", limit)


# The largest LIMIT the server accepts.
MAX_LIMIT = 1_000_000


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _fields(reply: Any) -> Dict[str, Any]:
    if isinstance(reply, dict):
        return {_text(k): v for k, v in reply.items()}
    items = list(reply)
    return {_text(items[i]): items[i + 1] for i in range(0, len(items) - 1, 2)}


def parse_info(reply: Any) -> Optional[Dict[str, Any]]:
    """``LOCK.INFO`` reply → {"owner", "count", "fence", "ttl", "waiters", …},
    or None for a free lock. RESP2 gives a flat field/value list, RESP3 a map;
    field names are decoded, values are left as the client returned them.
    ``holders``, where the server sends it, becomes a list of such dicts."""
    if reply is None:
        return None
    info = _fields(reply)
    if "holders" in info:
        info["holders"] = [_fields(holder) for holder in info["holders"] or []]
    return info


def own_hold(
    info: Optional[Dict[str, Any]], token: Optional[bytes], encode: Any
) -> Optional[Dict[str, Any]]:
    """The hold of ``token`` in ``info`` (from ``parse_info``, or
    ``OTHER_VALUE``): its fields (``owner``, ``count``, ``fence``, ``ttl``),
    or None. A shared lock has no single owner: its holds are listed in
    ``holders``; ``encode`` turns a reply's owner into bytes."""
    if token is None or info is None:
        return None
    for hold in info.get("holders") or [info]:
        if hold.get("owner") is not None and encode(hold["owner"]) == token:
            return hold
    return None


def owned_by(info: Optional[Dict[str, Any]], token: Optional[bytes], encode: Any) -> bool:
    """Whether ``info`` shows a hold of ``token`` (see ``own_hold``)."""
    return own_hold(info, token, encode) is not None


# What a lock reads as when its key holds a value of another type: taken (as
# redis-py's GET-based lock sees any value), by no token.
OTHER_VALUE: Dict[str, Any] = {"owner": None, "count": 0, "fence": None, "ttl": 0, "waiters": 0}


def is_notowner(error: ResponseError) -> bool:
    return str(error).startswith("NOTOWNER")


def is_wrongtype(error: ResponseError) -> bool:
    """The key holds a value of another type (a ``SET`` over the lock, say).
    In redis-py's terms the name is taken, by someone else."""
    return str(error).startswith("WRONGTYPE")


def hold_is_gone(error: ResponseError) -> bool:
    """The server says a token holds nothing here: not the owner, or a value
    of another type replaced the lock (that hold is gone for good, whatever
    becomes of the key)."""
    return is_notowner(error) or is_wrongtype(error)


def translate(error: ResponseError, name: Any) -> Exception:
    """A server error → the exception the caller should see: the module
    missing becomes ModuleNotLoadedError, anything else stays as it is."""
    if is_upgrade(error):
        return LockUpgradeError(str(error))
    text = str(error).lower()
    if "unknown command" in text and "lock." in text:
        return ModuleNotLoadedError(
            "the server does not know LOCK.* commands: is the lock module loaded? "
            f"({error})",
            lock_name=name,
        )
    return error
