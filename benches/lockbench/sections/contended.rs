//! 2. Contended hand-off: 2, 8, 32 clients on one lock.
//!
//! Beside the locks, Redis's own hand-off: a `BLPOP` token.

use std::collections::HashMap;

use super::{measurable, rotated, Ctx, Results};
use crate::contended::{self, Contended};
use crate::locks::Waiting;
use crate::markdown::{count, millis, percent, ratio};
use crate::stats::{self, median};

/// Runs the section.
pub fn run(ctx: &Ctx, r: &mut Results) {
    let ways = measurable(ctx, &Waiting::CONTENDED);
    for rep in 0..ctx.plan.reps {
        let mut runs = HashMap::new();
        for clients in ctx.plan.clients {
            for w in rotated(&ways, rep) {
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
            if let Some(x) = vs_token(&runs, clients) {
                eprintln!(
                    "  rep {}/{} {clients:>2} clients module ÷ BLPOP token: {}",
                    rep + 1,
                    ctx.plan.reps,
                    ratio(x)
                );
            }
        }
        r.contended.push(runs);
    }
    for clients in ctx.plan.clients {
        let per_rep: Vec<f64> = r
            .contended
            .iter()
            .filter_map(|rep| vs_token(rep, clients))
            .collect();
        if !per_rep.is_empty() {
            eprintln!(
                "  {clients:>2} clients: module ÷ BLPOP token acquisitions/s, median of {}: {}",
                per_rep.len(),
                ratio(median(&per_rep))
            );
        }
    }
}

/// The module's acquisitions/s ÷ the `BLPOP` token's, in one repetition.
pub fn vs_token(rep: &HashMap<(Waiting, usize), Contended>, clients: usize) -> Option<f64> {
    let module = rep.get(&(Waiting::ModuleWait, clients))?;
    let token = rep.get(&(Waiting::BlpopToken, clients))?;
    Some(module.acquisitions_per_s / token.acquisitions_per_s)
}
