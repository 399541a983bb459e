//! `make model`: every model at its full bounds; prints, per model, the
//! states explored, the time taken and each property's outcome, with a
//! trace for every counterexample. Exits non-zero if a property that must
//! hold did not, or a counterexample that must be found was not.
//! `redislock-model WORD` runs only the checks whose label contains WORD.

use std::process::ExitCode;

use redislock_model::{failover, multi, redlock, run, server, shared, wall_clock, Report, Search};

/// One check: its label, and the properties it must violate (a model run
/// without the protection it is built to show).
type Check = (String, Box<dyn FnOnce(usize) -> Report>, Vec<&'static str>);

fn checks() -> Vec<Check> {
    let mut checks: Vec<Check> = Vec::new();
    for (label, bounds) in [
        ("server: 2 clients, long run", server::Bounds::full()),
        ("server: 3 clients", server::Bounds::three_clients()),
        // A step of the wall clock, either way, at any point of the long
        // run (without the operator's writes, which end holds their own way).
        (
            "server: 2 clients, long run, wall clock steps",
            server::Bounds {
                operator_writes: 0,
                clock_steps: wall_clock::Steps::one_either_way(3),
                ..server::Bounds::full()
            },
        ),
    ] {
        let name = format!("{label} {bounds:?}");
        let label = name.clone();
        checks.push((
            name,
            Box::new(move |threads| {
                run(
                    &label,
                    server::ServerModel { bounds },
                    Search::Dfs,
                    threads,
                    None,
                )
            }),
            vec![],
        ));
    }
    let bounds = server::Bounds {
        same_owner_after_reconnect: true,
        ..server::Bounds::quick()
    };
    // Bug 1 (model/README.md), fixed by `Engine::owner_active`: the checker
    // found a counterexample here before; now every property holds.
    let name = format!("server: same owner after reconnect {bounds:?}");
    let label = name.clone();
    checks.push((
        name,
        Box::new(move |threads| {
            run(
                &label,
                server::ServerModel { bounds },
                Search::Bfs,
                threads,
                None,
            )
        }),
        vec![],
    ));
    for (max_ttl, fixed) in [
        (failover::Bounds::full().max_ttl, true),
        (failover::Bounds::full().max_ttl, false),
        (0, true),
    ] {
        let bounds = failover::Bounds {
            max_ttl,
            quarantine_blocks_reentry: fixed,
            ..failover::Bounds::full()
        };
        let property = "two clients never both believe they hold the lock";
        let name = format!("failover {bounds:?}");
        let label = name.clone();
        let (search, stop, expect) = if max_ttl > 0 && fixed {
            (Search::Dfs, None, vec![])
        } else {
            (Search::Bfs, Some(vec![property]), vec![property])
        };
        checks.push((
            name,
            Box::new(move |threads| {
                run(
                    &label,
                    failover::FailoverModel { bounds },
                    search,
                    threads,
                    stop.as_deref(),
                )
            }),
            expect,
        ));
    }
    for (fence_round, bounds) in [
        (true, redlock::Bounds::full()),
        (true, redlock::Bounds::three_clients()),
        (false, redlock::Bounds::full()),
    ] {
        let bounds = redlock::Bounds {
            fence_round,
            ..bounds
        };
        let property = "every fence handed out is above every earlier one";
        let name = format!("redlock {bounds:?}");
        let label = name.clone();
        // Without the FENCE round: breadth-first, for the shortest trace.
        let (search, stop, expect) = if fence_round {
            (Search::Dfs, None, vec![])
        } else {
            (Search::Bfs, Some(vec![property]), vec![property])
        };
        checks.push((
            name,
            Box::new(move |threads| {
                run(
                    &label,
                    redlock::RedlockModel { bounds },
                    search,
                    threads,
                    stop.as_deref(),
                )
            }),
            expect,
        ));
    }
    for bounds in [
        shared::Bounds::full(vec![
            shared::Role::Reader,
            shared::Role::Writer,
            shared::Role::Reader,
            shared::Role::Writer,
        ]),
        shared::Bounds {
            horizon: 6,
            commands: 2,
            ..shared::Bounds::full(vec![
                shared::Role::Permit,
                shared::Role::Permit,
                shared::Role::Writer,
                shared::Role::Permit,
            ])
        },
        shared::Bounds {
            horizon: 6,
            commands: 4,
            ..shared::Bounds::full(vec![
                shared::Role::Reader,
                shared::Role::Writer,
                shared::Role::Permit,
            ])
        },
        shared::Bounds {
            same_owner: Some((2, 1)),
            horizon: 6,
            commands: 4,
            ..shared::Bounds::full(vec![
                shared::Role::Reader,
                shared::Role::Writer,
                shared::Role::Reader,
            ])
        },
    ] {
        let name = format!("shared {bounds:?}");
        let label = name.clone();
        checks.push((
            name,
            Box::new(move |threads| {
                run(
                    &label,
                    shared::SharedModel { bounds },
                    Search::Dfs,
                    threads,
                    None,
                )
            }),
            vec![],
        ));
    }
    // A client that ignores the semaphore's limit: breadth-first, stopped
    // at the property the limit protects. (Flaws in the server's own
    // sequencing are planted in the core and caught by `tests/planted.rs`.)
    let properties = vec!["at most limit owners share a semaphore"];
    let bounds = shared::Bounds {
        flaw: Some(shared::Flaw::IgnoreLimit),
        ..shared::Bounds::semaphore()
    };
    let name = format!("shared {bounds:?}");
    let label = name.clone();
    let stop = properties.clone();
    checks.push((
        name,
        Box::new(move |threads| {
            run(
                &label,
                shared::SharedModel { bounds },
                Search::Bfs,
                threads,
                Some(&stop),
            )
        }),
        properties,
    ));
    // Several locks at once: three requests in a cycle of orders, then a
    // wide request for three locks among narrow ones, longer.
    for bounds in [
        multi::Bounds::full(),
        multi::Bounds {
            horizon: 4,
            wait: 3,
            commands: 3,
            ..multi::Bounds::wide_and_narrow()
        },
    ] {
        let name = format!("multi {bounds:?}");
        let label = name.clone();
        checks.push((
            name,
            Box::new(move |threads| {
                run(
                    &label,
                    multi::MultiModel { bounds },
                    Search::Dfs,
                    threads,
                    None,
                )
            }),
            vec![],
        ));
    }
    checks
}

fn main() -> ExitCode {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let filter = std::env::args().nth(1).unwrap_or_default();
    let mut ok = true;
    for (label, check, expect_failures) in checks() {
        if !label.contains(&filter) {
            continue;
        }
        let report = check(threads);
        print!("{}", report.summary());
        for (name, trace) in &report.failed {
            let expected = expect_failures.contains(name);
            println!(
                "  {} {name}:\n{trace}",
                if expected {
                    "expected counterexample for"
                } else {
                    "COUNTEREXAMPLE for"
                }
            );
            ok &= expected;
        }
        for name in &expect_failures {
            if report.counterexample(name).is_none() {
                println!("  MISSING expected counterexample: {name}");
                ok = false;
            }
        }
        println!();
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
