//! The server as the sequencing sees it ([`Server`], the
//! [`redislock_core::orchestrate::Host`] of the module), and blocked waiters: parking
//! clients in `LOCK.ACQUIRE … WAIT` and answering them.
//!
//! When a lock is served, handed over or taken back, and what the pump
//! does, is [`redislock_core::orchestrate`]'s (shared with the model checker); this
//! file carries each step out with the C API, and keeps what only a server
//! has: blocked-client handles, timers and jobs, the database a timer works
//! in, cluster redirections, and the reply races below.
//!
//! - A waiting client is blocked with `RedisModule_BlockClient` (no
//!   server-side timeout). Its handle is a [`BlockedClient`], a value that is
//!   consumed when it is unblocked: no path can unblock it twice, and one
//!   dropped on a panic still answers nil. Its `WAIT` deadline is kept in
//!   [`Deadlines`], ordered by time, behind one module timer for the
//!   earliest (creating and stopping a timer per wait cost more than the
//!   rest of a hand-off's waiting), so it is still answered within a
//!   millisecond of its deadline.
//! - A lock freed by our own command (`RELEASE` to zero, an `ACQUIRE` that
//!   finds an ended lease) is handed over inside that command
//!   (`orchestrate::serve` from the command): the release and the grant are one step for every later
//!   command and for replicas. A lock freed by another command is reported
//!   by a keyspace notification or a server event; notification callbacks
//!   must not write, so the pump runs as a post-notification job where the
//!   server has them (Redis 7.2+, Valkey), right after the command, and as
//!   a 0 ms timer otherwise — and also there, for a notification sent
//!   outside any command, after which the server runs no job (see
//!   [`arm_pump`]).
//! - While the server pauses writes (`CLIENT PAUSE`, `FAILOVER`, `SHUTDOWN`
//!   waiting for replicas) the module writes nothing on its own
//!   (`RedisModule_AvoidReplicaTraffic`): the engine keeps the work and a
//!   short retry timer brings it back when the pause ends. The same holds
//!   where Redis would refuse a write for lack of replicas
//!   (`min-replicas-to-write`, see `ffi::partition`): a master cut off from
//!   its replicas hands nothing over.
//! - A granted client's reply is written by the server later, when it
//!   handles the clients modules unblocked (before it next sleeps). Redis
//!   7.0's `CLIENT UNBLOCK` of a client in that state — from any command run
//!   in between, a queued `MULTI` included — unblocks it without any
//!   callback, and the reply is lost. So on servers older than 7.2 a granted
//!   client stays blocked ([`DEFERRED`]) until the server's before-sleep
//!   event, which Redis fires right before it writes module replies; a
//!   `CLIENT UNBLOCK` before that reaches our unblock callback, which
//!   answers the fence itself. Newer servers (Redis 7.2+, Valkey) leave a
//!   client a module has unblocked to its reply — a plain `CLIENT UNBLOCK`
//!   of it replies 1 and changes nothing; with `ERROR` the client gets the
//!   error, and the disconnect callback takes the grant back — so it is
//!   unblocked at once there.
//!
//! All of this runs on the server's main thread. The engine lives in a
//! thread-local `RefCell`; no borrow is held across a call into Redis, since
//! Redis may call back (a keyspace notification) during that call.

use std::cell::{Cell, RefCell};
use std::ffi::CString;
use std::mem::ManuallyDrop;
use std::os::raw::{c_int, c_void};
use std::ptr::{self, NonNull};

use redis_module::{logging, raw, Context, RedisString, RedisValue};

use crate::ffi::key::{LockKey, Tracked};
use crate::ffi::latency;
use crate::ffi::{self, config, ephemeral, partition, quarantine};
use crate::ffi::{context_flags, create_timer, guard, now_ms, server_version, writes_paused};
use crate::ffi::{select_db, selected_db};
use redislock_core::error::LockError;
use redislock_core::handoff::{Deadlines, Engine, Gate, Timer};
use redislock_core::holds::{Holds, Mode};
use redislock_core::lock::Hold;
use redislock_core::orchestrate::{self, Event, Host, Lease, Nil, Read, Removal, Stored, Write};
use redislock_core::queue::LockName;
use redislock_core::{cluster, fence, stats};

/// A blocked client's handle, owned by whoever must answer it next.
pub struct BlockedClient(NonNull<raw::RedisModuleBlockedClient>);

impl BlockedClient {
    /// Unblocks the client; its reply callback then answers `outcome`
    /// (`None`: the reply was already written, Redis only needs the handle).
    fn unblock(self, outcome: Option<Outcome>) {
        let this = ManuallyDrop::new(self);
        unblock_raw(this.0, outcome);
    }
}

impl Drop for BlockedClient {
    /// Only reached when a path lost the handle (a panic between taking a
    /// waiter and answering it): answer nil rather than leave it blocked.
    fn drop(&mut self) {
        logging::log_warning("lock: a waiting client was answered nil after an internal error");
        unblock_raw(self.0, Some(Outcome::TimedOut));
    }
}

/// One parked client: its handle and its `WAIT` deadline (unix ms).
pub struct Parked {
    client: BlockedClient,
    deadline: Option<u64>,
    /// When it parked ([`latency::now_us`]): `LOCK.QUEUE`'s `waited` and
    /// `INFO lock`'s `wait_usec`.
    since_us: u64,
    /// Asked `EPHEMERAL`: a fresh hold granted to it is bound to its
    /// connection.
    ephemeral: bool,
    /// Asked with a command for several locks: its grant is answered as a
    /// list of fences, even of one lock.
    list: bool,
}

/// What the reply callback tells the client once it is unblocked.
enum Outcome {
    Granted(u64),
    /// Granted several locks at once: their fences, in the order named.
    GrantedAll(Vec<u64>),
    TimedOut,
    /// Refused when it reached the head of the queue (the upgrade error).
    Refused(LockError),
    /// The lock moved to another cluster node: an error such as
    /// `ASK slot host:port` that a cluster client follows.
    Redirect(CString),
}

thread_local! {
    static ENGINE: RefCell<Engine<Parked>> = RefCell::new(Engine::default());
    /// Every parked client's `WAIT` deadline, behind one module timer.
    static DEADLINES: RefCell<Deadlines> = RefCell::new(Deadlines::default());
    /// Set while a command of ours frees a lock and serves its waiters
    /// itself: the notifications it sends need no pump.
    static SERVING_INLINE: Cell<bool> = const { Cell::new(false) };
    /// Clients granted but kept blocked until the server's before-sleep
    /// event (servers before 7.2; see the module docs): (client id, handle,
    /// fence), unblocked by [`before_sleep_cb`].
    static DEFERRED: RefCell<Vec<(u64, BlockedClient, Outcome)>> = const { RefCell::new(Vec::new()) };
    /// [`before_sleep_cb`] is subscribed: from the first deferred grant
    /// until a timer after the last one (every turn of the event loop pays
    /// for a subscriber, so it stays only while grants are deferred).
    static BEFORE_SLEEP_HOOKED: Cell<bool> = const { Cell::new(false) };
    /// The timer that unsubscribes [`before_sleep_cb`] is armed.
    static UNHOOK_ARMED: Cell<bool> = const { Cell::new(false) };
}

fn with<R>(f: impl FnOnce(&mut Engine<Parked>) -> R) -> R {
    ENGINE.with_borrow_mut(f)
}

// ---------------------------------------------------------------------------
// Questions the command handlers and events ask.
// ---------------------------------------------------------------------------

/// One client waiting on a lock, as `LOCK.QUEUE` shows it.
pub struct Queued {
    pub client: u64,
    pub owner: Vec<u8>,
    pub mode: Mode,
    /// ms since it parked.
    pub waited_ms: u64,
    /// ms left before its `WAIT` deadline; `None` without one.
    pub timeout_ms: Option<u64>,
}

/// The clients waiting on `key` (in the selected database), first in line
/// first: one pass over its queue.
pub fn queue(ctx: &Context, key: &RedisString) -> Vec<Queued> {
    let Some(name) = orchestrate::waiting_on(&mut Server::new(ctx), key) else {
        return Vec::new();
    };
    let (now, now_us) = (now_ms(), latency::now_us());
    with(|e| {
        e.queue(&name)
            .map(|(client, waiter)| Queued {
                client,
                owner: waiter.owner.clone(),
                mode: waiter.mode,
                waited_ms: now_us.saturating_sub(waiter.handle.since_us) / 1000,
                timeout_ms: waiter.handle.deadline.map(|at| at.saturating_sub(now)),
            })
            .collect()
    })
}

/// The lock name of `key` in the context's selected database.
fn lock_name(ctx: &Context, key: &RedisString) -> LockName {
    LockName::new(selected_db(ctx.ctx), key.as_slice())
}

/// How many clients wait on `key` (in the selected database).
pub fn waiters(ctx: &Context, key: &RedisString) -> usize {
    orchestrate::waiting_on(&mut Server::new(ctx), key).map_or(0, |name| with(|e| e.waiters(&name)))
}

/// Whether any client waits at all (the fast path of every notification).
pub fn anyone_waiting() -> bool {
    with(|e| e.anyone_waiting())
}

/// Whether this command may block: not inside MULTI, Lua or a function.
pub fn can_block(ctx: &Context) -> bool {
    let deny = raw::REDISMODULE_CTX_FLAGS_DENY_BLOCKING
        | raw::REDISMODULE_CTX_FLAGS_MULTI
        | raw::REDISMODULE_CTX_FLAGS_LUA;
    context_flags(ctx.ctx) & deny as c_int == 0
}

/// Whether our own notifications are being handled inline right now.
pub fn serving_inline() -> bool {
    SERVING_INLINE.get()
}

/// Runs `body` (a command freeing a lock and serving it) with the pump for
/// its own notifications turned off.
fn inline<R>(body: impl FnOnce() -> R) -> R {
    /// Puts the flag back even if `body` panics (the panic is caught at the
    /// boundary; a flag left set would leave later frees unserved).
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            SERVING_INLINE.set(self.0);
        }
    }
    let _restore = Restore(SERVING_INLINE.replace(true));
    body()
}

// ---------------------------------------------------------------------------
// The host: the sequencing of `orchestrate`, carried out with the C API.
// ---------------------------------------------------------------------------

/// The server as [`orchestrate`] sees it, from one command or callback.
pub struct Server<'c> {
    ctx: &'c Context,
    /// The calling command asked `EPHEMERAL` (its waiter remembers it).
    ephemeral: bool,
    /// The calling command names several locks: a grant is a list.
    list: bool,
    /// Not a command: a server event, whose context's client is not the
    /// author of what the module writes (see [`Server::outside_command`]).
    outside: bool,
}

impl<'c> Server<'c> {
    pub fn new(ctx: &'c Context) -> Self {
        // Every lock decision starts here: a wall-clock step is corrected
        // for before it.
        ffi::lease_rebase::check(ctx.ctx);
        Self::unchecked(ctx)
    }

    /// From a keyspace notification or a flush, which must not write to the
    /// keyspace: the clock is looked at later (what frees a lock here only
    /// schedules its serving).
    fn unchecked(ctx: &'c Context) -> Self {
        Server {
            ctx,
            ephemeral: false,
            list: false,
            outside: false,
        }
    }

    /// For `LOCK.ACQUIRE … EPHEMERAL`: a client it parks is bound to the
    /// hold it is handed.
    pub fn ephemeral(mut self, ephemeral: bool) -> Self {
        self.ephemeral = ephemeral;
        self
    }

    /// For `LOCK.MACQUIRE`: a client it parks is answered a list of
    /// fences, even for one lock.
    pub fn list(mut self) -> Self {
        self.list = true;
        self
    }

    /// For work done from a server event that may fire inside another
    /// client's command (a closing connection): keys are opened as from a
    /// timer, so their effects are replicated as such and never as that
    /// command (which `RedisModule_ReplicateVerbatim` would send).
    pub fn outside_command(ctx: &'c Context) -> Self {
        Server {
            outside: true,
            ..Server::new(ctx)
        }
    }
}

impl<'c> Host for Server<'c> {
    type Handle = Parked;
    type Target = RedisString;
    type Key = LockKey<'c>;

    fn engine<R>(&mut self, f: impl FnOnce(&mut Engine<Parked>) -> R) -> R {
        with(f)
    }

    fn now(&self) -> u64 {
        now_ms()
    }

    fn lock_name(&self, target: &RedisString) -> LockName {
        lock_name(self.ctx, target)
    }

    fn open(&mut self, target: &RedisString) -> LockKey<'c> {
        // The key keeps its own reference to the command's key name.
        let name = RedisString::new(NonNull::new(self.ctx.ctx), target.inner);
        LockKey::open_owned(self.ctx, name, !self.outside)
    }

    fn open_name(&mut self, name: &LockName, in_command: bool) -> LockKey<'c> {
        let in_command = in_command && !self.outside;
        if !in_command {
            select_db(self.ctx.ctx, name.db);
        }
        let key_name = RedisString::create_from_slice(self.ctx.ctx, &name.key);
        LockKey::open_owned(self.ctx, key_name, in_command)
    }

    fn key_now(&self, key: &LockKey<'c>) -> u64 {
        key.now()
    }

    fn read(&mut self, key: &mut LockKey<'c>, how: Read<'_>) -> Result<Stored, LockError> {
        key.read(how)
    }

    fn expires_at(&self, key: &LockKey<'c>) -> Option<u64> {
        key.expires_at()
    }

    fn stored_lease(&self, key: &LockKey<'c>) -> Option<u64> {
        key.stored().ok().flatten().map(|stored| stored.lease())
    }

    fn write(&mut self, key: &mut LockKey<'c>, holds: Write<'_>, event: Event) {
        match holds {
            Write::One { owner, hold, lease } => write_one(key, owner, hold, lease, event),
            Write::Listed(holds) => self.write_listed(key, holds, event),
        }
    }

    fn remove(&mut self, key: &mut LockKey<'c>, how: Removal) {
        inline(|| match how {
            Removal::Expired => {
                key.delete();
                key.notify(raw::REDISMODULE_NOTIFY_EXPIRED, c"expired");
            }
            Removal::Released => {
                key.notify(raw::REDISMODULE_NOTIFY_MODULE, c"lock.release");
                key.delete();
                key.notify(raw::REDISMODULE_NOTIFY_GENERIC, c"del");
            }
            Removal::Deleted => {
                key.delete();
                key.notify(raw::REDISMODULE_NOTIFY_GENERIC, c"del");
            }
        });
    }

    fn restore_expiry(&mut self, key: &mut LockKey<'c>, at: u64) {
        key.restore_expiry(at);
    }

    fn issue_fence(&mut self, now: u64) -> u64 {
        fence::issue(now)
    }

    fn raise_fences(&mut self, fence: u64) {
        fence::observe(fence);
    }

    fn refenced(&mut self, target: &RedisString, owner: &[u8], from: u64, to: u64) {
        if ephemeral::any() {
            ephemeral::refenced(self.ctx, target, owner, from, to);
        }
    }

    fn is_writer(&self) -> bool {
        let flags = raw::REDISMODULE_CTX_FLAGS_SLAVE | raw::REDISMODULE_CTX_FLAGS_LOADING;
        context_flags(self.ctx.ctx) & flags as c_int == 0
    }

    fn writes_paused(&mut self) -> bool {
        writes_paused()
    }

    fn replicas_follow(&self) -> bool {
        partition::open()
    }

    fn quarantine_gate(&self) -> Gate {
        quarantine::gate()
    }

    fn quarantined(&self) -> bool {
        quarantine::ms_left() > 0
    }

    fn lease_cap(&self) -> Option<u64> {
        Some(config::max_ttl()).filter(|&max| max > 0)
    }

    fn arm_lease_check(&mut self, timer: Timer) {
        let Timer { name, at, delay_ms } = timer;
        let data = Box::into_raw(Box::new((name, at))).cast::<c_void>();
        let delay_ms = ffi::lease_clock::early_delay_ms(at).unwrap_or(delay_ms);
        create_timer(self.ctx.ctx, delay_ms, lease_cb, data);
    }

    fn arm_retry(&mut self, delay_ms: u64) {
        create_timer(self.ctx.ctx, delay_ms, retry_cb, ptr::null_mut());
    }

    fn arm_pump(&mut self, from_command: bool) {
        arm_pump(self.ctx.ctx, from_command);
    }

    fn can_block(&self) -> bool {
        can_block(self.ctx)
    }

    fn block(&mut self, _name: &LockName, timeout_ms: u64) -> Option<(u64, Parked)> {
        block(self.ctx, timeout_ms, self.ephemeral, self.list)
    }

    fn began(&mut self, id: u64, handle: &Parked, name: &LockName, owner: &[u8], fence: u64) {
        if handle.ephemeral {
            ephemeral::bind(self.ctx.ctx, id, name.clone(), owner, fence);
        }
    }

    fn reply_granted(&mut self, id: u64, handle: Parked, _: &LockName, fence: u64, _until: u64) {
        forget_deadline(id, handle.deadline);
        latency::wait_granted(handle.since_us);
        let outcome = if handle.list {
            Outcome::GrantedAll(vec![fence])
        } else {
            Outcome::Granted(fence)
        };
        answer_granted(self.ctx.ctx, id, handle.client, outcome);
    }

    fn reply_granted_all(&mut self, id: u64, handle: Parked, _: &[LockName], holds: &[Hold]) {
        forget_deadline(id, handle.deadline);
        latency::wait_granted(handle.since_us);
        let fences = holds.iter().map(|hold| hold.fence).collect();
        answer_granted(self.ctx.ctx, id, handle.client, Outcome::GrantedAll(fences));
    }

    fn reply_refused(&mut self, id: u64, handle: Parked, error: LockError) {
        forget_deadline(id, handle.deadline);
        handle.client.unblock(Some(Outcome::Refused(error)));
    }

    fn reply_nil(&mut self, id: u64, handle: Parked, why: Nil) {
        match why {
            Nil::Refused => {
                forget_deadline(id, handle.deadline);
                handle.client.unblock(Some(Outcome::TimedOut));
            }
            // Its deadline is the one that passed: already forgotten.
            Nil::TimedOut => handle.client.unblock(Some(Outcome::TimedOut)),
            Nil::Left => {
                forget_deadline(id, handle.deadline);
                // Redis needs the handle back to free it; nothing to write.
                handle.client.unblock(None);
            }
        }
    }

    fn moved_to(&mut self, name: &LockName) -> Option<String> {
        if ffi::cluster_mode() {
            moved_to(self.ctx, &name.key)
        } else {
            None
        }
    }

    fn redirect(&mut self, name: &LockName, error: &str) {
        redirect(name, error);
    }
}

/// The keyspace event a change is announced with, if any.
impl<'c> Server<'c> {
    /// [`Host::write`] of listed holds: put back, and when they changed,
    /// recorded for the hold-time histogram, sent as each changed owner's
    /// hold, announced; a lock left with none goes.
    fn write_listed(&mut self, key: &mut LockKey<'c>, mut holds: Holds, event: Event) {
        let changes = holds.take_changes();
        if !changes.is_empty() {
            latency::holds_changed(&changes);
        }
        let none_left = holds.is_empty();
        key.put_holds(holds, &changes);
        if changes.is_empty() {
            return;
        }
        if none_left {
            return self.remove(key, orchestrate::removal(event));
        }
        if let Some(name) = event_name(event) {
            key.notify(raw::REDISMODULE_NOTIFY_MODULE, name);
        }
    }
}

/// [`Host::write`] of one exclusive hold: stored (and replicated), its
/// begin and end recorded for the hold-time histogram, announced.
fn write_one(key: &mut LockKey<'_>, owner: &[u8], hold: Hold, lease: Lease, event: Event) {
    if event == Event::HandOver {
        key.notify(raw::REDISMODULE_NOTIFY_MODULE, c"lock.release");
    }
    // A fresh hold (granted, or handed over in place) begins, and
    // ends the one it replaces; a fence raised goes on; other changes
    // keep the fence.
    let tracked = matches!(event, Event::Acquire | Event::HandOver | Event::Fence)
        .then(|| Tracked::before(key));
    let raised = (event == Event::Fence)
        .then(|| {
            key.stored()
                .ok()
                .flatten()
                .map(|stored| (stored.fence(), hold.fence))
        })
        .flatten();
    key.apply(owner, hold, lease);
    if let Some(tracked) = tracked {
        tracked.after(key, raised);
    }
    if let Some(name) = event_name(event) {
        key.notify(raw::REDISMODULE_NOTIFY_MODULE, name);
    }
}

fn event_name(event: Event) -> Option<&'static std::ffi::CStr> {
    Some(match event {
        Event::Acquire | Event::HandOver => c"lock.acquire",
        Event::Reenter => c"lock.reenter",
        Event::Release => c"lock.release",
        Event::Renew => c"lock.renew",
        Event::Fence => c"lock.fence",
        Event::SharesEnded | Event::Revoked => return None,
    })
}

/// Blocks the calling client (no server-side timeout: its `WAIT` deadline,
/// if any, joins [`DEADLINES`]). Its id and handle, or `None` if it could
/// not be blocked.
fn block(ctx: &Context, timeout_ms: u64, ephemeral: bool, list: bool) -> Option<(u64, Parked)> {
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
        (
            client,
            raw::RedisModule_GetClientId.map_or(0, |f| f(ctx.ctx)),
        )
    };
    let client = NonNull::new(client)?;
    // SAFETY: a handle just returned by RedisModule_BlockClient.
    unsafe {
        if let Some(set) = raw::RedisModule_SetDisconnectCallback {
            set(client.as_ptr(), Some(disconnect_cb));
        }
    }
    let deadline = (timeout_ms > 0).then(|| {
        let now = now_ms();
        let at = now.saturating_add(timeout_ms);
        if let Some(delay) = DEADLINES.with_borrow_mut(|d| d.add(id, at, now)) {
            arm_deadline_timer(ctx.ctx, at, delay);
        }
        at
    });
    let parked = Parked {
        client: BlockedClient(client),
        deadline,
        since_us: latency::now_us(),
        ephemeral,
        list,
    };
    Some((id, parked))
}

// ---------------------------------------------------------------------------
// Reports that a lock may have freed, or that its TTL changed.
// ---------------------------------------------------------------------------

/// A keyspace notification says `name` may have freed: serve it once the
/// command that freed it is done.
pub fn freed_by_event(ctx: *mut raw::RedisModuleCtx, name: LockName) {
    orchestrate::freed(&mut Server::unchecked(&Context::new(ctx)), name, true);
}

/// A flush, swap-db or load touched database `db` (`None`: all): every lock
/// with waiters there may be free.
pub fn freed_db(ctx: *mut raw::RedisModuleCtx, db: Option<i32>, in_command: bool) {
    let context = Context::new(ctx);
    let mut host = Server::unchecked(&context);
    for name in with(|e| e.names_in(db)) {
        orchestrate::freed(&mut host, name, in_command);
    }
}

/// Another command changed the TTL of the lock `name`: put the lease back
/// once that command is done.
pub fn ttl_changed(ctx: *mut raw::RedisModuleCtx, name: LockName) {
    if with(|e| e.ttl_changed(name)) {
        arm_pump(ctx, true);
    }
}

/// Where a key this node does not have lives, per the slot's state in
/// `CLUSTER NODES`: an `ASK`/`MOVED` error, or `None` if the slot is served here.
fn moved_to(ctx: &Context, key: &[u8]) -> Option<String> {
    let nodes = match ctx.call("CLUSTER", &["NODES"]) {
        Ok(RedisValue::SimpleString(text)) => text,
        Ok(RedisValue::BulkString(text)) => text,
        Ok(RedisValue::StringBuffer(bytes)) => String::from_utf8_lossy(&bytes).into_owned(),
        Ok(RedisValue::BulkRedisString(text)) => text.to_string_lossy(),
        _ => return None,
    };
    cluster::redirection(&nodes, cluster::key_slot(key))
}

/// `name` left this node (a cluster slot migration): every client
/// waiting on it is answered `error` instead of being handed a lock this node
/// no longer has.
fn redirect(name: &LockName, error: &str) {
    let Ok(error) = CString::new(error) else {
        return;
    };
    for (waiter_id, waiter) in with(|e| e.drain(name)) {
        stats::WAITING.add(-1);
        forget_deadline(waiter_id, waiter.handle.deadline);
        waiter
            .handle
            .client
            .unblock(Some(Outcome::Redirect(error.clone())));
    }
}

/// Arms the pump: a post-notification job when asked and the server has
/// them (it then runs right after the command that caused the event), and
/// a 0 ms timer (it runs once the server is back in its event loop).
///
/// The timer backs the job up. A job runs when the server ends the unit of
/// work that notified, and not every notification comes from one: Redis 8.2
/// deletes a hash whose last field expired from its expiry cycle, notifying
/// `del` with no job run after it, so the job — and the waiter's hand-off —
/// would wait for whatever command came next. Whichever of the two runs
/// first pumps; the other finds nothing to do.
fn arm_pump(ctx: *mut raw::RedisModuleCtx, from_command: bool) {
    if from_command {
        // SAFETY: a live context inside a notification or event; the job
        // takes no data.
        unsafe {
            raw::RedisModule_AddPostNotificationJob
                .map(|f| f(ctx, Some(pump_job_cb), ptr::null_mut(), None));
        }
    }
    create_timer(ctx, 0, pump_timer_cb, ptr::null_mut());
}

// ---------------------------------------------------------------------------
// Callbacks: timers and jobs.
// ---------------------------------------------------------------------------

/// The pump, run as a post-notification job.
extern "C" fn pump_job_cb(ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    guard("pump job", (), || {
        orchestrate::pump(&mut Server::new(&Context::new(ctx)));
    });
}

/// The pump, run as a 0 ms timer.
extern "C" fn pump_timer_cb(ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    guard("pump", (), || {
        orchestrate::pump(&mut Server::new(&Context::new(ctx)));
    });
}

/// The retry of a closed gate: pump again (it defers again if still closed).
extern "C" fn retry_cb(ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    guard("pause retry", (), || {
        orchestrate::retry_fired(&mut Server::new(&Context::new(ctx)));
    });
}

/// A lease-end check fired: serve the lock now.
extern "C" fn lease_cb(ctx: *mut raw::RedisModuleCtx, data: *mut c_void) {
    guard("lease check", (), || {
        // SAFETY: `arm_lease_check` passed a boxed (LockName, u64).
        let at = unsafe { (*data.cast::<(LockName, u64)>()).1 };
        if now_ms() < at {
            // Armed to fire up to a millisecond early (the event loop's
            // wait rounds up to whole ms): look again on the next turn,
            // until the first millisecond Redis counts the key as ended.
            create_timer(ctx, 0, lease_cb, data);
            return;
        }
        // SAFETY: `arm_lease_check` passed a boxed (LockName, u64), used once.
        let (name, at) = *unsafe { Box::from_raw(data.cast::<(LockName, u64)>()) };
        orchestrate::lease_check_fired(&mut Server::new(&Context::new(ctx)), &name, at);
    });
}

/// The module timer of the earliest `WAIT` deadline fired (`data`: the
/// deadline it was armed for): every client whose deadline has passed is
/// answered nil, and the timer for the next deadline is armed.
extern "C" fn deadline_cb(ctx: *mut raw::RedisModuleCtx, data: *mut c_void) {
    guard("deadline", (), || {
        let fired = data as usize as u64;
        let now = now_ms();
        let (due, next) = DEADLINES.with_borrow_mut(|d| d.fired(fired, now));
        if let Some(delay) = next {
            arm_deadline_timer(ctx, now.saturating_add(delay), delay);
        }
        let context = Context::new(ctx);
        let mut host = Server::new(&context);
        for id in due {
            orchestrate::deadline_passed(&mut host, id);
        }
    });
}

/// Arms the module timer of the deadline `at`, `delay_ms` from now.
fn arm_deadline_timer(ctx: *mut raw::RedisModuleCtx, at: u64, delay_ms: u64) {
    // A unix ms fits a pointer on the 64-bit platforms Redis modules run on.
    create_timer(ctx, delay_ms, deadline_cb, at as usize as *mut c_void);
}

/// Client `id` stopped waiting before its deadline (if it had one).
fn forget_deadline(id: u64, deadline: Option<u64>) {
    if let Some(at) = deadline {
        DEADLINES.with_borrow_mut(|d| d.remove(id, at));
    }
}

// ---------------------------------------------------------------------------
// Callbacks: blocked clients.
// ---------------------------------------------------------------------------

/// Unblocks a granted client with its fence: at once where the server
/// ignores a `CLIENT UNBLOCK` of it until its reply is written, else at the
/// server's before-sleep event (see the module docs).
fn answer_granted(ctx: *mut raw::RedisModuleCtx, id: u64, client: BlockedClient, granted: Outcome) {
    if !unblock_races_the_reply() {
        return client.unblock(Some(granted));
    }
    DEFERRED.with_borrow_mut(|deferred| deferred.push((id, client, granted)));
    if !BEFORE_SLEEP_HOOKED.replace(true) && !hook_before_sleep(ctx, Some(before_sleep_cb)) {
        // No hook: answer now rather than never.
        BEFORE_SLEEP_HOOKED.set(false);
        logging::log_warning("lock: cannot hook the before-sleep event");
        for (_, client, granted) in DEFERRED.take() {
            client.unblock(Some(granted));
        }
    }
}

/// Subscribes `callback` to the event loop's events, or unsubscribes
/// (`None`). Never from inside that callback: the server would free the
/// listener it is still using.
fn hook_before_sleep(
    ctx: *mut raw::RedisModuleCtx,
    callback: raw::RedisModuleEventCallback,
) -> bool {
    ffi::subscribe_to_server_event(ctx, raw::REDISMODULE_EVENT_EVENTLOOP, callback)
}

/// How long the before-sleep hook stays after it answered deferred grants,
/// in ms. Hooking and unhooking, and the timer that unhooks, cost a hand-off
/// more (about 5,000 instructions) than the hook costs each turn of the
/// event loop (two module contexts, about 1,000); while locks change hands
/// more often than this, the hook stays and is paid only per turn, and a
/// server whose hand-offs stop is rid of it this soon after.
const UNHOOK_AFTER_MS: u64 = 100;

/// Some time after the deferred grants were answered: unsubscribes the
/// before-sleep hook, unless grants were deferred again meanwhile.
extern "C" fn unhook_cb(ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    guard("before-sleep unhook", (), || {
        UNHOOK_ARMED.set(false);
        if DEFERRED.with_borrow(Vec::is_empty) && hook_before_sleep(ctx, None) {
            BEFORE_SLEEP_HOOKED.set(false);
        }
    });
}

/// Whether a `CLIENT UNBLOCK` run between our unblocking a client and the
/// server writing its reply loses that reply: Redis before 7.2.
fn unblock_races_the_reply() -> bool {
    static RACES: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *RACES.get_or_init(|| server_version() < 0x00_07_02_00)
}

/// Takes client `id` out of [`DEFERRED`], if it is there.
fn take_deferred(id: u64) -> Option<(BlockedClient, Outcome)> {
    DEFERRED.with_borrow_mut(|deferred| {
        let at = deferred.iter().position(|(waiting, ..)| *waiting == id)?;
        let (_, client, granted) = deferred.remove(at);
        Some((client, granted))
    })
}

/// The server is about to write the replies of clients modules unblocked
/// (and sleep): unblocks the granted clients kept blocked until now.
extern "C" fn before_sleep_cb(
    ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut c_void,
) {
    if subevent != raw::REDISMODULE_SUBEVENT_EVENTLOOP_BEFORE_SLEEP {
        return;
    }
    guard("deferred grants", (), || {
        if DEFERRED.with_borrow(Vec::is_empty) {
            return;
        }
        let mut grants = DEFERRED.take();
        for (_, client, granted) in grants.drain(..) {
            client.unblock(Some(granted));
        }
        // Its allocation serves the next grants.
        DEFERRED.with_borrow_mut(|deferred| {
            if deferred.is_empty() {
                *deferred = grants;
            }
        });
        if !UNHOOK_ARMED.replace(true) {
            create_timer(ctx, UNHOOK_AFTER_MS, unhook_cb, ptr::null_mut());
        }
    });
}

/// `CLIENT UNBLOCK id` (nil reply). Redis calls it only for a client we have
/// not unblocked yet: a waiter, or one granted and kept blocked until the
/// before-sleep event, which holds the lock and so is answered its fence.
extern "C" fn timeout_cb(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    guard("unblock", (), || {
        // SAFETY: Redis calls this with the blocked client's context.
        let id = unsafe { raw::RedisModule_GetClientId.map_or(0, |f| f(ctx)) };
        if let Some((client, granted)) = take_deferred(id) {
            reply(ctx, Some(&granted));
            with(|e| e.replied(id));
            return client.unblock(None);
        }
        let waiter = orchestrate::unblocked(&mut Server::outside_command(&Context::new(ctx)), id);
        reply(ctx, Some(&Outcome::TimedOut));
        if let Some(waiter) = waiter {
            forget_deadline(id, waiter.handle.deadline);
            // The reply is written; Redis needs the handle back to free it.
            waiter.handle.client.unblock(None);
        }
    });
    raw::Status::Ok as c_int
}

/// The client disconnected, or `CLIENT UNBLOCK … ERROR` (Redis replies the
/// error itself). Redis calls this even after we unblocked the client, until
/// its reply is written: then there is nothing to unblock, but a grant it
/// will never hear of is taken back.
extern "C" fn disconnect_cb(
    ctx: *mut raw::RedisModuleCtx,
    _client: *mut raw::RedisModuleBlockedClient,
) {
    guard("disconnect", (), || {
        // SAFETY: Redis calls this with a context naming the leaving client.
        let id = unsafe { raw::RedisModule_GetClientId.map_or(0, |f| f(ctx)) };
        // Granted and kept blocked, not told yet: Redis needs the handle
        // back; the engine takes the grant back below.
        if let Some((client, _)) = take_deferred(id) {
            client.unblock(None);
        }
        // The context is the leaving client's own: taking a grant back may
        // select the lock's database on it, which it must not keep.
        let db = selected_db(ctx);
        orchestrate::client_left(&mut Server::new(&Context::new(ctx)), id);
        select_db(ctx, db);
    });
}

/// Writes the reply of a client we unblocked: its fence, nil, or an error.
extern "C" fn reply_cb(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    guard("reply", (), || {
        // SAFETY: Redis calls this with the unblocked client's context and
        // the private data we passed to RedisModule_UnblockClient.
        let outcome = unsafe {
            let id = raw::RedisModule_GetClientId.map_or(0, |f| f(ctx));
            with(|e| e.replied(id));
            raw::RedisModule_GetBlockedClientPrivateData
                .map_or(ptr::null_mut(), |f| f(ctx))
                .cast::<Outcome>()
                .as_ref()
        };
        reply(ctx, outcome);
    });
    raw::Status::Ok as c_int
}

/// Writes `outcome` as the reply of the client of `ctx`: its fence, an
/// error, or nil (`None` too).
fn reply(ctx: *mut raw::RedisModuleCtx, outcome: Option<&Outcome>) {
    // SAFETY: a context whose client is being answered; the error text is a
    // C string that outlives the call.
    unsafe {
        match outcome {
            Some(Outcome::Granted(fence)) => {
                let fence = i64::try_from(*fence).unwrap_or(i64::MAX);
                raw::RedisModule_ReplyWithLongLong.map(|f| f(ctx, fence));
            }
            Some(Outcome::GrantedAll(fences)) => {
                let len = std::os::raw::c_long::try_from(fences.len()).unwrap_or(0);
                raw::RedisModule_ReplyWithArray.map(|f| f(ctx, len));
                for fence in fences {
                    let fence = i64::try_from(*fence).unwrap_or(i64::MAX);
                    raw::RedisModule_ReplyWithLongLong.map(|f| f(ctx, fence));
                }
            }
            Some(Outcome::Redirect(error)) => {
                raw::RedisModule_ReplyWithError.map(|f| f(ctx, error.as_ptr()));
            }
            Some(Outcome::Refused(error)) => {
                let text = CString::new(error.message()).unwrap_or_default();
                raw::RedisModule_ReplyWithError.map(|f| f(ctx, text.as_ptr()));
            }
            Some(Outcome::TimedOut) | None => {
                raw::RedisModule_ReplyWithNull.map(|f| f(ctx));
            }
        }
    }
}

/// Frees the private data given to `RedisModule_UnblockClient`.
extern "C" fn free_privdata(_ctx: *mut raw::RedisModuleCtx, data: *mut c_void) {
    guard("free privdata", (), || {
        if !data.is_null() {
            // SAFETY: only `unblock_raw` passes private data: a boxed Outcome.
            drop(unsafe { Box::from_raw(data.cast::<Outcome>()) });
        }
    });
}

fn unblock_raw(client: NonNull<raw::RedisModuleBlockedClient>, outcome: Option<Outcome>) {
    let data = outcome.map_or(ptr::null_mut(), |o| {
        Box::into_raw(Box::new(o)).cast::<c_void>()
    });
    // SAFETY: `client` is a handle from RedisModule_BlockClient not yet
    // unblocked: each BlockedClient is consumed by its one unblock.
    unsafe {
        raw::RedisModule_UnblockClient.map(|f| f(client.as_ptr(), data));
    }
}
