//! `lock`: distributed locks inside `redis-server`.
//!
//! The command reference is `docs/commands.md`. The logic lives in the
//! Redis-free crate `redislock-core` (`core/`: the lock state machine,
//! fences, the wait queue, the hand-off engine, the sequencing around them,
//! the quarantine, argument parsing, counters), which the glue names by
//! its own name (`redislock_core::…`); this crate is the glue that runs it
//! inside `redis-server`:
//!
//! | path | what lives there | touches Redis? |
//! |---|---|---|
//! | `core/` ([`redislock_core::lock`], [`redislock_core::handoff`], [`redislock_core::args`], …) | the logic, pure, time passed in | no |
//! | `core/` [`redislock_core::orchestrate`] | the sequencing: acquire (grant, park or nil), serve, hand over, revoke, the pump, lease checks; generic over its `Host` trait | no |
//! | [`commands`] | one handler per command: parse → call the core → reply | safe API |
//! | [`ffi`] | all raw C API use: data type, keys, the `Host` of [`redislock_core::orchestrate`] and blocked clients (`ffi::host`), events, ephemeral holds bound to connections (`ffi::ephemeral`) and ended when they close (`ffi::ephemeral_ends`), configs, the lease clock and the pass that re-bases leases after a wall-clock step (`ffi::lease_clock`, `ffi::lease_rebase`), the quarantine clock, where waits and holds begin and end (`ffi::latency`) | `unsafe` |
//!
//! A lock is a key whose value is the module type `redislock`: held
//! exclusively, its owner, count, fence, lease end and start in one
//! allocation; held shared, each holder's. The lease (the latest one of a
//! shared lock) is mirrored as the key's TTL and put back if another
//! command changes it. Every change the master makes goes to replicas and
//! the AOF as `LOCK.APPLY key owner count fence PXAT ms` (a renewal, whose
//! lease alone moves, as `LOCK.APPLY key PXAT ms`; a change to one owner's
//! share of a shared lock as `LOCK.APPLY key SHARE limit owner count fence
//! lease since` or `LOCK.APPLY key UNSHARE owner`, and the whole state, in
//! an AOF rewrite, as `LOCK.APPLY key SHARED limit` and each holder's
//! `owner count fence lease since`), so they store the master's decision instead of
//! deciding again (and the fence counter, when an AOF rewrite would lose
//! it, as `LOCK.LASTFENCE`).

pub mod commands;
pub mod ffi;

// Unit tests run without Redis, so they use the system allocator and skip
// the registration; the module allocates through Redis so that
// `used_memory` and `MEMORY USAGE` count its data.
#[cfg(not(test))]
mod registration {
    use std::os::raw::c_int;

    use redis_module::{raw, redis_module, Context, RedisResult, RedisString, Status};
    use redislock_core::error::LockError;

    use crate::commands;
    use crate::ffi::{self, commandinfo, datatype::LOCK_TYPE};

    /// Module load: panic hook, commands, INFO section and subscriptions
    /// to server events (the data type is registered by the macro).
    fn init(ctx: &Context, _args: &[RedisString]) -> Status {
        ffi::install_panic_hook();
        if let Err(why) = ffi::config::register(ctx) {
            ctx.log_warning(&format!("lock: {why}"));
            return Status::Err;
        }
        // Its configs read, the start-up quarantine begins.
        ffi::quarantine::module_loaded(ctx.ctx);
        if register_commands(ctx) == Status::Err {
            return Status::Err;
        }
        ffi::info::register(ctx.ctx);
        ffi::note_cluster_mode(ctx);
        match ffi::events::subscribe(ctx) {
            Ok(()) => Status::Ok,
            Err(why) => {
                ctx.log_warning(&format!("lock: {why}"));
                Status::Err
            }
        }
    }

    /// Runs one command: reads its arguments in place ([`ffi::Args`]),
    /// calls `handler` behind the panic guard and replies with the result.
    /// `makes_locks`: the command may make a lock or a waiter under its key
    /// (the others find one there or do nothing).
    #[inline(always)]
    fn run_command(
        ctx: *mut raw::RedisModuleCtx,
        argv: *mut *mut raw::RedisModuleString,
        argc: c_int,
        name: &str,
        makes_locks: bool,
        handler: impl Fn(&Context, &ffi::Args) -> RedisResult,
    ) -> c_int {
        let context = Context::new(ctx);
        // A client may wait on a lock that does not exist yet
        // (a quarantine): from the first lock command on, the
        // module hears about keys.
        ffi::lock_may_exist();
        let replied = ffi::guard(name, None, || {
            // SAFETY: Redis passes `argc` live arguments for the call.
            let args = unsafe { ffi::Args::from_raw(ctx, argv, argc) };
            // The key of a command that may make a lock or a
            // waiter there: its notifications count from now on.
            let key = args.bytes().get(1).copied().filter(|_| makes_locks);
            let reply = ffi::lock_names::lock_command(key, || handler(&context, &args));
            Some(context.reply(reply) as c_int)
        });
        // A panic outside the handler's own guard: still one reply.
        replied.unwrap_or_else(|| {
            context.reply(Err(commands::error_reply(LockError::Internal))) as c_int
        })
    }

    /// Registers the commands of [`commandinfo`]'s table, each behind a
    /// shim that Redis calls and that hands over to [`run_command`].
    fn register_commands(ctx: &Context) -> Status {
        // A C function per command (Redis passes no data to a command
        // callback, so each one names its handler itself).
        macro_rules! shim {
            ($handler:path, $makes_locks:expr) => {{
                extern "C" fn shim(
                    ctx: *mut raw::RedisModuleCtx,
                    argv: *mut *mut raw::RedisModuleString,
                    argc: c_int,
                ) -> c_int {
                    run_command(
                        ctx,
                        argv,
                        argc,
                        stringify!($handler),
                        $makes_locks,
                        $handler,
                    )
                }
                shim as extern "C" fn(_, _, _) -> _
            }};
        }
        let commands = [
            (&commandinfo::ACQUIRE, shim!(commands::acquire, true)),
            (&commandinfo::REENTER, shim!(commands::reenter, false)),
            (&commandinfo::RELEASE, shim!(commands::release, false)),
            (&commandinfo::RENEW, shim!(commands::renew, false)),
            (&commandinfo::FENCE, shim!(commands::fence, false)),
            (&commandinfo::MACQUIRE, shim!(commands::acquire_all, false)),
            (&commandinfo::MRELEASE, shim!(commands::release_all, false)),
            (&commandinfo::MRENEW, shim!(commands::renew_all, false)),
            (&commandinfo::INFO, shim!(commands::info, false)),
            (&commandinfo::QUEUE, shim!(commands::queue, false)),
            (&commandinfo::APPLY, shim!(commands::apply, true)),
            (&commandinfo::LAST_FENCE, shim!(commands::last_fence, false)),
        ];
        let category = commandinfo::add_category(ctx);
        for (command, handler) in commands {
            if let Err(why) = commandinfo::register(ctx, command, handler, category) {
                ctx.log_warning(&format!("lock: {why}"));
                return Status::Err;
            }
        }
        Status::Ok
    }

    /// `MODULE LIST`'s `ver`: the crate version as major × 10000 + minor ×
    /// 100 + patch (0.1.0 → 100), the way Redis's own modules number theirs.
    const VERSION: i32 = version_number(env!("CARGO_PKG_VERSION"));

    /// `"major.minor.patch"` (anything after the patch, such as `-rc1`, is
    /// ignored) as major × 10000 + minor × 100 + patch. A version that
    /// does not fit (minor or patch above 99, major above 214747) fails
    /// the build instead of showing a wrong number.
    const fn version_number(version: &str) -> i32 {
        let bytes = version.as_bytes();
        let mut parts = [0_i32; 3];
        let (mut part, mut i) = (0, 0);
        while i < bytes.len() && part < 3 {
            match bytes[i] {
                b'0'..=b'9' => parts[part] = parts[part] * 10 + (bytes[i] - b'0') as i32,
                b'.' => part += 1,
                _ => break,
            }
            i += 1;
        }
        assert!(part == 2, "the crate version is not major.minor.patch");
        assert!(
            parts[1] < 100 && parts[2] < 100,
            "minor and patch must be below 100"
        );
        assert!(parts[0] <= (i32::MAX - 9999) / 10000, "major too large");
        parts[0] * 10000 + parts[1] * 100 + parts[2]
    }

    redis_module! {
        name: "lock",
        version: VERSION,
        allocator: (redis_module::alloc::RedisAlloc, redis_module::alloc::RedisAlloc),
        data_types: [LOCK_TYPE],
        init: init,
    }
}
