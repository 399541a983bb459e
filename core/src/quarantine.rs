//! The quarantine: after a start or a promotion, a node begins no fresh hold
//! for `lock.max-ttl` ms; after a promotion, plus `min-replicas-max-lag`.
//!
//! Why it is enough: every hold this node (or the master it replaced) may
//! have forgotten — an acquisition its replica never received, an AOF write
//! not yet on disk — was granted or renewed before that moment with a lease
//! of at most `lock.max-ttl`. Once the quarantine is over, every such lease
//! has ended, so granting again cannot give a lock to a second live holder.
//! A master cut off from its replicas may go on granting after it was
//! replaced, until its replicas gate (`partition`) refuses: no later than
//! `min-replicas-max-lag`, counted in ms, after the last marker a replica
//! received, which was before the cut and so before the promotion. A
//! promoted node waits that lag too, so those grants have ended as well.
//!
//! Pure: time is the monotonic clock in ms, passed in (a wall clock that
//! jumps must not shorten the quarantine).

use std::ffi::CStr;

use crate::handoff::Gate;
use crate::lock;

/// When a quarantine applies (`lock.quarantine`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// After a start and after a promotion (the default).
    Always,
    /// After a promotion only: for servers whose AOF is fsynced on every
    /// write, so a restart forgets nothing.
    Promotion,
    /// Never.
    Never,
}

impl Mode {
    /// The config's words, in the order of their numbers.
    pub const NAMES: [&'static CStr; 3] = [c"always", c"promotion", c"never"];

    pub fn from_index(i: i32) -> Option<Mode> {
        match i {
            0 => Some(Mode::Always),
            1 => Some(Mode::Promotion),
            2 => Some(Mode::Never),
            _ => None,
        }
    }

    pub fn index(self) -> i32 {
        self as i32
    }
}

/// What may have made this node forget holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// The module was loaded: at start-up (from the end of loading the
    /// data), or by `MODULE LOAD`.
    Start,
    /// This node became a master.
    Promotion,
}

/// The quarantine's state: when it ends, on the monotonic clock.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Quarantine {
    until: u64,
}

impl Quarantine {
    /// `cause` happened at `now` with the configs `mode` and `max_ttl_ms`
    /// (0: no cap, so no quarantine), and `lag_ms`, how long an isolated
    /// master may still grant after the last marker its replicas received
    /// (`min-replicas-max-lag` in ms, as the replicas gate enforces it; 0
    /// when the gate does not ask for replicas), which a promotion adds. Returns whether one
    /// (re)started; a running one only ever gets longer.
    pub fn begin(
        &mut self,
        cause: Cause,
        mode: Mode,
        max_ttl_ms: u64,
        lag_ms: u64,
        now: u64,
    ) -> bool {
        let applies = match (mode, cause) {
            (Mode::Never, _) => false,
            (Mode::Promotion, Cause::Start) => false,
            (Mode::Always, _) | (Mode::Promotion, Cause::Promotion) => true,
        };
        if !applies || max_ttl_ms == 0 {
            return false;
        }
        // A hold granted up to `now` (before `now + lag_ms` by a master
        // that lost its replicas before `now` and was replaced) with a
        // lease of at most `max_ttl_ms` runs through that plus
        // `max_ttl_ms`: it has ended one ms later. A restart replaced
        // nobody: its old self is gone.
        let lag_ms = match cause {
            Cause::Promotion => lag_ms,
            Cause::Start => 0,
        };
        let last_lease_end = now.saturating_add(lag_ms).saturating_add(max_ttl_ms);
        self.until = self.until.max(lock::first_ended_ms(last_lease_end));
        true
    }

    /// Ms left at `now` (0: none).
    pub fn remaining(&self, now: u64) -> u64 {
        self.until.saturating_sub(now)
    }

    /// Whether fresh holds may begin at `now`.
    pub fn gate(&self, now: u64) -> Gate {
        match self.remaining(now) {
            0 => Gate::Open,
            ms => Gate::Closed { retry_in_ms: ms },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 5_000;

    #[test]
    fn which_causes_start_a_quarantine() {
        // (mode, cause, starts?)
        let table = [
            (Mode::Always, Cause::Start, true),
            (Mode::Always, Cause::Promotion, true),
            (Mode::Promotion, Cause::Start, false),
            (Mode::Promotion, Cause::Promotion, true),
            (Mode::Never, Cause::Start, false),
            (Mode::Never, Cause::Promotion, false),
        ];
        for (mode, cause, starts) in table {
            let mut q = Quarantine::default();
            assert_eq!(
                q.begin(cause, mode, 1_000, 0, NOW),
                starts,
                "{mode:?} {cause:?}"
            );
            // Through the last ms of a lease granted now: 1,000 + 1.
            let want = if starts { 1_001 } else { 0 };
            assert_eq!(q.remaining(NOW), want, "{mode:?} {cause:?}");
        }
    }

    #[test]
    fn no_cap_means_no_quarantine() {
        let mut q = Quarantine::default();
        assert!(!q.begin(Cause::Promotion, Mode::Always, 0, 2_000, NOW));
        assert_eq!(q.gate(NOW), Gate::Open);
    }

    #[test]
    fn the_gate_closes_for_max_ttl_then_opens() {
        let mut q = Quarantine::default();
        q.begin(Cause::Start, Mode::Always, 1_000, 0, NOW);
        let table = [
            (NOW, Gate::Closed { retry_in_ms: 1_001 }),
            // A lease of 1,000 granted at NOW still runs in this ms.
            (NOW + 1_000, Gate::Closed { retry_in_ms: 1 }),
            (NOW + 1_001, Gate::Open),
            (NOW + 50_000, Gate::Open),
        ];
        for (now, gate) in table {
            assert_eq!(q.gate(now), gate, "at {now}");
        }
    }

    #[test]
    fn a_quarantine_only_grows() {
        let mut q = Quarantine::default();
        q.begin(Cause::Start, Mode::Always, 1_000, 0, NOW);
        q.begin(Cause::Promotion, Mode::Always, 10, 0, NOW + 100); // shorter: kept
        assert_eq!(q.remaining(NOW), 1_001);
        q.begin(Cause::Promotion, Mode::Always, 2_000, 0, NOW + 100);
        assert_eq!(q.remaining(NOW), 2_101);
    }

    #[test]
    fn a_promotion_adds_the_replica_lag_and_a_start_does_not() {
        // (cause, max-ttl, lag, ms left at NOW)
        let table = [
            // An isolated master grants up to 1 s after the cut; its holds
            // run 1 s more, through their last ms.
            (Cause::Promotion, 1_000, 1_000, 2_001),
            (Cause::Promotion, 1_000, 0, 1_001),
            (Cause::Promotion, 60_000, 10_000, 70_001),
            // A restart replaced no master: no lag to wait for.
            (Cause::Start, 1_000, 1_000, 1_001),
            // No cap, no quarantine, lag or not.
            (Cause::Promotion, 0, 1_000, 0),
        ];
        for (cause, max_ttl, lag, left) in table {
            let mut q = Quarantine::default();
            q.begin(cause, Mode::Always, max_ttl, lag, NOW);
            assert_eq!(q.remaining(NOW), left, "{cause:?} {max_ttl} {lag}");
            // Open exactly when the last lease has ended.
            assert_eq!(q.gate(NOW + left), Gate::Open, "{cause:?} {max_ttl} {lag}");
        }
    }

    #[test]
    fn modes_round_trip_through_their_config_numbers() {
        for (i, name) in Mode::NAMES.iter().enumerate() {
            let mode = Mode::from_index(i as i32).unwrap_or_else(|| panic!("{name:?}"));
            assert_eq!(mode.index(), i as i32);
        }
        assert_eq!(Mode::from_index(3), None);
    }
}
