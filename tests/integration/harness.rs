//! The suite's view of the test kit (`testkit/`, the crate
//! `redislock-testkit`): a real `redis-server` per test with the module
//! loaded, and the client helpers every area shares, re-exported under the
//! names the areas use; plus what only this suite needs.
//!
//! - [`Server`] owns one server process: a free loopback port, its own temp
//!   dir, a readiness deadline, restart on the same port and dir, and
//!   kill-and-wait on drop. When the test panics, drop prints the server log
//!   and keeps the dir; when it passes, the dir is removed.
//! - [`Call`] extends `redis::Connection` with one-line commands whose error
//!   replies come back as text (`"NOTOWNER ..."`), and a [`LockInfo`] reader.
//! - [`wait_until`] polls observable state; tests never sleep for a fixed time.
//! - [`wait_on`] sends a blocking `LOCK.ACQUIRE … WAIT` from a thread of its
//!   own, on a plain or a cluster connection.
//!
//! Environment: `LOCK_MODULE`, `LOCK_SERVER` and `LOCK_CLI` (see the kit).

use std::time::{SystemTime, UNIX_EPOCH};

// The whole kit, under the names the areas have always used (`Server`,
// `Call`, `wait_until`, `wait_on`, …), so an area imports from one place.
pub use redislock_testkit::*;

/// A lease longer than any test runs.
pub const LONG: i64 = 600_000;

/// The fields of `INFO lock`, in the order the module reports them.
pub const LOCK_INFO_FIELDS: &[&str] = &[
    "lock_held",
    "lock_waiting",
    "lock_acquired",
    "lock_reentered",
    "lock_released",
    "lock_renewed",
    "lock_handoffs",
    "lock_wait_timeouts",
    "lock_expired_held",
    "lock_notowner",
    "lock_last_fence",
    "lock_quarantine_ms",
    "lock_partition_safe",
    "lock_shared_held",
    "lock_disconnect_released",
];

/// Milliseconds since the Unix epoch, as the module's fence clock reads them.
pub fn now_ms() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970");
    i64::try_from(since.as_millis()).expect("ms fit in i64")
}

/// The clock floor of a fence issued at `ms`: `ms × 2^20` (fencing).
pub fn clock_floor(ms: i64) -> i64 {
    ms << 20
}
