//! The module configs `lock.max-ttl` and `lock.quarantine` ("Configuration" in docs/operations.md,
//! and bad input).
//!
//! - Both are read and set like any server config: `CONFIG GET`/`CONFIG SET`
//!   at run time, and at start-up from `redis.conf` after `loadmodule`, from
//!   the command line, or with `MODULE LOADEX … CONFIG …`. The server checks
//!   ranges and words itself: a bad value gets its `CONFIG SET` error, and a
//!   server started with one refuses the module and exits.
//! - Changing either at run time starts no quarantine.
//! - `lock.max-ttl` caps the `ttl-ms` of every command that takes one, with
//!   an error that changes nothing; a `ttl-ms` equal to the cap is accepted,
//!   and lowering the cap leaves existing leases as they are.
//!
//! The quarantine itself (what `lock.max-ttl` turns on) is in `quarantine.rs`.

use std::fs;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use redis::{Connection, Value};

use crate::harness::{
    handed_fence, module_path, server_bin, text, wait_on, wait_until, Call, Hold, Server, LONG,
};

/// The error of a `ttl-ms` above the cap (bad input).
const ABOVE_MAX: &str = "ERR ttl-ms is above lock.max-ttl (CONFIG GET lock.max-ttl)";

/// 2^40, the largest `lock.max-ttl` (and `ttl-ms`).
const MAX_MS: i64 = 1 << 40;

/// `CONFIG GET name` → its one value.
fn config_get(c: &mut Connection, name: &str) -> String {
    let pairs: Vec<String> = c.value(&["CONFIG", "GET", name]);
    match pairs.as_slice() {
        [got, value] if got == name => value.clone(),
        other => panic!("CONFIG GET {name}: {other:?}"),
    }
}

/// `CONFIG SET name value`: `Ok(())` or the error text.
fn config_set(c: &mut Connection, name: &str, value: &str) -> Result<(), String> {
    match c.call(&["CONFIG", "SET", name, value]) {
        Ok(Value::Okay) => Ok(()),
        Ok(other) => panic!("CONFIG SET {name} {value}: {other:?}"),
        Err(err) => Err(err),
    }
}

/// Both configs, as `CONFIG GET lock.*` shows them: (max-ttl, quarantine).
fn configs(c: &mut Connection) -> (String, String) {
    (
        config_get(c, "lock.max-ttl"),
        config_get(c, "lock.quarantine"),
    )
}

#[test]
fn configs_have_defaults_and_are_set_at_run_time_within_their_range() {
    let server = Server::start();
    let mut c = server.conn();
    assert_eq!(configs(&mut c), ("0".into(), "always".into()), "defaults");
    // Both are module configs, listed under the module's name.
    let all: Vec<String> = c.value(&["CONFIG", "GET", "lock.*"]);
    assert_eq!(all.len(), 4, "CONFIG GET lock.*: {all:?}");

    for value in ["1", "60000", &MAX_MS.to_string(), "0", "2000"] {
        assert_eq!(config_set(&mut c, "lock.max-ttl", value), Ok(()));
        assert_eq!(config_get(&mut c, "lock.max-ttl"), value);
    }
    // Enum words are case-insensitive, as for the server's own enums; GET
    // answers in lower case.
    for (word, shown) in [
        ("never", "never"),
        ("PROMOTION", "promotion"),
        ("Always", "always"),
    ] {
        assert_eq!(config_set(&mut c, "lock.quarantine", word), Ok(()));
        assert_eq!(config_get(&mut c, "lock.quarantine"), shown);
    }

    // Out of range or not a number: the server's own error, naming the
    // config, and the value stays.
    for bad in ["-1", &(MAX_MS + 1).to_string(), "abc", "1.5", ""] {
        let err = config_set(&mut c, "lock.max-ttl", bad).expect_err(bad);
        assert!(
            err.starts_with("ERR CONFIG SET failed") && err.contains("'lock.max-ttl'"),
            "CONFIG SET lock.max-ttl {bad:?}: {err}"
        );
        assert_eq!(config_get(&mut c, "lock.max-ttl"), "2000", "after {bad:?}");
    }
    let err = config_set(&mut c, "lock.quarantine", "bogus").expect_err("bogus");
    assert!(
        err.starts_with("ERR CONFIG SET failed")
            && err.contains("'lock.quarantine'")
            && err.contains("always, promotion, never"),
        "CONFIG SET lock.quarantine bogus: {err}"
    );
    assert_eq!(config_get(&mut c, "lock.quarantine"), "always");

    // Turning the quarantine on at run time starts none: the configs apply
    // from the next start or promotion.
    assert_eq!(server.info_int("lock", "lock_quarantine_ms"), 0);
    assert!(c.acquire("fresh", "alice", 2_000).is_some(), "a free lock");
}

#[test]
fn configs_are_read_from_the_config_file_the_command_line_and_module_loadex() {
    let module = module_path();
    // redis.conf: `loadmodule`, then the module's configs.
    let from_file = Server::builder()
        .label("conf-file")
        .without_module()
        .config_file(&format!(
            "loadmodule {}\nlock.max-ttl 60000\nlock.quarantine promotion\n",
            module.display()
        ))
        .start();
    let mut c = from_file.conn();
    assert_eq!(configs(&mut c), ("60000".into(), "promotion".into()));
    // In force: the cap applies, and `promotion` started no quarantine.
    assert_eq!(c.err(&["LOCK.ACQUIRE", "k", "alice", "60001"]), ABOVE_MAX);
    assert_eq!(from_file.info_int("lock", "lock_quarantine_ms"), 0);
    assert!(c.acquire("k", "alice", 60_000).is_some());

    // The command line: `--lock.max-ttl 60000` after `--loadmodule`.
    let from_args = Server::builder()
        .label("command-line")
        .config("lock.max-ttl", 60_000)
        .config("lock.quarantine", "never")
        .start();
    let mut c = from_args.conn();
    assert_eq!(configs(&mut c), ("60000".into(), "never".into()));
    assert_eq!(c.err(&["LOCK.RENEW", "k", "alice", "60001"]), ABOVE_MAX);

    // MODULE LOADEX on a server started without the module. A bad value
    // refuses the module (the server's generic error; its log says why);
    // a good one loads it, and, being a load, starts a quarantine.
    let later = Server::builder()
        .label("loadex")
        .without_module()
        .config("enable-module-command", "yes")
        .start();
    let mut c = later.conn();
    let path = module.display().to_string();
    let err = c.err(&["MODULE", "LOADEX", &path, "CONFIG", "lock.max-ttl", "abc"]);
    assert!(err.starts_with("ERR Error loading the extension"), "{err}");
    // Redis 8 lists its built-in modules too: ours must not be among them.
    let modules: Vec<Vec<Value>> = c.value(&["MODULE", "LIST"]);
    let lock_loaded = modules.iter().any(|module| {
        module.chunks(2).any(|pair| {
            text(&pair[0]).as_deref() == Some("name") && text(&pair[1]).as_deref() == Some("lock")
        })
    });
    assert!(!lock_loaded, "the module is not loaded: {modules:?}");
    assert!(
        later
            .log()
            .contains("Issue during loading of configuration lock.max-ttl"),
        "the log names the bad config"
    );
    assert_eq!(
        c.call(&["MODULE", "LOADEX", &path, "CONFIG", "lock.max-ttl", "60000"]),
        Ok(Value::Okay)
    );
    assert_eq!(configs(&mut c), ("60000".into(), "always".into()));
    let left = later.info_int("lock", "lock_quarantine_ms");
    assert!(
        // max-ttl, plus the last ms of a lease granted at its start, plus
        // the rounding up to the next whole ms.
        (1..=60_002).contains(&left),
        "MODULE LOADEX with lock.max-ttl 60000 starts a quarantine: {left} ms left"
    );
    assert_eq!(c.acquire("k", "alice", 1_000), None, "quarantined");
}

/// Runs the server with `args` (listening on a unix socket only: it is not
/// meant to start) and returns its output once it exits; panics if it is
/// still running after a few seconds.
fn refused_start(name: &str, args: &[String]) -> String {
    let dir = std::env::temp_dir()
        .join("redislock-tests")
        .join(format!("refused-{name}-{}", std::process::id()));
    fs::create_dir_all(&dir).expect("create the test dir");
    let output = dir.join("output.log");
    let log = fs::File::create(&output).expect("create output.log");
    let mut child = Command::new(server_bin())
        .args(["--port", "0", "--save", "", "--logfile", ""])
        .arg("--unixsocket")
        .arg(dir.join("s.sock"))
        .arg("--dir")
        .arg(&dir)
        .args(args)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("clone output.log"))
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", server_bin()));
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().expect("poll the server") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the server started with {args:?}:\n{}",
                fs::read_to_string(&output).unwrap_or_default()
            );
        }
        thread::sleep(Duration::from_millis(5));
    };
    let printed = fs::read_to_string(&output).unwrap_or_default();
    let _ = fs::remove_dir_all(&dir);
    assert!(
        !status.success(),
        "{args:?}: exit status {status}\n{printed}"
    );
    printed
}

#[test]
fn server_started_with_an_invalid_config_value_refuses_the_module_and_exits() {
    let module = module_path().display().to_string();
    for (i, (name, value)) in [
        ("lock.max-ttl", "-1".to_string()),
        ("lock.max-ttl", (MAX_MS + 1).to_string()),
        ("lock.max-ttl", "abc".to_string()),
        ("lock.quarantine", "bogus".to_string()),
    ]
    .into_iter()
    .enumerate()
    {
        let args = [
            "--loadmodule".to_string(),
            module.clone(),
            format!("--{name}"),
            value.clone(),
        ];
        let printed = refused_start(&format!("bad-value-{i}"), &args);
        for expected in [
            format!("Issue during loading of configuration {name}"),
            "lock: invalid value for lock.max-ttl or lock.quarantine".to_string(),
            "Can't load module from".to_string(),
        ] {
            assert!(
                printed.contains(&expected),
                "--{name} {value}: no {expected:?} in:\n{printed}"
            );
        }
    }
    // A module config without the module: the server itself refuses it.
    let printed = refused_start(
        "no-module",
        &["--lock.max-ttl".to_string(), "2000".to_string()],
    );
    assert!(
        printed.contains("Module Configuration detected without loadmodule directive"),
        "{printed}"
    );
}

/// What a refused command must leave as it was: the hold, its lease end,
/// the number of keys, and the counters.
fn state(server: &Server, c: &mut Connection) -> (Hold, i64, i64, Vec<i64>) {
    let counters = [
        "lock_acquired",
        "lock_reentered",
        "lock_renewed",
        "lock_waiting",
    ]
    .iter()
    .map(|field| server.info_int("lock", field))
    .collect();
    (
        c.lock_info("held").expect("held").held(),
        c.int(&["PEXPIRETIME", "held"]),
        c.int(&["DBSIZE"]),
        counters,
    )
}

#[test]
fn ttl_above_max_ttl_is_refused_on_every_command_and_changes_nothing() {
    let server = Server::start();
    let mut c = server.conn();
    // Alice holds a lock with a long lease, taken before any cap.
    let fence = c.acquire("held", "alice", LONG).expect("free");
    assert_eq!(config_set(&mut c, "lock.max-ttl", "10000"), Ok(()));
    assert_eq!(server.info_int("lock", "lock_quarantine_ms"), 0);

    // Lowering the cap leaves her lease as it was.
    let info = c.lock_info("held").expect("held");
    assert!(info.ttl > 10_000, "the lease is kept: {} ms left", info.ttl);
    assert!(c.pttl("held") > 10_000);

    let before = state(&server, &mut c);
    assert_eq!(before.0, (b"alice".to_vec(), 1, fence));
    for args in [
        &["LOCK.ACQUIRE", "held", "alice", "10001"][..],
        &["LOCK.ACQUIRE", "held", "bob", "10001", "WAIT", "0"],
        &["LOCK.ACQUIRE", "free", "bob", "10001"],
        &["LOCK.ACQUIRE", "free", "bob", "10001", "WAIT", "100"],
        &["LOCK.REENTER", "held", "alice", "10001"],
        &["LOCK.RENEW", "held", "alice", "10001"],
        &["LOCK.RENEW", "held", "alice", &MAX_MS.to_string()],
        // The cap is checked right after the ttl's range, before the
        // timeout and the owner.
        &["LOCK.ACQUIRE", "free", "bob", "10001", "WAIT", "abc"],
        &["LOCK.ACQUIRE", "free", "", "10001"],
        &["LOCK.RENEW", "held", "", "10001"],
    ] {
        assert_eq!(c.err(args), ABOVE_MAX, "{args:?}");
        assert_eq!(state(&server, &mut c), before, "after {args:?}");
    }
    // Out of range is still the range error, not the cap's.
    let err = c.err(&["LOCK.ACQUIRE", "free", "bob", "0"]);
    assert!(err.starts_with("ERR ttl-ms must be an integer"), "{err}");

    // A ttl-ms equal to the cap is accepted everywhere.
    assert_eq!(c.int(&["LOCK.REENTER", "held", "alice", "10000"]), 2);
    assert!(c.pttl("held") <= 10_000, "the lease was reset to the cap");
    assert_eq!(c.acquire("held", "alice", 10_000), Some(fence), "reentry");
    assert_eq!(c.int(&["LOCK.RENEW", "held", "alice", "10000"]), 1);
    let free = c.acquire("free", "bob", 10_000).expect("free");
    assert!(free > fence);
    let waited = c.call(&["LOCK.ACQUIRE", "other", "bob", "10000", "WAIT", "100"]);
    assert!(
        matches!(waited, Ok(Value::Int(f)) if f > free),
        "{waited:?}"
    );
    for key in ["held", "free", "other"] {
        let left = c.pttl(key);
        assert!((1..=10_000).contains(&left), "{key}: PTTL {left}");
    }

    // No cap again: any ttl-ms in range.
    assert_eq!(config_set(&mut c, "lock.max-ttl", "0"), Ok(()));
    assert!(c.acquire("long", "carol", MAX_MS).is_some());
    assert_eq!(c.int(&["LOCK.RENEW", "held", "alice", "10001"]), 1);
    assert_eq!(c.int(&["LOCK.RELEASE", "held", "alice", "ALL"]), 0);
}

/// Lowering `lock.max-ttl` caps the lease of a client that was already
/// waiting when it is granted later: at most the cap in force at the grant
/// (the quarantine after a failover relies on no lease being longer).
#[test]
fn a_waiter_granted_after_max_ttl_was_lowered_gets_at_most_the_new_cap() {
    let server = Server::start();
    let mut c = server.conn();
    c.acquire("k", "alice", 60_000).expect("free");
    let bob = wait_on(server.conn(), "k", "bob", 3_600_000, 0);
    wait_until("bob waits", Duration::from_secs(5), || {
        c.lock_info("k").is_some_and(|info| info.waiters == 1)
    });
    config_set(&mut c, "lock.max-ttl", "1000").expect("lower the cap");
    assert_eq!(c.int(&["LOCK.RELEASE", "k", "alice"]), 0);
    let fence = handed_fence(bob, "bob");
    let info = c.lock_info("k").expect("bob holds k");
    assert_eq!((info.owner, info.fence), (b"bob".to_vec(), fence));
    let pttl = c.pttl("k");
    assert!(
        pttl > 0 && pttl <= 1000,
        "bob asked for an hour while the cap was lowered to 1000 ms; his lease is {pttl} ms"
    );
}
