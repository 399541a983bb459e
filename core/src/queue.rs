//! The wait queue: clients blocked on each lock, first come first served.
//!
//! Pure: no Redis. A waiter is known by its client id (a client blocks on
//! one command at a time, and Redis never reuses ids). Leaving the queue
//! (timeout, disconnect, `CLIENT UNBLOCK`) is O(1): the entry is forgotten
//! and its slot in the order becomes a tombstone that `pop` skips, so serving
//! the next waiter costs the same with 10 or 10,000 waiters.

use std::cmp::Ordering;
use std::collections::hash_map::{Entry, RandomState};
use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher};
use std::sync::OnceLock;

/// A lock's identity: database index and key name.
///
/// Its hash is computed once, when the name is made, with the standard
/// library's keyed SipHash: key names come from clients, so a map keyed by
/// them must not let a client choose names that collide. The engine's maps
/// ([`NameMap`], [`NameSet`]) then use that hash as it is, so the dozen
/// lookups of a hand-off hash no bytes again.
#[derive(Debug, Clone)]
pub struct LockName {
    pub db: i32,
    pub key: Vec<u8>,
    hash: u64,
}

impl LockName {
    pub fn new(db: i32, key: &[u8]) -> LockName {
        static KEYS: OnceLock<RandomState> = OnceLock::new();
        let hash = KEYS.get_or_init(RandomState::new).hash_one((db, key));
        LockName {
            db,
            key: key.to_vec(),
            hash,
        }
    }
}

// Equal and ordered by database and key alone (the hash follows from them).
impl PartialEq for LockName {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash && self.db == other.db && self.key == other.key
    }
}

impl Eq for LockName {}

impl PartialOrd for LockName {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for LockName {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.db, &self.key).cmp(&(other.db, &other.key))
    }
}

impl Hash for LockName {
    fn hash<S: Hasher>(&self, state: &mut S) {
        state.write_u64(self.hash);
    }
}

/// A map keyed by lock name, hashing with the name's own keyed hash.
pub type NameMap<V> = HashMap<LockName, V, BuildHasherDefault<Prehashed>>;
/// A set of lock names, likewise.
pub type NameSet = HashSet<LockName, BuildHasherDefault<Prehashed>>;
/// A map keyed by client id. Ids are handed out by the server in sequence,
/// not chosen by clients, so a multiplicative hash (which maps consecutive
/// ids to distinct buckets) is safe here, and much cheaper than SipHash.
pub type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

/// The hasher of [`NameMap`]: passes on the hash [`LockName`] carries.
#[derive(Default)]
pub struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }

    /// Not reached by [`LockName`]; mixes anything else in (FNV-1a).
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0 ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3);
        }
    }
}

/// The hasher of [`IdMap`].
#[derive(Default)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write_u64(&mut self, n: u64) {
        // Odd: a bijection on the low bits (the bucket), mixing into the
        // high bits (the map's tag).
        self.0 = (self.0 ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    /// Not reached by `u64` keys; mixes anything else in.
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(u64::from(byte));
        }
    }
}

/// All queues, and every waiter's payload `T`.
#[derive(Clone)]
pub struct WaitQueues<T> {
    queues: NameMap<Queue>,
    waiters: IdMap<Waiter<T>>,
    /// Tells a waiter's current entry from a tombstone of an earlier wait by
    /// the same client on the same lock.
    next_seq: u64,
}

#[derive(Clone)]
struct Queue {
    /// (client id, seq) in arrival order, tombstones included.
    order: VecDeque<(u64, u64)>,
    /// Waiters in `order` that are still waiting.
    live: usize,
}

#[derive(Clone)]
struct Waiter<T> {
    name: LockName,
    /// The other locks a request for several waits on, in the order it
    /// named them (empty for one lock). Its entry in each of their queues
    /// carries the same `seq`: one arrival order across every queue.
    more: Vec<LockName>,
    seq: u64,
    payload: T,
}

impl<T> Waiter<T> {
    fn names(&self) -> impl Iterator<Item = &LockName> {
        std::iter::once(&self.name).chain(&self.more)
    }
}

impl<T> Default for WaitQueues<T> {
    fn default() -> Self {
        WaitQueues {
            queues: NameMap::default(),
            waiters: IdMap::default(),
            next_seq: 0,
        }
    }
}

impl<T> WaitQueues<T> {
    /// Puts client `id` at the back of `name`'s queue. `false` (and nothing
    /// changes) if that client is already waiting somewhere.
    pub fn push(&mut self, name: LockName, id: u64, payload: T) -> bool {
        self.push_all(name, Vec::new(), id, payload)
    }

    /// Puts client `id` at the back of the queue of `name` and of each of
    /// `more` as one request: one place in the arrival order, shared by
    /// every queue (the sequence numbers only grow, so each queue is in
    /// that order). `false` (and nothing changes) if that client is already
    /// waiting somewhere.
    pub fn push_all(&mut self, name: LockName, more: Vec<LockName>, id: u64, payload: T) -> bool {
        let Entry::Vacant(slot) = self.waiters.entry(id) else {
            return false;
        };
        let seq = self.next_seq;
        self.next_seq += 1;
        for one in std::iter::once(&name).chain(&more) {
            let queue = self.queues.entry(one.clone()).or_insert_with(|| Queue {
                order: VecDeque::new(),
                live: 0,
            });
            queue.order.push_back((id, seq));
            queue.live += 1;
        }
        slot.insert(Waiter {
            name,
            more,
            seq,
            payload,
        });
        true
    }

    /// Every lock client `id` waits on (one, or those of a request for
    /// several, in the order it named them).
    pub fn names_of(&self, id: u64) -> Option<Vec<LockName>> {
        self.waiters.get(&id).map(|w| w.names().cloned().collect())
    }

    /// Whether client `id` waits on several locks at once.
    pub fn waits_on_several(&self, id: u64) -> bool {
        self.waiters.get(&id).is_some_and(|w| !w.more.is_empty())
    }

    /// The client first in line on `name`, if any.
    pub fn head(&self, name: &LockName) -> Option<u64> {
        self.iter(name).next().map(|(id, _)| id)
    }

    /// Takes client `id` out of whatever queue it is in (it left).
    pub fn remove(&mut self, id: u64) -> Option<(LockName, T)> {
        self.remove_noting_head(id)
            .map(|(name, payload, _)| (name, payload))
    }

    /// [`remove`](WaitQueues::remove), and whether client `id` was first in
    /// line with others behind it: only then may its leaving let the
    /// requests behind it in. O(1) amortised: the tombstones it skips at
    /// the front are dropped on the way, each once.
    pub fn remove_noting_head(&mut self, id: u64) -> Option<(LockName, T, bool)> {
        let (name, _, payload, heads) = self.remove_noting_heads(id)?;
        let was_head = !heads.is_empty();
        Some((name, payload, was_head))
    }

    /// [`remove_noting_head`](WaitQueues::remove_noting_head) for a client
    /// waiting on one lock or several: taken out of every queue it is in
    /// (O(1) amortised each), with the first lock it named, the others,
    /// and the locks where it was first in line with others behind it.
    #[allow(clippy::type_complexity)]
    pub fn remove_noting_heads(
        &mut self,
        id: u64,
    ) -> Option<(LockName, Vec<LockName>, T, Vec<LockName>)> {
        let waiter = self.waiters.remove(&id)?;
        let mut heads = Vec::new();
        for name in waiter.names() {
            if self.leave_queue(name, id, waiter.seq) {
                heads.push(name.clone());
            }
        }
        Some((waiter.name, waiter.more, waiter.payload, heads))
    }

    /// Takes entry (`id`, `seq`), already gone from `waiters`, out of
    /// `name`'s queue: whether it was first in line with others behind it.
    fn leave_queue(&mut self, name: &LockName, id: u64, seq: u64) -> bool {
        let Some(queue) = self.queues.get_mut(name) else {
            return false;
        };
        let mut was_head = false;
        let waiters = &self.waiters;
        while let Some(&(front, front_seq)) = queue.order.front() {
            if front == id && front_seq == seq {
                was_head = true;
                queue.order.pop_front();
                break;
            }
            if waiters.get(&front).is_some_and(|w| w.seq == front_seq) {
                break;
            }
            queue.order.pop_front();
        }
        queue.live -= 1;
        was_head &= queue.live > 0;
        if queue.live == 0 {
            self.queues.remove(name);
        } else if queue.order.len() > 2 * queue.live + 16 {
            // Many left from the middle: drop their tombstones now, so
            // memory stays proportional to the clients still waiting.
            queue
                .order
                .retain(|(id, seq)| waiters.get(id).is_some_and(|w| w.seq == *seq));
        }
        was_head
    }

    /// Whether client `id` waits somewhere.
    pub fn contains(&self, id: u64) -> bool {
        self.waiters.contains_key(&id)
    }

    /// The payload of waiting client `id`.
    pub fn get(&self, id: u64) -> Option<&T> {
        self.waiters.get(&id).map(|w| &w.payload)
    }

    /// The payload of waiting client `id`.
    pub fn get_mut(&mut self, id: u64) -> Option<&mut T> {
        self.waiters.get_mut(&id).map(|w| &mut w.payload)
    }

    /// The longest-waiting client of `name`, taken out of the queue.
    pub fn pop(&mut self, name: &LockName) -> Option<(u64, T)> {
        let queue = self.queues.get_mut(name)?;
        while let Some((id, seq)) = queue.order.pop_front() {
            let current = self.waiters.get(&id).is_some_and(|w| w.seq == seq);
            if current {
                queue.live -= 1;
                if queue.live == 0 {
                    self.queues.remove(name);
                }
                let waiter = self.waiters.remove(&id)?;
                // A request for several leaves the other queues too.
                for other in waiter.names().filter(|other| *other != name) {
                    self.leave_queue(other, id, seq);
                }
                return Some((id, waiter.payload));
            }
        }
        None
    }

    /// The clients waiting on `name`, longest-waiting first (ids and
    /// payloads, tombstones skipped).
    pub fn iter<'a>(&'a self, name: &LockName) -> impl Iterator<Item = (u64, &'a T)> + 'a {
        let order = self.queues.get(name).map(|q| q.order.iter());
        order.into_iter().flatten().filter_map(move |&(id, seq)| {
            self.waiters
                .get(&id)
                .filter(|w| w.seq == seq)
                .map(|w| (id, &w.payload))
        })
    }

    /// How many clients wait on `name`.
    pub fn len(&self, name: &LockName) -> usize {
        self.queues.get(name).map_or(0, |q| q.live)
    }

    /// Whether any client waits on `name`.
    pub fn has_waiters(&self, name: &LockName) -> bool {
        self.queues.contains_key(name)
    }

    /// Clients waiting on all locks.
    pub fn total(&self) -> usize {
        self.waiters.len()
    }

    /// Every lock with waiters in database `db` (`None`: all databases).
    pub fn names_in(&self, db: Option<i32>) -> Vec<LockName> {
        self.queues
            .keys()
            .filter(|name| db.is_none_or(|db| name.db == db))
            .cloned()
            .collect()
    }

    /// Every queue by name, each with its waiting clients in order:
    /// tombstones and sequence numbers are bookkeeping that no decision
    /// depends on, so this is the whole observable state.
    fn canonical(&self) -> Vec<(&LockName, Vec<(u64, &T)>)> {
        let mut queues: Vec<_> = self
            .queues
            .iter()
            .map(|(name, queue)| {
                let live = queue
                    .order
                    .iter()
                    .filter_map(|&(id, seq)| {
                        let waiter = self.waiters.get(&id).filter(|w| w.seq == seq)?;
                        Some((id, &waiter.payload))
                    })
                    .collect();
                (name, live)
            })
            .collect();
        queues.sort_by(|a, b| a.0.cmp(b.0));
        queues
    }
}

// Equality and hashing by the canonical view (the model checker keeps
// queues in its states; a `HashMap` hashes in no fixed order).
impl<T: PartialEq> PartialEq for WaitQueues<T> {
    fn eq(&self, other: &Self) -> bool {
        self.canonical() == other.canonical()
    }
}

impl<T: Eq> Eq for WaitQueues<T> {}

impl<T: Hash> Hash for WaitQueues<T> {
    fn hash<S: Hasher>(&self, state: &mut S) {
        self.canonical().hash(state);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(key: &str) -> LockName {
        LockName::new(0, key.as_bytes())
    }

    #[test]
    fn waiters_are_served_in_arrival_order() {
        let mut q = WaitQueues::default();
        for id in [5, 3, 9] {
            assert!(q.push(name("k"), id, id * 10));
        }
        assert_eq!(q.len(&name("k")), 3);
        assert_eq!(q.pop(&name("k")), Some((5, 50)));
        assert_eq!(q.pop(&name("k")), Some((3, 30)));
        assert_eq!(q.pop(&name("k")), Some((9, 90)));
        assert_eq!(q.pop(&name("k")), None);
        assert!(!q.has_waiters(&name("k")));
    }

    #[test]
    fn queues_are_per_lock_and_per_database() {
        let mut q = WaitQueues::default();
        q.push(name("a"), 1, ());
        q.push(LockName::new(1, b"a"), 2, ());
        q.push(name("b"), 3, ());
        assert_eq!(q.pop(&name("a")), Some((1, ())));
        assert_eq!(q.pop(&name("a")), None);
        assert_eq!(q.len(&LockName::new(1, b"a")), 1);
        let mut db0 = q.names_in(Some(0));
        db0.sort();
        assert_eq!(db0, vec![name("b")]);
        assert_eq!(q.names_in(None).len(), 2);
    }

    #[test]
    fn a_client_waits_in_one_place_at_a_time() {
        let mut q = WaitQueues::default();
        assert!(q.push(name("a"), 1, "first"));
        assert!(!q.push(name("b"), 1, "second"));
        assert_eq!(q.total(), 1);
        assert_eq!(q.len(&name("a")), 1);
        assert_eq!(q.len(&name("b")), 0);
    }

    #[test]
    fn a_client_that_left_is_never_served() {
        let mut q = WaitQueues::default();
        for id in 1..=3 {
            q.push(name("k"), id, ());
        }
        assert_eq!(q.remove(2), Some((name("k"), ())));
        assert_eq!(q.remove(2), None);
        assert_eq!(q.len(&name("k")), 2);
        assert_eq!(q.pop(&name("k")).map(|w| w.0), Some(1));
        assert_eq!(q.pop(&name("k")).map(|w| w.0), Some(3));
        assert_eq!(q.pop(&name("k")), None);
    }

    #[test]
    fn the_last_waiter_leaving_frees_the_queue() {
        let mut q = WaitQueues::default();
        q.push(name("k"), 1, ());
        q.remove(1);
        assert!(!q.has_waiters(&name("k")));
        assert_eq!(q.total(), 0);
        assert!(q.names_in(None).is_empty());
    }

    #[test]
    fn waiting_again_goes_to_the_back_not_to_the_old_place() {
        let mut q = WaitQueues::default();
        q.push(name("k"), 1, "old");
        q.push(name("k"), 2, "two");
        q.remove(1); // timed out: its slot is now a tombstone
        q.push(name("k"), 1, "new"); // and waits again, behind 2
        assert_eq!(q.pop(&name("k")), Some((2, "two")));
        assert_eq!(q.pop(&name("k")), Some((1, "new")));
    }

    #[test]
    fn tombstones_do_not_pile_up() {
        let mut q = WaitQueues::default();
        q.push(name("k"), 0, ());
        for id in 1..10_000 {
            q.push(name("k"), id, ());
            q.remove(id);
        }
        let queue = &q.queues[&name("k")];
        assert_eq!(queue.live, 1);
        assert!(
            queue.order.len() <= 2 * queue.live + 17,
            "{}",
            queue.order.len()
        );
        assert_eq!(q.pop(&name("k")).map(|w| w.0), Some(0));
    }

    #[test]
    fn names_are_equal_hashed_and_ordered_by_database_and_key() {
        let build = BuildHasherDefault::<Prehashed>::default();
        let (a, b) = (LockName::new(0, b"k"), LockName::new(0, b"k"));
        assert_eq!(a, b);
        assert_eq!(build.hash_one(&a), build.hash_one(&b));
        assert_ne!(a, LockName::new(1, b"k"));
        assert_ne!(a, LockName::new(0, b"j"));
        assert!(LockName::new(0, b"b") < LockName::new(1, b"a"));
        assert!(LockName::new(0, b"a") < LockName::new(0, b"b"));
    }

    #[test]
    fn consecutive_client_ids_land_in_distinct_buckets() {
        let build = BuildHasherDefault::<IdHasher>::default();
        let buckets: HashSet<u64> = (1_000..1_256u64)
            .map(|id| build.hash_one(id) & 255)
            .collect();
        assert_eq!(buckets.len(), 256);
    }
}
