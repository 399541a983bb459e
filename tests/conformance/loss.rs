//! The loss signal: raised no later than the server's own lease end when
//! renewals are refused, at once when the server says the hold is gone
//! (`NOTOWNER` after a `DEL`, `WRONGTYPE` after a `SET` over the key), and
//! never cleared by a later acquire through the same object.
//!
//! Leases of the timed scenarios are 5 s: the client's margin is 1 % of the
//! ttl + 2 ms (52 ms), room for a loaded machine to deliver the event.

use std::time::{Duration, Instant};

use crate::driver::Driver;
use crate::harness::*;

/// Waits for `h`'s loss and checks it came no later than `lease_end` (the
/// server's `PEXPIRETIME`), and not absurdly early.
fn lost_by(d: &Driver, h: &str, lease_end: i64, ttl_ms: i64, reason: &str) {
    let event = d.lost(h, Duration::from_millis(ttl_ms as u64 + 5_000));
    assert_eq!(event.field("reason"), reason, "{event:?}");
    assert!(
        event.unix_ms <= lease_end,
        "lost signalled at {} ms, {} ms after the server's lease end {lease_end}",
        event.unix_ms,
        event.unix_ms - lease_end
    );
    assert!(
        event.unix_ms >= lease_end - ttl_ms / 2,
        "lost signalled {} ms before the lease end of a {ttl_ms} ms lease",
        lease_end - event.unix_ms
    );
}

#[test]
fn renewals_refused_by_acl_lose_the_hold_before_the_server_lease_ends() {
    let (server, mut d) = setup();
    d.ok("acquire h=a key=k ttl=5000");
    let _: String = server.q(&["ACL", "SETUSER", "default", "-lock.renew"]);
    let lease_end = pexpiretime(&server, "k");
    lost_by(&d, "a", lease_end, 5000, "expired");
    let status = d.status("a");
    assert!(!status.held && status.lost, "{status:?}");
}

#[test]
fn renewals_held_up_by_a_write_pause_lose_the_hold_before_the_server_lease_ends() {
    let (server, mut d) = setup();
    d.ok("acquire h=a key=k ttl=5000");
    let mut conn = server.conn();
    let lease_end = pexpiretime(&server, "k");
    let _: String = conn.value(&["CLIENT", "PAUSE", "8000", "WRITE"]);
    lost_by(&d, "a", lease_end, 5000, "expired");
    let _: String = conn.value(&["CLIENT", "UNPAUSE"]);
}

#[test]
fn a_deleted_lock_is_lost_at_the_next_renew_as_not_owner() {
    let (server, d) = setup();
    let mut d = d;
    d.ok("acquire h=a key=k ttl=3000");
    let deleted = Instant::now();
    server.conn().int(&["DEL", "k"]);
    // The watchdog renews every third of the lease: 1 s here.
    let event = d.lost("a", Duration::from_secs(5));
    assert_eq!(event.field("reason"), "not-owner", "{event:?}");
    assert!(
        event.at - deleted < Duration::from_millis(2_000),
        "lost {:?} after the DEL: not at the next renew",
        event.at - deleted
    );
}

#[test]
fn a_lock_overwritten_by_set_is_lost_at_the_next_renew_as_not_owner() {
    let (server, mut d) = setup();
    d.ok("acquire h=a key=k ttl=3000");
    let overwritten = Instant::now();
    let _: String = server.q(&["SET", "k", "x", "PX", "60000"]);
    let event = d.lost("a", Duration::from_secs(5));
    assert_eq!(event.field("reason"), "not-owner", "{event:?}");
    assert!(
        event.at - overwritten < Duration::from_millis(2_000),
        "lost {:?} after the SET: not at the next renew",
        event.at - overwritten
    );
}

#[test]
fn a_renew_of_an_overwritten_lock_fails_and_signals_the_loss_at_once() {
    let (server, mut d) = setup();
    d.ok("acquire h=a key=k ttl=10000 renew=off");
    let _: String = server.q(&["SET", "k", "x", "PX", "60000"]);
    let reply = d.err_kind("renew h=a", &["not-owner", "lost"]);
    let event = d.lost("a", Duration::from_secs(2));
    assert_eq!(event.field("reason"), "not-owner", "{event:?}");
    assert!(
        event.at < reply.at + Duration::from_millis(200),
        "the loss came {:?} after the refused renew",
        event.at.saturating_duration_since(reply.at)
    );
    let status = d.status("a");
    assert!(!status.held && status.lost, "{status:?}");
}

/// A hold lost, then the same object acquires on another thread: the first
/// hold still reports its loss.
fn loss_survives_a_later_acquire(kind: &str) {
    let (server, mut d) = setup();
    d.ok(&format!(
        "acquire h=a key=k kind={kind} obj=o thread=t1 ttl=10000"
    ));
    server.conn().int(&["DEL", "k"]);
    let reply = d.err_kind("renew h=a", &["not-owner", "lost"]);
    drop(reply);
    d.lost("a", Duration::from_secs(2));
    d.ok(&format!(
        "acquire h=b key=k kind={kind} obj=o thread=t2 ttl=10000"
    ));
    let a = d.status("a");
    assert!(
        !a.held && a.lost,
        "the first hold after another's acquire: {a:?}"
    );
    let b = d.status("b");
    assert!(b.held && !b.lost, "the second hold: {b:?}");
    d.ok("release h=b");
    assert!(server.lock_info("k").is_none());
}

#[test]
fn a_loss_is_not_cleared_by_a_later_lock_through_the_same_object() {
    loss_survives_a_later_acquire("lock");
}

#[test]
fn a_loss_is_not_cleared_by_a_later_read_lock_through_the_same_handle() {
    loss_survives_a_later_acquire("read");
}
