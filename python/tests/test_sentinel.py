"""redislock.Lock behind redis-py's Sentinel: the master found through a
``redis-sentinel``, and the new master after ``SENTINEL FAILOVER`` (the old
one, now a replica, answers READONLY; redis-py asks the Sentinel again)."""

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import redis
from redis.sentinel import Sentinel

from conftest import Server, free_port, lock_info, wait_until
from redislock import Lock


class SentinelProcess:
    """A redis-sentinel on loopback monitoring ``master`` as ``m``."""

    def __init__(self, master: Server):
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="redislock-sentinel-")
        conf = Path(self.dir) / "sentinel.conf"
        conf.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {self.dir}\nlogfile sentinel.log\n"
            f"sentinel monitor m 127.0.0.1 {master.port} 1\n"
            "sentinel down-after-milliseconds m 2000\n"
            "sentinel failover-timeout m 10000\n"
        )
        self.proc = subprocess.Popen(
            ["redis-sentinel", str(conf)],
            cwd=self.dir,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, decode_responses=True, socket_timeout=2)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def group():
    if shutil.which("redis-sentinel") is None:
        pytest.fail("redis-sentinel not found: apt-get install redis-sentinel (make deps)")
    master = Server()
    replica = Server("--replicaof", "127.0.0.1", str(master.port))
    wait_until(
        lambda: master.client().info("replication")["connected_slaves"] == 1,
        what="the replica attached",
    )
    sentinel = SentinelProcess(master)
    yield master, replica, sentinel
    sentinel.stop()
    for server in (master, replica):
        server.stop()
        server.cleanup()


def test_the_lock_follows_the_master_sentinel_names_across_a_failover(group):
    master, replica, sentinel = group
    s = sentinel.client()
    wait_until(
        lambda: len(s.sentinel_slaves("m")) == 1, timeout=20, what="Sentinel sees the replica"
    )
    r = Sentinel([("127.0.0.1", sentinel.port)], socket_timeout=2).master_for("m", socket_timeout=5)
    lock = Lock(r, "job", timeout=5)
    assert lock.acquire()
    assert lock_info(master.client(), "job") is not None
    lock.release()

    def failover():
        try:
            return s.execute_command("SENTINEL", "FAILOVER", "m")
        except redis.ResponseError:
            return None  # NOGOODSLAVE until the Sentinel has read the replica's INFO

    wait_until(failover, timeout=30, what="Sentinel starts a failover")
    wait_until(
        lambda: s.sentinel_get_master_addr_by_name("m")[1] == replica.port,
        timeout=30,
        what="Sentinel names the replica",
    )

    wait_until(
        lambda: master.client().info("replication")["role"] == "slave",
        timeout=30,
        what="the old master is a replica",
    )

    def taken():
        try:
            return Lock(r, "job", timeout=5, blocking=False).acquire()
        except (redis.ConnectionError, redis.ReadOnlyError):
            return False  # the old connection, dropped; the next asks again

    wait_until(taken, timeout=20, what="the lock taken on the new master")
    assert lock_info(replica.client(), "job") is not None
