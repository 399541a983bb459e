//! A wait longer than a third of the ttl is confirmed with a renew before
//! the call returns. When that renew finds the lock gone (`NOTOWNER`: a
//! failover, a `DEL`, and someone else took it), the grant was not a hold:
//! the call waits again within what is left of its wait, and times out
//! when none is left. It never returns "not the owner" for it.

use std::thread;
use std::time::{Duration, Instant};

use crate::driver::Driver;
use crate::harness::*;

/// The driver waits (ttl 3 s); after 1.2 s the holder releases, which
/// grants the driver, and on the same connection, before the driver's
/// confirming renew can come, the lock is deleted and taken by `thief`.
fn grant_then_steal(server: &Server, d: &mut Driver, wait_ms: u64) -> (u64, Instant) {
    hold_elsewhere(server, "k", "other");
    let sent = Instant::now();
    let id = d.send(&format!("acquire h=a key=k ttl=3000 wait={wait_ms}"));
    waiters(server, "k", 1);
    thread::sleep(Duration::from_millis(1200).saturating_sub(sent.elapsed()));
    let mut conn = server.conn();
    let (): () = redis::pipe()
        .cmd("LOCK.RELEASE")
        .arg("k")
        .arg("other")
        .ignore()
        .cmd("DEL")
        .arg("k")
        .ignore()
        .cmd("LOCK.ACQUIRE")
        .arg("k")
        .arg("thief")
        .arg(600_000)
        .ignore()
        .query(&mut conn)
        .expect("grant, delete and take");
    (id, sent)
}

#[test]
fn a_grant_gone_before_its_confirming_renew_waits_again() {
    let (server, mut d) = setup();
    let (id, _) = grant_then_steal(&server, &mut d, 20_000);
    // The driver must queue again behind the thief, not give up.
    waiters(&server, "k", 1);
    assert!(
        d.reply_within(id, Duration::from_millis(300)).is_none(),
        "the call returned instead of waiting again"
    );
    server.conn().int(&["LOCK.RELEASE", "k", "thief"]);
    let reply = d.reply(id);
    assert!(reply.ok, "{:?}", reply.line);
    let info = server.lock_info("k").expect("held by the driver");
    assert_eq!(info.owner_text(), reply.field("owner"));
    d.ok("release h=a");
    assert!(server.lock_info("k").is_none());
}

#[test]
fn a_grant_gone_before_its_confirming_renew_times_out_within_the_wait() {
    let (server, mut d) = setup();
    let (id, sent) = grant_then_steal(&server, &mut d, 2_500);
    let reply = d.reply(id);
    assert_eq!(reply.kind, "timeout", "{:?}", reply.line);
    let took = reply.at - sent;
    assert!(
        took < Duration::from_millis(2_500 + 1_500),
        "a 2.5 s wait returned after {took:?}"
    );
    assert_eq!(
        server.lock_info("k").expect("the thief's").owner_text(),
        "thief"
    );
    nothing_left_but_the_thief(&server, &mut d);
}

fn nothing_left_but_the_thief(server: &Server, d: &mut Driver) {
    wait_until("no waiter", Duration::from_secs(3), || {
        server.lock_info("k").map(|i| i.waiters) == Some(0)
    });
    d.no_leaks(Duration::from_secs(3));
}
