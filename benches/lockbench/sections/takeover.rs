//! 3. Lease-end takeover.

use super::{rotated, waitings, Ctx, Results};
use crate::markdown::millis;
use crate::stats::{median, ms, percentile};
use crate::takeover;

/// Runs the section.
pub fn run(ctx: &Ctx, r: &mut Results) {
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
    if let Some(floor) = r.attempt("timer wake-up", || {
        takeover::timer_wake_lateness(takeover::FLOOR_SAMPLES)
    }) {
        eprintln!(
            "  this machine's timer wake-up, late by: median {}  p99 {}  max {}  ({} sleeps, no Redis)",
            millis(ms(percentile(&floor, 50.0))),
            millis(ms(percentile(&floor, 99.0))),
            millis(ms(percentile(&floor, 100.0))),
            floor.len()
        );
        r.timer_floor = floor;
    }
}
