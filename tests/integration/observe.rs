//! Watching a lock: `LOCK.QUEUE` (who waits, in line, for how long) and
//! `INFO lock`'s `wait_usec` and `hold_usec` latency lines.

use std::thread;
use std::time::{Duration, Instant};

use redis::{Connection, Value};

use crate::harness::{start_replica, text, wait_on, wait_until, Call, Server, LONG};

/// One `LOCK.QUEUE` entry.
#[derive(Debug, Clone, PartialEq)]
struct Queued {
    client: i64,
    owner: String,
    mode: String,
    waited: i64,
    timeout: i64,
}

/// An entry's fields by name, from a RESP3 map or a RESP2 flat array;
/// `map` says which shape the entry must have.
fn fields(entry: &Value, map: bool) -> Vec<(String, Value)> {
    let pairs: Vec<(Value, Value)> = match (entry, map) {
        (Value::Map(pairs), true) => pairs.clone(),
        (Value::Array(flat), false) if flat.len() % 2 == 0 => flat
            .chunks(2)
            .map(|pair| (pair[0].clone(), pair[1].clone()))
            .collect(),
        other => panic!("LOCK.QUEUE entry of the wrong shape (map: {map}): {other:?}"),
    };
    pairs
        .into_iter()
        .map(|(name, value)| (text(&name).expect("a field name"), value))
        .collect()
}

/// `LOCK.QUEUE key` read entry by entry, checking the fields' names and order.
fn queue(c: &mut Connection, key: &str, map: bool) -> Vec<Queued> {
    let reply = c.call(&["LOCK.QUEUE", key]);
    let Ok(Value::Array(entries)) = reply else {
        panic!("LOCK.QUEUE {key}: {reply:?}");
    };
    entries
        .iter()
        .map(|entry| {
            let fields = fields(entry, map);
            let names: Vec<&str> = fields.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(names, ["client", "owner", "mode", "waited", "timeout"]);
            let int = |i: usize| match &fields[i].1 {
                Value::Int(n) => *n,
                other => panic!("{}: not an integer: {other:?}", fields[i].0),
            };
            Queued {
                client: int(0),
                owner: text(&fields[1].1).expect("owner"),
                mode: text(&fields[2].1).expect("mode"),
                waited: int(3),
                timeout: int(4),
            }
        })
        .collect()
}

fn owners(line: &[Queued]) -> Vec<&str> {
    line.iter().map(|q| q.owner.as_str()).collect()
}

/// A connection and its client id.
fn client(server: &Server) -> (Connection, i64) {
    let mut c = server.conn();
    let id = c.int(&["CLIENT", "ID"]);
    (c, id)
}

/// Sends `LOCK.ACQUIRE key owner ttl [SHARED] WAIT timeout` on `c` from a
/// thread, and waits until the lock's queue is `before + 1` long.
fn join(
    server: &Server,
    c: Connection,
    key: &str,
    owner: &str,
    shared: bool,
    timeout_ms: i64,
) -> thread::JoinHandle<Result<Value, String>> {
    let mut watch = server.conn();
    let before = queue(&mut watch, key, false).len();
    let waiter = if shared {
        let args: Vec<String> = [key, owner, "60000", "SHARED", "WAIT"]
            .iter()
            .map(|s| s.to_string())
            .chain([timeout_ms.to_string()])
            .collect();
        let mut c = c;
        thread::spawn(move || {
            let mut full = vec!["LOCK.ACQUIRE".to_string()];
            full.extend(args);
            c.call(&full)
        })
    } else {
        wait_on(c, key, owner, LONG, timeout_ms)
    };
    wait_until(
        &format!("{owner} waits on {key}"),
        Duration::from_secs(5),
        || queue(&mut watch, key, false).len() == before + 1,
    );
    waiter
}

#[test]
fn the_queue_lists_waiters_in_line_with_their_mode_and_times_as_they_join_and_leave() {
    let server = Server::start();
    let mut admin = server.conn();
    admin.acquire("k", "alice", LONG).expect("free");
    assert_eq!(queue(&mut admin, "k", false), []);

    let (b, bob) = client(&server);
    let bob_waits = join(&server, b, "k", "bob", false, 0);
    let (c, carol) = client(&server);
    let carol_waits = join(&server, c, "k", "carol", true, 30_000);
    let (d, dave) = client(&server);
    let _dave_waits = join(&server, d, "k", "dave", false, 20_000);
    let (e, _erin) = client(&server);
    let erin_waits = join(&server, e, "k", "erin", true, 300);

    let line = queue(&mut admin, "k", false);
    assert_eq!(owners(&line), ["bob", "carol", "dave", "erin"]);
    let ids: Vec<i64> = line.iter().map(|q| q.client).collect();
    assert_eq!(&ids[..3], [bob, carol, dave]);
    let modes: Vec<&str> = line.iter().map(|q| q.mode.as_str()).collect();
    assert_eq!(modes, ["exclusive", "shared", "exclusive", "shared"]);
    assert_eq!(line[0].timeout, -1, "WAIT 0 has no timeout");
    assert!(line[1].timeout > 0 && line[1].timeout <= 30_000, "{line:?}");
    assert!(line[2].timeout > 0 && line[2].timeout <= 20_000, "{line:?}");
    // First in line has waited longest.
    assert!(
        line.windows(2).all(|w| w[0].waited >= w[1].waited),
        "{line:?}"
    );

    // Erin's timeout runs out: she leaves the line, nil.
    assert_eq!(erin_waits.join().expect("erin"), Ok(Value::Nil));
    let line = queue(&mut admin, "k", false);
    assert_eq!(owners(&line), ["bob", "carol", "dave"]);

    // Time passes: waited grows, timeout counts down.
    let first = line.clone();
    wait_until("time passes in the queue", Duration::from_secs(5), || {
        let now = queue(&mut admin, "k", false);
        now[0].waited >= first[0].waited + 20 && now[2].timeout <= first[2].timeout - 20
    });
    let now = queue(&mut admin, "k", false);
    assert_eq!(now[0].timeout, -1);
    assert!(now[1].timeout < first[1].timeout, "{first:?} then {now:?}");

    // Dave disconnects: gone from the line at once.
    assert_eq!(
        admin.int(&["CLIENT", "KILL", "ID", &dave.to_string()]),
        1,
        "CLIENT KILL dave"
    );
    wait_until("dave leaves the line", Duration::from_secs(5), || {
        owners(&queue(&mut admin, "k", false)) == ["bob", "carol"]
    });

    // Alice releases: bob holds it, carol (shared) waits for him.
    assert_eq!(admin.int(&["LOCK.RELEASE", "k", "alice"]), 0);
    assert!(matches!(bob_waits.join().expect("bob"), Ok(Value::Int(_))));
    let line = queue(&mut admin, "k", false);
    assert_eq!(owners(&line), ["carol"]);
    assert_eq!(line[0].client, carol);
    assert_eq!(admin.int(&["LOCK.RELEASE", "k", "bob"]), 0);
    assert!(matches!(
        carol_waits.join().expect("carol"),
        Ok(Value::Int(_))
    ));
    assert_eq!(queue(&mut admin, "k", false), []);
}

#[test]
fn the_queue_is_a_map_per_waiter_under_resp3() {
    let server = Server::start();
    let mut c = server.conn_resp3();
    c.acquire("k", "alice", LONG).expect("free");
    let (b, bob) = client(&server);
    let bob_waits = join(&server, b, "k", "bob", false, 10_000);
    let line = queue(&mut c, "k", true);
    assert_eq!(owners(&line), ["bob"]);
    assert_eq!(line[0].client, bob);
    assert_eq!(line[0].mode, "exclusive");
    assert!(line[0].timeout > 0 && line[0].timeout <= 10_000);
    // RESP2 on the same server: flat arrays, same entries.
    let mut two = server.conn();
    assert_eq!(owners(&queue(&mut two, "k", false)), ["bob"]);
    c.int(&["LOCK.RELEASE", "k", "alice"]);
    assert!(matches!(bob_waits.join().expect("bob"), Ok(Value::Int(_))));
}

#[test]
fn a_free_lock_or_a_missing_key_has_an_empty_queue_and_another_type_is_wrongtype() {
    let server = Server::start();
    let mut c = server.conn();
    assert_eq!(queue(&mut c, "missing", false), []);
    c.acquire("held", "alice", LONG).expect("free");
    assert_eq!(queue(&mut c, "held", false), []);
    let _: () = c.value(&["SET", "s", "x"]);
    let err = c.err(&["LOCK.QUEUE", "s"]);
    assert!(err.starts_with("WRONGTYPE"), "{err}");
    let err = c.err(&["LOCK.INFO", "s"]);
    assert!(err.starts_with("WRONGTYPE"), "LOCK.INFO agrees: {err}");
    let err = c.err(&["LOCK.QUEUE", "k", "extra"]);
    assert!(err.starts_with("ERR syntax"), "{err}");
}

#[test]
fn a_user_with_read_access_to_the_keys_may_watch_locks_but_not_take_them() {
    let server = Server::start();
    let mut admin = server.conn();
    admin.acquire("lock:a", "alice", LONG).expect("free");
    let (b, _) = client(&server);
    let bob_waits = join(&server, b, "lock:a", "bob", false, 10_000);
    let reply: String = admin.value(&[
        "ACL",
        "SETUSER",
        "watcher",
        "on",
        ">pw",
        "%R~lock:*",
        "+@all",
    ]);
    assert_eq!(reply, "OK");
    let mut watcher = server.conn();
    let reply: String = watcher.value(&["AUTH", "watcher", "pw"]);
    assert_eq!(reply, "OK");

    assert_eq!(owners(&queue(&mut watcher, "lock:a", false)), ["bob"]);
    let info = watcher.lock_info("lock:a").expect("held");
    assert_eq!(info.owner_text(), "alice");
    for args in [
        &["LOCK.ACQUIRE", "lock:b", "w", "1000"][..],
        &["LOCK.RELEASE", "lock:a", "alice"],
        &["LOCK.QUEUE", "other"],
    ] {
        let err = watcher.err(args);
        assert!(err.starts_with("NOPERM"), "{args:?}: {err}");
    }
    admin.int(&["LOCK.RELEASE", "lock:a", "alice"]);
    assert!(matches!(bob_waits.join().expect("bob"), Ok(Value::Int(_))));
}

#[test]
fn command_docs_describe_lock_queue() {
    let server = Server::start();
    let mut c = server.conn();
    let reply = c.call(&["COMMAND", "DOCS", "lock.queue"]).expect("docs");
    let shown = format!("{reply:?}");
    for part in ["waiting on a lock", "O(N)", "0.1.0", "key"] {
        assert!(
            shown.contains(part),
            "COMMAND DOCS lock.queue lacks {part}: {shown}"
        );
    }
}

/// `INFO lock`'s latency line `name`: (p50, p99, p99.9, count).
fn latency(server: &Server, name: &str) -> (f64, f64, f64, u64) {
    let line = server.info_field("lock", &format!("lock_{name}"));
    let mut parts = line.split(',').map(|part| {
        let (_, value) = part
            .split_once('=')
            .unwrap_or_else(|| panic!("{name}: {line}"));
        value.to_string()
    });
    let mut next = || -> String { parts.next().unwrap_or_else(|| panic!("{name}: {line}")) };
    let p50 = next().parse().expect("p50");
    let p99 = next().parse().expect("p99");
    let p999 = next().parse().expect("p99.9");
    let count = next().parse().expect("count");
    assert_eq!(
        line,
        format!("p50={p50:.3},p99={p99:.3},p99.9={p999:.3},count={count}"),
        "{name} in latencystats form"
    );
    (p50, p99, p999, count)
}

/// A hold of at least `ms` on `key`: (held at least, held at most) in µs
/// as the client saw it — the server's hold lies between.
fn hold_for(c: &mut Connection, key: &str, ms: u64) -> (f64, f64) {
    let sent = Instant::now();
    c.acquire(key, "holder", LONG).expect("free");
    let granted = Instant::now();
    thread::sleep(Duration::from_millis(ms));
    let releasing = Instant::now();
    assert_eq!(c.int(&["LOCK.RELEASE", key, "holder"]), 0);
    let released = Instant::now();
    let inner = releasing.duration_since(granted).as_micros() as f64;
    let outer = released.duration_since(sent).as_micros() as f64;
    (inner, outer)
}

#[test]
fn hold_usec_reports_how_long_holds_lasted_within_what_the_client_saw() {
    let server = Server::start();
    let mut c = server.conn();
    assert_eq!(latency(&server, "hold_usec"), (0.0, 0.0, 0.0, 0));
    assert_eq!(latency(&server, "wait_usec"), (0.0, 0.0, 0.0, 0));
    let short: Vec<(f64, f64)> = (0..3).map(|_| hold_for(&mut c, "k", 50)).collect();
    let long = hold_for(&mut c, "k", 200);
    let (p50, p99, p999, count) = latency(&server, "hold_usec");
    assert_eq!(count, 4);
    // p50 is one of the short holds, p99 and p99.9 the long one (1% error).
    let low = short.iter().map(|s| s.0).fold(f64::MAX, f64::min);
    let high = short.iter().map(|s| s.1).fold(0.0, f64::max);
    assert!(
        p50 >= low * 0.99 && p50 <= high * 1.01,
        "p50 {p50} not in {low}..{high}"
    );
    for p in [p99, p999] {
        assert!(
            p >= long.0 * 0.99 && p <= long.1 * 1.01,
            "{p} not in {}..{}",
            long.0,
            long.1
        );
    }
    assert_eq!(latency(&server, "wait_usec").3, 0, "nobody waited");
}

#[test]
fn wait_usec_reports_how_long_granted_waits_waited() {
    let server = Server::start();
    let mut alice = server.conn();
    alice.acquire("k", "alice", LONG).expect("free");
    let (b, _) = client(&server);
    let queued = Instant::now();
    let bob_waits = join(&server, b, "k", "bob", false, 10_000);
    // Bob waited at least from when he was seen in line until the release
    // was sent, and at most from before he asked until its reply came.
    let seen = Instant::now();
    thread::sleep(Duration::from_millis(100));
    let releasing = Instant::now();
    assert_eq!(alice.int(&["LOCK.RELEASE", "k", "alice"]), 0);
    let released = Instant::now();
    assert!(matches!(bob_waits.join().expect("bob"), Ok(Value::Int(_))));
    let (inner, outer) = (
        releasing.duration_since(seen).as_micros() as f64,
        released.duration_since(queued).as_micros() as f64,
    );
    let (p50, _, _, count) = latency(&server, "wait_usec");
    assert_eq!(count, 1);
    assert!(
        p50 >= inner * 0.99 && p50 <= outer * 1.01,
        "{p50} not in {inner}..{outer}"
    );
    assert_eq!(server.info_int("lock", "lock_handoffs"), 1);
    // A wait that timed out was not granted: not counted.
    let (d, _) = client(&server);
    let dave = join(&server, d, "k", "dave", false, 50);
    assert_eq!(dave.join().expect("dave"), Ok(Value::Nil));
    assert_eq!(latency(&server, "wait_usec").3, 1);
    // Alice's hold ended at her release (bob's goes on).
    assert_eq!(latency(&server, "hold_usec").3, 1);
}

#[test]
fn every_way_a_hold_ends_counts_once_and_only_holds_granted_here_count() {
    let server = Server::start();
    let replica = start_replica(&server, "replica");
    let mut c = server.conn();
    let ended = |server: &Server| latency(server, "hold_usec").3;

    // Reentry, renewal and a raised fence end nothing.
    let fence = c.acquire("a", "alice", LONG).expect("free");
    c.acquire("a", "alice", LONG).expect("reentry");
    c.int(&["LOCK.RENEW", "a", "alice", "60000"]);
    c.int(&["LOCK.FENCE", "a", "alice", &(fence + 1000).to_string()]);
    c.int(&["LOCK.RELEASE", "a", "alice"]);
    assert_eq!(ended(&server), 0);
    // Release to zero (after a raised fence).
    c.int(&["LOCK.RELEASE", "a", "alice"]);
    assert_eq!(ended(&server), 1);
    // DEL.
    c.acquire("b", "bob", LONG).expect("free");
    assert_eq!(c.int(&["DEL", "b"]), 1);
    assert_eq!(ended(&server), 2);
    // An overwrite.
    c.acquire("b", "bob", LONG).expect("free");
    let _: () = c.value(&["SET", "b", "x"]);
    assert_eq!(ended(&server), 3);
    // A lease end: counted up to the lease end even if the key goes later.
    c.acquire("e", "erin", 100).expect("free");
    wait_until("erin's lease ends", Duration::from_secs(5), || {
        c.int(&["EXISTS", "e"]) == 0
    });
    assert_eq!(ended(&server), 4);
    // One reader of three leaves; the others go with FLUSHALL, as does an
    // exclusive lock: one count per hold.
    for owner in ["r1", "r2", "r3"] {
        let reply = c.call(&["LOCK.ACQUIRE", "r", owner, "60000", "SHARED"]);
        assert!(matches!(reply, Ok(Value::Int(_))), "{owner}: {reply:?}");
    }
    let r1 = c.int(&["LOCK.ACQUIRE", "r", "r1", "60000", "SHARED"]);
    let raised = c.int(&["LOCK.FENCE", "r", "r1", &(r1 + 5000).to_string()]);
    assert_eq!(raised, r1 + 5000);
    assert_eq!(ended(&server), 4, "a reader's raised fence ends nothing");
    c.int(&["LOCK.RELEASE", "r", "r2"]);
    assert_eq!(ended(&server), 5);
    c.acquire("x", "xavier", LONG).expect("free");
    c.wait_replicas(1);
    let _: () = c.value(&["FLUSHALL"]);
    // Valkey 8 and later flush asynchronously by default
    // (`lazyfree-lazy-user-flush yes`): the values are freed, and their holds
    // end, on the lazy-free thread, soon after the reply.
    wait_until("the flushed holds end", Duration::from_secs(5), || {
        ended(&server) >= 8
    });
    assert_eq!(ended(&server), 8);
    assert!(latency(&server, "hold_usec").0 > 0.0);

    // The replica stored every one of those holds and saw each end: none
    // was granted there.
    replica.catch_up_with(&server);
    assert_eq!(latency(&replica, "hold_usec").3, 0);
    assert_eq!(latency(&replica, "wait_usec").3, 0);
    // Nor are holds that arrive by RESTORE.
    c.acquire("d", "dora", LONG).expect("free");
    let dump: Vec<u8> = c.value(&["DUMP", "d"]);
    let _: () = c.value(&["FLUSHALL"]);
    // Freed on Valkey's lazy-free thread, as above.
    wait_until("the flushed hold ends", Duration::from_secs(5), || {
        ended(&server) >= 9
    });
    assert_eq!(ended(&server), 9);
    let _: () = redis::cmd("RESTORE")
        .arg("d")
        .arg(0)
        .arg(dump)
        .query(&mut c)
        .expect("RESTORE");
    assert_eq!(c.int(&["DEL", "d"]), 1);
    assert_eq!(ended(&server), 9);
}

#[test]
fn a_hold_whose_lease_ran_out_counts_up_to_its_lease_end_not_to_the_key_going() {
    let server = Server::start();
    let mut c = server.conn();
    // Nobody waits and nothing reads the key (`INFO` does not), so nothing
    // looks at the lock at its lease end: Redis deletes the key when its
    // expiry cycle finds it, often tens of ms after.
    c.acquire("e", "erin", 150).expect("free");
    wait_until("erin's hold is counted", Duration::from_secs(5), || {
        latency(&server, "hold_usec").3 == 1
    });
    let (p50, _, _, count) = latency(&server, "hold_usec");
    assert_eq!(count, 1);
    // The lease is in whole ms of the wall clock, the length in µs of a
    // monotonic one: a few ms either way, and the histogram's 1%.
    assert!(
        (147_000.0 * 0.99..=153_000.0 * 1.01).contains(&p50),
        "a 150 ms lease counted as {p50} µs"
    );
}
