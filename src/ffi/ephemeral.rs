//! Ephemeral holds in the server: `LOCK.ACQUIRE … EPHEMERAL` binds a fresh
//! hold to the connection it is granted on, and the hold ends, as a release
//! to zero, when that connection closes.
//!
//! Which hold is bound to which client is [`crate::ephemeral`] (pure); this
//! file makes the bindings (the caller's, or a waiting client's when it is
//! handed the lock, see `host::Server::began`), hears connections close,
//! and ends their holds.
//!
//! - Connections closing are heard through the client-change server event,
//!   subscribed at the first binding: a server where nobody asks
//!   `EPHEMERAL` pays nothing per disconnect. The event fires wherever the
//!   server frees a client — inside another client's command (`CLIENT
//!   KILL`), or outside any (a read error, `QUIT`, the client timeout, an
//!   output-buffer limit, freed before the server sleeps) — and its
//!   context's client is the closing one. The hold is ended there and then,
//!   as the module's own timers end holds (keys opened outside any command,
//!   effects replicated with `RedisModule_Replicate`): no later command
//!   sees it, and its waiters are served in order in the same step.
//! - While the server pauses writes, or Redis would refuse them for lack of
//!   replicas, the module writes nothing on its own: the closed
//!   connections' holds wait and are ended by a short retry timer.
//! - A binding names a hold by lock, owner and fence; before a hold is
//!   ended its lock is read, and only the very hold that was bound ends (a
//!   later hold of the same owner, taken without `EPHEMERAL`, stays).
//! - `RENAME` and `MOVE` carry a lock's bindings to its new name (the
//!   keyspace notifications `rename_from`/`move_from` then
//!   `rename_to`/`move_to`). Bindings live in this process's memory only:
//!   a restart, a replica, a promoted replica or a `MIGRATE` target has none.

use std::cell::{Cell, RefCell};
use std::os::raw::{c_int, c_void};
use std::ptr;

use redis_module::{logging, raw, Context, RedisString};

use crate::ephemeral::{self, Binding, Bindings};
use crate::error::LockError;
use crate::ffi::host::Server;
use crate::ffi::key::{Access, LockKey};
use crate::ffi::writes_paused;
use crate::ffi::{context_flags, create_timer, guard, partition, subscribe_to_server_event};
use crate::ffi::{select_db, selected_db};
use crate::orchestrate;
use crate::queue::LockName;

thread_local! {
    static BINDINGS: RefCell<Bindings> = RefCell::new(Bindings::default());
    /// The client-change event is subscribed.
    static SUBSCRIBED: Cell<bool> = const { Cell::new(false) };
    /// A lock just left this name (`rename_from`, `move_from`); the next
    /// `rename_to`/`move_to` names where it went.
    static LEAVING: RefCell<Option<LockName>> = const { RefCell::new(None) };
    /// Holds of closed connections, to be ended once the module may write.
    static PENDING: RefCell<Vec<Binding>> = const { RefCell::new(Vec::new()) };
    /// The retry timer of [`PENDING`] is armed.
    static RETRY_ARMED: Cell<bool> = const { Cell::new(false) };
}

/// How long a closed connection's holds wait for writes to be allowed
/// again before the next look, in ms.
const RETRY_MS: u64 = 10;

/// Whether any hold is bound (every question here starts with it, so a
/// server without ephemeral holds pays one thread-local read).
pub fn any() -> bool {
    !BINDINGS.with_borrow(Bindings::is_empty)
}

/// The lock name of a command's key.
fn name_of(ctx: &Context, key: &RedisString) -> LockName {
    LockName::new(selected_db(ctx.ctx), key.as_slice())
}

/// The calling client's fresh hold of `key` with `fence`, asked
/// `EPHEMERAL`: bound to its connection. Inside `MULTI`, the client that
/// sent `EXEC`. Nothing is bound for what replication or loading applies
/// (those carry `LOCK.APPLY`, never this; the check is a second fence).
///
/// Inside a script or a function nothing gets here: [`refuse_in_script`]
/// turned the command away first.
pub fn bind_caller(ctx: &Context, key: &RedisString, owner: &[u8], fence: u64) {
    let applied = raw::REDISMODULE_CTX_FLAGS_REPLICATED
        | raw::REDISMODULE_CTX_FLAGS_LOADING
        | raw::REDISMODULE_CTX_FLAGS_SLAVE
        | raw::REDISMODULE_CTX_FLAGS_LUA;
    if context_flags(ctx.ctx) & applied as c_int != 0 {
        return;
    }
    // SAFETY: the command's live context.
    let id = unsafe { raw::RedisModule_GetClientId.map_or(0, |f| f(ctx.ctx)) };
    if id != 0 {
        bind(ctx.ctx, id, name_of(ctx, key), owner, fence);
    }
}

/// `EPHEMERAL` asked inside a Lua script or a function: refused. There the
/// command's client is the server's script client, not the caller, and the
/// module API offers no way to the caller; binding the script client (which
/// never disconnects) or holding as an ordinary hold would both leave the
/// caller believing its hold ends with its connection. What replication or
/// loading applies is never refused (it carries `LOCK.APPLY` anyway).
pub fn refuse_in_script(ctx: &Context) -> Result<(), LockError> {
    let flags = context_flags(ctx.ctx);
    let applied = raw::REDISMODULE_CTX_FLAGS_REPLICATED | raw::REDISMODULE_CTX_FLAGS_LOADING;
    if flags & raw::REDISMODULE_CTX_FLAGS_LUA as c_int != 0 && flags & applied as c_int == 0 {
        return Err(LockError::EphemeralInScript);
    }
    Ok(())
}

/// Binds `owner`'s fresh hold of `name` (with `fence`) to client `id`.
pub fn bind(ctx: *mut raw::RedisModuleCtx, id: u64, name: LockName, owner: &[u8], fence: u64) {
    if !SUBSCRIBED.replace(true)
        && !subscribe_to_server_event(
            ctx,
            raw::REDISMODULE_EVENT_CLIENT_CHANGE,
            Some(on_client_change),
        )
    {
        SUBSCRIBED.set(false);
        logging::log_warning(
            "lock: cannot hear connections close; EPHEMERAL holds end with their lease",
        );
        return;
    }
    BINDINGS.with_borrow_mut(|b| b.bind(id, name, owner, fence));
}

/// Whether `owner`'s hold of `key` with `fence` is bound (`LOCK.INFO`).
pub fn is_bound(ctx: &Context, key: &RedisString, owner: &[u8], fence: u64) -> bool {
    any() && BINDINGS.with_borrow(|b| b.is_bound(&name_of(ctx, key), owner, fence))
}

/// `owner` released its hold of `key` to zero: its binding, if any, goes.
pub fn released(ctx: &Context, key: &RedisString, owner: &[u8]) {
    if any() {
        BINDINGS.with_borrow_mut(|b| b.unbind(&name_of(ctx, key), owner));
    }
}

/// `LOCK.FENCE` raised `owner`'s hold of `key` from fence `old` to `new`:
/// still the same hold, still bound if it was.
pub fn refenced(ctx: &Context, key: &RedisString, owner: &[u8], old: u64, new: u64) {
    if any() && old != new {
        BINDINGS.with_borrow_mut(|b| b.refenced(&name_of(ctx, key), owner, old, new));
    }
}

/// A keyspace notification (`db`, `event`, key `name`): a lock that moves
/// to another name (`RENAME`, `MOVE`) takes its bindings along.
pub fn key_event(db: i32, event: &[u8], name: &[u8]) {
    if !any() {
        return;
    }
    match event {
        b"rename_from" | b"move_from" => LEAVING.set(Some(LockName::new(db, name))),
        b"rename_to" | b"move_to" => {
            if let Some(from) = LEAVING.take() {
                let to = LockName::new(db, name);
                BINDINGS.with_borrow_mut(|b| b.renamed(&from, &to));
            }
        }
        _ => {}
    }
}

/// The node changed role (became a replica, or was promoted): its holds are
/// now its master's, or a promoted copy of them, and ordinary ones. Those a
/// master had bound may come back by replication with the same fences, so
/// the bindings go rather than wait for their connections to close.
pub fn role_changed() {
    if any() {
        BINDINGS.with_borrow_mut(Bindings::clear);
        PENDING.take();
    }
}

/// The client-change server event: a connection closed.
extern "C" fn on_client_change(
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
        if !any() {
            return;
        }
        let ended = BINDINGS.with_borrow_mut(|b| b.closed(id));
        if !ended.is_empty() {
            end_or_defer(ctx, ended);
        }
    });
}

/// Ends the bound holds now, or once the module may write.
fn end_or_defer(ctx: *mut raw::RedisModuleCtx, mut ended: Vec<Binding>) {
    let replica = raw::REDISMODULE_CTX_FLAGS_SLAVE | raw::REDISMODULE_CTX_FLAGS_LOADING;
    if context_flags(ctx) & replica as c_int != 0 {
        return; // the holds are the master's, ordinary ones here
    }
    if writes_paused() || !partition::open() {
        PENDING.with_borrow_mut(|pending| pending.append(&mut ended));
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
    if !ephemeral::still_bound(binding, held) {
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
        let pending = PENDING.take();
        if !pending.is_empty() {
            end_or_defer(ctx, pending);
        }
    });
}
