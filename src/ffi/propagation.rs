//! Whether a replicated effect would reach anyone right now.
//!
//! `RedisModule_Replicate` builds the effect's argument objects (and looks
//! the command up) before Redis decides that nothing — no AOF, no replica,
//! no replication backlog — will receive it. Measured with callgrind, that
//! was over half the cost of a `LOCK.ACQUIRE` on a server without replicas.
//! So the module tracks the same condition Redis checks (AOF on, or a master
//! with a backlog or replicas) and, when nothing listens, only marks the
//! change (`RedisModule_ReplicateVerbatim`, which then propagates nothing but
//! counts the write for `save` points and `INFO`).
//!
//! The condition can only become true through a fork (a replica's full sync
//! and turning the AOF on both fork, and the first replica's sync creates the
//! backlog before its fork), a role change, or a replica coming and going:
//! each is a server event that refreshes it (heard by `ffi::events`). It is
//! also read at load.
//!
//! A fork is also when the AOF may be rewritten. A rewrite keeps only keys;
//! without the RDB preamble (whose aux field carries it) the fence counter
//! would be lost with the commands that raised it. So when a fork is born on
//! a master with the AOF on and the counter ahead of the clock (`LOCK.FENCE`
//! raised it), the master writes `LOCK.LASTFENCE counter` once, from a 0 ms
//! timer: it lands in the AOF file opened for the rewrite, which the rewrite
//! keeps, and reaches replicas. While writes are paused the timer waits.

use std::os::raw::{c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};

use redis_module::{raw, Context};

use crate::ffi::{context_flags, create_timer, guard, now_ms, partition, writes_paused};
use redislock_core::fence;
use redislock_core::handoff::PAUSE_RETRY_MS;

/// Whether effects must be built and sent. Starts true: safe until known.
static NEEDED: AtomicBool = AtomicBool::new(true);

/// Whether a [`record_counter`] timer is armed.
static RECORD_ARMED: AtomicBool = AtomicBool::new(false);

/// Whether an effect would reach the AOF or a replica.
pub fn needed() -> bool {
    NEEDED.load(Ordering::Relaxed)
}

/// Reads the condition now, and the replicas gate's settings (module
/// load). The replication events that change it are heard by
/// `ffi::events`, which calls [`refresh`] and [`forked`].
pub fn watch(ctx: &Context) -> Result<(), &'static str> {
    refresh(ctx.ctx);
    partition::watch(ctx)
}

/// A fork was born: the fence counter's record is written from a 0 ms
/// timer, unless one is armed already.
pub(crate) fn forked(ctx: *mut raw::RedisModuleCtx) {
    if !RECORD_ARMED.swap(true, Ordering::Relaxed) {
        arm_record(ctx, 0);
    }
}

fn arm_record(ctx: *mut raw::RedisModuleCtx, delay_ms: u64) {
    if create_timer(ctx, delay_ms, record_counter, ptr::null_mut()) == 0 {
        RECORD_ARMED.store(false, Ordering::Relaxed);
    }
}

/// After a fork: writes `LOCK.LASTFENCE counter` to the AOF and replicas if
/// this is a master with the AOF on and the counter ahead of the clock;
/// waits while writes are paused.
extern "C" fn record_counter(ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    guard("fence counter record", (), || {
        if writes_paused() {
            return arm_record(ctx, PAUSE_RETRY_MS);
        }
        RECORD_ARMED.store(false, Ordering::Relaxed);
        let (aof, master) = aof_and_master(ctx);
        let last = fence::last();
        if !(aof && master && fence::outruns_clock(last, now_ms())) {
            return;
        }
        let last = i64::try_from(last).unwrap_or(i64::MAX);
        // SAFETY: "l" takes one long long; a timer's context may replicate.
        unsafe {
            raw::RedisModule_Replicate
                .map(|f| f(ctx, c"LOCK.LASTFENCE".as_ptr(), c"l".as_ptr(), last));
        }
    });
}

/// Whether the AOF is on, and whether this node is a master.
fn aof_and_master(ctx: *mut raw::RedisModuleCtx) -> (bool, bool) {
    let flags = context_flags(ctx);
    (
        flags & raw::REDISMODULE_CTX_FLAGS_AOF as c_int != 0,
        flags & raw::REDISMODULE_CTX_FLAGS_MASTER as c_int != 0,
    )
}

/// Recomputes [`needed`]: AOF on, or a master with a backlog or replicas.
pub(crate) fn refresh(ctx: *mut raw::RedisModuleCtx) {
    // SAFETY: a live context; the server info object is freed before return
    // and its fields are read as plain integers.
    let (aof, master) = aof_and_master(ctx);
    let needed = unsafe {
        let (Some(get), Some(field), Some(free)) = (
            raw::RedisModule_GetServerInfo,
            raw::RedisModule_ServerInfoGetFieldSigned,
            raw::RedisModule_FreeServerInfo,
        ) else {
            return NEEDED.store(true, Ordering::Relaxed);
        };
        let info = get(ctx, c"replication".as_ptr());
        if info.is_null() {
            return NEEDED.store(true, Ordering::Relaxed);
        }
        let mut err = 0;
        let backlog = field(info, c"repl_backlog_active".as_ptr(), &mut err);
        let backlog_unknown = err != 0;
        let replicas = field(info, c"connected_slaves".as_ptr(), &mut err);
        let replicas_unknown = err != 0;
        free(ctx, info);
        aof || (master && (backlog != 0 || replicas != 0 || backlog_unknown || replicas_unknown))
    };
    NEEDED.store(needed, Ordering::Relaxed);
}
