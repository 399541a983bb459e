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
//! The server side is the core's own code: `LOCK.ACQUIRE` is decided by
//! [`Holds::acquire`] (with the waiters as a barrier and the waiting
//! shared request's limit), the per-owner commands by [`Holds::renew`] and
//! [`Holds::release`], the queue by [`shared_queue::serve`], and fences by
//! [`fence::next`]. The server's own work — serving the queue, answering a
//! deadline — runs before time moves on, in any order with the clients'
//! commands at that tick.
//!
//! With a [`Flaw`], one protection is taken out, and the checker shows what
//! it was for.

use std::fmt;

use redislock_core::error::LockError;
use redislock_core::fence;
use redislock_core::holds::{Holds, Mode};
use redislock_core::lock::{self, Acquire, Barriers};
use redislock_core::shared_queue::{self, Answer, Request};
use stateright::{Model, Property};

use crate::Fence;

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

/// A protection taken out, to see the checker find what it prevents.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Flaw {
    /// `LOCK.ACQUIRE` ignores the clients waiting: a request the lock
    /// admits is granted at once, ahead of them (barging).
    Barging,
    /// The queue is served past a head that cannot be granted: shared
    /// requests behind a waiting writer are granted if the lock admits them.
    ServePastTheHead,
    /// The semaphore's limit is ignored: permits are granted as read holds.
    IgnoreLimit,
    /// A writer is granted beside shared holds: it only waits for another
    /// writer (the mistake of a read-write lock that checks one mode only).
    WriterBesideReaders,
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
    /// A client was answered that was not waiting (twice, or never parked).
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
    holds: Holds,
    /// The parked clients, in the order they parked.
    queue: Vec<u8>,
    last_fence: u64,
    /// The highest shared hold's fence issued so far.
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
    /// The server serves the queue.
    Serve,
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

    /// The queue as the core's rule reads it.
    fn requests(&self, s: &State) -> Vec<Request<'static, u8>> {
        s.queue
            .iter()
            .map(|&client| Request {
                id: client,
                owner: self.owner(client as usize),
                mode: self.mode(client as usize),
                ttl_ms: self.bounds.ttl,
            })
            .collect()
    }

    /// Whether serving the queue now would answer anyone (tried on a copy
    /// of the holds).
    fn would_serve(&self, s: &State) -> bool {
        let mut holds = s.holds.clone();
        !shared_queue::serve(&mut holds, self.requests(s), s.now, || 0).is_empty()
            || !self.flawed_serve(s, &mut holds, || 0).is_empty()
    }

    /// The grants a flaw in the queue rule makes where the core's rule
    /// grants nobody.
    fn flawed_serve(
        &self,
        s: &State,
        holds: &mut Holds,
        mut issue_fence: impl FnMut() -> u64,
    ) -> Vec<(u8, Answer)> {
        let mut out = Vec::new();
        let now = s.now;
        match self.bounds.flaw {
            Some(Flaw::ServePastTheHead) => {
                for request in self.requests(s).into_iter().skip(1) {
                    if matches!(request.mode, Mode::Shared { .. })
                        && holds.of(request.owner, now).is_none()
                        && holds.admits(request.mode, now)
                    {
                        let hold = holds.begin(
                            request.owner,
                            request.mode,
                            request.ttl_ms,
                            now,
                            issue_fence(),
                        );
                        out.push((request.id, Answer::Fresh(hold)));
                    }
                }
            }
            Some(Flaw::WriterBesideReaders) => {
                if let Some(head) = self.requests(s).first() {
                    let shared_only =
                        holds.live(now).next().is_some() && holds.mode() != Mode::Exclusive;
                    if head.mode == Mode::Exclusive && shared_only {
                        let hold =
                            holds.begin(head.owner, head.mode, head.ttl_ms, now, issue_fence());
                        out.push((head.id, Answer::Fresh(hold)));
                    }
                }
            }
            _ => {}
        }
        out
    }

    fn serve(&self, s: &mut State) {
        let now = s.now;
        let mut last = s.last_fence;
        let mut holds = s.holds.clone();
        let mut issue = || {
            last = fence::next(last, now);
            last
        };
        let mut served: Vec<(u8, Answer)> =
            shared_queue::serve(&mut holds, self.requests(s), now, &mut issue)
                .into_iter()
                .map(|served| (served.id, served.answer))
                .collect();
        if served.is_empty() {
            served = self.flawed_serve(s, &mut holds, &mut issue);
        }
        s.holds = holds;
        let fresh = served
            .iter()
            .filter(|(_, answer)| matches!(answer, Answer::Fresh(_)))
            .count();
        s.seen.granted_together |= fresh >= 2;
        s.seen.granted_after_crash |= fresh >= 1 && s.seen.crash_ended;
        for (client, answer) in served {
            let Some(at) = s.queue.iter().position(|&c| c == client) else {
                s.broken.answered_twice = true;
                continue;
            };
            s.queue.remove(at);
            if !matches!(s.clients[client as usize], Client::Waiting { .. }) {
                s.broken.answered_twice = true;
            }
            match answer {
                Answer::Fresh(hold) => {
                    // Everyone parked ahead of it has been answered.
                    s.broken.overtaken |= at > 0;
                    let writer_ahead = s.queue[..at]
                        .iter()
                        .any(|&c| self.mode(c as usize) == Mode::Exclusive);
                    let shared = self.mode(client as usize) != Mode::Exclusive;
                    s.broken.writer_overtaken |= shared && writer_ahead;
                    if !shared && s.last_shared_fence > 0 {
                        s.seen.writer_after_shared |= hold.fence > s.last_shared_fence;
                    }
                    self.issued(s, client as usize, hold.fence);
                    s.clients[client as usize] = Client::Holding {
                        fence: hold.fence,
                        until: hold.expires_at,
                        count: 1,
                    };
                }
                Answer::Reentered(hold) => {
                    s.seen.queue_reentry = true;
                    s.clients[client as usize] = Client::Holding {
                        fence: hold.fence,
                        until: hold.expires_at,
                        count: 1,
                    };
                }
                Answer::Refused(error) => {
                    s.seen.upgrade_refused |= error == LockError::Upgrade;
                    s.clients[client as usize] = Client::Idle;
                }
            }
        }
    }

    /// A fresh fence `fence` went to `client`: it must be above every one
    /// issued before.
    fn issued(&self, s: &mut State, client: usize, fence: u64) {
        s.broken.fence_fell |= fence <= s.last_fence;
        s.last_fence = s.last_fence.max(fence);
        if self.mode(client) != Mode::Exclusive {
            s.last_shared_fence = s.last_shared_fence.max(fence);
        }
    }

    fn acquire(&self, s: &mut State, client: usize, wait: bool) {
        let now = s.now;
        let mode = self.mode(client);
        let requests = self.requests(s);
        let waiting = shared_queue::waiting_shared_mode(&requests);
        let barriers = Barriers {
            waiters: !s.queue.is_empty() && self.bounds.flaw != Some(Flaw::Barging),
            quarantined: false,
        };
        let last = s.last_fence;
        let decision = s.holds.acquire(
            self.owner(client),
            mode,
            self.bounds.ttl,
            now,
            barriers,
            waiting,
            || fence::next(last, now),
        );
        match decision {
            Ok(Acquire::Fresh(hold)) => {
                // Every client waiting came before it.
                s.broken.overtaken |= !s.queue.is_empty();
                let writer_waits = s
                    .queue
                    .iter()
                    .any(|&c| self.mode(c as usize) == Mode::Exclusive);
                s.broken.writer_overtaken |= mode != Mode::Exclusive && writer_waits;
                self.issued(s, client, hold.fence);
                s.clients[client] = Client::Holding {
                    fence: hold.fence,
                    until: hold.expires_at,
                    count: 1,
                };
            }
            Ok(Acquire::Reentered(hold)) => {
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
            Ok(Acquire::Busy) if wait => {
                s.queue.push(client as u8);
                s.clients[client] = Client::Waiting {
                    deadline: now + self.bounds.wait,
                };
            }
            // Nil, or an error: it holds nothing (a lease it had has ended,
            // or it would have been reentered).
            Ok(Acquire::Busy) | Err(_) => {
                s.seen.limit_refused |= decision == Err(LockError::LimitMismatch);
                s.seen.upgrade_refused |= decision == Err(LockError::Upgrade);
                s.clients[client] = Client::Idle;
            }
        }
    }
}

impl State {
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
            queue: Vec::new(),
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
        let mut server_work = false;
        if !s.queue.is_empty() && self.would_serve(s) {
            actions.push(Action::Serve);
            server_work = true;
        }
        for (i, c) in s.clients.iter().enumerate() {
            let client = i as u8;
            if let Client::Waiting { deadline } = *c {
                if s.now >= deadline {
                    actions.push(Action::Timeout { client });
                    server_work = true;
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
        if !server_work && s.now < b.horizon {
            actions.push(Action::Tick);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        let now = s.now;
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
                s.clients[i] = match s.holds.renew(self.owner(i), self.bounds.ttl, now) {
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
                s.clients[i] = match (s.holds.release(self.owner(i), false, now), s.clients[i]) {
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
            Action::Serve => self.serve(&mut s),
            Action::Timeout { client } => {
                match s.queue.iter().position(|&c| c == client) {
                    Some(at) => {
                        s.queue.remove(at);
                    }
                    None => s.broken.answered_twice = true,
                }
                s.clients[client as usize] = Client::Idle;
                s.seen.timed_out = true;
            }
            Action::Tick => {
                s.now += 1;
                // The lease checks: ended holds go.
                s.holds.drop_ended(s.now);
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
                    Some(_) if m.would_serve(s) => true,
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
        if readers >= 2 || (permits >= 2 && self.bounds.limit >= 2) {
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
