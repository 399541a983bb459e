//! The sections of a run, one module each: each measures and adds what it
//! found to [`Results`], which `report` renders. They run in the order of
//! [`ALL`], whose names `--only` takes.

pub mod clock;
pub mod contended;
pub mod crash;
pub mod drain;
pub mod memory;
pub mod multi;
pub mod scale;
pub mod shared;
pub mod takeover;
pub mod uncontended;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::contended::Contended;
use crate::drain::Drain;
use crate::locks::{Kind, Scripts, Waiting};
use crate::plan::Plan;
use crate::server::{Machine, Server};
use crate::stats;
use crate::throughput::{PairRun, Subject};
use crate::Res;

/// The sections, in run order.
pub const ALL: [(&str, Section); 10] = [
    ("uncontended", uncontended::run),
    ("contended", contended::run),
    ("takeover", takeover::run),
    ("memory", memory::run),
    ("scale", scale::run),
    ("drain", drain::run),
    ("shared", shared::run),
    ("crash", crash::run),
    ("clock", clock::run),
    ("multi", multi::run),
];

/// One section of the run: measures and adds to the results.
pub type Section = fn(&Ctx, &mut Results);

/// What every section needs.
pub struct Ctx<'a> {
    pub plan: &'a Plan,
    pub server: &'a Server,
    pub scripts: &'a Scripts,
    pub shim: &'a Path,
    pub run_dir: &'a Path,
    pub module: &'a PathBuf,
    pub machine: &'a Machine,
    /// Whether this build of the module implements `WAIT`.
    pub wait: bool,
}

/// Everything measured, per repetition where ratios are taken within one.
#[derive(Default)]
pub struct Results {
    /// pipeline → per repetition: subject → run.
    pub uncontended: HashMap<usize, Vec<HashMap<Subject, PairRun>>>,
    /// Per repetition: (way of waiting, clients) → run.
    pub contended: Vec<HashMap<(Waiting, usize), Contended>>,
    /// Way of waiting → takeover delays (ms).
    pub takeover: HashMap<Waiting, Vec<f64>>,
    /// This machine's own timer wake-up lateness, sorted.
    pub timer_floor: Vec<std::time::Duration>,
    /// Kind → bytes per lock, one per repetition; and `MEMORY USAGE` of one.
    pub memory: HashMap<Kind, Vec<f64>>,
    pub memory_usage: HashMap<Kind, i64>,
    /// Per repetition: (locks held, kind) → run.
    pub scale: Vec<HashMap<(usize, Kind), PairRun>>,
    /// Waiter counts actually used (the machine may not allow 10,000).
    pub waiters: Vec<usize>,
    pub waiters_note: Option<String>,
    /// Per repetition: (waiters, kind) → run.
    pub drain: Vec<HashMap<(usize, Kind), Drain>>,
    /// Shared holds: throughput and the stress check.
    pub shared: shared::SharedResults,
    /// A crashed holder's takeover and what `EPHEMERAL` costs.
    pub crash: crash::CrashResults,
    /// A step of the server's wall clock under a holder.
    pub clock: clock::ClockResults,
    /// Several locks or permits at once.
    pub multi: multi::MultiResults,
    pub errors: Vec<String>,
}

impl Results {
    /// Runs `body`; a failure is recorded and the run goes on with the rest.
    pub fn attempt<T>(&mut self, what: &str, body: impl FnOnce() -> Res<T>) -> Option<T> {
        match body() {
            Ok(value) => Some(value),
            Err(e) => {
                let message = format!("{what}: {e}");
                eprintln!("  ERROR {message}");
                self.errors.push(message);
                None
            }
        }
    }
}

/// `items` rotated left by `by`: each repetition starts with another subject.
pub fn rotated<T: Copy>(items: &[T], by: usize) -> Vec<T> {
    let mut v = items.to_vec();
    if !v.is_empty() {
        let k = by % v.len();
        v.rotate_left(k);
    }
    v
}

/// The ways of waiting for a lock this build can measure.
pub fn waitings(ctx: &Ctx) -> Vec<Waiting> {
    measurable(ctx, &Waiting::ALL)
}

/// `ways` without the module's `WAIT` if this build lacks it.
pub fn measurable(ctx: &Ctx, ways: &[Waiting]) -> Vec<Waiting> {
    ways.iter()
        .copied()
        .filter(|w| ctx.wait || *w != Waiting::ModuleWait)
        .collect()
}

/// A fresh owner name.
pub fn owner() -> String {
    format!("{}:1", stats::uuid())
}
