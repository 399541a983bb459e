//! Model 4: shared holds — one lock held by readers, writers or the permits
//! of a semaphore, with one queue for both modes.
//!
//! Each client is a reader (`SHARED`), a writer (exclusive) or a permit
//! client (`SHARED LIMIT n`). It acquires (with `WAIT` or without),
//! reenters by acquiring again, renews, releases, or crashes holding: it
//! stops renewing, and its hold ends with its lease (until then it may
//! still believe it holds, as a hung client would). Leases end as time
//! ticks; a parked client is granted or answered nil at its deadline. One
//! bound makes a client another connection of another client's owner.
//!
//! The server side is the module's own sequencing, [`orchestrate`] (what
//! `src/commands.rs` and `src/ffi/host.rs` call), with the hand-off
//! [`Engine`] and the core's rules under it: this file only implements its
//! [`Host`] on the model's state — the lock's key is its [`Holds`] (a
//! single exclusive hold shown as [`Stored::One`], as the module stores it
//! compactly), a lease check an armed time, a reply a change of the
//! client — and records what the properties need (who parked first). The
//! server's own work — a lease check that is due, a pump, a deadline — runs
//! before time moves on, in any order with the clients' commands at that
//! tick.
//!
//! With a [`Flaw`], a client asks for the wrong thing, and the checker shows
//! what the protection was for; flaws in the server's own code are planted
//! in the core (`tests/planted.rs`).

use std::fmt;

use redislock_core::error::LockError;
use redislock_core::fence;
use redislock_core::handoff::{Engine, Gate, Timer};
use redislock_core::holds::{Holds, Mode};
use redislock_core::lock;
use redislock_core::orchestrate::{self, Acquired, Event, Host, Nil, Read, Removal, Stored, Write};
use redislock_core::queue::LockName;
use stateright::{Model, Property};

use crate::{holds_key, Fence};

const OWNERS: [&[u8]; 4] = [b"c0", b"c1", b"c2", b"c3"];

/// What a client asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// `SHARED`: a read lock.
    Reader,
    /// Exclusive: a write lock.
    Writer,
    /// `SHARED LIMIT limit`: a semaphore's permit.
    Permit,
}

/// A client that asks for the wrong thing, to see the checker find what the
/// protection it bypasses is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Flaw {
    /// The semaphore's limit is ignored: permits are asked for as read holds.
    IgnoreLimit,
}

#[derive(Clone, Debug)]
pub struct Bounds {
    /// One client per entry, with what it asks for (at most 4).
    pub roles: Vec<Role>,
    /// The permit clients' `LIMIT`.
    pub limit: u32,
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
    /// Also try `LOCK.ACQUIRE` without `WAIT`.
    pub no_wait: bool,
    /// `Some((a, b))`: client `a` is another connection of client `b`'s
    /// owner (two threads of one process, a pool). Each connection counts
    /// its own acquisitions; one that sees the lease end it was told pass
    /// forgets them, as a client's lease timer does (a late release would
    /// take a count from a newer hold of the same owner: the server cannot
    /// tell them apart).
    pub same_owner: Option<(usize, usize)>,
    pub flaw: Option<Flaw>,
}

impl Bounds {
    /// Two readers and a writer (`make test`).
    pub fn readers_and_writer() -> Bounds {
        Bounds {
            roles: vec![Role::Reader, Role::Writer, Role::Reader],
            limit: 2,
            horizon: 4,
            ttl: 2,
            wait: 2,
            commands: 3,
            crashes: 1,
            no_wait: false,
            same_owner: None,
            flaw: None,
        }
    }

    /// Three permit clients of a semaphore of two (`make test`).
    pub fn semaphore() -> Bounds {
        Bounds {
            roles: vec![Role::Permit, Role::Permit, Role::Permit],
            horizon: 3,
            ..Bounds::readers_and_writer()
        }
    }

    /// A reader, a writer and a permit client on one lock: the reader's and
    /// the permit's requests refuse each other's limit (`make test`).
    pub fn mixed() -> Bounds {
        Bounds {
            roles: vec![Role::Reader, Role::Writer, Role::Permit],
            limit: 1,
            ..Bounds::readers_and_writer()
        }
    }

    /// A writer among the permit clients of a semaphore of one (`make test`).
    pub fn semaphore_and_writer() -> Bounds {
        Bounds {
            roles: vec![Role::Permit, Role::Writer, Role::Permit],
            limit: 1,
            ..Bounds::readers_and_writer()
        }
    }

    /// Two readers and a writer, the second reader being another
    /// connection of the writer's owner: a writer may read (a reentry),
    /// a reader may not upgrade, and a waiter whose owner holds the lock
    /// by the time it reaches the head is decided so (`make test`).
    pub fn same_owner() -> Bounds {
        Bounds {
            same_owner: Some((2, 1)),
            ..Bounds::readers_and_writer()
        }
    }

    /// Longer, and `WAIT` or not (`make model`; four clients reach
    /// tens of millions of states at these bounds).
    pub fn full(roles: Vec<Role>) -> Bounds {
        Bounds {
            roles,
            limit: 2,
            horizon: 4,
            ttl: 2,
            wait: 3,
            commands: 3,
            crashes: 1,
            no_wait: true,
            same_owner: None,
            flaw: None,
        }
    }
}

#[derive(Clone, Debug)]
pub struct SharedModel {
    pub bounds: Bounds,
}

/// The lock's name.
fn name() -> LockName {
    LockName::new(0, b"rw")
}

/// Where a client is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Client {
    Idle,
    /// Parked, its `WAIT` deadline at this tick.
    Waiting {
        deadline: u64,
    },
    /// Told it holds: the fence and lease end it was told, and how many
    /// times this connection acquired it.
    Holding {
        fence: u64,
        until: u64,
        count: u64,
    },
    /// Crashed (or hung) holding: it sends nothing more, and may believe
    /// it holds until the lease end it was told.
    Crashed {
        until: u64,
    },
}

/// Things that must never happen, recorded when they do (the properties
/// read them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct Broken {
    /// A fresh hold went to someone while a client that parked earlier
    /// still waited.
    overtaken: bool,
    /// A shared hold went to someone while a writer that came earlier
    /// still waited.
    writer_overtaken: bool,
    /// A fresh fence was not above every fence issued before.
    fence_fell: bool,
    /// A client was answered that was not waiting (twice, or never
    /// parked), or a waiting one was lost.
    answered_twice: bool,
}

/// Things the model should reach (the `sometimes` properties read them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct Seen {
    /// Two or more requests granted together from the queue.
    granted_together: bool,
    /// A writer granted from the queue a fence above a shared hold's.
    writer_after_shared: bool,
    /// A waiter answered nil at its deadline.
    timed_out: bool,
    /// A crashed holder's lease ended while clients waited.
    crash_ended: bool,
    /// Then a waiter was granted.
    granted_after_crash: bool,
    /// A shared request was refused for a limit other than the lock's or
    /// a waiting request's.
    limit_refused: bool,
    /// A waiter whose owner held the lock by then was reentered from the queue.
    queue_reentry: bool,
    /// A reader's owner asked for an exclusive hold and was refused.
    upgrade_refused: bool,
}

#[derive(Clone, PartialEq, Eq, Hash)]
pub struct State {
    now: u64,
    /// The lock's key: its holds (none: the key does not exist).
    holds: Holds,
    /// The module's hand-off engine; a parked client's handle is its index.
    engine: Engine<u8>,
    /// Lease checks armed, by the time each fires (sorted, once each).
    checks: Vec<u64>,
    /// Pump jobs armed.
    pumps: u8,
    /// The model's own record of the parked clients, in the order they
    /// parked.
    queue: Vec<u8>,
    /// The server's fence counter (what `fence::issue` keeps globally).
    fences: u64,
    /// The highest fresh fence a client was told so far.
    last_fence: u64,
    /// The highest shared hold's fence told so far.
    last_shared_fence: u64,
    clients: Vec<Client>,
    commands: Vec<u8>,
    crashes: u8,
    broken: Broken,
    seen: Seen,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// `LOCK.ACQUIRE` (by a holder: a reentry), with `WAIT` or without.
    Acquire {
        client: u8,
        wait: bool,
    },
    Renew {
        client: u8,
    },
    /// `LOCK.RELEASE` (one count).
    Release {
        client: u8,
    },
    /// The holder stops: no renewal, no release.
    Crash {
        client: u8,
    },
    /// The lease check armed for this time fires: the server serves the
    /// queue.
    Serve {
        at: u64,
    },
    /// The server runs a pump job.
    Pump,
    /// The deadline of a parked client: nil.
    Timeout {
        client: u8,
    },
    Tick,
}

impl SharedModel {
    /// The owner a client's connection acquires as.
    fn owner(&self, client: usize) -> &'static [u8] {
        match self.bounds.same_owner {
            Some((a, b)) if a == client => OWNERS[b],
            _ => OWNERS[client],
        }
    }

    /// Whether the client's owner token is shared with another connection.
    fn shares_owner(&self, client: usize) -> bool {
        self.bounds
            .same_owner
            .is_some_and(|(a, b)| a == client || b == client)
    }

    /// The mode a client's requests carry (as the server sees it: with
    /// [`Flaw::IgnoreLimit`], a permit is a read hold).
    fn mode(&self, client: usize) -> Mode {
        match (self.bounds.roles[client], self.bounds.flaw) {
            (Role::Writer, _) => Mode::Exclusive,
            (Role::Reader, _) | (Role::Permit, Some(Flaw::IgnoreLimit)) => Mode::READ,
            (Role::Permit, _) => Mode::Shared {
                limit: Some(self.bounds.limit),
            },
        }
    }

    /// `LOCK.ACQUIRE` through the module's sequencing, then what the
    /// client learns from the reply.
    fn acquire(&self, s: &mut State, client: usize, wait: bool) {
        let mode = self.mode(client);
        let wait_ms = wait.then_some(self.bounds.wait);
        let mut server = Server::command(s, self, client);
        let result = orchestrate::acquire(
            &mut server,
            &(),
            self.owner(client),
            mode,
            self.bounds.ttl,
            wait_ms,
        );
        server.done();
        match result {
            Ok(Acquired::Held(hold)) if hold.count == 1 => {
                // Every client waiting came before it.
                s.broken.overtaken |= !s.queue.is_empty();
                let writer_waits = s
                    .queue
                    .iter()
                    .any(|&c| self.mode(c as usize) == Mode::Exclusive);
                s.broken.writer_overtaken |= mode != Mode::Exclusive && writer_waits;
                s.issued(self, client, hold.fence);
                s.clients[client] = Client::Holding {
                    fence: hold.fence,
                    until: hold.expires_at,
                    count: 1,
                };
            }
            Ok(Acquired::Held(hold)) => {
                let mine = match s.clients[client] {
                    Client::Holding { count, .. } => count,
                    _ => 0,
                };
                s.clients[client] = Client::Holding {
                    fence: hold.fence,
                    until: hold.expires_at,
                    count: mine + 1,
                };
            }
            // Parked: `Host::block` has set it waiting.
            Ok(Acquired::Parked) => {}
            // Nil, or an error: it holds nothing (a lease it had has ended,
            // or it would have been reentered).
            Ok(Acquired::Nil) | Err(_) => {
                s.seen.limit_refused |= result == Err(LockError::LimitMismatch);
                s.seen.upgrade_refused |= result == Err(LockError::Upgrade);
                s.clients[client] = Client::Idle;
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The glue: the model's world as the module's own sequencing sees it.
// ---------------------------------------------------------------------------

/// The server side of the model as an [`orchestrate::Host`]. `caller`: the
/// client whose command runs (the one a `WAIT` blocks). `fresh`: the
/// clients handed a fresh hold in this step (two or more: granted
/// together).
struct Server<'s> {
    s: &'s mut State,
    m: &'s SharedModel,
    caller: usize,
    fresh: u8,
    /// The client [`Host::began`] just announced: its reply is a fresh
    /// hold, not a reentry from the queue.
    began: Option<u8>,
}

impl<'s> Server<'s> {
    /// A command of client `caller`.
    fn command(s: &'s mut State, m: &'s SharedModel, caller: usize) -> Self {
        Server {
            s,
            m,
            caller,
            fresh: 0,
            began: None,
        }
    }

    /// The server's own work (a timer, a job): no client calls.
    fn on(s: &'s mut State, m: &'s SharedModel) -> Self {
        Self::command(s, m, usize::MAX)
    }

    /// The step is over: what it showed.
    fn done(self) {
        self.s.seen.granted_together |= self.fresh >= 2;
        self.s.seen.granted_after_crash |= self.fresh >= 1 && self.s.seen.crash_ended;
    }

    /// Client `client` leaves the model's line, answered: it must have
    /// been in it, waiting. Where it stood.
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
    /// One lock: a command names nothing more.
    type Target = ();
    /// An open key: the one key.
    type Key = ();

    fn engine<R>(&mut self, f: impl FnOnce(&mut Engine<u8>) -> R) -> R {
        f(&mut self.s.engine)
    }

    fn now(&self) -> u64 {
        self.s.now
    }

    fn lock_name(&self, _: &()) -> LockName {
        name()
    }

    fn open(&mut self, _: &()) {
        self.open_name(&name(), true)
    }

    /// Opening expires a key whose every lease has ended, as Redis would,
    /// and tells the module (`expired`): its waiters are served by a pump.
    fn open_name(&mut self, _: &LockName, _in_command: bool) {
        let s = &mut *self.s;
        if !s.holds.is_empty() && s.holds.is_free(s.now) {
            s.holds = Holds::free();
            if s.engine.anyone_waiting() {
                orchestrate::freed(&mut Server::on(s, self.m), name(), true);
            }
        }
    }

    /// Opening expired a key past its time: now is never past a key's.
    fn key_now(&self, _: &()) -> u64 {
        self.s.now
    }

    fn expires_at(&self, _: &()) -> Option<u64> {
        self.s.holds.latest_lease()
    }

    fn stored_lease(&self, _: &()) -> Option<u64> {
        self.s.holds.latest_lease()
    }

    fn read(&mut self, _: &mut (), how: Read<'_>) -> Result<Stored, LockError> {
        Ok(holds_key::read(&mut self.s.holds, how))
    }

    fn write(&mut self, _: &mut (), holds: Write<'_>, _: Event) {
        holds_key::write(&mut self.s.holds, holds, self.s.now);
    }

    fn remove(&mut self, _: &mut (), _: Removal) {
        self.s.holds = Holds::free();
    }

    /// The model changes no TTL behind the module's back: none is put back.
    fn restore_expiry(&mut self, _: &mut (), _: u64) {}

    fn issue_fence(&mut self, now: u64) -> u64 {
        self.s.fences = fence::next(self.s.fences, now);
        self.s.fences
    }

    fn raise_fences(&mut self, fence: u64) {
        self.s.fences = self.s.fences.max(fence);
    }

    /// No client here binds a hold to its connection.
    fn refenced(&mut self, _: &(), _: &[u8], _: u64, _: u64) {}

    fn is_writer(&self) -> bool {
        true
    }

    /// Nobody pauses writes in this model (model 1 does).
    fn writes_paused(&mut self) -> bool {
        false
    }

    fn replicas_follow(&self) -> bool {
        true
    }

    /// This model has no quarantine (model 2 has).
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
        if let Err(at) = self.s.checks.binary_search(&timer.at) {
            self.s.checks.insert(at, timer.at);
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
        };
        Some((client as u64, client as u8))
    }

    fn reply_granted(&mut self, id: u64, client: u8, _: &LockName, fence: u64, until: u64) {
        // The reply is written at once: the grant is no longer in flight.
        self.s.engine.replied(id);
        let fresh = self.began.take() == Some(client);
        let Some(at) = self.answered(client) else {
            return;
        };
        let m = self.m;
        if fresh {
            self.fresh += 1;
            // Everyone parked ahead of it has been answered.
            self.s.broken.overtaken |= at > 0;
            let writer_ahead = self.s.queue[..at]
                .iter()
                .any(|&c| m.mode(c as usize) == Mode::Exclusive);
            let shared = m.mode(client as usize) != Mode::Exclusive;
            self.s.broken.writer_overtaken |= shared && writer_ahead;
            if !shared && self.s.last_shared_fence > 0 {
                self.s.seen.writer_after_shared |= fence > self.s.last_shared_fence;
            }
            self.s.issued(m, client as usize, fence);
        } else {
            self.s.seen.queue_reentry = true;
        }
        self.s.clients[client as usize] = Client::Holding {
            fence,
            until,
            count: 1,
        };
    }

    fn began(&mut self, _id: u64, &client: &u8, _: &LockName, _owner: &[u8], _fence: u64) {
        self.began = Some(client);
    }

    fn reply_granted_all(&mut self, id: u64, handle: u8, names: &[LockName], holds: &[lock::Hold]) {
        // This model's clients ask for one lock at a time, so no grant of
        // several reaches here; were one to, it is judged as the grant of
        // its first lock, by the model's own line.
        match (names.first(), holds.first()) {
            (Some(name), Some(hold)) => {
                self.reply_granted(id, handle, name, hold.fence, hold.expires_at)
            }
            _ => self.reply_refused(id, handle, LockError::Internal),
        }
    }

    fn reply_refused(&mut self, _id: u64, client: u8, error: LockError) {
        self.answered(client);
        self.s.seen.upgrade_refused |= error == LockError::Upgrade;
        self.s.clients[client as usize] = Client::Idle;
    }

    fn reply_nil(&mut self, _id: u64, client: u8, why: Nil) {
        self.answered(client);
        self.s.seen.timed_out |= why == Nil::TimedOut;
        self.s.clients[client as usize] = Client::Idle;
    }

    /// One node: the lock never moves.
    fn moved_to(&mut self, _: &LockName) -> Option<String> {
        None
    }

    fn redirect(&mut self, _: &LockName, _: &str) {}
}

impl State {
    /// A fresh fence `fence` went to `client`: it must be above every one
    /// told before.
    fn issued(&mut self, model: &SharedModel, client: usize, fence: u64) {
        self.broken.fence_fell |= fence <= self.last_fence;
        self.last_fence = self.last_fence.max(fence);
        if model.mode(client) != Mode::Exclusive {
            self.last_shared_fence = self.last_shared_fence.max(fence);
        }
    }

    /// Work the server owes before time moves on: a due lease check, a
    /// pump, a passed deadline.
    fn server_owes(&self) -> bool {
        self.pumps > 0
            || self.checks.first().is_some_and(|&at| at <= self.now)
            || self
                .clients
                .iter()
                .any(|c| matches!(*c, Client::Waiting { deadline } if deadline <= self.now))
    }

    /// The clients that believe they hold the lock now: the owner each
    /// acquires as, and its mode as it asked for it.
    fn believers<'a>(
        &'a self,
        model: &'a SharedModel,
    ) -> impl Iterator<Item = (&'static [u8], Role)> + 'a {
        self.clients
            .iter()
            .enumerate()
            .filter(|(_, c)| match **c {
                Client::Holding { until, .. } | Client::Crashed { until } => {
                    !lock::ended(until, self.now)
                }
                _ => false,
            })
            .map(|(i, _)| (model.owner(i), model.bounds.roles[i]))
    }

    /// How many owners believe they hold the lock, among those `which`.
    fn owners_holding(&self, model: &SharedModel, which: impl Fn(Role) -> bool) -> usize {
        let mut owners: Vec<&[u8]> = self
            .believers(model)
            .filter(|&(_, role)| which(role))
            .map(|(owner, _)| owner)
            .collect();
        owners.sort();
        owners.dedup();
        owners.len()
    }

    fn waiting(&self) -> usize {
        self.clients
            .iter()
            .filter(|c| matches!(c, Client::Waiting { .. }))
            .count()
    }
}

impl Model for SharedModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let n = self.bounds.roles.len();
        assert!(n <= OWNERS.len(), "at most {} clients", OWNERS.len());
        vec![State {
            now: 0,
            holds: Holds::free(),
            engine: Engine::default(),
            checks: Vec::new(),
            pumps: 0,
            queue: Vec::new(),
            fences: 0,
            last_fence: 0,
            last_shared_fence: 0,
            clients: vec![Client::Idle; n],
            commands: vec![0; n],
            crashes: 0,
            broken: Broken::default(),
            seen: Seen::default(),
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        let b = &self.bounds;
        if let Some(&at) = s.checks.first().filter(|&&at| at <= s.now) {
            actions.push(Action::Serve { at });
        }
        if s.pumps > 0 {
            actions.push(Action::Pump);
        }
        for (i, c) in s.clients.iter().enumerate() {
            let client = i as u8;
            if let Client::Waiting { deadline } = *c {
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
                    actions.push(Action::Acquire { client, wait: true });
                    actions.push(Action::Renew { client });
                    actions.push(Action::Release { client });
                    if s.crashes < b.crashes {
                        actions.push(Action::Crash { client });
                    }
                }
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
                let mine = match s.clients[i] {
                    Client::Holding { count, .. } => count,
                    _ => 0,
                };
                let mut server = Server::command(&mut s, self, i);
                let renewed = orchestrate::renew(&mut server, &(), self.owner(i), self.bounds.ttl);
                server.done();
                s.clients[i] = match renewed {
                    Ok(hold) => Client::Holding {
                        fence: hold.fence,
                        until: hold.expires_at,
                        count: mine,
                    },
                    // Its lease ended: it learns it lost the lock.
                    Err(_) => Client::Idle,
                };
            }
            Action::Release { client } => {
                let i = client as usize;
                s.commands[i] += 1;
                let mut server = Server::command(&mut s, self, i);
                let released = orchestrate::release(&mut server, &(), self.owner(i), false);
                server.done();
                s.clients[i] = match (released, s.clients[i]) {
                    (
                        Ok(_),
                        Client::Holding {
                            fence,
                            until,
                            count,
                        },
                    ) if count > 1 => Client::Holding {
                        fence,
                        until,
                        count: count - 1,
                    },
                    _ => Client::Idle,
                };
            }
            Action::Crash { client } => {
                let i = client as usize;
                s.commands[i] += 1;
                s.crashes += 1;
                let Client::Holding { until, .. } = s.clients[i] else {
                    return None;
                };
                s.clients[i] = Client::Crashed { until };
            }
            Action::Serve { at } => {
                s.checks.retain(|&t| t != at);
                let mut server = Server::on(&mut s, self);
                orchestrate::lease_check_fired(&mut server, &name(), at);
                server.done();
            }
            Action::Pump => {
                s.pumps -= 1;
                let mut server = Server::on(&mut s, self);
                orchestrate::pump(&mut server);
                server.done();
            }
            Action::Timeout { client } => {
                let mut server = Server::on(&mut s, self);
                let answered = orchestrate::deadline_passed(&mut server, u64::from(client));
                server.done();
                // A parked client the engine no longer knows: nobody would
                // ever answer it.
                s.broken.answered_twice |= !answered;
            }
            Action::Tick => {
                s.now += 1;
                // A crashed client restarts once its lease has ended.
                for (i, c) in s.clients.iter_mut().enumerate() {
                    match *c {
                        Client::Crashed { until } if lock::ended(until, s.now) => {
                            *c = Client::Idle;
                            s.seen.crash_ended |= !s.queue.is_empty();
                        }
                        Client::Holding { until, .. }
                            if lock::ended(until, s.now) && self.shares_owner(i) =>
                        {
                            *c = Client::Idle;
                        }
                        _ => {}
                    }
                }
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = vec![
            Property::always(
                "no exclusive hold beside any other live hold",
                |m: &SharedModel, s: &State| {
                    let writing = s.believers(m).any(|(_, role)| role == Role::Writer);
                    !writing || s.owners_holding(m, |_| true) == 1
                },
            ),
            Property::always(
                "at most limit owners share a semaphore",
                |m: &SharedModel, s: &State| {
                    s.owners_holding(m, |role| role == Role::Permit) <= m.bounds.limit as usize
                },
            ),
            Property::always(
                "no waiter is overtaken (first come, first served across modes)",
                |_, s: &State| !s.broken.overtaken,
            ),
            Property::always(
                "no reader is granted before a writer that came earlier",
                |_, s: &State| !s.broken.writer_overtaken,
            ),
            Property::always(
                "every fence issued is above every fence issued before",
                |_, s: &State| !s.broken.fence_fell,
            ),
            Property::always(
                "every parked client is answered exactly once",
                |_, s: &State| !s.broken.answered_twice && s.waiting() == s.queue.len(),
            ),
            Property::always(
                "no stuck queue: the head waits only for a live hold in its way",
                |m: &SharedModel, s: &State| match s.queue.first() {
                    None => true,
                    Some(_) if s.server_owes() => true,
                    Some(&head) => blocked(&s.holds, m.mode(head as usize), s.now),
                },
            ),
            Property::sometimes("a waiter times out", |_, s: &State| s.seen.timed_out),
            Property::sometimes(
                "a waiter is granted once a crashed holder's lease ended",
                |_, s: &State| s.seen.granted_after_crash,
            ),
        ];
        let count = |role| self.bounds.roles.iter().filter(|r| **r == role).count();
        let (readers, writers, permits) = (
            count(Role::Reader),
            count(Role::Writer),
            count(Role::Permit),
        );
        if readers >= 2 {
            properties.push(Property::sometimes(
                "two readers hold at once",
                |m: &SharedModel, s: &State| s.owners_holding(m, |role| role == Role::Reader) >= 2,
            ));
        }
        if permits >= self.bounds.limit as usize {
            properties.push(Property::sometimes(
                "a semaphore reaches its limit",
                |m: &SharedModel, s: &State| {
                    s.owners_holding(m, |role| role == Role::Permit) == m.bounds.limit as usize
                },
            ));
        }
        // Readers and permits of another limit are never granted together.
        // With every permit taken a waiter is served as soon as one frees
        // (the release serves the queue in the same command): two permits
        // wait at once only with two clients more than the limit.
        let permits_wait_together = permits >= self.bounds.limit as usize + 2;
        if readers >= 2 || (permits_wait_together && self.bounds.limit >= 2) {
            properties.push(Property::sometimes(
                "waiters are granted together",
                |_, s: &State| s.seen.granted_together,
            ));
        }
        if writers >= 1 && readers + permits >= 1 {
            properties.push(Property::sometimes(
                "a writer is granted after shared holds",
                |_, s: &State| s.seen.writer_after_shared,
            ));
        }
        if self.bounds.same_owner.is_some() {
            properties.push(Property::sometimes(
                "a waiter whose owner holds the lock is reentered from the queue",
                |_, s: &State| s.seen.queue_reentry,
            ));
            properties.push(Property::sometimes(
                "a reader's owner asking to write is refused",
                |_, s: &State| s.seen.upgrade_refused,
            ));
        }
        if readers >= 1 && permits >= 1 {
            properties.push(Property::sometimes(
                "a request of another limit is refused",
                |_, s: &State| s.seen.limit_refused,
            ));
        }
        properties
    }
}

/// Whether a live hold stands in the way of a request in `mode`.
fn blocked(holds: &Holds, mode: Mode, now: u64) -> bool {
    let live = holds.live(now).count() as u64;
    live > 0
        && (mode == Mode::Exclusive
            || holds.mode() == Mode::Exclusive
            || holds.mode() != mode
            || live >= mode.capacity())
}

impl fmt::Debug for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t={} | ", self.now)?;
        let live: Vec<_> = self.holds.live(self.now).collect();
        if live.is_empty() {
            write!(f, "free")?;
        } else {
            let mode = match self.holds.mode() {
                Mode::Exclusive => "exclusive".to_string(),
                Mode::Shared { limit: None } => "shared".to_string(),
                Mode::Shared { limit: Some(n) } => format!("shared limit {n}"),
            };
            write!(f, "{mode}:")?;
            for h in live {
                write!(
                    f,
                    " {} x{} fence {} until {};",
                    String::from_utf8_lossy(&h.owner),
                    h.hold.count,
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
                Client::Holding { fence, until, .. } if !lock::ended(until, self.now) => {
                    write!(f, " | c{i} holds ({}) until {until}", Fence(fence))?
                }
                Client::Crashed { until } if !lock::ended(until, self.now) => {
                    write!(f, " | c{i} crashed holding until {until}")?
                }
                _ => {}
            }
        }
        let b = self.broken;
        for (flag, what) in [
            (b.overtaken, "A WAITER WAS OVERTAKEN"),
            (b.writer_overtaken, "A READER OVERTOOK A WRITER"),
            (b.fence_fell, "A FENCE FELL"),
            (b.answered_twice, "ANSWERED TWICE"),
        ] {
            if flag {
                write!(f, " | {what}")?;
            }
        }
        Ok(())
    }
}
