//! The sequencing around the core, written once: what a command does to a
//! lock and its waiters, how a freed lock is served, how a grant is handed
//! over or taken back, what the pump does, and when a lease is checked.
//!
//! [`lock`] decides one command and [`Engine`] decides who gets a freed
//! lock; the functions here put those decisions in order — open the key,
//! ask, write, announce, answer, arm the next timer — against a [`Host`]:
//! the world as the sequencing needs it. The module (`src/ffi/host.rs`)
//! implements it with the server's C API; the model checker (`model/`)
//! implements it on its own state and so checks this very code.
//!
//! What stays with the host is how, not when: blocking a client, writing
//! its reply (a server before 7.2 defers a grant's reply), replicating a
//! change, a cluster redirection, the database a timer works in.

use crate::error::LockError;
use crate::handoff::{
    self, Engine, Gate, Gone, Grant, InFlight, Key, Pending, Serve, Timer, Waiter,
};
use crate::holds::{Holds, Mode};
use crate::lock::{self, Acquire, Barriers, Hold, Seen, TtlFix};
use crate::queue::LockName;
use crate::shared_queue::{self, Answer, Request};
use crate::stats;

/// Whether a change moves the hold's lease (and so the key's TTL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lease {
    /// The lease moved: the key's TTL is set to it.
    Moved,
    /// The lease is as it was: the TTL is left alone.
    Kept,
}

/// The keyspace event a change to a lock is announced with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    Acquire,
    Reenter,
    Release,
    Renew,
    Fence,
    /// A release to zero that handed the lock, in place, to a waiter: the
    /// release is announced, then the waiter's fresh hold; the key stays.
    HandOver,
    /// Shared holds whose lease ended were dropped and nothing was granted:
    /// announced by no event while others remain (nothing was acquired),
    /// as an expiry when none is left.
    SharesEnded,
    /// A shared grant taken back (its client never got the reply): a
    /// deletion when none is left, else no event.
    Revoked,
}

/// How a lock's key goes, and what the server is told. The host removes it
/// as part of serving it: what it announces needs no pump.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// Its lease has ended: as Redis's own expiry would (`expired`).
    Expired,
    /// Its owner released it to zero (`lock.release`, then `del`).
    Released,
    /// Taken back, or its lease ended under a TTL someone changed (`del`).
    Deleted,
}

/// How a lock whose last hold a [`Host::write`] of [`Write::Listed`] with
/// `event` ended goes: expired by its lease, deleted when taken back, else
/// released.
pub fn removal(event: Event) -> Removal {
    match event {
        Event::SharesEnded => Removal::Expired,
        Event::Revoked => Removal::Deleted,
        _ => Removal::Released,
    }
}

/// How [`Host::read`] shows a lock's holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read<'a> {
    /// As stored, and whether this owner holds a compactly stored exclusive
    /// hold (compared in place: the owner is not copied to the heap).
    Mine(&'a [u8]),
    /// As stored, whoever holds it.
    AsStored,
    /// Listed by owner whatever the storage (a free key shows none): the
    /// rule for shared requests decides over the list.
    Listed,
}

/// A lock's holds as [`Host::read`] shows them.
#[derive(Debug)]
pub enum Stored {
    /// No lock in the key.
    Free,
    /// One exclusive hold that the host stores compactly: the hold (ending at
    /// the earlier of its lease and the key's expiry), live or not, and
    /// whether it is the owner's that [`Read::Mine`] named.
    One { hold: Hold, mine: bool },
    /// The holds listed by owner, taken out of the key (a host may move
    /// them out of the stored value instead of copying them): every read
    /// that shows them is followed by a [`Host::write`] of
    /// [`Write::Listed`] with the same key, which puts them back, changed
    /// or not.
    Listed(Holds),
}

/// What [`Host::write`] stores.
#[derive(Debug)]
pub enum Write<'a> {
    /// `owner`'s exclusive `hold`, over the one hold the key has (the
    /// owner's own, or an ended or released one) or in a free key.
    /// [`Lease::Kept`]: the key's TTL is left alone.
    One {
        owner: &'a [u8],
        hold: Hold,
        lease: Lease,
    },
    /// Holds a [`Stored::Listed`] read took, put back.
    Listed(Holds),
}

/// Why a blocked client is answered nil (or nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nil {
    /// The server turned it away after blocking it: stop its deadline.
    Refused,
    /// Its `WAIT` deadline timer is the one firing.
    TimedOut,
    /// It left (disconnected, or unblocked with an error): nothing to write,
    /// the host only gives the handle back.
    Left,
}

/// What [`acquire`] answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquired {
    /// The caller holds the lock: this hold (its fence, count, lease end).
    Held(Hold),
    /// Busy: nil now.
    Nil,
    /// Parked: it is answered later (granted, or nil at its deadline).
    Parked,
}

/// What [`client_left`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Left {
    /// It was waiting, and is answered.
    Waiting,
    /// It had been granted a lock it never heard of: the grant is taken back.
    Revoked,
    /// Nothing of it here.
    Unknown,
}

/// What the sequencing needs from the world. Time is the host's clock
/// ([`Host::now`]) or a key's ([`Host::key_now`]); nothing here sleeps.
pub trait Host {
    /// A parked client's handle, kept by the engine until it is answered.
    type Handle;
    /// How a command names its lock (no [`LockName`] is built for it unless
    /// clients wait somewhere).
    type Target: ?Sized;
    /// An open key, closed when dropped.
    type Key;

    /// Runs `f` on the hand-off engine. No call into the host is made while
    /// it runs.
    fn engine<R>(&mut self, f: impl FnOnce(&mut Engine<Self::Handle>) -> R) -> R;
    /// The clock, unix ms.
    fn now(&self) -> u64;
    /// The lock a command names.
    fn lock_name(&self, target: &Self::Target) -> LockName;

    // --- keys ------------------------------------------------------------

    /// Opens a command's lock for writing (an ended lease is expired first,
    /// as the server does when it opens a key).
    fn open(&mut self, target: &Self::Target) -> Self::Key;
    /// Opens `name` for writing, from a command or from the server's own
    /// work (a timer, a job).
    fn open_name(&mut self, name: &LockName, in_command: bool) -> Self::Key;
    /// The time to judge the key's lock by.
    fn key_now(&self, key: &Self::Key) -> u64;
    /// The key's expiry, whatever it holds.
    fn expires_at(&self, key: &Self::Key) -> Option<u64>;
    /// The stored lease end of the lock in the key (`None`: no lock), not
    /// capped by the key's expiry: what a TTL fix compares with it.
    fn stored_lease(&self, key: &Self::Key) -> Option<u64>;
    /// The lock's holds, of either mode, shown as `how` asks: [`Stored::Free`]
    /// if the key is empty, `WRONGTYPE` for another type.
    fn read(&mut self, key: &mut Self::Key, how: Read<'_>) -> Result<Stored, LockError>;
    /// Stores `holds` and announces `event`. [`Write::One`] sends replicas
    /// and the AOF that hold. [`Write::Listed`]: when they changed
    /// ([`Holds::take_changes`]), sends each changed owner's hold, not the
    /// holder list; when nothing changed, only puts them back; when none is
    /// left the key goes, as [`removal`] says for `event`.
    fn write(&mut self, key: &mut Self::Key, holds: Write<'_>, event: Event);
    /// Deletes the lock (and replicates that), announced as `how` says.
    fn remove(&mut self, key: &mut Self::Key, how: Removal);
    /// Puts the key's expiry back to the lease end `at`.
    fn restore_expiry(&mut self, key: &mut Self::Key, at: u64);
    /// A fresh fence, above every fence issued before.
    fn issue_fence(&mut self, now: u64) -> u64;
    /// Every fence issued from now on is above `fence` (`LOCK.FENCE`).
    fn raise_fences(&mut self, fence: u64);
    /// `owner`'s hold of a command's lock had its fence raised `from` → `to`
    /// (`LOCK.FENCE`): where the host binds holds to connections by fence.
    fn refenced(&mut self, target: &Self::Target, owner: &[u8], from: u64, to: u64);

    // --- gates -----------------------------------------------------------

    /// A master, not loading: the server's own work may write.
    fn is_writer(&self) -> bool;
    /// The server pauses writes (`CLIENT PAUSE`, a failover…).
    fn writes_paused(&mut self) -> bool;
    /// The replicas Redis counts follow this master (or none are required).
    fn replicas_follow(&self) -> bool;
    /// Whether the quarantine lets a fresh hold begin now.
    fn quarantine_gate(&self) -> Gate;
    /// The node is in quarantine: it begins no hold, not even a reentry.
    fn quarantined(&self) -> bool;
    /// The longest lease a waiter may be granted now (`None`: no cap).
    fn lease_cap(&self) -> Option<u64>;

    // --- timers ----------------------------------------------------------

    /// Arms a lease check; it calls [`lease_check_fired`].
    fn arm_lease_check(&mut self, timer: Timer);
    /// Arms the retry of a closed gate; it calls [`retry_fired`].
    fn arm_retry(&mut self, delay_ms: u64);
    /// Arms the pump; it calls [`pump`] once the unit of work that asked is
    /// done (`from_command`: a command or a notification inside one).
    fn arm_pump(&mut self, from_command: bool);

    // --- clients ---------------------------------------------------------

    /// Whether the calling client may block (not in MULTI or a script).
    fn can_block(&self) -> bool;
    /// Blocks the calling client, to wait on `name` at most `timeout_ms`
    /// (0: no limit): its id and handle, or `None` if it cannot.
    fn block(&mut self, name: &LockName, timeout_ms: u64) -> Option<(u64, Self::Handle)>;
    /// Answers a parked client granted `name` with `fence`, its lease
    /// running through `until`.
    fn reply_granted(
        &mut self,
        id: u64,
        handle: Self::Handle,
        name: &LockName,
        fence: u64,
        until: u64,
    );
    /// Answers a parked client granted every lock it waited on at once:
    /// `holds[i]` of `names[i]`, in the order it named them.
    fn reply_granted_all(
        &mut self,
        id: u64,
        handle: Self::Handle,
        names: &[LockName],
        holds: &[Hold],
    );
    /// A parked client `id` is about to be answered a fresh hold of `name`
    /// (for `owner`, with `fence`): where the host binds holds to
    /// connections. Reentries are not reported.
    fn began(&mut self, id: u64, handle: &Self::Handle, name: &LockName, owner: &[u8], fence: u64);
    /// Answers a parked client with `error`: its request, reaching the head
    /// of the queue, is refused as it would have been had it asked then (an
    /// owner who meanwhile holds the lock shared asking for it exclusively).
    fn reply_refused(&mut self, id: u64, handle: Self::Handle, error: LockError);
    /// Answers a parked client nil, or only gives its handle back.
    fn reply_nil(&mut self, id: u64, handle: Self::Handle, why: Nil);
    /// Where `name`, free here, lives now if it left this node (a cluster
    /// slot migration): the error its waiters are answered.
    fn moved_to(&mut self, name: &LockName) -> Option<String>;
    /// Answers every waiter of `name` with `error`.
    fn redirect(&mut self, name: &LockName, error: &str);
}

// ---------------------------------------------------------------------------
// Commands.
// ---------------------------------------------------------------------------

/// `LOCK.ACQUIRE`: grant now, park the caller (with `wait_ms`), or nil.
/// Clients waiting on a lock found free are served first: it is theirs.
///
/// One path for every mode: an exclusive request reads the lock as stored
/// (an exclusive hold kept compactly is decided without listing it), a
/// shared one reads the holds listed by owner; either way [`lock::acquire`]
/// decides, and the same steps follow its answer.
pub fn acquire<H: Host>(
    host: &mut H,
    target: &H::Target,
    owner: &[u8],
    mode: Mode,
    ttl_ms: u64,
    wait_ms: Option<u64>,
) -> Result<Acquired, LockError> {
    acquire_permits(host, target, owner, (mode, 1), ttl_ms, wait_ms)
}

/// [`acquire`] of a hold worth `permits` of a semaphore's (`PERMITS k`):
/// admitted while the permits held, this one included, stay within the
/// limit; the queue stays first come first served.
pub fn acquire_permits<H: Host>(
    host: &mut H,
    target: &H::Target,
    owner: &[u8],
    (mode, permits): (Mode, u32),
    ttl_ms: u64,
    wait_ms: Option<u64>,
) -> Result<Acquired, LockError> {
    // The lock's name, made once and only if clients wait on it (serving
    // them adds no one to its queue).
    let waiting = waiting_on(host, target);
    if let Some(name) = &waiting {
        serve(host, name, true);
    }
    let mut key = host.open(target);
    let now = host.key_now(&key);
    let how = match mode {
        Mode::Exclusive => Read::Mine(owner),
        Mode::Shared { .. } => Read::Listed,
    };
    let stored = host.read(&mut key, how)?;
    let (waiters, waiting_mode) = match &waiting {
        Some(name) if mode == Mode::Exclusive => (host.engine(|e| e.has_waiters(name)), None),
        Some(name) => host.engine(|e| (e.has_waiters(name), e.waiting_shared_mode(name))),
        None => (false, None),
    };
    let barriers = Barriers {
        waiters: waiters && !planted::barges(),
        quarantined: host.quarantined(),
    };
    // The decision, stored, and what it leaves to check: the lease a
    // reentry moved, the first of several shared holds to end, and the
    // live lease a parked request waits for.
    let (decision, checks) = match stored {
        Stored::Listed(mut holds) => {
            let decision = holds.acquire_permits(
                owner,
                (mode, permits),
                ttl_ms,
                now,
                barriers,
                waiting_mode,
                || host.issue_fence(now),
            );
            if !matches!(decision, Ok(Acquire::Busy) | Err(_)) {
                holds.drop_ended(now);
            }
            let checks = Checks::of(&holds, now);
            let event = match decision {
                Ok(Acquire::Reentered(_)) => Event::Reenter,
                _ => Event::Acquire,
            };
            host.write(&mut key, Write::Listed(holds), event);
            (decision?, checks)
        }
        stored => {
            let held = match stored {
                Stored::One { hold, .. } => Some(hold),
                _ => None,
            };
            let decision = store_one(
                host,
                &mut key,
                stored,
                (owner, (mode, permits), ttl_ms),
                now,
                barriers,
            )?;
            let checks = Checks {
                lease: match decision {
                    Acquire::Reentered(hold) => Some(hold.expires_at),
                    _ => None,
                },
                ends: None,
                busy_until: held
                    .filter(|hold| !lock::ended(hold.expires_at, now))
                    .map(|hold| hold.expires_at),
            };
            (decision, checks)
        }
    };
    drop(key);
    match decision {
        Acquire::Fresh(hold) => {
            stats::ACQUIRED.incr();
            check_hold_end(host, target, waiting.as_ref(), checks.ends, now);
            Ok(Acquired::Held(hold))
        }
        Acquire::Reentered(hold) => {
            stats::REENTERED.incr();
            owner_active(host, target, owner);
            if let Some(at) = checks.lease {
                lease_changed(host, target, at);
            }
            check_hold_end(host, target, waiting.as_ref(), checks.ends, now);
            Ok(Acquired::Held(hold))
        }
        Acquire::Busy => match wait_ms {
            Some(timeout) if host.can_block() => {
                let name = waiting.unwrap_or_else(|| host.lock_name(target));
                let request = (owner, (mode, permits), ttl_ms);
                if !park(host, &name, request, timeout, checks.busy_until) {
                    return Ok(Acquired::Nil);
                }
                if checks.busy_until.is_none() {
                    // Free but not grantable now (quarantine): served when
                    // the gate opens.
                    serve(host, &name, true);
                }
                Ok(Acquired::Parked)
            }
            _ => Ok(Acquired::Nil),
        },
    }
}

/// What a decision over a lock's holds leaves to check, read once they are
/// stored.
#[derive(Debug, Clone, Copy)]
struct Checks {
    /// The earliest lease left: where a reentry of a shared hold points
    /// waiters' lease check.
    lease: Option<u64>,
    /// When the first of several shared holds ends, if before the others
    /// (the key's TTL ends the last): a check is due then.
    ends: Option<u64>,
    /// The first live lease end: when a parked request is looked at again
    /// (`None`: the lock is free, only a gate holds it back).
    busy_until: Option<u64>,
}

impl Checks {
    /// The checks of listed holds.
    fn of(holds: &Holds, now: u64) -> Checks {
        Checks {
            lease: holds.earliest_lease(),
            ends: shared_hold_ends(holds),
            busy_until: holds.earliest_live_lease(now),
        }
    }
}

/// When the first of several shared holds ends, if before the others (the
/// key's TTL ends the last): a check is due then.
fn shared_hold_ends(holds: &Holds) -> Option<u64> {
    if holds.mode() == Mode::Exclusive {
        return None;
    }
    let (first, last) = (holds.earliest_lease()?, holds.latest_lease()?);
    (first < last).then_some(first)
}

/// Arms the check of a shared hold that ends at `ends` (see
/// [`shared_hold_ends`]), naming the lock only then.
fn check_hold_end<H: Host>(
    host: &mut H,
    target: &H::Target,
    name: Option<&LockName>,
    ends: Option<u64>,
    now: u64,
) {
    let Some(at) = ends else {
        return;
    };
    let name = name.cloned().unwrap_or_else(|| host.lock_name(target));
    let timer = host.engine(|e| e.hold_ends(&name, at, now));
    arm(host, timer);
}

/// `LOCK.REENTER`: the hold, one count deeper.
pub fn reenter<H: Host>(
    host: &mut H,
    target: &H::Target,
    owner: &[u8],
    ttl_ms: Option<u64>,
) -> Result<Hold, LockError> {
    let lease = if ttl_ms.is_some() {
        Lease::Moved
    } else {
        Lease::Kept
    };
    let changed = change_own(host, target, owner, Event::Reenter, lease, |own, now| {
        lock::reenter(own, ttl_ms, now).map(Some)
    })?;
    stats::REENTERED.incr();
    changed.after.ok_or(LockError::NotOwner)
}

/// `LOCK.RENEW`: the hold with its new lease.
pub fn renew<H: Host>(
    host: &mut H,
    target: &H::Target,
    owner: &[u8],
    ttl_ms: u64,
) -> Result<Hold, LockError> {
    let changed = change_own(
        host,
        target,
        owner,
        Event::Renew,
        Lease::Moved,
        |own, now| lock::renew(own, ttl_ms, now).map(Some),
    )?;
    stats::RENEWED.incr();
    changed.after.ok_or(LockError::NotOwner)
}

/// What [`fence`] did: the caller's hold, whose fence went `from` → `hold.fence`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fenced {
    pub from: u64,
    pub hold: Hold,
}

/// `LOCK.FENCE`: the caller's hold, of either mode, with its fence raised
/// to at least `min_fence`; every fence this server issues afterwards is
/// higher, and a hold bound to a connection stays bound at its new fence.
/// Count and lease unchanged.
pub fn fence<H: Host>(
    host: &mut H,
    target: &H::Target,
    owner: &[u8],
    min_fence: u64,
) -> Result<Fenced, LockError> {
    let changed = change_own(host, target, owner, Event::Fence, Lease::Kept, |own, _| {
        lock::fence(own, min_fence).map(Some)
    })?;
    let (Some(before), Some(hold)) = (changed.before, changed.after) else {
        return Err(LockError::NotOwner);
    };
    // Replicas and the AOF raise their counter as they apply the hold.
    host.raise_fences(hold.fence);
    host.refenced(target, owner, before.fence, hold.fence);
    Ok(Fenced {
        from: before.fence,
        hold,
    })
}

/// `LOCK.RELEASE`: the hold left (`None`: now free). A release to zero
/// hands the lock to its longest-waiting client in the same command, so no
/// later command sees it free.
pub fn release<H: Host>(
    host: &mut H,
    target: &H::Target,
    owner: &[u8],
    all: bool,
) -> Result<Option<Hold>, LockError> {
    release_counted(host, target, owner, all, &stats::RELEASED)
}

/// An ephemeral hold whose connection closed ends as a release to zero
/// (waiters served the same way), counted apart from clients' releases.
pub fn end_bound<H: Host>(host: &mut H, target: &H::Target, owner: &[u8]) -> Result<(), LockError> {
    release_counted(host, target, owner, true, &stats::DISCONNECT_RELEASED).map(drop)
}

fn release_counted<H: Host>(
    host: &mut H,
    target: &H::Target,
    owner: &[u8],
    all: bool,
    counter: &stats::Counter,
) -> Result<Option<Hold>, LockError> {
    let changed = change_own(
        host,
        target,
        owner,
        Event::Release,
        Lease::Kept,
        |own, _| lock::release(own, all),
    )?;
    counter.incr();
    Ok(changed.after)
}

/// What [`change_own`] changed: the caller's live hold before and after
/// (`None` after: it ended).
#[derive(Debug, Clone, Copy)]
struct Changed {
    before: Option<Hold>,
    after: Option<Hold>,
}

/// A command on the caller's own hold, of either mode: `rule` decides the
/// hold it leaves from the caller's live hold (`None` after: it ends), and
/// that is stored with `lease` and announced with `event`. A hold that
/// ends hands the lock on: an exclusive one in place to the longest-waiting
/// client, in the same command (the key goes straight from one holder to
/// the next); a shared one by serving the queue, as holds may have ended.
fn change_own<H: Host>(
    host: &mut H,
    target: &H::Target,
    owner: &[u8],
    event: Event,
    lease: Lease,
    rule: impl FnOnce(Option<Hold>, u64) -> Result<Option<Hold>, LockError>,
) -> Result<Changed, LockError> {
    let mut key = host.open(target);
    let now = host.key_now(&key);
    let (before, after) = match host.read(&mut key, Read::Mine(owner))? {
        Stored::Listed(mut holds) => {
            let before = holds.of(owner, now).map(|h| h.hold);
            let after = match holds.decide(owner, now, |own| rule(own, now)) {
                Ok(after) => after,
                Err(error) => {
                    host.write(&mut key, Write::Listed(holds), event);
                    return Err(error);
                }
            };
            holds.drop_ended(now);
            let ends = shared_hold_ends(&holds);
            host.write(&mut key, Write::Listed(holds), event);
            drop(key);
            owner_active(host, target, owner);
            let waiting = waiting_on(host, target);
            if let Some(name) = &waiting {
                serve(host, name, true);
            }
            check_hold_end(host, target, waiting.as_ref(), ends, now);
            return Ok(Changed { before, after });
        }
        Stored::One { hold, mine: true } if !lock::ended(hold.expires_at, now) => {
            (Some(hold), rule(Some(hold), now)?)
        }
        _ => (None, rule(None, now)?),
    };
    owner_active(host, target, owner);
    match after {
        Some(hold) => {
            host.write(&mut key, Write::One { owner, hold, lease }, event);
            if matches!(event, Event::Reenter | Event::Renew) {
                drop(key);
                lease_changed(host, target, hold.expires_at);
            }
        }
        None => match waiting_on(host, target) {
            None => host.remove(&mut key, Removal::Released),
            Some(name) => match grant_freed(host, &name, now) {
                // The key goes straight from one holder to the next: it is
                // never deleted, re-created or opened again, and replicas
                // and the AOF get the one effect of the new hold.
                Some(grant) => hand_over(host, &mut key, &name, grant, now, Event::HandOver),
                None => {
                    host.remove(&mut key, Removal::Released);
                    drop(key);
                    serve(host, &name, true);
                }
            },
        },
    }
    Ok(Changed { before, after })
}

/// The grant of `name`, just freed by its holder's command, to its
/// longest-waiting client, if the gates are open (else [`serve`] decides,
/// once the key is gone).
fn grant_freed<H: Host>(host: &mut H, name: &LockName, now: u64) -> Option<Grant<H::Handle>> {
    if write_gate(host, true) != Gate::Open || host.quarantine_gate() != Gate::Open {
        return None;
    }
    if host.engine(|e| e.head_is_shared(name) || e.head_waits_on_several(name).is_some()) {
        // Shared requests at the head are granted together by [`serve`],
        // and a request for several locks on all of them at once.
        return None;
    }
    let cap = host.lease_cap();
    match host.engine(|e| e.serve(name, Key::Free, now, Gate::Open, cap)) {
        Serve::Grant(grant) => Some(grant),
        Serve::Wait(timer) => {
            arm(host, timer);
            None
        }
        Serve::Deferred { .. } => None,
    }
}

/// The name of a command's lock if clients wait on it (a free lock is then
/// theirs, not a newcomer's). Builds no name when nobody waits anywhere.
pub fn waiting_on<H: Host>(host: &mut H, target: &H::Target) -> Option<LockName> {
    if !host.engine(|e| e.anyone_waiting()) {
        return None;
    }
    let name = host.lock_name(target);
    host.engine(|e| e.has_waiters(&name)).then_some(name)
}

/// `owner` succeeded with a command of its own on its lock: a grant of that
/// lock to that owner is no longer taken back (see `Engine::owner_active`).
pub fn owner_active<H: Host>(host: &mut H, target: &H::Target, owner: &[u8]) {
    if host.engine(|e| e.any_in_flight() || e.has_revokes()) {
        let name = host.lock_name(target);
        host.engine(|e| e.owner_active(&name, owner));
    }
}

/// The holder's lease of a command's lock now ends at `at`: if clients
/// wait, check then.
pub fn lease_changed<H: Host>(host: &mut H, target: &H::Target, at: u64) {
    if let Some(name) = waiting_on(host, target) {
        let now = host.now();
        let timer = host.engine(|e| e.lease_moved(&name, at, now));
        arm(host, timer);
    }
}

/// Parks the calling client at the back of `name`'s queue. `false`: it
/// could not be blocked, and the caller answers nil.
fn park<H: Host>(
    host: &mut H,
    name: &LockName,
    (owner, (mode, permits), ttl_ms): (&[u8], (Mode, u32), u64),
    timeout_ms: u64,
    holder_until: Option<u64>,
) -> bool {
    let Some((id, handle)) = host.block(name, timeout_ms) else {
        return false;
    };
    let waiter = Waiter {
        owner: owner.to_vec(),
        ttl_ms,
        mode,
        permits,
        handle,
    };
    let now = host.now();
    match host.engine(|e| e.park(name.clone(), id, waiter, holder_until, now)) {
        Ok(timer) => {
            stats::WAITING.add(1);
            arm(host, timer);
        }
        Err(waiter) => host.reply_nil(id, waiter.handle, Nil::Refused),
    }
    true
}

// ---------------------------------------------------------------------------
// Several locks at once.
// ---------------------------------------------------------------------------

/// What [`acquire_all`] answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcquiredAll {
    /// The caller holds every lock: one hold each, in the order named.
    Held(Vec<Hold>),
    /// Not every lock can be granted now: nil, nothing changed.
    Nil,
    /// Parked on every lock as one request: answered later.
    Parked,
}

/// One lock of a request for several, opened and read.
struct Opened<K> {
    key: K,
    stored: Stored,
    now: u64,
}

/// Puts back what reading `opened` took out of the keys (listed holds),
/// unchanged.
fn put_back<H: Host>(host: &mut H, opened: Vec<Opened<H::Key>>) {
    for one in opened {
        let Opened {
            mut key, stored, ..
        } = one;
        if let Stored::Listed(holds) = stored {
            host.write(&mut key, Write::Listed(holds), Event::Acquire);
        }
    }
}

/// How a request in `mode` by `owner` reads a lock.
fn read_for<'a>(mode: Mode, owner: &'a [u8]) -> Read<'a> {
    match mode {
        Mode::Exclusive => Read::Mine(owner),
        Mode::Shared { .. } => Read::Listed,
    }
}

/// What one lock decides for a request, without storing anything (no
/// fence issued): the decision, and the live lease that keeps it busy.
fn dry_decide(
    stored: &Stored,
    owner: &[u8],
    (mode, permits): (Mode, u32),
    ttl_ms: u64,
    now: u64,
    barriers: Barriers,
) -> Result<(Acquire, Option<u64>), LockError> {
    let (seen, busy_until) = match stored {
        Stored::Listed(holds) => (
            holds.seen_permits(owner, mode, permits, now)?,
            holds.earliest_live_lease(now),
        ),
        Stored::One { hold, mine } => {
            let live = !lock::ended(hold.expires_at, now);
            (
                Seen::stored(Some(*hold), *mine, now),
                live.then_some(hold.expires_at),
            )
        }
        Stored::Free => (Seen::stored(None, false, now), None),
    };
    let decision = lock::acquire(seen, ttl_ms, now, barriers, || 0)?;
    Ok((decision, busy_until))
}

/// Stores the grant of one lock of a request for several, decided as
/// [`dry_decide`] did (same barriers), now with its fence: the hold, and
/// the first of several shared holds to end (a check is due then).
fn store_grant<H: Host>(
    host: &mut H,
    opened: Opened<H::Key>,
    (owner, (mode, permits), ttl_ms): (&[u8], (Mode, u32), u64),
    barriers: Barriers,
) -> Result<(Acquire, Option<u64>), LockError> {
    let Opened {
        mut key,
        stored,
        now,
    } = opened;
    match stored {
        Stored::Listed(mut holds) => {
            let ended = holds.drop_ended(now);
            for _ in &ended {
                stats::EXPIRED_HELD.incr();
            }
            let decision =
                holds.apply_permits(owner, (mode, permits), ttl_ms, now, barriers, || {
                    host.issue_fence(now)
                });
            let ends = shared_hold_ends(&holds);
            let event = match decision {
                Ok(Acquire::Reentered(_)) => Event::Reenter,
                _ => Event::Acquire,
            };
            host.write(&mut key, Write::Listed(holds), event);
            Ok((decision?, ends))
        }
        stored => {
            let decision = store_one(
                host,
                &mut key,
                stored,
                (owner, (mode, permits), ttl_ms),
                now,
                barriers,
            )?;
            Ok((decision, None))
        }
    }
}

/// The one decision and write of an acquire on a lock read as one compact
/// hold or free (`Stored::One`, `Stored::Free`), for a single request and
/// for each lock of a request for several alike.
fn store_one<H: Host>(
    host: &mut H,
    key: &mut H::Key,
    stored: Stored,
    (owner, (mode, permits), ttl_ms): (&[u8], (Mode, u32), u64),
    now: u64,
    barriers: Barriers,
) -> Result<Acquire, LockError> {
    let (held, mine) = match stored {
        Stored::One { hold, mine } => (Some(hold), mine),
        _ => (None, false),
    };
    let seen = Seen::stored(held, mine, now);
    let decision = lock::acquire(seen, ttl_ms, now, barriers, || host.issue_fence(now))?;
    match decision {
        Acquire::Fresh(hold) => {
            if held.is_some() {
                // The previous hold's lease ended: free it as Redis would.
                host.remove(key, Removal::Expired);
            }
            let write = match mode {
                Mode::Exclusive => Write::One {
                    owner,
                    hold,
                    lease: Lease::Moved,
                },
                // (A shared request reads the holds listed; were a free key
                // shown otherwise, it begins the list.)
                Mode::Shared { .. } => {
                    let mut holds = Holds::free();
                    holds.begin_permits(owner, (mode, permits), ttl_ms, now, hold.fence);
                    Write::Listed(holds)
                }
            };
            host.write(key, write, Event::Acquire);
        }
        Acquire::Reentered(hold) => {
            let write = Write::One {
                owner,
                hold,
                lease: Lease::Moved,
            };
            host.write(key, write, Event::Reenter);
        }
        Acquire::Busy => {}
    }
    Ok(decision)
}

/// `LOCK.MACQUIRE`: a hold on every lock of `targets` (distinct, at least
/// one), all or none, in one step. Granted now when every lock would grant
/// it as a single [`acquire`] would (free, the caller's own hold, or shared
/// room, nobody waiting ahead there): fresh holds get their fences in the
/// order named. Otherwise nil, or with `wait_ms` the caller parks on every
/// lock as one request ([`Engine::park_all`]), served when it is first in
/// line on all of them and all admit it ([`serve_several`]). It never
/// holds some while waiting for others, and nobody who came later is
/// granted any of them before it: so no deadlock in any key order.
pub fn acquire_all<H: Host>(
    host: &mut H,
    targets: &[&H::Target],
    owner: &[u8],
    (mode, permits): (Mode, u32),
    ttl_ms: u64,
    wait_ms: Option<u64>,
) -> Result<AcquiredAll, LockError> {
    let ask = (mode, permits);
    if let [target] = targets {
        // One lock: the single request, with its reply as a list.
        return Ok(
            match acquire_permits(host, target, owner, ask, ttl_ms, wait_ms)? {
                Acquired::Held(hold) => AcquiredAll::Held(vec![hold]),
                Acquired::Nil => AcquiredAll::Nil,
                Acquired::Parked => AcquiredAll::Parked,
            },
        );
    }
    // Clients waiting on a lock found free are served first: it is theirs.
    for target in targets {
        if let Some(name) = waiting_on(host, target) {
            serve(host, &name, true);
        }
    }
    let waiting: Vec<Option<LockName>> = targets.iter().map(|t| waiting_on(host, t)).collect();
    let quarantined = host.quarantined();
    let mut opened = Vec::with_capacity(targets.len());
    for target in targets {
        let mut key = host.open(target);
        let now = host.key_now(&key);
        match host.read(&mut key, read_for(mode, owner)) {
            Ok(stored) => opened.push(Opened { key, stored, now }),
            Err(error) => {
                drop(key);
                put_back(host, opened);
                return Err(error);
            }
        }
    }
    // Decide every lock before changing any.
    let mut barriers = Vec::with_capacity(targets.len());
    let mut busy_until = Vec::with_capacity(targets.len());
    let mut busy = false;
    for (one, name) in opened.iter().zip(&waiting) {
        let (waiters, waiting_mode) = match name {
            Some(name) => host.engine(|e| (e.has_waiters(name), e.waiting_shared_mode(name))),
            None => (false, None),
        };
        let these = Barriers {
            waiters,
            quarantined,
        };
        let decided = match &one.stored {
            Stored::Listed(holds) => holds.check_limit(mode, waiting_mode, one.now),
            _ => Ok(()),
        }
        .and_then(|()| dry_decide(&one.stored, owner, ask, ttl_ms, one.now, these));
        match decided {
            Ok((decision, until)) => {
                busy |= decision == Acquire::Busy;
                barriers.push(these);
                busy_until.push(until);
            }
            Err(error) => {
                put_back(host, opened);
                return Err(error);
            }
        }
    }
    if busy {
        put_back(host, opened);
        return match wait_ms {
            Some(timeout) if host.can_block() => {
                let names: Vec<LockName> = targets.iter().map(|t| host.lock_name(t)).collect();
                park_all(host, names, (owner, ask, ttl_ms), timeout, &busy_until)
            }
            _ => Ok(AcquiredAll::Nil),
        };
    }
    let mut holds = Vec::with_capacity(targets.len());
    let mut ends = Vec::with_capacity(targets.len());
    for (one, these) in opened.into_iter().zip(barriers) {
        let (decision, end) = store_grant(host, one, (owner, ask, ttl_ms), these)?;
        match decision {
            Acquire::Fresh(hold) => {
                stats::ACQUIRED.incr();
                holds.push((hold, true));
            }
            Acquire::Reentered(hold) => {
                stats::REENTERED.incr();
                holds.push((hold, false));
            }
            // Decided grantable above, with the same barriers.
            Acquire::Busy => return Err(LockError::Internal),
        }
        ends.push(end);
    }
    let now = host.now();
    for (((target, name), (hold, fresh)), end) in targets.iter().zip(&waiting).zip(&holds).zip(ends)
    {
        if !fresh {
            owner_active(host, target, owner);
            lease_changed(host, target, hold.expires_at);
        }
        check_hold_end(host, target, name.as_ref(), end, now);
    }
    Ok(AcquiredAll::Held(
        holds.into_iter().map(|(hold, _)| hold).collect(),
    ))
}

/// Parks the calling client on every lock of `names` as one request.
fn park_all<H: Host>(
    host: &mut H,
    names: Vec<LockName>,
    (owner, (mode, permits), ttl_ms): (&[u8], (Mode, u32), u64),
    timeout_ms: u64,
    busy_until: &[Option<u64>],
) -> Result<AcquiredAll, LockError> {
    let Some(first) = names.first() else {
        return Ok(AcquiredAll::Nil);
    };
    let Some((id, handle)) = host.block(first, timeout_ms) else {
        return Ok(AcquiredAll::Nil);
    };
    let waiter = Waiter {
        owner: owner.to_vec(),
        ttl_ms,
        mode,
        permits,
        handle,
    };
    let now = host.now();
    let free: Vec<LockName> = names
        .iter()
        .zip(busy_until)
        .filter(|(_, until)| until.is_none())
        .map(|(name, _)| name.clone())
        .collect();
    match host.engine(|e| e.park_all(names, id, waiter, busy_until, now)) {
        Ok(timers) => {
            stats::WAITING.add(1);
            for timer in timers {
                host.arm_lease_check(timer);
            }
        }
        Err(waiter) => {
            host.reply_nil(id, waiter.handle, Nil::Refused);
            return Ok(AcquiredAll::Parked);
        }
    }
    // A lock that is free but was not granted (others wait ahead, or a
    // gate is closed) is looked at again, or deferred until the gate opens.
    for name in free {
        serve(host, &name, true);
    }
    Ok(AcquiredAll::Parked)
}

/// Serves client `id`, first in line on a lock and waiting on several:
/// granted on all of them in this one step if it is first in line on
/// every one and every one admits it (decided by [`lock::acquire`] as if
/// it came now with nobody ahead); else nothing changes, and each lock
/// that is busy is checked again when its hold ends. Costs the locks it
/// names. Returns the locks to serve again after a grant (those behind
/// it).
fn serve_several<H: Host>(host: &mut H, id: u64, in_command: bool) -> Vec<LockName> {
    let Some(names) = host.engine(|e| e.names_of(id)) else {
        return Vec::new();
    };
    let first_on = |host: &mut H, name: &LockName| host.engine(|e| e.is_first(name, id));
    let its_turn = if planted::ignores_arrival_order() {
        names.iter().any(|name| first_on(host, name))
    } else {
        names.iter().all(|name| first_on(host, name))
    };
    if !its_turn {
        // Not its turn on some lock: that lock's queue reaches it.
        return Vec::new();
    }
    let cap = host.lease_cap();
    let Some((owner, ask, ttl_ms)) = host.engine(|e| e.request_of(id, cap)) else {
        return Vec::new();
    };
    let mut opened = Vec::with_capacity(names.len());
    let mut checks = Vec::new();
    let mut busy = false;
    let mut refused = None;
    for name in &names {
        let mut key = host.open_name(name, in_command);
        let now = host.key_now(&key);
        match host.read(&mut key, read_for(ask.0, &owner)) {
            Ok(stored) => {
                match dry_decide(&stored, &owner, ask, ttl_ms, now, Barriers::NONE) {
                    Ok((Acquire::Busy, until)) => {
                        busy = true;
                        checks.push((name.clone(), until));
                    }
                    Ok(_) => {}
                    Err(error) => refused = Some(error),
                }
                opened.push(Opened { key, stored, now });
            }
            Err(_) => {
                // Another type: wait for it to go, as `BLPOP` does.
                busy = true;
                checks.push((name.clone(), host.expires_at(&key)));
            }
        }
    }
    // A cluster slot migration may have moved a free lock to another node:
    // its waiters, this one included, follow it there (as for one lock)
    // rather than being granted it here; the others of its keys are
    // served again for those behind it.
    let free = |one: &Opened<H::Key>| match &one.stored {
        Stored::Free => true,
        Stored::Listed(holds) => holds.is_free(one.now),
        Stored::One { .. } => false,
    };
    let all_read = opened.len() == names.len();
    let moved = names
        .iter()
        .zip(&opened)
        .filter(|_| all_read)
        .filter(|(_, one)| free(one))
        .find_map(|(name, _)| host.moved_to(name).map(|error| (name.clone(), error)));
    if let Some((name, error)) = moved {
        put_back(host, opened);
        host.redirect(&name, &error);
        return names;
    }
    if busy || refused.is_some() || opened.len() != names.len() {
        put_back(host, opened);
        if let Some(error) = refused.filter(|_| !busy) {
            // As it would have been refused had it asked now.
            let Some((waiter, again)) = host.engine(|e| e.leave(id)) else {
                return Vec::new();
            };
            stats::WAITING.add(-1);
            host.reply_refused(id, waiter.handle, error);
            return again;
        }
        let now = host.now();
        for (name, until) in checks {
            if let Some(at) = until {
                let timer = host.engine(|e| e.hold_ends(&name, at, now));
                arm(host, timer);
            }
        }
        return Vec::new();
    }
    let mut holds = Vec::with_capacity(names.len());
    for one in opened {
        match store_grant(host, one, (&owner, ask, ttl_ms), Barriers::NONE) {
            Ok((Acquire::Fresh(hold), _)) => holds.push((hold, true)),
            Ok((Acquire::Reentered(hold), _)) => holds.push((hold, false)),
            // Decided grantable above on the same holds: not reached.
            Ok((Acquire::Busy, _)) | Err(_) => {}
        }
    }
    let Some(waiter) = host.engine(|e| e.take(id)) else {
        return Vec::new();
    };
    if holds.len() != names.len() {
        host.reply_refused(id, waiter.handle, LockError::Internal);
        return names;
    }
    let Waiter { owner, handle, .. } = waiter;
    stats::WAITING.add(-1);
    let mut in_flight = Vec::with_capacity(names.len());
    for (name, (hold, fresh)) in names.iter().zip(&holds) {
        if *fresh {
            stats::ACQUIRED.incr();
            stats::HANDOFFS.incr();
            host.began(id, &handle, name, &owner, hold.fence);
        } else {
            stats::REENTERED.incr();
        }
        in_flight.push(InFlight {
            name: name.clone(),
            owner: owner.clone(),
            fence: hold.fence,
        });
    }
    host.engine(|e| e.granted_several(id, in_flight));
    let holds: Vec<Hold> = holds.into_iter().map(|(hold, _)| hold).collect();
    host.reply_granted_all(id, handle, &names, &holds);
    // Those behind it: each lock is looked at again (a busy one arms its
    // check at the new lease's end; shared room may let more in).
    names
}

/// Checks that `owner` holds every lock of `targets` (live): `NOTOWNER`
/// otherwise, and nothing changes.
fn holds_all<H: Host>(host: &mut H, targets: &[&H::Target], owner: &[u8]) -> Result<(), LockError> {
    for target in targets {
        let mut key = host.open(target);
        let now = host.key_now(&key);
        let holds = match host.read(&mut key, Read::Mine(owner))? {
            Stored::One { hold, mine } => mine && !lock::ended(hold.expires_at, now),
            Stored::Listed(holds) => {
                let holds_it = holds.of(owner, now).is_some();
                host.write(&mut key, Write::Listed(holds), Event::Release);
                holds_it
            }
            Stored::Free => false,
        };
        if !holds {
            return Err(LockError::NotOwner);
        }
    }
    Ok(())
}

/// `LOCK.MRELEASE`: [`release`] of every lock of `targets`, all or none
/// (`NOTOWNER` if `owner` does not hold one of them, and nothing
/// changes): the holds left (`None`: that lock's hold ended), in order.
/// Each lock freed is handed to its waiters as a single release does.
pub fn release_all<H: Host>(
    host: &mut H,
    targets: &[&H::Target],
    owner: &[u8],
    all: bool,
) -> Result<Vec<Option<Hold>>, LockError> {
    holds_all(host, targets, owner)?;
    targets
        .iter()
        .map(|target| release(host, target, owner, all))
        .collect()
}

/// `LOCK.MRENEW`: [`renew`] of every lock of `targets`, all or none.
pub fn renew_all<H: Host>(
    host: &mut H,
    targets: &[&H::Target],
    owner: &[u8],
    ttl_ms: u64,
) -> Result<Vec<Hold>, LockError> {
    holds_all(host, targets, owner)?;
    targets
        .iter()
        .map(|target| renew(host, target, owner, ttl_ms))
        .collect()
}

// ---------------------------------------------------------------------------
// Reports: a lock may have freed, a timer fired, a client left.
// ---------------------------------------------------------------------------

/// `name` may have freed (a deletion, a flush, a lease that ended): serve it
/// once the unit of work that reported it is done.
pub fn freed<H: Host>(host: &mut H, name: LockName, from_command: bool) {
    if host.engine(|e| e.freed(name)) {
        host.arm_pump(from_command);
    }
}

/// A lease check fired: serve the lock now.
pub fn lease_check_fired<H: Host>(host: &mut H, name: &LockName, at: u64) {
    host.engine(|e| e.lease_check_fired(name, at));
    serve(host, name, false);
}

/// The retry of a closed gate fired: pump again (it defers again if the
/// gate is still closed).
pub fn retry_fired<H: Host>(host: &mut H) {
    host.engine(|e| e.retry_fired());
    pump(host);
}

/// Client `id`'s `WAIT` deadline passed: nil, if it still waits. The
/// requests behind it are served again if it was first in line.
pub fn deadline_passed<H: Host>(host: &mut H, id: u64) -> bool {
    let Some((waiter, again)) = host.engine(|e| e.leave(id)) else {
        return false;
    };
    stats::WAITING.add(-1);
    stats::WAIT_TIMEOUTS.incr();
    host.reply_nil(id, waiter.handle, Nil::TimedOut);
    for name in again {
        serve(host, &name, false);
    }
    true
}

/// Client `id` was unblocked by `CLIENT UNBLOCK` (the host writes its nil
/// itself, from inside that command): its waiter, if it still waits. The
/// requests behind it are served once that command is done, if it was
/// first in line.
pub fn unblocked<H: Host>(host: &mut H, id: u64) -> Option<Waiter<H::Handle>> {
    let (waiter, again) = host.engine(|e| e.leave(id))?;
    stats::WAITING.add(-1);
    for name in again {
        freed(host, name, false);
    }
    Some(waiter)
}

/// Client `id` disconnected (or was unblocked with an error): it leaves its
/// queue, or the grant it never heard of is taken back, at once. (Left to a
/// later pump, a command run before it — in the same turn of the event loop
/// or the next, as timers come after clients — would see the lock held by a
/// client already told it was unblocked.) A closed gate defers the taking
/// back as it defers all the pump's work.
pub fn client_left<H: Host>(host: &mut H, id: u64) -> Left {
    match host.engine(|e| e.gone(id)) {
        Gone::Waiting(waiter, again) => {
            stats::WAITING.add(-1);
            host.reply_nil(id, waiter.handle, Nil::Left);
            // The requests behind it may be let in now.
            for name in again {
                serve(host, &name, false);
            }
            Left::Waiting
        }
        Gone::Revoke => {
            pump(host);
            Left::Revoked
        }
        Gone::Unknown => Left::Unknown,
    }
}

// ---------------------------------------------------------------------------
// Serving waiters.
// ---------------------------------------------------------------------------

/// How many waiting requests the shared rule is first given: as many as a
/// hand-off usually grants, and a few.
const FIRST_SLICE: usize = 8;

/// The pump: takes back revoked grants, fixes TTLs, then serves each lock
/// reported free, in order. Defers it all while the gate is closed.
pub fn pump<H: Host>(host: &mut H) {
    let work = host.engine(|e| e.take_pending());
    if work == Pending::default() {
        return;
    }
    if !host.is_writer() {
        // A replica's master does this work; loading reports every lock
        // with waiters again when it ends.
        return;
    }
    if let Gate::Closed { retry_in_ms } = write_gate(host, false) {
        if let Some(delay) = host.engine(|e| e.defer(work, retry_in_ms)) {
            host.arm_retry(delay);
        }
        return;
    }
    for grant in &work.revokes {
        revoke(host, grant);
    }
    for name in &work.ttl_fixes {
        fix_ttl(host, name);
    }
    for name in &work.serves {
        serve(host, name, false);
    }
}

/// Whether the module may write now. Inside a command Redis has checked
/// the pause and its own count of replicas, but not whether they follow
/// this master; the server's own work checks all of it.
fn write_gate<H: Host>(host: &mut H, in_command: bool) -> Gate {
    if !in_command && host.writes_paused() {
        Gate::Closed {
            retry_in_ms: handoff::PAUSE_RETRY_MS,
        }
    } else if !host.replicas_follow() {
        Gate::Closed {
            retry_in_ms: handoff::REPLICAS_RETRY_MS,
        }
    } else {
        Gate::Open
    }
}

/// Looks at `name` and carries out the decision: grant the requests at the
/// head of its queue that the lock admits now, wait for a hold to end, or
/// defer behind a closed gate.
///
/// One path for every mode. An exclusive request at the head reads the
/// lock as stored: the engine pops it and [`hand_over`] writes its hold.
/// A shared one, or a lock held shared, reads the holds listed by owner:
/// the ended ones are dropped and the queue's rule ([`shared_queue::serve`],
/// which asks [`lock::acquire`] for each request) grants the head's prefix
/// it admits, each answered by [`answer_grant`] as a hand-over is.
///
/// A request for several locks first in line is served on all of them at
/// once ([`serve_several`]); the locks its grant changes are served again
/// here, in a loop (each round follows a grant, so it ends).
pub fn serve<H: Host>(host: &mut H, name: &LockName, in_command: bool) {
    let mut again = serve_one(host, name, in_command);
    while let Some(next) = again.pop() {
        again.extend(serve_one(host, &next, in_command));
    }
}

/// [`serve`] of one lock: the locks to serve again (after a grant of
/// several locks at once).
fn serve_one<H: Host>(host: &mut H, name: &LockName, in_command: bool) -> Vec<LockName> {
    if !in_command && !host.is_writer() {
        return Vec::new();
    }
    let gate = match write_gate(host, in_command) {
        closed @ Gate::Closed { .. } => closed,
        Gate::Open => host.quarantine_gate(),
    };
    if gate != Gate::Open {
        // The key is not even opened: during a pause Redis keeps expired
        // keys, and writing over one aborts the server. (In quarantine a
        // lock that frees waits for its waiters until the gate opens.)
        let now = host.now();
        if let Serve::Deferred {
            retry_in_ms: Some(delay),
        } = host.engine(|e| e.serve(name, Key::Free, now, gate, None))
        {
            host.arm_retry(delay);
        }
        return Vec::new();
    }
    if let Some(id) = host.engine(|e| e.head_waits_on_several(name)) {
        return serve_several(host, id, in_command);
    }
    let mut key = host.open_name(name, in_command);
    let how = if host.engine(|e| e.head_is_shared(name)) {
        Read::Listed
    } else {
        Read::AsStored
    };
    let stored = host.read(&mut key, how);
    let now = host.key_now(&key);
    let seen = match stored {
        Ok(Stored::Listed(holds)) if how == Read::AsStored && planted::hands_over_past_shared() => {
            host.write(&mut key, Write::Listed(holds), Event::SharesEnded);
            Key::Free
        }
        Ok(Stored::Listed(holds)) => return serve_listed(host, key, name, holds, now, in_command),
        Ok(Stored::Free) => Key::Free,
        Ok(Stored::One { hold, .. }) => Key::Held {
            until: hold.expires_at,
        },
        Err(_) => Key::Foreign {
            until: host.expires_at(&key),
        },
    };
    if seen == Key::Free {
        // A cluster slot migration may have moved the lock to another node:
        // its waiters follow it there instead of being granted it here.
        if let Some(error) = host.moved_to(name) {
            drop(key);
            host.redirect(name, &error);
            return Vec::new();
        }
    }
    // A client that waited gets at most the lease cap in force now.
    let cap = host.lease_cap();
    match host.engine(|e| e.serve(name, seen, now, Gate::Open, cap)) {
        Serve::Wait(timer) => arm(host, timer),
        Serve::Deferred { .. } => {}
        Serve::Grant(grant) => hand_over(host, &mut key, name, grant, now, Event::Acquire),
    }
    Vec::new()
}

/// [`serve`] over listed holds: drops the holds whose lease ended, grants
/// the requests at the head that the lock admits now (shared ones
/// together), and checks again at the earliest lease end left while
/// clients still wait.
fn serve_listed<H: Host>(
    host: &mut H,
    mut key: H::Key,
    name: &LockName,
    mut holds: Holds,
    now: u64,
    in_command: bool,
) -> Vec<LockName> {
    let ended = holds.drop_ended(now);
    for _ in &ended {
        stats::EXPIRED_HELD.incr();
    }
    if holds.is_empty() {
        // A cluster slot migration may have moved the lock to another node.
        if let Some(error) = host.moved_to(name) {
            host.write(&mut key, Write::Listed(holds), Event::SharesEnded);
            drop(key);
            host.redirect(name, &error);
            return Vec::new();
        }
    }
    let cap = host.lease_cap();
    // The rule reads only the prefix it grants: read the queue a slice at a
    // time, a larger one each time all of the last was granted, so a
    // hand-off costs what it grants, not the length of the queue.
    let mut served = Vec::new();
    let mut take = FIRST_SLICE;
    loop {
        let skip = served.len();
        let slice = host.engine(|e| e.requests(name, cap, skip, take));
        let waiting = slice
            .iter()
            .map(|(id, owner, (mode, permits), ttl_ms)| Request {
                id: *id,
                owner,
                mode: *mode,
                permits: *permits,
                ttl_ms: *ttl_ms,
            });
        let more = shared_queue::serve(&mut holds, waiting, now, || host.issue_fence(now));
        let whole = more.len() == take;
        served.extend(more);
        if !whole {
            break;
        }
        take = take.saturating_mul(2);
    }
    // Clients still waiting are looked at again when the first hold ends;
    // without them, only a shared hold that ends before the key's TTL is.
    let check = if host.engine(|e| e.waiters(name)) > served.len() {
        holds.earliest_lease()
    } else {
        shared_hold_ends(&holds)
    };
    // Announced by what was granted: a share that only ended by its lease
    // is nobody's acquisition (and a lock whose last one did expires).
    let event = if served.iter().any(|s| matches!(s.answer, Answer::Fresh(_))) {
        Event::Acquire
    } else if served
        .iter()
        .any(|s| matches!(s.answer, Answer::Reentered(_)))
    {
        Event::Reenter
    } else {
        Event::SharesEnded
    };
    host.write(&mut key, Write::Listed(holds), event);
    drop(key);
    if let Some(at) = check {
        let timer = host.engine(|e| e.hold_ends(name, at, now));
        arm(host, timer);
    }
    for one in served {
        let Some(waiter) = host.engine(|e| e.take(one.id)) else {
            continue;
        };
        let (hold, fresh) = match one.answer {
            Answer::Fresh(hold) => (hold, true),
            Answer::Reentered(hold) => (hold, false),
            Answer::Refused(error) => {
                // As it would have been refused had it asked then.
                stats::WAITING.add(-1);
                host.reply_refused(one.id, waiter.handle, error);
                continue;
            }
        };
        answer_grant(host, name, one.id, waiter, hold, fresh);
    }
    // The rule stops at a request for several locks: it may be first in
    // line now.
    match host.engine(|e| e.head_waits_on_several(name)) {
        Some(id) => serve_several(host, id, in_command),
        None => Vec::new(),
    }
}

/// Writes the lock for the client the engine popped and answers it
/// ([`answer_grant`]); `event` announces it ([`Event::HandOver`] when the
/// key still holds the hold its owner just released).
fn hand_over<H: Host>(
    host: &mut H,
    key: &mut H::Key,
    name: &LockName,
    grant: Grant<H::Handle>,
    now: u64,
    event: Event,
) {
    let Grant {
        id,
        waiter,
        end_previous,
        until,
        then,
    } = grant;
    if end_previous {
        // The lease ended at its expiry; Redis would expire the key only a
        // millisecond later (once now > expiry). Free it as Redis would.
        host.remove(key, Removal::Expired);
    }
    let hold = Hold {
        count: 1,
        fence: host.issue_fence(now),
        expires_at: until,
    };
    let write = Write::One {
        owner: &waiter.owner,
        hold,
        lease: Lease::Moved,
    };
    host.write(key, write, event);
    answer_grant(host, name, id, waiter, hold, true);
    arm(host, then);
}

/// Answers a waiter granted `hold` (a fresh one, or its owner's hold
/// reentered) once it is stored: it no longer waits, its grant is in
/// flight until its reply is out (see [`client_left`]).
fn answer_grant<H: Host>(
    host: &mut H,
    name: &LockName,
    id: u64,
    waiter: Waiter<H::Handle>,
    hold: Hold,
    fresh: bool,
) {
    let Waiter { owner, handle, .. } = waiter;
    stats::WAITING.add(-1);
    if fresh {
        stats::ACQUIRED.incr();
        stats::HANDOFFS.incr();
        host.began(id, &handle, name, &owner, hold.fence);
    } else {
        stats::REENTERED.incr();
    }
    let in_flight = InFlight {
        name: name.clone(),
        owner,
        fence: hold.fence,
    };
    host.engine(|e| e.granted(id, in_flight));
    host.reply_granted(id, handle, name, hold.fence, hold.expires_at);
}

/// Takes back a grant whose client never got the reply: the grantee's hold
/// ends if it is still exactly that grant — same owner and fence, count 1
/// (live or not: a grant whose lease ended meanwhile goes as well) — and
/// the queue is served. A hold the same owner reentered meanwhile (from
/// another connection) is in use, and stays; other holders keep theirs.
fn revoke<H: Host>(host: &mut H, grant: &InFlight) {
    let mut key = host.open_name(&grant.name, false);
    let revoked = match host.read(&mut key, Read::Mine(&grant.owner)) {
        Ok(Stored::One { hold, mine }) => {
            let revoked = lock::revocable(mine.then_some(hold), grant.fence);
            if revoked {
                host.remove(&mut key, Removal::Deleted);
            }
            revoked
        }
        Ok(Stored::Listed(mut holds)) => {
            let now = host.key_now(&key);
            let revoked = holds.revocable(&grant.owner, grant.fence, now)
                && holds.release(&grant.owner, true, now).is_ok();
            let event = if revoked {
                holds.drop_ended(now);
                Event::Revoked
            } else {
                Event::Release
            };
            host.write(&mut key, Write::Listed(holds), event);
            revoked
        }
        Ok(Stored::Free) | Err(_) => false,
    };
    if revoked {
        drop(key);
        serve(host, &grant.name, false);
    }
}

/// Puts back the lease of a lock whose TTL another command changed, or
/// deletes it if its lease has ended (no lock lives forever).
fn fix_ttl<H: Host>(host: &mut H, name: &LockName) {
    let mut key = host.open_name(name, false);
    let Some(lease) = host.stored_lease(&key) else {
        return;
    };
    let now = host.key_now(&key);
    let expiry = host.expires_at(&key);
    match lock::ttl_fix(lease, expiry, now) {
        // A TTL shorter than the lease ends the hold then, as a lease end
        // does: waiters are checked at that TTL, not at the lease end, nor
        // whenever Redis's expiry cycle happens to find the key.
        TtlFix::Keep => {
            if let Some(at) = expiry {
                // Listed holds that change later must not outlive it: their
                // stored leases end there too.
                if let Ok(Stored::Listed(mut holds)) = host.read(&mut key, Read::AsStored) {
                    holds.cap_leases(at);
                    host.write(&mut key, Write::Listed(holds), Event::SharesEnded);
                }
                let timer = host.engine(|e| e.lease_moved(name, at, now));
                arm(host, timer);
            }
        }
        TtlFix::Restore(at) => {
            host.restore_expiry(&mut key, at);
            // Waiters check at the lease end, not at the TTL someone set.
            let timer = host.engine(|e| e.lease_moved(name, at, now));
            arm(host, timer);
        }
        TtlFix::Delete => {
            host.remove(&mut key, Removal::Deleted);
            drop(key);
            serve(host, name, false);
        }
    }
}

fn arm<H: Host>(host: &mut H, timer: Option<Timer>) {
    if let Some(timer) = timer {
        host.arm_lease_check(timer);
    }
}

/// Flaws the model checks plant in the sequencing to show they catch them:
/// with the `planted-flaw` feature (which only the model's tests turn on)
/// and a switch set. Without the feature each check is a constant `false`.
pub mod planted {
    #[cfg(feature = "planted-flaw")]
    use std::sync::atomic::{AtomicBool, Ordering};

    /// [`serve`](super::serve) hands the lock to an exclusive request at
    /// the head as if listed holds were not there: a writer granted beside
    /// the readers that still hold it.
    #[cfg(feature = "planted-flaw")]
    pub static HAND_OVER_PAST_SHARED: AtomicBool = AtomicBool::new(false);

    /// [`acquire`](super::acquire) ignores the clients waiting: a request
    /// the lock admits is granted at once, ahead of them.
    #[cfg(feature = "planted-flaw")]
    pub static BARGE_PAST_WAITERS: AtomicBool = AtomicBool::new(false);

    #[inline(always)]
    pub(crate) fn hands_over_past_shared() -> bool {
        #[cfg(feature = "planted-flaw")]
        {
            HAND_OVER_PAST_SHARED.load(Ordering::Relaxed)
        }
        #[cfg(not(feature = "planted-flaw"))]
        {
            false
        }
    }

    /// A request for several locks is served when it is first in line on
    /// the lock being served, not on all of them: the arrival order across
    /// their queues taken out, so it takes a lock an older request waits
    /// for.
    #[cfg(feature = "planted-flaw")]
    pub static IGNORE_ARRIVAL_ORDER: AtomicBool = AtomicBool::new(false);

    #[inline(always)]
    pub(crate) fn ignores_arrival_order() -> bool {
        #[cfg(feature = "planted-flaw")]
        {
            IGNORE_ARRIVAL_ORDER.load(Ordering::Relaxed)
        }
        #[cfg(not(feature = "planted-flaw"))]
        {
            false
        }
    }

    #[inline(always)]
    pub(crate) fn barges() -> bool {
        #[cfg(feature = "planted-flaw")]
        {
            BARGE_PAST_WAITERS.load(Ordering::Relaxed)
        }
        #[cfg(not(feature = "planted-flaw"))]
        {
            false
        }
    }
}
