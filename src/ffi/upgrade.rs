//! Upgrading locks loaded from encoding version 1, which kept a lock's
//! lease only as its key's TTL: once loading is over, each adopts its TTL as
//! its stored lease, and one with no TTL is deleted (every hold has a lease).

use std::os::raw::{c_int, c_void};
use std::ptr;

use redis_module::{raw, Context, RedisString};

use crate::ffi::key::LockKey;
use crate::ffi::{create_timer, datatype, guard};

/// Loading is over and version-1 locks were loaded: upgrade them from a
/// timer, so that what the pass deletes is replicated and written to the AOF
/// like any change.
pub fn schedule(ctx: *mut raw::RedisModuleCtx) {
    create_timer(ctx, 0, upgrade_cb, ptr::null_mut());
}

/// Runs the upgrade pass once loading is over (a timer, so that what it
/// deletes is replicated and written to the AOF like any change).
extern "C" fn upgrade_cb(ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    guard("upgrade of version 1 locks", (), || {
        upgrade_v1_locks(&Context::new(ctx));
    });
}

/// Version 1 kept a lock's lease only as its key's TTL. Each such lock
/// adopts its TTL as its stored lease; one with no TTL (a `PERSIST` under
/// the old module) never had a lease and is deleted: every hold has one.
fn upgrade_v1_locks(ctx: &Context) {
    if ctx.get_flags().contains(redis_module::ContextFlags::SLAVE) {
        return; // the master upgrades, and replicates what it deletes
    }
    let mut found: Vec<(i32, Vec<u8>)> = Vec::new();
    let mut db = 0;
    // SAFETY: a live context; SelectDb fails past the last database; the
    // scan's callback only reads the key it is given and pushes into `found`,
    // which outlives the scan.
    unsafe {
        let (Some(select), Some(create), Some(scan), Some(destroy)) = (
            raw::RedisModule_SelectDb,
            raw::RedisModule_ScanCursorCreate,
            raw::RedisModule_Scan,
            raw::RedisModule_ScanCursorDestroy,
        ) else {
            return;
        };
        while select(ctx.ctx, db) == raw::Status::Ok as c_int {
            let cursor = create();
            let mut batch: Vec<Vec<u8>> = Vec::new();
            let data = ptr::addr_of_mut!(batch).cast::<c_void>();
            while scan(ctx.ctx, cursor, Some(collect_v1), data) != 0 {}
            destroy(cursor);
            found.extend(batch.into_iter().map(|name| (db, name)));
            db += 1;
        }
    }
    let (mut adopted, mut deleted) = (0, 0);
    for (db, name) in found {
        // SAFETY: a live context.
        unsafe { raw::RedisModule_SelectDb.map(|f| f(ctx.ctx, db)) };
        let key_name = RedisString::create_from_slice(ctx.ctx, &name);
        let mut key = LockKey::open_in_timer(ctx, &key_name);
        match key.expires_at() {
            Some(ttl) => {
                key.adopt_lease(ttl);
                adopted += 1;
            }
            None => {
                key.delete();
                deleted += 1;
            }
        }
    }
    ctx.log_notice(&format!(
        "lock: upgraded encoding version 1 locks: {adopted} adopted their TTL as lease, \
         {deleted} without a TTL (no lease) deleted"
    ));
}

/// Scan callback: collects the names of lock keys with no stored lease.
extern "C" fn collect_v1(
    _ctx: *mut raw::RedisModuleCtx,
    keyname: *mut raw::RedisModuleString,
    key: *mut raw::RedisModuleKey,
    data: *mut c_void,
) {
    guard("upgrade scan", (), || {
        // SAFETY: Redis passes the scanned key opened for reading and the
        // `Vec` given to RedisModule_Scan, alive for the scan.
        unsafe {
            let is_lock = !key.is_null()
                && raw::RedisModule_ModuleTypeGetType.map_or(ptr::null_mut(), |f| f(key))
                    == datatype::raw_type();
            if !is_lock {
                return;
            }
            let value = raw::RedisModule_ModuleTypeGetValue
                .map_or(ptr::null_mut(), |f| f(key))
                .cast::<datatype::StoredLock>();
            if value
                .as_ref()
                .is_some_and(|v| v.lease() == datatype::LEASE_UNKNOWN)
            {
                let batch = &mut *data.cast::<Vec<Vec<u8>>>();
                batch.push(RedisString::string_as_slice(keyname).to_vec());
            }
        }
    });
}
