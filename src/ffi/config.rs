//! Module configs: `lock.max-ttl` and `lock.quarantine` (the quarantine's
//! clock and state are in `ffi::quarantine`).
//!
//! The configs are registered with the server's module-config API, so they
//! are set like any config: in `redis.conf` after `loadmodule`, on the
//! command line, with `MODULE LOADEX … CONFIG …`, and with `CONFIG SET` /
//! `CONFIG GET`; the server checks ranges and enum words itself.

use std::os::raw::{c_char, c_int, c_longlong, c_void};
use std::ptr;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering::Relaxed};

use redis_module::{raw, Context};

use crate::ffi::guard;
use redislock_core::args::MAX_MS;
use redislock_core::quarantine::Mode;

/// `lock.max-ttl`: the longest lease a `ttl-ms` may ask for (0: no cap).
static MAX_TTL: AtomicU64 = AtomicU64::new(0);
/// `lock.quarantine`, as its config number ([`Mode::index`]).
static MODE: AtomicI32 = AtomicI32::new(0);

/// The cap on `ttl-ms` (0: none).
pub fn max_ttl() -> u64 {
    MAX_TTL.load(Relaxed)
}

/// `lock.quarantine`.
pub fn mode() -> Mode {
    Mode::from_index(MODE.load(Relaxed)).unwrap_or(Mode::Always)
}

/// Whether `lock.quarantine` is `never`.
pub fn quarantine_never() -> bool {
    mode() == Mode::Never
}

/// Registers both configs, loads their values (from `redis.conf`, the
/// command line or `MODULE LOADEX`), then starts the start-up quarantine.
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
    }
    Ok(())
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
