//! Whether a master that may be cut off from its replicas may write on its
//! own (hand-offs, lease-end grants, timers) and take fresh lock commands.
//!
//! Redis's `min-replicas-to-write N` / `min-replicas-max-lag L` make a master
//! refuse clients' writes once fewer than N replicas have acknowledged within
//! L seconds. But Redis counts that lag in whole seconds of its cached wall
//! clock, recounts once a second, and replicas acknowledge once a second: an
//! isolated master with a lag of 1 s takes writes for up to about 3 s after
//! the cut (2.7 s measured), while the promoted replica's quarantine only
//! waits the lag. The module's own gate therefore counts in milliseconds.
//!
//! How: at most once per probe interval the master takes a *probe* — the
//! moment `at` (monotonic ms) and its replication offset then — and writes a
//! marker, so that the stream grows past that offset. A replica whose
//! acknowledged offset reaches past the probe's offset has received bytes
//! written after `at`: it was alive and following this master at `at` or
//! later. A replica is good while its newest probe so proved is younger than
//! the lag; the gate is open while at least N replicas are good (and Redis
//! itself counts N good replicas). So the gate shuts no later than the lag
//! after the last probe any replica received before a cut: before
//! `cut + lag`. Acknowledgements that arrive late, after a partition heals,
//! prove only what they proved when they were sent: they cannot reopen the
//! gate for longer than that.
//!
//! Pure: the glue (`ffi::partition`) reads `INFO replication`, the settings
//! and the monotonic clock, feeds them here, and writes the marker when told.

/// Redis's `min-replicas-to-write` and `min-replicas-max-lag` (seconds).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Settings {
    pub min_replicas: u64,
    pub max_lag_s: u64,
}

impl Settings {
    /// Whether Redis refuses writes for lack of replicas at all: only with
    /// both set, as Redis reads them.
    pub fn active(self) -> bool {
        self.min_replicas > 0 && self.max_lag_s > 0
    }

    /// How long after the last probe its replicas received an isolated
    /// master may still grant, in ms (0: not bounded by these settings).
    /// The gate enforces it to the ms; a promoted node's quarantine adds it.
    pub fn lag_ms(self) -> u64 {
        if self.active() {
            self.max_lag_s.saturating_mul(1000)
        } else {
            0
        }
    }

    /// The least time between two probes: a sixteenth of the lag, so that a
    /// replica that follows always has a probe much younger than the lag to
    /// acknowledge, while a long lag costs few markers (the glue also takes
    /// at most one per cron tick).
    pub fn probe_interval_ms(self) -> u64 {
        self.lag_ms() / PROBE_FRACTION
    }
}

/// The probe interval is the lag divided by this.
pub const PROBE_FRACTION: u64 = 16;

/// Probes kept: those younger than the lag, at most one per interval, fit.
const PROBES: usize = PROBE_FRACTION as usize + 2;

/// What `INFO replication` shows at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct View {
    /// This node is a master.
    pub master: bool,
    /// `min_slaves_good_slaves`: replicas Redis counts as good now.
    pub good: u64,
    /// `master_repl_offset`.
    pub offset: u64,
    /// The acknowledged offset of each replica online.
    pub acked: Vec<u64>,
}

/// What the glue must do after [`Partition::observe`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Nothing,
    /// A probe was taken: replicate a marker (and ask the replicas to
    /// acknowledge), so that the stream grows past the probe's offset.
    WriteMarker,
}

/// A moment and the offset a replica must have acknowledged to prove it
/// received something written after it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
struct Probe {
    at: u64,
    target: u64,
}

/// The gate's state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Partition {
    settings: Settings,
    /// Oldest first; times and targets rise; `len` of them are in use.
    probes: [Probe; PROBES],
    len: usize,
    /// The gate is open at `now` while `now < open_until` (ms).
    open_until: u64,
}

impl Partition {
    /// A node that has seen nothing yet: shut until a replica has proved it
    /// follows, if the settings ask for replicas.
    pub fn new(settings: Settings) -> Partition {
        let mut p = Partition::default();
        p.configure(settings);
        p
    }

    /// The settings changed (or were read for the first time): the probes
    /// taken so far prove nothing about a new lag.
    pub fn configure(&mut self, settings: Settings) {
        self.settings = settings;
        self.len = 0;
        self.open_until = if settings.active() { 0 } else { u64::MAX };
    }

    pub fn settings(&self) -> Settings {
        self.settings
    }

    /// Whether the module may write on its own, and take fresh lock
    /// commands, at `now` as far as replicas go (a pause and the role are
    /// checked apart).
    pub fn open(&self, now: u64) -> bool {
        now < self.open_until
    }

    /// Until when the gate is open, as far as the last view shows (`u64::MAX`:
    /// the settings do not ask for replicas; at or before `now`: shut).
    pub fn open_until(&self) -> u64 {
        self.open_until
    }

    /// Takes a view of the replicas at `now`; asks for a marker when a probe
    /// is due.
    pub fn observe(&mut self, view: &View, now: u64) -> Action {
        let settings = self.settings;
        if !settings.active() {
            self.len = 0;
            self.open_until = u64::MAX;
            return Action::Nothing;
        }
        if !view.master {
            // A replica grants nothing; offsets seen as a master may not
            // continue once it is one again.
            self.len = 0;
            self.open_until = 0;
            return Action::Nothing;
        }
        let lag = settings.lag_ms();
        self.forget_before(now.saturating_sub(lag));
        self.open_until = if view.good < settings.min_replicas {
            // Redis refuses its clients' writes: the module's own too.
            0
        } else {
            self.nth_credit(&view.acked)
                .map_or(0, |at| at.saturating_add(lag))
        };
        let enough = view.acked.len() as u64 >= settings.min_replicas;
        let due = self
            .newest()
            .is_none_or(|p| now >= p.at.saturating_add(settings.probe_interval_ms()));
        if enough && due {
            self.take_probe(now, view.offset.saturating_add(1));
            Action::WriteMarker
        } else {
            Action::Nothing
        }
    }

    /// When the `min_replicas`-th best replica last proved it follows: the
    /// newest probe each acknowledged offset reaches.
    fn nth_credit(&self, acked: &[u64]) -> Option<u64> {
        let mut credits: Vec<u64> = acked
            .iter()
            .filter_map(|&offset| {
                self.live()
                    .iter()
                    .rev()
                    .find(|p| p.target <= offset)
                    .map(|p| p.at)
            })
            .collect();
        credits.sort_unstable_by(|a, b| b.cmp(a));
        let n = usize::try_from(self.settings.min_replicas).ok()?;
        credits.get(n.checked_sub(1)?).copied()
    }

    fn live(&self) -> &[Probe] {
        &self.probes[..self.len]
    }

    fn newest(&self) -> Option<Probe> {
        self.live().last().copied()
    }

    /// Drops probes taken before `cutoff`: they can keep nothing open.
    fn forget_before(&mut self, cutoff: u64) {
        let old = self.live().iter().take_while(|p| p.at < cutoff).count();
        self.probes.copy_within(old..self.len, 0);
        self.len -= old;
    }

    fn take_probe(&mut self, at: u64, target: u64) {
        if let Some(last) = self.newest() {
            if last.target == target {
                // Nothing was written since: the same offset, proved later.
                self.probes[self.len - 1].at = at;
                return;
            }
            if last.target > target {
                // The offset went back (never on one master): start again.
                self.len = 0;
            }
        }
        if self.len == PROBES {
            // Only after the interval shrank under us; losing the oldest
            // only shuts the gate sooner.
            self.forget_before(self.probes[1].at);
        }
        self.probes[self.len] = Probe { at, target };
        self.len += 1;
    }
}

/// What keeps failover safety under partitions from this configuration:
/// empty when `INFO lock` may say `partition_safe:1`.
pub fn unsafe_because(
    max_ttl_ms: u64,
    quarantine_never: bool,
    settings: Settings,
) -> Vec<&'static str> {
    let mut why = Vec::new();
    if max_ttl_ms == 0 {
        why.push("lock.max-ttl is 0 (no lease cap, no quarantine)");
    }
    if quarantine_never {
        why.push("lock.quarantine is never");
    }
    if settings.min_replicas == 0 {
        why.push("min-replicas-to-write is 0 (an isolated master keeps taking writes)");
    }
    if settings.max_lag_s == 0 {
        why.push("min-replicas-max-lag is 0 (an isolated master keeps taking writes)");
    }
    why
}

#[cfg(test)]
mod tests {
    use super::*;

    const ON: Settings = Settings {
        min_replicas: 1,
        max_lag_s: 1,
    };

    fn view(good: u64, offset: u64, acked: &[u64]) -> View {
        View {
            master: true,
            good,
            offset,
            acked: acked.to_vec(),
        }
    }

    /// A gate whose one replica acknowledged everything up to a probe
    /// taken at `at` (offset 100 then).
    fn proved_at(at: u64) -> Partition {
        let mut p = Partition::new(ON);
        assert_eq!(p.observe(&view(1, 100, &[100]), at), Action::WriteMarker);
        assert!(!p.open(at), "nothing proved yet");
        // The marker and the acknowledgement come back before the next look.
        p.observe(&view(1, 150, &[150]), at + 10);
        assert!(p.open(at + 10));
        p
    }

    #[test]
    fn without_the_settings_the_gate_is_always_open() {
        for settings in [
            Settings::default(),
            Settings {
                min_replicas: 1,
                max_lag_s: 0,
            },
            Settings {
                min_replicas: 0,
                max_lag_s: 10,
            },
        ] {
            let mut p = Partition::new(settings);
            assert!(p.open(0), "{settings:?}");
            assert_eq!(p.observe(&view(0, 5, &[]), 0), Action::Nothing);
            assert!(p.open(u64::MAX - 1), "{settings:?}");
            assert_eq!(settings.lag_ms(), 0);
        }
    }

    #[test]
    fn the_gate_stays_open_exactly_the_lag_after_the_last_probe_acknowledged() {
        let p = proved_at(5_000);
        // (now, open): the probe at 5,000 was acknowledged, nothing since.
        let table = [
            (5_010, true),
            (5_999, true),
            (6_000, false),
            (60_000, false),
        ];
        for (now, open) in table {
            assert_eq!(p.open(now), open, "at {now}");
        }
    }

    #[test]
    fn a_replica_that_stops_acknowledging_shuts_the_gate_within_the_lag() {
        let mut p = Partition::new(ON);
        // A look every 100 ms, a probe at each, the stream growing 20 bytes
        // between looks (the marker). The replica acknowledges what it
        // received until the cut at 1,250: the last marker it received is
        // the one after the probe of 1,200 (offset 240): it acknowledged 250.
        let mut offset = 0;
        for now in (0..=3_000).step_by(100) {
            let acked = if now <= 1_250 { offset } else { 250 };
            p.observe(&view(1, offset, &[acked]), now);
            offset += 20;
            // Looks after the cut change nothing: shut from 1,200 + 1,000.
            for at in [now, now + 99] {
                let open = (100..2_200).contains(&at);
                assert_eq!(p.open(at), open, "at {at}, looked at {now}");
            }
        }
    }

    #[test]
    fn late_acknowledgements_prove_only_when_they_were_sent() {
        let mut p = Partition::new(ON);
        // Probes at 0 (offset 100) and 100 (offset 200); the replica's
        // acknowledgement of 200 is held up in the network.
        p.observe(&view(1, 100, &[100]), 0);
        p.observe(&view(1, 200, &[150]), 100);
        assert!(p.open(100), "the probe at 0 is proved");
        // Shut by 1,000; at 1,500 the late acknowledgement arrives (and
        // Redis counts the replica good again): it proves the probe at
        // 100, which opens nothing after 1,100.
        p.observe(&view(0, 300, &[150]), 1_000);
        assert!(!p.open(1_000));
        p.observe(&view(1, 300, &[201]), 1_050);
        assert!(p.open(1_050), "proved at 100, good until 1,100");
        assert!(!p.open(1_100));
        p.observe(&view(1, 300, &[201]), 1_500);
        assert!(!p.open(1_500), "a late acknowledgement reopens nothing");
        // A replica that follows acknowledges a fresh probe.
        assert_eq!(p.observe(&view(1, 300, &[201]), 1_600), Action::WriteMarker);
        p.observe(&view(1, 320, &[320]), 1_700);
        assert!(p.open(1_700));
        assert!(p.open(2_599) && !p.open(2_600));
    }

    #[test]
    fn the_gate_shuts_whenever_redis_refuses_writes() {
        let mut p = proved_at(0);
        p.observe(&view(0, 150, &[150]), 20);
        assert!(!p.open(20), "Redis counts no good replica");
        p.observe(&view(1, 150, &[150]), 30);
        assert!(p.open(30), "the probe at 0 still proves the replica");
    }

    #[test]
    fn it_takes_as_many_good_replicas_as_redis_asks_for() {
        let two = Settings {
            min_replicas: 2,
            max_lag_s: 10,
        };
        let mut p = Partition::new(two);
        // Probes at 0 (offset 50) and 1,000 (offset 80).
        p.observe(&view(2, 50, &[50, 50]), 0);
        p.observe(&view(2, 80, &[80, 50]), 1_000);
        assert!(!p.open(1_000), "neither proved yet");
        // One replica proves the probe at 1,000, the other the one at 0:
        // the second best counts.
        p.observe(&view(2, 90, &[90, 51]), 1_010);
        assert!(p.open(9_999) && !p.open(10_000));
        p.observe(&view(2, 90, &[90, 81]), 1_020);
        assert!(p.open(10_999) && !p.open(11_000));
        // One replica only.
        p.observe(&view(2, 90, &[90]), 1_030);
        assert!(!p.open(1_030));
        assert_eq!(two.lag_ms(), 10_000);
    }

    #[test]
    fn probes_come_at_most_once_an_interval_and_stay_few() {
        for (lag_s, interval) in [(1, 62), (10, 625)] {
            let settings = Settings {
                min_replicas: 1,
                max_lag_s: lag_s,
            };
            assert_eq!(settings.probe_interval_ms(), interval);
            let mut p = Partition::new(settings);
            let mut markers = 0;
            // A look every 10 ms for 60 s, writes between them, the
            // replica a look behind.
            let mut offset = 0;
            for now in (0..60_000).step_by(10) {
                if p.observe(&view(1, offset + 7, &[offset]), now) == Action::WriteMarker {
                    markers += 1;
                }
                offset += 7;
                assert!(p.len <= PROBES);
                assert!(
                    p.open(now) || now < 20,
                    "a following replica keeps it open at {now}"
                );
            }
            // One per interval, rounded up to the next look.
            assert!(
                (60_000 / (interval + 10)..=60_000 / interval).contains(&markers),
                "lag {lag_s} s: {markers} markers in 60 s"
            );
        }
    }

    #[test]
    fn a_probe_with_nothing_written_since_replaces_the_last() {
        let mut p = Partition::new(ON);
        for now in [0, 100, 200, 300] {
            p.observe(&view(1, 100, &[100]), now);
        }
        assert_eq!(p.len, 1);
        // The replica acknowledges the marker: proved at 300.
        p.observe(&view(1, 120, &[120]), 350);
        assert!(p.open(1_299) && !p.open(1_300));
    }

    #[test]
    fn no_marker_while_too_few_replicas_are_online() {
        let mut p = Partition::new(ON);
        assert_eq!(p.observe(&view(0, 10, &[]), 0), Action::Nothing);
        assert!(!p.open(0));
        assert_eq!(p.observe(&view(1, 10, &[10]), 100), Action::WriteMarker);
    }

    #[test]
    fn a_replica_is_shut_and_proves_its_replicas_again_once_promoted() {
        let mut p = proved_at(0);
        let replica = View {
            master: false,
            ..view(0, 0, &[])
        };
        p.observe(&replica, 100);
        assert!(!p.open(100));
        // Promoted, its replicas attached: the old probes count for nothing.
        assert_eq!(p.observe(&view(1, 150, &[150]), 200), Action::WriteMarker);
        assert!(!p.open(200));
        p.observe(&view(1, 170, &[170]), 210);
        assert!(p.open(210));
    }

    #[test]
    fn new_settings_ask_for_a_new_proof() {
        let mut p = proved_at(0);
        p.configure(Settings {
            min_replicas: 2,
            max_lag_s: 1,
        });
        assert!(!p.open(20));
        p.configure(Settings::default());
        assert!(p.open(20));
    }

    #[test]
    fn reasons_name_every_missing_setting() {
        assert!(unsafe_because(1_000, false, ON).is_empty());
        let why = unsafe_because(0, true, Settings::default());
        assert_eq!(why.len(), 4, "{why:?}");
        let why = unsafe_because(
            1_000,
            false,
            Settings {
                min_replicas: 1,
                max_lag_s: 0,
            },
        );
        assert_eq!(
            why,
            ["min-replicas-max-lag is 0 (an isolated master keeps taking writes)"]
        );
    }
}
