//! The `INFO lock` section: the counters, the fence counter, the
//! quarantine and the replicas gate, and the wait and hold lengths.

use redis_module::raw;
use redislock_core::{fence, stats};

use crate::ffi::{guard, latency, partition, quarantine};

/// Registers the `INFO lock` section (fields `lock_held`, `lock_waiting`, …).
/// Done by hand: the crate's own info hook needs a newer Redis.
pub fn register(ctx: *mut raw::RedisModuleCtx) {
    raw::register_info_function(ctx, Some(info_callback));
}

/// Fills the `INFO lock` section.
extern "C" fn info_callback(ctx: *mut raw::RedisModuleInfoCtx, _for_crash_report: i32) {
    guard("info", (), || {
        // An empty section name makes Redis name the section after the module.
        raw::add_info_section(ctx, None);
        for (name, value) in stats::fields(fence::last(), quarantine::ms_left(), partition::safe())
        {
            raw::add_info_field_long_long(ctx, name, value);
        }
        raw::add_info_field_str(ctx, "wait_usec", &latency::render_wait());
        raw::add_info_field_str(ctx, "hold_usec", &latency::render_hold());
    });
}
