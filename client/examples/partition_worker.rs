//! A worker of the partition test (`tests/integration/sentinel.rs` at the
//! top of the workspace): threads that loop lock → fenced read-modify-write
//! → release through the Sentinel-discovered master, and print each hold.
//!
//! ```text
//! partition_worker SENTINELS NAME STORE_SOCKET LOCKS THREADS STOP_FILE
//! ```
//! `SENTINELS` is `host:port,host:port,…`; the store is a plain Redis on a
//! unix socket (reachable from any network namespace) whose `FCALL`-free Lua
//! refuses a fence lower than the highest it has seen, on reads and writes.
//! The worker runs until `STOP_FILE` exists (at most 15 minutes).
//!
//! Output, one line per hold (times in unix µs, as every process here reads
//! the same clock):
//! `hold LOCK FENCE GRANTED_US DONE_US RELEASED WROTE`: the holder used the
//! lock from its grant's reply to the moment it sent the release (whatever
//! became of the release: a master that died may have processed it or not,
//! the holder no longer acts on the lock either way); `WROTE` is whether
//! the store took the write.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redislock_client::{blocking::Client, LockOptions};

const TTL: Duration = Duration::from_millis(1_000);
const WAIT: Duration = Duration::from_millis(1_500);
const LONGEST: Duration = Duration::from_secs(15 * 60);
const WORK: Duration = Duration::from_millis(5);

/// Refuses a fence below the highest seen for the key, records it, then
/// reads (no third argument) or writes. Fences are below 2^53, so Lua
/// compares them exactly as numbers.
const STORE: &str = r#"
local seen = redis.call('GET', KEYS[1] .. ':fence')
local f = ARGV[1]
if seen and tonumber(f) < tonumber(seen) then
  return redis.error_reply('STALE fence ' .. f .. ' below ' .. seen)
end
redis.call('SET', KEYS[1] .. ':fence', f)
if ARGV[2] then
  redis.call('SET', KEYS[1], ARGV[2])
  return 'OK'
end
return redis.call('GET', KEYS[1]) or '0'
"#;

fn unix_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, sentinels, name, store, locks, threads, stop] = args.as_slice() else {
        eprintln!("usage: partition_worker SENTINELS NAME STORE_SOCKET LOCKS THREADS STOP_FILE");
        std::process::exit(2);
    };
    let sentinels: Vec<String> = sentinels
        .split(',')
        .map(|addr| format!("redis://{addr}/"))
        .collect();
    let locks: usize = locks.parse().expect("LOCKS");
    let threads: usize = threads.parse().expect("THREADS");
    let client = Client::sentinel(sentinels, name).expect("a Sentinel client");
    let started = Instant::now();
    std::thread::scope(|scope| {
        for t in 0..threads {
            let client = &client;
            scope.spawn(move || {
                let store = redis::Client::open(format!("redis+unix://{store}")).expect("store");
                let mut store = store.get_connection().expect("the store");
                let opts = LockOptions::new(TTL).wait(WAIT).watchdog(false);
                let mut i = t;
                while !Path::new(stop).exists() && started.elapsed() < LONGEST {
                    i += 1;
                    let key = format!("res:{}", i % locks);
                    let mut guard = match client.lock(&key, &opts) {
                        Ok(guard) => guard,
                        Err(_) => {
                            std::thread::sleep(Duration::from_millis(20));
                            continue;
                        }
                    };
                    let granted = unix_us();
                    let fence = guard.fence().to_string();
                    let read: redis::RedisResult<String> = redis::cmd("EVAL")
                        .arg(STORE)
                        .arg(1)
                        .arg(&key)
                        .arg(&fence)
                        .query(&mut store);
                    let mut wrote = false;
                    if let Ok(value) = read {
                        let next = value.parse::<u64>().unwrap_or(0) + 1;
                        // The work between the read and the write.
                        std::thread::sleep(WORK);
                        // Only within the lease, as a careful holder does.
                        if Instant::now() < guard.deadline() {
                            let write: redis::RedisResult<String> = redis::cmd("EVAL")
                                .arg(STORE)
                                .arg(1)
                                .arg(&key)
                                .arg(&fence)
                                .arg(next)
                                .query(&mut store);
                            wrote = write.is_ok();
                        }
                    }
                    // The holder is done before it sends the release (whose
                    // reply may come after the next holder's grant).
                    let done = unix_us();
                    let released = guard.release().is_ok();
                    let line = format!(
                        "hold {key} {fence} {granted} {done} {} {}\n",
                        u8::from(released),
                        u8::from(wrote)
                    );
                    let _ = std::io::stdout().lock().write_all(line.as_bytes());
                }
            });
        }
    });
}
