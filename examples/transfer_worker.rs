//! One worker of the transfer stress test (`tests/integration/multi_stress.rs`):
//! moves money between two accounts under one `LOCK.MACQUIRE` of both
//! accounts' locks, looping until its run time is over.
//!
//! Usage: `transfer_worker <port> <owner> <accounts> <run-ms> <seed>`.
//!
//! Each round: two accounts drawn at random, asked for in a random order
//! (so requests cross: `[a, b]` beside `[b, a]`), with `WAIT`; then a read
//! of both balances through the fenced store, a pause (the test `SIGSTOP`s
//! workers here, past their lease: they wake believing they hold and write
//! anyway, and the store must refuse them), a write of both new balances,
//! and `LOCK.MRELEASE`.
//!
//! Output, one item per line: `ok` per transfer written, `stale` per read or
//! write the store refused, `lost` when the release was refused, `timeout`
//! per `WAIT` that ended without the locks; `done` at the end.

use std::io::{self, Write};
use std::process::exit;
use std::thread;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::{Connection, Value};

/// Each hold's lease. The test stops workers for longer than this.
const LEASE_MS: &str = "1000";
/// Longer than any lease a stopped or killed holder keeps its keys for: a
/// `WAIT` that ends without the locks is a request left behind.
const WAIT_MS: &str = "8000";
/// Between the read and the write: a hold lasts long enough for the test to
/// catch a worker in the middle of a transfer.
const PAUSE: Duration = Duration::from_millis(20);

/// The fenced store: two accounts' balances and fences, in one script.
///
/// KEYS: account A's balance, A's fences (a hash: `seen`, the highest fence
/// of any accepted operation; `written`, the last write's), then B's two.
/// ARGV: `read` or `write`, A's fence, B's fence, and for a write A's and
/// B's new balances. A read is accepted only with fences at or above both
/// accounts' last writes, and answers both balances; a write only with
/// fences at or above every fence either account has seen. Refusals count in
/// `transfer:tally` (`stale-read`, `stale-write`).
const STORE: &str = r"
local op, fa, fb = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local function get(k, f) return tonumber(redis.call('HGET', k, f)) or 0 end
local ok
if op == 'read' then
  ok = fa >= get(KEYS[2], 'written') and fb >= get(KEYS[4], 'written')
else
  ok = fa >= get(KEYS[2], 'seen') and fb >= get(KEYS[4], 'seen')
end
if not ok then
  redis.call('HINCRBY', 'transfer:tally', 'stale-' .. op, 1)
  return 'stale'
end
for _, p in ipairs({{KEYS[2], ARGV[2], fa}, {KEYS[4], ARGV[3], fb}}) do
  if p[3] > get(p[1], 'seen') then redis.call('HSET', p[1], 'seen', p[2]) end
  if op == 'write' then redis.call('HSET', p[1], 'written', p[2]) end
end
if op == 'read' then
  return {redis.call('GET', KEYS[1]) or '0', redis.call('GET', KEYS[3]) or '0'}
end
redis.call('SET', KEYS[1], ARGV[4])
redis.call('SET', KEYS[3], ARGV[5])
redis.call('HINCRBY', 'transfer:tally', 'transfers', 1)
return 'ok'
";

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: transfer_worker <port> <owner> <accounts> <run-ms> <seed>";
    let [_, port, owner, accounts, run_ms, seed] = args.as_slice() else {
        eprintln!("{usage}");
        exit(1);
    };
    let (Ok(accounts), Ok(run_ms), Ok(seed)) = (
        accounts.parse::<usize>(),
        run_ms.parse::<u64>(),
        seed.parse::<u64>(),
    ) else {
        eprintln!("{usage}");
        exit(1);
    };
    if accounts < 2 {
        eprintln!("{usage}: at least two accounts");
        exit(1);
    }
    let run = Run {
        owner,
        accounts,
        until: Instant::now() + Duration::from_millis(run_ms),
        rng: StdRng::seed_from_u64(seed),
    };
    if let Err(why) = run.go(port) {
        eprintln!("{owner}: {why}");
        exit(1);
    }
}

struct Run<'a> {
    owner: &'a str,
    accounts: usize,
    until: Instant,
    rng: StdRng,
}

fn say(word: &str) {
    let mut out = io::stdout().lock();
    let _ = writeln!(out, "{word}");
    let _ = out.flush();
}

impl Run<'_> {
    fn go(mut self, port: &str) -> redis::RedisResult<()> {
        let mut conn =
            redis::Client::open(format!("redis://127.0.0.1:{port}/"))?.get_connection()?;
        let digest: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(STORE)
            .query(&mut conn)?;
        while Instant::now() < self.until {
            let a = self.rng.gen_range(0..self.accounts);
            let b = (a + self.rng.gen_range(1..self.accounts)) % self.accounts;
            self.transfer(&mut conn, &digest, a, b)?;
        }
        say("done");
        Ok(())
    }

    fn transfer(
        &mut self,
        conn: &mut Connection,
        digest: &str,
        a: usize,
        b: usize,
    ) -> redis::RedisResult<()> {
        let locks = [format!("acct:{a}:lock"), format!("acct:{b}:lock")];
        let granted: Option<Vec<u64>> = redis::cmd("LOCK.MACQUIRE")
            .arg(2)
            .arg(&locks)
            .arg(self.owner)
            .arg(LEASE_MS)
            .arg("WAIT")
            .arg(WAIT_MS)
            .query(conn)?;
        let Some(fences) = granted else {
            say("timeout");
            return Ok(());
        };
        let [fa, fb] = fences.as_slice() else {
            return Err(io::Error::other(format!("LOCK.MACQUIRE answered {fences:?}")).into());
        };
        let store_keys = [
            format!("acct:{a}:balance"),
            format!("acct:{a}:fences"),
            format!("acct:{b}:balance"),
            format!("acct:{b}:fences"),
        ];
        let read: Value = redis::cmd("EVALSHA")
            .arg(digest)
            .arg(4)
            .arg(&store_keys)
            .arg("read")
            .arg(fa)
            .arg(fb)
            .query(conn)?;
        let balances: Option<(i64, i64)> = redis::from_redis_value(read).ok();
        if let Some((from, to)) = balances {
            thread::sleep(PAUSE);
            let amount = self.rng.gen_range(1..=10);
            let written: String = redis::cmd("EVALSHA")
                .arg(digest)
                .arg(4)
                .arg(&store_keys)
                .arg("write")
                .arg(fa)
                .arg(fb)
                .arg(from - amount)
                .arg(to + amount)
                .query(conn)?;
            say(&written);
        } else {
            say("stale");
        }
        let released: redis::RedisResult<Value> = redis::cmd("LOCK.MRELEASE")
            .arg(2)
            .arg(&locks)
            .arg(self.owner)
            .query(conn);
        match released {
            Ok(_) => Ok(()),
            Err(e) if e.code() == Some("NOTOWNER") => {
                say("lost");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}
