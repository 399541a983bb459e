"""Python lock libraries against one local redis-server with the module.

Measures, in one run and on the same server:
- uncontended: one client, acquire + release pairs per second (median of 3);
- contended: 8 processes on one lock, each acquiring (blocking), doing
  nothing, releasing, for a fixed time: acquisitions per second (median of 2);
with how evenly the processes were served (fewest ÷ most acquisitions of
one process) and the longest single wait; for redislock.Lock (the module's
FIFO wait), redis-py's own Lock (polling,
with its default sleep=0.1 and with sleep=0.001) and python-redis-lock
(PyPI ``python-redis-lock``: SET NX + a BLPOP signal list).

Usage: python bench.py [--module PATH] [--server redis-server]
Bounded: under a minute in total.
"""

import argparse
import multiprocessing
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import redis
import redis.lock
import redis_lock

import redislock

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT = 10  # lease/expiry of every lock, seconds


def make_lock(kind, client, name):
    """A lock object with acquire(blocking) / release() for each library."""
    if kind == "redislock":
        return redislock.Lock(client, name, timeout=TIMEOUT)
    if kind == "redis-py sleep=0.1":
        return redis.lock.Lock(client, name, timeout=TIMEOUT)
    if kind == "redis-py sleep=0.001":
        return redis.lock.Lock(client, name, timeout=TIMEOUT, sleep=0.001)
    if kind == "python-redis-lock":
        return redis_lock.Lock(client, name, expire=TIMEOUT)
    raise ValueError(kind)


KINDS = ["redislock", "redis-py sleep=0.1", "redis-py sleep=0.001", "python-redis-lock"]


def uncontended(port, kind, pairs):
    client = redis.Redis(host="127.0.0.1", port=port)
    lock = make_lock(kind, client, f"bench:solo:{kind}")
    start = time.perf_counter()
    for _ in range(pairs):
        # python-redis-lock's Lock takes a fresh id per object but reuses it;
        # acquire/release on one object is its documented use.
        if not lock.acquire(blocking=False):
            raise RuntimeError(f"{kind}: uncontended acquire failed")
        lock.release()
    elapsed = time.perf_counter() - start
    client.close()
    return pairs / elapsed


def contender(port, kind, name, stop_at, queue):
    client = redis.Redis(host="127.0.0.1", port=port)
    count, longest = 0, 0.0
    while time.time() < stop_at:
        lock = make_lock(kind, client, name)
        asked = time.perf_counter()
        if kind == "python-redis-lock":
            got = lock.acquire(blocking=True, timeout=max(0.01, stop_at - time.time()))
        else:
            got = lock.acquire(blocking_timeout=max(0.001, stop_at - time.time()))
        if not got:
            break
        longest = max(longest, time.perf_counter() - asked)
        count += 1
        lock.release()
    client.close()
    queue.put((count, longest))


def contended(port, kind, procs, seconds):
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    name = f"bench:shared:{kind}:{time.time()}"
    stop_at = time.time() + 0.3 + seconds  # 0.3 s for the processes to start
    workers = [
        ctx.Process(target=contender, args=(port, kind, name, stop_at, queue))
        for _ in range(procs)
    ]
    for w in workers:
        w.start()
    results = [queue.get(timeout=seconds + 30) for _ in workers]
    for w in workers:
        w.join(10)
    counts = [c for c, _ in results]
    return {
        "rate": sum(counts) / seconds,
        # 1.0: every process got the lock equally often; 0: one starved.
        "fairness": min(counts) / max(counts) if max(counts) else 0.0,
        "longest_ms": max(w for _, w in results) * 1000,
    }


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(binary, module):
    directory = tempfile.mkdtemp(prefix="redislock-bench-")
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", directory,
         "--save", "", "--appendonly", "no", "--loadmodule", module],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )
    client = redis.Redis(host="127.0.0.1", port=port)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start") from None
            time.sleep(0.02)
    return proc, port, directory


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", default=os.environ.get("LOCK_MODULE")
                        or os.path.join(ROOT, "target/release/libredislock.so"))
    parser.add_argument("--server", default=os.environ.get("LOCK_SERVER") or "redis-server")
    parser.add_argument("--pairs", type=int, default=2000)
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=2.5)
    args = parser.parse_args()

    began = time.monotonic()
    proc, port, directory = start_server(args.server, args.module)
    try:
        version = redis.Redis(host="127.0.0.1", port=port).info("server")["redis_version"]
        print(f"server {args.server} {version}, module {args.module}, "
              f"redis-py {redis.__version__}, {os.cpu_count()} cores")
        solo = {k: [] for k in KINDS}
        busy = {k: [] for k in KINDS}
        for _ in range(3):  # interleaved, so drift hits every library alike
            for kind in KINDS:
                solo[kind].append(uncontended(port, kind, args.pairs))
        for _ in range(2):
            for kind in KINDS:
                busy[kind].append(contended(port, kind, args.procs, args.seconds))
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(directory, ignore_errors=True)

    solo = {k: statistics.median(v) for k, v in solo.items()}
    # Contended figures: those of the run with the median rate (2 runs: the lower).
    busy = {k: sorted(v, key=lambda run: run["rate"])[(len(v) - 1) // 2] for k, v in busy.items()}
    ours_solo, ours_busy = solo["redislock"], busy["redislock"]["rate"]
    columns = [
        ("lock", 22), ("uncontended pairs/s", 19), ("redislock ÷ it", 14),
        (f"{args.procs} procs acq/s", 15), ("redislock ÷ it", 14),
        ("fairness min÷max", 16), ("longest wait ms", 15),
    ]
    print()
    print("| " + " | ".join(f"{c:>{w}}" if i else f"{c:<{w}}"
                             for i, (c, w) in enumerate(columns)) + " |")
    print("|" + "|".join("-" * (w + 2) for _, w in columns) + "|")
    for kind in KINDS:
        b = busy[kind]
        cells = [f"{kind:<22}", f"{solo[kind]:>19,.0f}", f"{ours_solo / solo[kind]:>13.2f}×",
                 f"{b['rate']:>15,.0f}", f"{ours_busy / b['rate']:>13.2f}×",
                 f"{b['fairness']:>16.2f}", f"{b['longest_ms']:>15,.1f}"]
        print("| " + " | ".join(cells) + " |")
    print(f"\n(uncontended: median of 3 runs of {args.pairs} pairs; contended: median of "
          f"2 runs of {args.seconds} s; total {time.monotonic() - began:.0f} s)")


if __name__ == "__main__":
    sys.exit(main())
