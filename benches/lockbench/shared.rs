//! Shared holds: read-write locks and semaphores, the recipes of
//! [`crate::shared_recipes`] (and the module, once it has them).
//!
//! **Throughput runs**: C clients on one lock, each looping: pick a mode
//! (read or write by the scenario's mix, or a permit), acquire (recipes poll
//! every 1 ms; the module waits in the server's queue), `INCR` a counter,
//! work 1 ms (a sleep), release. The work makes sharing visible: one client
//! at a time would make at most ~1,000 acquisitions/s. The `INCR` numbers the
//! acquisitions, as in the contended section, for "same client again".
//!
//! **Stress check**: the same loop with a 100 ms lease, where each hold
//! writes to a shared log (a Redis list, so its order is the server's) when
//! it begins and when it ends; one hold in [`STALL_ONE_IN`] stalls 250 ms
//! before its second write, as a process stopped by `SIGSTOP` or a long GC
//! pause would, well past its lease. A checked client first asks the recipe
//! whether it still holds (its renewal, which also extends the lease by a
//! full one) and writes only if so; an unchecked one (the control) trusts
//! its lease and writes anyway. Reading the log back, a hold spans from its
//! first write to its last; a write is a violation when a conflicting hold
//! spans it (a writer beside anyone, a reader beside a writer, more than the
//! limit of permits). The control shows the check can see violations: the
//! holds that took a stalled holder's place begin and end inside its span.
//!
//! A checked client can still overlap if it stalls between its check and
//! its write for longer than the lease the check renewed; only a fence
//! checked by the resource closes that gap.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Barrier, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use rand::Rng;

use crate::resp::Reply;
use crate::server::{command_calls, Server};
use crate::shared_recipes::{Mode, Recipe, SharedClient, SharedScripts};
use crate::stats::percentile;
use crate::Res;

const KEY: &str = "shared:lock";
const COUNTER: &str = "shared:counter";
const LOG: &str = "shared:log";
/// Lease of a throughput run's holds: every holder releases long before.
const TTL_MS: u64 = 10_000;
/// The simulated work under the lock.
const WORK: Duration = Duration::from_millis(1);
/// The stress check's lease, and how long a stalled holder sleeps.
pub const STRESS_LEASE_MS: u64 = 100;
pub const STALL: Duration = Duration::from_millis(250);
/// One hold in this many stalls.
pub const STALL_ONE_IN: u32 = 100;

/// A workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scenario {
    /// 90% reads, 10% writes, 16 clients.
    ReadHeavy,
    /// 10% reads, 90% writes, 16 clients.
    WriteHeavy,
    /// 8 permits, 32 clients.
    Semaphore,
}

impl Scenario {
    pub const ALL: [Scenario; 3] = [
        Scenario::ReadHeavy,
        Scenario::WriteHeavy,
        Scenario::Semaphore,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Scenario::ReadHeavy => "90% read / 10% write, 16 clients",
            Scenario::WriteHeavy => "10% read / 90% write, 16 clients",
            Scenario::Semaphore => "semaphore, 8 permits, 32 clients",
        }
    }

    pub fn clients(self) -> usize {
        match self {
            Scenario::ReadHeavy | Scenario::WriteHeavy => 16,
            Scenario::Semaphore => 32,
        }
    }

    /// Permits of the semaphore (holders allowed at once).
    pub fn limit(self) -> usize {
        match self {
            Scenario::Semaphore => 8,
            _ => 1,
        }
    }

    /// The recipes that implement it (the module is added when it can).
    pub fn recipes(self) -> &'static [Recipe] {
        match self {
            Scenario::ReadHeavy | Scenario::WriteHeavy => &[Recipe::RedissonRw],
            Scenario::Semaphore => &[Recipe::RedissonPermits, Recipe::RedisSemaphore],
        }
    }

    fn pick(self, rng: &mut impl Rng) -> Mode {
        match self {
            Scenario::ReadHeavy if rng.gen_bool(0.9) => Mode::Read,
            Scenario::WriteHeavy if rng.gen_bool(0.1) => Mode::Read,
            Scenario::ReadHeavy | Scenario::WriteHeavy => Mode::Write,
            Scenario::Semaphore => Mode::Permit,
        }
    }
}

/// One throughput run's figures.
#[derive(Clone, Debug)]
pub struct SharedRun {
    /// Acquisitions made inside the run's window, per second.
    pub acquisitions_per_s: f64,
    pub wait_p50: Duration,
    pub wait_p99: Duration,
    pub wait_max: Duration,
    /// The writes' own waits (none in a semaphore run).
    pub write_wait_p99: Option<Duration>,
    pub write_wait_max: Option<Duration>,
    /// Server command calls (scripts' inner calls included) per acquisition.
    pub commands_per_acquisition: f64,
    /// Share of acquisitions by the client that made the one before.
    pub same_client_share: f64,
    /// Acquisitions of the client that made fewest ÷ of the one that made most.
    pub spread: f64,
    /// Clients still waiting when the window closed, and the longest of their waits.
    pub unserved: usize,
    pub unserved_longest: Duration,
}

/// One acquisition as a client saw it.
struct Sample {
    order: i64,
    mode: Mode,
    waited: Duration,
    in_window: bool,
}

/// What one client thread brings back.
#[derive(Default)]
struct Tally {
    samples: Vec<Sample>,
    /// The wait still going on when the window closed.
    unserved: Option<Duration>,
}

/// Connects `clients` clients of `recipe` to a fresh lock.
fn connect(
    server: &Server,
    scripts: &Arc<SharedScripts>,
    recipe: Recipe,
    scenario: Scenario,
    lease_ms: u64,
) -> Res<Vec<SharedClient>> {
    let mut con = server.conn()?;
    con.call(&["DEL", KEY, COUNTER, LOG])?.check("DEL")?;
    SharedClient::reset(&mut con, recipe, KEY, scenario.limit())?;
    let mut clients = Vec::with_capacity(scenario.clients());
    for _ in 0..scenario.clients() {
        clients.push(SharedClient::connect(
            server.port,
            recipe,
            scripts,
            KEY,
            lease_ms,
            scenario.limit(),
        )?);
    }
    Ok(clients)
}

/// Starts one thread per client, all released at once by a barrier with
/// the run's deadline; returns their results.
fn run_clients<T: Send + 'static>(
    clients: Vec<SharedClient>,
    window: Duration,
    body: impl Fn(usize, &mut SharedClient, Instant) -> std::io::Result<T> + Send + Sync + 'static,
) -> Res<Vec<T>> {
    let barrier = Arc::new(Barrier::new(clients.len() + 1));
    let deadline = Arc::new(OnceLock::<Instant>::new());
    let body = Arc::new(body);
    let threads: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(t, mut client)| {
            let (barrier, deadline, body) = (
                Arc::clone(&barrier),
                Arc::clone(&deadline),
                Arc::clone(&body),
            );
            thread::spawn(move || -> std::io::Result<Option<T>> {
                barrier.wait();
                match deadline.get() {
                    Some(&deadline) => body(t, &mut client, deadline).map(Some),
                    None => Ok(None),
                }
            })
        })
        .collect();
    let _ = deadline.set(Instant::now() + window);
    barrier.wait();
    let mut out = Vec::new();
    let mut failure = None;
    for (t, handle) in threads.into_iter().enumerate() {
        match handle.join() {
            Ok(Ok(Some(v))) => out.push(v),
            Ok(Ok(None)) => failure = Some(format!("client {t} never started")),
            Ok(Err(e)) => failure = Some(format!("client {t}: {e}")),
            Err(_) => failure = Some(format!("client {t} panicked")),
        }
    }
    match failure {
        Some(why) => Err(why.into()),
        None => Ok(out),
    }
}

/// One throughput run of `recipe` on `scenario` for `window`.
pub fn throughput(
    server: &Server,
    scripts: &Arc<SharedScripts>,
    recipe: Recipe,
    scenario: Scenario,
    window: Duration,
) -> Res<SharedRun> {
    let clients = connect(server, scripts, recipe, scenario, TTL_MS)?;
    let mut control = server.control()?;
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query::<()>(&mut control)?;
    let tallies = run_clients(clients, window, move |_, client, deadline| {
        let mut rng = rand::thread_rng();
        let mut tally = Tally::default();
        loop {
            let wanted = Instant::now();
            if wanted >= deadline {
                break;
            }
            let mode = scenario.pick(&mut rng);
            if !client.acquire(mode, deadline)? {
                tally.unserved = Some(wanted.elapsed());
                break;
            }
            let held = Instant::now();
            let order = client.call(&["INCR", COUNTER])?.int().unwrap_or(-1);
            thread::sleep(WORK);
            if !client.release()? {
                return Err(std::io::Error::other(format!(
                    "{} lost a {} hold within its {TTL_MS} ms lease",
                    recipe.label(),
                    mode.label()
                )));
            }
            tally.samples.push(Sample {
                order,
                mode,
                waited: held - wanted,
                in_window: held <= deadline,
            });
        }
        Ok(tally)
    })
    .map_err(|e| format!("{} on {}: {e}", recipe.label(), scenario.label()))?;
    let total_calls: u64 = command_calls(&mut control)?.values().sum();

    let mut history = Vec::new();
    let (mut waits, mut write_waits) = (Vec::new(), Vec::new());
    let mut per_client = Vec::new();
    let mut in_window = 0usize;
    let (mut unserved, mut unserved_longest) = (0, Duration::ZERO);
    for (t, tally) in tallies.into_iter().enumerate() {
        per_client.push(tally.samples.len());
        if let Some(w) = tally.unserved {
            unserved += 1;
            unserved_longest = unserved_longest.max(w);
        }
        for s in tally.samples {
            history.push((s.order, t));
            waits.push(s.waited);
            if s.mode == Mode::Write {
                write_waits.push(s.waited);
            }
            in_window += usize::from(s.in_window);
        }
    }
    let acquisitions = history.len();
    if acquisitions == 0 {
        return Err(format!("{} on {}: no acquisition", recipe.label(), scenario.label()).into());
    }
    history.sort_unstable();
    let repeats = history.windows(2).filter(|w| w[0].1 == w[1].1).count();
    waits.sort_unstable();
    write_waits.sort_unstable();
    let writes = (!write_waits.is_empty()).then_some(&write_waits);
    let (least, most) = (
        per_client.iter().copied().min().unwrap_or(0),
        per_client.iter().copied().max().unwrap_or(0),
    );
    Ok(SharedRun {
        acquisitions_per_s: in_window as f64 / window.as_secs_f64(),
        wait_p50: percentile(&waits, 50.0),
        wait_p99: percentile(&waits, 99.0),
        wait_max: percentile(&waits, 100.0),
        write_wait_p99: writes.map(|w| percentile(w, 99.0)),
        write_wait_max: writes.map(|w| percentile(w, 100.0)),
        commands_per_acquisition: total_calls as f64 / acquisitions as f64,
        same_client_share: repeats as f64 / (acquisitions.max(2) - 1) as f64,
        spread: least as f64 / most.max(1) as f64,
        unserved,
        unserved_longest,
    })
}

/// One stress run's counts.
#[derive(Clone, Debug, Default)]
pub struct StressRun {
    pub holds: usize,
    pub stalls: usize,
    /// Stalled holds whose check said the hold was gone (no second write).
    pub losses_seen: usize,
    /// Releases the recipe answered "not held" to.
    pub lost_releases: usize,
    pub writes: usize,
    /// Writes made while a conflicting hold spanned them.
    pub overlapping_writes: usize,
    /// Holds that began while a conflicting hold was open: a writer beside
    /// anyone, a reader beside a writer, more than the limit of permits.
    pub conflicting_begins: usize,
    /// Holds whose span overlapped a conflicting hold's, and how many of
    /// them had stalled.
    pub overlapped_holds: usize,
    pub overlapped_stalled: usize,
    /// The most holds open at once (the permits in use, for a semaphore).
    pub most_open: usize,
}

/// One stress run: `checked` clients check their hold before the second
/// write; unchecked ones (the control) do not.
pub fn stress(
    server: &Server,
    scripts: &Arc<SharedScripts>,
    recipe: Recipe,
    scenario: Scenario,
    checked: bool,
    window: Duration,
) -> Res<StressRun> {
    let clients = connect(server, scripts, recipe, scenario, STRESS_LEASE_MS)?;
    let counts = run_clients(clients, window, move |t, client, deadline| {
        let mut rng = rand::thread_rng();
        let mut run = StressRun::default();
        let mut hold = 0u64;
        let log = |client: &mut SharedClient, hold: u64, event: &str, mode: Mode| {
            let entry = format!("{t} {hold} {event} {}", mode.label());
            client.call(&["RPUSH", LOG, &entry]).map(drop)
        };
        while Instant::now() < deadline {
            let mode = scenario.pick(&mut rng);
            if !client.acquire(mode, deadline)? {
                break;
            }
            hold += 1;
            run.holds += 1;
            log(client, hold, "begin", mode)?;
            let stall = rng.gen_ratio(1, STALL_ONE_IN);
            run.stalls += usize::from(stall);
            thread::sleep(if stall { STALL } else { WORK });
            let after = if stall { "-after-stall" } else { "" };
            if checked && !client.still_holds()? {
                run.losses_seen += 1;
                log(client, hold, &format!("lost{after}"), mode)?;
            } else {
                log(client, hold, &format!("end{after}"), mode)?;
            }
            run.lost_releases += usize::from(!client.release()?);
        }
        Ok(run)
    })
    .map_err(|e| format!("{} stress on {}: {e}", recipe.label(), scenario.label()))?;
    let mut total = StressRun::default();
    for c in counts {
        total.holds += c.holds;
        total.stalls += c.stalls;
        total.losses_seen += c.losses_seen;
        total.lost_releases += c.lost_releases;
    }
    let mut con = server.conn()?;
    let entries = match con.call(&["LRANGE", LOG, "0", "-1"])?.check("LRANGE")? {
        Reply::Array(items) => items,
        other => return Err(format!("LRANGE {LOG} answered {other:?}").into()),
    };
    let mut events = Vec::with_capacity(entries.len());
    for e in entries {
        let Reply::Bulk(text) = e else {
            return Err(format!("a log entry is {e:?}").into());
        };
        events.push(Event::parse(&String::from_utf8_lossy(&text))?);
    }
    let found = analyse(&events, scenario.limit());
    total.writes = found.writes;
    total.overlapping_writes = found.overlapping_writes;
    total.conflicting_begins = found.conflicting_begins;
    total.overlapped_holds = found.overlapped.len();
    total.overlapped_stalled = found.overlapped_stalled;
    total.most_open = found.most_open;
    con.call(&["DEL", LOG])?;
    Ok(total)
}

/// One entry of the shared log: client, its hold number, what happened.
struct Event {
    hold: (usize, u64),
    kind: EventKind,
    mode: Mode,
    /// The hold stalled before this (its second) entry.
    stalled: bool,
}

#[derive(PartialEq)]
enum EventKind {
    Begin,
    End,
    /// The check said the hold was gone: no write.
    Lost,
}

impl Event {
    fn parse(text: &str) -> Res<Event> {
        let bad = || format!("a log entry reads {text:?}");
        let mut words = text.split(' ');
        let client = words.next().and_then(|w| w.parse().ok()).ok_or_else(bad)?;
        let hold = words.next().and_then(|w| w.parse().ok()).ok_or_else(bad)?;
        let event = words.next().ok_or_else(bad)?;
        let (event, stalled) = match event.strip_suffix("-after-stall") {
            Some(e) => (e, true),
            None => (event, false),
        };
        let kind = match event {
            "begin" => EventKind::Begin,
            "end" => EventKind::End,
            "lost" => EventKind::Lost,
            _ => return Err(bad().into()),
        };
        let mode = match words.next() {
            Some("read") => Mode::Read,
            Some("write") => Mode::Write,
            Some("permit") => Mode::Permit,
            _ => return Err(bad().into()),
        };
        Ok(Event {
            hold: (client, hold),
            kind,
            mode,
            stalled,
        })
    }
}

/// What the log shows.
#[derive(Default, Debug)]
struct Findings {
    writes: usize,
    overlapping_writes: usize,
    conflicting_begins: usize,
    /// Holds in any conflict: the writer's and those open beside it.
    overlapped: HashSet<(usize, u64)>,
    overlapped_stalled: usize,
    most_open: usize,
}

/// Replays the log in the server's order. A hold is open from its first
/// write to its last (a hold whose check failed wrote once: it closes at
/// once); at each write, the holds open beside it must not conflict with it.
fn analyse(events: &[Event], limit: usize) -> Findings {
    let mut last_write = HashMap::new();
    let mut stalled = HashSet::new();
    for (i, e) in events.iter().enumerate() {
        if e.kind != EventKind::Lost {
            last_write.insert(e.hold, i);
        }
        if e.stalled {
            stalled.insert(e.hold);
        }
    }
    let mut open: HashMap<(usize, u64), Mode> = HashMap::new();
    let mut f = Findings::default();
    for (i, e) in events.iter().enumerate() {
        if e.kind == EventKind::Lost {
            continue;
        }
        if e.kind == EventKind::Begin {
            open.insert(e.hold, e.mode);
        }
        f.writes += 1;
        f.most_open = f.most_open.max(open.len());
        let mut others = open.iter().filter(|(h, _)| **h != e.hold).map(|(_, m)| *m);
        let conflict = match e.mode {
            Mode::Write => others.next().is_some(),
            Mode::Read => others.any(|m| m == Mode::Write),
            Mode::Permit => open.len() > limit,
        };
        if conflict {
            f.overlapping_writes += 1;
            if e.kind == EventKind::Begin {
                f.conflicting_begins += 1;
            }
            f.overlapped.insert(e.hold);
            for (h, m) in &open {
                let clash = match e.mode {
                    Mode::Read => *m == Mode::Write,
                    Mode::Write | Mode::Permit => true,
                };
                if clash {
                    f.overlapped.insert(*h);
                }
            }
        }
        if last_write.get(&e.hold) == Some(&i) {
            open.remove(&e.hold);
        }
    }
    f.overlapped_stalled = stalled.intersection(&f.overlapped).count();
    f
}
