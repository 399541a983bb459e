//! Leases count real time: a step of the server's wall clock, forward or
//! backward, neither shortens nor lengthens a lease, a `WAIT` timeout or a
//! quarantine, and fences keep rising. Each server here runs under
//! [`ClockShift`] (a preload shim that moves its wall clock and leaves its
//! monotonic clock alone), and every check is made on this process's
//! monotonic clock ([`Instant`]): the lease as the holder counts it, from
//! the moment it sent the request.
//!
//! Each test prints what it measured (`--nocapture`): the overlap of a
//! second holder with the first one's lease, and how long after the lease
//! end a waiter took over.

use std::time::{Duration, Instant};

use redis::{Connection, Value};

use crate::harness::{
    wait_on_timed, wait_until, Call, ClockShift, Reply, Server, ServerBuilder, LONG,
};

/// The size of every step: far beyond any lease here, so that a lease
/// counted on the wall clock visibly ends (or lasts) a step too early (late).
const STEP_MS: i64 = 60_000;

/// How late after the lease end a lock may be taken over: a few ms on a
/// quiet machine, generous on a loaded one, and far below a step.
const LATE_MS: i64 = 250;

/// How early a deadline may fire, for the test's clock against the
/// server's (the server counts from when the request arrived).
const EARLY_MS: i64 = 5;

fn stepped(shift: &ClockShift) -> ServerBuilder {
    Server::builder().label("stepped").clock_shift(shift)
}

/// Milliseconds since `origin` on this process's monotonic clock.
fn since(origin: Instant, at: Instant) -> i64 {
    i64::try_from(at.saturating_duration_since(origin).as_millis()).expect("ms")
}

/// `LOCK.ACQUIRE key owner ttl` sent now: the fence (or `None`) and the
/// moment the reply came.
fn try_acquire(c: &mut Connection, key: &str, owner: &str, ttl: i64) -> (Option<i64>, Instant) {
    let fence = c.acquire(key, owner, ttl);
    (fence, Instant::now())
}

/// Polls `LOCK.ACQUIRE key owner ttl` every 2 ms until it is granted or
/// `until`: the fence and when it came.
fn poll_acquire(
    c: &mut Connection,
    key: &str,
    owner: &str,
    ttl: i64,
    until: Instant,
) -> Option<(i64, Instant)> {
    while Instant::now() < until {
        if let (Some(fence), at) = try_acquire(c, key, owner, ttl) {
            return Some((fence, at));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}

/// Asserts `taker` got the lock `got` ms (on the test's clock) after the
/// holder's lease, which ran from `sent_ms` (request sent) to at least
/// `sent_ms + lease`, and at most `replied_ms + lease`: never before, and
/// at most [`LATE_MS`] after.
fn assert_taken_at_lease_end(what: &str, got: i64, sent_ms: i64, replied_ms: i64, lease: i64) {
    let overlap = sent_ms + lease - got;
    let late = got - (replied_ms + lease);
    eprintln!("{what}: overlap {overlap} ms, takeover {late:+} ms after the lease end");
    assert!(
        overlap <= 0,
        "{what}: a second holder at {got} ms, {overlap} ms inside the first one's lease"
    );
    assert!(
        late <= LATE_MS,
        "{what}: taken over {late} ms after the lease end (allowed {LATE_MS})"
    );
}

/// A forward step while A holds and renews: nobody else gets the lock while
/// A's lease runs; when A stops renewing (a crash), B takes over at the end
/// of A's last lease.
#[test]
fn a_forward_step_does_not_end_a_renewed_lease_early() {
    let mut shift = ClockShift::new();
    let server = stepped(&shift).start();
    let (mut a, mut b) = (server.conn(), server.conn());
    const LEASE: i64 = 2_000;
    let origin = Instant::now();
    let (fence_a, replied) = try_acquire(&mut a, "k", "A", LEASE);
    let fence_a = fence_a.expect("A acquires");
    let (mut sent_ms, mut replied_ms) = (0, since(origin, replied));
    let mut renewals = 0;
    let mut stepped_at = None;
    let taken = loop {
        let now_ms = since(origin, Instant::now());
        assert!(now_ms < 4 * LEASE + 2 * LATE_MS, "B never got the lock");
        // A renews every 600 ms, three times, then goes away.
        if renewals < 3 && now_ms >= 600 * (renewals + 1) {
            let sent = Instant::now();
            let renewed = a.call(&["LOCK.RENEW", "k", "A", &LEASE.to_string()]);
            assert_eq!(renewed, Ok(Value::Int(1)), "A renews (renewal {renewals})");
            (sent_ms, replied_ms) = (since(origin, sent), since(origin, Instant::now()));
            renewals += 1;
        }
        // Between the first and second renewal, the wall clock jumps ahead.
        if renewals == 1 && stepped_at.is_none() && now_ms >= 900 {
            shift.step(STEP_MS);
            stepped_at = Some(now_ms);
        }
        if let (Some(fence), at) = try_acquire(&mut b, "k", "B", LEASE) {
            assert!(fence > fence_a, "B's fence {fence} above A's {fence_a}");
            break since(origin, at);
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    eprintln!("forward step at {stepped_at:?} ms, {renewals} renewals, B at {taken} ms");
    assert_taken_at_lease_end(
        "forward step, renewing holder",
        taken,
        sent_ms,
        replied_ms,
        LEASE,
    );
    assert_eq!(renewals, 3, "A renewed three times before B got the lock");
}

/// A backward step after the holder crashed: a waiter is handed the lock at
/// the lease end, not a step later; the new fence is above the old one.
#[test]
fn a_backward_step_does_not_keep_a_crashed_holders_lock() {
    let mut shift = ClockShift::new();
    let server = stepped(&shift).start();
    let (mut a, mut b) = (server.conn(), server.conn());
    const LEASE: i64 = 1_500;
    let origin = Instant::now();
    let (fence_a, replied) = try_acquire(&mut a, "k", "A", LEASE);
    let fence_a = fence_a.expect("A acquires");
    let replied_ms = since(origin, replied);
    // A crashes (sends nothing more); the wall clock jumps back.
    shift.step(-STEP_MS);
    // A waiter parks before the lease end; a poller tries too.
    let waiter = wait_on_timed(server.conn(), "k", "W", LONG, LEASE + 3_000);
    wait_until("W waits", Duration::from_secs(5), || {
        server.lock_info("k").is_some_and(|info| info.waiters == 1)
    });
    let until = origin + Duration::from_millis((2 * LEASE + 3 * LATE_MS) as u64);
    let polled = poll_acquire(&mut b, "k", "B", LEASE, until);
    let (reply, at) = waiter.join().expect("W's thread");
    let handed_ms = since(origin, at);
    eprintln!("backward step: W's reply {reply:?} at {handed_ms} ms, B polled {polled:?}");
    let Ok(Value::Int(fence_w)) = reply else {
        panic!("W was not handed the lock within {LATE_MS} ms of the lease end: {reply:?}");
    };
    assert!(fence_w > fence_a, "W's fence {fence_w} above A's {fence_a}");
    assert!(polled.is_none(), "B got the lock W was handed: {polled:?}");
    assert_taken_at_lease_end(
        "backward step, crashed holder",
        handed_ms,
        0,
        replied_ms,
        LEASE,
    );
}

/// A `WAIT` timeout counts elapsed time: after a step either way, a waiter
/// behind a long hold gets its nil when its timeout has run, not at once
/// and not a step later.
#[test]
fn wait_timeouts_count_elapsed_time_across_steps() {
    let mut shift = ClockShift::new();
    let server = stepped(&shift).start();
    let mut holder = server.conn();
    // Far longer than a step: no step ends it on any clock.
    assert!(holder.acquire("k", "H", 10 * STEP_MS).is_some());
    const TIMEOUT: i64 = 1_500;
    for step in [STEP_MS, -2 * STEP_MS] {
        let sent = Instant::now();
        let waiter = wait_on_timed(server.conn(), "k", "W", LONG, TIMEOUT);
        wait_until("W waits", Duration::from_secs(5), || {
            server.lock_info("k").is_some_and(|info| info.waiters == 1)
        });
        shift.step(step);
        let deadline = sent + Duration::from_millis((TIMEOUT + 2 * LATE_MS + 9_000) as u64);
        wait_until("W gets a reply", deadline - Instant::now(), || {
            waiter.is_finished()
        });
        let (reply, at) = waiter.join().expect("W's thread");
        let after = since(sent, at);
        eprintln!("WAIT {TIMEOUT} ms across a {step:+} ms step: reply {reply:?} after {after} ms");
        assert_eq!(reply, Ok(Value::Nil), "W times out (step {step:+})");
        assert!(
            (TIMEOUT - EARLY_MS..=TIMEOUT + LATE_MS).contains(&after),
            "W's {TIMEOUT} ms timeout ended after {after} ms (step {step:+})"
        );
        assert_eq!(
            holder.lock_info("k").map(|i| i.owner_text()),
            Some("H".into())
        );
    }
}

/// Shared holds across a forward step: both readers keep their holds until
/// their leases end; a writer gets the lock then, not at the step.
#[test]
fn a_forward_step_does_not_end_shared_holds_early() {
    let mut shift = ClockShift::new();
    let server = stepped(&shift).start();
    let (mut r, mut w) = (server.conn(), server.conn());
    const LEASE: i64 = 1_500;
    let origin = Instant::now();
    for reader in ["r1", "r2"] {
        let got = r.call(&["LOCK.ACQUIRE", "rw", reader, &LEASE.to_string(), "SHARED"]);
        assert!(matches!(got, Ok(Value::Int(_))), "{reader}: {got:?}");
    }
    let replied_ms = since(origin, Instant::now());
    shift.step(STEP_MS);
    let until = origin + Duration::from_millis((2 * LEASE + 3 * LATE_MS) as u64);
    let (_, at) = poll_acquire(&mut w, "rw", "W", LEASE, until).expect("W gets the lock");
    assert_taken_at_lease_end(
        "forward step, shared holds",
        since(origin, at),
        0,
        replied_ms,
        LEASE,
    );
}

/// A quarantine counts elapsed time: a forward step does not end it early.
#[test]
fn a_forward_step_does_not_end_a_quarantine_early() {
    let mut shift = ClockShift::new();
    const QUARANTINE: i64 = 2_000;
    let server = stepped(&shift).config("lock.max-ttl", QUARANTINE).start();
    let mut c = server.conn();
    let origin = Instant::now();
    let left = c.info_int("lock", "lock_quarantine_ms");
    assert!(left > 0, "a quarantine after the start: {left} ms left");
    shift.step(STEP_MS);
    let until = origin + Duration::from_millis((left + 3 * LATE_MS) as u64);
    let (_, at) = poll_acquire(&mut c, "k", "A", 1_000, until).expect("A gets the lock");
    let got = since(origin, at);
    eprintln!("quarantine of {left} ms across a forward step: first grant at {got} ms");
    assert!(
        got >= left - EARLY_MS,
        "granted at {got} ms, inside the quarantine ({left} ms)"
    );
}

/// Fences keep rising across a backward step, however many are issued.
#[test]
fn fences_rise_across_a_backward_step() {
    let mut shift = ClockShift::new();
    let server = stepped(&shift).start();
    let mut c = server.conn();
    let mut last = 0;
    for i in 0..200 {
        if i == 100 {
            shift.step(-STEP_MS);
        }
        let fence = c.acquire(&format!("k{i}"), "A", LONG).expect("granted");
        assert!(fence > last, "fence {fence} after {last} (acquire {i})");
        last = fence;
    }
    let _: Reply = c.call(&["PING"]);
}

/// A replica across its master's forward step: the lock stays on the
/// replica while the lease runs (the master does not expire it early, so no
/// `DEL` reaches the replica). The master re-bases the key's TTL in its own
/// (stepped) wall time and sends that `PEXPIREAT`: a replica reads absolute
/// times by its own clock, so its copy of the TTL is off by the master's
/// step, until the lease ends on the master and its `DEL` arrives.
#[test]
fn a_replica_keeps_the_lock_across_its_masters_forward_step() {
    let mut shift = ClockShift::new();
    let master = stepped(&shift).label("master").start();
    let replica = crate::harness::start_replica(&master, "replica");
    let mut m = master.conn();
    const LEASE: i64 = 1_500;
    let origin = Instant::now();
    let _fence = m.acquire("k", "A", LEASE).expect("A acquires");
    m.wait_replicas(1);
    shift.step(STEP_MS);
    let mut r = replica.conn();
    // Until the lease ends (as A counts it), the replica has the lock.
    let mut ttl_seen = None;
    while since(origin, Instant::now()) < LEASE - LATE_MS {
        assert_eq!(
            r.int(&["EXISTS", "k"]),
            1,
            "the replica lost the lock inside its lease"
        );
        ttl_seen = Some(r.pttl("k"));
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "replica across a +{STEP_MS} ms master step: its PTTL near the lease end {ttl_seen:?}"
    );
    // Then the master ends it, and the replica follows.
    wait_until(
        "the replica drops the ended lock",
        Duration::from_secs(5),
        || r.int(&["EXISTS", "k"]) == 0,
    );
    let gone = since(origin, Instant::now());
    assert!(
        gone >= LEASE - EARLY_MS,
        "the replica dropped the lock at {gone} ms"
    );
}
