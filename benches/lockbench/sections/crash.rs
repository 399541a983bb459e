//! A crashed holder: the takeover at leases of 1 s, 10 s and 30 s; then
//! what `EPHEMERAL` costs (uncontended pairs, disconnect churn).
//!
//! The module's `EPHEMERAL` joins when the loaded build answers
//! `LOCK.ACQUIRE … EPHEMERAL` with a fence; else the section says so and
//! measures the rest (the leases, the recipes, the module without it).

use std::collections::HashMap;
use std::fmt::Write as _;

use super::{measurable, rotated, Ctx, Results};
use crate::crash::{self, Churn, ChurnLock, Pairs, Subject, Takeover, PAIR_CLIENTS};
use crate::locks::Waiting;
use crate::markdown::{count, millis, num, ratio, Table};
use crate::server::{load_average, Server};
use crate::stats::median;

/// The holder's lease in the takeover rows, ms; the plan says how many
/// trials each gets.
pub const TTLS_MS: [u64; 3] = [1_000, 10_000, 30_000];

/// Everything the section measured.
#[derive(Default)]
pub struct CrashResults {
    /// Whether the module took part with `EPHEMERAL`.
    pub ephemeral: bool,
    /// Whether a closed connection's ephemeral hold ended at once (the
    /// build may accept the word before it binds holds).
    pub ends_on_close: Option<bool>,
    /// (lease, subject) → one figure per trial.
    pub takeover: HashMap<(u64, Subject), Vec<Takeover>>,
    /// Per repetition: (pipeline, with `EPHEMERAL`) → run.
    pub pairs: Vec<HashMap<(usize, bool), Pairs>>,
    /// (lock, one shared name) → one run per repetition.
    pub churn: HashMap<(ChurnLock, bool), Vec<Churn>>,
    pub churn_clients: usize,
    /// Load average at the start of each part and at the end.
    pub load: Vec<(&'static str, String)>,
}

/// The subjects of the takeover rows this build can measure.
fn subjects(ctx: &Ctx, ephemeral: bool) -> Vec<Subject> {
    let mut v: Vec<Subject> = measurable(ctx, &Waiting::ALL)
        .into_iter()
        .map(Subject::Lease)
        .collect();
    if ephemeral {
        v.insert(0, Subject::ModuleEphemeral);
    }
    v
}

/// Runs the section.
pub fn run(ctx: &Ctx, r: &mut Results) {
    let ephemeral = r.attempt("crash: probe", || {
        Ok(crash::module_has_ephemeral(&mut ctx.server.conn()?)?)
    }) == Some(true);
    r.crash.ephemeral = ephemeral;
    if !ephemeral {
        eprintln!("  module: no ephemeral holds in this build");
    } else {
        r.crash.ends_on_close = r.attempt("crash: disconnect probe", || {
            crash::ephemeral_ends_on_close(ctx.server)
        });
        if r.crash.ends_on_close == Some(false) {
            eprintln!("  module: EPHEMERAL is accepted, but a closed connection's hold outlived it by 1 s: this build does not bind holds yet");
        }
    }
    if !ctx.wait {
        eprintln!("  module: no WAIT in this build: the module's takeover rows are skipped");
    }
    r.crash.load.push(("takeover", load_average()));
    let subjects = subjects(ctx, ephemeral);
    for (ttl, trials) in TTLS_MS.into_iter().zip(ctx.plan.crash_trials) {
        for trial in 0..trials {
            let order = rotated(&subjects, trial);
            for (s, got) in crash::trial(ctx.server, ctx.scripts, &order, ttl) {
                let what = format!("crash takeover {} at {ttl} ms", s.label());
                if let Some(t) = r.attempt(&what, || got) {
                    eprintln!(
                        "  lease {:>2} s trial {}/{trials} {:<30} {:>10} after the kill (held {} before it)",
                        ttl / 1000,
                        trial + 1,
                        s.label(),
                        millis(t.after_kill_ms),
                        millis(t.held_ms)
                    );
                    r.crash.takeover.entry((ttl, s)).or_default().push(t);
                }
            }
        }
    }

    r.crash.load.push(("pairs", load_average()));
    let modes: &[bool] = if ephemeral { &[false, true] } else { &[false] };
    for rep in 0..ctx.plan.reps {
        let mut runs = HashMap::new();
        for pipeline in [1, 16] {
            let n = if pipeline == 1 {
                ctx.plan.pairs_p1
            } else {
                ctx.plan.pairs_p16
            };
            for eph in rotated(modes, rep) {
                let what = format!("crash pairs -P {pipeline} ephemeral={eph}");
                if let Some(p) = r.attempt(&what, || crash::pairs(ctx.server, eph, pipeline, n)) {
                    eprintln!(
                        "  rep {}/{} -P {pipeline:<2} {:<22} {:>9} pairs/s  {:>5.2} µs server CPU/pair",
                        rep + 1,
                        ctx.plan.reps,
                        if eph { "module, EPHEMERAL" } else { "module" },
                        count(p.pairs_per_s),
                        p.cpu_us_per_pair
                    );
                    runs.insert((pipeline, eph), p);
                }
            }
        }
        r.crash.pairs.push(runs);
    }

    r.crash.load.push(("churn", load_average()));
    // A server of its own: the run waits for it to hold nothing.
    let Some(churn_server) = r.attempt("crash: churn server", || {
        Server::start(
            ctx.run_dir,
            "churn",
            Some(ctx.module),
            &ctx.machine.pinning,
            1_000,
        )
    }) else {
        return;
    };
    let clients = ctx.plan.churn_clients;
    r.crash.churn_clients = clients;
    let locks: Vec<ChurnLock> = ChurnLock::ALL
        .into_iter()
        // A build that does not bind holds yet would keep them 60 s.
        .filter(|l| r.crash.ends_on_close == Some(true) || *l != ChurnLock::ModuleEphemeral)
        .collect();
    for rep in 0..ctx.plan.churn_reps {
        for one_name in [false, true] {
            for lock in rotated(&locks, rep) {
                let what = format!("crash churn {} one name={one_name}", lock.label());
                if let Some(c) = r.attempt(&what, || {
                    crash::churn(&churn_server, lock, one_name, clients)
                }) {
                    eprintln!(
                        "  rep {}/{} {:<32} {:<10} {:>6} granted  clients done {:.2} s, all gone {:.2} s  {:>5.1} µs server CPU/client",
                        rep + 1,
                        ctx.plan.churn_reps,
                        lock.label(),
                        if one_name { "one name" } else { "distinct" },
                        count(c.granted as f64),
                        c.clients_s,
                        c.all_gone_s,
                        c.cpu_us_per_client
                    );
                    r.crash.churn.entry((lock, one_name)).or_default().push(c);
                }
            }
        }
    }
    r.crash.load.push(("end", load_average()));
}

/// The section's tables.
pub fn render(ctx: &Ctx, r: &Results, out: &mut String) {
    let c = &r.crash;
    if c.takeover.is_empty() && c.pairs.is_empty() && c.churn.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "### Takeover after a crashed holder: the holder process is killed (`SIGKILL`) with one waiter waiting\n"
    );
    if !c.ephemeral {
        let _ = writeln!(out, "module: no ephemeral holds in this build.\n");
    } else if c.ends_on_close == Some(false) {
        let _ = writeln!(
            out,
            "module: this build accepts `EPHEMERAL`, but a hold whose connection closed was still there 1 s later (of a 10 s lease): it does not bind holds to connections yet, so its rows are lease-end figures.\n"
        );
    }
    let loads: Vec<String> = c.load.iter().map(|(p, l)| format!("{p} {l}")).collect();
    let _ = writeln!(
        out,
        "Load average at the start of each part: {}.\n",
        loads.join(", ")
    );
    let mut t = Table::new(&[
        "lease",
        "holder / waiter",
        "p50 kill → grant",
        "max",
        "trials",
    ]);
    for ttl in TTLS_MS {
        for s in subjects(ctx, c.ephemeral) {
            let Some(v) = c.takeover.get(&(ttl, s)) else {
                continue;
            };
            let d: Vec<f64> = v.iter().map(|t| t.after_kill_ms).collect();
            t.row(vec![
                format!("{} s", ttl / 1000),
                s.label(),
                millis(median(&d)),
                millis(d.iter().copied().fold(f64::NAN, f64::max)),
                d.len().to_string(),
            ]);
        }
    }
    out.push_str(&t.render());
    let held: Vec<f64> = c.takeover.values().flatten().map(|t| t.held_ms).collect();
    let _ = writeln!(
        out,
        "\nThe holder is a process of its own, killed once its waiter waits: it had held the lock for {} (median) before the kill, so a lease-end takeover comes about that much before the lease. p50 is the median over the trials.\n",
        millis(median(&held))
    );

    if !c.pairs.is_empty() {
        let _ = writeln!(
            out,
            "#### The cost of `EPHEMERAL`: uncontended acquire + release pairs on distinct keys, {PAIR_CLIENTS} connections\n"
        );
        let mut t = Table::new(&[
            "pipeline",
            "module pairs/s",
            "EPHEMERAL pairs/s",
            "EPHEMERAL ÷ module",
            "server µs/pair: module",
            "EPHEMERAL",
            "EPHEMERAL ÷ module, server CPU",
        ]);
        for pipeline in [1, 16] {
            let med = |eph: bool, f: &dyn Fn(&Pairs) -> f64| {
                let v: Vec<f64> = c
                    .pairs
                    .iter()
                    .filter_map(|rep| rep.get(&(pipeline, eph)).map(f))
                    .collect();
                median(&v)
            };
            let within = |f: &dyn Fn(&Pairs) -> f64| {
                let v: Vec<f64> = c
                    .pairs
                    .iter()
                    .filter_map(|rep| {
                        Some(f(rep.get(&(pipeline, true))?) / f(rep.get(&(pipeline, false))?))
                    })
                    .collect();
                median(&v)
            };
            t.row(vec![
                pipeline.to_string(),
                count(med(false, &|p| p.pairs_per_s)),
                count(med(true, &|p| p.pairs_per_s)),
                ratio(within(&|p| p.pairs_per_s)),
                num(med(false, &|p| p.cpu_us_per_pair), 2),
                num(med(true, &|p| p.cpu_us_per_pair), 2),
                ratio(within(&|p| p.cpu_us_per_pair)),
            ]);
        }
        out.push_str(&t.render());
        let _ = writeln!(
            out,
            "\nMedians of {} repetitions; the ratio is taken within a repetition. Pipeline 16: 8 pairs per batch, each release right after its acquire.\n",
            c.pairs.len()
        );
    }

    if !c.churn.is_empty() {
        let _ = writeln!(
            out,
            "#### Disconnect churn: {} clients each connect, take a lock and close without releasing\n",
            count(c.churn_clients as f64)
        );
        let mut t = Table::new(&[
            "lock",
            "names",
            "granted",
            "clients done",
            "until no lock is held",
            "server µs/client",
        ]);
        for one_name in [false, true] {
            for lock in ChurnLock::ALL {
                let Some(v) = c.churn.get(&(lock, one_name)) else {
                    continue;
                };
                let med = |f: &dyn Fn(&Churn) -> f64| median(&v.iter().map(f).collect::<Vec<_>>());
                t.row(vec![
                    lock.label().into(),
                    if one_name { "one" } else { "distinct" }.into(),
                    count(med(&|c| c.granted as f64)),
                    millis(med(&|c| c.clients_s * 1e3)),
                    millis(med(&|c| c.all_gone_s * 1e3)),
                    num(med(&|c| c.cpu_us_per_client), 1),
                ]);
            }
        }
        out.push_str(&t.render());
        let reps = c.churn.values().map(Vec::len).max().unwrap_or(0);
        let _ = writeln!(
            out,
            "\nMedians of {reps} runs on a server of its own; 4 threads run the clients in turn. Server CPU is the main thread's `INFO cpu` delta from the first connect until `DBSIZE` is 0 (polled every 2 ms), so a lease-ended lock's expiry counts.\n"
        );
    }
}
