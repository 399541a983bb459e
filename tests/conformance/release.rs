//! A release that does not complete (cancelled while writes are paused)
//! leaves a hold that is no longer reported held: it is reported lost
//! (`release-unconfirmed`), the release lands once the server takes writes
//! again (long before the lease ends), and nothing keeps running.

use std::thread;
use std::time::{Duration, Instant};

use crate::harness::*;

fn unconfirmed(request: &str, release: &str) {
    let (server, mut d) = setup();
    d.ok(&format!("{request} ttl=20000"));
    let mut conn = server.conn();
    let _: String = conn.value(&["CLIENT", "PAUSE", "1500", "WRITE"]);
    let paused = Instant::now();
    d.err_kind(&format!("{release} cancel=300"), &["cancelled"]);
    let status = d.status("a");
    assert_eq!(
        (status.held, status.lost, status.reason.as_str()),
        (false, true, "release-unconfirmed"),
        "after a release that did not complete: {status:?}"
    );
    assert!(
        server.lock_info("k").is_some(),
        "writes are paused: still held"
    );
    thread::sleep(Duration::from_millis(1600).saturating_sub(paused.elapsed()));
    nothing_left(&server, &mut d, "k", Duration::from_secs(3));
    let status = d.status("a");
    assert!(!status.held, "{status:?}");
}

#[test]
fn a_cancelled_release_reports_lost_and_lands_later() {
    unconfirmed("acquire h=a key=k", "release h=a");
}

#[test]
fn a_cancelled_release_of_a_read_hold_reports_lost_and_lands_later() {
    unconfirmed("acquire h=a key=k kind=read", "release h=a");
}

#[test]
fn a_cancelled_release_of_every_hold_reports_lost_and_lands_later() {
    unconfirmed("acquire h=a key=k", "release h=a all=1");
}

#[test]
fn a_cancelled_release_of_an_ephemeral_hold_leaves_no_connection_or_task() {
    unconfirmed("acquire h=a key=k ephemeral=1", "release h=a all=1");
}
