//! Shared holds under stress, with real processes
//! (`examples/shared_worker.rs`) and faults made on purpose: the test
//! `SIGSTOP`s workers while they hold, past their lease, and `SIGCONT`s them
//! once another hold has used the store (they wake believing they still hold
//! and carry on), and `SIGKILL`s others while they hold (a new worker takes
//! the slot).
//!
//! Every operation goes through a script in the server (the worker's
//! `STORE`): a fenced store and its log. A write is accepted only with a
//! fence at or above every fence the store has seen (readers register theirs
//! as they read), a read only with a fence at or above the last write's, a
//! permit operation only while the server counts the hold. Each accepted
//! operation is logged with its owner, fence, the server's `TIME`, whether
//! `LOCK.INFO` showed the caller's hold with that fence at that instant
//! (exclusive, for a write: *held*), whether it ran before the moment its
//! worker knew its lease surely still ran (*within*: the worker renews right
//! after each grant and passes the renewal's send time plus the lease, minus
//! a margin), and how many holders the server listed.
//!
//! What the log must show, in log order (the order the server ran them):
//!
//! - **Exclusion.** A hold's *span* runs from its first to its last held
//!   operation; as a hold never resumes once ended (a new hold gets a new
//!   fence), the server held it throughout its span. No writer hold's span
//!   meets another hold's span, and no more than the limit of permit spans
//!   cover any one operation.
//! - **Fencing.** The fences of writes never fall (so successive writer holds'
//!   fences rise), and no read carries a fence below the last write before it.
//! - **Leases.** An operation run within its lease is always held and never
//!   refused: the server never dropped a live hold nor let another take it.
//! - **Stale holders refused.** The stopped workers' late writes, reads and
//!   permit operations were refused: some must be (the count is > 0), so
//!   the faults did reach holders in the middle of their work.
//! - **Nothing lost.** Every worker slot held and worked, no fence was issued
//!   twice, and the lock ends free.
//!
//! The read-write run also goes, shorter and without faults of its own,
//! through a `CLIENT PAUSE … WRITE` longer than a lease, a failover to a
//! replica (`REPLICAOF NO ONE`, with `lock.max-ttl` set so the quarantine
//! covers the holds the replica never received) and a restart from the AOF;
//! the workers find the master again and give up any hold they may have
//! had. The same checks apply, the lease one except after a failover.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use redis::Connection;

use crate::harness::{
    clock_floor, drain, example_bin, now_ms, wait_until, Call, Server, CLOCK_SHIFT,
};

/// Each hold's lease, as the worker asks for it.
const LEASE: Duration = Duration::from_millis(1000);
/// How long any one wait on the server's state may take.
const SOON: Duration = Duration::from_secs(10);
/// Past this after the planned end, the workers are killed and the test fails.
const GRACE: Duration = Duration::from_secs(20);
const LIMIT: usize = 3;

/// How many times [`Crew::stop_past_lease`] tries to stop a holder mid-hold.
const STOP_TRIES: usize = 40;
/// The lease a stopped holder must have left for the test to tell its
/// lease's end from a release it sent just before the stop.
const MIN_LEASE_LEFT_MS: i64 = 300;

fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .args([format!("-{name}"), pid.to_string()])
        .status()
        .unwrap_or_else(|e| panic!("cannot run kill -{name}: {e}"));
    assert!(status.success(), "kill -{name} {pid} failed: {status}");
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Role {
    Reader,
    Writer,
    Permit,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Reader => "reader",
            Role::Writer => "writer",
            Role::Permit => "permit",
        }
    }
}

/// One worker process; `slot` names the place it fills (a killed worker's
/// successor keeps the slot under a new owner).
struct Worker {
    slot: String,
    owner: String,
    child: Child,
    stdout: Option<JoinHandle<String>>,
    stderr: Option<JoinHandle<String>>,
    killed: bool,
}

/// What one worker printed.
#[derive(Debug, Default)]
struct Report {
    /// The fence of each hold, as `LOCK.ACQUIRE` replied.
    fences: Vec<i64>,
    ok: usize,
    stale: usize,
    lapsed: usize,
    lost: usize,
    reconnects: usize,
    done: bool,
}

fn parse(owner: &str, stdout: &str, killed: bool) -> Report {
    let mut report = Report::default();
    let lines: Vec<&str> = stdout.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        match line.split(' ').next().unwrap_or("") {
            "fence" => match line.get(6..).unwrap_or("").parse() {
                Ok(fence) => report.fences.push(fence),
                Err(_) if killed && i + 1 == lines.len() => {}
                Err(_) => panic!("{owner} printed {line:?}"),
            },
            "ok" => report.ok += 1,
            "stale" => report.stale += 1,
            "lapsed" => report.lapsed += 1,
            "lost" => report.lost += 1,
            "reconnect" => report.reconnects += 1,
            "timeout" => {}
            "done" => report.done = true,
            // A killed worker's last line may be cut short.
            _ if killed && i + 1 == lines.len() => {}
            _ => panic!("{owner} printed {line:?}"),
        }
    }
    report
}

/// The workers of one run, all on one lock, and the faults the test makes.
struct Crew {
    bin: PathBuf,
    ports: String,
    ends: Instant,
    workers: Vec<Worker>,
}

impl Crew {
    fn start(ports: &[u16], slots: &[(Role, usize)], run_for: Duration) -> Crew {
        let mut crew = Crew {
            bin: example_bin("shared_worker"),
            ports: ports
                .iter()
                .map(u16::to_string)
                .collect::<Vec<_>>()
                .join(","),
            ends: Instant::now() + run_for,
            workers: Vec::new(),
        };
        for &(role, count) in slots {
            for i in 0..count {
                let slot = format!("{}-{i}", role.name());
                crew.spawn(role, slot.clone(), slot);
            }
        }
        crew
    }

    fn spawn(&mut self, role: Role, slot: String, owner: String) {
        let left = self.ends.saturating_duration_since(Instant::now());
        let mut child = Command::new(&self.bin)
            .args([
                self.ports.as_str(),
                role.name(),
                owner.as_str(),
                &left.as_millis().to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.bin.display()));
        let stdout = drain(child.stdout.take().expect("piped stdout"));
        let stderr = drain(child.stderr.take().expect("piped stderr"));
        self.workers.push(Worker {
            slot,
            owner,
            child,
            stdout: Some(stdout),
            stderr: Some(stderr),
            killed: false,
        });
    }

    fn live(&mut self, owner: &str) -> &mut Worker {
        self.workers
            .iter_mut()
            .find(|w| w.owner == owner && !w.killed)
            .unwrap_or_else(|| panic!("no live worker {owner}"))
    }

    /// Waits until a live worker of `role` holds `lock` (for a writer:
    /// exclusively) and returns its owner and fence. A killed worker's hold
    /// lasts until its lease ends.
    fn holder(&self, c: &mut Connection, lock: &str, role: Role) -> (String, i64) {
        let live: Vec<&str> = self
            .workers
            .iter()
            .filter(|w| !w.killed)
            .map(|w| w.owner.as_str())
            .collect();
        let mut found = None;
        wait_until(&format!("a {} holds {lock}", role.name()), SOON, || {
            let Some(info) = c.lock_info(lock) else {
                return false;
            };
            if role == Role::Writer && info.mode != "exclusive" {
                return false;
            }
            found = info
                .holders
                .iter()
                .find(|h| h.owner.starts_with(role.name()) && live.contains(&h.owner.as_str()))
                .map(|h| (h.owner.clone(), h.fence));
            found.is_some()
        });
        found.expect("found a holder")
    }

    /// `SIGSTOP`s a holder of `role`, keeps it stopped until its hold has
    /// ended with its lease and the store has taken an operation with a
    /// higher fence (what its late operations must lose to), then
    /// `SIGCONT`s it. Returns its owner.
    fn stop_past_lease(&mut self, c: &mut Connection, keys: &Keys, role: Role) -> String {
        // A worker holds for a few tens of ms, and `kill` is a process of its
        // own: on a busy machine the stop often lands just after a release
        // was sent. A miss costs little, so try many times.
        for _ in 0..STOP_TRIES {
            let (owner, fence) = self.holder(c, keys.lock, role);
            let pid = self.live(&owner).child.id();
            signal(pid, "STOP");
            if self.held_to_lease_end(c, keys, &owner, fence) {
                self.wait_store_past(c, keys, role, &owner, fence);
                signal(pid, "CONT");
                return owner;
            }
            signal(pid, "CONT");
        }
        panic!(
            "no {} was stopped while holding in {STOP_TRIES} tries",
            role.name()
        );
    }

    /// Whether `owner`'s hold, its process stopped, ends with its lease: a
    /// release it sent just before the stop may still reach the server, and
    /// then the stop missed.
    fn held_to_lease_end(&self, c: &mut Connection, keys: &Keys, owner: &str, fence: i64) -> bool {
        let hold = |c: &mut Connection| {
            c.lock_info(keys.lock)
                .and_then(|info| info.holders.into_iter().find(|h| h.owner == owner))
                .filter(|h| h.fence == fence)
        };
        let checked = Instant::now();
        let Some(stopped) = hold(c) else {
            return false;
        };
        // With little of its lease left, a release sent just before the stop
        // and a lease end look alike: count it as a miss.
        if stopped.ttl < MIN_LEASE_LEFT_MS {
            return false;
        }
        wait_until(&format!("{owner}'s hold ends while stopped"), SOON, || {
            hold(c).is_none()
        });
        // The server ends a lease within a few ms; far earlier is a release.
        let ended_after = checked.elapsed().as_millis() as i64;
        ended_after + 100 >= stopped.ttl
    }

    /// Waits until the store has taken an operation with a fence above
    /// `fence` that a late operation of `role` is judged against (a permit
    /// is judged by the server's holders alone).
    fn wait_store_past(
        &self,
        c: &mut Connection,
        keys: &Keys,
        role: Role,
        owner: &str,
        fence: i64,
    ) {
        let field = match role {
            Role::Reader => "written",
            Role::Writer => "seen",
            Role::Permit => return,
        };
        wait_until(
            &format!("the store moves past {owner}'s fence"),
            SOON,
            || {
                let mark: Option<String> = c.value(&["HGET", keys.fences, field]);
                mark.and_then(|m| m.parse::<i64>().ok())
                    .is_some_and(|m| m > fence)
            },
        );
    }

    /// `SIGKILL`s a holder of `role` and starts a successor in its slot.
    fn kill_holder(&mut self, c: &mut Connection, keys: &Keys, role: Role) {
        let (owner, _) = self.holder(c, keys.lock, role);
        let worker = self.live(&owner);
        let _ = worker.child.kill();
        let _ = worker.child.wait();
        worker.killed = true;
        let slot = worker.slot.clone();
        let generation = self.workers.iter().filter(|w| w.slot == slot).count();
        self.spawn(role, slot.clone(), format!("{slot}.{generation}"));
    }

    /// Waits for every live worker to end; returns each one's report, by slot.
    fn finish(mut self) -> BTreeMap<String, Vec<(String, Report)>> {
        let deadline = self.ends + GRACE;
        for worker in &mut self.workers {
            while !worker.killed && worker.child.try_wait().expect("poll a worker").is_none() {
                assert!(
                    Instant::now() < deadline,
                    "{} still running {GRACE:?} after its run's end",
                    worker.owner
                );
                thread::sleep(Duration::from_millis(20));
            }
        }
        let mut reports: BTreeMap<String, Vec<(String, Report)>> = BTreeMap::new();
        for worker in &mut self.workers {
            let stdout = worker
                .stdout
                .take()
                .expect("stdout")
                .join()
                .expect("reader");
            let stderr = worker
                .stderr
                .take()
                .expect("stderr")
                .join()
                .expect("reader");
            if !worker.killed {
                let status = worker.child.wait().expect("exited");
                assert!(
                    status.success(),
                    "{} failed ({status}):\n{stderr}",
                    worker.owner
                );
            }
            let report = parse(&worker.owner, &stdout, worker.killed);
            assert!(
                worker.killed || report.done,
                "{} did not finish:\n{stdout}",
                worker.owner
            );
            reports
                .entry(worker.slot.clone())
                .or_default()
                .push((worker.owner.clone(), report));
        }
        reports
    }
}

impl Drop for Crew {
    fn drop(&mut self) {
        for worker in &mut self.workers {
            // A stopped worker must run again to die of SIGTERM; SIGKILL
            // ends it either way.
            let _ = worker.child.kill();
            let _ = worker.child.wait();
        }
    }
}

/// The keys the worker's store uses for one lock.
struct Keys {
    lock: &'static str,
    fences: &'static str,
    log: &'static str,
    tally: &'static str,
}

const RW: Keys = Keys {
    lock: "rw:lock",
    fences: "rw:fences",
    log: "rw:log",
    tally: "rw:tally",
};

const SEM: Keys = Keys {
    lock: "sem:lock",
    fences: "sem:fences",
    log: "sem:log",
    tally: "sem:tally",
};

/// One accepted operation, as the store logged it.
#[derive(Debug)]
struct Entry {
    op: String,
    owner: String,
    fence: i64,
    held: bool,
    within: bool,
    holders: usize,
}

fn read_log(c: &mut Connection, keys: &Keys) -> Vec<Entry> {
    let lines: Vec<String> = c.value(&["LRANGE", keys.log, "0", "-1"]);
    lines
        .iter()
        .map(|line| {
            let f: Vec<&str> = line.split(' ').collect();
            let [op, owner, fence, _sec, _usec, held, within, holders] = f.as_slice() else {
                panic!("bad log entry {line:?}");
            };
            let int = |s: &str| -> i64 { s.parse().unwrap_or_else(|_| panic!("{line:?}")) };
            Entry {
                op: op.to_string(),
                owner: owner.to_string(),
                fence: int(fence),
                held: *held == "1",
                within: *within == "1",
                holders: int(holders) as usize,
            }
        })
        .collect()
}

fn tallies(c: &mut Connection, keys: &Keys) -> HashMap<String, i64> {
    c.value(&["HGETALL", keys.tally])
}

/// Each hold's span: the log positions of its first and last held
/// operation, by fence.
fn spans(log: &[Entry]) -> BTreeMap<i64, (usize, usize, String)> {
    let mut spans: BTreeMap<i64, (usize, usize, String)> = BTreeMap::new();
    for (i, e) in log.iter().enumerate().filter(|(_, e)| e.held) {
        spans
            .entry(e.fence)
            .and_modify(|s| s.1 = i)
            .or_insert((i, i, e.op.clone()));
    }
    spans
}

/// An operation run within its lease that the server did not show held
/// means the server dropped a live hold or let another take it.
fn check_leases(log: &[Entry], tally: &HashMap<String, i64>) {
    if let Some(e) = log.iter().find(|e| e.within && !e.held) {
        panic!("an operation within its lease was not held: {e:?}");
    }
    let refused: Vec<_> = tally
        .iter()
        .filter(|(k, _)| k.starts_with("inlease-"))
        .collect();
    assert!(
        refused.is_empty(),
        "operations within their lease refused: {refused:?}"
    );
}

/// The read-write log's checks (see the module's doc); returns the number
/// of writer holds.
/// `leases`: whether to check that operations within their lease were held;
/// not after a failover, which may lose a hold the replica never received.
fn check_rw_log(log: &[Entry], tally: &HashMap<String, i64>, leases: bool) -> usize {
    if leases {
        check_leases(log, tally);
    }
    // Fencing: write fences never fall; no read below the last write.
    let mut last_write = 0;
    for (i, e) in log.iter().enumerate() {
        match e.op.as_str() {
            "write" => {
                assert!(
                    e.fence >= last_write,
                    "write #{i} {e:?} below an earlier write's fence {last_write}"
                );
                last_write = e.fence;
            }
            "read" => assert!(
                e.fence >= last_write,
                "read #{i} {e:?} below the last write's fence {last_write}"
            ),
            other => panic!("a {other} in the read-write log"),
        }
    }
    // Exclusion: no writer hold's span meets another hold's.
    let spans = spans(log);
    let writers: Vec<_> = spans.iter().filter(|(_, s)| s.2 == "write").collect();
    for (wf, w) in &writers {
        for (f, s) in &spans {
            if f != *wf && s.0 <= w.1 && w.0 <= s.1 {
                panic!(
                    "{}'s writer hold {wf} (log #{}..#{}) overlaps {}'s {} hold {f} (#{}..#{})",
                    log[w.0].owner, w.0, w.1, log[s.0].owner, s.2, s.0, s.1
                );
            }
        }
    }
    // Inside a writer hold's span the store took nothing else, held or not:
    // an operation with a higher fence would have made its own later writes
    // stale, one with a lower fence was stale itself.
    for (wf, w) in &writers {
        if let Some(e) = log[w.0..=w.1].iter().find(|e| e.fence != **wf) {
            panic!("the store took {e:?} inside writer hold {wf}'s span");
        }
    }
    writers.len()
}

/// The largest number of permit spans covering one log position.
fn max_permits(log: &[Entry]) -> usize {
    let spans = spans(log);
    (0..log.len())
        .map(|i| spans.values().filter(|s| s.0 <= i && i <= s.1).count())
        .max()
        .unwrap_or(0)
}

fn count(tally: &HashMap<String, i64>, name: &str) -> i64 {
    tally.get(name).copied().unwrap_or(0)
}

/// Every slot held and had operations accepted, and no fence was issued
/// twice, whichever server issued it.
fn check_reports(reports: &BTreeMap<String, Vec<(String, Report)>>) {
    let mut issued = HashMap::new();
    for (owner, report) in reports.values().flatten() {
        for fence in &report.fences {
            if let Some(other) = issued.insert(*fence, owner) {
                panic!("fence {fence} issued to {other} and to {owner}");
            }
        }
    }
    for (slot, workers) in reports {
        let ok: usize = workers.iter().map(|(_, r)| r.ok).sum();
        assert!(
            ok > 0,
            "slot {slot} never had an operation accepted: {workers:?}"
        );
    }
}

/// What a read-write run showed, for the report.
struct RwFigures {
    writes: i64,
    reads: i64,
    writer_holds: usize,
    stale_writes: i64,
    stale_reads: i64,
    /// Operations the store took by their fence whose hold the server no
    /// longer had (a late holder before the next one used the store).
    unheld: i64,
}

impl std::fmt::Display for RwFigures {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(
            f,
            "{} writes in {} writer holds and {} reads accepted ({} of them no longer \
             held), {} stale writes and {} stale reads refused",
            self.writes,
            self.writer_holds,
            self.reads,
            self.unheld,
            self.stale_writes,
            self.stale_reads
        )
    }
}

fn rw_figures(
    c: &mut Connection,
    reports: &BTreeMap<String, Vec<(String, Report)>>,
    leases: bool,
) -> RwFigures {
    let log = read_log(c, &RW);
    let tally = tallies(c, &RW);
    let writer_holds = check_rw_log(&log, &tally, leases);
    check_reports(reports);
    let stale: usize = reports.values().flatten().map(|(_, r)| r.stale).sum();
    let figures = RwFigures {
        writes: count(&tally, "accepted-write"),
        reads: count(&tally, "accepted-read"),
        writer_holds,
        stale_writes: count(&tally, "stale-write"),
        stale_reads: count(&tally, "stale-read"),
        unheld: count(&tally, "unheld-write") + count(&tally, "unheld-read"),
    };
    assert_eq!(
        figures.writes + figures.reads,
        log.len() as i64,
        "every accepted operation is logged"
    );
    // A killed worker may not have printed the verdict of its last operation.
    assert!(
        stale as i64 <= figures.stale_writes + figures.stale_reads,
        "workers saw {stale} refusals; the store: {figures}"
    );
    figures
}

fn wait_free(c: &mut Connection, lock: &str) {
    // A killed holder's hold ends with its lease.
    wait_until(&format!("{lock} ends free"), LEASE + SOON, || {
        c.lock_info(lock).is_none()
    });
}

const READERS: usize = 6;
const WRITERS: usize = 3;

/// Six readers and three writers on one lock for eight seconds; two writers
/// and two readers stopped past their lease, one of each killed while
/// holding.
#[test]
fn readers_and_writers_with_stopped_and_killed_holders() {
    let server = Server::start();
    let mut c = server.conn();
    let mut crew = Crew::start(
        &[server.port()],
        &[(Role::Reader, READERS), (Role::Writer, WRITERS)],
        Duration::from_secs(8),
    );
    let mut stopped = Vec::new();
    stopped.push(crew.stop_past_lease(&mut c, &RW, Role::Writer));
    stopped.push(crew.stop_past_lease(&mut c, &RW, Role::Reader));
    crew.kill_holder(&mut c, &RW, Role::Writer);
    stopped.push(crew.stop_past_lease(&mut c, &RW, Role::Writer));
    crew.kill_holder(&mut c, &RW, Role::Reader);
    stopped.push(crew.stop_past_lease(&mut c, &RW, Role::Reader));
    let reports = crew.finish();

    let figures = rw_figures(&mut c, &reports, true);
    eprintln!("readers/writers with faults: {figures}");
    assert!(
        figures.stale_writes > 0,
        "no stale write refused: {figures}"
    );
    assert!(figures.stale_reads > 0, "no stale read refused: {figures}");
    assert!(
        figures.writer_holds >= 10,
        "too few writer holds: {figures}"
    );
    // A stopped worker wakes to find its release refused. On a starved
    // machine a release sent just before the stop can reach the server only
    // near the lease's end, which the stop's check cannot tell from a lease
    // that ended: so one stopped worker of the two must show it.
    let refused: Vec<&String> = stopped
        .iter()
        .filter(|owner| {
            reports
                .values()
                .flatten()
                .filter(|(o, _)| o == *owner)
                .map(|(_, r)| r.lost)
                .sum::<usize>()
                > 0
        })
        .collect();
    assert!(
        !refused.is_empty(),
        "every stopped worker ({stopped:?}) was stopped past its lease yet released"
    );
    wait_free(&mut c, RW.lock);
}

/// Eight permit holders on a semaphore of three permits for six seconds;
/// two stopped past their lease, one killed while holding.
#[test]
fn semaphore_never_over_its_limit_with_stopped_and_killed_holders() {
    let server = Server::start();
    let mut c = server.conn();
    let mut crew = Crew::start(
        &[server.port()],
        &[(Role::Permit, 8)],
        Duration::from_secs(6),
    );
    let first = crew.stop_past_lease(&mut c, &SEM, Role::Permit);
    crew.kill_holder(&mut c, &SEM, Role::Permit);
    let second = crew.stop_past_lease(&mut c, &SEM, Role::Permit);
    let reports = crew.finish();

    let log = read_log(&mut c, &SEM);
    let tally = tallies(&mut c, &SEM);
    check_leases(&log, &tally);
    check_reports(&reports);
    assert!(
        log.iter().all(|e| e.op == "permit" && e.held),
        "the store took an unheld permit"
    );
    let in_use = max_permits(&log);
    let listed = log.iter().map(|e| e.holders).max().unwrap_or(0);
    let refused = count(&tally, "lapsed-permit");
    eprintln!(
        "semaphore with faults: {} permit operations, {} holds, max {in_use} in use \
         (server listed at most {listed}), {refused} late operations refused",
        log.len(),
        spans(&log).len()
    );
    assert!(in_use <= LIMIT, "{in_use} permits in use at once");
    assert!(listed <= LIMIT, "the server listed {listed} holders");
    assert_eq!(
        in_use, LIMIT,
        "the permits were never all in use: no contention"
    );
    // A stopped worker wakes to find its permit gone: its next store
    // operation refused as lapsed, or, if the stop came after its last
    // operation, its release refused.
    let releases_refused: usize = reports
        .values()
        .flatten()
        .filter(|(owner, _)| *owner == first || *owner == second)
        .map(|(_, r)| r.lost)
        .sum();
    assert!(
        refused > 0 || releases_refused > 0,
        "no late permit operation or release refused ({first}, {second} stopped)"
    );
    wait_free(&mut c, SEM.lock);
}

/// The read-write run of the disturbed tests: shorter, no faults of its own.
fn short_crew(ports: &[u16]) -> Crew {
    Crew::start(
        ports,
        &[(Role::Reader, READERS), (Role::Writer, WRITERS)],
        Duration::from_secs(6),
    )
}

fn log_len(c: &mut Connection) -> i64 {
    c.int(&["LLEN", RW.log])
}

/// Waits until the run has logged `n` operations.
fn wait_logged(c: &mut Connection, n: i64, when: &str) {
    wait_until(&format!("{n} operations logged {when}"), SOON, || {
        log_len(c) >= n
    });
}

/// Writes accepted at log positions from `from` on.
fn writes_from(c: &mut Connection, from: i64) -> usize {
    read_log(c, &RW)
        .iter()
        .skip(from as usize)
        .filter(|e| e.op == "write")
        .count()
}

/// `CLIENT PAUSE 2000 WRITE` mid-run, longer than a lease: no operation is
/// taken while writes are paused (the store's script writes), leases that
/// end meanwhile hand off only after it, and the log stays sound.
#[test]
fn readers_and_writers_through_a_write_pause() {
    let server = Server::start();
    let mut c = server.conn();
    let crew = short_crew(&[server.port()]);
    wait_logged(&mut c, 20, "before the pause");
    let paused = Instant::now();
    assert_eq!(
        c.call(&["CLIENT", "PAUSE", "2000", "WRITE"]),
        Ok(redis::Value::Okay)
    );
    let at_pause = log_len(&mut c);
    // A write from another client returns when the pause ends.
    let mut probe = server.conn();
    let unpaused = thread::spawn(move || probe.call(&["SET", "probe", "1"]));
    // Sampled only well inside the pause: at its end the workers and the
    // probe go on together.
    while paused.elapsed() < Duration::from_millis(1800) {
        assert_eq!(log_len(&mut c), at_pause, "an operation ran while paused");
        thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(unpaused.join().expect("probe"), Ok(redis::Value::Okay));
    assert!(paused.elapsed() >= Duration::from_millis(1900));
    let reports = crew.finish();

    let figures = rw_figures(&mut c, &reports, true);
    let after = writes_from(&mut c, at_pause);
    eprintln!("readers/writers through a write pause: {figures}, {after} writes after it");
    assert!(after > 0, "no write accepted after the pause");
    wait_free(&mut c, RW.lock);
}

/// `lock.max-ttl` of the failover test: the quarantine after a promotion.
const MAX_TTL_MS: i64 = 2_000;

/// The master is killed mid-run and its replica promoted
/// (`REPLICAOF NO ONE`); the workers find the new master. With
/// `lock.max-ttl` set, the promoted replica begins no hold for that long,
/// so a hold the master granted and the replica never learned has ended
/// before anyone else holds. The promoted server's log (what it received,
/// then what it took itself) passes every check, and its writes carry
/// fences above every fence the store saw before.
#[test]
fn readers_and_writers_through_a_failover() {
    let configured = |label: &str| {
        Server::builder()
            .label(label)
            .config("lock.max-ttl", MAX_TTL_MS)
            .config("lock.quarantine", "promotion")
    };
    let mut master = configured("master").start();
    let heir = configured("heir").replica_of(&master).start();
    heir.wait_for_master_link();
    let mut m = master.conn();
    // After a diskless full sync the master streams to the replica only
    // from its first acknowledgement; `WAIT` asks for one, so the stream
    // flows from the start of the run, as with a replica long in sync.
    let _: () = m.value(&["SET", "synced", "1"]);
    m.wait_replicas(1);
    let crew = short_crew(&[master.port(), heir.port()]);
    wait_logged(&mut m, 100, "before the failover");

    master.kill();
    let mut h = heir.conn();
    // The quarantine begins after this moment, so ends after it plus its length.
    let promoting = now_ms();
    assert_eq!(h.call(&["REPLICAOF", "NO", "ONE"]), Ok(redis::Value::Okay));
    let at_promotion = log_len(&mut h);
    let seen_before: Option<String> = h.value(&["HGET", RW.fences, "seen"]);
    let quarantine = h.info_int("lock", "lock_quarantine_ms");
    assert!(quarantine > 0, "no quarantine after the promotion");
    let reports = crew.finish();

    let figures = rw_figures(&mut h, &reports, false);
    let after = writes_from(&mut h, at_promotion);
    eprintln!(
        "readers/writers through a failover: {figures}, {at_promotion} operations \
         replicated before it, {after} writes on the promoted replica, quarantine \
         {quarantine} ms"
    );
    assert!(after > 0, "no write accepted after the promotion");
    // What the replica never received is lost, the store's fences with it.
    // The holds the promoted replica began itself have fences above the
    // clock floor of the promotion (the dead master's are below it); each
    // began after the quarantine and is above every fence the replica had.
    let seen_before: i64 = seen_before.and_then(|s| s.parse().ok()).unwrap_or(0);
    let log = read_log(&mut h, &RW);
    let begun: Vec<&Entry> = log[at_promotion as usize..]
        .iter()
        .filter(|e| e.fence > clock_floor(promoting))
        .collect();
    assert!(!begun.is_empty(), "the promoted replica began no hold");
    if let Some(e) = begun.iter().find(|e| e.fence <= seen_before) {
        panic!("a hold begun after the promotion has a fence not above {seen_before}: {e:?}");
    }
    if let Some(e) = begun
        .iter()
        .find(|e| e.fence < clock_floor(promoting + MAX_TTL_MS))
    {
        panic!(
            "a hold began during the quarantine, {} ms after the promotion began: {e:?}",
            (e.fence >> CLOCK_SHIFT) - promoting
        );
    }
    wait_free(&mut h, RW.lock);
}

/// The server, with the AOF on, restarted mid-run (`SHUTDOWN NOSAVE`, then
/// started again on the same port); the workers reconnect. The holds, the
/// store and its log come back from the AOF, and the log passes every check
/// across the restart.
#[test]
fn readers_and_writers_across_an_aof_restart() {
    let mut server = Server::builder().appendonly(true).start();
    let mut c = server.conn();
    let crew = short_crew(&[server.port()]);
    wait_logged(&mut c, 20, "before the restart");
    let before = log_len(&mut c);
    server.restart();
    let mut c = server.conn();
    let at_restart = log_len(&mut c);
    assert!(
        at_restart >= before,
        "the AOF lost log entries: {at_restart} < {before}"
    );
    let reports = crew.finish();

    let figures = rw_figures(&mut c, &reports, true);
    let after = writes_from(&mut c, at_restart);
    let reconnects: usize = reports.values().flatten().map(|(_, r)| r.reconnects).sum();
    eprintln!(
        "readers/writers across an AOF restart: {figures}, {after} writes after it, \
         {reconnects} reconnections"
    );
    assert!(after > 0, "no write accepted after the restart");
    assert!(reconnects > 0, "no worker noticed the restart");
    wait_free(&mut c, RW.lock);
}
