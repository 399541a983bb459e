//! Every reply of the commands, the fencing rule
//! (fencing), and the corner cases the command reference decides: case-insensitive names
//! and `ALL`, binary-safe owners.

use std::time::Duration;

use redis::Value;

use crate::harness::{
    clock_floor, now_ms, text, wait_until, Call, Hold, LockInfo, Server, CLOCK_SHIFT, LONG,
};

/// A lease short enough to watch run out.
const SHORT: i64 = 30;

/// Waits until `key`'s lease has run out and the key is gone.
fn wait_for_expiry(c: &mut redis::Connection, key: &str) {
    wait_until(&format!("{key} expires"), Duration::from_secs(5), || {
        c.pttl(key) == -2
    });
}

/// What a refused command must leave as it was: the whole dataset, and the
/// lock's owner, count, fence and lease end (`DEBUG DIGEST` sees only whether
/// a key has a TTL, not its value).
fn state(server: &Server, c: &mut redis::Connection, key: &str) -> (String, Option<Hold>, i64) {
    let held = c.lock_info(key).map(|info| info.held());
    (server.digest(), held, c.int(&["PEXPIRETIME", key]))
}

#[test]
fn fresh_acquire_returns_the_clock_floor_fence() {
    let server = Server::start();
    let mut c = server.conn();
    let before = now_ms();
    let fence = c
        .acquire("k", "alice", LONG)
        .expect("a free lock is granted");
    let after = now_ms();
    // A fresh server has issued no fence, so max(last + 1, now × 2^10) is the
    // clock floor itself, taken during the call.
    assert_eq!(
        fence % (1 << CLOCK_SHIFT),
        0,
        "fence {fence} is not ms × 2^10"
    );
    assert!(
        (before..=after).contains(&(fence >> CLOCK_SHIFT)),
        "fence {fence} is ms {} outside the call [{before}, {after}]",
        fence >> CLOCK_SHIFT
    );
    assert!(fence < 1 << 53, "fence {fence} is not exact as a double");
    let info = c.lock_info("k").expect("held");
    assert_eq!(info.held(), (b"alice".to_vec(), 1, fence));
    assert_eq!(info.waiters, 0);
    assert!(info.ttl > LONG - 5_000 && info.ttl <= LONG, "{info:?}");
    let pttl = c.pttl("k");
    assert!(pttl > LONG - 5_000 && pttl <= LONG, "PTTL {pttl}");
}

#[test]
fn fence_is_at_least_the_clock_floor_at_every_call() {
    let server = Server::start();
    let mut c = server.conn();
    for i in 0..20 {
        let before = now_ms();
        let fence = c.acquire(&format!("k{i}"), "alice", LONG).expect("free");
        assert!(
            fence >= clock_floor(before),
            "fence {fence} below the clock floor {} of ms {before}",
            clock_floor(before)
        );
    }
}

#[test]
fn same_owner_reentry_returns_the_same_fence_and_resets_the_lease() {
    let server = Server::start();
    let mut c = server.conn();
    let fence = c.acquire("k", "alice", LONG).expect("free");

    // A shorter ttl shortens the lease: it is reset, not extended to the max.
    assert_eq!(c.acquire("k", "alice", 5_000), Some(fence));
    let info = c.lock_info("k").expect("held");
    assert_eq!(info.held(), (b"alice".to_vec(), 2, fence));
    let pttl = c.pttl("k");
    assert!(
        pttl > 4_000 && pttl <= 5_000,
        "PTTL {pttl} after reentry with 5000"
    );

    assert_eq!(c.acquire("k", "alice", LONG), Some(fence));
    assert_eq!(c.lock_info("k").expect("held").count, 3);
    assert!(c.pttl("k") > LONG - 5_000, "lease reset to LONG");
}

#[test]
fn other_owner_gets_nil_and_changes_nothing() {
    let server = Server::start();
    let mut c = server.conn();
    let fence = c.acquire("k", "alice", LONG).expect("free");
    let before = state(&server, &mut c, "k");

    assert_eq!(c.acquire("k", "bob", 5_000), None);
    assert_eq!(
        c.lock_info("k").expect("held").held(),
        (b"alice".to_vec(), 1, fence)
    );
    assert!(
        c.pttl("k") > LONG - 5_000,
        "bob's ttl must not touch the lease"
    );
    assert_eq!(state(&server, &mut c, "k"), before);
}

#[test]
fn reenter_counts_up_and_resets_the_lease_only_when_asked() {
    let server = Server::start();
    let mut c = server.conn();
    let fence = c.acquire("k", "alice", LONG).expect("free");

    assert_eq!(c.int(&["LOCK.REENTER", "k", "alice"]), 2);
    assert!(c.pttl("k") > LONG - 5_000, "no ttl: the lease is kept");

    assert_eq!(c.int(&["LOCK.REENTER", "k", "alice", "5000"]), 3);
    let pttl = c.pttl("k");
    assert!(
        pttl > 4_000 && pttl <= 5_000,
        "PTTL {pttl} after REENTER 5000"
    );

    assert_eq!(
        c.lock_info("k").expect("held").held(),
        (b"alice".to_vec(), 3, fence)
    );
}

#[test]
fn reenter_by_other_owner_is_refused() {
    let server = Server::start();
    let mut c = server.conn();
    let fence = c.acquire("k", "alice", LONG).expect("free");
    let before = state(&server, &mut c, "k");

    for args in [
        &["LOCK.REENTER", "k", "bob"][..],
        &["LOCK.REENTER", "k", "bob", "5000"],
    ] {
        let err = c.err(args);
        assert!(err.starts_with("NOTOWNER"), "{args:?}: {err}");
    }
    assert_eq!(
        c.lock_info("k").expect("held").held(),
        (b"alice".to_vec(), 1, fence)
    );
    assert_eq!(state(&server, &mut c, "k"), before);
}

#[test]
fn reenter_never_acquires_a_free_lock() {
    let server = Server::start();
    let mut c = server.conn();
    for args in [
        &["LOCK.REENTER", "k", "alice"][..],
        &["LOCK.REENTER", "k", "alice", "5000"],
    ] {
        let err = c.err(args);
        assert!(err.starts_with("NOTOWNER"), "{args:?}: {err}");
    }
    assert_eq!(c.int(&["EXISTS", "k"]), 0);
    assert_eq!(c.lock_info("k"), None);
}

#[test]
fn release_counts_down_and_frees_the_key_at_zero() {
    let server = Server::start();
    let mut c = server.conn();
    let fence = c.acquire("k", "alice", LONG).expect("free");
    c.acquire("k", "alice", LONG);
    c.acquire("k", "alice", LONG);

    assert_eq!(c.int(&["LOCK.RELEASE", "k", "alice"]), 2);
    assert_eq!(
        c.lock_info("k").expect("held").held(),
        (b"alice".to_vec(), 2, fence)
    );
    assert!(c.pttl("k") > 0, "the lease stays while held");
    assert_eq!(c.int(&["LOCK.RELEASE", "k", "alice"]), 1);
    assert_eq!(c.int(&["LOCK.RELEASE", "k", "alice"]), 0);
    assert_eq!(c.int(&["EXISTS", "k"]), 0, "a free lock has no key");
    assert_eq!(c.lock_info("k"), None);
}

#[test]
fn release_all_frees_the_lock_at_once() {
    let server = Server::start();
    let mut c = server.conn();
    for _ in 0..3 {
        c.acquire("k", "alice", LONG).expect("alice holds it");
    }
    assert_eq!(c.int(&["LOCK.RELEASE", "k", "alice", "ALL"]), 0);
    assert_eq!(c.int(&["EXISTS", "k"]), 0);
    // ALL on count 1 too.
    c.acquire("k", "alice", LONG).expect("free again");
    assert_eq!(c.int(&["LOCK.RELEASE", "k", "alice", "ALL"]), 0);
    assert_eq!(c.int(&["EXISTS", "k"]), 0);
}

#[test]
fn release_by_other_owner_is_refused() {
    let server = Server::start();
    let mut c = server.conn();
    let fence = c.acquire("k", "alice", LONG).expect("free");
    c.acquire("k", "alice", LONG);
    let before = state(&server, &mut c, "k");

    for args in [
        &["LOCK.RELEASE", "k", "bob"][..],
        &["LOCK.RELEASE", "k", "bob", "ALL"],
        // An owner that differs only by case or by a prefix is another owner.
        &["LOCK.RELEASE", "k", "Alice"],
        &["LOCK.RELEASE", "k", "alic"],
        &["LOCK.RELEASE", "k", "alice2"],
    ] {
        let err = c.err(args);
        assert!(err.starts_with("NOTOWNER"), "{args:?}: {err}");
    }
    assert_eq!(
        c.lock_info("k").expect("held").held(),
        (b"alice".to_vec(), 2, fence)
    );
    assert_eq!(state(&server, &mut c, "k"), before);
}

#[test]
fn release_of_a_free_lock_is_refused() {
    let server = Server::start();
    let mut c = server.conn();
    let err = c.err(&["LOCK.RELEASE", "k", "alice"]);
    assert!(err.starts_with("NOTOWNER"), "{err}");
    let err = c.err(&["LOCK.RELEASE", "k", "alice", "ALL"]);
    assert!(err.starts_with("NOTOWNER"), "{err}");
    assert_eq!(c.int(&["EXISTS", "k"]), 0);
}

#[test]
fn former_owner_is_refused_after_the_lease_ends() {
    let server = Server::start();
    let mut c = server.conn();
    c.acquire("k", "alice", SHORT).expect("free");
    c.acquire("k", "alice", SHORT).expect("reentry");
    wait_for_expiry(&mut c, "k");

    for args in [
        &["LOCK.RELEASE", "k", "alice"][..],
        &["LOCK.RELEASE", "k", "alice", "ALL"],
        &["LOCK.RENEW", "k", "alice", "5000"],
        &["LOCK.REENTER", "k", "alice"],
    ] {
        let err = c.err(args);
        assert!(err.starts_with("NOTOWNER"), "{args:?}: {err}");
    }
    assert_eq!(c.int(&["EXISTS", "k"]), 0);
    // Anyone may take it now.
    assert!(c.acquire("k", "bob", LONG).is_some());
}

#[test]
fn renew_resets_the_lease_and_keeps_count_and_fence() {
    let server = Server::start();
    let mut c = server.conn();
    let fence = c.acquire("k", "alice", LONG).expect("free");
    c.acquire("k", "alice", LONG);

    assert_eq!(c.int(&["LOCK.RENEW", "k", "alice", "5000"]), 1);
    let pttl = c.pttl("k");
    assert!(
        pttl > 4_000 && pttl <= 5_000,
        "PTTL {pttl} after RENEW 5000"
    );
    assert_eq!(
        c.lock_info("k").expect("held").held(),
        (b"alice".to_vec(), 2, fence)
    );

    assert_eq!(c.int(&["LOCK.RENEW", "k", "alice", &LONG.to_string()]), 1);
    assert!(c.pttl("k") > LONG - 5_000, "lease renewed to LONG");
    assert_eq!(
        c.lock_info("k").expect("held").held(),
        (b"alice".to_vec(), 2, fence)
    );
}

#[test]
fn renew_by_anyone_but_the_owner_is_refused() {
    let server = Server::start();
    let mut c = server.conn();
    let fence = c.acquire("k", "alice", LONG).expect("free");
    let before = state(&server, &mut c, "k");

    let err = c.err(&["LOCK.RENEW", "k", "bob", "5000"]);
    assert!(err.starts_with("NOTOWNER"), "{err}");
    let err = c.err(&["LOCK.RENEW", "free", "alice", "5000"]);
    assert!(err.starts_with("NOTOWNER"), "{err}");

    assert_eq!(c.int(&["EXISTS", "free"]), 0, "RENEW never creates a lock");
    assert_eq!(
        c.lock_info("k").expect("held").held(),
        (b"alice".to_vec(), 1, fence)
    );
    assert_eq!(state(&server, &mut c, "k"), before);
}

#[test]
fn info_of_a_free_lock_is_nil() {
    let server = Server::start();
    let mut c = server.conn();
    c.nil(&["LOCK.INFO", "k"]);
    assert_eq!(server.cli(&["LOCK.INFO", "k"]), "(nil)");
    c.nil(&["LOCK.INFO", "k"]);
    assert_eq!(c.int(&["EXISTS", "k"]), 0, "LOCK.INFO creates nothing");
    let mut c3 = server.conn_resp3();
    c3.nil(&["LOCK.INFO", "k"]);
}

#[test]
fn info_is_a_flat_array_in_field_order_under_resp2() {
    let server = Server::start();
    let mut c = server.conn();
    let fence = c.acquire("k", "alice", LONG).expect("free");
    c.acquire("k", "alice", LONG);

    let Ok(Value::Array(items)) = c.call(&["LOCK.INFO", "k"]) else {
        panic!("LOCK.INFO is not an array under RESP2");
    };
    assert_eq!(items.len(), 16, "{items:?}");
    // Field names may be simple or bulk strings; values have fixed types.
    let names: Vec<Option<String>> = items.iter().step_by(2).map(text).collect();
    let expected = [
        "owner", "count", "fence", "ttl", "waiters", "mode", "limit", "holders",
    ]
    .map(|n| Some(n.to_string()));
    assert_eq!(names, expected, "{items:?}");
    assert_eq!(text(&items[11]).as_deref(), Some("exclusive"));
    assert_eq!(items[13], Value::Int(0));
    let Value::Array(holders) = &items[15] else {
        panic!("holders is not an array: {items:?}");
    };
    let Some(Value::Array(holder)) = holders.first() else {
        panic!("one holder, a flat array under RESP2: {holders:?}");
    };
    let holder_names: Vec<Option<String>> = holder.iter().step_by(2).map(text).collect();
    let expected = [
        "owner",
        "count",
        "fence",
        "ttl",
        "held",
        "ephemeral",
        "permits",
    ]
    .map(|n| Some(n.to_string()));
    assert_eq!((holders.len(), holder_names), (1, expected.to_vec()));
    assert_eq!(holder[1], Value::BulkString(b"alice".to_vec()));
    assert_eq!(holder[3], Value::Int(2));
    assert_eq!(items[1], Value::BulkString(b"alice".to_vec()));
    assert_eq!(items[3], Value::Int(2));
    assert_eq!(items[5], Value::Int(fence));
    assert!(
        matches!(items[7], Value::Int(ttl) if ttl > LONG - 5_000 && ttl <= LONG),
        "ttl {:?}",
        items[7]
    );
    assert_eq!(items[9], Value::Int(0));

    // As redis-cli shows it.
    let shown = server.cli(&["LOCK.INFO", "k"]);
    let lines: Vec<&str> = shown.lines().map(str::trim).collect();
    assert!(lines.len() > 15, "{shown}");
    let name = |line: &str, i: usize, name: &str| {
        let shown = line.strip_prefix(&format!("{i}) ")).unwrap_or("");
        shown.trim_matches('"') == name
    };
    assert!(name(lines[0], 1, "owner"), "{shown}");
    assert_eq!(lines[1], "2) \"alice\"");
    assert!(name(lines[2], 3, "count"), "{shown}");
    assert_eq!(lines[3], "4) (integer) 2");
    assert!(name(lines[4], 5, "fence"), "{shown}");
    assert_eq!(lines[5], format!("6) (integer) {fence}"));
    assert!(name(lines[6], 7, "ttl"), "{shown}");
    assert!(lines[7].starts_with("8) (integer) "), "{shown}");
    assert!(name(lines[8], 9, "waiters"), "{shown}");
    assert_eq!(lines[9], "10) (integer) 0");
}

#[test]
fn info_is_a_map_in_field_order_under_resp3() {
    let server = Server::start();
    let mut c = server.conn_resp3();
    let fence = c.acquire("k", "alice", LONG).expect("free");

    let Ok(Value::Map(pairs)) = c.call(&["LOCK.INFO", "k"]) else {
        panic!("LOCK.INFO is not a map under RESP3");
    };
    let names: Vec<String> = pairs
        .iter()
        .map(|(k, _)| text(k).expect("field names are strings"))
        .collect();
    assert_eq!(
        names,
        ["owner", "count", "fence", "ttl", "waiters", "mode", "limit", "holders"]
    );
    assert_eq!(text(&pairs[5].1).as_deref(), Some("exclusive"));
    assert_eq!(pairs[6].1, Value::Int(0));
    let Value::Array(holders) = &pairs[7].1 else {
        panic!("holders is not an array: {pairs:?}");
    };
    assert!(
        matches!(holders.as_slice(), [Value::Map(holder)] if holder.len() == 7),
        "one holder, a map under RESP3: {holders:?}"
    );
    assert_eq!(pairs[0].1, Value::BulkString(b"alice".to_vec()));
    assert_eq!(pairs[1].1, Value::Int(1));
    assert_eq!(pairs[2].1, Value::Int(fence));
    assert!(
        matches!(pairs[3].1, Value::Int(ttl) if ttl > LONG - 5_000 && ttl <= LONG),
        "ttl {:?}",
        pairs[3].1
    );
    assert_eq!(pairs[4].1, Value::Int(0));

    // As `redis-cli -3` shows a map: `1# "owner" => "alice"`.
    let shown = server.cli3(&["LOCK.INFO", "k"]);
    let lines: Vec<&str> = shown.lines().map(str::trim).collect();
    assert!(lines.len() >= names.len(), "{shown}");
    for (i, (line, name)) in lines.iter().zip(&names).enumerate() {
        assert!(
            line.starts_with(&format!("{}# ", i + 1)) && line.contains(name.as_str()),
            "line {i} of the map: {shown}"
        );
    }
    assert!(lines[0].ends_with("=> \"alice\""), "{shown}");
    assert!(lines[1].ends_with("=> (integer) 1"), "{shown}");
    assert!(
        lines[2].ends_with(&format!("=> (integer) {fence}")),
        "{shown}"
    );
    assert!(lines[4].ends_with("=> (integer) 0"), "{shown}");
}

#[test]
fn fences_rise_across_release_expiry_del_and_flushall() {
    let server = Server::start();
    let mut c = server.conn();
    let mut fences = vec![c.acquire("k", "alice", LONG).expect("free")];

    assert_eq!(c.int(&["LOCK.RELEASE", "k", "alice"]), 0);
    fences.push(c.acquire("k", "alice", SHORT).expect("free after release"));

    wait_for_expiry(&mut c, "k");
    fences.push(c.acquire("k", "bob", LONG).expect("free after expiry"));

    assert_eq!(c.int(&["DEL", "k"]), 1);
    fences.push(c.acquire("k", "alice", LONG).expect("free after DEL"));

    c.value::<String, _>(&["FLUSHALL"]);
    fences.push(c.acquire("k", "alice", LONG).expect("free after FLUSHALL"));

    c.value::<String, _>(&["FLUSHALL", "ASYNC"]);
    fences.push(
        c.acquire("other", "carol", LONG)
            .expect("free after FLUSHALL ASYNC"),
    );

    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences must rise strictly: {fences:?}"
    );
}

#[test]
fn fences_are_unique_and_rising_even_within_one_millisecond() {
    let server = Server::start();
    let mut c = server.conn();
    // One pipeline: many acquisitions land in the same millisecond, where only
    // last + 1 keeps them apart.
    let mut pipe = redis::pipe();
    for i in 0..500 {
        pipe.cmd("LOCK.ACQUIRE")
            .arg(format!("k{i}"))
            .arg("alice")
            .arg(LONG);
        pipe.cmd("LOCK.RELEASE").arg(format!("k{i}")).arg("alice");
    }
    let replies: Vec<i64> = pipe.query(&mut c).expect("pipeline");
    let fences: Vec<i64> = replies.iter().step_by(2).copied().collect();
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences must rise strictly: {fences:?}"
    );
    assert!(replies.iter().skip(1).step_by(2).all(|&n| n == 0));
}

#[test]
fn command_names_and_all_are_case_insensitive() {
    let server = Server::start();
    let mut c = server.conn();
    let Ok(Value::Int(fence)) = c.call(&["lock.acquire", "k", "alice", "60000"]) else {
        panic!("lowercase LOCK.ACQUIRE");
    };
    assert_eq!(c.int(&["Lock.Acquire", "k", "alice", "60000"]), fence);
    assert_eq!(c.int(&["lock.reenter", "k", "alice"]), 3);
    assert_eq!(c.int(&["LoCk.ReNeW", "k", "alice", "60000"]), 1);
    let info = match c.call(&["lock.info", "k"]) {
        Ok(value) => LockInfo::from_reply(&value).expect("LOCK.INFO reply"),
        Err(err) => panic!("lowercase LOCK.INFO: {err}"),
    };
    assert_eq!(info.held(), (b"alice".to_vec(), 3, fence));
    assert_eq!(c.int(&["lock.release", "k", "alice", "all"]), 0);
    c.acquire("k", "alice", LONG);
    c.acquire("k", "alice", LONG);
    assert_eq!(c.int(&["LOCK.RELEASE", "k", "alice", "All"]), 0);
    assert_eq!(c.int(&["EXISTS", "k"]), 0);
}

#[test]
fn owners_are_binary_safe() {
    let server = Server::start();
    let mut c = server.conn();
    let owner: &[u8] = b"id\0\xff:1\r\n x";
    let cmd = |name: &str, owner: &[u8], rest: &[&str]| {
        let mut cmd = redis::cmd(name);
        cmd.arg("k").arg(owner).arg(rest);
        cmd
    };

    let fence: i64 = cmd("LOCK.ACQUIRE", owner, &["60000"])
        .query(&mut c)
        .expect("acquire with a binary owner");
    let info = c.lock_info("k").expect("held");
    assert_eq!(info.owner, owner, "owner bytes kept exactly");
    assert_eq!(info.fence, fence);

    // Owners that a C string or a lossy conversion would confuse with it.
    for other in [
        &b"id"[..],
        b"id\0",
        b"id\0\xfe:1\r\n x",
        b"id\0\xef\xbf\xbd:1\r\n x",
    ] {
        let reply: redis::Value = cmd("LOCK.ACQUIRE", other, &["60000"])
            .query(&mut c)
            .expect("acquire by another owner");
        assert_eq!(
            reply,
            Value::Nil,
            "{:?} is another owner",
            other.escape_ascii()
        );
        let err = cmd("LOCK.RELEASE", other, &[])
            .query::<Value>(&mut c)
            .expect_err("release by another owner");
        assert_eq!(err.code(), Some("NOTOWNER"), "{err}");
    }

    let count: i64 = cmd("LOCK.REENTER", owner, &[])
        .query(&mut c)
        .expect("reenter");
    assert_eq!(count, 2);
    let renewed: i64 = cmd("LOCK.RENEW", owner, &["60000"])
        .query(&mut c)
        .expect("renew");
    assert_eq!(renewed, 1);
    let left: i64 = cmd("LOCK.RELEASE", owner, &["ALL"])
        .query(&mut c)
        .expect("release");
    assert_eq!(left, 0);
    assert_eq!(c.int(&["EXISTS", "k"]), 0);
}
