//! How much a run measures: the full run (`make bench`) and the quick one
//! (`make bench-quick`).

use std::time::Duration;

/// How much a run measures. Each run of a section takes about a second on
/// a 2-core machine; more, shorter runs interleave better with the bursts of
/// other load on a shared machine than fewer, longer ones.
pub struct Plan {
    pub name: &'static str,
    /// Repetitions of the uncontended and contended runs.
    pub reps: usize,
    /// Pairs per `redis-benchmark` run at pipeline 1 and 16.
    pub pairs_p1: usize,
    pub pairs_p16: usize,
    pub clients: [usize; 3],
    pub contended_window: Duration,
    pub takeover_trials: usize,
    pub memory_locks: usize,
    pub memory_reps: usize,
    /// Locks held before the scale runs: few, many.
    pub held: [usize; 2],
    pub scale_reps: usize,
    pub scale_pairs: usize,
    pub waiters: [usize; 3],
    pub drain_reps: usize,
    /// Hand-offs per module / `BLPOP` drain run (bounded by 10 s too).
    pub fifo_handoffs: usize,
    /// Length of a hash-recipe drain run.
    pub drain_window: Duration,
    /// Repetitions and length of the shared-hold throughput runs.
    pub shared_reps: usize,
    pub shared_window: Duration,
    /// Length of each shared-hold stress run.
    pub stress_window: Duration,
    /// Crashed-holder takeover trials at leases of 1 s, 10 s and 30 s.
    pub crash_trials: [usize; 3],
    /// Clients per disconnect-churn run, and runs of each.
    pub churn_clients: usize,
    pub churn_reps: usize,
    /// How far the clock section steps the server's wall clock (a
    /// backward step keeps a recipe's crashed holder's lock that long).
    pub clock_step: Duration,
    /// The watchdog aborts the run after this.
    pub budget: Duration,
}

pub const FULL: Plan = Plan {
    name: "full",
    reps: 7,
    pairs_p1: 20_000,
    pairs_p16: 100_000,
    clients: [2, 8, 32],
    contended_window: Duration::from_millis(1_200),
    takeover_trials: 20,
    memory_locks: 100_000,
    memory_reps: 3,
    held: [1_000, 1_000_000],
    scale_reps: 4,
    scale_pairs: 100_000,
    waiters: [10, 1_000, 10_000],
    drain_reps: 5,
    fifo_handoffs: 10_000,
    drain_window: Duration::from_millis(1_500),
    shared_reps: 5,
    shared_window: Duration::from_millis(1_500),
    stress_window: Duration::from_secs(4),
    crash_trials: [10, 3, 3],
    churn_clients: 10_000,
    churn_reps: 3,
    clock_step: Duration::from_secs(60),
    budget: Duration::from_secs(18 * 60),
};

pub const QUICK: Plan = Plan {
    name: "quick",
    reps: 3,
    pairs_p1: 8_000,
    pairs_p16: 40_000,
    contended_window: Duration::from_millis(400),
    takeover_trials: 7,
    memory_reps: 1,
    scale_reps: 2,
    scale_pairs: 40_000,
    drain_reps: 1,
    fifo_handoffs: 4_000,
    drain_window: Duration::from_millis(600),
    shared_reps: 2,
    shared_window: Duration::from_millis(600),
    stress_window: Duration::from_secs(2),
    // The 1 s row only: a lease-end takeover takes the whole lease.
    crash_trials: [5, 0, 0],
    churn_clients: 2_000,
    churn_reps: 1,
    clock_step: Duration::from_secs(10),
    budget: Duration::from_secs(5 * 60),
    // The same client counts, locks and waiters as the full run.
    ..FULL
};
