//! What the module hears from the server: keyspace notifications and the
//! flush, swap-db and loading server events.
//!
//! Three uses. (1) A lock with waiters can be freed by any command (`DEL`,
//! `RENAME`, `MOVE`, eviction, a flush…): every notification about such a
//! key reports it to [`waiting::freed_by_event`], and a `persist`, `expire`
//! or `restore` of a lock to [`waiting::ttl_changed`]; callbacks must not
//! write, so the work runs right after the command (see `waiting`). (2)
//! Redis tells a data type that a key left the keyspace (`unlink2`) but not
//! why; an `expired` notification that follows at once, with no other event
//! about the key between, tells why: pairing the two counts leases that
//! ended while held. (3) At the end of loading, the fence
//! counter is re-based on the clock (see [`on_server_event`]).

use std::cell::Cell;
use std::os::raw::{c_char, c_int, c_void};
use std::ptr::NonNull;
use std::sync::atomic::Ordering::Relaxed;

use redis_module::{raw, Context, RedisString};

use crate::ffi::key::{Access, LockKey};
use crate::ffi::{datatype, quarantine, upgrade};
use crate::ffi::{guard, now_ms, subscribe_to_server_event, waiting};
use crate::queue::LockName;
use crate::{fence, stats};

thread_local! {
    /// Whether the load under way is the server's own AOF.
    static LOADING_AOF: Cell<bool> = const { Cell::new(false) };
}

/// Subscribes to what the module needs to hear. Called once at load.
pub fn subscribe(ctx: &Context) -> Result<(), &'static str> {
    // Only the classes that report a key leaving: `del` (DEL, UNLINK,
    // GETDEL, MIGRATE, a container's last element popped, a hash's last
    // field expired, Valkey's DELIFEQ), `rename_from`, `move_from` (all
    // generic), `expired` and `evicted`; the generic class also says when a
    // lock arrives (`restore`, `copy_to`, `rename_to`, `move_to`). A write
    // that keeps the key (a SET over a lock) does not free it, and every
    // class heard is a cost paid by every such write on the server, module
    // data or not. So neither `new` nor Redis 8.2's `overwritten` and
    // `type_changed` (classes of their own): a key created or replaced never
    // frees a lock, and the other servers do not send the last two.
    let types = raw::REDISMODULE_NOTIFY_GENERIC
        | raw::REDISMODULE_NOTIFY_EXPIRED
        | raw::REDISMODULE_NOTIFY_EVICTED;
    let server_events = [
        raw::REDISMODULE_EVENT_FLUSHDB,
        raw::REDISMODULE_EVENT_SWAPDB,
        raw::REDISMODULE_EVENT_LOADING,
    ];
    // SAFETY: called at module load with its context; the callback is a
    // plain function that lives as long as the module.
    unsafe {
        let ok = raw::Status::Ok as c_int;
        let keyspace = raw::RedisModule_SubscribeToKeyspaceEvents
            .map_or(!ok, |f| f(ctx.ctx, types, Some(on_keyspace_event)));
        if keyspace != ok {
            return Err("cannot subscribe to keyspace events");
        }
    }
    for id in server_events {
        if !subscribe_to_server_event(ctx.ctx, id, Some(on_server_event)) {
            return Err("cannot subscribe to server events");
        }
    }
    Ok(())
}

/// A keyspace notification (main thread). Must not write to the keyspace.
extern "C" fn on_keyspace_event(
    ctx: *mut raw::RedisModuleCtx,
    _type: c_int,
    event: *const c_char,
    key: *mut raw::RedisModuleString,
) -> c_int {
    guard("keyspace event", (), || keyspace_event(ctx, event, key));
    raw::Status::Ok as c_int
}

fn keyspace_event(
    ctx: *mut raw::RedisModuleCtx,
    event: *const c_char,
    key: *mut raw::RedisModuleString,
) {
    // SAFETY: Redis passes a NUL-terminated event name, a live key name and
    // a context whose selected database is the key's.
    let (event, name, db) = unsafe {
        (
            std::ffi::CStr::from_ptr(event).to_bytes(),
            RedisString::string_as_slice(key),
            raw::RedisModule_GetSelectedDb.map_or(-1, |f| f(ctx)),
        )
    };
    // Any event about the key consumes what its lock's unlink left: a lease
    // that ends unlinks the lock and says `expired` next, nothing between.
    // Another event first (`expire` after a `SET … PX` over the lock, `del`,
    // `rename_to`…) means the lock left some other way, and an `expired`
    // after it is about the value that replaced the lock.
    if datatype::take_unlinked(db, name) && event == b"expired" {
        stats::EXPIRED_HELD.incr();
    }
    if waiting::serving_inline() {
        return; // our own command frees the lock and serves it itself
    }
    if TTL_EVENTS.contains(&event) {
        if is_lock(ctx, key) {
            waiting::ttl_changed(ctx, LockName::new(db, name));
        } else if waiting::anyone_waiting() {
            // Not a lock (any more): another value, or nothing. Reading the
            // key may itself have deleted it: Redis 7.0 expires a key a
            // read finds past its TTL (`SET … PXAT` in the past sends
            // `expire` first), and does not send the `expired` that follows
            // to the module whose callback caused it. Its waiters are served
            // if the key is gone, or wait on for the other value.
            waiting::freed_by_event(ctx, LockName::new(db, name));
        }
        return;
    }
    if waiting::anyone_waiting() {
        waiting::freed_by_event(ctx, LockName::new(db, name));
    }
}

/// Events that change a key's TTL without this module: a lock's lease must
/// then be put back (no lock lives forever).
const TTL_EVENTS: [&[u8]; 3] = [b"persist", b"expire", b"restore"];

/// Whether `key` (in the context's database) holds a lock.
fn is_lock(ctx: *mut raw::RedisModuleCtx, key: *mut raw::RedisModuleString) -> bool {
    let context = Context::new(ctx);
    let name = RedisString::new(NonNull::new(ctx), key);
    let key = LockKey::open(&context, &name, Access::Read);
    let found = matches!(key.stored(), Ok(Some(_)));
    found
}

/// Flush, swap-db and end of loading: any lock with waiters may be free now.
extern "C" fn on_server_event(
    ctx: *mut raw::RedisModuleCtx,
    event: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    guard("server event", (), || {
        server_event(ctx, event, subevent, data)
    });
}

fn server_event(
    ctx: *mut raw::RedisModuleCtx,
    event: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    // (databases touched, whether a command caused it)
    let (dbs, in_command): (Vec<Option<i32>>, bool) = match (event.id, subevent) {
        (raw::REDISMODULE_EVENT_FLUSHDB, raw::REDISMODULE_SUBEVENT_FLUSHDB_END) => {
            // SAFETY: Redis passes a RedisModuleFlushInfo with this event.
            let db = unsafe { (*data.cast::<raw::RedisModuleFlushInfo>()).dbnum };
            (vec![(db >= 0).then_some(db)], true)
        }
        (raw::REDISMODULE_EVENT_SWAPDB, _) => {
            // SAFETY: Redis passes a RedisModuleSwapDbInfo with this event.
            let info = unsafe { &*data.cast::<raw::RedisModuleSwapDbInfo>() };
            (vec![Some(info.dbnum_first), Some(info.dbnum_second)], true)
        }
        (raw::REDISMODULE_EVENT_LOADING, raw::REDISMODULE_SUBEVENT_LOADING_AOF_START) => {
            LOADING_AOF.set(true);
            return;
        }
        (raw::REDISMODULE_EVENT_LOADING, raw::REDISMODULE_SUBEVENT_LOADING_ENDED) => {
            if LOADING_AOF.replace(false) {
                // A pure AOF carries no aux data (RDB-only) and its rewrite
                // keeps only the locks still held: re-base the counter on the
                // clock, which is past every fence this server issued before
                // it stopped, unless `LOCK.FENCE` raised it further (then a
                // `LOCK.LASTFENCE` record in the AOF raised it while loading,
                // see `propagation`). Not for a replica's sync: a replica
                // keeps exactly its master's counter.
                fence::observe(fence::next(0, now_ms()));
            }
            quarantine::loading_ended();
            if datatype::V1_LOADED.swap(0, Relaxed) > 0 {
                upgrade::schedule(ctx);
            }
            (vec![None], false)
        }
        _ => return,
    };
    for db in dbs {
        waiting::freed_db(ctx, db, in_command);
    }
}
