"""A worker of the partition test (tests/integration/sentinel.rs at the top
of the repository): threads that loop lock -> fenced read-modify-write ->
release on the master redis-py's ``Sentinel`` finds, and print each hold.

    python partition_worker.py SENTINELS NAME STORE_SOCKET LOCKS THREADS STOP_FILE

Same arguments and output as the Rust worker (client/examples/
partition_worker.rs): ``hold LOCK FENCE GRANTED_US DONE_US RELEASED WROTE``,
the holder using the lock from its grant's reply until it sends the release.
"""

import os
import sys
import threading
import time

import redis
from redis.sentinel import Sentinel

from redislock import Lock

TTL = 1.0
WAIT = 1.5
LONGEST = 15 * 60
WORK = 0.005

# The store's check, as in the Rust worker: a fence below the highest seen
# is refused, on reads and on writes; fences are below 2^53, so Lua compares
# them exactly as numbers.
STORE = """
local seen = redis.call('GET', KEYS[1] .. ':fence')
local f = ARGV[1]
if seen and tonumber(f) < tonumber(seen) then
  return redis.error_reply('STALE fence ' .. f .. ' below ' .. seen)
end
redis.call('SET', KEYS[1] .. ':fence', f)
if ARGV[2] then
  redis.call('SET', KEYS[1], ARGV[2])
  return 'OK'
end
return redis.call('GET', KEYS[1]) or '0'
"""

out_lock = threading.Lock()


def unix_us() -> int:
    return time.time_ns() // 1000


def work(master, store_path, locks, index, stop, started):
    store = redis.Redis(unix_socket_path=store_path)
    i = index
    while not os.path.exists(stop) and time.monotonic() - started < LONGEST:
        i += 1
        key = f"res:{i % locks}"
        lock = Lock(master, key, timeout=TTL, blocking_timeout=WAIT, auto_renewal=False)
        sent = time.monotonic()
        try:
            if not lock.acquire():
                continue
        except redis.RedisError:
            time.sleep(0.02)
            continue
        granted = unix_us()
        fence = str(lock.fence)
        wrote = False
        try:
            value = store.eval(STORE, 1, key, fence)
            time.sleep(WORK)  # the work between the read and the write
            # Only within the lease, counted from the send, as a careful holder does.
            if time.monotonic() < sent + TTL:
                store.eval(STORE, 1, key, fence, int(value) + 1)
                wrote = True
        except redis.RedisError:
            pass
        # Done before the release is sent: its reply may come after the next
        # holder's grant.
        done = unix_us()
        try:
            lock.release()
            released = True
        except Exception:
            released = False
        with out_lock:
            sys.stdout.write(f"hold {key} {fence} {granted} {done} {int(released)} {int(wrote)}\n")
            sys.stdout.flush()


def main():
    sentinels, name, store_path, locks, threads, stop = sys.argv[1:7]
    addrs = [(a.split(":")[0], int(a.split(":")[1])) for a in sentinels.split(",")]
    sentinel = Sentinel(addrs, socket_timeout=2.0, socket_connect_timeout=2.0)
    # The wait parks the connection in the server: its reply may take WAIT.
    master = sentinel.master_for(name, socket_timeout=WAIT + 2.0, socket_connect_timeout=2.0)
    started = time.monotonic()
    workers = [
        threading.Thread(
            target=work, args=(master, store_path, int(locks), t, stop, started), daemon=True
        )
        for t in range(int(threads))
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


if __name__ == "__main__":
    main()
