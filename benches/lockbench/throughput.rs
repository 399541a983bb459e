//! Uncontended pair throughput through `redis-benchmark` (measurement 1, and
//! the keyspace half of measurement 5).
//!
//! A pair is one acquire and one release of a lock no one else wants, on
//! distinct random keys. `redis-benchmark` runs one command per invocation, so
//! a pair is two runs with the same pinned seed: the acquire run takes `n`
//! random keys, the release run frees exactly those (checked with `DBSIZE`).
//! Pairs per second = n / (time of both runs). `PING` is the server's ceiling
//! for any round trip: its "pair" is two `PING`s.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::locks::{Kind, Scripts};
use crate::server::{redis_benchmark_bin, server_cpu_seconds, Server};
use crate::stats::run_bounded;
use crate::Res;

/// `redis-benchmark` connections, as the issue asks.
pub const CLIENTS: usize = 50;
/// Random keys are drawn from this many: collisions stay under 0.1% of runs.
const KEYSPACE: &str = "1000000000";
/// Leases far longer than a run: nothing expires while measured.
const TTL: &str = "600000";
/// No single `redis-benchmark` run may take longer than this.
const RUN_LIMIT: Duration = Duration::from_secs(120);

/// What a pair is made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Subject {
    Ping,
    Lock(Kind),
    /// Raw `SET NX PX` + `DEL` on a server without the module: the module
    /// subscribes to keyspace events, which every write then pays for.
    RawWithoutModule,
}

impl Subject {
    /// The order of rows in the report.
    pub const ALL: [Subject; 6] = [
        Subject::Ping,
        Subject::RawWithoutModule,
        Subject::Lock(Kind::Raw),
        Subject::Lock(Kind::StringRecipe),
        Subject::Lock(Kind::HashRecipe),
        Subject::Lock(Kind::Module),
    ];

    pub fn label(self) -> &'static str {
        match self {
            Subject::Ping => "PING + PING",
            Subject::Lock(kind) => kind.label(),
            Subject::RawWithoutModule => "raw, server without module",
        }
    }
}

/// One measured pair rate.
#[derive(Clone, Copy, Debug)]
pub struct PairRun {
    pub pairs_per_s: f64,
    /// The two runs' own rates (requests/s): acquire, release.
    pub acquire_rps: f64,
    pub release_rps: f64,
    /// Server main-thread CPU per pair, microseconds (`INFO cpu` delta).
    pub cpu_us_per_pair: f64,
}

/// `redis-benchmark` against one server, with the seed shim and the scripts.
pub struct Bench<'a> {
    pub server: &'a Server,
    pub shim: &'a Path,
    pub scripts: &'a Scripts,
    /// A 36-character UUID + ":1", as a lock client would send.
    pub owner: String,
}

impl Bench<'_> {
    /// Measures `n` pairs of `subject` at `pipeline`, with random keys drawn
    /// from `seed`.
    pub fn pair(&self, subject: Subject, pipeline: usize, n: usize, seed: u64) -> Res<PairRun> {
        let mut con = self.server.control()?;
        let cpu_before = server_cpu_seconds(&mut con)?;
        let (pairs_per_s, pairs, acquire_rps, release_rps) = match subject {
            Subject::Ping => {
                let rps = self.run(&["PING".into()], pipeline, n, seed)?;
                (rps / 2.0, n as f64 / 2.0, rps, rps)
            }
            Subject::Lock(_) | Subject::RawWithoutModule => {
                let kind = kind_of(subject);
                let key = "lk:__rand_int__";
                let acquire = kind.acquire(self.scripts, key, &self.owner, TTL);
                let release = kind.release(self.scripts, key, &self.owner, TTL);
                let before: u64 = redis::cmd("DBSIZE").query(&mut con)?;
                let a = self.run(&acquire, pipeline, n, seed)?;
                let held: u64 = redis::cmd("DBSIZE").query(&mut con)?;
                let r = self.run(&release, pipeline, n, seed)?;
                let after: u64 = redis::cmd("DBSIZE").query(&mut con)?;
                // Random draws may repeat a key now and then (a reentry or a
                // refusal, undone by the matching release): allow 1%.
                if held.saturating_sub(before) < (n as u64) * 99 / 100 || after != before {
                    return Err(format!(
                        "{}: the acquire run left {} keys of {n}, the release run {} \
                         (the seed shim must make both runs draw the same keys)",
                        kind.label(),
                        held.saturating_sub(before),
                        after.saturating_sub(before)
                    )
                    .into());
                }
                (1.0 / (1.0 / a + 1.0 / r), n as f64, a, r)
            }
        };
        let cpu = server_cpu_seconds(&mut con)? - cpu_before;
        Ok(PairRun {
            pairs_per_s,
            acquire_rps,
            release_rps,
            cpu_us_per_pair: cpu * 1e6 / pairs,
        })
    }

    /// One `redis-benchmark` run; its requests per second.
    fn run(&self, args: &[String], pipeline: usize, n: usize, seed: u64) -> Res<f64> {
        let mut command = Command::new(redis_benchmark_bin());
        command
            .env("LD_PRELOAD", self.shim)
            .env("LOCKBENCH_SEED", seed.to_string())
            .args(["-h", "127.0.0.1", "-p", &self.server.port.to_string()])
            .args(["-c", &CLIENTS.to_string(), "-P", &pipeline.to_string()])
            .args(["-n", &n.to_string(), "-r", KEYSPACE, "--csv"])
            .args(args);
        let out = run_bounded(command, RUN_LIMIT)?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let rps = stdout.lines().rev().find_map(|line| {
            line.split(',')
                .nth(1)?
                .trim_matches('"')
                .parse::<f64>()
                .ok()
        });
        match rps {
            Some(rps) if out.status.success() && rps > 0.0 => Ok(rps),
            _ => Err(format!(
                "redis-benchmark {} failed ({}):\n{stdout}{}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
            .into()),
        }
    }
}

/// The commands a subject's pairs are made of.
fn kind_of(subject: Subject) -> Kind {
    match subject {
        Subject::Lock(kind) => kind,
        Subject::Ping | Subject::RawWithoutModule => Kind::Raw,
    }
}
