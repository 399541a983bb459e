"""The asyncio twin: redis-py's ``redis.asyncio.lock.Lock`` interface on ``LOCK.*``.

``from redislock.asyncio import Lock``; use it with ``redis.asyncio.Redis``
or ``redis.asyncio.RedisCluster`` (``r.lock(name, lock_class=Lock)``).

Token storage is redis-py's: with ``thread_local=True`` (the default) the
token lives in a ``threading.local``, so tasks of one event loop that share
one Lock *instance* share its token, exactly as with redis-py's asyncio lock.
Give each task its own instance (``r.lock(...)`` makes a new one per call);
then no task can release, extend or renew another task's hold, since each
hold has its own random token checked by the server.
"""

import asyncio
import logging
import math
import threading
import time
import uuid
from types import SimpleNamespace
from typing import Any, Awaitable, Callable, Dict, Literal, Optional, Set

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
from ._core import RETRY_DELAY

logger = logging.getLogger(__name__)

# Releases that must finish even if their caller is cancelled again: the loop
# keeps only weak references to tasks.
_shielded: Set["asyncio.Task[Any]"] = set()


# ---------------------------------------------------------------------------
# Transport: a server-side wait outlives the client's socket_timeout
# ---------------------------------------------------------------------------


def _read_timeout(connection: Any, wait: Optional[int]) -> float:
    """As in the sync lock; ``math.inf`` is redis.asyncio's "no limit"."""
    margin = getattr(connection, "socket_timeout", None)
    if margin is None or wait == 0:
        return math.inf
    return (wait or 0) / 1000 + margin


async def _acquire_on(conn: Any, args: tuple, wait: Optional[int], asking: bool) -> Any:
    """One ``LOCK.ACQUIRE`` on ``conn``, never retried (see the sync lock);
    any failure or cancellation while waiting closes the connection, so the
    server drops us from the queue and no late reply lands on a pooled
    connection."""
    try:
        if asking:
            await conn.send_command("ASKING")
            await conn.read_response()
        await conn.send_command(*args)
        return await conn.read_response(timeout=_read_timeout(conn, wait))
    except ResponseError:
        raise
    except BaseException:
        await conn.disconnect(nowait=True)
        raise


async def _acquire_call(client: Any, name: Any, args: tuple, wait: Optional[int]) -> Any:
    if not hasattr(client, "nodes_manager"):
        pool = client.connection_pool
        conn = await pool.get_connection()
        try:
            return await _acquire_on(conn, args, wait, asking=False)
        finally:
            await pool.release(conn)
    # RedisCluster: the node owning the key's slot; follow MOVED and ASK.
    target = None
    for _ in range(5):
        node = target or client.get_node_from_key(name)
        conn = node.acquire_connection()
        try:
            return await _acquire_on(conn, args, wait, asking=target is not None)
        except MovedError:
            await client.nodes_manager.initialize()
            target = None
        except AskError as e:
            target = client.get_node(host=e.host, port=e.port)
            if target is None:
                await client.nodes_manager.initialize()
        finally:
            node.release(conn)
    raise LockError("too many cluster redirections for LOCK.ACQUIRE", lock_name=name)


# ---------------------------------------------------------------------------
# Automatic renewal
# ---------------------------------------------------------------------------


class _Renewer:
    """A task renewing one hold every third of its lease; see the sync
    ``_Renewer``. The loss deadline is a ``call_at`` on the loop, so a
    renewal stuck in a paused server does not hide the loss."""

    def __init__(self, lock: "Lock", token: bytes, lease: float, start: float):
        self.lock = lock
        self.token = token
        self.lease = lease
        self.mutex = asyncio.Lock()
        self.stopped = False
        self.deadline = start + lease
        self.loop = asyncio.get_running_loop()
        self.handle: Optional[asyncio.TimerHandle] = None
        self.wake = asyncio.Event()
        self._arm()
        self.task = self.loop.create_task(self._run(), name=f"redislock-renew:{lock.name!r}")

    def _arm(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
        delay = max(0.0, self.deadline - time.monotonic())
        self.handle = self.loop.call_later(delay, self._deadline_passed)

    def confirmed(self, deadline: float) -> None:
        """The server confirmed a lease ending at ``deadline`` (monotonic)."""
        if not self.stopped:
            self.deadline = deadline
            self._arm()

    def stop(self) -> None:
        self.stopped = True
        if self.handle is not None:
            self.handle.cancel()
        self.wake.set()

    async def _sleep(self, delay: float) -> bool:
        """Sleep ``delay`` seconds; True if stopped meanwhile."""
        try:
            await asyncio.wait_for(self.wake.wait(), delay)
            return True
        except asyncio.TimeoutError:
            return False

    async def _run(self) -> None:
        interval = self.lease / 3
        delay = interval
        lease_ms = seconds_to_ms(self.lease)
        while not await self._sleep(delay):
            async with self.mutex:
                if self.stopped:
                    return
                sent = time.monotonic()
                if self.deadline - sent > self.lease:
                    delay = interval
                    continue
                try:
                    await self.lock._renew(self.token, lease_ms)
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
        if self.stopped or time.monotonic() < self.deadline:
            return
        self._lose("the lease ended before a renewal got through")

    def _lose(self, why: str) -> None:
        if self.stopped:
            return
        self.stop()
        logger.warning("lock %r lost: %s", self.lock.name, why)
        self.lock.lost.set()
        if self.lock.on_lost is not None:
            try:
                result = self.lock.on_lost(self.lock)
                if asyncio.iscoroutine(result):
                    self.loop.create_task(result)
            except Exception:
                logger.exception("on_lost callback of lock %r failed", self.lock.name)


# ---------------------------------------------------------------------------
# The lock
# ---------------------------------------------------------------------------


class Lock:
    """redis-py's asyncio ``Lock`` interface on the module; see
    ``redislock.Lock`` for what differs from redis-py. ``lost`` is an
    ``asyncio.Event``; ``on_lost`` may be a plain function or a coroutine
    function."""

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
        self.auto_renewal = (not timeout) if auto_renewal is None else bool(auto_renewal)
        self.on_lost = on_lost
        self.lost = asyncio.Event()
        self.local = threading.local() if self.thread_local else SimpleNamespace()
        self.local.token = None

    async def __aenter__(self) -> "Lock":
        if await self.acquire():
            return self
        raise LockError("Unable to acquire lock within the time specified")

    async def __aexit__(self, exc_type, exc_value, traceback) -> None:
        try:
            await self.release()
        except LockError:
            if self.raise_on_release_error:
                raise
            logger.warning(
                "Lock was unlocked or no longer owned when exiting context manager."
            )

    @property
    def token(self) -> Optional[bytes]:
        return getattr(self.local, "token", None)

    @property
    def fence(self) -> Optional[int]:
        return getattr(self.local, "fence", None) if self.token is not None else None

    @property
    def lease(self) -> float:
        return float(self.timeout) if self.timeout else float(self.no_timeout_lease)

    async def _execute(self, *args: Any) -> Any:
        try:
            return await self.redis.execute_command(*args)
        except ResponseError as e:
            raise translate(e, self.name) from None

    async def _renew(self, token: bytes, ttl_ms: int) -> Any:
        return await self._execute("LOCK.RENEW", self.name, token, ttl_ms)

    def _encode(self, value: Any) -> bytes:
        try:
            encoder = self.redis.connection_pool.get_encoder()
        except AttributeError:  # cluster
            encoder = self.redis.get_encoder()
        return encoder.encode(value)

    async def acquire(
        self,
        blocking: Optional[bool] = None,
        blocking_timeout: Optional[float] = None,
        token: Optional[Any] = None,
    ) -> bool:
        """As ``redislock.Lock.acquire`` (redis-py's asyncio signature, which
        has no ``sleep``: ``self.sleep`` paces the polling). Cancelled, it
        leaves no hold behind: a grant that crossed the cancel is released."""
        token = uuid.uuid4().hex.encode() if token is None else self._encode(token)
        sleep = self.sleep
        if blocking is None:
            blocking = self.blocking
        if blocking_timeout is None:
            blocking_timeout = self.blocking_timeout
        budget = Budget(blocking, blocking_timeout, time.monotonic())
        while True:
            sent = time.monotonic()
            try:
                fence = await self._try_acquire(token, budget.wait(sent))
            except ResponseError as e:
                if not is_wrongtype(e):
                    raise translate(e, self.name) from None
                # Taken, in redis-py's terms, by a value the server queues
                # nobody on: try again later, as redis-py polls.
                if not budget.again(time.monotonic(), sleep):
                    return False
                await asyncio.sleep(sleep)
                continue
            if fence is None:
                return False
            if self.token != token and needs_confirmation(time.monotonic() - sent, self.lease):
                sent = time.monotonic()
                if not await self._confirm(token):
                    # Granted, but over before we knew: queue again if time is left.
                    if budget.again(time.monotonic()):
                        continue
                    return False
            self._held(token, int(fence), sent)
            return True

    async def _try_acquire(self, token: bytes, wait: Optional[int]) -> Any:
        """As in the sync lock; a cancel counts as a failure."""
        args = acquire_args(self.name, token, seconds_to_ms(self.lease), wait)
        try:
            return await _acquire_call(self.redis, self.name, args, wait)
        except ResponseError:
            raise
        except BaseException:
            await self._abandon(token)
            raise

    async def _confirm(self, token: bytes) -> bool:
        """As in the sync lock."""
        try:
            await self._renew(token, seconds_to_ms(self.lease))
        except ResponseError as e:
            if hold_is_gone(e):
                return False
            await self._abandon(token)
            raise
        except BaseException:
            await self._abandon(token)
            raise
        return True

    async def _abandon(self, token: bytes) -> None:
        """As in the sync lock. The release runs shielded: a second cancel
        stops the wait for it, not the release."""
        if token == self.token:
            return
        release = asyncio.ensure_future(self._release_abandoned(token))
        _shielded.add(release)
        release.add_done_callback(_shielded.discard)
        await asyncio.shield(release)

    async def _release_abandoned(self, token: bytes) -> None:
        try:
            await self._execute("LOCK.RELEASE", self.name, token)
        except Exception as e:  # the caller sees the failure that brought us here
            if not (isinstance(e, ResponseError) and hold_is_gone(e)):
                logger.warning("releasing %r after a failed acquire failed: %s", self.name, e)

    def _held(self, token: bytes, fence: int, start: float) -> None:
        """As in the sync lock (the loop runs one step at a time, so the
        renewer needs no holding still here)."""
        renewer = getattr(self.local, "renewer", None)
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
            _Renewer(self, token, self.lease, start) if self.auto_renewal else None
        )

    def _forget(self) -> None:
        renewer = getattr(self.local, "renewer", None)
        if renewer is not None:
            renewer.stop()
        self.local.renewer = None
        self.local.token = None
        self.local.fence = None

    async def _info(self) -> Optional[Dict[str, Any]]:
        try:
            return parse_info(await self._execute("LOCK.INFO", self.name))
        except ResponseError as e:
            if not is_wrongtype(e):
                raise
            return OTHER_VALUE

    async def locked(self) -> bool:
        return await self._info() is not None

    async def owned(self) -> bool:
        token = self.token
        return owned_by(await self._info(), token, self._encode)

    async def _paused(self, body: Callable[[], Awaitable[Any]]) -> Any:
        """Run ``body`` with this hold's renewer held still (see sync Lock)."""
        renewer = getattr(self.local, "renewer", None)
        if renewer is None:
            return await body()
        async with renewer.mutex:
            return await body()

    async def release(self) -> None:
        token = self.token
        if token is None:
            raise LockError(
                "Cannot release a lock that's not owned or is already unlocked.",
                lock_name=self.name,
            )

        async def body() -> None:
            try:
                remaining = await self._execute("LOCK.RELEASE", self.name, token)
            except LockError:
                raise
            except ResponseError as e:
                if not hold_is_gone(e):
                    raise
                self._forget()
                raise LockNotOwnedError(
                    "Cannot release a lock that's no longer owned"
                ) from None
            if int(remaining) == 0:
                self._forget()

        await self._paused(body)

    def extend(
        self, additional_time: float, replace_ttl: bool = False
    ) -> Awaitable[Literal[True]]:
        token = self.token
        if token is None:
            raise LockError("Cannot extend an unlocked lock")
        if self.timeout is None:
            raise LockError("Cannot extend a lock with no timeout")

        async def body() -> Literal[True]:
            sent = time.monotonic()
            ttl_ms = int(additional_time * 1000)
            if not replace_ttl:
                info = await self._info()
                if not owned_by(info, token, self._encode):
                    raise LockNotOwnedError("Cannot extend a lock that's no longer owned")
                ttl_ms += int(info["ttl"])
            ttl_ms = max(1, ttl_ms)
            await self._renew_or_raise(token, ttl_ms, "extend")
            renewer = getattr(self.local, "renewer", None)
            if renewer is not None:
                renewer.confirmed(sent + ttl_ms / 1000)
            return True

        return self._paused(body)

    def reacquire(self) -> Awaitable[Literal[True]]:
        token = self.token
        if token is None:
            raise LockError("Cannot reacquire an unlocked lock")
        if self.timeout is None:
            raise LockError("Cannot reacquire a lock with no timeout")

        async def body() -> Literal[True]:
            sent = time.monotonic()
            await self._renew_or_raise(token, seconds_to_ms(self.lease), "reacquire")
            renewer = getattr(self.local, "renewer", None)
            if renewer is not None:
                renewer.confirmed(sent + self.lease)
            return True

        return self._paused(body)

    async def _renew_or_raise(self, token: bytes, ttl_ms: int, verb: str) -> None:
        try:
            await self._renew(token, ttl_ms)
        except LockError:
            raise
        except ResponseError as e:
            if not hold_is_gone(e):
                raise
            raise LockNotOwnedError(f"Cannot {verb} a lock that's no longer owned") from None
