//! Model checks of the lock module's own pure code, with `stateright`.
//!
//! Each model is a small world — clients, one or more servers, a tick
//! counter for time — whose server side calls the module's real core
//! (`redislock_core::{lock, fence, queue, handoff, holds, shared_queue}`),
//! not a copy of it; the
//! server model also runs the module's sequencing,
//! `redislock_core::orchestrate`, through its own `Host` (its state as the
//! world: keys, timers, replies), the trait `src/ffi/host.rs` implements
//! with the C API. The checker then walks every interleaving within the bounds
//! and checks the guarantees in every state it reaches.
//!
//! | module | what it models |
//! |---|---|
//! | [`server`] | one server: commands, waiters, leases, deletes, flushes, pauses, steps of its wall clock ([`wall_clock`]) |
//! | [`failover`] | master, lagging replica, failover and restart, with and without the quarantine |
//! | [`redlock`] | Redlock over 3 servers with crash and restart, with and without the FENCE round |
//! | [`multi`] | several locks at once: requests in crossing orders, wide beside narrow, as one request each; and the hold-and-wait of asking one lock at a time |
//! | [`shared`] | one lock shared by readers, writers or a semaphore's permits, one queue for both modes, with each protection taken out in turn |
//!
//! [`run`] checks a model and reports what held and what did not, with a
//! readable trace for every counterexample.

use std::collections::BTreeSet;
use std::fmt::{self, Debug, Write as _};
use std::hash::Hash;
use std::time::{Duration, Instant};

use stateright::{Checker, Expectation, HasDiscoveries, Model, Path};

pub use Search::{Bfs, Dfs};

pub mod failover;
mod holds_key;
pub mod multi;
pub mod redlock;
pub mod server;
pub mod shared;
pub mod wall_clock;

/// What one run of the checker found.
pub struct Report {
    pub model: String,
    /// Distinct states explored.
    pub states: usize,
    /// States generated, repeats included.
    pub generated: usize,
    pub depth: usize,
    pub elapsed: Duration,
    /// Every state was explored (no property stopped the run early).
    pub complete: bool,
    /// `always` properties with no counterexample, `sometimes` with an example.
    pub held: Vec<&'static str>,
    /// Properties that failed, each with its trace: a counterexample to an
    /// `always`, or (for a `sometimes`) no example found in a complete run.
    pub failed: Vec<(&'static str, String)>,
    /// `sometimes` properties with no example in a run that stopped early
    /// (at a counterexample it looked for): they were not settled.
    pub unsettled: Vec<&'static str>,
}

impl Report {
    /// One summary line, then a line per property.
    pub fn summary(&self) -> String {
        let mut out = format!(
            "{}: {} states ({} generated, depth {}) in {:.2?}{}\n",
            self.model,
            self.states,
            self.generated,
            self.depth,
            self.elapsed,
            if self.complete {
                ""
            } else {
                " (stopped early)"
            }
        );
        for name in &self.held {
            let _ = writeln!(out, "  held:   {name}");
        }
        for (name, _) in &self.failed {
            let _ = writeln!(out, "  FAILED: {name}");
        }
        for name in &self.unsettled {
            let _ = writeln!(out, "  (no example before the run stopped): {name}");
        }
        out
    }

    /// The trace that made `property` fail, if it did.
    pub fn counterexample(&self, property: &str) -> Option<&str> {
        self.failed
            .iter()
            .find(|(name, _)| *name == property)
            .map(|(_, trace)| trace.as_str())
    }
}

/// How to walk the state space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Search {
    /// Breadth-first: counterexamples are shortest, but the frontier of
    /// states to visit is held in memory.
    Bfs,
    /// Depth-first: memory grows with the depth only; for big runs.
    Dfs,
}

/// Checks `model` on `threads` threads. `stop_at`: stop as soon as these
/// properties have a discovery (a test that expects a counterexample needs
/// no more), on one thread so that breadth-first finds the shortest trace;
/// `None`: explore everything.
pub fn run<M>(
    label: &str,
    model: M,
    search: Search,
    threads: usize,
    stop_at: Option<&[&'static str]>,
) -> Report
where
    M: Model + Clone + Send + Sync + 'static,
    M::State: Clone + Debug + Hash + PartialEq + Send + Sync + 'static,
    M::Action: Clone + Debug + PartialEq + Send + Sync + 'static,
{
    let started = Instant::now();
    let threads = if stop_at.is_some() { 1 } else { threads };
    let again = model.clone();
    let mut builder = model.checker().threads(threads);
    if let Some(names) = stop_at {
        builder = builder.finish_when(HasDiscoveries::AnyOf(
            names.iter().copied().collect::<BTreeSet<_>>(),
        ));
    }
    let mut report = match search {
        Search::Bfs => report(label, builder.spawn_bfs().join(), started, stop_at),
        Search::Dfs => report(label, builder.spawn_dfs().join(), started, stop_at),
    };
    if let (Search::Bfs, Some(names)) = (search, stop_at) {
        shorten(&mut report, &again, names);
    }
    report
}

/// Replaces the trace of each property in `names` that failed with a
/// shortest one. (stateright's breadth-first search keeps the last
/// discovery of a batch of states, which may be deeper than the first: this
/// searches again one depth at a time, up to the depth already found.)
fn shorten<M>(report: &mut Report, model: &M, names: &[&'static str])
where
    M: Model + Clone + Send + Sync + 'static,
    M::State: Clone + Debug + Hash + PartialEq + Send + Sync + 'static,
    M::Action: Clone + Debug + PartialEq + Send + Sync + 'static,
{
    for (name, found) in &mut report.failed {
        if !names.contains(name) {
            continue;
        }
        let steps = found.matches("-->").count();
        // A state at depth d (the first is 1) is checked when the target
        // is above d.
        for depth in 2..=steps + 2 {
            let checker = model
                .clone()
                .checker()
                .target_max_depth(depth)
                .finish_when(HasDiscoveries::AnyOf(BTreeSet::from([*name])))
                .spawn_bfs()
                .join();
            if let Some(path) = checker.discovery(name) {
                *found = trace(&path);
                break;
            }
        }
    }
}

/// What a finished checker found (`stop_at`: as given to [`run`]).
fn report<M, C>(
    label: &str,
    checker: C,
    started: Instant,
    stop_at: Option<&[&'static str]>,
) -> Report
where
    M: Model,
    M::State: Clone + Debug + PartialEq,
    M::Action: Clone + Debug + PartialEq,
    C: Checker<M>,
{
    let elapsed = started.elapsed();
    let mut held = Vec::new();
    let mut failed = Vec::new();
    let mut unfound = Vec::new();
    let mut complete = checker.is_done();
    for property in checker.model().properties() {
        let found = checker.discovery(property.name);
        match (property.expectation, found) {
            (Expectation::Sometimes, Some(_)) => held.push(property.name),
            (Expectation::Sometimes, None) => unfound.push(property.name),
            (_, None) => held.push(property.name),
            (_, Some(path)) => {
                complete = false;
                failed.push((property.name, trace(&path)));
            }
        }
    }
    // A run stopped at a counterexample says nothing of what it did not reach.
    let stopped = stop_at.is_some_and(|names| failed.iter().any(|(f, _)| names.contains(f)));
    let mut unsettled = Vec::new();
    for name in unfound {
        if !stopped {
            failed.push((
                name,
                "no reachable state shows this (the model may be too tight)".to_string(),
            ));
        } else {
            unsettled.push(name);
        }
    }
    Report {
        model: label.to_string(),
        states: checker.unique_state_count(),
        generated: checker.state_count(),
        depth: checker.max_depth(),
        elapsed,
        complete,
        held,
        failed,
        unsettled,
    }
}

/// A fence as `tick:counter`: `fence::next` issues `max(last + 1, now × 2^10)`,
/// so the high bits are the tick it was issued at.
pub struct Fence(pub u64);

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shift = redislock_core::fence::CLOCK_SHIFT;
        write!(f, "{}:{}", self.0 >> shift, self.0 & ((1 << shift) - 1))
    }
}

/// A path as numbered steps: each state (its `Debug` form is written to be
/// read), then the action taken from it.
pub fn trace<S: Clone + Debug, A: Clone + Debug>(path: &Path<S, A>) -> String {
    let mut out = String::new();
    for (step, (state, action)) in path.clone().into_vec().into_iter().enumerate() {
        let _ = writeln!(out, "  {step:>2}. {state:?}");
        if let Some(action) = action {
            let _ = writeln!(out, "      --> {action:?}");
        }
    }
    out
}
