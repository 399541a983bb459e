//! The report: one Markdown document, the medians per section, then one
//! summary table of ratios against the targets. Tables and number formats
//! come from [`crate::markdown`] (shared with `instr`).

use std::fmt::Write as _;
use std::time::Duration;

use crate::contended::Contended;
use crate::locks::{Kind, Waiting};
use crate::markdown::{count, millis, num, percent, ratio, utc_now, verdict, Table};
use crate::sections::{Ctx, Results};
use crate::server;
use crate::stats::{self, median, ms, percentile};
use crate::takeover;
use crate::throughput::{self, PairRun, Subject};

/// Median over repetitions of `f(rep)` where it is defined.
fn med<R>(reps: &[R], f: impl Fn(&R) -> Option<f64>) -> f64 {
    let v: Vec<f64> = reps.iter().filter_map(f).collect();
    median(&v)
}

/// The whole report: the run, the summary against the targets, then each
/// section's table.
pub fn render(ctx: &Ctx, r: &Results, took: Duration) -> String {
    let plan = ctx.plan;
    let m = ctx.machine;
    let mut out = String::new();
    let _ = writeln!(out, "## Benchmark results\n");
    let _ = writeln!(
        out,
        "Run {} ({} mode, {:.1} min) on {} cores ({}), {}. {} \
         Load average {} at the start, {} at the end (other users of the machine).",
        utc_now(),
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
        server::source_revision(ctx.module)
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
        Waiting::BlpopToken => "BLPOP token",
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
    // Redis's own hand-off as the yardstick: a ratio near 1 means the
    // module's hand-off costs no more wall-clock time than Redis's.
    let vs_token = |clients: usize| {
        med(&r.contended, |rep| {
            crate::sections::contended::vs_token(rep, clients)
        })
    };
    t.row(vec![
        format!(
            "acquisitions/s ÷ raw `BLPOP` token ({})",
            plan.clients.map(|c| c.to_string()).join(" / ")
        ),
        plan.clients.map(|c| ratio(vs_token(c))).join(" / "),
        format!(
            "token: {} acquisitions/s",
            plan.clients
                .map(|c| count(contended_med(r, Waiting::BlpopToken, c, |x| {
                    x.acquisitions_per_s
                })))
                .join(" / ")
        ),
        "(none; Redis's own hand-off)".into(),
        "".into(),
    ]);
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
        "≤ 1 ms".into(),
        verdict(defined(tmed(Waiting::ModuleWait)).map(|x| x <= 1.0)),
    ]);
    t.row(vec![
        "lease-end takeover, max".into(),
        millis(tmax(Waiting::ModuleWait)),
        recipes_cell(&|w| millis(tmax(w))),
        "≤ 2 ms".into(),
        verdict(defined(tmax(Waiting::ModuleWait)).map(|x| x <= 2.0)),
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
        for w in Waiting::CONTENDED {
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
         Longest hold: from holding the lock to the release's reply (one INCR and one release round trip, unless the client thread was descheduled). Same client again: share of acquisitions made by the client that made the one before (barging; the others starve). \
         Raw `BLPOP` token: no lock, Redis's own hand-off — one token in a list, `BLPOP` (timeout: the time left in the run, as the module's `WAIT`) → `INCR` → `RPUSH`, served in the order the clients blocked.\n"
    );
    let ratios: Vec<String> = plan
        .clients
        .iter()
        .map(|&c| {
            format!(
                "{c} clients {}",
                ratio(med(&r.contended, |rep| {
                    crate::sections::contended::vs_token(rep, c)
                }))
            )
        })
        .collect();
    let _ = writeln!(
        out,
        "Module ÷ raw `BLPOP` token, acquisitions/s (per repetition, then the median): {}.\n",
        ratios.join(", ")
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
    let floor = &r.timer_floor;
    if !floor.is_empty() {
        let at = |p: f64| millis(ms(percentile(floor, p)));
        let _ = writeln!(
            out,
            "This machine's own timer wake-up, the floor under every row (a takeover needs two: the server's at the lease end, the waiter's at the reply): a thread sleeping on a monotonic `timerfd` in `epoll`, as the module's lease alarm does, with no Redis, woke late by {} at the median, {} at p99 and {} at most ({} sleeps of 2–10 ms).\n",
            at(50.0),
            at(99.0),
            at(100.0),
            floor.len()
        );
    }

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
    crate::sections::shared::render(ctx, r, out);
    crate::sections::crash::render(ctx, r, out);
    crate::sections::clock::render(r, out);
    crate::sections::multi::render(r, out);
}
