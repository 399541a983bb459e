//! What the module hears from the server: keyspace notifications, the
//! flush, swap-db and loading server events, and the replication events
//! (a fork, a replica coming or going, a role change).
//!
//! Four uses. (1) A lock with waiters can be freed by any command (`DEL`,
//! `RENAME`, `MOVE`, eviction, a flush…): every notification about such a
//! key reports it to [`host::freed_by_event`], and a `persist`, `expire`
//! or `restore` of a lock to [`host::ttl_changed`]; callbacks must not
//! write, so the work runs right after the command (see `host`). (2)
//! Redis tells a data type that a key left the keyspace (`unlink2`) but not
//! why; an `expired` notification that follows at once, with no other event
//! about the key between, tells why: pairing the two counts leases that
//! ended while held. (3) At the end of loading, the fence
//! counter is re-based on the clock (see [`on_server_event`]). (4) A fork,
//! a replica change or a role change concerns several parts at once (see
//! [`on_replication_event`]): a module has one callback per event. (5) The
//! server's cron tick looks for a step of the wall clock (and corrects
//! for it) and has the replicas gate look at the replicas (see [`on_cron`]).
//!
//! Every notification heard costs the command that caused it, module data
//! or not: Redis builds a module context per delivery (~700 instructions).
//! So the module hears keys only once a lock may exist (see
//! `ffi::at_first_lock`), and a notification about a key that never held a
//! lock nor had waiters returns after a hash of its name (see
//! `lock_names::may_hold_lock`), without a key lookup.

use std::cell::Cell;
use std::os::raw::{c_char, c_int, c_void};
use std::sync::atomic::Ordering::Relaxed;

use redis_module::{logging, raw, Context, RedisString};

use crate::ffi::{at_first_lock, guard, lock_may_exist, now_ms};
use crate::ffi::{datatype, ephemeral, ephemeral_ends, expired_held, lock_names, partition};
use crate::ffi::{host, lease_rebase, subscribe_to_server_event};
use crate::ffi::{propagation, quarantine, upgrade};
use redislock_core::queue::LockName;
use redislock_core::{fence, stats};

thread_local! {
    /// Whether the load under way is the server's own AOF.
    static LOADING_AOF: Cell<bool> = const { Cell::new(false) };
}

/// Subscribes to what the module needs to hear: at load, the loading and
/// replication events; the rest once a lock may exist
/// ([`subscribe_for_locks`]).
pub fn subscribe(ctx: &Context) -> Result<(), &'static str> {
    // SAFETY: a copy of the API table's entry, read after module load.
    if unsafe { raw::RedisModule_SubscribeToKeyspaceEvents }.is_none() {
        return Err("cannot subscribe to keyspace events");
    }
    if !subscribe_to_server_event(
        ctx.ctx,
        raw::REDISMODULE_EVENT_LOADING,
        Some(on_server_event),
    ) {
        return Err("cannot subscribe to server events");
    }
    // A server where nobody locks pays nothing for the module on its keys.
    at_first_lock(ctx.ctx, subscribe_for_locks)?;
    // Nor per disconnect, where nobody asks `EPHEMERAL`: the client-change
    // event is subscribed at the first binding.
    ephemeral::hear_closes_with(Some(ephemeral_ends::on_client_change));
    propagation::watch(ctx)?;
    if !subscribe_to_server_event(ctx.ctx, raw::REDISMODULE_EVENT_CRON_LOOP, Some(on_cron)) {
        return Err("cannot subscribe to the cron event");
    }
    let events = [
        raw::REDISMODULE_EVENT_FORK_CHILD,
        raw::REDISMODULE_EVENT_REPLICA_CHANGE,
        raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED,
    ];
    for id in events {
        if !subscribe_to_server_event(ctx.ctx, id, Some(on_replication_event)) {
            return Err("cannot subscribe to replication events");
        }
    }
    Ok(())
}

/// The keyspace notifications, flushes and swaps: they matter only to a
/// lock or its waiters, so they are heard from the first lock on.
fn subscribe_for_locks(ctx: *mut raw::RedisModuleCtx) {
    // Only the classes that report a key leaving: `del` (DEL, UNLINK,
    // GETDEL, MIGRATE, a container's last element popped, a hash's last
    // field expired, Valkey's DELIFEQ), `rename_from`, `move_from` (all
    // generic), `expired` and `evicted`; the generic class also says when a
    // lock arrives (`restore`, `copy_to`, `rename_to`, `move_to`) and when
    // a TTL changes (`expire`, `persist`). A write that keeps the key (a
    // SET over a lock) does not free it, and every class heard is a cost
    // paid by every such write on the server, module data or not. So
    // neither `new` nor Redis 8.2's `overwritten` and `type_changed`
    // (classes of their own): a key created or replaced never frees a
    // lock, and the other servers do not send the last two.
    let types = raw::REDISMODULE_NOTIFY_GENERIC
        | raw::REDISMODULE_NOTIFY_EXPIRED
        | raw::REDISMODULE_NOTIFY_EVICTED;
    // SAFETY: the main thread, a context of this module; the callback is a
    // plain function that lives as long as the module. Redis appends the
    // subscriber to its list, safe even while it walks that list.
    let status = unsafe {
        raw::RedisModule_SubscribeToKeyspaceEvents.map_or(raw::Status::Err as c_int, |f| {
            f(ctx, types as c_int, Some(on_keyspace_event))
        })
    };
    let mut ok = status == raw::Status::Ok as c_int;
    for id in [
        raw::REDISMODULE_EVENT_FLUSHDB,
        raw::REDISMODULE_EVENT_SWAPDB,
    ] {
        ok &= subscribe_to_server_event(ctx, id, Some(on_server_event));
    }
    if !ok {
        logging::log_warning("lock: cannot subscribe to keyspace, flush or swap-db events");
    }
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
    // Most notifications are about keys that are not locks, on a server
    // where nobody waits: they must cost next to nothing (no allocation,
    // no string object, no key lookup unless the key may be a lock).
    // SAFETY: Redis passes a NUL-terminated event name, a live key name and
    // a context whose selected database is the key's; the name's bytes
    // live as long as `key`.
    let (event, name) = unsafe {
        (
            std::ffi::CStr::from_ptr(event).to_bytes(),
            RedisString::string_as_slice(key),
        )
    };
    // SAFETY: as above.
    let db = || unsafe { raw::RedisModule_GetSelectedDb.map_or(-1, |f| f(ctx)) };
    // Any event about the key consumes what its lock's unlink left: a lease
    // that ends unlinks the lock and says `expired` next, nothing between.
    // Another event first (`expire` after a `SET … PX` over the lock, `del`,
    // `rename_to`…) means the lock left some other way, and an `expired`
    // after it is about the value that replaced the lock.
    if expired_held::unlinked_pending()
        && expired_held::take_unlinked(db(), name)
        && event == b"expired"
    {
        stats::EXPIRED_HELD.incr();
    }
    if ARRIVALS.contains(&event) && is_lock(ctx, key) {
        // A lock under a new name: from now on its notifications count.
        lock_names::note_lock_name(name);
    } else if !lock_names::may_hold_lock(name) {
        return; // no lock and no waiter was ever under this name
    }
    ephemeral::key_event(db(), event, name);
    if host::serving_inline() {
        return; // our own command frees the lock and serves it itself
    }
    let nobody_waits = !host::anyone_waiting();
    if TTL_EVENTS.contains(&event) {
        if is_lock(ctx, key) {
            host::ttl_changed(ctx, LockName::new(db(), name));
        } else if !nobody_waits {
            // Not a lock (any more): another value, or nothing. Reading the
            // key may itself have deleted it: Redis 7.0 expires a key a
            // read finds past its TTL (`SET … PXAT` in the past sends
            // `expire` first), and does not send the `expired` that follows
            // to the module whose callback caused it. Its waiters are served
            // if the key is gone, or wait on for the other value.
            host::freed_by_event(ctx, LockName::new(db(), name));
        }
    } else if !nobody_waits {
        host::freed_by_event(ctx, LockName::new(db(), name));
    }
    // The last lock may just have gone.
    lock_names::forget_lock_names_if_idle(nobody_waits);
}

/// Events that bring a value to a new name (a lock keeps its lease):
/// `RENAME`, `MOVE`, `COPY` (the copy callback sees the name too) and
/// `RESTORE` (so does loading).
const ARRIVALS: [&[u8]; 4] = [b"rename_to", b"move_to", b"copy_to", b"restore"];

/// Events that change a key's TTL without this module: a lock's lease must
/// then be put back (no lock lives forever).
const TTL_EVENTS: [&[u8]; 3] = [b"persist", b"expire", b"restore"];

/// Whether `key` (in the context's database) holds a lock. No lookup while
/// no lock exists; otherwise one open without touching the key's LRU/LFU
/// (an operator's `EXPIRE` is not a read of the key by the module).
fn is_lock(ctx: *mut raw::RedisModuleCtx, key: *mut raw::RedisModuleString) -> bool {
    if stats::HELD.get() <= 0 {
        return false;
    }
    let mode = (raw::REDISMODULE_READ | raw::REDISMODULE_OPEN_KEY_NOTOUCH) as c_int;
    // SAFETY: the notification's live context and key name; the key is
    // closed before returning, and its type read only while open.
    unsafe {
        let (Some(open), Some(close), Some(type_of)) = (
            raw::RedisModule_OpenKey,
            raw::RedisModule_CloseKey,
            raw::RedisModule_ModuleTypeGetType,
        ) else {
            return false;
        };
        let opened = open(ctx, key, mode);
        if opened.is_null() {
            return false;
        }
        let lock = type_of(opened) == datatype::raw_type();
        close(opened);
        lock
    }
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
            if stats::HELD.get() > 0 {
                lock_may_exist(); // locks loaded off the main thread, if ever
            }
            if datatype::V1_LOADED.swap(0, Relaxed) > 0 {
                upgrade::schedule(ctx);
            }
            (vec![None], false)
        }
        _ => return,
    };
    for db in dbs {
        host::freed_db(ctx, db, in_command);
    }
}

/// The server's cron tick (`hz` a second): on an idle server, the look for
/// a step of the wall clock that no lock command made (and the correction
/// for it), then the replicas gate's look at the replicas, which the same
/// tick's replication cron has just recounted.
extern "C" fn on_cron(
    ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    _subevent: u64,
    _data: *mut c_void,
) {
    guard("cron tick", (), || {
        lease_rebase::check(ctx);
        partition::refresh(ctx);
    });
}

/// A fork, a replica change or a role change: whether effects have
/// listeners is read again, a fork has the fence counter recorded, a
/// replica that becomes a master starts its quarantine (it may lack holds
/// its old master granted), a role change drops the ephemeral bindings,
/// and the replicas gate looks again: one callback, as a module has one
/// per event.
extern "C" fn on_replication_event(
    ctx: *mut raw::RedisModuleCtx,
    event: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut c_void,
) {
    guard("replication event", (), || {
        propagation::refresh(ctx);
        let forked = event.id == raw::REDISMODULE_EVENT_FORK_CHILD
            && subevent == raw::REDISMODULE_SUBEVENT_FORK_CHILD_BORN;
        if forked {
            propagation::forked(ctx);
        }
        let promoted = event.id == raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED
            && subevent == raw::REDISMODULE_EVENT_REPLROLECHANGED_NOW_MASTER;
        if promoted {
            quarantine::promoted(partition::lag_ms());
        }
        if event.id == raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED {
            ephemeral::role_changed();
        }
        // Redis recounts its good replicas when one comes or goes.
        partition::refresh(ctx);
    });
}
