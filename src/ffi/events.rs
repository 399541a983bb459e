//! Keyspace notifications the module listens to.
//!
//! Redis tells a data type that a key left the keyspace (`unlink2`) but not
//! why; the `expired` notification that follows tells why but no longer has
//! the value. Pairing the two counts leases that ended while held.

use std::cell::RefCell;
use std::os::raw::{c_char, c_int};

use redis_module::{raw, Context, RedisString};

use crate::stats;

thread_local! {
    /// The last lock key unlinked (db, name), on the main thread. Its buffer
    /// is reused, so tracking costs no allocation per deletion.
    static LAST_UNLINKED: RefCell<(c_int, Vec<u8>)> = const { RefCell::new((-1, Vec::new())) };
}

/// Called from the data type's `unlink2` callback (main thread).
pub fn lock_unlinked(db: c_int, name: &[u8]) {
    LAST_UNLINKED.with_borrow_mut(|(last_db, last_name)| {
        *last_db = db;
        last_name.clear();
        last_name.extend_from_slice(name);
    });
}

/// Whether the key just unlinked was a lock (and forgets it).
fn take_unlinked(db: c_int, name: &[u8]) -> bool {
    LAST_UNLINKED.with_borrow_mut(|(last_db, last_name)| {
        let hit = *last_db == db && last_name == name;
        if hit {
            *last_db = -1;
        }
        hit
    })
}

/// Subscribes to the notifications the module needs. Called once at load.
pub fn subscribe(ctx: &Context) -> Result<(), &'static str> {
    let types = raw::REDISMODULE_NOTIFY_EXPIRED;
    // SAFETY: called from module load with its context; the callback is a
    // plain function that lives as long as the module.
    let status = unsafe {
        raw::RedisModule_SubscribeToKeyspaceEvents.map_or(raw::Status::Err as c_int, |f| {
            f(ctx.ctx, types, Some(on_keyspace_event))
        })
    };
    if status == raw::Status::Ok as c_int {
        Ok(())
    } else {
        Err("cannot subscribe to keyspace events")
    }
}

/// A keyspace notification (main thread). Must not write to the keyspace.
extern "C" fn on_keyspace_event(
    ctx: *mut raw::RedisModuleCtx,
    _type: c_int,
    event: *const c_char,
    key: *mut raw::RedisModuleString,
) -> c_int {
    // SAFETY: Redis passes a NUL-terminated event name and a live key name.
    let (event, name) = unsafe {
        (
            std::ffi::CStr::from_ptr(event).to_bytes(),
            RedisString::string_as_slice(key),
        )
    };
    // SAFETY: the context is live for the call.
    let db = unsafe { raw::RedisModule_GetSelectedDb.map_or(-1, |f| f(ctx)) };
    if event == b"expired" && take_unlinked(db, name) {
        stats::EXPIRED_HELD.incr();
    }
    raw::Status::Ok as c_int
}
