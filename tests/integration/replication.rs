//! Replication (fencing, durability and replication, cluster): the master sends each state change
//! as an effect, so a replica holds exactly the master's state, lease ends
//! included, without re-deriving anything from its own clock. A replica is
//! read-only, counts nothing its own clients did not ask for, and once
//! promoted issues fences above every fence of the master.

use std::time::Duration;

use redis::Connection;

use crate::harness::{start_replica, wait_until, Call, Server, LOCK_INFO_FIELDS, LONG};

/// `INFO lock` counters of what clients asked for: they stay 0 on a replica
/// (all but the gauge `held` and `last_fence`, which follow the master).
fn client_counters() -> impl Iterator<Item = &'static str> {
    LOCK_INFO_FIELDS
        .iter()
        .copied()
        .filter(|f| !matches!(*f, "lock_held" | "lock_last_fence"))
}

struct Pair {
    master: Server,
    replica: Server,
    m: Connection,
    r: Connection,
}

impl Pair {
    fn start() -> Pair {
        let master = Server::builder().label("master").start();
        let replica = start_replica(&master, "replica");
        let (m, r) = (master.conn(), replica.conn());
        Pair {
            master,
            replica,
            m,
            r,
        }
    }

    /// Waits until the replica has every write, then compares `keys` (owner,
    /// count, fence, lease end), the whole dataset, and the gauges.
    fn assert_same(&mut self, keys: &[&str], step: &str) {
        self.m.wait_replicas(1);
        self.replica.catch_up_with(&self.master);
        for key in keys {
            assert_eq!(
                self.r.lock_info(key).map(|i| i.held()),
                self.m.lock_info(key).map(|i| i.held()),
                "{step}: LOCK.INFO {key} on the replica"
            );
            assert_eq!(
                self.r.int(&["PEXPIRETIME", key]),
                self.m.int(&["PEXPIRETIME", key]),
                "{step}: lease end of {key} on the replica"
            );
        }
        assert_eq!(
            self.replica.digest(),
            self.master.digest(),
            "{step}: DEBUG DIGEST"
        );
        for field in ["lock_held", "lock_last_fence"] {
            assert_eq!(
                self.replica.info_int("lock", field),
                self.master.info_int("lock", field),
                "{step}: {field} on the replica"
            );
        }
        for field in client_counters() {
            assert_eq!(
                self.replica.info_int("lock", field),
                0,
                "{step}: {field} on the replica counts only its own clients"
            );
        }
    }
}

#[test]
fn replica_holds_the_masters_state_after_every_change() {
    let mut p = Pair::start();
    let keys = ["a", "b", "short"];

    let fence = p.m.acquire("a", "alice", LONG).expect("free");
    p.assert_same(&keys, "acquire");
    assert_eq!(p.r.lock_info("a").expect("replicated").fence, fence);

    p.m.acquire("a", "alice", 300_000).expect("reentry");
    p.assert_same(&keys, "reentrant acquire");
    assert_eq!(p.m.int(&["LOCK.REENTER", "a", "alice"]), 3);
    p.assert_same(&keys, "reenter");
    assert_eq!(p.m.int(&["LOCK.REENTER", "a", "alice", "200000"]), 4);
    p.assert_same(&keys, "reenter with ttl");
    assert_eq!(p.m.int(&["LOCK.RENEW", "a", "alice", "100000"]), 1);
    p.assert_same(&keys, "renew");
    assert_eq!(p.m.int(&["LOCK.RELEASE", "a", "alice"]), 3);
    p.assert_same(&keys, "release");

    p.m.acquire("b", "bob", LONG).expect("free");
    p.assert_same(&keys, "second lock");
    assert_eq!(p.m.int(&["LOCK.RELEASE", "a", "alice", "ALL"]), 0);
    p.assert_same(&keys, "release all");
    assert_eq!(p.r.int(&["EXISTS", "a"]), 0, "a released lock is gone");

    // A lease that ends on the master ends on the replica by the master's word.
    p.m.acquire("short", "carol", 50).expect("free");
    p.assert_same(&keys, "short lease");
    wait_until(
        "the short lease ends on the master",
        Duration::from_secs(5),
        || p.m.lock_info("short").is_none(),
    );
    let (master, replica) = (&p.master, &p.replica);
    wait_until(
        "the expiry reaches the replica",
        Duration::from_secs(5),
        || replica.conn().int(&["DBSIZE"]) == master.conn().int(&["DBSIZE"]),
    );
    p.assert_same(&keys, "lease end");
    assert_eq!(p.master.info_int("lock", "lock_expired_held"), 1);

    // What the master counted, for comparison with the replica's zeros.
    assert_eq!(p.master.info_int("lock", "lock_acquired"), 3);
    assert_eq!(p.master.info_int("lock", "lock_reentered"), 3);
    assert_eq!(p.master.info_int("lock", "lock_released"), 2);
    assert_eq!(p.master.info_int("lock", "lock_renewed"), 1);
}

#[test]
fn replica_refuses_every_write_command() {
    let mut p = Pair::start();
    let fence = p.m.acquire("k", "alice", LONG).expect("free");
    p.m.wait_replicas(1);
    let digest = p.replica.digest();

    for args in [
        &["LOCK.ACQUIRE", "k", "alice", "1000"][..],
        &["LOCK.ACQUIRE", "free", "alice", "1000"],
        &["LOCK.REENTER", "k", "alice"],
        &["LOCK.RELEASE", "k", "alice"],
        &["LOCK.RELEASE", "k", "alice", "ALL"],
        &["LOCK.RENEW", "k", "alice", "1000"],
    ] {
        let err = p.r.err(args);
        assert!(err.starts_with("READONLY"), "{args:?} on a replica: {err}");
    }
    // Reads work there.
    assert_eq!(
        p.r.lock_info("k").expect("held").held(),
        (b"alice".to_vec(), 1, fence)
    );
    assert_eq!(p.replica.digest(), digest);
    assert_eq!(p.replica.info_int("lock", "lock_notowner"), 0);
}

#[test]
fn replica_attached_later_gets_the_full_state_by_full_sync() {
    let master = Server::builder().label("master").start();
    let mut m = master.conn();
    let fence = m.acquire("k", "alice", LONG).expect("free");
    m.acquire("k", "alice", LONG);
    // A fence issued and released: only the counter remembers it.
    m.acquire("gone", "bob", LONG).expect("free");
    let last = master.info_int("lock", "lock_last_fence");
    assert_eq!(m.int(&["LOCK.RELEASE", "gone", "bob"]), 0);

    let replica = Server::builder()
        .label("replica")
        .replica_of(&master)
        .start();
    replica.wait_for_master_link();
    m.wait_replicas(1);
    replica.catch_up_with(&master);
    let mut r = replica.conn();
    assert_eq!(
        r.lock_info("k").expect("synced").held(),
        (b"alice".to_vec(), 2, fence)
    );
    assert_eq!(r.int(&["PEXPIRETIME", "k"]), m.int(&["PEXPIRETIME", "k"]));
    assert_eq!(replica.digest(), master.digest());
    assert_eq!(replica.info_int("lock", "lock_held"), 1);
    assert_eq!(replica.info_int("lock", "lock_last_fence"), last);
    assert_eq!(replica.info_int("lock", "lock_acquired"), 0);
}

#[test]
fn promoted_replica_issues_fences_above_every_master_fence() {
    let mut p = Pair::start();
    let mut highest = 0;
    for i in 0..100 {
        highest = p.m.acquire(&format!("k{i}"), "alice", LONG).expect("free");
    }
    p.m.acquire("k0", "alice", LONG).expect("reentry");
    p.m.wait_replicas(1);
    assert_eq!(p.replica.info_int("lock", "lock_last_fence"), highest);

    p.master.kill();
    assert_eq!(p.r.value::<String, _>(&["REPLICAOF", "NO", "ONE"]), "OK");

    let fence =
        p.r.acquire("new", "bob", LONG)
            .expect("the promoted replica grants locks");
    assert!(
        fence > highest,
        "fence {fence} not above the master's {highest}"
    );
    // The master's holders still hold their locks there.
    assert_eq!(p.r.acquire("k5", "bob", LONG), None);
    assert_eq!(p.r.int(&["LOCK.RELEASE", "k0", "alice"]), 1);
    assert_eq!(p.replica.info_int("lock", "lock_acquired"), 1);
}

/// A master that had nobody to replicate to skips building effects (see
/// `src/ffi/propagation.rs`); once a replica syncs, every change must reach
/// it again — including with a diskless sync delayed past the first writes.
#[test]
fn changes_after_a_replica_attaches_reach_it() {
    for diskless in ["no", "yes"] {
        let master = Server::builder()
            .label("master")
            .config("repl-diskless-sync", diskless)
            .config("repl-diskless-sync-delay", 1)
            .start();
        let mut m = master.conn();
        m.acquire("before", "alice", LONG).expect("free");
        let replica = Server::builder()
            .label("replica")
            .replica_of(&master)
            .start();
        // Writes while the replica is still syncing, then after.
        m.acquire("during", "bob", LONG).expect("free");
        replica.wait_for_master_link();
        m.acquire("after", "carol", LONG).expect("free");
        m.acquire("before", "alice", LONG).expect("reentry");
        assert_eq!(m.int(&["LOCK.RELEASE", "during", "bob"]), 0);
        m.wait_replicas(1);
        replica.catch_up_with(&master);
        let mut r = replica.conn();
        for key in ["before", "during", "after"] {
            assert_eq!(
                r.lock_info(key).map(|i| i.held()),
                m.lock_info(key).map(|i| i.held()),
                "{key} (diskless {diskless})"
            );
        }
        assert_eq!(replica.digest(), master.digest(), "diskless {diskless}");
    }
}
