//! The models at their quick bounds (`make test`): every property holds,
//! and the counterexamples the models are built to show are found.

use redislock_model::{failover, multi, redlock, run, server, shared, wall_clock, Report, Search};

fn assert_all_held(report: &Report) {
    print!("{}", report.summary());
    if let Some((name, trace)) = report.failed.first() {
        panic!("{}: {name}\n{trace}", report.model);
    }
}

#[test]
fn server_model_keeps_every_guarantee() {
    let report = run(
        "server",
        server::ServerModel {
            bounds: server::Bounds::quick(),
        },
        Search::Bfs,
        2,
        None,
    );
    assert_all_held(&report);
}

/// The server's wall clock steps once, forward or back by more than a
/// lease, at any point (while a client holds, waits, is being answered…):
/// the module's decisions count the lease clock, which does not move, so
/// every guarantee holds. (The operator's writes are left out: they end
/// holds their own way, checked above, and would triple the states.)
#[test]
fn server_model_across_a_step_of_the_wall_clock_keeps_every_guarantee() {
    let bounds = server::Bounds {
        operator_writes: 0,
        clock_steps: wall_clock::Steps::one_either_way(3),
        ..server::Bounds::quick()
    };
    let report = run(
        "server, wall clock steps",
        server::ServerModel { bounds },
        Search::Bfs,
        2,
        None,
    );
    assert_all_held(&report);
}

/// Ephemeral holds: a client may acquire with `EPHEMERAL`, and its
/// connection may be lost (during a write pause too); the hold it was
/// bound to ends as a release to zero and its waiters are served. No two
/// clients hold a lock at once (the lost one's belief counts no more: its
/// fence guards the resource), and every blocked client is answered once.
#[test]
fn ephemeral_holders_losing_their_connection_keep_every_guarantee() {
    // No operator writes: they end holds their own way, checked above.
    let bounds = server::Bounds {
        ephemeral: true,
        operator_writes: 0,
        ..server::Bounds::quick()
    };
    let report = run(
        "server, ephemeral holds",
        server::ServerModel { bounds },
        Search::Bfs,
        2,
        None,
    );
    assert_all_held(&report);
}

/// Found by the checker (model/README.md, "revoke after a reentry"): a
/// waiter granted a lock disconnects before its reply is written, so the
/// grant is queued to be taken back, while the same owner (another
/// connection) reenters the lock, and maybe releases once, and is told it
/// holds it; the revoke then deleted it and a third client took it. Fixed:
/// once the owner succeeds with a command on the lock, its grant is no
/// longer taken back (`Engine::owner_active`), and mutual exclusion holds.
#[test]
fn revoke_after_a_reentry_by_the_same_owner_keeps_mutual_exclusion() {
    let bounds = server::Bounds {
        operator_writes: 0,
        commands: 3,
        same_owner_after_reconnect: true,
        ..server::Bounds::quick()
    };
    let report = run(
        "server, same owner after reconnect",
        server::ServerModel { bounds },
        Search::Bfs,
        2,
        None,
    );
    assert_all_held(&report);
}

#[test]
fn redlock_with_the_fence_round_hands_out_rising_fences() {
    let report = run(
        "redlock",
        redlock::RedlockModel {
            bounds: redlock::Bounds::quick(),
        },
        Search::Bfs,
        2,
        None,
    );
    assert_all_held(&report);
}

/// Without the FENCE round a later majority can hand out a lower fence:
/// one of its servers never saw the earlier holder's (higher) fence.
#[test]
fn redlock_without_the_fence_round_can_hand_out_a_lower_fence() {
    let property = "every fence handed out is above every earlier one";
    let bounds = redlock::Bounds {
        fence_round: false,
        ..redlock::Bounds::quick()
    };
    let report = run(
        "redlock without FENCE",
        redlock::RedlockModel { bounds },
        Search::Bfs,
        1,
        Some(&[property]),
    );
    print!("{}", report.summary());
    let trace = report
        .counterexample(property)
        .expect("the checker finds a lower fence handed out");
    println!("{trace}");
    assert!(trace.contains("HOLDS"), "{trace}");
}

#[test]
fn failover_with_the_quarantine_keeps_mutual_exclusion() {
    let report = run(
        "failover",
        failover::FailoverModel {
            bounds: failover::Bounds::quick(),
        },
        Search::Bfs,
        2,
        None,
    );
    assert_all_held(&report);
}

/// Without `lock.max-ttl` (no quarantine) a promoted replica that never
/// received a grant gives the lock to a second client.
#[test]
fn failover_without_the_quarantine_breaks_mutual_exclusion() {
    let property = "two clients never both believe they hold the lock";
    let bounds = failover::Bounds {
        max_ttl: 0,
        ..failover::Bounds::quick()
    };
    let report = run(
        "failover without max-ttl",
        failover::FailoverModel { bounds },
        Search::Bfs,
        1,
        Some(&[property]),
    );
    print!("{}", report.summary());
    let trace = report
        .counterexample(property)
        .expect("the checker finds two holders after a failover or restart");
    println!("{trace}");
    assert!(
        trace.contains("Failover") || trace.contains("Restart"),
        "{trace}"
    );
}

/// The bug fixed by 26aade7, kept as a test of why (model/README.md, "a
/// released hold resurrected by a failover"): the replica applied f0's
/// grant but not its release; after the failover f0 acquires again, and
/// `LOCK.ACQUIRE` reenters the stale hold in quarantine while f1, whose
/// grant the replica never got, still holds the lock.
#[test]
fn quarantine_lets_acquire_reenter_a_released_hold() {
    let property = "two clients never both believe they hold the lock";
    let bounds = failover::Bounds {
        quarantine_blocks_reentry: false,
        ..failover::Bounds::quick()
    };
    let report = run(
        "failover, ACQUIRE reenters in quarantine (as before 26aade7)",
        failover::FailoverModel { bounds },
        Search::Bfs,
        1,
        Some(&[property]),
    );
    print!("{}", report.summary());
    let trace = report
        .counterexample(property)
        .expect("the checker finds the resurrected hold");
    println!("{trace}");
    assert!(trace.contains("quarantine"), "{trace}");
}

fn shared_model(label: &str, bounds: shared::Bounds) -> Report {
    run(label, shared::SharedModel { bounds }, Search::Bfs, 2, None)
}

#[test]
fn shared_holds_of_readers_and_a_writer_keep_every_guarantee() {
    let report = shared_model(
        "shared: readers and a writer",
        shared::Bounds::readers_and_writer(),
    );
    assert_all_held(&report);
}

#[test]
fn shared_permits_of_a_semaphore_keep_every_guarantee() {
    let report = shared_model("shared: semaphore", shared::Bounds::semaphore());
    assert_all_held(&report);
}

#[test]
fn shared_readers_writers_and_permits_on_one_lock_keep_every_guarantee() {
    let report = shared_model("shared: mixed", shared::Bounds::mixed());
    assert_all_held(&report);
}

#[test]
fn shared_holds_of_one_owner_on_two_connections_keep_every_guarantee() {
    let report = shared_model("shared: same owner", shared::Bounds::same_owner());
    assert_all_held(&report);
}

#[test]
fn shared_permits_and_a_writer_keep_every_guarantee() {
    let report = shared_model(
        "shared: semaphore and a writer",
        shared::Bounds::semaphore_and_writer(),
    );
    assert_all_held(&report);
}

/// Runs `bounds` with `flaw` until `property` fails, and returns the trace.
fn shared_counterexample(
    bounds: shared::Bounds,
    flaw: shared::Flaw,
    property: &'static str,
) -> String {
    let bounds = shared::Bounds {
        flaw: Some(flaw),
        ..bounds
    };
    let report = run(
        &format!("shared with {flaw:?}"),
        shared::SharedModel { bounds },
        Search::Bfs,
        1,
        Some(&[property]),
    );
    print!("{}", report.summary());
    let trace = report
        .counterexample(property)
        .unwrap_or_else(|| panic!("the checker finds a counterexample to {property:?}"))
        .to_string();
    println!("{trace}");
    trace
}

/// Granting permits as read holds lets more owners than the limit share.
#[test]
fn shared_without_the_limit_a_semaphore_is_oversold() {
    let trace = shared_counterexample(
        shared::Bounds::semaphore(),
        shared::Flaw::IgnoreLimit,
        "at most limit owners share a semaphore",
    );
    assert!(trace.contains("holds"), "{trace}");
}

fn multi_model(label: &str, bounds: multi::Bounds) -> Report {
    run(label, multi::MultiModel { bounds }, Search::Bfs, 2, None)
}

/// Two requests for `a` and `b` in crossing orders beside one for `b`:
/// never a deadlock, a partial hold or a waiter overtaken on any lock.
#[test]
fn several_locks_in_crossing_orders_keep_every_guarantee() {
    let report = multi_model("multi: crossing orders", multi::Bounds::crossing());
    assert_all_held(&report);
}

/// A request for three locks between requests for one at either end: it
/// is served, and no narrow request overtakes it.
#[test]
fn a_wide_request_beside_narrow_ones_keeps_every_guarantee() {
    let report = multi_model("multi: wide and narrow", multi::Bounds::wide_and_narrow());
    assert_all_held(&report);
}

/// A semaphore of two asked for 1, 2 and 1 permits: never more than two
/// held, and the request for two is not overtaken by those for one.
#[test]
fn several_permits_of_a_semaphore_keep_every_guarantee() {
    let report = multi_model("multi: permits", multi::Bounds::permits());
    assert_all_held(&report);
}

/// Permits of two semaphores at once, in crossing orders.
#[test]
fn several_permits_of_two_semaphores_in_crossing_orders_keep_every_guarantee() {
    let report = multi_model("multi: permits on two", multi::Bounds::permits_on_two());
    assert_all_held(&report);
}

/// Asking for the locks one at a time, each with `WAIT`, holds the first
/// while waiting for the next: the hold-and-wait the one request avoids.
#[test]
fn several_locks_asked_for_one_at_a_time_hold_some_while_waiting() {
    let property = "never a partial hold: a request holds all its locks or none";
    let bounds = multi::Bounds {
        flaw: Some(multi::Flaw::OneByOne),
        ..multi::Bounds::crossing()
    };
    let report = run(
        "multi, one lock at a time",
        multi::MultiModel { bounds },
        Search::Bfs,
        1,
        Some(&[property]),
    );
    print!("{}", report.summary());
    let trace = report
        .counterexample(property)
        .expect("the checker finds a client holding some of its locks")
        .to_string();
    println!("{trace}");
    // c1 holds `b` of its `[b, a]` and not `a`.
    assert!(
        trace.contains("b: c1") && !trace.contains("a: c1"),
        "{trace}"
    );
}
