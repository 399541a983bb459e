//! The command table: each command's name, flags and key, and its
//! registration with the server.
//!
//! `RedisModule_CreateCommand` alone describes a key only by position, and
//! the server then assumes the command reads *and* writes it: an ACL user
//! with `%R~*` could not even run `LOCK.INFO`. So each command also gets a
//! key spec with the access it really has (`RedisModule_SetCommandInfo`,
//! Redis 7.0+), which `COMMAND INFO`, `COMMAND GETKEYSANDFLAGS` and the ACL
//! key permissions read. The position given to `CreateCommand` stays
//! argument 1 either way, for cluster routing.

use std::ffi::CStr;
use std::os::raw::c_int;
use std::ptr;

use redis_module::{raw, Context};

/// What one command does with its key, as `REDISMODULE_CMD_KEY_*` bits.
/// `None` in [`Command::key`]: the command takes no key.
type KeyAccess = u32;

/// Reads the lock and replies with what it holds.
const READ: KeyAccess = raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS;
/// Changes the lock and replies with its count or fence (as `INCR` does).
const UPDATE_AND_READ: KeyAccess =
    raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_ACCESS | raw::REDISMODULE_CMD_KEY_UPDATE;
/// Changes the lease only and replies with a constant (as `PEXPIRE` does):
/// write permission is enough.
const UPDATE: KeyAccess = raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_UPDATE;
/// Lowers the count, deleting the key at 0, and replies with the count
/// left (as `GETDEL` and `LPOP` do).
const DELETE_AND_READ: KeyAccess =
    raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_ACCESS | raw::REDISMODULE_CMD_KEY_DELETE;
/// Stores a given state whatever the key held (as `SET` does).
const OVERWRITE: KeyAccess = raw::REDISMODULE_CMD_KEY_OW | raw::REDISMODULE_CMD_KEY_UPDATE;

/// One command as the server should know it.
pub struct Command {
    pub name: &'static CStr,
    /// `RedisModule_CreateCommand` flags.
    flags: &'static CStr,
    /// The key at argument 1, and what the command does with it.
    key: Option<KeyAccess>,
}

pub const ACQUIRE: Command = Command {
    name: c"lock.acquire",
    flags: c"write deny-oom",
    key: Some(UPDATE_AND_READ),
};

pub const REENTER: Command = Command {
    name: c"lock.reenter",
    flags: c"write deny-oom",
    key: Some(UPDATE_AND_READ),
};

pub const RELEASE: Command = Command {
    name: c"lock.release",
    flags: c"write",
    key: Some(DELETE_AND_READ),
};

pub const RENEW: Command = Command {
    name: c"lock.renew",
    flags: c"write",
    key: Some(UPDATE),
};

pub const FENCE: Command = Command {
    name: c"lock.fence",
    flags: c"write",
    key: Some(UPDATE_AND_READ),
};

pub const INFO: Command = Command {
    name: c"lock.info",
    flags: c"readonly fast",
    key: Some(READ),
};

pub const APPLY: Command = Command {
    name: c"lock.apply",
    flags: c"write",
    key: Some(OVERWRITE),
};

pub const LAST_FENCE: Command = Command {
    name: c"lock.lastfence",
    flags: c"write",
    key: None,
};

/// A command handler as the server calls it.
pub type Handler =
    extern "C" fn(*mut raw::RedisModuleCtx, *mut *mut raw::RedisModuleString, c_int) -> c_int;

/// Registers `command` with `handler`, then tells the server its key spec.
pub fn register(ctx: &Context, command: &Command, handler: Handler) -> Result<(), String> {
    let name = command.name;
    let position = if command.key.is_some() { 1 } else { 0 };
    // SAFETY: module load, with its context; name and flags are static C
    // strings and the handler a plain function.
    let status = unsafe {
        raw::RedisModule_CreateCommand.map_or(raw::Status::Err as c_int, |create| {
            create(
                ctx.ctx,
                name.as_ptr(),
                Some(handler),
                command.flags.as_ptr(),
                position,
                position,
                position,
            )
        })
    };
    if status != raw::Status::Ok as c_int {
        return Err(format!("cannot register {name:?}"));
    }
    // SAFETY: as above; the command was just created by this module.
    let handle = unsafe {
        raw::RedisModule_GetCommand.map_or(ptr::null_mut(), |get| get(ctx.ctx, name.as_ptr()))
    };
    if handle.is_null() {
        return Err(format!("cannot find {name:?} after registering it"));
    }
    set_info(handle, command)
}

/// `RedisModule_SetCommandInfo`: the key spec.
fn set_info(handle: *mut raw::RedisModuleCommand, command: &Command) -> Result<(), String> {
    let Some(access) = command.key else {
        return Ok(());
    };
    // SAFETY: reading a function pointer the server set at module init.
    let Some(set) = (unsafe { raw::RedisModule_SetCommandInfo }) else {
        // Older than Redis 7.0: the legacy key position is all there is.
        return Ok(());
    };
    let mut key_specs = [key_spec(access), end_of_key_specs()];
    let info = raw::RedisModuleCommandInfo {
        version: &VERSION,
        summary: ptr::null(),
        complexity: ptr::null(),
        since: ptr::null(),
        history: ptr::null_mut(),
        tips: ptr::null(),
        arity: 0,
        key_specs: key_specs.as_mut_ptr(),
        args: ptr::null_mut(),
    };
    // SAFETY: `handle` is this module's command; every pointer in `info`
    // lives until the call returns (the server copies what it keeps), and
    // the key spec array ends with a zeroed element.
    let status = unsafe { set(handle, &info) };
    if status == raw::Status::Ok as c_int {
        Ok(())
    } else {
        Err(format!(
            "the server refused the key spec of {:?} (see the log)",
            command.name
        ))
    }
}

/// The struct sizes the server must step by: the server reads the arrays
/// with these, so a newer header's larger structs work on an older server.
static VERSION: raw::RedisModuleCommandInfoVersion = raw::RedisModuleCommandInfoVersion {
    version: 1,
    sizeof_historyentry: std::mem::size_of::<raw::RedisModuleCommandHistoryEntry>(),
    sizeof_keyspec: std::mem::size_of::<raw::RedisModuleCommandKeySpec>(),
    sizeof_arg: std::mem::size_of::<raw::RedisModuleCommandArg>(),
};
/// The one key, at argument 1.
fn key_spec(access: KeyAccess) -> raw::RedisModuleCommandKeySpec {
    raw::RedisModuleCommandKeySpec {
        notes: ptr::null(),
        flags: u64::from(access),
        begin_search_type: raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX,
        bs: raw::RedisModuleCommandKeySpec__bindgen_ty_1 {
            index: raw::RedisModuleCommandKeySpec__bindgen_ty_1__bindgen_ty_1 { pos: 1 },
        },
        find_keys_type: raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE,
        fk: raw::RedisModuleCommandKeySpec__bindgen_ty_2 {
            range: raw::RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_1 {
                lastkey: 0,
                keystep: 1,
                limit: 0,
            },
        },
    }
}

/// The element that ends a key spec array: begin search type 0.
fn end_of_key_specs() -> raw::RedisModuleCommandKeySpec {
    raw::RedisModuleCommandKeySpec {
        notes: ptr::null(),
        flags: 0,
        begin_search_type: raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INVALID,
        bs: raw::RedisModuleCommandKeySpec__bindgen_ty_1 {
            index: raw::RedisModuleCommandKeySpec__bindgen_ty_1__bindgen_ty_1 { pos: 0 },
        },
        find_keys_type: raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_OMITTED,
        fk: raw::RedisModuleCommandKeySpec__bindgen_ty_2 {
            range: raw::RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_1 {
                lastkey: 0,
                keystep: 0,
                limit: 0,
            },
        },
    }
}
