//! Whether a master that may be cut off from its replicas may write on its
//! own (hand-offs, lease-end grants, timers) and take fresh lock commands.
//!
//! Redis's `min-replicas-to-write N` / `min-replicas-max-lag L` make a master
//! refuse clients' writes once fewer than N replicas have acknowledged within
//! L seconds (`INFO replication`'s `min_slaves_good_slaves`). A module's
//! timers are not clients: the module must ask the same question itself, or
//! an isolated master goes on handing locks to its waiters.
//!
//! Redis's answer alone is not enough after a partition heals. The
//! acknowledgements a replica sent before Sentinel moved it to the new
//! master arrive late, and make the old master count it as good again for
//! a moment (until the closed connection is noticed): Redis then accepts
//! writes on a master that has been replaced. So once replicas were found
//! missing, the module stays shut until enough replicas have acknowledged a
//! write made *after* that: it writes a marker (`LOCK.LASTFENCE`, harmless
//! to apply again) and waits for acknowledged offsets past the replication
//! offset seen before it. An acknowledgement sent before the cut cannot
//! reach past an offset read after it; a replica that follows another master
//! never receives the marker.
//!
//! Pure: the glue (`ffi::partition`) reads `INFO replication` and the
//! settings, feeds them here, and writes the marker when told to.

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

    /// How long after its replicas last acknowledged an isolated master may
    /// still take writes, in ms as Redis counts the lag (0: not bounded by
    /// these settings).
    pub fn lag_ms(self) -> u64 {
        if self.active() {
            self.max_lag_s.saturating_mul(1000)
        } else {
            0
        }
    }
}

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
    /// Replicate the marker, then call [`Partition::marker_written`] with
    /// this target (the offset seen before it, plus one).
    WriteMarker {
        target: u64,
    },
}

/// Where the master is in proving that its replicas follow it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
enum Proof {
    /// Nothing missing was seen since the last proof.
    #[default]
    None,
    /// Replicas were missing (or this node was not a master): a marker must
    /// be written once Redis counts enough replicas again.
    Due,
    /// The marker is out: enough replicas must acknowledge `target`.
    Awaiting { target: u64 },
}

/// The gate's state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Partition {
    settings: Settings,
    proof: Proof,
    open: bool,
}

impl Partition {
    /// A node that has seen nothing yet: shut until the first view, if the
    /// settings ask for replicas.
    pub fn new(settings: Settings) -> Partition {
        let mut p = Partition::default();
        p.configure(settings);
        p
    }

    /// The settings changed (or were read for the first time).
    pub fn configure(&mut self, settings: Settings) {
        self.settings = settings;
        if settings.active() {
            // Until a view shows replicas following: they may not be.
            self.proof = Proof::Due;
            self.open = false;
        } else {
            self.proof = Proof::None;
            self.open = true;
        }
    }

    pub fn settings(&self) -> Settings {
        self.settings
    }

    /// Whether the module may write on its own, and take fresh lock
    /// commands, as far as replicas go (a pause and the role are checked
    /// apart).
    pub fn open(&self) -> bool {
        self.open
    }

    /// Takes a new view of the replicas.
    pub fn observe(&mut self, view: &View) -> Action {
        if !self.settings.active() {
            self.proof = Proof::None;
            self.open = true;
            return Action::Nothing;
        }
        if !view.master || view.good < self.settings.min_replicas {
            // Redis refuses writes (or this is a replica): so do we, and
            // once they are back, they must show they follow this master.
            self.proof = Proof::Due;
            self.open = false;
            return Action::Nothing;
        }
        match self.proof {
            Proof::None => {
                self.open = true;
                Action::Nothing
            }
            Proof::Due => {
                self.open = false;
                Action::WriteMarker {
                    target: view.offset.saturating_add(1),
                }
            }
            Proof::Awaiting { target } => {
                let following = view.acked.iter().filter(|&&at| at >= target).count();
                if following as u64 >= self.settings.min_replicas {
                    self.proof = Proof::None;
                    self.open = true;
                } else {
                    self.open = false;
                }
                Action::Nothing
            }
        }
    }

    /// The marker asked for by [`Action::WriteMarker`] was replicated.
    pub fn marker_written(&mut self, target: u64) {
        if self.proof == Proof::Due {
            self.proof = Proof::Awaiting { target };
        }
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

    /// A gate that has proved its replicas once.
    fn proved() -> Partition {
        let mut p = Partition::new(ON);
        let Action::WriteMarker { target } = p.observe(&view(1, 100, &[100])) else {
            panic!("a fresh gate asks for a marker");
        };
        p.marker_written(target);
        p.observe(&view(1, 120, &[120]));
        assert!(p.open());
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
            assert!(p.open(), "{settings:?}");
            assert_eq!(p.observe(&view(0, 5, &[])), Action::Nothing);
            assert!(p.open(), "{settings:?}");
            assert_eq!(settings.lag_ms(), 0);
        }
    }

    #[test]
    fn the_gate_shuts_whenever_redis_refuses_writes() {
        let mut p = proved();
        // (view, open after it)
        let table = [
            (view(1, 130, &[130]), true),
            (view(0, 140, &[130]), false),
            // The same replica back with its old acknowledgement only.
            (view(1, 150, &[130]), false),
        ];
        for (v, open) in table {
            p.observe(&v);
            assert_eq!(p.open(), open, "{v:?}");
        }
    }

    #[test]
    fn late_acknowledgements_after_a_heal_do_not_reopen_it() {
        let mut p = proved();
        // Cut: the replica's last acknowledgement was offset 200; the
        // isolated master wrote up to 260 before Redis refused.
        p.observe(&view(0, 260, &[200]));
        assert!(!p.open());
        // Heal: late acknowledgements make Redis count the replica good.
        let Action::WriteMarker { target } = p.observe(&view(1, 260, &[200])) else {
            panic!("asks for a marker");
        };
        assert_eq!(target, 261);
        assert!(!p.open(), "shut until the marker is acknowledged");
        p.marker_written(target);
        for stale in [200, 255, 260] {
            p.observe(&view(1, 300, &[stale]));
            assert!(!p.open(), "an acknowledgement of {stale} proves nothing");
        }
        // A replica that follows this master acknowledges the marker.
        p.observe(&view(1, 300, &[300]));
        assert!(p.open());
    }

    #[test]
    fn it_takes_as_many_following_replicas_as_redis_asks_for() {
        let two = Settings {
            min_replicas: 2,
            max_lag_s: 10,
        };
        let mut p = Partition::new(two);
        let Action::WriteMarker { target } = p.observe(&view(2, 50, &[50, 50])) else {
            panic!("asks for a marker");
        };
        p.marker_written(target);
        p.observe(&view(2, 80, &[80, 50]));
        assert!(!p.open(), "one of two follows");
        p.observe(&view(2, 90, &[90, 80]));
        assert!(p.open());
        assert_eq!(two.lag_ms(), 10_000);
    }

    #[test]
    fn a_replica_is_shut_and_proves_its_replicas_once_promoted() {
        let mut p = proved();
        let replica = View {
            master: false,
            ..view(0, 0, &[])
        };
        p.observe(&replica);
        assert!(!p.open());
        // Promoted, its new replicas attached: a marker first.
        assert!(matches!(
            p.observe(&view(1, 10, &[10])),
            Action::WriteMarker { target: 11 }
        ));
        assert!(!p.open());
    }

    #[test]
    fn new_settings_ask_for_a_new_proof() {
        let mut p = proved();
        p.configure(Settings {
            min_replicas: 2,
            max_lag_s: 1,
        });
        assert!(!p.open());
        p.configure(Settings::default());
        assert!(p.open());
    }

    #[test]
    fn a_marker_never_written_keeps_the_gate_shut() {
        let mut p = Partition::new(ON);
        for offset in [10, 20, 30] {
            assert!(matches!(
                p.observe(&view(1, offset, &[offset])),
                Action::WriteMarker { .. }
            ));
            assert!(!p.open());
        }
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
