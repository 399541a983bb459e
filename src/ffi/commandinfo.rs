//! The command table: each command's name, flags, key, docs and ACL
//! categories, and its registration with the server.
//!
//! `RedisModule_CreateCommand` alone describes a key only by position, and
//! the server then assumes the command reads *and* writes it: an ACL user
//! with `%R~*` could not even run `LOCK.INFO`. So each command also gets a
//! key spec with the access it really has (`RedisModule_SetCommandInfo`,
//! Redis 7.0+), which `COMMAND INFO`, `COMMAND GETKEYSANDFLAGS` and the ACL
//! key permissions read; docs for `COMMAND DOCS`; and ACL categories
//! (`RedisModule_SetCommandACLCategories`, Redis 7.2+ and Valkey; on 7.0 the
//! module's commands belong to no category). The position given to
//! `CreateCommand` stays argument 1 either way, for cluster routing.

use std::ffi::CStr;
use std::io::ErrorKind;
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

/// The crate version that introduced each command.
const SINCE: &CStr = c"0.1.0";

/// The ACL category the module adds where the server allows it.
const CATEGORY: &CStr = c"lock";

/// One command as the server should know it.
pub struct Command {
    name: &'static CStr,
    /// `RedisModule_CreateCommand` flags.
    flags: &'static CStr,
    /// The key at argument 1, and what the command does with it.
    key: Option<KeyAccess>,
    /// The keys are `numkeys key [key ...]` from argument 1 on (a command
    /// for several locks), each used as `key` says.
    numkeys: bool,
    /// ACL categories, space-separated, without the module's own.
    categories: &'static str,
    summary: &'static CStr,
    complexity: &'static CStr,
    args: &'static [Arg],
}

/// One argument for `COMMAND DOCS`.
struct Arg {
    name: &'static CStr,
    kind: raw::RedisModuleCommandArgType,
    token: Option<&'static CStr>,
    optional: bool,
    multiple: bool,
}

impl Arg {
    const fn new(name: &'static CStr, kind: raw::RedisModuleCommandArgType) -> Arg {
        Arg {
            name,
            kind,
            token: None,
            optional: false,
            multiple: false,
        }
    }

    const fn key(name: &'static CStr) -> Arg {
        Arg::new(
            name,
            raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY,
        )
    }

    const fn string(name: &'static CStr) -> Arg {
        Arg::new(
            name,
            raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING,
        )
    }

    const fn integer(name: &'static CStr) -> Arg {
        Arg::new(
            name,
            raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER,
        )
    }

    const fn unix_time(name: &'static CStr) -> Arg {
        Arg::new(
            name,
            raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_UNIX_TIME,
        )
    }

    /// A word standing alone, such as `ALL`.
    const fn word(name: &'static CStr, token: &'static CStr) -> Arg {
        Arg {
            token: Some(token),
            ..Arg::new(
                name,
                raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN,
            )
        }
    }

    /// This argument after a word, such as `WAIT timeout-ms`.
    const fn after(self, token: &'static CStr) -> Arg {
        Arg {
            token: Some(token),
            ..self
        }
    }

    const fn optional(self) -> Arg {
        Arg {
            optional: true,
            ..self
        }
    }

    /// Given one or more times, such as the keys after `numkeys`.
    const fn multiple(self) -> Arg {
        Arg {
            multiple: true,
            ..self
        }
    }
}

const KEY: Arg = Arg::key(c"key");
const OWNER: Arg = Arg::string(c"owner");
const TTL: Arg = Arg::integer(c"ttl-ms");

pub const ACQUIRE: Command = Command {
    name: c"lock.acquire",
    // Blocking commands are not `fast`, even O(1) ones (`BLMOVE`): they
    // may hold the client for `timeout-ms`.
    flags: c"write deny-oom blocking",
    key: Some(UPDATE_AND_READ),
    numkeys: false,
    categories: "write slow blocking",
    summary: c"Takes a lock for ttl-ms milliseconds (SHARED: a read hold; LIMIT: one of n permits, PERMITS: k of them; \
        EPHEMERAL: ended when this connection closes), or reenters it if the owner holds it; \
        replies with the hold's fence, or nil. With WAIT, queues until the lock is handed over or timeout-ms passes.",
    complexity: c"O(1)",
    args: &[
        KEY,
        OWNER,
        TTL,
        // The options come in any order; LIMIT only with SHARED (the
        // command refuses it otherwise).
        Arg::word(c"shared", c"SHARED").optional(),
        Arg::integer(c"limit").after(c"LIMIT").optional(),
        Arg::integer(c"permits").after(c"PERMITS").optional(),
        Arg::word(c"ephemeral", c"EPHEMERAL").optional(),
        Arg::integer(c"timeout-ms").after(c"WAIT").optional(),
    ],
};

pub const REENTER: Command = Command {
    name: c"lock.reenter",
    flags: c"write deny-oom fast",
    key: Some(UPDATE_AND_READ),
    numkeys: false,
    categories: "write fast",
    summary:
        c"Adds 1 to the count of a lock the owner holds, and resets its lease to ttl-ms if given; \
        replies with the new count, NOTOWNER if the owner does not hold it.",
    complexity: c"O(1)",
    args: &[KEY, OWNER, TTL.optional()],
};

pub const RELEASE: Command = Command {
    name: c"lock.release",
    flags: c"write fast",
    key: Some(DELETE_AND_READ),
    numkeys: false,
    categories: "write fast",
    summary: c"Removes 1 from the count of a lock the owner holds (all with ALL); \
        replies with the count left. At 0 the lock is freed and handed to the longest waiter.",
    complexity: c"O(1)",
    args: &[KEY, OWNER, Arg::word(c"all", c"ALL").optional()],
};

pub const RENEW: Command = Command {
    name: c"lock.renew",
    flags: c"write fast",
    key: Some(UPDATE),
    numkeys: false,
    categories: "write fast",
    summary: c"Sets the lease of a lock the owner holds to ttl-ms from now; replies 1, \
        NOTOWNER if the owner does not hold it.",
    complexity: c"O(1)",
    args: &[KEY, OWNER, TTL],
};

pub const FENCE: Command = Command {
    name: c"lock.fence",
    flags: c"write fast",
    key: Some(UPDATE_AND_READ),
    numkeys: false,
    categories: "write fast",
    summary: c"Raises the fence of a lock the owner holds to at least min-fence, and every later fence above it; \
        replies with the hold's fence.",
    complexity: c"O(1)",
    args: &[KEY, OWNER, Arg::integer(c"min-fence")],
};

const NUMKEYS: Arg = Arg::integer(c"numkeys");
const KEYS: Arg = Arg::key(c"key").multiple();

pub const MACQUIRE: Command = Command {
    name: c"lock.macquire",
    // `getkeys-api`: see `ffi::keys_asked`.
    flags: c"write deny-oom blocking getkeys-api",
    key: Some(UPDATE_AND_READ),
    numkeys: true,
    categories: "write slow blocking",
    summary: c"Takes a lock on every key for ttl-ms milliseconds, all or none, in one step (options as LOCK.ACQUIRE); \
        replies with the fences in the order of the keys, or nil. With WAIT, queues on every key as one request, \
        first come first served across them, until all are granted together or timeout-ms passes.",
    complexity: c"O(N) where N is the number of keys",
    args: &[
        NUMKEYS,
        KEYS,
        OWNER,
        TTL,
        Arg::word(c"shared", c"SHARED").optional(),
        Arg::integer(c"limit").after(c"LIMIT").optional(),
        Arg::integer(c"permits").after(c"PERMITS").optional(),
        Arg::word(c"ephemeral", c"EPHEMERAL").optional(),
        Arg::integer(c"timeout-ms").after(c"WAIT").optional(),
    ],
};

pub const MRELEASE: Command = Command {
    name: c"lock.mrelease",
    flags: c"write getkeys-api",
    key: Some(DELETE_AND_READ),
    numkeys: true,
    categories: "write slow",
    summary: c"Releases a lock the owner holds on every key (to 0 with ALL), all or none; \
        replies with the counts left in the order of the keys, NOTOWNER (and nothing changes) if it does not hold one.",
    complexity: c"O(N) where N is the number of keys",
    args: &[NUMKEYS, KEYS, OWNER, Arg::word(c"all", c"ALL").optional()],
};

pub const MRENEW: Command = Command {
    name: c"lock.mrenew",
    flags: c"write getkeys-api",
    key: Some(UPDATE),
    numkeys: true,
    categories: "write slow",
    summary: c"Sets the lease of the owner's lock on every key to ttl-ms from now, all or none; replies 1, \
        NOTOWNER (and nothing changes) if it does not hold one.",
    complexity: c"O(N) where N is the number of keys",
    args: &[NUMKEYS, KEYS, OWNER, TTL],
};

pub const INFO: Command = Command {
    name: c"lock.info",
    flags: c"readonly fast",
    key: Some(READ),
    numkeys: false,
    categories: "read fast",
    summary:
        c"Replies with a held lock's owner, count, fence, ttl and waiters; nil if the lock is free.",
    complexity: c"O(1)",
    args: &[KEY],
};

pub const QUEUE: Command = Command {
    name: c"lock.queue",
    flags: c"readonly fast",
    key: Some(READ),
    numkeys: false,
    categories: "read fast",
    summary:
        c"Replies with the clients waiting on a lock, first in line first: each one's client id, \
        owner, mode, ms waited so far and ms left before its timeout.",
    complexity: c"O(N) where N is the number of clients waiting on the lock",
    args: &[KEY],
};

pub const APPLY: Command = Command {
    name: c"lock.apply",
    flags: c"write fast",
    key: Some(OVERWRITE),
    numkeys: false,
    categories: "write fast",
    summary: c"Internal: a lock's state as the master decided it, sent to replicas and the AOF. \
        Refused to clients.",
    complexity: c"O(1)",
    args: &[
        KEY,
        OWNER,
        Arg::integer(c"count"),
        Arg::integer(c"fence"),
        Arg::unix_time(c"unix-time-milliseconds")
            .after(c"PXAT")
            .optional(),
    ],
};

pub const LAST_FENCE: Command = Command {
    name: c"lock.lastfence",
    flags: c"write fast",
    key: None,
    numkeys: false,
    categories: "write fast",
    summary: c"Internal: the fence counter, written to the AOF so a rewrite keeps it. Refused to clients.",
    complexity: c"O(1)",
    args: &[Arg::integer(c"fence")],
};

/// A command handler as the server calls it.
pub type Handler =
    extern "C" fn(*mut raw::RedisModuleCtx, *mut *mut raw::RedisModuleString, c_int) -> c_int;

/// Adds the module's ACL category, `@lock`, where the server lets a module
/// add one (Redis 7.4+, Valkey 8). True if it exists now: another module
/// may have added it first, and commands of any module may join it.
pub fn add_category(ctx: &Context) -> bool {
    // SAFETY: module load (the only time the server allows it), with its
    // context; the name is a static C string.
    let status =
        unsafe { raw::RedisModule_AddACLCategory.map(|add| add(ctx.ctx, CATEGORY.as_ptr())) };
    match status {
        None => false,
        Some(status) if status == raw::Status::Ok as c_int => true,
        Some(_) => std::io::Error::last_os_error().kind() == ErrorKind::ResourceBusy,
    }
}

/// Registers `command` with `handler`, then tells the server its key spec,
/// docs and ACL categories (`@lock` too if `category`) where it can take
/// them.
pub fn register(
    ctx: &Context,
    command: &Command,
    handler: Handler,
    category: bool,
) -> Result<(), String> {
    let name = command.name;
    // Keys after `numkeys` have no fixed range: the key spec finds them
    // (the server then marks the command as having movable keys).
    let position = if command.key.is_some() && !command.numkeys {
        1
    } else {
        0
    };
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
    set_info(handle, command)?;
    set_categories(handle, command, category)
}

/// `RedisModule_SetCommandInfo`: key spec and docs.
fn set_info(handle: *mut raw::RedisModuleCommand, command: &Command) -> Result<(), String> {
    // SAFETY: reading a function pointer the server set at module init.
    let Some(set) = (unsafe { raw::RedisModule_SetCommandInfo }) else {
        // Older than Redis 7.0: the legacy key position is all there is.
        return Ok(());
    };
    let mut key_specs: Vec<raw::RedisModuleCommandKeySpec> = command
        .key
        .map(|access| key_spec(access, command.numkeys))
        .into_iter()
        .chain([end_of_key_specs()])
        .collect();
    let mut args = arg_rows(command.args);
    let info = raw::RedisModuleCommandInfo {
        version: &VERSION,
        summary: command.summary.as_ptr(),
        complexity: command.complexity.as_ptr(),
        since: SINCE.as_ptr(),
        history: ptr::null_mut(),
        tips: ptr::null(),
        // 0: the module checks the number of arguments itself, after the
        // ACL, and inside MULTI at EXEC time, as it always has.
        arity: 0,
        key_specs: if command.key.is_some() {
            key_specs.as_mut_ptr()
        } else {
            ptr::null_mut()
        },
        args: args.as_mut_ptr(),
    };
    // SAFETY: `handle` is this module's command; every pointer in `info`
    // lives until the call returns (the server copies what it keeps), and
    // each array ends with a zeroed element.
    let status = unsafe { set(handle, &info) };
    if status == raw::Status::Ok as c_int {
        Ok(())
    } else {
        Err(format!(
            "the server refused the key spec and docs of {:?} (see the log)",
            command.name
        ))
    }
}

/// `RedisModule_SetCommandACLCategories`, where the server has it.
fn set_categories(
    handle: *mut raw::RedisModuleCommand,
    command: &Command,
    category: bool,
) -> Result<(), String> {
    // SAFETY: reading a function pointer the server set at module init.
    let Some(set) = (unsafe { raw::RedisModule_SetCommandACLCategories }) else {
        return Ok(());
    };
    let mut categories = command.categories.to_string();
    if category {
        categories.push(' ');
        categories.push_str(&CATEGORY.to_string_lossy());
    }
    let categories = std::ffi::CString::new(categories)
        .map_err(|_| format!("a NUL in the ACL categories of {:?}", command.name))?;
    // SAFETY: `handle` is this module's command, during module load; the
    // server copies what it needs from the string.
    let status = unsafe { set(handle, categories.as_ptr()) };
    if status == raw::Status::Ok as c_int {
        Ok(())
    } else {
        Err(format!(
            "the server refused the ACL categories {categories:?} of {:?}",
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

/// The one key, at argument 1; or with `numkeys`, the count at argument 1
/// and that many keys after it.
fn key_spec(access: KeyAccess, numkeys: bool) -> raw::RedisModuleCommandKeySpec {
    if numkeys {
        return raw::RedisModuleCommandKeySpec {
            notes: ptr::null(),
            flags: u64::from(access),
            begin_search_type: raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX,
            bs: raw::RedisModuleCommandKeySpec__bindgen_ty_1 {
                index: raw::RedisModuleCommandKeySpec__bindgen_ty_1__bindgen_ty_1 { pos: 1 },
            },
            find_keys_type: raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_KEYNUM,
            fk: raw::RedisModuleCommandKeySpec__bindgen_ty_2 {
                keynum: raw::RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_2 {
                    keynumidx: 0,
                    firstkey: 1,
                    keystep: 1,
                },
            },
        };
    }
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

/// [`Arg`]s as the C array the server reads, ending with a zeroed element.
fn arg_rows(args: &[Arg]) -> Vec<raw::RedisModuleCommandArg> {
    let row = |arg: &Arg| {
        let is_key = arg.kind == raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY;
        raw::RedisModuleCommandArg {
            name: arg.name.as_ptr(),
            type_: arg.kind,
            // The key is described by key spec 0, the command's only one.
            key_spec_index: if is_key { 0 } else { -1 },
            token: arg.token.map_or(ptr::null(), CStr::as_ptr),
            summary: ptr::null(),
            since: ptr::null(),
            flags: (if arg.optional {
                raw::REDISMODULE_CMD_ARG_OPTIONAL as c_int
            } else {
                raw::REDISMODULE_CMD_ARG_NONE as c_int
            }) | if arg.multiple {
                raw::REDISMODULE_CMD_ARG_MULTIPLE as c_int
            } else {
                0
            },
            deprecated_since: ptr::null(),
            subargs: ptr::null_mut(),
            // Redis 7.2+ shows the name where this is null.
            display_text: ptr::null(),
        }
    };
    let end = raw::RedisModuleCommandArg {
        name: ptr::null(),
        type_: 0,
        key_spec_index: 0,
        token: ptr::null(),
        summary: ptr::null(),
        since: ptr::null(),
        flags: 0,
        deprecated_since: ptr::null(),
        subargs: ptr::null_mut(),
        display_text: ptr::null(),
    };
    args.iter().map(row).chain([end]).collect()
}
