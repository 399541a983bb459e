//! Sentinel-style failover (fencing and durability and replication): a master with
//! two replicas dies (`SIGKILL`); one replica is promoted with
//! `REPLICAOF NO ONE` and the other re-pointed at it, the steps Sentinel
//! takes.
//!
//! - Locks the replicas had received survive with owner, count, fence and
//!   lease end unchanged, and every fence the new master issues is above
//!   every fence the old one issued.
//! - The new master takes writes: owners release, renew and reenter there;
//!   clients wait there and are handed locks in arrival order, and what it
//!   decides reaches the replica that now follows it.
//! - A lock the replica never received (acquired without `WAIT`) is lost,
//!   yet the next fence for it still outranks the lost one: the clock floor.

use std::time::Duration;

use redis::{Connection, Value};

use crate::harness::{handed_fence, start_replica, wait_on, wait_until, Call, Hold, Server, LONG};

/// How long a test waits for something that should happen at once.
const SOON: Duration = Duration::from_secs(5);

/// A master, the replica that will be promoted, and a second replica.
struct Group {
    master: Server,
    heir: Server,
    other: Server,
    m: Connection,
}

impl Group {
    fn start() -> Group {
        let master = Server::builder().label("master").start();
        let heir = start_replica(&master, "heir");
        let other = start_replica(&master, "other");
        let m = master.conn();
        Group {
            master,
            heir,
            other,
            m,
        }
    }

    /// What Sentinel does once the master is down: `REPLICAOF NO ONE` on the
    /// heir, then the other replica follows the heir.
    fn fail_over(&mut self) {
        self.master.kill();
        let mut h = self.heir.conn();
        assert_eq!(h.call(&["REPLICAOF", "NO", "ONE"]), Ok(Value::Okay));
        assert_eq!(self.heir.info_field("replication", "role"), "master");
        let port = self.heir.port().to_string();
        let mut o = self.other.conn();
        assert_eq!(o.call(&["REPLICAOF", "127.0.0.1", &port]), Ok(Value::Okay));
        self.other.wait_for_master_link();
    }
}

/// A lock as the failover must keep it: owner, count, fence and lease end.
fn snapshot(c: &mut Connection, key: &str) -> (Hold, i64) {
    let held = c.lock_info(key).expect("held").held();
    (held, c.int(&["PEXPIRETIME", key]))
}

#[test]
fn promoted_replica_keeps_the_locks_and_issues_higher_fences() {
    let mut g = Group::start();
    g.m.acquire("a", "alice", LONG).expect("free");
    g.m.acquire("a", "alice", LONG).expect("reentry");
    g.m.acquire("b", "bob", 300_000).expect("free");
    // Fences issued and released: only the counter remembers them.
    for i in 0..100 {
        let key = format!("gone:{i}");
        g.m.acquire(&key, "zoe", LONG).expect("free");
        assert_eq!(g.m.int(&["LOCK.RELEASE", &key, "zoe"]), 0);
    }
    let highest = g.master.info_int("lock", "lock_last_fence");
    g.m.wait_replicas(2);
    let before = [snapshot(&mut g.m, "a"), snapshot(&mut g.m, "b")];

    g.fail_over();
    let mut h = g.heir.conn();
    assert_eq!(snapshot(&mut h, "a"), before[0], "a on the new master");
    assert_eq!(snapshot(&mut h, "b"), before[1], "b on the new master");
    assert_eq!(g.heir.info_int("lock", "lock_last_fence"), highest);

    // Every fence it issues is above every fence the old master issued.
    let mut last = highest;
    for i in 0..100 {
        let fence = h.acquire(&format!("new:{i}"), "carol", LONG).expect("free");
        assert!(fence > last, "fence {fence} after {last}");
        last = fence;
    }
    // The old owners keep their locks, and only they can use them.
    assert_eq!(h.acquire("a", "mallory", LONG), None);
    assert!(h
        .err(&["LOCK.RELEASE", "a", "mallory"])
        .starts_with("NOTOWNER"));
    assert_eq!(h.int(&["LOCK.REENTER", "a", "alice"]), 3);
    assert_eq!(h.int(&["LOCK.RENEW", "b", "bob", "100000"]), 1);
    assert_eq!(h.int(&["LOCK.RELEASE", "a", "alice", "ALL"]), 0);
    let fence = h.acquire("a", "dave", LONG).expect("free now");
    assert!(fence > last);

    // The other replica now follows the new master, and holds what it holds.
    h.wait_replicas(1);
    g.other.catch_up_with(&g.heir);
    let mut o = g.other.conn();
    for key in ["a", "b", "new:0", "new:99"] {
        assert_eq!(snapshot(&mut o, key), snapshot(&mut h, key), "{key}");
    }
    assert_eq!(g.other.digest(), g.heir.digest());
    assert_eq!(
        g.other.info_int("lock", "lock_last_fence"),
        g.heir.info_int("lock", "lock_last_fence")
    );
}

#[test]
fn waiters_on_the_promoted_replica_are_handed_locks() {
    let mut g = Group::start();
    let job_fence = g.m.acquire("job", "alice", LONG).expect("free");
    g.m.acquire("lease", "bob", LONG).expect("free");
    let highest = g.master.info_int("lock", "lock_last_fence");
    g.m.wait_replicas(2);

    g.fail_over();
    let mut h = g.heir.conn();

    // Two clients wait on alice's lock, in this order.
    let carol = wait_on(g.heir.conn(), "job", "carol", LONG, 0);
    wait_until("carol waits", SOON, || {
        h.lock_info("job").expect("held").waiters == 1
    });
    let dave = wait_on(g.heir.conn(), "job", "dave", LONG, 10_000);
    wait_until("dave waits", SOON, || {
        h.lock_info("job").expect("held").waiters == 2
    });
    assert_eq!(h.acquire("job", "erin", LONG), None, "no barging");
    assert_eq!(g.heir.info_int("lock", "lock_waiting"), 2);

    // Alice releases on the new master: carol first, then dave.
    assert_eq!(h.int(&["LOCK.RELEASE", "job", "alice"]), 0);
    let carol = handed_fence(carol, "carol");
    assert!(
        carol > highest && carol > job_fence,
        "carol's fence {carol}"
    );
    assert_eq!(
        h.lock_info("job").expect("carol holds it").held(),
        (b"carol".to_vec(), 1, carol)
    );
    assert_eq!(h.int(&["LOCK.RELEASE", "job", "carol"]), 0);
    let dave = handed_fence(dave, "dave");
    assert!(dave > carol, "dave's fence {dave}");

    // A lease that ends on the new master hands the lock on too: frank waits
    // on bob's replicated lock, then bob shortens his lease there.
    let frank = wait_on(g.heir.conn(), "lease", "frank", LONG, 10_000);
    wait_until("frank waits", SOON, || {
        h.lock_info("lease").expect("held").waiters == 1
    });
    assert_eq!(h.int(&["LOCK.RENEW", "lease", "bob", "50"]), 1);
    let frank = handed_fence(frank, "frank");
    assert!(frank > dave, "frank's fence {frank}");
    assert_eq!(g.heir.info_int("lock", "lock_handoffs"), 3);
    assert_eq!(g.heir.info_int("lock", "lock_expired_held"), 1);

    // The hand-offs the new master decided reach the replica following it.
    h.wait_replicas(1);
    g.other.catch_up_with(&g.heir);
    let mut o = g.other.conn();
    for key in ["job", "lease"] {
        assert_eq!(snapshot(&mut o, key), snapshot(&mut h, key), "{key}");
    }
    assert_eq!(
        o.lock_info("lease").expect("frank holds it").owner,
        b"frank".to_vec()
    );
}

#[test]
fn unacknowledged_lock_is_lost_in_a_failover_but_its_fence_is_outranked() {
    let mut g = Group::start();
    // The recommended practice: acquire, then WAIT until the replicas have it.
    let safe = g.m.acquire("safe", "alice", LONG).expect("free");
    assert_eq!(g.m.int(&["WAIT", "2", "5000"]), 2, "both replicas have it");

    // Cut the replicas off: drop their links and keep them from coming back
    // (they have no password). Connections already open stay authenticated.
    assert_eq!(
        g.m.call(&["CONFIG", "SET", "requirepass", "no-replica-gets-in"]),
        Ok(Value::Okay)
    );
    assert_eq!(g.m.int(&["CLIENT", "KILL", "TYPE", "replica"]), 2);
    for replica in [&g.heir, &g.other] {
        wait_until("the replica has lost its master", SOON, || {
            replica.info_field("replication", "master_link_status") == "down"
        });
    }
    // The hazard: bob acquires a lock no replica receives, and the master
    // dies before any does.
    let lost = g.m.acquire("lost", "bob", LONG).expect("free");
    assert_eq!(g.m.int(&["WAIT", "1", "100"]), 0, "no replica has it");
    assert_eq!(
        g.m.info_int("lock", "lock_last_fence"),
        lost,
        "the last fence"
    );

    g.fail_over();
    let mut h = g.heir.conn();
    assert_eq!(
        h.lock_info("safe")
            .expect("the acknowledged lock survived")
            .held(),
        (b"alice".to_vec(), 1, safe)
    );
    // Bob still believes he holds "lost"; the new master never heard of it.
    assert_eq!(h.lock_info("lost"), None, "the unacknowledged lock is lost");
    assert!(g.heir.info_int("lock", "lock_last_fence") < lost);
    assert!(h
        .err(&["LOCK.RELEASE", "lost", "bob"])
        .starts_with("NOTOWNER"));
    // Carol gets it, with a fence above bob's all the same (the clock
    // floor): a resource that checks fences takes carol's writes and
    // refuses bob's from now on.
    let carol = h.acquire("lost", "carol", LONG).expect("free there");
    assert!(carol > lost, "carol's fence {carol} not above bob's {lost}");
}
