//! Fencing tokens: `max(last + 1, unix_ms × 2^10)`.
//!
//! The counter part makes every fence this server issues larger than the one
//! before; the clock floor keeps fences rising across a restart that lost the
//! counter (persistence off) or a failover to a replica that missed the last
//! acquisitions, as long as clocks move forward. 2^10 fences per millisecond
//! (a million acquisitions a second) fit before the counter runs ahead of the
//! clock, far above what one server grants. `unix_ms × 2^10` stays below 2^53
//! until the year 2255, so a fence is exact wherever numbers are doubles: a
//! Lua script, a JSON parser, a JavaScript `Number`. A counter loaded from
//! data an older version wrote (fences were `unix_ms × 2^20` then, above
//! 2^53) keeps rising from where it is: fences never fall.

use std::sync::atomic::{AtomicU64, Ordering};

/// How far the clock is shifted: fences per millisecond.
pub const CLOCK_SHIFT: u32 = 10;

/// The largest fence: fences are replied as signed 64-bit integers.
pub const MAX_FENCE: u64 = i64::MAX as u64;

/// The fence to issue after `last` at wall-clock time `now_ms`.
pub fn next(last: u64, now_ms: u64) -> u64 {
    let floor = now_ms.saturating_mul(1 << CLOCK_SHIFT).min(MAX_FENCE);
    last.saturating_add(1).max(floor).min(MAX_FENCE)
}

/// The highest fence this server issued or saw (by replication, AOF, RDB,
/// `RESTORE`). Touched from the main thread only, but atomic so that it
/// needs no lock and no `unsafe`.
static LAST: AtomicU64 = AtomicU64::new(0);

/// Issues a new fence and remembers it.
pub fn issue(now_ms: u64) -> u64 {
    let mut issued = 0;
    // fetch_update retries only if another thread raced us; there is none,
    // so this runs once.
    let _ = LAST.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |last| {
        issued = next(last, now_ms);
        Some(issued)
    });
    issued
}

/// Records a fence decided elsewhere (a master, a file): later fences go above it.
pub fn observe(fence: u64) {
    LAST.fetch_max(fence, Ordering::SeqCst);
}

/// Whether the counter `last` is ahead of the clock floor at `now_ms`: only
/// then would a restart that forgot it issue a lower fence. That happens
/// after `LOCK.FENCE` raised it (up to an hour ahead), so an AOF rewrite
/// without the RDB preamble, which keeps only keys, must record it.
pub fn outruns_clock(last: u64, now_ms: u64) -> bool {
    last > next(0, now_ms)
}

/// The highest fence issued or seen so far.
pub fn last() -> u64 {
    LAST.load(Ordering::SeqCst)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_790_000_000_000; // a 2026 timestamp in ms

    #[test]
    fn first_fence_is_the_clock_floor() {
        assert_eq!(next(0, NOW), NOW << CLOCK_SHIFT);
    }

    #[test]
    fn fences_in_the_same_millisecond_count_up() {
        let a = next(0, NOW);
        let b = next(a, NOW);
        let c = next(b, NOW);
        assert_eq!((b, c), (a + 1, a + 2));
    }

    #[test]
    fn only_a_counter_past_the_clock_floor_outruns_the_clock() {
        let floor = NOW << CLOCK_SHIFT;
        let cases = [
            (0, false),
            (floor - 1, false),
            (floor, false),
            (floor + 1, true),
            ((NOW + 3_600_000) << CLOCK_SHIFT, true),
        ];
        for (last, want) in cases {
            assert_eq!(outruns_clock(last, NOW), want, "last {last}");
        }
    }

    #[test]
    fn a_later_millisecond_jumps_to_its_floor() {
        let a = next(0, NOW);
        assert_eq!(next(a, NOW + 1), (NOW + 1) << CLOCK_SHIFT);
    }

    #[test]
    fn a_clock_that_goes_back_never_lowers_fences() {
        let a = next(0, NOW);
        let b = next(a, NOW - 5_000);
        assert_eq!(b, a + 1);
    }

    #[test]
    fn a_lost_counter_still_rises_with_the_clock() {
        // Restart with persistence off: the counter is back to 0, but the
        // clock has moved on, so the floor is above every earlier fence.
        let before = next(next(0, NOW), NOW);
        let after_restart = next(0, NOW + 1);
        assert!(after_restart > before);
    }

    #[test]
    fn fences_saturate_instead_of_wrapping() {
        assert_eq!(next(MAX_FENCE, NOW), MAX_FENCE);
        assert_eq!(next(0, u64::MAX), MAX_FENCE);
        assert!(next(0, NOW) <= MAX_FENCE);
    }

    #[test]
    fn issue_and_observe_keep_the_global_counter_rising() {
        let a = issue(NOW);
        observe(a + 1_000);
        let b = issue(NOW);
        assert!(b > a + 1_000);
        assert!(last() >= b);
    }
}
