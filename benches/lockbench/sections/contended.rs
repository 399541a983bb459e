//! 2. Contended hand-off: 2, 8, 32 clients on one lock.

use std::collections::HashMap;

use super::{rotated, waitings, Ctx, Results};
use crate::contended;
use crate::markdown::{count, millis, percent};
use crate::stats::{self};

/// Runs the section.
pub fn run(ctx: &Ctx, r: &mut Results) {
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
