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
//! | module | what lives there |
//! |---|---|
//! | [`server`] | `redis-server` processes, CPU pinning, `INFO` readers, the seed shim, the watchdog |
//! | [`resp`] | a small RESP2/3 client: deadlines, pushes, non-blocking reads |
//! | [`locks`] | the recipes' Lua, the lock kinds, one waiting client per way of waiting |
//! | [`throughput`] | 1 and 5a: uncontended pairs/s through `redis-benchmark` |
//! | [`contended`] | 2: C clients on one lock, acquire → `INCR` → release |
//! | [`takeover`] | 3: a holder vanishes, time from lease end to the waiter's hold |
//! | [`memory`] | 4: the bulk loader and `used_memory` per held lock |
//! | [`drain`] | 5b: server CPU per hand-off with N clients waiting |
//! | [`stats`], [`report`] | medians and percentiles; Markdown tables |
//!
//! Without `--bench` (as `cargo test --all-targets` runs it) it does nothing.

mod contended;
mod drain;
mod locks;
mod memory;
mod report;
mod resp;
mod server;
mod stats;
mod takeover;
mod throughput;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use contended::Contended;
use drain::{Drain, Fifo};
use locks::{Kind, Scripts, Waiting};
use redislock_testkit::bench::BenchArgs;
use redislock_testkit::try_module_path;
use report::{count, millis, num, percent, ratio, verdict, Table};
use server::{build_seed_shim, Machine, RunDir, Server};
use stats::median;
use throughput::{Bench, PairRun, Subject};

/// Errors of the bench itself: a message for the person running it.
pub type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The sections, in run order (`--only` takes these names).
const SECTIONS: [&str; 6] = [
    "uncontended",
    "contended",
    "takeover",
    "memory",
    "scale",
    "drain",
];

/// How much a run measures. Each run of a section takes about a second on
/// a 2-core machine; more, shorter runs interleave better with the bursts of
/// other load on a shared machine than fewer, longer ones.
struct Plan {
    name: &'static str,
    /// Repetitions of the uncontended and contended runs.
    reps: usize,
    /// Pairs per `redis-benchmark` run at pipeline 1 and 16.
    pairs_p1: usize,
    pairs_p16: usize,
    clients: [usize; 3],
    contended_window: Duration,
    takeover_trials: usize,
    memory_locks: usize,
    memory_reps: usize,
    /// Locks held before the scale runs: few, many.
    held: [usize; 2],
    scale_reps: usize,
    scale_pairs: usize,
    waiters: [usize; 3],
    drain_reps: usize,
    /// Hand-offs per module / `BLPOP` drain run (bounded by 10 s too).
    fifo_handoffs: usize,
    /// Length of a hash-recipe drain run.
    drain_window: Duration,
    /// The watchdog aborts the run after this.
    budget: Duration,
}

const FULL: Plan = Plan {
    name: "full",
    reps: 7,
    pairs_p1: 20_000,
    pairs_p16: 100_000,
    clients: [2, 8, 32],
    contended_window: Duration::from_millis(1_200),
    takeover_trials: 20,
    memory_locks: 100_000,
    memory_reps: 3,
    held: [1_000, 1_000_000],
    scale_reps: 4,
    scale_pairs: 100_000,
    waiters: [10, 1_000, 10_000],
    drain_reps: 5,
    fifo_handoffs: 10_000,
    drain_window: Duration::from_millis(1_500),
    budget: Duration::from_secs(15 * 60),
};

const QUICK: Plan = Plan {
    name: "quick",
    reps: 3,
    pairs_p1: 8_000,
    pairs_p16: 40_000,
    clients: [2, 8, 32],
    contended_window: Duration::from_millis(400),
    takeover_trials: 7,
    memory_locks: 100_000,
    memory_reps: 1,
    held: [1_000, 1_000_000],
    scale_reps: 2,
    scale_pairs: 40_000,
    waiters: [10, 1_000, 10_000],
    drain_reps: 1,
    fifo_handoffs: 4_000,
    drain_window: Duration::from_millis(600),
    budget: Duration::from_secs(4 * 60),
};

/// Everything measured, per repetition where ratios are taken within one.
#[derive(Default)]
struct Results {
    /// pipeline → per repetition: subject → run.
    uncontended: HashMap<usize, Vec<HashMap<Subject, PairRun>>>,
    /// Per repetition: (way of waiting, clients) → run.
    contended: Vec<HashMap<(Waiting, usize), Contended>>,
    /// Way of waiting → takeover delays (ms).
    takeover: HashMap<Waiting, Vec<f64>>,
    /// Kind → bytes per lock, one per repetition; and `MEMORY USAGE` of one.
    memory: HashMap<Kind, Vec<f64>>,
    memory_usage: HashMap<Kind, i64>,
    /// Per repetition: (locks held, kind) → run.
    scale: Vec<HashMap<(usize, Kind), PairRun>>,
    /// Waiter counts actually used (the machine may not allow 10,000).
    waiters: Vec<usize>,
    waiters_note: Option<String>,
    /// Per repetition: (waiters, kind) → run.
    drain: Vec<HashMap<(usize, Kind), Drain>>,
    errors: Vec<String>,
}

impl Results {
    /// Runs `body`; a failure is recorded and the run goes on with the rest.
    fn attempt<T>(&mut self, what: &str, body: impl FnOnce() -> Res<T>) -> Option<T> {
        match body() {
            Ok(value) => Some(value),
            Err(e) => {
                let message = format!("{what}: {e}");
                eprintln!("  ERROR {message}");
                self.errors.push(message);
                None
            }
        }
    }
}

fn main() -> ExitCode {
    let Some(args) = BenchArgs::parse(
        "lockbench: run it with `cargo bench --bench lockbench [-- --quick]` or `make bench`",
    ) else {
        return ExitCode::SUCCESS;
    };
    let plan = if args.quick { &QUICK } else { &FULL };
    let only: Vec<String> = args
        .only
        .unwrap_or_else(|| SECTIONS.iter().map(ToString::to_string).collect());
    if let Some(bad) = only.iter().find(|s| !SECTIONS.contains(&s.as_str())) {
        eprintln!(
            "lockbench: unknown section {bad:?}; sections: {}",
            SECTIONS.join(",")
        );
        return ExitCode::FAILURE;
    }
    match run(plan, &only) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("lockbench: {e}");
            ExitCode::FAILURE
        }
    }
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
    let sections: [(&str, Section); 6] = [
        ("uncontended", uncontended),
        ("contended", contended_section),
        ("takeover", takeover_section),
        ("memory", memory_section),
        ("scale", scale_section),
        ("drain", drain_section),
    ];
    for (name, section) in sections {
        if want(name) {
            let t = Instant::now();
            eprintln!("[{:>4}s] {name}", started.elapsed().as_secs());
            section(&ctx, &mut results);
            eprintln!("         {name} took {:.0} s", t.elapsed().as_secs_f64());
        }
    }
    let report = render(&ctx, &results, started.elapsed());
    println!("{report}");
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/lockbench");
    if fs::create_dir_all(&out).is_ok() && fs::write(out.join("report.md"), &report).is_ok() {
        eprintln!("report written to {}", out.join("report.md").display());
    }
    Ok(results.errors.is_empty())
}

/// One section of the run: measures and adds to the results.
type Section = fn(&Ctx, &mut Results);

/// What every section needs.
struct Ctx<'a> {
    plan: &'a Plan,
    server: &'a Server,
    scripts: &'a Scripts,
    shim: &'a Path,
    run_dir: &'a Path,
    module: &'a PathBuf,
    machine: &'a Machine,
    /// Whether this build of the module implements `WAIT`.
    wait: bool,
}

/// Whether `LOCK.ACQUIRE … WAIT` works in this build (it answers a syntax
/// error until waiting lands).
fn wait_supported(server: &Server) -> Res<bool> {
    let mut con = server.conn()?;
    let reply = con.call(&["LOCK.ACQUIRE", "probe:wait", "probe", "1000", "WAIT", "10"])?;
    con.call(&["DEL", "probe:wait"])?;
    Ok(matches!(reply, resp::Reply::Int(_)))
}

/// `items` rotated left by `by`: each repetition starts with another subject.
fn rotated<T: Copy>(items: &[T], by: usize) -> Vec<T> {
    let mut v = items.to_vec();
    if !v.is_empty() {
        let k = by % v.len();
        v.rotate_left(k);
    }
    v
}

/// The ways of waiting this build can measure.
fn waitings(ctx: &Ctx) -> Vec<Waiting> {
    Waiting::ALL
        .into_iter()
        .filter(|w| ctx.wait || *w != Waiting::ModuleWait)
        .collect()
}

fn owner() -> String {
    format!("{}:1", stats::uuid())
}

// ---------------------------------------------------------------------------
// Sections
// ---------------------------------------------------------------------------

/// 1. Uncontended pairs/s at pipeline 1 and 16.
fn uncontended(ctx: &Ctx, r: &mut Results) {
    let bench = Bench {
        server: ctx.server,
        shim: ctx.shim,
        scripts: ctx.scripts,
        owner: owner(),
    };
    // The same raw pairs on a server without the module, side by side.
    let Some(plain) = r.attempt("uncontended: server without the module", || {
        Server::start(ctx.run_dir, "plain", None, &ctx.machine.pinning, 1_000)
    }) else {
        return;
    };
    let Some(plain_scripts) = r.attempt("uncontended: scripts", || {
        Scripts::load(&mut plain.control()?)
    }) else {
        return;
    };
    let plain_bench = Bench {
        server: &plain,
        shim: ctx.shim,
        scripts: &plain_scripts,
        owner: owner(),
    };
    for rep in 0..ctx.plan.reps {
        for pipeline in [1, 16] {
            let n = if pipeline == 1 {
                ctx.plan.pairs_p1
            } else {
                ctx.plan.pairs_p16
            };
            let seed = 1 + 100 * rep as u64 + pipeline as u64;
            let mut runs = HashMap::new();
            for subject in rotated(&Subject::ALL, rep) {
                let what = format!("uncontended {} -P {pipeline}", subject.label());
                let on = if subject == Subject::RawWithoutModule {
                    &plain_bench
                } else {
                    &bench
                };
                if let Some(run) = r.attempt(&what, || on.pair(subject, pipeline, n, seed)) {
                    eprintln!(
                        "  rep {}/{} -P {pipeline:<2} {:<26} {:>9} pairs/s ({:>9} + {:>9} /s)  {:>5.2} µs server CPU/pair",
                        rep + 1,
                        ctx.plan.reps,
                        subject.label(),
                        count(run.pairs_per_s),
                        count(run.acquire_rps),
                        count(run.release_rps),
                        run.cpu_us_per_pair
                    );
                    runs.insert(subject, run);
                }
            }
            r.uncontended.entry(pipeline).or_default().push(runs);
        }
    }
}

/// 2. Contended hand-off: 2, 8, 32 clients on one lock.
fn contended_section(ctx: &Ctx, r: &mut Results) {
    for rep in 0..ctx.plan.reps {
        let mut runs = HashMap::new();
        for clients in ctx.plan.clients {
            for w in rotated(&waitings(ctx), rep) {
                let what = format!("contended {} × {clients}", w.label());
                let got = r.attempt(&what, || {
                    contended::run(
                        ctx.server,
                        ctx.scripts,
                        w,
                        clients,
                        ctx.plan.contended_window,
                    )
                });
                if let Some(c) = got {
                    eprintln!(
                        "  rep {}/{} {clients:>2} clients {:<28} {:>7} acq/s  wait p50 {} p99 {} max {}  {:.1} cmds/acq  {} same client",
                        rep + 1,
                        ctx.plan.reps,
                        w.label(),
                        count(c.acquisitions_per_s),
                        millis(stats::ms(c.wait_p50)),
                        millis(stats::ms(c.wait_p99)),
                        millis(stats::ms(c.wait_max)),
                        c.commands_per_acquisition,
                        percent(c.same_client_share)
                    );
                    runs.insert((w, clients), c);
                }
            }
        }
        r.contended.push(runs);
    }
}

/// 3. Lease-end takeover.
fn takeover_section(ctx: &Ctx, r: &mut Results) {
    for trial in 0..ctx.plan.takeover_trials {
        for w in rotated(&waitings(ctx), trial) {
            let what = format!("takeover {}", w.label());
            if let Some(delay) = r.attempt(&what, || takeover::trial(ctx.server, ctx.scripts, w)) {
                r.takeover.entry(w).or_default().push(delay);
            }
        }
    }
    for w in waitings(ctx) {
        if let Some(d) = r.takeover.get(&w) {
            let max = d.iter().copied().fold(f64::NAN, f64::max);
            eprintln!(
                "  {:<28} median {}  max {}  ({} trials)",
                w.label(),
                millis(median(d)),
                millis(max),
                d.len()
            );
        }
    }
}

/// 4. Memory per held lock.
fn memory_section(ctx: &Ctx, r: &mut Results) {
    let kinds = [Kind::Module, Kind::StringRecipe, Kind::HashRecipe];
    for rep in 0..ctx.plan.memory_reps {
        for kind in rotated(&kinds, rep) {
            let what = format!("memory {}", kind.label());
            let n = ctx.plan.memory_locks;
            if let Some(b) = r.attempt(&what, || {
                memory::bytes_per_lock(ctx.server, ctx.scripts, kind, n)
            }) {
                eprintln!("  {:<16} {b:.1} bytes per held lock", kind.label());
                r.memory.entry(kind).or_default().push(b);
            }
        }
    }
    for kind in kinds {
        let what = format!("MEMORY USAGE {}", kind.label());
        if let Some(u) = r.attempt(&what, || {
            memory::memory_usage_of_one(ctx.server, ctx.scripts, kind)
        }) {
            r.memory_usage.insert(kind, u);
        }
    }
}

/// 5a. Pairs/s with few vs many locks already held: two servers side by
/// side, so the two are measured interleaved.
fn scale_section(ctx: &Ctx, r: &mut Results) {
    let [few, many] = ctx.plan.held;
    let Some(big) = r.attempt("scale: second server", || {
        Server::start(
            ctx.run_dir,
            "many",
            Some(ctx.module),
            &ctx.machine.pinning,
            1_000,
        )
    }) else {
        return;
    };
    let Some(big_scripts) = r.attempt("scale: scripts", || Scripts::load(&mut big.control()?))
    else {
        return;
    };
    // Half module locks, half string-recipe locks: to the keyspace (its hash
    // tables) a lock is a key with a TTL whatever its kind; the hash recipe
    // is left out only because its script makes loading a million slow.
    let mix = [Kind::Module, Kind::StringRecipe];
    let t = Instant::now();
    let filled = r
        .attempt("scale: loading", || {
            let mut con = ctx.server.control()?;
            redis::cmd("FLUSHALL").arg("SYNC").query::<()>(&mut con)?;
            memory::fill(ctx.server, ctx.scripts, &mix, "held:", few)?;
            memory::fill(&big, &big_scripts, &mix, "held:", many)
        })
        .is_some();
    if !filled {
        return;
    }
    eprintln!(
        "  loaded {} + {} held locks in {:.1} s",
        count(few as f64),
        count(many as f64),
        t.elapsed().as_secs_f64()
    );
    let benches = [
        (
            few,
            Bench {
                server: ctx.server,
                shim: ctx.shim,
                scripts: ctx.scripts,
                owner: owner(),
            },
        ),
        (
            many,
            Bench {
                server: &big,
                shim: ctx.shim,
                scripts: &big_scripts,
                owner: owner(),
            },
        ),
    ];
    // One unmeasured run on each: a run adds as many keys as it measures,
    // which may grow the server's hash tables; that happens once, here, and
    // the measured runs start once the rehashing is over.
    for (held, bench) in &benches {
        let what = format!("scale warm-up with {held} held");
        let raw = Subject::Lock(Kind::Raw);
        r.attempt(&what, || {
            bench.pair(raw, 16, ctx.plan.scale_pairs, 99)?;
            server::settle_rehashing(&mut bench.server.control()?, Duration::from_secs(30))
        });
    }
    let kinds = [
        Kind::Raw,
        Kind::StringRecipe,
        Kind::HashRecipe,
        Kind::Module,
    ];
    for rep in 0..ctx.plan.scale_reps {
        let mut runs = HashMap::new();
        for kind in rotated(&kinds, rep) {
            for (held, bench) in rotated(&[0, 1], rep).into_iter().map(|i| &benches[i]) {
                let what = format!("scale {} with {held} held", kind.label());
                let seed = 7 + rep as u64;
                if let Some(run) = r.attempt(&what, || {
                    bench.pair(Subject::Lock(kind), 16, ctx.plan.scale_pairs, seed)
                }) {
                    eprintln!(
                        "  rep {}/{} {:>9} held {:<22} {:>9} pairs/s  {:>5.2} µs CPU/pair",
                        rep + 1,
                        ctx.plan.scale_reps,
                        count(*held as f64),
                        kind.label(),
                        count(run.pairs_per_s),
                        run.cpu_us_per_pair
                    );
                    runs.insert((*held, kind), run);
                }
            }
        }
        r.scale.push(runs);
    }
    r.attempt("scale: cleanup", || {
        Ok(redis::cmd("FLUSHALL")
            .arg("SYNC")
            .query::<()>(&mut ctx.server.control()?)?)
    });
}

/// 5b. Server CPU per hand-off with N clients waiting.
fn drain_section(ctx: &Ctx, r: &mut Results) {
    let Some(limit) = r.attempt("drain: limits", || drain::max_waiters(ctx.server)) else {
        return;
    };
    r.waiters = ctx.plan.waiters.iter().map(|&n| n.min(limit)).collect();
    r.waiters.dedup();
    if r.waiters.last() != ctx.plan.waiters.last() {
        r.waiters_note = Some(format!(
            "{} waiting clients are not possible here (open-files limit {}, server maxclients): \
             the largest N used is {limit}; raise `ulimit -n` to measure 10,000",
            count(ctx.plan.waiters[2] as f64),
            server::open_files_limit().map_or("unknown".into(), |n| n.to_string()),
        ));
    }
    let waiters = r.waiters.clone();
    for rep in 0..ctx.plan.drain_reps {
        let mut runs = HashMap::new();
        for &n in &waiters {
            let mut kinds = vec![Kind::Raw, Kind::HashRecipe];
            if ctx.wait {
                kinds.insert(0, Kind::Module);
            }
            for kind in rotated(&kinds, rep) {
                let what = format!("drain {} with {n} waiting", drain_label(kind));
                let (handoffs, limit) = (ctx.plan.fifo_handoffs, Duration::from_secs(10));
                let got = r.attempt(&what, || match kind {
                    Kind::Module => drain::fifo(ctx.server, Fifo::Module, n, handoffs, limit),
                    Kind::Raw => drain::fifo(ctx.server, Fifo::Blpop, n, handoffs, limit),
                    _ => drain::hash(ctx.server, ctx.scripts, n, ctx.plan.drain_window, 5_000),
                });
                if let Some(d) = got {
                    eprintln!(
                        "  rep {}/{} {:>6} waiting {:<14} {:>9.1} µs server CPU per hand-off ({} hand-offs)",
                        rep + 1,
                        ctx.plan.drain_reps,
                        count(n as f64),
                        drain_label(kind),
                        d.cpu_us_per_handoff,
                        count(d.handoffs as f64)
                    );
                    runs.insert((n, kind), d);
                }
            }
        }
        r.drain.push(runs);
    }
}

/// What each kind is in the drain runs.
fn drain_label(kind: Kind) -> &'static str {
    match kind {
        Kind::Raw => "raw BLPOP",
        other => other.label(),
    }
}

// ---------------------------------------------------------------------------
// Report
// ---------------------------------------------------------------------------

/// Median over repetitions of `f(rep)` where it is defined.
fn med<R>(reps: &[R], f: impl Fn(&R) -> Option<f64>) -> f64 {
    let v: Vec<f64> = reps.iter().filter_map(f).collect();
    median(&v)
}

fn render(ctx: &Ctx, r: &Results, took: Duration) -> String {
    let plan = ctx.plan;
    let m = ctx.machine;
    let mut out = String::new();
    let _ = writeln!(out, "## Benchmark results\n");
    let _ = writeln!(
        out,
        "Run {} ({} mode, {:.1} min) on {} cores ({}), {}. {} \
         Load average {} at the start, {} at the end (other users of the machine).",
        report::utc_now(),
        plan.name,
        took.as_secs_f64() / 60.0,
        m.cores,
        m.cpu_model,
        m.redis_version,
        match (&m.pinning.server, &m.pinning.clients) {
            (Some(s), Some(c)) => format!("redis-server pinned to CPU {s}, clients (redis-benchmark, the bench's threads) to CPU {c}."),
            _ => "No CPU pinning (one CPU).".into(),
        },
        m.load_at_start,
        server::load_average(),
    );
    let _ = writeln!(
        out,
        "Module: `{}`, built from commit {}.",
        ctx.module.display(),
        server::source_revision()
    );
    let _ = writeln!(
        out,
        "Medians of {} repetitions, interleaved; ratios are taken within a repetition, then the median. \
         Absolute figures move ±20% between runs on a shared machine; compare ratios.{}\n",
        plan.reps,
        if ctx.wait {
            ""
        } else {
            " **This build of the module does not implement `WAIT` yet: module waits are not measured.**"
        }
    );
    render_summary(ctx, r, &mut out);
    render_details(ctx, r, &mut out);
    if !r.errors.is_empty() {
        let _ = writeln!(out, "### Errors\n");
        for e in &r.errors {
            let _ = writeln!(out, "- {}", e.replace('\n', " "));
        }
        out.push('\n');
    }
    out
}

/// Per-repetition uncontended ratio of `a` to `b` at `pipeline`.
fn uncontended_ratio(r: &Results, pipeline: usize, a: Subject, b: Subject) -> f64 {
    let reps = r.uncontended.get(&pipeline).map_or(&[][..], Vec::as_slice);
    med(reps, |rep| {
        Some(rep.get(&a)?.pairs_per_s / rep.get(&b)?.pairs_per_s)
    })
}

fn contended_med(r: &Results, w: Waiting, clients: usize, f: impl Fn(&Contended) -> f64) -> f64 {
    med(&r.contended, |rep| rep.get(&(w, clients)).map(&f))
}

const RECIPE_WAITS: [Waiting; 3] = [
    Waiting::Poll(Duration::from_millis(20)),
    Waiting::Poll(Duration::from_millis(1)),
    Waiting::PubSub,
];

fn short(w: Waiting) -> &'static str {
    match w {
        Waiting::ModuleWait => "module",
        Waiting::Poll(d) if d >= Duration::from_millis(20) => "poll 20 ms",
        Waiting::Poll(_) => "poll 1 ms",
        Waiting::PubSub => "pub/sub",
    }
}

fn render_summary(ctx: &Ctx, r: &Results, out: &mut String) {
    let plan = ctx.plan;
    let mut t = Table::new(&[
        "figure",
        "module",
        "recipes (string / hash, or per way of waiting)",
        "target",
        "module meets it?",
    ]);
    let raw = Subject::Lock(Kind::Raw);
    let module = Subject::Lock(Kind::Module);
    let string = Subject::Lock(Kind::StringRecipe);
    let hash = Subject::Lock(Kind::HashRecipe);

    for pipeline in [16, 1] {
        let m = uncontended_ratio(r, pipeline, module, raw);
        t.row(vec![
            format!("pairs/s ÷ raw `SET NX PX`+`DEL`, pipeline {pipeline}"),
            ratio(m),
            format!(
                "{} / {}",
                ratio(uncontended_ratio(r, pipeline, string, raw)),
                ratio(uncontended_ratio(r, pipeline, hash, raw))
            ),
            if pipeline == 16 {
                "≥ 0.9×".into()
            } else {
                "(none)".into()
            },
            if pipeline == 16 {
                verdict(defined(m).map(|m| m >= 0.9))
            } else {
                "".into()
            },
        ]);
    }
    // The same ratio from server CPU per pair: what pairs/s would show on a
    // server core of its own, and far steadier on a shared machine.
    let cpu_ratio = |a: Subject, b: Subject| {
        let reps = r.uncontended.get(&16).map_or(&[][..], Vec::as_slice);
        med(reps, |rep| {
            Some(rep.get(&b)?.cpu_us_per_pair / rep.get(&a)?.cpu_us_per_pair)
        })
    };
    let mc = cpu_ratio(module, raw);
    t.row(vec![
        "server CPU per pair: raw ÷ this, pipeline 16".into(),
        ratio(mc),
        format!(
            "{} / {}",
            ratio(cpu_ratio(string, raw)),
            ratio(cpu_ratio(hash, raw))
        ),
        "(≥ 0.9×, as above)".into(),
        verdict(defined(mc).map(|m| m >= 0.9)),
    ]);
    t.row(vec![
        "raw pair's server CPU, module loaded ÷ not, pipeline 16".into(),
        ratio(1.0 / cpu_ratio(raw, Subject::RawWithoutModule)),
        "(the module's keyspace subscription, paid by every write)".into(),
        "(none)".into(),
        "".into(),
    ]);
    for pipeline in [16, 1] {
        t.row(vec![
            format!("pairs/s ÷ `PING` pairs, pipeline {pipeline}"),
            ratio(uncontended_ratio(r, pipeline, module, Subject::Ping)),
            format!(
                "{} / {}",
                ratio(uncontended_ratio(r, pipeline, string, Subject::Ping)),
                ratio(uncontended_ratio(r, pipeline, hash, Subject::Ping))
            ),
            "(none)".into(),
            "".into(),
        ]);
    }

    let recipes_cell = |f: &dyn Fn(Waiting) -> String| {
        RECIPE_WAITS
            .iter()
            .map(|&w| format!("{} {}", short(w), f(w)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    for clients in plan.clients {
        // Module ÷ the best recipe in the same repetition.
        let vs_best = med(&r.contended, |rep| {
            let m = rep.get(&(Waiting::ModuleWait, clients))?.acquisitions_per_s;
            let best = RECIPE_WAITS
                .iter()
                .filter_map(|w| rep.get(&(*w, clients)).map(|c| c.acquisitions_per_s))
                .fold(f64::NAN, f64::max);
            Some(m / best)
        });
        t.row(vec![
            format!("acquisitions/s, {clients} clients on one lock"),
            format!(
                "{} ({} best recipe)",
                count(contended_med(r, Waiting::ModuleWait, clients, |c| c.acquisitions_per_s)),
                ratio(vs_best)
            ),
            recipes_cell(&|w| count(contended_med(r, w, clients, |c| c.acquisitions_per_s))),
            "≥ 3× the best recipe".into(),
            verdict(defined(vs_best).map(|x| x >= 3.0)),
        ]);
    }
    let (lo, hi) = (plan.clients[0], plan.clients[2]);
    let flat = |w: Waiting| {
        med(&r.contended, |rep| {
            Some(rep.get(&(w, hi))?.acquisitions_per_s / rep.get(&(w, lo))?.acquisitions_per_s)
        })
    };
    let module_flat = flat(Waiting::ModuleWait);
    t.row(vec![
        format!("acquisitions/s, {hi} ÷ {lo} clients"),
        ratio(module_flat),
        recipes_cell(&|w| ratio(flat(w))),
        "flat (≥ 0.8×)".into(),
        verdict(defined(module_flat).map(|x| x >= 0.8)),
    ]);
    // FIFO: each acquisition waits for the other clients' turns, so the
    // longest wait is about clients × the time per acquisition; a holder
    // that stalls (a descheduled client thread) adds its stall, so "about"
    // is taken as within 2×, and the longest hold is shown beside it.
    let mwait = contended_med(r, Waiting::ModuleWait, hi, |c| stats::ms(c.wait_max));
    let fifo =
        hi as f64 * 1000.0 / contended_med(r, Waiting::ModuleWait, hi, |c| c.acquisitions_per_s);
    let stall = contended_med(r, Waiting::ModuleWait, hi, |c| stats::ms(c.hold_max));
    t.row(vec![
        format!("longest wait, {hi} clients"),
        format!("{} (longest hold {})", millis(mwait), millis(stall)),
        recipes_cell(&|w| millis(contended_med(r, w, hi, |c| stats::ms(c.wait_max)))),
        format!(
            "≈ FIFO: {hi} × time per acquisition = {} (met within 2×)",
            millis(fifo)
        ),
        verdict(defined(mwait).map(|x| x <= 2.0 * fifo)),
    ]);
    let mcmd = contended_med(r, Waiting::ModuleWait, hi, |c| c.commands_per_acquisition);
    t.row(vec![
        format!("server commands per acquisition, {hi} clients"),
        num(mcmd, 2),
        recipes_cell(&|w| num(contended_med(r, w, hi, |c| c.commands_per_acquisition), 1)),
        "3 (acquire, INCR, release)".into(),
        verdict(defined(mcmd).map(|x| x <= 3.05)),
    ]);
    t.row(vec![
        format!("acquisitions by the client that just released, {hi} clients"),
        percent(contended_med(r, Waiting::ModuleWait, hi, |c| {
            c.same_client_share
        })),
        recipes_cell(&|w| percent(contended_med(r, w, hi, |c| c.same_client_share))),
        "(none; FIFO gives 0%)".into(),
        "".into(),
    ]);

    let tk = |w: Waiting| r.takeover.get(&w).map_or(&[][..], Vec::as_slice);
    let tmax = |w: Waiting| tk(w).iter().copied().fold(f64::NAN, f64::max);
    let tmed = |w: Waiting| median(tk(w));
    t.row(vec![
        "lease-end takeover, median".into(),
        millis(tmed(Waiting::ModuleWait)),
        recipes_cell(&|w| millis(tmed(w))),
        "≤ 2 ms".into(),
        verdict(defined(tmed(Waiting::ModuleWait)).map(|x| x <= 2.0)),
    ]);
    t.row(vec![
        "lease-end takeover, max".into(),
        millis(tmax(Waiting::ModuleWait)),
        recipes_cell(&|w| millis(tmax(w))),
        "≤ 5 ms".into(),
        verdict(defined(tmax(Waiting::ModuleWait)).map(|x| x <= 5.0)),
    ]);

    let bytes = |k: Kind| median(r.memory.get(&k).map_or(&[][..], Vec::as_slice));
    t.row(vec![
        "bytes per held lock (`used_memory`)".into(),
        num(bytes(Kind::Module), 0),
        format!(
            "{} / {}",
            num(bytes(Kind::StringRecipe), 0),
            num(bytes(Kind::HashRecipe), 0)
        ),
        "≤ 150".into(),
        verdict(defined(bytes(Kind::Module)).map(|x| x <= 150.0)),
    ]);

    let (nlo, nhi) = (
        r.waiters.first().copied().unwrap_or(0),
        r.waiters.last().copied().unwrap_or(0),
    );
    let growth = |k: Kind| {
        med(&r.drain, |rep| {
            Some(rep.get(&(nhi, k))?.cpu_us_per_handoff / rep.get(&(nlo, k))?.cpu_us_per_handoff)
        })
    };
    let mg = growth(Kind::Module);
    let own = med(&r.drain, |rep| {
        let g = |k: Kind| {
            Some(rep.get(&(nhi, k))?.cpu_us_per_handoff / rep.get(&(nlo, k))?.cpu_us_per_handoff)
        };
        Some(g(Kind::Module)? / g(Kind::Raw)?)
    });
    t.row(vec![
        format!(
            "server CPU per hand-off, {} ÷ {} waiting",
            count(nhi as f64),
            count(nlo as f64)
        ),
        format!("{} ({} of raw `BLPOP`'s growth)", ratio(mg), ratio(own)),
        format!(
            "hash (pub/sub) {}; raw `BLPOP`/`LPUSH` hand-off {}",
            ratio(growth(Kind::HashRecipe)),
            ratio(growth(Kind::Raw))
        ),
        "≤ 1.5×".into(),
        verdict(defined(mg).map(|x| x <= 1.5)),
    ]);

    let [few, many] = plan.held;
    let held_ratio = |k: Kind| {
        med(&r.scale, |rep| {
            Some(rep.get(&(many, k))?.pairs_per_s / rep.get(&(few, k))?.pairs_per_s)
        })
    };
    t.row(vec![
        format!(
            "pairs/s with {} ÷ {} locks held, pipeline 16",
            count(many as f64),
            count(few as f64)
        ),
        ratio(held_ratio(Kind::Module)),
        format!(
            "{} / {} (raw {})",
            ratio(held_ratio(Kind::StringRecipe)),
            ratio(held_ratio(Kind::HashRecipe)),
            ratio(held_ratio(Kind::Raw))
        ),
        "(none)".into(),
        "".into(),
    ]);
    let _ = writeln!(out, "### Summary: the module against the issue's targets\n");
    out.push_str(&t.render());
    out.push('\n');
}

/// `Some(x)` unless `x` is NaN (not measured).
fn defined(x: f64) -> Option<f64> {
    (!x.is_nan()).then_some(x)
}

fn render_details(ctx: &Ctx, r: &Results, out: &mut String) {
    let plan = ctx.plan;
    let _ = writeln!(
        out,
        "### 1. Uncontended: acquire + release pairs on distinct keys, {} clients\n",
        throughput::CLIENTS
    );
    let mut t = Table::new(&[
        "pair",
        "pipeline 1: pairs/s",
        "÷ raw",
        "÷ PING",
        "server µs/pair",
        "pipeline 16: pairs/s",
        "÷ raw",
        "÷ PING",
        "server µs/pair",
    ]);
    for s in Subject::ALL {
        let mut row = vec![s.label().to_string()];
        for p in [1, 16] {
            let reps = r.uncontended.get(&p).map_or(&[][..], Vec::as_slice);
            row.push(count(med(reps, |rep| rep.get(&s).map(|x| x.pairs_per_s))));
            row.push(ratio(uncontended_ratio(r, p, s, Subject::Lock(Kind::Raw))));
            row.push(ratio(uncontended_ratio(r, p, s, Subject::Ping)));
            row.push(num(
                med(reps, |rep| rep.get(&s).map(|x| x.cpu_us_per_pair)),
                2,
            ));
        }
        t.row(row);
    }
    out.push_str(&t.render());
    let _ = writeln!(
        out,
        "\n`redis-benchmark` runs {} and {} pairs per run at pipeline 1 and 16. Server µs/pair: the server's main-thread CPU (`INFO cpu`) per pair.\n",
        count(plan.pairs_p1 as f64),
        count(plan.pairs_p16 as f64)
    );

    let _ = writeln!(
        out,
        "### 2. Contended: clients on one lock, each looping acquire → `INCR` → release for {:.1} s\n",
        plan.contended_window.as_secs_f64()
    );
    let mut t = Table::new(&[
        "waiting",
        "clients",
        "acquisitions/s",
        "wait p50",
        "wait p99",
        "wait max",
        "commands/acquisition",
        "server µs/acquisition",
        "longest hold",
        "same client again",
    ]);
    for clients in plan.clients {
        for w in Waiting::ALL {
            if r.contended
                .iter()
                .all(|rep| !rep.contains_key(&(w, clients)))
            {
                continue;
            }
            t.row(vec![
                w.label(),
                clients.to_string(),
                count(contended_med(r, w, clients, |c| c.acquisitions_per_s)),
                millis(contended_med(r, w, clients, |c| stats::ms(c.wait_p50))),
                millis(contended_med(r, w, clients, |c| stats::ms(c.wait_p99))),
                millis(contended_med(r, w, clients, |c| stats::ms(c.wait_max))),
                num(
                    contended_med(r, w, clients, |c| c.commands_per_acquisition),
                    2,
                ),
                num(
                    contended_med(r, w, clients, |c| c.cpu_us_per_acquisition),
                    1,
                ),
                millis(contended_med(r, w, clients, |c| stats::ms(c.hold_max))),
                percent(contended_med(r, w, clients, |c| c.same_client_share)),
            ]);
        }
    }
    out.push_str(&t.render());
    let _ = writeln!(
        out,
        "\nWait: from wanting the lock to holding it. Commands: every call in `INFO commandstats` (those inside scripts too) ÷ acquisitions. \
         Server µs: the server's main-thread CPU per acquisition. \
         Longest hold: from holding the lock to the release's reply (one INCR and one release round trip, unless the client thread was descheduled). Same client again: share of acquisitions made by the client that made the one before (barging; the others starve).\n"
    );

    let _ = writeln!(
        out,
        "### 3. Lease-end takeover: a holder with a {} ms lease vanishes\n",
        takeover::LEASE.as_millis()
    );
    let mut t = Table::new(&["waiting", "median", "max", "trials"]);
    for w in Waiting::ALL {
        if let Some(d) = r.takeover.get(&w) {
            t.row(vec![
                w.label(),
                millis(median(d)),
                millis(d.iter().copied().fold(f64::NAN, f64::max)),
                d.len().to_string(),
            ]);
        }
    }
    out.push_str(&t.render());
    let _ = writeln!(out, "\nTime from the lease end to the waiter holding the lock (±1 ms: the server keeps time in ms).\n");

    let _ = writeln!(
        out,
        "### 4. Memory: {} locks held, owner a 36-character UUID + `:1`\n",
        count(plan.memory_locks as f64)
    );
    let mut t = Table::new(&[
        "lock",
        "bytes per held lock (`used_memory` delta)",
        "`MEMORY USAGE` of one",
    ]);
    for k in [Kind::Module, Kind::StringRecipe, Kind::HashRecipe] {
        t.row(vec![
            k.label().into(),
            num(median(r.memory.get(&k).map_or(&[][..], Vec::as_slice)), 1),
            r.memory_usage
                .get(&k)
                .map_or("n/a".into(), |u| u.to_string()),
        ]);
    }
    out.push_str(&t.render());
    out.push('\n');

    let [few, many] = plan.held;
    let _ = writeln!(
        out,
        "### 5. Scale\n\nPairs/s at pipeline 16 with {} vs {} locks already held (half module, half string-recipe locks; two servers, measured interleaved):\n",
        count(few as f64),
        count(many as f64)
    );
    let mut t = Table::new(&[
        "pair",
        &format!("{} held: pairs/s", count(few as f64)),
        "server µs/pair",
        &format!("{} held: pairs/s", count(many as f64)),
        "server µs/pair",
        "ratio",
    ]);
    for k in [
        Kind::Raw,
        Kind::StringRecipe,
        Kind::HashRecipe,
        Kind::Module,
    ] {
        let at =
            |held: usize, f: fn(&PairRun) -> f64| med(&r.scale, |rep| rep.get(&(held, k)).map(f));
        t.row(vec![
            k.label().into(),
            count(at(few, |p| p.pairs_per_s)),
            num(at(few, |p| p.cpu_us_per_pair), 2),
            count(at(many, |p| p.pairs_per_s)),
            num(at(many, |p| p.cpu_us_per_pair), 2),
            ratio(med(&r.scale, |rep| {
                Some(rep.get(&(many, k))?.pairs_per_s / rep.get(&(few, k))?.pairs_per_s)
            })),
        ]);
    }
    out.push_str(&t.render());
    let _ = writeln!(
        out,
        "\nServer CPU per hand-off with N clients waiting on one lock: each client that gets the lock \
         releases it and waits again, so N stay waiting. Raw `BLPOP`: the same loop on Redis's own \
         first-come-first-served hand-off (`LPUSH` onto a list N clients block on), which shows what \
         N costs the server without any lock:\n"
    );
    let mut t = Table::new(&[
        "waiting clients",
        "module µs/hand-off",
        "hash recipe µs/hand-off",
        "raw `BLPOP` µs/hand-off",
        "hand-offs measured (module / hash / raw)",
    ]);
    for &n in &r.waiters {
        let cpu = |k: Kind| {
            med(&r.drain, |rep| {
                rep.get(&(n, k)).map(|d| d.cpu_us_per_handoff)
            })
        };
        let done = |k: Kind| med(&r.drain, |rep| rep.get(&(n, k)).map(|d| d.handoffs as f64));
        t.row(vec![
            count(n as f64),
            num(cpu(Kind::Module), 1),
            num(cpu(Kind::HashRecipe), 1),
            num(cpu(Kind::Raw), 1),
            format!(
                "{} / {} / {}",
                count(done(Kind::Module)),
                count(done(Kind::HashRecipe)),
                count(done(Kind::Raw))
            ),
        ]);
    }
    out.push_str(&t.render());
    if let Some(note) = &r.waiters_note {
        let _ = writeln!(out, "\n{note}");
    }
    out.push('\n');
}
