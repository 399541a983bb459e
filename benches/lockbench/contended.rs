//! Contended hand-off (measurement 2): C clients, one lock, each looping
//! acquire → `INCR counter` → release for a fixed time.
//!
//! Each client is a thread with its own connection(s). The `INCR` runs under
//! the lock, so its value numbers the acquisitions in the order they happened:
//! sorting by it shows who followed whom, hence how often the client that had
//! just released took the lock again (barging; its other clients starve).
//!
//! The `BLPOP` token runs the same loop on a list seeded with one token
//! (`BLPOP` it, `INCR`, `RPUSH` it back): Redis's own hand-off, one holder at
//! a time, in the order the clients blocked. The module's throughput against
//! this one's shows what a lock's bookkeeping adds to a hand-off.

use std::sync::{Arc, Barrier, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use crate::locks::{token_list, Client, Scripts, Waiting};
use crate::server::{command_calls, server_cpu_seconds, Server};
use crate::stats::{percentile, uuid};
use crate::Res;

const KEY: &str = "contended:lock";
const COUNTER: &str = "contended:counter";
/// Lease of each hold: every holder releases long before it ends.
const TTL_MS: u64 = 10_000;

/// One run's figures.
#[derive(Clone, Debug)]
pub struct Contended {
    /// Acquisitions completed inside the run's window, per second.
    pub acquisitions_per_s: f64,
    /// Time from wanting the lock to holding it (every acquisition).
    pub wait_p50: Duration,
    pub wait_p99: Duration,
    pub wait_max: Duration,
    /// Server command calls (scripts' inner calls included) per acquisition.
    pub commands_per_acquisition: f64,
    /// Share of acquisitions by the client that made the previous one.
    pub same_client_share: f64,
    /// Server main-thread CPU per acquisition, microseconds.
    pub cpu_us_per_acquisition: f64,
    /// The longest hold: from holding the lock to the release's reply. A
    /// holder that stalls (descheduled) delays every client queued behind.
    pub hold_max: Duration,
}

/// One acquisition as a client saw it.
struct Sample {
    /// The `INCR` value: the acquisition's place in the lock's history.
    order: i64,
    waited: Duration,
    held_for: Duration,
    in_window: bool,
}

/// Runs `clients` clients waiting the `waiting` way for `window`.
pub fn run(
    server: &Server,
    scripts: &Scripts,
    waiting: Waiting,
    clients: usize,
    window: Duration,
) -> Res<Contended> {
    let mut con = server.control()?;
    redis::cmd("DEL")
        .arg(KEY)
        .arg(COUNTER)
        .arg(token_list(KEY))
        .query::<()>(&mut con)?;
    if waiting == Waiting::BlpopToken {
        redis::cmd("RPUSH")
            .arg(token_list(KEY))
            .arg("x")
            .query::<()>(&mut con)?;
    }
    let mut connected = Vec::with_capacity(clients);
    let run_id = uuid();
    for t in 0..clients {
        let owner = format!("{run_id}:{t}");
        connected.push(Client::connect(
            server.port,
            waiting,
            scripts,
            KEY,
            &owner,
            TTL_MS,
        )?);
    }
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query::<()>(&mut con)?;
    let cpu_before = server_cpu_seconds(&mut con)?;

    let barrier = Arc::new(Barrier::new(clients + 1));
    let deadline = Arc::new(OnceLock::<Instant>::new());
    let threads: Vec<_> = connected
        .into_iter()
        .map(|mut client| {
            let barrier = Arc::clone(&barrier);
            let deadline = Arc::clone(&deadline);
            thread::spawn(move || -> std::io::Result<Vec<Sample>> {
                barrier.wait();
                let Some(&deadline) = deadline.get() else {
                    return Ok(Vec::new());
                };
                let mut samples = Vec::new();
                loop {
                    let wanted = Instant::now();
                    if wanted >= deadline || !client.acquire(deadline)? {
                        break;
                    }
                    let held = Instant::now();
                    let order = client.call(&["INCR", COUNTER])?.int().unwrap_or(-1);
                    client.release()?;
                    samples.push(Sample {
                        order,
                        waited: held - wanted,
                        held_for: held.elapsed(),
                        in_window: held <= deadline,
                    });
                }
                Ok(samples)
            })
        })
        .collect();
    let _ = deadline.set(Instant::now() + window);
    barrier.wait();

    // Thread index per sample, to follow the lock from client to client.
    let mut history: Vec<(i64, usize)> = Vec::new();
    let mut waits = Vec::new();
    let mut in_window = 0usize;
    let mut hold_max = Duration::ZERO;
    let mut failure = None;
    for (t, handle) in threads.into_iter().enumerate() {
        match handle.join() {
            Ok(Ok(samples)) => {
                for s in samples {
                    history.push((s.order, t));
                    waits.push(s.waited);
                    hold_max = hold_max.max(s.held_for);
                    in_window += usize::from(s.in_window);
                }
            }
            Ok(Err(e)) => failure = Some(format!("client {t}: {e}")),
            Err(_) => failure = Some(format!("client {t} panicked")),
        }
    }
    if let Some(why) = failure {
        return Err(format!("{} with {clients} clients: {why}", waiting.label()).into());
    }
    let cpu = server_cpu_seconds(&mut con)? - cpu_before;
    let total_calls: u64 = command_calls(&mut con)?.values().sum();
    let acquisitions = history.len();
    if acquisitions == 0 {
        return Err(format!("{} with {clients} clients: no acquisition", waiting.label()).into());
    }
    history.sort_unstable();
    let repeats = history.windows(2).filter(|w| w[0].1 == w[1].1).count();
    waits.sort_unstable();
    Ok(Contended {
        acquisitions_per_s: in_window as f64 / window.as_secs_f64(),
        wait_p50: percentile(&waits, 50.0),
        wait_p99: percentile(&waits, 99.0),
        wait_max: percentile(&waits, 100.0),
        commands_per_acquisition: total_calls as f64 / acquisitions as f64,
        same_client_share: repeats as f64 / (acquisitions.max(2) - 1) as f64,
        cpu_us_per_acquisition: cpu * 1e6 / acquisitions as f64,
        hold_max,
    })
}
