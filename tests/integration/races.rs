//! Blocked-client races (cleanup and bad input): no blocked
//! client is ever answered twice or never, and the server never crashes,
//! when a hand-off meets `CLIENT UNBLOCK` (nil or `ERROR`) or `CLIENT KILL`
//! in the same pipeline — with and without I/O threads, which let commands
//! run between the module unblocking a client and that client's reply.
//!
//! Each round: alice holds `k`, bob waits on it, and a third connection
//! sends `LOCK.RELEASE k alice` (which hands `k` to bob) with the cut right
//! behind it in the same pipeline or the same `MULTI`, or a fourth sends the
//! cut at once. Whatever bob sees must match the lock: a fence means he holds
//! `k` with that fence; nil or an error means he does not; a closed
//! connection means he holds it or nobody does. Bob's next command (`PING`)
//! must get its own reply, `PONG`, not a second answer to his wait.

use std::time::{Duration, Instant};

use redis::{Connection, Value};

use crate::harness::{error_text, wait_args, wait_until, Call, Server, LONG};

/// Rounds per test, the cuts taken in turn.
const ROUNDS: usize = 600;

/// How long a test waits for something that should happen at once.
const SOON: Duration = Duration::from_secs(5);

/// What follows `LOCK.RELEASE k alice` in the third connection's pipeline.
#[derive(Clone, Copy, Debug)]
enum Cut {
    Unblock,
    UnblockError,
    Kill,
    UnblockThenKill,
}

const CUTS: [Cut; 4] = [
    Cut::Unblock,
    Cut::UnblockError,
    Cut::Kill,
    Cut::UnblockThenKill,
];

/// How bob's wait ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Fence(i64),
    Nil,
    Error(String),
    Closed,
}

/// How the cut travels with the release.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Carrier {
    /// Right behind it in one pipeline.
    Pipeline,
    /// From a fourth connection, at once.
    Split,
    /// In one `MULTI`/`EXEC`: queued while bob still waits, run after the
    /// release granted him `k`.
    Multi,
}

/// What each round ended in, for the summary.
#[derive(Default, Debug)]
struct Tally {
    fence: usize,
    nil: usize,
    error: usize,
    closed_holding: usize,
    closed_free: usize,
}

fn race_rounds(io_threads: bool) {
    let mut builder = Server::builder();
    if io_threads {
        builder = builder
            .config("io-threads", 2)
            .config("io-threads-do-reads", "yes");
    }
    let mut server = builder.start();
    let mut c = server.conn();
    let mut d = server.conn();
    let mut bob: Option<Connection> = None;
    let mut tally = Tally::default();
    let started = Instant::now();

    for round in 0..ROUNDS {
        let cut = CUTS[round % CUTS.len()];
        let carrier = [Carrier::Pipeline, Carrier::Split, Carrier::Multi][(round / CUTS.len()) % 3];
        let context = format!("round {round} ({cut:?}, {carrier:?})");
        let b = bob.get_or_insert_with(|| server.conn());
        let id = b.int(&["CLIENT", "ID"]).to_string();
        c.acquire("k", "alice", LONG)
            .unwrap_or_else(|| panic!("{context}: k is not free at the start"));
        let wait = wait_args("k", "bob", LONG, 0);
        b.send_packed_command(&redis::cmd(&wait[0]).arg(&wait[1..]).get_packed_command())
            .expect("send bob's wait");
        wait_until(&format!("{context}: bob waits"), SOON, || {
            c.lock_info("k").is_some_and(|info| info.waiters == 1)
        });

        // Split: the cut comes from a fourth connection, sent right behind
        // the release: it lands in the same or a later turn of the event
        // loop, as it happens.
        let split = carrier == Carrier::Split;
        let mut pipe = redis::pipe();
        if carrier == Carrier::Multi {
            pipe.atomic();
        }
        if !split {
            pipe.cmd("LOCK.RELEASE").arg(&["k", "alice"]);
        }
        match cut {
            Cut::Unblock => pipe.cmd("CLIENT").arg(&["UNBLOCK", &id]),
            Cut::UnblockError => pipe.cmd("CLIENT").arg(&["UNBLOCK", &id, "ERROR"]),
            Cut::Kill => pipe.cmd("CLIENT").arg(&["KILL", "ID", &id]),
            Cut::UnblockThenKill => pipe
                .cmd("CLIENT")
                .arg(&["UNBLOCK", &id])
                .cmd("CLIENT")
                .arg(&["KILL", "ID", &id]),
        };
        if split {
            let release = redis::cmd("LOCK.RELEASE")
                .arg(&["k", "alice"])
                .get_packed_command();
            c.send_packed_command(&release).expect("send the release");
            let _: Vec<Value> = pipe
                .query(&mut d)
                .unwrap_or_else(|e| panic!("{context}: the cut failed: {e}"));
            let released = c.recv_response().expect("the release's reply");
            assert_eq!(released, Value::Int(0), "{context}: LOCK.RELEASE");
        } else {
            let replies: Vec<Value> = pipe
                .query(&mut c)
                .unwrap_or_else(|e| panic!("{context}: the pipeline failed: {e}"));
            assert_eq!(replies[0], Value::Int(0), "{context}: LOCK.RELEASE");
        }

        let seen = match b.recv_response() {
            Ok(Value::Int(fence)) => Seen::Fence(fence),
            Ok(Value::Nil) => Seen::Nil,
            Ok(Value::ServerError(err)) => Seen::Error(format!(
                "{} {}",
                err.code(),
                err.details().unwrap_or_default()
            )),
            Ok(other) => panic!("{context}: bob's wait replied {other:?}"),
            Err(err) => match error_text(&err) {
                Some(text) => Seen::Error(text),
                None if err.is_timeout() => panic!("{context}: bob got no reply"),
                None => Seen::Closed,
            },
        };
        assert!(
            server.is_alive(),
            "{context}: the server died (bob saw {seen:?})"
        );
        let held = c.lock_info("k");
        let holder = held.as_ref().map(|info| (info.owner.clone(), info.fence));
        match &seen {
            Seen::Fence(fence) => {
                assert_eq!(
                    holder,
                    Some((b"bob".to_vec(), *fence)),
                    "{context}: bob was handed k, but the lock says otherwise"
                );
                tally.fence += 1;
            }
            Seen::Nil | Seen::Error(_) => {
                if let Seen::Error(text) = &seen {
                    assert!(text.starts_with("UNBLOCKED"), "{context}: bob got {text}");
                    tally.error += 1;
                } else {
                    tally.nil += 1;
                }
                assert_eq!(
                    holder, None,
                    "{context}: bob was answered {seen:?} but holds k"
                );
            }
            Seen::Closed => {
                let owner = holder.as_ref().map(|(owner, _)| owner.as_slice());
                assert!(
                    owner.is_none() || owner == Some(b"bob"),
                    "{context}: k is held by {owner:?} after bob's connection closed"
                );
                if owner.is_some() {
                    tally.closed_holding += 1;
                } else {
                    tally.closed_free += 1;
                }
            }
        }
        // Exactly one reply: bob's next command gets its own answer. (A
        // killed bob may have had his reply first; his connection is gone.)
        let killed = matches!(cut, Cut::Kill | Cut::UnblockThenKill);
        if !killed {
            let pong = redis::cmd("PING")
                .query::<Value>(b)
                .map_err(|e| format!("{context}: bob's PING: {e}"));
            assert_eq!(
                pong.as_ref().map(crate::harness::text),
                Ok(Some("PONG".into())),
                "{context}: bob's PING read {pong:?}: a second reply to his wait"
            );
        } else {
            bob = None;
        }
        if holder.is_some() {
            assert_eq!(c.int(&["LOCK.RELEASE", "k", "bob", "ALL"]), 0, "{context}");
        }
        let pong = redis::cmd("PING").query::<String>(&mut c);
        assert!(
            matches!(&pong, Ok(p) if p == "PONG"),
            "{context}: the server does not answer: {pong:?}"
        );
        wait_until(&format!("{context}: nobody waits"), SOON, || {
            c.info_int("lock", "lock_waiting") == 0 && c.info_int("clients", "blocked_clients") == 0
        });
    }

    let log = server.log();
    for sign in ["ASSERTION FAILED", "crashed by signal", "panicked"] {
        assert!(!log.contains(sign), "the server log says {sign:?}");
    }
    println!(
        "{ROUNDS} rounds (io-threads {}): {tally:?} in {:?}",
        if io_threads { "2" } else { "off" },
        started.elapsed()
    );
}

/// hand-off against `CLIENT UNBLOCK`/`KILL`, one I/O thread.
#[test]
fn a_hand_off_raced_by_unblock_or_kill_answers_the_waiter_once_and_truly() {
    race_rounds(false);
}

/// the same with `io-threads 2` and threaded reads.
#[test]
fn a_hand_off_raced_by_unblock_or_kill_answers_once_with_io_threads() {
    race_rounds(true);
}

/// A grant bob never heard of is taken back before the next command runs:
/// one `MULTI` releases `k` (handing it to bob), unblocks bob with `ERROR`,
/// then reads `k`. Bob is told `UNBLOCKED`, so the read must find `k` free,
/// on every server; it used to find bob holding it until a pump timer fired
/// after the commands of the next turn of the event loop.
#[test]
fn a_grant_cut_by_unblock_error_is_gone_for_the_very_next_command() {
    let server = Server::start();
    let mut alice = server.conn();
    for round in 0..20 {
        let context = format!("round {round}");
        let mut bob = server.conn();
        let id = bob.int(&["CLIENT", "ID"]).to_string();
        alice
            .acquire("k", "alice", LONG)
            .unwrap_or_else(|| panic!("{context}: k is not free at the start"));
        let wait = wait_args("k", "bob", LONG, 0);
        bob.send_packed_command(&redis::cmd(&wait[0]).arg(&wait[1..]).get_packed_command())
            .expect("send bob's wait");
        wait_until(&format!("{context}: bob waits"), SOON, || {
            alice.lock_info("k").is_some_and(|info| info.waiters == 1)
        });
        let replies: Vec<Value> = redis::pipe()
            .atomic()
            .cmd("LOCK.RELEASE")
            .arg(&["k", "alice"])
            .cmd("CLIENT")
            .arg(&["UNBLOCK", &id, "ERROR"])
            .cmd("LOCK.INFO")
            .arg("k")
            .query(&mut alice)
            .unwrap_or_else(|e| panic!("{context}: the MULTI failed: {e}"));
        assert_eq!(replies[0], Value::Int(0), "{context}: LOCK.RELEASE");
        assert_eq!(replies[1], Value::Int(1), "{context}: CLIENT UNBLOCK");
        assert_eq!(
            replies[2],
            Value::Nil,
            "{context}: k read in the same MULTI after bob was told UNBLOCKED"
        );
        let told = bob.recv_response();
        assert!(
            matches!(&told, Ok(Value::ServerError(e)) if e.code() == "UNBLOCKED"),
            "{context}: bob's wait replied {told:?}"
        );
        assert_eq!(alice.lock_info("k"), None, "{context}: k after the MULTI");
        let pong: String = redis::cmd("PING").query(&mut bob).expect("bob's PING");
        assert_eq!(pong, "PONG", "{context}: bob's next reply");
    }
}

/// A `CLIENT UNBLOCK` queued in a `MULTI` while bob still waits, whose `EXEC`
/// runs in the same turn of the event loop as the release that hands `k` to
/// bob (a `DEBUG SLEEP` on another connection gathers both into one turn).
/// The unblock then meets a client already granted but not yet answered: bob
/// must get exactly one reply, and it must match the lock (on Redis 7.0 he
/// used to get none at all, and the grant was taken back).
#[test]
fn an_unblock_queued_in_multi_before_the_grant_still_answers_the_waiter_once() {
    const QUEUED_ROUNDS: usize = 12;
    let server = Server::start();
    let mut alice = server.conn();
    let mut queued = server.conn();
    let mut sleeper = server.conn();
    for round in 0..QUEUED_ROUNDS {
        let error = round % 2 == 1;
        let context = format!(
            "round {round} (CLIENT UNBLOCK{})",
            if error { " ERROR" } else { "" }
        );
        let mut bob = server.conn();
        let id = bob.int(&["CLIENT", "ID"]).to_string();
        alice
            .acquire("k", "alice", LONG)
            .unwrap_or_else(|| panic!("{context}: k is not free at the start"));
        let wait = wait_args("k", "bob", LONG, 0);
        bob.send_packed_command(&redis::cmd(&wait[0]).arg(&wait[1..]).get_packed_command())
            .expect("send bob's wait");
        wait_until(&format!("{context}: bob waits"), SOON, || {
            alice.lock_info("k").is_some_and(|info| info.waiters == 1)
        });
        let _: () = redis::cmd("MULTI").query(&mut queued).expect("MULTI");
        let mut unblock = redis::cmd("CLIENT");
        unblock.arg(&["UNBLOCK", &id]);
        if error {
            unblock.arg("ERROR");
        }
        let status: String = unblock.query(&mut queued).expect("queue the unblock");
        assert_eq!(status, "QUEUED", "{context}");

        // One turn of the event loop: the release first, then the EXEC.
        sleeper
            .send_packed_command(
                &redis::cmd("DEBUG")
                    .arg(&["SLEEP", "0.3"])
                    .get_packed_command(),
            )
            .expect("send DEBUG SLEEP");
        // The sleeping server cannot be asked whether it sleeps: give the
        // command time to arrive (the sleep is six times longer).
        std::thread::sleep(Duration::from_millis(50));
        alice
            .send_packed_command(
                &redis::cmd("LOCK.RELEASE")
                    .arg(&["k", "alice"])
                    .get_packed_command(),
            )
            .expect("send the release");
        std::thread::sleep(Duration::from_millis(5));
        queued
            .send_packed_command(&redis::cmd("EXEC").get_packed_command())
            .expect("send EXEC");
        let _ = sleeper.recv_response().expect("DEBUG SLEEP's reply");
        assert_eq!(
            alice.recv_response().expect("the release's reply"),
            Value::Int(0),
            "{context}"
        );
        let exec = queued.recv_response().expect("EXEC's reply");

        bob.set_read_timeout(Some(Duration::from_secs(2)))
            .expect("read timeout");
        let seen = match bob.recv_response() {
            Ok(Value::Int(fence)) => Seen::Fence(fence),
            Ok(Value::Nil) => Seen::Nil,
            Ok(Value::ServerError(err)) => Seen::Error(err.code().to_string()),
            Ok(other) => panic!("{context}: bob's wait replied {other:?}"),
            Err(err) => match error_text(&err) {
                Some(text) => Seen::Error(text),
                None if err.is_timeout() => {
                    panic!("{context}: bob got no reply to his wait (EXEC replied {exec:?})")
                }
                None => Seen::Closed,
            },
        };
        println!("{context}: bob saw {seen:?}, EXEC replied {exec:?}");
        let holder = alice.lock_info("k").map(|info| (info.owner, info.fence));
        match &seen {
            Seen::Fence(fence) => assert_eq!(
                holder,
                Some((b"bob".to_vec(), *fence)),
                "{context}: bob was answered his fence but does not hold k"
            ),
            Seen::Nil | Seen::Error(_) => {
                assert_eq!(
                    holder, None,
                    "{context}: bob was answered {seen:?} but holds k"
                )
            }
            Seen::Closed => panic!("{context}: bob's connection closed"),
        }
        let pong = redis::cmd("PING").query::<Value>(&mut bob);
        assert_eq!(
            pong.as_ref().ok().and_then(crate::harness::text),
            Some("PONG".into()),
            "{context}: bob's PING read {pong:?}: a second reply to his wait"
        );
        if holder.is_some() {
            assert_eq!(
                alice.int(&["LOCK.RELEASE", "k", "bob", "ALL"]),
                0,
                "{context}"
            );
        }
    }
}
