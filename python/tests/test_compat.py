"""redis-py compatibility: each scenario runs once with redis-py's own lock
and once with redislock's (each on its own key of the same server), on both
APIs (``redis.lock.Lock`` against ``redislock.Lock``, and
``redis.asyncio.lock.Lock`` against ``redislock.asyncio.Lock``), and both
runs must observe the same things: return values, exception classes and
messages, lock state, the key's TTL."""

import threading
import time

import pytest
import redis.lock

import redislock


class Scene:
    """What a scenario works with: the API's client ``r`` (its replies, like
    the locks', completed by ``run``), the ``key`` and ``make(**kwargs)`` for
    a lock of the class under test on it."""

    def __init__(self, api, client, cls, key):
        self.api = api
        self.r = client
        self.cls = cls
        self.key = key

    def make(self, **kwargs):
        return self.cls(self.r, self.key, **kwargs)

    def run(self, value):
        return self.api.run(value)

    def attempt(self, call):
        """What making ``call`` shows: its value, or the exception's class and text."""
        try:
            return ("ok", self.run(call()))
        except Exception as e:  # the observation is the point
            return ("raise", type(e).__name__, str(e))


def basic(t):
    run, attempt = t.run, t.attempt
    a, b = t.make(timeout=10), t.make(timeout=10)
    seen = [run(a.acquire(blocking=False)), run(a.locked()), run(a.owned())]
    seen += [run(b.acquire(blocking=False)), run(b.owned()), run(b.locked())]
    seen += [attempt(a.release), run(a.locked()), run(a.owned())]
    seen += [run(b.acquire(blocking=False)), run(b.owned()), run(a.owned()), attempt(b.release)]
    seen += [attempt(a.release), attempt(b.release), run(b.locked())]
    return seen


def context_manager(t):
    run = t.run
    lock = t.make(timeout=10)
    with t.api.entered(lock) as entered:
        seen = [entered is lock, run(lock.owned()), run(lock.locked())]
    seen += [run(lock.locked()), run(lock.owned())]
    return seen


def blocking_timeout_when_held(t):
    run, attempt = t.run, t.attempt
    holder = t.make(timeout=10)
    run(holder.acquire())
    waiter = t.make(timeout=10, blocking_timeout=0.3)
    start = time.monotonic()
    seen = [run(waiter.acquire()), time.monotonic() - start < 1.0]
    seen += [run(t.make(blocking=False).acquire()), run(t.make().acquire(blocking=False))]
    seen += [attempt(lambda: t.api.entered(t.make(timeout=1, blocking_timeout=0.1)).__enter__())]
    seen += [attempt(holder.release), run(waiter.acquire()), run(waiter.owned())]
    return seen


def extend_and_reacquire(t):
    run, attempt, r, key = t.run, t.attempt, t.r, t.key
    lock = t.make(timeout=10)
    run(lock.acquire())
    seen = [run(lock.extend(5)), 14000 < run(r.pttl(key)) <= 15000]
    seen += [run(lock.extend(2, replace_ttl=True)), 1000 < run(r.pttl(key)) <= 2000]
    seen += [run(lock.reacquire()), 9000 < run(r.pttl(key)) <= 10000]
    seen += [attempt(lock.release), attempt(lambda: lock.extend(1))]
    seen += [attempt(lock.reacquire)]
    return seen


def extend_without_timeout(t):
    run, attempt = t.run, t.attempt
    lock = t.make()
    run(lock.acquire())
    seen = [attempt(lambda: lock.extend(1)), attempt(lock.reacquire)]
    seen += [attempt(lock.release), run(lock.locked())]
    return seen


def lost_lock(t):
    run, attempt = t.run, t.attempt
    lock = t.make(timeout=10)
    run(lock.acquire())
    run(t.r.delete(t.key))
    seen = [run(lock.owned()), run(lock.locked())]
    seen += [attempt(lambda: lock.extend(1)), attempt(lock.reacquire)]
    seen += [attempt(lock.release), attempt(lock.release)]
    return seen


def overwritten_by_another_value(t):
    """redis-py's own lock tests fake another holder with a plain SET."""
    run, attempt, r, key = t.run, t.attempt, t.r, t.key
    lock = t.make(timeout=10)
    run(lock.acquire())
    run(r.set(key, "x"))
    seen = [run(lock.owned()), run(lock.locked())]
    seen += [attempt(lambda: lock.extend(1)), attempt(lambda: lock.extend(1, True))]
    seen += [attempt(lock.reacquire)]
    seen += [attempt(lock.release), lock.local.token, attempt(lock.release)]
    other = t.make(timeout=10, blocking_timeout=0.2)
    seen += [attempt(lambda: other.acquire(blocking=False)), attempt(other.acquire)]
    seen += [run(other.owned()), run(other.locked()), run(r.get(key)) in ("x", b"x")]
    run(r.delete(key))
    seen += [run(other.acquire(blocking=False)), run(other.owned()), attempt(other.release)]
    return seen


def release_error_in_context(t):
    def body(raise_on_release_error):
        with t.api.entered(t.make(timeout=10, raise_on_release_error=raise_on_release_error)):
            t.run(t.r.delete(t.key))
        return "exited"

    return [t.attempt(lambda: body(True)), t.attempt(lambda: body(False))]


def expiry(t):
    run, attempt = t.run, t.attempt
    lock, other = t.make(timeout=0.2), t.make(timeout=10)
    seen = [run(lock.acquire())]
    deadline = time.monotonic() + 5
    while run(lock.locked()) and time.monotonic() < deadline:
        t.api.sleep(0.01)
    seen += [run(lock.locked()), run(lock.owned()), run(other.acquire(blocking=False))]
    seen += [attempt(lock.release), run(other.owned()), attempt(other.release)]
    return seen


def explicit_token(t):
    run, attempt = t.run, t.attempt
    lock, other = t.make(timeout=10), t.make(timeout=10)
    seen = [run(lock.acquire(token="tok-1")), run(lock.owned()), lock.local.token]
    seen += [run(other.acquire(token="tok-2", blocking=False)), run(other.owned())]
    seen += [attempt(lock.release), run(other.acquire(token=b"tok-2", blocking=False))]
    seen += [other.local.token, attempt(other.release)]
    return seen


def through_client_lock_method(t):
    run, attempt = t.run, t.attempt
    lock = t.r.lock(t.key, timeout=10, blocking_timeout=0.5, lock_class=t.cls)
    seen = [type(lock) is t.cls, lock.timeout, lock.blocking_timeout, run(lock.acquire())]
    seen += [run(lock.owned()), attempt(lock.release), run(lock.locked())]
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
    through_client_lock_method,
]

OPTIONS = pytest.mark.parametrize(
    "options",
    [{"protocol": 3}, {"protocol": 2}, {"protocol": 3, "decode_responses": True}],
    ids=["resp3", "resp2", "resp3-decoded"],
)


def observe(scene, scenario):
    try:
        return scenario(scene)
    finally:
        scene.run(scene.r.delete(scene.key))


@OPTIONS
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.__name__)
def test_same_observations_as_redis_py(api, r, scenario, options):
    client = api.client(**options)
    seen = {
        label: observe(
            Scene(api, client, cls, f"compat:{api.name}:{label}:{scenario.__name__}"), scenario
        )
        for label, cls in (("redis-py", api.RedisPyLock), ("redislock", api.Lock))
    }
    assert seen["redislock"] == seen["redis-py"]


def shared_across_threads(client, key, cls):
    lock = cls(client, key, timeout=10, thread_local=False)
    lock.acquire()
    result = []
    worker = threading.Thread(target=lambda: result.append(attempt(lock.release)))
    worker.start()
    worker.join()
    return [result, lock.locked()]


def attempt(call):
    try:
        return ("ok", call())
    except Exception as e:  # the observation is the point
        return ("raise", type(e).__name__, str(e))


@OPTIONS
def test_a_lock_shared_across_threads_as_redis_py(server, r, options):
    """thread_local=False: a hold taken in one thread is released from
    another (sync only: asyncio's clients belong to one loop)."""
    client = server.client(**options)
    seen = {}
    for label, cls in (("redis-py", redis.lock.Lock), ("redislock", redislock.Lock)):
        key = f"compat:{label}:shared_across_threads"
        try:
            seen[label] = shared_across_threads(client, key, cls)
        finally:
            client.delete(key)
    assert seen["redislock"] == seen["redis-py"]
