//! Model 1: one server, its clients and its operator.
//!
//! Clients acquire (with or without `WAIT` and a deadline), reenter, renew,
//! release and disconnect; leases end as time ticks; an operator deletes,
//! overwrites (`SET`) and flushes keys and pauses writes. The server side is
//! the module's own core — [`lock`] decides each command, [`fence::next`]
//! issues fences, [`Engine`] (with its [`queue`](redislock_core::queue)) decides
//! hand-offs — and this file's glue does what `src/commands.rs` and
//! `src/ffi/waiting.rs` do around it: write the key, issue the fence, arm
//! timers, answer handles, take back grants never replied.
//!
//! Time is a tick counter passed to the core as `now_ms`. Work the server
//! owes (a pump job, a due timer, a reply to write) runs before time moves
//! on, in any order with the clients' commands at that tick: that is the
//! "within a few milliseconds" of the contract, and every interleaving of
//! it is explored.

use std::fmt;

use redislock_core::fence;
use redislock_core::handoff::{
    self, Engine, Gate, Gone, Grant, InFlight, Key, Serve, Timer, Waiter,
};
use redislock_core::lock::{self, Acquire, Barriers, Hold, Lock};
use redislock_core::queue::LockName;
use stateright::{Model, Property};

use crate::Fence;

/// Owner tokens: client `i` uses `OWNERS[2i]`, and after a reconnect either
/// the same token (one token per process, as `<uuid>:<thread>`) or a new one,
/// `OWNERS[2i + 1]` (see [`Bounds::same_owner_after_reconnect`]).
const OWNERS: [&[u8]; 8] = [b"c0", b"c0'", b"c1", b"c1'", b"c2", b"c2'", b"c3", b"c3'"];
const LOCK_NAMES: [&str; 3] = ["a", "b", "c"];

fn name(lock: usize) -> LockName {
    LockName::new(0, LOCK_NAMES[lock].as_bytes())
}

fn lock_index(name: &LockName) -> usize {
    LOCK_NAMES
        .iter()
        .position(|n| n.as_bytes() == name.key.as_slice())
        .unwrap_or(usize::MAX)
}

fn owner_index(owner: &[u8]) -> usize {
    OWNERS
        .iter()
        .position(|o| *o == owner)
        .unwrap_or(usize::MAX)
}

/// The bounds of one run.
#[derive(Clone, Debug)]
pub struct Bounds {
    pub clients: usize,
    pub locks: usize,
    /// Time runs from 0 to this tick.
    pub horizon: u64,
    /// Lease lengths a client may ask for.
    pub ttls: Vec<u64>,
    /// `WAIT` timeouts a client may ask for (0: no limit).
    pub timeouts: Vec<u64>,
    /// Highest reentry count a client builds up.
    pub max_count: u64,
    /// Disconnects per client.
    pub disconnects: u8,
    /// Operator writes (DEL, SET, FLUSHALL) in the whole run.
    pub operator_writes: u8,
    /// `CLIENT PAUSE WRITE` periods in the whole run.
    pub pauses: u8,
    /// Commands per client (bounds the run without bounding time).
    pub commands: u8,
    /// A client that reconnects keeps its owner token (`true`), or takes a
    /// new one. With `true` the checker finds a counterexample to mutual
    /// exclusion: see `model/README.md`, "revoke after a reentry".
    pub same_owner_after_reconnect: bool,
}

impl Bounds {
    /// Small enough for `make test`.
    pub fn quick() -> Bounds {
        Bounds {
            clients: 2,
            locks: 1,
            horizon: 4,
            ttls: vec![2],
            timeouts: vec![2],
            max_count: 2,
            disconnects: 1,
            operator_writes: 1,
            pauses: 1,
            commands: 2,
            same_owner_after_reconnect: false,
        }
    }

    /// A full run of `make model`: two clients, a longer run, more choices.
    pub fn full() -> Bounds {
        Bounds {
            clients: 2,
            locks: 1,
            horizon: 5,
            ttls: vec![2],
            timeouts: vec![0, 2],
            max_count: 2,
            disconnects: 1,
            operator_writes: 1,
            pauses: 1,
            commands: 3,
            same_owner_after_reconnect: false,
        }
    }

    /// A full run of `make model`: three clients, so two can wait at once.
    pub fn three_clients() -> Bounds {
        Bounds {
            clients: 3,
            locks: 1,
            horizon: 3,
            ttls: vec![2],
            timeouts: vec![2],
            max_count: 2,
            disconnects: 1,
            operator_writes: 1,
            pauses: 1,
            commands: 2,
            same_owner_after_reconnect: false,
        }
    }
}

/// The model (and its bounds).
#[derive(Clone, Debug)]
pub struct ServerModel {
    pub bounds: Bounds,
}

/// A waiting client's handle: which client, which connection, which wait.
/// It must come back from the engine exactly once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Handle {
    client: u8,
    conn: u8,
    wait: u8,
}

/// What a key holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Slot {
    Empty,
    /// A lock; its key's TTL is its lease (the module keeps them equal).
    Lock {
        owner: u8,
        count: u64,
        fence: u64,
        lease: u64,
    },
    /// Another type (a `SET` overwrote the lock), maybe with an expiry.
    Foreign {
        expiry: Option<u64>,
    },
}

impl Slot {
    /// When Redis would expire the key: the tick after its expiry.
    fn expiry(&self) -> Option<u64> {
        match *self {
            Slot::Empty => None,
            Slot::Lock { lease, .. } => Some(lease),
            Slot::Foreign { expiry } => expiry,
        }
    }
}

/// A module timer the glue armed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Armed {
    /// Fires at `at`.
    Lease {
        lock: u8,
        at: u64,
    },
    Retry {
        at: u64,
    },
    Deadline {
        client: u8,
        conn: u8,
        at: u64,
    },
}

impl Armed {
    fn at(&self) -> u64 {
        match *self {
            Armed::Lease { at, .. } | Armed::Retry { at } | Armed::Deadline { at, .. } => at,
        }
    }
}

/// A reply the server has decided but not written yet (Redis writes the
/// replies of unblocked clients before it next sleeps).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Reply {
    Granted { lock: u8, fence: u64, until: u64 },
    Nil,
}

/// A client as it sees itself.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Client {
    conn: u8,
    disconnects: u8,
    commands: u8,
    waits: u8,
    /// Blocked in `LOCK.ACQUIRE … WAIT`: on which lock, which wait.
    blocked: Option<(u8, u8)>,
    /// A reply on its way to it.
    reply: Option<Reply>,
    /// Per lock: the fence and lease end of the hold it believes it has.
    holds: Vec<Option<(u64, u64)>>,
}

/// Broken rules, recorded when they happen (a property reads them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct Broken {
    /// A fence not above every fence issued before it.
    fence: bool,
    /// A grant to a client that was not first in line.
    order: bool,
    /// A grant to a client that had left the queue.
    left: bool,
    /// A handle came back twice (or one never given out).
    twice: bool,
    /// A blocked client the engine no longer knows: nobody will answer it.
    lost: bool,
}

/// Examples the run should show (so no property holds only vacuously).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct Seen {
    handoff: bool,
    handoff_after_pause: bool,
    revoked: bool,
    timed_out: bool,
    /// Some serve was deferred by a pause (hand-offs after it count below).
    deferred: bool,
}

#[derive(Clone, PartialEq, Eq, Hash)]
pub struct State {
    now: u64,
    keys: Vec<Slot>,
    /// The server's fence counter (what `fence::issue` keeps globally).
    last_fence: u64,
    engine: Engine<Handle>,
    /// Pump jobs armed (post-notification jobs or 0 ms timers).
    pumps: u8,
    /// Module timers armed, sorted.
    timers: Vec<Armed>,
    paused: bool,
    pauses: u8,
    operator_writes: u8,
    clients: Vec<Client>,
    /// [`Bounds::same_owner_after_reconnect`], a constant of the run.
    same_owner: bool,
    /// The model's own record of each lock's queue, in arrival order.
    line: Vec<Vec<u8>>,
    /// Grants taken back: (lock, fence) that must not stay held.
    revoked: Vec<(u8, u64)>,
    /// Holds the operator forced free: (lock, fence).
    forced: Vec<(u8, u64)>,
    highest_fence: u64,
    broken: Broken,
    seen: Seen,
}

/// What can happen next.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Acquire {
        client: u8,
        lock: u8,
        ttl: u64,
        wait: Option<u64>,
    },
    Reenter {
        client: u8,
        lock: u8,
        ttl: Option<u64>,
    },
    Renew {
        client: u8,
        lock: u8,
        ttl: u64,
    },
    Release {
        client: u8,
        lock: u8,
        all: bool,
    },
    Disconnect {
        client: u8,
    },
    /// `DEL` (or `MOVE`/`RENAME` away: the same "key left" event).
    Del {
        lock: u8,
    },
    /// `SET key v [PX ttl]`: another type over the lock.
    Set {
        lock: u8,
        ttl: Option<u64>,
    },
    FlushAll,
    /// Redis's active expiry deletes an expired key.
    ActiveExpire {
        lock: u8,
    },
    Pause,
    Resume,
    /// The server runs a pump job.
    Pump,
    /// A due module timer fires.
    Fire(ArmedTimer),
    /// The server writes a client's reply.
    Reply {
        client: u8,
    },
    Tick,
}

/// A timer, as named in an action.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ArmedTimer(Armed);

impl ServerModel {
    fn id(client: usize, conn: u8) -> u64 {
        client as u64 * 16 + conn as u64 + 1
    }
}

// ---------------------------------------------------------------------------
// The glue: what src/ffi/waiting.rs and src/commands.rs do around the core.
// ---------------------------------------------------------------------------

impl State {
    /// The owner token client `client` uses now: its index in [`OWNERS`].
    fn token(&self, client: usize) -> u8 {
        let renewed = !self.same_owner && self.clients[client].conn > 0;
        (2 * client + usize::from(renewed)) as u8
    }

    fn owner(&self, client: usize) -> &'static [u8] {
        OWNERS[self.token(client) as usize]
    }

    /// The lock as the core sees it (`LockKey::current`).
    fn current(&self, lock: usize) -> Result<Option<Lock<'static>>, ()> {
        match self.keys[lock] {
            Slot::Empty => Ok(None),
            Slot::Lock {
                owner,
                count,
                fence,
                lease,
            } => Ok(Some(Lock {
                owner: OWNERS[owner as usize],
                hold: Hold {
                    count,
                    fence,
                    expires_at: lock::lease_end(lease, Some(lease)),
                },
            })),
            Slot::Foreign { .. } => Err(()),
        }
    }

    /// Opens a key: Redis deletes it first if it has expired (now past its
    /// expiry) and tells the module (`expired`).
    fn open(&mut self, lock: usize, inline: bool) {
        if self.keys[lock].expiry().is_some_and(|at| at < self.now) {
            self.remove(lock);
            self.key_left(lock, inline);
        }
    }

    /// The key is gone.
    fn remove(&mut self, lock: usize) {
        self.keys[lock] = Slot::Empty;
    }

    /// The operator removes or overwrites a key: a live hold there is
    /// forced free (the contract's way to force a lock free), so its
    /// holder's belief no longer counts for mutual exclusion.
    fn force_free(&mut self, lock: usize) {
        if let Slot::Lock { fence, .. } = self.keys[lock] {
            self.forced.push((lock as u8, fence));
            self.forced.sort();
        }
        self.remove(lock);
    }

    /// A keyspace notification of a key leaving (`events::keyspace_event`).
    fn key_left(&mut self, lock: usize, inline: bool) {
        if inline || !self.engine.anyone_waiting() {
            return;
        }
        if self.engine.freed(name(lock)) {
            self.pumps += 1;
        }
    }

    fn arm(&mut self, timer: Armed) {
        self.timers.push(timer);
        self.timers.sort();
    }

    fn arm_lease_check(&mut self, timer: Option<Timer>) {
        if let Some(Timer { name, at, delay_ms }) = timer {
            debug_assert_eq!(at, self.now + delay_ms);
            self.arm(Armed::Lease {
                lock: lock_index(&name) as u8,
                at,
            });
        }
    }

    fn disarm_deadline(&mut self, client: usize) {
        self.timers
            .retain(|t| !matches!(t, Armed::Deadline { client: c, .. } if *c as usize == client));
    }

    /// A handle came back from the engine: answer that client, once.
    fn answer(&mut self, handle: Handle, reply: Option<Reply>) {
        let client = &mut self.clients[handle.client as usize];
        if client.conn != handle.conn || client.blocked.map(|b| b.1) != Some(handle.wait) {
            self.broken.twice = true;
            return;
        }
        let lock = client.blocked.map_or(0, |b| b.0 as usize);
        client.blocked = None;
        client.reply = reply;
        self.line[lock].retain(|&c| c != handle.client);
        self.disarm_deadline(handle.client as usize);
    }

    fn issue_fence(&mut self) -> u64 {
        let fence = fence::next(self.last_fence, self.now);
        if fence <= self.highest_fence {
            self.broken.fence = true;
        }
        self.last_fence = fence;
        self.highest_fence = self.highest_fence.max(fence);
        fence
    }

    /// `waiting::serve`: looks at a lock and carries out the engine's decision.
    fn serve(&mut self, lock: usize, in_command: bool) {
        // Writes paused (a command never runs then), else the quarantine's
        // gate: this model has no quarantine (model 2 has), so it is open.
        let gate = if !in_command && self.paused {
            Gate::Closed {
                retry_in_ms: handoff::PAUSE_RETRY_MS,
            }
        } else {
            Gate::Open
        };
        if gate != Gate::Open {
            self.seen.deferred = true;
            // The glue does not open the key while paused.
            if let Serve::Deferred {
                retry_in_ms: Some(delay),
            } = self.engine.serve(&name(lock), Key::Free, self.now, gate)
            {
                self.arm(Armed::Retry {
                    at: self.now + delay,
                });
            }
            return;
        }
        self.open(lock, false);
        let seen = match self.current(lock) {
            Ok(None) => Key::Free,
            Ok(Some(held)) => Key::Held {
                until: held.hold.expires_at,
            },
            Err(()) => Key::Foreign {
                until: self.keys[lock].expiry(),
            },
        };
        match self.engine.serve(&name(lock), seen, self.now, Gate::Open) {
            Serve::Wait(timer) => self.arm_lease_check(timer),
            Serve::Deferred { .. } => {}
            Serve::Grant(grant) => self.hand_over(lock, grant),
        }
    }

    /// `waiting::hand_over`: writes the lock for the waiter, answers it.
    fn hand_over(&mut self, lock: usize, grant: Grant<Handle>) {
        let Grant {
            id,
            waiter,
            end_previous,
            until,
            then,
        } = grant;
        let client = waiter.handle.client;
        // The model's own line: the grant must go to its head, and to a
        // client still in it.
        match self.line[lock].first() {
            Some(&head) if head == client => {}
            _ if !self.line[lock].contains(&client) => self.broken.left = true,
            _ => self.broken.order = true,
        }
        let token = owner_index(&waiter.owner) as u8;
        if end_previous {
            self.remove(lock);
        }
        let fence = self.issue_fence();
        self.keys[lock] = Slot::Lock {
            owner: token,
            count: 1,
            fence,
            lease: until,
        };
        self.engine.granted(
            id,
            InFlight {
                name: name(lock),
                owner: waiter.owner,
                fence,
            },
        );
        self.seen.handoff = true;
        if self.seen.deferred {
            self.seen.handoff_after_pause = true;
        }
        self.answer(
            waiter.handle,
            Some(Reply::Granted {
                lock: lock as u8,
                fence,
                until,
            }),
        );
        self.arm_lease_check(then);
    }

    /// `waiting::revoke`: frees a lock granted to a client that never got
    /// the reply, if it is still that grant, and serves the next waiter.
    fn revoke(&mut self, grant: &InFlight) {
        let lock = lock_index(&grant.name);
        self.open(lock, false);
        if lock::revocable(self.current(lock).ok().flatten(), &grant.owner, grant.fence) {
            self.remove(lock);
            self.serve(lock, false);
        }
    }

    /// `waiting::pump`.
    fn pump(&mut self) {
        let work = self.engine.take_pending();
        if work == handoff::Pending::default() {
            return;
        }
        if self.paused {
            self.seen.deferred = true;
            if let Some(delay) = self.engine.defer(work, handoff::PAUSE_RETRY_MS) {
                self.arm(Armed::Retry {
                    at: self.now + delay,
                });
            }
            return;
        }
        for grant in &work.revokes {
            self.revoke(grant);
        }
        for name in &work.serves {
            self.serve(lock_index(name), false);
        }
    }

    /// `waiting::lease_changed`: the holder's lease now ends at `at`.
    fn lease_changed(&mut self, lock: usize, at: u64) {
        if self.engine.has_waiters(&name(lock)) {
            let timer = self.engine.lease_moved(&name(lock), at, self.now);
            self.arm_lease_check(timer);
        }
    }

    /// A hold this client believes in: set, or dropped (NOTOWNER, released).
    fn believe(&mut self, client: usize, lock: usize, hold: Option<(u64, u64)>) {
        self.clients[client].holds[lock] = hold;
    }

    /// `commands::acquire`.
    fn acquire(&mut self, client: usize, lock: usize, ttl: u64, wait: Option<u64>) {
        let owner = self.owner(client);
        if self.engine.has_waiters(&name(lock)) {
            self.serve(lock, true);
        }
        self.open(lock, false);
        let Ok(current) = self.current(lock) else {
            return; // WRONGTYPE
        };
        let now = self.now;
        let holder_until = current
            .filter(|held| held.is_live(now))
            .map(|held| held.hold.expires_at);
        let free = holder_until.is_none();
        let barriers = Barriers {
            waiters: free && self.engine.has_waiters(&name(lock)),
            // This model has no quarantine (model 2 has).
            quarantined: false,
        };
        let fence = fence::next(self.last_fence, now);
        let decision = lock::acquire(current, owner, ttl, now, barriers, || fence);
        match decision {
            Ok(Acquire::Fresh(hold)) => {
                if current.is_some() {
                    self.remove(lock); // inline: no notification heard
                }
                let fence = self.issue_fence();
                debug_assert_eq!(fence, hold.fence);
                self.keys[lock] = Slot::Lock {
                    owner: self.token(client),
                    count: hold.count,
                    fence: hold.fence,
                    lease: hold.expires_at,
                };
                self.believe(client, lock, Some((hold.fence, hold.expires_at)));
            }
            Ok(Acquire::Reentered(hold)) => {
                self.store(client, lock, hold);
                self.believe(client, lock, Some((hold.fence, hold.expires_at)));
                self.lease_changed(lock, hold.expires_at);
            }
            Ok(Acquire::Busy) => {
                if let Some(timeout) = wait {
                    self.park(client, lock, ttl, timeout, holder_until);
                    if free {
                        // Free but not grantable now: served when the gate opens.
                        self.serve(lock, true);
                    }
                }
            }
            Err(_) => {}
        }
    }

    /// `waiting::block`: parks the client on the lock.
    fn park(
        &mut self,
        client: usize,
        lock: usize,
        ttl: u64,
        timeout: u64,
        holder_until: Option<u64>,
    ) {
        let c = &mut self.clients[client];
        c.waits += 1;
        let handle = Handle {
            client: client as u8,
            conn: c.conn,
            wait: c.waits,
        };
        c.blocked = Some((lock as u8, c.waits));
        self.line[lock].push(client as u8);
        if timeout > 0 {
            self.arm(Armed::Deadline {
                client: client as u8,
                conn: handle.conn,
                at: self.now + timeout,
            });
        }
        let waiter = Waiter {
            owner: self.owner(client).to_vec(),
            ttl_ms: ttl,
            handle,
        };
        let id = ServerModel::id(client, handle.conn);
        match self
            .engine
            .park(name(lock), id, waiter, holder_until, self.now)
        {
            Ok(timer) => self.arm_lease_check(timer),
            Err(waiter) => self.answer(waiter.handle, Some(Reply::Nil)),
        }
    }

    /// The owner was answered for this hold by a command of its own: a
    /// revoke queued for it may rightly leave it alone (`lock::revocable`).
    fn claimed(&mut self, lock: usize, fence: u64) {
        self.revoked
            .retain(|&(l, f)| (l as usize, f) != (lock, fence));
    }

    fn store(&mut self, client: usize, lock: usize, hold: Hold) {
        self.claimed(lock, hold.fence);
        // `waiting::owner_active`, as every owner command that succeeds does.
        let owner = self.owner(client).to_vec();
        self.engine.owner_active(&name(lock), &owner);
        self.keys[lock] = Slot::Lock {
            owner: self.token(client),
            count: hold.count,
            fence: hold.fence,
            lease: hold.expires_at,
        };
    }

    /// `commands::reenter`, `renew`, `release`: the owner-only commands.
    fn owner_command(&mut self, action: &Action) {
        let now = self.now;
        match *action {
            Action::Reenter { client, lock, ttl } => {
                let (client, lock) = (client as usize, lock as usize);
                self.open(lock, false);
                let Ok(current) = self.current(lock) else {
                    return;
                };
                match lock::reenter(current, self.owner(client), ttl, now) {
                    Ok(hold) => {
                        self.store(client, lock, hold);
                        if ttl.is_some() {
                            self.believe(client, lock, Some((hold.fence, hold.expires_at)));
                        }
                        self.lease_changed(lock, hold.expires_at);
                    }
                    Err(_) => self.believe(client, lock, None),
                }
            }
            Action::Renew { client, lock, ttl } => {
                let (client, lock) = (client as usize, lock as usize);
                self.open(lock, false);
                let Ok(current) = self.current(lock) else {
                    return;
                };
                match lock::renew(current, self.owner(client), ttl, now) {
                    Ok(hold) => {
                        self.store(client, lock, hold);
                        self.believe(client, lock, Some((hold.fence, hold.expires_at)));
                        self.lease_changed(lock, hold.expires_at);
                    }
                    Err(_) => self.believe(client, lock, None),
                }
            }
            Action::Release { client, lock, all } => {
                let (client, lock) = (client as usize, lock as usize);
                self.open(lock, false);
                let Ok(current) = self.current(lock) else {
                    return;
                };
                match lock::release(current, self.owner(client), all, now) {
                    Ok(Some(hold)) => self.store(client, lock, hold),
                    Ok(None) => {
                        self.believe(client, lock, None);
                        self.keys[lock] = Slot::Empty; // inline: no notification heard
                        if self.engine.has_waiters(&name(lock)) {
                            self.serve(lock, true);
                        }
                    }
                    Err(_) => self.believe(client, lock, None),
                }
            }
            _ => {}
        }
    }

    /// The disconnect callback (`waiting::disconnect_cb`), called for a
    /// blocked client, or one unblocked whose reply is not written yet.
    fn disconnect(&mut self, client: usize) {
        let c = &self.clients[client];
        let id = ServerModel::id(client, c.conn);
        let (blocked, reply) = (c.blocked, c.reply);
        if blocked.is_some() || reply.is_some() {
            match self.engine.gone(id) {
                Gone::Waiting(waiter) => self.answer(waiter.handle, None),
                Gone::Revoke { arm_pump } => {
                    if let Some(Reply::Granted { lock, fence, .. }) = reply {
                        self.revoked.push((lock, fence));
                        self.revoked.sort();
                        self.seen.revoked = true;
                    }
                    if arm_pump {
                        self.pumps += 1;
                    }
                }
                Gone::Unknown => {}
            }
        }
        if self.clients[client].blocked.is_some() {
            // Still blocked after the engine had its say: nobody has its handle.
            self.broken.lost = true;
        }
        let c = &mut self.clients[client];
        c.blocked = None;
        c.reply = None;
        c.conn += 1;
        c.disconnects += 1;
    }

    /// A module timer fires.
    fn fire(&mut self, timer: Armed) {
        if let Some(i) = self.timers.iter().position(|t| *t == timer) {
            self.timers.remove(i);
        }
        match timer {
            Armed::Lease { lock, at } => {
                self.engine.lease_check_fired(&name(lock as usize), at);
                self.serve(lock as usize, false);
            }
            Armed::Retry { .. } => {
                self.engine.retry_fired();
                self.pump();
            }
            Armed::Deadline { client, conn, .. } => {
                let id = ServerModel::id(client as usize, conn);
                match self.engine.leave(id) {
                    Some(waiter) => {
                        self.seen.timed_out = true;
                        self.answer(waiter.handle, Some(Reply::Nil));
                    }
                    None if self.clients[client as usize].blocked.is_some()
                        && self.clients[client as usize].conn == conn =>
                    {
                        self.broken.lost = true;
                    }
                    None => {}
                }
            }
        }
    }

    /// Work the server does before time moves on.
    fn urgent(&self) -> bool {
        self.pumps > 0
            || self.clients.iter().any(|c| c.reply.is_some())
            || self.timers.iter().any(|t| t.at() <= self.now)
    }

    /// Clients in at most one state each: how many believe they hold `lock`
    /// with a lease not yet ended.
    fn believers(&self, lock: usize) -> usize {
        self.clients
            .iter()
            .filter_map(|c| c.holds[lock])
            .filter(|&(fence, until)| {
                !lock::ended(until, self.now) && !self.forced.contains(&(lock as u8, fence))
            })
            .count()
    }

    /// Nothing left for the server to do on its own at this tick, and no
    /// retry after a pause is pending.
    fn idle(&self) -> bool {
        !self.urgent() && !self.timers.iter().any(|t| matches!(t, Armed::Retry { .. }))
    }
}

// ---------------------------------------------------------------------------
// The model.
// ---------------------------------------------------------------------------

impl Model for ServerModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let b = &self.bounds;
        vec![State {
            now: 0,
            keys: vec![Slot::Empty; b.locks],
            last_fence: 0,
            engine: Engine::default(),
            pumps: 0,
            timers: Vec::new(),
            paused: false,
            pauses: 0,
            operator_writes: 0,
            clients: vec![
                Client {
                    conn: 0,
                    disconnects: 0,
                    commands: 0,
                    waits: 0,
                    blocked: None,
                    reply: None,
                    holds: vec![None; b.locks],
                };
                b.clients
            ],
            same_owner: b.same_owner_after_reconnect,
            line: vec![Vec::new(); b.locks],
            revoked: Vec::new(),
            forced: Vec::new(),
            highest_fence: 0,
            broken: Broken::default(),
            seen: Seen::default(),
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        let b = &self.bounds;
        // The server's own work.
        if s.pumps > 0 {
            actions.push(Action::Pump);
        }
        for t in &s.timers {
            if t.at() <= s.now {
                actions.push(Action::Fire(ArmedTimer(*t)));
            }
        }
        for (i, c) in s.clients.iter().enumerate() {
            if c.reply.is_some() {
                actions.push(Action::Reply { client: i as u8 });
            }
        }
        // Clients: writes are held back by the server while it pauses them.
        for (i, c) in s.clients.iter().enumerate() {
            let client = i as u8;
            if c.disconnects < b.disconnects {
                actions.push(Action::Disconnect { client });
            }
            if s.paused || c.blocked.is_some() || c.reply.is_some() || c.commands >= b.commands {
                continue;
            }
            for l in 0..b.locks {
                let lock = l as u8;
                let count = match s.keys[l] {
                    Slot::Lock { owner, count, .. } if owner == s.token(i) => count,
                    _ => 0,
                };
                let holding = c.holds[l].is_some();
                for &ttl in &b.ttls {
                    if count < b.max_count {
                        actions.push(Action::Acquire {
                            client,
                            lock,
                            ttl,
                            wait: None,
                        });
                        if !holding {
                            for &timeout in &b.timeouts {
                                actions.push(Action::Acquire {
                                    client,
                                    lock,
                                    ttl,
                                    wait: Some(timeout),
                                });
                            }
                        }
                    }
                }
                // Owner-only commands: sent by a client that believes it holds the lock.
                if holding {
                    if count < b.max_count {
                        actions.push(Action::Reenter {
                            client,
                            lock,
                            ttl: None,
                        });
                    }
                    for &ttl in &b.ttls {
                        actions.push(Action::Renew { client, lock, ttl });
                    }
                    actions.push(Action::Release {
                        client,
                        lock,
                        all: false,
                    });
                    if count > 1 {
                        actions.push(Action::Release {
                            client,
                            lock,
                            all: true,
                        });
                    }
                }
            }
        }
        // The operator.
        if !s.paused {
            if s.operator_writes < b.operator_writes {
                for l in 0..b.locks {
                    if s.keys[l] != Slot::Empty {
                        actions.push(Action::Del { lock: l as u8 });
                    }
                    if !matches!(s.keys[l], Slot::Foreign { .. }) {
                        actions.push(Action::Set {
                            lock: l as u8,
                            ttl: None,
                        });
                        actions.push(Action::Set {
                            lock: l as u8,
                            ttl: Some(1),
                        });
                    }
                }
                if s.keys.iter().any(|k| *k != Slot::Empty) {
                    actions.push(Action::FlushAll);
                }
            }
            for l in 0..b.locks {
                if s.keys[l].expiry().is_some_and(|at| at < s.now) {
                    actions.push(Action::ActiveExpire { lock: l as u8 });
                }
            }
            if s.pauses < b.pauses {
                actions.push(Action::Pause);
            }
        } else {
            actions.push(Action::Resume);
        }
        if s.now < b.horizon && !s.urgent() {
            actions.push(Action::Tick);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Acquire {
                client,
                lock,
                ttl,
                wait,
            } => {
                s.clients[client as usize].commands += 1;
                s.acquire(client as usize, lock as usize, ttl, wait);
            }
            Action::Reenter { client, .. }
            | Action::Renew { client, .. }
            | Action::Release { client, .. } => {
                s.clients[client as usize].commands += 1;
                s.owner_command(&action);
            }
            Action::Disconnect { client } => s.disconnect(client as usize),
            Action::Del { lock } => {
                s.operator_writes += 1;
                s.force_free(lock as usize);
                s.key_left(lock as usize, false);
            }
            Action::Set { lock, ttl } => {
                s.operator_writes += 1;
                s.force_free(lock as usize);
                s.keys[lock as usize] = Slot::Foreign {
                    expiry: ttl.map(|t| s.now + t),
                };
            }
            Action::FlushAll => {
                s.operator_writes += 1;
                for l in 0..s.keys.len() {
                    s.force_free(l);
                }
                // `waiting::freed_db`, in the order the names come (sorted
                // here: the model must be deterministic).
                let mut names = s.engine.names_in(None);
                names.sort();
                for n in names {
                    if s.engine.freed(n) {
                        s.pumps += 1;
                    }
                }
            }
            Action::ActiveExpire { lock } => {
                s.remove(lock as usize);
                s.key_left(lock as usize, false);
            }
            Action::Pause => {
                s.paused = true;
                s.pauses += 1;
            }
            Action::Resume => {
                s.paused = false;
            }
            Action::Pump => {
                s.pumps -= 1;
                s.pump();
            }
            Action::Fire(ArmedTimer(timer)) => s.fire(timer),
            Action::Reply { client } => {
                let c = client as usize;
                let id = ServerModel::id(c, s.clients[c].conn);
                s.engine.replied(id);
                if let Some(Reply::Granted { lock, fence, until }) = s.clients[c].reply.take() {
                    s.believe(c, lock as usize, Some((fence, until)));
                }
            }
            // A belief whose lease has ended stays: the client may still
            // send RENEW or RELEASE, and learns from NOTOWNER.
            Action::Tick => s.now += 1,
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = vec![
            Property::always("at most one client holds a lock", |_, s: &State| {
                (0..s.keys.len()).all(|l| s.believers(l) <= 1)
            }),
            Property::always("fences strictly increase", |_, s: &State| !s.broken.fence),
            Property::always(
                "waiters are granted in queue order, never after leaving",
                |_, s: &State| !s.broken.order && !s.broken.left,
            ),
            Property::always(
                "every blocked client is answered exactly once",
                |_, s: &State| !s.broken.twice && !s.broken.lost,
            ),
            Property::always(
                "no stuck queue: an idle server leaves no free lock to its waiters",
                |_, s: &State| {
                    s.paused
                        || !s.idle()
                        || (0..s.keys.len()).all(|l| {
                            !s.engine.has_waiters(&name(l))
                                || match s.keys[l] {
                                    Slot::Lock { lease, .. } => !lock::ended(lease, s.now),
                                    Slot::Foreign { .. } => true,
                                    Slot::Empty => false,
                                }
                        })
                },
            ),
            Property::always("a grant never replied is taken back", |_, s: &State| {
                !s.idle()
                        || s.paused
                        || s.revoked.iter().all(|&(l, f)| {
                            !matches!(s.keys[l as usize], Slot::Lock { fence, .. } if fence == f)
                        })
            }),
            Property::always(
                "the engine and the model agree on who waits",
                |_, s: &State| {
                    (0..s.keys.len()).all(|l| s.engine.waiters(&name(l)) == s.line[l].len())
                },
            ),
            Property::sometimes("a waiter is handed a lock", |_, s: &State| s.seen.handoff),
            Property::sometimes("a hand-off deferred by a pause", |_, s: &State| {
                s.seen.handoff_after_pause
            }),
            Property::sometimes("a grant is taken back", |_, s: &State| s.seen.revoked),
            Property::sometimes("a wait times out", |_, s: &State| s.seen.timed_out),
        ];
        if self.bounds.clients >= 3 {
            properties.push(Property::sometimes(
                "two clients wait at once",
                |_, s: &State| s.line.iter().any(|l| l.len() >= 2),
            ));
        }
        properties
    }

    fn within_boundary(&self, _: &State) -> bool {
        true
    }
}

// ---------------------------------------------------------------------------
// Traces: one line per state, only what matters.
// ---------------------------------------------------------------------------

impl fmt::Debug for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t={}", self.now)?;
        if self.paused {
            write!(f, " PAUSED")?;
        }
        for (l, key) in self.keys.iter().enumerate() {
            let n = LOCK_NAMES[l];
            match *key {
                Slot::Empty => write!(f, " | {n}: free")?,
                Slot::Lock {
                    owner,
                    count,
                    fence,
                    lease,
                } => write!(
                    f,
                    " | {n}: {} x{count} fence {} until {lease}",
                    String::from_utf8_lossy(OWNERS[owner as usize]),
                    Fence(fence)
                )?,
                Slot::Foreign { expiry } => write!(f, " | {n}: foreign value, expiry {expiry:?}")?,
            }
            if !self.line[l].is_empty() {
                write!(f, ", line {:?}", self.line[l])?;
            }
        }
        for (i, c) in self.clients.iter().enumerate() {
            let mut parts = Vec::new();
            if let Some((l, _)) = c.blocked {
                parts.push(format!("blocked on {}", LOCK_NAMES[l as usize]));
            }
            if let Some(r) = c.reply {
                parts.push(match r {
                    Reply::Granted { lock, fence, .. } => format!(
                        "reply pending: {} fence {}",
                        LOCK_NAMES[lock as usize],
                        Fence(fence)
                    ),
                    Reply::Nil => "reply pending: nil".into(),
                });
            }
            for (l, h) in c.holds.iter().enumerate() {
                if let Some((fence, until)) = h {
                    parts.push(format!(
                        "holds {} fence {} until {until}",
                        LOCK_NAMES[l],
                        Fence(*fence)
                    ));
                }
            }
            if !parts.is_empty() {
                write!(f, " | c{i}: {}", parts.join(", "))?;
            }
        }
        if self.pumps > 0 {
            write!(f, " | pump x{}", self.pumps)?;
        }
        if !self.timers.is_empty() {
            write!(f, " | timers {:?}", self.timers)?;
        }
        if self.broken != Broken::default() {
            write!(f, " | BROKEN {:?}", self.broken)?;
        }
        Ok(())
    }
}
