//! `instr`: instructions executed in `redis-server` per operation, the module
//! against Redis's own commands for the same work, and what loading the
//! module costs other clients' commands (`make bench-instr`).
//!
//! Directly: `cargo bench --bench instr [-- --quick] [-- --only word,word]`
//! (`--only`: the figures whose names, as progress shows them, contain one
//! of the words); `LOCK_SERVER` picks the server binary, `LOCK_MODULE` the
//! module, `INSTR_SEED` the hash seed, `INSTR_DUMPS` a directory to keep the
//! callgrind dumps in.
//!
//! Each figure is measured on a server started for it (no state left by
//! another workload carries over), under `valgrind --tool=callgrind` (see
//! [`callgrind`]), which counts instructions, not time: the figures do not
//! depend on the machine's load. A figure is the difference between two
//! counted runs of `n1` and `n2` operations divided by `n2 - n1`, which
//! cancels what a run costs once (its first command after idling, the
//! counter's own start and stop). Every command is sent once the server is
//! idle, as natively it would be. Each figure is measured twice on its
//! server and both results are kept: the table says how far they differ.
//!
//! | module | what lives there |
//! |---|---|
//! | [`callgrind`] | a server under callgrind, and counting a workload |
//! | [`work`] | the workloads: command sequences, rings of waiting clients |
//! | `resp`, `server`, `stats`, `markdown`, `locks`, `memory` | shared with `lockbench` |
//!
//! Without `--bench` (as `cargo test --all-targets` runs it) it does nothing.

mod callgrind;
mod work;

// Shared with `benches/lockbench/`; this bench uses part of each.
#[allow(dead_code)]
#[path = "../lockbench/locks.rs"]
mod locks;
#[allow(dead_code)]
#[path = "../lockbench/markdown.rs"]
mod markdown;
#[allow(dead_code)]
#[path = "../lockbench/memory.rs"]
mod memory;
#[allow(dead_code)]
#[path = "../lockbench/resp.rs"]
mod resp;
#[allow(dead_code)]
#[path = "../lockbench/server.rs"]
mod server;
#[allow(dead_code)]
#[path = "../lockbench/stats.rs"]
mod stats;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::fs;
use std::path::Path;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use callgrind::{Seed, Setup, VgServer};
use locks::{Kind, Scripts};
use markdown::{count, ratio, Table};
use redislock_testkit::bench::{self, BenchArgs};
use redislock_testkit::{server_bin, try_module_path};
use server::{Pinning, RunDir};
use work::{Expect, Ring, Steps, Token, Workload, TTL_MS};

/// Errors of the bench itself: a message for the person running it.
pub type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// How much a run measures.
struct Plan {
    name: &'static str,
    /// Operations before counting starts (first allocations, buffers).
    warmup: usize,
    /// The two counted runs.
    n1: usize,
    n2: usize,
    /// Clients waiting in the hand-off rows.
    waiters: [usize; 2],
    /// Locks held on the server in the "locks held" rows of the tax.
    held: usize,
    /// Locks taken for bytes per lock.
    memory_locks: usize,
    /// The watchdog aborts the run after this.
    budget: Duration,
}

const FULL: Plan = Plan {
    name: "full",
    warmup: 200,
    n1: 1_000,
    n2: 2_000,
    waiters: [1, 1_000],
    held: 1_000,
    memory_locks: 100_000,
    budget: Duration::from_secs(30 * 60),
};

const QUICK: Plan = Plan {
    name: "quick",
    warmup: 50,
    n1: 200,
    n2: 400,
    waiters: [1, 100],
    held: 100,
    memory_locks: 10_000,
    budget: Duration::from_secs(10 * 60),
};

/// Hand-off timeouts: the module's `WAIT` in ms, `BLPOP`'s in s.
const WAITS: [(u64, u64); 2] = [(0, 0), (30_000, 30)];

/// Other clients' commands whose cost with the module loaded is compared
/// with the cost without it: name, setup, steps of one operation.
type Op<'a> = (&'a [&'a str], Expect);
/// A command's name in the table, its setup, and one operation.
type TaxRow = (
    &'static str,
    &'static [&'static [&'static str]],
    &'static [Op<'static>],
);
const TAX: [TaxRow; 6] = [
    (
        "`SET k v PX` + `DEL k`",
        &[],
        &[
            (&["SET", "tax:k", "v", "PX", TTL_MS], Expect::Ok),
            (&["DEL", "tax:k"], Expect::Int(1)),
        ],
    ),
    (
        "`EXPIRE k 600`",
        &[&["SET", "tax:k", "v"]],
        &[(&["EXPIRE", "tax:k", "600"], Expect::Int(1))],
    ),
    (
        "`SET k v` + `GET k`",
        &[],
        &[
            (&["SET", "tax:k", "v"], Expect::Ok),
            (&["GET", "tax:k"], Expect::Bulk),
        ],
    ),
    ("`INCR n`", &[], &[(&["INCR", "tax:n"], Expect::AnyInt)]),
    (
        "`HSET h f v`",
        &[],
        &[(&["HSET", "tax:h", "f", "v"], Expect::AnyInt)],
    ),
    (
        "`LPUSH l v` + `LPOP l`",
        &[],
        &[
            (&["LPUSH", "tax:l", "v"], Expect::Int(1)),
            (&["LPOP", "tax:l"], Expect::Bulk),
        ],
    ),
];

/// Two per-operation figures for one workload on one server setup.
type Figures = [f64; 2];

/// Everything measured: (setup, workload name) → figures.
#[derive(Default)]
struct Results {
    figures: HashMap<(bool, bool, String), Figures>,
    /// Bytes per held lock: module, string recipe.
    memory: Option<(f64, f64)>,
    errors: Vec<String>,
}

impl Results {
    fn get(&self, setup: Setup, name: &str) -> Option<Figures> {
        self.figures
            .get(&(setup.module, setup.aof, name.to_string()))
            .copied()
    }
}

fn main() -> ExitCode {
    let Some(args) = BenchArgs::parse("instr", "bench-instr") else {
        return ExitCode::SUCCESS;
    };
    let plan = if args.quick { &QUICK } else { &FULL };
    let only = args.only.unwrap_or_default();
    bench::exit_code("instr", run(plan, &only))
}

/// The whole run; `Ok(false)` if some measurement failed.
fn run(plan: &Plan, only: &[String]) -> Res<bool> {
    server::start_watchdog(plan.budget);
    let module = try_module_path()?;
    let run_dir = RunDir::create()?;
    let version = server_version()?;
    let seed = Seed::prepare(&run_dir.0)?;
    let started = Instant::now();
    eprintln!(
        "instr ({} run): {} {version} under callgrind, {} and {} operations per counted run",
        plan.name,
        server_bin(),
        plan.n1,
        plan.n2
    );
    let mut results = Results::default();
    let wanted = |name: &str| only.is_empty() || only.iter().any(|o| name.contains(o.as_str()));
    let mut servers = 0;
    for module_loaded in [false, true] {
        for aof in [false, true] {
            let setup = Setup {
                module: module_loaded,
                aof,
            };
            let mut ctx = Ctx {
                plan,
                setup,
                results: &mut results,
                started,
                wanted: &wanted,
                run_dir: &run_dir.0,
                module: &module,
                seed: &seed,
                servers,
            };
            ctx.measure_setup();
            servers = ctx.servers;
        }
    }
    if wanted("memory") {
        eprintln!("[{:>4}s] bytes per held lock", started.elapsed().as_secs());
        match bytes_per_lock(&run_dir.0, &module, plan.memory_locks) {
            Ok(m) => results.memory = Some(m),
            Err(e) => results.errors.push(format!("bytes per held lock: {e}")),
        }
    }
    let report = render(plan, &version, seed.value, &results, started.elapsed());
    println!("{report}");
    let out_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-instr");
    fs::create_dir_all(&out_dir)?;
    let file = out_dir.join(format!("report-{}.md", version.replace(' ', "-")));
    fs::write(&file, &report)?;
    eprintln!("instr: report written to {}", file.display());
    Ok(results.errors.is_empty())
}

/// What one server setup measures, and where its figures go.
struct Ctx<'a> {
    plan: &'a Plan,
    setup: Setup,
    results: &'a mut Results,
    started: Instant,
    wanted: &'a dyn Fn(&str) -> bool,
    run_dir: &'a Path,
    module: &'a Path,
    seed: &'a Seed,
    /// Servers started so far, each in a dir of its own.
    servers: usize,
}

impl Ctx<'_> {
    /// Every row of the table that this setup has a column of.
    fn measure_setup(&mut self) {
        let setup = self.setup;
        let plan = self.plan;
        let owner = format!("{}:1", stats::uuid());
        let owner = owner.as_str();
        // Acquire + release, or the raw pair; renew, or `PEXPIRE`.
        if setup.module {
            let acquire = ["LOCK.ACQUIRE", "pair", owner, TTL_MS];
            let release = ["LOCK.RELEASE", "pair", owner];
            let pair = [
                (&acquire[..], Expect::AnyInt),
                (&release[..], Expect::Int(0)),
            ];
            self.steps("pair", &[], &pair, 0);
            let hold = ["LOCK.ACQUIRE", "renew", owner, TTL_MS];
            let renew = ["LOCK.RENEW", "renew", owner, TTL_MS];
            let renew = [(&renew[..], Expect::Int(1))];
            self.steps("renew", &[&hold], &renew, 0);
        } else {
            let set = ["SET", "pair", owner, "NX", "PX", TTL_MS];
            let pair = [
                (&set[..], Expect::Ok),
                (&["DEL", "pair"][..], Expect::Int(1)),
            ];
            self.steps("pair", &[], &pair, 0);
            let hold = ["SET", "renew", owner];
            let renew = [(&["PEXPIRE", "renew", TTL_MS][..], Expect::Int(1))];
            self.steps("renew", &[&hold], &renew, 0);
        }
        // Hand-offs.
        for (wait_ms, timeout_s) in WAITS {
            for waiters in plan.waiters {
                let token = if setup.module {
                    Token::Lock { wait_ms }
                } else {
                    Token::List { timeout_s }
                };
                self.cell(&handoff_name(wait_ms, waiters), |server| {
                    let mut ring = Ring::set_up(server, token, waiters)?;
                    measure(server, plan, &mut ring)
                });
            }
        }
        // The tax on other clients' commands, without and with locks held.
        if !setup.aof {
            for held in [0, plan.held] {
                for (name, prep, ops) in TAX {
                    self.steps(&tax_name(name, held), prep, ops, held);
                }
            }
        }
    }

    /// Measures `name` on a server of its own, started for it, so that no
    /// state left by another workload changes what this one costs.
    fn cell(&mut self, name: &str, body: impl FnOnce(&mut VgServer) -> Res<Figures>) {
        if !(self.wanted)(name) {
            return;
        }
        eprintln!(
            "[{:>4}s]   {}: {name}",
            self.started.elapsed().as_secs(),
            self.setup.label()
        );
        self.servers += 1;
        let dir = self.run_dir.join(format!("server-{}", self.servers));
        let label = format!("{} {name}", self.setup.label());
        let result = VgServer::start(&dir, &label, self.setup, self.module, self.seed)
            .and_then(|mut server| body(&mut server));
        let _ = fs::remove_dir_all(&dir);
        match result {
            Ok(figures) => {
                eprintln!(
                    "          {} / {} instructions per operation",
                    count(figures[0]),
                    count(figures[1])
                );
                self.results.figures.insert(
                    (self.setup.module, self.setup.aof, name.to_string()),
                    figures,
                );
            }
            Err(e) => {
                let message = format!("{}, {name}: {e}", self.setup.label());
                eprintln!("  ERROR {message}");
                self.results.errors.push(message);
            }
        }
    }

    /// A [`Steps`] workload: `prep` once, then `ops` per operation; with
    /// `held` > 0 on a server holding that many locks and one more in use
    /// (see [`work::lock_in_use`]).
    fn steps(&mut self, name: &str, prep: &[&[&str]], ops: &[Op], held: usize) {
        let plan = self.plan;
        let module = self.setup.module;
        self.cell(name, |server| {
            let mut _in_use = None;
            if held > 0 {
                work::hold_locks(server, module, held)?;
                _in_use = Some(work::lock_in_use(server, module)?);
            }
            let mut steps = Steps::new(server, prep, ops)?;
            measure(server, plan, &mut steps)
        });
    }
}

/// Instructions per operation of `work`, twice: after a warm-up, the
/// difference of counted runs of `n1` and `n2` operations ÷ `n2 - n1`.
fn measure(server: &mut VgServer, plan: &Plan, work: &mut dyn Workload) -> Res<Figures> {
    let idle = server.idle();
    work.run(plan.warmup, &idle)?;
    let mut figures = [0.0; 2];
    for figure in &mut figures {
        let c1 = server.count(|| work.run(plan.n1, &idle))?;
        let c2 = server.count(|| work.run(plan.n2, &idle))?;
        *figure = (c2 as f64 - c1 as f64) / (plan.n2 - plan.n1) as f64;
    }
    Ok(figures)
}

fn handoff_name(wait_ms: u64, waiters: usize) -> String {
    format!("handoff wait={wait_ms} waiters={waiters}")
}

fn tax_name(command: &str, held: usize) -> String {
    format!("tax {command} held={held}")
}

/// Bytes per held lock (`used_memory` delta), module and string recipe: on
/// a server started natively (memory does not need callgrind).
fn bytes_per_lock(run_dir: &Path, module: &Path, n: usize) -> Res<(f64, f64)> {
    let pinning = Pinning {
        server: None,
        clients: None,
    };
    let native = server::Server::start(run_dir, "memory", Some(module), &pinning, 1_000)?;
    let scripts = Scripts::load(&mut native.control()?)?;
    let module_bytes = memory::bytes_per_lock(&native, &scripts, Kind::Module, n)?;
    let string_bytes = memory::bytes_per_lock(&native, &scripts, Kind::StringRecipe, n)?;
    Ok((module_bytes, string_bytes))
}

/// `redis-server --version`: `7.0.15`.
fn server_version() -> Res<String> {
    let out = Command::new(server_bin())
        .arg("--version")
        .output()
        .map_err(|e| format!("cannot run {}: {e}", server_bin()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let version = text
        .split_whitespace()
        .find_map(|w| w.strip_prefix("v="))
        .unwrap_or("unknown");
    let name = if text.starts_with("Valkey") {
        "Valkey"
    } else {
        "Redis"
    };
    Ok(format!("{name} {version}"))
}

/// The report: one table, then how it was measured.
fn render(plan: &Plan, version: &str, seed: u64, results: &Results, took: Duration) -> String {
    let plain = |aof| Setup { module: false, aof };
    let loaded = |aof| Setup { module: true, aof };
    let mut table = Table::new(&[
        "path",
        "module",
        "yardstick",
        "module ÷ yardstick",
        "runs differ by",
    ]);
    let mut compare =
        |path: String, module: Option<Figures>, yard_name: &str, yard: Option<Figures>| {
            let mean = |f: Option<Figures>| f.map_or(f64::NAN, |[a, b]| (a + b) / 2.0);
            let spread =
                |f: Option<Figures>| f.map_or(f64::NAN, |[a, b]| (a - b).abs() / ((a + b) / 2.0));
            let (m, y) = (mean(module), mean(yard));
            let worst = spread(module).max(spread(yard));
            table.row(vec![
                path,
                count(m),
                format!("{yard_name} {}", count(y)),
                ratio(m / y),
                if worst.is_nan() {
                    "n/a".into()
                } else {
                    format!("{:.2}%", worst * 100.0)
                },
            ]);
        };
    for aof in [false, true] {
        let persistence = if aof { ", `appendonly yes`" } else { "" };
        compare(
            format!("acquire + release, pipeline 1{persistence}"),
            results.get(loaded(aof), "pair"),
            "`SET NX PX` + `DEL`",
            results.get(plain(aof), "pair"),
        );
    }
    for aof in [false, true] {
        let persistence = if aof { ", `appendonly yes`" } else { "" };
        compare(
            format!("renew{persistence}"),
            results.get(loaded(aof), "renew"),
            "`PEXPIRE`",
            results.get(plain(aof), "renew"),
        );
    }
    for (wait_ms, timeout_s) in WAITS {
        for aof in [false, true] {
            for waiters in plan.waiters {
                let persistence = if aof { ", `appendonly yes`" } else { "" };
                let name = handoff_name(wait_ms, waiters);
                compare(
                    format!(
                        "hand-off, `WAIT {wait_ms}`, {} waiting{persistence}",
                        count(waiters as f64)
                    ),
                    results.get(loaded(aof), &name),
                    &format!("`RPUSH`/`BLPOP tok {timeout_s}`"),
                    results.get(plain(aof), &name),
                );
            }
        }
    }
    for held in [0, plan.held] {
        for (command, ..) in TAX {
            let name = tax_name(command, held);
            let locks = if held == 0 {
                "no locks".to_string()
            } else {
                format!("{} locks held, 1 waiting", count(held as f64))
            };
            compare(
                format!("other clients' {command}, {locks}: module loaded ÷ not"),
                results.get(loaded(false), &name),
                "not loaded",
                results.get(plain(false), &name),
            );
        }
    }
    if let Some((module, string)) = results.memory {
        table.row(vec![
            format!(
                "bytes per held lock (`used_memory`, {} locks)",
                count(plan.memory_locks as f64)
            ),
            format!("{module:.1}"),
            format!("string recipe {string:.1}"),
            ratio(module / string),
            "(not counted)".into(),
        ]);
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "### Instructions per operation in redis-server ({version}, {} run)\n",
        plan.name
    );
    let _ = writeln!(
        out,
        "{}, module {}, hash seed {seed}, {} and {} operations per counted run, each figure measured twice \
         (\"runs differ by\": the larger of the two columns' differences); the whole run took {:.1} min.\n",
        markdown::utc_now(),
        server::source_revision(Path::new(env!("CARGO_MANIFEST_DIR"))),
        count(plan.n1 as f64),
        count(plan.n2 as f64),
        took.as_secs_f64() / 60.0
    );
    out.push_str(&table.render());
    if !results.errors.is_empty() {
        let _ = writeln!(out, "\nErrors:");
        for e in &results.errors {
            let _ = writeln!(out, "- {e}");
        }
    }
    out
}
