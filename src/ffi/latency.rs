//! Timing waits for `LOCK.QUEUE`'s `waited`.
//!
//! Lengths are measured on a monotonic clock in microseconds ([`now_us`]),
//! so a wall-clock step changes none of them.

use std::sync::OnceLock;
use std::time::Instant;

/// Microseconds on a monotonic clock (since the module first asked).
pub fn now_us() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let micros = EPOCH.get_or_init(Instant::now).elapsed().as_micros();
    u64::try_from(micros).unwrap_or(u64::MAX)
}
