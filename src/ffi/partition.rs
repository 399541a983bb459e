//! The replicas gate's glue ([`redislock_core::partition`]): Redis's
//! `min-replicas-to-write` / `min-replicas-max-lag`, read from the server,
//! and the marker write that proves replicas follow this master.
//!
//! Cost: nothing on the command path but a cached flag. The settings are
//! read at load and when a `CONFIG SET` changes them (the config event);
//! `INFO replication` is read only while they are set, at each server cron
//! ([`refresh`], from `ffi::events`: Redis recounts its good replicas in its
//! replication cron, which runs just before the module cron event of the
//! same tick) and when a replica comes, goes or the role changes (the only
//! other times Redis recounts).
//! So the cached answer is never older than Redis's own. The marker is
//! followed by `REPLCONF GETACK *` to the replicas, so the proof comes back
//! in a round trip rather than at their next once-a-second acknowledgement.

use std::cell::Cell;
use std::os::raw::{c_int, c_void};
use std::ptr;
use std::time::Instant;

use redis_module::{logging, raw, Context, RedisValue};

use crate::ffi::{
    config, context_flags, create_timer, guard, subscribe_to_server_event, writes_paused,
};
use redislock_core::fence;
use redislock_core::partition::{self, Action, Partition, Settings, View};

thread_local! {
    /// The gate (main thread only).
    static GATE: Cell<Partition> = Cell::new(Partition::default());
    /// A marker timer is armed.
    static MARKER_ARMED: Cell<bool> = const { Cell::new(false) };
    /// What the last log line said about partition safety, so a `CONFIG SET`
    /// of something else logs nothing: (max-ttl, never, settings).
    static LOGGED: Cell<Option<(u64, bool, Settings)>> = const { Cell::new(None) };
    /// When Redis last counted enough replicas while the gate was shut (the
    /// marker was asked for): the log says how long the proof then took.
    static COUNTED_SINCE: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Whether the replicas let the module grant and take fresh lock commands.
pub fn open() -> bool {
    GATE.get().open()
}

/// `min-replicas-max-lag` in ms while both settings are on, else 0.
pub fn lag_ms() -> u64 {
    GATE.get().settings().lag_ms()
}

/// Whether this configuration gives failover safety under partitions.
pub fn safe() -> bool {
    unsafe_because().is_empty()
}

fn unsafe_because() -> Vec<&'static str> {
    partition::unsafe_because(
        config::max_ttl(),
        config::quarantine_never(),
        GATE.get().settings(),
    )
}

/// At load: reads the settings, subscribes to the config event, and logs
/// whether the configuration is safe under partitions. (The cron tick's
/// [`refresh`] is called by `ffi::events`.)
pub fn watch(ctx: &Context) -> Result<(), &'static str> {
    reconfigure(ctx.ctx);
    if !subscribe_to_server_event(ctx.ctx, raw::REDISMODULE_EVENT_CONFIG, Some(on_config)) {
        return Err("cannot subscribe to the config event");
    }
    Ok(())
}

/// A config change.
extern "C" fn on_config(
    ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    _subevent: u64,
    _data: *mut c_void,
) {
    guard("replicas gate event", (), || reconfigure(ctx));
}

/// A config may have changed: read the settings again, log if the safety
/// of the configuration changed, and look at the replicas.
pub fn reconfigure(ctx: *mut raw::RedisModuleCtx) {
    let settings = read_settings(ctx);
    let mut gate = GATE.get();
    if gate.settings() != settings || LOGGED.get().is_none() {
        gate.configure(settings);
        GATE.set(gate);
    }
    log_safety();
    refresh(ctx);
}

/// Logs why `INFO lock` says `partition_safe:0` (or that it says 1), once
/// per change of the configs that decide it.
pub fn log_safety() {
    let now = (
        config::max_ttl(),
        config::quarantine_never(),
        GATE.get().settings(),
    );
    if LOGGED.replace(Some(now)) == Some(now) {
        return;
    }
    let why = unsafe_because();
    if why.is_empty() {
        logging::log_notice(
            "lock: partition_safe:1 (lock.max-ttl, min-replicas-to-write and \
             min-replicas-max-lag set: failover safety holds under partitions)",
        );
    } else {
        logging::log_warning(format!(
            "lock: partition_safe:0: {}; mutual exclusion is not guaranteed when a \
             master with replicas is cut off from them and replaced",
            why.join("; ")
        ));
    }
}

/// Reads `INFO replication` (only while the settings are on) and moves the
/// gate; arms the marker write if it asks for one.
pub fn refresh(ctx: *mut raw::RedisModuleCtx) {
    let mut gate = GATE.get();
    if !gate.settings().active() {
        return;
    }
    let view = read_view(ctx);
    let was_open = gate.open();
    let action = gate.observe(&view);
    GATE.set(gate);
    let redis_refuses = !view.master || view.good < gate.settings().min_replicas;
    log_transition(was_open, gate.open(), action, redis_refuses);
    if let Action::WriteMarker { target } = action {
        if !MARKER_ARMED.replace(true) {
            let data = target as usize as *mut c_void;
            if create_timer(ctx, 0, write_marker, data) == 0 {
                MARKER_ARMED.set(false);
            }
        }
    }
}

/// Logs the gate shutting and opening again: rare (a partition, a replica
/// restart, a promotion), and what an operator wants to see next to
/// Sentinel's log. The time from Redis counting enough replicas again to
/// their proof is time the module refused what Redis would have taken; a
/// count that falls again before any proof (a replaced master's late
/// acknowledgements after a heal) is logged too, with how long it lasted.
fn log_transition(was_open: bool, open: bool, action: Action, redis_refuses: bool) {
    let counted = COUNTED_SINCE.get();
    if matches!(action, Action::WriteMarker { .. }) && counted.is_none() {
        COUNTED_SINCE.set(Some(Instant::now()));
    }
    if was_open && !open {
        COUNTED_SINCE.set(None);
        logging::log_notice(
            "lock: too few replicas follow this master: no grants and no fresh \
             lock commands until enough of them acknowledge a write made after this",
        );
    } else if !was_open && open {
        let ms = COUNTED_SINCE
            .take()
            .map_or(0, |since| since.elapsed().as_millis());
        logging::log_notice(format!(
            "lock: replicas follow this master again ({ms} ms after Redis counted \
             them good): grants resume"
        ));
    } else if redis_refuses {
        if let Some(since) = COUNTED_SINCE.take() {
            logging::log_notice(format!(
                "lock: replicas Redis counted good for {} ms never acknowledged the \
                 marker (late acknowledgements to a replaced master?): the module \
                 refused lock commands and grants meanwhile",
                since.elapsed().as_millis()
            ));
        }
    }
}

/// Replicates the marker (a timer: event callbacks do not propagate), unless
/// writes are paused or this is no longer a master: the next cron asks again.
extern "C" fn write_marker(ctx: *mut raw::RedisModuleCtx, data: *mut c_void) {
    guard("replicas marker", (), || {
        MARKER_ARMED.set(false);
        let master = context_flags(ctx) & raw::REDISMODULE_CTX_FLAGS_MASTER as c_int != 0;
        if writes_paused() || !master {
            return;
        }
        let target = data as usize as u64;
        // Harmless to apply: a replica's counter is at least this already,
        // or gets higher fences from it.
        let last = i64::try_from(fence::last().max(1)).unwrap_or(i64::MAX);
        // SAFETY: "l" takes one long long; a timer's context may replicate.
        unsafe {
            raw::RedisModule_Replicate
                .map(|f| f(ctx, c"LOCK.LASTFENCE".as_ptr(), c"l".as_ptr(), last));
        }
        let mut gate = GATE.get();
        gate.marker_written(target);
        GATE.set(gate);
        // Replicas acknowledge once a second on their own; asking now makes
        // the proof a round trip. Its own timer, so that it is not wrapped
        // with the marker in a MULTI.
        create_timer(ctx, 0, ask_for_acks, ptr::null_mut());
    });
}

/// `REPLCONF GETACK *` to the replicas only (not the AOF), as Redis sends
/// for `WAIT`: each replica answers with its offset, past the marker if it
/// follows this master.
extern "C" fn ask_for_acks(ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    guard("replicas ack request", (), || {
        let master = context_flags(ctx) & raw::REDISMODULE_CTX_FLAGS_MASTER as c_int != 0;
        if writes_paused() || !master {
            return;
        }
        // SAFETY: two C strings for "cc"; "A" keeps it out of the AOF; a
        // timer's context may replicate.
        unsafe {
            raw::RedisModule_Replicate.map(|f| {
                f(
                    ctx,
                    c"REPLCONF".as_ptr(),
                    c"ccA".as_ptr(),
                    c"GETACK".as_ptr(),
                    c"*".as_ptr(),
                )
            });
        }
    });
}

/// `min-replicas-to-write` and `min-replicas-max-lag` from `CONFIG GET`.
fn read_settings(ctx: *mut raw::RedisModuleCtx) -> Settings {
    let context = Context::new(ctx);
    let get = |name: &str| -> u64 {
        match context.call("CONFIG", &["GET", name]) {
            Ok(RedisValue::Array(items)) => items.get(1).and_then(as_u64).unwrap_or(0),
            _ => 0,
        }
    };
    Settings {
        min_replicas: get("min-replicas-to-write"),
        max_lag_s: get("min-replicas-max-lag"),
    }
}

fn as_u64(value: &RedisValue) -> Option<u64> {
    let text = match value {
        RedisValue::SimpleString(s) | RedisValue::BulkString(s) => s.clone(),
        RedisValue::StringBuffer(b) => String::from_utf8_lossy(b).into_owned(),
        RedisValue::BulkRedisString(s) => s.to_string_lossy(),
        RedisValue::Integer(n) => return u64::try_from(*n).ok(),
        _ => return None,
    };
    text.trim().parse().ok()
}

/// What `INFO replication` shows now. Fields it lacks read as "no replica",
/// which keeps the gate shut: wrong only on the safe side.
fn read_view(ctx: *mut raw::RedisModuleCtx) -> View {
    let master = context_flags(ctx) & raw::REDISMODULE_CTX_FLAGS_MASTER as c_int != 0;
    let mut view = View {
        master,
        ..View::default()
    };
    if !master {
        return view;
    }
    // SAFETY: a live context; the info object is freed before return, and
    // the strings it hands out are copied before that.
    unsafe {
        let (Some(get), Some(signed), Some(text), Some(free)) = (
            raw::RedisModule_GetServerInfo,
            raw::RedisModule_ServerInfoGetFieldSigned,
            raw::RedisModule_ServerInfoGetFieldC,
            raw::RedisModule_FreeServerInfo,
        ) else {
            return view;
        };
        let info = get(ctx, c"replication".as_ptr());
        if info.is_null() {
            return view;
        }
        let mut err = 0;
        let number = |name: &std::ffi::CStr, err: &mut c_int| -> u64 {
            u64::try_from(signed(info, name.as_ptr(), err)).unwrap_or(0)
        };
        view.good = number(c"min_slaves_good_slaves", &mut err);
        if err != 0 {
            view.good = 0;
        }
        view.offset = number(c"master_repl_offset", &mut err);
        let replicas = number(c"connected_slaves", &mut err);
        for i in 0..replicas.min(1024) {
            let Ok(name) = std::ffi::CString::new(format!("slave{i}")) else {
                continue;
            };
            let line = text(info, name.as_ptr());
            if line.is_null() {
                continue;
            }
            let line = std::ffi::CStr::from_ptr(line).to_string_lossy();
            if let Some(offset) = online_offset(&line) {
                view.acked.push(offset);
            }
        }
        free(ctx, info);
    }
    view
}

/// The acknowledged offset of a `slaveN:ip=…,port=…,state=online,offset=…,lag=…`
/// line, if that replica is online.
fn online_offset(line: &str) -> Option<u64> {
    let field = |name: &str| {
        line.split(',')
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
    };
    (field("state")? == "online").then_some(())?;
    field("offset")?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::online_offset;

    #[test]
    fn only_online_replicas_give_their_offset() {
        let table = [
            (
                "ip=198.18.0.2,port=6379,state=online,offset=1234,lag=0",
                Some(1234),
            ),
            (
                "ip=198.18.0.2,port=6379,state=wait_bgsave,offset=0,lag=0",
                None,
            ),
            ("ip=198.18.0.2,port=6379,state=online,offset=x,lag=0", None),
            ("garbage", None),
        ];
        for (line, want) in table {
            assert_eq!(online_offset(line), want, "{line}");
        }
    }
}
