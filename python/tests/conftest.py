"""Real servers for the tests: each on a free loopback port, in its own temp
dir, killed at teardown. The binaries come from the environment:

- ``LOCK_MODULE``: the module (default: ``target/release/libredislock.so`` of
  the checkout this folder lives in);
- ``LOCK_SERVER`` / ``LOCK_CLI``: ``redis-server``/``redis-cli`` (default) or
  ``valkey-server``/``valkey-cli``.

Tests wait on what the servers report (``LOCK.INFO``, ``INFO``), with
deadlines, rather than on fixed sleeps.
"""

import os
import random
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, List, Optional

import pytest
import redis

from redislock._common import parse_info

ROOT = Path(__file__).resolve().parents[2]
MODULE = os.environ.get("LOCK_MODULE") or str(ROOT / "target/release/libredislock.so")
SERVER = os.environ.get("LOCK_SERVER") or "redis-server"
CLI = os.environ.get("LOCK_CLI") or "redis-cli"


def wait_until(check: Callable[[], object], timeout: float = 10.0, what: str = "") -> object:
    """Poll ``check`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}")
        time.sleep(0.005)


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
        for attempt in range(3):  # a port taken between the check and the bind
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


def wait_waiters(client: redis.Redis, name: str, n: int, timeout: float = 10.0) -> None:
    """Wait until ``n`` clients are queued on ``name``."""
    wait_until(
        lambda: (lock_info(client, name) or {}).get("waiters") == n,
        timeout,
        f"{n} waiters on {name}",
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


# -- fixtures ----------------------------------------------------------------

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
                if info.get("cluster_state") != "ok" or int(info.get("cluster_known_nodes", 0)) != 3:
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
