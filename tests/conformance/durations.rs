//! Durations the server accepts (up to 2^40 ms) are accepted without
//! overflow: a wait of 2^31 ms waits, a lease of 30 days is renewed
//! without a timer that spins.

use std::thread;
use std::time::Duration;

use crate::driver::tree_cpu_ms;
use crate::harness::*;

#[test]
fn a_wait_of_2_pow_31_ms_waits_until_granted() {
    let (server, mut d) = setup();
    hold_elsewhere(&server, "k", "other");
    let id = d.send("acquire h=a key=k ttl=10000 wait=2147483648");
    waiters(&server, "k", 1);
    assert!(
        d.reply_within(id, Duration::from_millis(1_000)).is_none(),
        "a wait of 2^31 ms ended early"
    );
    server.conn().int(&["LOCK.RELEASE", "k", "other"]);
    let reply = d.reply(id);
    assert!(reply.ok, "{:?}", reply.line);
    d.ok("release h=a");
}

#[test]
fn a_30_day_lease_is_kept_without_spinning() {
    let (server, mut d) = setup();
    d.ok("acquire h=a key=k ttl=2592000000");
    let pttl = server.conn().pttl("k");
    assert!(pttl > 2_591_000_000, "PTTL {pttl}");
    // Settle, then measure the driver's CPU over 1.5 s of holding.
    thread::sleep(Duration::from_millis(300));
    let before = tree_cpu_ms(d.pid());
    thread::sleep(Duration::from_millis(1_500));
    let used = tree_cpu_ms(d.pid()) - before;
    assert!(
        used < 150,
        "the driver used {used} ms of CPU in 1.5 s holding a 30-day lease"
    );
    let status = d.status("a");
    assert!(status.held && !status.lost, "{status:?}");
    d.ok("release h=a");
    d.no_leaks(Duration::from_secs(3));
}

#[test]
fn the_longest_lease_the_server_accepts_is_accepted() {
    let (server, mut d) = setup();
    d.ok("acquire h=a key=k ttl=1099511627776 renew=off");
    assert!(server.conn().pttl("k") > 1_099_000_000_000);
    let status = d.status("a");
    assert!(status.held && !status.lost, "{status:?}");
    d.ok("release h=a");
}
