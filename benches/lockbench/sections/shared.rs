//! Shared holds: read-write locks and semaphores.
//!
//! Throughput per workload, then the stress check.
//!
//! The recipes always run; the module joins as one more [`Recipe`] when the
//! loaded build answers `LOCK.ACQUIRE … SHARED` (and `WAIT`), else the
//! section says so and measures the recipes only.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use super::{rotated, Ctx, Results};
use crate::markdown::{count, millis, num, percent, ratio, Table};
use crate::shared::{self, Scenario, SharedRun, StressRun};
use crate::shared_recipes::{module_has_shared, Recipe, SharedScripts};
use crate::stats::{self, median};

/// Everything the section measured.
#[derive(Default)]
pub struct SharedResults {
    /// Per repetition: (scenario, recipe) → run.
    pub runs: Vec<HashMap<(Scenario, Recipe), SharedRun>>,
    /// (scenario, recipe, checked before writing) → counts.
    pub stress: Vec<(Scenario, Recipe, bool, StressRun)>,
    /// Whether the module took part.
    pub module: bool,
}

/// What the stress check runs: each recipe checked, and for each kind of
/// lock one control that writes without checking.
const STRESS: [(Scenario, Recipe, bool); 5] = [
    (Scenario::WriteHeavy, Recipe::RedissonRw, true),
    (Scenario::WriteHeavy, Recipe::RedissonRw, false),
    (Scenario::Semaphore, Recipe::RedissonPermits, true),
    (Scenario::Semaphore, Recipe::RedisSemaphore, true),
    (Scenario::Semaphore, Recipe::RedisSemaphore, false),
];

/// Runs the section.
pub fn run(ctx: &Ctx, r: &mut Results) {
    let Some(scripts) = r.attempt("shared: scripts", || {
        Ok(Arc::new(SharedScripts::load(&mut ctx.server.conn()?)?))
    }) else {
        return;
    };
    let module = ctx.wait
        && r.attempt("shared: probe", || {
            Ok(module_has_shared(&mut ctx.server.conn()?)?)
        }) == Some(true);
    r.shared.module = module;
    if !module {
        eprintln!("  module: no shared holds in this build (recipes only)");
    }
    let recipes = |s: Scenario| {
        let mut v = s.recipes().to_vec();
        if module {
            v.insert(0, Recipe::Module);
        }
        v
    };
    for rep in 0..ctx.plan.shared_reps {
        let mut runs = HashMap::new();
        for scenario in Scenario::ALL {
            for recipe in rotated(&recipes(scenario), rep) {
                let what = format!("shared {} on {}", recipe.label(), scenario.label());
                let got = r.attempt(&what, || {
                    shared::throughput(
                        ctx.server,
                        &scripts,
                        recipe,
                        scenario,
                        ctx.plan.shared_window,
                    )
                });
                if let Some(s) = got {
                    eprintln!(
                        "  rep {}/{} {:<34} {:<34} {:>6} acq/s  wait p50 {} p99 {} max {}{}  {:.1} cmds/acq  {} same client  spread {:.2}{}",
                        rep + 1,
                        ctx.plan.shared_reps,
                        scenario.label(),
                        recipe.label(),
                        count(s.acquisitions_per_s),
                        millis(stats::ms(s.wait_p50)),
                        millis(stats::ms(s.wait_p99)),
                        millis(stats::ms(s.wait_max)),
                        s.write_wait_max.map_or(String::new(), |w| format!(
                            " (writes: max {})",
                            millis(stats::ms(w))
                        )),
                        s.commands_per_acquisition,
                        percent(s.same_client_share),
                        s.spread,
                        if s.unserved > 0 {
                            format!(
                                "  {} still waiting at the end (longest {})",
                                s.unserved,
                                millis(stats::ms(s.unserved_longest))
                            )
                        } else {
                            String::new()
                        }
                    );
                    runs.insert((scenario, recipe), s);
                }
            }
        }
        r.shared.runs.push(runs);
    }
    let mut stress: Vec<_> = STRESS.to_vec();
    if module {
        stress.insert(0, (Scenario::Semaphore, Recipe::Module, true));
        stress.insert(0, (Scenario::WriteHeavy, Recipe::Module, true));
    }
    for (scenario, recipe, checked) in stress {
        let what = format!(
            "shared stress {} on {}{}",
            recipe.label(),
            scenario.label(),
            if checked { "" } else { " (control)" }
        );
        let got = r.attempt(&what, || {
            shared::stress(
                ctx.server,
                &scripts,
                recipe,
                scenario,
                checked,
                ctx.plan.stress_window,
            )
        });
        if let Some(s) = got {
            eprintln!(
                "  stress {:<34} {:<34} {:<9} {} holds, {} stalled, {} losses seen, {} lost releases; {} writes, {} beside a conflicting hold; {} holds in an overlap ({} stalled); at most {} open",
                scenario.label(),
                recipe.label(),
                if checked { "checked" } else { "unchecked" },
                s.holds,
                s.stalls,
                s.losses_seen,
                s.lost_releases,
                s.writes,
                s.overlapping_writes,
                s.overlapped_holds,
                s.overlapped_stalled,
                s.most_open
            );
            r.shared.stress.push((scenario, recipe, checked, s));
        }
    }
}

/// The section's tables.
pub fn render(ctx: &Ctx, r: &Results, out: &mut String) {
    let s = &r.shared;
    if s.runs.is_empty() && s.stress.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "### Shared holds: read-write locks and semaphores, each client looping acquire → `INCR` → 1 ms of work → release for {:.1} s\n",
        ctx.plan.shared_window.as_secs_f64()
    );
    if !s.module {
        let _ = writeln!(
            out,
            "module: no shared holds in this build; the recipes only.\n"
        );
    }
    let mut t = Table::new(&[
        "workload",
        "lock",
        "acquisitions/s",
        "wait p50",
        "wait p99",
        "wait max",
        "writes: wait p99 / max",
        "longest wait cut by the end",
        "commands/acquisition",
        "same client again",
        "fewest ÷ most per client",
    ]);
    let med = |sc: Scenario, rc: Recipe, f: &dyn Fn(&SharedRun) -> Option<f64>| {
        let v: Vec<f64> = s
            .runs
            .iter()
            .filter_map(|rep| rep.get(&(sc, rc)).and_then(f))
            .collect();
        median(&v)
    };
    for scenario in Scenario::ALL {
        let mut recipes = scenario.recipes().to_vec();
        recipes.insert(0, Recipe::Module);
        for recipe in recipes {
            if s.runs
                .iter()
                .all(|rep| !rep.contains_key(&(scenario, recipe)))
            {
                continue;
            }
            let ms = |f: fn(&SharedRun) -> Option<std::time::Duration>| {
                millis(med(scenario, recipe, &|x| f(x).map(stats::ms)))
            };
            t.row(vec![
                scenario.label().into(),
                recipe.label().into(),
                count(med(scenario, recipe, &|x| Some(x.acquisitions_per_s))),
                ms(|x| Some(x.wait_p50)),
                ms(|x| Some(x.wait_p99)),
                ms(|x| Some(x.wait_max)),
                if scenario == Scenario::Semaphore {
                    "".into()
                } else {
                    format!(
                        "{} / {}",
                        ms(|x| x.write_wait_p99),
                        ms(|x| x.write_wait_max)
                    )
                },
                ms(|x| (x.unserved > 0).then_some(x.unserved_longest)),
                num(
                    med(scenario, recipe, &|x| Some(x.commands_per_acquisition)),
                    1,
                ),
                percent(med(scenario, recipe, &|x| Some(x.same_client_share))),
                num(med(scenario, recipe, &|x| Some(x.spread)), 2),
            ]);
        }
    }
    out.push_str(&t.render());
    let _ = writeln!(
        out,
        "\nMedians of {} repetitions. Recipes poll every 1 ms; the module waits in the server's queue. \
         Wait: from wanting a hold to having it (writes: the write holds' own). Longest wait cut by the end: the longest wait still going on when the window closed (a starved writer shows here, not in the waits that ended). \
         Commands: every call in `INFO commandstats` (those inside scripts too) ÷ acquisitions. \
         Fewest ÷ most: acquisitions of the client that made fewest ÷ of the one that made most (1 is even).\n",
        ctx.plan.shared_reps
    );
    if s.module {
        // Within each repetition, then the median, as the other sections'
        // ratios.
        let ratios: Vec<String> = Scenario::ALL
            .iter()
            .map(|&sc| {
                let v: Vec<f64> = s
                    .runs
                    .iter()
                    .filter_map(|rep| {
                        let m = rep.get(&(sc, Recipe::Module))?.acquisitions_per_s;
                        let best = sc
                            .recipes()
                            .iter()
                            .filter_map(|rc| rep.get(&(sc, *rc)).map(|x| x.acquisitions_per_s))
                            .fold(f64::NAN, f64::max);
                        Some(m / best)
                    })
                    .collect();
                format!("{} {}", sc.label(), ratio(median(&v)))
            })
            .collect();
        let _ = writeln!(
            out,
            "Module ÷ the best recipe, acquisitions/s: {}.\n",
            ratios.join("; ")
        );
    }
    if s.stress.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "Stress check: {} ms leases; one hold in {} stalls {} ms (past its lease) between its two writes to a shared log. \
         Checked: the client asks the recipe (its renewal) whether it still holds before the second write, and skips it if not; \
         unchecked (the control): it writes anyway. A write beside a conflicting hold: a writer beside anyone, a reader beside a writer, \
         or more than the limit of permits open, as the log's order shows (a hold spans from its first write to its last). Runs of {:.1} s.\n",
        shared::STRESS_LEASE_MS,
        shared::STALL_ONE_IN,
        shared::STALL.as_millis(),
        ctx.plan.stress_window.as_secs_f64()
    );
    let mut t = Table::new(&[
        "workload",
        "lock",
        "client",
        "holds",
        "stalled",
        "losses the check saw",
        "releases answered \"not held\"",
        "writes",
        "writes beside a conflicting hold",
        "holds begun beside one",
        "holds in an overlap (of them stalled)",
        "most holds open at once",
    ]);
    for (scenario, recipe, checked, x) in &s.stress {
        t.row(vec![
            scenario.label().into(),
            recipe.label().into(),
            if *checked {
                "checked".into()
            } else {
                "control: unchecked".into()
            },
            count(x.holds as f64),
            count(x.stalls as f64),
            count(x.losses_seen as f64),
            count(x.lost_releases as f64),
            count(x.writes as f64),
            count(x.overlapping_writes as f64),
            count(x.conflicting_begins as f64),
            format!(
                "{} ({})",
                count(x.overlapped_holds as f64),
                count(x.overlapped_stalled as f64)
            ),
            x.most_open.to_string(),
        ]);
    }
    out.push_str(&t.render());
    out.push('\n');
}
