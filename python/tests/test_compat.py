"""redis-py compatibility: each scenario runs once with redis-py's own
``redis.lock.Lock`` and once with ``redislock.Lock`` (each on its own key of
the same server), and both runs must observe the same things: return values,
exception classes and messages, lock state, the key's TTL."""

import threading
import time

import pytest
import redis
import redis.lock

import redislock

CLASSES = {"redis-py": redis.lock.Lock, "redislock": redislock.Lock}


def attempt(fn):
    """What calling ``fn`` shows: its value, or the exception's class and text."""
    try:
        return ("ok", fn())
    except Exception as e:  # the observation is the point
        return ("raise", type(e).__name__, str(e))


def basic(r, key, make):
    a, b = make(timeout=10), make(timeout=10)
    seen = [a.acquire(blocking=False), a.locked(), a.owned()]
    seen += [b.acquire(blocking=False), b.owned(), b.locked()]
    seen += [attempt(a.release), a.locked(), a.owned()]
    seen += [b.acquire(blocking=False), b.owned(), a.owned(), attempt(b.release)]
    seen += [attempt(a.release), attempt(b.release), b.locked()]
    return seen


def context_manager(r, key, make):
    lock = make(timeout=10)
    with lock as entered:
        seen = [entered is lock, lock.owned(), lock.locked()]
    seen += [lock.locked(), lock.owned()]
    return seen


def blocking_timeout_when_held(r, key, make):
    holder = make(timeout=10)
    holder.acquire()
    waiter = make(timeout=10, blocking_timeout=0.3)
    start = time.monotonic()
    seen = [waiter.acquire(), time.monotonic() - start < 1.0]
    seen += [make(blocking=False).acquire(), make().acquire(blocking=False)]
    seen += [attempt(lambda: make(timeout=1, blocking_timeout=0.1).__enter__())]
    seen += [attempt(holder.release), waiter.acquire(), waiter.owned()]
    return seen


def extend_and_reacquire(r, key, make):
    lock = make(timeout=10)
    lock.acquire()
    seen = [lock.extend(5), 14000 < r.pttl(key) <= 15000]
    seen += [lock.extend(2, replace_ttl=True), 1000 < r.pttl(key) <= 2000]
    seen += [lock.reacquire(), 9000 < r.pttl(key) <= 10000]
    seen += [attempt(lock.release), attempt(lambda: lock.extend(1))]
    seen += [attempt(lock.reacquire)]
    return seen


def extend_without_timeout(r, key, make):
    lock = make()
    lock.acquire()
    seen = [attempt(lambda: lock.extend(1)), attempt(lock.reacquire)]
    seen += [attempt(lock.release), lock.locked()]
    return seen


def lost_lock(r, key, make):
    lock = make(timeout=10)
    lock.acquire()
    r.delete(key)
    seen = [lock.owned(), lock.locked()]
    seen += [attempt(lambda: lock.extend(1)), attempt(lock.reacquire)]
    seen += [attempt(lock.release), attempt(lock.release)]
    return seen


def overwritten_by_another_value(r, key, make):
    """redis-py's own lock tests fake another holder with a plain SET."""
    lock = make(timeout=10)
    lock.acquire()
    r.set(key, "x")
    seen = [lock.owned(), lock.locked()]
    seen += [attempt(lambda: lock.extend(1)), attempt(lambda: lock.extend(1, True))]
    seen += [attempt(lock.reacquire)]
    seen += [attempt(lock.release), lock.local.token, attempt(lock.release)]
    other = make(timeout=10, blocking_timeout=0.2)
    seen += [attempt(lambda: other.acquire(blocking=False)), attempt(other.acquire)]
    seen += [other.owned(), other.locked(), r.get(key) in ("x", b"x")]
    r.delete(key)
    seen += [other.acquire(blocking=False), other.owned(), attempt(other.release)]
    return seen


def release_error_in_context(r, key, make):
    def body(raise_on_release_error):
        with make(timeout=10, raise_on_release_error=raise_on_release_error):
            r.delete(key)
        return "exited"

    return [attempt(lambda: body(True)), attempt(lambda: body(False))]


def expiry(r, key, make):
    lock, other = make(timeout=0.2), make(timeout=10)
    seen = [lock.acquire()]
    deadline = time.monotonic() + 5
    while lock.locked() and time.monotonic() < deadline:
        time.sleep(0.01)
    seen += [lock.locked(), lock.owned(), other.acquire(blocking=False)]
    seen += [attempt(lock.release), other.owned(), attempt(other.release)]
    return seen


def explicit_token(r, key, make):
    lock, other = make(timeout=10), make(timeout=10)
    seen = [lock.acquire(token="tok-1"), lock.owned(), lock.local.token]
    seen += [other.acquire(token="tok-2", blocking=False), other.owned()]
    seen += [attempt(lock.release), other.acquire(token=b"tok-2", blocking=False)]
    seen += [other.local.token, attempt(other.release)]
    return seen


def shared_across_threads(r, key, make):
    lock = make(timeout=10, thread_local=False)
    lock.acquire()
    result = []
    worker = threading.Thread(target=lambda: result.append(attempt(lock.release)))
    worker.start()
    worker.join()
    return [result, lock.locked()]


def through_client_lock_method(r, key, make):
    cls = make.cls
    lock = r.lock(key, timeout=10, blocking_timeout=0.5, lock_class=cls)
    seen = [type(lock) is cls, lock.timeout, lock.blocking_timeout, lock.acquire()]
    seen += [lock.owned(), attempt(lock.release), lock.locked()]
    return seen


SCENARIOS = [
    basic,
    context_manager,
    blocking_timeout_when_held,
    extend_and_reacquire,
    extend_without_timeout,
    lost_lock,
    overwritten_by_another_value,
    release_error_in_context,
    expiry,
    explicit_token,
    shared_across_threads,
    through_client_lock_method,
]


def run(scenario, client, cls, key):
    def make(**kwargs):
        return cls(client, key, **kwargs)

    make.cls = cls
    try:
        return scenario(client, key, make)
    finally:
        client.delete(key)


@pytest.mark.parametrize(
    "options",
    [{"protocol": 3}, {"protocol": 2}, {"protocol": 3, "decode_responses": True}],
    ids=["resp3", "resp2", "resp3-decoded"],
)
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
def test_same_observations_as_redis_py(server, r, scenario, options):
    client = server.client(**options)
    seen = {
        label: run(scenario, client, cls, f"compat:{label}:{scenario.__name__}")
        for label, cls in CLASSES.items()
    }
    assert seen["redislock"] == seen["redis-py"]
