//! A crashed holder, and what `EPHEMERAL` holds cost.
//!
//! **Takeover after a crash**: the holder is a process of its own (this
//! bench, started again as [`holder_main`]) that takes the lock and then
//! sits; one waiter of the same kind is already waiting when the holder is
//! killed with `SIGKILL`, so its socket closes the way a crash closes it
//! (the kernel's close, nothing from the client). The figure is the time
//! from the kill to the waiter's grant. The module with `EPHEMERAL` ends the
//! hold when the connection closes; every other lock waits for the lease.
//!
//! **Pairs**: acquire + release on distinct keys, the module with and
//! without `EPHEMERAL`, from the bench's own clients: `redis-benchmark`
//! cannot measure it, as its acquire run's connections close (and end
//! every ephemeral hold) before the release run starts.
//!
//! **Churn**: clients that connect, take one lock and die without
//! releasing, on distinct names or on one name; total time until the server
//! holds no lock, and server CPU per client.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::locks::{channel, Client, Kind, Scripts, Waiting};
use crate::resp::{Conn, Reply};
use crate::server::{forget_child, server_cpu_seconds, track_child, Server};
use crate::stats::uuid;
use crate::Res;

/// Set in a holder process's environment: the server's port.
const HOLDER_PORT_ENV: &str = "LOCKBENCH_HOLDER_PORT";
/// A waiter that has not got the lock this long after the lease end fails.
const GIVE_UP_AFTER_LEASE: Duration = Duration::from_secs(3);
/// How long a waiter may take to start waiting, a holder to take the lock.
const SETTLE: Duration = Duration::from_secs(5);

/// Whether this build answers `LOCK.ACQUIRE … EPHEMERAL` with a fence.
pub fn module_has_ephemeral(con: &mut Conn) -> io::Result<bool> {
    let key = format!("probe:ephemeral:{}", uuid());
    let reply = con.call(&["LOCK.ACQUIRE", &key, "probe", "1000", "EPHEMERAL"])?;
    con.call(&["DEL", &key])?;
    Ok(matches!(reply, Reply::Int(_)))
}

/// Whether an ephemeral hold of a connection that closes ends within a
/// second (of a 10 s lease): a build may accept the word before it binds
/// holds to connections, and its figures would then be lease-end ones.
pub fn ephemeral_ends_on_close(server: &Server) -> Res<bool> {
    let key = format!("probe:ephemeral:{}", uuid());
    let mut holder = server.conn()?;
    let reply = holder.call(&["LOCK.ACQUIRE", &key, "probe", "10000", "EPHEMERAL"])?;
    if !matches!(reply, Reply::Int(_)) {
        return Err(format!("EPHEMERAL probe: LOCK.ACQUIRE answered {reply:?}").into());
    }
    drop(holder);
    let mut control = server.conn()?;
    let deadline = Instant::now() + Duration::from_secs(1);
    let ended = loop {
        if control.call(&["EXISTS", &key])?.int() == Some(0) {
            break true;
        }
        if Instant::now() > deadline {
            break false;
        }
        thread::sleep(Duration::from_millis(1));
    };
    control.call(&["DEL", &key])?;
    Ok(ended)
}

/// Who holds the lock when the holder crashes, and how the waiter waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Subject {
    /// The module, the holder's acquire with `EPHEMERAL`; the waiter `WAIT`s.
    ModuleEphemeral,
    /// Any lock of [`Waiting::ALL`]: taken over at the lease end.
    Lease(Waiting),
}

impl Subject {
    pub fn label(self) -> String {
        match self {
            Subject::ModuleEphemeral => "module, EPHEMERAL (WAIT)".into(),
            Subject::Lease(w) => w.label(),
        }
    }

    fn waiting(self) -> Waiting {
        match self {
            Subject::ModuleEphemeral => Waiting::ModuleWait,
            Subject::Lease(w) => w,
        }
    }

    /// The holder's acquire command.
    fn holder_command(self, scripts: &Scripts, key: &str, owner: &str, ttl_ms: u64) -> Vec<String> {
        let mut args = self
            .waiting()
            .kind()
            .acquire(scripts, key, owner, &ttl_ms.to_string());
        if self == Subject::ModuleEphemeral {
            args.push("EPHEMERAL".into());
        }
        args
    }
}

/// The holder process: when [`HOLDER_PORT_ENV`] is set, this binary
/// connects, sends its arguments as one command, prints `took` (or why
/// not) and then waits for its stdin to close, or to be killed.
pub fn holder_main() -> Option<ExitCode> {
    let port: u16 = std::env::var(HOLDER_PORT_ENV).ok()?.parse().ok()?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut out = io::stdout();
    let took = Conn::connect(port).and_then(|mut con| {
        let reply = con.call(&args)?;
        let kind = if args.first() == Some(&"LOCK.ACQUIRE") {
            Kind::Module
        } else if args.first() == Some(&"SET") {
            Kind::StringRecipe
        } else {
            Kind::HashRecipe
        };
        Ok((con, kind.took(&reply), reply))
    });
    match took {
        Ok((con, true, _)) => {
            let _ = writeln!(out, "took");
            let _ = out.flush();
            // Hold the connection until killed (or the bench goes away).
            let _ = io::stdin().read_to_end(&mut Vec::new());
            drop(con);
            Some(ExitCode::SUCCESS)
        }
        Ok((_, false, reply)) => {
            let _ = writeln!(out, "refused: {reply:?}");
            Some(ExitCode::FAILURE)
        }
        Err(e) => {
            let _ = writeln!(out, "error: {e}");
            Some(ExitCode::FAILURE)
        }
    }
}

/// A running holder process.
struct Holder {
    child: Child,
    took_at: Instant,
}

impl Holder {
    fn start(port: u16, command: &[String]) -> Res<Holder> {
        let mut child = Command::new(std::env::current_exe()?)
            .env(HOLDER_PORT_ENV, port.to_string())
            .args(command)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        track_child(child.id());
        let mut line = String::new();
        let stdout = child.stdout.take().ok_or("no stdout pipe")?;
        BufReader::new(stdout).read_line(&mut line)?;
        let took_at = Instant::now();
        let holder = Holder { child, took_at };
        if line.trim() != "took" {
            return Err(format!(
                "the holder process ({}): {}",
                command.join(" "),
                line.trim()
            )
            .into());
        }
        Ok(holder)
    }

    /// `SIGKILL`; the instant just before it.
    fn kill(&mut self) -> Instant {
        let at = Instant::now();
        let _ = self.child.kill();
        at
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        forget_child(self.child.id());
    }
}

/// Whether the waiter on `key` (client id `id`) is waiting now.
fn waiting_now(control: &mut Conn, waiting: Waiting, key: &str, id: i64) -> io::Result<bool> {
    if waiting == Waiting::PubSub {
        let reply = control.call(&["PUBSUB", "NUMSUB", &channel(key)])?;
        return Ok(
            matches!(reply, Reply::Array(v) if v.get(1).and_then(Reply::int).unwrap_or(0) > 0),
        );
    }
    let line = match control.call(&["CLIENT", "LIST", "ID", &id.to_string()])? {
        Reply::Bulk(b) => String::from_utf8_lossy(&b).into_owned(),
        Reply::Status(s) => s,
        other => return Err(io::Error::other(format!("CLIENT LIST answered {other:?}"))),
    };
    let field = |name: &str| {
        line.split_whitespace()
            .find_map(|f| f.strip_prefix(name))
            .unwrap_or("")
            .to_string()
    };
    Ok(match waiting {
        // Blocked in the server's queue.
        Waiting::ModuleWait => field("flags=").contains('b'),
        // Its first try was refused: it is in its sleep-and-retry loop.
        _ => field("cmd=") == "set",
    })
}

/// One trial's figures for one subject.
#[derive(Clone, Copy, Debug)]
pub struct Takeover {
    /// From the kill to the waiter's grant.
    pub after_kill_ms: f64,
    /// How long the holder held before it was killed.
    pub held_ms: f64,
}

/// One trial: every subject at once, each on its own key with its own
/// holder process and waiter; once all wait, the holders are killed in the
/// order given.
pub fn trial(
    server: &Server,
    scripts: &Scripts,
    subjects: &[Subject],
    ttl_ms: u64,
) -> Vec<(Subject, Res<Takeover>)> {
    let mut setup = Vec::new();
    let mut out = Vec::new();
    for &s in subjects {
        match start_one(server, scripts, s, ttl_ms) {
            Ok(running) => setup.push((s, running)),
            Err(e) => out.push((s, Err(e))),
        }
    }
    let mut killed = Vec::new();
    for (s, (mut holder, waiter)) in setup {
        let at = holder.kill();
        let held_ms = (at - holder.took_at).as_secs_f64() * 1e3;
        killed.push((s, holder, waiter, at, held_ms));
    }
    for (s, holder, waiter, at, held_ms) in killed {
        let got = match waiter.recv() {
            Ok(Ok(granted)) => Ok(Takeover {
                after_kill_ms: granted.saturating_duration_since(at).as_secs_f64() * 1e3,
                held_ms,
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(format!("{}: the waiter thread died", s.label()).into()),
        };
        drop(holder);
        out.push((s, got));
    }
    out
}

type Granted = mpsc::Receiver<Res<Instant>>;

/// Starts a holder process on a fresh key and a waiter thread; returns once
/// the waiter waits.
fn start_one(
    server: &Server,
    scripts: &Scripts,
    s: Subject,
    ttl_ms: u64,
) -> Res<(Holder, Granted)> {
    let key = format!("crash:{}", uuid());
    let command = s.holder_command(scripts, &key, &format!("{}:1", uuid()), ttl_ms);
    let holder = Holder::start(server.port, &command)?;
    let waiting = s.waiting();
    let mut waiter = Client::connect(
        server.port,
        waiting,
        scripts,
        &key,
        &format!("{}:1", uuid()),
        10_000,
    )?;
    let id = waiter
        .call(&["CLIENT", "ID"])?
        .int()
        .ok_or("CLIENT ID: no integer")?;
    let give_up = holder.took_at + Duration::from_millis(ttl_ms) + GIVE_UP_AFTER_LEASE;
    let (tx, rx) = mpsc::channel();
    let label = s.label();
    thread::spawn(move || {
        let got = waiter.acquire(give_up).map_err(Into::into).and_then(|got| {
            let at = Instant::now();
            if !got {
                return Err(format!(
                    "{label}: no takeover by {GIVE_UP_AFTER_LEASE:?} after the lease end"
                )
                .into());
            }
            waiter.release()?;
            Ok(at)
        });
        let _ = tx.send(got);
    });
    let mut control = server.conn()?;
    let deadline = Instant::now() + SETTLE;
    while !waiting_now(&mut control, waiting, &key, id)? {
        if Instant::now() > deadline {
            return Err(format!(
                "{}: the waiter did not start waiting within {SETTLE:?}",
                s.label()
            )
            .into());
        }
        thread::sleep(Duration::from_micros(200));
    }
    Ok((holder, rx))
}

/// One run of uncontended pairs.
#[derive(Clone, Copy, Debug)]
pub struct Pairs {
    pub pairs_per_s: f64,
    /// Server main-thread CPU per pair, microseconds.
    pub cpu_us_per_pair: f64,
}

/// Connections (one thread each) of a pair run.
pub const PAIR_CLIENTS: usize = 8;

/// `n` acquire + release pairs on distinct keys, from [`PAIR_CLIENTS`]
/// connections, `pipeline` commands in flight on each (an acquire and its
/// release travel in the same batch).
pub fn pairs(server: &Server, ephemeral: bool, pipeline: usize, n: usize) -> Res<Pairs> {
    let mut control = server.control()?;
    let cpu_before = server_cpu_seconds(&mut control)?;
    let per_client = n / PAIR_CLIENTS;
    let per_batch = (pipeline / 2).max(1);
    let mut cons = Vec::new();
    for _ in 0..PAIR_CLIENTS {
        cons.push(server.conn()?);
    }
    let started = Instant::now();
    let threads: Vec<_> = cons
        .into_iter()
        .map(|mut con| {
            thread::spawn(move || -> io::Result<()> {
                let owner = format!("{}:1", uuid());
                let prefix = uuid();
                let mut done = 0;
                while done < per_client {
                    let batch = per_batch.min(per_client - done);
                    let keys: Vec<String> = (done..done + batch)
                        .map(|i| format!("pair:{prefix}:{i}"))
                        .collect();
                    for key in &keys {
                        let mut acquire = vec!["LOCK.ACQUIRE", key, &owner, "600000"];
                        if ephemeral {
                            acquire.push("EPHEMERAL");
                        }
                        con.queue(&acquire);
                        if pipeline == 1 {
                            con.flush()?;
                            expect(con.read()?, "acquire", |r| matches!(r, Reply::Int(_)))?;
                        }
                        con.queue(&["LOCK.RELEASE", key, &owner]);
                        if pipeline == 1 {
                            con.flush()?;
                            expect(con.read()?, "release", |r| *r == Reply::Int(0))?;
                        }
                    }
                    if pipeline > 1 {
                        con.flush()?;
                        for _ in 0..batch {
                            expect(con.read()?, "acquire", |r| matches!(r, Reply::Int(_)))?;
                            expect(con.read()?, "release", |r| *r == Reply::Int(0))?;
                        }
                    }
                    done += batch;
                }
                Ok(())
            })
        })
        .collect();
    for t in threads {
        t.join().map_err(|_| "a pair client panicked")??;
    }
    let took = started.elapsed().as_secs_f64();
    let cpu = server_cpu_seconds(&mut control)? - cpu_before;
    let total = (per_client * PAIR_CLIENTS) as f64;
    Ok(Pairs {
        pairs_per_s: total / took,
        cpu_us_per_pair: cpu * 1e6 / total,
    })
}

fn expect(reply: Reply, what: &str, ok: impl Fn(&Reply) -> bool) -> io::Result<()> {
    if ok(&reply) {
        Ok(())
    } else {
        Err(io::Error::other(format!("{what} answered {reply:?}")))
    }
}

/// What a churn client takes before it dies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChurnLock {
    /// `LOCK.ACQUIRE … EPHEMERAL` with a long lease: the disconnect ends it.
    ModuleEphemeral,
    /// `LOCK.ACQUIRE` with [`CHURN_LEASE_MS`]: the lease ends it.
    Module,
    /// `SET NX PX` [`CHURN_LEASE_MS`]: the key's expiry ends it.
    SetNxPx,
}

impl ChurnLock {
    pub const ALL: [ChurnLock; 3] = [
        ChurnLock::ModuleEphemeral,
        ChurnLock::Module,
        ChurnLock::SetNxPx,
    ];

    pub fn label(self) -> &'static str {
        match self {
            ChurnLock::ModuleEphemeral => "module, EPHEMERAL (lease 60 s)",
            ChurnLock::Module => "module, lease 200 ms",
            ChurnLock::SetNxPx => "SET NX PX 200",
        }
    }
}

/// The lease of the churn runs whose holds end with it.
pub const CHURN_LEASE_MS: u64 = 200;
/// Threads the churn clients are spread over (each runs its clients in turn).
const CHURN_THREADS: usize = 4;

/// One churn run.
#[derive(Clone, Copy, Debug)]
pub struct Churn {
    /// Clients that got their lock (on one name, most find it taken).
    pub granted: usize,
    /// From the first connect to the last client's death.
    pub clients_s: f64,
    /// From the first connect to the server holding no lock.
    pub all_gone_s: f64,
    /// Server main-thread CPU per client, microseconds, over `all_gone_s`.
    pub cpu_us_per_client: f64,
}

/// `clients` clients connect, take `lock` (on one shared name or each its
/// own) and close their connection without releasing.
pub fn churn(server: &Server, lock: ChurnLock, one_name: bool, clients: usize) -> Res<Churn> {
    let mut control = server.conn()?;
    if control.call(&["DBSIZE"])?.int() != Some(0) {
        return Err("churn: the server is not empty before the run".into());
    }
    let mut cpu_con = server.control()?;
    let cpu_before = server_cpu_seconds(&mut cpu_con)?;
    let port = server.port;
    let run = uuid();
    let started = Instant::now();
    let threads: Vec<_> = (0..CHURN_THREADS)
        .map(|t| {
            let run = run.clone();
            thread::spawn(move || -> io::Result<usize> {
                let mut granted = 0;
                for i in (t..clients).step_by(CHURN_THREADS) {
                    let key = if one_name {
                        format!("churn:{run}")
                    } else {
                        format!("churn:{run}:{i}")
                    };
                    let owner = format!("{run}:{i}");
                    let lease = CHURN_LEASE_MS.to_string();
                    let mut con = Conn::connect(port)?;
                    let reply = match lock {
                        ChurnLock::ModuleEphemeral => {
                            con.call(&["LOCK.ACQUIRE", &key, &owner, "60000", "EPHEMERAL"])?
                        }
                        ChurnLock::Module => con.call(&["LOCK.ACQUIRE", &key, &owner, &lease])?,
                        ChurnLock::SetNxPx => {
                            con.call(&["SET", &key, &owner, "NX", "PX", &lease])?
                        }
                    };
                    granted += usize::from(
                        matches!(reply, Reply::Int(_)) || reply == Reply::Status("OK".into()),
                    );
                    // Dies: the connection closes with the lock still held.
                    drop(con);
                }
                Ok(granted)
            })
        })
        .collect();
    let mut granted = 0;
    for t in threads {
        granted += t.join().map_err(|_| "a churn client thread panicked")??;
    }
    let clients_s = started.elapsed().as_secs_f64();
    let deadline = Instant::now() + Duration::from_millis(CHURN_LEASE_MS) + Duration::from_secs(20);
    loop {
        if control.call(&["DBSIZE"])?.int() == Some(0) {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "churn {}: locks still held 20 s after the lease end",
                lock.label()
            )
            .into());
        }
        thread::sleep(Duration::from_millis(2));
    }
    let all_gone_s = started.elapsed().as_secs_f64();
    let cpu = server_cpu_seconds(&mut cpu_con)? - cpu_before;
    Ok(Churn {
        granted,
        clients_s,
        all_gone_s,
        cpu_us_per_client: cpu * 1e6 / clients as f64,
    })
}
