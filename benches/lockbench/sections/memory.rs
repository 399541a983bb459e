//! 4. Memory per held lock.

use super::{rotated, Ctx, Results};
use crate::locks::Kind;
use crate::memory;

/// Runs the section.
pub fn run(ctx: &Ctx, r: &mut Results) {
    let kinds = [Kind::Module, Kind::StringRecipe, Kind::HashRecipe];
    for rep in 0..ctx.plan.memory_reps {
        for kind in rotated(&kinds, rep) {
            let what = format!("memory {}", kind.label());
            let n = ctx.plan.memory_locks;
            if let Some(b) = r.attempt(&what, || {
                memory::bytes_per_lock(ctx.server, ctx.scripts, kind, n)
            }) {
                eprintln!("  {:<16} {b:.1} bytes per held lock", kind.label());
                r.memory.entry(kind).or_default().push(b);
            }
        }
    }
    for kind in kinds {
        let what = format!("MEMORY USAGE {}", kind.label());
        if let Some(u) = r.attempt(&what, || {
            memory::memory_usage_of_one(ctx.server, ctx.scripts, kind)
        }) {
            r.memory_usage.insert(kind, u);
        }
    }
}
