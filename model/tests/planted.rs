//! Flaws planted in the core's own code (not in the model): the checks must
//! catch each. Its own test binary, so the switches it sets reach no other
//! check (each file under `tests/` is a process of its own), and one test,
//! so one switch is set at a time.
//!
//! The flaws:
//! - `shared_queue::planted::SERVE_PAST_A_WRITER`: the queue's rule goes on
//!   past an exclusive request at the head that cannot be granted, so
//!   readers queued behind a waiting writer are granted ahead of it.
//! - `orchestrate::planted::HAND_OVER_PAST_SHARED`: the one serve hands
//!   the lock to an exclusive request at the head as if the listed holds
//!   were not there, so a writer is granted beside readers.
//! - `orchestrate::planted::BARGE_PAST_WAITERS`: `LOCK.ACQUIRE` ignores
//!   the clients waiting, so a reader asking while a writer waits is
//!   granted at once beside the readers holding.
//! - `orchestrate::planted::IGNORE_ARRIVAL_ORDER`: a request for several
//!   locks is served when it is first in line on the lock being served, not
//!   on all of them, so it takes a lock an older request still waits for.
//! - `planted::LEASES_ON_WALL_CLOCK`: the server's lease decisions read its
//!   wall clock instead of the lease clock, so a forward step of the wall
//!   clock ends a lease early and a second client is granted the lock.

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, Ordering};

use redislock_core::orchestrate::planted::{
    BARGE_PAST_WAITERS, HAND_OVER_PAST_SHARED, IGNORE_ARRIVAL_ORDER,
};
use redislock_core::planted::LEASES_ON_WALL_CLOCK;
use redislock_core::shared_queue::planted::SERVE_PAST_A_WRITER;
use redislock_model::{multi, run, server, shared, wall_clock, Search};
use stateright::Model;

/// Runs `model` with `switch` set until `property` fails; the trace that
/// breaks it.
fn caught_in<M>(label: &str, model: M, switch: &AtomicBool, property: &'static str) -> String
where
    M: Model + Clone + Send + Sync + 'static,
    M::State: Clone + Debug + Hash + PartialEq + Send + Sync + 'static,
    M::Action: Clone + Debug + PartialEq + Send + Sync + 'static,
{
    switch.store(true, Ordering::Relaxed);
    let report = run(label, model, Search::Bfs, 1, Some(&[property]));
    switch.store(false, Ordering::Relaxed);
    print!("{}", report.summary());
    let trace = report
        .counterexample(property)
        .unwrap_or_else(|| panic!("the checker misses the planted flaw: {}", report.summary()))
        .to_string();
    println!("{trace}");
    trace
}

/// [`caught_in`] the readers-and-a-writer model.
fn caught(label: &str, switch: &AtomicBool, property: &'static str) -> String {
    // The code as built keeps every property at these bounds (checked in
    // full by `shared_holds_of_readers_and_a_writer_keep_every_guarantee` in
    // models.rs); the planted flaw breaks this one.
    let model = shared::SharedModel {
        bounds: shared::Bounds::readers_and_writer(),
    };
    caught_in(label, model, switch, property)
}

#[test]
fn flaws_planted_in_the_core_are_caught() {
    let trace = caught(
        "shared, serve past a writer",
        &SERVE_PAST_A_WRITER,
        "no waiter is overtaken (first come, first served across modes)",
    );
    assert!(trace.contains("A WAITER WAS OVERTAKEN"), "{trace}");

    let trace = caught(
        "shared, a writer handed the lock beside readers",
        &HAND_OVER_PAST_SHARED,
        "no exclusive hold beside any other live hold",
    );
    assert!(trace.contains("exclusive"), "{trace}");

    let trace = caught(
        "shared, a reader barging past a waiting writer",
        &BARGE_PAST_WAITERS,
        "no reader is granted before a writer that came earlier",
    );
    assert!(trace.contains("A READER OVERTOOK A WRITER"), "{trace}");

    // Several locks in crossing orders, at the bounds of
    // `several_locks_in_crossing_orders_keep_every_guarantee` in models.rs.
    let model = multi::MultiModel {
        bounds: multi::Bounds::crossing(),
    };
    let trace = caught_in(
        "multi, arrival order ignored",
        model,
        &IGNORE_ARRIVAL_ORDER,
        "no waiter is overtaken on any of its locks",
    );
    assert!(trace.contains("A WAITER WAS OVERTAKEN"), "{trace}");

    // The server model with a step of its wall clock, at the bounds of
    // `server_model_across_a_step_of_the_wall_clock_keeps_every_guarantee`
    // in models.rs, where every guarantee holds with leases on the lease
    // clock.
    let model = server::ServerModel {
        bounds: server::Bounds {
            operator_writes: 0,
            clock_steps: wall_clock::Steps::one_either_way(3),
            ..server::Bounds::quick()
        },
    };
    let trace = caught_in(
        "server, leases on the wall clock",
        model,
        &LEASES_ON_WALL_CLOCK,
        "at most one client holds a lock",
    );
    // One holds; the wall clock jumps past its lease while no time
    // elapses; another is granted the lock.
    let step = trace
        .find("StepClock { by: 3 }")
        .unwrap_or_else(|| panic!("no forward step: {trace}"));
    let first = trace.find("Acquire").unwrap_or(usize::MAX);
    let last = trace.rfind("Acquire").unwrap_or(0);
    assert!(first < step && step < last, "{trace}");
}
