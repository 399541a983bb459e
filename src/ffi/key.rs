//! Opening a lock key, showing its holds to the core ([`Stored`]), writing decisions back, and
//! sending each change to replicas and the AOF as an effect.

use std::cell::Cell;
use std::ffi::CStr;
use std::os::raw::c_int;

use redis_module::{raw, Context, RedisString};

use crate::ffi::datatype::{self, raw_type, StoredLock, LEASE_UNKNOWN};
use crate::ffi::latency::{self, HoldEnds};
use crate::ffi::lease_clock::{from_wall, to_wall};
use crate::ffi::{now_ms, propagation};
use redislock_core::args::ShareChange;
use redislock_core::error::LockError;
use redislock_core::holds::{Changes, Holder, Holds, Mode};
use redislock_core::lock::{self, Hold};
use redislock_core::orchestrate::{Read, Stored};
use redislock_core::stats;

/// `RedisModule_Replicate`'s type.
type ReplicateFn = unsafe extern "C" fn(
    *mut raw::RedisModuleCtx,
    *const std::os::raw::c_char,
    *const std::os::raw::c_char,
    ...
) -> c_int;

/// `PTTL`'s "no expiry", and ours for a lock someone `PERSIST`ed.
const NO_EXPIRE: i64 = -1;

/// The holds in a key before the module writes it, to compare with after
/// for the hold-time record ([`latency::holds_rewritten`]).
pub struct Tracked(HoldEnds);

impl Tracked {
    /// Notes what `key` holds now.
    pub fn before(key: &LockKey) -> Tracked {
        Tracked(key.hold_ends())
    }

    /// The write is done: holds whose fence went ended, new fences began.
    /// `raised`: `LOCK.FENCE` moved one hold's fence (from, to), and that
    /// hold goes on.
    pub fn after(self, key: &LockKey, raised: Option<(u64, u64)>) {
        latency::holds_rewritten(self.0, key.hold_ends(), raised);
    }
}

/// An open key, closed on drop.
pub struct LockKey<'a> {
    ctx: &'a Context,
    name: Name<'a>,
    key: *mut raw::RedisModuleKey,
    /// Opened by a client's command (not a timer): the command's own argv
    /// exists, so a change nobody listens to can be marked verbatim.
    in_command: bool,
    /// The key's expiry once read (`None`: not read yet). Asking Redis is a
    /// lookup in the expires table, and a command asks two or three times
    /// (its clock, the lock's lease); only this key's own writes change it
    /// while it is open, and they keep this up to date.
    expiry: Cell<Option<Option<u64>>>,
}

/// The key's name: the caller's, or one the key keeps alive itself (the
/// server's own work names a lock by its bytes).
enum Name<'a> {
    Borrowed(&'a RedisString),
    Owned(RedisString),
}

impl Name<'_> {
    fn inner(&self) -> *mut raw::RedisModuleString {
        match self {
            Name::Borrowed(name) => name.inner,
            Name::Owned(name) => name.inner,
        }
    }
}

/// How a command opens a lock's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// To read it only (`LOCK.INFO`).
    Read,
    /// To read and change it.
    Write,
}

pub use redislock_core::orchestrate::Lease;

impl<'a> LockKey<'a> {
    /// Opens `name` for a client's command. Opening lazily expires a key
    /// whose lease has ended.
    pub fn open(ctx: &'a Context, name: &'a RedisString, access: Access) -> LockKey<'a> {
        Self::open_with(ctx, Name::Borrowed(name), access == Access::Write, true)
    }

    /// Opens `name` for writing from a timer (a hand-off), outside any command.
    pub fn open_in_timer(ctx: &'a Context, name: &'a RedisString) -> LockKey<'a> {
        Self::open_with(ctx, Name::Borrowed(name), true, false)
    }

    /// Opens `name` for writing, keeping the name alive with the key: from
    /// a command (`in_command`) or from a timer.
    pub fn open_owned(ctx: &'a Context, name: RedisString, in_command: bool) -> LockKey<'a> {
        Self::open_with(ctx, Name::Owned(name), true, in_command)
    }

    fn open_with(ctx: &'a Context, name: Name<'a>, write: bool, in_command: bool) -> Self {
        let mode = if write {
            raw::KeyMode::READ | raw::KeyMode::WRITE
        } else {
            raw::KeyMode::READ
        };
        let key = raw::open_key(ctx.ctx, name.inner(), mode);
        LockKey {
            ctx,
            name,
            key,
            in_command,
            expiry: Cell::new(None),
        }
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
        if let Some(known) = self.expiry.get() {
            return known;
        }
        let at = if self.is_empty() {
            // Redis 8 reads the value of the key without checking it exists.
            None
        } else {
            // SAFETY: `self.key` is an open key of this context.
            let at = unsafe { raw::RedisModule_GetAbsExpire.map_or(NO_EXPIRE, |f| f(self.key)) };
            u64::try_from(at).ok().map(from_wall)
        };
        self.expiry.set(Some(at));
        at
    }

    /// The time to judge this key's lock by: now, but never past the key's
    /// own expiry. Redis found the key when it opened it, so by the clock
    /// Redis expires keys with (frozen for a whole command, `EXEC` or
    /// script) its time had not passed; the module's decisions must agree
    /// with that, or a lock it calls ended would still exist for `EXISTS`.
    pub fn now(&self) -> u64 {
        now_ms().min(self.expires_at().unwrap_or(u64::MAX))
    }

    /// Whether the key does not exist.
    fn is_empty(&self) -> bool {
        // SAFETY: `self.key` is an open key of this context when not null.
        self.key.is_null()
            || unsafe { raw::RedisModule_KeyType.map_or(0, |f| f(self.key)) }
                == raw::REDISMODULE_KEYTYPE_EMPTY as c_int
    }

    /// The holds here as the core reads them ([`Read`]): an exclusive
    /// hold stored compactly is shown as its numbers, its lease ending at
    /// the earlier of the stored one and the key's expiry, and whether the
    /// owner asked about holds it (compared with the stored form, nothing
    /// copied to the heap); listed holds are taken out
    /// ([`LockKey::take_holds`]) and must be put back.
    pub fn read(&mut self, how: Read<'_>) -> Result<Stored, LockError> {
        let value = self.value_ptr()?;
        // SAFETY: the key's live value, borrowed no longer than this call
        // (nothing below changes the key).
        let Some(stored) = (unsafe { value.as_ref() }) else {
            return Ok(match how {
                Read::Listed => Stored::Listed(Holds::free()),
                Read::Mine(_) | Read::AsStored => Stored::Free,
            });
        };
        if stored.shared().is_some() || how == Read::Listed {
            return Ok(Stored::Listed(self.take_holds()?.unwrap_or_default()));
        }
        let mine = match how {
            Read::Mine(owner) => stored.owned_by(owner),
            Read::AsStored | Read::Listed => false,
        };
        let hold = Hold {
            count: stored.count(),
            fence: stored.fence(),
            expires_at: lock::lease_end(stored.lease(), self.expires_at()),
        };
        Ok(Stored::One { hold, mine })
    }

    /// The holds here in plain numbers ([`HoldEnds`]).
    pub fn hold_ends(&self) -> HoldEnds {
        match self.stored() {
            Ok(Some(value)) if value.shared().is_none() => {
                HoldEnds::One(value.fence(), value.lease())
            }
            Ok(Some(value)) => HoldEnds::Many(value.hold_ends()),
            _ => HoldEnds::Free,
        }
    }

    /// The holds here, of either mode (`None`: free), each ending at the
    /// earlier of its lease and the key's expiry. A copy: for reading them
    /// all (`LOCK.INFO`); a change takes them ([`LockKey::take_holds`]).
    pub fn holds(&self) -> Result<Option<Holds>, LockError> {
        let Some(stored) = self.stored()? else {
            return Ok(None);
        };
        let expiry = self.expires_at();
        let holds = stored.holds();
        let mode = holds.mode();
        let holders = holds
            .holders()
            .map(|h| {
                let mut h = h.clone();
                h.hold.expires_at = lock::lease_end(h.hold.expires_at, expiry);
                h
            })
            .collect();
        Ok(Some(Holds::from_parts(mode, holders)))
    }

    /// Takes the holds out to decide over them, without copying a shared
    /// lock's: its value keeps an empty list until [`LockKey::put_holds`]
    /// puts them back (nothing reads the key in between). An exclusive
    /// value is read into one holder, its lease ending at the earlier of
    /// the stored one and the key's expiry.
    fn take_holds(&mut self) -> Result<Option<Holds>, LockError> {
        let value = self.value_ptr()?;
        // SAFETY: the key's live value; `&mut self` makes this the only borrow.
        let Some(stored) = (unsafe { value.as_mut() }) else {
            return Ok(None);
        };
        if let Some(holds) = stored.shared_mut() {
            let taken = std::mem::take(holds);
            stats::SHARED_HELD.add(-(taken.len() as i64));
            return Ok(Some(taken));
        }
        let mut holds = stored.holds();
        let expiry = self.expires_at();
        if let Some(one) = holds.only().cloned() {
            let lease = lock::lease_end(one.hold.expires_at, expiry);
            if lease != one.hold.expires_at {
                let hold = Hold {
                    expires_at: lease,
                    ..one.hold
                };
                holds = Holds::from_parts(Mode::Exclusive, vec![Holder { hold, ..one }]);
            }
        }
        Ok(Some(holds))
    }

    /// Puts back holds taken by [`LockKey::take_holds`]. `changes`: what
    /// changed meanwhile (empty: they go back as they were). A changed lock
    /// is stored — a single exclusive hold as the compact value, shared ones
    /// in place — its TTL set to the latest lease (a shorter TTL someone
    /// set is kept for the holds that did not change), and each changed
    /// owner's hold is sent to replicas and the AOF: `LOCK.APPLY key SHARE
    /// limit owner count fence lease since`, or `LOCK.APPLY key UNSHARE
    /// owner` for a hold that ended. An exclusive hold goes as its own full
    /// form. The caller deletes a lock left with no hold.
    pub fn put_holds(&mut self, holds: Holds, changes: &Changes) {
        let value = self.value_ptr().ok().unwrap_or(std::ptr::null_mut());
        // SAFETY: the key's live value; `&mut self` makes this the only borrow.
        let stored = unsafe { value.as_mut() };
        if changes.is_empty() {
            if let Some(place) = stored.and_then(StoredLock::shared_mut) {
                stats::SHARED_HELD.add(holds.len() as i64);
                *place = holds;
            }
            return;
        }
        let Some(latest) = holds.latest_lease() else {
            return;
        };
        if let (Mode::Exclusive, Some(one)) = (holds.mode(), holds.only()) {
            let value = StoredLock::new_raw(
                &one.owner,
                one.hold.count,
                one.hold.fence,
                one.hold.expires_at,
                one.since,
            );
            self.replace_or_set(value);
            self.set_expiry(latest);
            self.replicate_apply(&one.owner, one.hold);
            return;
        }
        // The holds that did not change keep a shorter TTL someone set.
        let moved = changes
            .owners
            .iter()
            .filter_map(|owner| holds.get(owner))
            .map(|h| h.hold.expires_at)
            .max();
        let expiry = match self.expires_at() {
            Some(at) if at < latest => at.max(moved.unwrap_or(0)),
            _ => latest,
        };
        let limit = match holds.mode() {
            Mode::Shared { limit } => limit.map_or(0, i64::from),
            Mode::Exclusive => 0,
        };
        let effects: Vec<(Vec<u8>, Option<Holder>)> = changes
            .owners
            .iter()
            .map(|owner| (owner.clone(), holds.get(owner).cloned()))
            .collect();
        match stored.and_then(StoredLock::shared_mut) {
            Some(place) => {
                stats::SHARED_HELD.add(holds.len() as i64);
                *place = holds;
            }
            None => self.replace_or_set(StoredLock::new_shared(holds)),
        }
        if self.expires_at() != Some(expiry) {
            self.set_expiry(expiry);
        }
        for (owner, now) in effects {
            self.replicate_share(limit, &owner, now.as_ref());
        }
    }

    /// Applies one owner's change as a master sent it (`LOCK.APPLY key SHARE
    /// …` / `UNSHARE …`): the key goes with its last hold; its TTL follows
    /// as on the master.
    pub fn apply_share(&mut self, change: ShareChange<'_>) {
        let mut holds = match self.take_holds() {
            Ok(Some(holds)) if holds.mode() != Mode::Exclusive => holds,
            // A free key, or an exclusive hold the master has replaced.
            Ok(Some(_)) | Ok(None) => Holds::free(),
            Err(_) => return,
        };
        match change {
            ShareChange::Share(mode, holder) => holds.put(mode, holder),
            ShareChange::Unshare(owner) => {
                holds.end(owner);
            }
        }
        let changes = holds.take_changes();
        if holds.is_empty() {
            if matches!(self.value_ptr(), Ok(value) if !value.is_null()) {
                // SAFETY: the key is open for writing.
                unsafe {
                    if let Some(del) = raw::RedisModule_DeleteKey {
                        del(self.key);
                    }
                }
                self.expiry.set(Some(None));
            }
            return;
        }
        let value = self.value_ptr().ok().unwrap_or(std::ptr::null_mut());
        // SAFETY: the key's live value; `&mut self` makes this the only borrow.
        let stored = unsafe { value.as_mut() };
        let latest = holds.latest_lease().unwrap_or(0);
        let moved = changes
            .owners
            .iter()
            .filter_map(|owner| holds.get(owner))
            .map(|h| h.hold.expires_at)
            .max();
        match stored.and_then(StoredLock::shared_mut) {
            Some(place) => {
                stats::SHARED_HELD.add(holds.len() as i64);
                *place = holds;
            }
            None => self.replace_or_set(StoredLock::new_shared(holds)),
        }
        let expiry = match self.expires_at() {
            Some(at) if at < latest => at.max(moved.unwrap_or(0)),
            _ => latest,
        };
        if self.expires_at() != Some(expiry) {
            self.set_expiry(expiry);
        }
    }

    /// Stores holds decided elsewhere (the shared form of `LOCK.APPLY`),
    /// with the key's TTL at their latest lease.
    pub fn store_applied(&mut self, holds: Holds) {
        let Some(latest) = holds.latest_lease() else {
            return;
        };
        self.replace_or_set(datatype::new_value(holds));
        self.set_expiry(latest);
    }

    /// Stores a lock decided elsewhere (`LOCK.APPLY`: a master, the AOF) and,
    /// if given, its lease end, also as the key's expiry. Replaces a value
    /// of another type.
    pub fn store(&mut self, owner: &[u8], count: u64, fence: u64, lease: Option<u64>) {
        let value = StoredLock::new_raw(
            owner,
            count,
            fence,
            lease.unwrap_or(LEASE_UNKNOWN),
            now_ms(),
        );
        match lease {
            Some(at) => {
                self.replace_or_set(value);
                self.set_expiry(at);
            }
            // Without a lease the key has no TTL: setting a value clears it.
            None => self.set_new(value),
        }
    }

    /// The short form of `LOCK.APPLY` (a renewal): the lock here keeps its
    /// owner, count and fence, and its lease, and the key's TTL, move to
    /// `lease`. Nothing to do without a lock (effects arrive in order, so the
    /// renewed hold is here).
    pub fn move_lease(&mut self, lease: u64) {
        // SAFETY: the key's live value; `&mut self` makes this the only borrow.
        if let Ok(Some(value)) = self.value_ptr().map(|v| unsafe { v.as_mut() }) {
            if !value.set_lease(lease) {
                self.refit_lease(lease);
            }
            self.set_expiry(lease);
        }
    }

    /// Stores the core's decision for `owner` and replicates it as
    /// `LOCK.APPLY` (its short form when only the lease moved: a renewal).
    /// [`Lease::Kept`] skips rewriting an unchanged TTL.
    pub fn apply(&mut self, owner: &[u8], hold: Hold, lease: Lease) {
        let mut lease_only = false;
        match self.value_ptr() {
            // SAFETY: the key's live value; `&mut self` makes this the only
            // borrow of it. Same owner (reentry, release, renew): update the
            // numbers in place, no allocation.
            Ok(current) if unsafe { current.as_ref() }.is_some_and(|l| *l.owner() == *owner) => {
                // SAFETY: as the guard's: the key's live value, only borrow.
                let stored = unsafe { &mut *current };
                lease_only = stored.count() == hold.count
                    && stored.fence() == hold.fence
                    && stored.lease() != LEASE_UNKNOWN;
                if !stored.set_hold(hold) {
                    // The numbers outgrew the compact form: the same hold,
                    // stored wide.
                    let since = stored.since();
                    self.replace_or_set(StoredLock::new_raw(
                        owner,
                        hold.count,
                        hold.fence,
                        hold.expires_at,
                        since,
                    ));
                }
            }
            // A new owner (a fresh hold, a hand-off): a new value. Its lease
            // moved, so the TTL is set below either way.
            _ => self.replace_or_set(StoredLock::new_raw(
                owner,
                hold.count,
                hold.fence,
                hold.expires_at,
                now_ms(),
            )),
        }
        if lease == Lease::Moved {
            self.set_expiry(hold.expires_at);
        }
        if lease_only && lease == Lease::Moved {
            self.replicate_lease(hold.expires_at);
        } else {
            self.replicate_apply(owner, hold);
        }
    }

    /// Records `lease` as the stored lease end of the lock here (a version 1
    /// value adopting its key's TTL); nothing to replicate, as the lease the
    /// core sees does not change.
    pub fn adopt_lease(&mut self, lease: u64) {
        // SAFETY: the key's live value; `&mut self` makes this the only borrow.
        if let Ok(Some(value)) = self.value_ptr().map(|v| unsafe { v.as_mut() }) {
            if !value.set_lease(lease) {
                self.refit_lease(lease);
            }
        }
    }

    /// Stores the exclusive lock here anew with its lease at `lease`: the
    /// lease did not fit its value in place. The key's TTL is kept.
    fn refit_lease(&mut self, lease: u64) {
        let Ok(Some(stored)) = self.stored() else {
            return;
        };
        let value = StoredLock::new_raw(
            &stored.owner(),
            stored.count(),
            stored.fence(),
            lease,
            stored.since(),
        );
        // Replacing a value keeps the key's TTL.
        self.replace_or_set(value);
    }

    /// Puts back a lock that Redis removed by a stepped wall clock while
    /// its lease still ran, and replicates it (each hold in full).
    pub fn restore_holds(&mut self, holds: Holds) {
        let changes = Changes {
            owners: holds.holders().map(|h| h.owner.clone()).collect(),
            began: Vec::new(),
            ended: Vec::new(),
            raised: Vec::new(),
        };
        self.put_holds(holds, &changes);
    }

    /// Sets the key's expiry back to the lease end `at` (something else
    /// changed it) and replicates that as `PEXPIREAT`.
    pub fn restore_expiry(&self, at: u64) {
        self.set_expiry(at);
        let at = i64::try_from(to_wall(at)).unwrap_or(i64::MAX);
        self.propagate(|ctx, rep| {
            // SAFETY: "sl": the live key name and a long long.
            unsafe {
                rep(
                    ctx,
                    c"PEXPIREAT".as_ptr(),
                    c"sl".as_ptr(),
                    self.name.inner(),
                    at,
                )
            };
        });
    }

    /// Deletes the key (the lock is free) and replicates a `DEL`.
    pub fn delete(&self) {
        // SAFETY: the key is open for writing.
        unsafe {
            if let Some(del) = raw::RedisModule_DeleteKey {
                del(self.key);
            }
        }
        self.expiry.set(Some(None));
        self.propagate(|ctx, rep| {
            // SAFETY: "s" takes one RedisModuleString: the live key name.
            unsafe { rep(ctx, c"DEL".as_ptr(), c"s".as_ptr(), self.name.inner()) };
        });
    }

    /// Sends an effect to replicas and the AOF with `emit`, which gets the
    /// context and `RedisModule_Replicate`. When nothing would receive it
    /// (see [`propagation`]), a command only marks the change instead.
    fn propagate(&self, emit: impl FnOnce(*mut raw::RedisModuleCtx, ReplicateFn)) {
        // SAFETY: the API table is filled in at load; the context is live.
        unsafe {
            if self.in_command && !propagation::needed() {
                raw::RedisModule_ReplicateVerbatim.map(|f| f(self.ctx.ctx));
            } else if let Some(rep) = raw::RedisModule_Replicate {
                emit(self.ctx.ctx, rep);
            }
        }
    }

    /// Publishes a keyspace notification about this key.
    pub fn notify(&self, class: c_int, event: &CStr) {
        // SAFETY: a live context, a static C string and a live key name.
        unsafe {
            if let Some(notify) = raw::RedisModule_NotifyKeyspaceEvent {
                notify(self.ctx.ctx, class, event.as_ptr(), self.name.inner());
            }
        }
    }

    /// Puts a new lock value (from [`StoredLock::new_raw`]) in the key,
    /// replacing whatever was there.
    fn set_new(&mut self, value: *mut std::os::raw::c_void) {
        if value.is_null() {
            return;
        }
        // SAFETY: the key is open for writing; on failure Redis did not take
        // the value, so we free it.
        let status = unsafe {
            raw::RedisModule_ModuleTypeSetValue.map_or(raw::Status::Err as c_int, |f| {
                f(self.key, raw_type(), value)
            })
        };
        // Setting a value may drop the TTL: read it again if asked.
        self.expiry.set(None);
        if status != raw::Status::Ok as c_int {
            // SAFETY: Redis refused `value`, it is still ours.
            unsafe { StoredLock::free_raw(value) };
        }
    }

    /// Puts a new lock value in the key: over the lock already there by
    /// swapping the value alone (`RedisModule_ModuleTypeReplaceValue`: the
    /// key, its TTL and its place in the keyspace stay, no keyspace event),
    /// else as [`LockKey::set_new`] does. The caller sets the TTL.
    fn replace_or_set(&mut self, value: *mut std::os::raw::c_void) {
        if value.is_null() {
            return;
        }
        if matches!(self.value_ptr(), Ok(current) if !current.is_null()) {
            let mut old = std::ptr::null_mut();
            // SAFETY: the key is open for writing and holds a value of our
            // type; on success Redis keeps `value` and hands back the old
            // one, which nothing else references any more.
            let status = unsafe {
                raw::RedisModule_ModuleTypeReplaceValue.map_or(raw::Status::Err as c_int, |f| {
                    f(self.key, raw_type(), value, &mut old)
                })
            };
            if status == raw::Status::Ok as c_int {
                // SAFETY: the value Redis gave back, made by `new_raw`.
                unsafe { StoredLock::free_raw(old) };
                return;
            }
        }
        self.set_new(value);
    }

    /// Sets the key's absolute expiry (the lease end).
    fn set_expiry(&self, at: u64) {
        let wall = i64::try_from(to_wall(at)).unwrap_or(i64::MAX);
        // SAFETY: the key is open for writing and holds a value now.
        let status = unsafe {
            raw::RedisModule_SetAbsExpire.map_or(raw::Status::Err as c_int, |f| f(self.key, wall))
        };
        let known = (status == raw::Status::Ok as c_int).then_some(Some(at));
        self.expiry.set(known);
    }

    /// Sends a renewal: `LOCK.APPLY key PXAT ms`, the lease alone (three
    /// arguments, not six: each costs Redis an object and AOF formatting).
    fn replicate_lease(&self, at: u64) {
        let at = i64::try_from(to_wall(at)).unwrap_or(i64::MAX);
        self.propagate(|ctx, rep| {
            // SAFETY: "scl": the live key name, a C string and a long long.
            unsafe {
                rep(
                    ctx,
                    c"LOCK.APPLY".as_ptr(),
                    c"scl".as_ptr(),
                    self.name.inner(),
                    c"PXAT".as_ptr(),
                    at,
                );
            }
        });
    }

    /// Sends one owner's share: `LOCK.APPLY key SHARE limit owner count
    /// fence lease since [PERMITS k]`, or `LOCK.APPLY key UNSHARE owner`
    /// once it ended.
    fn replicate_share(&self, limit: i64, owner: &[u8], now: Option<&Holder>) {
        let clamp = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        self.propagate(|ctx, rep| match now {
            // SAFETY: the format "sclbllllcl" matches the arguments: the
            // key name, a C string, a long long, an owner (pointer, length),
            // four long longs, a C string and a long long. Redis copies them
            // into its own objects. A share worth more than one permit says
            // so after the hold (older replicas never see one).
            Some(h) if h.permits != 1 => unsafe {
                rep(
                    ctx,
                    c"LOCK.APPLY".as_ptr(),
                    c"sclbllllcl".as_ptr(),
                    self.name.inner(),
                    c"SHARE".as_ptr(),
                    limit,
                    owner.as_ptr(),
                    owner.len(),
                    clamp(h.hold.count),
                    clamp(h.hold.fence),
                    clamp(to_wall(h.hold.expires_at)),
                    clamp(to_wall(h.since)),
                    c"PERMITS".as_ptr(),
                    i64::from(h.permits),
                );
            },
            // SAFETY: the format "sclbllll" matches the arguments: the key
            // name, a C string, a long long, an owner (pointer, length) and
            // four long longs. Redis copies them into its own objects.
            Some(h) => unsafe {
                rep(
                    ctx,
                    c"LOCK.APPLY".as_ptr(),
                    c"sclbllll".as_ptr(),
                    self.name.inner(),
                    c"SHARE".as_ptr(),
                    limit,
                    owner.as_ptr(),
                    owner.len(),
                    clamp(h.hold.count),
                    clamp(h.hold.fence),
                    clamp(to_wall(h.hold.expires_at)),
                    clamp(to_wall(h.since)),
                );
            },
            // SAFETY: "scb": the key name, a C string, an owner (pointer,
            // length).
            None => unsafe {
                rep(
                    ctx,
                    c"LOCK.APPLY".as_ptr(),
                    c"scb".as_ptr(),
                    self.name.inner(),
                    c"UNSHARE".as_ptr(),
                    owner.as_ptr(),
                    owner.len(),
                );
            },
        });
    }

    /// Sends the master's decision: `LOCK.APPLY key owner count fence PXAT ms`.
    /// Replicas and the AOF store exactly this; they never pick a fence.
    fn replicate_apply(&self, owner: &[u8], hold: Hold) {
        let clamp = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        self.propagate(|ctx, rep| {
            // SAFETY: the format "sbllcl" matches the arguments: the key
            // name, an owner (pointer, length), two long longs, a C string, a
            // long long. Redis copies them into its own objects.
            unsafe {
                rep(
                    ctx,
                    c"LOCK.APPLY".as_ptr(),
                    c"sbllcl".as_ptr(),
                    self.name.inner(),
                    owner.as_ptr(),
                    owner.len(),
                    clamp(hold.count),
                    clamp(hold.fence),
                    c"PXAT".as_ptr(),
                    clamp(to_wall(hold.expires_at)),
                );
            }
        });
    }
}

impl Drop for LockKey<'_> {
    fn drop(&mut self) {
        if !self.key.is_null() {
            raw::close_key(self.key);
        }
    }
}
