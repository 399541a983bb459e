//! Opening a lock key, reading it as a [`Held`], writing decisions back, and
//! sending each change to replicas and the AOF as an effect.

use std::ffi::CString;
use std::os::raw::c_int;

use redis_module::{raw, Context, RedisString};

use crate::error::LockError;
use crate::ffi::datatype::{raw_type, StoredLock};
use crate::lock::Held;

/// `PTTL`'s "no expiry", and ours for a lock someone `PERSIST`ed.
const NO_EXPIRE: i64 = -1;

/// An open key, closed on drop.
pub struct LockKey<'a> {
    ctx: &'a Context,
    name: &'a RedisString,
    key: *mut raw::RedisModuleKey,
}

impl<'a> LockKey<'a> {
    /// Opens `name` for reading and writing (`write`) or reading only.
    /// Opening lazily expires a key whose lease has ended.
    pub fn open(ctx: &'a Context, name: &'a RedisString, write: bool) -> LockKey<'a> {
        let mode = if write {
            raw::KeyMode::READ | raw::KeyMode::WRITE
        } else {
            raw::KeyMode::READ
        };
        let key = raw::open_key(ctx.ctx, name.inner, mode);
        LockKey { ctx, name, key }
    }

    /// The lock here: `None` if the key is free, `WRONGTYPE` if it holds
    /// another type.
    pub fn stored(&self) -> Result<Option<&StoredLock>, LockError> {
        // SAFETY: a non-null pointer is the key's live value, borrowed no
        // longer than the open key.
        self.value_ptr().map(|value| unsafe { value.as_ref() })
    }

    /// The key's lock value as a raw pointer: null if the key is free.
    fn value_ptr(&self) -> Result<*mut StoredLock, LockError> {
        if self.key.is_null() {
            return Ok(std::ptr::null_mut());
        }
        // SAFETY: `self.key` is an open key of this context.
        unsafe {
            let key_type = raw::RedisModule_KeyType.map_or(0, |f| f(self.key));
            if key_type == raw::REDISMODULE_KEYTYPE_EMPTY as c_int {
                return Ok(std::ptr::null_mut());
            }
            let is_lock = key_type == raw::REDISMODULE_KEYTYPE_MODULE as c_int
                && raw::RedisModule_ModuleTypeGetType.map_or(std::ptr::null_mut(), |f| f(self.key))
                    == raw_type();
            if !is_lock {
                return Err(LockError::WrongType);
            }
            let value =
                raw::RedisModule_ModuleTypeGetValue.map_or(std::ptr::null_mut(), |f| f(self.key));
            Ok(value.cast::<StoredLock>())
        }
    }

    /// The key's TTL in ms (`PTTL`), or -1 without one.
    pub fn ttl_ms(&self) -> i64 {
        // SAFETY: `self.key` is an open, non-empty key of this context.
        unsafe { raw::RedisModule_GetExpire.map_or(NO_EXPIRE, |f| f(self.key)) }
    }

    /// The key's absolute expiry (unix ms), whatever its type; `None` if it
    /// has none or does not exist.
    pub fn expires_at(&self) -> Option<u64> {
        if self.key.is_null() {
            return None;
        }
        // SAFETY: `self.key` is an open key of this context.
        let at = unsafe { raw::RedisModule_GetAbsExpire.map_or(NO_EXPIRE, |f| f(self.key)) };
        u64::try_from(at).ok()
    }

    /// The lock as the core sees it: value plus absolute lease end.
    pub fn read(&self) -> Result<Option<Held>, LockError> {
        let Some(lock) = self.stored()? else {
            return Ok(None);
        };
        // SAFETY: `self.key` is an open, non-empty key of this context.
        let expires_at =
            unsafe { raw::RedisModule_GetAbsExpire.map_or(NO_EXPIRE, |f| f(self.key)) };
        Ok(Some(Held {
            owner: lock.owner.to_vec(),
            count: lock.count,
            fence: lock.fence,
            expires_at: u64::try_from(expires_at).unwrap_or(u64::MAX),
        }))
    }

    /// Stores `lock` (in place when the key already holds a lock) and, if
    /// given, the absolute lease end. Replaces a value of another type.
    pub fn store(&mut self, lock: StoredLock, expires_at: Option<u64>) {
        match self.value_ptr() {
            // SAFETY: the key's live value; `&mut self` makes this the only
            // borrow of it.
            Ok(current) if !current.is_null() => unsafe { *current = lock },
            _ => {
                let value = lock.into_raw();
                // SAFETY: the key is open for writing; on failure Redis did
                // not take the value, so we free it.
                let status = unsafe {
                    raw::RedisModule_ModuleTypeSetValue.map_or(raw::Status::Err as c_int, |f| {
                        f(self.key, raw_type(), value)
                    })
                };
                if status != raw::Status::Ok as c_int {
                    // SAFETY: Redis refused `value`, it is still ours.
                    drop(unsafe { StoredLock::from_raw(value) });
                    return;
                }
            }
        }
        if let Some(at) = expires_at {
            let at = i64::try_from(at).unwrap_or(i64::MAX);
            // SAFETY: the key is open for writing and holds a value now.
            unsafe {
                if let Some(set) = raw::RedisModule_SetAbsExpire {
                    set(self.key, at);
                }
            }
        }
    }

    /// Stores the core's decision and replicates it as `LOCK.APPLY`.
    pub fn store_held(&mut self, held: &Held) {
        self.store(
            StoredLock {
                owner: held.owner.as_slice().into(),
                count: held.count,
                fence: held.fence,
            },
            Some(held.expires_at),
        );
        replicate_apply(self.ctx, self.name, held);
    }

    /// Deletes the key (the lock is free) and replicates a `DEL`.
    pub fn delete(&self) {
        // SAFETY: the key is open for writing.
        unsafe {
            if let Some(del) = raw::RedisModule_DeleteKey {
                del(self.key);
            }
        }
        replicate(self.ctx, "DEL", &[self.name.as_slice()]);
    }
}

impl Drop for LockKey<'_> {
    fn drop(&mut self) {
        if !self.key.is_null() {
            raw::close_key(self.key);
        }
    }
}

/// Sends the master's decision: `LOCK.APPLY key owner count fence PXAT ms`.
/// Replicas and the AOF store exactly this; they never pick a fence.
fn replicate_apply(ctx: &Context, name: &RedisString, held: &Held) {
    let (count, fence, at) = (
        held.count.to_string(),
        held.fence.to_string(),
        held.expires_at.min(i64::MAX as u64).to_string(),
    );
    replicate(
        ctx,
        "LOCK.APPLY",
        &[
            name.as_slice(),
            &held.owner,
            count.as_bytes(),
            fence.as_bytes(),
            b"PXAT",
            at.as_bytes(),
        ],
    );
}

/// `RedisModule_Replicate` with binary-safe arguments.
fn replicate(ctx: &Context, command: &str, args: &[&[u8]]) {
    let Ok(command) = CString::new(command) else {
        return;
    };
    let strings: Vec<RedisString> = args
        .iter()
        .map(|a| RedisString::create_from_slice(ctx.ctx, a))
        .collect();
    let mut ptrs: Vec<*mut raw::RedisModuleString> = strings.iter().map(|s| s.inner).collect();
    // SAFETY: format "v" takes an array of RedisModuleString pointers and its
    // length; `strings` keeps them alive until after the call.
    unsafe {
        if let Some(rep) = raw::RedisModule_Replicate {
            rep(
                ctx.ctx,
                command.as_ptr(),
                c"v".as_ptr(),
                ptrs.as_mut_ptr(),
                ptrs.len(),
            );
        }
    }
}
