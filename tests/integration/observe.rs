//! Watching a lock: `LOCK.QUEUE` (who waits, in line, for how long).

use std::thread;
use std::time::Duration;

use redis::{Connection, Value};

use crate::harness::{text, wait_on, wait_until, Call, Server, LONG};

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
