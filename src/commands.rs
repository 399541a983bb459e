//! The command handlers: parse → apply → reply, one thin function each.
//!
//! Parsing is [`crate::args`], deciding is [`crate::lock`]; a handler opens
//! the key, asks the core, stores the answer (which also replicates it) and
//! replies. Errors travel as [`LockError`] and become replies in [`run`].

use redis_module::{raw, Context, ContextFlags, NotifyEvent, RedisResult, RedisString, RedisValue};

use crate::args;
use crate::error::LockError;
use crate::ffi::datatype::StoredLock;
use crate::ffi::key::LockKey;
use crate::ffi::{guard, now_ms, waiting};
use crate::lock::{self, Acquire};
use crate::{fence, stats};

/// `LOCK.ACQUIRE key owner ttl-ms [WAIT timeout-ms]` → fence, or nil if busy.
/// With `WAIT` a busy lock parks the client until it is handed the lock
/// (fence) or the timeout passes (nil); never inside MULTI or scripts.
pub fn acquire(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    run(ctx, "LOCK.ACQUIRE", &args, |argv| {
        let req = args::parse_acquire(argv)?;
        let mut key = LockKey::open(ctx, &args[1], true);
        let current = key.read()?;
        let now = now_ms();
        let name = waiting::lock_name(ctx, &args[1]);
        let holder = current.as_ref().filter(|held| held.is_live(now));
        // No barging: a free lock with clients waiting is theirs. (Their
        // hand-off is normally already scheduled; scheduling again is cheap.)
        let queued = holder.is_none() && waiting::has_waiters(&name);
        let decision = if queued {
            waiting::schedule(ctx.ctx, name.clone());
            Acquire::Busy
        } else {
            lock::acquire(current.as_ref(), req.owner, req.ttl_ms, now, || {
                fence::issue(now)
            })?
        };
        match decision {
            Acquire::Fresh(held) => {
                key.store_held(&held);
                stats::ACQUIRED.incr();
                notify(ctx, "lock.acquire", &args[1]);
                Ok(fence_reply(held.fence))
            }
            Acquire::Reentered(held) => {
                key.store_held(&held);
                stats::REENTERED.incr();
                notify(ctx, "lock.reenter", &args[1]);
                waiting::lease_changed(ctx, &name, held.expires_at);
                Ok(fence_reply(held.fence))
            }
            Acquire::Busy => match req.wait_ms {
                Some(timeout) if waiting::can_block(ctx) => {
                    let holder_expiry = current.map(|held| held.expires_at);
                    drop(key);
                    waiting::block(ctx, name, req.owner, req.ttl_ms, timeout, holder_expiry);
                    Ok(RedisValue::NoReply)
                }
                _ => Ok(RedisValue::Null),
            },
        }
    })
}

/// `LOCK.REENTER key owner [ttl-ms]` → the new count.
pub fn reenter(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    run(ctx, "LOCK.REENTER", &args, |argv| {
        let req = args::parse_reenter(argv)?;
        let mut key = LockKey::open(ctx, &args[1], true);
        let held = lock::reenter(key.read()?.as_ref(), req.owner, req.ttl_ms, now_ms())?;
        key.store_held(&held);
        stats::REENTERED.incr();
        notify(ctx, "lock.reenter", &args[1]);
        waiting::lease_changed(ctx, &waiting::lock_name(ctx, &args[1]), held.expires_at);
        Ok(count_reply(held.count))
    })
}

/// `LOCK.RELEASE key owner [ALL]` → the remaining count (0: now free).
pub fn release(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    run(ctx, "LOCK.RELEASE", &args, |argv| {
        let req = args::parse_release(argv)?;
        let mut key = LockKey::open(ctx, &args[1], true);
        let remaining = lock::release(key.read()?.as_ref(), req.owner, req.all, now_ms())?;
        stats::RELEASED.incr();
        notify(ctx, "lock.release", &args[1]);
        match remaining {
            Some(held) => {
                key.store_held(&held);
                Ok(count_reply(held.count))
            }
            None => {
                key.delete();
                drop(key);
                ctx.notify_keyspace_event(NotifyEvent::GENERIC, "del", &args[1]);
                waiting::schedule(ctx.ctx, waiting::lock_name(ctx, &args[1]));
                Ok(RedisValue::Integer(0))
            }
        }
    })
}

/// `LOCK.RENEW key owner ttl-ms` → 1.
pub fn renew(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    run(ctx, "LOCK.RENEW", &args, |argv| {
        let req = args::parse_renew(argv)?;
        let mut key = LockKey::open(ctx, &args[1], true);
        let held = lock::renew(key.read()?.as_ref(), req.owner, req.ttl_ms, now_ms())?;
        key.store_held(&held);
        stats::RENEWED.incr();
        notify(ctx, "lock.renew", &args[1]);
        waiting::lease_changed(ctx, &waiting::lock_name(ctx, &args[1]), held.expires_at);
        Ok(RedisValue::Integer(1))
    })
}

/// `LOCK.INFO key` → nil if free; else owner, count, fence, ttl, waiters
/// (a map under RESP3, a flat array under RESP2; fields in this order).
pub fn info(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    run(ctx, "LOCK.INFO", &args, |argv| {
        args::parse_info(argv)?;
        let key = LockKey::open(ctx, &args[1], false);
        let Some(lock) = key.stored()? else {
            return Ok(RedisValue::Null);
        };
        let fields = [
            ("owner", RedisValue::StringBuffer(lock.owner.to_vec())),
            ("count", count_reply(lock.count)),
            ("fence", fence_reply(lock.fence)),
            ("ttl", RedisValue::Integer(key.ttl_ms())),
            (
                "waiters",
                count_reply(waiting::waiters(&waiting::lock_name(ctx, &args[1])) as u64),
            ),
        ];
        // The crate's map replies do not keep field order, so reply by hand;
        // Redis turns a map into a flat array for RESP2 clients.
        raw::reply_with_map(ctx.ctx, fields.len() as _);
        for (name, value) in fields {
            ctx.reply(Ok(RedisValue::SimpleStringStatic(name)));
            ctx.reply(Ok(value));
        }
        Ok(RedisValue::NoReply)
    })
}

/// `LOCK.APPLY key owner count fence [PXAT unix-ms]` → OK. Internal: how a
/// master's decision reaches replicas and the AOF. Refused from clients, so
/// nobody can forge a lock or a fence with it.
pub fn apply(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    run(ctx, "LOCK.APPLY", &args, |argv| {
        let flags = ctx.get_flags();
        if !flags.intersects(ContextFlags::REPLICATED | ContextFlags::LOADING) {
            return Err(LockError::InternalCommand);
        }
        let req = args::parse_apply(argv)?;
        let mut key = LockKey::open(ctx, &args[1], true);
        key.store(
            StoredLock {
                owner: req.owner.into(),
                count: req.count,
                fence: req.fence,
            },
            req.expires_at,
        );
        fence::observe(req.fence);
        // Module commands are not propagated on their own: a replica writes
        // what it applied to its own AOF this way.
        ctx.replicate_verbatim();
        Ok(RedisValue::SimpleStringStatic("OK"))
    })
}

/// Runs one command body with the boundary rules: argument bytes in, errors
/// mapped to replies (and `NOTOWNER` counted), panics caught and logged.
fn run(
    ctx: &Context,
    name: &str,
    args: &[RedisString],
    body: impl FnOnce(&[&[u8]]) -> Result<RedisValue, LockError>,
) -> RedisResult {
    let argv: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
    let result = guard(name, Err(LockError::Internal), || body(&argv));
    let _ = ctx;
    result.map_err(|err| {
        if err == LockError::NotOwner {
            stats::NOTOWNER.incr();
        }
        err.into_redis()
    })
}

/// A keyspace notification of the module class, for users who listen.
fn notify(ctx: &Context, event: &str, key: &RedisString) {
    ctx.notify_keyspace_event(NotifyEvent::MODULE, event, key);
}

fn fence_reply(fence: u64) -> RedisValue {
    RedisValue::Integer(i64::try_from(fence).unwrap_or(i64::MAX))
}

fn count_reply(count: u64) -> RedisValue {
    RedisValue::Integer(i64::try_from(count).unwrap_or(i64::MAX))
}
