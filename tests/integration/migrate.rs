//! `MIGRATE` inside `MULTI` or a Lua script, with clients waiting (fair hand-off,
//! bad input). `cluster.rs` covers a plain `MIGRATE`;
//! here the same slot move runs inside a transaction or a script. The lock
//! leaves the source whole: its waiters there must not be granted a lock the
//! node no longer has; they are answered `-ASK slot host:port`, wait again on
//! the target, and are served there. The source keeps no such key.
//!
//! Before this was fixed the module recognised a `MIGRATE` only as a
//! client's own command: inside `EXEC` it took the move for a delete and
//! handed the lock to a waiter on the source.
//!
//! A two-master cluster made by hand (`CLUSTER ADDSLOTSRANGE`, `MEET`) keeps
//! each test to a second or two.

use std::time::Duration;

use redis::cluster::ClusterConnection;
use redis::Value;

use crate::cluster::cluster_client;
use crate::harness::{handed_fence, wait_on, wait_until, Call, Server, LONG};

/// How long the two nodes get to agree on the cluster.
const CONVERGE: Duration = Duration::from_secs(15);

/// How long a test waits for something that should happen at once.
const SOON: Duration = Duration::from_secs(5);

/// Two cluster masters, each serving half of the slots.
struct TwoNodes {
    nodes: [Server; 2],
    ids: [String; 2],
}

fn cluster_info(node: &Server, name: &str) -> String {
    let info: String = node.conn().value(&["CLUSTER", "INFO"]);
    info.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("no {name} in CLUSTER INFO:\n{info}"))
        .trim()
        .to_string()
}

impl TwoNodes {
    fn start() -> TwoNodes {
        let nodes = [0, 1].map(|i| {
            Server::builder()
                .label(&format!("node{i}"))
                .cluster_node(5_000)
                .start()
        });
        for (node, range) in nodes.iter().zip([["0", "8191"], ["8192", "16383"]]) {
            let added = node
                .conn()
                .call(&["CLUSTER", "ADDSLOTSRANGE", range[0], range[1]]);
            assert_eq!(added, Ok(Value::Okay), "ADDSLOTSRANGE {range:?}");
        }
        let met =
            nodes[0]
                .conn()
                .call(&["CLUSTER", "MEET", "127.0.0.1", &nodes[1].port().to_string()]);
        assert_eq!(met, Ok(Value::Okay), "CLUSTER MEET");
        wait_until("both nodes see a whole cluster", CONVERGE, || {
            nodes.iter().all(|n| {
                cluster_info(n, "cluster_state") == "ok"
                    && cluster_info(n, "cluster_known_nodes") == "2"
            })
        });
        let ids = [0, 1].map(|i| nodes[i].conn().value::<String, _>(&["CLUSTER", "MYID"]));
        TwoNodes { nodes, ids }
    }

    fn client(&self) -> ClusterConnection {
        cluster_client(&self.nodes)
    }
}

/// How the lock's key is migrated.
#[derive(Clone, Copy, Debug)]
enum Via {
    Multi,
    Lua,
}

/// Alice holds a lock with carol (plain connection) and dave (cluster
/// client) waiting; its slot moves to the other node, the key by `MIGRATE`
/// run `via` a transaction or a script.
fn migrate_with_waiters(via: Via) {
    let cluster = TwoNodes::start();
    let key = "{moving}:lock";
    let slot = cluster.nodes[0].conn().int(&["CLUSTER", "KEYSLOT", key]);
    let source = usize::from(slot >= 8192);
    let target = 1 - source;
    let (src, dst) = (&cluster.nodes[source], &cluster.nodes[target]);
    let dst_addr = format!("127.0.0.1:{}", dst.port());

    let mut s = src.conn();
    let fence = s.acquire(key, "alice", LONG).expect("free");
    let held = s.lock_info(key).expect("held").held();
    let carol = wait_on(src.conn(), key, "carol", 5_000, 0);
    let dave = wait_on(cluster.client(), key, "dave", 5_000, 10_000);
    wait_until("carol and dave wait on the source", SOON, || {
        s.lock_info(key).is_some_and(|info| info.waiters == 2)
    });

    let setslot = |node: &Server, args: &[&str]| {
        let reply = node
            .conn()
            .call([&["CLUSTER", "SETSLOT", &slot.to_string()][..], args].concat());
        assert_eq!(reply, Ok(Value::Okay), "CLUSTER SETSLOT {slot} {args:?}");
    };
    setslot(dst, &["IMPORTING", &cluster.ids[source]]);
    setslot(src, &["MIGRATING", &cluster.ids[target]]);
    let port = dst.port().to_string();
    match via {
        Via::Multi => {
            let (migrated,): (String,) = redis::pipe()
                .atomic()
                .cmd("MIGRATE")
                .arg(&["127.0.0.1", &port, key, "0", "5000"])
                .query(&mut s)
                .expect("MULTI / MIGRATE / EXEC");
            assert_eq!(migrated, "OK");
        }
        Via::Lua => {
            let script = "return redis.call('MIGRATE', ARGV[1], ARGV[2], KEYS[1], '0', '5000')";
            let migrated = s.call(&["EVAL", script, "1", key, "127.0.0.1", &port]);
            assert_eq!(migrated, Ok(Value::Okay), "EVAL … MIGRATE");
        }
    }

    // Carol is told where the lock went, never handed it on the source.
    let reply = carol.join().expect("carol's thread");
    assert_eq!(
        reply,
        Err(format!("ASK {slot} {dst_addr}")),
        "carol, waiting on the source when MIGRATE ran {via:?}"
    );
    assert_eq!(
        src.info_int("lock", "lock_held"),
        0,
        "the source still holds a lock after MIGRATE {via:?}"
    );
    assert_eq!(
        s.int(&["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()]),
        0,
        "the source keeps a key in the migrated slot"
    );
    assert_eq!(
        src.info_int("lock", "lock_handoffs"),
        0,
        "granted on the source"
    );
    let mut asking = dst.conn();
    assert_eq!(asking.call(&["ASKING"]), Ok(Value::Okay));
    let carol = wait_on(asking, key, "carol", 5_000, 0);
    wait_until("carol and dave wait on the target", SOON, || {
        dst.info_int("lock", "lock_waiting") == 2
    });
    assert_eq!(
        src.info_int("lock", "lock_waiting"),
        0,
        "nobody left behind"
    );

    for node in [dst, src] {
        setslot(node, &["NODE", &cluster.ids[target]]);
    }
    let mut d = dst.conn();
    assert_eq!(d.lock_info(key).expect("the lock arrived").held(), held);

    // Alice releases on the target: one waiter, then the other, is served.
    assert_eq!(d.int(&["LOCK.RELEASE", key, "alice"]), 0);
    let first = d.lock_info(key).expect("handed on").owner;
    assert!(first == b"carol" || first == b"dave", "first: {first:?}");
    assert_eq!(
        d.int(&["LOCK.RELEASE", key, &String::from_utf8_lossy(&first)]),
        0
    );
    let carol_fence = handed_fence(carol, "carol");
    let dave_fence = handed_fence(dave, "dave");
    assert!(carol_fence > fence && dave_fence > fence);
    assert_eq!(dst.info_int("lock", "lock_handoffs"), 2);
    assert_eq!(src.info_int("lock", "lock_held"), 0);
}

/// `MULTI` / `MIGRATE` / `EXEC` with waiters on the lock.
#[test]
fn migrate_inside_multi_redirects_waiters_to_the_target() {
    migrate_with_waiters(Via::Multi);
}

/// (A guard: the old module passed this one, as command filters
/// see a script's calls): `EVAL "return redis.call('MIGRATE', …)"` with waiters on the
/// lock (both servers allow `MIGRATE` in scripts).
#[test]
fn migrate_from_lua_redirects_waiters_to_the_target() {
    migrate_with_waiters(Via::Lua);
}
