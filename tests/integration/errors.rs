//! Bad input (the order of checks). Checks answer in this order: too few arguments, an
//! argument past the grammar, a bad ttl-ms, a bad owner, another type, not the
//! owner. Each test below sends input that fails several checks and expects
//! the earliest one's error; every refusal is checked to change nothing.
//!
//! Also here: the command table (key at position 1, flags), `deny-oom`, and the
//! internal `LOCK.APPLY` being closed to clients. A read-only replica refusing
//! writes is in `replication`.

use redis::{Connection, Value};

use crate::harness::{text, Call, Hold, Server, LONG};

const ARITY: &str = "ERR wrong number of arguments for";
const SYNTAX: &str = "ERR syntax error";
const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

/// 2^40, the largest ttl-ms.
const MAX_TTL: i64 = 1 << 40;

/// The keys of a [`Fixture`].
const KEYS: [&str; 4] = ["k", "s", "l", "free"];

/// A server with a lock `k` held by `alice` (count 2), a string `s`, a list
/// `l`, and no key `free`.
struct Fixture {
    server: Server,
    c: Connection,
}

/// What a refusal must leave as it was.
#[derive(Debug, PartialEq)]
struct State {
    digest: String,
    keys: i64,
    types: Vec<String>,
    /// Lease ends: `DEBUG DIGEST` sees only whether a key has a TTL.
    expire_times: Vec<i64>,
    k: Option<Hold>,
    s: String,
    counters: Vec<i64>,
}

impl Fixture {
    fn new() -> Fixture {
        let server = Server::start();
        let mut c = server.conn();
        c.acquire("k", "alice", LONG).expect("free");
        c.acquire("k", "alice", LONG).expect("reentry");
        c.value::<String, _>(&["SET", "s", "v"]);
        c.int(&["RPUSH", "l", "x"]);
        Fixture { server, c }
    }

    fn state(&mut self) -> State {
        State {
            digest: self.server.digest(),
            keys: self.c.int(&["DBSIZE"]),
            types: KEYS
                .iter()
                .map(|key| self.c.value(&["TYPE", key]))
                .collect(),
            expire_times: KEYS
                .iter()
                .map(|key| self.c.int(&["PEXPIRETIME", key]))
                .collect(),
            k: self.c.lock_info("k").map(|info| info.held()),
            s: self.c.value(&["GET", "s"]),
            counters: [
                "lock_held",
                "lock_acquired",
                "lock_reentered",
                "lock_released",
                "lock_renewed",
                "lock_last_fence",
            ]
            .iter()
            .map(|name| self.server.info_int("lock", name))
            .collect(),
        }
    }

    /// Sends `args`, expects an error starting with `prefix` and mentioning
    /// `mention`, and that nothing changed; returns the error.
    fn refused(&mut self, args: &[&str], prefix: &str, mention: &str) -> String {
        let before = self.state();
        let err = self.c.err(args);
        assert!(
            err.starts_with(prefix) && err.contains(mention),
            "{args:?}: expected {prefix:?} mentioning {mention:?}, got {err:?}"
        );
        assert_eq!(self.state(), before, "{args:?} changed state");
        err
    }
}

#[test]
fn too_few_arguments_get_the_standard_arity_error() {
    let mut f = Fixture::new();
    let cases: &[(&str, &[&str])] = &[
        ("lock.acquire", &[]),
        ("lock.acquire", &["k"]),
        ("lock.acquire", &["k", "alice"]),
        // Arity answers first even when what is there is bad too.
        ("lock.acquire", &["s", ""]),
        ("lock.reenter", &[]),
        ("lock.reenter", &["s"]),
        ("lock.release", &[]),
        ("lock.release", &["k"]),
        ("lock.renew", &[]),
        ("lock.renew", &["k"]),
        ("lock.renew", &["s", ""]),
        ("lock.info", &[]),
        ("lock.queue", &[]),
    ];
    for (name, rest) in cases {
        let upper = name.to_uppercase();
        let args: Vec<&str> = std::iter::once(upper.as_str())
            .chain(rest.iter().copied())
            .collect();
        let expected = format!("{ARITY} '{name}' command");
        assert_eq!(f.refused(&args, &expected, ""), expected, "{args:?}");
    }
}

#[test]
fn arguments_past_the_grammar_are_a_syntax_error() {
    let mut f = Fixture::new();
    for args in [
        &["LOCK.ACQUIRE", "k", "alice", "1000", "extra"][..],
        &["LOCK.ACQUIRE", "k", "alice", "1000", "FOO", "5"],
        &["LOCK.ACQUIRE", "k", "alice", "1000", "ALL"],
        &["LOCK.ACQUIRE", "free", "alice", "1000", "PX", "5"],
        &["LOCK.REENTER", "k", "alice", "1000", "extra"],
        &["LOCK.REENTER", "k", "alice", "1000", "1000"],
        &["LOCK.RELEASE", "k", "alice", "extra"],
        &["LOCK.RELEASE", "k", "alice", "1"],
        &["LOCK.RELEASE", "k", "alice", "ALL", "extra"],
        &["LOCK.RELEASE", "k", "alice", "ALL", "ALL"],
        &["LOCK.RENEW", "k", "alice", "1000", "extra"],
        &["LOCK.INFO", "k", "extra"],
        &["LOCK.INFO", "free", "free"],
        &["LOCK.QUEUE", "k", "extra"],
    ] {
        assert_eq!(f.refused(args, SYNTAX, ""), SYNTAX, "{args:?}");
    }
}

#[test]
fn syntax_error_answers_before_bad_ttl_owner_type_or_ownership() {
    let mut f = Fixture::new();
    for args in [
        &["LOCK.ACQUIRE", "k", "alice", "abc", "extra"][..],
        &["LOCK.ACQUIRE", "k", "alice", "0", "extra"],
        &["LOCK.ACQUIRE", "free", "", "1000", "extra"],
        &["LOCK.ACQUIRE", "s", "alice", "1000", "extra"],
        &["LOCK.REENTER", "k", "", "-5", "extra"],
        &["LOCK.REENTER", "k", "bob", "1000", "extra"],
        &["LOCK.RELEASE", "s", "", "FOO"],
        &["LOCK.RELEASE", "k", "bob", "FOO"],
        &["LOCK.RENEW", "k", "alice", "0", "extra"],
        &["LOCK.RENEW", "l", "bob", "1000", "extra"],
        &["LOCK.INFO", "s", "extra"],
    ] {
        f.refused(args, SYNTAX, "");
    }
}

#[test]
fn ttl_must_be_an_integer_from_1_to_2_pow_40() {
    let mut f = Fixture::new();
    let too_big = (MAX_TTL + 1).to_string();
    let bad = [
        "0",
        "-1",
        "-1000",
        too_big.as_str(),
        "9223372036854775807",
        "9223372036854775808",
        "-9223372036854775809",
        "99999999999999999999999",
        "abc",
        "",
        "1.5",
        "1e3",
        "10ms",
        "0x10",
        " 1",
    ];
    for ttl in bad {
        for args in [
            &["LOCK.ACQUIRE", "free", "alice", ttl][..],
            &["LOCK.ACQUIRE", "k", "alice", ttl],
            &["LOCK.REENTER", "k", "alice", ttl],
            &["LOCK.RENEW", "k", "alice", ttl],
        ] {
            f.refused(args, "ERR", "ttl-ms");
        }
    }

    // The bounds themselves are accepted.
    let max = MAX_TTL.to_string();
    let c = &mut f.c;
    c.acquire("max", "alice", MAX_TTL)
        .expect("ttl 2^40 accepted");
    assert!(c.pttl("max") > MAX_TTL - 60_000, "lease of 2^40 ms");
    assert_eq!(c.int(&["LOCK.REENTER", "max", "alice", &max]), 2);
    assert_eq!(c.int(&["LOCK.RENEW", "max", "alice", &max]), 1);
    assert!(c.pttl("max") > MAX_TTL - 60_000, "lease of 2^40 ms");
    assert!(c.acquire("one", "alice", 1).is_some(), "ttl 1 accepted");
    assert_eq!(c.int(&["LOCK.RENEW", "k", "alice", "1"]), 1);
}

#[test]
fn ttl_is_checked_before_owner_type_and_ownership() {
    let mut f = Fixture::new();
    let long_owner = "o".repeat(1025);
    for args in [
        &["LOCK.ACQUIRE", "free", "", "0"][..],
        &["LOCK.ACQUIRE", "free", &long_owner, "abc"],
        &["LOCK.ACQUIRE", "s", "alice", "0"],
        &["LOCK.ACQUIRE", "s", "", "-1"],
        &["LOCK.REENTER", "free", "", "0"],
        &["LOCK.REENTER", "free", "alice", "0"],
        &["LOCK.REENTER", "l", "alice", "x"],
        &["LOCK.RENEW", "k", "bob", "0"],
        &["LOCK.RENEW", "s", "", "abc"],
        &["LOCK.RENEW", "free", "alice", "1099511627777"],
    ] {
        f.refused(args, "ERR", "ttl-ms");
    }
}

#[test]
fn owner_must_be_1_to_1024_bytes() {
    let mut f = Fixture::new();
    let too_long = "o".repeat(1025);
    for owner in ["", too_long.as_str()] {
        for args in [
            &["LOCK.ACQUIRE", "free", owner, "1000"][..],
            &["LOCK.ACQUIRE", "k", owner, "1000"],
            &["LOCK.REENTER", "k", owner],
            &["LOCK.REENTER", "k", owner, "1000"],
            &["LOCK.RELEASE", "k", owner],
            &["LOCK.RELEASE", "k", owner, "ALL"],
            &["LOCK.RENEW", "k", owner, "1000"],
        ] {
            f.refused(args, "ERR", "owner");
        }
    }

    // 1024 bytes is a valid owner for every command.
    let longest = "o".repeat(1024);
    let c = &mut f.c;
    let fence = c.acquire("free", &longest, LONG).expect("1024-byte owner");
    let info = c.lock_info("free").expect("held");
    assert_eq!(info.owner, longest.as_bytes());
    assert_eq!(info.fence, fence);
    assert_eq!(c.int(&["LOCK.REENTER", "free", &longest]), 2);
    assert_eq!(c.int(&["LOCK.RENEW", "free", &longest, "1000"]), 1);
    assert_eq!(c.int(&["LOCK.RELEASE", "free", &longest, "ALL"]), 0);
}

#[test]
fn owner_is_checked_before_type_and_ownership() {
    let mut f = Fixture::new();
    let too_long = "o".repeat(1025);
    for args in [
        &["LOCK.ACQUIRE", "s", "", "1000"][..],
        &["LOCK.ACQUIRE", "l", &too_long, "1000"],
        &["LOCK.REENTER", "s", ""],
        &["LOCK.REENTER", "free", ""],
        &["LOCK.RELEASE", "s", ""],
        &["LOCK.RELEASE", "free", &too_long],
        &["LOCK.RENEW", "l", "", "1000"],
        &["LOCK.RENEW", "free", &too_long, "1000"],
    ] {
        f.refused(args, "ERR", "owner");
    }
}

#[test]
fn a_key_of_another_type_is_wrongtype_before_any_ownership_check() {
    let mut f = Fixture::new();
    for key in ["s", "l"] {
        for args in [
            &["LOCK.ACQUIRE", key, "alice", "1000"][..],
            &["LOCK.REENTER", key, "alice"],
            &["LOCK.REENTER", key, "alice", "1000"],
            &["LOCK.RELEASE", key, "alice"],
            &["LOCK.RELEASE", key, "alice", "ALL"],
            &["LOCK.RENEW", key, "alice", "1000"],
            &["LOCK.INFO", key],
        ] {
            assert_eq!(f.refused(args, WRONGTYPE, ""), WRONGTYPE, "{args:?}");
        }
    }
    assert_eq!(f.c.value::<String, _>(&["TYPE", "s"]), "string");
    assert_eq!(f.c.pttl("s"), -1, "the string keeps having no TTL");
    assert_eq!(
        f.c.value::<Vec<String>, _>(&["LRANGE", "l", "0", "-1"]),
        ["x"]
    );
}

#[test]
fn notowner_refusals_change_nothing_but_the_notowner_counter() {
    let mut f = Fixture::new();
    let cases = [
        &["LOCK.REENTER", "k", "bob"][..],
        &["LOCK.REENTER", "k", "bob", "1000"],
        &["LOCK.RELEASE", "k", "bob"],
        &["LOCK.RELEASE", "k", "bob", "ALL"],
        &["LOCK.RENEW", "k", "bob", "1000"],
        &["LOCK.RELEASE", "free", "alice"],
        &["LOCK.RENEW", "free", "alice", "1000"],
        &["LOCK.REENTER", "free", "alice"],
    ];
    for args in cases {
        let notowner = f.server.info_int("lock", "lock_notowner");
        f.refused(args, "NOTOWNER", "");
        assert_eq!(
            f.server.info_int("lock", "lock_notowner"),
            notowner + 1,
            "{args:?}"
        );
    }
}

#[test]
fn acquire_and_reenter_are_refused_under_oom_while_release_and_renew_work() {
    let mut f = Fixture::new();
    f.c.value::<String, _>(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    f.c.value::<String, _>(&["CONFIG", "SET", "maxmemory", "1"]);
    for args in [
        &["LOCK.ACQUIRE", "free", "alice", "1000"][..],
        &["LOCK.ACQUIRE", "k", "alice", "1000"],
        &["LOCK.REENTER", "k", "alice"],
        &["LOCK.REENTER", "k", "alice", "1000"],
    ] {
        f.refused(args, "OOM", "");
    }
    let fence = f.c.lock_info("k").expect("held").fence;
    assert_eq!(f.c.int(&["LOCK.RENEW", "k", "alice", "5000"]), 1);
    assert!(f.c.pttl("k") <= 5_000, "RENEW applied under OOM");
    assert_eq!(f.c.int(&["LOCK.RELEASE", "k", "alice"]), 1);
    assert_eq!(
        f.c.lock_info("k")
            .expect("read-only LOCK.INFO works")
            .held(),
        (b"alice".to_vec(), 1, fence)
    );
    assert_eq!(f.c.int(&["LOCK.RELEASE", "k", "alice", "ALL"]), 0);

    f.c.value::<String, _>(&["CONFIG", "SET", "maxmemory", "0"]);
    assert!(f.c.acquire("free", "alice", LONG).is_some());
}

/// `COMMAND INFO name`: its flags and (first key, last key, step).
fn command_info(c: &mut Connection, name: &str) -> (Vec<String>, (i64, i64, i64)) {
    let Ok(Value::Array(commands)) = c.call(&["COMMAND", "INFO", name]) else {
        panic!("COMMAND INFO {name}");
    };
    let Some(Value::Array(fields)) = commands.first() else {
        panic!("COMMAND INFO {name}: unknown command: {commands:?}");
    };
    let Value::Array(flags) = &fields[2] else {
        panic!("COMMAND INFO {name}: flags {:?}", fields[2]);
    };
    let flags = flags.iter().filter_map(text).collect();
    let int = |v: &Value| match v {
        Value::Int(n) => *n,
        other => panic!("COMMAND INFO {name}: {other:?}"),
    };
    (flags, (int(&fields[3]), int(&fields[4]), int(&fields[5])))
}

/// How the command table must list one command.
struct TableEntry {
    name: &'static str,
    /// Arguments for `COMMAND GETKEYS`, whose key is `mykey`.
    args: &'static [&'static str],
    has: &'static [&'static str],
    lacks: &'static [&'static str],
}

#[test]
fn command_table_names_the_key_at_position_1_with_the_documented_flags() {
    let server = Server::start();
    let mut c = server.conn();
    let entries = [
        TableEntry {
            name: "lock.acquire",
            args: &["mykey", "alice", "1000"],
            has: &["write", "denyoom"],
            lacks: &["readonly"],
        },
        TableEntry {
            name: "lock.reenter",
            args: &["mykey", "alice"],
            has: &["write", "denyoom"],
            lacks: &["readonly"],
        },
        TableEntry {
            name: "lock.release",
            args: &["mykey", "alice", "ALL"],
            has: &["write"],
            lacks: &["denyoom", "readonly"],
        },
        TableEntry {
            name: "lock.renew",
            args: &["mykey", "alice", "1000"],
            has: &["write"],
            lacks: &["denyoom", "readonly"],
        },
        TableEntry {
            name: "lock.info",
            args: &["mykey"],
            has: &["readonly", "fast"],
            lacks: &["write", "denyoom"],
        },
    ];
    for entry in entries {
        let name = entry.name;
        let (flags, keys) = command_info(&mut c, name);
        assert_eq!(keys, (1, 1, 1), "{name}: first key, last key, step");
        for flag in entry.has {
            assert!(
                flags.iter().any(|f| f == flag),
                "{name} lacks {flag}: {flags:?}"
            );
        }
        for flag in entry.lacks {
            assert!(
                !flags.iter().any(|f| f == flag),
                "{name} has {flag}: {flags:?}"
            );
        }
        let mut getkeys = vec!["COMMAND", "GETKEYS", name];
        getkeys.extend_from_slice(entry.args);
        let keys: Vec<String> = c.value(&getkeys[..]);
        assert_eq!(keys, ["mykey"], "COMMAND GETKEYS {name}");
    }
}

#[test]
fn clients_cannot_forge_a_lock_or_the_counter_with_the_internal_commands() {
    let mut f = Fixture::new();
    let future = (crate::harness::now_ms() + LONG).to_string();
    // A fence far above anything issued: if it were adopted, last_fence shows it.
    let forged = (1_i64 << 62).to_string();
    for args in [
        &["LOCK.APPLY", "free", "mallory", "1", &forged][..],
        &[
            "LOCK.APPLY",
            "free",
            "mallory",
            "1",
            &forged,
            "PXAT",
            &future,
        ],
        &["LOCK.APPLY", "k", "mallory", "1", &forged, "PXAT", &future],
        &["LOCK.APPLY", "k", "alice", "5", &forged],
        &["LOCK.APPLY", "k", "alice", "0", "0"],
        &["LOCK.APPLY", "free"],
        &["LOCK.APPLY"],
        &["lock.apply", "free", "mallory", "1", &forged],
        &["LOCK.LASTFENCE", &forged],
        &["lock.lastfence", &forged],
        &["LOCK.LASTFENCE", "0"],
        &["LOCK.LASTFENCE"],
        &["LOCK.LASTFENCE", &forged, "1"],
    ] {
        f.refused(args, "ERR", "");
    }

    // Nor from a transaction or a script.
    let before = f.state();
    let c = &mut f.c;
    c.value::<String, _>(&["MULTI"]);
    let queued = c.call(&["LOCK.APPLY", "free", "mallory", "1", &forged]);
    let exec = c.call(&["EXEC"]);
    // Refused when queued (EXEC then aborts) or when run (EXEC reports it).
    assert!(
        queued.is_err() || exec.is_err(),
        "LOCK.APPLY in MULTI: queued {queued:?}, EXEC {exec:?}"
    );
    let script = "return redis.call('LOCK.APPLY', KEYS[1], 'mallory', '1', ARGV[1])";
    let eval = c.call(&["EVAL", script, "1", "free", &forged]);
    assert!(eval.is_err(), "LOCK.APPLY from a script: {eval:?}");
    let script = "return redis.call('LOCK.LASTFENCE', ARGV[1])";
    let eval = c.call(&["EVAL", script, "0", &forged]);
    assert!(eval.is_err(), "LOCK.LASTFENCE from a script: {eval:?}");
    assert_eq!(f.state(), before);
    assert_eq!(f.c.lock_info("free"), None);
}
