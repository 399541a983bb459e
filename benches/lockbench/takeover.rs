//! Lease-end takeover (measurement 3): a holder takes the lock with a 200 ms
//! lease and vanishes without releasing; one waiter wants it. The figure is
//! the time from the lease's end to the waiter holding the lock.
//!
//! The lease end is estimated as the midpoint of the holder's acquire round
//! trip + 200 ms (the server stamps it somewhere in that round trip, to the
//! millisecond: figures are good to about ±1 ms).

use std::time::{Duration, Instant};

use crate::locks::{Client, Scripts, Waiting};
use crate::server::Server;
use crate::stats::uuid;
use crate::Res;

const KEY: &str = "takeover:lock";
/// The vanished holder's lease.
pub const LEASE: Duration = Duration::from_millis(200);
/// Timer wake-ups [`timer_wake_lateness`] measures per run (about 3 s).
pub const FLOOR_SAMPLES: usize = 500;
/// A takeover slower than this counts as a failure.
const GIVE_UP_AFTER: Duration = Duration::from_secs(2);

/// One takeover: the delay past the lease end, in milliseconds (negative
/// would mean the waiter got the lock before the lease ended).
pub fn trial(server: &Server, scripts: &Scripts, waiting: Waiting) -> Res<f64> {
    let mut con = server.control()?;
    redis::cmd("DEL").arg(KEY).query::<()>(&mut con)?;
    let kind = waiting.kind();
    let mut waiter = Client::connect(
        server.port,
        waiting,
        scripts,
        KEY,
        &format!("{}:1", uuid()),
        10_000,
    )?;
    let mut holder = server.conn()?;
    let take = kind.acquire(
        scripts,
        KEY,
        &format!("{}:1", uuid()),
        &LEASE.as_millis().to_string(),
    );
    let take: Vec<&str> = take.iter().map(String::as_str).collect();
    let sent = Instant::now();
    let reply = holder.call(&take)?;
    let answered = Instant::now();
    if !kind.took(&reply) {
        return Err(format!(
            "{}: the holder could not take a free lock: {reply:?}",
            kind.label()
        )
        .into());
    }
    let lease_end = sent + (answered - sent) / 2 + LEASE;
    // The holder vanishes: its connection closes, it never releases.
    drop(holder);

    let got = waiter.acquire(lease_end + GIVE_UP_AFTER)?;
    let took_at = Instant::now();
    if !got {
        return Err(format!(
            "{}: no takeover within {GIVE_UP_AFTER:?} of the lease end",
            waiting.label()
        )
        .into());
    }
    waiter.release()?;
    let delay_ms = if took_at >= lease_end {
        (took_at - lease_end).as_secs_f64() * 1e3
    } else {
        -(lease_end - took_at).as_secs_f64() * 1e3
    };
    Ok(delay_ms)
}

/// How late this machine wakes a thread from a timer with nothing else in
/// the way: `samples` sleeps of 2 to 10 ms on a monotonic `timerfd` watched
/// by `epoll`, as the module's lease alarm sleeps in the server's event
/// loop; their lateness, sorted. A takeover needs two such wake-ups (the
/// server at the lease end, then the waiter at its reply), so the machine
/// sets a floor under its figures that no lock can beat.
pub fn timer_wake_lateness(samples: usize) -> Res<Vec<Duration>> {
    let timer = Fd::new(
        // SAFETY: plain syscall; the fd is closed by `Fd`'s drop.
        unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_NONBLOCK) },
        "timerfd_create",
    )?;
    // SAFETY: plain syscall; the fd is closed by `Fd`'s drop.
    let poll = Fd::new(unsafe { libc::epoll_create1(0) }, "epoll_create1")?;
    let mut watch = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: 0,
    };
    // SAFETY: two fds of ours and a valid event.
    if unsafe { libc::epoll_ctl(poll.0, libc::EPOLL_CTL_ADD, timer.0, &mut watch) } != 0 {
        return Err(format!("epoll_ctl: {}", std::io::Error::last_os_error()).into());
    }
    let mut lateness = Vec::with_capacity(samples);
    for i in 0..samples {
        // Spread over 2–10 ms without a random source: a stride that is
        // coprime with the span visits every µs offset in turn.
        let sleep = Duration::from_micros(2_000 + (i as u64 * 3_571) % 8_000);
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: 0,
                tv_nsec: libc::c_long::from(sleep.subsec_nanos()),
            },
        };
        let start = Instant::now();
        // SAFETY: our timerfd and a valid spec; the old value is not wanted.
        unsafe { libc::timerfd_settime(timer.0, 0, &spec, std::ptr::null_mut()) };
        let mut ready = [libc::epoll_event { events: 0, u64: 0 }];
        // SAFETY: our epoll fd and a buffer of one event. A signal can end
        // the wait early (-1, EINTR): wait again, a few times at most.
        let rang =
            (0..5).any(|_| unsafe { libc::epoll_wait(poll.0, ready.as_mut_ptr(), 1, 1_000) } > 0);
        let woke = Instant::now();
        if !rang {
            return Err("a timerfd never became readable".into());
        }
        let mut expirations = [0u8; 8];
        // SAFETY: our non-blocking timerfd into an 8-byte buffer.
        unsafe { libc::read(timer.0, expirations.as_mut_ptr().cast(), 8) };
        lateness.push(woke.saturating_duration_since(start + sleep));
    }
    lateness.sort();
    Ok(lateness)
}

/// An fd closed on drop.
struct Fd(libc::c_int);

impl Fd {
    fn new(fd: libc::c_int, what: &str) -> Res<Fd> {
        if fd < 0 {
            return Err(format!("{what}: {}", std::io::Error::last_os_error()).into());
        }
        Ok(Fd(fd))
    }
}

impl Drop for Fd {
    fn drop(&mut self) {
        // SAFETY: an fd of ours, closed once.
        unsafe { libc::close(self.0) };
    }
}
