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
