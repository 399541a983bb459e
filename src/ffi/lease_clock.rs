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
//! slew allowance. [`look`] moves the offset at once and marks the step
//! pending. Correcting the keys and timers for it opens keys, so it lives
//! above them (`ffi::lease_rebase`); this file opens none and imports no
//! other `ffi` file, so the files below the keys (the data type, the key)
//! can read this clock.
//!
//! Inside, lease ends are lease-clock times; what leaves the module (a
//! key's TTL, `PXAT` to replicas and the AOF, the RDB) is wall time, turned
//! with [`to_wall`] and [`from_wall`].
//!
//! Also here, as they depend on nothing but this clock: the locks Redis
//! removed by a stepped clock while their leases ran ([`unlinked`], kept
//! for the re-base to put back: Redis expires keys by the wall clock, and
//! its expiry cycle runs before any module code), and the registry of
//! pending module timers ([`arm`], [`rearm_timers`]): module timers are
//! filed by wall time (`ustime()`), so a backward step would otherwise
//! delay every lease check and `WAIT` deadline by its size.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::os::raw::{c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicI64, Ordering};

use redis_module::{logging, raw};

use redislock_core::holds::Holds;
use redislock_core::stats;

/// A disagreement between the two clocks below this is not a step: the
/// wall clock is read between two reads of the monotonic clock, so a
/// preemption shows as a wide bracket rather than as a step, and NTP steps
/// only beyond 128 ms (it slews smaller corrections).
const TOLERANCE_US: i64 = 25_000;

/// Brackets wider than this (µs) are read again (the thread was
/// preempted between the reads), a few times at most.
const BRACKET_US: i64 = 200;

/// And the slew allowed per elapsed second, in µs (1,000 ppm: NTP slews at
/// most 500), so that a long idle stretch under a slewing clock is no step.
const SLEW_US_PER_S: i64 = 1_000;

/// Wall minus lease clock, in ms: 0 until the first step.
static OFFSET_MS: AtomicI64 = AtomicI64::new(0);

thread_local! {
    /// The two clocks at the last look (wall µs, monotonic µs); main
    /// thread only.
    static LAST: Cell<Option<(i64, i64)>> = const { Cell::new(None) };
    /// Pending module timers by the address of their [`Armed`] record, with
    /// the server's timer id.
    static TIMERS: RefCell<HashMap<usize, raw::RedisModuleTimerID>> = RefCell::new(HashMap::new());
    /// A step was seen and not yet corrected for (`ffi::lease_rebase`).
    static PENDING: Cell<bool> = const { Cell::new(false) };
    /// Locks Redis removed while a step was pending and their leases ran:
    /// (db, name, holds), to put back.
    static STASH: RefCell<Vec<(c_int, Vec<u8>, Holds)>> = const { RefCell::new(Vec::new()) };
}

/// Now on the lease clock: the server's wall-clock unix milliseconds
/// (`mstime()`), less the wall clock's steps.
pub fn now_ms() -> u64 {
    // SAFETY: RedisModule_Milliseconds takes no arguments and is set once the
    // module is initialised, before any command or callback can run.
    let ms = unsafe { raw::RedisModule_Milliseconds.map_or(0, |f| f()) };
    from_wall(u64::try_from(ms).unwrap_or(0))
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
    clock_us(libc::CLOCK_REALTIME)
}

/// A clock of `clock_gettime` in µs, as a plain number: every lock command
/// looks at the clocks, and integer arithmetic keeps that look cheap.
fn clock_us(clock: libc::clockid_t) -> i64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to write, and a clock every Linux has.
    unsafe { libc::clock_gettime(clock, &mut now) };
    now.tv_sec
        .saturating_mul(1_000_000)
        .saturating_add(now.tv_nsec / 1_000)
}

/// The monotonic clock in µs (`CLOCK_MONOTONIC`, which `Instant` reads).
fn mono_us() -> i64 {
    clock_us(libc::CLOCK_MONOTONIC)
}

/// The wall clock and the monotonic clock (µs), read together: the wall
/// clock between two monotonic reads, taken again while the two are far
/// apart.
fn read_both() -> (i64, i64) {
    let mut best: Option<(i64, i64, i64)> = None;
    for _ in 0..4 {
        let before = mono_us();
        let wall = wall_us();
        let after = mono_us();
        let width = after.saturating_sub(before);
        let mid = before.saturating_add(width / 2);
        if width <= BRACKET_US {
            return (wall, mid);
        }
        if best.is_none_or(|(_, _, w)| width < w) {
            best = Some((wall, mid, width));
        }
    }
    best.map_or_else(|| (wall_us(), mono_us()), |(wall, mid, _)| (wall, mid))
}

/// Compares the clocks with the last look: the step in ms (wall moved
/// minus monotonic elapsed), if beyond the tolerance. The first look only
/// records them.
fn detect() -> Option<i64> {
    let (wall, mono) = read_both();
    let (last_wall, last_mono) = LAST.replace(Some((wall, mono)))?;
    let elapsed = mono.saturating_sub(last_mono);
    let moved = wall.saturating_sub(last_wall);
    let step = moved.saturating_sub(elapsed);
    let allowed = TOLERANCE_US.saturating_add(elapsed / 1_000_000 * SLEW_US_PER_S);
    (step.abs() > allowed).then_some(step / 1_000)
}

/// Looks at the clocks: a step moves the offset at once (every lease
/// decision from here on counts on) and stays pending until the keys and
/// timers are corrected for it ([`settled`]). Whether one is pending. Cheap
/// when there is none: two clock reads.
pub fn look() -> bool {
    if let Some(step) = detect().filter(|&step| step != 0) {
        OFFSET_MS.fetch_add(step, Ordering::Relaxed);
        stats::CLOCK_STEPS.incr();
        PENDING.set(true);
        logging::log_notice(format!("lock: the wall clock stepped {step:+} ms"));
    }
    PENDING.get()
}

/// The keys and timers are corrected for the last step.
pub fn settled() {
    PENDING.set(false);
}

/// A lock key leaves its database, `holds` its lock's holds. While a step
/// is pending, Redis may be expiring it by the stepped wall clock: if a
/// hold still runs on the lease clock, keep it to put back ([`stashed`]).
pub fn unlinked(db: c_int, name: &[u8], holds: impl FnOnce() -> Holds) {
    if !look() {
        return;
    }
    let holds = holds();
    if holds.live(now_ms()).next().is_some() {
        STASH.with_borrow_mut(|stash| stash.push((db, name.to_vec(), holds)));
    }
}

/// The locks Redis removed while a step was pending and their leases ran,
/// taken: (db, name, holds).
pub fn stashed() -> Vec<(c_int, Vec<u8>, Holds)> {
    STASH.take()
}

/// How long until the lease-clock millisecond `at` begins, in µs
/// (negative: it has begun): the first instant Redis counts a key whose
/// lease runs through `at - 1` as ended.
pub fn us_until(at: u64) -> Option<i64> {
    let wall_at_us = i64::try_from(to_wall(at)).ok()?.checked_mul(1_000)?;
    wall_at_us.checked_sub(wall_us())
}

/// A module timer is put off by up to this much past its delay: the event
/// loop rounds its wait up to whole ms, and a timer found with a sub-ms
/// remainder waits another whole ms.
const TIMER_LATE_MS: u64 = 2;

/// The delay of a module timer for the lease-clock millisecond `at`, armed
/// to fire early by up to [`TIMER_LATE_MS`] and one more: the check is
/// wanted at the first instant Redis counts the key as ended, not a tick
/// later, so the timer's callback hands the last stretch to the µs alarm
/// (`ffi::lease_alarm`). 0 once less than that is left.
pub fn early_delay_ms(at: u64) -> Option<u64> {
    let left_ms = us_until(at)? / 1_000;
    Some(u64::try_from(left_ms).map_or(0, |ms| ms.saturating_sub(TIMER_LATE_MS)))
}

/// A pending module timer: the callback and data it was armed with, and
/// when it is due on the lease clock.
struct Armed {
    callback: extern "C" fn(*mut raw::RedisModuleCtx, *mut c_void),
    data: *mut c_void,
    due: u64,
}

/// Arms a module timer through the registry (see `ffi::create_timer`).
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
    // `fired` once, when the timer fires, or to [`rearm_timers`].
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
pub(crate) fn rearm_timers(ctx: *mut raw::RedisModuleCtx) -> usize {
    let now = now_ms();
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
