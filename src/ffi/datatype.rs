//! The lock's module data type: what a lock key holds, and the callbacks
//! Redis calls to save, load, rewrite, copy, digest, size and free it.
//!
//! The lease is not stored here: it is the key's TTL, which Redis saves,
//! replicates and expires itself.

use std::ffi::CString;
use std::os::raw::{c_int, c_void};
use std::ptr;

use redis_module::{logging, native_types::RedisType, raw, RedisString};

use crate::ffi::{events, guard};
use crate::{fence, stats};

/// The RDB encoding of a lock value. Version history (every one must stay
/// loadable: see [`rdb_load`]):
/// - 1: owner (string buffer), count (unsigned), fence (unsigned).
pub const ENCODING_VERSION: i32 = 1;

/// What a lock key's value is. The lease end lives in the key's TTL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredLock {
    pub owner: Box<[u8]>,
    pub count: u64,
    pub fence: u64,
}

impl StoredLock {
    /// Hands a value to Redis. Every lock value is born here and dies in
    /// [`free`], which is how `INFO lock` counts `held`.
    pub fn into_raw(self) -> *mut c_void {
        stats::HELD.add(1);
        Box::into_raw(Box::new(self)).cast()
    }

    /// Takes back a value Redis refused or freed.
    ///
    /// # Safety
    /// `value` must come from [`StoredLock::into_raw`] and not be used again.
    pub unsafe fn from_raw(value: *mut c_void) -> Box<StoredLock> {
        stats::HELD.add(-1);
        // SAFETY: the caller's contract above.
        unsafe { Box::from_raw(value.cast::<StoredLock>()) }
    }
}

/// Registered at load time; its `raw_type` is set then.
pub static LOCK_TYPE: RedisType = RedisType::new(
    "redislock",
    ENCODING_VERSION,
    raw::RedisModuleTypeMethods {
        // 4: the newest method set Redis 7.0 knows (unlink2, copy2, …).
        version: 4,
        rdb_load: Some(rdb_load),
        rdb_save: Some(rdb_save),
        aof_rewrite: Some(aof_rewrite),
        mem_usage: Some(mem_usage),
        digest: Some(digest),
        free: Some(free),
        aux_load: Some(aux_load),
        aux_save: Some(aux_save),
        aux_save_triggers: raw::REDISMODULE_AUX_AFTER_RDB as c_int,
        free_effort: None,
        unlink: None,
        copy: Some(copy),
        defrag: None,
        mem_usage2: None,
        free_effort2: None,
        unlink2: Some(unlink2),
        copy2: None,
        aux_save2: None,
    },
);

/// The raw type pointer, for opening and setting keys.
pub fn raw_type() -> *mut raw::RedisModuleType {
    *LOCK_TYPE.raw_type.borrow()
}

// ---------------------------------------------------------------------------
// Callbacks. Each is a thin shim: SAFETY notes, then safe code.
// ---------------------------------------------------------------------------

/// Loads one lock value written by any encoding version this module ever used.
extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    guard("rdb_load", ptr::null_mut(), || match encver {
        1 => load_v1(rdb).map_or(ptr::null_mut(), StoredLock::into_raw),
        other => {
            logging::log_warning(format!(
                "lock: cannot load a lock value of encoding version {other} \
                 (this module knows 1..={ENCODING_VERSION}); upgrade the module"
            ));
            ptr::null_mut()
        }
    })
}

fn load_v1(rdb: *mut raw::RedisModuleIO) -> Option<StoredLock> {
    let owner = raw::load_string_buffer(rdb).ok()?;
    let count = raw::load_unsigned(rdb).ok()?;
    let fence = raw::load_unsigned(rdb).ok()?;
    let owner: Box<[u8]> = owner.as_ref().into();
    if owner.is_empty() || count == 0 || fence == 0 {
        logging::log_warning("lock: refusing a corrupt lock value (empty owner, count or fence)");
        return None;
    }
    // A fence that arrives from a file or a master moves our counter, so the
    // next fence this server issues is above it.
    fence::observe(fence);
    Some(StoredLock {
        owner,
        count,
        fence,
    })
}

/// Saves one lock value in the current encoding.
extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    // SAFETY: Redis passes a value this type created, alive for the call.
    let lock = unsafe { &*value.cast::<StoredLock>() };
    guard("rdb_save", (), || {
        raw::save_slice(rdb, &lock.owner);
        raw::save_unsigned(rdb, lock.count);
        raw::save_unsigned(rdb, lock.fence);
    });
}

/// Writes the lock as `LOCK.APPLY key owner count fence`; Redis follows it
/// with a `PEXPIREAT` for the lease.
extern "C" fn aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    // SAFETY: Redis passes a value this type created, alive for the call.
    let lock = unsafe { &*value.cast::<StoredLock>() };
    let (Some(emit), Ok(count), Ok(fence)) = (
        // SAFETY: the API table is filled in at module load.
        unsafe { raw::RedisModule_EmitAOF },
        CString::new(lock.count.to_string()),
        CString::new(lock.fence.to_string()),
    ) else {
        return;
    };
    // SAFETY: the format "sbcc" matches the arguments: a RedisModuleString,
    // a (pointer, length) buffer, and two NUL-terminated C strings.
    unsafe {
        emit(
            aof,
            c"LOCK.APPLY".as_ptr(),
            c"sbcc".as_ptr(),
            key,
            lock.owner.as_ptr(),
            lock.owner.len(),
            count.as_ptr(),
            fence.as_ptr(),
        );
    }
}

/// Bytes this value uses, for `MEMORY USAGE`.
extern "C" fn mem_usage(value: *const c_void) -> usize {
    // SAFETY: Redis passes a value this type created, alive for the call.
    let lock = unsafe { &*value.cast::<StoredLock>() };
    std::mem::size_of::<StoredLock>() + lock.owner.len()
}

/// Feeds `DEBUG DIGEST`, so master and replica digests can be compared.
extern "C" fn digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    // SAFETY: Redis passes a value this type created and a live digest.
    unsafe {
        let lock = &*value.cast::<StoredLock>();
        if let (Some(add_buf), Some(add_ll), Some(end)) = (
            raw::RedisModule_DigestAddStringBuffer,
            raw::RedisModule_DigestAddLongLong,
            raw::RedisModule_DigestEndSequence,
        ) {
            add_buf(md, lock.owner.as_ptr().cast_mut().cast(), lock.owner.len());
            add_ll(md, lock.count as i64);
            add_ll(md, lock.fence as i64);
            end(md);
        }
    }
}

/// Frees a value Redis no longer needs (may run on a lazy-free thread).
extern "C" fn free(value: *mut c_void) {
    // SAFETY: Redis frees each value it got from us exactly once.
    drop(unsafe { StoredLock::from_raw(value) });
}

/// A lock key leaves the keyspace (DEL, expiry, eviction, overwrite…): tell
/// the event tracker which, so it can tell a lease end from other deletions.
extern "C" fn unlink2(ctx: *mut raw::RedisModuleKeyOptCtx, _value: *const c_void) {
    // SAFETY: Redis passes a live option context for this call.
    let (name, db) = unsafe {
        let name = raw::RedisModule_GetKeyNameFromOptCtx.map_or(ptr::null(), |f| f(ctx));
        let db = raw::RedisModule_GetDbIdFromOptCtx.map_or(-1, |f| f(ctx));
        (name, db)
    };
    if !name.is_null() {
        events::lock_unlinked(db, RedisString::string_as_slice(name));
    }
}

/// `COPY`: an independent copy of the value (same owner, count and fence).
extern "C" fn copy(
    _from: *mut raw::RedisModuleString,
    _to: *mut raw::RedisModuleString,
    value: *const c_void,
) -> *mut c_void {
    // SAFETY: Redis passes a value this type created, alive for the call.
    let lock = unsafe { &*value.cast::<StoredLock>() };
    guard("copy", ptr::null_mut(), || lock.clone().into_raw())
}

/// Saves the fence counter beside the keys, so a restart from RDB continues it.
extern "C" fn aux_save(rdb: *mut raw::RedisModuleIO, _when: c_int) {
    raw::save_unsigned(rdb, fence::last());
}

/// Loads the fence counter (version 1: one unsigned).
extern "C" fn aux_load(rdb: *mut raw::RedisModuleIO, encver: c_int, _when: c_int) -> c_int {
    guard("aux_load", raw::Status::Err as c_int, || {
        if encver > ENCODING_VERSION {
            return raw::Status::Err as c_int;
        }
        match raw::load_unsigned(rdb) {
            Ok(last) => {
                fence::observe(last);
                raw::Status::Ok as c_int
            }
            Err(_) => raw::Status::Err as c_int,
        }
    })
}
