//! Flaws planted in the core (not in the model): the checks must catch
//! them. Their own test binary, so the switches set here reach no other
//! check (each file under `tests/` is a process of its own); within it, one
//! flaw at a time ([`ONE_FLAW_AT_A_TIME`]).
//!
//! The flaws:
//! - `redislock_core::shared_queue::planted`: the queue's serve goes on past
//!   an exclusive request at the head that cannot be granted, so readers
//!   queued behind a waiting writer are granted ahead of it.
//! - `redislock_core::planted`: the server's lease decisions read its wall
//!   clock instead of the lease clock, so a forward step of the wall clock
//!   ends a lease early.

use std::sync::atomic::Ordering;
use std::sync::Mutex;

use redislock_core::planted::LEASES_ON_WALL_CLOCK;
use redislock_core::shared_queue::planted::SERVE_PAST_A_WRITER;
use redislock_model::{run, server, shared, wall_clock, Search};

/// Held while a switch is set: the tests of this file run on threads of
/// one process.
static ONE_FLAW_AT_A_TIME: Mutex<()> = Mutex::new(());

#[test]
fn a_serve_that_grants_readers_past_a_waiting_writer_is_caught() {
    let _one = ONE_FLAW_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let property = "no waiter is overtaken (first come, first served across modes)";
    let model = shared::SharedModel {
        bounds: shared::Bounds::readers_and_writer(),
    };
    // The serve as built keeps the property at these bounds (checked in
    // full by `shared_holds_of_readers_and_a_writer_keep_every_guarantee` in
    // models.rs); the planted one breaks it, in a trace that serves the
    // queue.
    SERVE_PAST_A_WRITER.store(true, Ordering::Relaxed);
    let report = run(
        "shared, serve past a writer",
        model,
        Search::Bfs,
        1,
        Some(&[property]),
    );
    SERVE_PAST_A_WRITER.store(false, Ordering::Relaxed);
    print!("{}", report.summary());
    let trace = report
        .counterexample(property)
        .unwrap_or_else(|| panic!("the checker misses the planted flaw: {}", report.summary()))
        .to_string();
    println!("{trace}");
    assert!(trace.contains("Serve"), "{trace}");
}

#[test]
fn leases_counted_on_the_wall_clock_give_two_holders_after_a_forward_step() {
    let _one = ONE_FLAW_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let property = "at most one client holds a lock";
    // The bounds of `server_model_across_a_step_of_the_wall_clock_keeps_every_guarantee`
    // in models.rs, where every guarantee holds with leases on the lease
    // clock.
    let model = server::ServerModel {
        bounds: server::Bounds {
            operator_writes: 0,
            clock_steps: wall_clock::Steps::one_either_way(3),
            ..server::Bounds::quick()
        },
    };
    LEASES_ON_WALL_CLOCK.store(true, Ordering::Relaxed);
    let report = run(
        "server, leases on the wall clock",
        model,
        Search::Bfs,
        1,
        Some(&[property]),
    );
    LEASES_ON_WALL_CLOCK.store(false, Ordering::Relaxed);
    print!("{}", report.summary());
    let trace = report
        .counterexample(property)
        .unwrap_or_else(|| panic!("the checker misses the planted flaw: {}", report.summary()))
        .to_string();
    println!("{trace}");
    // One holds; the wall clock jumps past its lease while no time
    // elapses; another is granted the lock.
    let step = trace
        .find("StepClock { by: 3 }")
        .unwrap_or_else(|| panic!("no forward step: {trace}"));
    let first = trace.find("Acquire").unwrap_or(usize::MAX);
    let last = trace.rfind("Acquire").unwrap_or(0);
    assert!(first < step && step < last, "{trace}");
}
