//! What differs between the servers the suites run on — Redis 7.0, Valkey
//! 8.1, Redis 8.2, Valkey 9.1 — and what the module does on each. Every test
//! runs on every server and asserts the behaviour that server has: where a
//! command does not exist there, that the server refuses it as unknown.
//!
//! - Redis 8.2 adds the `overwritten` and `type_changed` notifications (all
//!   four send `new`). The module listens to none of them: replacing a lock
//!   never frees the key, and every way a key goes or a lock arrives is heard
//!   on the four alike (`del`, `expired`, `evicted`, `rename_*`, `move_*`,
//!   `restore`, `copy_to`, flushes).
//! - Valkey 9.1 has `DELIFEQ`; Redis 8.4 and Valkey 9.2 add `DELEX`: string
//!   commands, so a lock is `WRONGTYPE` to them.
//! - Redis 8.2 and Valkey 9.1 expire hash fields, and delete a hash when its
//!   last field goes; Redis also when a read finds the field expired, Valkey
//!   only in its expiry cycle.
//! - An expiry time already past: Valkey deletes the key at once and says
//!   `expired`; Redis says `del`, or (`SET … PXAT`) `set` and `expire` and
//!   keeps the expired string for the next read.
//! - Redis 7.2+ and Valkey run a module's post-notification jobs right after
//!   the command; Redis 7.0 has none, and the module uses a 0 ms timer.
//! - A `CLIENT UNBLOCK` that meets a client the module has just granted
//!   reaches the module by different paths (see the module docs of
//!   `src/ffi/host.rs`), with the same outcome on all four.

use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use redis::{Connection, Value};

use crate::harness::{
    handed_fence, keyevent_listener, now_ms, text, wait_args, wait_on, wait_until, Call, LockInfo,
    Reply, Server, CLOCK_SHIFT, LONG,
};

/// How long a test waits for something that should happen at once.
const SOON: Duration = Duration::from_secs(5);

/// How long a test watches for something that must not happen.
const A_WHILE: Duration = Duration::from_millis(200);

/// The server under test: which one, and what it has.
#[derive(Debug, Clone, Copy)]
struct Kind {
    valkey: bool,
    /// Major and minor version (Valkey's own, not the Redis version it
    /// reports for compatibility).
    version: (u32, u32),
}

impl Kind {
    fn of(c: &mut Connection) -> Kind {
        let info: String = c.value(&["INFO", "server"]);
        let field = |name: &str| {
            info.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
                .map(|v| v.trim().to_string())
        };
        let (valkey, version) = match field("valkey_version") {
            Some(version) => (true, version),
            None => (false, field("redis_version").expect("redis_version")),
        };
        let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
        let version = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        Kind { valkey, version }
    }

    /// At least Redis `redis` or Valkey `valkey` (`None`: no Valkey).
    fn since(&self, redis: (u32, u32), valkey: Option<(u32, u32)>) -> bool {
        if self.valkey {
            valkey.is_some_and(|v| self.version >= v)
        } else {
            self.version >= redis
        }
    }

    fn name(&self) -> String {
        let (major, minor) = self.version;
        let name = if self.valkey { "Valkey" } else { "Redis" };
        format!("{name} {major}.{minor}")
    }

    /// Post-notification jobs (the module's hand-off after `DEL` & co. runs
    /// right after that command).
    fn runs_jobs(&self) -> bool {
        self.since((7, 2), Some((7, 2)))
    }

    /// The `overwritten` (class `o`) and `type_changed` (`c`) notifications.
    fn overwrite_events(&self) -> bool {
        self.since((8, 2), None)
    }

    /// `HSET`'s fields can expire (`HPEXPIRE` & co.).
    fn field_ttl(&self) -> bool {
        self.since((7, 4), Some((9, 0)))
    }

    /// `DELIFEQ`: Valkey only.
    fn delifeq(&self) -> bool {
        self.valkey && self.version >= (9, 0)
    }

    /// `DELEX`.
    fn delex(&self) -> bool {
        self.since((8, 4), Some((9, 2)))
    }
}

/// Asserts that `command` was refused as unknown on `kind`, which lacks it.
fn assert_unknown(kind: Kind, command: &str, error: &str) {
    assert!(
        error.starts_with("ERR unknown command"),
        "{}: {command} should be an unknown command there, got {error}",
        kind.name()
    );
}

fn lock_int(c: &mut Connection, field: &str) -> i64 {
    c.info_int("lock", &format!("lock_{field}"))
}

/// Starts bob waiting on `key` (no limit) and returns once the server shows
/// one more client waiting.
fn bob_waits(server: &Server, key: &str) -> JoinHandle<Reply> {
    let mut watch = server.conn();
    let before = lock_int(&mut watch, "waiting");
    let bob = wait_on(server.conn(), key, "bob", LONG, 0);
    wait_until(&format!("bob waits on {key}"), SOON, || {
        lock_int(&mut watch, "waiting") == before + 1
    });
    bob
}

/// Asserts that bob is still waiting, a while after something that must not
/// serve him.
fn assert_still_waiting(bob: &JoinHandle<Reply>, c: &mut Connection, after: &str) {
    thread::sleep(A_WHILE);
    assert!(!bob.is_finished(), "bob was answered after {after}");
    assert_eq!(lock_int(c, "waiting"), 1, "INFO lock_waiting after {after}");
}

/// Every keyspace notification class `kind` has, so that the tests run with
/// all of them on (the module's own subscription does not depend on it).
fn every_class(kind: Kind) -> &'static str {
    if kind.overwrite_events() {
        "KEAnoc"
    } else {
        "KEAn"
    }
}

/// A key's `DUMP` payload.
fn dump(c: &mut Connection, key: &str) -> Vec<u8> {
    match c.call(&["DUMP", key]) {
        Ok(Value::BulkString(payload)) => payload,
        other => panic!("DUMP {key}: {other:?}"),
    }
}

// ---------------------------------------------------------------------------
// A lock replaced by another type: the new notifications.
// ---------------------------------------------------------------------------

/// The ways other commands replace a lock with a value of another type
/// (each round on its own key, with `{s}` a string and `{h}` a hash made for
/// it, `{payload}` the string's `DUMP`).
const REPLACEMENTS: &[(&str, &[&[&str]])] = &[
    ("SET", &[&["SET", "{key}", "a string"]]),
    (
        // The second: `overwritten` without `type_changed` on Redis 8.2.
        "SET twice",
        &[&["SET", "{key}", "a string"], &["SET", "{key}", "another"]],
    ),
    (
        "RESTORE REPLACE",
        &[&["RESTORE", "{key}", "0", "{payload}", "REPLACE"]],
    ),
    ("COPY REPLACE", &[&["COPY", "{s}", "{key}", "REPLACE"]]),
    ("RENAME a string", &[&["RENAME", "{s}", "{key}"]]),
    ("RENAME a hash", &[&["RENAME", "{h}", "{key}"]]),
];

/// A lock replaced by a string or a hash — whatever notifications the server
/// sends for it (Redis 8.2 adds `overwritten` and `type_changed`) — keeps its
/// waiters waiting while the other value occupies the key, and serves them
/// once it is deleted. The lock's value is freed once (`lock_held` drops by
/// one), nothing counts as a lease that ended, and the hand-off counts once.
#[test]
fn a_lock_replaced_by_another_type_keeps_its_waiters_until_that_key_is_gone() {
    let server = Server::start();
    let mut c = server.conn();
    let kind = Kind::of(&mut c);
    let _: () = c.value(&["CONFIG", "SET", "notify-keyspace-events", every_class(kind)]);
    for (round, (how, commands)) in REPLACEMENTS.iter().enumerate() {
        let context = format!("{} {how}", kind.name());
        let (key, s, h) = (
            format!("k{round}"),
            format!("s{round}"),
            format!("h{round}"),
        );
        let _: () = c.value(&["SET", &s, "a string"]);
        let _: i64 = c.value(&["HSET", &h, "field", "value"]);
        let payload = dump(&mut c, &s);
        let alice = c.acquire(&key, "alice", LONG).expect("free");
        let bob = bob_waits(&server, &key);
        assert_eq!(lock_int(&mut c, "held"), 1, "{context}: held before");

        for command in commands.iter() {
            let mut cmd = redis::cmd(command[0]);
            for arg in &command[1..] {
                match *arg {
                    "{key}" => cmd.arg(&key),
                    "{s}" => cmd.arg(&s),
                    "{h}" => cmd.arg(&h),
                    "{payload}" => cmd.arg(&payload),
                    word => cmd.arg(word),
                };
            }
            let replaced: Value = cmd
                .query(&mut c)
                .unwrap_or_else(|e| panic!("{context}: {e}"));
            assert!(
                matches!(replaced, Value::Okay | Value::Int(1)),
                "{context}: {replaced:?}"
            );
        }
        assert_still_waiting(&bob, &mut c, &context);
        assert_eq!(
            lock_int(&mut c, "held"),
            0,
            "{context}: held while replaced"
        );
        let refused = c.err(&["LOCK.ACQUIRE", &key, "carol", "1000"]);
        assert!(refused.starts_with("WRONGTYPE"), "{context}: {refused}");

        assert_eq!(c.int(&["DEL", &key]), 1, "{context}: DEL");
        let fence = handed_fence(bob, &context);
        assert!(fence > alice, "{context}: bob's fence {fence} <= {alice}");
        let info = c.lock_info(&key).expect("bob holds the key");
        assert_eq!(info.held(), (b"bob".to_vec(), 1, fence), "{context}");
        assert_eq!(lock_int(&mut c, "held"), 1, "{context}: held after");
        assert_eq!(lock_int(&mut c, "handoffs"), round as i64 + 1, "{context}");
        assert_eq!(lock_int(&mut c, "expired_held"), 0, "{context}");
        assert_eq!(c.int(&["LOCK.RELEASE", &key, "bob"]), 0, "{context}");
        let _: i64 = c.value(&["DEL", &s, &h]);
    }
}

/// A lock restored over a lock with `RESTORE … REPLACE` (the same type:
/// `overwritten` alone on Redis 8.2) is a new hold: waiters keep waiting for
/// its lease, then are served. Each lease that ended while held counts once:
/// the restored hold (ended by the module's hand-off) and its source (ended
/// by the server's expiry).
#[test]
fn a_lock_restored_over_a_lock_is_waited_for_and_each_lease_end_counts_once() {
    let server = Server::start();
    let mut c = server.conn();
    let kind = Kind::of(&mut c);
    let _: () = c.value(&["CONFIG", "SET", "notify-keyspace-events", every_class(kind)]);
    let alice = c.acquire("k", "alice", LONG).expect("free");
    let carol = c.acquire("src", "carol", 400).expect("free");
    let bob = bob_waits(&server, "k");
    let payload = dump(&mut c, "src");
    let _: () = redis::cmd("RESTORE")
        .arg(&["k", "0"])
        .arg(&payload)
        .arg("REPLACE")
        .query(&mut c)
        .expect("RESTORE k 0 <src's payload> REPLACE");
    let info = c.lock_info("k").expect("k holds carol's lock");
    assert_eq!(
        (info.held(), info.waiters),
        ((b"carol".to_vec(), 1, carol), 1),
        "{}: k after the RESTORE",
        kind.name()
    );
    assert!(info.ttl > 0, "the restored lease was put back: {info:?}");
    assert_eq!(
        lock_int(&mut c, "held"),
        2,
        "alice's lock freed, one restored"
    );
    let lease_end = c.int(&["PEXPIRETIME", "k"]);

    let fence = handed_fence(bob, "bob");
    assert!(fence > carol && carol > alice);
    assert!(
        fence >> CLOCK_SHIFT >= lease_end,
        "bob was granted k at {}, before the restored lease ended at {lease_end}",
        fence >> CLOCK_SHIFT
    );
    // `src` ends at the same time: the read expires it if the server's
    // cycle has not yet.
    assert_eq!(c.int(&["EXISTS", "src"]), 0);
    assert_eq!(lock_int(&mut c, "held"), 1);
    assert_eq!(lock_int(&mut c, "expired_held"), 2);
    assert_eq!(lock_int(&mut c, "handoffs"), 1);
    thread::sleep(A_WHILE);
    assert_eq!(lock_int(&mut c, "expired_held"), 2, "counted again later");
}

/// An expiry time already past, on a lock or on a string written over it,
/// frees the key at once, and the waiter is served at once, on every server —
/// though they say it differently. Valkey deletes the key in that command
/// and sends `expired`; Redis sends `del` for `PEXPIRE` and, for `SET … PXAT`,
/// `set` and `expire`, keeping the expired string until a read finds it.
/// The module's own read on `expire` is that read: on Redis 7.0 it deleted
/// the string inside the module's notification callback, whose nested
/// `expired` the server does not send back to the module, and the waiter
/// was never served.
///
/// `lock_expired_held` follows the server's word: an `expired` right after
/// the lock leaves is how a lease end looks to the module, so Valkey's counts
/// (though no lease ended), Redis's `del` does not.
#[test]
fn an_expiry_time_already_past_frees_the_key_for_its_waiter_at_once() {
    let server = Server::start();
    let mut c = server.conn();
    let kind = Kind::of(&mut c);
    let past: [(&str, &[&str]); 2] = [
        (
            "SET … PXAT past over the lock",
            &["SET", "k", "v", "PXAT", "1"],
        ),
        ("PEXPIRE past on the lock", &["PEXPIRE", "k", "-1"]),
    ];
    for (round, (how, command)) in past.into_iter().enumerate() {
        let context = format!("{} {how}", kind.name());
        let alice = c.acquire("k", "alice", LONG).expect("free");
        let bob = bob_waits(&server, "k");
        let _: Value = c.value(command);
        wait_until(&format!("{context}: bob is served"), SOON, || {
            bob.is_finished()
        });
        let fence = handed_fence(bob, &context);
        assert!(fence > alice, "{context}");
        assert_eq!(c.lock_info("k").map(|i| i.owner), Some(b"bob".to_vec()));
        let counted = if kind.valkey { round as i64 + 1 } else { 0 };
        assert_eq!(lock_int(&mut c, "expired_held"), counted, "{context}");
        assert_eq!(c.int(&["LOCK.RELEASE", "k", "bob"]), 0, "{context}");
    }
}

/// What each server publishes when a lock is created, replaced by a string,
/// that string replaced, and the key deleted, with every class it has on.
/// Redis 8.2 alone knows classes `o` and `c`; the others refuse them as
/// unknown characters. All four send `new` for the lock's key.
#[test]
fn the_notifications_of_a_replaced_lock_per_server() {
    let server = Server::start();
    let mut c = server.conn();
    let kind = Kind::of(&mut c);
    if !kind.overwrite_events() {
        let refused = c.err(&["CONFIG", "SET", "notify-keyspace-events", "KEAo"]);
        assert!(
            refused.contains("Invalid event class character"),
            "{}: class o: {refused}",
            kind.name()
        );
    }
    // After the refusal: a refused CONFIG SET puts back the old value as
    // CONFIG GET shows it, which has no `n` (on all four).
    let _: () = c.value(&["CONFIG", "SET", "notify-keyspace-events", every_class(kind)]);
    let mut listener = keyevent_listener(&server);
    c.acquire("k", "alice", LONG).expect("free");
    let _: () = c.value(&["SET", "k", "one"]);
    let _: () = c.value(&["SET", "k", "two"]);
    assert_eq!(c.int(&["DEL", "k"]), 1);

    let mut events = Vec::new();
    listener.set_read_timeout(Some(SOON)).expect("read timeout");
    while events.last().map(String::as_str) != Some("del") {
        let message = listener.recv_response().expect("a notification");
        let Value::Array(parts) = &message else {
            panic!("not a pubsub message: {message:?}");
        };
        let channel = parts.get(2).and_then(text).unwrap_or_default();
        let event = channel.trim_start_matches("__keyevent@0__:").to_string();
        assert_eq!(
            parts.get(3).and_then(text).as_deref(),
            Some("k"),
            "{message:?}"
        );
        events.push(event);
    }
    let expected: &[&str] = if kind.overwrite_events() {
        &[
            "new",
            "lock.acquire",
            "overwritten",
            "type_changed",
            "set",
            "overwritten",
            "set",
            "del",
        ]
    } else {
        &["new", "lock.acquire", "set", "set", "del"]
    };
    assert_eq!(events, expected, "{}", kind.name());
}

// ---------------------------------------------------------------------------
// Conditional deletes.
// ---------------------------------------------------------------------------

/// `DELIFEQ key value` (Valkey 9) and `DELEX key IFEQ value` (Redis 8.4,
/// Valkey 9.2) compare a string: on a lock they fail with `WRONGTYPE` and
/// change nothing. On a string that replaced a lock they delete it, and the
/// lock's waiter is served. Servers without them refuse them as unknown, and
/// the lock is untouched too.
#[test]
fn conditional_deletes_leave_a_lock_alone_and_free_a_string_for_its_waiter() {
    let server = Server::start();
    let mut c = server.conn();
    let kind = Kind::of(&mut c);
    let alice = c.acquire("k", "alice", LONG).expect("free");
    let bob = bob_waits(&server, "k");
    let before = c.lock_info("k").expect("held");

    let delex = c.err(&["DELEX", "k", "IFEQ", "alice"]);
    if kind.delex() {
        assert!(
            delex.starts_with("WRONGTYPE"),
            "{}: DELEX: {delex}",
            kind.name()
        );
    } else {
        assert_unknown(kind, "DELEX", &delex);
    }
    let delifeq = c.err(&["DELIFEQ", "k", "alice"]);
    if kind.delifeq() {
        assert!(
            delifeq.starts_with("WRONGTYPE"),
            "{}: DELIFEQ: {delifeq}",
            kind.name()
        );
    } else {
        assert_unknown(kind, "DELIFEQ", &delifeq);
    }
    let after = c.lock_info("k").expect("still held");
    assert_eq!((after.held(), after.waiters), (before.held(), 1));
    assert_eq!(lock_int(&mut c, "held"), 1);
    assert_still_waiting(&bob, &mut c, "a refused conditional delete");

    // The lock replaced by a string: only a matching value deletes it.
    let _: () = c.value(&["SET", "k", "a string"]);
    if kind.delifeq() {
        assert_eq!(c.int(&["DELIFEQ", "k", "another"]), 0);
        assert_still_waiting(&bob, &mut c, "DELIFEQ of another value");
        assert_eq!(c.int(&["DELIFEQ", "k", "a string"]), 1);
    } else if kind.delex() {
        assert_eq!(c.int(&["DELEX", "k", "IFEQ", "another"]), 0);
        assert_still_waiting(&bob, &mut c, "DELEX of another value");
        assert_eq!(c.int(&["DELEX", "k", "IFEQ", "a string"]), 1);
    } else {
        assert_eq!(c.int(&["DEL", "k"]), 1);
    }
    let fence = handed_fence(bob, "bob");
    assert!(fence > alice);
    assert_eq!(c.lock_info("k").map(|i| i.owner), Some(b"bob".to_vec()));
    assert_eq!(lock_int(&mut c, "held"), 1);
    assert_eq!(lock_int(&mut c, "waiting"), 0);
}

// ---------------------------------------------------------------------------
// Hash-field expiry.
// ---------------------------------------------------------------------------

/// Alice holds `k`, bob waits on it, then a hash renamed onto `k` replaces
/// the lock; its one field gets a TTL of `field_ttl_ms`. `None` where the
/// server has no field expiry (it refuses `HPEXPIRE` as unknown); else the
/// field's expiry (unix ms) and bob.
fn a_hash_with_an_expiring_field_replaces_the_lock(
    server: &Server,
    c: &mut Connection,
    kind: Kind,
    field_ttl_ms: i64,
) -> (JoinHandle<Reply>, Option<i64>) {
    c.acquire("k", "alice", LONG).expect("free");
    let bob = bob_waits(server, "k");
    let _: i64 = c.value(&["HSET", "h", "f", "v"]);
    let _: () = c.value(&["RENAME", "h", "k"]);
    assert_eq!(lock_int(c, "held"), 0);
    let ttl = field_ttl_ms.to_string();
    match c.call(&["HPEXPIRE", "k", &ttl, "FIELDS", "1", "f"]) {
        Ok(set) => {
            assert!(
                kind.field_ttl(),
                "{}: HPEXPIRE replied {set:?}",
                kind.name()
            );
            assert_eq!(set, Value::Array(vec![Value::Int(1)]), "HPEXPIRE");
            let at: Vec<i64> = c.value(&["HPEXPIRETIME", "k", "FIELDS", "1", "f"]);
            (bob, Some(at[0]))
        }
        Err(error) => {
            assert!(!kind.field_ttl(), "{}: HPEXPIRE: {error}", kind.name());
            assert_unknown(kind, "HPEXPIRE", &error);
            (bob, None)
        }
    }
}

/// Where the hash has no field expiry: bob keeps waiting while the hash
/// occupies `k`, and is served once it is deleted.
fn without_field_expiry(c: &mut Connection, bob: JoinHandle<Reply>) {
    assert_still_waiting(&bob, c, "a hash replaced the lock");
    assert_eq!(c.int(&["DEL", "k"]), 1);
    handed_fence(bob, "bob");
}

/// A hash whose last field expires is deleted by the server's expiry cycle,
/// which notifies `hexpired` (not heard by the module) and then `del`: the
/// lock's waiter is served then, with no other command sent meanwhile.
/// Redis 8.2 notifies that `del` outside any command and runs no
/// post-notification job after it: the module once left the hand-off for
/// whichever command came next, and bob waited until then.
#[test]
fn a_hash_deleted_when_its_last_field_expires_frees_the_key_for_its_waiter() {
    let server = Server::start();
    let mut c = server.conn();
    let kind = Kind::of(&mut c);
    let (bob, expires_at) =
        a_hash_with_an_expiring_field_replaces_the_lock(&server, &mut c, kind, 200);
    let Some(expires_at) = expires_at else {
        return without_field_expiry(&mut c, bob);
    };
    // No command may reach the server until bob is answered: any would run
    // a job left pending, and hide the fault.
    let deadline = Instant::now() + Duration::from_secs(3);
    while !bob.is_finished() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(2));
    }
    let answered_at = now_ms();
    assert!(
        bob.is_finished(),
        "{}: bob was not served within 3 s of k's last field expiring at {expires_at} \
         (EXISTS k: {})",
        kind.name(),
        c.int(&["EXISTS", "k"])
    );
    let fence = handed_fence(bob, "bob");
    assert!(
        fence >> CLOCK_SHIFT >= expires_at,
        "bob was granted k at {}, before its field expired at {expires_at}",
        fence >> CLOCK_SHIFT
    );
    // The expiry cycle runs `hz` (10) times a second.
    assert!(
        answered_at - expires_at < 1000,
        "{}: bob was served {} ms after the field expired",
        kind.name(),
        answered_at - expires_at
    );
    assert_eq!(c.lock_info("k").map(|i| i.owner), Some(b"bob".to_vec()));
    assert_eq!(lock_int(&mut c, "held"), 1);
    assert_eq!(lock_int(&mut c, "expired_held"), 0, "a field is no lease");
}

/// With the server's expiry cycle off, only a read can find the expired
/// field. Redis 8.2 then deletes the field and the emptied hash (`del`, in
/// that command) and bob is served; Valkey 9.1 only hides the field from the
/// read: the hash stays, bob keeps waiting, and is served once the cycle,
/// back on, deletes the hash.
#[test]
fn a_read_of_an_expired_last_field_frees_the_key_on_redis_but_not_on_valkey() {
    let server = Server::start();
    let mut c = server.conn();
    let kind = Kind::of(&mut c);
    let _: () = c.value(&["DEBUG", "SET-ACTIVE-EXPIRE", "0"]);
    let (bob, expires_at) =
        a_hash_with_an_expiring_field_replaces_the_lock(&server, &mut c, kind, 50);
    let Some(expires_at) = expires_at else {
        return without_field_expiry(&mut c, bob);
    };
    wait_until("the field's expiry passed", SOON, || {
        now_ms() > expires_at + 2
    });
    assert_eq!(c.call(&["HGET", "k", "f"]), Ok(Value::Nil), "HGET k f");
    if kind.valkey {
        assert_eq!(
            c.int(&["EXISTS", "k"]),
            1,
            "{}: the hash stays",
            kind.name()
        );
        assert_still_waiting(&bob, &mut c, "a read of the expired field");
        let _: () = c.value(&["DEBUG", "SET-ACTIVE-EXPIRE", "1"]);
    }
    let fence = handed_fence(bob, "bob");
    assert!(fence >> CLOCK_SHIFT >= expires_at);
    assert_eq!(c.lock_info("k").map(|i| i.owner), Some(b"bob".to_vec()));
    assert_eq!(lock_int(&mut c, "held"), 1);
}

// ---------------------------------------------------------------------------
// When a hand-off after another command happens.
// ---------------------------------------------------------------------------

/// `DEL` of a lock with a waiter, then `LOCK.INFO` and a newcomer's
/// `LOCK.ACQUIRE`, in one pipeline. Where the server runs post-notification
/// jobs (Redis 7.2+, Valkey) the hand-off runs right after the `DEL`: the
/// next command already sees bob holding the lock. Redis 7.0 has no such
/// jobs; the module's 0 ms timer runs once the server has run the whole
/// pipeline, so `LOCK.INFO` still sees the key free — and the newcomer still
/// gets nil, as bob waits. Either way bob holds it before the next pipeline.
#[test]
fn a_hand_off_after_del_is_seen_by_the_next_command_or_the_next_pipeline() {
    let server = Server::start();
    let mut c = server.conn();
    let kind = Kind::of(&mut c);
    c.acquire("k", "alice", LONG).expect("free");
    let bob = bob_waits(&server, "k");
    let replies: Vec<Value> = redis::pipe()
        .cmd("DEL")
        .arg("k")
        .cmd("LOCK.INFO")
        .arg("k")
        .cmd("LOCK.ACQUIRE")
        .arg(&["k", "carol", "1000"])
        .query(&mut c)
        .expect("the pipeline");
    let [deleted, info, carol] = &replies[..] else {
        panic!("three replies expected: {replies:?}");
    };
    assert_eq!(deleted, &Value::Int(1));
    assert_eq!(carol, &Value::Nil, "{}: carol took k from bob", kind.name());
    if kind.runs_jobs() {
        let info = LockInfo::from_reply(info).unwrap_or_else(|why| panic!("{why}: {info:?}"));
        assert_eq!(
            (info.owner.as_slice(), info.waiters),
            (&b"bob"[..], 0),
            "{}: LOCK.INFO right after the DEL",
            kind.name()
        );
    } else {
        assert_eq!(
            info,
            &Value::Nil,
            "{}: LOCK.INFO right after the DEL",
            kind.name()
        );
    }
    let next = c.lock_info("k").expect("k is held in the next pipeline");
    assert_eq!((next.owner.as_slice(), next.waiters), (&b"bob"[..], 0));
    assert_eq!(next.fence, handed_fence(bob, "bob"));
}

/// `LOCK.RELEASE` hands `k` to bob and `CLIENT UNBLOCK bob` follows in the
/// same pipeline, before the server has written bob's reply. The module
/// gets there two ways — Redis 7.0 keeps the granted bob blocked until the
/// server's before-sleep event and answers the unblock itself; newer servers
/// see the unblock of a client the module has already unblocked — and the
/// outcome is the same on all four: `CLIENT UNBLOCK` replies 1; its nil form
/// leaves bob his fence; its `ERROR` form gets him `UNBLOCKED` and the grant
/// is taken back. Bob gets exactly one reply either way.
#[test]
fn client_unblock_right_after_a_grant_has_the_same_outcome_on_every_server() {
    let server = Server::start();
    let mut c = server.conn();
    let kind = Kind::of(&mut c);
    for error in [false, true] {
        let context = format!(
            "{} CLIENT UNBLOCK{}",
            kind.name(),
            if error { " ERROR" } else { "" }
        );
        let mut b = server.conn();
        let id = b.int(&["CLIENT", "ID"]).to_string();
        c.acquire("k", "alice", LONG).expect("free");
        let wait = wait_args("k", "bob", LONG, 0);
        b.send_packed_command(&redis::cmd(&wait[0]).arg(&wait[1..]).get_packed_command())
            .expect("send bob's wait");
        wait_until("bob waits", SOON, || lock_int(&mut c, "waiting") == 1);

        let mut pipe = redis::pipe();
        pipe.cmd("LOCK.RELEASE").arg(&["k", "alice"]);
        pipe.cmd("CLIENT").arg(&["UNBLOCK", &id]);
        if error {
            pipe.arg("ERROR");
        }
        let replies: Vec<Value> = pipe.query(&mut c).expect("the pipeline");
        assert_eq!(replies, [Value::Int(0), Value::Int(1)], "{context}");

        let seen = b.recv_response();
        let holder = c.lock_info("k").map(|info| (info.owner, info.fence));
        match (&seen, error) {
            (Ok(Value::Int(fence)), false) => {
                assert_eq!(holder, Some((b"bob".to_vec(), *fence)), "{context}");
                assert_eq!(c.int(&["LOCK.RELEASE", "k", "bob"]), 0);
            }
            (Ok(Value::ServerError(err)), true) => {
                assert_eq!(err.code(), "UNBLOCKED", "{context}");
                wait_until("the grant is taken back", SOON, || {
                    c.lock_info("k").is_none()
                });
            }
            _ => panic!("{context}: bob saw {seen:?}, k is held by {holder:?}"),
        }
        let pong: Value = redis::cmd("PING").query(&mut b).expect("bob's PING");
        assert_eq!(
            text(&pong).as_deref(),
            Some("PONG"),
            "{context}: a second reply"
        );
        assert_eq!(lock_int(&mut c, "waiting"), 0, "{context}");
        assert_eq!(lock_int(&mut c, "held"), 0, "{context}");
    }
}
