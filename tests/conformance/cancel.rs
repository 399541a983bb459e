//! Cancellation at any point leaves nothing held, nothing parked and
//! nothing running: before the send, while parked in the server's queue,
//! while the grant's reply is in flight (writes paused, so the grant lands
//! after the client gave up), during the confirming renew of a long wait,
//! and a try whose reply comes after the client stopped listening.

use std::thread;
use std::time::{Duration, Instant};

use crate::harness::*;

/// `cancel=0`: cancelled at once, before the request can have gone out
/// (or, in a runtime whose timer lets it start, right after it parked: the
/// lock is held elsewhere, so no grant can come either way).
#[test]
fn a_cancel_before_the_send_leaves_nothing() {
    let (server, mut d) = setup();
    hold_elsewhere(&server, "k", "other");
    d.err_kind(
        "acquire h=a key=k ttl=30000 wait=5000 cancel=0",
        &["cancelled"],
    );
    wait_until("nobody waits", Duration::from_secs(3), || {
        server.lock_info("k").map(|i| i.waiters) == Some(0)
    });
    server.conn().int(&["LOCK.RELEASE", "k", "other"]);
    nothing_left(&server, &mut d, "k", Duration::from_secs(3));
}

#[test]
fn a_cancel_while_parked_leaves_no_waiter_and_no_grant() {
    let (server, mut d) = setup();
    hold_elsewhere(&server, "k", "other");
    let id = d.send("acquire h=a key=k ttl=30000 wait=10000 cancel=500");
    waiters(&server, "k", 1);
    let reply = d.reply(id);
    assert_eq!(reply.kind, "cancelled", "{:?}", reply.line);
    wait_until("the waiter is gone", Duration::from_secs(3), || {
        server.lock_info("k").map(|i| i.waiters) == Some(0)
    });
    server.conn().int(&["LOCK.RELEASE", "k", "other"]);
    nothing_left(&server, &mut d, "k", Duration::from_secs(3));
}

#[test]
fn a_cancel_while_parked_forever_leaves_no_waiter() {
    let (server, mut d) = setup();
    hold_elsewhere(&server, "k", "other");
    let id = d.send("acquire h=a key=k ttl=30000 wait=forever cancel=500");
    waiters(&server, "k", 1);
    assert_eq!(d.reply(id).kind, "cancelled");
    wait_until("the waiter is gone", Duration::from_secs(3), || {
        server.lock_info("k").map(|i| i.waiters) == Some(0)
    });
    server.conn().int(&["LOCK.RELEASE", "k", "other"]);
    nothing_left(&server, &mut d, "k", Duration::from_secs(3));
}

/// Writes paused for 1.5 s; the acquire goes out, is held by the pause,
/// the client cancels after 300 ms; the pause ends, the server grants:
/// the client must release what it was granted, long before the 30 s lease.
fn grant_in_flight(request: &str) {
    let (server, mut d) = setup();
    let mut conn = server.conn();
    let _: String = conn.value(&["CLIENT", "PAUSE", "1500", "WRITE"]);
    let paused = Instant::now();
    d.err_kind(&format!("{request} ttl=30000 cancel=300"), &["cancelled"]);
    // Past the pause, and the grant with it.
    let left = Duration::from_millis(1700).saturating_sub(paused.elapsed());
    thread::sleep(left);
    nothing_left(&server, &mut d, "k", Duration::from_secs(3));
}

#[test]
fn a_cancelled_try_lock_whose_grant_was_in_flight_is_released() {
    grant_in_flight("acquire h=a key=k");
}

#[test]
fn a_cancelled_try_read_whose_grant_was_in_flight_is_released() {
    grant_in_flight("acquire h=a key=k kind=read");
}

#[test]
fn a_cancelled_try_permit_whose_grant_was_in_flight_is_released() {
    grant_in_flight("acquire h=a key=k kind=permit limit=3");
}

#[test]
fn a_cancelled_wait_whose_grant_was_in_flight_is_released() {
    grant_in_flight("acquire h=a key=k wait=10000");
}

#[test]
fn a_cancelled_wait_for_a_permit_whose_grant_was_in_flight_is_released() {
    grant_in_flight("acquire h=a key=k kind=permit limit=2 wait=10000");
}

/// A wait longer than a third of the ttl is confirmed by a renew; writes
/// are paused right after the grant, so the renew is held up, and the
/// client cancels during it. The hold must be released once writes resume,
/// well before its lease ends.
#[test]
fn a_cancel_during_the_confirming_renew_leaves_nothing() {
    let (server, mut d) = setup();
    hold_elsewhere(&server, "k", "other");
    let id = d.send("acquire h=a key=k ttl=3000 wait=20000 cancel=2000");
    waiters(&server, "k", 1);
    // Counted from when the wait is seen parked, not from the send: the
    // client's call began before that, however slowly its driver started.
    // Past a third of the ttl by its clock too, so the grant needs
    // confirming; and its cancel (2 s after its call began) still comes
    // after the grant (1.2 s after it parked) and inside the pause.
    let parked = Instant::now();
    thread::sleep(Duration::from_millis(1200).saturating_sub(parked.elapsed()));
    let mut conn = server.conn();
    let (): () = redis::pipe()
        .cmd("LOCK.RELEASE")
        .arg("k")
        .arg("other")
        .ignore()
        .cmd("CLIENT")
        .arg("PAUSE")
        .arg("1500")
        .arg("WRITE")
        .ignore()
        .query(&mut conn)
        .expect("release and pause");
    let granted = now_ms();
    let reply = d.reply(id);
    assert_eq!(reply.kind, "cancelled", "{:?}", reply.line);
    // The pause ends 1.5 s after the grant, the lease 3 s after it (the
    // renew, if it lands, pushes it further): free well before that.
    let lease_end = granted + 3_000;
    free_within(&server, "k", Duration::from_secs(3));
    assert!(
        now_ms() < lease_end,
        "the hold was freed by its lease end, not by a release"
    );
    nothing_left(&server, &mut d, "k", Duration::from_secs(3));
}

/// The server sleeps 3 s (`DEBUG SLEEP`) with the try queued behind: a
/// client that stops listening before the reply comes must count the try
/// as cancelled and release the grant it may get; a client that waits it
/// out holds the lock and releases it.
#[test]
fn a_try_whose_reply_comes_too_late_leaves_nothing_held() {
    let (server, mut d) = setup();
    // The client's connections are open before the server sleeps, so the
    // try is sent, not stuck connecting.
    d.ok("acquire h=warm key=w ttl=10000");
    d.ok("release h=warm");
    let mut conn = server.conn();
    let sleeper = thread::spawn(move || {
        let _: String = conn.value(&["DEBUG", "SLEEP", "3"]);
    });
    // DEBUG SLEEP blocks the whole server: wait until it sleeps (a PING
    // from elsewhere stops answering).
    thread::sleep(Duration::from_millis(200));
    let reply = d.call("acquire h=a key=k ttl=30000");
    sleeper.join().expect("the sleeper");
    if reply.ok {
        d.ok("release h=a");
    }
    nothing_left(&server, &mut d, "k", Duration::from_secs(3));
}
