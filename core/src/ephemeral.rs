//! Ephemeral holds: which connection each `EPHEMERAL` hold is bound to.
//!
//! Pure: client ids and fences come in as arguments. A binding names the
//! hold by lock name, owner and fence: a lock has at most one hold per
//! owner, and every fresh hold gets a fence no hold had before, so a
//! binding whose hold ended some other way (a release, its lease, a `DEL`
//! or a flush, another owner since) is told apart from a later hold of the
//! same owner on the same lock by its fence. Such a stale binding is not
//! looked for when its hold ends (that would cost every ending hold a
//! lookup); it is dropped when its connection closes, when its owner binds
//! that lock again, or when its owner releases that lock to zero.
//!
//! Two indexes: by client, so a closing connection costs the holds bound
//! to it and nothing more; and by lock, so `LOCK.INFO`, a release, a fence
//! raise and a rename find a hold's binding without a scan.

use std::collections::{HashMap, HashSet};

use crate::queue::{IdMap, LockName, NameMap};

/// One hold bound to a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    pub name: LockName,
    pub owner: Vec<u8>,
    pub fence: u64,
}

/// Every binding, indexed by client and by lock.
#[derive(Default)]
pub struct Bindings {
    /// Lock → owner → (client id, fence of the bound hold).
    by_lock: NameMap<HashMap<Vec<u8>, (u64, u64)>>,
    /// Client id → the (lock, owner) pairs bound to it.
    by_client: IdMap<HashSet<(LockName, Vec<u8>)>>,
}

impl Bindings {
    /// Whether nothing is bound (the fast path of every question).
    pub fn is_empty(&self) -> bool {
        self.by_client.is_empty()
    }

    /// How many holds are bound (stale ones included).
    pub fn len(&self) -> usize {
        self.by_client.values().map(HashSet::len).sum()
    }

    /// A fresh hold of `owner` on `name`, with `fence`, began on
    /// connection `client`. Any older binding of that owner on that lock
    /// is stale (its hold ended before this one began) and goes.
    pub fn bind(&mut self, client: u64, name: LockName, owner: &[u8], fence: u64) {
        let holders = self.by_lock.entry(name.clone()).or_default();
        if let Some((old, _)) = holders.insert(owner.to_vec(), (client, fence)) {
            if old != client {
                forget_pair(&mut self.by_client, old, &name, owner);
            }
        }
        self.by_client
            .entry(client)
            .or_default()
            .insert((name, owner.to_vec()));
    }

    /// Whether the hold of `owner` on `name` with `fence` is bound.
    pub fn is_bound(&self, name: &LockName, owner: &[u8], fence: u64) -> bool {
        self.by_lock
            .get(name)
            .and_then(|holders| holders.get(owner))
            .is_some_and(|&(_, bound)| bound == fence)
    }

    /// `owner`'s hold on `name` ended by its own release: its binding goes.
    pub fn unbind(&mut self, name: &LockName, owner: &[u8]) {
        let Some(holders) = self.by_lock.get_mut(name) else {
            return;
        };
        let Some((client, _)) = holders.remove(owner) else {
            return;
        };
        if holders.is_empty() {
            self.by_lock.remove(name);
        }
        forget_pair(&mut self.by_client, client, name, owner);
    }

    /// `LOCK.FENCE` raised the fence of `owner`'s hold on `name` from `old`
    /// to `new`: it is the same hold, still bound.
    pub fn refenced(&mut self, name: &LockName, owner: &[u8], old: u64, new: u64) {
        if let Some((_, fence)) = self
            .by_lock
            .get_mut(name)
            .and_then(|holders| holders.get_mut(owner))
            .filter(|(_, fence)| *fence == old)
        {
            *fence = new;
        }
    }

    /// The lock `from` now lives under `to` (`RENAME`, `MOVE`): its
    /// bindings follow it. Whatever was bound under `to` was overwritten.
    pub fn renamed(&mut self, from: &LockName, to: &LockName) {
        if from == to {
            return;
        }
        if let Some(overwritten) = self.by_lock.remove(to) {
            for (owner, (client, _)) in overwritten {
                forget_pair(&mut self.by_client, client, to, &owner);
            }
        }
        let Some(moved) = self.by_lock.remove(from) else {
            return;
        };
        for (owner, &(client, _)) in &moved {
            let pairs = self.by_client.entry(client).or_default();
            pairs.remove(&(from.clone(), owner.clone()));
            pairs.insert((to.clone(), owner.clone()));
        }
        self.by_lock.insert(to.clone(), moved);
    }

    /// Connection `client` closed: its bindings, each to be ended if its
    /// hold is still the one bound (same owner, same fence). Costs the
    /// holds bound to that client only.
    pub fn closed(&mut self, client: u64) -> Vec<Binding> {
        let Some(pairs) = self.by_client.remove(&client) else {
            return Vec::new();
        };
        let mut ended = Vec::with_capacity(pairs.len());
        for (name, owner) in pairs {
            let Some(holders) = self.by_lock.get_mut(&name) else {
                continue;
            };
            let Some(&(bound_to, fence)) = holders.get(&owner) else {
                continue;
            };
            if bound_to != client {
                continue;
            }
            holders.remove(&owner);
            if holders.is_empty() {
                self.by_lock.remove(&name);
            }
            ended.push(Binding { name, owner, fence });
        }
        ended
    }

    /// Forgets every binding (the node became a replica: its holds are
    /// its master's, ordinary ones).
    pub fn clear(&mut self) {
        *self = Bindings::default();
    }
}

/// Whether a bound hold is to be ended now: the lock's hold of the
/// binding's owner (its fence, if the owner holds it) is still the one
/// bound.
pub fn still_bound(binding: &Binding, held_fence: Option<u64>) -> bool {
    held_fence == Some(binding.fence)
}

fn forget_pair(
    by_client: &mut IdMap<HashSet<(LockName, Vec<u8>)>>,
    client: u64,
    name: &LockName,
    owner: &[u8],
) {
    if let Some(pairs) = by_client.get_mut(&client) {
        pairs.remove(&(name.clone(), owner.to_vec()));
        if pairs.is_empty() {
            by_client.remove(&client);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(key: &str) -> LockName {
        LockName::new(0, key.as_bytes())
    }

    fn closed(b: &mut Bindings, client: u64) -> Vec<(String, String, u64)> {
        let mut out: Vec<_> = b
            .closed(client)
            .into_iter()
            .map(|x| {
                let key = String::from_utf8(x.name.key).unwrap();
                (key, String::from_utf8(x.owner).unwrap(), x.fence)
            })
            .collect();
        out.sort();
        out
    }

    fn t(key: &str, owner: &str, fence: u64) -> (String, String, u64) {
        (key.to_string(), owner.to_string(), fence)
    }

    #[test]
    fn a_closing_client_ends_its_own_holds_only() {
        let mut b = Bindings::default();
        b.bind(1, n("a"), b"x", 10);
        b.bind(1, n("b"), b"x", 11);
        b.bind(2, n("a"), b"y", 12); // a shared lock: two owners
        assert!(b.is_bound(&n("a"), b"x", 10));
        assert!(!b.is_bound(&n("a"), b"x", 9));
        assert_eq!(closed(&mut b, 1), vec![t("a", "x", 10), t("b", "x", 11)]);
        assert!(!b.is_bound(&n("a"), b"x", 10));
        assert!(b.is_bound(&n("a"), b"y", 12));
        assert_eq!(closed(&mut b, 1), vec![]);
        assert_eq!(closed(&mut b, 3), vec![]);
        assert_eq!(closed(&mut b, 2), vec![t("a", "y", 12)]);
        assert!(b.is_empty());
    }

    #[test]
    fn a_later_hold_of_the_same_owner_replaces_the_stale_binding() {
        // (steps, client closed, holds it ends)
        type Step = (u64, &'static str, &'static str, u64);
        let cases: [(&[Step], u64, usize); 4] = [
            // Bound again on another connection: the first one ends nothing.
            (&[(1, "a", "x", 10), (2, "a", "x", 20)], 1, 0),
            (&[(1, "a", "x", 10), (2, "a", "x", 20)], 2, 1),
            // Bound again on the same connection: one binding, the newer.
            (&[(1, "a", "x", 10), (1, "a", "x", 20)], 1, 1),
            // Another owner on the same lock keeps its own binding.
            (&[(1, "a", "x", 10), (2, "a", "y", 20)], 1, 1),
        ];
        for (steps, client, ends) in cases {
            let mut b = Bindings::default();
            for &(c, key, owner, fence) in steps {
                b.bind(c, n(key), owner.as_bytes(), fence);
            }
            assert_eq!(b.closed(client).len(), ends, "{steps:?} close {client}");
        }
        let mut b = Bindings::default();
        b.bind(1, n("a"), b"x", 10);
        b.bind(1, n("a"), b"x", 20);
        assert_eq!(b.len(), 1);
        assert_eq!(closed(&mut b, 1), vec![t("a", "x", 20)]);
    }

    #[test]
    fn release_fence_and_rename_keep_the_indexes_in_step() {
        let mut b = Bindings::default();
        b.bind(1, n("a"), b"x", 10);
        b.bind(2, n("c"), b"z", 30);
        b.unbind(&n("a"), b"x");
        b.unbind(&n("a"), b"x"); // twice: nothing
        assert_eq!(closed(&mut b, 1), vec![]);

        b.bind(1, n("a"), b"x", 11);
        b.refenced(&n("a"), b"x", 11, 50);
        b.refenced(&n("a"), b"x", 11, 60); // not that fence any more
        assert!(b.is_bound(&n("a"), b"x", 50));

        // A rename over a bound lock: the destination's binding was overwritten.
        b.renamed(&n("a"), &n("c"));
        assert!(!b.is_bound(&n("a"), b"x", 50));
        assert!(b.is_bound(&n("c"), b"x", 50));
        assert_eq!(closed(&mut b, 2), vec![]);
        b.renamed(&n("nothing"), &n("c")); // the destination is overwritten
        assert!(b.is_empty());

        // MOVE: another database, same key.
        b.bind(1, n("a"), b"x", 12);
        let other = LockName::new(1, b"a");
        b.renamed(&n("a"), &other);
        b.renamed(&other, &other);
        assert_eq!(b.closed(1).first().map(|x| x.name.db), Some(1));
    }

    #[test]
    fn a_binding_ends_only_the_hold_it_was_made_for() {
        let binding = Binding {
            name: n("a"),
            owner: b"x".to_vec(),
            fence: 10,
        };
        // (the owner's fence on the lock now, whether its hold ends)
        let cases = [
            (Some(10), true),
            (Some(11), false), // released, then acquired again (not ephemeral)
            (None, false),     // released, lease ended, deleted, flushed, other owner
        ];
        for (held, ends) in cases {
            assert_eq!(still_bound(&binding, held), ends, "{held:?}");
        }
    }

    #[test]
    fn closing_costs_the_clients_own_holds_only() {
        let mut b = Bindings::default();
        for other in 0..1000u64 {
            b.bind(100 + other, n(&format!("k{other}")), b"o", other);
        }
        b.bind(1, n("mine"), b"o", 5);
        // The closed client's set holds its own pair only: nothing else is walked.
        assert_eq!(b.by_client.get(&1).map(HashSet::len), Some(1));
        assert_eq!(b.closed(1).len(), 1);
        assert_eq!(b.len(), 1000);
    }
}
