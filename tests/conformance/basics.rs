//! The plain path: a try takes a free lock, is refused a held one; a wait
//! runs out or is granted in turn; the replies say what the server says.

use std::time::{Duration, Instant};

use crate::driver::Driver;
use crate::harness::*;

#[test]
fn a_try_takes_a_free_lock_with_the_servers_fence_and_owner() {
    let (server, mut d) = setup();
    let reply = d.ok("acquire h=a key=k ttl=10000");
    let info = server.lock_info("k").expect("k is held");
    assert_eq!(info.owner_text(), reply.field("owner"));
    assert_eq!(info.fence.to_string(), reply.field("fence"));
    assert_eq!(info.count, 1);
    let status = d.status("a");
    assert!(status.held && !status.lost, "{status:?}");
    d.ok("release h=a");
    assert!(server.lock_info("k").is_none(), "released");
    let status = d.status("a");
    assert!(!status.held && !status.lost, "{status:?}");
    d.no_leaks(Duration::from_secs(5));
}

#[test]
fn a_try_on_a_held_lock_is_not_obtained_and_changes_nothing() {
    let (server, mut d) = setup();
    hold_elsewhere(&server, "k", "other");
    let before = server.lock_info("k").expect("held").held();
    d.err_kind("acquire h=a key=k ttl=10000", &["not-obtained"]);
    assert_eq!(server.lock_info("k").expect("held").held(), before);
    d.no_leaks(Duration::from_secs(5));
}

#[test]
fn a_wait_that_runs_out_is_a_timeout_and_leaves_no_waiter() {
    let (server, mut d) = setup();
    hold_elsewhere(&server, "k", "other");
    let start = Instant::now();
    d.err_kind("acquire h=a key=k ttl=10000 wait=300", &["timeout"]);
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(5),
        "a 300 ms wait took {took:?}"
    );
    assert_eq!(server.lock_info("k").expect("held").waiters, 0);
    assert_eq!(blocked(&server), 0);
    d.no_leaks(Duration::from_secs(5));
}

#[test]
fn a_waiter_is_granted_when_the_holder_releases() {
    let (server, mut d) = setup();
    hold_elsewhere(&server, "k", "other");
    let id = d.send("acquire h=a key=k ttl=10000 wait=10000");
    waiters(&server, "k", 1);
    server.conn().int(&["LOCK.RELEASE", "k", "other"]);
    let reply = d.reply(id);
    assert!(reply.ok, "{:?}", reply.line);
    let info = server.lock_info("k").expect("held by the waiter");
    assert_eq!(info.owner_text(), reply.field("owner"));
    d.ok("release h=a");
    assert!(server.lock_info("k").is_none());
}

#[test]
fn a_released_hold_cannot_be_renewed_or_released_again() {
    let (server, mut d) = setup();
    d.ok("acquire h=a key=k ttl=10000 renew=off");
    d.ok("release h=a");
    d.err_kind("release h=a", &["not-owner", "lost"]);
    d.err_kind("renew h=a", &["not-owner", "lost"]);
    assert!(server.lock_info("k").is_none());
}

#[test]
fn permits_count_up_to_the_limit_and_another_limit_is_refused() {
    let (server, mut d) = setup();
    d.ok("acquire h=p1 key=s kind=permit limit=2 ttl=10000");
    d.ok("acquire h=p2 key=s kind=permit limit=2 ttl=10000");
    d.err_kind(
        "acquire h=p3 key=s kind=permit limit=2 ttl=10000",
        &["not-obtained"],
    );
    d.err_kind(
        "acquire h=p4 key=s kind=permit limit=3 ttl=10000",
        &["limit-mismatch"],
    );
    assert_eq!(server.lock_info("s").expect("held").holders.len(), 2);
    d.ok("release h=p1");
    d.ok("release h=p2");
    assert!(server.lock_info("s").is_none());
}

#[test]
fn a_line_that_does_not_parse_is_a_bad_request() {
    let (_server, mut d) = setup();
    d.err_kind("acquire h=a key=k ttl=ten", &["bad-request"]);
    d.err_kind("acquire h=a", &["bad-request"]);
    d.err_kind("status h=nobody", &["bad-request"]);
}

/// A server that has just become a master (or started) begins no hold for
/// `lock.max-ttl` ms (its quarantine): a try then is refused as
/// `quarantine` (try again), not as held, for a lock and for a permit; a
/// wait queues and is granted when the quarantine ends.
#[test]
fn a_try_during_the_quarantine_is_refused_as_quarantine_and_a_wait_is_served_after_it() {
    const QUARANTINE_MS: i64 = 5_000;
    // A replica of nothing, promoted once the driver is connected: the
    // quarantine starts then, however long the driver took to start.
    let server = Server::builder()
        .config("lock.max-ttl", QUARANTINE_MS)
        .config("replicaof", "127.0.0.1 1")
        .start();
    let mut d = Driver::connected(&server);
    let _: () = server.q(&["REPLICAOF", "NO", "ONE"]);
    let left = server.info_int("lock", "lock_quarantine_ms");
    assert!(
        left > 1_000,
        "the promotion started no quarantine: {left} ms left"
    );
    d.err_kind("acquire h=a key=k ttl=5000", &["quarantine"]);
    d.err_kind(
        "acquire h=p key=s kind=permit limit=2 ttl=5000",
        &["quarantine"],
    );
    assert!(server.lock_info("k").is_none() && server.lock_info("s").is_none());
    let id = d.send("acquire h=w key=k ttl=5000 wait=20000");
    let reply = d.reply(id);
    assert!(reply.ok, "{:?}", reply.line);
    assert_eq!(
        server.info_int("lock", "lock_quarantine_ms"),
        0,
        "granted before the quarantine ended"
    );
    d.ok("release h=w");
    d.ok("acquire h=b key=k ttl=5000");
    d.ok("release h=b");
    d.no_leaks(Duration::from_secs(5));
}
