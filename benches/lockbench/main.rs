//! `lockbench`: the lock module against the two classic Redis lock recipes and
//! raw Redis, side by side, in one run on one machine.
//!
//! `make bench` (full, under 10 minutes) or `make bench-quick` (under 2);
//! directly: `cargo bench --bench lockbench [-- --quick] [-- --only a,b]`.
//! It starts its own `redis-server` with the module (free loopback port, own
//! temp dir, no persistence), runs every measurement interleaved — each
//! repetition measures every subject once, in a rotating order — and prints
//! one Markdown report: the medians per section, then one summary table of
//! ratios against the targets. The report is also written to
//! `target/lockbench/report.md`.
//!
//! This file is the run: the plan, the machine, the main server, then each
//! section in turn and the report.
//!
//! | module | what lives there |
//! |---|---|
//! | [`plan`] | how much a run measures: full and quick |
//! | [`sections`] | one driver per section (`sections/*.rs`), what they share ([`sections::Ctx`]) and produce ([`sections::Results`]) |
//! | [`report`] | the Markdown report: the summary against the targets, one table per section |
//! | [`server`] | the test kit's servers with CPU pinning, `INFO` readers, the seed shim, the watchdog |
//! | [`resp`] | a small RESP2/3 client: deadlines, pushes, non-blocking reads |
//! | [`locks`] | the recipes' Lua, the lock kinds, one waiting client per way of waiting |
//! | [`throughput`] | 1 and 5a: uncontended pairs/s through `redis-benchmark` |
//! | [`contended`] | 2: C clients on one lock, acquire → `INCR` → release |
//! | [`takeover`] | 3: a holder vanishes, time from lease end to the waiter's hold; the machine's own timer wake-up under it |
//! | [`crash`] | a holder process killed: time from the kill to the waiter's hold; what `EPHEMERAL` costs |
//! | `sections/clock.rs` | a step of the server's wall clock under a holder: the module against the recipes |
//! | `sections/multi.rs` | several locks or permits at once: the module against Redisson's `MultiLock`, node-redlock, bsm/redislock and redis-semaphore, written from their algorithms |
//! | [`memory`] | 4: the bulk loader and `used_memory` per held lock |
//! | [`drain`] | 5b: server CPU per hand-off with N clients waiting |
//! | [`shared`], [`shared_recipes`] | shared holds: read-write locks and semaphores: the recipes' Lua, throughput, the stress check |
//! | [`stats`], [`markdown`] | medians and percentiles; Markdown tables and number formats |
//!
//! Without `--bench` (as `cargo test --all-targets` runs it) it does nothing.

mod contended;
mod crash;
mod drain;
mod locks;
mod markdown;
mod memory;
mod plan;
mod report;
mod resp;
mod sections;
mod server;
mod shared;
mod shared_recipes;
mod stats;
mod takeover;
mod throughput;

use std::fs;
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use locks::Scripts;
use plan::{Plan, FULL, QUICK};
use redislock_testkit::bench::{self, BenchArgs};
use redislock_testkit::try_module_path;
use sections::{Ctx, Results};
use server::{build_seed_shim, Machine, RunDir, Server};

/// Errors of the bench itself: a message for the person running it.
pub type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn main() -> ExitCode {
    // The crash section starts this binary again as a lock holder to kill.
    if let Some(code) = crash::holder_main() {
        return code;
    }
    let Some(args) = BenchArgs::parse("lockbench", "bench") else {
        return ExitCode::SUCCESS;
    };
    let plan = if args.quick { &QUICK } else { &FULL };
    let names: Vec<&str> = sections::ALL.iter().map(|(name, _)| *name).collect();
    let only: Vec<String> = args
        .only
        .unwrap_or_else(|| names.iter().map(ToString::to_string).collect());
    if let Some(bad) = only.iter().find(|s| !names.contains(&s.as_str())) {
        eprintln!(
            "lockbench: unknown section {bad:?}; sections: {}",
            names.join(",")
        );
        return ExitCode::FAILURE;
    }
    bench::exit_code("lockbench", run(plan, &only))
}

/// The whole run; `Ok(false)` if some measurement failed.
fn run(plan: &Plan, only: &[String]) -> Res<bool> {
    // Pin before any thread starts: threads and children inherit it.
    let machine = Machine::probe_and_pin()?;
    server::start_watchdog(plan.budget);
    let module = try_module_path()?;
    let run_dir = RunDir::create()?;
    let shim = build_seed_shim(&run_dir.0)?;
    let main = Server::start(&run_dir.0, "main", Some(&module), &machine.pinning, 12_000)?;
    let scripts = Scripts::load(&mut main.control()?)?;
    let wait = wait_supported(&main)?;
    eprintln!(
        "lockbench ({} run): redis-server {} on port {}, {} cores{}; module WAIT {}",
        plan.name,
        machine.redis_version,
        main.port,
        machine.cores,
        machine
            .pinning
            .server
            .as_ref()
            .map_or(String::new(), |cpu| format!(", server pinned to CPU {cpu}")),
        if wait {
            "works"
        } else {
            "not supported yet: module waits are skipped"
        },
    );
    let started = Instant::now();
    let mut results = Results::default();
    let want = |s: &str| only.iter().any(|o| o == s);
    let ctx = Ctx {
        plan,
        server: &main,
        scripts: &scripts,
        shim: &shim,
        run_dir: &run_dir.0,
        module: &module,
        machine: &machine,
        wait,
    };
    for (name, section) in sections::ALL {
        if want(name) {
            let t = Instant::now();
            eprintln!("[{:>4}s] {name}", started.elapsed().as_secs());
            section(&ctx, &mut results);
            eprintln!("         {name} took {:.0} s", t.elapsed().as_secs_f64());
        }
    }
    let report = report::render(&ctx, &results, started.elapsed());
    println!("{report}");
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/lockbench");
    if fs::create_dir_all(&out).is_ok() && fs::write(out.join("report.md"), &report).is_ok() {
        eprintln!("report written to {}", out.join("report.md").display());
    }
    Ok(results.errors.is_empty())
}

/// Whether `LOCK.ACQUIRE … WAIT` works in this build (it answers a syntax
/// error until waiting lands).
fn wait_supported(server: &Server) -> Res<bool> {
    let mut con = server.conn()?;
    let reply = con.call(&["LOCK.ACQUIRE", "probe:wait", "probe", "1000", "WAIT", "10"])?;
    con.call(&["DEL", "probe:wait"])?;
    Ok(matches!(reply, resp::Reply::Int(_)))
}
