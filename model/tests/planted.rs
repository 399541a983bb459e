//! A flaw planted in the core's own serve (not in the model): the checks
//! must catch it. Its own test binary, so the switch it sets reaches no
//! other check (each file under `tests/` is a process of its own).
//!
//! The flaw (`redislock_core::shared_queue::planted`): the queue's serve
//! goes on past an exclusive request at the head that cannot be granted,
//! so readers queued behind a waiting writer are granted ahead of it.

use std::sync::atomic::Ordering;

use redislock_core::shared_queue::planted::SERVE_PAST_A_WRITER;
use redislock_model::{run, shared, Search};

#[test]
fn a_serve_that_grants_readers_past_a_waiting_writer_is_caught() {
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
