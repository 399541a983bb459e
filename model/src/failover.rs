//! Model 2: a master, a replica that lags, failover and restart, with and
//! without the quarantine (`lock.max-ttl`).
//!
//! Clients acquire, renew and release on whichever node is the master now;
//! the master decides with [`lock`] and [`fence::next`] and sends each
//! change to the replica as an effect (`LOCK.APPLY`: the decided hold, or a
//! delete) that the replica applies later, in order. The master may crash
//! and either restart having lost its data (persistence off: the worst
//! case), or be replaced by the replica (failover: the effects not yet
//! applied are lost). A node that starts or is promoted begins its
//! [`Quarantine`] with `lock.max-ttl`, and `LOCK.ACQUIRE` gets nil while it
//! runs: the model passes the quarantine to `lock::acquire` as a barrier,
//! as `commands::acquire` does; leases are capped at `max_ttl`.
//!
//! Property: two clients never both believe they hold the lock at the same
//! instant (believe: it was told it holds it, and the lease it was told has
//! not ended). With `max_ttl` on it holds; with it off the checker finds the
//! counterexample (a hold the promoted replica never received).

use redislock_core::fence;
use redislock_core::lock::{self, Acquire, Barriers, Hold, Lock, Seen};
use redislock_core::quarantine::{Cause, Mode, Quarantine};
use stateright::{Model, Property};

use crate::Fence;

const OWNERS: [&[u8]; 3] = [b"f0", b"f1", b"f2"];

#[derive(Clone, Debug)]
pub struct Bounds {
    pub clients: usize,
    pub horizon: u64,
    /// The lease clients ask for (at most `max_ttl` when that is on).
    pub ttl: u64,
    /// `lock.max-ttl`: 0 turns the cap and the quarantine off.
    pub max_ttl: u64,
    /// Crashes (a restart or a failover each) in the whole run.
    pub crashes: u8,
    /// Commands per client.
    pub commands: u8,
    /// `true`: `LOCK.ACQUIRE` as `commands::acquire` decides since 26aade7
    /// — in quarantine it begins nothing and reenters nothing (`REENTER`,
    /// `RENEW`, which assert a hold the owner knows it has, still work).
    /// `false`: as before that commit — only a free lock got nil, and a
    /// hold the node shows for the caller was reentered, which the checker
    /// showed unsafe (`model/README.md`, "a released hold resurrected by a
    /// failover").
    pub quarantine_blocks_reentry: bool,
}

impl Bounds {
    pub fn quick() -> Bounds {
        Bounds {
            clients: 2,
            horizon: 4,
            ttl: 2,
            max_ttl: 2,
            crashes: 1,
            commands: 3,
            quarantine_blocks_reentry: true,
        }
    }

    pub fn full() -> Bounds {
        Bounds {
            clients: 3,
            horizon: 6,
            ttl: 2,
            max_ttl: 3,
            crashes: 2,
            commands: 4,
            quarantine_blocks_reentry: true,
        }
    }
}

#[derive(Clone, Debug)]
pub struct FailoverModel {
    pub bounds: Bounds,
}

/// A change the master made, as the replica receives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Effect {
    /// `LOCK.APPLY`: store this hold for this owner.
    Apply(u8, Hold),
    /// `DEL`: the lock is free.
    Del,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Node {
    key: Option<(u8, Hold)>,
    last_fence: u64,
    quarantine: Quarantine,
}

impl Node {
    fn empty() -> Node {
        Node {
            key: None,
            last_fence: 0,
            quarantine: Quarantine::default(),
        }
    }
}

#[derive(Clone, PartialEq, Eq, Hash)]
pub struct State {
    now: u64,
    master: Node,
    /// `None` once it was promoted (the model has one replica).
    replica: Option<Node>,
    /// Effects sent to the replica, not applied yet.
    stream: Vec<Effect>,
    crashes: u8,
    commands: Vec<u8>,
    /// Per client: the lease end it was told, while it believes it holds.
    beliefs: Vec<Option<u64>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Acquire {
        client: u8,
    },
    Renew {
        client: u8,
    },
    Release {
        client: u8,
    },
    /// The replica applies the next effect.
    Replicate,
    /// The master crashes and restarts with no data (persistence off).
    Restart,
    /// The master crashes; the replica is promoted.
    Failover,
    Tick,
}

impl State {
    fn current(&self) -> Option<Lock<'static>> {
        self.master.key.map(|(owner, hold)| Lock {
            owner: OWNERS[owner as usize],
            hold,
        })
    }

    /// The master stores a decision and sends it to the replica.
    fn store(&mut self, key: Option<(u8, Hold)>) {
        self.master.key = key;
        if self.replica.is_some() {
            self.stream.push(match key {
                Some((owner, hold)) => Effect::Apply(owner, hold),
                None => Effect::Del,
            });
        }
    }

    /// `commands::acquire` without `WAIT`.
    fn acquire(&mut self, client: usize, ttl: u64, blocks_reentry: bool) {
        let now = self.now;
        let current = self.current();
        let free = !current.is_some_and(|l| l.is_live(now));
        let barriers = Barriers {
            waiters: false,
            quarantined: (free || blocks_reentry) && self.master.quarantine.remaining(now) > 0,
        };
        let last = self.master.last_fence;
        let seen = Seen::exclusive(current, OWNERS[client], now);
        let decision = lock::acquire(seen, ttl, now, barriers, || fence::next(last, now));
        match decision {
            Ok(Acquire::Fresh(hold)) | Ok(Acquire::Reentered(hold)) => {
                self.master.last_fence = self.master.last_fence.max(hold.fence);
                self.store(Some((client as u8, hold)));
                self.beliefs[client] = Some(hold.expires_at);
            }
            Ok(Acquire::Busy) | Err(_) => {}
        }
    }

    fn renew(&mut self, client: usize, ttl: u64) {
        let own = lock::own_hold(self.current(), OWNERS[client], self.now);
        match lock::renew(own, ttl, self.now) {
            Ok(hold) => {
                self.store(Some((client as u8, hold)));
                self.beliefs[client] = Some(hold.expires_at);
            }
            Err(_) => self.beliefs[client] = None,
        }
    }

    fn release(&mut self, client: usize) {
        let own = lock::own_hold(self.current(), OWNERS[client], self.now);
        match lock::release(own, true) {
            Ok(None) => self.store(None),
            Ok(Some(hold)) => self.store(Some((client as u8, hold))),
            Err(_) => {}
        }
        self.beliefs[client] = None;
    }

    fn believers(&self) -> usize {
        self.beliefs
            .iter()
            .filter(|b| b.is_some_and(|until| !lock::ended(until, self.now)))
            .count()
    }
}

impl Model for FailoverModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            now: 0,
            master: Node::empty(),
            replica: Some(Node::empty()),
            stream: Vec::new(),
            crashes: 0,
            commands: vec![0; self.bounds.clients],
            beliefs: vec![None; self.bounds.clients],
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        let b = &self.bounds;
        for i in 0..b.clients {
            let client = i as u8;
            if s.commands[i] >= b.commands {
                continue;
            }
            if s.beliefs[i].is_some() {
                actions.push(Action::Renew { client });
                actions.push(Action::Release { client });
            } else {
                actions.push(Action::Acquire { client });
            }
        }
        if s.replica.is_some() && !s.stream.is_empty() {
            actions.push(Action::Replicate);
        }
        if s.crashes < b.crashes {
            actions.push(Action::Restart);
            if s.replica.is_some() {
                actions.push(Action::Failover);
            }
        }
        if s.now < b.horizon {
            actions.push(Action::Tick);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        // `ttl-ms` above `lock.max-ttl` is refused: clients ask within it.
        let ttl = match self.bounds.max_ttl {
            0 => self.bounds.ttl,
            cap => self.bounds.ttl.min(cap),
        };
        let max_ttl = self.bounds.max_ttl;
        match action {
            Action::Acquire { client } => {
                s.commands[client as usize] += 1;
                s.acquire(client as usize, ttl, self.bounds.quarantine_blocks_reentry);
            }
            Action::Renew { client } => {
                s.commands[client as usize] += 1;
                s.renew(client as usize, ttl);
            }
            Action::Release { client } => {
                s.commands[client as usize] += 1;
                s.release(client as usize);
            }
            Action::Replicate => {
                let effect = s.stream.remove(0);
                if let Some(replica) = &mut s.replica {
                    match effect {
                        Effect::Apply(owner, hold) => {
                            replica.key = Some((owner, hold));
                            // `LOCK.APPLY` observes the fence it carries.
                            replica.last_fence = replica.last_fence.max(hold.fence);
                        }
                        Effect::Del => replica.key = None,
                    }
                }
            }
            Action::Restart => {
                s.crashes += 1;
                let mut node = Node::empty();
                node.quarantine
                    .begin(Cause::Start, Mode::Always, max_ttl, 0, s.now);
                s.master = node;
                // The replica resynchronises from the restarted master.
                if s.replica.is_some() {
                    s.replica = Some(Node::empty());
                    s.stream.clear();
                }
            }
            Action::Failover => {
                s.crashes += 1;
                let mut promoted = s.replica.take()?;
                promoted
                    .quarantine
                    .begin(Cause::Promotion, Mode::Always, max_ttl, 0, s.now);
                s.master = promoted;
                s.stream.clear();
            }
            Action::Tick => s.now += 1,
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "two clients never both believe they hold the lock",
                |_, s: &State| s.believers() <= 1,
            ),
            Property::sometimes(
                "a client holds the lock after a failover",
                |_, s: &State| s.replica.is_none() && s.believers() == 1,
            ),
        ]
    }
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let node = |f: &mut std::fmt::Formatter<'_>, n: &Node| -> std::fmt::Result {
            match n.key {
                Some((owner, hold)) => write!(
                    f,
                    "held by f{owner} fence {} until {}",
                    Fence(hold.fence),
                    hold.expires_at
                )?,
                None => write!(f, "free")?,
            }
            let q = n.quarantine.remaining(self.now);
            if q > 0 {
                write!(f, ", quarantine {q} more")?;
            }
            Ok(())
        };
        write!(f, "t={} | master: ", self.now)?;
        node(f, &self.master)?;
        match &self.replica {
            Some(r) => {
                write!(f, " | replica: ")?;
                node(f, r)?;
                if !self.stream.is_empty() {
                    write!(f, " ({} effects not applied)", self.stream.len())?;
                }
            }
            None => write!(f, " | (replica promoted)")?,
        }
        for (i, b) in self.beliefs.iter().enumerate() {
            if let Some(until) = b {
                write!(f, " | f{i} believes it holds until {until}")?;
            }
        }
        Ok(())
    }
}
