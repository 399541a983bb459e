//! `lock`: distributed locks inside `redis-server`.
//!
//! The contract is `SPEC.md` (shared with the team); this crate is laid out
//! so that the logic can be read and tested without Redis:
//!
//! | file | what lives there | touches Redis? |
//! |---|---|---|
//! | [`args`] | argument vectors → typed requests, every §9 rule | no |
//! | [`cluster`] | hash slots and `MIGRATE` arguments, for slot migration | no |
//! | [`lock`] | the state machine: acquire, reenter, release, renew, lease end | no |
//! | [`fence`] | fencing tokens `max(last + 1, unix_ms × 2^20)` | no |
//! | [`queue`] | the FIFO of clients waiting on each lock | no |
//! | [`error`] | the one error enum and its reply texts | no |
//! | [`stats`] | counters for `INFO lock` | no |
//! | [`commands`] | one handler per command: parse → apply → reply | safe API |
//! | [`ffi`] | all raw C API use: data type callbacks, keys, blocking, events | `unsafe` |
//!
//! A lock is a key whose value is the module type `redislock` (owner, count,
//! fence); its lease is the key's TTL. Every change the master makes goes to
//! replicas and the AOF as `LOCK.APPLY key owner count fence PXAT ms`, so
//! they store the master's decision instead of deciding again.

pub mod args;
pub mod cluster;
pub mod commands;
pub mod error;
pub mod fence;
pub mod ffi;
pub mod lock;
pub mod queue;
pub mod stats;

// Unit tests run without Redis, so they use the system allocator and skip
// the registration; the module allocates through Redis so that `used_memory`
// and `MEMORY USAGE` count its data.
#[cfg(not(test))]
mod registration {
    use redis_module::{redis_module, Context, RedisString, Status};

    use crate::commands;
    use crate::ffi::{self, datatype::LOCK_TYPE};

    /// Module load: panic hook, INFO section and subscriptions to server
    /// events (commands and the data type are registered by the macro).
    fn init(ctx: &Context, _args: &[RedisString]) -> Status {
        ffi::install_panic_hook();
        ffi::register_info(ctx.ctx);
        ffi::events::watch_migrations(ctx);
        match ffi::events::subscribe(ctx).and_then(|()| ffi::propagation::watch(ctx)) {
            Ok(()) => Status::Ok,
            Err(why) => {
                ctx.log_warning(&format!("lock: {why}"));
                Status::Err
            }
        }
    }

    redis_module! {
        name: "lock",
        version: 1,
        allocator: (redis_module::alloc::RedisAlloc, redis_module::alloc::RedisAlloc),
        data_types: [LOCK_TYPE],
        init: init,
        commands: [
            // [name, handler, flags, first key, last key, key step, ACL categories]
            // ACL categories stay empty: Redis 7.0 lacks the API to set them.
            ["lock.acquire", commands::acquire, "write deny-oom", 1, 1, 1, ""],
            ["lock.reenter", commands::reenter, "write deny-oom", 1, 1, 1, ""],
            ["lock.release", commands::release, "write", 1, 1, 1, ""],
            ["lock.renew", commands::renew, "write", 1, 1, 1, ""],
            ["lock.info", commands::info, "readonly fast", 1, 1, 1, ""],
            ["lock.apply", commands::apply, "write", 1, 1, 1, ""],
        ],
    }
}
