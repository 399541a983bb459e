//! Holds of either mode: one exclusive owner, or owners sharing the lock
//! (a read lock, or the permits of a counting semaphore).
//!
//! Pure, time passed in as `now_ms`, like [`crate::lock`], whose rules decide
//! every change here: this file only keeps the holds and shows
//! [`crate::lock`] the view it decides on ([`Holds::seen`], the caller's own
//! live hold), then stores the hold it answers. A lock's holds are a list,
//! oldest first, each with its own count, fence and lease: a shared hold
//! released to zero, or whose lease ends, frees that owner's share only,
//! and the lock is free when its last hold ends. Every decision looks only
//! at the holds still live at `now_ms`; [`Holds::drop_ended`] removes the
//! others when their lease check runs.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::error::LockError;
use crate::lock::{self, ended, Acquire, Barriers, Hold, Seen};

/// How a request (or the lock) is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// One owner, every other request waits.
    Exclusive,
    /// Owners share it. `limit`: at most that many owners at once (a
    /// semaphore's permits); `None`: any number (a read lock).
    Shared { limit: Option<u32> },
}

impl Mode {
    /// A read lock: shared by any number of owners.
    pub const READ: Mode = Mode::Shared { limit: None };

    /// How many owners may hold the lock at once in this mode.
    pub fn capacity(self) -> u64 {
        match self {
            Mode::Exclusive => 1,
            Mode::Shared { limit: None } => u64::MAX,
            Mode::Shared { limit: Some(n) } => u64::from(n),
        }
    }
}

/// One owner's hold, and when it began (for `held` in `LOCK.INFO` and the
/// hold-time histogram).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Holder {
    pub owner: Vec<u8>,
    pub hold: Hold,
    /// Unix ms of the grant that began this hold.
    pub since: u64,
    /// The semaphore's permits this hold is worth (`PERMITS k`; 1 for
    /// every other hold). Kept across reentries.
    pub permits: u32,
}

/// A lock's holds: its mode while held, and the holders, oldest first.
/// Empty means free; the mode of a free lock means nothing.
///
/// Each owner's hold is found by its owner, and the earliest and latest
/// leases by an ordered set, so a change to one owner's hold costs the same
/// however many share the lock (only listing them grows with them). What
/// changed is noted ([`Holds::take_changes`]): the glue sends that change to
/// replicas and the AOF, not the whole holder list.
#[derive(Debug, Clone)]
pub struct Holds {
    mode: Mode,
    /// Every stored hold by the order it began (its place), oldest first.
    holders: BTreeMap<u64, Holder>,
    /// Each owner's place in `holders`.
    by_owner: HashMap<Vec<u8>, u64>,
    /// (lease end, place) of every hold: the earliest and latest lease in
    /// O(log n), and the ended holds found from the front.
    by_end: BTreeSet<(u64, u64)>,
    /// The place the next hold takes.
    next: u64,
    /// The permits of every stored hold, summed (kept as holds come and
    /// go, so admitting a request costs the same however many share).
    permits: u64,
    /// What changed since [`Holds::take_changes`] last asked.
    changes: Changes,
}

/// What changed in a lock's holds: whose hold (to replicate that owner's
/// hold alone), and which holds began, ended or had their fence raised
/// (for the hold-time record).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// Owners whose hold began, changed or ended, each once, in order.
    pub owners: Vec<Vec<u8>>,
    /// Fences of the holds that began.
    pub began: Vec<u64>,
    /// (fence, lease end) of the holds that ended.
    pub ended: Vec<(u64, u64)>,
    /// (from, to) of fences raised by `LOCK.FENCE` (the hold goes on).
    pub raised: Vec<(u64, u64)>,
}

impl Changes {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.owners.is_empty()
    }

    fn touched(&mut self, owner: &[u8]) {
        // A change touches one owner, a grant a few: the list stays short.
        if !self.owners.iter().any(|o| o == owner) {
            self.owners.push(owner.to_vec());
        }
    }
}

// Holds are equal when they hold the same, in the same order: places and
// the change log are bookkeeping (the model checker keeps holds in states).
impl PartialEq for Holds {
    fn eq(&self, other: &Self) -> bool {
        self.mode == other.mode && self.holders.values().eq(other.holders.values())
    }
}

impl Eq for Holds {}

impl std::hash::Hash for Holds {
    fn hash<S: std::hash::Hasher>(&self, state: &mut S) {
        self.mode.hash(state);
        for holder in self.holders.values() {
            holder.hash(state);
        }
    }
}

impl Default for Holds {
    fn default() -> Holds {
        Holds::free()
    }
}

impl Holds {
    /// A free lock.
    pub fn free() -> Holds {
        Holds {
            mode: Mode::Exclusive,
            holders: BTreeMap::new(),
            by_owner: HashMap::new(),
            by_end: BTreeSet::new(),
            next: 0,
            permits: 0,
            changes: Changes::default(),
        }
    }

    /// Holds as stored (loaded from RDB, a replica's `LOCK.APPLY`), oldest
    /// first: the caller has checked them. Nothing is noted as changed.
    pub fn from_parts(mode: Mode, holders: Vec<Holder>) -> Holds {
        let mut holds = Holds::free();
        holds.mode = mode;
        for holder in holders {
            holds.insert(holder);
        }
        holds
    }

    /// The mode the lock is held in (meaningless when free).
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// How many holds are stored, live or not.
    pub fn len(&self) -> usize {
        self.holders.len()
    }

    /// Whether no hold is stored.
    pub fn is_empty(&self) -> bool {
        self.holders.is_empty()
    }

    /// Every stored hold, live or not, oldest first.
    pub fn holders(&self) -> impl DoubleEndedIterator<Item = &Holder> + ExactSizeIterator {
        self.holders.values()
    }

    /// The one stored hold, if there is exactly one.
    pub fn only(&self) -> Option<&Holder> {
        match self.holders.len() {
            1 => self.holders.values().next(),
            _ => None,
        }
    }

    /// `owner`'s stored hold, live or not.
    pub fn get(&self, owner: &[u8]) -> Option<&Holder> {
        self.by_owner.get(owner).and_then(|p| self.holders.get(p))
    }

    /// The holds still running at `now_ms`, oldest first (O(holders): for
    /// listing them).
    pub fn live(&self, now_ms: u64) -> impl Iterator<Item = &Holder> {
        self.holders
            .values()
            .filter(move |h| !ended(h.hold.expires_at, now_ms))
    }

    /// Whether no hold runs at `now_ms`.
    pub fn is_free(&self, now_ms: u64) -> bool {
        self.latest_lease().is_none_or(|at| ended(at, now_ms))
    }

    /// The live hold of `owner`, if any.
    pub fn of(&self, owner: &[u8], now_ms: u64) -> Option<&Holder> {
        self.get(owner)
            .filter(|h| !ended(h.hold.expires_at, now_ms))
    }

    /// The key's TTL: the latest lease among the stored holds (`None`: free).
    pub fn latest_lease(&self) -> Option<u64> {
        self.by_end.last().map(|&(at, _)| at)
    }

    /// The earliest lease among the stored holds: when the next check is due.
    pub fn earliest_lease(&self) -> Option<u64> {
        self.by_end.first().map(|&(at, _)| at)
    }

    /// The earliest lease among the holds still running at `now_ms`.
    pub fn earliest_live_lease(&self, now_ms: u64) -> Option<u64> {
        self.by_end.range((now_ms, 0)..).next().map(|&(at, _)| at)
    }

    /// The highest fence of the live holds (what `LOCK.INFO` shows).
    pub fn highest_fence(&self, now_ms: u64) -> Option<u64> {
        self.live(now_ms).map(|h| h.hold.fence).max()
    }

    /// How many holds run at `now_ms`: the stored ones less the ended ones
    /// not yet dropped (found from the front of the lease order).
    fn live_count(&self, now_ms: u64) -> u64 {
        let ended = self.by_end.range(..(now_ms, 0)).count();
        (self.holders.len() - ended) as u64
    }

    /// Removes the holds whose lease has ended at `now_ms`; returns them.
    pub fn drop_ended(&mut self, now_ms: u64) -> Vec<Holder> {
        let mut gone = Vec::new();
        while let Some(&(at, place)) = self.by_end.first() {
            if !ended(at, now_ms) {
                break;
            }
            if let Some(holder) = self.remove(place) {
                gone.push(holder);
            }
        }
        gone
    }

    /// What changed since the last call, and forgets it.
    pub fn take_changes(&mut self) -> Changes {
        std::mem::take(&mut self.changes)
    }

    /// Whether anything changed since [`Holds::take_changes`] last asked.
    pub fn changed(&self) -> bool {
        !self.changes.is_empty()
    }

    /// Whether a request in `mode` could be granted now, queue aside: the
    /// lock is free, or held shared in the same mode by fewer owners than
    /// its limit. A different shared limit is refused with an error by
    /// [`check_limit`](Holds::check_limit) before this is asked.
    pub fn admits(&self, mode: Mode, now_ms: u64) -> bool {
        self.admits_permits(mode, 1, now_ms)
    }

    /// [`admits`](Holds::admits) for a request worth `permits`: while the
    /// permits of the live holds, this one included, stay within the
    /// limit.
    pub fn admits_permits(&self, mode: Mode, permits: u32, now_ms: u64) -> bool {
        let sharing = self.live_count(now_ms);
        match mode {
            _ if sharing == 0 => u64::from(permits) <= mode.capacity(),
            Mode::Exclusive => false,
            Mode::Shared { .. } => {
                self.mode == mode
                    && self.live_permits(now_ms).saturating_add(u64::from(permits))
                        <= mode.capacity()
            }
        }
    }

    /// The permits of the holds running at `now_ms`: the stored ones less
    /// those of the ended ones not yet dropped.
    pub fn live_permits(&self, now_ms: u64) -> u64 {
        let ended: u64 = self
            .by_end
            .range(..(now_ms, 0))
            .filter_map(|(_, place)| self.holders.get(place))
            .map(|h| u64::from(h.permits))
            .sum();
        self.permits.saturating_sub(ended)
    }

    /// A shared request's limit must be the held lock's, and that of a
    /// shared request already waiting (`waiting`), while either exists.
    pub fn check_limit(
        &self,
        mode: Mode,
        waiting: Option<Mode>,
        now_ms: u64,
    ) -> Result<(), LockError> {
        let Mode::Shared { .. } = mode else {
            return Ok(());
        };
        let held = (!self.is_free(now_ms) && self.mode != Mode::Exclusive).then_some(self.mode);
        match held.or(waiting) {
            Some(other) if other != mode => Err(LockError::LimitMismatch),
            _ => Ok(()),
        }
    }

    /// `LOCK.ACQUIRE` in `mode`: reenter the caller's own hold, or begin a
    /// new one if the lock admits it and nobody waits ahead. `waiting`: the
    /// shared mode of a request already waiting, if any. `issue_fence` is
    /// called only for a fresh hold. Applies the decision to `self`.
    #[allow(clippy::too_many_arguments)]
    pub fn acquire(
        &mut self,
        owner: &[u8],
        mode: Mode,
        ttl_ms: u64,
        now_ms: u64,
        barriers: Barriers,
        waiting: Option<Mode>,
        issue_fence: impl FnOnce() -> u64,
    ) -> Result<Acquire, LockError> {
        self.check_limit(mode, waiting, now_ms)?;
        self.apply(owner, mode, ttl_ms, now_ms, barriers, issue_fence)
    }

    /// [`acquire`](Holds::acquire) of a hold worth `permits`.
    #[allow(clippy::too_many_arguments)]
    pub fn acquire_permits(
        &mut self,
        owner: &[u8],
        (mode, permits): (Mode, u32),
        ttl_ms: u64,
        now_ms: u64,
        barriers: Barriers,
        waiting: Option<Mode>,
        issue_fence: impl FnOnce() -> u64,
    ) -> Result<Acquire, LockError> {
        self.check_limit(mode, waiting, now_ms)?;
        self.apply_permits(
            owner,
            (mode, permits),
            ttl_ms,
            now_ms,
            barriers,
            issue_fence,
        )
    }

    /// [`lock::acquire`] decided over these holds, and applied: a fresh
    /// hold begun, a reentry stored. The limit is not checked (see
    /// [`Holds::acquire`]); the queue's serve asks this for each request
    /// it reaches.
    pub fn apply(
        &mut self,
        owner: &[u8],
        mode: Mode,
        ttl_ms: u64,
        now_ms: u64,
        barriers: Barriers,
        issue_fence: impl FnOnce() -> u64,
    ) -> Result<Acquire, LockError> {
        self.apply_permits(owner, (mode, 1), ttl_ms, now_ms, barriers, issue_fence)
    }

    /// [`apply`](Holds::apply) of a hold worth `permits`. A reentry asking
    /// for other permits than its hold has is refused.
    pub fn apply_permits(
        &mut self,
        owner: &[u8],
        (mode, permits): (Mode, u32),
        ttl_ms: u64,
        now_ms: u64,
        barriers: Barriers,
        issue_fence: impl FnOnce() -> u64,
    ) -> Result<Acquire, LockError> {
        let seen = self.seen_permits(owner, mode, permits, now_ms)?;
        let decision = lock::acquire(seen, ttl_ms, now_ms, barriers, issue_fence)?;
        match decision {
            Acquire::Fresh(hold) => {
                self.begin_permits(owner, (mode, permits), ttl_ms, now_ms, hold.fence);
            }
            Acquire::Reentered(hold) => {
                if let Some(place) = self.live_place(owner, now_ms) {
                    self.change(place, |stored| {
                        *stored = hold;
                        Ok(())
                    })?;
                }
            }
            Acquire::Busy => {}
        }
        Ok(decision)
    }

    /// The lock as a request of `owner` in `mode` sees it, for
    /// [`lock::acquire`].
    pub fn seen(&self, owner: &[u8], mode: Mode, now_ms: u64) -> Seen {
        let own = self.of(owner, now_ms).map(|h| h.hold);
        Seen {
            own,
            admits: self.admits(mode, now_ms),
            upgrade: own.is_some() && mode == Mode::Exclusive && self.mode != Mode::Exclusive,
        }
    }

    /// [`seen`](Holds::seen) by a request worth `permits`; a shared hold of
    /// the owner's worth other permits answers the permits error (its
    /// reentry keeps the permits it was granted with).
    pub fn seen_permits(
        &self,
        owner: &[u8],
        mode: Mode,
        permits: u32,
        now_ms: u64,
    ) -> Result<Seen, LockError> {
        let own = self.of(owner, now_ms);
        let shared = self.mode != Mode::Exclusive && mode != Mode::Exclusive;
        if own.is_some_and(|h| shared && h.permits != permits) {
            return Err(LockError::PermitsMismatch);
        }
        let own = own.map(|h| h.hold);
        Ok(Seen {
            own,
            admits: self.admits_permits(mode, permits, now_ms),
            upgrade: own.is_some() && mode == Mode::Exclusive && self.mode != Mode::Exclusive,
        })
    }

    /// Begins a fresh hold for `owner` (a grant: the caller checked that the
    /// lock admits it). Ended holds are dropped first, so a lock whose last
    /// lease ended takes the new mode.
    pub fn begin(
        &mut self,
        owner: &[u8],
        mode: Mode,
        ttl_ms: u64,
        now_ms: u64,
        fence: u64,
    ) -> Hold {
        self.begin_permits(owner, (mode, 1), ttl_ms, now_ms, fence)
    }

    /// [`begin`](Holds::begin) of a hold worth `permits`.
    pub fn begin_permits(
        &mut self,
        owner: &[u8],
        (mode, permits): (Mode, u32),
        ttl_ms: u64,
        now_ms: u64,
        fence: u64,
    ) -> Hold {
        self.drop_ended(now_ms);
        if self.holders.is_empty() {
            self.mode = mode;
        }
        let hold = Hold {
            count: 1,
            fence,
            expires_at: now_ms.saturating_add(ttl_ms),
        };
        if let Some(&place) = self.by_owner.get(owner) {
            // Not reached: a live hold of the owner is reentered instead.
            self.remove(place);
        }
        self.insert(Holder {
            owner: owner.to_vec(),
            hold,
            since: now_ms,
            permits,
        });
        self.changes.began.push(fence);
        self.changes.touched(owner);
        hold
    }

    /// `LOCK.REENTER`: the caller's count + 1, lease reset if `ttl_ms`.
    pub fn reenter(
        &mut self,
        owner: &[u8],
        ttl_ms: Option<u64>,
        now_ms: u64,
    ) -> Result<Hold, LockError> {
        self.decide(owner, now_ms, |own| {
            lock::reenter(own, ttl_ms, now_ms).map(Some)
        })?
        .ok_or(LockError::NotOwner)
    }

    /// `LOCK.RELEASE`: the caller's count − 1 (to 0 with `all`). At 0 the
    /// caller's hold ends (the lock is free if it was the last). Returns the
    /// remaining count.
    pub fn release(&mut self, owner: &[u8], all: bool, now_ms: u64) -> Result<u64, LockError> {
        let left = self.decide(owner, now_ms, |own| lock::release(own, all))?;
        Ok(left.map_or(0, |hold| hold.count))
    }

    /// `LOCK.RENEW`: the caller's lease becomes `ttl_ms` from now.
    pub fn renew(&mut self, owner: &[u8], ttl_ms: u64, now_ms: u64) -> Result<Hold, LockError> {
        self.decide(owner, now_ms, |own| {
            lock::renew(own, ttl_ms, now_ms).map(Some)
        })?
        .ok_or(LockError::NotOwner)
    }

    /// `LOCK.FENCE`: the caller's fence becomes `max(fence, min_fence)`.
    pub fn fence(&mut self, owner: &[u8], min_fence: u64, now_ms: u64) -> Result<Hold, LockError> {
        self.decide(owner, now_ms, |own| lock::fence(own, min_fence).map(Some))?
            .ok_or(LockError::NotOwner)
    }

    /// Whether a grant to `owner` with `fence` may be taken back
    /// ([`lock::revocable`]).
    pub fn revocable(&self, owner: &[u8], fence: u64, now_ms: u64) -> bool {
        lock::revocable(self.of(owner, now_ms).map(|h| h.hold), fence)
    }

    /// Decides a change to `owner`'s live hold with one of [`crate::lock`]'s
    /// rules, and stores the hold it answers (`None`: the hold ends). A
    /// raised fence is noted for the hold-time record.
    pub fn decide(
        &mut self,
        owner: &[u8],
        now_ms: u64,
        rule: impl FnOnce(Option<Hold>) -> Result<Option<Hold>, LockError>,
    ) -> Result<Option<Hold>, LockError> {
        let place = self.live_place(owner, now_ms);
        let own = place.and_then(|p| self.holders.get(&p)).map(|h| h.hold);
        let after = rule(own)?;
        let (place, before) = place.zip(own).ok_or(LockError::NotOwner)?;
        match after {
            Some(hold) => {
                if hold.fence != before.fence {
                    self.changes.raised.push((before.fence, hold.fence));
                }
                self.change(place, |stored| {
                    *stored = hold;
                    Ok(())
                })
                .map(Some)
            }
            None => {
                self.remove(place);
                Ok(None)
            }
        }
    }

    /// Ends every hold at `at` at the latest (a TTL someone set shorter
    /// than the leases: every hold ends then). O(holds): for that rare event.
    pub fn cap_leases(&mut self, at: u64) {
        let later: Vec<u64> = self
            .by_end
            .range((at.saturating_add(1), 0)..)
            .map(|&(_, place)| place)
            .collect();
        for place in later {
            let _ = self.change(place, |hold| {
                hold.expires_at = at;
                Ok(())
            });
        }
    }

    /// Puts one owner's hold as another server decided it (a replica's
    /// `LOCK.APPLY` of that share): replaces the owner's hold, or adds it
    /// as the newest. The lock takes `mode` if it was free.
    pub fn put(&mut self, mode: Mode, holder: Holder) {
        if self.holders.is_empty() {
            self.mode = mode;
        }
        match self.by_owner.get(&holder.owner).copied() {
            Some(place) => {
                let Holder {
                    hold,
                    since,
                    permits,
                    ..
                } = holder;
                let _ = self.change(place, |stored| {
                    *stored = hold;
                    Ok(())
                });
                if let Some(stored) = self.holders.get_mut(&place) {
                    stored.since = since;
                    self.permits = self.permits - u64::from(stored.permits) + u64::from(permits);
                    stored.permits = permits;
                }
            }
            None => {
                self.changes.touched(&holder.owner);
                self.insert(holder);
            }
        }
    }

    /// Ends `owner`'s hold, whatever its count (another server decided it).
    pub fn end(&mut self, owner: &[u8]) -> Option<Holder> {
        let place = *self.by_owner.get(owner)?;
        self.remove(place)
    }

    /// The place of `owner`'s live hold.
    fn live_place(&self, owner: &[u8], now_ms: u64) -> Option<u64> {
        let place = *self.by_owner.get(owner)?;
        let holder = self.holders.get(&place)?;
        (!ended(holder.hold.expires_at, now_ms)).then_some(place)
    }

    /// Changes the hold at `place` with `f` (keeping the lease order), and
    /// notes its owner as changed. The hold after, or `f`'s error (then
    /// nothing changed).
    fn change(
        &mut self,
        place: u64,
        f: impl FnOnce(&mut Hold) -> Result<(), LockError>,
    ) -> Result<Hold, LockError> {
        let holder = self.holders.get_mut(&place).ok_or(LockError::NotOwner)?;
        let mut hold = holder.hold;
        f(&mut hold)?;
        if hold.expires_at != holder.hold.expires_at {
            self.by_end.remove(&(holder.hold.expires_at, place));
            self.by_end.insert((hold.expires_at, place));
        }
        holder.hold = hold;
        self.changes.touched(&holder.owner);
        Ok(hold)
    }

    /// Adds `holder` as the newest hold (its owner holds nothing yet).
    fn insert(&mut self, holder: Holder) {
        let place = self.next;
        self.next += 1;
        self.by_owner.insert(holder.owner.clone(), place);
        self.by_end.insert((holder.hold.expires_at, place));
        self.permits += u64::from(holder.permits);
        self.holders.insert(place, holder);
    }

    /// Removes the hold at `place`, noting its end.
    fn remove(&mut self, place: u64) -> Option<Holder> {
        let holder = self.holders.remove(&place)?;
        self.permits -= u64::from(holder.permits);
        self.by_owner.remove(&holder.owner);
        self.by_end.remove(&(holder.hold.expires_at, place));
        self.changes
            .ended
            .push((holder.hold.fence, holder.hold.expires_at));
        self.changes.touched(&holder.owner);
        Some(holder)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) const NOW: u64 = 1_700_000_000_000;
    const SEM3: Mode = Mode::Shared { limit: Some(3) };

    /// Holds of `mode` by the given owners, each count 1 with the lease end
    /// given, fences 1, 2, 3… in order (the queue rule's tests use it too).
    pub(crate) fn held(mode: Mode, owners: &[(&str, u64)]) -> Holds {
        let holders = owners
            .iter()
            .zip(1..)
            .map(|(&(owner, until), fence)| Holder {
                owner: owner.as_bytes().to_vec(),
                hold: Hold {
                    count: 1,
                    fence,
                    expires_at: until,
                },
                since: NOW - 100,
                permits: 1,
            })
            .collect();
        Holds::from_parts(mode, holders)
    }

    /// The live holders' names, oldest first (the queue rule's tests use it too).
    pub(crate) fn owners(holds: &Holds, now: u64) -> Vec<String> {
        holds
            .live(now)
            .map(|h| String::from_utf8_lossy(&h.owner).into_owned())
            .collect()
    }

    #[test]
    fn who_may_be_granted_by_mode() {
        let later = NOW + 1_000;
        // (the lock, the request's mode, granted now?)
        let cases = [
            (Holds::free(), Mode::Exclusive, true),
            (Holds::free(), Mode::READ, true),
            (Holds::free(), SEM3, true),
            (held(Mode::Exclusive, &[("w", later)]), Mode::READ, false),
            (
                held(Mode::Exclusive, &[("w", later)]),
                Mode::Exclusive,
                false,
            ),
            (held(Mode::Exclusive, &[("w", NOW - 1)]), Mode::READ, true), // lease ended
            (
                held(Mode::READ, &[("r1", later), ("r2", later)]),
                Mode::READ,
                true,
            ),
            (held(Mode::READ, &[("r1", later)]), Mode::Exclusive, false),
            (held(Mode::READ, &[("r1", NOW - 1)]), Mode::Exclusive, true),
            (held(SEM3, &[("a", later), ("b", later)]), SEM3, true),
            (
                held(SEM3, &[("a", later), ("b", later), ("c", later)]),
                SEM3,
                false,
            ),
            (
                held(SEM3, &[("a", later), ("b", later), ("c", NOW)]),
                SEM3,
                false,
            ), // NOW: still running
            (
                held(SEM3, &[("a", later), ("b", later), ("c", NOW - 1)]),
                SEM3,
                true,
            ),
        ];
        for (holds, mode, want) in cases {
            assert_eq!(holds.admits(mode, NOW), want, "{holds:?} {mode:?}");
        }
    }

    #[test]
    fn readers_share_and_each_gets_its_own_fence() {
        let mut holds = Holds::free();
        let mut next = 10;
        let mut fence = || {
            next += 1;
            next
        };
        for reader in ["r1", "r2", "r3"] {
            let got = holds.acquire(
                reader.as_bytes(),
                Mode::READ,
                500,
                NOW,
                Barriers::NONE,
                None,
                &mut fence,
            );
            assert!(matches!(got, Ok(Acquire::Fresh(_))), "{reader}: {got:?}");
        }
        let fences: Vec<u64> = holds.live(NOW).map(|h| h.hold.fence).collect();
        assert_eq!(fences, [11, 12, 13]);
        assert_eq!(holds.highest_fence(NOW), Some(13));
        let writer = holds.acquire(
            b"w",
            Mode::Exclusive,
            500,
            NOW,
            Barriers::NONE,
            None,
            &mut fence,
        );
        assert_eq!(writer, Ok(Acquire::Busy));
    }

    #[test]
    fn a_semaphore_admits_up_to_its_limit_and_frees_one_permit_at_a_time() {
        let mut holds = Holds::free();
        let mut fence = 0;
        let mut grant = |holds: &mut Holds, who: &str| {
            holds.acquire(who.as_bytes(), SEM3, 100, NOW, Barriers::NONE, None, || {
                fence += 1;
                fence
            })
        };
        for who in ["a", "b", "c"] {
            assert!(matches!(grant(&mut holds, who), Ok(Acquire::Fresh(_))));
        }
        assert_eq!(grant(&mut holds, "d"), Ok(Acquire::Busy));
        assert_eq!(holds.release(b"b", false, NOW), Ok(0));
        assert_eq!(owners(&holds, NOW), ["a", "c"]);
        assert!(matches!(grant(&mut holds, "d"), Ok(Acquire::Fresh(h)) if h.fence == 4));
        assert_eq!(owners(&holds, NOW), ["a", "c", "d"]);
    }

    #[test]
    fn reentry_and_mixed_modes() {
        let later = NOW + 1_000;
        // (the lock, the caller "x"'s request, the outcome)
        let reentered = |count, until| {
            Ok(Acquire::Reentered(Hold {
                count,
                fence: 1,
                expires_at: until,
            }))
        };
        let cases = [
            // A writer may read: it reenters its exclusive hold.
            (
                held(Mode::Exclusive, &[("x", later)]),
                Mode::READ,
                reentered(2, NOW + 50),
            ),
            (
                held(Mode::Exclusive, &[("x", later)]),
                Mode::Exclusive,
                reentered(2, NOW + 50),
            ),
            (
                held(Mode::READ, &[("x", later)]),
                Mode::READ,
                reentered(2, NOW + 50),
            ),
            // A reader may not upgrade.
            (
                held(Mode::READ, &[("x", later)]),
                Mode::Exclusive,
                Err(LockError::Upgrade),
            ),
            (
                held(SEM3, &[("y", later), ("x", later)]),
                Mode::Exclusive,
                Err(LockError::Upgrade),
            ),
            // A different limit while shared.
            (
                held(SEM3, &[("y", later)]),
                Mode::READ,
                Err(LockError::LimitMismatch),
            ),
            (
                held(Mode::READ, &[("y", later)]),
                SEM3,
                Err(LockError::LimitMismatch),
            ),
            (
                held(SEM3, &[("x", later)]),
                Mode::Shared { limit: Some(4) },
                Err(LockError::LimitMismatch),
            ),
            // Free again: any limit.
            (
                held(SEM3, &[("y", NOW - 1)]),
                Mode::READ,
                Ok(Acquire::Fresh(Hold {
                    count: 1,
                    fence: 7,
                    expires_at: NOW + 50,
                })),
            ),
        ];
        for (mut holds, mode, want) in cases {
            let before = holds.clone();
            let got = holds.acquire(b"x", mode, 50, NOW, Barriers::NONE, None, || 7);
            assert_eq!(got, want, "{before:?} {mode:?}");
            if got.is_err() {
                assert_eq!(holds, before, "an error changes nothing");
            }
        }
    }

    #[test]
    fn barriers_and_a_waiting_limit() {
        let later = NOW + 1_000;
        let waiters = Barriers {
            waiters: true,
            ..Barriers::NONE
        };
        let quarantined = Barriers {
            quarantined: true,
            ..Barriers::NONE
        };
        // (the lock, barriers, the mode of a waiting shared request, the
        // caller "x"'s request, the outcome)
        let cases = [
            // Nobody overtakes a waiter, even where the lock admits it.
            (
                held(Mode::READ, &[("r", later)]),
                waiters,
                None,
                Mode::READ,
                Ok(Acquire::Busy),
            ),
            (Holds::free(), waiters, None, Mode::READ, Ok(Acquire::Busy)),
            // The holder reenters past waiters, not in quarantine.
            (
                held(Mode::READ, &[("x", later)]),
                waiters,
                None,
                Mode::READ,
                Ok(Acquire::Reentered(Hold {
                    count: 2,
                    fence: 1,
                    expires_at: NOW + 50,
                })),
            ),
            (
                held(Mode::READ, &[("x", later)]),
                quarantined,
                None,
                Mode::READ,
                Ok(Acquire::Busy),
            ),
            // A waiting shared request fixes the limit even for a free lock.
            (
                Holds::free(),
                waiters,
                Some(SEM3),
                Mode::READ,
                Err(LockError::LimitMismatch),
            ),
            (Holds::free(), waiters, Some(SEM3), SEM3, Ok(Acquire::Busy)),
        ];
        for (mut holds, barriers, waiting, mode, want) in cases {
            let got = holds.acquire(b"x", mode, 50, NOW, barriers, waiting, || 7);
            assert_eq!(got, want, "{holds:?} {barriers:?} {waiting:?} {mode:?}");
        }
    }

    #[test]
    fn each_hold_ends_on_its_own_and_the_key_ttl_is_the_latest_lease() {
        let mut holds = held(
            Mode::READ,
            &[("a", NOW + 10), ("b", NOW + 30), ("c", NOW + 20)],
        );
        assert_eq!(holds.latest_lease(), Some(NOW + 30));
        assert_eq!(holds.earliest_lease(), Some(NOW + 10));
        let gone = holds.drop_ended(NOW + 11);
        assert_eq!(gone.len(), 1);
        assert_eq!(owners(&holds, NOW + 11), ["b", "c"]);
        assert_eq!(holds.earliest_lease(), Some(NOW + 20));
        assert_eq!(
            holds.renew(b"c", 100, NOW + 15),
            Ok(Hold {
                count: 1,
                fence: 3,
                expires_at: NOW + 115
            })
        );
        assert_eq!(holds.latest_lease(), Some(NOW + 115));
        assert_eq!(holds.renew(b"a", 100, NOW + 15), Err(LockError::NotOwner));
        holds.drop_ended(NOW + 31);
        assert_eq!(owners(&holds, NOW + 31), ["c"]);
        assert_eq!(holds.release(b"c", true, NOW + 31), Ok(0));
        assert!(holds.is_free(NOW + 31));
        assert_eq!(holds.latest_lease(), None);
    }

    #[test]
    fn per_owner_commands_touch_only_the_callers_hold() {
        let later = NOW + 1_000;
        let mut holds = held(SEM3, &[("a", later), ("b", later)]);
        assert_eq!(holds.reenter(b"b", Some(5), NOW).map(|h| h.count), Ok(2));
        assert_eq!(holds.fence(b"a", 99, NOW).map(|h| h.fence), Ok(99));
        assert_eq!(holds.release(b"b", false, NOW), Ok(1));
        assert_eq!(holds.release(b"z", false, NOW), Err(LockError::NotOwner));
        assert_eq!(holds.reenter(b"z", None, NOW), Err(LockError::NotOwner));
        let counts: Vec<(u64, u64)> = holds
            .live(NOW)
            .map(|h| (h.hold.count, h.hold.fence))
            .collect();
        assert_eq!(counts, [(1, 99), (1, 2)]);
        // A lease ended is no hold.
        assert_eq!(holds.fence(b"b", 1, NOW + 6), Err(LockError::NotOwner));
    }

    #[test]
    fn each_change_is_noted_for_its_owner_alone() {
        let later = NOW + 1_000;
        let mut holds = held(Mode::READ, &[("a", later), ("b", NOW + 10), ("c", later)]);
        assert!(!holds.changed(), "holds as stored are no change");
        assert_eq!(
            holds.renew(b"c", 5_000, NOW).map(|h| h.expires_at),
            Ok(NOW + 5_000)
        );
        assert_eq!(holds.latest_lease(), Some(NOW + 5_000));
        assert_eq!(holds.earliest_lease(), Some(NOW + 10));
        let changes = holds.take_changes();
        assert_eq!(changes.owners, [b"c".to_vec()]);
        assert!(changes.began.is_empty() && changes.ended.is_empty());
        // b's lease ends: only b goes, and is noted as ended.
        let gone = holds.drop_ended(NOW + 11);
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].owner, b"b");
        assert_eq!(holds.earliest_lease(), Some(later));
        let changes = holds.take_changes();
        assert_eq!(changes.owners, [b"b".to_vec()]);
        assert_eq!(changes.ended, [(2, NOW + 10)]);
        // A release to zero, a raised fence, a fresh hold.
        assert_eq!(holds.release(b"a", true, NOW), Ok(0));
        assert_eq!(holds.fence(b"c", 50, NOW).map(|h| h.fence), Ok(50));
        holds.begin(b"d", Mode::READ, 100, NOW, 60);
        let changes = holds.take_changes();
        assert_eq!(
            changes.owners,
            [b"a".to_vec(), b"c".to_vec(), b"d".to_vec()]
        );
        assert_eq!(changes.ended, [(1, later)]);
        assert_eq!(changes.raised, [(3, 50)]);
        assert_eq!(changes.began, [60]);
        assert_eq!(owners(&holds, NOW), ["c", "d"], "oldest first");
        assert_eq!(holds.get(b"a"), None);
        // Another server's decision for one owner.
        let mut put = holds.get(b"d").cloned().expect("d");
        put.hold.count = 3;
        holds.put(Mode::READ, put);
        assert_eq!(holds.of(b"d", NOW).map(|h| h.hold.count), Some(3));
        assert_eq!(holds.end(b"c").map(|h| h.hold.fence), Some(50));
        assert_eq!(owners(&holds, NOW), ["d"]);
    }

    #[test]
    fn holds_equal_by_what_they_hold_not_how_they_got_there() {
        let later = NOW + 1_000;
        let mut a = held(Mode::READ, &[("x", later)]);
        a.begin(b"y", Mode::READ, 1_000, NOW, 2);
        a.release(b"y", true, NOW).expect("release");
        assert_eq!(a, held(Mode::READ, &[("x", later)]));
    }

    #[test]
    fn a_lock_whose_last_lease_ended_takes_the_next_holders_mode() {
        let mut holds = held(Mode::READ, &[("r", NOW - 1)]);
        let got = holds.acquire(b"w", Mode::Exclusive, 10, NOW, Barriers::NONE, None, || 5);
        assert!(matches!(got, Ok(Acquire::Fresh(_))));
        assert_eq!(holds.mode(), Mode::Exclusive);
        assert_eq!(holds.holders().len(), 1, "the ended reader was dropped");
    }
}
