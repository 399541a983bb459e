//! Model 3: Redlock over three independent servers, with fences.
//!
//! A client asks each server for the lock (`LOCK.ACQUIRE`, decided by
//! [`lock::acquire`] with a fence from [`fence::next`] on that server's own
//! counter). Once a majority said yes it takes the highest fence they
//! returned and, with the FENCE round on, raises each server of that
//! majority to it (`LOCK.FENCE`: the hold's fence becomes
//! `max(fence, min_fence)` and the server's counter observes it); it hands
//! the fence out only when a majority answered that round. Servers crash
//! (losing everything: key and counter, persistence off) and restart at a
//! later tick; leases end as time ticks.
//!
//! Property: every fence handed out is higher than every fence handed out
//! before its attempt began. With the FENCE round it holds; without it the checker finds
//! the counterexample (a server of the new majority never saw the old
//! fence, so its counter is below it).
//! The FENCE step is the core's [`lock::fence`] plus the counter raise
//! that `commands::fence` does (`fence::observe`).

use std::fmt;

use redislock_core::fence;
use redislock_core::lock::{self, Acquire, Barriers, Hold, Lock, Seen};
use stateright::{Model, Property};

use crate::Fence;

const SERVERS: usize = 3;
const MAJORITY: usize = SERVERS / 2 + 1;
const OWNERS: [&[u8]; 3] = [b"r0", b"r1", b"r2"];

/// The bounds of one run.
#[derive(Clone, Debug)]
pub struct Bounds {
    pub clients: usize,
    /// Time runs from 0 to this tick.
    pub horizon: u64,
    pub ttl: u64,
    /// Lock attempts per client.
    pub attempts: u8,
    /// Server crashes in the whole run.
    pub crashes: u8,
    /// Whether clients run the FENCE round before handing a fence out.
    pub fence_round: bool,
}

impl Bounds {
    /// Small enough for `make test`.
    pub fn quick() -> Bounds {
        Bounds {
            clients: 2,
            horizon: 2,
            ttl: 2,
            attempts: 1,
            crashes: 1,
            fence_round: true,
        }
    }

    /// A full run of `make model`: each client tries twice.
    pub fn full() -> Bounds {
        Bounds {
            attempts: 2,
            ..Bounds::quick()
        }
    }

    /// A full run of `make model`: three clients, two crashes.
    pub fn three_clients() -> Bounds {
        Bounds {
            clients: 3,
            horizon: 2,
            ttl: 2,
            attempts: 1,
            crashes: 2,
            fence_round: true,
        }
    }
}

#[derive(Clone, Debug)]
pub struct RedlockModel {
    pub bounds: Bounds,
}

/// One server: its lock key and its fence counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Server {
    up: bool,
    /// Down since this tick (it restarts at a later one).
    crashed_at: u64,
    /// The lock: owner (client index) and hold.
    key: Option<(u8, Hold)>,
    /// What `fence::issue` keeps globally on a real server.
    last_fence: u64,
}

/// A client's answer from one server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Answer {
    NotAsked,
    Yes(u64),
    No,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Phase {
    Idle,
    /// Asking each server for the lock.
    Acquiring([Answer; SERVERS]),
    /// A majority said yes; raising them to `fence` (`NotAsked`: to ask).
    Fencing {
        fence: u64,
        acks: [Answer; SERVERS],
    },
    /// The fence was handed out.
    Holding {
        fence: u64,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Client {
    phase: Phase,
    attempts: u8,
    /// When the current attempt began: every lease it won ends at
    /// `started + ttl` or later, so the holds are all valid before then.
    started: u64,
    /// The highest fence handed out (to anyone) before this attempt began:
    /// the fence this attempt hands out must be above it.
    to_beat: u64,
}

#[derive(Clone, PartialEq, Eq, Hash)]
pub struct State {
    now: u64,
    servers: [Server; SERVERS],
    clients: Vec<Client>,
    crashes: u8,
    /// Fences handed out, in order.
    handed: Vec<u64>,
    /// A fence handed out was not above every fence handed out before
    /// its attempt began.
    broken: bool,
    /// A fence was handed out while another client still held one (a
    /// crash lost a hold: Redlock without delayed restarts).
    two_holders: bool,
    /// A server restarted and a fence was handed out after it.
    handed_after_restart: bool,
    restarted: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// The client starts an attempt.
    Start {
        client: u8,
    },
    /// `LOCK.ACQUIRE key owner ttl` on one server.
    Acquire {
        client: u8,
        server: u8,
    },
    /// `LOCK.FENCE key owner fence` on one server of the majority.
    Fence {
        client: u8,
        server: u8,
    },
    /// `LOCK.RELEASE key owner ALL` on every server.
    Release {
        client: u8,
    },
    Crash {
        server: u8,
    },
    Restart {
        server: u8,
    },
    Tick,
}

impl State {
    fn current(&self, server: usize) -> Option<Lock<'static>> {
        self.servers[server].key.map(|(owner, hold)| Lock {
            owner: OWNERS[owner as usize],
            hold,
        })
    }

    /// The server runs `LOCK.ACQUIRE`: the core decides, with a fence
    /// from this server's counter.
    fn acquire(&mut self, client: usize, server: usize, ttl: u64) -> Answer {
        let now = self.now;
        if !self.servers[server].up {
            return Answer::No;
        }
        let last = self.servers[server].last_fence;
        let current = self.current(server);
        let barriers = Barriers::NONE; // no waiters, no quarantine in this model
        let seen = Seen::exclusive(current, OWNERS[client], now);
        match lock::acquire(seen, ttl, now, barriers, || fence::next(last, now)) {
            Ok(Acquire::Fresh(hold)) | Ok(Acquire::Reentered(hold)) => {
                let s = &mut self.servers[server];
                s.last_fence = s.last_fence.max(hold.fence);
                s.key = Some((client as u8, hold));
                Answer::Yes(hold.fence)
            }
            Ok(Acquire::Busy) | Err(_) => Answer::No,
        }
    }

    /// The server runs `LOCK.FENCE` (`commands::fence`): the core decides
    /// the hold, and the server's counter observes its fence.
    fn fence(&mut self, client: usize, server: usize, min_fence: u64) -> Answer {
        if !self.servers[server].up {
            return Answer::No;
        }
        let own = lock::own_hold(self.current(server), OWNERS[client], self.now);
        let Ok(hold) = lock::fence(own, min_fence) else {
            return Answer::No;
        };
        let s = &mut self.servers[server];
        s.key = Some((client as u8, hold));
        s.last_fence = s.last_fence.max(hold.fence);
        Answer::Yes(hold.fence)
    }

    /// `LOCK.RELEASE … ALL` on every server that is up.
    fn release(&mut self, client: usize) {
        let now = self.now;
        for server in 0..SERVERS {
            if !self.servers[server].up {
                continue;
            }
            let own = lock::own_hold(self.current(server), OWNERS[client], now);
            if let Ok(None) = lock::release(own, true) {
                self.servers[server].key = None;
            }
        }
    }

    /// The fence goes to the client's caller — if the holds are still
    /// valid (Redlock's validity time: the attempt took less than the
    /// lease); else the client gives up and releases what it won.
    fn hand_out(&mut self, client: usize, fence: u64, ttl: u64) {
        if self.now >= self.clients[client].started + ttl {
            self.release(client);
            self.clients[client].phase = Phase::Idle;
            return;
        }
        if fence <= self.clients[client].to_beat {
            self.broken = true;
        }
        let live_holders = self
            .clients
            .iter()
            .filter(|c| matches!(c.phase, Phase::Holding { .. }))
            .count();
        if live_holders > 0 {
            self.two_holders = true;
        }
        self.handed.push(fence);
        if self.restarted {
            self.handed_after_restart = true;
        }
        self.clients[client].phase = Phase::Holding { fence };
    }
}

fn count(answers: &[Answer; SERVERS], yes: bool) -> usize {
    answers
        .iter()
        .filter(|a| match a {
            Answer::Yes(_) => yes,
            Answer::No => !yes,
            Answer::NotAsked => false,
        })
        .count()
}

impl Model for RedlockModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let server = Server {
            up: true,
            crashed_at: 0,
            key: None,
            last_fence: 0,
        };
        vec![State {
            now: 0,
            servers: [server; SERVERS],
            clients: vec![
                Client {
                    phase: Phase::Idle,
                    attempts: 0,
                    started: 0,
                    to_beat: 0,
                };
                self.bounds.clients
            ],
            crashes: 0,
            handed: Vec::new(),
            broken: false,
            two_holders: false,
            handed_after_restart: false,
            restarted: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        let b = &self.bounds;
        for (i, c) in s.clients.iter().enumerate() {
            let client = i as u8;
            match c.phase {
                Phase::Idle if c.attempts < b.attempts => actions.push(Action::Start { client }),
                Phase::Idle => {}
                Phase::Acquiring(answers) => {
                    for (server, a) in answers.iter().enumerate() {
                        if *a == Answer::NotAsked {
                            actions.push(Action::Acquire {
                                client,
                                server: server as u8,
                            });
                        }
                    }
                }
                Phase::Fencing { acks, .. } => {
                    for (server, a) in acks.iter().enumerate() {
                        if *a == Answer::NotAsked {
                            actions.push(Action::Fence {
                                client,
                                server: server as u8,
                            });
                        }
                    }
                }
                Phase::Holding { .. } => actions.push(Action::Release { client }),
            }
        }
        for (i, server) in s.servers.iter().enumerate() {
            if server.up && s.crashes < b.crashes {
                actions.push(Action::Crash { server: i as u8 });
            }
            // A restart takes time: the clock has moved on.
            if !server.up && s.now > server.crashed_at {
                actions.push(Action::Restart { server: i as u8 });
            }
        }
        if s.now < b.horizon {
            actions.push(Action::Tick);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Start { client } => {
                let c = &mut s.clients[client as usize];
                c.attempts += 1;
                c.started = s.now;
                c.to_beat = s.handed.iter().copied().max().unwrap_or(0);
                c.phase = Phase::Acquiring([Answer::NotAsked; SERVERS]);
            }
            Action::Acquire { client, server } => {
                let (client, server) = (client as usize, server as usize);
                let answer = s.acquire(client, server, self.bounds.ttl);
                let Phase::Acquiring(mut answers) = s.clients[client].phase else {
                    return None;
                };
                answers[server] = answer;
                if count(&answers, true) >= MAJORITY {
                    let fence = answers
                        .iter()
                        .filter_map(|a| match a {
                            Answer::Yes(f) => Some(*f),
                            _ => None,
                        })
                        .max()
                        .unwrap_or(0);
                    if self.bounds.fence_round {
                        // Raise exactly the servers that said yes.
                        let acks = answers.map(|a| match a {
                            Answer::Yes(_) => Answer::NotAsked,
                            _ => Answer::No,
                        });
                        s.clients[client].phase = Phase::Fencing { fence, acks };
                    } else {
                        s.hand_out(client, fence, self.bounds.ttl);
                    }
                } else if count(&answers, false) > SERVERS - MAJORITY {
                    s.release(client);
                    s.clients[client].phase = Phase::Idle;
                } else {
                    s.clients[client].phase = Phase::Acquiring(answers);
                }
            }
            Action::Fence { client, server } => {
                let (client, server) = (client as usize, server as usize);
                let Phase::Fencing { fence, mut acks } = s.clients[client].phase else {
                    return None;
                };
                acks[server] = s.fence(client, server, fence);
                if count(&acks, true) >= MAJORITY {
                    s.hand_out(client, fence, self.bounds.ttl);
                } else if count(&acks, false) > SERVERS - MAJORITY {
                    s.release(client);
                    s.clients[client].phase = Phase::Idle;
                } else {
                    s.clients[client].phase = Phase::Fencing { fence, acks };
                }
            }
            Action::Release { client } => {
                s.release(client as usize);
                s.clients[client as usize].phase = Phase::Idle;
            }
            Action::Crash { server } => {
                s.crashes += 1;
                s.servers[server as usize] = Server {
                    up: false,
                    crashed_at: s.now,
                    key: None,
                    last_fence: 0,
                };
            }
            Action::Restart { server } => {
                s.servers[server as usize].up = true;
                s.restarted = true;
            }
            Action::Tick => {
                s.now += 1;
                // A lease that ended leaves the key (Redis expires it).
                let now = s.now;
                for server in &mut s.servers {
                    if server.key.is_some_and(|(_, h)| h.expires_at <= now) {
                        server.key = None;
                    }
                }
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "every fence handed out is above every earlier one",
                |_, s: &State| !s.broken,
            ),
            Property::sometimes(
                "two clients hold at once (a crash lost a hold)",
                |_, s: &State| s.two_holders,
            ),
            Property::sometimes("two holders one after the other", |_, s: &State| {
                s.handed.len() >= 2
            }),
            Property::sometimes("a holder after a server restarted", |_, s: &State| {
                s.handed_after_restart
            }),
        ]
    }
}

impl fmt::Debug for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t={}", self.now)?;
        for (i, server) in self.servers.iter().enumerate() {
            write!(f, " | S{i}")?;
            if !server.up {
                write!(f, " DOWN")?;
                continue;
            }
            write!(f, " counter {}", Fence(server.last_fence))?;
            if let Some((owner, hold)) = server.key {
                write!(
                    f,
                    ", held by r{owner} fence {} until {}",
                    Fence(hold.fence),
                    hold.expires_at
                )?;
            }
        }
        for (i, c) in self.clients.iter().enumerate() {
            match c.phase {
                Phase::Idle => {}
                Phase::Acquiring(answers) => write!(f, " | r{i} acquiring {answers:?}")?,
                Phase::Fencing { fence, acks } => {
                    write!(f, " | r{i} fencing to {} {acks:?}", Fence(fence))?
                }
                Phase::Holding { fence } => write!(f, " | r{i} HOLDS fence {}", Fence(fence))?,
            }
        }
        if !self.handed.is_empty() {
            let handed: Vec<String> = self.handed.iter().map(|&x| Fence(x).to_string()).collect();
            write!(f, " | handed out [{}]", handed.join(", "))?;
        }
        Ok(())
    }
}
