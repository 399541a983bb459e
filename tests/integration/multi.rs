//! Several locks at once (`LOCK.MACQUIRE`, `LOCK.MRELEASE`, `LOCK.MRENEW`):
//! all or none in one step, one arrival order across the queues of the keys
//! a request names (crossing key orders never deadlock, a wide request is
//! not starved by narrow ones), a waiter that leaves re-serves every key it
//! headed, the master's holds on a replica and after restarts, bad input
//! that changes nothing, and a hand-off whose cost does not grow with the
//! clients waiting.

use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use redis::Value;

use crate::harness::*;

const SOON: Duration = Duration::from_secs(10);

/// `LOCK.MACQUIRE numkeys keys… owner ttl [options…]`'s arguments.
fn macquire_args(keys: &[&str], owner: &str, ttl: i64, opts: &[&str]) -> Vec<String> {
    let mut args = vec!["LOCK.MACQUIRE".to_string(), keys.len().to_string()];
    args.extend(keys.iter().map(|k| k.to_string()));
    args.push(owner.to_string());
    args.push(ttl.to_string());
    args.extend(opts.iter().map(|o| o.to_string()));
    args
}

fn macquire(
    conn: &mut redis::Connection,
    keys: &[&str],
    owner: &str,
    ttl: i64,
    opts: &[&str],
) -> Reply {
    conn.call(macquire_args(keys, owner, ttl, opts))
}

/// A `LOCK.MACQUIRE … WAIT timeout` from a thread of its own, on a new
/// connection.
fn wait_all(
    server: &Server,
    keys: &[&str],
    owner: &str,
    ttl: i64,
    timeout: i64,
) -> JoinHandle<Reply> {
    let mut conn = server.conn();
    let args = macquire_args(keys, owner, ttl, &["WAIT", &timeout.to_string()]);
    thread::spawn(move || conn.call(args))
}

/// The fences of a granted `LOCK.MACQUIRE`.
fn fences(reply: &Reply) -> Vec<i64> {
    match reply {
        Ok(Value::Array(items)) => items
            .iter()
            .map(|item| match item {
                Value::Int(fence) => *fence,
                other => panic!("expected a fence, got {other:?}"),
            })
            .collect(),
        other => panic!("expected an array of fences, got {other:?}"),
    }
}

fn mrelease(conn: &mut redis::Connection, keys: &[&str], owner: &str) -> Reply {
    let mut args = vec!["LOCK.MRELEASE".to_string(), keys.len().to_string()];
    args.extend(keys.iter().map(|k| k.to_string()));
    args.push(owner.to_string());
    conn.call(args)
}

fn owner(server: &Server, key: &str) -> Option<String> {
    server.lock_info(key).map(|info| info.owner_text())
}

fn waiters(server: &Server, key: &str) -> i64 {
    let queue: Vec<Value> = server.conn().value(&["LOCK.QUEUE", key]);
    queue.len() as i64
}

fn wait_for_waiters(server: &Server, key: &str, n: i64) {
    wait_until(&format!("{n} waiting on {key}"), SOON, || {
        waiters(server, key) == n
    });
}

#[test]
fn every_key_or_none_with_fences_in_key_order() {
    let server = Server::start();
    let mut c = server.conn();
    assert!(c.acquire("a", "x", LONG).is_some());
    // One key busy: nil, and the free ones stay free.
    assert_eq!(
        macquire(&mut c, &["b", "a", "c"], "o", LONG, &[]),
        Ok(Value::Nil)
    );
    assert_eq!(server.lock_info("b"), None);
    assert_eq!(server.lock_info("c"), None);
    assert_eq!(c.int(&["LOCK.RELEASE", "a", "x"]), 0);
    let got = fences(&macquire(&mut c, &["b", "a", "c"], "o", LONG, &[]));
    assert_eq!(got.len(), 3);
    assert!(
        got[0] < got[1] && got[1] < got[2],
        "issued in key order: {got:?}"
    );
    for (key, fence) in ["b", "a", "c"].iter().zip(&got) {
        let info = server.lock_info(key).expect("held");
        assert_eq!(
            (info.owner_text().as_str(), info.count, info.fence),
            ("o", 1, *fence)
        );
        assert!(c.pttl(key) > LONG - 60_000);
    }
    // The owner's own holds are reentered: same fences, count 2; a fresh
    // key beside them gets a new fence.
    let again = fences(&macquire(&mut c, &["a", "d"], "o", LONG, &[]));
    assert_eq!(again[0], got[1]);
    assert!(again[1] > got[2]);
    assert_eq!(server.lock_info("a").expect("held").count, 2);
    // Each hold is an ordinary one.
    assert_eq!(c.int(&["LOCK.RELEASE", "a", "o"]), 1);
    assert_eq!(
        c.value::<Vec<i64>, _>(&["LOCK.MRELEASE", "3", "a", "b", "d", "o"]),
        [0, 0, 0]
    );
    assert_eq!(owner(&server, "c").as_deref(), Some("o"));
    // One key: still a list.
    assert_eq!(fences(&macquire(&mut c, &["e"], "p", LONG, &[])).len(), 1);
}

#[test]
fn release_and_renew_are_all_or_none() {
    let server = Server::start();
    let mut c = server.conn();
    fences(&macquire(&mut c, &["a", "b"], "o", 60_000, &[]));
    assert!(c.acquire("z", "other", LONG).is_some());
    let notowner = c.err(&["LOCK.MRELEASE", "3", "a", "b", "z", "o"]);
    assert!(notowner.starts_with("NOTOWNER"), "{notowner}");
    let notowner = c.err(&["LOCK.MRENEW", "2", "a", "free", "o", "600000"]);
    assert!(notowner.starts_with("NOTOWNER"), "{notowner}");
    for key in ["a", "b"] {
        assert_eq!(owner(&server, key).as_deref(), Some("o"), "{key} kept");
        assert!(c.pttl(key) <= 60_000, "{key}'s lease unchanged");
    }
    assert_eq!(c.int(&["LOCK.MRENEW", "2", "a", "b", "o", "600000"]), 1);
    assert!(c.pttl("a") > 60_000 && c.pttl("b") > 60_000);
    fences(&macquire(&mut c, &["a"], "o", LONG, &[]));
    assert_eq!(
        c.value::<Vec<i64>, _>(&["LOCK.MRELEASE", "2", "a", "b", "o"]),
        [1, 0]
    );
    assert_eq!(
        c.value::<Vec<i64>, _>(&["LOCK.MRELEASE", "1", "a", "o", "ALL"]),
        [0]
    );
    assert_eq!(server.lock_info("a"), None);
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let server = Server::start();
    let mut c = server.conn();
    c.call(&["SET", "str", "x"]).expect("set");
    let cases: &[(&[&str], &str)] = &[
        (&["LOCK.MACQUIRE"], "ERR wrong number of arguments"),
        (&["LOCK.MACQUIRE", "0", "a", "o", "100"], "ERR numkeys"),
        (&["LOCK.MACQUIRE", "65", "a", "o", "100"], "ERR numkeys"),
        (&["LOCK.MACQUIRE", "x", "a", "o", "100"], "ERR numkeys"),
        (
            &["LOCK.MACQUIRE", "3", "a", "b"],
            "ERR wrong number of arguments",
        ),
        (
            &["LOCK.MACQUIRE", "2", "a", "b", "o"],
            "ERR wrong number of arguments",
        ),
        (&["LOCK.MACQUIRE", "2", "a", "b", "o", "0"], "ERR ttl-ms"),
        (
            &["LOCK.MACQUIRE", "2", "a", "b", "o", "100", "NOPE"],
            "ERR syntax error",
        ),
        (
            &["LOCK.MACQUIRE", "2", "a", "b", "o", "100", "LIMIT", "2"],
            "ERR syntax error",
        ),
        (
            &["LOCK.MACQUIRE", "2", "a", "a", "o", "100"],
            "ERR the keys must be distinct",
        ),
        (&["LOCK.MACQUIRE", "2", "a", "str", "o", "100"], "WRONGTYPE"),
        (
            &["LOCK.MRELEASE", "2", "a", "b"],
            "ERR wrong number of arguments",
        ),
        (
            &["LOCK.MRELEASE", "2", "a", "a", "o"],
            "ERR the keys must be distinct",
        ),
        (&["LOCK.MRENEW", "2", "a", "b", "o", "-1"], "ERR ttl-ms"),
    ];
    for (args, want) in cases {
        let got = c.err(*args);
        assert!(got.starts_with(want), "{args:?}: {got}");
        assert_eq!(server.lock_info("a"), None, "{args:?} took nothing");
        assert_eq!(server.lock_info("b"), None, "{args:?} took nothing");
    }
    let keys: Vec<String> = (0..64).map(|i| format!("k{i}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    assert_eq!(fences(&macquire(&mut c, &keys, "o", LONG, &[])).len(), 64);
}

#[test]
fn the_waiter_is_granted_every_key_in_one_step() {
    let server = Server::start();
    let mut c = server.conn();
    assert!(c.acquire("a", "x", LONG).is_some());
    assert!(c.acquire("b", "y", LONG).is_some());
    let waiter = wait_all(&server, &["a", "b"], "w", LONG, 10_000);
    wait_for_waiters(&server, "a", 1);
    wait_for_waiters(&server, "b", 1);
    // a frees: the waiter holds nothing while b is busy.
    assert_eq!(c.int(&["LOCK.RELEASE", "a", "x"]), 0);
    thread::sleep(Duration::from_millis(50));
    assert_eq!(server.lock_info("a"), None, "no partial hold");
    assert_eq!(c.int(&["LOCK.RELEASE", "b", "y"]), 0);
    let got = fences(&waiter.join().expect("waiter"));
    assert_eq!(owner(&server, "a").as_deref(), Some("w"));
    assert_eq!(owner(&server, "b").as_deref(), Some("w"));
    assert!(got[0] < got[1]);
}

#[test]
fn crossing_key_orders_never_deadlock_and_never_overlap() {
    let server = Server::start();
    let mut admin = server.conn();
    admin.call(&["SET", "inside", "0"]).expect("set");
    let workers: Vec<_> = (0..6)
        .map(|w| {
            let mut conn = server.conn();
            thread::spawn(move || {
                let keys: [&str; 3] = match w % 3 {
                    0 => ["a", "b", "c"],
                    1 => ["c", "b", "a"],
                    _ => ["b", "a", "c"],
                };
                let keys = &keys[..2 + w % 2];
                let owner = format!("w{w}");
                for _ in 0..40 {
                    let got = macquire(&mut conn, keys, &owner, 10_000, &["WAIT", "20000"]);
                    let fences = fences(&got);
                    assert_eq!(fences.len(), keys.len());
                    // Everyone takes b: at most one inside at a time.
                    assert_eq!(conn.int(&["INCR", "inside"]), 1, "{owner} overlaps");
                    assert_eq!(conn.int(&["DECR", "inside"]), 0);
                    let left: Vec<i64> = mrelease(&mut conn, keys, &owner)
                        .map(|v| redis::from_redis_value(v).expect("counts"))
                        .expect("release");
                    assert!(left.iter().all(|&n| n == 0));
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().expect("a worker got every grant");
    }
    for key in ["a", "b", "c"] {
        assert_eq!(server.lock_info(key), None);
    }
}

#[test]
fn a_wide_request_is_not_overtaken_by_narrow_ones() {
    let server = Server::start();
    let mut c = server.conn();
    assert!(c.acquire("a", "x", LONG).is_some());
    let wide = wait_all(&server, &["a", "b", "c"], "wide", LONG, 10_000);
    wait_for_waiters(&server, "c", 1);
    // b and c are free, but the wide request came first: narrow requests
    // for them wait behind it, and a try without WAIT gets nil.
    assert_eq!(c.call(&["LOCK.ACQUIRE", "b", "n0", "1000"]), Ok(Value::Nil));
    let narrow_b = wait_on(server.conn(), "b", "nb", LONG, 10_000);
    let narrow_c = wait_all(&server, &["c"], "nc", LONG, 10_000);
    wait_for_waiters(&server, "b", 2);
    wait_for_waiters(&server, "c", 2);
    assert_eq!(server.lock_info("b"), None);
    assert_eq!(server.lock_info("c"), None);
    assert_eq!(c.int(&["LOCK.RELEASE", "a", "x"]), 0);
    let wide_fences = fences(&wide.join().expect("wide"));
    for key in ["a", "b", "c"] {
        assert_eq!(owner(&server, key).as_deref(), Some("wide"));
    }
    assert_eq!(
        c.value::<Vec<i64>, _>(&["LOCK.MRELEASE", "3", "a", "b", "c", "wide"]),
        [0, 0, 0]
    );
    let b = handed_fence(narrow_b, "nb");
    let cf = fences(&narrow_c.join().expect("nc"));
    assert!(b > wide_fences[2] && cf[0] > wide_fences[2]);
}

#[test]
fn first_come_first_served_across_keys() {
    let server = Server::start();
    let mut c = server.conn();
    assert!(c.acquire("a", "x", LONG).is_some());
    assert!(c.acquire("b", "y", LONG).is_some());
    let first = wait_all(&server, &["a", "b"], "first", LONG, 10_000);
    wait_for_waiters(&server, "b", 1);
    let later = wait_on(server.conn(), "b", "later", LONG, 10_000);
    wait_for_waiters(&server, "b", 2);
    // b frees first: it is not given to the later single request.
    assert_eq!(c.int(&["LOCK.RELEASE", "b", "y"]), 0);
    thread::sleep(Duration::from_millis(50));
    assert_eq!(server.lock_info("b"), None);
    assert_eq!(c.int(&["LOCK.RELEASE", "a", "x"]), 0);
    fences(&first.join().expect("first"));
    assert_eq!(owner(&server, "b").as_deref(), Some("first"));
    assert_eq!(
        c.value::<Vec<i64>, _>(&["LOCK.MRELEASE", "2", "a", "b", "first"]),
        [0, 0]
    );
    handed_fence(later, "later");
}

/// How a waiter for `[a, b]` goes away.
#[derive(Debug, Clone, Copy)]
enum Leave {
    Timeout,
    Unblock,
    Disconnect,
}

#[test]
fn a_multi_waiter_that_leaves_reserves_every_key_it_headed() {
    for how in [Leave::Timeout, Leave::Unblock, Leave::Disconnect] {
        let server = Server::start();
        let mut c = server.conn();
        assert!(c.acquire("a", "x", LONG).is_some());
        let mut conn = server.conn();
        let id = conn.int(&["CLIENT", "ID"]);
        let timeout = match how {
            Leave::Timeout => "300",
            _ => "0",
        };
        let args = macquire_args(&["a", "b", "c"], "m", LONG, &["WAIT", timeout]);
        let multi = thread::spawn(move || conn.call(args));
        wait_for_waiters(&server, "b", 1);
        // b and c are free but taken by nobody: these wait behind it.
        let on_b = wait_on(server.conn(), "b", "sb", LONG, 10_000);
        let on_c = wait_all(&server, &["c"], "sc", LONG, 10_000);
        wait_for_waiters(&server, "b", 2);
        wait_for_waiters(&server, "c", 2);
        let started = Instant::now();
        match how {
            Leave::Timeout => {}
            Leave::Unblock => assert_eq!(c.int(&["CLIENT", "UNBLOCK", &id.to_string()]), 1),
            Leave::Disconnect => {
                assert_eq!(c.int(&["CLIENT", "KILL", "ID", &id.to_string()]), 1)
            }
        }
        handed_fence(on_b, "sb");
        fences(&on_c.join().expect("sc"));
        assert!(started.elapsed() < SOON, "{how:?}: served at once");
        // (A killed connection's thread sees the connection fail.)
        if let (false, Ok(reply)) = (matches!(how, Leave::Disconnect), multi.join()) {
            assert_eq!(reply, Ok(Value::Nil), "{how:?}");
        }
        assert_eq!(owner(&server, "a").as_deref(), Some("x"), "{how:?}");
        assert_eq!(waiters(&server, "a"), 0, "{how:?}: left every queue");
    }
}

#[test]
fn inside_multi_wait_never_blocks() {
    let server = Server::start();
    let mut c = server.conn();
    assert!(c.acquire("b", "x", LONG).is_some());
    let replies: Vec<Value> = redis::pipe()
        .atomic()
        .cmd("LOCK.MACQUIRE")
        .arg(&["2", "a", "b", "o", "1000", "WAIT", "0"])
        .cmd("LOCK.MACQUIRE")
        .arg(&["2", "a", "c", "o", "1000", "WAIT", "0"])
        .query(&mut c)
        .expect("exec");
    assert_eq!(replies[0], Value::Nil);
    assert!(matches!(&replies[1], Value::Array(f) if f.len() == 2));
    assert_eq!(server.lock_info("a").expect("held").owner_text(), "o");
}

/// Each holder of a lock: owner, count, fence.
type Holders = Vec<(String, i64, i64)>;

/// Who holds `key`, with what count and fence, and in which mode.
fn holds(server: &Server, key: &str) -> Option<(String, i64, Holders)> {
    server.lock_info(key).map(|info| {
        let holders = info
            .holders
            .iter()
            .map(|h| (h.owner.clone(), h.count, h.fence));
        (info.mode, info.limit, holders.collect())
    })
}

#[test]
fn a_replica_holds_what_the_master_holds_on_every_key() {
    let master = Server::builder().label("master").start();
    let replica = start_replica(&master, "replica");
    let mut m = master.conn();
    assert!(m.acquire("a", "x", LONG).is_some());
    fences(&macquire(&mut m, &["c", "d"], "o", LONG, &["SHARED"]));
    let mut conn = master.conn();
    let args = macquire_args(&["a", "b", "c"], "w", LONG, &["SHARED", "WAIT", "10000"]);
    let waiter = thread::spawn(move || conn.call(args));
    wait_for_waiters(&master, "a", 1);
    // c is shared, so the shared request waits for a alone.
    assert_eq!(m.int(&["LOCK.RELEASE", "a", "x"]), 0);
    fences(&waiter.join().expect("waiter"));
    m.wait_replicas(1);
    replica.catch_up_with(&master);
    for key in ["a", "b", "c", "d"] {
        assert_eq!(holds(&replica, key), holds(&master, key), "{key}");
    }
    assert_eq!(replica.digest(), master.digest());
    assert_eq!(m.int(&["LOCK.MRENEW", "2", "c", "d", "o", "900000"]), 1);
    mrelease(&mut m, &["a", "b"], "w").expect("release");
    m.wait_replicas(1);
    replica.catch_up_with(&master);
    assert_eq!(replica.digest(), master.digest());
    assert_eq!(replica.lock_info("a"), None);
}

#[test]
fn holds_taken_together_survive_aof_and_rdb_restarts() {
    let mut server = Server::builder().appendonly(false).start();
    let mut c = server.conn();
    fences(&macquire(&mut c, &["a", "b"], "o", LONG, &[]));
    fences(&macquire(
        &mut c,
        &["r", "s"],
        "p",
        LONG,
        &["SHARED", "LIMIT", "3"],
    ));
    let state = |server: &Server| {
        ["a", "b", "r", "s"]
            .iter()
            .map(|key| server.lock_info(key).map(|info| info.holders))
            .collect::<Vec<_>>()
    };
    let want = state(&server);
    server.restart();
    let after = state(&server);
    assert_eq!(after.len(), want.len());
    for (got, want) in after.iter().zip(&want) {
        let owners = |h: &Option<Vec<HolderInfo>>| {
            h.as_ref().map(|h| {
                h.iter()
                    .map(|h| (h.owner.clone(), h.fence))
                    .collect::<Vec<_>>()
            })
        };
        assert_eq!(owners(got), owners(want), "after an AOF restart");
    }
    server.restart_saving();
    let after = state(&server);
    for (got, want) in after.iter().zip(&want) {
        let fences = |h: &Option<Vec<HolderInfo>>| {
            h.as_ref()
                .map(|h| h.iter().map(|h| h.fence).collect::<Vec<_>>())
        };
        assert_eq!(fences(got), fences(want), "after an RDB restart");
    }
}

#[test]
fn the_server_knows_the_keys_of_the_commands() {
    let server = Server::start();
    let mut c = server.conn();
    let keys: Vec<String> = c.value(&[
        "COMMAND",
        "GETKEYS",
        "LOCK.MACQUIRE",
        "3",
        "a",
        "b",
        "c",
        "o",
        "100",
        "WAIT",
        "5",
    ]);
    assert_eq!(keys, ["a", "b", "c"]);
    let keys: Vec<String> = c.value(&["COMMAND", "GETKEYS", "LOCK.MRELEASE", "2", "x", "y", "o"]);
    assert_eq!(keys, ["x", "y"]);
    let keys: Vec<String> = c.value(&["COMMAND", "GETKEYS", "LOCK.MRENEW", "1", "x", "o", "5"]);
    assert_eq!(keys, ["x"]);
}

/// The microseconds the server has spent in `command` so far.
fn usec(admin: &mut redis::Connection, command: &str) -> i64 {
    let info: String = admin.value(&["INFO", "commandstats"]);
    let prefix = format!("cmdstat_{command}:");
    info.lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').find_map(|f| f.strip_prefix("usec=")))
        .and_then(|n| n.parse::<i64>().ok())
        .unwrap_or(0)
}

/// Two keys held together, with `n` clients waiting for both behind.
struct Pair {
    keys: [String; 2],
    holder: String,
    _waiters: Vec<redis::Connection>,
}

impl Pair {
    fn new(server: &Server, admin: &mut redis::Connection, n: usize) -> Pair {
        let keys = [format!("a{n}"), format!("b{n}")];
        let refs = [keys[0].as_str(), keys[1].as_str()];
        let holder = format!("h{n}");
        fences(&macquire(admin, &refs, &holder, LONG, &[]));
        let waiters = (0..n)
            .map(|i| {
                let mut conn = server.conn();
                let args = macquire_args(&refs, &format!("w{n}:{i}"), LONG, &["WAIT", "0"]);
                let mut cmd = redis::cmd(&args[0]);
                cmd.arg(&args[1..]);
                conn.send_packed_command(&cmd.get_packed_command())
                    .expect("send the wait");
                conn
            })
            .collect();
        wait_until(
            &format!("{n} wait on {}", keys[1]),
            Duration::from_secs(60),
            || server.lock_info(&keys[1]).map_or(0, |info| info.waiters) == n as i64,
        );
        Pair {
            keys,
            holder,
            _waiters: waiters,
        }
    }

    /// One release of both keys handing them to the next waiter: its cost.
    fn hand_off(&mut self, server: &Server, admin: &mut redis::Connection) -> i64 {
        let refs = [self.keys[0].as_str(), self.keys[1].as_str()];
        let before = usec(admin, "lock.mrelease");
        mrelease(admin, &refs, &self.holder).expect("release");
        let cost = usec(admin, "lock.mrelease") - before;
        let next = owner(server, refs[0]).expect("handed over");
        assert_eq!(owner(server, refs[1]).as_deref(), Some(next.as_str()));
        self.holder = next;
        cost
    }
}

fn cheapest_quarter(mut costs: Vec<i64>) -> i64 {
    costs.sort_unstable();
    costs[..costs.len() / 4].iter().sum()
}

#[test]
fn a_multi_hand_off_costs_the_same_behind_few_or_many_waiters() {
    let server = Server::start();
    let mut admin = server.conn();
    let mut small = Pair::new(&server, &mut admin, 50);
    let mut large = Pair::new(&server, &mut admin, 800);
    let (mut smalls, mut larges) = (Vec::new(), Vec::new());
    for _ in 0..40 {
        smalls.push(small.hand_off(&server, &mut admin));
        larges.push(large.hand_off(&server, &mut admin));
    }
    let (small, large) = (cheapest_quarter(smalls), cheapest_quarter(larges));
    let ratio = large as f64 / small.max(1) as f64;
    eprintln!("multi hand-off: {small} vs {large} µs (ratio {ratio:.2})");
    assert!(ratio < 2.0, "{large} µs against {small} µs");
}

/// Each holder of `key` with its permits, as `LOCK.INFO` lists them.
fn permits_of(server: &Server, key: &str) -> Vec<(String, i64)> {
    let info: Value = server.conn().call(&["LOCK.INFO", key]).expect("info");
    let field = |pairs: &[Value], name: &str| -> Option<Value> {
        pairs.chunks(2).find_map(|pair| match pair {
            [key, value] if text(key).as_deref() == Some(name) => Some(value.clone()),
            _ => None,
        })
    };
    let Value::Array(pairs) = info else {
        return Vec::new();
    };
    let Some(Value::Array(holders)) = field(&pairs, "holders") else {
        panic!("no holders in {pairs:?}");
    };
    holders
        .iter()
        .map(|holder| {
            let Value::Array(pairs) = holder else {
                panic!("holder {holder:?}");
            };
            let owner = field(pairs, "owner")
                .as_ref()
                .and_then(text)
                .expect("owner");
            let permits = match field(pairs, "permits") {
                Some(Value::Int(k)) => k,
                other => panic!("permits: {other:?}"),
            };
            (owner, permits)
        })
        .collect()
}

fn sem(n: &str, k: &str) -> Vec<String> {
    ["SHARED", "LIMIT", n, "PERMITS", k]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// A blocking `LOCK.ACQUIRE key owner LONG SHARED LIMIT n PERMITS k WAIT
/// 10000` from a thread of its own.
fn wait_permits(server: &Server, key: &str, owner: &str, n: &str, k: &str) -> JoinHandle<Reply> {
    let mut conn = server.conn();
    let mut args = vec![
        "LOCK.ACQUIRE".to_string(),
        key.to_string(),
        owner.to_string(),
    ];
    args.push(LONG.to_string());
    args.extend(sem(n, k));
    args.extend(["WAIT".to_string(), "10000".to_string()]);
    thread::spawn(move || conn.call(args))
}

#[test]
fn permits_are_first_come_first_served_within_the_limit() {
    let server = Server::start();
    let mut c = server.conn();
    let acquire = |c: &mut redis::Connection, owner: &str, k: &str| {
        let mut args = vec!["LOCK.ACQUIRE".to_string(), "pool".into(), owner.into()];
        args.push(LONG.to_string());
        args.extend(sem("4", k));
        c.call(args)
    };
    assert!(matches!(acquire(&mut c, "a", "3"), Ok(Value::Int(_))));
    // Two do not fit beside three: nil, or wait at the head.
    assert_eq!(acquire(&mut c, "x", "2"), Ok(Value::Nil));
    let big = wait_permits(&server, "pool", "big", "4", "2");
    wait_for_waiters(&server, "pool", 1);
    // One would fit, but the big request came first: it waits behind it.
    assert_eq!(acquire(&mut c, "y", "1"), Ok(Value::Nil));
    let small = wait_permits(&server, "pool", "small", "4", "1");
    wait_for_waiters(&server, "pool", 2);
    thread::sleep(Duration::from_millis(50));
    assert_eq!(permits_of(&server, "pool"), [("a".to_string(), 3)]);
    // The hold keeps its permits: a reentry asking for others is refused.
    let refused = acquire(&mut c, "a", "1").expect_err("other permits");
    assert!(refused.contains("PERMITS"), "{refused}");
    assert!(matches!(acquire(&mut c, "a", "3"), Ok(Value::Int(_))));
    assert_eq!(c.int(&["LOCK.RELEASE", "pool", "a", "ALL"]), 0);
    handed_fence(big, "big");
    handed_fence(small, "small");
    assert_eq!(
        permits_of(&server, "pool"),
        [("big".to_string(), 2), ("small".to_string(), 1)]
    );
    // Without PERMITS a share is one permit; errors change nothing.
    let bad = acquire(&mut c, "z", "5").expect_err("above the limit");
    assert!(bad.starts_with("ERR PERMITS"), "{bad}");
    let bad = c.err(&[
        "LOCK.ACQUIRE",
        "pool",
        "z",
        "1000",
        "SHARED",
        "PERMITS",
        "1",
    ]);
    assert_eq!(bad, "ERR syntax error");
    assert!(matches!(
        c.call(&[
            "LOCK.ACQUIRE",
            "pool",
            "one",
            "1000",
            "SHARED",
            "LIMIT",
            "4"
        ]),
        Ok(Value::Int(_))
    ));
    assert_eq!(acquire(&mut c, "w", "1"), Ok(Value::Nil), "4 of 4 held");
    let held: i64 = permits_of(&server, "pool").iter().map(|(_, k)| k).sum();
    assert_eq!(held, 4);
}

#[test]
fn several_keys_with_permits_all_or_none() {
    let server = Server::start();
    let mut c = server.conn();
    let mut args = macquire_args(&["p", "q"], "a", LONG, &[]);
    args.extend(sem("3", "2"));
    fences(&c.call(args.clone()));
    let mut b = macquire_args(&["p", "q"], "b", LONG, &[]);
    b.extend(sem("3", "2"));
    assert_eq!(c.call(b), Ok(Value::Nil), "2 + 2 > 3 on both");
    assert_eq!(permits_of(&server, "q"), [("a".to_string(), 2)]);
}

#[test]
fn permits_reach_replicas_files_and_digests() {
    let mut master = Server::builder().label("master").appendonly(false).start();
    let replica = start_replica(&master, "replica");
    let mut m = master.conn();
    let mut args = vec![
        "LOCK.ACQUIRE".to_string(),
        "s".into(),
        "a".into(),
        LONG.to_string(),
    ];
    args.extend(sem("5", "3"));
    m.call(args).expect("a");
    let mut args = vec![
        "LOCK.ACQUIRE".to_string(),
        "s".into(),
        "b".into(),
        LONG.to_string(),
    ];
    args.extend(sem("5", "2"));
    m.call(args).expect("b");
    let want = vec![("a".to_string(), 3), ("b".to_string(), 2)];
    m.wait_replicas(1);
    replica.catch_up_with(&master);
    assert_eq!(permits_of(&replica, "s"), want, "on the replica");
    assert_eq!(replica.digest(), master.digest());
    drop(replica);
    master.restart();
    assert_eq!(permits_of(&master, "s"), want, "after an AOF restart");
    let mut c = master.conn();
    c.call(&["BGREWRITEAOF"]).expect("rewrite");
    master.wait_for_aof_rewrite();
    master.restart();
    assert_eq!(permits_of(&master, "s"), want, "after a rewritten AOF");
    master.restart_saving();
    assert_eq!(permits_of(&master, "s"), want, "after an RDB restart");
    let mut c = master.conn();
    c.call(&["DEBUG", "RELOAD"]).expect("reload");
    assert_eq!(permits_of(&master, "s"), want, "after DEBUG RELOAD");
    let dump: Vec<u8> = redis::cmd("DUMP").arg("s").query(&mut c).expect("dump");
    redis::cmd("RESTORE")
        .arg("t")
        .arg(0)
        .arg(dump)
        .query::<()>(&mut c)
        .expect("restore");
    assert_eq!(permits_of(&master, "t"), want, "after DUMP/RESTORE");
}
