//! Blocked waiters: parking clients in `LOCK.ACQUIRE … WAIT` and handing
//! them the lock when it frees.
//!
//! - Each waiting client is blocked with `RedisModule_BlockClient` (no
//!   server-side timeout) and queued in a module-owned FIFO
//!   ([`crate::queue`]). Its `WAIT` deadline is a module timer, so it fires
//!   within a millisecond and never races a hand-off (Redis 7.0 checks
//!   blocking timeouts before it handles module unblocks).
//! - A lock frees by our own `RELEASE`, or by any command or event Redis
//!   tells us about (keyspace notifications, flush / swap-db / loading
//!   events). Notification callbacks must not write, so they only
//!   [`schedule`] the lock; a 0 ms "pump" timer then serves one waiter per
//!   freed lock: it writes the lock for the waiter (replicated as an effect,
//!   like any acquisition) and unblocks it with its fence.
//! - A lease that ends while clients wait is caught by a timer at the lease
//!   end, not by Redis's periodic expiry cycle.
//!
//! All of this runs on the server's main thread. The state lives in a
//! thread-local `RefCell`; no borrow is held across a call into Redis, since
//! Redis may call back (a keyspace notification) during that call.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::os::raw::{c_int, c_void};
use std::ptr;

use redis_module::{raw, Context, RedisString};

use crate::ffi::key::LockKey;
use crate::ffi::{guard, now_ms};
use crate::lock::Hold;
use crate::queue::{LockName, WaitQueues};
use crate::{fence, stats};

/// One parked client.
struct Waiter {
    owner: Vec<u8>,
    ttl_ms: u64,
    client: *mut raw::RedisModuleBlockedClient,
    /// The `WAIT` deadline timer, if the wait has a limit.
    deadline: Option<raw::RedisModuleTimerID>,
}

/// What the reply callback tells the client once it is unblocked.
enum Outcome {
    Granted(u64),
    TimedOut,
    /// The lock moved to another cluster node: an error such as
    /// `ASK slot host:port` that a cluster client follows.
    Redirect(CString),
}

#[derive(Default)]
struct State {
    queues: WaitQueues<Waiter>,
    /// Locks to look at in the next pump, in the order they were scheduled.
    pending: Vec<LockName>,
    pending_set: HashSet<LockName>,
    pump_armed: bool,
    /// Earliest armed lease-end check per lock.
    lease_checks: HashMap<LockName, u64>,
    /// Clients handed a lock whose reply is not written yet: if one is
    /// unblocked or disconnects in that window, the grant is taken back.
    granted: HashMap<u64, (LockName, Vec<u8>, u64)>,
    revokes: Vec<(LockName, Vec<u8>, u64)>,
}

thread_local! {
    static STATE: RefCell<State> = RefCell::new(State::default());
}

fn with<R>(f: impl FnOnce(&mut State) -> R) -> R {
    STATE.with_borrow_mut(f)
}

// ---------------------------------------------------------------------------
// Questions the command handlers ask.
// ---------------------------------------------------------------------------

/// The lock name of `key` in the context's selected database.
pub fn lock_name(ctx: &Context, key: &RedisString) -> LockName {
    (selected_db(ctx.ctx), key.as_slice().to_vec())
}

/// How many clients wait on `key` (in the selected database).
pub fn waiters(ctx: &Context, key: &RedisString) -> usize {
    waiting_on(ctx, key).map_or(0, |name| with(|s| s.queues.len(&name)))
}

/// The lock name of `key` if clients wait on it (a free lock is then
/// theirs, not a newcomer's). Allocates nothing when nobody waits anywhere.
pub fn waiting_on(ctx: &Context, key: &RedisString) -> Option<LockName> {
    if !anyone_waiting() {
        return None;
    }
    let name = lock_name(ctx, key);
    has_waiters(&name).then_some(name)
}

fn has_waiters(name: &LockName) -> bool {
    with(|s| s.queues.has_waiters(name))
}

/// Whether any client waits at all (the fast path of every notification).
pub fn anyone_waiting() -> bool {
    with(|s| s.queues.total() > 0)
}

/// Whether this command may block: not inside MULTI, Lua or a function.
pub fn can_block(ctx: &Context) -> bool {
    // SAFETY: the command's live context.
    let flags = unsafe { raw::RedisModule_GetContextFlags.map_or(0, |f| f(ctx.ctx)) };
    let deny = raw::REDISMODULE_CTX_FLAGS_DENY_BLOCKING
        | raw::REDISMODULE_CTX_FLAGS_MULTI
        | raw::REDISMODULE_CTX_FLAGS_LUA;
    flags & deny as c_int == 0
}

// ---------------------------------------------------------------------------
// Blocking a client.
// ---------------------------------------------------------------------------

/// Parks the calling client at the back of `name`'s queue. `holder_expiry`
/// is the current holder's lease end, checked then even if Redis is late.
pub fn block(
    ctx: &Context,
    name: LockName,
    owner: &[u8],
    ttl_ms: u64,
    timeout_ms: u64,
    holder_expiry: Option<u64>,
) {
    // SAFETY: the command's live context; the callbacks are plain functions.
    let (client, id) = unsafe {
        let client = raw::RedisModule_BlockClient.map_or(ptr::null_mut(), |f| {
            f(
                ctx.ctx,
                Some(reply_cb),
                Some(timeout_cb),
                Some(free_privdata),
                0,
            )
        });
        if let Some(set) = raw::RedisModule_SetDisconnectCallback {
            set(client, Some(disconnect_cb));
        }
        (
            client,
            raw::RedisModule_GetClientId.map_or(0, |f| f(ctx.ctx)),
        )
    };
    let deadline = (timeout_ms > 0)
        .then(|| create_timer(ctx.ctx, timeout_ms, deadline_cb, id as usize as *mut c_void));
    let waiter = Waiter {
        owner: owner.to_vec(),
        ttl_ms,
        client,
        deadline,
    };
    // A client waits in one place at a time, and a blocked client sends no
    // command, so this push cannot fail; if it ever did, the client gets
    // nil now rather than hanging unqueued.
    let queued = with(|s| s.queues.push(name.clone(), id, waiter));
    if !queued {
        stop_deadline(ctx.ctx, deadline);
        unblock(client, Some(Outcome::TimedOut));
        return;
    }
    stats::WAITING.add(1);
    if let Some(at) = holder_expiry {
        arm_lease_check(ctx.ctx, name, at);
    }
}

/// Asks for `name` to be looked at soon: if it is free then, its
/// longest-waiting client gets it. Cheap and idempotent.
pub fn schedule(ctx: *mut raw::RedisModuleCtx, name: LockName) {
    let arm = with(|s| {
        if !s.queues.has_waiters(&name) || !s.pending_set.insert(name.clone()) {
            return false;
        }
        s.pending.push(name);
        !std::mem::replace(&mut s.pump_armed, true)
    });
    if arm {
        create_timer(ctx, 0, pump_cb, ptr::null_mut());
    }
}

/// Schedules every lock with waiters in `db` (`None`: all databases).
pub fn schedule_db(ctx: *mut raw::RedisModuleCtx, db: Option<i32>) {
    for name in with(|s| s.queues.names_in(db)) {
        schedule(ctx, name);
    }
}

/// The holder's lease of `key` now ends at `at`: check then, if clients wait.
pub fn lease_changed(ctx: &Context, key: &RedisString, at: u64) {
    if let Some(name) = waiting_on(ctx, key) {
        arm_lease_check(ctx.ctx, name, at);
    }
}

// ---------------------------------------------------------------------------
// Serving waiters.
// ---------------------------------------------------------------------------

/// The pump: takes back revoked grants, then serves each scheduled lock.
extern "C" fn pump_cb(ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    guard("pump", (), || {
        let (pending, revokes) = with(|s| {
            s.pump_armed = false;
            s.pending_set.clear();
            (
                std::mem::take(&mut s.pending),
                std::mem::take(&mut s.revokes),
            )
        });
        let ctx = Context::new(ctx);
        for (name, owner, fence) in revokes {
            revoke(&ctx, &name, &owner, fence);
        }
        for name in pending {
            serve(&ctx, &name);
        }
    });
}

/// If `name` is free, grants it to its longest-waiting client.
fn serve(ctx: &Context, name: &LockName) {
    if !is_writable_master(ctx) || !has_waiters(name) {
        return;
    }
    select_db(ctx.ctx, name.0);
    let key_name = RedisString::create_from_slice(ctx.ctx, &name.1);
    let mut key = LockKey::open_in_timer(ctx, &key_name);
    let now = now_ms();
    match key.current() {
        Ok(None) => {}
        // The lease ended at `expires_at`; Redis would expire the key only
        // a millisecond later (once now > expiry). The lock is free now: say
        // so as Redis would, and hand it over without that extra wait.
        Ok(Some(lock)) if !lock.is_live(now) => {
            key.notify(raw::REDISMODULE_NOTIFY_EXPIRED, c"expired");
            stats::EXPIRED_HELD.incr();
        }
        Ok(Some(lock)) => return arm_lease_check(ctx.ctx, name.clone(), lock.hold.expires_at),
        // Another type (a SET overwrote the lock): wait for that key to go,
        // which Redis does once now > its expiry.
        Err(_) => {
            if let Some(at) = key.expires_at() {
                arm_lease_check(ctx.ctx, name.clone(), at.saturating_add(1));
            }
            return;
        }
    }
    let Some((id, waiter)) = with(|s| s.queues.pop(name)) else {
        return;
    };
    stats::WAITING.add(-1);
    stop_deadline(ctx.ctx, waiter.deadline);
    let hold = Hold {
        count: 1,
        fence: fence::issue(now),
        expires_at: now.saturating_add(waiter.ttl_ms),
    };
    key.apply(&waiter.owner, hold, true);
    key.notify(raw::REDISMODULE_NOTIFY_MODULE, c"lock.acquire");
    drop(key);
    stats::ACQUIRED.incr();
    stats::HANDOFFS.incr();
    with(|s| {
        s.granted
            .insert(id, (name.clone(), waiter.owner, hold.fence))
    });
    unblock(waiter.client, Some(Outcome::Granted(hold.fence)));
    if has_waiters(name) {
        arm_lease_check(ctx.ctx, name.clone(), hold.expires_at);
    }
}

/// `name` is leaving this node (a cluster slot migration): every client
/// waiting on it is answered `error` instead of being handed a lock this node
/// no longer has.
pub fn redirect(ctx: *mut raw::RedisModuleCtx, name: &LockName, error: &str) {
    let Ok(error) = CString::new(error) else {
        return;
    };
    while let Some((_, waiter)) = with(|s| s.queues.pop(name)) {
        stats::WAITING.add(-1);
        stop_deadline(ctx, waiter.deadline);
        unblock(waiter.client, Some(Outcome::Redirect(error.clone())));
    }
}

/// Takes back a grant whose client never got the reply: frees the lock if it
/// is still that grant, and serves the next waiter.
fn revoke(ctx: &Context, name: &LockName, owner: &[u8], fence: u64) {
    if !is_writable_master(ctx) {
        return;
    }
    select_db(ctx.ctx, name.0);
    let key_name = RedisString::create_from_slice(ctx.ctx, &name.1);
    let key = LockKey::open_in_timer(ctx, &key_name);
    if let Ok(Some(lock)) = key.current() {
        if lock.owner == owner && lock.hold.fence == fence {
            key.delete();
            drop(key);
            schedule(ctx.ctx, name.clone());
        }
    }
}

/// Grants and revokes change data: only on a master that is not loading.
fn is_writable_master(ctx: &Context) -> bool {
    // SAFETY: a live context.
    let flags = unsafe { raw::RedisModule_GetContextFlags.map_or(0, |f| f(ctx.ctx)) };
    let not_now = raw::REDISMODULE_CTX_FLAGS_SLAVE | raw::REDISMODULE_CTX_FLAGS_LOADING;
    flags & not_now as c_int == 0
}

// ---------------------------------------------------------------------------
// Leaving the queue: deadline, CLIENT UNBLOCK, disconnect.
// ---------------------------------------------------------------------------

/// The `WAIT` deadline passed: reply nil.
extern "C" fn deadline_cb(ctx: *mut raw::RedisModuleCtx, data: *mut c_void) {
    guard("deadline", (), || {
        let id = data as usize as u64;
        // This timer is the one firing: Redis frees it after this callback,
        // so it must not be stopped here too.
        with(|s| s.queues.get_mut(id).map(|w| w.deadline = None));
        if let Some(waiter) = leave(ctx, id, false) {
            stats::WAIT_TIMEOUTS.incr();
            unblock(waiter.client, Some(Outcome::TimedOut));
        }
    });
}

/// `CLIENT UNBLOCK id` (nil reply): the client leaves the queue.
extern "C" fn timeout_cb(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    guard("unblock", (), || {
        // SAFETY: Redis calls this with the blocked client's context.
        let (id, client) = unsafe {
            (
                raw::RedisModule_GetClientId.map_or(0, |f| f(ctx)),
                raw::RedisModule_GetBlockedClientHandle.map_or(ptr::null_mut(), |f| f(ctx)),
            )
        };
        leave(ctx, id, true);
        // SAFETY: the reply goes to the client being unblocked.
        unsafe {
            raw::RedisModule_ReplyWithNull.map(|f| f(ctx));
        }
        // Redis needs the handle back to free it; no reply follows.
        unblock(client, None);
    });
    raw::Status::Ok as c_int
}

/// The client disconnected, or `CLIENT UNBLOCK … ERROR` (Redis replies the
/// error itself): it leaves the queue.
extern "C" fn disconnect_cb(
    ctx: *mut raw::RedisModuleCtx,
    client: *mut raw::RedisModuleBlockedClient,
) {
    guard("disconnect", (), || {
        // SAFETY: Redis calls this with a context naming the leaving client.
        let id = unsafe { raw::RedisModule_GetClientId.map_or(0, |f| f(ctx)) };
        leave(ctx, id, true);
        unblock(client, None);
    });
}

/// Takes client `id` out of its queue. `revoke_grant`: it is gone for good,
/// so a grant it never heard of is taken back.
fn leave(ctx: *mut raw::RedisModuleCtx, id: u64, revoke_grant: bool) -> Option<Waiter> {
    let (waiter, grant) = with(|s| {
        let waiter = s.queues.remove(id).map(|(_, w)| w);
        let grant = if revoke_grant {
            s.granted.remove(&id)
        } else {
            None
        };
        (waiter, grant)
    });
    if let Some(grant) = grant {
        // The pump runs the revoke; arm it even if no lock is pending.
        let arm = with(|s| {
            s.revokes.push(grant);
            !std::mem::replace(&mut s.pump_armed, true)
        });
        if arm {
            create_timer(ctx, 0, pump_cb, ptr::null_mut());
        }
    }
    let waiter = waiter?;
    stats::WAITING.add(-1);
    stop_deadline(ctx, waiter.deadline);
    Some(waiter)
}

// ---------------------------------------------------------------------------
// Replies to unblocked clients.
// ---------------------------------------------------------------------------

/// Writes the reply of a client we unblocked: its fence, or nil.
extern "C" fn reply_cb(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    guard("reply", (), || {
        // SAFETY: Redis calls this with the unblocked client's context and
        // the private data we passed to RedisModule_UnblockClient.
        unsafe {
            let id = raw::RedisModule_GetClientId.map_or(0, |f| f(ctx));
            with(|s| s.granted.remove(&id));
            let outcome = raw::RedisModule_GetBlockedClientPrivateData
                .map_or(ptr::null_mut(), |f| f(ctx))
                .cast::<Outcome>();
            match outcome.as_ref() {
                Some(Outcome::Granted(fence)) => {
                    let fence = i64::try_from(*fence).unwrap_or(i64::MAX);
                    raw::RedisModule_ReplyWithLongLong.map(|f| f(ctx, fence));
                }
                Some(Outcome::Redirect(error)) => {
                    raw::RedisModule_ReplyWithError.map(|f| f(ctx, error.as_ptr()));
                }
                Some(Outcome::TimedOut) | None => {
                    raw::RedisModule_ReplyWithNull.map(|f| f(ctx));
                }
            }
        }
    });
    raw::Status::Ok as c_int
}

/// Frees the private data given to `RedisModule_UnblockClient`.
extern "C" fn free_privdata(_ctx: *mut raw::RedisModuleCtx, data: *mut c_void) {
    if !data.is_null() {
        // SAFETY: only `unblock` passes private data: a boxed Outcome.
        drop(unsafe { Box::from_raw(data.cast::<Outcome>()) });
    }
}

/// Unblocks `client`; the reply callback then answers with `outcome`.
fn unblock(client: *mut raw::RedisModuleBlockedClient, outcome: Option<Outcome>) {
    if client.is_null() {
        return;
    }
    let data = outcome.map_or(ptr::null_mut(), |o| {
        Box::into_raw(Box::new(o)).cast::<c_void>()
    });
    // SAFETY: `client` is a handle from RedisModule_BlockClient not yet
    // unblocked (each path that gets here took its waiter out first).
    unsafe {
        raw::RedisModule_UnblockClient.map(|f| f(client, data));
    }
}

// ---------------------------------------------------------------------------
// Timers and small helpers.
// ---------------------------------------------------------------------------

/// Arms a check of `name` at `at` (unix ms), unless an earlier one is armed
/// (it re-arms for the later end when it finds the lock held).
fn arm_lease_check(ctx: *mut raw::RedisModuleCtx, name: LockName, at: u64) {
    let arm = with(|s| match s.lease_checks.get(&name) {
        Some(&armed) if armed <= at => false,
        _ => {
            s.lease_checks.insert(name.clone(), at);
            true
        }
    });
    if arm {
        let delay = at.saturating_sub(now_ms());
        let data = Box::into_raw(Box::new((name, at))).cast::<c_void>();
        create_timer(ctx, delay, lease_cb, data);
    }
}

/// A lease-end check fired: serve the lock now (Redis expires it on open).
extern "C" fn lease_cb(ctx: *mut raw::RedisModuleCtx, data: *mut c_void) {
    // SAFETY: `arm_lease_check` passed a boxed (LockName, u64), used once.
    let (name, at) = *unsafe { Box::from_raw(data.cast::<(LockName, u64)>()) };
    guard("lease check", (), || {
        with(|s| {
            if s.lease_checks.get(&name) == Some(&at) {
                s.lease_checks.remove(&name);
            }
        });
        serve(&Context::new(ctx), &name);
    });
}

fn create_timer(
    ctx: *mut raw::RedisModuleCtx,
    delay_ms: u64,
    callback: extern "C" fn(*mut raw::RedisModuleCtx, *mut c_void),
    data: *mut c_void,
) -> raw::RedisModuleTimerID {
    let delay = i64::try_from(delay_ms).unwrap_or(i64::MAX);
    // SAFETY: a live context of this module; `data` is handed back to
    // `callback` once, when the timer fires.
    unsafe { raw::RedisModule_CreateTimer.map_or(0, |f| f(ctx, delay, Some(callback), data)) }
}

fn stop_deadline(ctx: *mut raw::RedisModuleCtx, timer: Option<raw::RedisModuleTimerID>) {
    if let Some(id) = timer {
        // SAFETY: a live context of this module; deadline timers carry no
        // allocation, so the returned data needs no freeing.
        unsafe {
            let mut data = ptr::null_mut();
            raw::RedisModule_StopTimer.map(|f| f(ctx, id, &mut data));
        }
    }
}

fn selected_db(ctx: *mut raw::RedisModuleCtx) -> i32 {
    // SAFETY: a live context.
    unsafe { raw::RedisModule_GetSelectedDb.map_or(0, |f| f(ctx)) }
}

fn select_db(ctx: *mut raw::RedisModuleCtx, db: i32) {
    // SAFETY: a live context; an index that no longer exists fails harmlessly.
    unsafe {
        raw::RedisModule_SelectDb.map(|f| f(ctx, db));
    }
}
