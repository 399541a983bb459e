//! Read-write handles: both sides of one handle (`obj=`) share its owner.
//! The writer may take the read side (a reentry, at once); a reader asking
//! for the write side is refused at once with `upgrade`, never queued
//! behind its own read hold. Giving back a cancelled grant never ends
//! another hold of the same handle.

use std::thread;
use std::time::{Duration, Instant};

use crate::harness::*;

#[test]
fn a_writer_takes_the_read_side_of_its_own_handle_at_once() {
    let (server, mut d) = setup();
    let w = d.ok("acquire h=w key=k kind=write obj=rw ttl=10000");
    let start = Instant::now();
    d.ok("acquire h=r key=k kind=read obj=rw ttl=10000 wait=5000");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "the read side waited"
    );
    let info = server.lock_info("k").expect("held");
    assert_eq!(
        info.owner_text(),
        w.field("owner"),
        "one owner for both sides"
    );
    assert_eq!(info.count, 2, "the read side is a reentry: {info:?}");
    d.ok("release h=r");
    let info = server.lock_info("k").expect("the write side is still held");
    assert_eq!(info.count, 1);
    d.ok("release h=w");
    assert!(server.lock_info("k").is_none());
    d.no_leaks(Duration::from_secs(3));
}

#[test]
fn a_reader_asking_for_the_write_side_is_refused_at_once() {
    let (server, mut d) = setup();
    d.ok("acquire h=r key=k kind=read obj=rw ttl=10000");
    let start = Instant::now();
    d.err_kind(
        "acquire h=w key=k kind=write obj=rw ttl=10000 wait=5000",
        &["upgrade"],
    );
    let took = start.elapsed();
    assert!(
        took < Duration::from_millis(1_000),
        "refused after {took:?}"
    );
    let info = server.lock_info("k").expect("the read side is still held");
    assert_eq!((info.mode.as_str(), info.waiters), ("shared", 0));
    d.ok("release h=r");
    assert!(server.lock_info("k").is_none());
    d.no_leaks(Duration::from_secs(3));
}

#[test]
fn a_reader_trying_for_the_write_side_is_refused_too() {
    let (server, mut d) = setup();
    d.ok("acquire h=r key=k kind=read obj=rw ttl=10000");
    d.err_kind(
        "acquire h=w key=k kind=write obj=rw ttl=10000",
        &["upgrade"],
    );
    d.ok("release h=r");
    assert!(server.lock_info("k").is_none());
}

#[test]
fn two_handles_exclude_each_other() {
    let (server, mut d) = setup();
    d.ok("acquire h=r key=k kind=read obj=one ttl=10000");
    d.ok("acquire h=r2 key=k kind=read obj=two ttl=10000");
    d.err_kind(
        "acquire h=w key=k kind=write obj=three ttl=10000 wait=300",
        &["timeout"],
    );
    assert_eq!(server.lock_info("k").expect("held").holders.len(), 2);
    d.ok("release h=r");
    d.ok("release h=r2");
    assert!(server.lock_info("k").is_none());
}

/// Writes paused; a read through the handle `h` goes out, then a second
/// read through `h`, and the first is cancelled while both grants are held
/// up by the pause. When the pause ends the server grants both to the
/// handle's one owner (the second as a reentry), then gets whatever the
/// client sent to give the cancelled grant back: that must not end the
/// second hold. It is held on the server while the driver says so, and
/// once it is released nothing is left.
#[test]
fn a_cancelled_read_never_undoes_a_later_read_of_its_handle() {
    let (server, mut d) = setup();
    // The client's connections are open before the pause.
    d.ok("acquire h=warm key=w ttl=10000");
    d.ok("release h=warm");
    let mut conn = server.conn();
    let _: String = conn.value(&["CLIENT", "PAUSE", "1500", "WRITE"]);
    let paused = Instant::now();
    let a = d.send("acquire h=a key=k kind=read obj=h ttl=30000 cancel=300");
    let b = d.send("acquire h=b key=k kind=read obj=h ttl=30000");
    let reply = d.reply(a);
    assert_eq!(reply.kind, "cancelled", "{:?}", reply.line);
    let reply = d.reply(b);
    assert!(reply.ok, "the second read: {:?}", reply.line);
    // Past the pause, and whatever was queued behind it.
    thread::sleep(Duration::from_millis(2000).saturating_sub(paused.elapsed()));
    let status = d.status("b");
    assert!(status.held, "the second read: {status:?}");
    let info = server.lock_info("k");
    let holder = info
        .as_ref()
        .and_then(|i| i.holders.iter().find(|h| h.owner == reply.field("owner")));
    assert!(
        holder.is_some(),
        "the driver says b is held, the server holds nothing for its owner: {info:?}"
    );
    d.ok("release h=b");
    nothing_left(&server, &mut d, "k", Duration::from_secs(3));
}
