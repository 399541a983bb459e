//! Ephemeral holds in the server: `LOCK.ACQUIRE … EPHEMERAL` binds a fresh
//! hold to the connection it is granted on, and the hold ends, as a release
//! to zero, when that connection closes.
//!
//! Which hold is bound to which client is [`redislock_core::ephemeral`] (pure); this
//! file keeps the server's bindings: it makes them (the caller's, or a
//! waiting client's when it is handed the lock, see `host::Server::began`),
//! keeps them through `RENAME`, `MOVE`, `LOCK.FENCE` and a release, and
//! hands a closed connection's holds to `ffi::ephemeral_ends`, which ends
//! them.
//!
//! - Connections closing are heard through the client-change server event,
//!   subscribed at the first binding: a server where nobody asks
//!   `EPHEMERAL` pays nothing per disconnect.
//! - A binding names a hold by lock, owner and fence; before a hold is
//!   ended its lock is read, and only the very hold that was bound ends (a
//!   later hold of the same owner, taken without `EPHEMERAL`, stays).
//! - `RENAME` and `MOVE` carry a lock's bindings to its new name (the
//!   keyspace notifications `rename_from`/`move_from` then
//!   `rename_to`/`move_to`). Bindings live in this process's memory only:
//!   a restart, a replica, a promoted replica or a `MIGRATE` target has none.

use std::cell::{Cell, RefCell};
use std::os::raw::c_int;

use redis_module::{logging, raw, Context, RedisString};

use crate::ffi::{context_flags, selected_db, subscribe_to_server_event};
use redislock_core::ephemeral::{Binding, Bindings};
use redislock_core::error::LockError;
use redislock_core::queue::LockName;

thread_local! {
    static BINDINGS: RefCell<Bindings> = RefCell::new(Bindings::default());
    /// The client-change event is subscribed.
    static SUBSCRIBED: Cell<bool> = const { Cell::new(false) };
    /// A lock just left this name (`rename_from`, `move_from`); the next
    /// `rename_to`/`move_to` names where it went.
    static LEAVING: RefCell<Option<LockName>> = const { RefCell::new(None) };
    /// Holds of closed connections, to be ended once the module may write.
    static PENDING: RefCell<Vec<Binding>> = const { RefCell::new(Vec::new()) };
    /// The client-change callback that ends a closed connection's holds
    /// (`ffi::ephemeral_ends`), given at load ([`hear_closes_with`]) and
    /// subscribed at the first binding.
    static ON_CLOSE: Cell<raw::RedisModuleEventCallback> = const { Cell::new(None) };
}

/// Names the callback to subscribe to the client-change event at the
/// first binding (module load).
pub fn hear_closes_with(callback: raw::RedisModuleEventCallback) {
    ON_CLOSE.set(callback);
}

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
        && (ON_CLOSE.get().is_none()
            || !subscribe_to_server_event(
                ctx,
                raw::REDISMODULE_EVENT_CLIENT_CHANGE,
                ON_CLOSE.get(),
            ))
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

/// Client `id`'s connection closed: its bindings go, and the holds they
/// named are returned, to be ended.
pub fn closed(id: u64) -> Vec<Binding> {
    BINDINGS.with_borrow_mut(|b| b.closed(id))
}

/// Holds of closed connections that cannot be ended yet (writes refused):
/// kept until [`take_deferred`], or dropped by a role change.
pub fn defer(mut ended: Vec<Binding>) {
    PENDING.with_borrow_mut(|pending| pending.append(&mut ended));
}

/// The holds [`defer`] kept, to be ended now.
pub fn take_deferred() -> Vec<Binding> {
    PENDING.take()
}
