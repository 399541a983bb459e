"""A lock on several keys at once, for the sync and the asyncio ``Lock``
alike: the same operations (``_core.py``) with commands that name every key
(``LOCK.MACQUIRE``, ``LOCK.MRENEW``, ``LOCK.MRELEASE``), which the server
runs all or none. So one renewal per period keeps every key, a renewal
refused because any one key is gone loses the whole hold, and a release, an
abandoned grant or a retried release gives every key back together.
"""

from typing import Any, Callable, List, Optional

from redis.exceptions import LockError, ResponseError

from ._common import is_wrongtype, owned_by, parse_info, seconds_to_ms

# The most keys one LOCK.MACQUIRE names (the server's bound).
MAX_KEYS = 64


class MultiLockBase:
    """Mixed in before a transport's ``Lock``: ``names`` (1 to 64 distinct
    keys; in a cluster, of one hash slot) are held together, all or none.

    ``acquire`` takes every key in one step or none: a try fails if any key
    is held by another owner (holding nothing on the others); a wait queues
    on every key as one request and is granted when all of them can be
    granted together, never some while it waits, so locks on the same keys
    in any order never deadlock, and nobody that came later takes one of
    its keys first. ``fences`` has one fence per key, in order; ``fence``
    is the highest. ``lost`` fires when any key is lost. The rest is
    ``Lock``'s: ``release``, ``renew``, ``extend``, ``auto_renewal``,
    ``ephemeral``, reentry with the same token (every key counts one more).
    """

    name: Any
    local: Any
    lease: float
    ephemeral: bool
    _mode: tuple
    token: Optional[bytes]
    _encode: Callable[[Any], bytes]
    _call: Callable[..., Any]
    _hold: Callable[[], Any]

    def __init__(self, redis: Any, names: Any, *args: Any, **kwargs: Any):
        if isinstance(names, (str, bytes)):
            raise TypeError("a lock on several keys takes a list of key names, not one name")
        names = tuple(names)
        if not 1 <= len(names) <= MAX_KEYS:
            raise ValueError(f"a lock on several keys takes 1 to {MAX_KEYS} keys, not {len(names)}")
        encoder = redis.get_encoder()
        if len({encoder.encode(name) for name in names}) != len(names):
            raise ValueError(f"a lock on several keys names each key once: {names!r}")
        super().__init__(redis, names, *args, **kwargs)  # type: ignore[call-arg]

    @property
    def names(self) -> tuple:
        return self.name

    @property
    def fences(self) -> Optional[List[int]]:
        """One fence per key, in the order of ``names`` (None when not held)."""
        if self._hold() is None:
            return None
        return getattr(self.local, "fences", None)

    def _keys(self) -> tuple:
        return self.name

    def _acquire_args(self, token: bytes, wait: Optional[int]) -> tuple:
        args = (
            "LOCK.MACQUIRE",
            len(self.name),
            *self.name,
            token,
            seconds_to_ms(self.lease),
            *self._mode,
        )
        if self.ephemeral:
            args = (*args, "EPHEMERAL")
        return args if wait is None else (*args, "WAIT", wait)

    def _renew_args(self, token: bytes, ttl_ms: int) -> tuple:
        return ("LOCK.MRENEW", len(self.name), *self.name, token, ttl_ms)

    def _release_args(self, token: bytes, *everything: str) -> tuple:
        return ("LOCK.MRELEASE", len(self.name), *self.name, token, *everything)

    def _granted(self, reply: Any) -> int:
        fences = [int(fence) for fence in reply]
        self.local.fences = fences
        return max(fences)

    def _left(self, reply: Any) -> int:
        # Every key was taken in one step, so every count is the same.
        return max(int(count) for count in reply)

    def _infos(self) -> Any:
        """Each key's ``LOCK.INFO`` fields (None: free; a key of another
        type counts as held by someone else)."""
        infos = []
        for key in self.name:
            try:
                infos.append(parse_info((yield from self._call("LOCK.INFO", key))))
            except ResponseError as e:
                if not is_wrongtype(e):
                    raise
                infos.append({"owner": None})
        return infos

    def _locked(self) -> Any:
        """Whether any of the keys is held."""
        return any(info is not None for info in (yield from self._infos()))

    def _owned(self) -> Any:
        """Whether this thread's token holds every key."""
        token = self.token
        infos = yield from self._infos()
        return all(owned_by(info, token, self._encode) for info in infos)

    def _resuming(self, token: Any, fence: Optional[int], ttl: Optional[float]) -> Any:
        raise LockError("a lock on several keys is not resumed", lock_name=self.name)
        yield  # a generator, as the operation it replaces
