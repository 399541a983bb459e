//! Several at once: a lock on several keys (`acquire keys=…`) taken all or
//! none, released all together, lost when any one key is lost, and never
//! left half-held by a cancel; and several permits of a semaphore
//! (`permits=`) admitted within its limit, first come first served.

use std::thread;
use std::time::{Duration, Instant};

use redis::Value;

use crate::driver::Driver;
use crate::harness::*;

/// Every key of `keys` is free.
fn all_free(server: &Server, keys: &[&str]) {
    for key in keys {
        assert!(
            server.lock_info(key).is_none(),
            "{key} is held: {:?}",
            server.lock_info(key)
        );
    }
}

/// Every key of `keys` is held by `owner`, with the fences in `fences`
/// (the reply's `fences=`), one per key in order.
fn all_held_by(server: &Server, keys: &[&str], owner: &str, fences: &str) {
    let fences: Vec<&str> = fences.split(',').collect();
    assert_eq!(fences.len(), keys.len(), "one fence per key: {fences:?}");
    for (key, fence) in keys.iter().zip(&fences) {
        let info = server
            .lock_info(key)
            .unwrap_or_else(|| panic!("{key} is not held"));
        assert_eq!(info.owner_text(), owner, "{key}'s owner");
        assert_eq!(info.fence.to_string(), *fence, "{key}'s fence");
    }
}

#[test]
fn a_try_takes_every_key_with_a_fence_each_in_key_order() {
    let (server, mut d) = setup();
    let keys = ["k1", "k2", "k3"];
    let reply = d.ok("acquire h=a keys=k1,k2,k3 ttl=10000");
    all_held_by(&server, &keys, reply.field("owner"), reply.field("fences"));
    let fences: Vec<i64> = reply
        .field("fences")
        .split(',')
        .map(|f| f.parse().expect("a fence is an integer"))
        .collect();
    assert!(
        fences.windows(2).all(|pair| pair[0] < pair[1]),
        "fences are issued in key order: {fences:?}"
    );
    assert_eq!(reply.field("fence"), fences[0].to_string());
    let status = d.status("a");
    assert!(status.held && !status.lost, "{status:?}");
    d.ok("release h=a");
    all_free(&server, &keys);
    let status = d.status("a");
    assert!(!status.held && !status.lost, "{status:?}");
    d.err_kind("release h=a", &["not-owner", "lost"]);
    d.no_leaks(Duration::from_secs(5));
}

/// All or none: one key held by another owner, and the try holds nothing
/// on the others.
#[test]
fn a_try_with_one_key_held_elsewhere_is_not_obtained_and_holds_no_key() {
    let (server, mut d) = setup();
    hold_elsewhere(&server, "k2", "other");
    d.err_kind("acquire h=a keys=k1,k2,k3 ttl=10000", &["not-obtained"]);
    all_free(&server, &["k1", "k3"]);
    assert_eq!(
        server.lock_info("k2").expect("still held").owner_text(),
        "other"
    );
    d.no_leaks(Duration::from_secs(5));
}

/// A wait holds none of its keys while one is held elsewhere, and is
/// granted all of them in the step that frees the last.
#[test]
fn a_wait_is_granted_every_key_once_the_last_is_freed() {
    let (server, mut d) = setup();
    hold_elsewhere(&server, "k2", "other");
    let id = d.send("acquire h=a keys=k1,k2 ttl=10000 wait=10000");
    waiters(&server, "k2", 1);
    assert!(server.lock_info("k1").is_none(), "k1 held while waiting");
    server.conn().int(&["LOCK.RELEASE", "k2", "other"]);
    let reply = d.reply(id);
    assert!(reply.ok, "{:?}", reply.line);
    all_held_by(
        &server,
        &["k1", "k2"],
        reply.field("owner"),
        reply.field("fences"),
    );
    d.ok("release h=a");
    all_free(&server, &["k1", "k2"]);
    d.no_leaks(Duration::from_secs(5));
}

#[test]
fn a_wait_that_runs_out_is_a_timeout_and_leaves_no_waiter_on_any_key() {
    let (server, mut d) = setup();
    hold_elsewhere(&server, "k2", "other");
    let start = Instant::now();
    d.err_kind("acquire h=a keys=k1,k2 ttl=10000 wait=300", &["timeout"]);
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(5),
        "a 300 ms wait took {took:?}"
    );
    assert!(server.lock_info("k1").is_none());
    assert_eq!(server.lock_info("k2").expect("held").waiters, 0);
    assert_eq!(blocked(&server), 0);
    d.no_leaks(Duration::from_secs(5));
}

/// Two waits for the same keys in opposite orders, both queued behind a
/// third holder: served one after the other in arrival order, never stuck
/// each holding what the other wants.
#[test]
fn waits_for_the_same_keys_in_crossing_orders_are_served_in_turn() {
    let (server, mut d) = setup();
    hold_elsewhere(&server, "x", "other");
    let first = d.send("acquire h=a keys=x,y ttl=10000 wait=10000");
    waiters(&server, "x", 1);
    let second = d.send("acquire h=b keys=y,x ttl=10000 wait=10000");
    waiters(&server, "x", 2);
    // The second is not granted y, free as it is: the first came before it.
    assert!(server.lock_info("y").is_none(), "y granted out of turn");
    server.conn().int(&["LOCK.RELEASE", "x", "other"]);
    let a = d.reply(first);
    assert!(a.ok, "{:?}", a.line);
    assert!(
        d.reply_within(second, Duration::from_millis(300)).is_none(),
        "both granted at once"
    );
    all_held_by(&server, &["x", "y"], a.field("owner"), a.field("fences"));
    d.ok("release h=a");
    let b = d.reply(second);
    assert!(b.ok, "{:?}", b.line);
    all_held_by(&server, &["y", "x"], b.field("owner"), b.field("fences"));
    d.ok("release h=b");
    all_free(&server, &["x", "y"]);
    d.no_leaks(Duration::from_secs(5));
}

/// Rounds of waits for three keys in every order, all at once: each is
/// released as soon as it is granted, and every one is granted well
/// within its wait (a deadlock would run them out).
#[test]
fn many_waits_in_every_key_order_all_complete() {
    let (server, mut d) = setup();
    let orders = ["x,y,z", "z,y,x", "y,x,z", "z,x,y"];
    for round in 0..5 {
        let mut pending: Vec<(String, u64)> = orders
            .iter()
            .enumerate()
            .map(|(i, keys)| {
                let h = format!("r{round}w{i}");
                let id = d.send(&format!("acquire h={h} keys={keys} ttl=10000 wait=15000"));
                (h, id)
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(15);
        while !pending.is_empty() {
            assert!(
                Instant::now() < deadline,
                "round {round}: still waiting: {pending:?}"
            );
            let mut next = Vec::new();
            for (h, id) in pending {
                match d.reply_within(id, Duration::from_millis(20)) {
                    Some(reply) => {
                        assert!(reply.ok, "round {round}: {:?}", reply.line);
                        d.ok(&format!("release h={h}"));
                    }
                    None => next.push((h, id)),
                }
            }
            pending = next;
        }
    }
    all_free(&server, &["x", "y", "z"]);
    assert_eq!(blocked(&server), 0);
    d.no_leaks(Duration::from_secs(5));
}

/// The loss signal fires when any one key is lost: deleted, or
/// overwritten by another type; one renew for all keys finds it.
fn loss_of_one_key(overwrite: bool) {
    let (server, mut d) = setup();
    d.ok("acquire h=a keys=k1,k2,k3 ttl=3000");
    let gone = Instant::now();
    if overwrite {
        let _: String = server.q(&["SET", "k2", "x", "PX", "60000"]);
    } else {
        server.conn().int(&["DEL", "k2"]);
    }
    // The watchdog renews every third of the lease: 1 s here.
    let event = d.lost("a", Duration::from_secs(5));
    assert_eq!(event.field("reason"), "not-owner", "{event:?}");
    assert!(
        event.at - gone < Duration::from_millis(2_000),
        "lost {:?} after the key went: not at the next renew",
        event.at - gone
    );
    let status = d.status("a");
    assert!(!status.held && status.lost, "{status:?}");
    d.err_kind("renew h=a", &["not-owner", "lost"]);
}

#[test]
fn a_deleted_key_is_a_loss_of_the_whole_hold() {
    loss_of_one_key(false);
}

#[test]
fn a_key_overwritten_by_set_is_a_loss_of_the_whole_hold() {
    loss_of_one_key(true);
}

/// One watchdog for every key: the leases are kept past their ttl by
/// `LOCK.MRENEW`, never by a renew per key.
#[test]
fn one_renew_keeps_every_key() {
    let (server, mut d) = setup();
    d.ok("acquire h=a keys=k1,k2,k3 ttl=1500");
    thread::sleep(Duration::from_millis(3_500));
    let status = d.status("a");
    assert!(status.held && !status.lost, "{status:?}");
    for key in ["k1", "k2", "k3"] {
        assert!(server.lock_info(key).is_some(), "{key} expired");
    }
    let stats: String = server.q(&["INFO", "commandstats"]);
    let calls = |cmd: &str| -> i64 {
        stats
            .lines()
            .find_map(|line| line.strip_prefix(&format!("cmdstat_{cmd}:calls=")))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    assert!(calls("lock.mrenew") >= 2, "{stats}");
    assert_eq!(calls("lock.renew"), 0, "a renew per key: {stats}");
    d.ok("release h=a");
    d.no_leaks(Duration::from_secs(5));
}

#[test]
fn a_renew_with_a_new_ttl_sets_every_keys_lease() {
    let (server, mut d) = setup();
    d.ok("acquire h=a keys=k1,k2 ttl=5000 renew=off");
    d.ok("renew h=a ttl=60000");
    for key in ["k1", "k2"] {
        let pttl: i64 = server.q(&["PTTL", key]);
        assert!(pttl > 50_000 && pttl <= 60_000, "{key}: PTTL {pttl}");
    }
    d.ok("release h=a");
    all_free(&server, &["k1", "k2"]);
}

/// After a cancel: every key free, nobody parked, nothing running.
fn nothing_left_on(server: &Server, d: &mut Driver, keys: &[&str]) {
    for key in keys {
        free_within(server, key, Duration::from_secs(3));
    }
    wait_until("no client is blocked", Duration::from_secs(3), || {
        blocked(server) == 0
    });
    d.no_leaks(Duration::from_secs(3));
}

#[test]
fn a_cancel_while_parked_leaves_no_waiter_and_no_key_held() {
    let (server, mut d) = setup();
    hold_elsewhere(&server, "k2", "other");
    let id = d.send("acquire h=a keys=k1,k2,k3 ttl=30000 wait=forever cancel=500");
    waiters(&server, "k2", 1);
    assert_eq!(d.reply(id).kind, "cancelled");
    wait_until("the waiter is gone", Duration::from_secs(3), || {
        server.lock_info("k2").map(|i| i.waiters) == Some(0)
    });
    server.conn().int(&["LOCK.RELEASE", "k2", "other"]);
    nothing_left_on(&server, &mut d, &["k1", "k2", "k3"]);
}

/// Writes paused: the acquire is held up by the pause, the client cancels,
/// the server grants every key after the pause; the client must give them
/// all back long before the 30 s lease.
fn grant_in_flight(request: &str, keys: &[&str]) {
    let (server, mut d) = setup();
    let mut conn = server.conn();
    let _: String = conn.value(&["CLIENT", "PAUSE", "1500", "WRITE"]);
    let paused = Instant::now();
    d.err_kind(&format!("{request} ttl=30000 cancel=300"), &["cancelled"]);
    thread::sleep(Duration::from_millis(1700).saturating_sub(paused.elapsed()));
    nothing_left_on(&server, &mut d, keys);
}

#[test]
fn a_cancelled_try_whose_grant_was_in_flight_releases_every_key() {
    grant_in_flight("acquire h=a keys=k1,k2,k3", &["k1", "k2", "k3"]);
}

#[test]
fn a_cancelled_wait_whose_grant_was_in_flight_releases_every_key() {
    grant_in_flight("acquire h=a keys=k1,k2,k3 wait=10000", &["k1", "k2", "k3"]);
}

#[test]
fn a_cancelled_wait_for_permits_whose_grant_was_in_flight_is_released() {
    grant_in_flight(
        "acquire h=a key=k1 kind=permit limit=5 permits=3 wait=10000",
        &["k1"],
    );
}

/// A release cancelled while writes are paused: the hold is no longer
/// reported held, and every key is released once the pause ends.
#[test]
fn a_release_that_did_not_complete_lands_on_every_key_later() {
    let (server, mut d) = setup();
    d.ok("acquire h=a keys=k1,k2 ttl=30000");
    let mut conn = server.conn();
    let _: String = conn.value(&["CLIENT", "PAUSE", "1500", "WRITE"]);
    d.err_kind("release h=a cancel=300", &["cancelled"]);
    let status = d.status("a");
    assert!(
        !status.held && status.lost && status.reason == "release-unconfirmed",
        "{status:?}"
    );
    nothing_left_on(&server, &mut d, &["k1", "k2"]);
}

/// The permits each holder of `key` has, from `LOCK.INFO`'s holders (a
/// holder listed without `permits` has one).
fn permits_held(server: &Server, key: &str) -> Vec<i64> {
    let info: Value = server.q(&["LOCK.INFO", key]);
    let pairs = |value: &Value| -> Vec<(String, Value)> {
        match value {
            Value::Array(items) => items
                .chunks(2)
                .filter_map(|pair| Some((text(&pair[0])?, pair.get(1)?.clone())))
                .collect(),
            Value::Map(items) => items
                .iter()
                .filter_map(|(k, v)| Some((text(k)?, v.clone())))
                .collect(),
            _ => Vec::new(),
        }
    };
    let Some((_, Value::Array(holders))) =
        pairs(&info).into_iter().find(|(name, _)| name == "holders")
    else {
        return Vec::new();
    };
    holders
        .iter()
        .map(|holder| {
            pairs(holder)
                .into_iter()
                .find_map(|(name, value)| match (name.as_str(), value) {
                    ("permits", Value::Int(n)) => Some(n),
                    _ => None,
                })
                .unwrap_or(1)
        })
        .collect()
}

#[test]
fn permits_are_admitted_while_they_stay_within_the_limit() {
    let (server, mut d) = setup();
    d.ok("acquire h=p1 key=s kind=permit limit=4 permits=3 ttl=10000");
    assert_eq!(permits_held(&server, "s"), vec![3]);
    d.err_kind(
        "acquire h=p2 key=s kind=permit limit=4 permits=2 ttl=10000",
        &["not-obtained"],
    );
    d.ok("acquire h=p3 key=s kind=permit limit=4 permits=1 ttl=10000");
    assert_eq!(permits_held(&server, "s"), vec![3, 1]);
    d.ok("release h=p1");
    assert_eq!(permits_held(&server, "s"), vec![1]);
    d.ok("acquire h=p4 key=s kind=permit limit=4 permits=3 ttl=10000");
    assert_eq!(permits_held(&server, "s").iter().sum::<i64>(), 4);
    d.ok("release h=p3");
    d.ok("release h=p4");
    assert!(server.lock_info("s").is_none());
    d.no_leaks(Duration::from_secs(5));
}

/// A request for more permits than are free waits at the head of the
/// queue; a smaller one behind it waits behind it (a try is refused) even
/// though enough permits are free for it, and both are served, in order,
/// once the permits come back.
#[test]
fn a_big_request_at_the_head_is_not_overtaken_by_smaller_ones() {
    let (server, mut d) = setup();
    d.ok("acquire h=p1 key=s kind=permit limit=4 permits=2 ttl=10000");
    let big = d.send("acquire h=big key=s kind=permit limit=4 permits=3 ttl=10000 wait=10000");
    waiters(&server, "s", 1);
    d.err_kind(
        "acquire h=try key=s kind=permit limit=4 permits=1 ttl=10000",
        &["not-obtained"],
    );
    let small = d.send("acquire h=small key=s kind=permit limit=4 permits=1 ttl=10000 wait=10000");
    waiters(&server, "s", 2);
    assert!(
        d.reply_within(small, Duration::from_millis(300)).is_none(),
        "the small request overtook the big one"
    );
    assert_eq!(permits_held(&server, "s"), vec![2]);
    d.ok("release h=p1");
    let big = d.reply(big);
    assert!(big.ok, "{:?}", big.line);
    let small = d.reply(small);
    assert!(small.ok, "{:?}", small.line);
    let mut held = permits_held(&server, "s");
    held.sort_unstable();
    assert_eq!(held, vec![1, 3]);
    d.ok("release h=big");
    d.ok("release h=small");
    assert!(server.lock_info("s").is_none());
    d.no_leaks(Duration::from_secs(5));
}

#[test]
fn a_cancelled_wait_for_permits_leaves_no_waiter_and_unblocks_those_behind() {
    let (server, mut d) = setup();
    d.ok("acquire h=p1 key=s kind=permit limit=4 permits=2 ttl=10000");
    let big = d.send(
        "acquire h=big key=s kind=permit limit=4 permits=3 ttl=10000 wait=forever cancel=800",
    );
    waiters(&server, "s", 1);
    let small = d.send("acquire h=small key=s kind=permit limit=4 permits=2 ttl=10000 wait=10000");
    waiters(&server, "s", 2);
    assert_eq!(d.reply(big).kind, "cancelled");
    // The head left: the request behind it fits in the free permits.
    let small = d.reply(small);
    assert!(small.ok, "{:?}", small.line);
    assert_eq!(permits_held(&server, "s"), vec![2, 2]);
    d.ok("release h=p1");
    d.ok("release h=small");
    nothing_left(&server, &mut d, "s", Duration::from_secs(3));
}

/// `ephemeral=1` on a lock on several keys: every key bound to the one
/// connection it was granted on; killing it ends every key and the client
/// signals `disconnected` within milliseconds.
fn ephemeral_on_every_key(request: &str) {
    let (server, mut d) = setup();
    let keys = ["k1", "k2"];
    d.ok(&format!("{request} ttl=30000 ephemeral=1"));
    for key in keys {
        let info = server.lock_info(key).expect("held");
        assert!(
            info.holders.len() == 1 && info.holders[0].ephemeral,
            "{key} not bound to its connection: {info:?}"
        );
    }
    let _: i64 = server.q(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
    let killed = Instant::now();
    let event = d.lost("a", Duration::from_secs(5));
    assert_eq!(event.field("reason"), "disconnected", "{event:?}");
    assert!(
        event.at - killed < Duration::from_millis(500),
        "the loss came {:?} after the connection was killed",
        event.at - killed
    );
    all_free(&server, &keys);
    d.no_leaks(Duration::from_secs(3));
}

#[test]
fn an_ephemeral_try_on_several_keys_binds_every_key() {
    ephemeral_on_every_key("acquire h=a keys=k1,k2");
}

#[test]
fn an_ephemeral_wait_on_several_keys_binds_every_key() {
    ephemeral_on_every_key("acquire h=a keys=k1,k2 wait=5000");
}
