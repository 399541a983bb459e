//! 5b. Server CPU per hand-off with N clients waiting.

use std::collections::HashMap;
use std::time::Duration;

use super::{rotated, Ctx, Results};
use crate::drain::{self, Fifo};
use crate::locks::Kind;
use crate::markdown::count;
use crate::server::{self};

/// Runs the section.
pub fn run(ctx: &Ctx, r: &mut Results) {
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
