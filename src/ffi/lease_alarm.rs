//! The lease check's last millisecond: an alarm on the monotonic clock,
//! to the microsecond, so that a waiter takes a lock over at the first
//! instant Redis counts its key as ended rather than a timer tick later.
//!
//! Module timers cannot fire there. They are due in whole milliseconds
//! from when they are armed; the event loop rounds its wait up to a whole
//! millisecond; and a module timer found not quite due (a sub-ms
//! remainder) is put off by a full millisecond (on Redis 7.0 they are also
//! filed by wall time while the loop sleeps by the monotonic clock). So the
//! lease check's module timer is armed a few ms early
//! ([`crate::ffi::lease_clock::early_delay_ms`]), and when it finds the
//! lease not yet ended it hands the rest to [`set`]: a `timerfd` on the
//! monotonic clock in the server's event loop (`RedisModule_EventLoopAdd`),
//! set for the exact µs. Its readiness ends the event loop's wait at once;
//! its callback arms a 0 ms module timer in the lock's database, which the
//! same turn of the loop runs (time events come after file events), and
//! that timer runs the check with a context that may write and replicate.
//!
//! A step of the wall clock leaves a pending alarm alone: it counts
//! monotonic time, as the lease clock does across a step, and the check
//! looks at the lease clock again when it runs.
//!
//! Main thread only. Without the API or the fd (an old server, a failed
//! syscall) [`set`] says so and the caller falls back to a module timer.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::os::raw::{c_int, c_void};
use std::ptr;
use std::time::{Duration, Instant};

use redis_module::{logging, raw};

use crate::ffi::{create_timer, guard, select_db, selected_db};

/// What a due alarm runs: a 0 ms module timer with this callback and data,
/// in this database.
struct Due {
    callback: extern "C" fn(*mut raw::RedisModuleCtx, *mut c_void),
    data: *mut c_void,
    db: c_int,
}

/// The alarm's fd in the event loop and a detached context of this module
/// to arm module timers with (the fd's callback gets no context).
#[derive(Clone, Copy)]
struct Alarm {
    fd: c_int,
    ctx: *mut raw::RedisModuleCtx,
}

thread_local! {
    /// The alarm, once made; `Some(None)`: it could not be made.
    static ALARM: Cell<Option<Option<Alarm>>> = const { Cell::new(None) };
    /// What is due when, in order (the `u64` tells apart alarms set for
    /// the same instant).
    static PENDING: RefCell<BTreeMap<(Instant, u64), Due>> = const { RefCell::new(BTreeMap::new()) };
    /// The next `u64` of [`PENDING`]'s keys.
    static SEQ: Cell<u64> = const { Cell::new(0) };
}

/// Runs `callback(data)` as a 0 ms module timer in `ctx`'s database once
/// `left` has passed on the monotonic clock. `false`: no alarm on this
/// server (nothing was armed; `data` is still the caller's).
pub fn set(
    ctx: *mut raw::RedisModuleCtx,
    left: Duration,
    callback: extern "C" fn(*mut raw::RedisModuleCtx, *mut c_void),
    data: *mut c_void,
) -> bool {
    let Some(alarm) = alarm(ctx) else {
        return false;
    };
    let due = Instant::now() + left;
    let seq = SEQ.replace(SEQ.get().wrapping_add(1));
    let db = selected_db(ctx);
    let earliest = PENDING.with_borrow_mut(|pending| {
        pending.insert((due, seq), Due { callback, data, db });
        pending.keys().next().copied()
    });
    if earliest == Some((due, seq)) {
        settime(alarm.fd, left);
    }
    true
}

/// The alarm, made on first use.
fn alarm(ctx: *mut raw::RedisModuleCtx) -> Option<Alarm> {
    if let Some(made) = ALARM.get() {
        return made;
    }
    let made = make(ctx);
    if made.is_none() {
        logging::log_notice(
            "lock: no µs alarm in this server's event loop: lease checks fire on module timers",
        );
    }
    ALARM.set(Some(made));
    made
}

/// Makes the timerfd and puts it in the event loop.
fn make(ctx: *mut raw::RedisModuleCtx) -> Option<Alarm> {
    // SAFETY: plain syscall; the fd is ours until the process ends.
    let fd = unsafe {
        libc::timerfd_create(
            libc::CLOCK_MONOTONIC,
            libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: a live context of this module; the detached context lives as
    // long as the module, and is used on the main thread only.
    let detached = unsafe {
        raw::RedisModule_GetDetachedThreadSafeContext.map_or(ptr::null_mut(), |f| f(ctx))
    };
    // SAFETY: a main-thread call with an fd of ours and a plain function.
    let added = !detached.is_null()
        && unsafe {
            raw::RedisModule_EventLoopAdd.map_or(raw::Status::Err as c_int, |f| {
                f(
                    fd,
                    raw::REDISMODULE_EVENTLOOP_READABLE as c_int,
                    Some(rang),
                    ptr::null_mut(),
                )
            })
        } == raw::Status::Ok as c_int;
    if !added {
        // SAFETY: our fd, in no event loop.
        unsafe { libc::close(fd) };
        return None;
    }
    Some(Alarm { fd, ctx: detached })
}

/// Sets the timerfd to expire once, `left` from now (at least 1 ns: 0
/// would disarm it).
fn settime(fd: c_int, left: Duration) {
    let left = left.max(Duration::from_nanos(1));
    let spec = libc::itimerspec {
        it_interval: libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        },
        it_value: libc::timespec {
            tv_sec: libc::time_t::try_from(left.as_secs()).unwrap_or(libc::time_t::MAX),
            tv_nsec: libc::c_long::from(left.subsec_nanos()),
        },
    };
    // SAFETY: our timerfd and a valid spec; the old value is not wanted.
    unsafe { libc::timerfd_settime(fd, 0, &spec, ptr::null_mut()) };
}

/// The event loop found the alarm's fd readable: arms the 0 ms module
/// timers of everything due, and sets the fd for the next.
extern "C" fn rang(fd: c_int, _data: *mut c_void, _mask: c_int) {
    guard("lease alarm", (), || {
        let mut expirations = [0u8; 8];
        // SAFETY: our non-blocking timerfd into an 8-byte buffer; nothing
        // to read (EAGAIN) is harmless.
        unsafe { libc::read(fd, expirations.as_mut_ptr().cast(), expirations.len()) };
        let Some(Some(alarm)) = ALARM.get() else {
            return;
        };
        let now = Instant::now();
        let (due, next) = PENDING.with_borrow_mut(|pending| {
            let later = pending.split_off(&(now, u64::MAX));
            let due = std::mem::replace(pending, later);
            (due, pending.keys().next().map(|&(at, _)| at))
        });
        if let Some(at) = next {
            settime(fd, at.saturating_duration_since(now));
        }
        for Due { callback, data, db } in due.into_values() {
            select_db(alarm.ctx, db);
            if create_timer(alarm.ctx, 0, callback, data) == 0 {
                // Not reached on a server that has the event loop API (it
                // has timers); the check is then left to the next command
                // on the lock or the waiters' deadlines.
                logging::log_warning("lock: a lease check could not be armed");
            }
        }
    });
}
