//! What the server knows about each command, as Redis's own modules declare
//! it: key specs (which ACL key permission a command needs, what
//! `COMMAND GETKEYSANDFLAGS` shows), the key at argument 1 that cluster
//! routing reads, `COMMAND DOCS`, ACL categories with the `fast` and
//! `blocking` flags they follow, and the module version in `MODULE LIST`.

use redis::{Connection, Value};

use crate::harness::{text, Call, Server, LONG};

/// An ACL user whose only key permission is `keys` (`%R~*`, `%W~*`), with
/// every command allowed: what it may do comes from the key specs alone.
fn connect_as(server: &Server, user: &str, keys: &str) -> Connection {
    let mut admin = server.conn();
    let reply: String = admin.value(&["ACL", "SETUSER", user, "on", ">pw", keys, "+@all"]);
    assert_eq!(reply, "OK");
    let mut c = server.conn();
    let reply: String = c.value(&["AUTH", user, "pw"]);
    assert_eq!(reply, "OK");
    c
}

/// Asserts that the server refused `args` for want of key permission.
fn assert_noperm(c: &mut Connection, args: &[&str]) {
    let err = c.err(args);
    assert!(err.starts_with("NOPERM"), "{args:?}: {err}");
}

/// The commands that change a lock, each with arguments that would change
/// `k` (held by alice, count 1) or take `free`, were they allowed.
const CHANGES: &[&[&str]] = &[
    &["LOCK.ACQUIRE", "free", "bob", "1000"],
    &["LOCK.ACQUIRE", "k", "alice", "1000"],
    &["LOCK.REENTER", "k", "alice"],
    &["LOCK.RELEASE", "k", "alice"],
    &["LOCK.RENEW", "k", "alice", "1000"],
    &["LOCK.FENCE", "k", "alice", "5"],
];

#[test]
fn a_read_only_user_can_read_a_lock_but_not_change_one() {
    let server = Server::start();
    let mut admin = server.conn();
    let fence = admin.acquire("k", "alice", LONG).expect("free");
    let mut reader = connect_as(&server, "reader", "%R~*");

    let info = reader.lock_info("k").expect("held");
    assert_eq!(info.held(), (b"alice".to_vec(), 1, fence));
    reader.nil(&["LOCK.INFO", "free"]);
    for args in CHANGES {
        assert_noperm(&mut reader, args);
    }
    assert_eq!(
        admin.lock_info("k").map(|info| info.held()),
        Some((b"alice".to_vec(), 1, fence))
    );
    assert_eq!(admin.int(&["EXISTS", "free"]), 0);
}

/// Write permission alone allows what needs nothing from the lock's value:
/// `LOCK.RENEW` sets the lease and replies 1, as `PEXPIRE` does for any key.
/// Every other command replies with the lock's owner, count or fence, so it
/// needs read permission as well (as `INCR` or `GETDEL` do).
#[test]
fn a_write_only_user_can_renew_a_lock_and_do_nothing_that_reads_one() {
    let server = Server::start();
    let mut admin = server.conn();
    let fence = admin.acquire("k", "alice", 1_000).expect("free");
    let mut writer = connect_as(&server, "writer", "%W~*");

    assert_eq!(
        writer.int(&["LOCK.RENEW", "k", "alice", &LONG.to_string()]),
        1
    );
    assert!(admin.pttl("k") > 1_000, "the renewal took effect");
    assert_noperm(&mut writer, &["LOCK.INFO", "k"]);
    for args in CHANGES.iter().filter(|args| args[0] != "LOCK.RENEW") {
        assert_noperm(&mut writer, args);
    }
    assert_eq!(
        admin.lock_info("k").map(|info| info.held()),
        Some((b"alice".to_vec(), 1, fence))
    );
    assert_eq!(admin.int(&["EXISTS", "free"]), 0);
}

/// A reply of name/value pairs (a RESP2 flat array or a RESP3 map).
fn pairs<'a>(what: &str, value: &'a Value) -> Vec<(String, &'a Value)> {
    match value {
        Value::Array(items) if items.len() % 2 == 0 => items
            .chunks(2)
            .map(|pair| (text(&pair[0]).unwrap_or_default(), &pair[1]))
            .collect(),
        Value::Map(items) => items
            .iter()
            .map(|(k, v)| (text(k).unwrap_or_default(), v))
            .collect(),
        other => panic!("{what}: not name/value pairs: {other:?}"),
    }
}

/// The value of field `name` among `pairs`.
fn field<'a>(what: &str, pairs: &[(String, &'a Value)], name: &str) -> &'a Value {
    pairs
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| *v)
        .unwrap_or_else(|| panic!("{what}: no field {name} in {pairs:?}"))
}

/// A string, an integer or an array of them, as text: `"1"`, `"[RO, access]"`.
fn show(value: &Value) -> String {
    match value {
        Value::Int(n) => n.to_string(),
        Value::Array(items) | Value::Set(items) => {
            let items: Vec<String> = items.iter().map(show).collect();
            format!("[{}]", items.join(", "))
        }
        other => text(other).unwrap_or_else(|| format!("{other:?}")),
    }
}

/// How one command's key must be described.
struct KeyAccess {
    name: &'static str,
    /// Arguments for `COMMAND GETKEYSANDFLAGS`, whose key is `mykey`.
    args: &'static [&'static str],
    /// The key spec's flags as the server shows them.
    flags: &'static [&'static str],
}

const KEY_ACCESS: &[KeyAccess] = &[
    KeyAccess {
        name: "lock.acquire",
        args: &["mykey", "alice", "1000", "WAIT", "0"],
        flags: &["RW", "access", "update"],
    },
    KeyAccess {
        name: "lock.reenter",
        args: &["mykey", "alice"],
        flags: &["RW", "access", "update"],
    },
    KeyAccess {
        name: "lock.release",
        args: &["mykey", "alice", "ALL"],
        flags: &["RW", "access", "delete"],
    },
    KeyAccess {
        name: "lock.renew",
        args: &["mykey", "alice", "1000"],
        flags: &["RW", "update"],
    },
    KeyAccess {
        name: "lock.fence",
        args: &["mykey", "alice", "5"],
        flags: &["RW", "access", "update"],
    },
    KeyAccess {
        name: "lock.info",
        args: &["mykey"],
        flags: &["RO", "access"],
    },
    KeyAccess {
        name: "lock.queue",
        args: &["mykey"],
        flags: &["RO", "access"],
    },
    // Replication's effect: it stores the master's decision whatever the
    // key held, as `SET` does.
    KeyAccess {
        name: "lock.apply",
        args: &["mykey", "alice", "1", "5"],
        flags: &["OW", "update"],
    },
];

#[test]
fn command_info_describes_each_key_with_the_access_its_command_needs() {
    let server = Server::start();
    let mut c = server.conn();
    for entry in KEY_ACCESS {
        let name = entry.name;
        let Ok(Value::Array(commands)) = c.call(&["COMMAND", "INFO", name]) else {
            panic!("COMMAND INFO {name}");
        };
        let Some(Value::Array(info)) = commands.first() else {
            panic!("COMMAND INFO {name}: {commands:?}");
        };
        // Cluster clients and the server's own routing read the legacy
        // first key, last key and step, which must stay argument 1.
        assert_eq!(show(&Value::Array(info[3..6].to_vec())), "[1, 1, 1]");
        let Value::Array(specs) = &info[8] else {
            panic!("COMMAND INFO {name}: key specs {:?}", info[8]);
        };
        assert_eq!(specs.len(), 1, "{name}: one key spec: {specs:?}");
        let spec = pairs(name, &specs[0]);
        let flags = field(name, &spec, "flags");
        assert_eq!(
            show(flags),
            format!("[{}]", entry.flags.join(", ")),
            "{name}"
        );
        let begin = pairs(name, field(name, &spec, "begin_search"));
        assert_eq!(show(field(name, &begin, "type")), "index", "{name}");
        let index = pairs(name, field(name, &begin, "spec"));
        assert_eq!(show(field(name, &index, "index")), "1", "{name}");
        let find = pairs(name, field(name, &spec, "find_keys"));
        assert_eq!(show(field(name, &find, "type")), "range", "{name}");
        let range = pairs(name, field(name, &find, "spec"));
        let range: Vec<String> = ["lastkey", "keystep", "limit"]
            .iter()
            .map(|f| show(field(name, &range, f)))
            .collect();
        assert_eq!(range, ["0", "1", "0"], "{name}: one key");

        let mut getkeys = vec!["COMMAND", "GETKEYSANDFLAGS", name];
        getkeys.extend_from_slice(entry.args);
        let keys = c.call(&getkeys[..]).expect("COMMAND GETKEYSANDFLAGS");
        assert_eq!(
            show(&keys),
            format!("[[mykey, [{}]]]", entry.flags.join(", ")),
            "COMMAND GETKEYSANDFLAGS {name}"
        );
    }
    // The fence counter's record names no key.
    let Ok(Value::Array(commands)) = c.call(&["COMMAND", "INFO", "lock.lastfence"]) else {
        panic!("COMMAND INFO lock.lastfence");
    };
    let Some(Value::Array(info)) = commands.first() else {
        panic!("COMMAND INFO lock.lastfence: {commands:?}");
    };
    assert_eq!(show(&Value::Array(info[3..6].to_vec())), "[0, 0, 0]");
    assert_eq!(show(&info[8]), "[]", "lock.lastfence: no key spec");
}

/// The server under test, for what differs between versions.
#[derive(Debug, PartialEq)]
enum Flavor {
    /// Redis 7.0: no display texts in `COMMAND DOCS`, no ACL categories
    /// for module commands.
    Redis70,
    /// Redis 7.2: ACL categories, but no module-added ones.
    Redis72,
    /// Redis 7.4+ and Valkey: module-added ACL categories too.
    Newer,
}

fn flavor(c: &mut Connection) -> Flavor {
    let info: String = c.value(&["INFO", "server"]);
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .map(|v| v.trim().to_string())
    };
    if field("valkey_version").is_some() {
        return Flavor::Newer;
    }
    let version = field("redis_version").expect("redis_version in INFO server");
    match version.split('.').take(2).collect::<Vec<_>>()[..] {
        ["7", "0"] => Flavor::Redis70,
        ["7", "2"] => Flavor::Redis72,
        _ => Flavor::Newer,
    }
}

/// How `COMMAND DOCS` must describe one command.
struct Docs {
    name: &'static str,
    /// Each argument as `name type`, then `token=WORD` and `optional`.
    args: &'static [&'static str],
}

const DOCS: &[Docs] = &[
    Docs {
        name: "lock.acquire",
        args: &[
            "key key",
            "owner string",
            "ttl-ms integer",
            "shared pure-token token=SHARED optional",
            "limit integer token=LIMIT optional",
            "permits integer token=PERMITS optional",
            "ephemeral pure-token token=EPHEMERAL optional",
            "timeout-ms integer token=WAIT optional",
        ],
    },
    Docs {
        name: "lock.macquire",
        args: &[
            "numkeys integer",
            "key key flags=[multiple]",
            "owner string",
            "ttl-ms integer",
            "shared pure-token token=SHARED optional",
            "limit integer token=LIMIT optional",
            "permits integer token=PERMITS optional",
            "ephemeral pure-token token=EPHEMERAL optional",
            "timeout-ms integer token=WAIT optional",
        ],
    },
    Docs {
        name: "lock.mrelease",
        args: &[
            "numkeys integer",
            "key key flags=[multiple]",
            "owner string",
            "all pure-token token=ALL optional",
        ],
    },
    Docs {
        name: "lock.mrenew",
        args: &[
            "numkeys integer",
            "key key flags=[multiple]",
            "owner string",
            "ttl-ms integer",
        ],
    },
    Docs {
        name: "lock.reenter",
        args: &["key key", "owner string", "ttl-ms integer optional"],
    },
    Docs {
        name: "lock.release",
        args: &[
            "key key",
            "owner string",
            "all pure-token token=ALL optional",
        ],
    },
    Docs {
        name: "lock.renew",
        args: &["key key", "owner string", "ttl-ms integer"],
    },
    Docs {
        name: "lock.fence",
        args: &["key key", "owner string", "min-fence integer"],
    },
    Docs {
        name: "lock.info",
        args: &["key key"],
    },
    Docs {
        name: "lock.queue",
        args: &["key key"],
    },
    Docs {
        name: "lock.apply",
        args: &[
            "key key",
            "owner string",
            "count integer",
            "fence integer",
            "unix-time-milliseconds unix-time token=PXAT optional",
        ],
    },
    Docs {
        name: "lock.lastfence",
        args: &["fence integer"],
    },
];

#[test]
fn command_docs_describe_every_command_and_its_arguments() {
    let server = Server::start();
    let mut c = server.conn();
    let with_display_texts = flavor(&mut c) != Flavor::Redis70;
    for docs in DOCS {
        let name = docs.name;
        let reply = c.call(&["COMMAND", "DOCS", name]).expect("COMMAND DOCS");
        let commands = pairs(name, &reply);
        let doc = pairs(name, field(name, &commands, name));
        let summary = show(field(name, &doc, "summary"));
        let internal = matches!(name, "lock.apply" | "lock.lastfence");
        assert_eq!(
            summary.starts_with("Internal:"),
            internal,
            "{name}: summary {summary:?}"
        );
        assert!(summary.len() > 20, "{name}: summary {summary:?}");
        assert_eq!(show(field(name, &doc, "since")), "0.1.0", "{name}");
        // Listing a lock's waiters takes a step per waiter; all else is O(1).
        let complexity = match name {
            "lock.queue" => "O(N) where N is the number of clients waiting on the lock",
            "lock.macquire" | "lock.mrelease" | "lock.mrenew" => {
                "O(N) where N is the number of keys"
            }
            _ => "O(1)",
        };
        assert_eq!(show(field(name, &doc, "complexity")), complexity, "{name}");
        assert_eq!(show(field(name, &doc, "group")), "module", "{name}");
        assert_eq!(show(field(name, &doc, "module")), "lock", "{name}");

        let Value::Array(args) = field(name, &doc, "arguments") else {
            panic!("{name}: arguments {doc:?}");
        };
        let mut shown = Vec::new();
        for arg in args {
            let arg = pairs(name, arg);
            let text = |f: &str| arg.iter().find(|(k, _)| k == f).map(|(_, v)| show(v));
            let arg_name = text("name").expect("an argument has a name");
            let kind = text("type").expect("an argument has a type");
            let mut line = format!("{arg_name} {kind}");
            if let Some(token) = text("token") {
                line.push_str(&format!(" token={token}"));
            }
            match text("flags").as_deref() {
                None => {}
                Some("[optional]") => line.push_str(" optional"),
                Some(other) => line.push_str(&format!(" flags={other}")),
            }
            // What redis-cli shows in its hints (Redis 7.2+): the name.
            let expected_display = with_display_texts.then(|| arg_name.clone());
            assert_eq!(text("display_text"), expected_display, "{name} {arg_name}");
            // A key argument points at the command's only key spec.
            let key_spec = text("key_spec_index");
            assert_eq!(key_spec.is_some(), kind == "key", "{name} {arg_name}");
            if let Some(index) = key_spec {
                assert_eq!(index, "0", "{name} {arg_name}");
            }
            shown.push(line);
        }
        assert_eq!(shown, docs.args, "{name}: arguments");
    }
}

/// The module's commands that `ACL CAT category` lists, sorted; `None`
/// when the server knows no such category.
fn listed(c: &mut Connection, category: &str) -> Option<Vec<String>> {
    match c.call(&["ACL", "CAT", category]) {
        Ok(value) => {
            let names: Vec<String> = redis::from_redis_value(value.clone()).expect("names");
            let mut ours: Vec<String> = names
                .into_iter()
                .filter(|name| name.starts_with("lock."))
                .collect();
            ours.sort();
            Some(ours)
        }
        Err(err) => {
            assert!(err.starts_with("ERR Unknown category"), "{err}");
            None
        }
    }
}

#[test]
fn acl_categories_hold_the_commands_where_the_server_lets_a_module_set_them() {
    let server = Server::start();
    let mut c = server.conn();
    let flavor = flavor(&mut c);
    let all = [
        "lock.acquire",
        "lock.apply",
        "lock.fence",
        "lock.info",
        "lock.lastfence",
        "lock.macquire",
        "lock.mrelease",
        "lock.mrenew",
        "lock.queue",
        "lock.reenter",
        "lock.release",
        "lock.renew",
    ];
    let but = |left_out: &[&str]| -> Option<Vec<String>> {
        Some(
            all.iter()
                .filter(|name| !left_out.contains(name))
                .map(|name| name.to_string())
                .collect(),
        )
    };
    let only = |names: &[&str]| Some(names.iter().map(|name| name.to_string()).collect());
    let none = Some(Vec::new());
    let (write, read, fast, slow, blocking, lock) = match flavor {
        // Redis 7.0 lets no module put a command in a category (that came
        // with RedisModule_SetCommandACLCategories in 7.2) and does not
        // derive any from the command's flags as it does for its own
        // commands: no category lists the module's commands.
        Flavor::Redis70 => (
            none.clone(),
            none.clone(),
            none.clone(),
            none.clone(),
            none,
            None,
        ),
        Flavor::Redis72 | Flavor::Newer => (
            but(&["lock.info", "lock.queue"]),
            only(&["lock.info", "lock.queue"]),
            // Blocking commands are not fast, as `BLMOVE` is not; nor are
            // those of several keys, as `MSET` is not.
            but(&[
                "lock.acquire",
                "lock.macquire",
                "lock.mrelease",
                "lock.mrenew",
            ]),
            only(&[
                "lock.acquire",
                "lock.macquire",
                "lock.mrelease",
                "lock.mrenew",
            ]),
            only(&["lock.acquire", "lock.macquire"]),
            // Redis 7.2 lets no module add a category of its own.
            (flavor == Flavor::Newer).then(|| but(&[]).expect("all")),
        ),
    };
    assert_eq!(listed(&mut c, "write"), write, "@write");
    assert_eq!(listed(&mut c, "read"), read, "@read");
    assert_eq!(listed(&mut c, "fast"), fast, "@fast");
    assert_eq!(listed(&mut c, "slow"), slow, "@slow");
    assert_eq!(listed(&mut c, "blocking"), blocking, "@blocking");
    assert_eq!(listed(&mut c, "lock"), lock, "@lock");

    // What a category grants: `+@read` runs LOCK.INFO where it lists it.
    let reply: String = c.value(&["ACL", "SETUSER", "reader", "on", ">pw", "~*", "+@read"]);
    assert_eq!(reply, "OK");
    let mut reader = server.conn();
    let reply: String = reader.value(&["AUTH", "reader", "pw"]);
    assert_eq!(reply, "OK");
    match (flavor, reader.call(&["LOCK.INFO", "k"])) {
        (Flavor::Redis70, Err(err)) => assert!(err.starts_with("NOPERM"), "{err}"),
        (Flavor::Redis72 | Flavor::Newer, Ok(Value::Nil)) => {}
        (flavor, reply) => panic!("{flavor:?}: LOCK.INFO as +@read: {reply:?}"),
    }
    assert!(reader
        .err(&["LOCK.ACQUIRE", "k", "o", "1000"])
        .starts_with("NOPERM"));
}

#[test]
fn only_lock_acquire_may_block_and_every_other_public_command_is_fast() {
    let server = Server::start();
    let mut c = server.conn();
    for (name, has, lacks) in [
        ("lock.acquire", "blocking", "fast"),
        ("lock.reenter", "fast", "blocking"),
        ("lock.release", "fast", "blocking"),
        ("lock.renew", "fast", "blocking"),
        ("lock.fence", "fast", "blocking"),
        ("lock.info", "fast", "blocking"),
        ("lock.queue", "fast", "blocking"),
    ] {
        let Ok(Value::Array(commands)) = c.call(&["COMMAND", "INFO", name]) else {
            panic!("COMMAND INFO {name}");
        };
        let Some(Value::Array(info)) = commands.first() else {
            panic!("COMMAND INFO {name}: {commands:?}");
        };
        let flags: Vec<String> = redis::from_redis_value(info[2].clone()).expect("flags");
        assert!(
            flags.iter().any(|f| f == has),
            "{name} lacks {has}: {flags:?}"
        );
        assert!(
            !flags.iter().any(|f| f == lacks),
            "{name} has {lacks}: {flags:?}"
        );
    }
}

/// The crate version as `MODULE LIST` should show it: major × 10000 +
/// minor × 100 + patch.
fn module_version() -> i64 {
    let version = env!("CARGO_PKG_VERSION");
    let core = version.split(['-', '+']).next().unwrap_or(version);
    let parts: Vec<i64> = core
        .split('.')
        .map(|part| part.parse().expect("a numeric version part"))
        .collect();
    let [major, minor, patch] = parts[..] else {
        panic!("crate version {version} is not major.minor.patch");
    };
    major * 10_000 + minor * 100 + patch
}

#[test]
fn module_list_shows_the_crate_version() {
    let server = Server::start();
    let mut c = server.conn();
    let Ok(Value::Array(modules)) = c.call(&["MODULE", "LIST"]) else {
        panic!("MODULE LIST");
    };
    // Redis 8 lists its built-in modules (vectorset) too.
    let module = modules
        .iter()
        .map(|module| pairs("MODULE LIST", module))
        .find(|module| show(field("MODULE LIST", module, "name")) == "lock")
        .unwrap_or_else(|| panic!("no module lock in {modules:?}"));
    assert_eq!(
        show(field("MODULE LIST", &module, "ver")),
        module_version().to_string(),
        "crate version {}",
        env!("CARGO_PKG_VERSION")
    );
}
