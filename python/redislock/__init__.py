"""A drop-in for redis-py's ``Lock``, backed by the lock module.

``from redislock import Lock`` gives a class with redis-py's constructor,
methods and exceptions (``r.lock(name, lock_class=Lock)`` works), whose
commands are the module's ``LOCK.*``: waiting happens in the server's FIFO
queue instead of a sleep loop, each fresh acquisition carries a fence, the
same token reenters, and a daemon thread can renew the lease.
``from redislock.asyncio import Lock`` is the twin for ``redis.asyncio``.

``ReadWriteLock`` (``read_lock()``/``write_lock()``) and ``Semaphore``
(whose ``acquire`` returns a ``Permit``, of one or ``permits=k`` permits)
are shared holds on the same commands, in both packages; ``MultiLock``
holds several keys at once, all or none.
"""

from redis.exceptions import LockError, LockNotOwnedError

from ._common import LockUpgradeError, ModuleNotLoadedError
from .lock import Lock, MultiLock, Permit, ReadWriteLock, Semaphore

__all__ = [
    "Lock",
    "LockError",
    "LockNotOwnedError",
    "LockUpgradeError",
    "ModuleNotLoadedError",
    "MultiLock",
    "Permit",
    "ReadWriteLock",
    "Semaphore",
]
