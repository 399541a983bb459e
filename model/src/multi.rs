//! Model 5: several locks at once — clients asking for two or three locks
//! in crossing orders (`[a, b]` beside `[b, a]`), beside clients asking for
//! one, each as one `LOCK.MACQUIRE` (with `WAIT` or without), then renewing
//! (`LOCK.MRENEW`), releasing (`LOCK.MRELEASE`) or crashing holding (its
//! holds end with their lease). Leases end as time ticks; a parked client
//! is granted or answered nil at its deadline.
//!
//! The server side is the module's own sequencing, [`orchestrate`]'s
//! `acquire_all`, `renew_all` and `release_all` over the hand-off
//! [`Engine`], on this file's [`Host`]: each lock's key is its [`Holds`]
//! (a single exclusive hold shown as [`Stored::One`], as the module stores
//! it), a lease check an armed time and lock, a reply a change of the
//! client. The properties:
//!
//! - **No deadlock**: a server with no work due leaves no request waiting
//!   whose locks are all free.
//! - **Nobody overtaken on any lock**: no fresh hold of a lock goes to a
//!   request while one that parked earlier and names that lock still waits.
//! - **Never a partial hold**: a request holds all its locks or none, at
//!   the server, whatever the interleaving; and no lock has two holders.
//!
//! With [`Flaw::OneByOne`], each client asks for its locks one at a time
//! with `LOCK.ACQUIRE … WAIT`, holding the first while it waits for the
//! next (as client-side multi-locks do): the checker shows the hold-and-wait
//! that the one request avoids. The arrival order taken out of the serve is
//! planted in the core (`tests/planted.rs`).

use std::fmt;

use redislock_core::error::LockError;
use redislock_core::fence;
use redislock_core::handoff::{Engine, Gate, Timer};
use redislock_core::holds::{Holds, Mode};
use redislock_core::lock::{self, Hold};
use redislock_core::orchestrate::{
    self, Acquired, AcquiredAll, Event, Host, Nil, Read, Removal, Stored, Write,
};
use redislock_core::queue::LockName;
use stateright::{Model, Property};

use crate::{holds_key, Fence};

const OWNERS: [&[u8]; 4] = [b"c0", b"c1", b"c2", b"c3"];
const KEYS: [&[u8]; 3] = [b"a", b"b", b"c"];

/// A client that asks for the wrong thing, to see the checker find what the
/// protection it bypasses is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Flaw {
    /// Each lock asked for alone, in the client's order, each with `WAIT`:
    /// the first is held while the client waits for the next.
    OneByOne,
}

#[derive(Clone, Debug)]
pub struct Bounds {
    /// One client per entry: the locks it asks for, in its order (indexes
    /// into `a`, `b`, `c`).
    pub requests: Vec<Vec<u8>>,
    /// `Some(n)`: every lock is a semaphore of `n` permits (`SHARED LIMIT
    /// n`), and client `i` asks for `permits[i]` of them (`PERMITS k`);
    /// `None`: exclusive holds.
    pub semaphore: Option<u32>,
    pub permits: Vec<u32>,
    /// The last tick.
    pub horizon: u64,
    /// The lease clients ask for, in ticks.
    pub ttl: u64,
    /// The `WAIT` timeout of a blocking acquire, in ticks.
    pub wait: u64,
    /// Commands per client (acquire, renew, release, crash).
    pub commands: u8,
    /// Clients that crash holding, in the whole run.
    pub crashes: u8,
    /// Also try `LOCK.MACQUIRE` without `WAIT`.
    pub no_wait: bool,
    pub flaw: Option<Flaw>,
}

impl Bounds {
    /// Two clients asking for `a` and `b` in crossing orders, and one for
    /// `b` alone (`make test`).
    pub fn crossing() -> Bounds {
        Bounds {
            requests: vec![vec![0, 1], vec![1, 0], vec![1]],
            semaphore: None,
            permits: vec![1, 1, 1],
            horizon: 3,
            ttl: 2,
            wait: 2,
            commands: 2,
            crashes: 1,
            no_wait: false,
            flaw: None,
        }
    }

    /// A wide request for all three locks between narrow ones on each end
    /// (`make test`): the wide one is not starved.
    pub fn wide_and_narrow() -> Bounds {
        Bounds {
            requests: vec![vec![0], vec![2, 1, 0], vec![2]],
            ..Bounds::crossing()
        }
    }

    /// A semaphore of two permits asked for 1, 2 and 1 at a time
    /// (`make test`): at most two held, and the request for two, once
    /// first in line, is not overtaken by the requests for one.
    pub fn permits() -> Bounds {
        Bounds {
            requests: vec![vec![0], vec![0], vec![0]],
            semaphore: Some(2),
            permits: vec![1, 2, 1],
            ..Bounds::crossing()
        }
    }

    /// Several permits of two semaphores at once, in crossing orders
    /// (`make test`).
    pub fn permits_on_two() -> Bounds {
        Bounds {
            semaphore: Some(2),
            permits: vec![1, 2, 1],
            ..Bounds::crossing()
        }
    }

    /// Three requests in a cycle of orders (`[a, b]`, `[b, c]`, `[c, a]`),
    /// longer, with tries too (`make model`).
    pub fn full() -> Bounds {
        Bounds {
            requests: vec![vec![0, 1], vec![1, 2], vec![2, 0]],
            horizon: 4,
            wait: 3,
            commands: 3,
            no_wait: true,
            ..Bounds::crossing()
        }
    }
}

#[derive(Clone, Debug)]
pub struct MultiModel {
    pub bounds: Bounds,
}

fn name(key: u8) -> LockName {
    LockName::new(0, KEYS[key as usize])
}

fn key_of(name: &LockName) -> u8 {
    KEYS.iter()
        .position(|k| name == &LockName::new(0, k))
        .map_or(0, |i| i as u8)
}

/// Where a client is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Client {
    Idle,
    /// Parked, its `WAIT` deadline at this tick; with [`Flaw::OneByOne`],
    /// `got` locks of its request already held.
    Waiting {
        deadline: u64,
        got: u8,
    },
    /// Told it holds all its locks, until this tick.
    Holding {
        until: u64,
    },
    /// With [`Flaw::OneByOne`]: holds the first `got` of its locks and
    /// asks for the next with its next command.
    Partial {
        got: u8,
    },
    /// Crashed (or hung) holding: it sends nothing more, and may believe
    /// it holds until the lease end it was told.
    Crashed {
        until: u64,
    },
}

/// Things that must never happen, recorded when they do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct Broken {
    /// A fresh hold of a lock went to a request while one that parked
    /// earlier and names that lock still waited.
    overtaken: bool,
    /// A fresh fence was not above every fence issued before.
    fence_fell: bool,
    /// A client was answered that was not waiting, or a waiting one lost.
    answered_twice: bool,
    /// A grant of some of a request's locks but not all.
    partial_grant: bool,
}

/// Things the model should reach.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct Seen {
    /// A request for several locks granted from the queue.
    wide_from_queue: bool,
    /// A waiter answered nil at its deadline.
    timed_out: bool,
    /// Two requests in crossing orders waited at once.
    crossed: bool,
}

#[derive(Clone, PartialEq, Eq, Hash)]
pub struct State {
    now: u64,
    /// Each lock's key: its holds (none: the key does not exist).
    holds: Vec<Holds>,
    engine: Engine<u8>,
    /// Lease checks armed: (time, lock), sorted, once each.
    checks: Vec<(u64, u8)>,
    pumps: u8,
    /// The model's own record of the parked clients, in the order they
    /// parked.
    queue: Vec<u8>,
    fences: u64,
    last_fence: u64,
    clients: Vec<Client>,
    commands: Vec<u8>,
    crashes: u8,
    broken: Broken,
    seen: Seen,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// `LOCK.MACQUIRE` of the client's locks, with `WAIT` or without.
    Acquire {
        client: u8,
        wait: bool,
    },
    /// `LOCK.MRENEW` of its locks.
    Renew {
        client: u8,
    },
    /// `LOCK.MRELEASE` of its locks.
    Release {
        client: u8,
    },
    /// The holder stops: no renewal, no release.
    Crash {
        client: u8,
    },
    /// The lease check armed for this time and lock fires.
    Serve {
        at: u64,
        key: u8,
    },
    Pump,
    /// The deadline of a parked client: nil.
    Timeout {
        client: u8,
    },
    Tick,
}

impl MultiModel {
    fn owner(client: usize) -> &'static [u8] {
        OWNERS[client]
    }

    fn keys(&self, client: usize) -> &[u8] {
        &self.bounds.requests[client]
    }

    /// What client `client` asks for on each of its locks.
    fn ask(&self, client: usize) -> (Mode, u32) {
        match self.bounds.semaphore {
            Some(n) => (
                Mode::Shared { limit: Some(n) },
                self.bounds.permits.get(client).copied().unwrap_or(1),
            ),
            None => (Mode::Exclusive, 1),
        }
    }

    /// The client's request through the module's sequencing: all its locks
    /// in one `LOCK.MACQUIRE`, or (with the flaw) the next one alone.
    fn acquire(&self, s: &mut State, client: usize, wait: bool) {
        let wait_ms = wait.then_some(self.bounds.wait);
        let keys = self.keys(client).to_vec();
        if self.bounds.flaw == Some(Flaw::OneByOne) {
            let got = match s.clients[client] {
                Client::Partial { got } => got,
                _ => 0,
            };
            self.acquire_next(s, client, got, wait_ms);
            return;
        }
        let targets: Vec<&u8> = keys.iter().collect();
        let mut server = Server::command(s, self, client);
        let result = orchestrate::acquire_all(
            &mut server,
            &targets,
            Self::owner(client),
            self.ask(client),
            self.bounds.ttl,
            wait_ms,
        );
        server.done();
        match result {
            Ok(AcquiredAll::Held(holds)) => {
                s.granted_now(self, client, &holds);
            }
            Ok(AcquiredAll::Parked) => s.note_crossing(self),
            Ok(AcquiredAll::Nil) | Err(_) => s.clients[client] = Client::Idle,
        }
    }

    /// With [`Flaw::OneByOne`]: `LOCK.ACQUIRE` of the client's lock number
    /// `got`, the ones before it held.
    fn acquire_next(&self, s: &mut State, client: usize, got: u8, wait_ms: Option<u64>) {
        let key = self.keys(client)[got as usize];
        let mut server = Server::command(s, self, client);
        server.one_by_one_got = got;
        let result = orchestrate::acquire(
            &mut server,
            &key,
            Self::owner(client),
            Mode::Exclusive,
            self.bounds.ttl,
            wait_ms,
        );
        server.done();
        match result {
            Ok(Acquired::Held(hold)) => s.one_granted(self, client, got, &hold),
            Ok(Acquired::Parked) => s.note_crossing(self),
            Ok(Acquired::Nil) | Err(_) => s.clients[client] = Client::Idle,
        }
    }
}

// ---------------------------------------------------------------------------
// The glue: the model's world as the module's own sequencing sees it.
// ---------------------------------------------------------------------------

struct Server<'s> {
    s: &'s mut State,
    m: &'s MultiModel,
    caller: usize,
    /// With the flaw: the locks of the caller's request it already holds.
    one_by_one_got: u8,
    /// Locks [`Host::began`] announced in this step, per client: fresh
    /// holds, not reentries.
    began: Vec<(u8, u8)>,
}

impl<'s> Server<'s> {
    fn command(s: &'s mut State, m: &'s MultiModel, caller: usize) -> Self {
        Server {
            s,
            m,
            caller,
            one_by_one_got: 0,
            began: Vec::new(),
        }
    }

    fn on(s: &'s mut State, m: &'s MultiModel) -> Self {
        Self::command(s, m, usize::MAX)
    }

    fn done(self) {}

    /// Client `client` leaves the model's line, answered: where it stood.
    fn answered(&mut self, client: u8) -> Option<usize> {
        let at = self.s.queue.iter().position(|&c| c == client);
        match at {
            Some(at) => {
                self.s.queue.remove(at);
            }
            None => self.s.broken.answered_twice = true,
        }
        if !matches!(self.s.clients[client as usize], Client::Waiting { .. }) {
            self.s.broken.answered_twice = true;
        }
        at
    }
}

impl Host for Server<'_> {
    type Handle = u8;
    /// A lock: its index.
    type Target = u8;
    /// An open key: the lock's index.
    type Key = u8;

    fn engine<R>(&mut self, f: impl FnOnce(&mut Engine<u8>) -> R) -> R {
        f(&mut self.s.engine)
    }

    fn now(&self) -> u64 {
        self.s.now
    }

    fn lock_name(&self, &key: &u8) -> LockName {
        name(key)
    }

    fn open(&mut self, &key: &u8) -> u8 {
        self.open_name(&name(key), true)
    }

    /// Opening expires a key whose every lease has ended, as Redis would,
    /// and tells the module (`expired`): its waiters are served by a pump.
    fn open_name(&mut self, lock: &LockName, _in_command: bool) -> u8 {
        let key = key_of(lock);
        let s = &mut *self.s;
        let holds = &mut s.holds[key as usize];
        if !holds.is_empty() && holds.is_free(s.now) {
            *holds = Holds::free();
            if s.engine.anyone_waiting() {
                orchestrate::freed(&mut Server::on(s, self.m), name(key), true);
            }
        }
        key
    }

    fn key_now(&self, _: &u8) -> u64 {
        self.s.now
    }

    fn expires_at(&self, &key: &u8) -> Option<u64> {
        self.s.holds[key as usize].latest_lease()
    }

    fn stored_lease(&self, &key: &u8) -> Option<u64> {
        self.s.holds[key as usize].latest_lease()
    }

    fn read(&mut self, &mut key: &mut u8, how: Read<'_>) -> Result<Stored, LockError> {
        Ok(holds_key::read(&mut self.s.holds[key as usize], how))
    }

    fn write(&mut self, &mut key: &mut u8, holds: Write<'_>, _: Event) {
        holds_key::write(&mut self.s.holds[key as usize], holds, self.s.now);
    }

    fn remove(&mut self, &mut key: &mut u8, _: Removal) {
        self.s.holds[key as usize] = Holds::free();
    }

    fn restore_expiry(&mut self, _: &mut u8, _: u64) {}

    fn issue_fence(&mut self, now: u64) -> u64 {
        self.s.fences = fence::next(self.s.fences, now);
        self.s.fences
    }

    fn raise_fences(&mut self, fence: u64) {
        self.s.fences = self.s.fences.max(fence);
    }

    /// No client here binds a hold to its connection.
    fn refenced(&mut self, _: &u8, _: &[u8], _: u64, _: u64) {}

    fn is_writer(&self) -> bool {
        true
    }

    fn writes_paused(&mut self) -> bool {
        false
    }

    fn replicas_follow(&self) -> bool {
        true
    }

    fn quarantine_gate(&self) -> Gate {
        Gate::Open
    }

    fn quarantined(&self) -> bool {
        false
    }

    fn lease_cap(&self) -> Option<u64> {
        None
    }

    fn arm_lease_check(&mut self, timer: Timer) {
        let entry = (timer.at, key_of(&timer.name));
        if let Err(at) = self.s.checks.binary_search(&entry) {
            self.s.checks.insert(at, entry);
        }
    }

    /// Every gate is open here: nothing is deferred to a retry.
    fn arm_retry(&mut self, _delay_ms: u64) {
        self.s.broken.answered_twice = true;
    }

    fn arm_pump(&mut self, _from_command: bool) {
        self.s.pumps = self.s.pumps.saturating_add(1);
    }

    fn can_block(&self) -> bool {
        true
    }

    fn block(&mut self, _: &LockName, timeout_ms: u64) -> Option<(u64, u8)> {
        let client = self.caller;
        self.s.queue.push(client as u8);
        self.s.clients[client] = Client::Waiting {
            deadline: self.s.now + timeout_ms,
            got: self.one_by_one_got,
        };
        Some((client as u64, client as u8))
    }

    /// A grant of one lock from the queue: only with the flaw, where each
    /// lock is asked for alone.
    fn reply_granted(&mut self, id: u64, client: u8, lock: &LockName, fence: u64, until: u64) {
        self.s.engine.replied(id);
        let fresh = self.began.iter().any(|&(c, _)| c == client);
        let got = match self.s.clients[client as usize] {
            Client::Waiting { got, .. } => got,
            _ => 0,
        };
        let Some(at) = self.answered(client) else {
            return;
        };
        if fresh {
            self.s.overtook(self.m, client, at, &[key_of(lock)]);
            self.s.issued(fence);
        }
        let hold = Hold {
            count: 1,
            fence,
            expires_at: until,
        };
        self.s.one_granted(self.m, client as usize, got, &hold);
    }

    fn reply_granted_all(&mut self, id: u64, client: u8, names: &[LockName], holds: &[Hold]) {
        self.s.engine.replied(id);
        let Some(at) = self.answered(client) else {
            return;
        };
        let keys: Vec<u8> = names.iter().map(key_of).collect();
        let fresh: Vec<u8> = self
            .began
            .iter()
            .filter(|&&(c, _)| c == client)
            .map(|&(_, k)| k)
            .collect();
        self.s.overtook(self.m, client, at, &fresh);
        for (key, hold) in keys.iter().zip(holds) {
            if fresh.contains(key) {
                self.s.issued(hold.fence);
            }
        }
        self.s.seen.wide_from_queue |= keys.len() >= 2;
        self.s.granted(self.m, client as usize, &keys, holds);
    }

    fn began(&mut self, _id: u64, &client: &u8, lock: &LockName, _owner: &[u8], _fence: u64) {
        self.began.push((client, key_of(lock)));
    }

    fn reply_refused(&mut self, _id: u64, client: u8, _error: LockError) {
        self.answered(client);
        self.s.clients[client as usize] = Client::Idle;
    }

    fn reply_nil(&mut self, _id: u64, client: u8, why: Nil) {
        self.answered(client);
        self.s.seen.timed_out |= why == Nil::TimedOut;
        self.s.clients[client as usize] = Client::Idle;
    }

    fn moved_to(&mut self, _: &LockName) -> Option<String> {
        None
    }

    fn redirect(&mut self, _: &LockName, _: &str) {}
}

impl State {
    fn issued(&mut self, fence: u64) {
        self.broken.fence_fell |= fence <= self.last_fence;
        self.last_fence = self.last_fence.max(fence);
    }

    /// A fresh hold of `keys` went to `client`, which stood at `at` in the
    /// line (`None`: it never waited): nobody still waiting that parked
    /// before it may name any of those locks.
    fn overtook(&mut self, m: &MultiModel, client: u8, at: usize, keys: &[u8]) {
        let ahead = &self.queue[..at.min(self.queue.len())];
        let names_one = |c: u8| m.keys(c as usize).iter().any(|k| keys.contains(k));
        self.broken.overtaken |= ahead.iter().any(|&c| c != client && names_one(c));
    }

    /// An immediate grant of the whole request (no `WAIT` needed).
    fn granted_now(&mut self, m: &MultiModel, client: usize, holds: &[Hold]) {
        let keys = m.keys(client).to_vec();
        let waiting = self.queue.clone();
        let names_one = |c: u8| m.keys(c as usize).iter().any(|k| keys.contains(k));
        self.broken.overtaken |= waiting.iter().any(|&c| names_one(c));
        for hold in holds {
            self.issued(hold.fence);
        }
        self.granted(m, client, &keys, holds);
    }

    /// `client` was told it holds `keys` with `holds`: all its locks, with
    /// one lease end.
    fn granted(&mut self, m: &MultiModel, client: usize, keys: &[u8], holds: &[Hold]) {
        let mut asked = m.keys(client).to_vec();
        let mut told = keys.to_vec();
        asked.sort_unstable();
        told.sort_unstable();
        self.broken.partial_grant |= asked != told || holds.len() != keys.len();
        let until = holds.iter().map(|h| h.expires_at).min().unwrap_or(self.now);
        self.clients[client] = Client::Holding { until };
    }

    /// With the flaw: the client's lock number `got` was granted alone.
    /// Holding it, the client asks for the next with its next command.
    fn one_granted(&mut self, m: &MultiModel, client: usize, got: u8, hold: &Hold) {
        self.clients[client] = if got + 1 >= m.keys(client).len() as u8 {
            Client::Holding {
                until: hold.expires_at,
            }
        } else {
            Client::Partial { got: got + 1 }
        };
    }

    /// Two requests naming the same locks in crossing orders wait at once.
    fn note_crossing(&mut self, m: &MultiModel) {
        let waiting: Vec<usize> = self.queue.iter().map(|&c| c as usize).collect();
        for &x in &waiting {
            for &y in &waiting {
                let (kx, ky) = (m.keys(x), m.keys(y));
                if x != y && kx.len() >= 2 && ky.len() >= 2 && kx[0] == ky[1] && kx[1] == ky[0] {
                    self.seen.crossed = true;
                }
            }
        }
    }

    fn server_owes(&self) -> bool {
        self.pumps > 0
            || self.checks.first().is_some_and(|&(at, _)| at <= self.now)
            || self
                .clients
                .iter()
                .any(|c| matches!(*c, Client::Waiting { deadline, .. } if deadline <= self.now))
    }

    fn waiting(&self) -> usize {
        self.clients
            .iter()
            .filter(|c| matches!(c, Client::Waiting { .. }))
            .count()
    }

    /// A waiting request that nothing stands in the way of: its locks are
    /// all free and no request that parked before it names any of them.
    /// (One that did stands first: the server keeps the lock for it.)
    fn stuck(&self, m: &MultiModel) -> Option<u8> {
        self.queue.iter().enumerate().find_map(|(at, &c)| {
            let keys = m.keys(c as usize);
            let free = keys.iter().all(|&k| self.admits(m, k, c as usize));
            let first = self.queue[..at]
                .iter()
                .all(|&e| !m.keys(e as usize).iter().any(|k| keys.contains(k)));
            (free && first).then_some(c)
        })
    }

    /// Whether lock `key` has room for client `c`'s request now: free, or
    /// for a semaphore, its permits within the limit.
    fn admits(&self, m: &MultiModel, key: u8, c: usize) -> bool {
        match m.bounds.semaphore {
            Some(n) => self.permits_held(key) + m.ask(c).1 <= n,
            None => self.holds[key as usize].is_free(self.now),
        }
    }

    /// The permits live holds of lock `key` count.
    fn permits_held(&self, key: u8) -> u32 {
        self.holds[key as usize]
            .live(self.now)
            .map(|h| h.permits)
            .sum()
    }

    /// The owners holding lock `key` at the server now.
    fn holders(&self, key: u8) -> Vec<Vec<u8>> {
        self.holds[key as usize]
            .live(self.now)
            .map(|h| h.owner.clone())
            .collect()
    }

    /// Client `c`'s locks on which its owner holds a live hold.
    fn held_by(&self, m: &MultiModel, c: usize) -> usize {
        let owner = MultiModel::owner(c);
        m.keys(c)
            .iter()
            .filter(|&&k| self.holders(k).iter().any(|o| o == owner))
            .count()
    }
}

impl Model for MultiModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let n = self.bounds.requests.len();
        assert!(n <= OWNERS.len(), "at most {} clients", OWNERS.len());
        vec![State {
            now: 0,
            holds: vec![Holds::free(); KEYS.len()],
            engine: Engine::default(),
            checks: Vec::new(),
            pumps: 0,
            queue: Vec::new(),
            fences: 0,
            last_fence: 0,
            clients: vec![Client::Idle; n],
            commands: vec![0; n],
            crashes: 0,
            broken: Broken::default(),
            seen: Seen::default(),
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        let b = &self.bounds;
        if let Some(&(at, key)) = s.checks.first().filter(|&&(at, _)| at <= s.now) {
            actions.push(Action::Serve { at, key });
        }
        if s.pumps > 0 {
            actions.push(Action::Pump);
        }
        for (i, c) in s.clients.iter().enumerate() {
            let client = i as u8;
            if let Client::Waiting { deadline, .. } = *c {
                if s.now >= deadline {
                    actions.push(Action::Timeout { client });
                }
            }
            if s.commands[i] >= b.commands {
                continue;
            }
            match c {
                Client::Idle => {
                    actions.push(Action::Acquire { client, wait: true });
                    if b.no_wait {
                        actions.push(Action::Acquire {
                            client,
                            wait: false,
                        });
                    }
                }
                Client::Holding { .. } => {
                    actions.push(Action::Renew { client });
                    actions.push(Action::Release { client });
                    if s.crashes < b.crashes {
                        actions.push(Action::Crash { client });
                    }
                }
                // Holding some, it asks for the next lock, waiting.
                Client::Partial { .. } => actions.push(Action::Acquire { client, wait: true }),
                Client::Waiting { .. } | Client::Crashed { .. } => {}
            }
        }
        if !s.server_owes() && s.now < b.horizon {
            actions.push(Action::Tick);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Acquire { client, wait } => {
                s.commands[client as usize] += 1;
                self.acquire(&mut s, client as usize, wait);
            }
            Action::Renew { client } => {
                let i = client as usize;
                s.commands[i] += 1;
                let keys = self.keys(i).to_vec();
                let targets: Vec<&u8> = keys.iter().collect();
                let mut server = Server::command(&mut s, self, i);
                let renewed =
                    orchestrate::renew_all(&mut server, &targets, Self::owner(i), self.bounds.ttl);
                server.done();
                s.clients[i] = match renewed {
                    Ok(holds) => Client::Holding {
                        until: holds.iter().map(|h| h.expires_at).min().unwrap_or(s.now),
                    },
                    // A lease ended: it learns it lost the locks.
                    Err(_) => Client::Idle,
                };
            }
            Action::Release { client } => {
                let i = client as usize;
                s.commands[i] += 1;
                let keys = self.keys(i).to_vec();
                let targets: Vec<&u8> = keys.iter().collect();
                let mut server = Server::command(&mut s, self, i);
                let _ = orchestrate::release_all(&mut server, &targets, Self::owner(i), true);
                server.done();
                s.clients[i] = Client::Idle;
            }
            Action::Crash { client } => {
                let i = client as usize;
                s.commands[i] += 1;
                s.crashes += 1;
                let Client::Holding { until } = s.clients[i] else {
                    return None;
                };
                s.clients[i] = Client::Crashed { until };
            }
            Action::Serve { at, key } => {
                s.checks.retain(|&c| c != (at, key));
                let mut server = Server::on(&mut s, self);
                orchestrate::lease_check_fired(&mut server, &name(key), at);
                server.done();
            }
            Action::Pump => {
                s.pumps -= 1;
                let mut server = Server::on(&mut s, self);
                orchestrate::pump(&mut server);
                server.done();
            }
            Action::Timeout { client } => {
                // With the flaw, a client timing out on a later lock still
                // holds the earlier ones until their lease ends.
                let mut server = Server::on(&mut s, self);
                let answered = orchestrate::deadline_passed(&mut server, u64::from(client));
                server.done();
                s.broken.answered_twice |= !answered;
            }
            Action::Tick => {
                s.now += 1;
                for c in s.clients.iter_mut() {
                    if let Client::Crashed { until } = *c {
                        if lock::ended(until, s.now) {
                            *c = Client::Idle;
                        }
                    }
                }
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = vec![
            Property::always(
                "no lock has two exclusive holders, nor a semaphore more than its permits",
                |m: &MultiModel, s: &State| {
                    (0..KEYS.len() as u8).all(|k| match m.bounds.semaphore {
                        Some(n) => s.permits_held(k) <= n,
                        None => s.holders(k).len() <= 1,
                    })
                },
            ),
            Property::always(
                "never a partial hold: a request holds all its locks or none",
                |m: &MultiModel, s: &State| {
                    !s.broken.partial_grant
                        && (0..s.clients.len()).all(|c| {
                            let held = s.held_by(m, c);
                            held == 0 || held == m.keys(c).len()
                        })
                },
            ),
            Property::always(
                "no waiter is overtaken on any of its locks",
                |_, s: &State| !s.broken.overtaken,
            ),
            Property::always(
                "no deadlock: an idle server leaves no request waiting whose locks are all free and who is first in line on each",
                |m: &MultiModel, s: &State| s.server_owes() || s.stuck(m).is_none(),
            ),
            Property::always(
                "every fence issued is above every fence issued before",
                |_, s: &State| !s.broken.fence_fell,
            ),
            Property::always(
                "every parked client is answered exactly once",
                |_, s: &State| !s.broken.answered_twice && s.waiting() == s.queue.len(),
            ),
            Property::sometimes("a waiter times out", |_, s: &State| s.seen.timed_out),
        ];
        if self.bounds.semaphore.is_some() {
            properties.push(Property::sometimes(
                "every permit of a semaphore is held",
                |m: &MultiModel, s: &State| {
                    (0..KEYS.len() as u8).any(|k| Some(s.permits_held(k)) == m.bounds.semaphore)
                },
            ));
        }
        let wide = self.bounds.requests.iter().any(|r| r.len() >= 2);
        if self.bounds.flaw.is_none() && wide {
            properties.push(Property::sometimes(
                "a request for several locks is granted from the queue",
                |_, s: &State| s.seen.wide_from_queue,
            ));
        }
        let crossing = self.bounds.requests.iter().any(|x| {
            self.bounds
                .requests
                .iter()
                .any(|y| x.len() >= 2 && y.len() >= 2 && x[0] == y[1] && x[1] == y[0])
        });
        if crossing {
            properties.push(Property::sometimes(
                "requests in crossing orders wait at once",
                |_, s: &State| s.seen.crossed,
            ));
        }
        properties
    }
}

impl fmt::Debug for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t={}", self.now)?;
        for (k, holds) in self.holds.iter().enumerate() {
            let live: Vec<_> = holds.live(self.now).collect();
            let key = String::from_utf8_lossy(KEYS[k]);
            if live.is_empty() {
                continue;
            }
            for h in live {
                write!(
                    f,
                    " | {key}: {} ({}) until {}",
                    String::from_utf8_lossy(&h.owner),
                    Fence(h.hold.fence),
                    h.hold.expires_at
                )?;
            }
        }
        if !self.queue.is_empty() {
            let line: Vec<String> = self.queue.iter().map(|c| format!("c{c}")).collect();
            write!(f, " | line [{}]", line.join(", "))?;
        }
        for (i, c) in self.clients.iter().enumerate() {
            match *c {
                Client::Holding { until } if !lock::ended(until, self.now) => {
                    write!(f, " | c{i} holds until {until}")?
                }
                Client::Crashed { until } if !lock::ended(until, self.now) => {
                    write!(f, " | c{i} crashed holding until {until}")?
                }
                Client::Waiting { got, .. } if got > 0 => write!(f, " | c{i} waits holding {got}")?,
                _ => {}
            }
        }
        let b = self.broken;
        for (flag, what) in [
            (b.overtaken, "A WAITER WAS OVERTAKEN"),
            (b.fence_fell, "A FENCE FELL"),
            (b.answered_twice, "ANSWERED TWICE"),
            (b.partial_grant, "A PARTIAL GRANT"),
        ] {
            if flag {
                write!(f, " | {what}")?;
            }
        }
        Ok(())
    }
}
