//! Several at once: 32 clients each taking 2 or 4 of 8 locks (random keys in
//! a random order), and 32 clients taking 1, 2 or 4 of a semaphore's 8
//! permits; acquire → `INCR` → release, for a fixed time.
//!
//! The subjects, each written here from its library's algorithm:
//!
//! - **The module**: `LOCK.MACQUIRE … WAIT`, one request queued on every key
//!   and served first come first served; `LOCK.MRELEASE`. For permits,
//!   `LOCK.ACQUIRE … SHARED LIMIT 8 PERMITS k WAIT`.
//! - **Redisson's `MultiLock`**: its keys one by one in the order given, each
//!   through the hash recipe's try-lock waiting on pub/sub up to the time
//!   left; a key it cannot get releases the ones it holds and starts over;
//!   `lock()` retries `tryLock` with a wait of 1.5 s per key.
//! - **node-redlock's multi-resource acquire**: one script that sets every
//!   key if none exists, retried after 10 ± 5 ms (the Node bench's setting;
//!   its default is 200 ± 200 ms).
//! - **bsm/redislock's `ObtainMulti`**: `MSETNX` and a `PEXPIRE` per key in
//!   one script, retried with a linear 2 ms backoff (the Go bench's setting).
//! - **redis-semaphore's `MultiSemaphore`**: a sorted set of permit ids
//!   scored by the client's clock; one script drops the expired ones and adds
//!   k ids if they fit, retried every 10 ms (its default).
//!
//! Figures per run: acquisitions/s, the wait's p99 and max (for permits also
//! per size: the wide requests are the ones a poller starves), attempts
//! that failed and were retried per acquisition, and server commands per
//! acquisition (scripts' inner calls included, the `INCR` too).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io;
use std::sync::{Arc, Barrier, OnceLock};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use super::{rotated, Ctx, Results};
use crate::locks::{channel, Scripts};
use crate::markdown::{count, millis, num, Table};
use crate::resp::{Conn, Reply};
use crate::server::{command_calls, Server};
use crate::stats::{self, median, percentile, uuid};
use crate::Res;

/// Locks the clients draw their keys from.
const KEYS: usize = 8;
/// Keys per request: the two rows of the table.
pub const WIDTHS: [usize; 2] = [2, 4];
const CLIENTS: usize = 32;
/// The semaphore's permits, and the sizes its clients ask for.
const LIMIT: usize = 8;
const PERMIT_SIZES: [usize; 3] = [1, 2, 4];
/// Lease of each hold: every holder releases long before it ends.
const TTL_MS: u64 = 10_000;
const COUNTER: &str = "multi:counter";

/// node-redlock: every key set if none exists; the number set, or 0.
const REDLOCK_ACQUIRE_LUA: &str = "\
for _, key in ipairs(KEYS) do
  if redis.call('exists', key) == 1 then return 0 end
end
for _, key in ipairs(KEYS) do
  redis.call('set', key, ARGV[1], 'PX', ARGV[2])
end
return #KEYS";
/// node-redlock's release: every key still holding the owner's value.
const REDLOCK_RELEASE_LUA: &str = "\
local n = 0
for _, key in ipairs(KEYS) do
  if redis.call('get', key) == ARGV[1] then n = n + redis.call('del', key) end
end
return n";
/// bsm/redislock's obtain: `MSETNX`, then the lease on every key.
const MSETNX_ACQUIRE_LUA: &str = "\
local pairs = {}
for _, key in ipairs(KEYS) do
  table.insert(pairs, key)
  table.insert(pairs, ARGV[1])
end
if redis.call('msetnx', unpack(pairs)) ~= 1 then return 0 end
for _, key in ipairs(KEYS) do redis.call('pexpire', key, ARGV[2]) end
return 1";
/// redis-semaphore's `MultiSemaphore` acquire: KEYS[1] the set; ARGV limit,
/// permits, id, lease (ms), the client's now (ms).
const SEMAPHORE_ACQUIRE_LUA: &str = "\
local limit, permits, ttl, now = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[4]), tonumber(ARGV[5])
redis.call('zremrangebyscore', KEYS[1], '-inf', now - ttl)
if redis.call('zcard', KEYS[1]) + permits > limit then return 0 end
local args = {}
for i = 0, permits - 1 do
  table.insert(args, now)
  table.insert(args, ARGV[3] .. '_' .. i)
end
redis.call('zadd', KEYS[1], unpack(args))
redis.call('pexpire', KEYS[1], ttl)
return 1";
/// Its release: the k ids.
const SEMAPHORE_RELEASE_LUA: &str = "\
for i = 0, tonumber(ARGV[2]) - 1 do redis.call('zrem', KEYS[1], ARGV[1] .. '_' .. i) end
return 1";

/// A way of taking several locks, or several permits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Way {
    Module,
    RedissonMultiLock,
    NodeRedlock,
    BsmObtainMulti,
    /// Permits only: redis-semaphore's `MultiSemaphore`.
    MultiSemaphore,
}

impl Way {
    pub const KEYS: [Way; 4] = [
        Way::Module,
        Way::RedissonMultiLock,
        Way::NodeRedlock,
        Way::BsmObtainMulti,
    ];
    pub const PERMITS: [Way; 2] = [Way::Module, Way::MultiSemaphore];

    pub fn label(self) -> &'static str {
        match self {
            Way::Module => "module (`WAIT`)",
            Way::RedissonMultiLock => "Redisson `MultiLock` (pub/sub)",
            Way::NodeRedlock => "node-redlock script, retry 10 ± 5 ms",
            Way::BsmObtainMulti => "bsm `ObtainMulti` (`MSETNX`), backoff 2 ms",
            Way::MultiSemaphore => "redis-semaphore `MultiSemaphore`, retry 10 ms",
        }
    }
}

/// One run's figures.
#[derive(Clone, Debug, Default)]
pub struct MultiRun {
    pub acquisitions_per_s: f64,
    pub wait_p99: Duration,
    pub wait_max: Duration,
    pub retries_per_acquisition: f64,
    pub commands_per_acquisition: f64,
    /// Permits only: size → (p99, max) of its waits.
    pub by_size: Vec<(usize, Duration, Duration)>,
    /// No acquisition ended in the window: the waits are the window, at least.
    pub stalled: bool,
}

/// Everything the section measured, per repetition.
#[derive(Default)]
pub struct MultiResults {
    /// (keys per request, way) → one run per repetition.
    pub keys: HashMap<(usize, Way), Vec<MultiRun>>,
    pub permits: HashMap<Way, Vec<MultiRun>>,
}

/// The scripts' SHA1s.
#[derive(Clone)]
struct MultiScripts {
    hash: Scripts,
    redlock_acquire: String,
    redlock_release: String,
    msetnx_acquire: String,
    semaphore_acquire: String,
    semaphore_release: String,
}

impl MultiScripts {
    fn load(server: &Server, hash: &Scripts) -> Res<MultiScripts> {
        let mut con = server.control()?;
        let mut load = |body: &str| -> Res<String> {
            Ok(redis::cmd("SCRIPT").arg("LOAD").arg(body).query(&mut con)?)
        };
        Ok(MultiScripts {
            hash: hash.clone(),
            redlock_acquire: load(REDLOCK_ACQUIRE_LUA)?,
            redlock_release: load(REDLOCK_RELEASE_LUA)?,
            msetnx_acquire: load(MSETNX_ACQUIRE_LUA)?,
            semaphore_acquire: load(SEMAPHORE_ACQUIRE_LUA)?,
            semaphore_release: load(SEMAPHORE_RELEASE_LUA)?,
        })
    }
}

/// Runs the section.
pub fn run(ctx: &Ctx, r: &mut Results) {
    let Some(scripts) = r.attempt("multi: load the scripts", || {
        MultiScripts::load(ctx.server, ctx.scripts)
    }) else {
        return;
    };
    let window = ctx.plan.shared_window;
    for rep in 0..ctx.plan.shared_reps {
        for width in WIDTHS {
            for way in rotated(&Way::KEYS, rep) {
                let what = format!("multi {} × {width} of {KEYS}", way.label());
                let got = r.attempt(&what, || {
                    run_once(ctx.server, &scripts, way, Want::Keys(width), window)
                });
                if let Some(run) = got {
                    report_line(rep, ctx.plan.shared_reps, &what, &run);
                    r.multi.keys.entry((width, way)).or_default().push(run);
                }
            }
        }
        for way in rotated(&Way::PERMITS, rep) {
            let what = format!("permits {} of {LIMIT}", way.label());
            let got = r.attempt(&what, || {
                run_once(ctx.server, &scripts, way, Want::Permits, window)
            });
            if let Some(run) = got {
                report_line(rep, ctx.plan.shared_reps, &what, &run);
                r.multi.permits.entry(way).or_default().push(run);
            }
        }
    }
}

fn report_line(rep: usize, reps: usize, what: &str, run: &MultiRun) {
    eprintln!(
        "  rep {}/{reps} {what:<60} {:>7} acq/s  wait p99 {} max {}  {:.1} retries/acq  {:.1} cmds/acq",
        rep + 1,
        count(run.acquisitions_per_s),
        millis(stats::ms(run.wait_p99)),
        millis(stats::ms(run.wait_max)),
        run.retries_per_acquisition,
        run.commands_per_acquisition,
    );
}

/// What each client asks for.
#[derive(Clone, Copy, Debug)]
enum Want {
    /// This many of the [`KEYS`] locks, drawn at random for each request.
    Keys(usize),
    /// One of [`PERMIT_SIZES`] of the semaphore's [`LIMIT`], drawn likewise.
    Permits,
}

/// One acquisition as a client saw it.
struct Sample {
    size: usize,
    waited: Duration,
    retries: u64,
    in_window: bool,
}

fn lock_key(i: usize) -> String {
    format!("multi:lock:{i}")
}

const SEMAPHORE: &str = "multi:semaphore";

fn run_once(
    server: &Server,
    scripts: &MultiScripts,
    way: Way,
    want: Want,
    window: Duration,
) -> Res<MultiRun> {
    let mut con = server.control()?;
    let mut del = redis::cmd("DEL");
    del.arg(COUNTER).arg(SEMAPHORE);
    for i in 0..KEYS {
        del.arg(lock_key(i));
    }
    del.query::<()>(&mut con)?;
    let run_id = uuid();
    let mut clients = Vec::with_capacity(CLIENTS);
    for t in 0..CLIENTS {
        clients.push(Worker {
            way,
            scripts: scripts.clone(),
            owner: format!("{run_id}:{t}"),
            con: server.conn()?,
            sub: match way {
                Way::RedissonMultiLock => Some(server.conn()?),
                _ => None,
            },
            rng: StdRng::seed_from_u64(t as u64),
        });
    }
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query::<()>(&mut con)?;
    let barrier = Arc::new(Barrier::new(CLIENTS + 1));
    let deadline = Arc::new(OnceLock::<Instant>::new());
    let threads: Vec<_> = clients
        .into_iter()
        .map(|mut w| {
            let barrier = Arc::clone(&barrier);
            let deadline = Arc::clone(&deadline);
            thread::spawn(move || -> io::Result<Vec<Sample>> {
                barrier.wait();
                let Some(&deadline) = deadline.get() else {
                    return Ok(Vec::new());
                };
                let mut samples = Vec::new();
                loop {
                    let wanted = Instant::now();
                    if wanted >= deadline {
                        break;
                    }
                    let request = w.draw(want);
                    let Some(retries) = w.acquire(&request, deadline)? else {
                        break;
                    };
                    let held = Instant::now();
                    w.con.call(&["INCR", COUNTER])?.check("INCR")?;
                    w.release(&request)?;
                    samples.push(Sample {
                        size: request.size(),
                        waited: held - wanted,
                        retries,
                        in_window: held <= deadline,
                    });
                }
                Ok(samples)
            })
        })
        .collect();
    let _ = deadline.set(Instant::now() + window);
    barrier.wait();
    let mut samples = Vec::new();
    for (t, handle) in threads.into_iter().enumerate() {
        match handle.join() {
            Ok(Ok(s)) => samples.extend(s),
            Ok(Err(e)) => return Err(format!("client {t}: {e}").into()),
            Err(_) => return Err(format!("client {t} panicked").into()),
        }
    }
    let calls: u64 = command_calls(&mut con)?.values().sum();
    if samples.is_empty() {
        // Every client stuck past the window (a hold-and-wait cycle): no
        // wait ended, so each lasted the whole window at least.
        return Ok(MultiRun {
            wait_p99: window,
            wait_max: window,
            // No acquisition to divide by: left out of the medians.
            commands_per_acquisition: f64::NAN,
            stalled: true,
            ..MultiRun::default()
        });
    }
    let n = samples.len() as f64;
    let mut waits: Vec<Duration> = samples.iter().map(|s| s.waited).collect();
    waits.sort_unstable();
    let mut by_size = Vec::new();
    if matches!(want, Want::Permits) {
        for size in PERMIT_SIZES {
            let mut w: Vec<Duration> = samples
                .iter()
                .filter(|s| s.size == size)
                .map(|s| s.waited)
                .collect();
            w.sort_unstable();
            if !w.is_empty() {
                by_size.push((size, percentile(&w, 99.0), percentile(&w, 100.0)));
            }
        }
    }
    Ok(MultiRun {
        acquisitions_per_s: samples.iter().filter(|s| s.in_window).count() as f64
            / window.as_secs_f64(),
        wait_p99: percentile(&waits, 99.0),
        wait_max: percentile(&waits, 100.0),
        retries_per_acquisition: samples.iter().map(|s| s.retries).sum::<u64>() as f64 / n,
        commands_per_acquisition: calls as f64 / n,
        by_size,
        stalled: false,
    })
}

/// One request: the keys in the order asked, or a number of permits.
enum Request {
    Keys(Vec<String>),
    Permits(usize),
}

impl Request {
    fn size(&self) -> usize {
        match self {
            Request::Keys(keys) => keys.len(),
            Request::Permits(k) => *k,
        }
    }
}

struct Worker {
    way: Way,
    scripts: MultiScripts,
    owner: String,
    con: Conn,
    /// Redisson's pub/sub connection.
    sub: Option<Conn>,
    rng: StdRng,
}

impl Worker {
    fn draw(&mut self, want: Want) -> Request {
        match want {
            Want::Keys(width) => {
                let mut all: Vec<usize> = (0..KEYS).collect();
                all.shuffle(&mut self.rng);
                Request::Keys(all[..width].iter().map(|&i| lock_key(i)).collect())
            }
            Want::Permits => {
                Request::Permits(PERMIT_SIZES[self.rng.gen_range(0..PERMIT_SIZES.len())])
            }
        }
    }

    fn call(&mut self, args: &[&str]) -> io::Result<Reply> {
        let what = args.first().copied().unwrap_or("");
        self.con.call(args)?.check(what)
    }

    /// Takes what `request` names; `None` if `give_up` came first, else
    /// the attempts that failed on the way.
    fn acquire(&mut self, request: &Request, give_up: Instant) -> io::Result<Option<u64>> {
        match (self.way, request) {
            (Way::Module, _) => self.module_acquire(request, give_up),
            (Way::RedissonMultiLock, Request::Keys(keys)) => self.redisson_lock(keys, give_up),
            (Way::NodeRedlock | Way::BsmObtainMulti, Request::Keys(keys)) => {
                self.scripted_acquire(keys, give_up)
            }
            (Way::MultiSemaphore, Request::Permits(k)) => self.semaphore_acquire(*k, give_up),
            _ => Err(io::Error::other(format!(
                "{} cannot take this request",
                self.way.label()
            ))),
        }
    }

    fn module_acquire(&mut self, request: &Request, give_up: Instant) -> io::Result<Option<u64>> {
        let left = give_up.saturating_duration_since(Instant::now());
        // WAIT 0 would mean "forever": wait at least 1 ms.
        let wait = (left.as_millis() as u64).max(1).to_string();
        let ttl = TTL_MS.to_string();
        let owner = self.owner.clone();
        let reply = match request {
            Request::Keys(keys) => {
                let n = keys.len().to_string();
                let mut args = vec!["LOCK.MACQUIRE", n.as_str()];
                args.extend(keys.iter().map(String::as_str));
                args.extend([owner.as_str(), &ttl, "WAIT", &wait]);
                self.call(&args)?
            }
            Request::Permits(k) => {
                let (limit, k) = (LIMIT.to_string(), k.to_string());
                self.call(&[
                    "LOCK.ACQUIRE",
                    SEMAPHORE,
                    &owner,
                    &ttl,
                    "SHARED",
                    "LIMIT",
                    &limit,
                    "PERMITS",
                    &k,
                    "WAIT",
                    &wait,
                ])?
            }
        };
        Ok(match reply {
            Reply::Nil => None,
            _ => Some(0),
        })
    }

    /// `MultiLock.lock()`: `tryLock` with a wait of 1.5 s per key until it
    /// succeeds.
    fn redisson_lock(&mut self, keys: &[String], give_up: Instant) -> io::Result<Option<u64>> {
        let base = Duration::from_millis(1_500 * keys.len() as u64);
        let mut failed = 0;
        loop {
            let now = Instant::now();
            if now >= give_up {
                return Ok(None);
            }
            if self.redisson_try_lock(keys, (now + base).min(give_up), &mut failed)? {
                return Ok(Some(failed));
            }
        }
    }

    /// `MultiLock.tryLock(wait)`: each key in turn, waiting up to the time
    /// left; a key it cannot get frees the ones it holds and it starts over.
    fn redisson_try_lock(
        &mut self,
        keys: &[String],
        until: Instant,
        failed: &mut u64,
    ) -> io::Result<bool> {
        let mut held = 0;
        while held < keys.len() {
            if self.hash_try_lock(&keys[held], until)? {
                held += 1;
            } else {
                *failed += 1;
                self.hash_unlock(&keys[..held])?;
                held = 0;
            }
            if Instant::now() >= until && held < keys.len() {
                self.hash_unlock(&keys[..held])?;
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The hash recipe's `tryLock(wait)`: try; if busy, subscribe and retry
    /// on each release message or when the holder's lease should end.
    fn hash_try_lock(&mut self, key: &str, until: Instant) -> io::Result<bool> {
        let ttl = TTL_MS.to_string();
        let owner = self.owner.clone();
        let sha = self.scripts.hash.hash_acquire.clone();
        let attempt = |w: &mut Worker| w.call(&["EVALSHA", &sha, "1", key, &ttl, &owner]);
        let first = attempt(self)?;
        if first == Reply::Nil {
            return Ok(true);
        }
        if Instant::now() >= until {
            return Ok(false);
        }
        let chan = channel(key);
        self.sub()?.send(&["SUBSCRIBE", &chan])?;
        let got = loop {
            let reply = attempt(self)?;
            if reply == Reply::Nil {
                break true;
            }
            if Instant::now() >= until {
                break false;
            }
            let pttl = Duration::from_millis(reply.int().unwrap_or(0).max(0) as u64);
            let wake = (Instant::now() + pttl).min(until);
            let sub = self.sub()?;
            while let Some(msg) = sub.read_until(wake)? {
                if msg.is_pubsub("message") {
                    break;
                }
            }
        };
        let sub = self.sub()?;
        sub.send(&["UNSUBSCRIBE", &chan])?;
        while !sub.read()?.is_pubsub("unsubscribe") {}
        Ok(got)
    }

    fn hash_unlock(&mut self, keys: &[String]) -> io::Result<()> {
        let ttl = TTL_MS.to_string();
        let owner = self.owner.clone();
        let sha = self.scripts.hash.hash_release.clone();
        for key in keys {
            self.call(&["EVALSHA", &sha, "1", key, &ttl, &owner])?;
        }
        Ok(())
    }

    fn sub(&mut self) -> io::Result<&mut Conn> {
        self.sub
            .as_mut()
            .ok_or_else(|| io::Error::other("no pub/sub connection"))
    }

    /// node-redlock's and bsm's loop: one all-or-none script, then a sleep.
    fn scripted_acquire(&mut self, keys: &[String], give_up: Instant) -> io::Result<Option<u64>> {
        let sha = match self.way {
            Way::NodeRedlock => self.scripts.redlock_acquire.clone(),
            _ => self.scripts.msetnx_acquire.clone(),
        };
        let n = keys.len().to_string();
        let ttl = TTL_MS.to_string();
        let owner = self.owner.clone();
        let mut args = vec!["EVALSHA", sha.as_str(), n.as_str()];
        args.extend(keys.iter().map(String::as_str));
        args.extend([owner.as_str(), ttl.as_str()]);
        let mut failed = 0;
        loop {
            if !matches!(self.call(&args)?, Reply::Int(0)) {
                return Ok(Some(failed));
            }
            failed += 1;
            let pause = match self.way {
                Way::NodeRedlock => Duration::from_micros(self.rng.gen_range(5_000..=15_000)),
                _ => Duration::from_millis(2),
            };
            if Instant::now() + pause >= give_up {
                return Ok(None);
            }
            thread::sleep(pause);
        }
    }

    fn semaphore_acquire(&mut self, k: usize, give_up: Instant) -> io::Result<Option<u64>> {
        let sha = self.scripts.semaphore_acquire.clone();
        let (limit, k, ttl) = (LIMIT.to_string(), k.to_string(), TTL_MS.to_string());
        let owner = self.owner.clone();
        let mut failed = 0;
        loop {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis())
                .to_string();
            let args = [
                "EVALSHA", &sha, "1", SEMAPHORE, &limit, &k, &owner, &ttl, &now,
            ];
            if matches!(self.call(&args)?, Reply::Int(1)) {
                return Ok(Some(failed));
            }
            failed += 1;
            let pause = Duration::from_millis(10);
            if Instant::now() + pause >= give_up {
                return Ok(None);
            }
            thread::sleep(pause);
        }
    }

    fn release(&mut self, request: &Request) -> io::Result<()> {
        let owner = self.owner.clone();
        match (self.way, request) {
            (Way::Module, Request::Keys(keys)) => {
                let n = keys.len().to_string();
                let mut args = vec!["LOCK.MRELEASE", n.as_str()];
                args.extend(keys.iter().map(String::as_str));
                args.push(&owner);
                self.call(&args)?;
            }
            (Way::Module, Request::Permits(_)) => {
                self.call(&["LOCK.RELEASE", SEMAPHORE, &owner])?;
            }
            (Way::RedissonMultiLock, Request::Keys(keys)) => self.hash_unlock(keys)?,
            (Way::NodeRedlock | Way::BsmObtainMulti, Request::Keys(keys)) => {
                // bsm releases each key with the same compare-and-delete.
                let sha = self.scripts.redlock_release.clone();
                let n = keys.len().to_string();
                let mut args = vec!["EVALSHA", sha.as_str(), n.as_str()];
                args.extend(keys.iter().map(String::as_str));
                args.push(&owner);
                self.call(&args)?;
            }
            (Way::MultiSemaphore, Request::Permits(k)) => {
                let sha = self.scripts.semaphore_release.clone();
                let k = k.to_string();
                self.call(&["EVALSHA", &sha, "1", SEMAPHORE, &owner, &k])?;
            }
            _ => return Err(io::Error::other("a release of what was not taken")),
        }
        Ok(())
    }
}

fn med_of(runs: &[MultiRun], f: impl Fn(&MultiRun) -> f64) -> f64 {
    median(&runs.iter().map(f).collect::<Vec<_>>())
}

/// The section's tables.
pub fn render(r: &Results, out: &mut String) {
    let m = &r.multi;
    if m.keys.is_empty() && m.permits.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "### Several at once: {CLIENTS} clients, each request 2 or 4 of {KEYS} locks (random keys, random order)\n"
    );
    let mut t = Table::new(&[
        "keys per request",
        "way",
        "acquisitions/s",
        "wait p99",
        "wait max",
        "failed attempts per acquisition",
        "server commands per acquisition",
    ]);
    for width in WIDTHS {
        for way in Way::KEYS {
            let Some(runs) = m.keys.get(&(width, way)) else {
                continue;
            };
            // A run in which nothing was acquired waited the whole window:
            // its waits are "at least" that, and the row says how many
            // runs stalled.
            let stalled = runs.iter().filter(|x| x.stalled).count();
            let at_least = if 2 * stalled >= runs.len() {
                "≥ "
            } else {
                ""
            };
            let label = match stalled {
                0 => way.label().to_string(),
                n => format!(
                    "{} — nothing acquired in {n} of {} runs",
                    way.label(),
                    runs.len()
                ),
            };
            t.row(vec![
                width.to_string(),
                label,
                count(med_of(runs, |x| x.acquisitions_per_s)),
                format!(
                    "{at_least}{}",
                    millis(med_of(runs, |x| stats::ms(x.wait_p99)))
                ),
                format!(
                    "{at_least}{}",
                    millis(med_of(runs, |x| stats::ms(x.wait_max)))
                ),
                num(med_of(runs, |x| x.retries_per_acquisition), 1),
                num(med_of(runs, |x| x.commands_per_acquisition), 1),
            ]);
        }
    }
    out.push_str(&t.render());
    let _ = writeln!(
        out,
        "\nMedians over the repetitions; commands count the `INCR` under each hold.\n\n\
         ### Several permits: {CLIENTS} clients asking 1, 2 or 4 of a semaphore's {LIMIT}\n"
    );
    let mut t = Table::new(&[
        "way",
        "acquisitions/s",
        "wait p99 / max, 1 permit",
        "wait p99 / max, 2 permits",
        "wait p99 / max, 4 permits",
        "failed attempts per acquisition",
        "server commands per acquisition",
    ]);
    for way in Way::PERMITS {
        let Some(runs) = m.permits.get(&way) else {
            continue;
        };
        let mut row = vec![
            way.label().to_string(),
            count(med_of(runs, |x| x.acquisitions_per_s)),
        ];
        for size in PERMIT_SIZES {
            let of = |x: &MultiRun, pick: fn(&(usize, Duration, Duration)) -> Duration| {
                x.by_size
                    .iter()
                    .find(|s| s.0 == size)
                    .map_or(f64::NAN, |s| stats::ms(pick(s)))
            };
            row.push(format!(
                "{} / {}",
                millis(med_of(runs, |x| of(x, |s| s.1))),
                millis(med_of(runs, |x| of(x, |s| s.2)))
            ));
        }
        row.push(num(med_of(runs, |x| x.retries_per_acquisition), 1));
        row.push(num(med_of(runs, |x| x.commands_per_acquisition), 1));
        t.row(row);
    }
    out.push_str(&t.render());
    out.push('\n');
}
