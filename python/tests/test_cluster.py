"""Redis Cluster through redis-py's RedisCluster (sync and asyncio, the
``api`` fixture): every LOCK.* command names its key at position 1, so the
client must send each one to the node that owns the key's slot. Checked by
the command counts of every node: the owner ran them, the other two ran none."""

from conftest import commandstat
from redislock._common import parse_info

COMMANDS = ("lock.acquire", "lock.release", "lock.renew", "lock.info")


def key_per_node(rc, nodes):
    """One key name per node, each in a slot that node owns."""
    found = {}
    i = 0
    while len(found) < len(nodes):
        key = f"cluster-lock:{i}"
        found.setdefault(rc.get_node_from_key(key).port, key)
        i += 1
    return found


def counts(nodes):
    return {n.port: {c: commandstat(n.client(), c) for c in COMMANDS} for n in nodes}


def reset(nodes):
    for n in nodes:
        n.client().config_resetstat()


def assert_only_owner_ran(nodes, owner_port, expected):
    seen = counts(nodes)
    for port, calls in seen.items():
        if port == owner_port:
            assert calls == expected, seen
        else:
            assert not any(calls.values()), seen


def test_commands_go_to_the_node_owning_the_key(api, cluster):
    rc = api.cluster_client(cluster)
    for port, key in key_per_node(rc, cluster).items():
        reset(cluster)
        holder = rc.lock(key, timeout=10, lock_class=api.Lock)
        assert api.run(holder.acquire(blocking=False))  # ACQUIRE
        waiter = api.Lock(rc, key, timeout=10, thread_local=False)
        worker = api.spawn(waiter.acquire)  # ACQUIRE ... WAIT 0
        owner = next(n for n in cluster if n.port == port).client()
        api.wait_until(
            lambda owner=owner: owner.info("lock")["lock_waiting"] == 1, what="waiting"
        )
        assert api.run(holder.locked()) and api.run(holder.owned())  # INFO x2
        api.run(holder.extend(1))  # INFO + RENEW
        held = holder.fence
        api.run(holder.release())  # RELEASE: hands over to the waiter
        worker.join(5)
        assert worker.result is True, worker.result
        assert api.run(waiter.owned()) and waiter.fence > held  # INFO
        api.run(waiter.reacquire())  # RENEW
        api.run(waiter.release())  # RELEASE
        assert_only_owner_ran(
            cluster, port,
            {"lock.acquire": 2, "lock.release": 2, "lock.renew": 2, "lock.info": 4},
        )


def test_a_wait_follows_moved(api, cluster):
    """The client's slot map is wrong for one key: the wait is sent to a node
    that answers MOVED, and the lock follows it to the owner."""
    rc = api.cluster_client(cluster)
    keys = key_per_node(rc, cluster)
    port, key = next(iter(keys.items()))
    wrong = next(n for n in rc.get_primaries() if n.port != port)
    rc.nodes_manager.slots_cache[rc.keyslot(key)] = [wrong]
    reset(cluster)
    lock = api.Lock(rc, key, timeout=10)
    assert api.run(lock.acquire(blocking_timeout=1))
    assert rc.get_node_from_key(key).port == port  # the map was refreshed
    api.run(lock.release())
    assert_only_owner_ran(
        cluster, port, {"lock.acquire": 1, "lock.release": 1, "lock.renew": 0, "lock.info": 0}
    )


def test_an_acquire_follows_ask_to_the_importing_node(api, cluster):
    """While a slot migrates, the old owner answers ASK for a key it no longer
    has; the acquire must go to the importing node, preceded by ASKING."""
    rc = api.cluster_client(cluster)
    keys = key_per_node(rc, cluster)
    source_port, key = next(iter(keys.items()))
    source = next(n for n in cluster if n.port == source_port)
    target = next(n for n in cluster if n.port != source_port)
    slot = rc.keyslot(key)
    ids = {n.port: n.client().cluster("myid") for n in (source, target)}
    ids = {p: (i.decode() if isinstance(i, bytes) else i) for p, i in ids.items()}
    target.client().cluster("setslot", slot, "importing", ids[source.port])
    source.client().cluster("setslot", slot, "migrating", ids[target.port])
    try:
        reset(cluster)
        lock = api.Lock(rc, key, timeout=10)
        assert api.run(lock.acquire(blocking_timeout=1))
        assert commandstat(target.client(), "lock.acquire") == 1
        assert commandstat(source.client(), "lock.acquire") == 0  # redirected
        asking = target.client(single_connection_client=True)
        asking.execute_command("ASKING")
        assert parse_info(asking.execute_command("LOCK.INFO", key))["owner"] == lock.token
        asking.execute_command("ASKING")
        assert asking.execute_command("LOCK.RELEASE", key, lock.token) == 0
        asking.close()
    finally:
        for n in (source, target):
            n.client().cluster("setslot", slot, "stable")
