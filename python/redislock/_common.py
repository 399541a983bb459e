"""What the sync and asyncio locks share: argument conversion, reply
parsing and the mapping of server errors to redis-py's lock exceptions."""

from typing import Any, Dict, Optional

from redis.exceptions import LockError, ResponseError


class ModuleNotLoadedError(LockError):
    """The server does not know the ``LOCK.*`` commands: load the module
    (``loadmodule /path/to/libredislock.so`` or ``MODULE LOAD``)."""


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


def acquire_args(name: Any, token: bytes, ttl_ms: int, wait: Optional[int]) -> tuple:
    if wait is None:
        return ("LOCK.ACQUIRE", name, token, ttl_ms)
    return ("LOCK.ACQUIRE", name, token, ttl_ms, "WAIT", wait)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def parse_info(reply: Any) -> Optional[Dict[str, Any]]:
    """``LOCK.INFO`` reply → {"owner", "count", "fence", "ttl", "waiters"},
    or None for a free lock. RESP2 gives a flat field/value list, RESP3 a map;
    field names are decoded, values are left as the client returned them."""
    if reply is None:
        return None
    if isinstance(reply, dict):
        return {_text(k): v for k, v in reply.items()}
    items = list(reply)
    return {_text(items[i]): items[i + 1] for i in range(0, len(items) - 1, 2)}


def is_notowner(error: ResponseError) -> bool:
    return str(error).startswith("NOTOWNER")


def translate(error: ResponseError, name: Any) -> Exception:
    """A server error → the exception the caller should see: the module
    missing becomes ModuleNotLoadedError, anything else stays as it is."""
    text = str(error).lower()
    if "unknown command" in text and "lock." in text:
        return ModuleNotLoadedError(
            "the server does not know LOCK.* commands: is the lock module loaded? "
            f"({error})",
            lock_name=name,
        )
    return error
