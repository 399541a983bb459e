//! After a step of the wall clock: every lease put back on the lease clock
//! ([`crate::ffi::lease_clock`], which saw the step and moved its offset).
//! A lock key's TTL is wall time, so each one is put back to its lease left
//! and replicated as `PEXPIREAT` (O(keys) once per step); a lock Redis
//! removed by the stepped clock while its lease ran is put back, replicated,
//! before anyone could be granted it; every pending module timer is
//! re-armed by the lease clock.
//!
//! [`check`] looks for a step and corrects for it: at every entry point of
//! the lock machinery (`Server::new`) and at every cron tick (`ffi::events`).
//! A lock key that leaves its database looks too (the data type's
//! `unlink2`, through the lease clock), but cannot write there: what it
//! keeps is put back by the next check that can (the same cron tick, or the
//! next lock command).

use std::os::raw::{c_int, c_void};
use std::ptr;
use std::time::Instant;

use redis_module::{logging, raw, Context, RedisString};

use crate::ffi::datatype;
use crate::ffi::key::LockKey;
use crate::ffi::{context_flags, guard, lease_clock, now_ms, writes_paused};

/// Looks at the clocks; after a step, corrects for it ([`rebase`]). Cheap
/// when there is none: two clock reads. Main thread, with a live context
/// that may write.
pub fn check(ctx: *mut raw::RedisModuleCtx) {
    if lease_clock::look() {
        rebase(ctx);
    }
}

/// After a step: the locks Redis removed by it put back, every lock key's
/// TTL back to its lease left (in wall terms now), replicated; every
/// pending timer re-armed.
fn rebase(ctx: *mut raw::RedisModuleCtx) {
    let started = Instant::now();
    let timers = lease_clock::rearm_timers(ctx);
    let flags = context_flags(ctx);
    if flags & (raw::REDISMODULE_CTX_FLAGS_SLAVE | raw::REDISMODULE_CTX_FLAGS_LOADING) as c_int != 0
    {
        // A replica keeps the absolute times its master sent (read by its
        // own clock) and writes nothing of its own.
        lease_clock::stashed();
        lease_clock::settled();
        return;
    }
    if writes_paused() {
        // Neither write nor propagate now: the next look does it.
        return;
    }
    // Opening a key Redis counts as expired by the stepped clock deletes
    // it: the lease clock keeps it while the step is pending, and
    // `restore` puts it back.
    let keys = rebase_keys(ctx);
    lease_clock::settled();
    let restored = restore(ctx);
    logging::log_notice(format!(
        "lock: after the step, {restored} locks put back, {keys} lock TTLs and {timers} \
         timers re-based in {} µs",
        started.elapsed().as_micros()
    ));
}

/// Puts back the locks Redis removed by a stepped wall clock while their
/// leases ran, unless the name was taken meanwhile; the count.
fn restore(ctx: *mut raw::RedisModuleCtx) -> usize {
    let stash = lease_clock::stashed();
    if stash.is_empty() {
        return 0;
    }
    let context = Context::new(ctx);
    // SAFETY: a live context; the selected db is restored at the end.
    let was = unsafe { raw::RedisModule_GetSelectedDb.map_or(0, |f| f(ctx)) };
    let now = now_ms();
    let mut done = 0;
    for (db, name, holds) in stash {
        // SAFETY: a live context.
        unsafe { raw::RedisModule_SelectDb.map(|f| f(ctx, db)) };
        let key_name = RedisString::create_from_slice(ctx, &name);
        let mut key = LockKey::open_in_timer(&context, &key_name);
        if matches!(key.stored(), Ok(None)) && holds.live(now).next().is_some() {
            key.restore_holds(holds);
            done += 1;
        }
    }
    // SAFETY: a live context; `was` was selected before.
    unsafe { raw::RedisModule_SelectDb.map(|f| f(ctx, was)) };
    done
}

/// Puts every lock key's TTL back to its stored lease; the count.
fn rebase_keys(ctx: *mut raw::RedisModuleCtx) -> usize {
    let context = Context::new(ctx);
    // SAFETY: a live context; the selected db is restored at the end.
    let was = unsafe { raw::RedisModule_GetSelectedDb.map_or(0, |f| f(ctx)) };
    let mut done = 0;
    let mut db = 0;
    loop {
        // SAFETY: a live context; SelectDb fails past the last database.
        let selected =
            unsafe { raw::RedisModule_SelectDb.map_or(raw::Status::Err as c_int, |f| f(ctx, db)) };
        if selected != raw::Status::Ok as c_int {
            break;
        }
        for name in lock_keys(ctx) {
            let key_name = RedisString::create_from_slice(ctx, &name);
            let key = LockKey::open_in_timer(&context, &key_name);
            if let Some(lease) = key.stored().ok().flatten().map(|stored| stored.lease()) {
                if lease != datatype::LEASE_UNKNOWN {
                    key.restore_expiry(lease);
                    done += 1;
                }
            }
        }
        db += 1;
    }
    // SAFETY: a live context; `was` was selected before.
    unsafe { raw::RedisModule_SelectDb.map(|f| f(ctx, was)) };
    done
}

/// The names of the lock keys of the selected db.
fn lock_keys(ctx: *mut raw::RedisModuleCtx) -> Vec<Vec<u8>> {
    let mut found: Vec<Vec<u8>> = Vec::new();
    // SAFETY: a live context; the scan's callback only reads the key it is
    // given and pushes into `found`, which outlives the scan.
    unsafe {
        let (Some(create), Some(scan), Some(destroy)) = (
            raw::RedisModule_ScanCursorCreate,
            raw::RedisModule_Scan,
            raw::RedisModule_ScanCursorDestroy,
        ) else {
            return found;
        };
        let cursor = create();
        let data = ptr::addr_of_mut!(found).cast::<c_void>();
        while scan(ctx, cursor, Some(collect_lock), data) != 0 {}
        destroy(cursor);
    }
    found
}

/// Scan callback: collects the names of lock keys.
extern "C" fn collect_lock(
    _ctx: *mut raw::RedisModuleCtx,
    keyname: *mut raw::RedisModuleString,
    key: *mut raw::RedisModuleKey,
    data: *mut c_void,
) {
    guard("clock step scan", (), || {
        // SAFETY: Redis passes the scanned key opened for reading and the
        // `Vec` given to RedisModule_Scan, alive for the scan.
        unsafe {
            let is_lock = !key.is_null()
                && raw::RedisModule_ModuleTypeGetType.map_or(ptr::null_mut(), |f| f(key))
                    == datatype::raw_type();
            if is_lock {
                let found = &mut *data.cast::<Vec<Vec<u8>>>();
                found.push(RedisString::string_as_slice(keyname).to_vec());
            }
        }
    });
}
