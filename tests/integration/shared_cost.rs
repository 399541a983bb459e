//! What a shared lock's events cost does not grow with the clients waiting
//! on it nor with the owners sharing it: a hand-off and a refused try cost
//! the same behind 300 or 3,000 waiters, so does a waiter leaving the head of
//! the queue (which serves it again), a reader's acquire, renewal and
//! release the same beside 50 or 2,000 readers, and replicas receive that
//! one change, not the holder list. Each cost test measures two sizes in one run, by the server's own
//! count of the time spent in a command (`INFO commandstats`), and compares
//! the cheapest quarter of many rounds: whatever else the machine runs
//! only adds.

use crate::harness::*;

/// The microseconds the server has spent in `command` so far.
fn usec(admin: &mut redis::Connection, command: &str) -> i64 {
    let info: String = admin.value(&["INFO", "commandstats"]);
    let prefix = format!("cmdstat_{command}:");
    info.lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').find_map(|f| f.strip_prefix("usec=")))
        .and_then(|n| n.parse::<i64>().ok())
        .unwrap_or(0)
}

/// The sum of the cheapest quarter of `costs`.
fn cheapest_quarter(mut costs: Vec<i64>) -> i64 {
    costs.sort_unstable();
    costs[..costs.len() / 4].iter().sum()
}

/// `n` clients, each on a connection of its own, waiting on `key` with
/// `LOCK.ACQUIRE key <tag><i> LONG [opts] WAIT 0`, in that order; returns
/// once the server shows them all waiting.
fn waiting(
    server: &Server,
    key: &str,
    tag: &str,
    n: usize,
    opts: &[&str],
) -> Vec<redis::Connection> {
    let before = server.lock_info(key).map_or(0, |info| info.waiters);
    let long = LONG.to_string();
    let conns = (0..n)
        .map(|i| {
            let mut conn = server.conn();
            let owner = format!("{tag}{i}");
            let mut cmd = redis::cmd("LOCK.ACQUIRE");
            cmd.arg(&[key, &owner, &long]).arg(opts).arg(&["WAIT", "0"]);
            conn.send_packed_command(&cmd.get_packed_command())
                .expect("send the wait");
            conn
        })
        .collect();
    wait_until(
        &format!("{n} wait on {key}"),
        std::time::Duration::from_secs(60),
        || server.lock_info(key).map_or(0, |info| info.waiters) == before + n as i64,
    );
    conns
}

/// A `SHARED LIMIT 1` lock `key` held by one owner, with `n` waiters behind.
struct Permit {
    key: String,
    holder: String,
    _waiters: Vec<redis::Connection>,
}

impl Permit {
    fn new(server: &Server, admin: &mut redis::Connection, n: usize) -> Permit {
        let key = format!("sem{n}");
        let holder = format!("{key}:h");
        let long = LONG.to_string();
        admin
            .call(&["LOCK.ACQUIRE", &key, &holder, &long, "SHARED", "LIMIT", "1"])
            .expect("the first permit");
        let sem = ["SHARED", "LIMIT", "1"];
        let waiters = waiting(server, &key, &format!("{key}:w"), n, &sem);
        Permit {
            key,
            holder,
            _waiters: waiters,
        }
    }

    /// One release handing the permit to the next waiter: its cost.
    fn hand_off(&mut self, server: &Server, admin: &mut redis::Connection) -> i64 {
        let before = usec(admin, "lock.release");
        assert_eq!(admin.int(&["LOCK.RELEASE", &self.key, &self.holder]), 0);
        let cost = usec(admin, "lock.release") - before;
        let info = server.lock_info(&self.key).expect("handed over");
        self.holder = info.holders[0].owner.clone();
        assert_ne!(self.holder, "", "a waiter holds the permit");
        cost
    }
}

/// Runs `small` and `large` alternately `rounds` times each (so the load of
/// the machine weighs on both alike), and compares their cheapest quarters.
fn compare(
    what: &str,
    rounds: usize,
    mut small: impl FnMut() -> i64,
    mut large: impl FnMut() -> i64,
) {
    let (mut smalls, mut larges) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        smalls.push(small());
        larges.push(large());
    }
    let (small, large) = (cheapest_quarter(smalls), cheapest_quarter(larges));
    let ratio = large as f64 / small.max(1) as f64;
    eprintln!("{what}: {small} vs {large} µs (ratio {ratio:.2})");
    assert!(ratio < 2.0, "{what}: {large} µs against {small} µs");
}

#[test]
fn a_shared_hand_off_costs_the_same_behind_300_or_3000_waiters() {
    let server = Server::start();
    let mut admin = server.conn();
    let mut small = Permit::new(&server, &mut admin, 300);
    let mut large = Permit::new(&server, &mut admin, 3_000);
    let admin = std::cell::RefCell::new(admin);
    compare(
        "shared hand-off behind 300 vs 3,000 waiters",
        150,
        || small.hand_off(&server, &mut admin.borrow_mut()),
        || large.hand_off(&server, &mut admin.borrow_mut()),
    );
}

/// A `SHARED LIMIT 1` lock held by one owner with `n` permit requests
/// waiting, each on its own connection, oldest first with its client id.
struct Queue {
    key: String,
    owner: usize,
    waiters: std::collections::VecDeque<(i64, redis::Connection)>,
}

impl Queue {
    fn new(server: &Server, admin: &mut redis::Connection, n: usize) -> Queue {
        let key = format!("leave{n}");
        let long = LONG.to_string();
        admin
            .call(&[
                "LOCK.ACQUIRE",
                &key,
                "holder",
                &long,
                "SHARED",
                "LIMIT",
                "1",
            ])
            .expect("the permit");
        let mut queue = Queue {
            key,
            owner: 0,
            waiters: std::collections::VecDeque::new(),
        };
        for _ in 0..n {
            queue.join(server);
        }
        wait_until(
            &format!("{n} wait on {}", queue.key),
            std::time::Duration::from_secs(60),
            || server.lock_info(&queue.key).map_or(0, |info| info.waiters) == n as i64,
        );
        queue
    }

    /// A new permit request joins at the back.
    fn join(&mut self, server: &Server) {
        let mut conn = server.conn();
        let id = conn.int(&["CLIENT", "ID"]);
        let owner = format!("{}:w{}", self.key, self.owner);
        self.owner += 1;
        let long = LONG.to_string();
        let mut cmd = redis::cmd("LOCK.ACQUIRE");
        cmd.arg(&[self.key.as_str(), &owner, &long])
            .arg(&["SHARED", "LIMIT", "1", "WAIT", "0"]);
        conn.send_packed_command(&cmd.get_packed_command())
            .expect("send the wait");
        self.waiters.push_back((id, conn));
    }

    /// The first in line leaves (its connection is killed, so the queue is
    /// served again at once, inside `CLIENT KILL`): its cost. Then another
    /// request joins at the back, so the queue keeps its length.
    fn head_leaves(&mut self, server: &Server, admin: &mut redis::Connection) -> i64 {
        let (id, _conn) = self.waiters.pop_front().expect("a waiter");
        let before = usec(admin, "client|kill");
        assert_eq!(admin.int(&["CLIENT", "KILL", "ID", &id.to_string()]), 1);
        let cost = usec(admin, "client|kill") - before;
        let n = self.waiters.len() as i64;
        self.join(server);
        wait_until(
            "the new request waits",
            std::time::Duration::from_secs(60),
            || server.lock_info(&self.key).map_or(0, |info| info.waiters) == n + 1,
        );
        cost
    }
}

/// A waiter leaving the head of a shared queue serves the queue again
/// (the requests behind it may be let in now): that costs what it reads,
/// not the queue's length.
#[test]
fn a_waiter_leaving_the_head_costs_the_same_before_300_or_3000_waiters() {
    let server = Server::start();
    let mut admin = server.conn();
    let mut small = Queue::new(&server, &mut admin, 300);
    let mut large = Queue::new(&server, &mut admin, 3_000);
    let admin = std::cell::RefCell::new(admin);
    compare(
        "the head waiter leaving, before 300 vs 3,000 waiters",
        100,
        || small.head_leaves(&server, &mut admin.borrow_mut()),
        || large.head_leaves(&server, &mut admin.borrow_mut()),
    );
}

/// A lock `key` held exclusively with `n` exclusive requests waiting.
fn writers_waiting(
    server: &Server,
    admin: &mut redis::Connection,
    n: usize,
) -> (String, Vec<redis::Connection>) {
    let key = format!("rw{n}");
    admin
        .call(&["LOCK.ACQUIRE", &key, "x", &LONG.to_string()])
        .expect("held");
    let conns = waiting(server, &key, &format!("{key}:w"), n, &[]);
    (key, conns)
}

/// One non-blocking `SHARED` try of `key` (nil, writers wait): its cost.
fn refused_try(admin: &mut redis::Connection, key: &str) -> i64 {
    let before = usec(admin, "lock.acquire");
    let reply = admin.call(&["LOCK.ACQUIRE", key, "r", &LONG.to_string(), "SHARED"]);
    let cost = usec(admin, "lock.acquire") - before;
    assert_eq!(reply, Ok(redis::Value::Nil), "behind writers: nil");
    cost
}

#[test]
fn a_refused_shared_try_costs_the_same_behind_100_or_4000_writers() {
    let server = Server::start();
    let mut admin = server.conn();
    let (small, _a) = writers_waiting(&server, &mut admin, 100);
    let (large, _b) = writers_waiting(&server, &mut admin, 4_000);
    let admin = std::cell::RefCell::new(admin);
    compare(
        "a refused SHARED try behind 100 vs 4,000 writers",
        300,
        || refused_try(&mut admin.borrow_mut(), &small),
        || refused_try(&mut admin.borrow_mut(), &large),
    );
}

/// A read lock `key` shared by `n` readers.
fn readers(admin: &mut redis::Connection, key: &str, n: usize) {
    let mut pipe = redis::pipe();
    for i in 0..n {
        pipe.cmd("LOCK.ACQUIRE")
            .arg(key)
            .arg(format!("{key}:r{i}"))
            .arg(LONG)
            .arg("SHARED")
            .ignore();
    }
    let _: () = pipe.query(admin).expect("the readers");
}

/// One more reader's acquire, renewal and release of `key`: their cost.
fn one_share(admin: &mut redis::Connection, key: &str) -> i64 {
    let commands = ["lock.acquire", "lock.renew", "lock.release"];
    let before: i64 = commands.iter().map(|c| usec(admin, c)).sum();
    let long = LONG.to_string();
    admin
        .call(&["LOCK.ACQUIRE", key, "x", &long, "SHARED"])
        .expect("a share");
    admin.int(&["LOCK.RENEW", key, "x", &long]);
    assert_eq!(admin.int(&["LOCK.RELEASE", key, "x"]), 0);
    let after: i64 = commands.iter().map(|c| usec(admin, c)).sum();
    after - before
}

#[test]
fn a_change_to_one_share_costs_the_same_beside_50_or_2000_readers() {
    let server = Server::start();
    let mut admin = server.conn();
    readers(&mut admin, "r50", 50);
    readers(&mut admin, "r2000", 2_000);
    let admin = std::cell::RefCell::new(admin);
    compare(
        "a reader's acquire, renew and release beside 50 vs 2,000 readers",
        150,
        || one_share(&mut admin.borrow_mut(), "r50"),
        || one_share(&mut admin.borrow_mut(), "r2000"),
    );
}

/// What replicas receive for a change to one owner's share is that change,
/// not the lock's holder list: a few hundred bytes beside 2,000 readers.
/// The replica ends with the master's holders all the same.
#[test]
fn a_change_to_one_share_sends_replicas_that_change_only() {
    let master = Server::start();
    let replica = start_replica(&master, "replica");
    let mut admin = master.conn();
    readers(&mut admin, "r", 2_000);
    let long = LONG.to_string();
    let steps: [&[&str]; 5] = [
        &["LOCK.ACQUIRE", "r", "x", &long, "SHARED"],
        &["LOCK.REENTER", "r", "x"],
        &["LOCK.RENEW", "r", "x", &long],
        &["LOCK.RELEASE", "r", "x", "ALL"],
        &["LOCK.RELEASE", "r", "r:r7"],
    ];
    for step in steps {
        let before = master.info_int("replication", "master_repl_offset");
        admin.call(step).expect("the step");
        let sent = master.info_int("replication", "master_repl_offset") - before;
        assert!(sent < 1_000, "{step:?} sent {sent} bytes to replicas");
    }
    replica.catch_up_with(&master);
    assert_eq!(replica.digest(), master.digest());
    let holders = replica.lock_info("r").expect("held").holders;
    assert_eq!(holders.len(), 1_999);
}
