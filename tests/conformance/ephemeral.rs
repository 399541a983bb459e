//! `ephemeral=1` on every acquire kind: the server shows the hold bound to
//! its connection, and when that connection is killed the client signals
//! the loss (`disconnected`) within milliseconds, not at the next renew.
//! Where a client cannot keep a connection for the hold (Redlock), the
//! acquire is refused, never silently an ordinary hold.

use std::time::{Duration, Instant};

use crate::driver::Driver;
use crate::harness::*;

fn honoured(request: &str) {
    let (server, mut d) = setup();
    d.ok(&format!("{request} ttl=30000 ephemeral=1"));
    let info = server.lock_info("k").expect("held");
    assert_eq!(info.holders.len(), 1, "{info:?}");
    assert!(
        info.holders[0].ephemeral,
        "not bound to its connection: {info:?}"
    );
    // Every connection but ours: the hold's own among them.
    let _: i64 = server.q(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
    let killed = Instant::now();
    let event = d.lost("a", Duration::from_secs(5));
    assert_eq!(event.field("reason"), "disconnected", "{event:?}");
    let after = event.at - killed;
    assert!(
        after < Duration::from_millis(500),
        "the loss came {after:?} after the connection was killed"
    );
    assert!(server.lock_info("k").is_none(), "the server ended the hold");
    let status = d.status("a");
    assert!(!status.held && status.lost, "{status:?}");
    d.no_leaks(Duration::from_secs(3));
}

#[test]
fn an_ephemeral_try_lock_is_bound_to_its_connection() {
    honoured("acquire h=a key=k");
}

#[test]
fn an_ephemeral_waited_lock_is_bound_to_its_connection() {
    honoured("acquire h=a key=k wait=5000");
}

#[test]
fn an_ephemeral_read_lock_is_bound_to_its_connection() {
    honoured("acquire h=a key=k kind=read wait=5000");
}

#[test]
fn an_ephemeral_try_write_lock_is_bound_to_its_connection() {
    honoured("acquire h=a key=k kind=write");
}

#[test]
fn an_ephemeral_try_permit_is_bound_to_its_connection() {
    honoured("acquire h=a key=k kind=permit limit=2");
}

#[test]
fn an_ephemeral_release_frees_the_lock_and_its_connection() {
    let (server, mut d) = setup();
    d.ok("acquire h=a key=k ttl=30000 ephemeral=1");
    d.ok("release h=a");
    assert!(server.lock_info("k").is_none());
    d.no_leaks(Duration::from_secs(3));
}

#[test]
fn redlock_refuses_an_ephemeral_hold() {
    let servers: Vec<Server> = (0..3).map(|_| Server::start()).collect();
    let urls: Vec<String> = servers.iter().map(Server::url).collect();
    let mut d = Driver::start();
    let connected = d.call(&format!("connect topology=redlock urls={}", urls.join(",")));
    if !connected.ok && connected.kind == "unsupported" {
        // A client without Redlock has nothing to refuse.
        return;
    }
    assert!(connected.ok, "{:?}", connected.line);
    d.err_kind("acquire h=a key=k ttl=30000 ephemeral=1", &["refused"]);
    d.err_kind(
        "acquire h=b key=k ttl=30000 wait=1000 ephemeral=1",
        &["refused"],
    );
    for server in &servers {
        assert!(server.lock_info("k").is_none(), "held on {}", server.url());
    }
    // Without it, Redlock works (rounds until a majority answers in time).
    d.ok("acquire h=c key=k ttl=30000 wait=10000");
    // Its release needs each server to answer within Redlock's short
    // timeout, which a loaded machine may miss: not what is checked here.
    let _ = d.call("release h=c");
}
