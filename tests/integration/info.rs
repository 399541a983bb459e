//! The `INFO lock` section ("Observability" in docs/operations.md): `held` and `waiting` are
//! gauges of now; the rest count what this server's clients asked for.

use std::time::Duration;

use crate::harness::{wait_until, Call, Server, LOCK_INFO_FIELDS, LONG};

const FIELDS: &[&str] = LOCK_INFO_FIELDS;

/// All fields of `INFO lock`, in `FIELDS` order.
fn counters(server: &Server) -> Vec<i64> {
    FIELDS.iter().map(|f| server.info_int("lock", f)).collect()
}

/// Asserts some fields of `INFO lock`; the others must be as in `base`.
fn assert_counters(server: &Server, base: &[i64], changed: &[(&str, i64)]) {
    let expected: Vec<i64> = FIELDS
        .iter()
        .zip(base)
        .map(|(field, &value)| {
            changed
                .iter()
                .find(|(name, _)| name == field)
                .map_or(value, |&(_, v)| v)
        })
        .collect();
    let got = counters(server);
    let diff: Vec<String> = FIELDS
        .iter()
        .zip(expected.iter().zip(&got))
        .filter(|(_, (e, g))| e != g)
        .map(|(field, (e, g))| format!("{field}: expected {e}, got {g}"))
        .collect();
    assert!(diff.is_empty(), "INFO lock: {}", diff.join("; "));
}

#[test]
fn a_fresh_server_reports_every_field_at_zero() {
    let server = Server::start();
    assert_eq!(counters(&server), vec![0; FIELDS.len()]);
    let section = server.cli(&["INFO", "lock"]);
    assert!(
        section.contains("# lock"),
        "INFO lock has no lock section:\n{section}"
    );
}

#[test]
fn counters_follow_each_kind_of_success() {
    let server = Server::start();
    let mut c = server.conn();
    let zero = counters(&server);

    let a = c.acquire("a", "alice", LONG).expect("free");
    assert_counters(
        &server,
        &zero,
        &[
            ("lock_held", 1),
            ("lock_acquired", 1),
            ("lock_last_fence", a),
        ],
    );
    let base = counters(&server);

    c.acquire("a", "alice", LONG).expect("reentry");
    assert_eq!(c.int(&["LOCK.REENTER", "a", "alice"]), 3);
    assert_counters(&server, &base, &[("lock_reentered", 2)]);

    assert_eq!(c.int(&["LOCK.RENEW", "a", "alice", "60000"]), 1);
    assert_counters(
        &server,
        &base,
        &[("lock_reentered", 2), ("lock_renewed", 1)],
    );
    let base = counters(&server);

    // A release that leaves it held still counts as a release.
    assert_eq!(c.int(&["LOCK.RELEASE", "a", "alice"]), 2);
    assert_counters(&server, &base, &[("lock_released", 1)]);
    assert_eq!(c.int(&["LOCK.RELEASE", "a", "alice", "ALL"]), 0);
    assert_counters(&server, &base, &[("lock_released", 2), ("lock_held", 0)]);
    let base = counters(&server);

    let b = c.acquire("b", "bob", LONG).expect("free");
    let d = c.acquire("d", "dave", LONG).expect("free");
    assert!(a < b && b < d);
    assert_counters(
        &server,
        &base,
        &[
            ("lock_held", 2),
            ("lock_acquired", 3),
            ("lock_last_fence", d),
        ],
    );
    let base = counters(&server);

    // Refusals: a busy lock's nil counts nothing, NOTOWNER counts each time.
    assert_eq!(c.acquire("b", "alice", LONG), None);
    assert_counters(&server, &base, &[]);
    c.err(&["LOCK.RELEASE", "b", "alice"]);
    c.err(&["LOCK.RENEW", "b", "alice", "1000"]);
    c.err(&["LOCK.REENTER", "free", "alice"]);
    assert_counters(&server, &base, &[("lock_notowner", 3)]);
    let base = counters(&server);

    // Other errors count nothing.
    c.err(&["LOCK.ACQUIRE", "b", "alice", "0"]);
    c.err(&["LOCK.RELEASE", "b", "", "ALL"]);
    c.err(&["LOCK.RELEASE", "b", "bob", "extra"]);
    c.err(&["LOCK.INFO"]);
    assert_counters(&server, &base, &[]);

    // Reads count nothing.
    c.lock_info("b").expect("held");
    c.nil(&["LOCK.INFO", "free"]);
    assert_counters(&server, &base, &[]);
}

#[test]
fn a_lease_that_ends_counts_as_expired_held() {
    let server = Server::start();
    let mut c = server.conn();
    c.acquire("long", "alice", LONG).expect("free");
    c.acquire("short", "alice", 50).expect("free");
    let base = counters(&server);
    assert_eq!(base[0], 2, "two held");

    // Only INFO is polled: the server must notice the end of the lease itself.
    wait_until("the short lease ends", Duration::from_secs(5), || {
        server.info_int("lock", "lock_expired_held") == 1
    });
    assert_counters(
        &server,
        &base,
        &[("lock_held", 1), ("lock_expired_held", 1)],
    );
    assert_eq!(c.int(&["EXISTS", "short"]), 0);
}

#[test]
fn held_follows_locks_removed_by_other_commands() {
    let server = Server::start();
    let mut c = server.conn();
    for key in ["a", "b", "c", "d", "e"] {
        c.acquire(key, "alice", LONG).expect("free");
    }
    assert_eq!(server.info_int("lock", "lock_held"), 5);

    assert_eq!(c.int(&["DEL", "a"]), 1);
    assert_eq!(server.info_int("lock", "lock_held"), 4);
    assert_eq!(c.int(&["UNLINK", "b"]), 1);
    assert_eq!(server.info_int("lock", "lock_held"), 3);
    // SET overwrites a lock: it is no longer held.
    c.value::<String, _>(&["SET", "c", "v"]);
    assert_eq!(server.info_int("lock", "lock_held"), 2);
    // SYNC: Valkey flushes lazily by default (`lazyfree-lazy-user-flush`),
    // and `held` drops as each value is freed, on a background thread then.
    c.value::<String, _>(&["FLUSHALL", "SYNC"]);
    assert_eq!(server.info_int("lock", "lock_held"), 0);

    // None of this counts as a release or an expiry.
    assert_eq!(server.info_int("lock", "lock_released"), 0);
    assert_eq!(server.info_int("lock", "lock_expired_held"), 0);
    assert_eq!(server.info_int("lock", "lock_acquired"), 5);
    assert_eq!(server.info_int("lock", "lock_waiting"), 0);
}

/// `expired_held` counts leases that ended while held, not a string that
/// overwrote a lock and then expired under the same name.
#[test]
fn expired_held_ignores_a_string_that_overwrote_a_lock() {
    let server = Server::start();
    let mut c = server.conn();
    c.acquire("k", "alice", LONG).expect("free");
    c.value::<(), _>(&["SET", "k", "v", "PX", "30"]);
    wait_until("the string expires", Duration::from_secs(5), || {
        c.int(&["EXISTS", "k"]) == 0
    });
    assert_eq!(server.info_int("lock", "lock_expired_held"), 0);

    c.acquire("short", "bob", 30).expect("free");
    wait_until("the lease ends", Duration::from_secs(5), || {
        server.info_int("lock", "lock_expired_held") == 1
    });
}
