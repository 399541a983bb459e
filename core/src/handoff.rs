//! The hand-off engine: which waiting client gets a lock when it frees, and
//! when to look at a lock again.
//!
//! Pure: no Redis, time passed in. The glue (`ffi::host`) feeds it what
//! happened — a client parks, a lock may have freed, a lease or a deadline
//! timer fired, a client left, writes were paused — together with what it
//! saw in the lock's key, and executes the decision: grant (write the lock,
//! reply the fence), answer a client, arm a timer, take a grant back.
//!
//! Each waiting client's handle `H` lives inside the engine until a decision
//! hands it back, once, to the one path that answers it: a handle cannot be
//! answered twice or forgotten.
//!
//! Rules kept here:
//! - First come, first served: [`Engine::serve`] grants only the head of a
//!   lock's queue, and only when the lock is free (or its lease has ended).
//! - Nothing is granted while the gate is closed — writes paused, too few
//!   replicas (where Redis would refuse a write), or the node in quarantine
//!   after a start or a promotion: a lock to serve then
//!   stays pending, and one retry timer brings it back ([`Serve::Deferred`]).
//! - A timer is never armed for "never", and no delay exceeds
//!   [`MAX_DELAY_MS`]; a lock has at most one lease check armed, the earliest.
//! - A client that left is never granted; a grant whose reply the client
//!   never got is taken back ([`Engine::gone`]).

use std::collections::BTreeSet;
use std::hash::{Hash, Hasher};

use crate::holds::Mode;
use crate::lock;
use crate::queue::{IdMap, LockName, NameMap, NameSet, WaitQueues};

/// The longest timer delay: 2^40 ms, as `ttl-ms` (a timer further away
/// would overflow the server's timer arithmetic).
pub const MAX_DELAY_MS: u64 = 1 << 40;

/// How soon a paused server is looked at again, in ms: hand-offs resume
/// within this much of the pause's end.
pub const PAUSE_RETRY_MS: u64 = 2;

/// How soon a master whose replicas are missing is looked at again, in ms:
/// the replicas gate moves at the server's cron (every 100 ms at `hz 10`)
/// or when a replica comes back, so hand-offs resume this soon after.
pub const REPLICAS_RETRY_MS: u64 = 10;

/// A waiting request as the shared rule reads it ([`Engine::requests`]):
/// client id, owner, (mode, permits), ttl.
pub type Requested = (u64, Vec<u8>, (Mode, u32), u64);

/// A parked client: who it will hold the lock as, for how long, and the
/// glue's handle to answer it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Waiter<H> {
    pub owner: Vec<u8>,
    pub ttl_ms: u64,
    /// Exclusive, or shared (with its limit).
    pub mode: Mode,
    /// The semaphore's permits it asks for (1 but with `PERMITS`).
    pub permits: u32,
    pub handle: H,
}

/// What the glue saw in a lock's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    /// No key: the lock is free.
    Free,
    /// A lock whose hold runs through `until` (unix ms; ended once
    /// [`lock::ended`], as Redis expires a key once now is past its time).
    Held { until: u64 },
    /// A value of another type (a `SET` overwrote the lock), expiring at
    /// `until` (gone once now is past it) if it has a TTL. Waiters wait
    /// for it to go, as `BLPOP` does.
    Foreign { until: Option<u64> },
}

/// A lease check to arm: look at `name` again in `delay_ms` (at `at`, the
/// first millisecond at which the hold has ended).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timer {
    pub name: LockName,
    pub at: u64,
    pub delay_ms: u64,
}

/// A lock handed to a waiting client.
#[derive(Debug)]
pub struct Grant<H> {
    /// The client's id.
    pub id: u64,
    pub waiter: Waiter<H>,
    /// The previous hold's lease has ended but its key is still there: the
    /// glue frees it (as the expiry Redis would run) before writing.
    pub end_previous: bool,
    /// The new hold's lease end: the waiter's ttl from now, at most the
    /// lease cap given to [`Engine::serve`].
    pub until: u64,
    /// Clients still wait: check again at the new lease's end.
    pub then: Option<Timer>,
}

/// Whether the module may grant now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Yes.
    Open,
    /// No, for about `retry_in_ms`: writes are paused ([`PAUSE_RETRY_MS`]),
    /// replicas are missing ([`REPLICAS_RETRY_MS`]), or the quarantine has
    /// that long to run.
    Closed { retry_in_ms: u64 },
}

/// The decision of [`Engine::serve`].
#[derive(Debug)]
pub enum Serve<H> {
    /// Nobody to serve now; look again when the timer fires, if any.
    Wait(Option<Timer>),
    /// The gate is closed: the lock stays pending. `retry_in_ms`: the glue
    /// arms the retry timer with that delay (`None`: one is armed), then
    /// calls [`Engine::retry_fired`] and serves what
    /// [`Engine::take_pending`] gives.
    Deferred { retry_in_ms: Option<u64> },
    /// Hand the lock over.
    Grant(Grant<H>),
}

/// A grant made but whose reply the client has not received yet.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct InFlight {
    pub name: LockName,
    pub owner: Vec<u8>,
    pub fence: u64,
}

/// What [`Engine::gone`] found for a client that left.
#[derive(Debug)]
pub enum Gone<H> {
    /// It was waiting: here is its handle, to answer (or release) once,
    /// and the locks to serve again where its leaving may let others in.
    Waiting(Waiter<H>, Vec<LockName>),
    /// It had been granted the lock but never got the reply: the grant is
    /// queued for the pump to take back, which the caller runs at once.
    Revoke,
    /// Nothing of it here (already answered).
    Unknown,
}

/// Work the pump does when it runs.
#[derive(Debug, Default, Clone, PartialEq, Eq, Hash)]
pub struct Pending {
    /// Grants to take back (first, so the lock can go to the next waiter).
    pub revokes: Vec<InFlight>,
    /// Locks whose TTL someone else changed: put the lease back. (Each
    /// once: [`Engine`] keeps a set beside it, so a report costs O(1).)
    pub ttl_fixes: Vec<LockName>,
    /// Locks that may have freed, in the order they were reported.
    pub serves: Vec<LockName>,
}

/// The engine's whole state. `Clone`, `Eq` and `Hash` are for the model
/// checker (`model/`), which keeps engines in its states.
#[derive(Clone, PartialEq, Eq)]
pub struct Engine<H> {
    queues: WaitQueues<Waiter<H>>,
    pending: Pending,
    /// The locks in `pending.serves`, for O(1) "already pending?".
    pending_set: NameSet,
    /// The locks in `pending.ttl_fixes`, likewise.
    fixes_set: NameSet,
    /// A pump (post-notification job or 0 ms timer) is armed.
    pump_armed: bool,
    /// The pause retry timer is armed.
    retry_armed: bool,
    /// Earliest armed lease check per lock. An entry stays until its timer
    /// fires, even when the lock's queue empties: the timer is still armed,
    /// so a client that parks behind the next holder needs no new one (a
    /// check that finds nobody waiting costs nothing).
    lease_checks: NameMap<u64>,
    in_flight: IdMap<InFlight>,
    /// Grants of several locks at once whose reply is not out yet, one
    /// entry per lock: all are taken back if the client never hears.
    in_flight_several: IdMap<Vec<InFlight>>,
    /// Per lock, the mode of the shared requests waiting on it and how many
    /// wait (a lock's shared requests share one limit): a new shared
    /// request is checked against it without walking the queue. Follows
    /// from `queues`, so it takes no part in hashing.
    shared_waiting: NameMap<(Mode, usize)>,
}

impl<H> Default for Engine<H> {
    fn default() -> Self {
        Engine {
            queues: WaitQueues::default(),
            pending: Pending::default(),
            pending_set: NameSet::default(),
            fixes_set: NameSet::default(),
            pump_armed: false,
            retry_armed: false,
            lease_checks: NameMap::default(),
            in_flight: IdMap::default(),
            in_flight_several: IdMap::default(),
            shared_waiting: NameMap::default(),
        }
    }
}

/// Hashes every field, maps and sets in sorted order (`HashMap` has none).
impl<H: Hash> Hash for Engine<H> {
    fn hash<S: Hasher>(&self, state: &mut S) {
        fn sorted<T: Ord>(items: impl Iterator<Item = T>) -> Vec<T> {
            let mut items: Vec<T> = items.collect();
            items.sort();
            items
        }
        self.queues.hash(state);
        self.pending.hash(state);
        sorted(self.pending_set.iter()).hash(state);
        sorted(self.fixes_set.iter()).hash(state);
        self.pump_armed.hash(state);
        self.retry_armed.hash(state);
        sorted(self.lease_checks.iter()).hash(state);
        let in_flight = sorted(self.in_flight.keys());
        for id in in_flight {
            (id, &self.in_flight[id]).hash(state);
        }
        for id in sorted(self.in_flight_several.keys()) {
            (id, &self.in_flight_several[id]).hash(state);
        }
    }
}

impl<H> Engine<H> {
    // --- questions -------------------------------------------------------

    /// Whether any client waits anywhere (the fast path of every event).
    pub fn anyone_waiting(&self) -> bool {
        self.queues.total() > 0
    }

    /// How many clients wait on `name`.
    pub fn waiters(&self, name: &LockName) -> usize {
        self.queues.len(name)
    }

    /// Whether clients wait on `name`.
    pub fn has_waiters(&self, name: &LockName) -> bool {
        self.queues.has_waiters(name)
    }

    /// Clients waiting on all locks.
    pub fn total_waiting(&self) -> usize {
        self.queues.total()
    }

    /// Every lock with waiters in database `db` (`None`: all databases).
    pub fn names_in(&self, db: Option<i32>) -> Vec<LockName> {
        self.queues.names_in(db)
    }

    /// Whether a shared request is at the head of `name`'s queue: the queue
    /// is then served by the shared rule ([`crate::shared_queue::serve`]).
    pub fn head_is_shared(&self, name: &LockName) -> bool {
        self.queues
            .iter(name)
            .next()
            .is_some_and(|(_, w)| w.mode != Mode::Exclusive)
    }

    /// Whether a shared request waits on `name`.
    pub fn any_shared_waiting(&self, name: &LockName) -> bool {
        self.shared_waiting.contains_key(name)
    }

    /// The mode of the shared requests waiting on `name`, if any. O(1).
    pub fn waiting_shared_mode(&self, name: &LockName) -> Option<Mode> {
        self.shared_waiting.get(name).map(|&(mode, _)| mode)
    }

    /// Up to `take` of the requests waiting on `name`, from the `skip`th in
    /// line on, as the shared rule reads them: (id, owner, mode, ttl capped
    /// at `lease_cap`). The rule reads only the prefix it grants, so the
    /// caller asks for more only while every one it was given was granted.
    pub fn requests(
        &self,
        name: &LockName,
        lease_cap: Option<u64>,
        skip: usize,
        take: usize,
    ) -> Vec<Requested> {
        self.queues
            .iter(name)
            .take_while(|&(id, _)| !self.queues.waits_on_several(id))
            .skip(skip)
            .take(take)
            .map(|(id, w)| {
                let ttl = lease_cap.map_or(w.ttl_ms, |cap| w.ttl_ms.min(cap));
                (id, w.owner.clone(), (w.mode, w.permits), ttl)
            })
            .collect()
    }

    /// The clients waiting on `name`, first in line first, with what each
    /// asked for. One pass over the queue (whose tombstones never outnumber
    /// its waiters by more than twice plus a few): O(waiters).
    pub fn queue<'a>(&'a self, name: &LockName) -> impl Iterator<Item = (u64, &'a Waiter<H>)> + 'a {
        self.queues.iter(name)
    }

    /// Whether client `id` was granted a lock whose reply it has not had.
    pub fn is_in_flight(&self, id: u64) -> bool {
        self.in_flight.contains_key(&id) || self.in_flight_several.contains_key(&id)
    }

    /// Whether grants wait to be taken back.
    pub fn has_revokes(&self) -> bool {
        !self.pending.revokes.is_empty()
    }

    /// Whether any grant awaits its reply (the fast path of the command filter).
    pub fn any_in_flight(&self) -> bool {
        !self.in_flight.is_empty() || !self.in_flight_several.is_empty()
    }

    // --- inputs ----------------------------------------------------------

    /// Client `id` parks on `name`, behind everyone already there. The
    /// current holder's lease ends at `holder_until`: a check is armed then.
    /// `Err` gives the waiter back if the client already waits somewhere
    /// (it cannot: a blocked client sends nothing; the glue answers it nil).
    pub fn park(
        &mut self,
        name: LockName,
        id: u64,
        waiter: Waiter<H>,
        holder_until: Option<u64>,
        now: u64,
    ) -> Result<Option<Timer>, Waiter<H>> {
        // `push` refuses only a client already waiting: check first, so the
        // waiter can be handed back.
        if self.queues.contains(id) {
            return Err(waiter);
        }
        if let Mode::Shared { .. } = waiter.mode {
            let entry = self
                .shared_waiting
                .entry(name.clone())
                .or_insert((waiter.mode, 0));
            entry.1 += 1;
        }
        self.queues.push(name.clone(), id, waiter);
        Ok(holder_until.and_then(|at| self.arm_lease_check(name, at, now)))
    }

    /// Client `id` parks on every lock of `names` (two or more, distinct) as
    /// one request, behind everyone already waiting on any of them: one
    /// place in one arrival order across their queues. `holder_until[i]`:
    /// when the live hold of `names[i]` ends, if any (a check is armed
    /// then). `Err` as for [`park`](Engine::park).
    pub fn park_all(
        &mut self,
        names: Vec<LockName>,
        id: u64,
        waiter: Waiter<H>,
        holder_until: &[Option<u64>],
        now: u64,
    ) -> Result<Vec<Timer>, Waiter<H>> {
        if self.queues.contains(id) || names.is_empty() {
            return Err(waiter);
        }
        let mut timers = Vec::new();
        for (i, name) in names.iter().enumerate() {
            if let Mode::Shared { .. } = waiter.mode {
                let entry = self
                    .shared_waiting
                    .entry(name.clone())
                    .or_insert((waiter.mode, 0));
                entry.1 += 1;
            }
            let until = holder_until.get(i).copied().flatten();
            if let Some(timer) = until.and_then(|at| self.arm_lease_check(name.clone(), at, now)) {
                timers.push(timer);
            }
        }
        let mut names = names;
        let first = names.remove(0);
        self.queues.push_all(first, names, id, waiter);
        Ok(timers)
    }

    /// The client first in line on `name` if it waits on several locks:
    /// the queue's rules for one lock stop at it, and it is served on all
    /// its locks at once.
    pub fn head_waits_on_several(&self, name: &LockName) -> Option<u64> {
        self.queues
            .head(name)
            .filter(|&id| self.queues.waits_on_several(id))
    }

    /// Whether client `id` is first in line on `name`.
    pub fn is_first(&self, name: &LockName, id: u64) -> bool {
        self.queues.head(name) == Some(id)
    }

    /// Every lock client `id` waits on, in the order it named them.
    pub fn names_of(&self, id: u64) -> Option<Vec<LockName>> {
        self.queues.names_of(id)
    }

    /// The request client `id` waits with: (owner, mode, ttl capped at
    /// `lease_cap`).
    pub fn request_of(
        &self,
        id: u64,
        lease_cap: Option<u64>,
    ) -> Option<(Vec<u8>, (Mode, u32), u64)> {
        self.queues.get(id).map(|w| {
            let ttl = lease_cap.map_or(w.ttl_ms, |cap| w.ttl_ms.min(cap));
            (w.owner.clone(), (w.mode, w.permits), ttl)
        })
    }

    /// `name` may have freed (a release, a deletion, a flush…): serve it at
    /// the next pump. `true`: the glue must arm the pump (it was not armed).
    pub fn freed(&mut self, name: LockName) -> bool {
        if !self.queues.has_waiters(&name) || !self.pending_set.insert(name.clone()) {
            return false;
        }
        self.pending.serves.push(name);
        self.arm_pump()
    }

    /// Something else changed the TTL of the lock `name`: fix it at the next
    /// pump. `true`: arm the pump.
    pub fn ttl_changed(&mut self, name: LockName) -> bool {
        if !self.fixes_set.insert(name.clone()) {
            return false;
        }
        self.pending.ttl_fixes.push(name);
        self.arm_pump()
    }

    /// The pump runs: everything pending, in order.
    pub fn take_pending(&mut self) -> Pending {
        self.pump_armed = false;
        self.pending_set.clear();
        self.fixes_set.clear();
        std::mem::take(&mut self.pending)
    }

    /// The pump could not write (the gate is closed for `retry_in_ms`): keep
    /// this work for the retry. `Some(delay)`: arm the retry timer.
    pub fn defer(&mut self, work: Pending, retry_in_ms: u64) -> Option<u64> {
        for name in &work.serves {
            self.pending_set.insert(name.clone());
        }
        for name in &work.ttl_fixes {
            self.fixes_set.insert(name.clone());
        }
        let mut work = work;
        work.revokes.append(&mut self.pending.revokes);
        work.ttl_fixes.append(&mut self.pending.ttl_fixes);
        work.serves.append(&mut self.pending.serves);
        self.pending = work;
        self.arm_retry(retry_in_ms)
    }

    /// The pause retry timer fired: the glue now pumps.
    pub fn retry_fired(&mut self) {
        self.retry_armed = false;
    }

    /// The hold on `name` now runs through `until` (a renewal, a reentry, a
    /// TTL put back or shortened): if clients wait, check it once it ends.
    pub fn lease_moved(&mut self, name: &LockName, until: u64, now: u64) -> Option<Timer> {
        if !self.queues.has_waiters(name) {
            return None;
        }
        self.arm_lease_check(name.clone(), until, now)
    }

    /// A shared hold of `name` runs through `until`, before the lock's
    /// last lease (the key's TTL): check it then whether or not clients
    /// wait, so that its share ends on time.
    pub fn hold_ends(&mut self, name: &LockName, until: u64, now: u64) -> Option<Timer> {
        self.arm_lease_check(name.clone(), until, now)
    }

    /// The lease check armed for `name` at `at` fired.
    pub fn lease_check_fired(&mut self, name: &LockName, at: u64) {
        if self.lease_checks.get(name) == Some(&at) {
            self.lease_checks.remove(name);
        }
    }

    /// Looks at `name`, whose key the glue found in state `key` at `now`,
    /// and decides. `gate`: whether the module may grant now. `lease_cap`:
    /// the longest lease a grant may give now (`lock.max-ttl`; `None`: no
    /// cap), so a client that waited with a longer ttl gets at most this and
    /// no lease outlives a cap lowered while it waited.
    pub fn serve(
        &mut self,
        name: &LockName,
        key: Key,
        now: u64,
        gate: Gate,
        lease_cap: Option<u64>,
    ) -> Serve<H> {
        if !self.queues.has_waiters(name) {
            return Serve::Wait(None);
        }
        if let Gate::Closed { retry_in_ms } = gate {
            if self.pending_set.insert(name.clone()) {
                self.pending.serves.push(name.clone());
            }
            return Serve::Deferred {
                retry_in_ms: self.arm_retry(retry_in_ms),
            };
        }
        let end_previous = match key {
            Key::Held { until } if !lock::ended(until, now) => {
                return Serve::Wait(self.arm_lease_check(name.clone(), until, now));
            }
            Key::Foreign { until } => {
                let timer = until.and_then(|at| self.arm_lease_check(name.clone(), at, now));
                return Serve::Wait(timer);
            }
            Key::Held { .. } => true,
            Key::Free => false,
        };
        let Some((id, waiter)) = self.queues.pop(name) else {
            return Serve::Wait(None);
        };
        self.no_longer_waits(name, waiter.mode);
        let ttl_ms = lease_cap.map_or(waiter.ttl_ms, |cap| waiter.ttl_ms.min(cap));
        let until = now.saturating_add(ttl_ms);
        let then = if self.queues.has_waiters(name) {
            self.arm_lease_check(name.clone(), until, now)
        } else {
            None
        };
        Serve::Grant(Grant {
            id,
            waiter,
            end_previous,
            until,
            then,
        })
    }

    /// The glue wrote a grant and unblocked the client; its reply is not
    /// out yet.
    pub fn granted(&mut self, id: u64, grant: InFlight) {
        self.in_flight.insert(id, grant);
    }

    /// The glue wrote a grant of several locks (one [`InFlight`] each) and
    /// unblocked the client; its reply is not out yet.
    pub fn granted_several(&mut self, id: u64, grants: Vec<InFlight>) {
        self.in_flight_several.insert(id, grants);
    }

    /// `owner` just succeeded with a command of its own on `name` (a reentry,
    /// a renewal, a release, a fence): it is alive and using the lock, so no
    /// grant of `name` to that owner is taken back any more, even if the
    /// client it was granted to never hears of it.
    pub fn owner_active(&mut self, name: &LockName, owner: &[u8]) {
        if !self.any_in_flight() && self.pending.revokes.is_empty() {
            return;
        }
        let other = |grant: &InFlight| grant.name != *name || grant.owner != owner;
        self.in_flight.retain(|_, grant| other(grant));
        // A grant of several locks is in use once its owner uses one of
        // them: none of them is taken back.
        self.in_flight_several
            .retain(|_, grants| grants.iter().all(&other));
        self.pending.revokes.retain(|grant| other(grant));
    }

    /// Client `id`'s reply was written: its grant stands.
    pub fn replied(&mut self, id: u64) {
        self.in_flight.remove(&id);
        self.in_flight_several.remove(&id);
    }

    /// Client `id` stops waiting at its deadline or by `CLIENT UNBLOCK`:
    /// its waiter, if it still waits, and the locks to serve again where it
    /// was first in line with others behind it (a reader that waited only
    /// behind a writer who leaves may join the readers holding the lock).
    /// A request for several locks leaves every queue it is in.
    pub fn leave(&mut self, id: u64) -> Option<(Waiter<H>, Vec<LockName>)> {
        let (name, more, waiter, heads) = self.queues.remove_noting_heads(id)?;
        for one in std::iter::once(&name).chain(&more) {
            self.no_longer_waits(one, waiter.mode);
        }
        Some((waiter, heads))
    }

    /// Client `id`, just granted, leaves every queue it waits in: its
    /// waiter, to answer.
    pub fn take(&mut self, id: u64) -> Option<Waiter<H>> {
        self.leave(id).map(|(waiter, _)| waiter)
    }

    /// Client `id` disconnected (or was unblocked with an error): it leaves
    /// the queue, or the grant it never heard of is taken back.
    pub fn gone(&mut self, id: u64) -> Gone<H> {
        if let Some((waiter, serve)) = self.leave(id) {
            return Gone::Waiting(waiter, serve);
        }
        if let Some(grants) = self.in_flight_several.remove(&id) {
            self.pending.revokes.extend(grants);
            return Gone::Revoke;
        }
        match self.in_flight.remove(&id) {
            Some(grant) => {
                self.pending.revokes.push(grant);
                Gone::Revoke
            }
            None => Gone::Unknown,
        }
    }

    /// `name` left this node (cluster slot migration): every waiter, to be
    /// answered with a redirection: (client id, waiter), in order.
    pub fn drain(&mut self, name: &LockName) -> Vec<(u64, Waiter<H>)> {
        let mut out = Vec::new();
        while let Some(entry) = self.queues.pop(name) {
            out.push(entry);
        }
        self.shared_waiting.remove(name);
        out
    }

    /// A request of `mode` no longer waits on `name`.
    fn no_longer_waits(&mut self, name: &LockName, mode: Mode) {
        if mode == Mode::Exclusive {
            return;
        }
        if let Some(entry) = self.shared_waiting.get_mut(name) {
            entry.1 -= 1;
            if entry.1 == 0 {
                self.shared_waiting.remove(name);
            }
        }
    }

    // --- timers ----------------------------------------------------------

    /// A check of `name` once a hold running through `until` has ended
    /// (the next millisecond), unless one as early is armed.
    fn arm_lease_check(&mut self, name: LockName, until: u64, now: u64) -> Option<Timer> {
        if until == u64::MAX {
            return None; // "never": nothing to check
        }
        let at = lock::first_ended_ms(until);
        if self
            .lease_checks
            .get(&name)
            .is_some_and(|&armed| armed <= at)
        {
            return None;
        }
        self.lease_checks.insert(name.clone(), at);
        Some(Timer {
            name,
            at,
            delay_ms: at.saturating_sub(now).min(MAX_DELAY_MS),
        })
    }

    fn arm_retry(&mut self, delay_ms: u64) -> Option<u64> {
        (!std::mem::replace(&mut self.retry_armed, true)).then_some(delay_ms.min(MAX_DELAY_MS))
    }

    fn arm_pump(&mut self) -> bool {
        !std::mem::replace(&mut self.pump_armed, true)
    }
}

/// Every waiting client's `WAIT` deadline, ordered by time, behind as few
/// server timers as possible: a server timer costs several thousand
/// instructions to create and to stop (its radix tree is keyed by the
/// microsecond it fires), and a client that waits again and again would
/// create and stop one per wait. Here a deadline costs an ordered-set insert
/// and remove; a server timer is armed only when a deadline comes earlier
/// than every timer armed, and each timer that fires arms the next.
#[derive(Debug, Default, Clone)]
pub struct Deadlines {
    /// (deadline, client id) of every client with a deadline.
    by_time: BTreeSet<(u64, u64)>,
    /// When each armed server timer fires (unix ms).
    armed: BTreeSet<u64>,
}

impl Deadlines {
    /// Client `id` gives up at `at`. `Some(delay_ms)`: arm a server timer
    /// with that delay (no armed timer fires by `at`).
    pub fn add(&mut self, id: u64, at: u64, now: u64) -> Option<u64> {
        self.by_time.insert((at, id));
        self.arm_for(at, now)
    }

    /// Client `id`, whose deadline was `at`, stopped waiting otherwise. Its
    /// timer, if it armed one, stays: it finds nothing and arms the next.
    pub fn remove(&mut self, id: u64, at: u64) {
        self.by_time.remove(&(at, id));
    }

    /// The server timer armed for `fired` fired at `now`: the clients whose
    /// deadline has passed (in deadline order, now forgotten here), and the
    /// delay of the timer to arm for the next deadline, if none is armed
    /// early enough.
    pub fn fired(&mut self, fired: u64, now: u64) -> (Vec<u64>, Option<u64>) {
        self.armed.remove(&fired);
        let mut due = Vec::new();
        while let Some(&(at, id)) = self.by_time.first() {
            if at > now {
                break;
            }
            self.by_time.pop_first();
            due.push(id);
        }
        let earliest = self.by_time.first().map(|&(at, _)| at);
        let next = earliest.and_then(|at| self.arm_for(at, now));
        (due, next)
    }

    /// How many clients have a deadline.
    pub fn len(&self) -> usize {
        self.by_time.len()
    }

    /// Whether no client has a deadline.
    pub fn is_empty(&self) -> bool {
        self.by_time.is_empty()
    }

    fn arm_for(&mut self, at: u64, now: u64) -> Option<u64> {
        if self.armed.first().is_some_and(|&first| first <= at) {
            return None;
        }
        self.armed.insert(at);
        Some(at.saturating_sub(now).min(MAX_DELAY_MS))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_000_000;

    /// A handle that is not `Clone`: each must come back exactly once.
    #[derive(Debug, PartialEq, Eq)]
    struct Handle(u64);

    fn name(key: &str) -> LockName {
        LockName::new(0, key.as_bytes())
    }

    fn waiter(id: u64) -> Waiter<Handle> {
        Waiter {
            owner: format!("w{id}").into_bytes(),
            ttl_ms: 100,
            mode: Mode::Exclusive,
            permits: 1,
            handle: Handle(id),
        }
    }

    fn park(e: &mut Engine<Handle>, key: &str, id: u64) {
        assert!(e.park(name(key), id, waiter(id), None, NOW).is_ok());
    }

    fn granted(s: Serve<Handle>) -> Grant<Handle> {
        match s {
            Serve::Grant(g) => g,
            other => panic!("expected a grant, got {other:?}"),
        }
    }

    #[test]
    fn a_free_lock_goes_to_the_longest_waiting_client() {
        let mut e = Engine::default();
        for id in [7, 3, 9] {
            park(&mut e, "k", id);
        }
        let order: Vec<u64> = (0..3)
            .map(|_| granted(e.serve(&name("k"), Key::Free, NOW, Gate::Open, None)).id)
            .collect();
        assert_eq!(order, [7, 3, 9]);
        assert!(matches!(
            e.serve(&name("k"), Key::Free, NOW, Gate::Open, None),
            Serve::Wait(None)
        ));
    }

    #[test]
    fn what_the_key_holds_decides() {
        // (key seen, grant?, lease check armed at)
        let table = [
            (Key::Free, true, None),
            (Key::Held { until: NOW - 1 }, true, None), // ended: now is past it
            // Its last millisecond: Redis still has the key; checked next ms.
            (Key::Held { until: NOW }, false, Some(NOW + 1)),
            (Key::Held { until: NOW + 50 }, false, Some(NOW + 51)),
            (
                Key::Foreign {
                    until: Some(NOW + 5),
                },
                false,
                Some(NOW + 6),
            ),
            (Key::Foreign { until: None }, false, None),
            (Key::Held { until: u64::MAX }, false, None), // never: no timer
        ];
        for (key, grant, check) in table {
            let mut e = Engine::default();
            park(&mut e, "k", 1);
            match e.serve(&name("k"), key, NOW, Gate::Open, None) {
                Serve::Grant(g) => {
                    assert!(grant, "{key:?}");
                    assert_eq!(g.end_previous, matches!(key, Key::Held { .. }));
                    assert_eq!(g.until, NOW + 100);
                    assert_eq!(g.waiter.handle, Handle(1));
                }
                Serve::Wait(timer) => {
                    assert!(!grant, "{key:?}");
                    assert_eq!(timer.map(|t| t.at), check, "{key:?}");
                    assert_eq!(e.waiters(&name("k")), 1);
                }
                Serve::Deferred { .. } => panic!("the gate is open"),
            }
        }
    }

    const PAUSED: Gate = Gate::Closed {
        retry_in_ms: PAUSE_RETRY_MS,
    };

    #[test]
    fn nothing_is_granted_while_the_gate_is_closed() {
        let mut e = Engine::default();
        park(&mut e, "a", 1);
        park(&mut e, "b", 2);
        let first = e.serve(&name("a"), Key::Free, NOW, PAUSED, None);
        assert!(matches!(
            first,
            Serve::Deferred {
                retry_in_ms: Some(PAUSE_RETRY_MS)
            }
        ));
        let second = e.serve(&name("b"), Key::Free, NOW, PAUSED, None);
        assert!(matches!(second, Serve::Deferred { retry_in_ms: None }));
        // The retry fires once the pause is over: both, in order.
        e.retry_fired();
        let work = e.take_pending();
        assert_eq!(work.serves, [name("a"), name("b")]);
        assert_eq!(
            granted(e.serve(&name("a"), Key::Free, NOW, Gate::Open, None)).id,
            1
        );
        assert_eq!(
            granted(e.serve(&name("b"), Key::Free, NOW, Gate::Open, None)).id,
            2
        );
    }

    #[test]
    fn deferred_work_keeps_its_order_ahead_of_newer_work() {
        let mut e: Engine<Handle> = Engine::default();
        park(&mut e, "a", 1);
        park(&mut e, "b", 2);
        assert!(e.freed(name("a")));
        assert!(!e.ttl_changed(name("x"))); // the pump is armed already
        let work = e.take_pending();
        assert!(e.freed(name("b")));
        assert_eq!(e.defer(work, 500), Some(500)); // a quarantine with 500 ms to go
        assert_eq!(e.defer(Pending::default(), 2), None); // one retry timer at a time
        e.retry_fired();
        let work = e.take_pending();
        assert_eq!(work.serves, [name("a"), name("b")]);
        assert_eq!(work.ttl_fixes, [name("x")]);
    }

    #[test]
    fn the_pump_is_armed_once_per_batch() {
        let mut e = Engine::default();
        park(&mut e, "a", 1);
        park(&mut e, "b", 2);
        assert!(e.freed(name("a")));
        assert!(!e.freed(name("a")));
        assert!(!e.freed(name("b")));
        assert!(!e.freed(name("nobody-waits")));
        assert_eq!(e.take_pending().serves, [name("a"), name("b")]);
        assert!(e.freed(name("a")));
    }

    #[test]
    fn lease_checks_are_earliest_only_and_never_for_never() {
        let mut e = Engine::default();
        let at = |t: Option<Timer>| t.map(|t| (t.at, t.delay_ms));
        let p = |e: &mut Engine<Handle>, id, until| {
            e.park(name("k"), id, waiter(id), Some(until), NOW)
                .map(at)
                .ok()
                .flatten()
        };
        // A hold through `until` is checked at until + 1, once it has ended.
        assert_eq!(p(&mut e, 1, NOW + 50), Some((NOW + 51, 51)));
        assert_eq!(p(&mut e, 2, NOW + 80), None); // a check at +51 comes first
        assert_eq!(p(&mut e, 3, NOW + 20), Some((NOW + 21, 21)));
        e.lease_check_fired(&name("k"), NOW + 51); // a stale timer: no effect
        assert_eq!(p(&mut e, 4, NOW + 30), None);
        e.lease_check_fired(&name("k"), NOW + 21);
        assert_eq!(p(&mut e, 5, NOW + 30), Some((NOW + 31, 31)));
        assert_eq!(p(&mut e, 6, u64::MAX), None);
    }

    #[test]
    fn a_moved_lease_is_checked_only_if_someone_waits() {
        let mut e = Engine::default();
        assert_eq!(e.lease_moved(&name("k"), NOW + 10, NOW), None);
        park(&mut e, "k", 1);
        let timer = e.lease_moved(&name("k"), NOW + 10, NOW);
        assert_eq!(timer.map(|t| t.at), Some(NOW + 11));
        assert_eq!(e.waiters(&name("k")), 1); // never a grant
    }

    #[test]
    fn a_waiter_granted_after_the_cap_was_lowered_gets_at_most_the_cap() {
        // (cap in force at the grant, the waiter's ttl, the lease it gets)
        let table = [
            (None, 100, 100),
            (Some(1_000), 100, 100),
            (Some(40), 100, 40),
        ];
        for (cap, ttl_ms, want) in table {
            let mut e = Engine::default();
            let w = Waiter {
                ttl_ms,
                ..waiter(1)
            };
            assert!(e.park(name("k"), 1, w, None, NOW).is_ok());
            let g = granted(e.serve(&name("k"), Key::Free, NOW, Gate::Open, cap));
            assert_eq!(g.until, NOW + want, "cap {cap:?}, ttl {ttl_ms}");
        }
    }

    #[test]
    fn many_ttl_changes_are_each_pending_once() {
        let mut e: Engine<Handle> = Engine::default();
        assert!(e.ttl_changed(name("a")), "the first report arms the pump");
        assert!(!e.ttl_changed(name("b")));
        assert!(!e.ttl_changed(name("a")), "already pending");
        let work = e.take_pending();
        assert_eq!(work.ttl_fixes, [name("a"), name("b")]);
        assert!(e.ttl_changed(name("a")), "pending again after the pump ran");
        // Deferred work is still known as pending.
        let work = e.take_pending();
        assert_eq!(e.defer(work, 2), Some(2));
        assert!(!e.ttl_changed(name("a")));
    }

    #[test]
    fn a_check_still_armed_is_not_armed_again_when_the_queue_refills() {
        let mut e = Engine::default();
        // Bob waits behind a hold that runs through NOW + 50.
        let armed = e.park(name("k"), 1, waiter(1), Some(NOW + 50), NOW);
        assert_eq!(armed.ok().flatten().map(|t| t.at), Some(NOW + 51));
        // Released early: bob is handed the lock; the queue is empty, the
        // timer still armed.
        let g = granted(e.serve(&name("k"), Key::Free, NOW, Gate::Open, None));
        assert_eq!((g.until, g.then), (NOW + 100, None));
        // Someone waits behind bob: the armed check comes first and will
        // look at the lock, so no second timer.
        let again = e.park(name("k"), 2, waiter(2), Some(g.until), NOW);
        assert_eq!(again.ok().flatten(), None);
        // When it fires, bob still holds it: the check moves to his lease end.
        e.lease_check_fired(&name("k"), NOW + 51);
        let held = Key::Held { until: g.until };
        match e.serve(&name("k"), held, NOW + 51, Gate::Open, None) {
            Serve::Wait(timer) => assert_eq!(timer.map(|t| t.at), Some(g.until + 1)),
            other => panic!("expected a wait, got {other:?}"),
        }
    }

    #[test]
    fn delays_are_clamped() {
        let mut e = Engine::default();
        let timer = e
            .park(name("k"), 1, waiter(1), Some(u64::MAX - 1), NOW)
            .ok()
            .flatten();
        assert_eq!(timer.map(|t| t.delay_ms), Some(MAX_DELAY_MS));
    }

    #[test]
    fn a_grant_with_more_waiters_checks_at_the_new_lease_end() {
        let mut e = Engine::default();
        park(&mut e, "k", 1);
        park(&mut e, "k", 2);
        let g = granted(e.serve(&name("k"), Key::Free, NOW, Gate::Open, None));
        assert_eq!(g.then.map(|t| t.at), Some(NOW + 101));
        let g = granted(e.serve(&name("k"), Key::Free, NOW, Gate::Open, None));
        assert_eq!(g.then, None);
    }

    #[test]
    fn the_queue_lists_waiters_in_line_with_what_they_asked_for() {
        let mut e = Engine::default();
        for id in [4, 2, 8] {
            park(&mut e, "k", id);
        }
        let reader = Waiter {
            mode: Mode::READ,
            ..waiter(6)
        };
        assert!(e.park(name("k"), 6, reader, None, NOW).is_ok());
        park(&mut e, "other", 5);
        let line = |e: &Engine<Handle>| -> Vec<(u64, Vec<u8>, Mode)> {
            e.queue(&name("k"))
                .map(|(id, w)| (id, w.owner.clone(), w.mode))
                .collect()
        };
        assert_eq!(
            line(&e),
            [
                (4, b"w4".to_vec(), Mode::Exclusive),
                (2, b"w2".to_vec(), Mode::Exclusive),
                (8, b"w8".to_vec(), Mode::Exclusive),
                (6, b"w6".to_vec(), Mode::READ),
            ]
        );
        // One leaves from the middle, the head is served: both disappear.
        e.leave(2);
        granted(e.serve(&name("k"), Key::Free, NOW, Gate::Open, None));
        let ids: Vec<u64> = line(&e).into_iter().map(|w| w.0).collect();
        assert_eq!(ids, [8, 6]);
        assert_eq!(e.queue(&name("free")).count(), 0);
    }

    #[test]
    fn only_the_head_leaving_with_others_behind_asks_to_serve_again() {
        let mut e = Engine::default();
        for id in [1, 2, 3, 4] {
            park(&mut e, "k", id);
        }
        let again = |left: Option<(Waiter<Handle>, Vec<LockName>)>| {
            left.and_then(|(_, n)| n.first().cloned())
        };
        // From the middle: the head still blocks everyone behind it.
        assert_eq!(again(e.leave(3)), None);
        // The head, with others behind: they may be let in now.
        assert_eq!(again(e.leave(1)), Some(name("k")));
        // The new head (past 3's tombstone there is still 4).
        assert_eq!(again(e.leave(2)), Some(name("k")));
        // The last one: nobody behind it.
        assert_eq!(again(e.leave(4)), None);
        assert!(!e.has_waiters(&name("k")));
    }

    #[test]
    fn the_shared_mode_waiting_is_known_without_walking_the_queue() {
        let mut e = Engine::default();
        let sem = Mode::Shared { limit: Some(3) };
        let shared = |id| Waiter {
            mode: sem,
            ..waiter(id)
        };
        park(&mut e, "k", 1);
        assert_eq!(e.waiting_shared_mode(&name("k")), None);
        assert!(e.park(name("k"), 2, shared(2), None, NOW).is_ok());
        assert!(e.park(name("k"), 3, shared(3), None, NOW).is_ok());
        assert_eq!(e.waiting_shared_mode(&name("k")), Some(sem));
        assert!(e.leave(2).is_some());
        assert!(e.any_shared_waiting(&name("k")));
        assert!(e.take(3).is_some());
        assert!(!e.any_shared_waiting(&name("k")));
        assert!(e.park(name("k"), 4, shared(4), None, NOW).is_ok());
        assert_eq!(e.drain(&name("k")).len(), 2);
        assert_eq!(e.waiting_shared_mode(&name("k")), None);
    }

    #[test]
    fn requests_are_read_a_slice_at_a_time() {
        let mut e = Engine::default();
        for id in 1..=5 {
            park(&mut e, "k", id);
        }
        let ids = |e: &Engine<Handle>, skip, take| -> Vec<u64> {
            e.requests(&name("k"), None, skip, take)
                .into_iter()
                .map(|r| r.0)
                .collect()
        };
        assert_eq!(ids(&e, 0, 2), [1, 2]);
        assert_eq!(ids(&e, 2, 2), [3, 4]);
        assert_eq!(ids(&e, 4, 2), [5]);
    }

    #[test]
    fn a_client_that_left_is_never_granted_and_answered_once() {
        let mut e = Engine::default();
        park(&mut e, "k", 1);
        park(&mut e, "k", 2);
        assert_eq!(e.leave(1).map(|(w, _)| w.handle), Some(Handle(1)));
        assert!(e.leave(1).is_none());
        assert!(matches!(e.gone(1), Gone::Unknown));
        assert_eq!(
            granted(e.serve(&name("k"), Key::Free, NOW, Gate::Open, None)).id,
            2
        );
    }

    #[test]
    fn a_grant_never_replied_is_taken_back_once() {
        let mut e: Engine<Handle> = Engine::default();
        park(&mut e, "k", 1);
        let g = granted(e.serve(&name("k"), Key::Free, NOW, Gate::Open, None));
        let record = InFlight {
            name: name("k"),
            owner: g.waiter.owner.clone(),
            fence: 42,
        };
        e.granted(g.id, record.clone());
        assert!(e.is_in_flight(1));
        assert!(matches!(e.gone(1), Gone::Revoke));
        assert!(matches!(e.gone(1), Gone::Unknown));
        assert_eq!(e.take_pending().revokes, [record]);
    }

    #[test]
    fn a_grant_whose_owner_acts_on_the_lock_is_not_taken_back() {
        let record = |key: &str, owner: &[u8]| InFlight {
            name: name(key),
            owner: owner.to_vec(),
            fence: 7,
        };
        // Before the client leaves: its grant is no longer in flight.
        let mut e: Engine<Handle> = Engine::default();
        e.granted(1, record("k", b"w1"));
        e.granted(2, record("other", b"w1"));
        e.owner_active(&name("k"), b"w1");
        assert!(!e.is_in_flight(1));
        assert!(e.is_in_flight(2), "another lock's grant is untouched");
        // After it left: the queued revoke is dropped.
        let mut e: Engine<Handle> = Engine::default();
        e.granted(1, record("k", b"w1"));
        assert!(matches!(e.gone(1), Gone::Revoke));
        e.owner_active(&name("k"), b"someone-else");
        e.owner_active(&name("k"), b"w1");
        assert!(e.take_pending().revokes.is_empty());
    }

    #[test]
    fn a_replied_grant_stands() {
        let mut e: Engine<Handle> = Engine::default();
        park(&mut e, "k", 1);
        let g = granted(e.serve(&name("k"), Key::Free, NOW, Gate::Open, None));
        e.granted(
            g.id,
            InFlight {
                name: name("k"),
                owner: vec![b'w'],
                fence: 1,
            },
        );
        e.replied(1);
        assert!(!e.any_in_flight());
        assert!(matches!(e.gone(1), Gone::Unknown));
        assert!(e.take_pending().revokes.is_empty());
    }

    #[test]
    fn a_client_parks_in_one_place_at_a_time() {
        let mut e = Engine::default();
        park(&mut e, "a", 1);
        let again = e.park(name("b"), 1, waiter(1), None, NOW);
        assert_eq!(again.err().map(|w| w.handle), Some(Handle(1)));
        assert_eq!(e.total_waiting(), 1);
    }

    #[test]
    fn drain_answers_every_waiter_of_a_lock_that_moved() {
        let mut e = Engine::default();
        park(&mut e, "k", 1);
        park(&mut e, "k", 2);
        park(&mut e, "other", 3);
        let ids: Vec<(u64, Handle)> = e
            .drain(&name("k"))
            .into_iter()
            .map(|(id, w)| (id, w.handle))
            .collect();
        assert_eq!(ids, [(1, Handle(1)), (2, Handle(2))]);
        assert_eq!(e.total_waiting(), 1);
    }

    #[test]
    fn deadlines_share_the_earliest_timer() {
        let mut d = Deadlines::default();
        // The first deadline arms a timer; later ones ride on it.
        assert_eq!(d.add(1, NOW + 100, NOW), Some(100));
        assert_eq!(d.add(2, NOW + 300, NOW), None);
        // An earlier one arms its own.
        assert_eq!(d.add(3, NOW + 50, NOW), Some(50));
        // A client granted before its deadline leaves the set.
        d.remove(3, NOW + 50);
        // Its timer fires, finds nobody due, and the +100 timer is still armed.
        assert_eq!(d.fired(NOW + 50, NOW + 50), (vec![], None));
        // The +100 timer: client 1 is due; the next timer is for client 2.
        assert_eq!(d.fired(NOW + 100, NOW + 100), (vec![1], Some(200)));
        assert_eq!(d.len(), 1);
    }

    #[test]
    fn a_timer_answers_every_deadline_passed_in_order() {
        let mut d = Deadlines::default();
        assert_eq!(d.add(9, NOW + 10, NOW), Some(10));
        assert_eq!(d.add(4, NOW + 10, NOW), None);
        assert_eq!(d.add(7, NOW + 5, NOW), Some(5));
        // The server was busy: both timers are late, the first answers all.
        assert_eq!(d.fired(NOW + 5, NOW + 12), (vec![7, 4, 9], None));
        assert_eq!(d.fired(NOW + 10, NOW + 12), (vec![], None));
        assert!(d.is_empty());
        // Nothing armed any more: the next deadline arms again.
        assert_eq!(d.add(1, NOW + 40, NOW + 12), Some(28));
    }

    #[test]
    fn a_client_waiting_again_and_again_arms_one_timer() {
        let mut d = Deadlines::default();
        let mut armed = 0;
        for round in 0..1_000u64 {
            let now = NOW + round;
            armed += usize::from(d.add(1, now + 30_000, now).is_some());
            d.remove(1, now + 30_000);
        }
        assert_eq!(armed, 1);
        // When it fires with nobody due, nothing is armed until someone waits.
        assert_eq!(d.fired(NOW + 30_000, NOW + 30_000), (vec![], None));
        assert_eq!(d.add(2, NOW + 40_000, NOW + 30_000), Some(10_000));
    }
}
