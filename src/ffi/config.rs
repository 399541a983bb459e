//! Module configs (`lock.max-ttl`, `lock.quarantine`) and the quarantine's
//! clock and state. A promotion's quarantine adds Redis's
//! `min-replicas-max-lag`, which its caller reads (`ffi::partition`).
//!
//! The configs are registered with the server's module-config API, so they
//! are set like any config: in `redis.conf` after `loadmodule`, on the
//! command line, with `MODULE LOADEX … CONFIG …`, and with `CONFIG SET` /
//! `CONFIG GET`; the server checks ranges and enum words itself.

use std::cell::Cell;
use std::os::raw::{c_char, c_int, c_longlong, c_void};
use std::ptr;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::Instant;

use redis_module::{raw, Context};

use crate::args::MAX_MS;
use crate::ffi::{create_timer, guard};
use crate::handoff::Gate;
use crate::quarantine::{Cause, Mode, Quarantine};

/// `lock.max-ttl`: the longest lease a `ttl-ms` may ask for (0: no cap).
static MAX_TTL: AtomicU64 = AtomicU64::new(0);
/// `lock.quarantine`, as its config number ([`Mode::index`]).
static MODE: AtomicI32 = AtomicI32::new(0);

thread_local! {
    /// The quarantine (main thread only).
    static QUARANTINE: Cell<Quarantine> = Cell::new(Quarantine::default());
    /// From module load until the event loop first runs: the load at
    /// start-up happens then, and its end starts the quarantine again.
    static STARTING: Cell<bool> = const { Cell::new(false) };
}

/// The cap on `ttl-ms` (0: none).
pub fn max_ttl() -> u64 {
    MAX_TTL.load(Relaxed)
}

fn mode() -> Mode {
    Mode::from_index(MODE.load(Relaxed)).unwrap_or(Mode::Always)
}

/// Whether `lock.quarantine` is `never`.
pub fn quarantine_never() -> bool {
    mode() == Mode::Never
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
/// (`min-replicas-max-lag`, see `ffi::partition`), which a promotion adds.
pub fn begin_quarantine(cause: Cause, lag_ms: u64) {
    let mut q = QUARANTINE.get();
    // `mono_ms` truncates: count from the next whole millisecond, so the
    // quarantine never ends before the cause's instant + max-ttl.
    q.begin(
        cause,
        mode(),
        max_ttl(),
        lag_ms,
        mono_ms().saturating_add(1),
    );
    QUARANTINE.set(q);
}

/// Ms of quarantine left (0: none), for `INFO lock`.
pub fn quarantine_ms() -> u64 {
    QUARANTINE.get().remaining(mono_ms())
}

/// Whether fresh holds may begin now.
pub fn quarantine_gate() -> Gate {
    QUARANTINE.get().gate(mono_ms())
}

/// A load ended: at start-up, the quarantine counts from now.
pub fn loading_ended() {
    if STARTING.get() {
        begin_quarantine(Cause::Start, 0);
    }
}

/// Registers both configs, loads their values (from `redis.conf`, the
/// command line or `MODULE LOADEX`), and starts the start-up quarantine.
pub fn register(ctx: &Context) -> Result<(), &'static str> {
    let ok = raw::Status::Ok as c_int;
    let flags = raw::REDISMODULE_CONFIG_DEFAULT;
    let names: Vec<*const c_char> = Mode::NAMES.iter().map(|name| name.as_ptr()).collect();
    let values: Vec<c_int> = (0..Mode::NAMES.len() as c_int).collect();
    // SAFETY: module load, with its context; names are static C strings, the
    // enum arrays outlive the call (Redis copies them), and the callbacks
    // are plain functions that live as long as the module.
    unsafe {
        let numeric = raw::RedisModule_RegisterNumericConfig.map_or(!ok, |f| {
            f(
                ctx.ctx,
                c"max-ttl".as_ptr(),
                0,
                flags,
                0,
                MAX_MS as c_longlong,
                Some(get_max_ttl),
                Some(set_max_ttl),
                None,
                ptr::null_mut(),
            )
        });
        let enumerated = raw::RedisModule_RegisterEnumConfig.map_or(!ok, |f| {
            f(
                ctx.ctx,
                c"quarantine".as_ptr(),
                Mode::Always.index(),
                flags,
                names.as_ptr().cast_mut(),
                values.as_ptr(),
                values.len() as c_int,
                Some(get_mode),
                Some(set_mode),
                None,
                ptr::null_mut(),
            )
        });
        if numeric != ok || enumerated != ok {
            return Err("cannot register the module configs (Redis 7.0 or later needed)");
        }
        if raw::RedisModule_LoadConfigs.map_or(!ok, |f| f(ctx.ctx)) != ok {
            return Err("invalid value for lock.max-ttl or lock.quarantine");
        }
        // The event loop's first turn ends the start-up phase.
        create_timer(ctx.ctx, 0, started, ptr::null_mut());
    }
    STARTING.set(true);
    begin_quarantine(Cause::Start, 0);
    Ok(())
}

/// The event loop runs: a later load (`DEBUG RELOAD`, a replica's full
/// sync) starts no quarantine.
extern "C" fn started(_ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    guard("start-up timer", (), || STARTING.set(false));
}

extern "C" fn get_max_ttl(_name: *const c_char, _privdata: *mut c_void) -> c_longlong {
    guard("config get", 0, || {
        c_longlong::try_from(max_ttl()).unwrap_or(c_longlong::MAX)
    })
}

extern "C" fn set_max_ttl(
    _name: *const c_char,
    value: c_longlong,
    _privdata: *mut c_void,
    _err: *mut *mut raw::RedisModuleString,
) -> c_int {
    // The server has checked the range (0..=2^40) already.
    guard("config set", (), || {
        MAX_TTL.store(u64::try_from(value).unwrap_or(0), Relaxed);
    });
    raw::Status::Ok as c_int
}

extern "C" fn get_mode(_name: *const c_char, _privdata: *mut c_void) -> c_int {
    guard("config get", 0, || mode().index())
}

extern "C" fn set_mode(
    _name: *const c_char,
    value: c_int,
    _privdata: *mut c_void,
    _err: *mut *mut raw::RedisModuleString,
) -> c_int {
    guard(
        "config set",
        raw::Status::Err as c_int,
        || match Mode::from_index(value) {
            Some(mode) => {
                MODE.store(mode.index(), Relaxed);
                raw::Status::Ok as c_int
            }
            None => raw::Status::Err as c_int,
        },
    )
}
