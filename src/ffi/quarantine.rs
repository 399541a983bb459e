//! The quarantine as the server runs it: its monotonic clock, its state,
//! and what starts it — the module's load, the end of the load at
//! start-up, and a promotion (whose quarantine adds Redis's
//! `min-replicas-max-lag`, read by `ffi::partition`). The rules are the
//! core's [`redislock_core::quarantine`]; the configs they read, `ffi::config`.

use std::cell::Cell;
use std::os::raw::c_void;
use std::ptr;
use std::sync::OnceLock;
use std::time::Instant;

use redis_module::raw;

use crate::ffi::{config, create_timer, guard};
use redislock_core::handoff::Gate;
use redislock_core::quarantine::{Cause, Quarantine};

thread_local! {
    /// The quarantine (main thread only).
    static QUARANTINE: Cell<Quarantine> = Cell::new(Quarantine::default());
    /// From module load until the event loop first runs: the load at
    /// start-up happens then, and its end starts the quarantine again.
    static STARTING: Cell<bool> = const { Cell::new(false) };
}

/// Milliseconds on the monotonic clock (since the module loaded).
fn mono_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    let elapsed = START.get_or_init(Instant::now).elapsed().as_millis();
    u64::try_from(elapsed).unwrap_or(u64::MAX)
}

/// `cause` happened now: start the quarantine if the configs say so.
///
/// `lag_ms`: how long a master cut off from its replicas may still grant
/// (`min-replicas-max-lag` in ms, as `ffi::partition` enforces it), which a
/// promotion adds.
fn begin(cause: Cause, lag_ms: u64) {
    let mut q = QUARANTINE.get();
    // `mono_ms` truncates: count from the next whole millisecond, so the
    // quarantine never ends before the cause's instant + max-ttl.
    q.begin(
        cause,
        config::mode(),
        config::max_ttl(),
        lag_ms,
        mono_ms().saturating_add(1),
    );
    QUARANTINE.set(q);
}

/// The module loaded (its configs read): the start-up quarantine begins,
/// and begins again when the load at start-up ends.
pub fn module_loaded(ctx: *mut raw::RedisModuleCtx) {
    STARTING.set(true);
    // The event loop's first turn ends the start-up phase.
    create_timer(ctx, 0, started, ptr::null_mut());
    begin(Cause::Start, 0);
}

/// The event loop runs: a later load (`DEBUG RELOAD`, a replica's full
/// sync) starts no quarantine.
extern "C" fn started(_ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    guard("start-up timer", (), || STARTING.set(false));
}

/// A load ended: at start-up, the quarantine counts from now.
pub fn loading_ended() {
    if STARTING.get() {
        begin(Cause::Start, 0);
    }
}

/// This server became a master: it may lack holds its old master granted.
pub fn promoted(lag_ms: u64) {
    begin(Cause::Promotion, lag_ms);
}

/// Ms of quarantine left (0: none), for `INFO lock`.
pub fn ms_left() -> u64 {
    QUARANTINE.get().remaining(mono_ms())
}

/// Whether fresh holds may begin now.
pub fn gate() -> Gate {
    QUARANTINE.get().gate(mono_ms())
}
