//! Which key names may hold a lock, for the keyspace notifications: a
//! filter that a notification about any other key stops at, without a key
//! lookup (see `ffi::events`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use redislock_core::stats;

/// A Bloom filter (two bits per name) of the key names that may hold a
/// lock or have clients waiting: every key a lock command named, and every
/// lock loaded, restored, copied, renamed or moved. A notification about a
/// name it does not hold is about no lock and no waiter, and returns
/// without a key lookup. It cannot forget one name, so it is emptied as a
/// whole when no lock exists and nobody waits, once enough names went in
/// (until then a name may stay a false positive: a key lookup, as without
/// the filter). Blind to databases, so `SWAPDB` and `MOVE` keep it true.
/// Atomics, in static memory: a value may be born off the main thread.
static NAME_BITS: [AtomicU64; NAME_WORDS] = [const { AtomicU64::new(0) }; NAME_WORDS];
/// 65,536 bits (8 KiB): about 1% false positives with 3,000 names in.
const NAME_WORDS: usize = 1024;
/// Names put in since the filter was last emptied.
static NAMES_ADDED: AtomicU64 = AtomicU64::new(0);
/// A lock arrived whose key name Redis did not give: every name may be one.
static NAMES_UNKNOWN: AtomicBool = AtomicBool::new(false);
/// Emptied only once this many names went in (emptying costs a pass over
/// the 8 KiB; a server that takes and frees one lock over and over keeps
/// its few names).
const EMPTY_AFTER: u64 = 2_048;

/// The filter's two bit positions for `name`.
fn name_bits(name: &[u8]) -> [usize; 2] {
    // A multiplicative hash over 8-byte words (FxHash's step): a few
    // instructions per word, its entropy in the high bits used here.
    let step = |h: u64, word: u64| (h.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
    let mut words = name.chunks_exact(8);
    let mut h = name.len() as u64;
    for word in &mut words {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(word);
        h = step(h, u64::from_le_bytes(bytes));
    }
    let tail = words
        .remainder()
        .iter()
        .rev()
        .fold(0u64, |acc, &b| (acc << 8) | u64::from(b));
    h = step(h, tail);
    [(h >> 48) as usize, ((h >> 32) & 0xffff) as usize]
}

/// Puts `name` in the filter: it may hold a lock or have waiters.
pub fn note_lock_name(name: &[u8]) {
    for bit in name_bits(name) {
        NAME_BITS[bit / 64].fetch_or(1 << (bit % 64), Relaxed);
    }
    NAMES_ADDED.fetch_add(1, Relaxed);
}

/// Whether `name` may hold a lock or have waiters (`false`: it does not).
pub fn may_hold_lock(name: &[u8]) -> bool {
    NAMES_UNKNOWN.load(Relaxed)
        || name_bits(name)
            .iter()
            .all(|&bit| NAME_BITS[bit / 64].load(Relaxed) & (1 << (bit % 64)) != 0)
}

/// A lock arrived whose key name Redis did not give (loaded or copied
/// without it): every name may hold one until the filter is emptied.
pub fn note_unknown() {
    NAMES_UNKNOWN.store(true, Relaxed);
}

/// A lock command runs: the filter is not emptied meanwhile (the command
/// put its key in before it ran, and may make a lock there after a
/// notification found none left).
static IN_LOCK_COMMAND: AtomicBool = AtomicBool::new(false);

/// Runs a lock command that may make a lock or a waiter under `name`: puts
/// the name in the filter first, and keeps the filter from being emptied
/// until the command is done.
pub fn lock_command<R>(name: Option<&[u8]>, command: impl FnOnce() -> R) -> R {
    /// Clears the flag even if `command` panics (caught at the boundary).
    struct Done;
    impl Drop for Done {
        fn drop(&mut self) {
            IN_LOCK_COMMAND.store(false, Relaxed);
        }
    }
    if let Some(name) = name {
        note_lock_name(name);
    }
    IN_LOCK_COMMAND.store(true, Relaxed);
    let _done = Done;
    command()
}

/// Empties the filter if no lock exists, `nobody_waits` (nor waits for
/// lease work), no lock command runs, and enough names went in to make it
/// worth a pass (main thread).
pub fn forget_lock_names_if_idle(nobody_waits: bool) {
    let full = NAMES_ADDED.load(Relaxed) >= EMPTY_AFTER || NAMES_UNKNOWN.load(Relaxed);
    if full && nobody_waits && !IN_LOCK_COMMAND.load(Relaxed) && stats::HELD.get() <= 0 {
        for word in &NAME_BITS {
            word.store(0, Relaxed);
        }
        NAMES_ADDED.store(0, Relaxed);
        NAMES_UNKNOWN.store(false, Relaxed);
    }
}
