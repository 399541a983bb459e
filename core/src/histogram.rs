//! Latency histograms for `INFO lock` (`wait_usec`, `hold_usec`), in the
//! form of Redis's own `latencystats` lines.
//!
//! Log-linear buckets: values below 128 µs each have their own bucket;
//! above, every power of two is cut into 64 equal buckets, so a bucket is
//! at most 1/64 of the values in it wide, and reporting its middle is off
//! by at most 0.8%. A fixed array of counters: O(1) memory and O(1) per
//! record, whatever the number of values. Atomic counters, because a hold
//! can end in the data type's free callback, which Redis may run on a
//! background thread.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Values below this each have a bucket of their own.
const EXACT: u64 = 128;
/// Buckets per power of two above [`EXACT`].
const PER_OCTAVE: u64 = 64;
/// log2 of [`PER_OCTAVE`].
const OCTAVE_BITS: u32 = 6;
/// Octaves above [`EXACT`] up to `u64::MAX`.
const OCTAVES: u64 = 64 - 7;
const BUCKETS: usize = (EXACT + OCTAVES * PER_OCTAVE) as usize;

/// A histogram of microsecond values.
pub struct Histogram {
    buckets: [AtomicU64; BUCKETS],
    count: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram::new()
    }
}

impl Histogram {
    pub const fn new() -> Histogram {
        Histogram {
            buckets: [const { AtomicU64::new(0) }; BUCKETS],
            count: AtomicU64::new(0),
        }
    }

    /// Counts one value.
    pub fn record(&self, usec: u64) {
        self.buckets[index(usec)].fetch_add(1, Relaxed);
        self.count.fetch_add(1, Relaxed);
    }

    /// How many values were recorded.
    pub fn count(&self) -> u64 {
        self.count.load(Relaxed)
    }

    /// The value at percentile `p` (0–100]: the middle of the bucket that
    /// holds the value of rank ⌈p% × count⌉. `None` when empty.
    pub fn percentile(&self, p: f64) -> Option<f64> {
        let counts: Vec<u64> = self.buckets.iter().map(|b| b.load(Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = ((p / 100.0 * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (i, n) in counts.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Some(middle(i));
            }
        }
        None
    }

    /// `p50=…,p99=…,p99.9=…,count=…`, as Redis prints its `latencystats`
    /// (three decimals); zeros while empty.
    pub fn render(&self) -> String {
        let mut line = String::new();
        for (name, p) in [("p50", 50.0), ("p99", 99.0), ("p99.9", 99.9)] {
            let value = self.percentile(p).unwrap_or(0.0);
            let _ = write!(line, "{name}={value:.3},");
        }
        let _ = write!(line, "count={}", self.count());
        line
    }
}

/// The bucket of `v`.
fn index(v: u64) -> usize {
    if v < EXACT {
        return v as usize;
    }
    // v has `bits` significant bits, at least 8; its top 7 (64..=127)
    // pick the bucket within its octave.
    let bits = 64 - v.leading_zeros();
    let shift = bits - (OCTAVE_BITS + 1);
    let octave = u64::from(shift) - 1;
    let within = (v >> shift) - PER_OCTAVE;
    (EXACT + octave * PER_OCTAVE + within) as usize
}

/// The middle of bucket `i`'s values.
fn middle(i: usize) -> f64 {
    let i = i as u64;
    if i < EXACT {
        return i as f64;
    }
    let octave = (i - EXACT) / PER_OCTAVE;
    let within = (i - EXACT) % PER_OCTAVE;
    let shift = octave + 1;
    let low = (PER_OCTAVE + within) << shift;
    let width = 1u64 << shift;
    low as f64 + (width - 1) as f64 / 2.0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator: the tests need spread, not quality.
    fn values(n: usize, seed: u64, max: u64) -> Vec<u64> {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                // Spread over many octaves: a random number of bits.
                let bits = (x >> 58) % 64;
                ((x >> 7) & ((1u64 << bits) - 1).max(1)) % max
            })
            .collect()
    }

    #[test]
    fn every_value_lands_in_a_bucket_whose_middle_is_within_one_percent() {
        let mut probes: Vec<u64> = (0..5_000).collect();
        probes.extend(values(20_000, 7, u64::MAX));
        probes.extend([
            u64::MAX,
            u64::MAX / 2,
            1 << 40,
            (1 << 40) - 1,
            127,
            128,
            129,
            255,
            256,
        ]);
        for v in probes {
            let i = index(v);
            assert!(i < BUCKETS, "{v} → bucket {i}");
            let error = (middle(i) - v as f64).abs() / (v as f64).max(1.0);
            assert!(
                error <= 0.01,
                "{v}: middle {} is {:.4} off",
                middle(i),
                error
            );
        }
    }

    #[test]
    fn buckets_are_ordered_and_adjacent() {
        // Consecutive values never go down a bucket, and never skip one.
        for v in 0..100_000u64 {
            let (a, b) = (index(v), index(v + 1));
            assert!(b == a || b == a + 1, "{v}: {a} then {b}");
        }
    }

    #[test]
    fn percentiles_match_the_sorted_values_within_one_percent() {
        for (seed, max) in [(1, 1_000), (2, 1_000_000), (3, 10_000_000_000)] {
            let histogram = Histogram::new();
            let mut all = values(50_000, seed, max);
            for &v in &all {
                histogram.record(v);
            }
            all.sort_unstable();
            assert_eq!(histogram.count(), all.len() as u64);
            for p in [50.0, 99.0, 99.9, 100.0] {
                let rank = ((p / 100.0 * all.len() as f64).ceil() as usize).max(1);
                let exact = all[rank - 1] as f64;
                let got = histogram.percentile(p).unwrap();
                assert!(
                    (got - exact).abs() <= 0.01 * exact.max(1.0),
                    "seed {seed} p{p}: {got} vs {exact}"
                );
            }
        }
    }

    #[test]
    fn renders_as_latencystats_and_empty_as_zeros() {
        let histogram = Histogram::new();
        assert_eq!(
            histogram.render(),
            "p50=0.000,p99=0.000,p99.9=0.000,count=0"
        );
        for v in [10, 10, 10, 1_000] {
            histogram.record(v);
        }
        assert_eq!(
            histogram.render(),
            "p50=10.000,p99=1003.500,p99.9=1003.500,count=4"
        );
    }
}
