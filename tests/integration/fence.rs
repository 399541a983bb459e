//! `LOCK.FENCE key owner min-fence` : the owner
//! raises its hold's fence, and every fence the server issues afterwards, for
//! any lock, is higher. Replies, each error in the order of checks with nothing
//! changed, replication, and persistence (RDB, AOF, `DEBUG RELOAD`).

use std::time::Duration;

use redis::{Connection, Value};

use crate::harness::{clock_floor, now_ms, start_replica, wait_until, Call, Hold, Server, LONG};

/// How far ahead of the clock floor a `min-fence` may go: one hour.
const AHEAD_MS: i64 = 3_600_000;

/// A fence well ahead of every clock floor in this test (30 minutes), but
/// inside the one-hour bound: what a Redlock client raises a lagging server to.
fn ahead() -> i64 {
    clock_floor(now_ms() + AHEAD_MS / 2)
}

/// `LOCK.FENCE key owner min-fence` → the hold's fence.
fn fence(c: &mut Connection, key: &str, owner: &str, min_fence: i64) -> i64 {
    c.int(&["LOCK.FENCE", key, owner, &min_fence.to_string()])
}

/// A fresh acquisition of a new key must get a fence above `above`.
fn assert_next_fence_above(c: &mut Connection, above: i64) {
    let key = format!("probe-{}", now_ms());
    let next = c.acquire(&key, "zed", LONG).expect("a new key is free");
    assert!(next > above, "fence {next} is not above {above}");
    assert_eq!(c.int(&["LOCK.RELEASE", &key, "zed"]), 0);
}

#[test]
fn fence_raises_the_holds_fence_and_keeps_count_and_lease() {
    let server = Server::start();
    let mut c = server.conn();
    let issued = c.acquire("k", "alice", LONG).expect("free");
    c.acquire("k", "alice", LONG).expect("reentry");
    let expire_time = c.int(&["PEXPIRETIME", "k"]);

    // Below or at the fence: nothing moves, the reply is the hold's fence.
    assert_eq!(fence(&mut c, "k", "alice", 1), issued);
    assert_eq!(fence(&mut c, "k", "alice", issued), issued);

    let raised = issued + 1_000;
    assert_eq!(fence(&mut c, "k", "alice", raised), raised);
    let info = c.lock_info("k").expect("held");
    assert_eq!(info.held(), (b"alice".to_vec(), 2, raised));
    assert_eq!(c.int(&["PEXPIRETIME", "k"]), expire_time, "lease moved");

    // A lower min-fence never lowers it again; a reentry keeps the raised fence.
    assert_eq!(fence(&mut c, "k", "alice", issued), raised);
    assert_eq!(c.acquire("k", "alice", LONG), Some(raised));
    assert_eq!(c.int(&["LOCK.RELEASE", "k", "alice", "ALL"]), 0);
}

#[test]
fn every_later_fence_on_any_lock_is_higher() {
    let server = Server::start();
    let mut c = server.conn();
    c.acquire("k", "alice", LONG).expect("free");
    let target = ahead();
    assert_eq!(fence(&mut c, "k", "alice", target), target);
    assert!(server.info_int("lock", "lock_last_fence") >= target);

    // Other locks, and the same lock after its release, all go above it,
    // though the clock floor is still half an hour behind.
    let mut last = target;
    for key in ["a", "b", "k"] {
        if key == "k" {
            assert_eq!(c.int(&["LOCK.RELEASE", "k", "alice"]), 0);
        }
        let next = c.acquire(key, "bob", LONG).expect("free");
        assert!(next > last, "{key}: fence {next} not above {last}");
        last = next;
    }
    assert_eq!(server.info_int("lock", "lock_last_fence"), last);
}

/// Lua numbers are doubles, exact only below 2^53, and fences stay below it:
/// fences issued one after another inside one script come back as distinct,
/// rising numbers, and a script may compare fences as numbers.
#[test]
fn fences_are_exact_numbers_inside_a_script() {
    let server = Server::start();
    let mut c = server.conn();
    // Raised ahead of the clock, every next fence is the last + 1: two
    // consecutive integers, which doubles above 2^53 cannot tell apart.
    c.acquire("seed", "alice", LONG).expect("free");
    let seed = fence(&mut c, "seed", "alice", ahead() + 1);
    let exclusive: Vec<i64> = redis::cmd("EVAL")
        .arg(&[
            "local a = redis.call('LOCK.ACQUIRE', KEYS[1], 'p:1', 60000)
             local b = redis.call('LOCK.ACQUIRE', KEYS[2], 'q:1', 60000)
             redis.call('LOCK.RELEASE', KEYS[1], 'p:1')
             local c = redis.call('LOCK.ACQUIRE', KEYS[1], 'z:1', 60000)
             return {a, b, c}",
            "2",
            "k1",
            "k2",
        ])
        .query(&mut c)
        .expect("EVAL");
    assert_eq!(exclusive, [seed + 1, seed + 2, seed + 3], "exclusive");
    let shared: Vec<i64> = redis::cmd("EVAL")
        .arg(&[
            "local out = {}
             for i = 1, 3 do
               out[i] = redis.call('LOCK.ACQUIRE', KEYS[1], 'r:' .. i, 60000, 'SHARED')
             end
             return out",
            "1",
            "rw",
        ])
        .query(&mut c)
        .expect("EVAL");
    assert_eq!(shared, [seed + 4, seed + 5, seed + 6], "shared holds");
    for (owner, want) in [("r:1", seed + 4), ("r:3", seed + 6)] {
        let holder = c
            .lock_info("rw")
            .expect("held")
            .holders
            .into_iter()
            .find(|h| h.owner == owner)
            .expect("holder");
        assert_eq!(holder.fence, want, "{owner}");
    }
    let mut newer = |a: i64, b: i64| -> i64 {
        let reply: Option<i64> = redis::cmd("EVAL")
            .arg(&[
                "return tonumber(ARGV[1]) > tonumber(ARGV[2])",
                "0",
                &a.to_string(),
                &b.to_string(),
            ])
            .query(&mut c)
            .expect("EVAL");
        reply.unwrap_or(0)
    };
    assert_eq!(newer(seed + 2, seed + 1), 1, "compared as numbers");
    assert_eq!(newer(seed + 1, seed + 2), 0, "compared as numbers");
}

#[test]
fn fence_is_a_write_with_its_key_at_position_one() {
    let server = Server::start();
    let mut c = server.conn();
    let args = ["LOCK.FENCE", "mykey", "alice", "5"];
    let keys: Vec<String> = c.value([&["COMMAND", "GETKEYS"][..], &args[..]].concat());
    assert_eq!(keys, ["mykey"]);
    let Ok(Value::Array(info)) = c.call(&["COMMAND", "INFO", "lock.fence"]) else {
        panic!("COMMAND INFO lock.fence");
    };
    let Some(Value::Array(fields)) = info.first() else {
        panic!("COMMAND INFO lock.fence: {info:?}");
    };
    assert_eq!(fields[3..6], [Value::Int(1), Value::Int(1), Value::Int(1)]);
    let flags: Vec<String> = redis::from_redis_value(fields[2].clone()).expect("flags");
    assert!(flags.iter().any(|f| f == "write"), "flags {flags:?}");
    assert!(!flags.iter().any(|f| f == "denyoom"), "flags {flags:?}");
}

/// A server with `k` held by alice (count 2, fence raised), a string `s`,
/// and no key `free`: each refusal below must leave all of it as it was.
struct Fixture {
    server: Server,
    c: Connection,
}

/// What a refusal must not change.
#[derive(Debug, PartialEq)]
struct State {
    digest: String,
    k: Option<Hold>,
    expire_time: i64,
    pttl_free: i64,
    last_fence: i64,
}

impl Fixture {
    fn new() -> Fixture {
        let server = Server::start();
        let mut c = server.conn();
        c.acquire("k", "alice", LONG).expect("free");
        c.acquire("k", "alice", LONG).expect("reentry");
        let raised = ahead();
        assert_eq!(fence(&mut c, "k", "alice", raised), raised);
        c.value::<String, _>(&["SET", "s", "v"]);
        Fixture { server, c }
    }

    fn state(&mut self) -> State {
        State {
            digest: self.server.digest(),
            k: self.c.lock_info("k").map(|info| info.held()),
            expire_time: self.c.int(&["PEXPIRETIME", "k"]),
            pttl_free: self.c.pttl("free"),
            last_fence: self.server.info_int("lock", "lock_last_fence"),
        }
    }

    /// Sends `args`, expects an error starting with `prefix`, and checks
    /// that nothing changed; returns the error text.
    fn refused(&mut self, args: &[&str], prefix: &str) -> String {
        let before = self.state();
        let err = self.c.err(args);
        assert!(
            err.starts_with(prefix),
            "{args:?}: expected {prefix:?}, got {err:?}"
        );
        assert_eq!(self.state(), before, "{args:?} changed state");
        err
    }
}

#[test]
fn errors_come_in_spec_order_and_change_nothing() {
    let mut f = Fixture::new();
    let too_long = "x".repeat(1025);
    // Past the bound by a minute, so the server's clock cannot catch up
    // between our reading and its check.
    let over = clock_floor(now_ms() + AHEAD_MS + 60_000).to_string();
    let i64_max = i64::MAX.to_string();

    // Each row also breaks every later rule, so only its own may answer.
    let arity = "ERR wrong number of arguments for 'lock.fence' command";
    for args in [
        &["LOCK.FENCE"][..],
        &["LOCK.FENCE", "s"],
        &["LOCK.FENCE", "s", ""],
    ] {
        assert_eq!(f.refused(args, arity), arity);
    }
    for args in [
        &["LOCK.FENCE", "k", "alice", "5", "extra"][..],
        &["LOCK.FENCE", "s", "", "0", "extra"],
    ] {
        assert_eq!(f.refused(args, "ERR syntax error"), "ERR syntax error");
    }
    for bad in ["0", "-1", "abc", "1.5", "05", "", &over, &i64_max] {
        for (key, owner) in [("k", "alice"), ("s", ""), ("free", too_long.as_str())] {
            let err = f.refused(&["LOCK.FENCE", key, owner, bad], "ERR min-fence");
            assert!(
                err.contains("from 1 to (unix_ms + 3600000) * 2^10"),
                "the error names the range: {err}"
            );
        }
    }
    for (key, owner) in [("s", ""), ("free", too_long.as_str())] {
        let err = f.refused(&["LOCK.FENCE", key, owner, "5"], "ERR owner");
        assert_eq!(err, "ERR owner must be 1 to 1024 bytes long");
    }
    f.refused(&["LOCK.FENCE", "s", "alice", "5"], "WRONGTYPE");
    let notowner = f.server.info_int("lock", "lock_notowner");
    for (key, owner) in [("k", "bob"), ("free", "alice")] {
        f.refused(&["LOCK.FENCE", key, owner, "5"], "NOTOWNER");
    }
    assert_eq!(f.server.info_int("lock", "lock_notowner"), notowner + 2);

    // The bound itself, read a minute behind the server's clock, is fine.
    let at_bound = clock_floor(now_ms() - 60_000 + AHEAD_MS);
    assert_eq!(fence(&mut f.c, "k", "alice", at_bound), at_bound);
}

#[test]
fn fence_after_release_or_lease_end_is_refused() {
    let server = Server::start();
    let mut c = server.conn();
    c.acquire("k", "alice", LONG).expect("free");
    assert_eq!(c.int(&["LOCK.RELEASE", "k", "alice"]), 0);
    assert!(c
        .err(&["LOCK.FENCE", "k", "alice", "5"])
        .starts_with("NOTOWNER"));

    c.acquire("short", "alice", 30).expect("free");
    wait_until("the lease ends", Duration::from_secs(5), || {
        c.pttl("short") == -2
    });
    let err = c.err(&["LOCK.FENCE", "short", "alice", "5"]);
    assert!(err.starts_with("NOTOWNER"), "{err}");
    assert_eq!(c.lock_info("short"), None, "a refusal creates nothing");
}

#[test]
fn replica_holds_the_raised_fence_and_its_counter() {
    let master = Server::builder().label("master").start();
    let replica = start_replica(&master, "replica");
    let mut m = master.conn();
    m.acquire("k", "alice", LONG).expect("free");
    let raised = ahead();
    assert_eq!(fence(&mut m, "k", "alice", raised), raised);
    m.wait_replicas(1);
    replica.catch_up_with(&master);

    let mut r = replica.conn();
    assert_eq!(
        r.lock_info("k").map(|i| i.held()),
        Some((b"alice".to_vec(), 1, raised))
    );
    assert_eq!(r.int(&["PEXPIRETIME", "k"]), m.int(&["PEXPIRETIME", "k"]));
    assert_eq!(replica.digest(), master.digest());
    assert_eq!(replica.info_int("lock", "lock_last_fence"), raised);

    // Promoted, the replica issues fences above the raised one.
    drop(master);
    assert_eq!(r.value::<String, _>(&["REPLICAOF", "NO", "ONE"]), "OK");
    assert_next_fence_above(&mut r, raised);
}

/// Raises `k`'s fence ahead of the clock, releases a second lock raised even
/// higher (so only the counter remembers it); returns the highest fence.
fn raise_and_release(c: &mut Connection) -> i64 {
    c.acquire("k", "alice", LONG).expect("free");
    c.acquire("gone", "bob", LONG).expect("free");
    let raised = ahead();
    assert_eq!(fence(c, "k", "alice", raised), raised);
    assert_eq!(fence(c, "gone", "bob", raised + 10), raised + 10);
    assert_eq!(c.int(&["LOCK.RELEASE", "gone", "bob"]), 0);
    raised + 10
}

/// A server with the AOF on (`appendfsync always`) after
/// [`raise_and_release`]; returns it and the highest fence.
fn raised_with_aof(rdb_preamble: bool) -> (Server, i64) {
    let server = Server::builder().appendonly(rdb_preamble).start();
    server.wait_for_aof_rewrite();
    let highest = raise_and_release(&mut server.conn());
    (server, highest)
}

/// After a reload or restart: `k` keeps its raised fence, and new fences go
/// above the highest one raised.
fn assert_survived(server: &Server, highest: i64, how: &str) {
    let mut c = server.conn();
    let info = c.lock_info("k").unwrap_or_else(|| panic!("{how}: k lost"));
    assert_eq!(info.held(), (b"alice".to_vec(), 1, highest - 10), "{how}");
    assert!(
        server.info_int("lock", "lock_last_fence") >= highest,
        "{how}: counter below {highest}"
    );
    assert_next_fence_above(&mut c, highest);
}

#[test]
fn raised_fences_survive_debug_reload_and_an_rdb_restart() {
    let mut server = Server::start();
    let mut c = server.conn();
    let highest = raise_and_release(&mut c);
    let digest = server.digest();
    assert_eq!(c.value::<String, _>(&["DEBUG", "RELOAD"]), "OK");
    assert_eq!(server.digest(), digest);
    assert_survived(&server, highest, "DEBUG RELOAD");

    server.restart_saving();
    assert_survived(&server, highest, "RDB restart");
}

#[test]
fn raised_fences_survive_an_aof_crash_restart() {
    for rdb_preamble in [true, false] {
        let (mut server, highest) = raised_with_aof(rdb_preamble);
        let digest = server.digest();
        // appendfsync always: each effect was on disk before its reply.
        server.crash_restart();
        assert_eq!(server.digest(), digest, "preamble {rdb_preamble}");
        assert_survived(&server, highest, &format!("AOF, preamble {rdb_preamble}"));
    }
}

/// A rewrite keeps only the keys: with the RDB preamble the counter rides in
/// its aux field; without it, the master writes `LOCK.LASTFENCE` to the new
/// AOF when the rewrite forks (the counter is ahead of the clock here).
#[test]
fn raised_fences_survive_an_aof_rewrite_with_or_without_the_rdb_preamble() {
    for rdb_preamble in [true, false] {
        let (mut server, highest) = raised_with_aof(rdb_preamble);
        server.conn().call(&["BGREWRITEAOF"]).expect("BGREWRITEAOF");
        server.wait_for_aof_rewrite();
        server.restart();
        let how = format!("AOF rewrite, preamble {rdb_preamble}");
        assert_survived(&server, highest, &how);
    }
}

/// A rewrite while writes are paused: the record waits for the pause to end
/// (the server must not propagate while paused), then lands.
#[test]
fn a_rewrite_during_a_write_pause_keeps_the_raised_fence_after_the_pause() {
    let (mut server, highest) = raised_with_aof(false);
    let mut c = server.conn();
    assert_eq!(
        c.value::<String, _>(&["CLIENT", "PAUSE", "60000", "WRITE"]),
        "OK"
    );
    c.call(&["BGREWRITEAOF"]).expect("BGREWRITEAOF");
    server.wait_for_aof_rewrite();
    let size = server.info_int("persistence", "aof_current_size");
    assert_eq!(c.value::<String, _>(&["CLIENT", "UNPAUSE"]), "OK");
    wait_until("the record reaches the AOF", Duration::from_secs(5), || {
        server.info_int("persistence", "aof_current_size") > size
    });
    server.restart();
    assert_survived(&server, highest, "AOF rewrite during a pause");
}
