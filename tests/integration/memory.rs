//! Bytes per held lock: the module against the `SET key owner NX PX`
//! recipe, with the owners the clients send, measured in one run on one
//! server (`used_memory` delta per key, each set taken on an emptied
//! server, every key with a one-hour lease, so an entry in the expires
//! table too).

use std::time::Duration;

use crate::harness::{wait_until, Server};

/// Locks per measurement: enough that the hash tables' share per key is
/// the same for both sides (both fill the same tables to the same size).
const LOCKS: usize = 100_000;
/// Commands per pipelined batch.
const BATCH: usize = 1_000;
/// What `used_memory` moves by between two readings for reasons of its
/// own, per key (see the test).
const NOISE: f64 = 0.1;
/// A lease that outlives the run.
const TTL: &str = "3600000";

/// A random 128-bit value.
fn random_u128() -> u128 {
    rand::random::<u128>()
}

/// `0123abcd-…`: a canonical lowercase UUID (Java's `UUID.toString()`).
fn uuid_text(n: u128) -> String {
    let hex = format!("{n:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// Lock `i`'s owner in one format.
type MakeOwner = fn(usize) -> String;

/// The owner formats the clients and the usual libraries send.
const FORMATS: &[(&str, MakeOwner)] = &[
    // Redisson: the client's UUID and the thread id.
    ("<uuid>:<thread>", |i| {
        format!("{}:{}", uuid_text(random_u128()), 1 + i % 300)
    }),
    // The Rust and Node clients: a client id and a counter of lock calls.
    ("<hex32>:<n>", |i| {
        format!("{:032x}:{}", random_u128(), 1 + i)
    }),
    // The Python and Go clients: a random 128-bit token.
    ("<hex32>", |_| format!("{:032x}", random_u128())),
    // The Java client: its UUID and one per hold.
    ("<uuid>:<uuid>", |_| {
        format!("{}:{}", uuid_text(random_u128()), uuid_text(random_u128()))
    }),
];

/// `used_memory` per key once `LOCKS` keys are taken by `command(key,
/// owner)`, on an emptied server. The loading connection is closed before
/// the second reading, so no client buffer is counted.
fn bytes_per_key(server: &Server, owners: &[String], command: fn(&str, &str) -> redis::Cmd) -> f64 {
    server.cli(&["FLUSHALL", "SYNC"]);
    let clients = server.info_int("clients", "connected_clients");
    let before = server.info_int("memory", "used_memory");
    {
        let mut con = server.conn();
        for (start, batch) in owners.chunks(BATCH).enumerate() {
            let mut pipe = redis::pipe();
            for (j, owner) in batch.iter().enumerate() {
                pipe.add_command(command(&format!("lock:{}", start * BATCH + j), owner));
            }
            let replies: Vec<redis::Value> = pipe.query(&mut con).expect("loading");
            assert!(
                replies.iter().all(|r| !matches!(r, redis::Value::Nil)),
                "a lock was not taken"
            );
        }
    }
    wait_until(
        "the loading connection is closed",
        Duration::from_secs(30),
        || server.info_int("clients", "connected_clients") <= clients,
    );
    let after = server.info_int("memory", "used_memory");
    let keys: i64 = redis::cmd("DBSIZE")
        .query(&mut server.conn())
        .expect("DBSIZE");
    assert_eq!(keys, LOCKS as i64, "every key was taken");
    server.cli(&["FLUSHALL", "SYNC"]);
    (after - before) as f64 / LOCKS as f64
}

fn module_acquire(key: &str, owner: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("LOCK.ACQUIRE");
    cmd.arg(key).arg(owner).arg(TTL);
    cmd
}

fn recipe_acquire(key: &str, owner: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("SET");
    cmd.arg(key).arg(owner).arg("NX").arg("PX").arg(TTL);
    cmd
}

/// How many bytes per key a lock may take above the recipe on `server`.
/// Where a string value is an allocation of its own (Redis 7), none. Where
/// the server keeps a short string value inside its key's object (Redis 8,
/// Valkey 8 and later), the recipe's value costs no allocation at all,
/// while any module value costs Redis a 16-byte wrapper (`moduleValue`)
/// and the module an allocation of at least 16 bytes: 32, and 1 for the
/// hash tables, sized a little differently in the two runs.
fn allowance(server: &Server) -> f64 {
    let info = server.cli(&["INFO", "server"]);
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    let major = |version: &str| version.split('.').next()?.parse::<u32>().ok();
    let embeds = field("valkey_version").is_some()
        || field("redis_version")
            .and_then(major)
            .is_some_and(|m| m >= 8);
    if embeds {
        33.0
    } else {
        0.0
    }
}

#[test]
fn a_held_lock_takes_no_more_memory_than_the_set_nx_px_recipe() {
    let server = Server::start();
    let allowed = allowance(&server);
    let mut report = Vec::new();
    let mut over = Vec::new();
    // The module times each hold granted here (`INFO lock`'s `hold_usec`)
    // in a table that keeps its size once grown: the first rounds of
    // 100,000 locks pay for it, later ones do not. Its cost is shown, then
    // every figure is of a server that held as many locks before.
    let warm_up: Vec<String> = (0..LOCKS).map(FORMATS[0].1).collect();
    let cold = bytes_per_key(&server, &warm_up, module_acquire);
    let again = bytes_per_key(&server, &warm_up, module_acquire);
    let warm = bytes_per_key(&server, &warm_up, module_acquire);
    println!(
        "{:<16} module {cold:7.1} B on a fresh server, {again:7.1} B the second time, {warm:7.1} B the third",
        FORMATS[0].0
    );
    for (format, make) in FORMATS {
        let owners: Vec<String> = (0..LOCKS).map(make).collect();
        let module = bytes_per_key(&server, &owners, module_acquire);
        let recipe = bytes_per_key(&server, &owners, recipe_acquire);
        let line = format!("{format:<16} module {module:7.2} B, SET NX PX {recipe:7.2} B");
        println!("{line}");
        // Both sides fill the same tables with the same keys: what differs
        // is what each value costs. `used_memory` also counts the server's
        // own small allocations that come and go between two readings (a few
        // hundred bytes either way): 0.1 B per key (10 KB) absorbs them.
        if module > recipe + allowed + NOISE {
            over.push(line.clone());
        }
        report.push(line);
    }
    assert!(
        over.is_empty(),
        "bytes per held lock above the recipe's + {allowed} B:\n{}\n(all:\n{})",
        over.join("\n"),
        report.join("\n")
    );
}

/// Owners of every form the value stores (packed in 32 bytes, packed with
/// a header, as they came), and near misses of the packed forms.
fn owners_of_every_form() -> Vec<Vec<u8>> {
    let uuid = uuid_text(random_u128());
    let hex = format!("{:032x}", random_u128());
    let mut owners: Vec<Vec<u8>> = [
        format!("{uuid}:1"),
        format!("{uuid}:16777215"),
        format!("{uuid}:16777216"),
        format!("{uuid}:{}", u64::MAX),
        format!("{uuid}:{}", uuid_text(random_u128())),
        uuid.clone(),
        hex.clone(),
        format!("{hex}:0"),
        format!("{hex}:123456789"),
        uuid.to_uppercase(),
        format!("{}:7", uuid.to_uppercase()),
        format!("{uuid}:07"),
        format!("{uuid}:-1"),
        format!("{uuid}:{}0", u64::MAX),
        format!("{hex}x"),
        hex[..31].to_string(),
        "alice".to_string(),
    ]
    .into_iter()
    .map(String::into_bytes)
    .collect();
    let mut odd = hex.clone().into_bytes();
    odd[3] = 0xff;
    owners.push(odd);
    let mut nul = format!("{uuid}:1").into_bytes();
    nul.push(0);
    owners.push(nul);
    owners.push(vec![b'o'; 1024]);
    owners
}

/// What `LOCK.INFO key` says of the holder: owner, count, fence.
fn held(con: &mut redis::Connection, key: &str) -> (Vec<u8>, i64, i64) {
    use crate::harness::Call;
    let info = con
        .lock_info(key)
        .unwrap_or_else(|| panic!("{key} is not held"));
    (info.owner, info.count, info.fence)
}

#[test]
fn every_owner_comes_back_byte_for_byte_through_each_change_and_reload() {
    use crate::harness::Call;
    let server = Server::start();
    let mut c = server.conn();
    let owners = owners_of_every_form();
    let mut expected = Vec::new();
    for (i, owner) in owners.iter().enumerate() {
        let key = format!("k{i}");
        let fence: i64 = redis::cmd("LOCK.ACQUIRE")
            .arg(&key)
            .arg(owner)
            .arg(TTL)
            .query(&mut c)
            .expect("acquire");
        assert_eq!(held(&mut c, &key), (owner.clone(), 1, fence), "{key}");
        // Reentries past what the compact form counts, a renewal, a fence
        // raised an hour ahead: each finds the same owner, and each number
        // is kept whatever form it moves the value to.
        for count in 2..=20 {
            let got: i64 = redis::cmd("LOCK.ACQUIRE")
                .arg(&key)
                .arg(owner)
                .arg(TTL)
                .query(&mut c)
                .expect("reenter");
            assert_eq!(got, fence, "{key}: a reentry keeps the fence");
            assert_eq!(held(&mut c, &key), (owner.clone(), count, fence), "{key}");
        }
        let renewed: i64 = redis::cmd("LOCK.RENEW")
            .arg(&key)
            .arg(owner)
            .arg("7200000")
            .query(&mut c)
            .expect("renew");
        assert_eq!(renewed, 1, "{key}: renewed");
        let pttl = c.pttl(&key);
        assert!(
            pttl > 3_600_000,
            "{key}: the renewal moved the lease ({pttl} ms)"
        );
        let released: i64 = redis::cmd("LOCK.RELEASE")
            .arg(&key)
            .arg(owner)
            .query(&mut c)
            .expect("release");
        assert_eq!(released, 19, "{key}: one count released");
        let raised = if i % 2 == 0 {
            let min = (crate::harness::now_ms() + 1_800_000) * 1024;
            let got: i64 = redis::cmd("LOCK.FENCE")
                .arg(&key)
                .arg(owner)
                .arg(min)
                .query(&mut c)
                .expect("fence");
            assert_eq!(got, min, "{key}: the fence is raised");
            got
        } else {
            fence
        };
        assert_eq!(held(&mut c, &key), (owner.clone(), 19, raised), "{key}");
        expected.push((key, owner.clone(), 19, raised));
        // One more key left as acquired: the compact form where it applies.
        let fresh = format!("fresh{i}");
        let fence: i64 = redis::cmd("LOCK.ACQUIRE")
            .arg(&fresh)
            .arg(owner)
            .arg(TTL)
            .query(&mut c)
            .expect("acquire");
        expected.push((fresh, owner.clone(), 1, fence));
    }
    let check = |c: &mut redis::Connection, when: &str| {
        for (key, owner, count, fence) in &expected {
            assert_eq!(
                held(c, key),
                (owner.clone(), *count, *fence),
                "{key} {when}"
            );
            let usage: i64 = c.int(&["MEMORY", "USAGE", key]);
            assert!(usage > 0, "{key} {when}: MEMORY USAGE {usage}");
        }
    };
    check(&mut c, "as taken");
    let digest = server.digest();
    assert_eq!(c.value::<String, _>(&["DEBUG", "RELOAD"]), "OK");
    check(&mut c, "after DEBUG RELOAD");
    assert_eq!(server.digest(), digest, "the digest after DEBUG RELOAD");
    // DUMP and RESTORE under another name: the same holder.
    for (key, owner, count, fence) in &expected {
        let payload: Vec<u8> = c.value(&["DUMP", key.as_str()]);
        let copy = format!("{key}:copy");
        let _: () = redis::cmd("RESTORE")
            .arg(&copy)
            .arg(0)
            .arg(payload)
            .query(&mut c)
            .expect("RESTORE");
        assert_eq!(
            held(&mut c, &copy),
            (owner.clone(), *count, *fence),
            "{copy}"
        );
        // The restored lock is its owner's: a release by it counts down.
        let left: i64 = redis::cmd("LOCK.RELEASE")
            .arg(&copy)
            .arg(owner)
            .query(&mut c)
            .expect("release");
        assert_eq!(left, count - 1, "{copy}");
    }
    // Every original, and every copy not released to nothing, once the
    // values a lazy free hands to another thread (`DEBUG RELOAD`'s old
    // ones, on Valkey 9) are gone.
    let copies_left = expected.iter().filter(|e| e.2 > 1).count();
    let held = (expected.len() + copies_left) as i64;
    wait_until(
        &format!("INFO lock counts {held} locks held"),
        Duration::from_secs(10),
        || server.info_int("lock", "lock_held") == held,
    );
}
