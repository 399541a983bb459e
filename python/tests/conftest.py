"""Real servers for the tests: each on a free loopback port, in its own temp
dir, killed at teardown. The binaries come from the environment:

- ``LOCK_MODULE``: the module (default: ``target/release/libredislock.so`` of
  the checkout this folder lives in);
- ``LOCK_SERVER`` / ``LOCK_CLI``: ``redis-server``/``redis-cli`` (default) or
  ``valkey-server``/``valkey-cli``.

Tests wait on what the servers report (``LOCK.INFO``, ``INFO``), with
deadlines, rather than on fixed sleeps.

The ``api`` fixture runs one test body on both locks: the sync one with
redis-py's client, and the asyncio one with redis.asyncio's (see ``SyncAPI``
and ``AsyncAPI``).
"""

import asyncio
import inspect
import os
import random
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, List, Optional

import pytest
import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.lock
import redis.cluster
import redis.lock

import redislock
import redislock.asyncio
from redislock._common import parse_info

ROOT = Path(__file__).resolve().parents[2]
MODULE = os.environ.get("LOCK_MODULE") or str(ROOT / "target/release/libredislock.so")
SERVER = os.environ.get("LOCK_SERVER") or "redis-server"
CLI = os.environ.get("LOCK_CLI") or "redis-cli"


def wait_until(
    check: Callable[[], object],
    timeout: float = 10.0,
    what: str = "",
    pause: Callable[[float], object] = time.sleep,
) -> object:
    """Poll ``check`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}")
        pause(0.005)


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(cluster: bool = False) -> int:
    """A free loopback port; for a cluster node, port + 10000 (its bus) too."""
    for _ in range(200):
        port = random.randint(20000, 30000)
        if _bindable(port) and (not cluster or _bindable(port + 10000)):
            return port
    raise RuntimeError("no free port")


class Server:
    """One redis-server/valkey-server process."""

    def __init__(self, *extra: str, module: bool = True, cluster: bool = False):
        self.dir = tempfile.mkdtemp(prefix="redislock-py-")
        self.extra = list(extra)
        self.module = module
        self.cluster = cluster
        self.proc: Optional[subprocess.Popen] = None
        for _attempt in range(3):  # a port taken between the check and the bind
            self.port = free_port(cluster)
            if self._start():
                return
        raise RuntimeError(f"{SERVER} did not start:\n{self.log()}")

    def _start(self) -> bool:
        args = [
            SERVER,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", self.dir,
            "--logfile", "server.log",
            "--save", "",
            "--appendonly", "no",
            "--enable-debug-command", "yes",
            "--repl-diskless-sync-delay", "0",
        ]
        if self.module:
            args += ["--loadmodule", MODULE]
        if self.cluster:
            args += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                     "--cluster-node-timeout", "5000"]
        args += self.extra
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                if client.ping():
                    return True
            except (redis.ConnectionError, redis.TimeoutError):
                pass
            except redis.ResponseError:  # LOADING
                pass
            time.sleep(0.01)
        self.stop()
        return False

    def client(self, **kwargs) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)

    def log(self) -> str:
        try:
            return Path(self.dir, "server.log").read_text(errors="replace")
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def commandstat(client: redis.Redis, command: str) -> int:
    """How many times the server ran ``command`` since CONFIG RESETSTAT."""
    stats = client.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


def lock_info(client: redis.Redis, name: str) -> Optional[dict]:
    """LOCK.INFO as a dict (RESP2 or RESP3 client), None for a free lock."""
    return parse_info(client.execute_command("LOCK.INFO", name))


def wait_waiters(
    client: redis.Redis,
    name: str,
    n: int,
    timeout: float = 10.0,
    pause: Callable[[float], object] = time.sleep,
) -> None:
    """Wait until ``n`` clients are queued on ``name``."""
    wait_until(
        lambda: (lock_info(client, name) or {}).get("waiters") == n,
        timeout,
        f"{n} waiters on {name}",
        pause,
    )


def in_thread(fn):
    """Run ``fn`` in a thread; the returned thread's ``result`` holds its
    value or the exception it raised."""
    def body():
        try:
            worker.result = fn()
        except BaseException as e:
            worker.result = e

    worker = threading.Thread(target=body, daemon=True)
    worker.result = None
    worker.start()
    return worker


# -- one test body, both locks ------------------------------------------------


class SyncAPI:
    """``redislock.Lock`` with redis-py's client. A test body written for
    both APIs wraps each lock call in ``run`` (here it returns the value it
    is given), waits with ``sleep``/``wait``/``wait_until`` and runs calls in
    the background with ``spawn`` (here a thread)."""

    name = "sync"
    Lock = redislock.Lock
    MultiLock = redislock.MultiLock
    ReadWriteLock = redislock.ReadWriteLock
    Semaphore = redislock.Semaphore
    RedisPyLock = redis.lock.Lock

    def __init__(self, server: "Server"):
        self.server = server
        self.clients: list = []

    def client(self, server: Optional["Server"] = None, **kwargs):
        client = (server or self.server).client(**kwargs)
        self.clients.append(client)
        return client

    def cluster_client(self, nodes: List["Server"], **kwargs):
        client = redis.cluster.RedisCluster(host="127.0.0.1", port=nodes[0].port, **kwargs)
        self.clients.append(client)
        return client

    def run(self, value):
        return value

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def wait(self, event, timeout: float) -> bool:
        """Wait for the lock's ``lost`` (or any event) at most ``timeout`` s."""
        return event.wait(timeout)

    def entered(self, lock):
        """``with api.entered(lock) as held:`` for ``with``/``async with``."""
        return lock

    def blocking(self, call):
        """Make a blocking call (a sync client's, say) while the background
        goes on: here it always does."""
        return call()

    def spawn(self, *calls):
        """Make ``calls`` one after another in the background; the returned
        handle has ``join(timeout)``, ``is_alive()`` and ``result`` (the last
        call's value, or the exception one raised)."""
        return in_thread(lambda: [self.run(call()) for call in calls][-1])

    def wait_until(self, check, timeout: float = 10.0, what: str = ""):
        return wait_until(check, timeout, what, self.sleep)

    def wait_waiters(self, client, name: str, n: int, timeout: float = 10.0) -> None:
        wait_waiters(client, name, n, timeout, self.sleep)

    def close(self) -> None:
        for client in self.clients:
            client.close()


class AsyncAPI(SyncAPI):
    """``redislock.asyncio.Lock`` with redis.asyncio's client, on an event
    loop of the test's own. The loop runs while the body waits (in ``run``,
    ``sleep``, ``wait``, ``wait_until`` and a handle's ``join``): that is
    when renewals and spawned tasks make progress, as threads would while a
    sync body sleeps."""

    name = "asyncio"
    Lock = redislock.asyncio.Lock
    MultiLock = redislock.asyncio.MultiLock
    ReadWriteLock = redislock.asyncio.ReadWriteLock
    Semaphore = redislock.asyncio.Semaphore
    RedisPyLock = redis.asyncio.lock.Lock

    def __init__(self, server: "Server"):
        super().__init__(server)
        self.loop = asyncio.new_event_loop()

    def client(self, server: Optional["Server"] = None, **kwargs):
        port = (server or self.server).port
        client = redis.asyncio.Redis(host="127.0.0.1", port=port, **kwargs)
        self.clients.append(client)
        return client

    def cluster_client(self, nodes: List["Server"], **kwargs):
        client = redis.asyncio.cluster.RedisCluster(
            host="127.0.0.1", port=nodes[0].port, **kwargs
        )
        self.run(client.initialize())
        self.clients.append(client)
        return client

    def run(self, value):
        """Complete ``value`` on the loop if it is awaitable."""
        if inspect.isawaitable(value):
            return self.loop.run_until_complete(value)
        return value

    def sleep(self, seconds: float) -> None:
        self.run(asyncio.sleep(seconds))

    def wait(self, event, timeout: float) -> bool:
        async def waited() -> bool:
            try:
                await asyncio.wait_for(event.wait(), timeout)
            except asyncio.TimeoutError:
                return False
            return True

        return self.run(waited())

    @contextmanager
    def entered(self, lock):
        held = self.run(lock.__aenter__())
        try:
            yield held
        except BaseException as e:
            if not self.run(lock.__aexit__(type(e), e, e.__traceback__)):
                raise
        else:
            self.run(lock.__aexit__(None, None, None))

    def blocking(self, call):
        """Make it in a thread, with the loop running meanwhile."""
        return self.run(self.loop.run_in_executor(None, call))

    def spawn(self, *calls):
        async def body():
            value = None
            for call in calls:
                value = call()
                if inspect.isawaitable(value):
                    value = await value
            return value

        return _Spawned(self, self.loop.create_task(body()))

    def close(self) -> None:
        for client in self.clients:
            self.run(client.aclose())
        self.run(self._cancel_tasks())
        self.loop.close()

    @staticmethod
    async def _cancel_tasks() -> None:
        """Cancel what the test left running (renewals of holds it kept)."""
        left = asyncio.all_tasks() - {asyncio.current_task()}
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)


class _Spawned:
    """A task seen as ``in_thread`` shows a thread."""

    def __init__(self, api: AsyncAPI, task: "asyncio.Task"):
        self.api = api
        self.task = task

    def join(self, timeout: Optional[float] = None) -> None:
        self.api.run(asyncio.wait({self.task}, timeout=timeout))

    def is_alive(self) -> bool:
        return not self.task.done()

    @property
    def result(self):
        if not self.task.done():
            return None
        if self.task.cancelled():
            return asyncio.CancelledError()
        return self.task.exception() or self.task.result()


# -- fixtures ----------------------------------------------------------------


@pytest.fixture(params=[SyncAPI, AsyncAPI], ids=lambda api: api.name)
def api(request, server):
    """Each test that takes it runs twice: on the sync lock and on the asyncio one."""
    made = request.param(server)
    yield made
    made.close()

_servers: List[Server] = []


@pytest.fixture(scope="session")
def server():
    s = Server()
    _servers.append(s)
    yield s
    _servers.remove(s)
    s.cleanup()


@pytest.fixture
def r(server):
    """A client of the shared server, the database emptied and stats reset."""
    client = server.client()
    client.flushall()
    client.config_resetstat()
    yield client
    client.close()


@pytest.fixture
def name(request) -> str:
    return f"lock:{request.node.name}"


@pytest.fixture
def bare_server():
    """A server without the module."""
    s = Server(module=False)
    yield s
    s.cleanup()


@pytest.fixture
def replica_pair():
    master = Server()
    replica = Server("--replicaof", "127.0.0.1", str(master.port))
    _servers.extend([master, replica])
    wait_until(
        lambda: replica.client().info("replication").get("master_link_status") == "up",
        what="replica link up",
    )
    yield master, replica
    for s in (replica, master):
        _servers.remove(s)
        s.cleanup()


@pytest.fixture(scope="session")
def cluster():
    """Three masters, no replicas, every slot covered."""
    nodes = [Server(cluster=True) for _ in range(3)]
    _servers.extend(nodes)
    try:
        subprocess.run(
            [CLI, "--cluster", "create", *[f"127.0.0.1:{n.port}" for n in nodes],
             "--cluster-replicas", "0", "--cluster-yes"],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, timeout=60,
        )

        def ready():
            for n in nodes:
                c = n.client()
                info = c.cluster("info")
                known = int(info.get("cluster_known_nodes", 0))
                if info.get("cluster_state") != "ok" or known != 3:
                    return False
            return True

        wait_until(ready, 30, "cluster state ok")
        yield nodes
    finally:
        for n in nodes:
            _servers.remove(n)
            n.cleanup()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """On a failing test, show the tail of every running server's log."""
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        for s in _servers:
            report.sections.append(
                (f"server log (port {s.port})", "\n".join(s.log().splitlines()[-40:]))
            )


def pytest_report_header(config):
    try:
        version = subprocess.run([SERVER, "--version"], capture_output=True, text=True,
                                 timeout=10).stdout.strip()
    except OSError as e:
        version = f"not runnable: {e}"
    return [f"lock server: {SERVER}: {version}", f"lock module: {MODULE}"]
