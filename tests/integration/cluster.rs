//! Redis Cluster (fencing, durability, cluster): three masters, each
//! with one replica, every node loading the module, made by
//! `redis-cli --cluster create` as an operator would.
//!
//! - A cluster client routes every command by its key (position 1), so
//!   thousands of locks spread over all masters, and their replicas follow.
//! - A hash tag puts a lock and the data it guards in one slot, hence on one
//!   node and in one transaction.
//! - A slot moves (`CLUSTER SETSLOT … MIGRATING/IMPORTING`, `MIGRATE`) while
//!   locks in it are held and clients wait on them: the locks arrive intact;
//!   the waiters are answered `-ASK slot host:port` (the module's choice: never
//!   left hanging, never granted a lock the old node gave away) and wait again
//!   on the new node, which hands them the lock.
//! - A master holding locks dies (`SIGKILL`) and its replica takes over: locks
//!   the replica had acknowledged (`WAIT 1`) survive unchanged; one it never
//!   received is lost, which is why clients should `WAIT 1` after acquiring;
//!   and every later fence is above every earlier one, lost lock included.
//!
//! Each test builds its own six-node cluster (a few seconds), so there are few
//! of them and each covers a whole story.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use redis::cluster::{ClusterClient, ClusterConnection};
use redis::Value;

use crate::harness::{
    cli_bin, clock_floor, handed_fence, now_ms, text, wait_on, wait_until, Call, Server, LONG,
};

/// How long a silent node may stay silent before its peers call it failed:
/// short, so that a failover completes quickly.
const NODE_TIMEOUT_MS: u64 = 2_000;

/// How long the cluster gets to agree on something (a new node, a new slot
/// owner, a promotion).
pub(super) const CONVERGE: Duration = Duration::from_secs(15);

/// How long a test waits for something that should happen at once.
const SOON: Duration = Duration::from_secs(5);

/// One node as a line of `CLUSTER NODES` shows it.
#[derive(Debug)]
struct NodeView {
    id: String,
    master: bool,
    /// The id of its master, for a replica.
    master_id: Option<String>,
    /// The slot ranges it serves, inclusive.
    slots: Vec<(u16, u16)>,
}

impl NodeView {
    /// One line of `CLUSTER NODES`: `id addr flags master ping pong epoch
    /// link slot…`.
    fn parse(line: &str) -> NodeView {
        let fields: Vec<&str> = line.split(' ').collect();
        assert!(fields.len() >= 8, "a CLUSTER NODES line: {line}");
        let flags: Vec<&str> = fields[2].split(',').collect();
        let slots = fields[8..]
            .iter()
            // `[slot->-id]` / `[slot-<-id]`: a slot being migrated or imported.
            .filter(|range| !range.starts_with('['))
            .map(|range| {
                let (low, high) = range.split_once('-').unwrap_or((range, range));
                (
                    low.parse().expect("slot number"),
                    high.parse().expect("slot number"),
                )
            })
            .collect();
        NodeView {
            id: fields[0].to_string(),
            master: flags.contains(&"master"),
            master_id: (fields[3] != "-").then(|| fields[3].to_string()),
            slots,
        }
    }
}

/// Six cluster nodes: three masters with one replica each.
pub(super) struct Cluster {
    pub(super) nodes: Vec<Server>,
}

impl Cluster {
    /// Starts six nodes, joins them with `redis-cli --cluster create …
    /// --cluster-replicas 1`, and waits until every node sees all six and
    /// every slot served (`cluster_state:ok`) and every replica is in sync.
    pub(super) fn start() -> Cluster {
        Cluster::start_with(&[])
    }

    /// [`Cluster::start`] with these startup configs on every node (e.g.
    /// `lock.max-ttl`).
    pub(super) fn start_with(config: &[(&str, &str)]) -> Cluster {
        let nodes: Vec<Server> = (0..6)
            .map(|i| {
                let mut node = Server::builder()
                    .label(&format!("node{i}"))
                    .cluster_node(NODE_TIMEOUT_MS);
                for (name, value) in config {
                    node = node.config(name, value);
                }
                node.start()
            })
            .collect();
        let cluster = Cluster { nodes };
        let addresses: Vec<String> = cluster
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let created = Command::new(cli_bin())
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", cli_bin()));
        assert!(
            created.status.success(),
            "--cluster create failed:\n{}{}",
            String::from_utf8_lossy(&created.stdout),
            String::from_utf8_lossy(&created.stderr)
        );
        wait_until("every node sees a whole cluster", CONVERGE, || {
            cluster.nodes.iter().all(|n| {
                cluster_info(n, "cluster_state") == "ok"
                    && cluster_info(n, "cluster_known_nodes") == "6"
            })
        });
        // Who replicates whom spreads by gossip, after the slots: a master
        // that still takes a replica for a master refuses it its vote in a
        // failover ("it is a master node").
        wait_until("every node knows every node's role", CONVERGE, || {
            let roles = |views: Vec<NodeView>| {
                let mut roles: Vec<_> = views.into_iter().map(|v| (v.id, v.master_id)).collect();
                roles.sort();
                roles
            };
            let truth = roles((0..cluster.nodes.len()).map(|i| cluster.view(i)).collect());
            truth.iter().filter(|(_, master)| master.is_some()).count() == 3
                && (0..cluster.nodes.len()).all(|i| roles(cluster.views_from(i)) == truth)
        });
        for replica in cluster.replicas() {
            cluster.nodes[replica].wait_for_master_link();
        }
        cluster
    }

    /// Every node as node `i` sees it, `myself` first.
    fn views_from(&self, i: usize) -> Vec<NodeView> {
        let nodes: String = self.nodes[i].conn().value(&["CLUSTER", "NODES"]);
        let mut views: Vec<(bool, NodeView)> = nodes
            .lines()
            .filter(|line| !line.is_empty())
            .map(|line| (!line.contains("myself"), NodeView::parse(line)))
            .collect();
        views.sort_by_key(|(other, _)| *other);
        views.into_iter().map(|(_, view)| view).collect()
    }

    /// Node `i` as it sees itself.
    fn view(&self, i: usize) -> NodeView {
        self.views_from(i).remove(0)
    }

    /// The masters, by index into `nodes`.
    fn masters(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.view(i).master)
            .collect()
    }

    /// The replicas, by index into `nodes`.
    fn replicas(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| !self.view(i).master)
            .collect()
    }

    /// The master serving `slot`, in its own view.
    pub(super) fn master_of(&self, slot: u16) -> usize {
        self.masters()
            .into_iter()
            .find(|&i| {
                self.view(i)
                    .slots
                    .iter()
                    .any(|&(low, high)| (low..=high).contains(&slot))
            })
            .unwrap_or_else(|| panic!("no master serves slot {slot}"))
    }

    /// The replica of master `master`.
    pub(super) fn replica_of(&self, master: usize) -> usize {
        let id = self.view(master).id;
        self.replicas()
            .into_iter()
            .find(|&i| self.view(i).master_id.as_deref() == Some(id.as_str()))
            .unwrap_or_else(|| panic!("node{master} has no replica"))
    }

    /// A cluster-aware client that knows every node.
    fn client(&self) -> ClusterConnection {
        cluster_client(&self.nodes)
    }

    /// `CLUSTER KEYSLOT key`, as the server computes it.
    pub(super) fn slot(&self, key: &str) -> u16 {
        let slot = self.nodes[0].conn().int(&["CLUSTER", "KEYSLOT", key]);
        u16::try_from(slot).expect("a slot number")
    }

    /// The highest fence any of `masters` has issued so far.
    fn highest_fence(&self, masters: &[usize]) -> i64 {
        masters
            .iter()
            .map(|&m| self.nodes[m].info_int("lock", "lock_last_fence"))
            .max()
            .expect("a master")
    }
}

/// A cluster-aware client that knows `nodes`.
pub(super) fn cluster_client(nodes: &[Server]) -> ClusterConnection {
    let urls: Vec<String> = nodes
        .iter()
        .map(|n| format!("redis://127.0.0.1:{}/", n.port()))
        .collect();
    ClusterClient::builder(urls)
        .connection_timeout(SOON)
        .response_timeout(Duration::from_secs(10))
        .build()
        .expect("cluster client")
        .get_connection()
        .expect("connect to the cluster")
}

/// Cuts `replica` off its master (on connection `m`): drops its link and
/// keeps it from coming back (it has no password). Connections already
/// open stay authenticated.
pub(super) fn cut_off_replica(m: &mut redis::Connection, replica: &Server) {
    assert_eq!(
        m.call(&["CONFIG", "SET", "requirepass", "no-replica-gets-in"]),
        Ok(Value::Okay)
    );
    assert_eq!(m.int(&["CLIENT", "KILL", "TYPE", "replica"]), 1);
    wait_until("the replica has lost its master", SOON, || {
        replica.info_field("replication", "master_link_status") == "down"
    });
}

/// One field of `CLUSTER INFO` on `node`.
pub(super) fn cluster_info(node: &Server, name: &str) -> String {
    let info: String = node.conn().value(&["CLUSTER", "INFO"]);
    info.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("no {name} in CLUSTER INFO:\n{info}"))
        .trim()
        .to_string()
}

#[test]
fn cluster_client_routes_thousands_of_locks_over_every_master() {
    const KEYS: usize = 3_000;
    let cluster = Cluster::start();
    let masters = cluster.masters();
    assert_eq!(masters.len(), 3);

    // The command table names the key at position 1 on a cluster node too:
    // that is what cluster clients and the server's own routing read.
    let mut c = cluster.nodes[masters[0]].conn();
    for args in [
        &["LOCK.ACQUIRE", "mykey", "alice", "1000", "WAIT", "0"][..],
        &["LOCK.REENTER", "mykey", "alice", "1000"],
        &["LOCK.RELEASE", "mykey", "alice", "ALL"],
        &["LOCK.RENEW", "mykey", "alice", "1000"],
        &["LOCK.INFO", "mykey"],
    ] {
        let keys: Vec<String> = c.value([&["COMMAND", "GETKEYS"][..], args].concat());
        assert_eq!(keys, ["mykey"], "COMMAND GETKEYS {args:?}");
        let Ok(Value::Array(info)) = c.call(&["COMMAND", "INFO", args[0]]) else {
            panic!("COMMAND INFO {}", args[0]);
        };
        let Some(Value::Array(fields)) = info.first() else {
            panic!("COMMAND INFO {}: {info:?}", args[0]);
        };
        assert_eq!(
            fields[3..6],
            [Value::Int(1), Value::Int(1), Value::Int(1)],
            "COMMAND INFO {}: first key, last key, step",
            args[0]
        );
    }
    // A node that does not serve the key's slot redirects a plain client to
    // the one that does, as for any built-in command.
    let slot = cluster.slot("mykey");
    let owner = cluster.master_of(slot);
    let other = *masters.iter().find(|&&m| m != owner).expect("3 masters");
    let err = cluster.nodes[other]
        .conn()
        .err(&["LOCK.ACQUIRE", "mykey", "alice", "1000"]);
    assert_eq!(
        err,
        format!("MOVED {slot} 127.0.0.1:{}", cluster.nodes[owner].port())
    );

    let mut cc = cluster.client();
    let start = now_ms();
    let keys: Vec<String> = (0..KEYS).map(|i| format!("lock:{i}")).collect();
    let mut fences = Vec::with_capacity(KEYS);
    for key in &keys {
        let fence = cc.acquire(key, "alice", LONG).expect("a free lock");
        assert!(fence >= clock_floor(start), "{key}: fence {fence} too low");
        assert_eq!(cc.acquire(key, "alice", LONG), Some(fence), "{key} reentry");
        assert_eq!(cc.int(&["LOCK.REENTER", key, "alice"]), 3, "{key}");
        assert_eq!(cc.int(&["LOCK.RENEW", key, "alice", "300000"]), 1, "{key}");
        assert_eq!(cc.acquire(key, "bob", LONG), None, "{key} is held");
        fences.push(fence);
    }

    // Every master holds its share (the keys hash all over the slots), and
    // its replica exactly the same.
    let held: Vec<i64> = masters
        .iter()
        .map(|&m| cluster.nodes[m].info_int("lock", "lock_held"))
        .collect();
    assert!(held.iter().all(|&n| n > KEYS as i64 / 6), "held: {held:?}");
    assert_eq!(held.iter().sum::<i64>(), KEYS as i64, "held: {held:?}");
    for &m in &masters {
        let (master, replica) = (&cluster.nodes[m], &cluster.nodes[cluster.replica_of(m)]);
        replica.catch_up_with(master);
        for field in ["lock_held", "lock_last_fence"] {
            assert_eq!(
                replica.info_int("lock", field),
                master.info_int("lock", field),
                "{field} on the replica of node{m}"
            );
        }
        assert_eq!(replica.digest(), master.digest(), "replica of node{m}");
    }

    for (key, &fence) in keys.iter().zip(&fences) {
        let info = cc.lock_info(key).expect("held");
        assert_eq!(info.held(), (b"alice".to_vec(), 3, fence), "{key}");
        assert!(info.ttl <= 300_000, "{key}: the renewed lease");
        assert!(cc
            .err(&["LOCK.RELEASE", key, "bob"])
            .starts_with("NOTOWNER"));
        assert_eq!(cc.int(&["LOCK.RELEASE", key, "alice"]), 2, "{key}");
        assert_eq!(cc.int(&["LOCK.RELEASE", key, "alice", "ALL"]), 0, "{key}");
    }
    let mut acquired = 0;
    for &m in &masters {
        let node = &cluster.nodes[m];
        assert_eq!(node.info_int("lock", "lock_held"), 0, "node{m}");
        assert_eq!(node.conn().int(&["DBSIZE"]), 0, "node{m}");
        acquired += node.info_int("lock", "lock_acquired");
    }
    assert_eq!(
        acquired, KEYS as i64,
        "each lock acquired once, on its node"
    );
}

#[test]
fn hash_tag_puts_a_lock_and_its_data_in_one_slot() {
    let cluster = Cluster::start();
    let (lock, stock) = ("{order:42}:lock", "{order:42}:stock");
    let slot = cluster.slot(lock);
    assert_eq!(cluster.slot(stock), slot, "the tag alone is hashed");
    assert_eq!(cluster.slot("order:42"), slot);
    let untagged = "order:42:stock";
    assert_ne!(cluster.slot(untagged), slot, "without a tag: another slot");

    let mut cc = cluster.client();
    assert_eq!(cc.call(&["SET", stock, "10"]), Ok(Value::Okay));
    assert_eq!(cc.call(&["SET", untagged, "10"]), Ok(Value::Okay));

    // The lock, the data it guards and the release in one transaction, on
    // the one node that serves them all.
    let node = cluster.master_of(slot);
    let mut c = cluster.nodes[node].conn();
    assert_eq!(c.call(&["MULTI"]), Ok(Value::Okay));
    for args in [
        &["LOCK.ACQUIRE", lock, "alice", "10000"][..],
        &["DECR", stock],
        &["LOCK.RELEASE", lock, "alice"],
    ] {
        assert_eq!(c.call(args).as_ref().map(text), Ok(Some("QUEUED".into())));
    }
    let Ok(Value::Array(replies)) = c.call(&["EXEC"]) else {
        panic!("EXEC failed");
    };
    let Value::Int(fence) = replies[0] else {
        panic!("LOCK.ACQUIRE in MULTI: {:?}", replies[0]);
    };
    assert_eq!(replies[1..], [Value::Int(9), Value::Int(0)]);
    assert!(fence > 0);
    assert_eq!(cc.value::<i64, _>(&["GET", stock]), 9);
    assert_eq!(cc.lock_info(lock), None, "released in the transaction");

    // Without the tag the data lives in another slot, and the cluster
    // refuses the transaction as a whole: at once if that slot is on another
    // node (`MOVED`), at `EXEC` if on this one (`CROSSSLOT`). Nothing is
    // decremented and no lock is held.
    assert_eq!(c.call(&["MULTI"]), Ok(Value::Okay));
    c.call(&["LOCK.ACQUIRE", lock, "alice", "10000"])
        .expect("queued");
    let queued = c.call(&["DECR", untagged]);
    let exec = c.err(&["EXEC"]);
    if cluster.master_of(cluster.slot(untagged)) == node {
        assert_eq!(queued.as_ref().map(text), Ok(Some("QUEUED".into())));
        assert!(exec.starts_with("CROSSSLOT"), "{exec}");
    } else {
        let err = queued.expect_err("DECR of a key served elsewhere");
        assert!(err.starts_with("MOVED"), "{err}");
        assert!(exec.starts_with("EXECABORT"), "{exec}");
    }
    assert_eq!(cc.lock_info(lock), None);
    assert_eq!(cc.value::<i64, _>(&["GET", untagged]), 10);
}

#[test]
fn slot_migration_moves_held_locks_intact_and_redirects_their_waiters() {
    let cluster = Cluster::start();
    let masters = cluster.masters();
    // Three locks in one slot: two held (one with count 2), one free.
    let (one, two, three) = ("{mig}:one", "{mig}:two", "{mig}:three");
    let slot = cluster.slot(one);
    let source = cluster.master_of(slot);
    let target = *masters.iter().find(|&&m| m != source).expect("3 masters");
    let (src, dst) = (&cluster.nodes[source], &cluster.nodes[target]);
    let (src_id, dst_id) = (cluster.view(source).id, cluster.view(target).id);
    let dst_addr = format!("127.0.0.1:{}", dst.port());

    let mut s = src.conn();
    s.acquire(one, "alice", LONG).expect("free");
    s.acquire(two, "bob", 300_000).expect("free");
    s.acquire(two, "bob", 300_000).expect("reentry");
    let before: Vec<_> = [one, two]
        .iter()
        .map(|key| {
            let info = s.lock_info(key).expect("held");
            (info.held(), s.int(&["PEXPIRETIME", key]))
        })
        .collect();
    let fences_before = cluster.highest_fence(&masters);

    // Carol waits on `one` without a time limit on a plain connection; dave
    // waits on `two` through a cluster client, which follows redirections.
    let carol = wait_on(src.conn(), one, "carol", 5_000, 0);
    let dave = wait_on(cluster.client(), two, "dave", 5_000, 10_000);
    wait_until("carol and dave wait on the source", SOON, || {
        let mut s = src.conn();
        s.lock_info(one).expect("held").waiters == 1 && s.lock_info(two).expect("held").waiters == 1
    });

    // The documented resharding steps: IMPORTING on the target, MIGRATING
    // on the source, MIGRATE the slot's keys, then NODE everywhere.
    let setslot = |node: &Server, args: &[&str]| {
        let reply = node
            .conn()
            .call([&["CLUSTER", "SETSLOT", &slot.to_string()][..], args].concat());
        assert_eq!(reply, Ok(Value::Okay), "CLUSTER SETSLOT {slot} {args:?}");
    };
    setslot(dst, &["IMPORTING", &src_id]);
    setslot(src, &["MIGRATING", &dst_id]);
    let keys: Vec<String> = s.value(&["CLUSTER", "GETKEYSINSLOT", &slot.to_string(), "10"]);
    assert_eq!(keys.len(), 2, "the slot holds the two held locks: {keys:?}");
    let port = dst.port().to_string();
    let mut migrate = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
    migrate.extend(keys.iter().map(String::as_str));
    let sent = Instant::now();
    assert_eq!(s.call(&migrate), Ok(Value::Okay), "MIGRATE");
    let migrate_ms = i64::try_from(sent.elapsed().as_millis()).expect("ms") + 1;

    // Carol is told where the lock went, never handed it here; she asks
    // there (the slot is still importing, so ASKING is needed) and waits.
    let reply = carol.join().expect("carol's thread");
    assert_eq!(reply, Err(format!("ASK {slot} {dst_addr}")), "carol");
    let mut asking = dst.conn();
    assert_eq!(asking.call(&["ASKING"]), Ok(Value::Okay));
    let carol = wait_on(asking, one, "carol", 5_000, 0);
    // Dave's cluster client did the same by itself.
    wait_until("carol and dave wait on the target", SOON, || {
        dst.info_int("lock", "lock_waiting") == 2
    });
    assert_eq!(
        src.info_int("lock", "lock_waiting"),
        0,
        "nobody left behind"
    );

    // The target first, then the source, then the other master.
    let third = *masters
        .iter()
        .find(|&&m| m != source && m != target)
        .expect("3 masters");
    for node in [dst, src, &cluster.nodes[third]] {
        setslot(node, &["NODE", &dst_id]);
    }
    assert_eq!(cluster.master_of(slot), target);
    assert_eq!(
        s.int(&["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()]),
        0,
        "the source no longer has the locks"
    );
    assert_eq!(src.info_int("lock", "lock_held"), 0);

    // Owner, count, fence arrive intact; so does the lease end, give or take
    // the time MIGRATE took (it sends the TTL left, not the deadline).
    let mut d = dst.conn();
    for (key, (held, expire_at)) in [one, two].iter().zip(&before) {
        let info = d.lock_info(key).expect("the lock arrived");
        assert_eq!(&info.held(), held, "{key} on the target");
        assert_eq!(info.waiters, 1, "{key}: its waiter followed it");
        let moved_at = d.int(&["PEXPIRETIME", key]);
        assert!(
            (0..=migrate_ms).contains(&(moved_at - expire_at)),
            "{key}: lease end {moved_at} on the target, {expire_at} on the source"
        );
    }
    assert_eq!(dst.info_int("lock", "lock_held"), 2);

    // A fresh lock on the target, asked without ASKING now that the slot is
    // its own: a fence above every fence issued before, anywhere.
    let fresh = d.acquire(three, "erin", LONG).expect("free");
    assert!(
        fresh > fences_before,
        "fence {fresh} not above the earlier {fences_before}"
    );

    // The owners release on the new node; the waiters get the locks there.
    assert_eq!(d.int(&["LOCK.RELEASE", one, "alice"]), 0);
    let carol_fence = handed_fence(carol, "carol");
    assert!(carol_fence > fresh, "carol's fence {carol_fence}");
    assert_eq!(d.int(&["LOCK.RELEASE", two, "bob"]), 1);
    assert_eq!(d.int(&["LOCK.RELEASE", two, "bob"]), 0);
    let dave_fence = handed_fence(dave, "dave");
    assert!(dave_fence > carol_fence, "dave's fence {dave_fence}");
    assert_eq!(
        d.lock_info(one).expect("carol holds it").held(),
        (b"carol".to_vec(), 1, carol_fence)
    );
    assert_eq!(
        d.lock_info(two).expect("dave holds it").held(),
        (b"dave".to_vec(), 1, dave_fence)
    );
    assert_eq!(dst.info_int("lock", "lock_handoffs"), 2);
    assert_eq!(src.info_int("lock", "lock_handoffs"), 0, "nothing granted");
}

#[test]
fn failover_keeps_acknowledged_locks_and_fences_keep_rising() {
    let mut cluster = Cluster::start();
    let masters = cluster.masters();
    let (safe, lost) = ("{fo}:safe", "{fo}:lost");
    let slot = cluster.slot(safe);
    let dying = cluster.master_of(slot);
    let heir = cluster.replica_of(dying);
    let mut m = cluster.nodes[dying].conn();

    // Locks on every master, so "every fence before" means the cluster's.
    let mut cc = cluster.client();
    for i in 0..300 {
        cc.acquire(&format!("spread:{i}"), "zoe", LONG)
            .expect("a free lock");
    }
    // The recommended practice: acquire, then WAIT until the replica has it.
    let safe_fence = m.acquire(safe, "alice", LONG).expect("free");
    m.acquire(safe, "alice", LONG).expect("reentry");
    assert_eq!(m.int(&["WAIT", "1", "5000"]), 1, "the replica acknowledged");
    let safe_expire = m.int(&["PEXPIRETIME", safe]);

    cut_off_replica(&mut m, &cluster.nodes[heir]);
    // The hazard: a lock acquired now, not acknowledged by any replica.
    let lost_fence = m.acquire(lost, "bob", LONG).expect("free");
    assert_eq!(m.int(&["WAIT", "1", "100"]), 0, "no replica has the lock");
    // Every fence issued so far: the dying master's last one is bob's.
    let others: Vec<usize> = masters.iter().copied().filter(|&i| i != dying).collect();
    assert_eq!(m.info_int("lock", "lock_last_fence"), lost_fence);
    let fences_before = cluster.highest_fence(&others).max(lost_fence);

    cluster.nodes[dying].kill();
    let r = &cluster.nodes[heir];
    assert_eq!(
        r.conn().call(&["CLUSTER", "FAILOVER", "FORCE"]),
        Ok(Value::Okay)
    );
    wait_until("the replica is promoted", CONVERGE, || {
        r.info_field("replication", "role") == "master" && cluster_info(r, "cluster_state") == "ok"
    });
    let heir_id = cluster.view(heir).id;
    wait_until("every live node knows the new master", CONVERGE, || {
        (0..cluster.nodes.len()).filter(|&i| i != dying).all(|i| {
            cluster
                .views_from(i)
                .iter()
                .any(|view| view.id == heir_id && view.master)
        })
    });
    let mut r = r.conn();

    // What the replica acknowledged survived unchanged...
    assert_eq!(
        r.lock_info(safe)
            .expect("the acknowledged lock survived")
            .held(),
        (b"alice".to_vec(), 2, safe_fence)
    );
    assert_eq!(r.int(&["PEXPIRETIME", safe]), safe_expire);
    assert_eq!(r.acquire(safe, "mallory", LONG), None, "still alice's");
    // ...what it never received is gone: bob believes he holds a lock that
    // the new master gives to carol.
    assert_eq!(r.lock_info(lost), None, "the unacknowledged lock is lost");
    let heir_last = cluster.nodes[heir].info_int("lock", "lock_last_fence");
    assert!(
        heir_last < lost_fence,
        "the promoted replica never saw fence {lost_fence}"
    );
    // Its fences still rise above every earlier one, lost lock included:
    // the clock floor. A resource that saw bob's fence refuses carol's
    // writes only if hers were lower; it is higher, so bob is the one fenced.
    let carol = r
        .acquire(lost, "carol", LONG)
        .expect("free on the new master");
    assert!(
        carol > fences_before,
        "fence {carol} not above every earlier fence {fences_before}"
    );
    let mut last = carol;
    for i in 0..20 {
        let fence = r
            .acquire(&format!("{{fo}}:after:{i}"), "dan", LONG)
            .expect("free");
        assert!(fence > last, "fences rise on the new master");
        last = fence;
    }
    assert_eq!(
        r.int(&["LOCK.RELEASE", safe, "alice"]),
        1,
        "alice still holds"
    );

    // A cluster client finds the new master by itself.
    let mut cc = cluster.client();
    assert_eq!(
        cc.lock_info(safe).expect("held").held(),
        (b"alice".to_vec(), 1, safe_fence)
    );
    assert!(cc.acquire("{fo}:later", "erin", LONG).expect("free") > last);
}
