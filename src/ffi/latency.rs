//! Timing waits and holds for `INFO lock` (`wait_usec`, `hold_usec`; the
//! bookkeeping is [`redislock_core::latency`]'s).
//!
//! Lengths are measured on a monotonic clock in microseconds ([`now_us`]),
//! so a wall-clock step changes none of them. A hold's begin and end are
//! seen where they happen: the module's own writes (a grant, a hand-off in
//! place, a shared hold that ends while others go on) compare the fences
//! stored before and after ([`holds_rewritten`]); a key that goes with its holds
//! (release to zero, lease end, revoke, `DEL`, an overwrite, a flush) ends
//! them in the data type's free callback ([`value_freed`]), one map
//! removal per hold. A lease that ran out before its key went counts up to
//! its lease end, not to the moment Redis deleted the key.

use std::sync::OnceLock;
use std::time::Instant;

use crate::ffi::now_ms;
use redislock_core::holds::Changes;
use redislock_core::latency::{self, HOLDS, WAIT_USEC};

/// Microseconds on a monotonic clock (since the module first asked).
pub fn now_us() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let micros = EPOCH.get_or_init(Instant::now).elapsed().as_micros();
    u64::try_from(micros).unwrap_or(u64::MAX)
}

/// A waiting client that parked at `since_us` was granted now.
pub fn wait_granted(since_us: u64) {
    WAIT_USEC.record(now_us().saturating_sub(since_us));
}

/// How long past its lease end `lease_ms` a hold ended at `now_ms`, in µs.
fn late_us(lease_ms: u64, now_ms: u64) -> u64 {
    now_ms.saturating_sub(lease_ms).saturating_mul(1000)
}

/// The holds in a key as (fence, lease end) each, in plain numbers: what
/// the hold-time record compares before and after a write.
pub enum HoldEnds {
    /// No lock there.
    Free,
    /// One exclusive hold (read without allocating).
    One(u64, u64),
    /// Shared holds.
    Many(Vec<(u64, u64)>),
}

/// The module wrote a key that held `was` and now holds `stored`: holds
/// whose fence went ended, new fences began (the module writes only what
/// it decided, so every new hold is a grant made here). `raised`:
/// `LOCK.FENCE` moved one hold's fence (from, to), and that hold goes on.
pub fn holds_rewritten(was: HoldEnds, stored: HoldEnds, raised: Option<(u64, u64)>) {
    let mut before = match (was, &stored) {
        // A lock taken while free (the common case): every hold now
        // there begins, with no comparing.
        (HoldEnds::Free, HoldEnds::One(fence, _)) => {
            HOLDS.begin(*fence, now_us());
            return;
        }
        (HoldEnds::Free, HoldEnds::Many(holds)) => {
            let now = now_us();
            for &(fence, _) in holds {
                HOLDS.begin(fence, now);
            }
            return;
        }
        (HoldEnds::Free, HoldEnds::Free) => return,
        // One exclusive hold before and after: the same hold, a raised
        // fence, or a hand-off in place.
        (HoldEnds::One(old, lease), &HoldEnds::One(new, _)) => {
            if raised == Some((old, new)) {
                HOLDS.raised(old, new);
            } else if old != new {
                HOLDS.replace(old, new, now_us(), late_us(lease, now_ms()));
            }
            return;
        }
        (HoldEnds::One(fence, lease), _) => vec![(fence, lease)],
        (HoldEnds::Many(holds), _) => holds,
    };
    let after = match stored {
        HoldEnds::Free => Vec::new(),
        HoldEnds::One(fence, lease) => vec![(fence, lease)],
        HoldEnds::Many(holds) => holds,
    };
    let mut before_fences: Vec<u64> = before.iter().map(|h| h.0).collect();
    let mut after_fences: Vec<u64> = after.iter().map(|h| h.0).collect();
    let (mut ended, mut begun) = latency::changes(&mut before_fences, &mut after_fences);
    if let Some((from, to)) = raised.filter(|(from, to)| from != to) {
        HOLDS.raised(from, to);
        ended.retain(|&fence| fence != from);
        begun.retain(|&fence| fence != to);
    }
    if ended.is_empty() && begun.is_empty() {
        return;
    }
    let (now, now_ms) = (now_us(), now_ms());
    // By fence, to find each ended hold's lease in O(log n).
    before.sort_unstable();
    for fence in ended {
        let lease = before
            .binary_search_by_key(&fence, |h| h.0)
            .map_or(now_ms, |i| before[i].1);
        HOLDS.end(fence, now, late_us(lease, now_ms));
    }
    for fence in begun {
        HOLDS.begin(fence, now);
    }
}

/// A change the module made to a lock's holds ([`Changes`]): the holds
/// that began, ended (each counted up to its lease end if that came
/// first) and had their fence raised.
pub fn holds_changed(changes: &Changes) {
    let (now, now_ms) = (now_us(), now_ms());
    for &(from, to) in &changes.raised {
        HOLDS.raised(from, to);
    }
    for &(fence, lease) in &changes.ended {
        HOLDS.end(fence, now, late_us(lease, now_ms));
    }
    for &fence in &changes.began {
        HOLDS.begin(fence, now);
    }
}

/// Whether any hold's start is on record (a value freed with none needs no
/// look at its holds).
pub fn any_open() -> bool {
    HOLDS.open() > 0
}

/// A lock value left Redis (its key deleted, expired, overwritten or
/// flushed; possibly on a lazy-free thread): its holds end. `holds` calls
/// its argument with each hold's (fence, lease end), in plain numbers.
pub fn value_freed(holds: impl FnOnce(&mut dyn FnMut(u64, u64))) {
    let (now, now_ms) = (now_us(), now_ms());
    holds(&mut |fence, lease| {
        HOLDS.end(fence, now, late_us(lease, now_ms));
    });
}

/// `INFO lock`'s `wait_usec` value.
pub fn render_wait() -> String {
    WAIT_USEC.render()
}

/// `INFO lock`'s `hold_usec` value.
pub fn render_hold() -> String {
    HOLDS.lengths.render()
}
