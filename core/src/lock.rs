//! The lock state machine, for holds of every mode: what `LOCK.ACQUIRE`,
//! `LOCK.REENTER`, `LOCK.RELEASE`, `LOCK.RENEW` and `LOCK.FENCE` do to one
//! owner's hold, lease end, TTL fixes.
//!
//! Pure: no Redis, time passed in as `now_ms`. Every rule is decided here
//! once, on a small `Copy` view of the lock as the caller sees it ([`Seen`]:
//! the caller's own live hold, whether the lock admits a fresh one), and
//! answers with the [`Hold`] to store — so deciding allocates nothing. Where
//! that view comes from is storage: an exclusive lock the glue keeps
//! compactly is shown as a [`Lock`] (owner borrowed from the key), a lock
//! whose holds are listed ([`crate::holds::Holds`], shared holds) shows its
//! own, and both are decided by the same functions. The same `Hold` the
//! master stores is what replicas and the AOF receive.
//!
//! The small rules are `#[inline]`: the module crate instantiates the
//! sequencing that calls them, and the release build has no LTO, so without
//! it each exclusive command would pay calls across crates that the glue's
//! own code never did.

use crate::error::LockError;

/// The numbers of a hold: how many times, its fence, its lease end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Hold {
    /// Reentrancy count, at least 1.
    pub count: u64,
    /// The fencing token issued when this hold began fresh.
    pub fence: u64,
    /// Absolute lease end, unix ms (mirrored into the key's TTL).
    pub expires_at: u64,
}

/// An exclusive lock as the glue stores it compactly: who holds it, and the
/// hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lock<'a> {
    pub owner: &'a [u8],
    pub hold: Hold,
}

impl Lock<'_> {
    /// Whether the lease is still running at `now_ms`.
    #[inline]
    pub fn is_live(&self, now_ms: u64) -> bool {
        !ended(self.hold.expires_at, now_ms)
    }
}

/// The lock as one request sees it: all [`acquire`] decides on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    /// The caller's own hold, if it runs at `now_ms`.
    pub own: Option<Hold>,
    /// Whether a fresh hold in the caller's mode fits beside the live holds
    /// (queue aside): the lock is free, or shared in that mode below its
    /// limit.
    pub admits: bool,
    /// The caller asks exclusively for a lock it holds shared.
    pub upgrade: bool,
}

impl Seen {
    /// An exclusive request's view of a compactly stored exclusive lock
    /// (`None`: no lock in the key).
    #[inline]
    pub fn exclusive(current: Option<Lock>, owner: &[u8], now_ms: u64) -> Seen {
        let live = current.filter(|lock| lock.is_live(now_ms));
        Seen {
            own: own(live, owner),
            admits: live.is_none(),
            upgrade: false,
        }
    }
}

impl Seen {
    /// A request's view of one exclusive hold as the host stores it
    /// compactly (`None`: no lock in the key): `mine`, whether the asker
    /// owns it. In any mode, as [`crate::holds::Holds::seen`] would show it.
    #[inline]
    pub fn stored(hold: Option<Hold>, mine: bool, now_ms: u64) -> Seen {
        let live = hold.filter(|hold| !ended(hold.expires_at, now_ms));
        Seen {
            own: live.filter(|_| mine),
            admits: live.is_none(),
            upgrade: false,
        }
    }
}

/// The caller's hold in a live compact lock.
#[inline]
fn own(live: Option<Lock>, owner: &[u8]) -> Option<Hold> {
    live.filter(|lock| lock.owner == owner)
        .map(|lock| lock.hold)
}

/// `owner`'s live hold in a compactly stored exclusive lock: what the
/// per-owner commands ([`reenter`], [`release`], [`renew`], [`fence`])
/// decide on.
#[inline]
pub fn own_hold(current: Option<Lock>, owner: &[u8], now_ms: u64) -> Option<Hold> {
    own(current.filter(|lock| lock.is_live(now_ms)), owner)
}

/// What `LOCK.ACQUIRE` decided, in any mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquire {
    /// A new hold with a new fence (the lock was free, or shared room).
    Fresh(Hold),
    /// The caller already held it: count + 1, lease reset, same fence.
    Reentered(Hold),
    /// It cannot be granted now (or clients wait ahead of the caller).
    Busy,
}

/// What the server knows beside the lock that can make `LOCK.ACQUIRE` answer
/// busy before the owner check (the glue and the models fill it in).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Barriers {
    /// Clients wait on this lock. A free lock (or shared room) is theirs,
    /// first come first served, not the caller's (no barging).
    pub waiters: bool,
    /// The node is in quarantine: it begins nothing, not even a reentry.
    /// The hold it shows may be one its owner released on a master that
    /// died (the release was lost) while another client holds the lock
    /// there. An owner that still holds it says so with `LOCK.REENTER`.
    pub quarantined: bool,
}

impl Barriers {
    /// Nothing in the way.
    pub const NONE: Barriers = Barriers {
        waiters: false,
        quarantined: false,
    };
}

/// `LOCK.ACQUIRE`, in any mode: reenter the caller's own hold (even past
/// waiters), or begin a fresh one if the lock admits it and nobody waits,
/// unless quarantined. An owner holding it shared may not upgrade.
/// `issue_fence` is called only for a fresh hold.
pub fn acquire(
    seen: Seen,
    ttl_ms: u64,
    now_ms: u64,
    barriers: Barriers,
    issue_fence: impl FnOnce() -> u64,
) -> Result<Acquire, LockError> {
    if barriers.quarantined {
        return Ok(Acquire::Busy);
    }
    let expires_at = now_ms.saturating_add(ttl_ms);
    match seen.own {
        Some(_) if seen.upgrade => Err(LockError::Upgrade),
        Some(hold) => Ok(Acquire::Reentered(Hold {
            count: increment(hold.count)?,
            expires_at,
            ..hold
        })),
        None if barriers.waiters || !seen.admits => Ok(Acquire::Busy),
        None => Ok(Acquire::Fresh(Hold {
            count: 1,
            fence: issue_fence(),
            expires_at,
        })),
    }
}

/// `LOCK.REENTER` on the caller's live hold `own`: count + 1, lease reset
/// if `ttl_ms`.
#[inline]
pub fn reenter(own: Option<Hold>, ttl_ms: Option<u64>, now_ms: u64) -> Result<Hold, LockError> {
    let hold = own.ok_or(LockError::NotOwner)?;
    Ok(Hold {
        count: increment(hold.count)?,
        expires_at: ttl_ms.map_or(hold.expires_at, |ttl| now_ms.saturating_add(ttl)),
        ..hold
    })
}

/// `LOCK.RELEASE` of the caller's live hold `own`: count − 1 (or to 0 with
/// `all`). `None`: the caller's hold ended (the lock is free if it was the
/// last).
#[inline]
pub fn release(own: Option<Hold>, all: bool) -> Result<Option<Hold>, LockError> {
    let hold = own.ok_or(LockError::NotOwner)?;
    let count = if all { 0 } else { hold.count - 1 };
    Ok((count > 0).then_some(Hold { count, ..hold }))
}

/// `LOCK.RENEW` of the caller's live hold `own`: the lease becomes `ttl_ms`
/// from now; count and fence kept.
#[inline]
pub fn renew(own: Option<Hold>, ttl_ms: u64, now_ms: u64) -> Result<Hold, LockError> {
    let hold = own.ok_or(LockError::NotOwner)?;
    Ok(Hold {
        expires_at: now_ms.saturating_add(ttl_ms),
        ..hold
    })
}

/// `LOCK.FENCE` on the caller's live hold `own`: the fence becomes
/// `max(fence, min_fence)`; count and lease kept. (The caller also raises
/// the server's fence counter to it, so every later fence is higher.)
#[inline]
pub fn fence(own: Option<Hold>, min_fence: u64) -> Result<Hold, LockError> {
    let hold = own.ok_or(LockError::NotOwner)?;
    Ok(Hold {
        fence: hold.fence.max(min_fence),
        ..hold
    })
}

/// Whether a grant with `fence` whose client never got the reply may be
/// taken back, given the grantee's stored hold `own`: only while it is
/// still exactly that grant. A hold its owner reentered meanwhile (another
/// connection with the same token was told it holds it) is in use and stays.
#[inline]
pub fn revocable(own: Option<Hold>, fence: u64) -> bool {
    own.is_some_and(|hold| hold.fence == fence && hold.count == 1)
}

/// Whether a hold (or a key) whose time is `until` has ended at `now_ms`:
/// once now is past it, the definition Redis uses to expire a key. The one
/// definition everywhere, so that whenever the module calls a lock over,
/// Redis has also expired its key, and the other way round.
#[inline]
pub fn ended(until: u64, now_ms: u64) -> bool {
    now_ms > until
}

/// The first millisecond at which a hold running through `until` has
/// ended: when a check of it is due.
pub fn first_ended_ms(until: u64) -> u64 {
    until.saturating_add(1)
}

/// When a hold ends, from its stored lease end (`0`: not known, a value
/// from encoding version 1) and the key's expiry: the earlier of the two. A
/// TTL shorter than the lease ends the hold early (an operator forcing it
/// free); a missing or longer TTL changes nothing (no lock lives forever). A hold
/// with neither has ended: every hold has a lease.
pub fn lease_end(stored_lease: u64, key_expiry: Option<u64>) -> u64 {
    match (stored_lease, key_expiry) {
        (0, expiry) => expiry.unwrap_or(0),
        (lease, Some(expiry)) => lease.min(expiry),
        (lease, None) => lease,
    }
}

/// What to do with a lock key's TTL after something other than this module
/// changed it (`PERSIST`, `EXPIRE`, `RESTORE`, …).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TtlFix {
    /// The TTL is the lease, or shorter: leave it.
    Keep,
    /// Set the key's expiry back to the stored lease end.
    Restore(u64),
    /// The hold has ended (or never had a lease): delete the key.
    Delete,
}

/// Decides [`TtlFix`] for a lock with `stored_lease` whose key now expires
/// at `key_expiry`, at `now_ms`.
pub fn ttl_fix(stored_lease: u64, key_expiry: Option<u64>, now_ms: u64) -> TtlFix {
    if ended(lease_end(stored_lease, key_expiry), now_ms) {
        return TtlFix::Delete;
    }
    match key_expiry {
        Some(expiry) if stored_lease == 0 || expiry <= stored_lease => TtlFix::Keep,
        _ => TtlFix::Restore(stored_lease),
    }
}

/// Count + 1, refusing to pass the largest count a lock value stores.
fn increment(count: u64) -> Result<u64, LockError> {
    count
        .checked_add(1)
        .filter(|&c| c <= crate::limits::MAX_COUNT)
        .ok_or(LockError::CountOverflow)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_000_000;
    const FENCE: u64 = 77;

    fn hold(count: u64, expires_at: u64) -> Hold {
        Hold {
            count,
            fence: FENCE,
            expires_at,
        }
    }

    fn lock(owner: &str, count: u64, expires_at: u64) -> Option<Lock<'_>> {
        Some(Lock {
            owner: owner.as_bytes(),
            hold: hold(count, expires_at),
        })
    }

    /// An exclusive request on a compactly stored lock.
    fn acq(
        current: Option<Lock>,
        owner: &[u8],
        ttl_ms: u64,
        now_ms: u64,
        barriers: Barriers,
        issue_fence: impl FnOnce() -> u64,
    ) -> Result<Acquire, LockError> {
        acquire(
            Seen::exclusive(current, owner, now_ms),
            ttl_ms,
            now_ms,
            barriers,
            issue_fence,
        )
    }

    fn no_fence() -> u64 {
        panic!("a reentry or a refusal must not issue a fence")
    }

    #[test]
    fn acquire_free_lock_issues_a_fence_and_a_lease() {
        let got = acq(None, b"a", 500, NOW, Barriers::NONE, || 9).unwrap();
        assert_eq!(
            got,
            Acquire::Fresh(Hold {
                count: 1,
                fence: 9,
                expires_at: NOW + 500
            })
        );
    }

    #[test]
    fn acquire_after_lease_end_is_fresh() {
        let got = acq(lock("a", 3, NOW - 1), b"b", 10, NOW, Barriers::NONE, || 10).unwrap();
        assert_eq!(
            got,
            Acquire::Fresh(Hold {
                count: 1,
                fence: 10,
                expires_at: NOW + 10
            })
        );
    }

    #[test]
    fn acquire_by_holder_reenters_with_same_fence_and_new_lease() {
        let got = acq(
            lock("a", 2, NOW + 5),
            b"a",
            1_000,
            NOW,
            Barriers::NONE,
            no_fence,
        )
        .unwrap();
        assert_eq!(got, Acquire::Reentered(hold(3, NOW + 1_000)));
    }

    #[test]
    fn barriers_make_acquire_busy_only_where_they_apply() {
        let reentered = Acquire::Reentered(hold(2, NOW + 10));
        let fresh = Acquire::Fresh(Hold {
            count: 1,
            fence: 5,
            expires_at: NOW + 10,
        });
        let (waiters, quarantined) = (
            Barriers {
                waiters: true,
                ..Barriers::NONE
            },
            Barriers {
                quarantined: true,
                ..Barriers::NONE
            },
        );
        // (lock now, barriers, what the caller "a" gets)
        let cases = [
            (None, waiters, Acquire::Busy),
            (lock("b", 1, NOW - 1), waiters, Acquire::Busy), // lease ended: free
            (lock("a", 1, NOW + 5), waiters, reentered),     // the holder reenters
            (None, quarantined, Acquire::Busy),
            (lock("a", 1, NOW + 5), quarantined, Acquire::Busy),
            (None, Barriers::NONE, fresh),
        ];
        for (current, barriers, want) in cases {
            let got = acq(current, b"a", 10, NOW, barriers, || 5);
            assert_eq!(got, Ok(want), "{current:?} {barriers:?}");
        }
    }

    #[test]
    fn acquire_by_other_owner_is_busy() {
        assert_eq!(
            acq(
                lock("a", 1, NOW + 5),
                b"b",
                10,
                NOW,
                Barriers::NONE,
                no_fence
            ),
            Ok(Acquire::Busy)
        );
    }

    #[test]
    fn owners_compare_as_bytes() {
        let cur = lock("a", 1, NOW + 5);
        assert_eq!(
            acq(cur, b"A", 10, NOW, Barriers::NONE, no_fence),
            Ok(Acquire::Busy)
        );
        assert_eq!(
            acq(cur, b"a\0", 10, NOW, Barriers::NONE, no_fence),
            Ok(Acquire::Busy)
        );
    }

    #[test]
    fn reenter_counts_up_and_optionally_resets_the_lease() {
        let cur = lock("a", 1, NOW + 5);
        assert_eq!(
            reenter(own_hold(cur, b"a", NOW), None, NOW),
            Ok(hold(2, NOW + 5))
        );
        assert_eq!(
            reenter(own_hold(cur, b"a", NOW), Some(90), NOW),
            Ok(hold(2, NOW + 90))
        );
    }

    #[test]
    fn reenter_never_acquires() {
        assert_eq!(
            reenter(own_hold(None, b"a", NOW), None, NOW),
            Err(LockError::NotOwner)
        );
        assert_eq!(
            reenter(own_hold(lock("a", 1, NOW - 1), b"a", NOW), Some(5), NOW),
            Err(LockError::NotOwner)
        );
        assert_eq!(
            reenter(own_hold(lock("b", 1, NOW + 5), b"a", NOW), None, NOW),
            Err(LockError::NotOwner)
        );
    }

    #[test]
    fn release_counts_down_to_free() {
        let once = release(own_hold(lock("a", 2, NOW + 5), b"a", NOW), false).unwrap();
        assert_eq!(once, Some(hold(1, NOW + 5)));
        let again = once.map(|hold| Lock { owner: b"a", hold });
        assert_eq!(release(own_hold(again, b"a", NOW), false), Ok(None));
    }

    #[test]
    fn release_all_frees_at_once() {
        assert_eq!(
            release(own_hold(lock("a", 3, NOW + 5), b"a", NOW), true),
            Ok(None)
        );
    }

    #[test]
    fn only_the_live_owner_may_release_renew_or_reenter() {
        let table = [
            (None, "free lock"),
            (lock("b", 1, NOW + 5), "other owner"),
            (lock("a", 1, NOW - 1), "lease ended: now is past it"),
            (lock("a", 1, NOW - 9), "lease ended before"),
        ];
        for (cur, case) in table {
            assert_eq!(
                release(own_hold(cur, b"a", NOW), false),
                Err(LockError::NotOwner),
                "{case}"
            );
            assert_eq!(
                release(own_hold(cur, b"a", NOW), true),
                Err(LockError::NotOwner),
                "{case}"
            );
            assert_eq!(
                renew(own_hold(cur, b"a", NOW), 5, NOW),
                Err(LockError::NotOwner),
                "{case}"
            );
            assert_eq!(
                fence(own_hold(cur, b"a", NOW), 5),
                Err(LockError::NotOwner),
                "{case}"
            );
            assert_eq!(
                reenter(own_hold(cur, b"a", NOW), None, NOW),
                Err(LockError::NotOwner),
                "{case}"
            );
        }
    }

    #[test]
    fn renew_moves_only_the_lease() {
        assert_eq!(
            renew(own_hold(lock("a", 4, NOW + 5), b"a", NOW), 60_000, NOW),
            Ok(hold(4, NOW + 60_000))
        );
    }

    #[test]
    fn fence_only_ever_raises_the_fence() {
        // (min-fence, the hold's fence after): count and lease never move.
        let cur = lock("a", 3, NOW + 5);
        for (min_fence, want) in [
            (1, FENCE),
            (FENCE, FENCE),
            (FENCE + 1, FENCE + 1),
            (1 << 50, 1 << 50),
        ] {
            assert_eq!(
                fence(own_hold(cur, b"a", NOW), min_fence),
                Ok(Hold {
                    fence: want,
                    ..hold(3, NOW + 5)
                }),
                "min-fence {min_fence}"
            );
        }
    }

    #[test]
    fn count_never_wraps() {
        let cur = lock("a", crate::limits::MAX_COUNT, NOW + 5);
        assert_eq!(
            reenter(own_hold(cur, b"a", NOW), None, NOW),
            Err(LockError::CountOverflow)
        );
        assert_eq!(
            acq(cur, b"a", 5, NOW, Barriers::NONE, no_fence),
            Err(LockError::CountOverflow)
        );
    }

    #[test]
    fn only_the_exact_grant_is_taken_back() {
        let table = [
            (lock("a", 1, NOW + 5), true),
            (lock("a", 2, NOW + 5), false), // reentered by its owner meanwhile
            (lock("b", 1, NOW + 5), false), // someone else's hold now
            (None, false),
        ];
        for (current, want) in table {
            assert_eq!(
                revocable(own_hold(current, b"a", NOW), FENCE),
                want,
                "{current:?}"
            );
        }
        assert!(!revocable(
            own_hold(lock("a", 1, NOW + 5), b"a", NOW),
            FENCE + 1
        )); // a later hold
    }

    #[test]
    fn a_hold_ends_at_the_earlier_of_lease_and_ttl() {
        let table = [
            // (stored lease, key expiry, hold ends at)
            (NOW + 10, Some(NOW + 10), NOW + 10),
            (NOW + 10, None, NOW + 10), // PERSIST: the lease still ends it
            (NOW + 10, Some(NOW + 99_999), NOW + 10), // a longer TTL changes nothing
            (NOW + 10, Some(NOW + 3), NOW + 3), // a shorter TTL ends it early
            (0, Some(NOW + 7), NOW + 7), // version 1 value: the TTL is the lease
            (0, None, 0),               // no lease at all: ended
        ];
        for (lease, expiry, want) in table {
            assert_eq!(lease_end(lease, expiry), want, "{lease} {expiry:?}");
        }
    }

    #[test]
    fn ttl_changes_by_others_are_undone_unless_shorter() {
        let table = [
            // (stored lease, key expiry, fix)
            (NOW + 10, Some(NOW + 10), TtlFix::Keep),
            (NOW + 10, Some(NOW + 5), TtlFix::Keep),
            (NOW + 10, None, TtlFix::Restore(NOW + 10)),
            (NOW + 10, Some(NOW + 50), TtlFix::Restore(NOW + 10)),
            (NOW - 1, None, TtlFix::Delete), // RESTORE of a lock whose lease ended
            (NOW - 1, Some(NOW + 50), TtlFix::Delete),
            (NOW, Some(NOW + 50), TtlFix::Restore(NOW)), // its last millisecond
            (0, Some(NOW + 50), TtlFix::Keep),           // version 1: nothing to restore from
            (0, None, TtlFix::Delete),
        ];
        for (lease, expiry, want) in table {
            assert_eq!(ttl_fix(lease, expiry, NOW), want, "{lease} {expiry:?}");
        }
    }

    #[test]
    fn lease_end_saturates() {
        let got = acq(None, b"a", 10, u64::MAX - 1, Barriers::NONE, || 1).unwrap();
        assert_eq!(
            got,
            Acquire::Fresh(Hold {
                count: 1,
                fence: 1,
                expires_at: u64::MAX
            })
        );
    }
}
