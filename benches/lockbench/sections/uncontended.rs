//! 1. Uncontended pairs/s at pipeline 1 and 16.

use std::collections::HashMap;

use super::{owner, rotated, Ctx, Results};
use crate::locks::Scripts;
use crate::markdown::count;
use crate::server::Server;
use crate::throughput::{Bench, Subject};

/// Runs the section.
pub fn run(ctx: &Ctx, r: &mut Results) {
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
