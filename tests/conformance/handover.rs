//! Renew with a new ttl, stop renewing without releasing, and continue a
//! hold in another process by its owner token (acquire in a scheduler,
//! renew and release in a worker).

use std::thread;
use std::time::Duration;

use crate::driver::Driver;
use crate::harness::*;

#[test]
fn a_renew_with_a_new_ttl_sets_the_lease_to_it() {
    let (server, mut d) = setup();
    d.ok("acquire h=a key=k ttl=5000 renew=off");
    d.ok("renew h=a ttl=60000");
    let pttl = server.conn().pttl("k");
    assert!(
        (55_000..=60_000).contains(&pttl),
        "PTTL {pttl} after a renew for 60 s"
    );
    d.ok("renew h=a ttl=2000");
    let pttl = server.conn().pttl("k");
    assert!(
        (1_000..=2_000).contains(&pttl),
        "PTTL {pttl} after a renew for 2 s"
    );
    d.ok("renew h=a");
    let status = d.status("a");
    assert!(status.held && !status.lost, "{status:?}");
    d.ok("release h=a");
}

#[test]
fn the_watchdog_renews_for_the_new_ttl() {
    let (server, mut d) = setup();
    d.ok("acquire h=a key=k ttl=30000");
    d.ok("renew h=a ttl=900");
    // Three leases of the new ttl later the hold is still there, kept by
    // the watchdog, and each renew asked for 900 ms.
    thread::sleep(Duration::from_millis(2_700));
    let pttl = server.conn().pttl("k");
    assert!((1..=900).contains(&pttl), "PTTL {pttl}");
    let status = d.status("a");
    assert!(status.held && !status.lost, "{status:?}");
    d.ok("release h=a");
}

#[test]
fn stop_renew_keeps_the_hold_until_its_lease_ends_and_renews_no_more() {
    let (server, mut d) = setup();
    // 4 s: a margin of 42 ms for the loss event to arrive in time.
    d.ok("acquire h=a key=k ttl=4000");
    d.ok("stop-renew h=a");
    let lease_end = pexpiretime(&server, "k");
    let renews = server.calls("lock.renew");
    let status = d.status("a");
    assert!(status.held && !status.lost, "{status:?}");
    let event = d.lost("a", Duration::from_secs(8));
    assert_eq!(event.field("reason"), "expired", "{event:?}");
    assert!(
        event.unix_ms <= lease_end,
        "lost {} ms after the lease end",
        event.unix_ms - lease_end
    );
    // -2: gone already; else the lease end must not have moved.
    let now = pexpiretime(&server, "k");
    assert!(now == -2 || now == lease_end, "the lease moved to {now}");
    free_within(&server, "k", Duration::from_secs(3));
    assert_eq!(
        server.calls("lock.renew"),
        renews,
        "renewed after stop-renew"
    );
    d.no_leaks(Duration::from_secs(3));
}

#[test]
fn a_hold_resumed_by_its_owner_token_renews_and_releases_from_another_process() {
    let (server, mut scheduler) = setup();
    // Both processes are up before the hold is taken: a driver's start-up
    // does not eat into the lease.
    let mut worker = Driver::connected(&server);
    let taken = scheduler.ok("acquire h=a key=k ttl=30000 renew=off");
    let (owner, fence) = (taken.field("owner"), taken.field("fence"));
    worker.ok(&format!(
        "resume h=r key=k owner={owner} fence={fence} ttl=5000 renew=off"
    ));
    let status = worker.ok("status h=r");
    assert_eq!(status.field("held"), "1");
    assert_eq!(status.field("fence"), fence);
    worker.ok("renew h=r ttl=60000");
    let pttl = server.conn().pttl("k");
    assert!(pttl > 55_000, "PTTL {pttl} after the worker's renew");
    worker.ok("release h=r");
    assert!(server.lock_info("k").is_none(), "released by the worker");
    worker.no_leaks(Duration::from_secs(3));
}

#[test]
fn a_hold_resumed_without_its_fence_learns_it_from_the_server() {
    let (server, mut scheduler) = setup();
    let mut worker = Driver::connected(&server);
    let taken = scheduler.ok("acquire h=a key=k ttl=30000 renew=off");
    let resumed = worker.ok(&format!(
        "resume h=r key=k owner={} ttl=5000",
        taken.field("owner")
    ));
    drop(resumed);
    let status = worker.ok("status h=r");
    assert_eq!(status.field("fence"), taken.field("fence"));
    worker.ok("release h=r");
    assert!(server.lock_info("k").is_none());
}

#[test]
fn resuming_a_hold_that_is_not_there_is_refused() {
    let (server, mut d) = setup();
    hold_elsewhere(&server, "k", "other");
    d.err_kind("resume h=r key=k owner=nobody ttl=5000", &["not-owner"]);
    d.err_kind("resume h=r2 key=free owner=nobody ttl=5000", &["not-owner"]);
    assert_eq!(server.lock_info("k").expect("held").owner_text(), "other");
}
