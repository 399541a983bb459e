//! The command handlers: parse → apply → reply, one thin function each.
//!
//! Parsing is [`redislock_core::args`]; deciding and its sequencing — open the key,
//! ask [`redislock_core::lock`], store the answer (which also replicates it), serve
//! or park waiters — is [`redislock_core::orchestrate`], run against the server
//! ([`Server`]); a handler parses, calls it and replies. Errors travel as [`LockError`] and become replies in [`run`].

use std::os::raw::c_long;

use redis_module::{raw, Context, ContextFlags, RedisError, RedisResult, RedisString, RedisValue};

use crate::ffi::host::{self, Server};
use crate::ffi::key::{Access, LockKey};
use crate::ffi::{config, ephemeral, guard, lease_clock, now_ms, partition, Args};
use redislock_core::args;
use redislock_core::error::LockError;
use redislock_core::holds::{Holder, Holds, Mode};
use redislock_core::orchestrate::{self, Acquired, AcquiredAll};
use redislock_core::{fence, stats};

/// `LOCK.ACQUIRE key owner ttl-ms [SHARED [LIMIT n]] [EPHEMERAL] [WAIT timeout-ms]` → fence, or nil if busy.
/// With `WAIT` a busy lock parks the client until it is handed the lock
/// (fence) or the timeout passes (nil); never inside MULTI or scripts.
pub fn acquire(ctx: &Context, input: &Args) -> RedisResult {
    run("LOCK.ACQUIRE", input, |argv| {
        let req = args::parse_acquire(argv, config::max_ttl())?;
        if req.ephemeral {
            ephemeral::refuse_in_script(ctx)?;
        }
        replicas_follow(ctx)?;
        let key_name = input.key()?;
        let mut host = Server::new(ctx).ephemeral(req.ephemeral);
        let acquired = orchestrate::acquire_permits(
            &mut host,
            &key_name,
            req.owner,
            (req.mode, req.permits),
            req.ttl_ms,
            req.wait_ms,
        )?;
        Ok(match acquired {
            Acquired::Held(hold) => {
                // A reentry (count above 1) binds nothing new.
                if req.ephemeral && hold.count == 1 {
                    ephemeral::bind_caller(ctx, &key_name, req.owner, hold.fence);
                }
                integer(hold.fence)
            }
            Acquired::Nil => RedisValue::Null,
            Acquired::Parked => RedisValue::NoReply,
        })
    })
}

/// `LOCK.MACQUIRE numkeys key [key ...] owner ttl-ms [SHARED [LIMIT n]]
/// [EPHEMERAL] [WAIT timeout-ms]` → an array of fences in the order of the
/// keys, or nil: every lock or none, in one step. With `WAIT` the client
/// parks on every lock as one request, first come first served across them.
pub fn acquire_all(ctx: &Context, input: &Args) -> RedisResult {
    run("LOCK.MACQUIRE", input, |argv| {
        let (names, req) = args::parse_acquire_all(argv, config::max_ttl())?;
        note_lock_names(&names);
        if req.ephemeral {
            ephemeral::refuse_in_script(ctx)?;
        }
        replicas_follow(ctx)?;
        let keys = input.keys(2, names.len())?;
        let targets: Vec<&RedisString> = keys.iter().collect();
        let mut host = Server::new(ctx).ephemeral(req.ephemeral).list();
        let acquired = orchestrate::acquire_all(
            &mut host,
            &targets,
            req.owner,
            (req.mode, req.permits),
            req.ttl_ms,
            req.wait_ms,
        )?;
        Ok(match acquired {
            AcquiredAll::Held(holds) => {
                for (key, hold) in keys.iter().zip(&holds) {
                    // A reentry (count above 1) binds nothing new.
                    if req.ephemeral && hold.count == 1 {
                        ephemeral::bind_caller(ctx, key, req.owner, hold.fence);
                    }
                }
                RedisValue::Array(holds.iter().map(|hold| integer(hold.fence)).collect())
            }
            AcquiredAll::Nil => RedisValue::Null,
            AcquiredAll::Parked => RedisValue::NoReply,
        })
    })
}

/// `LOCK.MRELEASE numkeys key [key ...] owner [ALL]` → an array of the
/// counts left, in the order of the keys; all or none (`NOTOWNER` if the
/// owner does not hold one of them, and nothing changes).
pub fn release_all(ctx: &Context, input: &Args) -> RedisResult {
    run("LOCK.MRELEASE", input, |argv| {
        let (names, req) = args::parse_release_all(argv)?;
        let keys = input.keys(2, names.len())?;
        let targets: Vec<&RedisString> = keys.iter().collect();
        let left = orchestrate::release_all(&mut Server::new(ctx), &targets, req.owner, req.all)?;
        for (key, hold) in keys.iter().zip(&left) {
            if hold.is_none() {
                ephemeral::released(ctx, key, req.owner);
            }
        }
        Ok(RedisValue::Array(
            left.iter()
                .map(|hold| integer(hold.map_or(0, |hold| hold.count)))
                .collect(),
        ))
    })
}

/// `LOCK.MRENEW numkeys key [key ...] owner ttl-ms` → 1; all or none.
pub fn renew_all(ctx: &Context, input: &Args) -> RedisResult {
    run("LOCK.MRENEW", input, |argv| {
        let (names, req) = args::parse_renew_all(argv, config::max_ttl())?;
        replicas_follow(ctx)?;
        let keys = input.keys(2, names.len())?;
        let targets: Vec<&RedisString> = keys.iter().collect();
        orchestrate::renew_all(&mut Server::new(ctx), &targets, req.owner, req.ttl_ms)?;
        Ok(RedisValue::Integer(1))
    })
}

/// The keys of a command that may make locks or waiters under several
/// names: their notifications count from now on (the single-lock commands
/// note their key before they run).
fn note_lock_names(names: &[&[u8]]) {
    for name in names {
        crate::ffi::lock_names::note_lock_name(name);
    }
}

/// `LOCK.REENTER key owner [ttl-ms]` → the new count.
pub fn reenter(ctx: &Context, input: &Args) -> RedisResult {
    run("LOCK.REENTER", input, |argv| {
        let req = args::parse_reenter(argv, config::max_ttl())?;
        replicas_follow(ctx)?;
        let key_name = input.key()?;
        let hold = orchestrate::reenter(&mut Server::new(ctx), &key_name, req.owner, req.ttl_ms)?;
        Ok(integer(hold.count))
    })
}

/// `LOCK.RELEASE key owner [ALL]` → the remaining count (0: now free).
/// A release to zero hands the lock to its longest-waiting client in this
/// same command: no later command sees it free.
pub fn release(ctx: &Context, input: &Args) -> RedisResult {
    run("LOCK.RELEASE", input, |argv| {
        let req = args::parse_release(argv)?;
        let key_name = input.key()?;
        let remaining = orchestrate::release(&mut Server::new(ctx), &key_name, req.owner, req.all)?;
        if remaining.is_none() {
            ephemeral::released(ctx, &key_name, req.owner);
        }
        Ok(integer(remaining.map_or(0, |hold| hold.count)))
    })
}

/// `LOCK.RENEW key owner ttl-ms` → 1.
pub fn renew(ctx: &Context, input: &Args) -> RedisResult {
    run("LOCK.RENEW", input, |argv| {
        let req = args::parse_renew(argv, config::max_ttl())?;
        replicas_follow(ctx)?;
        let key_name = input.key()?;
        orchestrate::renew(&mut Server::new(ctx), &key_name, req.owner, req.ttl_ms)?;
        Ok(RedisValue::Integer(1))
    })
}

/// `LOCK.FENCE key owner min-fence` → the hold's fence, now at least
/// `min-fence`; every fence this server issues afterwards is higher.
pub fn fence(ctx: &Context, input: &Args) -> RedisResult {
    run("LOCK.FENCE", input, |argv| {
        let req = args::parse_fence(argv, now_ms())?;
        replicas_follow(ctx)?;
        let key_name = input.key()?;
        let fenced =
            orchestrate::fence(&mut Server::new(ctx), &key_name, req.owner, req.min_fence)?;
        Ok(integer(fenced.hold.fence))
    })
}

/// `LOCK.INFO key` → nil if free; else owner, count, fence, ttl, waiters,
/// mode, limit and holders (a map under RESP3, a flat array under RESP2;
/// fields in this order). A shared lock shows no owner, its number of
/// owners as the count, their highest fence and the key's TTL.
pub fn info(ctx: &Context, input: &Args) -> RedisResult {
    run("LOCK.INFO", input, |argv| {
        args::parse_info(argv)?;
        let key_name = input.key()?;
        let key = LockKey::open(ctx, &key_name, Access::Read);
        let now = key.now();
        let Some(holds) = key.holds()?.filter(|holds| !holds.is_free(now)) else {
            return Ok(RedisValue::Null);
        };
        let live: Vec<_> = holds.live(now).collect();
        let latest = live.iter().map(|h| h.hold.expires_at).max().unwrap_or(now);
        let (owner, count, fence, mode, limit) = match holds.mode() {
            Mode::Exclusive => {
                let one = live[0];
                let owner = RedisValue::StringBuffer(one.owner.clone());
                (owner, one.hold.count, one.hold.fence, "exclusive", 0)
            }
            Mode::Shared { limit } => {
                let fence = live.iter().map(|h| h.hold.fence).max().unwrap_or(0);
                let limit = limit.map_or(0, u64::from);
                (RedisValue::Null, live.len() as u64, fence, "shared", limit)
            }
        };
        let fields = [
            ("owner", owner),
            ("count", integer(count)),
            ("fence", integer(fence)),
            ("ttl", integer(latest - now)),
            ("waiters", integer(host::waiters(ctx, &key_name) as u64)),
            ("mode", RedisValue::SimpleStringStatic(mode)),
            ("limit", integer(limit)),
        ];
        // The crate's map replies do not keep field order, so reply by hand;
        // Redis turns a map into a flat array for RESP2 clients.
        raw::reply_with_map(ctx.ctx, fields.len() as c_long + 1);
        for (name, value) in fields {
            ctx.reply(Ok(RedisValue::SimpleStringStatic(name)));
            ctx.reply(Ok(value));
        }
        ctx.reply(Ok(RedisValue::SimpleStringStatic("holders")));
        raw::reply_with_array(ctx.ctx, live.len() as c_long);
        for holder in live {
            let entry = [
                ("owner", RedisValue::StringBuffer(holder.owner.clone())),
                ("count", integer(holder.hold.count)),
                ("fence", integer(holder.hold.fence)),
                ("ttl", integer(holder.hold.expires_at - now)),
                ("held", integer(now.saturating_sub(holder.since))),
                (
                    "ephemeral",
                    integer(u64::from(ephemeral::is_bound(
                        ctx,
                        &key_name,
                        &holder.owner,
                        holder.hold.fence,
                    ))),
                ),
                ("permits", integer(u64::from(holder.permits))),
            ];
            raw::reply_with_map(ctx.ctx, entry.len() as c_long);
            for (name, value) in entry {
                ctx.reply(Ok(RedisValue::SimpleStringStatic(name)));
                ctx.reply(Ok(value));
            }
        }
        Ok(RedisValue::NoReply)
    })
}

/// `LOCK.QUEUE key` → the clients waiting on the lock, first in line
/// first, each a map (a flat array under RESP2) of `client`, `owner`,
/// `mode`, `waited` (ms so far) and `timeout` (ms left, -1 for none); an
/// empty array when nobody waits. A key of another type is `WRONGTYPE`, as
/// for `LOCK.INFO`.
pub fn queue(ctx: &Context, input: &Args) -> RedisResult {
    run("LOCK.QUEUE", input, |argv| {
        // The same grammar as `LOCK.INFO`: the key alone.
        args::parse_info(argv)?;
        let key_name = input.key()?;
        LockKey::open(ctx, &key_name, Access::Read).holds()?;
        let line = host::queue(ctx, &key_name);
        raw::reply_with_array(ctx.ctx, line.len() as c_long);
        for waiter in line {
            let mode = match waiter.mode {
                Mode::Exclusive => "exclusive",
                Mode::Shared { .. } => "shared",
            };
            let timeout = waiter.timeout_ms.map_or(RedisValue::Integer(-1), integer);
            let entry = [
                ("client", integer(waiter.client)),
                ("owner", RedisValue::StringBuffer(waiter.owner)),
                ("mode", RedisValue::SimpleStringStatic(mode)),
                ("waited", integer(waiter.waited_ms)),
                ("timeout", timeout),
            ];
            raw::reply_with_map(ctx.ctx, entry.len() as c_long);
            for (name, value) in entry {
                ctx.reply(Ok(RedisValue::SimpleStringStatic(name)));
                ctx.reply(Ok(value));
            }
        }
        Ok(RedisValue::NoReply)
    })
}

/// `LOCK.APPLY key owner count fence [PXAT unix-ms]` → OK, or the short
/// form of a renewal, `LOCK.APPLY key PXAT unix-ms` (the hold keeps its
/// owner, count and fence), a shared lock's whole state (`SHARED limit`
/// and each holder) or one owner's share (`SHARE limit owner count fence
/// lease since`, `UNSHARE owner`). Internal: how a master's decision reaches
/// replicas and the AOF. Refused from clients, so nobody can forge a lock or
/// a fence with it.
pub fn apply(ctx: &Context, input: &Args) -> RedisResult {
    run("LOCK.APPLY", input, |argv| {
        let flags = ctx.get_flags();
        if !flags.intersects(ContextFlags::REPLICATED | ContextFlags::LOADING) {
            return Err(LockError::InternalCommand);
        }
        let key_name = input.key()?;
        // Masters and files send wall-clock times; leases here count on
        // the lease clock.
        let applied = from_wall_applied(args::parse_applied(argv)?);
        let mut key = LockKey::open(ctx, &key_name, Access::Write);
        match applied {
            args::Applied::Lease(lease) => key.move_lease(lease),
            args::Applied::Share(change) => {
                if let args::ShareChange::Share(_, holder) = &change {
                    fence::observe(holder.hold.fence);
                }
                key.apply_share(change);
            }
            args::Applied::Holds(holds) => {
                for holder in holds.holders() {
                    fence::observe(holder.hold.fence);
                }
                key.store_applied(holds);
            }
            args::Applied::Hold(req) => {
                key.store(req.owner, req.count, req.fence, req.expires_at);
                fence::observe(req.fence);
            }
        }
        // Module commands are not propagated on their own: a replica writes
        // what it applied to its own AOF this way.
        ctx.replicate_verbatim();
        Ok(RedisValue::SimpleStringStatic("OK"))
    })
}

/// A `LOCK.APPLY`'s times (wall clock, unix ms) on the lease clock.
fn from_wall_applied(applied: args::Applied<'_>) -> args::Applied<'_> {
    let holder = |mut h: Holder| {
        h.hold.expires_at = lease_clock::from_wall(h.hold.expires_at);
        h.since = lease_clock::from_wall(h.since);
        h
    };
    match applied {
        args::Applied::Lease(at) => args::Applied::Lease(lease_clock::from_wall(at)),
        args::Applied::Share(args::ShareChange::Share(mode, h)) => {
            args::Applied::Share(args::ShareChange::Share(mode, holder(h)))
        }
        args::Applied::Holds(holds) => args::Applied::Holds(Holds::from_parts(
            holds.mode(),
            holds.holders().cloned().map(holder).collect(),
        )),
        args::Applied::Hold(mut req) => {
            req.expires_at = req.expires_at.map(lease_clock::from_wall);
            args::Applied::Hold(req)
        }
        other => other,
    }
}

/// `LOCK.LASTFENCE fence` → OK. Internal: the master writes it to the AOF
/// when a rewrite starts while the fence counter is ahead of the clock (see
/// [`crate::ffi::propagation`]), so that a rewrite without the RDB preamble,
/// which keeps only keys, does not forget a fence raised by `LOCK.FENCE`.
pub fn last_fence(ctx: &Context, input: &Args) -> RedisResult {
    run("LOCK.LASTFENCE", input, |argv| {
        let flags = ctx.get_flags();
        if !flags.intersects(ContextFlags::REPLICATED | ContextFlags::LOADING) {
            return Err(LockError::InternalCommand);
        }
        fence::observe(args::parse_last_fence(argv)?);
        ctx.replicate_verbatim();
        Ok(RedisValue::SimpleStringStatic("OK"))
    })
}

/// Refuses a command that begins or lengthens a hold on a master whose
/// replicas Redis counts as good again but which have not yet shown that
/// they follow it (see [`redislock_core::partition`]): after a partition heals, the
/// old master may count replicas that Sentinel has moved to the new master.
/// (Where Redis itself counts too few, it refuses before the module runs.)
fn replicas_follow(ctx: &Context) -> Result<(), LockError> {
    if partition::open() {
        return Ok(());
    }
    let flags = ctx.get_flags();
    let from_master = flags.intersects(ContextFlags::REPLICATED | ContextFlags::LOADING);
    if flags.contains(ContextFlags::MASTER) && !from_master {
        Err(LockError::NoReplicas)
    } else {
        Ok(())
    }
}

/// Runs one command body with the boundary rules: argument bytes in, errors
/// mapped to replies (and `NOTOWNER` counted), panics caught and logged.
fn run(
    name: &str,
    input: &Args,
    body: impl FnOnce(&[&[u8]]) -> Result<RedisValue, LockError>,
) -> RedisResult {
    let result = guard(name, Err(LockError::Internal), || body(input.bytes()));
    result.map_err(|err| {
        if err == LockError::NotOwner {
            stats::NOTOWNER.incr();
        }
        error_reply(err)
    })
}

/// The reply Redis sends for `err`. Arity goes through
/// `RedisModule_WrongArity` so the text names the command exactly as the
/// server's own check does; every other error is its text from the core.
pub fn error_reply(err: LockError) -> RedisError {
    match err {
        LockError::WrongArity => RedisError::WrongArity,
        other => RedisError::Str(other.message()),
    }
}

/// Counts, fences: unsigned here, signed integers in RESP.
fn integer(n: u64) -> RedisValue {
    RedisValue::Integer(i64::try_from(n).unwrap_or(i64::MAX))
}
