//! Holds of either mode: one exclusive owner, or owners sharing the lock
//! (a read lock, or the permits of a counting semaphore).
//!
//! Pure, time passed in as `now_ms`, like [`crate::lock`]. A lock's holds are
//! a list, oldest first, each with its own count, fence and lease: a shared
//! hold released to zero, or whose lease ends, frees that owner's share
//! only, and the lock is free when its last hold ends. Every decision looks
//! only at the holds still live at `now_ms`; [`Holds::drop_ended`] removes the
//! others when their lease check runs.

use crate::error::LockError;
use crate::lock::{ended, Barriers, Hold};

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
}

/// What `LOCK.ACQUIRE` decided for a request of either mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquire {
    /// A new hold with a new fence.
    Fresh(Hold),
    /// The caller already held it: count + 1, lease reset, same fence.
    Reentered(Hold),
    /// It cannot be granted now (or clients wait ahead of the caller).
    Busy,
}

/// A lock's holds: its mode while held, and the holders, oldest first.
/// Empty means free; the mode of a free lock means nothing.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Holds {
    mode: Mode,
    holders: Vec<Holder>,
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
            holders: Vec::new(),
        }
    }

    /// Holds as stored (loaded from RDB, a replica's `LOCK.APPLY`): the
    /// caller has checked them.
    pub fn from_parts(mode: Mode, holders: Vec<Holder>) -> Holds {
        Holds { mode, holders }
    }

    /// The mode the lock is held in (meaningless when free).
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Every stored hold, live or not, oldest first.
    pub fn holders(&self) -> &[Holder] {
        &self.holders
    }

    /// The holds still running at `now_ms`, oldest first.
    pub fn live(&self, now_ms: u64) -> impl Iterator<Item = &Holder> {
        self.holders
            .iter()
            .filter(move |h| !ended(h.hold.expires_at, now_ms))
    }

    /// Whether no hold runs at `now_ms`.
    pub fn is_free(&self, now_ms: u64) -> bool {
        self.live(now_ms).next().is_none()
    }

    /// The live hold of `owner`, if any.
    pub fn of(&self, owner: &[u8], now_ms: u64) -> Option<&Holder> {
        self.live(now_ms).find(|h| h.owner == owner)
    }

    /// The key's TTL: the latest lease among the stored holds (`None`: free).
    pub fn latest_lease(&self) -> Option<u64> {
        self.holders.iter().map(|h| h.hold.expires_at).max()
    }

    /// The earliest lease among the stored holds: when the next check is due.
    pub fn earliest_lease(&self) -> Option<u64> {
        self.holders.iter().map(|h| h.hold.expires_at).min()
    }

    /// The highest fence of the live holds (what `LOCK.INFO` shows).
    pub fn highest_fence(&self, now_ms: u64) -> Option<u64> {
        self.live(now_ms).map(|h| h.hold.fence).max()
    }

    /// Removes the holds whose lease has ended at `now_ms`; returns them.
    pub fn drop_ended(&mut self, now_ms: u64) -> Vec<Holder> {
        let (ended_now, live) = std::mem::take(&mut self.holders)
            .into_iter()
            .partition(|h| ended(h.hold.expires_at, now_ms));
        self.holders = live;
        ended_now
    }

    /// Whether a request in `mode` could be granted now, queue aside: the
    /// lock is free, or held shared in the same mode by fewer owners than
    /// its limit. A different shared limit is refused with an error by
    /// [`check_limit`](Holds::check_limit) before this is asked.
    pub fn admits(&self, mode: Mode, now_ms: u64) -> bool {
        let sharing = self.live(now_ms).count() as u64;
        match mode {
            _ if sharing == 0 => true,
            Mode::Exclusive => false,
            Mode::Shared { .. } => self.mode == mode && sharing < mode.capacity(),
        }
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
        if barriers.quarantined {
            return Ok(Acquire::Busy);
        }
        let expires_at = now_ms.saturating_add(ttl_ms);
        let held_mode = self.mode;
        if let Some(mine) = self.live_mut(owner, now_ms) {
            if mode == Mode::Exclusive && held_mode != Mode::Exclusive {
                return Err(LockError::Upgrade);
            }
            mine.hold.count = increment(mine.hold.count)?;
            mine.hold.expires_at = expires_at;
            return Ok(Acquire::Reentered(mine.hold));
        }
        if barriers.waiters || !self.admits(mode, now_ms) {
            return Ok(Acquire::Busy);
        }
        Ok(Acquire::Fresh(self.begin(
            owner,
            mode,
            ttl_ms,
            now_ms,
            issue_fence(),
        )))
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
        self.drop_ended(now_ms);
        if self.holders.is_empty() {
            self.mode = mode;
        }
        let hold = Hold {
            count: 1,
            fence,
            expires_at: now_ms.saturating_add(ttl_ms),
        };
        self.holders.push(Holder {
            owner: owner.to_vec(),
            hold,
            since: now_ms,
        });
        hold
    }

    /// `LOCK.REENTER`: the caller's count + 1, lease reset if `ttl_ms`.
    pub fn reenter(
        &mut self,
        owner: &[u8],
        ttl_ms: Option<u64>,
        now_ms: u64,
    ) -> Result<Hold, LockError> {
        let mine = self.live_mut(owner, now_ms).ok_or(LockError::NotOwner)?;
        mine.hold.count = increment(mine.hold.count)?;
        if let Some(ttl) = ttl_ms {
            mine.hold.expires_at = now_ms.saturating_add(ttl);
        }
        Ok(mine.hold)
    }

    /// `LOCK.RELEASE`: the caller's count − 1 (to 0 with `all`). At 0 the
    /// caller's hold ends (the lock is free if it was the last). Returns the
    /// remaining count.
    pub fn release(&mut self, owner: &[u8], all: bool, now_ms: u64) -> Result<u64, LockError> {
        let mine = self.live_mut(owner, now_ms).ok_or(LockError::NotOwner)?;
        mine.hold.count = if all { 0 } else { mine.hold.count - 1 };
        let left = mine.hold.count;
        if left == 0 {
            self.holders.retain(|h| h.owner != owner);
        }
        Ok(left)
    }

    /// `LOCK.RENEW`: the caller's lease becomes `ttl_ms` from now.
    pub fn renew(&mut self, owner: &[u8], ttl_ms: u64, now_ms: u64) -> Result<Hold, LockError> {
        let mine = self.live_mut(owner, now_ms).ok_or(LockError::NotOwner)?;
        mine.hold.expires_at = now_ms.saturating_add(ttl_ms);
        Ok(mine.hold)
    }

    /// `LOCK.FENCE`: the caller's fence becomes `max(fence, min_fence)`.
    pub fn fence(&mut self, owner: &[u8], min_fence: u64, now_ms: u64) -> Result<Hold, LockError> {
        let mine = self.live_mut(owner, now_ms).ok_or(LockError::NotOwner)?;
        mine.hold.fence = mine.hold.fence.max(min_fence);
        Ok(mine.hold)
    }

    fn live_mut(&mut self, owner: &[u8], now_ms: u64) -> Option<&mut Holder> {
        self.holders
            .iter_mut()
            .find(|h| h.owner == owner && !ended(h.hold.expires_at, now_ms))
    }
}

fn increment(count: u64) -> Result<u64, LockError> {
    count
        .checked_add(1)
        .filter(|&c| c <= crate::limits::MAX_COUNT)
        .ok_or(LockError::CountOverflow)
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
    fn a_lock_whose_last_lease_ended_takes_the_next_holders_mode() {
        let mut holds = held(Mode::READ, &[("r", NOW - 1)]);
        let got = holds.acquire(b"w", Mode::Exclusive, 10, NOW, Barriers::NONE, None, || 5);
        assert!(matches!(got, Ok(Acquire::Fresh(_))));
        assert_eq!(holds.mode(), Mode::Exclusive);
        assert_eq!(holds.holders().len(), 1, "the ended reader was dropped");
    }
}
