//! The workloads: what one operation is, for each row of the table.
//!
//! Every operation waits for its replies before the next one starts
//! (pipeline 1), and every reply is checked: a workload that went wrong (a
//! nil grant, an error) fails the run instead of counting the wrong path.

use std::thread;
use std::time::{Duration, Instant};

use crate::callgrind::{Idle, VgServer};
use crate::resp::{Conn, Reply};
use crate::stats::uuid;
use crate::Res;

/// Lease of every lock and TTL of every key the workloads set: longer than
/// any run, so nothing expires while it is counted.
pub const TTL_MS: &str = "600000";

/// Something that runs `n` operations on a server, sending each command
/// only once the server is idle.
pub trait Workload {
    fn run(&mut self, n: usize, idle: &Idle) -> Res<()>;
}

/// What a reply must be.
#[derive(Clone, Copy, Debug)]
pub enum Expect {
    Ok,
    Int(i64),
    AnyInt,
    Bulk,
}

impl Expect {
    fn matches(self, reply: &Reply) -> bool {
        match (self, reply) {
            (Expect::Ok, Reply::Status(s)) => s == "OK",
            (Expect::Int(want), Reply::Int(got)) => want == *got,
            (Expect::AnyInt, Reply::Int(_)) => true,
            (Expect::Bulk, Reply::Bulk(_)) => true,
            _ => false,
        }
    }
}

/// An operation of one or more commands on one connection, each sent after
/// the previous one's reply.
pub struct Steps {
    con: Conn,
    steps: Vec<(Vec<String>, Expect)>,
}

impl Steps {
    /// `setup` commands run once (their replies must not be errors); each
    /// operation then runs `steps` in order.
    pub fn new(server: &VgServer, setup: &[&[&str]], steps: &[(&[&str], Expect)]) -> Res<Steps> {
        let mut con = server.conn()?;
        for args in setup {
            con.call(args)?.check(&args.join(" "))?;
        }
        let owned = |a: &[&str]| a.iter().map(ToString::to_string).collect();
        Ok(Steps {
            con,
            steps: steps.iter().map(|(a, e)| (owned(a), *e)).collect(),
        })
    }
}

impl Workload for Steps {
    fn run(&mut self, n: usize, idle: &Idle) -> Res<()> {
        for _ in 0..n {
            for (args, expect) in &self.steps {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                idle.wait()?;
                let reply = self.con.call(&args)?;
                if !expect.matches(&reply) {
                    return Err(
                        format!("{}: expected {expect:?}, got {reply:?}", args.join(" ")).into(),
                    );
                }
            }
        }
        Ok(())
    }
}

/// What is handed round a ring of clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Token {
    /// A lock: released with `LOCK.RELEASE`, waited for with
    /// `LOCK.ACQUIRE … WAIT <ms>` (0: no limit).
    Lock { wait_ms: u64 },
    /// Redis's own FIFO hand-off: an element `RPUSH`ed onto a list that the
    /// others wait on with `BLPOP … <s>` (0: no limit).
    List { timeout_s: u64 },
}

const RING_KEY: &str = "ring";

/// `waiters + 1` clients passing one token round: the holder hands it over
/// and queues again at the back, in one write (so it is queued before the
/// client it handed to can do anything); the client that waited longest gets
/// it. One operation = one hand-off: the holder's two commands, the grant and
/// its reply to the waiter.
pub struct Ring {
    token: Token,
    clients: Vec<Conn>,
    owners: Vec<String>,
    holder: usize,
}

impl Ring {
    /// Client 0 takes the token; the others queue one by one, each after the
    /// previous one is seen blocked, so the queue order is the client order.
    pub fn set_up(server: &VgServer, token: Token, waiters: usize) -> Res<Ring> {
        let mut control = server.conn()?;
        let base = blocked_clients(&mut control)?;
        let mut ring = Ring {
            token,
            clients: Vec::with_capacity(waiters + 1),
            owners: (0..=waiters).map(|_| format!("{}:1", uuid())).collect(),
            holder: 0,
        };
        for _ in 0..=waiters {
            ring.clients.push(server.conn()?);
        }
        if let Token::Lock { .. } = token {
            let args = ["LOCK.ACQUIRE", RING_KEY, &ring.owners[0], TTL_MS];
            let reply = ring.clients[0].call(&args)?;
            if !Expect::AnyInt.matches(&reply) {
                return Err(format!("ring: the first acquire answered {reply:?}").into());
            }
        }
        for i in 1..=waiters {
            let args = ring.wait_args(i);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            ring.clients[i].send(&args)?;
            wait_until_blocked(&mut control, base + i as u64)?;
        }
        Ok(ring)
    }

    fn wait_args(&self, i: usize) -> Vec<String> {
        let v = |a: &[&str]| a.iter().map(ToString::to_string).collect();
        match self.token {
            Token::Lock { wait_ms } => v(&[
                "LOCK.ACQUIRE",
                RING_KEY,
                &self.owners[i],
                TTL_MS,
                "WAIT",
                &wait_ms.to_string(),
            ]),
            Token::List { timeout_s } => v(&["BLPOP", RING_KEY, &timeout_s.to_string()]),
        }
    }

    fn release_args(&self, i: usize) -> Vec<String> {
        let v = |a: &[&str]| a.iter().map(ToString::to_string).collect();
        match self.token {
            Token::Lock { .. } => v(&["LOCK.RELEASE", RING_KEY, &self.owners[i]]),
            Token::List { .. } => v(&["RPUSH", RING_KEY, "t"]),
        }
    }
}

impl Workload for Ring {
    fn run(&mut self, n: usize, idle: &Idle) -> Res<()> {
        for _ in 0..n {
            idle.wait()?;
            let h = self.holder;
            let next = (h + 1) % self.clients.len();
            let release = self.release_args(h);
            let wait = self.wait_args(h);
            let holder = &mut self.clients[h];
            holder.queue(&release.iter().map(String::as_str).collect::<Vec<_>>());
            holder.queue(&wait.iter().map(String::as_str).collect::<Vec<_>>());
            holder.flush()?;
            let released = holder.read()?;
            let want = match self.token {
                // The count left: 0, the lock is free (and handed over).
                Token::Lock { .. } => Expect::Int(0),
                // The list's length after the push, before the waiter pops it.
                Token::List { .. } => Expect::Int(1),
            };
            if !want.matches(&released) {
                return Err(format!("ring: the release answered {released:?}").into());
            }
            let granted = self.clients[next].read()?;
            let ok = match self.token {
                Token::Lock { .. } => matches!(granted, Reply::Int(_)),
                Token::List { .. } => matches!(&granted, Reply::Array(kv) if kv.len() == 2),
            };
            if !ok {
                return Err(format!("ring: the waiter was answered {granted:?}").into());
            }
            self.holder = next;
        }
        Ok(())
    }
}

fn blocked_clients(control: &mut Conn) -> Res<u64> {
    info_u64(control, "clients", "blocked_clients")
}

/// One numeric field of `INFO <section>`.
pub fn info_u64(con: &mut Conn, section: &str, field: &str) -> Res<u64> {
    let reply = con.call(&["INFO", section])?;
    let Reply::Bulk(text) = reply else {
        return Err(format!("INFO {section} answered {reply:?}").into());
    };
    String::from_utf8_lossy(&text)
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| format!("INFO {section} has no numeric {field}").into())
}

fn wait_until_blocked(control: &mut Conn, want: u64) -> Res<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = blocked_clients(control)?;
        if now == want {
            return Ok(());
        }
        if now > want || Instant::now() > deadline {
            return Err(format!("waiting for {want} blocked clients: {now}").into());
        }
        thread::sleep(Duration::from_millis(1));
    }
}

/// A lock in use: handed over once from one client to another, and the
/// first waiting for it again (`LOCK.ACQUIRE … WAIT 0`); where the module is
/// not loaded, the same with Redis's own hand-off (`RPUSH` to a client in
/// `BLPOP`). Some costs begin with the first hand-off a server makes. The
/// client waits while the connections live.
pub fn lock_in_use(server: &VgServer, module: bool) -> Res<[Conn; 2]> {
    let mut control = server.conn()?;
    let base = blocked_clients(&mut control)?;
    let mut ring = Ring::set_up(server, lock_or_list(module), 1)?;
    ring.run(1, &server.idle())?;
    wait_until_blocked(&mut control, base + 1)?;
    let [a, b]: [Conn; 2] = ring
        .clients
        .try_into()
        .map_err(|_| "a ring of one waiter has two clients")?;
    Ok([a, b])
}

/// The token a hand-off passes with or without the module, without limits.
pub fn lock_or_list(module: bool) -> Token {
    if module {
        Token::Lock { wait_ms: 0 }
    } else {
        Token::List { timeout_s: 0 }
    }
}

/// Takes `n` locks `held:<i>`, each by its own owner with a long lease:
/// module locks, or the string recipe's `SET NX PX` where the module is not
/// loaded.
pub fn hold_locks(server: &VgServer, module: bool, n: usize) -> Res<()> {
    let mut con = server.conn()?;
    for start in (0..n).step_by(1_000) {
        let end = (start + 1_000).min(n);
        for i in start..end {
            let key = format!("held:{i}");
            let owner = format!("{}:1", uuid());
            if module {
                con.queue(&["LOCK.ACQUIRE", &key, &owner, "3600000"]);
            } else {
                con.queue(&["SET", &key, &owner, "NX", "PX", "3600000"]);
            }
        }
        con.flush()?;
        for _ in start..end {
            let reply = con.read()?;
            if !matches!(&reply, Reply::Int(_)) && !Expect::Ok.matches(&reply) {
                return Err(format!("holding locks: acquire answered {reply:?}").into());
            }
        }
    }
    Ok(())
}
