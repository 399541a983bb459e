//! The lock state machine: acquire, reenter, release, renew and lease end.
//!
//! Pure: no Redis, time passed in as `now_ms`. The glue reads a key into a
//! [`Held`] (value + the key's absolute expiry), asks one of the functions
//! below what happens, and writes the answer back to the key and to the
//! replication stream. Because every decision is a value, the same `Held` the
//! master stores is what replicas and the AOF receive.

use crate::error::LockError;

/// One held lock: who holds it, how many times, its fence and its lease end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// The owner token, binary-safe, 1..=1024 bytes.
    pub owner: Vec<u8>,
    /// Reentrancy count, at least 1.
    pub count: u64,
    /// The fencing token issued when this hold began fresh.
    pub fence: u64,
    /// Absolute lease end, unix ms (mirrored into the key's TTL).
    pub expires_at: u64,
}

impl Held {
    /// Whether `owner` holds this lock at `now_ms`.
    fn is_held_by(&self, owner: &[u8], now_ms: u64) -> bool {
        self.owner == owner && self.is_live(now_ms)
    }

    /// Whether the lease is still running at `now_ms`.
    pub fn is_live(&self, now_ms: u64) -> bool {
        self.expires_at > now_ms
    }
}

/// What `LOCK.ACQUIRE` decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquire {
    /// The lock was free (or its lease had ended): a new hold with a new fence.
    Fresh(Held),
    /// The caller already held it: count + 1, lease reset, same fence.
    Reentered(Held),
    /// Someone else holds it.
    Busy,
}

/// `LOCK.ACQUIRE`: take a free lock, or reenter one the caller holds.
/// `issue_fence` is called only for a fresh hold.
pub fn acquire(
    current: Option<&Held>,
    owner: &[u8],
    ttl_ms: u64,
    now_ms: u64,
    issue_fence: impl FnOnce() -> u64,
) -> Result<Acquire, LockError> {
    match current.filter(|held| held.is_live(now_ms)) {
        None => Ok(Acquire::Fresh(Held {
            owner: owner.to_vec(),
            count: 1,
            fence: issue_fence(),
            expires_at: now_ms.saturating_add(ttl_ms),
        })),
        Some(held) if held.owner == owner => Ok(Acquire::Reentered(Held {
            count: increment(held.count)?,
            expires_at: now_ms.saturating_add(ttl_ms),
            ..held.clone()
        })),
        Some(_) => Ok(Acquire::Busy),
    }
}

/// `LOCK.REENTER`: count + 1 for the current owner, lease reset if `ttl_ms`.
pub fn reenter(
    current: Option<&Held>,
    owner: &[u8],
    ttl_ms: Option<u64>,
    now_ms: u64,
) -> Result<Held, LockError> {
    let held = owned(current, owner, now_ms)?;
    Ok(Held {
        count: increment(held.count)?,
        expires_at: ttl_ms.map_or(held.expires_at, |ttl| now_ms.saturating_add(ttl)),
        ..held.clone()
    })
}

/// `LOCK.RELEASE`: count − 1 (or to 0 with `all`). `None`: the lock is free.
pub fn release(
    current: Option<&Held>,
    owner: &[u8],
    all: bool,
    now_ms: u64,
) -> Result<Option<Held>, LockError> {
    let held = owned(current, owner, now_ms)?;
    let count = if all { 0 } else { held.count - 1 };
    Ok((count > 0).then(|| Held {
        count,
        ..held.clone()
    }))
}

/// `LOCK.RENEW`: the lease becomes `ttl_ms` from now; count and fence kept.
pub fn renew(
    current: Option<&Held>,
    owner: &[u8],
    ttl_ms: u64,
    now_ms: u64,
) -> Result<Held, LockError> {
    let held = owned(current, owner, now_ms)?;
    Ok(Held {
        expires_at: now_ms.saturating_add(ttl_ms),
        ..held.clone()
    })
}

/// The hold, if `owner` has it now; `NOTOWNER` otherwise.
fn owned<'a>(current: Option<&'a Held>, owner: &[u8], now_ms: u64) -> Result<&'a Held, LockError> {
    current
        .filter(|held| held.is_held_by(owner, now_ms))
        .ok_or(LockError::NotOwner)
}

/// Count + 1, refusing to wrap (counts are replied as signed integers).
fn increment(count: u64) -> Result<u64, LockError> {
    count
        .checked_add(1)
        .filter(|&c| c <= i64::MAX as u64)
        .ok_or(LockError::CountOverflow)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_000_000;
    const FENCE: u64 = 77;

    fn held(owner: &str, count: u64, expires_at: u64) -> Held {
        Held {
            owner: owner.as_bytes().to_vec(),
            count,
            fence: FENCE,
            expires_at,
        }
    }

    fn no_fence() -> u64 {
        panic!("a reentry or a refusal must not issue a fence")
    }

    #[test]
    fn acquire_free_lock_issues_a_fence_and_a_lease() {
        let got = acquire(None, b"a", 500, NOW, || 9).unwrap();
        assert_eq!(
            got,
            Acquire::Fresh(Held {
                fence: 9,
                ..held("a", 1, NOW + 500)
            })
        );
    }

    #[test]
    fn acquire_after_lease_end_is_fresh() {
        let old = held("a", 3, NOW);
        let got = acquire(Some(&old), b"b", 10, NOW, || 10).unwrap();
        assert_eq!(
            got,
            Acquire::Fresh(Held {
                fence: 10,
                ..held("b", 1, NOW + 10)
            })
        );
    }

    #[test]
    fn acquire_by_holder_reenters_with_same_fence_and_new_lease() {
        let cur = held("a", 2, NOW + 5);
        let got = acquire(Some(&cur), b"a", 1_000, NOW, no_fence).unwrap();
        assert_eq!(got, Acquire::Reentered(held("a", 3, NOW + 1_000)));
    }

    #[test]
    fn acquire_by_other_owner_is_busy() {
        let cur = held("a", 1, NOW + 5);
        assert_eq!(
            acquire(Some(&cur), b"b", 10, NOW, no_fence),
            Ok(Acquire::Busy)
        );
    }

    #[test]
    fn owners_compare_as_bytes() {
        let cur = held("a", 1, NOW + 5);
        assert_eq!(
            acquire(Some(&cur), b"A", 10, NOW, no_fence),
            Ok(Acquire::Busy)
        );
        assert_eq!(
            acquire(Some(&cur), b"a\0", 10, NOW, no_fence),
            Ok(Acquire::Busy)
        );
    }

    #[test]
    fn reenter_counts_up_and_optionally_resets_the_lease() {
        let cur = held("a", 1, NOW + 5);
        assert_eq!(
            reenter(Some(&cur), b"a", None, NOW),
            Ok(held("a", 2, NOW + 5))
        );
        assert_eq!(
            reenter(Some(&cur), b"a", Some(90), NOW),
            Ok(held("a", 2, NOW + 90))
        );
    }

    #[test]
    fn reenter_never_acquires() {
        assert_eq!(reenter(None, b"a", None, NOW), Err(LockError::NotOwner));
        let ended = held("a", 1, NOW);
        assert_eq!(
            reenter(Some(&ended), b"a", Some(5), NOW),
            Err(LockError::NotOwner)
        );
        let other = held("b", 1, NOW + 5);
        assert_eq!(
            reenter(Some(&other), b"a", None, NOW),
            Err(LockError::NotOwner)
        );
    }

    #[test]
    fn release_counts_down_to_free() {
        let cur = held("a", 2, NOW + 5);
        let once = release(Some(&cur), b"a", false, NOW).unwrap();
        assert_eq!(once, Some(held("a", 1, NOW + 5)));
        assert_eq!(release(once.as_ref(), b"a", false, NOW), Ok(None));
    }

    #[test]
    fn release_all_frees_at_once() {
        let cur = held("a", 3, NOW + 5);
        assert_eq!(release(Some(&cur), b"a", true, NOW), Ok(None));
    }

    #[test]
    fn only_the_live_owner_may_release_renew_or_reenter() {
        let table: [(Option<Held>, &str); 4] = [
            (None, "free lock"),
            (Some(held("b", 1, NOW + 5)), "other owner"),
            (Some(held("a", 1, NOW)), "lease ended exactly now"),
            (Some(held("a", 1, NOW - 1)), "lease ended before"),
        ];
        for (cur, case) in table {
            let cur = cur.as_ref();
            assert_eq!(
                release(cur, b"a", false, NOW),
                Err(LockError::NotOwner),
                "{case}"
            );
            assert_eq!(
                release(cur, b"a", true, NOW),
                Err(LockError::NotOwner),
                "{case}"
            );
            assert_eq!(renew(cur, b"a", 5, NOW), Err(LockError::NotOwner), "{case}");
            assert_eq!(
                reenter(cur, b"a", None, NOW),
                Err(LockError::NotOwner),
                "{case}"
            );
        }
    }

    #[test]
    fn renew_moves_only_the_lease() {
        let cur = held("a", 4, NOW + 5);
        assert_eq!(
            renew(Some(&cur), b"a", 60_000, NOW),
            Ok(held("a", 4, NOW + 60_000))
        );
    }

    #[test]
    fn count_never_wraps() {
        let cur = held("a", i64::MAX as u64, NOW + 5);
        assert_eq!(
            reenter(Some(&cur), b"a", None, NOW),
            Err(LockError::CountOverflow)
        );
        assert_eq!(
            acquire(Some(&cur), b"a", 5, NOW, no_fence),
            Err(LockError::CountOverflow)
        );
    }

    #[test]
    fn lease_end_saturates() {
        let got = acquire(None, b"a", 10, u64::MAX - 1, || 1).unwrap();
        assert_eq!(
            got,
            Acquire::Fresh(Held {
                fence: 1,
                ..held("a", 1, u64::MAX)
            })
        );
    }
}
