//! 5a. Pairs/s with few vs many locks already held: two servers side by
//! side, so the two are measured interleaved.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::{owner, rotated, Ctx, Results};
use crate::locks::{Kind, Scripts};
use crate::markdown::count;
use crate::memory;
use crate::server::{self, Server};
use crate::throughput::{Bench, Subject};

/// Runs the section.
pub fn run(ctx: &Ctx, r: &mut Results) {
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
