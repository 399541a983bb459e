//! A master cut off from its replicas: with Redis's `min-replicas-to-write`
//! and `min-replicas-max-lag` set, the module grants nothing on its own
//! where Redis would refuse a client's write, a promoted replica's
//! quarantine covers the lag as well as `lock.max-ttl`, and `INFO lock`
//! says whether the configuration is safe under partitions.
//!
//! A replica that stops acknowledging is a `SIGSTOP`ped process here; the
//! real partitions, with Sentinel, are in `sentinel.rs`.

use std::time::{Duration, Instant};

use redis::Value;

use crate::harness::{handed_fence, now_ms, start_replica, wait_on, wait_until, Call, Server};

/// Redis counts good replicas once a second, in whole seconds of lag: with
/// a lag of 1 s it refuses writes within about 3 s of the last
/// acknowledgement.
const REFUSAL: Duration = Duration::from_secs(6);

fn set(server: &Server, name: &str, value: &str) {
    let mut c = server.conn();
    assert_eq!(c.call(&["CONFIG", "SET", name, value]), Ok(Value::Okay));
}

fn good_replicas(server: &Server) -> i64 {
    server.info_int("replication", "min_slaves_good_slaves")
}

/// The story: a holder's lease ends while Redis refuses writes for lack of
/// replicas. Redis would refuse the waiter's own `LOCK.ACQUIRE`; the module
/// must not hand it the lock either, until the replica is back.
#[test]
fn a_master_without_good_replicas_hands_nothing_over_at_a_lease_end() {
    let master = Server::builder()
        .label("master")
        .config("min-replicas-to-write", 1)
        .config("min-replicas-max-lag", 1)
        .start();
    let replica = start_replica(&master, "replica");
    wait_until("the replica counts as good", REFUSAL, || {
        good_replicas(&master) == 1
    });
    let mut m = master.conn();
    // Long enough to outlast Redis's refusal, which starts up to ~3 s after
    // the replica's last acknowledgement.
    let ttl_ms = 5_000;
    wait_until("the gate lets the holder in", REFUSAL, || {
        m.call(&["LOCK.ACQUIRE", "job", "holder", &ttl_ms.to_string()])
            .is_ok_and(|v| matches!(v, Value::Int(_)))
    });
    let acquired = Instant::now();
    let waiter = wait_on(master.conn(), "job", "waiter", 10_000, 0);
    wait_until("the waiter queues", REFUSAL, || {
        master.info_int("lock", "lock_waiting") == 1
    });
    replica.suspend();
    wait_until("Redis refuses writes", REFUSAL, || {
        good_replicas(&master) == 0
    });
    let refused = m.call(&["SET", "probe", "1"]);
    assert!(
        refused.as_ref().is_err_and(|e| e.starts_with("NOREPLICAS")),
        "Redis itself refuses writes now: {refused:?}"
    );
    // The lease ends; a lease-end check fires; still nothing is granted.
    let lease_end = acquired + Duration::from_millis(ttl_ms);
    assert!(
        Instant::now() < lease_end,
        "Redis took longer than the lease to refuse writes: the test proves nothing"
    );
    while Instant::now() < lease_end + Duration::from_millis(500) {
        assert_eq!(
            master.info_int("lock", "lock_handoffs"),
            0,
            "the lock was handed over while Redis refuses writes"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Redis expires the key on its own, as any key: the lock is free, and
    // stays free for its waiter.
    assert_eq!(m.call(&["LOCK.INFO", "job"]), Ok(Value::Nil));
    // The replica comes back: the waiter gets the lock.
    replica.resume();
    let fence = handed_fence(waiter, "the waiter");
    assert!(fence > 0);
    assert_eq!(master.info_int("lock", "lock_handoffs"), 1);
}

/// The story: a replica stops acknowledging (here `SIGSTOP`, as a cut link
/// looks to the master) just after it acknowledged, just after a whole
/// second of the wall clock. Redis counts the lag in whole seconds and
/// recounts once a second, so it counts that replica good for about two
/// seconds more, and once took a `LOCK.ACQUIRE` 2.6 s after a cut with a lag
/// of 1 while Sentinel had promoted a replica at 1.5 s. The module's gate
/// counts the age of the last acknowledged marker in ms: no grant, from a
/// command or at a lease end, comes later than the lag after the cut.
#[test]
fn a_master_refuses_grants_within_the_lag_of_its_replicas_last_acknowledgement() {
    const LAG_MS: u64 = 1_000;
    /// A cron tick of slack on a loaded machine; Redis's own count runs
    /// about 900 ms past this.
    const SLACK_MS: u64 = 300;
    let master = Server::builder()
        .label("master")
        .config("min-replicas-to-write", 1)
        .config("min-replicas-max-lag", LAG_MS / 1_000)
        .start();
    let replica = start_replica(&master, "replica");
    let mut m = master.conn();
    wait_until("the gate lets a client in", REFUSAL, || {
        m.call(&["LOCK.ACQUIRE", "warm-up", "a", "100"])
            .is_ok_and(|v| matches!(v, Value::Int(_)))
    });
    // A holder and a client waiting for it. Just before the cut, the
    // holder's lease is renewed to end after the lag but before Redis would
    // refuse: a hand-off at its lease end would be a grant by the module on
    // its own. (Renewed then, not taken then: the waiter's set-up on a
    // loaded machine does not eat into the lease.)
    let ttl_ms = LAG_MS + 400;
    assert!(matches!(
        m.call(&["LOCK.ACQUIRE", "job", "holder", "60000"]),
        Ok(Value::Int(_))
    ));
    let waiter = wait_on(master.conn(), "job", "waiter", 10_000, 0);
    wait_until("the waiter queues", REFUSAL, || {
        master.info_int("lock", "lock_waiting") == 1
    });
    // Just after a whole second: Redis's whole-second count then keeps the
    // replica good for the longest.
    wait_until("a whole second of the wall clock", REFUSAL, || {
        (20..120).contains(&(now_ms() % 1_000))
    });
    let acquired = Instant::now();
    assert_eq!(
        m.call(&["LOCK.RENEW", "job", "holder", &ttl_ms.to_string()]),
        Ok(Value::Int(1))
    );
    // The replica acknowledges everything so far, then stops.
    assert_eq!(m.call(&["WAIT", "1", "1000"]), Ok(Value::Int(1)));
    replica.suspend();
    let cut = Instant::now();
    let lease_end = acquired + Duration::from_millis(ttl_ms);
    assert!(
        lease_end > cut + Duration::from_millis(LAG_MS + 100),
        "the set-up took {:?}: the lease ends too early to show anything",
        cut - acquired
    );
    // Fresh locks, one every few ms, until Redis itself refuses for sure.
    let mut last_grant = None;
    let mut first_refusal = None;
    let mut handoffs_at = None;
    let mut i = 0;
    while cut.elapsed() < Duration::from_millis(3_500) {
        i += 1;
        let key = format!("fresh{i}");
        // A grant is counted from the send (the server granted it no
        // earlier), a refusal from the reply (it refused no later): a test
        // thread that a loaded machine holds up cannot make either look
        // worse than it was.
        let sent = cut.elapsed().as_millis() as u64;
        let reply = m.call(&["LOCK.ACQUIRE", &key, "b", "60000"]);
        let at = cut.elapsed().as_millis() as u64;
        match reply {
            Ok(Value::Int(_)) => last_grant = Some(sent),
            Err(e) if e.starts_with("NOREPLICAS") => {
                first_refusal.get_or_insert(at);
            }
            other => panic!("LOCK.ACQUIRE {key}: {other:?}"),
        }
        if handoffs_at.is_none() && master.info_int("lock", "lock_handoffs") > 0 {
            handoffs_at = Some(at);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    eprintln!(
        "after the cut: last grant at {last_grant:?} ms, first refusal at \
         {first_refusal:?} ms, hand-off at {handoffs_at:?} ms (lease end at {} ms)",
        (lease_end - cut).as_millis()
    );
    let first_refusal = first_refusal.expect("the master never refused");
    assert!(
        last_grant.is_none_or(|ms| ms < LAG_MS + SLACK_MS),
        "granted {last_grant:?} ms after its replica's last acknowledgement (lag {LAG_MS} ms)"
    );
    assert!(first_refusal < LAG_MS + SLACK_MS, "{first_refusal} ms");
    assert_eq!(
        handoffs_at, None,
        "the lock was handed over at its lease end, past the lag"
    );
    // The replica comes back: the waiter is served.
    replica.resume();
    assert!(handed_fence(waiter, "the waiter") > 0);
}

/// A promoted replica waits `lock.max-ttl` plus `min-replicas-max-lag`: the
/// master it replaced may have granted until its replicas' lag ran out.
#[test]
fn a_promoted_replica_quarantines_for_max_ttl_plus_the_replica_lag() {
    let master = Server::start();
    let replica = Server::builder()
        .label("replica")
        .replica_of(&master)
        .config("lock.max-ttl", 1_000)
        .config("min-replicas-to-write", 1)
        .config("min-replicas-max-lag", 3)
        .start();
    replica.wait_for_master_link();
    let mut r = replica.conn();
    assert_eq!(r.call(&["REPLICAOF", "NO", "ONE"]), Ok(Value::Okay));
    let left = replica.info_int("lock", "lock_quarantine_ms");
    assert!(
        (3_500..=4_002).contains(&left),
        "quarantine of 1,000 ms + 3 s of lag expected, {left} ms left"
    );
    // Without the replica settings, the lag is not added.
    let plain = Server::builder()
        .label("plain")
        .replica_of(&master)
        .config("lock.max-ttl", 1_000)
        .config("min-replicas-max-lag", 3)
        .start();
    plain.wait_for_master_link();
    let mut p = plain.conn();
    assert_eq!(p.call(&["REPLICAOF", "NO", "ONE"]), Ok(Value::Okay));
    let left = plain.info_int("lock", "lock_quarantine_ms");
    assert!(
        (500..=1_002).contains(&left),
        "min-replicas-to-write 0: only lock.max-ttl, {left} ms left"
    );
}

/// `partition_safe` is 1 only with every setting, follows `CONFIG SET`, and
/// the log says why it is 0.
#[test]
fn info_says_partition_safe_only_with_every_setting_and_the_log_says_why() {
    let server = Server::start();
    let safe = || server.info_int("lock", "lock_partition_safe");
    assert_eq!(safe(), 0);
    assert!(
        server.log().contains("partition_safe:0: lock.max-ttl is 0"),
        "the start-up log says why:\n{}",
        server.log()
    );
    // (config, value, partition_safe after it); Redis's default
    // min-replicas-max-lag is 10.
    let steps = [
        ("lock.max-ttl", "1000", 0),
        ("min-replicas-to-write", "1", 1),
        ("min-replicas-max-lag", "0", 0),
        ("min-replicas-max-lag", "2", 1),
        ("lock.quarantine", "never", 0),
        ("lock.quarantine", "promotion", 1),
        ("min-replicas-max-lag", "0", 0),
    ];
    for (name, value, want) in steps {
        set(&server, name, value);
        assert_eq!(safe(), want, "after CONFIG SET {name} {value}");
    }
    let log = server.log();
    assert!(log.contains("partition_safe:1"), "{log}");
    assert!(
        log.contains("lock.quarantine is never"),
        "CONFIG SET logs the reason:\n{log}"
    );
    assert!(log.contains("min-replicas-max-lag is 0"), "{log}");
}

/// Without the replica settings the gate stays out of the way: a master
/// with a replica hands over at a lease end as before.
#[test]
fn without_the_settings_nothing_changes() {
    let master = Server::start();
    let _replica = start_replica(&master, "replica");
    let mut m = master.conn();
    assert!(matches!(
        m.call(&["LOCK.ACQUIRE", "job", "a", "100"]),
        Ok(Value::Int(_))
    ));
    let waiter = wait_on(master.conn(), "job", "b", 1_000, 0);
    assert!(handed_fence(waiter, "b") > 0);
    assert_eq!(master.info_int("lock", "lock_partition_safe"), 0);
}
