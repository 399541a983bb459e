//! Model 1: one server, its clients and its operator.
//!
//! Clients acquire (with or without `WAIT` and a deadline, and with
//! [`Bounds::ephemeral`] with or without `EPHEMERAL`), reenter, renew,
//! release and disconnect (a disconnect ends the ephemeral holds bound to
//! that connection, as `ffi::ephemeral` does); leases end as time ticks; an operator deletes,
//! overwrites (`SET`) and flushes keys and pauses writes. The server side is
//! the module's own core — [`lock`] decides each command, [`fence::next`]
//! issues fences, [`Engine`] (with its [`queue`](redislock_core::queue)) decides
//! hand-offs — put in order by the module's own sequencing,
//! [`orchestrate`] (what `src/commands.rs` and `src/ffi/host.rs` call).
//! This file only implements its [`Host`] on the model's state: a key is a
//! slot, a timer an entry, a reply a field of the client; and it records
//! what the properties need (who queued first, what was revoked).
//!
//! Time is a tick counter passed to the core as `now_ms`. Work the server
//! owes (a pump job, a due timer, a reply to write) runs before time moves
//! on, in any order with the clients' commands at that tick: that is the
//! "within a few milliseconds" of the contract, and every interleaving of
//! it is explored.

use std::fmt;

use redislock_core::ephemeral;
use redislock_core::error::LockError;
use redislock_core::fence;
use redislock_core::handoff::{Engine, Gate, Timer};
use redislock_core::holds::{Holder, Holds, Mode};
use redislock_core::lock::{self, Hold};
use redislock_core::orchestrate::{
    self, Acquired, Event, Host, Left, Nil, Read, Removal, Stored, Write,
};
use redislock_core::queue::LockName;
use stateright::{Model, Property};

use crate::wall_clock::{Steps, WallClock};
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
    /// Clients may also acquire with `EPHEMERAL`: the hold is bound to
    /// the connection it is granted on, and ends when it disconnects.
    pub ephemeral: bool,
    /// Steps of the server's wall clock (see [`crate::wall_clock`]).
    pub clock_steps: Steps,
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
            ephemeral: false,
            clock_steps: Steps::none(),
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
            ephemeral: false,
            clock_steps: Steps::none(),
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
            ephemeral: false,
            clock_steps: Steps::none(),
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
    /// Asked `EPHEMERAL`: bound to `conn` when it is handed the lock.
    ephemeral: bool,
}

/// What a key holds.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Slot {
    Empty,
    /// A lock; its key's TTL is its lease (the module keeps them equal).
    Lock {
        owner: u8,
        count: u64,
        fence: u64,
        lease: u64,
    },
    /// Holds listed by owner (shared ones, as the module keeps them); the
    /// key's TTL is their latest lease. A single exclusive hold is stored
    /// as [`Slot::Lock`] instead, as the module stores it compactly.
    Listed(Holds),
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
            Slot::Listed(ref holds) => holds.latest_lease(),
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
    /// An ephemeral hold ended because its connection closed.
    disconnect_ended: bool,
    /// ... and its lock was handed to a waiter at once.
    disconnect_handoff: bool,
    /// ... while writes were paused (ended after the pause).
    disconnect_deferred: bool,
}

/// A hold bound to a connection (`EPHEMERAL`): the client and connection,
/// the lock, and the hold's fence (a stale binding names an old fence).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Bound {
    client: u8,
    conn: u8,
    lock: u8,
    fence: u64,
}

#[derive(Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// The lease clock (elapsed time).
    now: u64,
    /// The wall clock beside it.
    wall: WallClock,
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
    /// Holds bound to connections, sorted.
    bound: Vec<Bound>,
    /// Bound holds whose connection closed while writes were paused: ended
    /// by the retry after the pause.
    pending_ends: Vec<Bound>,
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
        ephemeral: bool,
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
    /// The server's wall clock steps by this many ms; no time elapses.
    StepClock {
        by: i64,
    },
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
// The glue: the model's world as the module's own sequencing sees it.
// ---------------------------------------------------------------------------

/// The server side of the model as an [`orchestrate::Host`]: the shared
/// sequencing (`redislock_core::orchestrate`, what the module runs) acts on
/// the model's state through it. `caller`: the client whose command runs
/// (the one a `WAIT` blocks).
struct Server<'s> {
    s: &'s mut State,
    caller: usize,
    /// The caller's command asked `EPHEMERAL`.
    ephemeral: bool,
}

impl<'s> Server<'s> {
    /// The server's own work (a timer, a job): no client calls.
    fn on(s: &'s mut State) -> Self {
        Server {
            s,
            caller: usize::MAX,
            ephemeral: false,
        }
    }

    /// A command of client `caller`.
    fn command(s: &'s mut State, caller: usize) -> Self {
        Server {
            s,
            caller,
            ephemeral: false,
        }
    }
}

impl Host for Server<'_> {
    type Handle = Handle;
    /// A command names its lock by index.
    type Target = usize;
    /// An open key: the lock's index.
    type Key = usize;

    fn engine<R>(&mut self, f: impl FnOnce(&mut Engine<Handle>) -> R) -> R {
        f(&mut self.s.engine)
    }

    fn now(&self) -> u64 {
        self.s.wall.for_leases(self.s.now)
    }

    fn lock_name(&self, lock: &usize) -> LockName {
        name(*lock)
    }

    fn open(&mut self, lock: &usize) -> usize {
        self.s.open(*lock);
        *lock
    }

    fn open_name(&mut self, name: &LockName, _in_command: bool) -> usize {
        let lock = lock_index(name);
        self.s.open(lock);
        lock
    }

    /// Opening expired a key past its time: now is never past a key's.
    fn key_now(&self, _: &usize) -> u64 {
        self.now()
    }

    fn expires_at(&self, lock: &usize) -> Option<u64> {
        self.s.keys[*lock].expiry()
    }

    fn stored_lease(&self, lock: &usize) -> Option<u64> {
        match self.s.keys[*lock] {
            Slot::Lock { lease, .. } => Some(lease),
            Slot::Listed(ref holds) => holds.latest_lease(),
            _ => None,
        }
    }

    /// As `LockKey::read`: an exclusive hold kept as one slot is shown as
    /// its numbers (and whether the asker owns it), listed holds as a copy.
    fn read(&mut self, lock: &mut usize, how: Read<'_>) -> Result<Stored, LockError> {
        match (&self.s.keys[*lock], how) {
            (Slot::Foreign { .. }, _) => Err(LockError::WrongType),
            (Slot::Empty, Read::Listed) => Ok(Stored::Listed(Holds::free())),
            (Slot::Empty, _) => Ok(Stored::Free),
            (Slot::Listed(holds), _) => Ok(Stored::Listed(holds.clone())),
            (
                &Slot::Lock {
                    owner,
                    count,
                    fence,
                    lease,
                },
                how,
            ) => {
                let hold = Hold {
                    count,
                    fence,
                    expires_at: lock::lease_end(lease, Some(lease)),
                };
                let owner = OWNERS[owner as usize];
                Ok(match how {
                    Read::Mine(asker) => Stored::One {
                        hold,
                        mine: asker == owner,
                    },
                    Read::AsStored => Stored::One { hold, mine: false },
                    Read::Listed => Stored::Listed(Holds::from_parts(
                        Mode::Exclusive,
                        vec![Holder {
                            owner: owner.to_vec(),
                            hold,
                            since: 0,
                            permits: 1,
                        }],
                    )),
                })
            }
        }
    }

    fn write(&mut self, lock: &mut usize, holds: Write<'_>, event: Event) {
        let (owner, hold) = match holds {
            Write::One { owner, hold, .. } => (owner.to_vec(), hold),
            Write::Listed(mut holds) => {
                let changes = holds.take_changes();
                if changes.is_empty() {
                    return;
                }
                if holds.is_empty() {
                    return self.remove(lock, orchestrate::removal(event));
                }
                // A hold its owner was answered for by a command of its own.
                for owner in &changes.owners {
                    if let Some(h) = holds.get(owner) {
                        self.s.claimed(*lock, h.hold.fence);
                    }
                }
                match (holds.mode(), holds.only()) {
                    (Mode::Exclusive, Some(one)) => (one.owner.clone(), one.hold),
                    _ => {
                        self.s.keys[*lock] = Slot::Listed(holds);
                        return;
                    }
                }
            }
        };
        // The owner was answered for this hold: a revoke queued for it may
        // rightly leave it alone (`lock::revocable`).
        self.s.claimed(*lock, hold.fence);
        self.s.keys[*lock] = Slot::Lock {
            owner: owner_index(&owner) as u8,
            count: hold.count,
            fence: hold.fence,
            lease: hold.expires_at,
        };
    }

    /// Removed while serving: the notification is not heard.
    fn remove(&mut self, lock: &mut usize, _: Removal) {
        self.s.remove(*lock);
    }

    /// The model changes no TTL behind the module's back (see the README):
    /// no TTL is ever put back.
    fn restore_expiry(&mut self, _: &mut usize, _: u64) {}

    fn issue_fence(&mut self, _now: u64) -> u64 {
        self.s.issue_fence()
    }

    fn raise_fences(&mut self, fence: u64) {
        self.s.last_fence = self.s.last_fence.max(fence);
    }

    /// A bound hold stays bound at its new fence (`ffi::ephemeral`).
    fn refenced(&mut self, lock: &usize, owner: &[u8], from: u64, to: u64) {
        let by_owner: Vec<bool> = (self.s.bound.iter())
            .map(|b| OWNERS[self.s.token_on(b.client as usize, b.conn) as usize] == owner)
            .collect();
        for (b, by_owner) in self.s.bound.iter_mut().zip(by_owner) {
            if by_owner && b.lock as usize == *lock && b.fence == from {
                b.fence = to;
            }
        }
        self.s.bound.sort();
    }

    fn is_writer(&self) -> bool {
        true
    }

    fn writes_paused(&mut self) -> bool {
        if self.s.paused {
            self.s.seen.deferred = true;
        }
        self.s.paused
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
        let Timer { name, at, delay_ms } = timer;
        debug_assert_eq!(at, self.now() + delay_ms);
        self.s.arm(Armed::Lease {
            lock: lock_index(&name) as u8,
            at,
        });
    }

    fn arm_retry(&mut self, delay_ms: u64) {
        let at = self.s.now + delay_ms;
        self.s.arm(Armed::Retry { at });
    }

    fn arm_pump(&mut self, _from_command: bool) {
        self.s.pumps += 1;
    }

    fn can_block(&self) -> bool {
        true
    }

    fn block(&mut self, name: &LockName, timeout: u64) -> Option<(u64, Handle)> {
        let (client, lock) = (self.caller, lock_index(name));
        let c = &mut self.s.clients[client];
        c.waits += 1;
        let handle = Handle {
            client: client as u8,
            conn: c.conn,
            wait: c.waits,
            ephemeral: self.ephemeral,
        };
        c.blocked = Some((lock as u8, c.waits));
        self.s.line[lock].push(client as u8);
        if timeout > 0 {
            let at = self.s.now + timeout;
            self.s.arm(Armed::Deadline {
                client: client as u8,
                conn: handle.conn,
                at,
            });
        }
        Some((ServerModel::id(client, handle.conn), handle))
    }

    fn reply_granted(&mut self, _id: u64, handle: Handle, name: &LockName, fence: u64, until: u64) {
        let (lock, client) = (lock_index(name), handle.client);
        // The model's own line: the grant must go to its head, and to a
        // client still in it.
        match self.s.line[lock].first() {
            Some(&head) if head == client => {}
            _ if !self.s.line[lock].contains(&client) => self.s.broken.left = true,
            _ => self.s.broken.order = true,
        }
        self.s.seen.handoff = true;
        if self.s.seen.deferred {
            self.s.seen.handoff_after_pause = true;
        }
        let lock = lock as u8;
        let reply = Reply::Granted { lock, fence, until };
        self.s.answer(handle, Some(reply));
    }

    fn began(&mut self, _id: u64, handle: &Handle, name: &LockName, _owner: &[u8], fence: u64) {
        if handle.ephemeral {
            let (client, conn) = (handle.client, handle.conn);
            self.s.bind(client, conn, lock_index(name) as u8, fence);
        }
    }

    /// Only a shared hold makes a queued request refused; this model's
    /// clients ask for exclusive holds alone, so a refusal is a flaw.
    fn reply_granted_all(&mut self, id: u64, handle: Handle, names: &[LockName], holds: &[Hold]) {
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

    fn reply_refused(&mut self, _id: u64, handle: Handle, _error: LockError) {
        self.s.broken.order = true;
        self.s.answer(handle, Some(Reply::Nil));
    }

    fn reply_nil(&mut self, _id: u64, handle: Handle, why: Nil) {
        match why {
            Nil::Refused => self.s.answer(handle, Some(Reply::Nil)),
            Nil::TimedOut => {
                self.s.seen.timed_out = true;
                self.s.answer(handle, Some(Reply::Nil));
            }
            Nil::Left => self.s.answer(handle, None),
        }
    }

    /// One node: a lock never moves.
    fn moved_to(&mut self, _: &LockName) -> Option<String> {
        None
    }

    fn redirect(&mut self, _: &LockName, _: &str) {}
}

impl State {
    /// The owner token client `client` uses now: its index in [`OWNERS`].
    fn token(&self, client: usize) -> u8 {
        self.token_on(client, self.clients[client].conn)
    }

    /// The owner token client `client` used on connection `conn`.
    fn token_on(&self, client: usize, conn: u8) -> u8 {
        let renewed = !self.same_owner && conn > 0;
        (2 * client + usize::from(renewed)) as u8
    }

    fn owner(&self, client: usize) -> &'static [u8] {
        OWNERS[self.token(client) as usize]
    }

    /// `owner`'s live hold's fence in `lock`, in either storage.
    fn live_fence(&self, lock: usize, owner: &[u8]) -> Option<u64> {
        match &self.keys[lock] {
            &Slot::Lock {
                owner: o,
                fence,
                lease,
                ..
            } if OWNERS[o as usize] == owner && !lock::ended(lease, self.now) => Some(fence),
            Slot::Listed(holds) => holds.of(owner, self.now).map(|h| h.hold.fence),
            _ => None,
        }
    }

    /// Opens a key: Redis deletes it first if it has expired (now past its
    /// expiry) and tells the module (`expired`).
    fn open(&mut self, lock: usize) {
        if self.keys[lock].expiry().is_some_and(|at| at < self.now) {
            self.remove(lock);
            self.key_left(lock);
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
        match &self.keys[lock] {
            &Slot::Lock { fence, .. } => self.forced.push((lock as u8, fence)),
            Slot::Listed(holds) => {
                let fences: Vec<u64> = holds.holders().map(|h| h.hold.fence).collect();
                self.forced
                    .extend(fences.into_iter().map(|f| (lock as u8, f)));
            }
            _ => {}
        }
        self.forced.sort();
        self.remove(lock);
    }

    /// A keyspace notification of a key leaving (`events::keyspace_event`).
    fn key_left(&mut self, lock: usize) {
        if self.engine.anyone_waiting() {
            orchestrate::freed(&mut Server::on(self), name(lock), true);
        }
    }

    fn arm(&mut self, timer: Armed) {
        self.timers.push(timer);
        self.timers.sort();
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

    /// A hold this client believes in: set, or dropped (NOTOWNER, released).
    fn believe(&mut self, client: usize, lock: usize, hold: Option<(u64, u64)>) {
        self.clients[client].holds[lock] = hold;
    }

    /// The owner was answered for this hold by a command of its own: a
    /// revoke queued for it may rightly leave it alone (`lock::revocable`).
    fn claimed(&mut self, lock: usize, fence: u64) {
        self.revoked
            .retain(|&(l, f)| (l as usize, f) != (lock, fence));
    }

    /// `LOCK.ACQUIRE`: the module's own sequencing, then what the client
    /// learns from the reply. A fresh hold asked `EPHEMERAL` is bound to
    /// the caller's connection (`commands::acquire`: count 1).
    fn acquire(&mut self, client: usize, lock: usize, ttl: u64, wait: Option<u64>, eph: bool) {
        let owner = self.owner(client);
        let mut server = Server::command(self, client);
        server.ephemeral = eph;
        if let Ok(Acquired::Held(hold)) =
            orchestrate::acquire(&mut server, &lock, owner, Mode::Exclusive, ttl, wait)
        {
            self.believe(client, lock, Some((hold.fence, hold.expires_at)));
            if eph && hold.count == 1 {
                let conn = self.clients[client].conn;
                self.bind(client as u8, conn, lock as u8, hold.fence);
            }
        }
    }

    fn bind(&mut self, client: u8, conn: u8, lock: u8, fence: u64) {
        self.bound.push(Bound {
            client,
            conn,
            lock,
            fence,
        });
        self.bound.sort();
    }

    /// Connection `conn` of `client` closed (`ffi::ephemeral`): each hold
    /// bound to it that is still that hold (owner and fence) ends as a
    /// release to zero, now, or after a write pause.
    fn connection_closed(&mut self, client: usize, conn: u8) {
        let (ended, kept): (Vec<Bound>, Vec<Bound>) = self
            .bound
            .iter()
            .partition(|b| b.client as usize == client && b.conn == conn);
        self.bound = kept;
        if ended.is_empty() {
            return;
        }
        if self.paused {
            self.pending_ends.extend(ended);
            self.pending_ends.sort();
            if !self.timers.contains(&Armed::Retry { at: self.now + 1 }) {
                self.arm(Armed::Retry { at: self.now + 1 });
            }
            return;
        }
        for binding in ended {
            self.end_bound(binding);
        }
    }

    /// Ends one bound hold if it is still that hold; whether it did.
    fn end_bound(&mut self, b: Bound) -> bool {
        let lock = b.lock as usize;
        let owner = OWNERS[self.token_on(b.client as usize, b.conn) as usize];
        self.open(lock);
        let held = self.live_fence(lock, owner);
        let binding = ephemeral::Binding {
            name: name(lock),
            owner: owner.to_vec(),
            fence: b.fence,
        };
        if !ephemeral::still_bound(&binding, held) {
            return false;
        }
        // The client lost its connection: whatever it believes, the hold is
        // gone (its fence guards the resource from here on).
        self.forced.push((b.lock, b.fence));
        self.forced.sort();
        let waited = self.engine.has_waiters(&name(lock));
        let ended = orchestrate::end_bound(&mut Server::on(self), &lock, owner).is_ok();
        if ended {
            self.seen.disconnect_ended = true;
            if waited && matches!(self.keys[lock], Slot::Lock { fence, .. } if fence != b.fence) {
                self.seen.disconnect_handoff = true;
            }
        }
        ended
    }

    /// The retry after a write pause: bound holds whose connection closed
    /// during it end now (or wait for the next retry).
    fn end_pending(&mut self) {
        if self.pending_ends.is_empty() {
            return;
        }
        if self.paused {
            self.arm(Armed::Retry { at: self.now + 1 });
            return;
        }
        for binding in std::mem::take(&mut self.pending_ends) {
            if self.end_bound(binding) {
                self.seen.disconnect_deferred = true;
            }
        }
    }

    /// `LOCK.REENTER`, `RENEW`, `RELEASE`: the owner-only commands. An
    /// error other than `WRONGTYPE` (the key holds another value) tells the
    /// client it no longer holds the lock.
    fn owner_command(&mut self, action: &Action) {
        let (client, lock) = match *action {
            Action::Reenter { client, lock, .. }
            | Action::Renew { client, lock, .. }
            | Action::Release { client, lock, .. } => (client as usize, lock as usize),
            _ => return,
        };
        let owner = self.owner(client);
        let mut server = Server::command(self, client);
        let belief = match *action {
            Action::Reenter { ttl, .. } => orchestrate::reenter(&mut server, &lock, owner, ttl)
                .map(|hold| ttl.map(|_| Some((hold.fence, hold.expires_at)))),
            Action::Renew { ttl, .. } => orchestrate::renew(&mut server, &lock, owner, ttl)
                .map(|hold| Some(Some((hold.fence, hold.expires_at)))),
            Action::Release { all, .. } => orchestrate::release(&mut server, &lock, owner, all)
                .map(|remaining| remaining.is_none().then_some(None)),
            _ => return,
        };
        match belief {
            Ok(Some(hold)) => self.believe(client, lock, hold),
            Ok(None) | Err(LockError::WrongType) => {}
            Err(_) => self.believe(client, lock, None),
        }
    }

    /// The disconnect callback (`host::disconnect_cb`), called for a
    /// blocked client, or one unblocked whose reply is not written yet.
    fn disconnect(&mut self, client: usize) {
        let c = &self.clients[client];
        let id = ServerModel::id(client, c.conn);
        let (blocked, reply) = (c.blocked, c.reply);
        if blocked.is_some() || reply.is_some() {
            let left = orchestrate::client_left(&mut Server::on(self), id);
            if let (Left::Revoked, Some(Reply::Granted { lock, fence, .. })) = (left, reply) {
                self.revoked.push((lock, fence));
                self.revoked.sort();
                self.seen.revoked = true;
            }
        }
        if self.clients[client].blocked.is_some() {
            // Still blocked after the engine had its say: nobody has its handle.
            self.broken.lost = true;
        }
        self.connection_closed(client, self.clients[client].conn);
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
                orchestrate::lease_check_fired(&mut Server::on(self), &name(lock as usize), at);
            }
            Armed::Retry { .. } => {
                orchestrate::retry_fired(&mut Server::on(self));
                self.end_pending();
            }
            Armed::Deadline { client, conn, .. } => {
                let id = ServerModel::id(client as usize, conn);
                let answered = orchestrate::deadline_passed(&mut Server::on(self), id);
                let c = &self.clients[client as usize];
                if !answered && c.blocked.is_some() && c.conn == conn {
                    self.broken.lost = true;
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
            wall: WallClock::default(),
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
            bound: Vec::new(),
            pending_ends: Vec::new(),
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
                let count = match &s.keys[l] {
                    &Slot::Lock { owner, count, .. } if owner == s.token(i) => count,
                    Slot::Listed(holds) => holds.get(s.owner(i)).map_or(0, |h| h.hold.count),
                    _ => 0,
                };
                let holding = c.holds[l].is_some();
                let modes: &[bool] = if b.ephemeral {
                    &[false, true]
                } else {
                    &[false]
                };
                for &ttl in &b.ttls {
                    for &ephemeral in modes {
                        if count < b.max_count {
                            actions.push(Action::Acquire {
                                client,
                                lock,
                                ttl,
                                wait: None,
                                ephemeral,
                            });
                            if !holding {
                                for &timeout in &b.timeouts {
                                    actions.push(Action::Acquire {
                                        client,
                                        lock,
                                        ttl,
                                        wait: Some(timeout),
                                        ephemeral,
                                    });
                                }
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
        // The wall clock, whatever the server is doing.
        for by in s.wall.steps(&b.clock_steps, s.now) {
            actions.push(Action::StepClock { by });
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
                ephemeral,
            } => {
                s.clients[client as usize].commands += 1;
                s.acquire(client as usize, lock as usize, ttl, wait, ephemeral);
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
                s.key_left(lock as usize);
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
                // `host::freed_db`, in the order the names come (sorted
                // here: the model must be deterministic).
                let mut names = s.engine.names_in(None);
                names.sort();
                for n in names {
                    orchestrate::freed(&mut Server::on(&mut s), n, true);
                }
            }
            Action::ActiveExpire { lock } => {
                s.remove(lock as usize);
                s.key_left(lock as usize);
            }
            Action::StepClock { by } => s.wall.step(by),
            Action::Pause => {
                s.paused = true;
                s.pauses += 1;
            }
            Action::Resume => {
                s.paused = false;
            }
            Action::Pump => {
                s.pumps -= 1;
                orchestrate::pump(&mut Server::on(&mut s));
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
                                || match &s.keys[l] {
                                    &Slot::Lock { lease, .. } => !lock::ended(lease, s.now),
                                    Slot::Listed(holds) => !holds.is_free(s.now),
                                    Slot::Foreign { .. } => true,
                                    Slot::Empty => false,
                                }
                        })
                },
            ),
            Property::always("a grant never replied is taken back", |_, s: &State| {
                !s.idle()
                    || s.paused
                    || s.revoked.iter().all(|&(l, f)| match &s.keys[l as usize] {
                        &Slot::Lock { fence, .. } => fence != f,
                        Slot::Listed(holds) => holds.holders().all(|h| h.hold.fence != f),
                        _ => true,
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
        if self.bounds.ephemeral {
            properties.push(Property::sometimes(
                "a lost connection hands its ephemeral hold to a waiter",
                |_, s: &State| s.seen.disconnect_handoff,
            ));
            properties.push(Property::sometimes(
                "a connection lost during a write pause ends its hold after it",
                |_, s: &State| s.seen.disconnect_deferred,
            ));
            properties.push(Property::always(
                "a closed connection's hold is ended once the server is idle",
                |_, s: &State| s.paused || !s.idle() || s.pending_ends.is_empty(),
            ));
        }
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
        if self.wall.offset() != 0 {
            write!(f, " (wall {})", self.wall.read(self.now))?;
        }
        if self.paused {
            write!(f, " PAUSED")?;
        }
        for (l, key) in self.keys.iter().enumerate() {
            let n = LOCK_NAMES[l];
            match *key {
                Slot::Empty => write!(f, " | {n}: free")?,
                Slot::Listed(ref holds) => {
                    write!(f, " | {n}: {:?}", holds.mode())?;
                    for h in holds.holders() {
                        let who = String::from_utf8_lossy(&h.owner);
                        let (count, fence) = (h.hold.count, Fence(h.hold.fence));
                        write!(
                            f,
                            " {who} x{count} fence {fence} until {}",
                            h.hold.expires_at
                        )?;
                    }
                }
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
        for b in &self.bound {
            write!(
                f,
                " | {} bound to c{}#{} fence {}",
                LOCK_NAMES[b.lock as usize],
                b.client,
                b.conn,
                Fence(b.fence)
            )?;
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
