//! Hand-off cost with N clients waiting on one lock (measurement 5, second
//! half): server CPU per hand-off from `INFO cpu` deltas, for N = 10 … 10,000.
//!
//! One thread drives all N clients, each on its own connection. The queue is
//! kept N long: a client that got the lock releases it and at once waits
//! again, so every hand-off happens with N clients waiting (draining the queue
//! once would give N = 10 only ten hand-offs, too few to measure).
//!
//! - **Module**: each client sends `LOCK.ACQUIRE … WAIT 0` and blocks. The
//!   clients are queued one by one (each waits until `LOCK.INFO` counts it),
//!   so the FIFO order is known: the driver reads the fence from the client
//!   whose turn it is, then sends its `LOCK.RELEASE` and its next
//!   `LOCK.ACQUIRE … WAIT 0` in one write. A client not served in turn is an
//!   error (the spec promises FIFO).
//! - **Hash recipe**: each client is one RESP3 connection, subscribed to the
//!   lock's channel and running commands on it too. Every release message
//!   makes every waiting client retry the acquire script; the winner releases
//!   (another message) and waits again. Sockets are polled without blocking.
//!   Each hand-off costs O(N) here, so the run is bounded by time, not count.
//! - **Raw Redis** baseline: the module's loop with `BLPOP` for the wait and
//!   `LPUSH` for the release — Redis's own first-come-first-served hand-off.

use std::io;
use std::thread;
use std::time::{Duration, Instant};

use crate::locks::{channel, Scripts};
use crate::resp::{Conn, Reply};
use crate::server::{open_files_limit, server_cpu_seconds, Server};
use crate::Res;

const TTL: &str = "600000";
/// A client not served within this after its turn came means a lost hand-off.
const TURN_TIMEOUT: Duration = Duration::from_secs(5);

/// One measured run.
#[derive(Clone, Copy, Debug)]
pub struct Drain {
    pub handoffs: usize,
    /// Server main-thread CPU per hand-off, microseconds.
    pub cpu_us_per_handoff: f64,
}

/// The most waiting clients this machine allows: the server's `maxclients`
/// (lowered by Redis if it cannot raise its own open-files limit) and this
/// process's open-files limit, less what the bench needs itself.
pub fn max_waiters(server: &Server) -> Res<usize> {
    let mut con = server.control()?;
    let reply: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxclients")
        .query(&mut con)?;
    let maxclients: usize = reply.get(1).and_then(|v| v.parse().ok()).unwrap_or(0);
    let files = open_files_limit().unwrap_or(1024);
    Ok(maxclients.saturating_sub(16).min(files.saturating_sub(256)))
}

/// A queue Redis serves first come, first served: the module's waiters, or
/// (the raw-Redis baseline) clients blocked in `BLPOP` on a list, handed one
/// element each by `LPUSH`. Both run the same loop, so their growth with N
/// can be compared: what the baseline's grows by comes from the server and
/// the kernel (more connections, colder caches), not from a lock's queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fifo {
    Module,
    Blpop,
}

impl Fifo {
    fn key(self) -> &'static str {
        match self {
            Fifo::Module => "drain:module",
            Fifo::Blpop => "drain:list",
        }
    }

    /// Queues client `i` (its reply comes when it is served).
    fn wait(self, c: &mut Conn, i: usize) {
        match self {
            Fifo::Module => c.queue(&["LOCK.ACQUIRE", self.key(), &owner(i), TTL, "WAIT", "0"]),
            Fifo::Blpop => c.queue(&["BLPOP", self.key(), "0"]),
        }
    }

    /// Hands the lock (or the element) on: its reply is an integer.
    fn hand_on(self, c: &mut Conn, i: usize) {
        match self {
            Fifo::Module => c.queue(&["LOCK.RELEASE", self.key(), &owner(i)]),
            Fifo::Blpop => c.queue(&["LPUSH", self.key(), "x"]),
        }
    }

    /// Clients waiting now.
    fn waiting(self, control: &mut Conn) -> Res<Option<i64>> {
        let reply = match self {
            Fifo::Module => control.call(&["LOCK.INFO", self.key()])?,
            Fifo::Blpop => control.call(&["INFO", "clients"])?,
        }
        .check("waiting count")?;
        Ok(match (self, &reply) {
            (Fifo::Module, Reply::Array(fields)) => fields
                .chunks(2)
                .find(|kv| {
                    matches!(&kv[0], Reply::Status(k) if k == "waiters")
                        || matches!(&kv[0], Reply::Bulk(k) if k == b"waiters")
                })
                .and_then(|kv| kv.get(1)?.int()),
            (Fifo::Blpop, Reply::Bulk(text)) => String::from_utf8_lossy(text)
                .lines()
                .find_map(|l| l.strip_prefix("blocked_clients:")?.trim().parse().ok()),
            _ => None,
        })
    }
}

/// A waiter's owner token (36 characters + ":1", as elsewhere).
fn owner(i: usize) -> String {
    format!("waiter-{i:05}-0000-0000-000000000000:1")
}

/// Up to `handoffs` hand-offs (or until `limit`) with `n` clients waiting.
pub fn fifo(server: &Server, kind: Fifo, n: usize, handoffs: usize, limit: Duration) -> Res<Drain> {
    let key = kind.key();
    let mut control = server.conn()?;
    control.call(&["DEL", key])?.check("DEL")?;
    let mut holder = server.conn()?;
    if kind == Fifo::Module {
        holder
            .call(&["LOCK.ACQUIRE", key, "holder", TTL])?
            .check("LOCK.ACQUIRE")?;
    }

    // One by one, so the order they are served in is the order here.
    let mut waiters = Vec::with_capacity(n);
    for i in 0..n {
        let mut w = server
            .conn()
            .map_err(|e| format!("connecting waiter {i} of {n}: {e}"))?;
        kind.wait(&mut w, i);
        w.flush()?;
        let deadline = Instant::now() + TURN_TIMEOUT;
        loop {
            let waiting = kind.waiting(&mut control)?;
            if waiting == Some(i as i64 + 1) {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{key}: {} clients waiting, expected {}",
                    waiting.unwrap_or(-1),
                    i + 1
                )
                .into());
            }
            thread::sleep(Duration::from_micros(50));
        }
        waiters.push(w);
    }

    let mut con = server.control()?;
    let cpu_before = server_cpu_seconds(&mut con)?;
    let started = Instant::now();
    match kind {
        Fifo::Module => holder.call(&["LOCK.RELEASE", key, "holder"])?,
        Fifo::Blpop => holder.call(&["LPUSH", key, "x"])?,
    }
    .check("first hand-off")?;
    let mut done = 0;
    while done < handoffs && started.elapsed() < limit {
        let i = done % n;
        let w = &mut waiters[i];
        if done >= n {
            // The reply to this client's previous hand-on.
            expect(w, i, "the reply to its release", |r| {
                matches!(r, Reply::Int(_))
            })?;
        }
        expect(w, i, "its turn", |r| {
            matches!(r, Reply::Int(_) | Reply::Array(_))
        })?;
        kind.hand_on(w, i);
        kind.wait(w, i);
        w.flush()?;
        done += 1;
    }
    let cpu = server_cpu_seconds(&mut con)? - cpu_before;
    drop(waiters);
    control.call(&["DEL", key])?;
    Ok(Drain {
        handoffs: done,
        cpu_us_per_handoff: cpu * 1e6 / done.max(1) as f64,
    })
}

fn expect(w: &mut Conn, i: usize, what: &str, ok: impl Fn(&Reply) -> bool) -> Res<()> {
    match w.read_until(Instant::now() + TURN_TIMEOUT)? {
        Some(reply) if ok(&reply) => Ok(()),
        Some(other) => Err(format!("waiter {i} was answered {other:?} for {what}").into()),
        None => Err(format!(
            "waiter {i} did not get {what} within {TURN_TIMEOUT:?} \
             (hand-off not first come, first served, or lost)"
        )
        .into()),
    }
}

/// Where one hash-recipe client is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    /// Subscribed, waiting for a release message.
    Waiting,
    /// Acquire script sent; `woken`: a message came meanwhile.
    Trying { woken: bool },
    /// Holds the lock, release script sent.
    Releasing { woken: bool },
    /// Won the last hand-off of the run: holds the lock, does nothing more.
    Holding,
}

/// The hash recipe: `n` clients waiting, for `window` (at most `max_handoffs`).
pub fn hash(
    server: &Server,
    scripts: &Scripts,
    n: usize,
    window: Duration,
    max_handoffs: usize,
) -> Res<Drain> {
    let key = "drain:hash";
    let chan = channel(key);
    let acquire = |c: &mut Conn, i: usize| {
        c.queue(&["EVALSHA", &scripts.hash_acquire, "1", key, TTL, &owner(i)]);
    };
    let release = |c: &mut Conn, i: usize| {
        c.queue(&["EVALSHA", &scripts.hash_release, "1", key, TTL, &owner(i)]);
    };
    let mut holder = server.conn()?;
    holder.call(&["DEL", key])?.check("DEL")?;
    holder
        .call(&["EVALSHA", &scripts.hash_acquire, "1", key, TTL, "holder"])?
        .check("EVALSHA")?;

    let mut clients = Vec::with_capacity(n);
    for i in 0..n {
        let mut c = server
            .conn()
            .map_err(|e| format!("connecting waiter {i} of {n}: {e}"))?;
        c.queue(&["HELLO", "3"]);
        c.queue(&["SUBSCRIBE", &chan]);
        acquire(&mut c, i);
        c.flush()?;
        c.read()?.check("HELLO")?;
        let sub = c.read()?;
        if !sub.is_pubsub("subscribe") {
            return Err(format!("SUBSCRIBE answered {sub:?}").into());
        }
        match c.read()?.check("EVALSHA")? {
            Reply::Int(_) => {}
            other => return Err(format!("a waiter's first try answered {other:?}").into()),
        }
        c.set_nonblocking(true)?;
        clients.push(c);
    }
    let mut states = vec![State::Waiting; n];

    let mut con = server.control()?;
    let cpu_before = server_cpu_seconds(&mut con)?;
    let started = Instant::now();
    holder
        .call(&["EVALSHA", &scripts.hash_release, "1", key, TTL, "holder"])?
        .check("EVALSHA")?;
    let mut handoffs = 0;
    let mut stopping = false;
    let hard_limit = window + Duration::from_secs(60);
    loop {
        let mut busy = 0;
        for (i, c) in clients.iter_mut().enumerate() {
            while let Some(reply) = c.poll_reply()? {
                let message = reply.is_pubsub("message");
                states[i] = match (states[i], reply) {
                    (State::Waiting, _) if message => {
                        if stopping {
                            State::Waiting
                        } else {
                            acquire(c, i);
                            State::Trying { woken: false }
                        }
                    }
                    (State::Trying { .. }, _) if message => State::Trying { woken: true },
                    (State::Releasing { .. }, _) if message => State::Releasing { woken: true },
                    (State::Holding, _) if message => State::Holding,
                    (State::Trying { .. }, Reply::Nil) => {
                        handoffs += 1;
                        if handoffs >= max_handoffs || started.elapsed() >= window {
                            stopping = true;
                        }
                        if stopping {
                            State::Holding
                        } else {
                            release(c, i);
                            State::Releasing { woken: false }
                        }
                    }
                    (State::Trying { woken }, Reply::Int(_))
                    | (State::Releasing { woken }, Reply::Int(1)) => {
                        if woken && !stopping {
                            acquire(c, i);
                            State::Trying { woken: false }
                        } else {
                            State::Waiting
                        }
                    }
                    (_, other) => {
                        return Err(format!("hash waiter {i}: unexpected {other:?}").into())
                    }
                };
            }
            c.try_flush()
                .map_err(|e| io::Error::new(e.kind(), format!("waiter {i}: {e}")))?;
            busy += usize::from(matches!(
                states[i],
                State::Trying { .. } | State::Releasing { .. }
            ));
        }
        if stopping && busy == 0 {
            break;
        }
        if started.elapsed() > hard_limit {
            return Err(format!(
                "hash recipe with {n} waiters did not settle within {hard_limit:?}"
            )
            .into());
        }
    }
    let cpu = server_cpu_seconds(&mut con)? - cpu_before;
    drop(clients);
    holder.call(&["DEL", key])?;
    Ok(Drain {
        handoffs,
        cpu_us_per_handoff: cpu * 1e6 / handoffs.max(1) as f64,
    })
}
