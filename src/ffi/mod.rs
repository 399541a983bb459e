//! Everything that touches Redis's C API through raw pointers.
//!
//! The rest of the crate is safe Rust. Each `extern "C"` callback here hands
//! over at once to a safe function, inside [`guard`], so a bug becomes a log
//! line and an error reply instead of a panic unwinding into C (which would
//! abort the server).

pub mod commandinfo;
pub mod config;
pub mod datatype;
pub mod ephemeral;
pub mod ephemeral_ends;
pub mod events;
pub mod expired_held;
pub mod host;
pub mod info;
pub mod key;
pub mod latency;
pub mod lease_clock;
pub mod lease_rebase;
pub mod lock_names;
pub mod partition;
pub mod propagation;
pub mod quarantine;
pub mod upgrade;

use std::panic::{catch_unwind, AssertUnwindSafe};

use std::os::raw::{c_int, c_void};
use std::ptr::NonNull;

use std::cell::Cell;

use redis_module::{logging, raw, Context, RedisString};

use redislock_core::error::LockError;

/// Now on the lease clock: the server's wall-clock unix milliseconds
/// (`mstime()`), less the wall clock's steps.
pub use lease_clock::now_ms;

/// The server's version as `0x00MMmmpp` (7.0.15 is `0x0007000f`); Valkey
/// reports the Redis version it is compatible with. 0 if unknown.
pub fn server_version() -> u32 {
    // SAFETY: takes no arguments; set once the module is initialised.
    let version = unsafe { raw::RedisModule_GetServerVersion.map_or(0, |f| f()) };
    u32::try_from(version).unwrap_or(0)
}

/// Whether the server pauses writes (`CLIENT PAUSE`, `FAILOVER`, `SHUTDOWN`
/// waiting for replicas): then the module must neither write nor propagate.
pub fn writes_paused() -> bool {
    // SAFETY: takes no arguments; set once the module is initialised.
    unsafe { raw::RedisModule_AvoidReplicaTraffic.map_or(0, |f| f()) != 0 }
}

/// The context's `REDISMODULE_CTX_FLAGS_*` bits.
pub(crate) fn context_flags(ctx: *mut raw::RedisModuleCtx) -> c_int {
    // SAFETY: a live context.
    unsafe { raw::RedisModule_GetContextFlags.map_or(0, |f| f(ctx)) }
}

/// Arms a module timer: `callback` gets `data` back once, in `delay_ms`
/// (at most [`redislock_core::handoff::MAX_DELAY_MS`]). 0: it could not be armed.
pub(crate) fn create_timer(
    ctx: *mut raw::RedisModuleCtx,
    delay_ms: u64,
    callback: extern "C" fn(*mut raw::RedisModuleCtx, *mut c_void),
    data: *mut c_void,
) -> raw::RedisModuleTimerID {
    // Filed with the lease clock, which re-arms it after a step: module
    // timers are filed by wall time.
    lease_clock::arm(ctx, delay_ms, now_ms(), callback, data)
}

/// Subscribes `callback` to the server event `id`, or unsubscribes (`None`).
/// `false` if the server refused. (Never unsubscribe from inside that
/// callback: the server would free the listener it is still using.)
pub(crate) fn subscribe_to_server_event(
    ctx: *mut raw::RedisModuleCtx,
    id: u64,
    callback: raw::RedisModuleEventCallback,
) -> bool {
    let event = raw::RedisModuleEvent { id, dataver: 1 };
    // SAFETY: a live context of this module; the callback is a plain
    // function that lives as long as the module.
    let status = unsafe {
        raw::RedisModule_SubscribeToServerEvent
            .map_or(raw::Status::Err as c_int, |f| f(ctx, event, callback))
    };
    status == raw::Status::Ok as c_int
}

/// Subscriptions to make once a lock may exist, given a context to make
/// them with.
type FirstLockHook = fn(*mut raw::RedisModuleCtx);

thread_local! {
    /// What waits for the first lock (see [`at_first_lock`]): a detached
    /// context of this module and the hook to call with it. Set at load,
    /// on the main thread only, so a value born on another thread (a
    /// server that loads off the main thread) cannot run it from there;
    /// taken when run.
    static FIRST_LOCK: Cell<Option<(*mut raw::RedisModuleCtx, FirstLockHook)>> =
        const { Cell::new(None) };
}

/// Defers `hook` (subscriptions) until a lock may exist: see
/// [`lock_may_exist`]. Until then no key is a lock and no client waits, so
/// there is nothing to hear; and every keyspace class and server event a
/// module subscribes to costs the server's other commands (a module context
/// per notification; on Redis 7.0, a walk of every listener twice per turn
/// of the event loop), locks or not.
pub(crate) fn at_first_lock(
    ctx: *mut raw::RedisModuleCtx,
    hook: FirstLockHook,
) -> Result<(), &'static str> {
    // SAFETY: called at module load with its live context; the detached
    // context lives as long as the module.
    let detached = unsafe {
        raw::RedisModule_GetDetachedThreadSafeContext.map_or(std::ptr::null_mut(), |f| f(ctx))
    };
    if detached.is_null() {
        return Err("cannot make a context to subscribe to events with");
    }
    FIRST_LOCK.set(Some((detached, hook)));
    Ok(())
}

/// Runs the [`at_first_lock`] hook if it has not run: called wherever a
/// lock may begin to exist (a value is born, a module command runs,
/// loading ends with locks), before any notification about it. Costs one
/// thread-local read once run.
pub(crate) fn lock_may_exist() {
    if FIRST_LOCK_DONE.load(std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    if let Some((ctx, hook)) = FIRST_LOCK.take() {
        FIRST_LOCK_DONE.store(true, std::sync::atomic::Ordering::Relaxed);
        hook(ctx);
    }
}

/// The [`at_first_lock`] hook has run: a check without a thread-local read.
static FIRST_LOCK_DONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Runs `body`; if it panics, logs and returns `fallback` instead.
pub fn guard<T>(what: &str, fallback: T, body: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(value) => value,
        Err(_) => {
            logging::log_warning(format!("lock: recovered from a panic in {what}"));
            fallback
        }
    }
}

/// Sends panics to the Redis log (with location) as well as stderr, so a
/// recovered panic is never silent.
pub fn install_panic_hook() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        logging::log_warning(format!("lock: panic: {info}"));
        default(info);
    }));
}

/// A command's arguments as Redis passed them, read in place: no copy and
/// no reference counting per argument (the `redis-module` crate's wrapper
/// retained and released every one, a measurable share of a `LOCK.ACQUIRE`).
pub struct Args<'a> {
    ctx: *mut raw::RedisModuleCtx,
    strings: &'a [*mut raw::RedisModuleString],
    bytes: Vec<&'a [u8]>,
}

impl<'a> Args<'a> {
    /// # Safety
    /// `argv` must hold `argc` live strings that outlive `'a` (true for the
    /// duration of a command callback).
    pub unsafe fn from_raw(
        ctx: *mut raw::RedisModuleCtx,
        argv: *mut *mut raw::RedisModuleString,
        argc: c_int,
    ) -> Args<'a> {
        let strings: &[*mut raw::RedisModuleString] = match usize::try_from(argc) {
            // SAFETY: the caller's contract.
            Ok(len) if !argv.is_null() => unsafe { std::slice::from_raw_parts(argv, len) },
            _ => &[],
        };
        let bytes = strings
            .iter()
            .map(|&s| RedisString::string_as_slice(s))
            .collect();
        Args {
            ctx,
            strings,
            bytes,
        }
    }

    /// Every argument's bytes, the command name first.
    pub fn bytes(&self) -> &[&'a [u8]] {
        &self.bytes
    }

    /// The key (argument 1) as a string Redis can use.
    pub fn key(&self) -> Result<RedisString, LockError> {
        self.key_at(1)
    }

    /// `count` keys from argument `first` on (a command for several
    /// locks), as strings Redis can use.
    pub fn keys(&self, first: usize, count: usize) -> Result<Vec<RedisString>, LockError> {
        (first..first + count).map(|at| self.key_at(at)).collect()
    }

    fn key_at(&self, at: usize) -> Result<RedisString, LockError> {
        let key = *self.strings.get(at).ok_or(LockError::WrongArity)?;
        Ok(RedisString::new(NonNull::new(self.ctx), key))
    }
}

/// Whether the server runs in cluster mode.
pub fn cluster_mode() -> bool {
    CLUSTER_MODE.get()
}

/// Notes whether the server runs in cluster mode (at module load).
pub fn note_cluster_mode(ctx: &Context) {
    let flags = context_flags(ctx.ctx);
    CLUSTER_MODE.set(flags & raw::REDISMODULE_CTX_FLAGS_CLUSTER as c_int != 0);
}

thread_local! {
    /// Whether the server runs in cluster mode: only there can a lock's key
    /// live on another node (see `orchestrate::serve`).
    static CLUSTER_MODE: Cell<bool> = const { Cell::new(false) };
}

/// The database `ctx` works in.
pub(crate) fn selected_db(ctx: *mut raw::RedisModuleCtx) -> i32 {
    // SAFETY: a live context.
    unsafe { raw::RedisModule_GetSelectedDb.map_or(0, |f| f(ctx)) }
}

/// Makes `ctx` work in database `db`.
pub(crate) fn select_db(ctx: *mut raw::RedisModuleCtx, db: i32) {
    // SAFETY: a live context; an index that no longer exists fails harmlessly.
    unsafe {
        raw::RedisModule_SelectDb.map(|f| f(ctx, db));
    }
}
