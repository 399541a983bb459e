//! Several locks at once under stress, with real processes
//! (`examples/transfer_worker.rs`): workers move money between accounts,
//! each transfer under one `LOCK.MACQUIRE` of both accounts' locks asked for
//! in a random order, so requests for the same keys cross (`[a, b]` beside
//! `[b, a]`). Every read and write goes through a fenced store in the
//! server, one per account.
//!
//! The faults, made on purpose: the test `SIGSTOP`s workers while they hold,
//! past their lease, and `SIGCONT`s them once another transfer has written
//! one of their accounts (they wake believing they hold and write anyway),
//! and `SIGKILL`s others while they hold (a new worker takes the slot).
//!
//! What must hold:
//! - **No deadlock, no starvation.** No `WAIT` ends without its locks, though
//!   it is longer than any lease a stopped or killed holder keeps, and every
//!   worker that ran to its end made transfers.
//! - **Money conserved.** The balances add up to what the accounts began
//!   with: no transfer overwrote another (a lost update would change the
//!   sum), whatever the stopped workers wrote late.
//! - **Stale holders refused.** Some late reads or writes of the stopped
//!   workers were refused by the store (so the faults reached holders in the
//!   middle of a transfer), and every lock ends free.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::harness::{drain, example_bin, wait_until, Server};

const ACCOUNTS: usize = 4;
const START_BALANCE: i64 = 1_000;
const WORKERS: usize = 6;
const RUN: Duration = Duration::from_secs(8);
const LEASE: Duration = Duration::from_millis(1000);
/// Holders stopped past their lease until a late operation is refused.
const STOP_TRIES: usize = 30;

struct Worker {
    owner: String,
    child: Child,
    stdout: Option<JoinHandle<String>>,
    killed: bool,
}

struct Crew {
    port: u16,
    ends: Instant,
    workers: Vec<Worker>,
    spawned: u64,
}

impl Crew {
    fn spawn(&mut self, slot: usize) {
        let left = self.ends.saturating_duration_since(Instant::now());
        self.spawned += 1;
        let owner = format!("w{slot}.{}", self.spawned);
        let mut child = Command::new(example_bin("transfer_worker"))
            .args([
                self.port.to_string(),
                owner.clone(),
                ACCOUNTS.to_string(),
                left.as_millis().to_string(),
                self.spawned.to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start transfer_worker");
        let stdout = drain(child.stdout.take().expect("piped stdout"));
        self.workers.push(Worker {
            owner,
            child,
            stdout: Some(stdout),
            killed: false,
        });
    }

    /// A live worker holding some account's lock now, with that lock.
    fn holder(&self, server: &Server) -> (usize, String) {
        let mut found = None;
        wait_until(
            "a live worker holds an account",
            Duration::from_secs(10),
            || {
                for a in 0..ACCOUNTS {
                    let Some(info) = server.lock_info(&format!("acct:{a}:lock")) else {
                        continue;
                    };
                    for h in &info.holders {
                        if let Some(w) = self
                            .workers
                            .iter()
                            .position(|w| !w.killed && w.owner == h.owner)
                        {
                            found = Some((a, w));
                            return true;
                        }
                    }
                }
                false
            },
        );
        let (account, index) = found.expect("a holder");
        (account, self.workers[index].owner.clone())
    }

    fn index(&self, owner: &str) -> usize {
        self.workers
            .iter()
            .position(|w| !w.killed && w.owner == owner)
            .expect("a live worker")
    }

    fn finish(mut self) -> HashMap<String, (bool, String)> {
        let mut out = HashMap::new();
        for w in &mut self.workers {
            if !w.killed {
                let deadline = Instant::now() + RUN + Duration::from_secs(30);
                while w.child.try_wait().expect("poll a worker").is_none() {
                    assert!(Instant::now() < deadline, "{} still running", w.owner);
                    thread::sleep(Duration::from_millis(20));
                }
            }
            let text = w
                .stdout
                .take()
                .map(|h| h.join().expect("reader"))
                .unwrap_or_default();
            out.insert(w.owner.clone(), (w.killed, text));
        }
        out
    }
}

impl Drop for Crew {
    fn drop(&mut self) {
        for w in &mut self.workers {
            let _ = w.child.kill();
            let _ = w.child.wait();
        }
    }
}

fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .args([format!("-{name}"), pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{name} {pid} failed");
}

fn tally(server: &Server, field: &str) -> i64 {
    server
        .q::<Option<i64>>(("HGET", "transfer:tally", field))
        .unwrap_or(0)
}

#[test]
fn transfers_under_several_locks_in_crossing_orders_conserve_money_through_stops_and_kills() {
    let server = Server::start();
    for a in 0..ACCOUNTS {
        server.q::<()>(("SET", format!("acct:{a}:balance"), START_BALANCE));
    }
    let mut crew = Crew {
        port: server.port(),
        ends: Instant::now() + RUN,
        workers: Vec::new(),
        spawned: 0,
    };
    for slot in 0..WORKERS {
        crew.spawn(slot);
    }
    // Stop holders past their lease until the store has refused a late
    // operation of one of them.
    let mut stops = 0;
    while tally(&server, "stale-read") + tally(&server, "stale-write") == 0 {
        assert!(
            stops < STOP_TRIES,
            "no stopped holder was refused in {STOP_TRIES} tries"
        );
        stops += 1;
        let (account, owner) = crew.holder(&server);
        let pid = crew.workers[crew.index(&owner)].child.id();
        signal(pid, "STOP");
        let stopped = Instant::now();
        let fences = format!("acct:{account}:fences");
        let written_before: Option<i64> = server.q(("HGET", &fences, "written"));
        // Past its lease, and another transfer wrote one of its accounts.
        wait_until(
            "another transfer writes the account",
            Duration::from_secs(15),
            || {
                stopped.elapsed() > LEASE
                    && server.q::<Option<i64>>(("HGET", &fences, "written")) > written_before
            },
        );
        signal(pid, "CONT");
        thread::sleep(Duration::from_millis(100));
    }
    // Kill two holders; a new worker takes each slot.
    for _ in 0..2 {
        let (_, owner) = crew.holder(&server);
        let i = crew.index(&owner);
        let _ = crew.workers[i].child.kill();
        let _ = crew.workers[i].child.wait();
        crew.workers[i].killed = true;
        crew.spawn(WORKERS + i);
    }
    let reports = crew.finish();
    let mut transfers = 0;
    for (owner, (killed, text)) in &reports {
        let count = |word: &str| text.lines().filter(|l| *l == word).count();
        assert_eq!(
            count("timeout"),
            0,
            "{owner} waited past every lease:\n{text}"
        );
        if !killed {
            assert_eq!(count("done"), 1, "{owner} did not finish:\n{text}");
            assert!(count("ok") > 0, "{owner} made no transfer:\n{text}");
        }
        transfers += count("ok");
    }
    let total: i64 = (0..ACCOUNTS)
        .map(|a| server.q::<i64>(("GET", format!("acct:{a}:balance"))))
        .sum();
    assert_eq!(
        total,
        START_BALANCE * ACCOUNTS as i64,
        "money appeared or vanished in {transfers} transfers"
    );
    // A killed worker may die between the store's write and its `ok`.
    let counted = tally(&server, "transfers");
    assert!(
        (transfers as i64..=transfers as i64 + 2).contains(&counted),
        "the store counted {counted} transfers, the workers reported {transfers}"
    );
    for a in 0..ACCOUNTS {
        wait_until("every lock ends free", LEASE * 3, || {
            server.lock_info(&format!("acct:{a}:lock")).is_none()
        });
    }
    eprintln!(
        "{transfers} transfers, {stops} stops, {} stale reads, {} stale writes",
        tally(&server, "stale-read"),
        tally(&server, "stale-write")
    );
}
