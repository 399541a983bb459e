//! The classic oversell test, with real processes: 16 workers
//! (`examples/oversell_worker.rs`) sell a stock of 500 items, each reading the
//! stock and writing back `n - 1` it computed itself — a race that oversells
//! at once without mutual exclusion. Under `LOCK.ACQUIRE … WAIT` exactly 500
//! items sell, the stock ends at 0 and is never read below 0, and the fences,
//! in acquisition order, rise strictly (mutual exclusion, fencing, fair hand-off).

use std::collections::HashSet;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::harness::{drain, example_bin, Call, Server};

const WORKERS: usize = 16;
const STOCK: i64 = 500;
/// The whole run takes a few seconds; past this, the workers are killed.
const DEADLINE: Duration = Duration::from_secs(60);

/// The worker processes, killed if the test ends before they do.
struct Workers(Vec<Child>);

impl Drop for Workers {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Reads all of a pipe on a thread of its own, so a full pipe never stalls
/// a worker.
/// What one worker printed.
#[derive(Debug, Default)]
struct Report {
    fences: Vec<i64>,
    sales: i64,
    sale_lines: i64,
    negatives: Vec<i64>,
    timeouts: i64,
}

fn parse(owner: &str, stdout: &str) -> Report {
    let mut report = Report {
        sales: -1,
        ..Report::default()
    };
    for line in stdout.lines() {
        let (word, value) = line.split_once(' ').unwrap_or((line, ""));
        let number = || -> i64 {
            value
                .parse()
                .unwrap_or_else(|_| panic!("{owner} printed {line:?}"))
        };
        match word {
            "fence" => report.fences.push(number()),
            "sale" => report.sale_lines += 1,
            "sales" => report.sales = number(),
            "negative" => report.negatives.push(number()),
            "timeout" => report.timeouts += 1,
            _ => panic!("{owner} printed {line:?}"),
        }
    }
    assert_eq!(
        report.sales, report.sale_lines,
        "{owner}'s summary:\n{stdout}"
    );
    report
}

#[test]
fn sixteen_workers_sell_exactly_the_stock_with_rising_fences() {
    let worker = example_bin("oversell_worker");
    let server = Server::start();
    let mut c = server.conn();
    let _: () = c.value(&["SET", "stock", &STOCK.to_string()]);

    let port = server.port().to_string();
    let mut workers = Workers(Vec::new());
    let mut pipes = Vec::new();
    for i in 0..WORKERS {
        let owner = format!("worker-{i}");
        let mut child = Command::new(&worker)
            .args([port.as_str(), owner.as_str()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", worker.display()));
        let stdout = drain(child.stdout.take().expect("piped stdout"));
        let stderr = drain(child.stderr.take().expect("piped stderr"));
        workers.0.push(child);
        pipes.push((owner, stdout, stderr));
    }

    let started = Instant::now();
    let mut statuses = vec![None; WORKERS];
    while statuses.iter().any(Option::is_none) {
        for (child, status) in workers.0.iter_mut().zip(&mut statuses) {
            if status.is_none() {
                *status = child.try_wait().expect("poll a worker");
            }
        }
        assert!(
            started.elapsed() < DEADLINE,
            "workers still running after {DEADLINE:?}; stock is {:?}",
            c.value::<Option<String>, _>(&["GET", "stock"])
        );
        thread::sleep(Duration::from_millis(20));
    }

    let mut reports = Vec::new();
    for ((owner, stdout, stderr), status) in pipes.into_iter().zip(statuses) {
        let stdout = stdout.join().expect("stdout reader");
        let stderr = stderr.join().expect("stderr reader");
        let status = status.expect("exited");
        assert!(status.success(), "{owner} failed ({status}):\n{stderr}");
        reports.push((owner.clone(), parse(&owner, &stdout)));
    }

    let sales: i64 = reports.iter().map(|(_, r)| r.sales).sum();
    assert_eq!(sales, STOCK, "items sold");
    assert_eq!(c.value::<String, _>(&["GET", "stock"]), "0", "stock left");
    for (owner, report) in &reports {
        assert!(
            report.negatives.is_empty(),
            "{owner} read a negative stock: {:?}",
            report.negatives
        );
        assert_eq!(report.timeouts, 0, "{owner}'s WAIT 10000 timed out");
        assert!(
            report.fences.windows(2).all(|w| w[0] < w[1]),
            "{owner}'s fences do not rise: {:?}",
            report.fences
        );
    }

    // Every acquisition issued a fence of its own, and the server's list,
    // appended under the lock, is the acquisition order: strictly rising.
    let all: Vec<i64> = reports.iter().flat_map(|(_, r)| r.fences.clone()).collect();
    let distinct: HashSet<i64> = all.iter().copied().collect();
    assert_eq!(distinct.len(), all.len(), "a fence was issued twice");
    let order: Vec<i64> = c.value(&["LRANGE", "fences", "0", "-1"]);
    assert_eq!(order.len(), all.len(), "RPUSH fences once per acquisition");
    if let Some(i) = order.windows(2).position(|w| w[0] >= w[1]) {
        panic!(
            "fences in acquisition order do not rise: #{i} {} then {}",
            order[i],
            order[i + 1]
        );
    }
    assert_eq!(order.iter().copied().collect::<HashSet<_>>(), distinct);
    // Each worker stops after one round that finds the stock empty.
    assert_eq!(all.len(), STOCK as usize + WORKERS, "acquisitions");

    // Every acquisition was fresh (hand-offs included); the lock was passed
    // from waiter to waiter; nothing is left held or waiting.
    assert_eq!(server.info_int("lock", "lock_acquired"), all.len() as i64);
    assert!(
        server.info_int("lock", "lock_handoffs") > 0,
        "no worker ever waited"
    );
    assert_eq!(server.info_int("lock", "lock_wait_timeouts"), 0);
    assert_eq!(server.info_int("lock", "lock_waiting"), 0);
    assert_eq!(server.info_int("lock", "lock_held"), 0);
    assert_eq!(c.lock_info("inventory:lock"), None);
}
