//! How long waits and holds last, for `INFO lock`'s `wait_usec` and
//! `hold_usec` lines.
//!
//! A wait is timed by the glue from the request to the grant and recorded
//! in [`WAIT_USEC`]. A hold is timed only if this server granted it to one
//! of its clients: [`HoldClock::begin`] notes its start under its fence
//! (every fresh hold gets a fence of its own), and [`HoldClock::end`] takes
//! it back when the hold ends, however that happens. A hold that arrived by
//! replication, `RESTORE` or loading was never begun here, so its end finds
//! nothing and counts nothing. Pure: times are passed in (microseconds of
//! one clock, the glue's choice); a map and a mutex, because a hold can end
//! in the data type's free callback, which Redis may run on a lazy-free
//! thread. O(1) per hold begun or ended, whatever else is held.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, PoisonError};

use crate::histogram::Histogram;

/// Waits granted, from the request to the grant (µs).
pub static WAIT_USEC: Histogram = Histogram::new();
/// Holds granted here, from the grant to their end (µs).
pub static HOLDS: HoldClock = HoldClock::new();

/// Fence → start (µs).
type Started = HashMap<u64, u64, BuildHasherDefault<FenceHasher>>;

/// Hashes a fence with a few shifts and multiplications (SplitMix64's
/// finaliser). Fences are issued by the server, each above the last (a
/// client can only ask for a higher one, within a bound), so they need no
/// keyed hash against chosen collisions; the default keyed one cost every
/// fresh hold and every hold's end about 140 instructions. They do need
/// mixing: a fence is often a multiple of 2^10 (the time in ms × 2^10), and
/// the map places a key by its hash's low bits.
#[derive(Default)]
struct FenceHasher(u64);

impl Hasher for FenceHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = mix(self.0.rotate_left(8) ^ u64::from(b));
        }
    }

    fn write_u64(&mut self, fence: u64) {
        self.0 = mix(fence);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// SplitMix64's finaliser: every bit of `x` moves every bit of the result.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The start of every hold granted here and not ended yet, and the
/// lengths of those that ended.
pub struct HoldClock {
    /// Fence → start (µs). `None` until the first hold.
    started: Mutex<Option<Started>>,
    /// Entries in `started`: ends of holds never begun here (a replica's,
    /// every hold of a flushed database of them) skip the lock.
    open: AtomicUsize,
    pub lengths: Histogram,
}

impl Default for HoldClock {
    fn default() -> Self {
        HoldClock::new()
    }
}

impl HoldClock {
    pub const fn new() -> HoldClock {
        HoldClock {
            started: Mutex::new(None),
            open: AtomicUsize::new(0),
            lengths: Histogram::new(),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut Started) -> R) -> R {
        // A panic elsewhere while the lock was held left the map whole.
        let mut started = self.started.lock().unwrap_or_else(PoisonError::into_inner);
        let map = started.get_or_insert_with(Started::default);
        let result = f(map);
        self.open.store(map.len(), Relaxed);
        result
    }

    /// A hold with `fence` was granted here at `now_us`.
    pub fn begin(&self, fence: u64, now_us: u64) {
        self.with(|map| map.insert(fence, now_us));
    }

    /// `LOCK.FENCE` raised a hold's fence from `from` to `to`: the same
    /// hold goes on.
    pub fn raised(&self, from: u64, to: u64) {
        if from == to || self.open.load(Relaxed) == 0 {
            return;
        }
        self.with(|map| {
            if let Some(start) = map.remove(&from) {
                map.insert(to, start);
            }
        });
    }

    /// The hold with `fence` ended, noticed at `now_us`, `late_us` after it
    /// really ended (a lease that ran out before its key was deleted): its
    /// length is recorded if it was granted here, and returned.
    pub fn end(&self, fence: u64, now_us: u64, late_us: u64) -> Option<u64> {
        if self.open.load(Relaxed) == 0 {
            return None;
        }
        let start = self.with(|map| map.remove(&fence))?;
        let length = now_us.saturating_sub(late_us).saturating_sub(start);
        self.lengths.record(length);
        Some(length)
    }

    /// [`HoldClock::end`] of `ended` and [`HoldClock::begin`] of `begun`
    /// in one step (a hand-off in place: one hold ends as the next begins).
    pub fn replace(&self, ended: u64, begun: u64, now_us: u64, late_us: u64) -> Option<u64> {
        let start = self.with(|map| {
            map.insert(begun, now_us);
            map.remove(&ended)
        })?;
        let length = now_us.saturating_sub(late_us).saturating_sub(start);
        self.lengths.record(length);
        Some(length)
    }

    /// Holds granted here and not ended yet.
    pub fn open(&self) -> usize {
        self.open.load(Relaxed)
    }
}

/// What a change to a lock's holds did, by fence (every hold has its own):
/// `before` and `after` are the fences stored before and after it. Sorted
/// in place, so O(n log n) for a lock of n holds, which the write that
/// changed them already costs. Returns (ended, begun).
pub fn changes(before: &mut [u64], after: &mut [u64]) -> (Vec<u64>, Vec<u64>) {
    before.sort_unstable();
    after.sort_unstable();
    let (mut ended, mut begun) = (Vec::new(), Vec::new());
    let (mut i, mut j) = (0, 0);
    while i < before.len() || j < after.len() {
        match (before.get(i), after.get(j)) {
            (Some(a), Some(b)) if a == b => {
                i += 1;
                j += 1;
            }
            (Some(&a), Some(&b)) if a < b => {
                ended.push(a);
                i += 1;
            }
            (Some(&a), None) => {
                ended.push(a);
                i += 1;
            }
            (_, Some(&b)) => {
                begun.push(b);
                j += 1;
            }
            (None, None) => break,
        }
    }
    (ended, begun)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fences as the server issues them (the time in ms × 2^10, or one
    /// above the last) land on buckets all over the map: the low bits of
    /// their hashes, which place them, take nearly every value.
    #[test]
    fn fences_spread_over_the_low_bits_of_their_hashes() {
        let ms = 1_764_000_000_000u64;
        for fences in [
            (0..4096).map(|i| (ms + i) << 10).collect::<Vec<_>>(),
            (0..4096).map(|i| (ms << 10) + i).collect(),
        ] {
            let buckets: std::collections::HashSet<u64> = fences
                .iter()
                .map(|&fence| {
                    let mut h = FenceHasher::default();
                    h.write_u64(fence);
                    h.finish() & 4095
                })
                .collect();
            // Random placement would fill about 63% of 4,096 buckets.
            assert!(buckets.len() > 2_400, "{} of 4096 buckets", buckets.len());
        }
    }

    #[test]
    fn a_hold_begun_here_is_timed_once_from_grant_to_end() {
        let clock = HoldClock::new();
        clock.begin(7, 1_000);
        assert_eq!(clock.open(), 1);
        assert_eq!(clock.end(7, 51_000, 0), Some(50_000));
        assert_eq!(clock.end(7, 90_000, 0), None, "an end is counted once");
        assert_eq!(clock.open(), 0);
        assert_eq!(clock.lengths.count(), 1);
    }

    #[test]
    fn a_hold_not_begun_here_counts_nothing() {
        let clock = HoldClock::new();
        clock.begin(1, 0);
        assert_eq!(clock.end(2, 10, 0), None);
        assert_eq!(clock.lengths.count(), 0);
        assert_eq!(clock.open(), 1);
    }

    #[test]
    fn a_hold_handed_on_in_place_ends_as_the_next_begins() {
        let clock = HoldClock::new();
        clock.begin(1, 100);
        assert_eq!(clock.replace(1, 2, 400, 0), Some(300));
        assert_eq!(clock.open(), 1);
        assert_eq!(clock.end(2, 1_000, 0), Some(600));
        // The one before was not granted here: the next one still begins.
        assert_eq!(clock.replace(8, 9, 0, 0), None);
        assert_eq!(clock.end(9, 50, 0), Some(50));
        assert_eq!(clock.lengths.count(), 3);
    }

    #[test]
    fn a_raised_fence_keeps_the_hold_going() {
        let clock = HoldClock::new();
        clock.begin(5, 100);
        clock.raised(5, 900);
        assert_eq!(clock.end(5, 200, 0), None);
        assert_eq!(clock.end(900, 300, 0), Some(200));
    }

    #[test]
    fn an_end_noticed_late_counts_up_to_the_lease_end() {
        let clock = HoldClock::new();
        clock.begin(1, 1_000);
        // Noticed 30 ms after the lease ran out.
        assert_eq!(clock.end(1, 231_000, 30_000), Some(200_000));
        clock.begin(2, 1_000);
        assert_eq!(clock.end(2, 500, 0), Some(0), "never negative");
    }

    #[test]
    fn changes_tell_ended_and_begun_holds_by_fence() {
        // (before, after, ended, begun)
        type Case = (
            &'static [u64],
            &'static [u64],
            &'static [u64],
            &'static [u64],
        );
        let cases: [Case; 6] = [
            (&[], &[4], &[], &[4]),
            (&[4], &[], &[4], &[]),
            (&[4], &[4], &[], &[]),
            (&[4], &[9], &[4], &[9]),
            (&[9, 3, 5], &[5, 11, 3], &[9], &[11]),
            (&[1, 2, 3], &[3, 2, 1], &[], &[]),
        ];
        for (before, after, ended, begun) in cases {
            let (mut b, mut a) = (before.to_vec(), after.to_vec());
            assert_eq!(
                changes(&mut b, &mut a),
                (ended.to_vec(), begun.to_vec()),
                "{before:?} → {after:?}"
            );
        }
    }
}
