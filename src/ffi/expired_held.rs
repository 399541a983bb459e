//! Leases that ended while held (`INFO lock`'s `expired_held`): Redis tells
//! the data type that a lock key left the keyspace (its `unlink2`
//! callback) but not why; an `expired` notification about the same key
//! that follows at once, with no other event about it between, tells why
//! (see `ffi::events`). This file keeps the one key to pair.

use std::cell::RefCell;
use std::os::raw::c_int;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use crate::ffi::now_ms;

thread_local! {
    /// The last lock key unlinked (db, name), on the main thread. Its buffer
    /// is reused, so tracking costs no allocation per deletion.
    /// When (unix ms) is kept too: Redis sends `expired` right after the
    /// unlink, so an older entry (a lock a SET overwrote, which the module
    /// hears nothing more of) never matches a later expiry of that key.
    static LAST_UNLINKED: RefCell<(c_int, Vec<u8>, u64)> = const { RefCell::new((-1, Vec::new(), 0)) };

}

/// Whether [`LAST_UNLINKED`] holds a key: read on every notification, so
/// a plain static instead of the thread-local.
static UNLINKED_PENDING: AtomicBool = AtomicBool::new(false);

/// Records the lock key `unlink2` saw leave (main thread).
pub fn lock_unlinked(db: c_int, name: &[u8]) {
    UNLINKED_PENDING.store(true, Relaxed);
    LAST_UNLINKED.with_borrow_mut(|(last_db, last_name, at)| {
        *last_db = db;
        last_name.clear();
        last_name.extend_from_slice(name);
        *at = now_ms();
    });
}

/// Whether a lock key's unlink waits to be paired with a notification (a
/// check that costs no key name).
pub fn unlinked_pending() -> bool {
    UNLINKED_PENDING.load(Relaxed)
}

/// Whether the key just unlinked was `name` in `db` (and forgets it then).
pub fn take_unlinked(db: c_int, name: &[u8]) -> bool {
    LAST_UNLINKED.with_borrow_mut(|(last_db, last_name, at)| {
        let fresh = now_ms().saturating_sub(*at) <= 1;
        let hit = fresh && *last_db == db && last_name == name;
        if hit || !fresh {
            // Consumed, or too old ever to match: nothing to pair any more.
            *last_db = -1;
            UNLINKED_PENDING.store(false, Relaxed);
        }
        hit
    })
}
