//! `make bench-client`: Redlock over 3 local servers (each with the module),
//! this client against `rslock` (the Redlock crate on crates.io, SET NX + Lua)
//! in the same run: acquire + release latency without contention, and lock
//! cycles per second with 4 contenders on one key. Bounded well under 2 min.
//!
//! The servers come from the workspace's test kit (`redislock-testkit`), so
//! `LOCK_MODULE` and `LOCK_SERVER` choose them as for the tests.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redislock_client::{LockOptions, Redlock, RedlockOptions};
use redislock_testkit::Server;

const LATENCY_ROUNDS: usize = 2_000;
const WARM_UP: usize = 100;
const CONTENDERS: usize = 4;
const CONTENDED_FOR: Duration = Duration::from_secs(5);
const TTL: Duration = Duration::from_secs(10);
/// Both clients wait up to this (random) between failed rounds.
const RETRY_DELAY: Duration = Duration::from_millis(5);

struct Row {
    name: &'static str,
    p50: Duration,
    p99: Duration,
    per_sec: f64,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn ours(urls: &[String], watchdog: bool, name: &'static str) -> Row {
    let options = RedlockOptions {
        retry_delay: RETRY_DELAY,
        ..RedlockOptions::default()
    };
    let redlock = Redlock::with_options(urls.to_vec(), options).expect("redlock");
    let opts = LockOptions::new(TTL).watchdog(watchdog).wait_forever();
    let mut times = Vec::with_capacity(LATENCY_ROUNDS);
    // The first rounds open the connections: not measured.
    for i in 0..WARM_UP + LATENCY_ROUNDS {
        let key = format!("lat-{name}-{}", i % 16);
        let start = Instant::now();
        let guard = redlock.try_lock(&key, &opts).await.expect("uncontended");
        guard.release_all().await.expect("release");
        if i >= WARM_UP {
            times.push(start.elapsed());
        }
    }
    times.sort();
    let cycles = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + CONTENDED_FOR;
    let mut tasks = Vec::new();
    for _ in 0..CONTENDERS {
        let (redlock, opts, cycles) = (redlock.clone(), opts.clone(), cycles.clone());
        let key = format!("hot-{name}");
        tasks.push(tokio::spawn(async move {
            while Instant::now() < until {
                if let Ok(guard) = redlock.lock(&key, &opts).await {
                    let _ = guard.release_all().await;
                    cycles.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    Row {
        name,
        p50: percentile(&times, 0.5),
        p99: percentile(&times, 0.99),
        per_sec: cycles.load(Ordering::Relaxed) as f64 / CONTENDED_FOR.as_secs_f64(),
    }
}

async fn rslock_row(urls: &[String]) -> Row {
    let mut manager = rslock::LockManager::new(urls.to_vec());
    manager.set_retry(1, RETRY_DELAY);
    let mut times = Vec::with_capacity(LATENCY_ROUNDS);
    for i in 0..WARM_UP + LATENCY_ROUNDS {
        let key = format!("lat-rslock-{}", i % 16);
        let start = Instant::now();
        let lock = manager
            .lock(key.as_bytes(), TTL)
            .await
            .expect("uncontended");
        manager.unlock(&lock).await;
        if i >= WARM_UP {
            times.push(start.elapsed());
        }
    }
    times.sort();
    let cycles = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + CONTENDED_FOR;
    let mut tasks = Vec::new();
    for _ in 0..CONTENDERS {
        // Each contender its own manager, as separate processes would have.
        let mut manager = rslock::LockManager::new(urls.to_vec());
        manager.set_retry(1, RETRY_DELAY);
        let cycles = cycles.clone();
        tasks.push(tokio::spawn(async move {
            while Instant::now() < until {
                match manager.lock(&b"hot-rslock"[..], TTL).await {
                    Ok(lock) => {
                        manager.unlock(&lock).await;
                        cycles.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => {
                        let pause = rand::random::<u64>() % RETRY_DELAY.as_micros() as u64;
                        tokio::time::sleep(Duration::from_micros(pause)).await;
                    }
                }
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    Row {
        name: "rslock 0.10 (SET NX + Lua)",
        p50: percentile(&times, 0.5),
        p99: percentile(&times, 0.99),
        per_sec: cycles.load(Ordering::Relaxed) as f64 / CONTENDED_FOR.as_secs_f64(),
    }
}

#[tokio::main]
async fn main() {
    // `cargo bench` passes `--bench`; nothing else to read.
    let servers: Vec<Server> = (0..3).map(|_| Server::start()).collect();
    let urls: Vec<String> = servers.iter().map(Server::url).collect();
    let started = Instant::now();
    let rows = vec![
        ours(&urls, false, "redislock-client (fence round, no watchdog)").await,
        ours(&urls, true, "redislock-client (fence round, watchdog)").await,
        rslock_row(&urls).await,
    ];
    println!(
        "\nRedlock over 3 local servers: acquire + release, {LATENCY_ROUNDS} uncontended rounds; \
         {CONTENDERS} contenders on one key for {CONTENDED_FOR:?}"
    );
    println!(
        "{:<46} {:>10} {:>10} {:>14}",
        "client", "p50", "p99", "contended/s"
    );
    for row in rows {
        println!(
            "{:<46} {:>10.1?} {:>10.1?} {:>14.0}",
            row.name, row.p50, row.p99, row.per_sec
        );
    }
    println!("(took {:.1?})", started.elapsed());
}
