//! The server model's wall clock, and the steps it takes.
//!
//! The server model's time ([`crate::server`]'s tick counter) is the lease
//! clock: elapsed time, what the module counts every lease, `WAIT` deadline
//! and lease check on (`src/ffi/lease_clock.rs`). Beside it runs the
//! server's wall clock, which an operator, NTP or a resumed VM may step
//! forward or backward while no time elapses: a step moves the wall clock
//! alone. The module's decisions read the lease clock (the host's clock,
//! [`WallClock::for_leases`]), so the properties hold whatever the wall
//! clock does; with the flaw planted in the core
//! ([`redislock_core::planted`]) they read the wall clock, and a forward
//! step ends a lease early: the checker finds two holders.
//!
//! Not modelled: Redis's own expiry of a key by the stepped wall clock
//! before the module looks, and module timers filed by wall time. The
//! module puts such a key back, and re-bases every TTL and timer, at its
//! first look after the step, which comes before any grant (every lock
//! command looks first), so the model takes the re-base as done with the
//! step: a key's TTL is its lease, and a timer fires at its lease-clock
//! time. That window is checked on real servers, by a preload library
//! that steps their wall clock (`tests/integration/clock.rs`).

use redislock_core::planted;

/// The steps a run allows.
#[derive(Clone, Debug, Default)]
pub struct Steps {
    /// How far one step moves the wall clock, forward (> 0) or back.
    pub sizes: Vec<i64>,
    /// Steps in the whole run.
    pub max: u8,
}

impl Steps {
    /// No step.
    pub fn none() -> Steps {
        Steps::default()
    }

    /// One step in the run, forward or back by `size`: a size above the
    /// longest lease ends every lease at once if a decision reads wall time.
    pub fn one_either_way(size: i64) -> Steps {
        Steps {
            sizes: vec![size, -size],
            max: 1,
        }
    }
}

/// The wall clock, as its distance from the lease clock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct WallClock {
    /// Wall minus lease clock: the sum of the steps taken.
    offset: i64,
    /// Steps taken.
    steps: u8,
}

impl WallClock {
    /// The wall clock when the lease clock reads `lease_now`.
    pub fn read(&self, lease_now: u64) -> u64 {
        lease_now.saturating_add_signed(self.offset)
    }

    /// What the module's lease decisions read: the lease clock (unless the
    /// flaw is planted).
    pub fn for_leases(&self, lease_now: u64) -> u64 {
        planted::lease_decisions_read(lease_now, self.read(lease_now))
    }

    /// The steps it may take now (the wall clock stays at or above 0).
    pub fn steps<'b>(&self, allowed: &'b Steps, lease_now: u64) -> impl Iterator<Item = i64> + 'b {
        let wall = self.read(lease_now);
        let more = self.steps < allowed.max;
        allowed
            .sizes
            .iter()
            .copied()
            .filter(move |&by| more && wall.checked_add_signed(by).is_some())
    }

    /// Steps by `by` ms; elapsed time does not move.
    pub fn step(&mut self, by: i64) {
        self.offset += by;
        self.steps += 1;
    }

    /// Wall minus lease clock, ms.
    pub fn offset(&self) -> i64 {
        self.offset
    }
}
