//! Counters for the module's `INFO lock` section (Observability in docs/operations.md).
//!
//! Atomics because the data type's free callback can run on a background
//! thread (`FLUSHALL ASYNC`, `UNLINK` of a big database); everything else
//! runs on the server's main thread.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

/// One counter or gauge, named as it appears in `INFO` (after `lock_`).
pub struct Counter(AtomicU64);

impl Counter {
    const fn new() -> Self {
        Counter(AtomicU64::new(0))
    }
    pub fn incr(&self) {
        self.0.fetch_add(1, Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// A gauge that goes up and down (held locks, waiting clients).
pub struct Gauge(AtomicI64);

impl Gauge {
    const fn new() -> Self {
        Gauge(AtomicI64::new(0))
    }
    pub fn add(&self, n: i64) {
        self.0.fetch_add(n, Relaxed);
    }
    pub fn get(&self) -> i64 {
        self.0.load(Relaxed)
    }
}

/// Locks held now: lock values alive in the keyspace (created by a command,
/// replication, `RESTORE`, `COPY` or loading; gone when the data type frees them).
pub static HELD: Gauge = Gauge::new();
/// Shared holds now, one per owner, in the lock values alive.
pub static SHARED_HELD: Gauge = Gauge::new();
/// Clients blocked in `LOCK.ACQUIRE … WAIT` now.
pub static WAITING: Gauge = Gauge::new();
/// Free-to-held transitions asked for by this server's clients (hand-offs included).
pub static ACQUIRED: Counter = Counter::new();
/// Reentrant `ACQUIRE`s and `REENTER`s.
pub static REENTERED: Counter = Counter::new();
/// Successful `RELEASE` calls.
pub static RELEASED: Counter = Counter::new();
/// Successful `RENEW` calls.
pub static RENEWED: Counter = Counter::new();
/// Locks granted to a waiting client.
pub static HANDOFFS: Counter = Counter::new();
/// Waits that ended at their deadline.
pub static WAIT_TIMEOUTS: Counter = Counter::new();
/// Leases that ended while held.
pub static EXPIRED_HELD: Counter = Counter::new();
/// `NOTOWNER` refusals.
pub static NOTOWNER: Counter = Counter::new();
/// Steps of the wall clock the module detected and corrected for.
pub static CLOCK_STEPS: Counter = Counter::new();
/// Ephemeral holds ended by their connection closing.
pub static DISCONNECT_RELEASED: Counter = Counter::new();

/// The section's fields in order, as (name, value). `last_fence` comes from
/// the fence generator, `quarantine_ms` from the quarantine,
/// `partition_safe` from the configs (1: failover safety holds under
/// partitions).
pub fn fields(
    last_fence: u64,
    quarantine_ms: u64,
    partition_safe: bool,
) -> [(&'static str, i64); 16] {
    let c = |c: &Counter| i64::try_from(c.get()).unwrap_or(i64::MAX);
    [
        ("held", HELD.get()),
        ("waiting", WAITING.get()),
        ("acquired", c(&ACQUIRED)),
        ("reentered", c(&REENTERED)),
        ("released", c(&RELEASED)),
        ("renewed", c(&RENEWED)),
        ("handoffs", c(&HANDOFFS)),
        ("wait_timeouts", c(&WAIT_TIMEOUTS)),
        ("expired_held", c(&EXPIRED_HELD)),
        ("notowner", c(&NOTOWNER)),
        ("last_fence", i64::try_from(last_fence).unwrap_or(i64::MAX)),
        (
            "quarantine_ms",
            i64::try_from(quarantine_ms).unwrap_or(i64::MAX),
        ),
        ("clock_steps", c(&CLOCK_STEPS)),
        ("partition_safe", i64::from(partition_safe)),
        ("shared_held", SHARED_HELD.get()),
        ("disconnect_released", c(&DISCONNECT_RELEASED)),
    ]
}
