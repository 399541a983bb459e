//! The replicas gate's glue ([`redislock_core::partition`]): Redis's
//! `min-replicas-to-write` / `min-replicas-max-lag`, read from the server,
//! the probes and their markers, and the monotonic clock the gate counts on.
//!
//! Cost, and only while both settings are on (else nothing but a cached
//! flag): a command or a hand-off reads a cached deadline and the monotonic
//! clock. At each server cron tick ([`refresh`], called by `ffi::events`;
//! and when a replica comes, goes or the role changes) the glue reads
//! `INFO replication` (the acknowledged offset of each replica) and, at
//! most once per tick and once per sixteenth of the lag, takes a probe: it replicates a `PING` (to the replicas only, not the
//! AOF: 14 bytes, which a replica applies as nothing) followed by `REPLCONF
//! GETACK *` (as `WAIT` sends), so each replica answers with an offset past
//! the probe within a round trip instead of at its next once-a-second
//! acknowledgement. At Redis's default `hz 10` and a lag of 1 s that is ten
//! probes a second: about 50 bytes to each replica and an acknowledgement
//! back. A replica that follows is then always counted within about two
//! ticks; keep `hz` at 10 or above with a lag of 1 s.

use std::cell::Cell;
use std::os::raw::{c_int, c_void};
use std::ptr;
use std::sync::OnceLock;
use std::time::Instant;

use redis_module::{logging, raw, Context, RedisValue};

use crate::ffi::{
    config, context_flags, create_timer, guard, subscribe_to_server_event, writes_paused,
};
use redislock_core::partition::{self, Action, Partition, Settings, View};

thread_local! {
    /// The gate (main thread only).
    static GATE: Cell<Partition> = Cell::new(Partition::default());
    /// The gate's deadline on [`mono_ms`], copied out of [`GATE`] so that
    /// the hot path reads one word (`u64::MAX`: the settings are off).
    static OPEN_UNTIL: Cell<u64> = const { Cell::new(u64::MAX) };
    /// A marker timer is armed.
    static MARKER_ARMED: Cell<bool> = const { Cell::new(false) };
    /// What the last log line said about partition safety, so a `CONFIG SET`
    /// of something else logs nothing: (max-ttl, never, settings).
    static LOGGED: Cell<Option<(u64, bool, Settings)>> = const { Cell::new(None) };
    /// Whether the gate was open at the last look, and since when (ms) it
    /// was shut: the log notes each change.
    static WAS_OPEN: Cell<bool> = const { Cell::new(true) };
    static SHUT_SINCE: Cell<u64> = const { Cell::new(0) };
}

/// Milliseconds on the monotonic clock since the module loaded: what the
/// probes and the gate count on (a step of the wall clock moves nothing).
/// Both ends truncate, which only shuts the gate sooner: a grant at `now`
/// passes only if `now < probe + lag` in whole ms.
fn mono_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    let elapsed = START.get_or_init(Instant::now).elapsed().as_millis();
    u64::try_from(elapsed).unwrap_or(u64::MAX)
}

/// Whether the replicas let the module grant and take fresh lock commands
/// now.
pub fn open() -> bool {
    let until = OPEN_UNTIL.get();
    until == u64::MAX || mono_ms() < until
}

/// How long a master cut off from its replicas may still grant, in ms: the
/// lag while both settings are on, else 0. A promotion's quarantine adds it.
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
        OPEN_UNTIL.set(gate.open_until());
        // New settings start shut (or open, without them) silently.
        WAS_OPEN.set(gate.open(mono_ms()));
        SHUT_SINCE.set(mono_ms());
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
/// gate; arms the marker if a probe was taken.
pub fn refresh(ctx: *mut raw::RedisModuleCtx) {
    let mut gate = GATE.get();
    if !gate.settings().active() {
        return;
    }
    // The time first: a probe's offset must be read no earlier than its
    // time, so that every byte past it was written after that time.
    let now = mono_ms();
    let view = read_view(ctx);
    let deadline = gate.open_until();
    let action = gate.observe(&view, now);
    GATE.set(gate);
    OPEN_UNTIL.set(gate.open_until());
    log_transition(&gate, deadline, now);
    if action == Action::WriteMarker
        && !MARKER_ARMED.replace(true)
        && create_timer(ctx, 0, write_marker, ptr::null_mut()) == 0
    {
        MARKER_ARMED.set(false);
    }
}

/// Logs the gate shutting and opening again: rare (a partition, a replica
/// restart or pause, a promotion), and what an operator wants to see next
/// to Sentinel's log.
fn log_transition(gate: &Partition, deadline: u64, now: u64) {
    let open = gate.open(now);
    if WAS_OPEN.replace(open) == open {
        return;
    }
    let lag = gate.settings().lag_ms();
    if open {
        let shut_ms = now.saturating_sub(SHUT_SINCE.get());
        logging::log_notice(format!(
            "lock: enough replicas acknowledged within {lag} ms again: grants resume \
             (shut for about {shut_ms} ms)"
        ));
    } else {
        // Shut since the deadline of the last look passed (the cut plus
        // the lag, at the latest), or now when Redis refused first.
        let since = deadline.min(now);
        SHUT_SINCE.set(since);
        logging::log_notice(format!(
            "lock: fewer replicas than min-replicas-to-write acknowledged a probe \
             within {lag} ms (shut since {} ms): no grants and no fresh lock commands \
             until they do",
            now.saturating_sub(since)
        ));
    }
}

/// Replicates the probe's marker (a timer: event callbacks do not
/// propagate), unless writes are paused or this is no longer a master: the
/// probe then waits for the next marker, which proves it as well.
extern "C" fn write_marker(ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    guard("replicas marker", (), || {
        MARKER_ARMED.set(false);
        let master = context_flags(ctx) & raw::REDISMODULE_CTX_FLAGS_MASTER as c_int != 0;
        if writes_paused() || !master {
            return;
        }
        // Any bytes do: a `PING` is what Redis itself sends its replicas to
        // keep the link alive, and a replica applies it as nothing. "A"
        // keeps it out of the AOF.
        // SAFETY: no arguments after the flags; a timer's context may
        // replicate.
        unsafe {
            raw::RedisModule_Replicate.map(|f| f(ctx, c"PING".as_ptr(), c"A".as_ptr()));
        }
        // Replicas acknowledge once a second on their own; asking now makes
        // the proof a round trip. Its own timer, so that it is not wrapped
        // with the marker in a MULTI (a replica answers a GETACK inside one
        // with the offset before the whole block).
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
