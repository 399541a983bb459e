//! Shared holds: read-write locks (`SHARED`) and counting semaphores
//! (`SHARED LIMIT n`) — who is granted together, the one first-come queue
//! for both modes, each owner's own hold and lease, and the state kept by
//! replication, the AOF, RDB reloads and `DUMP`/`RESTORE`.

use std::thread::JoinHandle;
use std::time::Duration;

use redis::Value;

use crate::harness::*;

const SOON: Duration = Duration::from_secs(5);

/// `LOCK.ACQUIRE key owner ttl [options…]` on `conn`.
fn acquire(conn: &mut redis::Connection, key: &str, owner: &str, ttl: i64, opts: &[&str]) -> Reply {
    let ttl = ttl.to_string();
    let mut args = vec!["LOCK.ACQUIRE", key, owner, ttl.as_str()];
    args.extend_from_slice(opts);
    conn.call(&args)
}

/// A blocking `LOCK.ACQUIRE … [options] WAIT 10000` from a thread of its own.
fn wait_shared(server: &Server, key: &str, owner: &str, opts: &[&str]) -> JoinHandle<Reply> {
    wait_shared_for(server, key, owner, LONG, opts)
}

/// [`wait_shared`] with a lease of `ttl` ms.
fn wait_shared_for(
    server: &Server,
    key: &str,
    owner: &str,
    ttl: i64,
    opts: &[&str],
) -> JoinHandle<Reply> {
    let mut conn = server.conn();
    let ttl = ttl.to_string();
    let mut args: Vec<String> = ["LOCK.ACQUIRE", key, owner, ttl.as_str()]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(opts.iter().map(|s| s.to_string()));
    args.extend(["WAIT".to_string(), "10000".to_string()]);
    std::thread::spawn(move || conn.call(&args))
}

fn fence_of(reply: &Reply) -> i64 {
    match reply {
        Ok(Value::Int(fence)) => *fence,
        other => panic!("expected a fence, got {other:?}"),
    }
}

/// The owners holding `key`, oldest hold first.
fn holders(server: &Server, key: &str) -> Vec<String> {
    server
        .lock_info(key)
        .map(|info| info.holders.into_iter().map(|h| h.owner).collect())
        .unwrap_or_default()
}

fn waiters(server: &Server, key: &str) -> i64 {
    server.lock_info(key).map_or(0, |info| info.waiters)
}

#[test]
fn readers_are_granted_together_and_a_writer_waits_for_all_of_them() {
    let server = Server::start();
    let mut c = server.conn();
    let a = fence_of(&acquire(&mut c, "rw", "a", LONG, &["SHARED"]));
    let b = fence_of(&acquire(&mut c, "rw", "b", LONG, &["SHARED"]));
    assert!(b > a, "every fresh hold gets a new fence");
    let info = server.lock_info("rw").expect("held");
    assert_eq!(
        (info.mode.as_str(), info.limit, info.count),
        ("shared", 0, 2)
    );
    assert!(info.owner.is_empty(), "a shared lock has no one owner");
    assert_eq!(info.fence, b, "the highest fence");
    assert_eq!(holders(&server, "rw"), ["a", "b"]);
    assert_eq!(server.info_int("lock", "lock_shared_held"), 2);
    // Without WAIT a writer gets nil; with it, it waits for both readers.
    assert_eq!(acquire(&mut c, "rw", "w", LONG, &[]), Ok(Value::Nil));
    let writer = wait_shared(&server, "rw", "w", &[]);
    wait_until("the writer waits", SOON, || waiters(&server, "rw") == 1);
    assert_eq!(c.call(&["LOCK.RELEASE", "rw", "a"]), Ok(Value::Int(0)));
    assert!(!writer.is_finished(), "one reader still holds it");
    assert_eq!(holders(&server, "rw"), ["b"]);
    assert_eq!(c.call(&["LOCK.RELEASE", "rw", "b"]), Ok(Value::Int(0)));
    let w = fence_of(&writer.join().expect("writer"));
    assert!(w > b, "a writer's fence is above every reader's");
    let info = server.lock_info("rw").expect("held");
    assert_eq!(
        (info.owner_text().as_str(), info.mode.as_str()),
        ("w", "exclusive")
    );
    assert_eq!(server.info_int("lock", "lock_shared_held"), 0);
}

#[test]
fn readers_behind_a_waiting_writer_wait_and_are_granted_together_after_it() {
    let server = Server::start();
    let mut c = server.conn();
    fence_of(&acquire(&mut c, "q", "r1", LONG, &["SHARED"]));
    let writer = wait_shared(&server, "q", "w", &[]);
    wait_until("the writer waits", SOON, || waiters(&server, "q") == 1);
    // No barging: a reader behind the writer waits, though readers hold it.
    assert_eq!(
        acquire(&mut c, "q", "r2", LONG, &["SHARED"]),
        Ok(Value::Nil)
    );
    let r2 = wait_shared(&server, "q", "r2", &["SHARED"]);
    // r2 in line before r3 asks: the order checked below is theirs.
    wait_until("two wait", SOON, || waiters(&server, "q") == 2);
    let r3 = wait_shared(&server, "q", "r3", &["SHARED"]);
    wait_until("three wait", SOON, || waiters(&server, "q") == 3);
    assert_eq!(holders(&server, "q"), ["r1"]);
    c.call(&["LOCK.RELEASE", "q", "r1"]).expect("release");
    let w = fence_of(&writer.join().expect("writer"));
    assert_eq!(holders(&server, "q"), ["w"]);
    assert!(!r2.is_finished() && !r3.is_finished());
    c.call(&["LOCK.RELEASE", "q", "w"]).expect("release");
    let (f2, f3) = (fence_of(&r2.join().unwrap()), fence_of(&r3.join().unwrap()));
    assert!(f2 > w && f3 > f2, "granted in queue order");
    assert_eq!(holders(&server, "q"), ["r2", "r3"]);
}

#[test]
fn a_semaphore_hands_each_freed_permit_to_the_next_waiter_in_order() {
    let server = Server::start();
    let mut c = server.conn();
    let sem = ["SHARED", "LIMIT", "3"];
    let waits: Vec<_> = (1..=5)
        .map(|i| {
            let owner = format!("p{i}");
            let handle = wait_shared(&server, "sem", &owner, &sem);
            wait_until("it holds or waits", SOON, || {
                holders(&server, "sem").len() + waiters(&server, "sem") as usize == i
            });
            handle
        })
        .collect();
    assert_eq!(holders(&server, "sem"), ["p1", "p2", "p3"]);
    assert_eq!(waiters(&server, "sem"), 2);
    assert_eq!(server.lock_info("sem").unwrap().limit, 3);
    c.call(&["LOCK.RELEASE", "sem", "p2"]).expect("release");
    wait_until("p4 holds", SOON, || {
        holders(&server, "sem") == ["p1", "p3", "p4"]
    });
    assert_eq!(waiters(&server, "sem"), 1, "p5 still waits");
    c.call(&["LOCK.RELEASE", "sem", "p1"]).expect("release");
    wait_until("p5 holds", SOON, || {
        holders(&server, "sem") == ["p3", "p4", "p5"]
    });
    for handle in waits {
        fence_of(&handle.join().expect("waiter"));
    }
}

#[test]
fn a_readers_lease_end_frees_its_permit_to_a_waiter() {
    let server = Server::start();
    let mut c = server.conn();
    fence_of(&acquire(
        &mut c,
        "l",
        "long",
        LONG,
        &["SHARED", "LIMIT", "2"],
    ));
    fence_of(&acquire(
        &mut c,
        "l",
        "short",
        200,
        &["SHARED", "LIMIT", "2"],
    ));
    let waiter = wait_shared(&server, "l", "next", &["SHARED", "LIMIT", "2"]);
    let started = std::time::Instant::now();
    let fence = fence_of(&waiter.join().expect("waiter"));
    assert!(fence > 0);
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_millis(200 + 150),
        "granted {waited:?} after the wait began"
    );
    assert_eq!(holders(&server, "l"), ["long", "next"]);
}

#[test]
fn a_readers_lease_end_ends_its_share_though_nobody_waits() {
    let server = Server::start();
    let mut c = server.conn();
    fence_of(&acquire(&mut c, "e", "long", LONG, &["SHARED"]));
    fence_of(&acquire(&mut c, "e", "short", 100, &["SHARED"]));
    assert_eq!(server.info_int("lock", "lock_shared_held"), 2);
    let started = std::time::Instant::now();
    // INFO reads no key: only the module's own check of the lease ends it.
    wait_until("the short hold ends", SOON, || {
        server.info_int("lock", "lock_shared_held") == 1
    });
    assert!(started.elapsed() < Duration::from_millis(100 + 150));
    assert_eq!(server.info_int("lock", "lock_expired_held"), 1);
    assert_eq!(holders(&server, "e"), ["long"]);
}

#[test]
fn limits_must_match_and_a_refusal_changes_nothing() {
    let server = Server::start();
    let mut c = server.conn();
    fence_of(&acquire(&mut c, "m", "a", LONG, &["SHARED", "LIMIT", "2"]));
    let before = server.lock_info("m");
    for opts in [&["SHARED"][..], &["SHARED", "LIMIT", "3"]] {
        let err = acquire(&mut c, "m", "b", LONG, opts).expect_err("a mismatch is refused");
        assert!(
            err.starts_with("ERR the lock is shared with another LIMIT"),
            "{err}"
        );
    }
    assert_eq!(
        server.lock_info("m").map(|i| i.held()),
        before.map(|i| i.held())
    );
    // A waiting shared request's limit binds too, once the lock is free.
    fence_of(&acquire(&mut c, "x", "w", LONG, &[]));
    let waiter = wait_shared(&server, "x", "r", &["SHARED", "LIMIT", "5"]);
    wait_until("it waits", SOON, || waiters(&server, "x") == 1);
    let err = acquire(&mut c, "x", "s", LONG, &["SHARED"]).expect_err("mismatch");
    assert!(err.contains("LIMIT"), "{err}");
    c.call(&["LOCK.RELEASE", "x", "w"]).expect("release");
    fence_of(&waiter.join().unwrap());
}

#[test]
fn a_reader_may_not_upgrade_but_a_writer_may_read() {
    let server = Server::start();
    let mut c = server.conn();
    let f = fence_of(&acquire(&mut c, "u", "r", LONG, &["SHARED"]));
    let err = acquire(&mut c, "u", "r", LONG, &[]).expect_err("upgrade refused");
    assert!(
        err.starts_with("ERR the owner holds the lock shared"),
        "{err}"
    );
    assert_eq!(server.lock_info("u").unwrap().holders[0].count, 1);
    // A reader asking SHARED again reenters.
    assert_eq!(
        acquire(&mut c, "u", "r", LONG, &["SHARED"]),
        Ok(Value::Int(f))
    );
    assert_eq!(server.lock_info("u").unwrap().holders[0].count, 2);
    let w = fence_of(&acquire(&mut c, "v", "w", LONG, &[]));
    assert_eq!(
        acquire(&mut c, "v", "w", LONG, &["SHARED"]),
        Ok(Value::Int(w))
    );
    let info = server.lock_info("v").unwrap();
    assert_eq!(
        (info.mode.as_str(), info.count, info.fence),
        ("exclusive", 2, w)
    );
}

#[test]
fn each_owner_renews_reenters_fences_and_releases_its_own_hold() {
    let server = Server::start();
    let mut c = server.conn();
    let fa = fence_of(&acquire(&mut c, "o", "a", 60_000, &["SHARED"]));
    fence_of(&acquire(&mut c, "o", "b", 30_000, &["SHARED"]));
    assert_eq!(c.call(&["LOCK.REENTER", "o", "a"]), Ok(Value::Int(2)));
    assert_eq!(
        c.call(&["LOCK.RENEW", "o", "b", "90000"]),
        Ok(Value::Int(1))
    );
    let pttl = c.pttl("o");
    assert!(
        pttl > 60_000 && pttl <= 90_000,
        "the key's TTL is the latest lease: {pttl}"
    );
    let raised = fa + 1_000;
    let got = c.call(&["LOCK.FENCE", "o", "a", &raised.to_string()]);
    assert_eq!(got, Ok(Value::Int(raised)));
    let err = c
        .call(&["LOCK.RENEW", "o", "z", "1000"])
        .expect_err("not a holder");
    assert!(err.starts_with("NOTOWNER"), "{err}");
    let info = server.lock_info("o").unwrap();
    let a = &info.holders[0];
    assert_eq!((a.owner.as_str(), a.count, a.fence), ("a", 2, raised));
    assert!(info.holders[1].ttl > 60_000);
    assert_eq!(c.call(&["LOCK.RELEASE", "o", "a"]), Ok(Value::Int(1)));
    assert_eq!(c.call(&["LOCK.RELEASE", "o", "a"]), Ok(Value::Int(0)));
    assert_eq!(holders(&server, "o"), ["b"]);
    // A new hold after a raised fence is above it, in either mode.
    let fc = fence_of(&acquire(&mut c, "o", "c", LONG, &["SHARED"]));
    assert!(fc > raised);
    assert_eq!(
        c.call(&["LOCK.RELEASE", "o", "b", "ALL"]),
        Ok(Value::Int(0))
    );
    assert_eq!(c.call(&["LOCK.RELEASE", "o", "c"]), Ok(Value::Int(0)));
    assert_eq!(
        c.int(&["EXISTS", "o"]),
        0,
        "the key goes with the last hold"
    );
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let server = Server::start();
    let mut c = server.conn();
    fence_of(&acquire(&mut c, "b", "a", LONG, &["SHARED"]));
    let before = server.lock_info("b").map(|i| i.held());
    let cases: [(&[&str], &str); 7] = [
        (&["LIMIT", "3"], "ERR syntax error"),
        (&["SHARED", "LIMIT"], "ERR syntax error"),
        (&["SHARED", "SHARED"], "ERR syntax error"),
        (&["SHARED", "WAIT"], "ERR syntax error"),
        (&["SHARED", "EPHEMERAL", "EPHEMERAL"], "ERR syntax error"),
        (
            &["SHARED", "LIMIT", "0"],
            "ERR LIMIT must be an integer from 1 to 1000000",
        ),
        (
            &["SHARED", "LIMIT", "1000001"],
            "ERR LIMIT must be an integer from 1 to 1000000",
        ),
    ];
    for (opts, want) in cases {
        let got = acquire(&mut c, "b", "n", LONG, opts);
        assert_eq!(got, Err(want.to_string()), "{opts:?}");
    }
    assert_eq!(server.lock_info("b").map(|i| i.held()), before);
    assert_eq!(holders(&server, "b"), ["a"]);
}

/// What must survive a copy of a shared lock: holders with counts,
/// fences and lease ends (ttl within the time the copy took).
fn state(server: &Server, key: &str) -> (String, i64, Vec<(String, i64, i64)>) {
    let info = server.lock_info(key).expect("held");
    let holders = info
        .holders
        .iter()
        .map(|h| (h.owner.clone(), h.count, h.fence))
        .collect();
    (info.mode, info.limit, holders)
}

fn make_shared(server: &Server, key: &str) {
    let mut c = server.conn();
    fence_of(&acquire(&mut c, key, "a", LONG, &["SHARED", "LIMIT", "4"]));
    fence_of(&acquire(
        &mut c,
        key,
        "b",
        LONG / 2,
        &["SHARED", "LIMIT", "4"],
    ));
    c.call(&["LOCK.REENTER", key, "b"]).expect("reenter");
}

#[test]
fn a_replica_ends_with_the_masters_holders() {
    let master = Server::builder().label("master").start();
    let replica = start_replica(&master, "replica");
    make_shared(&master, "s");
    let mut m = master.conn();
    m.call(&["LOCK.RENEW", "s", "a", "500000"]).expect("renew");
    m.wait_replicas(1);
    replica.catch_up_with(&master);
    assert_eq!(state(&replica, "s"), state(&master, "s"));
    let lease_end = |server: &Server| server.conn().int(&["PEXPIRETIME", "s"]);
    assert_eq!(lease_end(&replica), lease_end(&master));
    assert_eq!(replica.digest(), master.digest());
    m.call(&["LOCK.RELEASE", "s", "a"]).expect("release");
    m.wait_replicas(1);
    replica.catch_up_with(&master);
    assert_eq!(state(&replica, "s"), state(&master, "s"));
}

#[test]
fn holders_survive_reload_aof_restart_and_dump_restore() {
    let mut server = Server::builder().appendonly(false).start();
    make_shared(&server, "s");
    let want = state(&server, "s");
    server.restart();
    assert_eq!(state(&server, "s"), want, "after an AOF restart");
    let mut c = server.conn();
    c.call(&["BGREWRITEAOF"]).expect("rewrite");
    server.wait_for_aof_rewrite();
    server.restart();
    assert_eq!(state(&server, "s"), want, "after a rewritten AOF");
    let mut c = server.conn();
    c.call(&["DEBUG", "RELOAD"]).expect("reload");
    assert_eq!(state(&server, "s"), want, "after DEBUG RELOAD");
    let dump: Vec<u8> = redis::cmd("DUMP").arg("s").query(&mut c).expect("dump");
    redis::cmd("RESTORE")
        .arg("t")
        .arg(0)
        .arg(dump)
        .query::<()>(&mut c)
        .expect("restore");
    assert_eq!(state(&server, "t"), want, "a restored copy");
}

#[test]
fn the_quarantine_begins_no_hold_of_either_mode_and_serves_readers_together_after() {
    let server = Server::builder().config("lock.max-ttl", 1_000).start();
    let mut c = server.conn();
    assert!(
        server.info_int("lock", "lock_quarantine_ms") > 0,
        "a start quarantine"
    );
    assert_eq!(
        acquire(&mut c, "qr", "a", 1_000, &["SHARED"]),
        Ok(Value::Nil)
    );
    assert_eq!(
        acquire(&mut c, "qr", "a", 1_000, &["SHARED", "LIMIT", "2"]),
        Ok(Value::Nil)
    );
    assert_eq!(server.lock_info("qr"), None);
    let readers = ["r1", "r2"].map(|owner| {
        let handle = wait_shared_for(&server, "qr", owner, 1_000, &["SHARED"]);
        wait_until("it waits", SOON, || {
            server.info_int("lock", "lock_waiting") as usize >= owner[1..].parse().unwrap()
        });
        handle
    });
    assert!(
        readers.iter().all(|r| !r.is_finished()),
        "nothing granted in quarantine"
    );
    for reader in readers {
        fence_of(&reader.join().expect("reader"));
    }
    assert_eq!(server.info_int("lock", "lock_quarantine_ms"), 0);
    assert_eq!(holders(&server, "qr"), ["r1", "r2"]);
}

/// A shared grant its client never heard of is taken back before the next
/// command runs: one `MULTI` releases a writer's hold (granting it to a
/// waiting reader), unblocks that reader with `ERROR`, then reads the lock,
/// which must show no reader: the reader was told `UNBLOCKED`.
#[test]
fn a_shared_grant_cut_by_unblock_error_is_gone_for_the_very_next_command() {
    let server = Server::start();
    let mut alice = server.conn();
    fence_of(&acquire(&mut alice, "k", "reader-0", LONG, &["SHARED"]));
    fence_of(&acquire(&mut alice, "w", "alice", LONG, &[]));
    for (key, first) in [("k", "reader-0"), ("w", "alice")] {
        let mut bob = server.conn();
        let id = bob.int(&["CLIENT", "ID"]).to_string();
        // A writer waits behind reader-0 on `k`, so bob queues behind it.
        let blocker = (key == "k").then(|| wait_shared(&server, "k", "writer", &[]));
        let before = if key == "k" { 1 } else { 0 };
        wait_until("the blocker waits", SOON, || {
            waiters(&server, key) == before
        });
        let wait = ["LOCK.ACQUIRE", key, "bob", "600000", "SHARED", "WAIT", "0"];
        bob.send_packed_command(&redis::cmd(wait[0]).arg(&wait[1..]).get_packed_command())
            .expect("send bob's wait");
        wait_until("bob waits", SOON, || waiters(&server, key) == before + 1);
        if let Some(blocker) = blocker {
            // The writer goes first, then releases inside the MULTI below.
            alice.call(&["LOCK.RELEASE", key, first]).expect("release");
            fence_of(&blocker.join().expect("writer"));
        }
        let holder = if key == "k" { "writer" } else { first };
        let replies: Vec<Value> = redis::pipe()
            .atomic()
            .cmd("LOCK.RELEASE")
            .arg(&[key, holder])
            .cmd("CLIENT")
            .arg(&["UNBLOCK", &id, "ERROR"])
            .cmd("LOCK.INFO")
            .arg(key)
            .query(&mut alice)
            .expect("the MULTI");
        assert_eq!(replies[0], Value::Int(0), "{key}: LOCK.RELEASE");
        assert_eq!(replies[1], Value::Int(1), "{key}: CLIENT UNBLOCK");
        assert_eq!(
            replies[2],
            Value::Nil,
            "{key}: read after bob was told UNBLOCKED"
        );
        let told = bob.recv_response();
        assert!(
            matches!(&told, Ok(Value::ServerError(e)) if e.code() == "UNBLOCKED"),
            "{key}: bob's wait replied {told:?}"
        );
        assert_eq!(server.lock_info(key), None, "{key} after the MULTI");
    }
}

/// A blocking `LOCK.ACQUIRE key owner LONG [options] WAIT wait_ms` sent on a
/// connection of its own, once the server shows it waiting; returns that
/// connection (to read its reply, or to drop) and its client id.
fn queued(
    server: &Server,
    key: &str,
    owner: &str,
    opts: &[&str],
    wait_ms: i64,
) -> (redis::Connection, i64) {
    let before = waiters(server, key);
    let mut conn = server.conn();
    let id = conn.int(&["CLIENT", "ID"]);
    let long = LONG.to_string();
    let wait = wait_ms.to_string();
    let mut cmd = redis::cmd("LOCK.ACQUIRE");
    cmd.arg(&[key, owner, &long])
        .arg(opts)
        .arg(&["WAIT", &wait]);
    conn.send_packed_command(&cmd.get_packed_command())
        .expect("send the wait");
    wait_until(&format!("{owner} waits on {key}"), SOON, || {
        waiters(server, key) == before + 1
    });
    (conn, id)
}

/// A reader that waited only behind a writer joins the readers holding the
/// lock as soon as the writer leaves the queue — by its timeout, `CLIENT
/// UNBLOCK` or a disconnect — for a read lock and a semaphore alike; it is
/// not left waiting for the next holder's command or lease end.
#[test]
fn readers_behind_a_writer_that_leaves_the_queue_are_granted_at_once() {
    let server = Server::start();
    let mut c = server.conn();
    for (key, opts) in [("rw", &["SHARED"][..]), ("sem", &["SHARED", "LIMIT", "3"])] {
        for how in ["timeout", "unblock", "disconnect"] {
            let key = format!("{key}:{how}");
            fence_of(&acquire(&mut c, &key, "a", LONG, opts));
            let wait_ms = if how == "timeout" { 300 } else { 0 };
            let (writer, writer_id) = queued(&server, &key, "w", &[], wait_ms);
            let (mut reader, _) = queued(&server, &key, "r", opts, 0);
            match how {
                "unblock" => {
                    c.int(&["CLIENT", "UNBLOCK", &writer_id.to_string()]);
                }
                "disconnect" => {
                    c.int(&["CLIENT", "KILL", "ID", &writer_id.to_string()]);
                }
                _ => {}
            }
            // A's lease is ten minutes: only the writer's leaving can let r in.
            reader
                .set_read_timeout(Some(Duration::from_secs(3)))
                .expect("read timeout");
            let granted = reader.recv_response();
            assert!(
                matches!(granted, Ok(Value::Int(_))),
                "{key}: the reader behind the writer got {granted:?}"
            );
            assert_eq!(holders(&server, &key), ["a", "r"], "{key}");
            assert_eq!(waiters(&server, &key), 0, "{key}");
            // A newcomer is not turned away by a queue that is empty now.
            fence_of(&acquire(&mut c, &key, "n", LONG, opts));
            drop(writer);
        }
    }
}

/// One shared hold's lease ends while another remains: that share ends,
/// and nothing is announced as acquired (nothing was).
#[test]
fn a_shared_hold_whose_lease_ends_beside_others_announces_no_acquisition() {
    let server = Server::start();
    let mut c = server.conn();
    let _: () = c.value(&["CONFIG", "SET", "notify-keyspace-events", "Egxdn"]);
    let mut listener = keyevent_listener(&server);
    fence_of(&acquire(&mut c, "e", "long", LONG, &["SHARED"]));
    fence_of(&acquire(&mut c, "e", "short", 100, &["SHARED"]));
    assert_eq!(
        events_until(&mut listener, "e", "lock.acquire"),
        ["new", "lock.acquire"]
    );
    assert_eq!(
        events_until(&mut listener, "e", "lock.acquire"),
        ["lock.acquire"]
    );
    wait_until("the short hold ends", SOON, || {
        server.info_int("lock", "lock_shared_held") == 1
    });
    c.int(&["LOCK.RENEW", "e", "long", &LONG.to_string()]);
    assert_eq!(
        events_until(&mut listener, "e", "lock.renew"),
        ["lock.renew"],
        "events between the two: the end of a share is no acquisition"
    );
}

/// `DEBUG DIGEST-VALUE` tells an exclusive hold, a read lock and a
/// semaphore apart though owner, count, fence and lease are the same: the
/// three are made by `RESTORE` from one payload that differs only in the
/// mode and limit (checksums off).
#[test]
fn the_digest_covers_mode_and_limit() {
    let server = Server::start();
    let mut c = server.conn();
    fence_of(&acquire(
        &mut c,
        "src",
        "o",
        LONG,
        &["SHARED", "LIMIT", "7"],
    ));
    let dump: Vec<u8> = c.value(&["DUMP", "src"]);
    // The value's first unsigned numbers: mode 1 (shared), limit 7, one
    // holder, each an RDB module unsigned (opcode 2, then the number).
    let shared_7 = [2u8, 1, 2, 7, 2, 1];
    let at = dump
        .windows(shared_7.len())
        .position(|w| w == shared_7)
        .expect("mode and limit in the payload");
    let _: () = c.value(&["DEBUG", "SET-SKIP-CHECKSUM-VALIDATION", "1"]);
    let mut digests = Vec::new();
    for (key, mode, limit) in [("x", 0u8, 0u8), ("r", 1, 0), ("s", 1, 7)] {
        let mut payload = dump.clone();
        payload[at + 1] = mode;
        payload[at + 3] = limit;
        let _: () = redis::cmd("RESTORE")
            .arg(key)
            .arg(0)
            .arg(payload)
            .query(&mut c)
            .expect("RESTORE");
        let info = server.lock_info(key).expect("restored");
        let want = if mode == 0 { "exclusive" } else { "shared" };
        assert_eq!((info.mode.as_str(), info.limit), (want, i64::from(limit)));
        let digest: Vec<String> = c.value(&["DEBUG", "DIGEST-VALUE", key]);
        digests.push(digest[0].clone());
    }
    assert_ne!(digests[0], digests[1], "exclusive vs read lock");
    assert_ne!(digests[0], digests[2], "exclusive vs semaphore");
    assert_ne!(digests[1], digests[2], "read lock vs semaphore");
}

/// An owner waits shared on one connection and exclusively on another;
/// when the holder releases, the first is granted its shared hold and the
/// second reaches the head holding the lock shared: it gets the upgrade
/// error then, not a nil as if its wait had timed out.
#[test]
fn a_queued_upgrade_is_answered_the_upgrade_error() {
    let server = Server::start();
    let mut c = server.conn();
    fence_of(&acquire(&mut c, "u", "holder", LONG, &[]));
    let (mut shared, _) = queued(&server, "u", "o", &["SHARED"], 0);
    let (mut exclusive, _) = queued(&server, "u", "o", &[], 2000);
    c.int(&["LOCK.RELEASE", "u", "holder"]);
    fence_of(&shared.recv_response().map_err(|e| e.to_string()));
    let answer = format!("{:?}", exclusive.recv_response());
    assert!(
        answer.contains("the owner holds the lock shared"),
        "the queued upgrade got {answer}, not the upgrade error"
    );
    assert_eq!(holders(&server, "u"), ["o"]);
    assert_eq!(waiters(&server, "u"), 0);
}
