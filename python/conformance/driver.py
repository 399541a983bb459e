"""The Python client's driver for the conformance suite (docs/conformance.md).

Reads requests on standard input, one per line, runs each concurrently, and
writes replies and events on standard output (logs go to standard error):

    python python/conformance/driver.py              # the sync API (threads)
    python python/conformance/driver.py --api asyncio

How the protocol's ideas map to this client:

- ``obj=``: one ``Lock``, ``ReadWriteLock`` or ``Semaphore`` per name, with
  redis-py's per-thread owners (``thread_local=True``); an object of one call
  only is not per thread (any thread may act on its hold).
- ``thread=``: sync, a thread of that name runs every call naming it, one at
  a time, and every later call about a hold it took; calls through a named
  object that name no thread share one thread of that object's (so they are
  one owner, as the suite's read-write scenarios expect). asyncio: tasks of
  one event loop share a thread, so ``thread=`` changes nothing there.
- ``cancel=<ms>``: asyncio cancels the task. The sync API is interrupted as a
  blocking Python call is: ``KeyboardInterrupt`` (SIGINT) on the main
  thread, which runs every call that carries ``cancel=`` (one at a time). A
  call that must run on a thread of its own (``thread=`` with a shared
  ``obj=``) cannot be interrupted: ``err unsupported``.
- ``! lost``: written when the hold's loss signal (``lock.lost``) is set,
  and before any reply that shows the loss.
- ``leaks``: the client's threads (sync) or tasks and armed timers
  (asyncio) still alive, after letting ones that are ending finish.
"""

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from queue import Queue
from typing import Any, Callable, Dict, Optional

# Run from a checkout without installing: the package is beside this folder.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis  # noqa: E402
import redis.asyncio  # noqa: E402
from redis.exceptions import (  # noqa: E402
    ConnectionError,
    LockError,
    LockNotOwnedError,
    ResponseError,
    TimeoutError,
)

import redislock  # noqa: E402
import redislock.asyncio  # noqa: E402
import redislock.lock  # noqa: E402
from redislock import LockUpgradeError  # noqa: E402

log = logging.getLogger("driver")


class BadRequest(Exception):
    """The line (or one of its arguments) does not parse."""


class Unsupported(Exception):
    """This client cannot express the request."""


class Refused(Exception):
    """The client refuses the combination."""


class Failed(Exception):
    """A reply of kind ``kind``: not-obtained, timeout."""

    def __init__(self, kind: str, text: str = ""):
        super().__init__(text)
        self.kind = kind


def refusal(lock: Any, what: str) -> Failed:
    """What an acquire that came back empty reports: the kind its
    ``not_acquired_reason`` names (``held``: not-obtained)."""
    reason = lock.not_acquired_reason
    kind = {"held": "not-obtained", "timeout": "timeout", "quarantine": "quarantine"}
    return Failed(kind.get(reason, "not-obtained"), f"{what} ({reason})")


class Cancelled(Exception):
    pass


# ---------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------

_out = threading.Lock()


def emit(line: str) -> None:
    with _out:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


# ---------------------------------------------------------------------------
# Requests
# ---------------------------------------------------------------------------


class Request:
    def __init__(self, line: str):
        tokens = line.split(" ")
        if len(tokens) < 2 or not tokens[0].isdigit():
            raise BadRequest(f"not `<id> <verb> [name=value ...]`: {line!r}")
        self.id = tokens[0]
        self.verb = tokens[1]
        self.args: Dict[str, str] = {}
        for token in tokens[2:]:
            name, sep, value = token.partition("=")
            if not sep or not name:
                raise BadRequest(f"not name=value: {token!r}")
            self.args[name] = value

    def get(self, name: str, default: Optional[str] = None) -> Optional[str]:
        return self.args.get(name, default)

    def need(self, name: str) -> str:
        value = self.args.get(name)
        if value is None:
            raise BadRequest(f"{self.verb} needs {name}=")
        return value

    def ms(self, name: str) -> Optional[int]:
        value = self.args.get(name)
        if value is None:
            return None
        if not value.isdigit():
            raise BadRequest(f"{name}= is a number of milliseconds, not {value!r}")
        return int(value)


def split_wait(request: Request) -> tuple:
    """``wait=`` → (blocking, blocking_timeout in seconds)."""
    wait = request.get("wait")
    if wait is None:
        return False, None
    if wait == "forever":
        return True, None
    ms = request.ms("wait")
    assert ms is not None
    # redis-py reads a blocking_timeout of 0 as one try, as the suite's wait=0.
    return (True, ms / 1000) if ms > 0 else (False, None)


class Record:
    """One hold the suite named (``h=``)."""

    def __init__(self, handle: str, lock: Any, worker: Any, private: bool):
        self.handle = handle
        self.lock = lock  # the Lock (or read/write side, or Permit) it was taken through
        self.worker = worker  # the thread its calls run on (per-thread objects)
        self.private = private  # an object of this hold only: any thread may act on it
        self.hold: Any = None  # the client's Hold, once granted
        self.watch: Any = None  # asyncio: the task that writes its `! lost`
        self.reported = False
        self.fence: Optional[int] = None


# ---------------------------------------------------------------------------
# What both APIs share: the verbs, on objects built by a subclass
# ---------------------------------------------------------------------------


class Driver:
    """The verbs; ``Sync`` and ``Async`` build the client and objects and run
    the calls."""

    api: Any  # redislock or redislock.asyncio

    def __init__(self) -> None:
        self.client: Any = None
        self.objects: Dict[str, Any] = {}
        self.records: Dict[str, Record] = {}
        self.state = threading.Lock()

    # -- replies ----------------------------------------------------------------

    def reply(self, request_id: str, text: str) -> None:
        emit(f"{request_id} {text}")

    def report_loss(self, record: Record) -> None:
        """Write the hold's ``! lost`` event, once, if it is lost."""
        hold = record.hold
        if hold is None:
            return
        reason = hold.check() if not hold.lost.is_set() else hold.reason
        if reason is None:
            return
        with self.state:
            if record.reported:
                return
            record.reported = True
            emit(f"! lost h={record.handle} reason={reason}")

    def error_kind(self, error: BaseException, record: Optional[Record]) -> str:
        if isinstance(error, (Cancelled, asyncio.CancelledError, KeyboardInterrupt)):
            return "cancelled"
        if isinstance(error, Failed):
            return error.kind
        if isinstance(error, BadRequest):
            return "bad-request"
        if isinstance(error, Unsupported):
            return "unsupported"
        if isinstance(error, Refused):
            return "refused"
        if isinstance(error, LockUpgradeError):
            return "upgrade"
        lost = record is not None and record.hold is not None and record.hold.check() is not None
        if isinstance(error, LockNotOwnedError):
            return "lost" if lost else "not-owner"
        if isinstance(error, ResponseError):
            text = str(error)
            if "another LIMIT" in text:
                return "limit-mismatch"
            if text.startswith("NOTOWNER"):
                return "not-owner"
            return "transport" if "LOADING" in text else "bad-request"
        if isinstance(error, LockError):
            return "lost" if lost else "not-owner"
        if isinstance(error, (ConnectionError, TimeoutError, OSError)):
            return "transport"
        if isinstance(error, ValueError):
            return "bad-request"
        return "transport"

    def failure(self, request: Request, error: BaseException) -> None:
        record = self.records.get(request.get("h") or "")
        if record is not None:
            self.report_loss(record)
        kind = self.error_kind(error, record)
        if kind in ("transport", "bad-request") and not isinstance(error, BadRequest):
            log.warning("%s %s: %s", request.id, request.verb, "".join(
                traceback.format_exception_only(type(error), error)).strip())
        text = " ".join(str(error).split())
        self.reply(request.id, f"err {kind} {text}".rstrip())

    def record(self, request: Request) -> Record:
        handle = request.need("h")
        record = self.records.get(handle)
        if record is None:
            raise BadRequest(f"no hold named {handle!r}")
        return record

    # -- objects ------------------------------------------------------------------

    def lock_of(self, request: Request) -> tuple:
        """The object an ``acquire`` goes through: (lock-shaped object, shared)."""
        kind = request.get("kind", "lock")
        keys = request.get("keys")
        if keys is not None and kind != "lock":
            raise Unsupported("several keys at once: exclusive locks only")
        key = request.need("key") if keys is None else keys
        name = request.get("obj")
        ttl = request.ms("ttl")
        if ttl is not None and ttl < 1:
            raise BadRequest("ttl= is at least 1 ms")
        timeout = None if ttl is None else ttl / 1000
        renew = request.get("renew", "auto")
        if renew not in ("auto", "off"):
            raise BadRequest(f"renew= is auto or off, not {renew!r}")
        ephemeral = request.get("ephemeral", "0") == "1"
        shared = name is not None
        options = dict(timeout=timeout, auto_renewal=renew == "auto")
        with self.state:
            obj = self.objects.get(name) if shared else None
            if obj is None:
                obj = self.new_object(kind, key, request, shared, ephemeral)
                if shared:
                    self.objects[name] = obj
        if kind == "lock":
            lock = obj
        elif kind in ("read", "write"):
            if not isinstance(obj, self.api.ReadWriteLock):
                raise BadRequest(f"obj={name} is not a read-write handle")
            lock = obj.read_lock() if kind == "read" else obj.write_lock()
        elif kind == "permit":
            if not isinstance(obj, self.api.Semaphore):
                raise BadRequest(f"obj={name} is not a semaphore")
            obj.timeout = timeout
            obj.auto_renewal = options["auto_renewal"]
            obj.ephemeral = ephemeral
            return obj, shared
        else:
            raise BadRequest(f"kind= is lock, read, write or permit, not {kind!r}")
        # The call's options, on the object it goes through.
        lock.timeout = timeout
        lock.auto_renewal = renew == "auto"
        lock.ephemeral = ephemeral
        return lock, shared

    def new_object(self, kind: str, key: str, request: Request, shared: bool, ephemeral: bool):
        if self.client is None:
            raise BadRequest("connect first")
        if ephemeral and self.refuses_ephemeral:
            raise Refused("ephemeral holds need a client that does not reconnect on its own")
        if kind == "lock" and request.get("keys") is not None:
            return self.api.MultiLock(self.client, key.split(","), thread_local=shared)
        if kind == "lock":
            return self.api.Lock(self.client, key, thread_local=shared)
        if kind in ("read", "write"):
            return self.api.ReadWriteLock(self.client, key, thread_local=shared)
        if kind == "permit":
            limit = request.ms("limit")
            return self.api.Semaphore(self.client, key, 1 if limit is None else limit)
        raise BadRequest(f"kind= is lock, read, write or permit, not {kind!r}")

    refuses_ephemeral = False

    def connect_args(self, request: Request) -> tuple:
        topology = request.get("topology", "single")
        if topology == "redlock":
            raise Unsupported("the Python client has no Redlock")
        if topology not in ("single", "cluster", "sentinel"):
            raise BadRequest(f"topology= is single, cluster, sentinel or redlock, not {topology!r}")
        url = request.need("url")
        return topology, url

    def release_count(self, request: Request, record: Record) -> int:
        """How many releases ``release`` makes: one, or with ``all=1`` as many
        as the hold's acquisitions through its object."""
        if request.get("all", "0") != "1":
            return 1
        return max(1, record.hold.count)

    def status_text(self, record: Record) -> str:
        self.report_loss(record)
        hold = record.hold
        lost = hold is not None and hold.lost.is_set()
        held = hold is not None and not lost and not hold.ended
        reason = hold.reason if lost else None
        fence = "-" if record.fence is None else record.fence
        return f"ok held={int(held)} lost={int(lost)} reason={reason or '-'} fence={fence}"


def granted_fields(record: Record) -> str:
    """An ``acquire``'s reply fields; a lock on several keys answers the
    first key's fence and every key's (``fences=``)."""
    hold = record.hold
    fences = getattr(record.lock, "fences", None)
    if fences is None:
        record.fence = hold.fence
        return f"fence={hold.fence} owner={hold.token.decode()}"
    record.fence = fences[0]
    joined = ",".join(str(fence) for fence in fences)
    return f"fence={fences[0]} fences={joined} owner={hold.token.decode()}"


def sentinel_address(url: str) -> tuple:
    rest = url.split("://", 1)[-1].split("/", 1)[0]
    host, _, port = rest.rpartition(":")
    return host or "127.0.0.1", int(port or 26379)


# ---------------------------------------------------------------------------
# The sync API: threads, and KeyboardInterrupt on the main thread to cancel
# ---------------------------------------------------------------------------


class Worker:
    """A thread that runs the calls given to it, one at a time."""

    def __init__(self, name: str):
        self.jobs: "Queue[Callable[[], None]]" = Queue()
        self.thread = threading.Thread(target=self._run, name=f"driver:{name}", daemon=True)
        self.thread.start()

    def submit(self, job: Callable[[], None]) -> None:
        self.jobs.put(job)

    def _run(self) -> None:
        while True:
            self.jobs.get()()


class MainThread:
    """Runs calls that carry ``cancel=`` on the main thread, one at a time,
    and interrupts one with SIGINT (``KeyboardInterrupt``) when its time is
    up, as Ctrl-C interrupts a blocking call."""

    def __init__(self) -> None:
        self.jobs: "Queue[Optional[Callable[[], None]]]" = Queue()
        self.guard = threading.Lock()
        self.running: Optional[object] = None
        self.armed = False
        signal.signal(signal.SIGINT, self._interrupted)

    def _interrupted(self, signum: int, frame: Any) -> None:
        # Only while the call it was meant for still runs.
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt

    def call(self, fn: Callable[[], Any], cancel_ms: int) -> Any:
        """Run ``fn`` here; interrupt it after ``cancel_ms``."""
        token = object()

        def interrupt() -> None:
            with self.guard:
                if self.running is token:
                    self.armed = True
                    # A real signal to the main thread, so that a blocking
                    # system call there returns (EINTR) and the handler runs.
                    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

        timer = threading.Timer(cancel_ms / 1000, interrupt)
        timer.daemon = True
        done = False
        result: Any = None
        try:
            try:
                with self.guard:
                    self.running = token
                timer.start()
                result = fn()
                done = True
            finally:
                timer.cancel()
                with self.guard:
                    self.running = None
                    self.armed = False
        except KeyboardInterrupt:
            if not done:
                raise Cancelled("cancelled") from None
        return result

    def submit(self, job: Callable[[], None]) -> None:
        self.jobs.put(job)

    def serve(self) -> None:
        while True:
            try:
                job = self.jobs.get()
                if job is None:
                    return
                job()
            except KeyboardInterrupt:  # one that came too late for its call
                continue


class Sync(Driver):
    api = redislock

    def __init__(self) -> None:
        super().__init__()
        self.workers: Dict[str, Worker] = {}
        self.main = MainThread()

    # -- where a call runs -----------------------------------------------------

    def worker(self, name: str) -> Worker:
        with self.state:
            worker = self.workers.get(name)
            if worker is None:
                worker = self.workers[name] = Worker(name)
            return worker

    def run(self, request: Request, fn: Callable[[], str], worker: Optional[Worker]) -> None:
        """Run ``fn`` (which returns the reply's text after ``ok``) where it
        must run, and reply."""
        cancel = request.ms("cancel")

        def job() -> None:
            try:
                if cancel == 0:
                    raise Cancelled("cancelled before it was sent")
                if cancel is None:
                    text = fn()
                else:
                    text = self.main.call(fn, cancel)
            except BaseException as e:
                self.failure(request, e)
            else:
                self.reply(request.id, f"ok{' ' + text if text else ''}")

        if cancel is not None:
            if worker is not None and worker is not self.main:
                raise Unsupported("a call bound to a thread of its own cannot be interrupted")
            self.main.submit(job)
        elif worker is not None:
            worker.submit(job)
        else:  # a thread of this call only
            threading.Thread(target=job, name=f"driver:{request.id}", daemon=True).start()

    # -- verbs ------------------------------------------------------------------

    def handle(self, request: Request) -> None:
        verb = request.verb
        if verb == "connect":
            topology, url = self.connect_args(request)
            if topology == "single":
                self.client = redis.Redis.from_url(url)
            elif topology == "cluster":
                from redis.cluster import RedisCluster

                self.client = RedisCluster.from_url(url)
            else:
                from redis.sentinel import Sentinel

                sentinel = Sentinel([sentinel_address(url)])
                self.client = sentinel.master_for(request.need("master"))
            self.reply(request.id, "ok")
        elif verb == "acquire":
            self.acquire(request)
        elif verb == "resume":
            self.resume(request)
        elif verb in ("renew", "release", "stop-renew"):
            record = self.record(request)
            worker = None if record.private else record.worker
            self.run(request, lambda: self.on_hold(request, record), worker)
        elif verb == "status":
            self.reply(request.id, self.status_text(self.record(request)))
        elif verb == "leaks":
            self.reply(request.id, f"ok running={settled(redislock.lock.running)}")
        elif verb == "quit":
            self.reply(request.id, "ok")
            os._exit(0)
        else:
            raise BadRequest(f"unknown verb {verb!r}")

    def acquire(self, request: Request) -> None:
        handle = request.need("h")
        if handle in self.records:
            raise BadRequest(f"h={handle} is taken")
        lock, shared = self.lock_of(request)
        blocking, blocking_timeout = split_wait(request)
        permits = request.ms("permits") or 1
        thread = request.get("thread")
        private = not shared or isinstance(lock, redislock.Semaphore)
        # A shared object's owners are per thread: the calls about a hold
        # taken through one run on the thread that took it (the main thread
        # for a call that may be interrupted).
        worker: Any = None
        if not private:
            if thread is not None:
                worker = self.worker(thread)
            elif request.get("cancel") is not None:
                worker = self.main
            else:
                # Unnamed calls through one object share a thread of its own,
                # so they share the object's owner.
                worker = self.worker(f"obj:{request.get('obj')}")
        record = Record(handle, lock, worker, private=private)
        self.records[handle] = record

        def call() -> str:
            if isinstance(lock, redislock.Semaphore):
                permit = lock.acquire(
                    blocking=blocking, blocking_timeout=blocking_timeout, permits=permits
                )
                if permit is None:
                    raise refusal(lock, "no permit")
                record.lock = permit
            elif not lock.acquire(blocking=blocking, blocking_timeout=blocking_timeout):
                raise refusal(lock, "not acquired")
            return self.granted(record)

        self.run(request, call, worker)

    def granted(self, record: Record) -> str:
        """Note the hold just taken (in the thread that took it)."""
        hold = record.lock._hold()
        record.hold = hold
        self.watch(record)
        return granted_fields(record)

    def watch(self, record: Record) -> None:
        """Write ``! lost`` the moment the hold's signal is set."""
        signal_ = record.hold.lost

        def watching() -> None:
            while not record.hold.ended or signal_.is_set():
                if signal_.wait(0.2):
                    self.report_loss(record)
                    return

        threading.Thread(target=watching, name=f"driver:watch:{record.handle}", daemon=True).start()

    def resume(self, request: Request) -> None:
        handle = request.need("h")
        if handle in self.records:
            raise BadRequest(f"h={handle} is taken")
        ttl = request.ms("ttl")
        if ttl is None or ttl < 1:
            raise BadRequest("resume needs ttl= (at least 1 ms)")
        fence = request.ms("fence")
        renew = request.get("renew", "auto")
        if self.client is None:
            raise BadRequest("connect first")
        lock = redislock.Lock(
            self.client, request.need("key"), timeout=ttl / 1000,
            auto_renewal=renew == "auto", thread_local=False,
        )
        record = Record(handle, lock, None, private=True)
        self.records[handle] = record
        owner = request.need("owner")

        def call() -> str:
            lock.resume(owner, fence)
            return self.granted(record)

        self.run(request, call, None)

    def on_hold(self, request: Request, record: Record) -> str:
        lock = record.lock
        if record.hold is None:
            raise BadRequest(f"h={record.handle} holds nothing")
        if request.verb == "renew":
            ttl = request.ms("ttl")
            self.report_loss(record)
            lock.renew(None if ttl is None else ttl / 1000)
        elif request.verb == "release":
            self.report_loss(record)
            for _ in range(self.release_count(request, record)):
                lock.release()
        else:
            lock.stop_renewal()
        return ""


def settled(count: Callable[[], int], patience: float = 0.5) -> int:
    """``count()`` once background work that is ending has ended (threads
    and tasks stop soon after they are told to, not at once)."""
    deadline = time.monotonic() + patience
    value = count()
    while value and time.monotonic() < deadline:
        time.sleep(0.01)
        value = count()
    return value


def serve_sync() -> None:
    driver = Sync()

    def reading() -> None:
        for line in sys.stdin:
            line = line.rstrip("\n")
            if not line:
                continue
            dispatch(driver, line)
        driver.main.jobs.put(None)

    threading.Thread(target=reading, name="driver:stdin", daemon=True).start()
    driver.main.serve()
    os._exit(0)


def dispatch(driver: Driver, line: str) -> None:
    try:
        request = Request(line)
    except BadRequest as e:
        first = line.split(" ", 1)[0]
        emit(f"{first if first.isdigit() else 0} err bad-request {e}")
        return
    try:
        driver.handle(request)
    except BaseException as e:  # noqa: BLE001 - every failure is a reply
        driver.failure(request, e)


# ---------------------------------------------------------------------------
# The asyncio API: one event loop, a task per request
# ---------------------------------------------------------------------------


class Async(Driver):
    api = redislock.asyncio

    def __init__(self, loop: asyncio.AbstractEventLoop):
        super().__init__()
        self.loop = loop
        self.tasks: set = set()

    def start(self, request: Request, coroutine: Any) -> None:
        cancel = request.ms("cancel")

        if cancel == 0:  # cancelled before it started
            coroutine.close()
            self.failure(request, Cancelled("cancelled before it was sent"))
            return

        async def run() -> None:
            task = asyncio.current_task()
            timer = None
            if cancel is not None:
                timer = self.loop.call_later(cancel / 1000, task.cancel)
            try:
                text = await coroutine
            except BaseException as e:
                self.failure(request, e)
            else:
                self.reply(request.id, f"ok{' ' + text if text else ''}")
            finally:
                if timer is not None:
                    timer.cancel()

        task = self.loop.create_task(run(), name=f"driver:{request.id}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def handle(self, request: Request) -> None:
        verb = request.verb
        if verb == "connect":
            topology, url = self.connect_args(request)
            if topology == "single":
                self.client = redis.asyncio.Redis.from_url(url)
            elif topology == "cluster":
                from redis.asyncio.cluster import RedisCluster as AsyncCluster

                self.client = AsyncCluster.from_url(url)
            else:
                from redis.asyncio.sentinel import Sentinel as AsyncSentinel

                sentinel = AsyncSentinel([sentinel_address(url)])
                self.client = sentinel.master_for(request.need("master"))
            self.reply(request.id, "ok")
        elif verb == "acquire":
            self.acquire(request)
        elif verb == "resume":
            self.resume(request)
        elif verb in ("renew", "release", "stop-renew"):
            record = self.record(request)
            self.start(request, self.on_hold(request, record))
        elif verb == "status":
            self.reply(request.id, self.status_text(self.record(request)))
        elif verb == "leaks":
            self.start(request, self.leaks())
        elif verb == "quit":
            self.reply(request.id, "ok")
            os._exit(0)
        else:
            raise BadRequest(f"unknown verb {verb!r}")

    async def leaks(self) -> str:
        deadline = time.monotonic() + 0.5
        while redislock.asyncio.running() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return f"running={redislock.asyncio.running()}"

    def acquire(self, request: Request) -> None:
        handle = request.need("h")
        if handle in self.records:
            raise BadRequest(f"h={handle} is taken")
        lock, shared = self.lock_of(request)
        blocking, blocking_timeout = split_wait(request)
        permits = request.ms("permits") or 1
        record = Record(handle, lock, None, private=not shared)
        self.records[handle] = record

        async def call() -> str:
            if isinstance(lock, redislock.asyncio.Semaphore):
                permit = await lock.acquire(
                    blocking=blocking, blocking_timeout=blocking_timeout, permits=permits
                )
                if permit is None:
                    raise refusal(lock, "no permit")
                record.lock = permit
            elif not await lock.acquire(blocking=blocking, blocking_timeout=blocking_timeout):
                raise refusal(lock, "not acquired")
            return self.granted(record)

        self.start(request, call())

    def granted(self, record: Record) -> str:
        hold = record.lock._hold()
        record.hold = hold

        async def watching() -> None:
            await hold.lost.wait()
            self.report_loss(record)

        watch = self.loop.create_task(watching(), name=f"driver:watch:{record.handle}")
        self.tasks.add(watch)
        watch.add_done_callback(self.tasks.discard)
        record.watch = watch
        return granted_fields(record)

    def resume(self, request: Request) -> None:
        handle = request.need("h")
        if handle in self.records:
            raise BadRequest(f"h={handle} is taken")
        ttl = request.ms("ttl")
        if ttl is None or ttl < 1:
            raise BadRequest("resume needs ttl= (at least 1 ms)")
        fence = request.ms("fence")
        renew = request.get("renew", "auto")
        if self.client is None:
            raise BadRequest("connect first")
        lock = redislock.asyncio.Lock(
            self.client, request.need("key"), timeout=ttl / 1000,
            auto_renewal=renew == "auto", thread_local=False,
        )
        record = Record(handle, lock, None, private=True)
        self.records[handle] = record
        owner = request.need("owner")

        async def call() -> str:
            await lock.resume(owner, fence)
            return self.granted(record)

        self.start(request, call())

    async def on_hold(self, request: Request, record: Record) -> str:
        lock = record.lock
        if record.hold is None:
            raise BadRequest(f"h={record.handle} holds nothing")
        if request.verb == "renew":
            ttl = request.ms("ttl")
            self.report_loss(record)
            await lock.renew(None if ttl is None else ttl / 1000)
        elif request.verb == "release":
            self.report_loss(record)
            try:
                for _ in range(self.release_count(request, record)):
                    await lock.release()
            finally:
                self.report_loss(record)
                watch = getattr(record, "watch", None)
                if watch is not None and not record.hold.lost.is_set():
                    watch.cancel()
        else:
            lock.stop_renewal()
        return ""


def serve_asyncio() -> None:
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    driver = Async(loop)
    finished = loop.create_future()

    def reading() -> None:
        for line in sys.stdin:
            line = line.rstrip("\n")
            if line:
                loop.call_soon_threadsafe(dispatch, driver, line)
        loop.call_soon_threadsafe(finished.set_result, None)

    threading.Thread(target=reading, name="driver:stdin", daemon=True).start()
    loop.run_until_complete(finished)
    os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--api", choices=("sync", "asyncio"), default="sync")
    options = parser.parse_args()
    logging.basicConfig(
        stream=sys.stderr, level=logging.WARNING, format="driver %(levelname)s %(message)s"
    )
    if options.api == "sync":
        serve_sync()
    else:
        serve_asyncio()


if __name__ == "__main__":
    main()
