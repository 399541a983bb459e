//! The lease clock: the time every lease, `WAIT` deadline and lease check
//! is counted in, so that a step of the server's wall clock (NTP correcting
//! a drifted clock, a VM resumed, an operator) neither ends a hold early nor
//! keeps a crashed holder's lock for the size of the step.
//!
//! The lease clock is the wall clock minus an offset that changes only at a
//! step: between steps it reads exactly what Redis reads (so the module and
//! Redis agree on when a key has ended), and at a step it goes on as the
//! monotonic clock went. A step is the wall clock moving more (or less) than
//! the monotonic clock since the last look, beyond [`TOLERANCE_US`] and a
//! slew allowance. The module looks at every entry point of the lock
//! machinery (`Server::new`), at every cron tick, and whenever a lock key
//! leaves its database ([`unlinked`]): Redis expires keys by the wall clock,
//! and its expiry cycle runs before any module code, so after a forward step
//! it can remove a lock whose lease still runs. Such a lock is kept
//! ([`STASH`]) and put back, replicated, by the next look that can write
//! ([`check`]: the same cron tick, or the next lock command), before anyone
//! could be granted it.
//!
//! Inside, lease ends are lease-clock times; what leaves the module (a
//! key's TTL, `PXAT` to replicas and the AOF, the RDB) is wall time, turned
//! with [`to_wall`] and [`from_wall`]. At a step ([`rebase`]) every lock
//! key's TTL is put back to its lease left and replicated as `PEXPIREAT`
//! (O(keys) once per step), and every pending module timer is re-armed by
//! the lease clock: module timers are filed by wall time (`ustime()`), so a
//! backward step would otherwise delay every lease check and `WAIT`
//! deadline by its size.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::os::raw::{c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use redis_module::{logging, raw, Context, RedisString};

use crate::ffi::datatype::{self, StoredLock};
use crate::ffi::guard;
use crate::ffi::key::LockKey;
use redislock_core::holds::Holds;
use redislock_core::stats;

/// A disagreement between the two clocks below this is not a step: the
/// wall clock is read between two reads of the monotonic clock, so a
/// preemption shows as a wide bracket rather than as a step, and NTP steps
/// only beyond 128 ms (it slews smaller corrections).
const TOLERANCE_US: i64 = 25_000;

/// Brackets wider than this are read again (the thread was preempted
/// between the reads), a few times at most.
const BRACKET_US: u128 = 200;

/// And the slew allowed per elapsed second, in µs (1,000 ppm: NTP slews at
/// most 500), so that a long idle stretch under a slewing clock is no step.
const SLEW_US_PER_S: i64 = 1_000;

/// Wall minus lease clock, in ms: 0 until the first step.
static OFFSET_MS: AtomicI64 = AtomicI64::new(0);

thread_local! {
    /// The two clocks at the last look (wall µs, monotonic instant); main
    /// thread only.
    static LAST: Cell<Option<(i64, Instant)>> = const { Cell::new(None) };
    /// Pending module timers by the address of their [`Armed`] record, with
    /// the server's timer id.
    static TIMERS: RefCell<HashMap<usize, raw::RedisModuleTimerID>> = RefCell::new(HashMap::new());
    /// A step was seen and not yet corrected for ([`rebase`]).
    static PENDING: Cell<bool> = const { Cell::new(false) };
    /// Locks Redis removed while a step was pending and their leases ran:
    /// (db, name, holds), to put back.
    static STASH: RefCell<Vec<(c_int, Vec<u8>, Holds)>> = const { RefCell::new(Vec::new()) };
}

/// Wall minus lease clock, ms.
pub fn offset_ms() -> i64 {
    OFFSET_MS.load(Ordering::Relaxed)
}

/// The lease-clock time of the wall-clock time `wall` (unix ms). 0 (none)
/// stays 0.
pub fn from_wall(wall: u64) -> u64 {
    shift(wall, -offset_ms())
}

/// The wall-clock time (unix ms) of the lease-clock time `lease`. 0 (none)
/// stays 0.
pub fn to_wall(lease: u64) -> u64 {
    shift(lease, offset_ms())
}

/// `at + by`, leaving 0 (no time) and the far future (`u64::MAX`, "never")
/// alone.
fn shift(at: u64, by: i64) -> u64 {
    if at == 0 || at >= i64::MAX as u64 || by == 0 {
        return at;
    }
    at.saturating_add_signed(by).max(1)
}

/// The wall clock in µs, as the server reads it (`ustime()`) where the API
/// has it (Redis 7.2 on), else as this process reads it. (The server's own
/// read matters where a server loads modules with `RTLD_DEEPBIND`, Valkey:
/// a preload library that moves the clock then moves the server's only.)
fn wall_us() -> i64 {
    // SAFETY: takes no arguments; set once the module is initialised.
    if let Some(us) = unsafe { raw::RedisModule_Microseconds } {
        // SAFETY: as above.
        return unsafe { us() };
    }
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// The wall clock (µs) and the monotonic clock, read together: the wall
/// clock between two monotonic reads, taken again while the two are far
/// apart.
fn read_both() -> (i64, Instant) {
    let mut best = None;
    for _ in 0..4 {
        let before = Instant::now();
        let wall = wall_us();
        let after = Instant::now();
        let width = after.duration_since(before).as_micros();
        let mid = before + after.duration_since(before) / 2;
        if width <= BRACKET_US {
            return (wall, mid);
        }
        if best.is_none_or(|(_, _, w)| width < w) {
            best = Some((wall, mid, width));
        }
    }
    best.map_or_else(|| (wall_us(), Instant::now()), |(wall, mid, _)| (wall, mid))
}

/// Compares the clocks with the last look: the step in ms (wall moved
/// minus monotonic elapsed), if beyond the tolerance. The first look only
/// records them.
fn detect() -> Option<i64> {
    let (wall, mono) = read_both();
    let (last_wall, last_mono) = LAST.replace(Some((wall, mono)))?;
    let elapsed = i64::try_from(mono.duration_since(last_mono).as_micros()).unwrap_or(i64::MAX);
    let moved = wall.saturating_sub(last_wall);
    let step = moved.saturating_sub(elapsed);
    let allowed = TOLERANCE_US.saturating_add(elapsed / 1_000_000 * SLEW_US_PER_S);
    (step.abs() > allowed).then_some(step / 1_000)
}

/// Looks at the clocks: a step moves the offset at once (every lease
/// decision from here on counts on), and waits for [`check`] to correct
/// the keys and timers.
fn look() {
    if let Some(step) = detect().filter(|&step| step != 0) {
        OFFSET_MS.fetch_add(step, Ordering::Relaxed);
        stats::CLOCK_STEPS.incr();
        PENDING.set(true);
        logging::log_notice(format!("lock: the wall clock stepped {step:+} ms"));
    }
}

/// Looks at the clocks; after a step, corrects for it ([`rebase`]). Cheap
/// when there is none: two clock reads. Main thread, with a live context
/// that may write.
pub fn check(ctx: *mut raw::RedisModuleCtx) {
    look();
    if PENDING.get() {
        rebase(ctx);
    }
}

/// A lock key leaves its database, `value` its lock. While a step is
/// pending, Redis may be expiring it by the stepped wall clock: if a hold
/// still runs on the lease clock, keep it to put back.
pub fn unlinked(db: c_int, name: &[u8], value: &StoredLock) {
    look();
    if !PENDING.get() {
        return;
    }
    let holds = value.holds();
    if holds.live(crate::ffi::now_ms()).next().is_some() {
        STASH.with_borrow_mut(|stash| stash.push((db, name.to_vec(), holds)));
    }
}

/// After a step: the locks Redis removed by it put back, every lock key's
/// TTL back to its lease left (in wall terms now), replicated; every
/// pending timer re-armed.
fn rebase(ctx: *mut raw::RedisModuleCtx) {
    let started = Instant::now();
    let timers = rearm_timers(ctx);
    let flags = crate::ffi::context_flags(ctx);
    if flags & (raw::REDISMODULE_CTX_FLAGS_SLAVE | raw::REDISMODULE_CTX_FLAGS_LOADING) as c_int != 0
    {
        // A replica keeps the absolute times its master sent (read by its
        // own clock) and writes nothing of its own.
        STASH.take();
        PENDING.set(false);
        return;
    }
    if crate::ffi::writes_paused() {
        // Neither write nor propagate now: the next look does it.
        return;
    }
    // Opening a key Redis counts as expired by the stepped clock deletes
    // it: `unlinked` keeps it while the step is pending, and `restore`
    // puts it back.
    let keys = rebase_keys(ctx);
    PENDING.set(false);
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
    let stash = STASH.take();
    if stash.is_empty() {
        return 0;
    }
    let context = Context::new(ctx);
    // SAFETY: a live context; the selected db is restored at the end.
    let was = unsafe { raw::RedisModule_GetSelectedDb.map_or(0, |f| f(ctx)) };
    let now = crate::ffi::now_ms();
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

/// The delay of a module timer for the lease-clock millisecond `at`, armed
/// to fire up to a millisecond early: the event loop rounds its wait up to
/// whole milliseconds, and the check is wanted at the first instant Redis
/// counts the key as ended, not a tick later (the caller looks again on the
/// next turn when early).
pub fn early_delay_ms(at: u64) -> Option<u64> {
    let wall_at_us = i64::try_from(to_wall(at)).ok()?.checked_mul(1_000)?;
    let left_us = wall_at_us.checked_sub(wall_us())?;
    Some(u64::try_from(left_us / 1_000 - 1).unwrap_or(0))
}

/// A pending module timer: the callback and data it was armed with, and
/// when it is due on the lease clock.
struct Armed {
    callback: extern "C" fn(*mut raw::RedisModuleCtx, *mut c_void),
    data: *mut c_void,
    due: u64,
}

/// Arms a module timer through the registry (see [`crate::ffi::create_timer`]).
pub(crate) fn arm(
    ctx: *mut raw::RedisModuleCtx,
    delay_ms: u64,
    now: u64,
    callback: extern "C" fn(*mut raw::RedisModuleCtx, *mut c_void),
    data: *mut c_void,
) -> raw::RedisModuleTimerID {
    let armed = Box::into_raw(Box::new(Armed {
        callback,
        data,
        due: now.saturating_add(delay_ms),
    }));
    let id = create(ctx, delay_ms, armed);
    if id == 0 {
        // SAFETY: just made, never handed to the server.
        drop(unsafe { Box::from_raw(armed) });
    }
    id
}

/// Creates the server's timer for `armed`, and files it.
fn create(
    ctx: *mut raw::RedisModuleCtx,
    delay_ms: u64,
    armed: *mut Armed,
) -> raw::RedisModuleTimerID {
    let delay = i64::try_from(delay_ms.min(redislock_core::handoff::MAX_DELAY_MS)).unwrap_or(0);
    // SAFETY: a live context of this module; `armed` comes back to
    // `fired` once, when the timer fires, or to `rearm_timers`.
    let id = unsafe {
        raw::RedisModule_CreateTimer.map_or(0, |f| f(ctx, delay, Some(fired), armed.cast()))
    };
    if id != 0 {
        TIMERS.with_borrow_mut(|timers| timers.insert(armed as usize, id));
    }
    id
}

/// A registered timer fired: unfile it and run its callback.
extern "C" fn fired(ctx: *mut raw::RedisModuleCtx, data: *mut c_void) {
    TIMERS.with_borrow_mut(|timers| timers.remove(&(data as usize)));
    // SAFETY: made by `arm`, handed back once by the server.
    let armed = unsafe { Box::from_raw(data.cast::<Armed>()) };
    (armed.callback)(ctx, armed.data);
}

/// Re-arms every pending timer for its due time on the lease clock; the
/// count.
fn rearm_timers(ctx: *mut raw::RedisModuleCtx) -> usize {
    let now = crate::ffi::now_ms();
    let pending: Vec<(usize, raw::RedisModuleTimerID)> =
        TIMERS.with_borrow_mut(|timers| timers.drain().collect());
    let mut done = 0;
    for (armed, id) in pending {
        let mut data: *mut c_void = ptr::null_mut();
        // SAFETY: a timer of this module, not fired yet (it is filed).
        let stopped = unsafe {
            raw::RedisModule_StopTimer.map_or(raw::Status::Err as c_int, |f| f(ctx, id, &mut data))
        };
        if stopped != raw::Status::Ok as c_int {
            continue;
        }
        let armed = armed as *mut Armed;
        // SAFETY: the record the stopped timer held, still ours.
        let due = unsafe { (*armed).due };
        if create(ctx, due.saturating_sub(now), armed) == 0 {
            // SAFETY: no timer holds it any more: run it now rather than never.
            let armed = unsafe { Box::from_raw(armed) };
            (armed.callback)(ctx, armed.data);
        }
        done += 1;
    }
    done
}
