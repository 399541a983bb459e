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
//! - [`wait_until`] polls observable state: a test waits for what it
//!   expects by polling it. Fixed sleeps remain only where the time itself
//!   is under test (a lease that must pass, a hold's length) or where a test
//!   shows that something does not happen for a while.
//! - [`wait_on`] sends a blocking `LOCK.ACQUIRE … WAIT` from a thread of its
//!   own, on a plain or a cluster connection.
//!
//! Environment: `LOCK_MODULE`, `LOCK_SERVER` and `LOCK_CLI` (see the kit).

use std::io::Read;
use std::path::PathBuf;
use std::thread::{self, JoinHandle};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

// The whole kit, under the names the areas have always used (`Server`,
// `Call`, `wait_until`, `wait_on`, …), so an area imports from one place.
pub use redislock_testkit::*;

/// An example of this package (`examples/<name>.rs`), built by `cargo test`
/// beside the test binary (`target/<profile>/examples/`), so it is always
/// from this build: the worker processes of the oversell and stress tests.
pub fn example_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    // target/<profile>/deps/integration-<hash> → target/<profile>
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test binary is in target/<profile>/deps");
    let bin = profile_dir
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.is_file(),
        "{} not found: `cargo test --release` builds the examples, a run limited \
         to `--test integration` does not (then: cargo build --release --examples)",
        bin.display()
    );
    bin
}

/// Reads a child's pipe to its end on a thread of its own (so a chatty
/// child never blocks on a full pipe); the thread returns the text.
pub fn drain(mut pipe: impl Read + Send + 'static) -> JoinHandle<String> {
    thread::spawn(move || {
        let mut text = String::new();
        let _ = pipe.read_to_string(&mut text);
        text
    })
}

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
    "lock_clock_steps",
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

/// Fences per millisecond of the clock floor, as a shift: a fence is
/// `max(last + 1, unix_ms × 2^10)`, below 2^53 so that it is exact as a
/// double (Lua, JSON, JavaScript).
pub const CLOCK_SHIFT: u32 = 10;

/// The clock floor of a fence issued at `ms`: `ms × 2^10` (fencing).
pub fn clock_floor(ms: i64) -> i64 {
    ms << CLOCK_SHIFT
}

/// A connection of `server` subscribed to every keyevent of db 0
/// (`__keyevent@0__:*`), for [`events_until`].
pub fn keyevent_listener(server: &Server) -> redis::Connection {
    let mut listener = server.conn();
    let _: redis::Value = redis::cmd("PSUBSCRIBE")
        .arg("__keyevent@0__:*")
        .query(&mut listener)
        .expect("PSUBSCRIBE");
    listener
}

/// The keyevent names a subscriber sees for `key` from `listener` (already
/// subscribed to `__keyevent@0__:*`) until `last` arrives for it.
pub fn events_until(listener: &mut redis::Connection, key: &str, last: &str) -> Vec<String> {
    fn text(value: &redis::Value) -> Option<String> {
        match value {
            redis::Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
            _ => None,
        }
    }
    listener
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("read timeout");
    let mut events = Vec::new();
    while events.last().map(String::as_str) != Some(last) {
        let message = listener.recv_response().expect("a notification");
        let redis::Value::Array(parts) = &message else {
            panic!("not a pubsub message: {message:?}");
        };
        if parts.get(3).and_then(text).as_deref() != Some(key) {
            continue;
        }
        let channel = parts.get(2).and_then(text).unwrap_or_default();
        events.push(channel.trim_start_matches("__keyevent@0__:").to_string());
    }
    events
}
