//! Durability (fencing and durability and replication): the full state (owner, count, fence,
//! lease, and the fence counter) survives RDB, AOF with and without the RDB
//! preamble (written live and by a rewrite), `DEBUG RELOAD`, and travels with
//! `DUMP`/`RESTORE` and `COPY`. Fences keep rising across every restart, even
//! one that lost all data.

use std::fs;

use redis::Connection;

use crate::harness::{clock_floor, now_ms, wait_until, Call, Hold, Server, Stop, LONG};

/// Tolerance when comparing a lease's end before and after a restart: the
/// end is absolute, only the measurement moves.
const LEASE_SLACK_MS: i64 = 250;

/// A lock as it was before a restart.
#[derive(Debug)]
struct Held {
    key: &'static str,
    info: Hold,
    /// The lease's end, in Unix ms, as estimated from `PTTL`.
    lease_end: i64,
}

fn snapshot(c: &mut Connection, key: &'static str) -> Held {
    let info = c.lock_info(key).unwrap_or_else(|| panic!("{key} is held"));
    let before = now_ms();
    let pttl = c.pttl(key);
    Held {
        key,
        info: info.held(),
        lease_end: before + pttl,
    }
}

/// Asserts that each lock is held as before, with the same lease end.
fn assert_kept(c: &mut Connection, locks: &[Held]) {
    for held in locks {
        let now = snapshot(c, held.key);
        assert_eq!(now.info, held.info, "{}: owner, count, fence", held.key);
        assert!(
            (now.lease_end - held.lease_end).abs() <= LEASE_SLACK_MS,
            "{}: the lease ended at {} and now ends at {}",
            held.key,
            held.lease_end,
            now.lease_end
        );
    }
}

/// A mix of states: `a` reentered, `b` renewed, `c` released (gone).
/// Returns the locks held and the highest fence issued.
fn make_locks(c: &mut Connection) -> (Vec<Held>, i64) {
    let a = c.acquire("a", "alice", LONG).expect("free");
    c.acquire("a", "alice", LONG);
    assert_eq!(c.int(&["LOCK.REENTER", "a", "alice"]), 3);
    let b = c.acquire("b", "bob\0\u{ff}", 20_000).expect("free");
    assert_eq!(c.int(&["LOCK.RENEW", "b", "bob\0\u{ff}", "400000"]), 1);
    let last = c.acquire("c", "carol", LONG).expect("free");
    assert_eq!(c.int(&["LOCK.RELEASE", "c", "carol"]), 0);
    assert!(a < b && b < last);
    (vec![snapshot(c, "a"), snapshot(c, "b")], last)
}

/// The server's fence counter (`lock_last_fence`) must be at least `fence`.
fn assert_last_fence_at_least(server: &Server, fence: i64) {
    let last_fence = server.info_int("lock", "lock_last_fence");
    assert!(
        last_fence >= fence,
        "lock_last_fence is {last_fence}, below the fence {fence} issued before"
    );
}

/// A fresh acquisition's fence must exceed `above`; returns it. The probe lock
/// is released at once, so it leaves no state behind.
fn assert_next_fence_above(c: &mut Connection, above: i64) -> i64 {
    let key = format!("probe-{above}");
    let fence = c.acquire(&key, "zed", LONG).expect("free");
    assert!(fence > above, "fence {fence} is not above {above}");
    assert_eq!(c.int(&["LOCK.RELEASE", &key, "zed"]), 0);
    fence
}

#[test]
fn save_and_restart_keep_locks() {
    let mut server = Server::start();
    let mut c = server.conn();
    let (locks, last) = make_locks(&mut c);
    assert_eq!(c.value::<String, _>(&["SAVE"]), "OK");
    server.restart();

    let mut c = server.conn();
    assert_kept(&mut c, &locks);
    assert_last_fence_at_least(&server, last);
    assert_eq!(server.info_int("lock", "lock_held"), 2);
    assert_eq!(
        c.int(&["LOCK.RELEASE", "a", "alice"]),
        2,
        "the owner still owns it"
    );
    assert_next_fence_above(&mut c, last);
}

#[test]
fn shutdown_save_and_restart_keep_locks() {
    let mut server = Server::start();
    let mut c = server.conn();
    let (locks, last) = make_locks(&mut c);
    server.restart_saving();

    let mut c = server.conn();
    assert_kept(&mut c, &locks);
    assert_next_fence_above(&mut c, last);
}

#[test]
fn debug_reload_keeps_locks() {
    let server = Server::start();
    let mut c = server.conn();
    let (locks, last) = make_locks(&mut c);
    let digest = server.digest();
    assert_eq!(c.value::<String, _>(&["DEBUG", "RELOAD"]), "OK");
    assert_kept(&mut c, &locks);
    assert_eq!(server.digest(), digest);
    assert_last_fence_at_least(&server, last);
    // Valkey 9 frees the values read before the reload on its lazy-free
    // thread after the reply; their holds end then.
    wait_until(
        "the holds read before the reload have ended",
        std::time::Duration::from_secs(10),
        || server.info_int("lock", "lock_held") <= 2,
    );
    assert_eq!(server.info_int("lock", "lock_held"), 2);
    assert_next_fence_above(&mut c, last);
}

#[test]
fn last_fence_survives_an_rdb_restart_with_no_lock_held() {
    let mut server = Server::start();
    let mut c = server.conn();
    let mut last = 0;
    for i in 0..50 {
        let key = format!("k{i}");
        last = c.acquire(&key, "alice", LONG).expect("free");
        assert_eq!(c.int(&["LOCK.RELEASE", &key, "alice"]), 0);
    }
    assert_eq!(c.int(&["DBSIZE"]), 0);
    assert_eq!(c.value::<String, _>(&["SAVE"]), "OK");
    server.restart();

    // The RDB carries the fence counter even with no lock in it.
    assert_last_fence_at_least(&server, last);
    assert_next_fence_above(&mut server.conn(), last);
}

/// AOF on: live effects reach the AOF (checked by a crash), then a rewrite
/// writes them anew (checked by a restart).
fn aof_keeps_locks(rdb_preamble: bool) {
    let mut server = Server::builder().appendonly(rdb_preamble).start();
    server.wait_for_aof_rewrite();
    let mut c = server.conn();
    let (locks, last) = make_locks(&mut c);
    let digest = server.digest();

    // appendfsync always: every reply was on disk first, so a crash loses none.
    server.crash_restart();
    let mut c = server.conn();
    assert_kept(&mut c, &locks);
    assert_eq!(server.digest(), digest);
    assert_last_fence_at_least(&server, last);
    let next = assert_next_fence_above(&mut c, last);

    // The rewrite writes the same state from scratch.
    c.call(&["BGREWRITEAOF"]).expect("BGREWRITEAOF");
    server.wait_for_aof_rewrite();
    assert_eq!(
        server.info_field("persistence", "aof_last_bgrewrite_status"),
        "ok"
    );
    let digest = server.digest();
    server.restart();
    let mut c = server.conn();
    assert_kept(&mut c, &locks);
    assert_eq!(server.digest(), digest);
    assert_last_fence_at_least(&server, next);
    assert_next_fence_above(&mut c, next);
}

#[test]
fn aof_with_rdb_preamble_keeps_locks_through_crash_and_rewrite() {
    aof_keeps_locks(true);
}

#[test]
fn aof_without_rdb_preamble_keeps_locks_through_crash_and_rewrite() {
    aof_keeps_locks(false);
}

/// One command in RESP, as an AOF holds it.
fn resp(args: &[&str]) -> String {
    let mut out = format!("*{}\r\n", args.len());
    for arg in args {
        out.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    out
}

#[test]
fn aof_replay_keeps_a_fence_issued_ahead_of_this_clock() {
    // An AOF written by a server whose clock ran an hour ahead: replay must
    // keep its fence, never re-derive one, and fences must go on from there.
    let mut server = Server::start();
    server.stop(Stop::NoSave);
    let ahead = clock_floor(now_ms() + 3_600_000) + 7;
    let lease_end = now_ms() + LONG;
    let aof = resp(&["SELECT", "0"])
        + &resp(&[
            "LOCK.APPLY",
            "k",
            "alice",
            "2",
            &ahead.to_string(),
            "PXAT",
            &lease_end.to_string(),
        ]);
    fs::write(server.dir().join("appendonly.aof"), aof).expect("write the AOF");
    server.set_startup_config("appendonly", "yes");
    server.start_again();

    let mut c = server.conn();
    let info = c.lock_info("k").expect("the AOF's lock is held");
    assert_eq!(info.held(), (b"alice".to_vec(), 2, ahead));
    let pttl = c.pttl("k");
    assert!(
        (pttl - (lease_end - now_ms())).abs() <= LEASE_SLACK_MS,
        "PTTL {pttl}"
    );
    // Loading moves held and last_fence only.
    assert_last_fence_at_least(&server, ahead);
    assert_eq!(server.info_int("lock", "lock_held"), 1);
    assert_eq!(server.info_int("lock", "lock_acquired"), 0);
    let next = assert_next_fence_above(&mut c, ahead);

    // The counter, not the clock, also survives an RDB with no lock held.
    assert_eq!(c.int(&["LOCK.RELEASE", "k", "alice", "ALL"]), 0);
    assert_eq!(c.value::<String, _>(&["SAVE"]), "OK");
    server.stop(Stop::NoSave);
    server.set_startup_config("appendonly", "no");
    server.start_again();
    assert_last_fence_at_least(&server, next);
    assert_next_fence_above(&mut server.conn(), next);
}

#[test]
fn a_renewal_reaches_the_aof_as_its_lease_alone_and_loads_back() {
    // Only the lease moves, so the effect is `LOCK.APPLY key PXAT ms`; a
    // replay must give the hold that lease, in the key and in the lock.
    let mut server = Server::builder().appendonly(true).start();
    server.wait_for_aof_rewrite();
    let mut c = server.conn();
    c.acquire("k", "alice", 1_000).expect("free");
    assert_eq!(c.int(&["LOCK.RENEW", "k", "alice", &LONG.to_string()]), 1);
    let held = c.lock_info("k").expect("held").held();
    let lease = c.int(&["PEXPIRETIME", "k"]);

    let commands = crate::handoff::aof_incr_commands(&server);
    let last = commands
        .iter()
        .rev()
        .find(|command| command.get(1).is_some_and(|key| key == b"k"))
        .expect("k in the AOF");
    let want: Vec<Vec<u8>> = ["LOCK.APPLY", "k", "PXAT", &lease.to_string()]
        .iter()
        .map(|arg| arg.as_bytes().to_vec())
        .collect();
    assert_eq!(last, &want);

    server.crash_restart();
    let mut c = server.conn();
    let info = c.lock_info("k").expect("held after the replay");
    assert_eq!(info.held(), held);
    assert!(
        info.ttl > 1_000,
        "the replayed lock kept its first lease: {info:?}"
    );
    assert_eq!(c.int(&["PEXPIRETIME", "k"]), lease);
}

#[test]
fn restart_without_persistence_loses_locks_but_fences_keep_rising() {
    let mut server = Server::start();
    let mut c = server.conn();
    let (_, last) = make_locks(&mut c);
    server.restart();

    let mut c = server.conn();
    assert_eq!(c.int(&["DBSIZE"]), 0, "nothing was persisted");
    assert_eq!(c.lock_info("a"), None);
    // Only the clock floor is left: let it pass the last fence, as a restart
    // takes longer than that anyway.
    wait_until(
        "the clock floor passes the last fence",
        std::time::Duration::from_secs(5),
        || clock_floor(now_ms()) > last,
    );
    assert_next_fence_above(&mut c, last);
}

#[test]
fn dump_and_restore_keep_owner_count_fence_and_lease() {
    let server = Server::start();
    let mut c = server.conn();
    let (locks, last) = make_locks(&mut c);
    let a = &locks[0];
    let payload: Vec<u8> = c.value(&["DUMP", "a"]);
    let expire_at: i64 = c.int(&["PEXPIRETIME", "a"]);

    // Onto another key of the same server.
    let restored: String = redis::cmd("RESTORE")
        .arg("a2")
        .arg(expire_at)
        .arg(&payload)
        .arg("ABSTTL")
        .query(&mut c)
        .expect("RESTORE");
    assert_eq!(restored, "OK");
    assert_eq!(c.lock_info("a2").expect("restored").held(), a.info);
    assert_eq!(c.int(&["PEXPIRETIME", "a2"]), expire_at);
    assert_eq!(server.info_int("lock", "lock_held"), 3);
    // The copy is its own lock.
    assert_eq!(c.int(&["LOCK.RELEASE", "a2", "alice", "ALL"]), 0);
    assert_eq!(c.lock_info("a").expect("original kept").held(), a.info);

    // Onto another server, which learns the fence.
    let other = Server::builder().label("other").start();
    let mut o = other.conn();
    let restored: String = redis::cmd("RESTORE")
        .arg("a")
        .arg(expire_at)
        .arg(&payload)
        .arg("ABSTTL")
        .query(&mut o)
        .expect("RESTORE on another server");
    assert_eq!(restored, "OK");
    assert_eq!(o.lock_info("a").expect("restored").held(), a.info);
    assert_eq!(o.int(&["PEXPIRETIME", "a"]), expire_at);
    assert_eq!(other.info_int("lock", "lock_held"), 1);
    assert_eq!(
        other.info_int("lock", "lock_acquired"),
        0,
        "RESTORE is no acquisition"
    );
    assert_last_fence_at_least(&other, a.info.2);
    assert_eq!(
        o.int(&["LOCK.REENTER", "a", "alice"]),
        4,
        "the owner owns it there"
    );
    assert_next_fence_above(&mut o, a.info.2);
    assert_next_fence_above(&mut c, last);
}

#[test]
fn copy_makes_an_independent_lock_with_the_same_state() {
    let server = Server::start();
    let mut c = server.conn();
    let (locks, _) = make_locks(&mut c);
    let a = &locks[0];

    assert_eq!(c.int(&["COPY", "a", "a2"]), 1);
    assert_eq!(c.lock_info("a2").expect("copied").held(), a.info);
    assert_eq!(
        c.int(&["PEXPIRETIME", "a2"]),
        c.int(&["PEXPIRETIME", "a"]),
        "the copy has the same lease"
    );
    assert_eq!(server.info_int("lock", "lock_held"), 3);

    // Changing the copy leaves the original alone, and the other way round.
    assert_eq!(c.int(&["LOCK.REENTER", "a2", "alice"]), 4);
    assert_eq!(c.lock_info("a").expect("held").count, 3);
    assert_eq!(c.int(&["LOCK.RELEASE", "a", "alice"]), 2);
    assert_eq!(c.lock_info("a2").expect("held").count, 4);
    assert_eq!(c.int(&["LOCK.RELEASE", "a2", "alice", "ALL"]), 0);
    assert_eq!(c.int(&["EXISTS", "a2"]), 0);
    let (owner, _, fence) = a.info.clone();
    assert_eq!(
        c.lock_info("a").expect("original intact").held(),
        (owner, 2, fence)
    );

    // COPY onto an existing lock needs REPLACE, as for any key.
    assert_eq!(c.int(&["COPY", "a", "b"]), 0);
    assert_eq!(c.lock_info("b").expect("held").held(), locks[1].info);
}

/// Changes count for `save` points even when nothing is replicated, and an
/// AOF turned on at run time receives every later change.
#[test]
fn changes_count_for_save_points_and_reach_an_aof_turned_on_later() {
    let mut server = Server::start();
    let mut c = server.conn();
    let before = server.info_int("persistence", "rdb_changes_since_last_save");
    c.acquire("k", "alice", LONG).expect("free");
    c.acquire("k", "alice", LONG).expect("reentry");
    assert_eq!(c.int(&["LOCK.RELEASE", "k", "alice"]), 1);
    let after = server.info_int("persistence", "rdb_changes_since_last_save");
    assert!(after >= before + 3, "dirty went from {before} to {after}");

    c.value::<(), _>(&["CONFIG", "SET", "appendonly", "yes"]);
    server.wait_for_aof_rewrite();
    let fence = c.acquire("later", "bob", LONG).expect("free");
    c.acquire("k", "alice", LONG).expect("reentry");
    server.set_startup_config("appendonly", "yes");
    server.restart();
    let mut c = server.conn();
    assert_eq!(
        c.lock_info("later").map(|i| i.held()),
        Some((b"bob".to_vec(), 1, fence))
    );
    assert_eq!(c.lock_info("k").map(|i| i.count), Some(2));
}
