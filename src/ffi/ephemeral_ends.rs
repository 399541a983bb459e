//! Ending ephemeral holds when their connection closes (the bindings are
//! `ffi::ephemeral`'s).
//!
//! - The client-change server event fires wherever the server frees a
//!   client — inside another client's command (`CLIENT KILL`), or outside
//!   any (a read error, `QUIT`, the client timeout, an output-buffer limit,
//!   freed before the server sleeps) — and its context's client is the
//!   closing one. The hold is ended there and then, as the module's own
//!   timers end holds (keys opened outside any command, effects replicated
//!   with `RedisModule_Replicate`): no later command sees it, and its
//!   waiters are served in order in the same step.
//! - While the server pauses writes, or Redis would refuse them for lack of
//!   replicas, the module writes nothing on its own: the closed
//!   connections' holds wait and are ended by a short retry timer.

use std::cell::Cell;
use std::os::raw::{c_int, c_void};
use std::ptr;

use redis_module::{logging, raw, Context, RedisString};

use crate::ffi::host::Server;
use crate::ffi::key::{Access, LockKey};
use crate::ffi::{context_flags, create_timer, ephemeral, guard, partition, writes_paused};
use crate::ffi::{select_db, selected_db};
use redislock_core::ephemeral::{still_bound, Binding};
use redislock_core::orchestrate;

thread_local! {
    /// The retry timer of the deferred holds is armed.
    static RETRY_ARMED: Cell<bool> = const { Cell::new(false) };
}

/// How long a closed connection's holds wait for writes to be allowed
/// again before the next look, in ms.
const RETRY_MS: u64 = 10;

/// The client-change server event: a connection closed.
pub extern "C" fn on_client_change(
    ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    if subevent != raw::REDISMODULE_SUBEVENT_CLIENT_CHANGE_DISCONNECTED || data.is_null() {
        return;
    }
    guard("connection closed", (), || {
        // SAFETY: Redis passes a RedisModuleClientInfo with this event.
        let id = unsafe { (*data.cast::<raw::RedisModuleClientInfo>()).id };
        if !ephemeral::any() {
            return;
        }
        let ended = ephemeral::closed(id);
        if !ended.is_empty() {
            end_or_defer(ctx, ended);
        }
    });
}

/// Ends the bound holds now, or once the module may write.
fn end_or_defer(ctx: *mut raw::RedisModuleCtx, ended: Vec<Binding>) {
    let replica = raw::REDISMODULE_CTX_FLAGS_SLAVE | raw::REDISMODULE_CTX_FLAGS_LOADING;
    if context_flags(ctx) & replica as c_int != 0 {
        return; // the holds are the master's, ordinary ones here
    }
    if writes_paused() || !partition::open() {
        ephemeral::defer(ended);
        if !RETRY_ARMED.replace(true) {
            create_timer(ctx, RETRY_MS, retry_cb, ptr::null_mut());
        }
        return;
    }
    // The context's client is the closing one, or a timer's: the database
    // it had selected is put back.
    let db = selected_db(ctx);
    let context = Context::new(ctx);
    for binding in ended {
        end_one(&context, &binding);
    }
    select_db(ctx, db);
}

/// Ends one bound hold as a release to zero, if it is still that hold.
fn end_one(ctx: &Context, binding: &Binding) {
    select_db(ctx.ctx, binding.name.db);
    let key = RedisString::create_from_slice(ctx.ctx, &binding.name.key);
    let held = {
        let lock = LockKey::open(ctx, &key, Access::Read);
        let now = lock.now();
        lock.holds().ok().flatten().and_then(|holds| {
            holds
                .of(&binding.owner, now)
                .map(|holder| holder.hold.fence)
        })
    };
    if !still_bound(binding, held) {
        return;
    }
    let mut host = Server::outside_command(ctx);
    if let Err(why) = orchestrate::end_bound(&mut host, &key, &binding.owner) {
        logging::log_warning(format!(
            "lock: an ephemeral hold was not ended: {}",
            why.message()
        ));
    }
}

/// The retry of holds whose connection closed while writes were refused.
extern "C" fn retry_cb(ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    guard("ephemeral retry", (), || {
        RETRY_ARMED.set(false);
        let pending = ephemeral::take_deferred();
        if !pending.is_empty() {
            end_or_defer(ctx, pending);
        }
    });
}
