//! Upgrade (no lock lives forever and durability and replication): an RDB written by the
//! module's first encoding (version 1, where the lease lived only in the
//! key's TTL) loads in this one. `tests/fixtures/README.md` says how the
//! file was made: two held locks with 2^40 ms leases (one reentered), a
//! lock whose TTL was removed with `PERSIST`, and a plain string.
//!
//! The new encoding stores the lease in the lock itself; a v1 lock that
//! arrives with no TTL must still not be held forever.

use std::fs;
use std::path::PathBuf;

use crate::harness::{now_ms, Call, Server, Stop};

/// The lock `orders:{42}`: owner, count, fence, lease end (Unix ms).
const ORDERS: (&str, &str, i64, i64, i64) = (
    "orders:{42}",
    "c0ffee00-0000-4000-8000-000000000001:1",
    1,
    1_882_687_747_958_767_616,
    2_894_982_578_817,
);

/// The lock `job`, reentered to count 3.
const JOB: (&str, &str, i64, i64, i64) = (
    "job",
    "worker-7",
    3,
    1_882_687_747_965_059_072,
    2_894_982_578_829,
);

/// `lock_last_fence` when the file was saved.
const LAST_FENCE: i64 = 1_882_687_747_982_884_864;

/// A server started on a copy of `tests/fixtures/v1-locks.rdb` as its
/// `dump.rdb`.
fn start_on_v1_rdb() -> Server {
    start_on_rdb("v1-locks.rdb")
}

/// A server started on a copy of `tests/fixtures/<file>` as its `dump.rdb`.
fn start_on_rdb(file: &str) -> Server {
    let mut server = Server::start();
    server.stop(Stop::NoSave);
    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(file);
    fs::copy(&fixture, server.dir().join("dump.rdb"))
        .unwrap_or_else(|e| panic!("copy {}: {e}", fixture.display()));
    server.start_again();
    server
}

/// Guards the upgrade (the old module passes it too: v1 is what it wrote):
/// owners, counts, fences and lease ends arrive as saved, the fence counter
/// goes on above the file's, and the owners go on holding their locks.
#[test]
fn an_rdb_written_by_encoding_version_1_loads_with_its_locks_intact() {
    let server = start_on_v1_rdb();
    let mut c = server.conn();
    for (key, owner, count, fence, lease_end) in [ORDERS, JOB] {
        let info = c
            .lock_info(key)
            .unwrap_or_else(|| panic!("{key} was not loaded"));
        assert_eq!(
            info.held(),
            (owner.as_bytes().to_vec(), count, fence),
            "{key}"
        );
        // The file's lease end, to the millisecond; a second of slack lets
        // a module that rebuilds the lease from the TTL round it.
        let loaded_end = c.int(&["PEXPIRETIME", key]);
        assert!(
            (loaded_end - lease_end).abs() <= 1_000,
            "{key}'s lease ends at {loaded_end}, in the file at {lease_end}"
        );
        let left = lease_end - now_ms();
        assert!(
            (info.ttl - left).abs() <= 1_000,
            "{key}: ttl {} ms, the lease has {left} ms left",
            info.ttl
        );
    }
    assert_eq!(c.value::<String, _>(&["TYPE", "plain"]), "string");
    assert_eq!(c.value::<String, _>(&["GET", "plain"]), "value");
    let last = server.info_int("lock", "lock_last_fence");
    assert!(last >= LAST_FENCE, "lock_last_fence {last} < {LAST_FENCE}");

    // New fences go on above everything in the file.
    let fresh = c.acquire("fresh", "zed", 60_000).expect("free");
    assert!(fresh > LAST_FENCE, "fence {fresh} not above {LAST_FENCE}");
    // The owners still own their locks; others still do not.
    assert_eq!(c.acquire(ORDERS.0, "mallory", 60_000), None);
    assert_eq!(c.int(&["LOCK.RENEW", ORDERS.0, ORDERS.1, "60000"]), 1);
    let pttl = c.pttl(ORDERS.0);
    assert!(pttl > 0 && pttl <= 60_000, "PTTL after RENEW: {pttl}");
    assert_eq!(c.int(&["LOCK.RELEASE", JOB.0, JOB.1]), 2);
    assert_eq!(c.int(&["LOCK.RELEASE", JOB.0, JOB.1, "ALL"]), 0);
    assert_eq!(c.lock_info(JOB.0), None);
    let next = c.acquire(JOB.0, "worker-8", 60_000).expect("job is free");
    assert!(next > fresh);
}

/// the v1 lock saved with no TTL (`PERSIST`ed) is not held
/// forever once loaded: the module gives every lock a lease, or drops a
/// lock whose lease it cannot know.
#[test]
fn a_v1_lock_saved_without_a_ttl_is_not_held_forever_after_loading() {
    let server = start_on_v1_rdb();
    let mut c = server.conn();
    let pttl = c.pttl("persisted");
    assert_ne!(
        pttl, -1,
        "the v1 lock `persisted` was loaded with no TTL: held forever"
    );
    if pttl == -2 {
        assert_eq!(c.lock_info("persisted"), None);
    } else {
        assert!(pttl > 0, "PTTL persisted: {pttl}");
    }
}

/// The holders of `tests/fixtures/v3-locks.rdb`, per lock: (key, mode,
/// limit, [(owner, count, fence, lease end)]).
type Saved = (
    &'static str,
    &'static str,
    i64,
    &'static [(&'static str, i64, i64, i64)],
);

const V3_LOCKS: [Saved; 3] = [
    (
        "pool",
        "shared",
        3,
        &[
            (
                "c0ffee00-0000-4000-8000-00000000000a:1",
                1,
                1_882_737_165_587_185_664,
                2_895_029_707_140,
            ),
            ("worker-b", 2, 1_882_737_165_593_477_120, 2_895_029_707_146),
        ],
    ),
    (
        "config",
        "shared",
        0,
        &[
            ("reader-1", 1, 1_882_737_165_608_157_184, 2_895_029_707_160),
            ("reader-2", 1, 1_882_737_165_614_448_640, 2_795_518_079_390),
        ],
    ),
    (
        "job",
        "exclusive",
        0,
        &[("worker-7", 2, 1_882_737_165_619_691_520, 2_895_029_707_171)],
    ),
];

/// An RDB written by encoding version 3 (shared holds) loads with every
/// holder's count, fence and lease end, the key's TTL at the latest lease,
/// and the holds' start times; the owners go on holding their share.
#[test]
fn an_rdb_written_by_encoding_version_3_loads_every_holder() {
    let server = start_on_rdb("v3-locks.rdb");
    let mut c = server.conn();
    for (key, mode, limit, holders) in V3_LOCKS {
        let info = c
            .lock_info(key)
            .unwrap_or_else(|| panic!("{key} was not loaded"));
        assert_eq!((info.mode.as_str(), info.limit), (mode, limit), "{key}");
        let now = now_ms();
        assert_eq!(info.holders.len(), holders.len(), "{key}: {info:?}");
        for (got, &(owner, count, fence, lease_end)) in info.holders.iter().zip(holders) {
            assert_eq!(
                (got.owner.as_str(), got.count, got.fence),
                (owner, count, fence)
            );
            let left = lease_end - now;
            assert!(
                (got.ttl - left).abs() <= 1_000,
                "{key}/{owner}: ttl {}",
                got.ttl
            );
            // The holds began when the file was made, not when it loaded.
            assert!(
                got.held > now - 1_795_518_079_400,
                "{key}/{owner}: held {}",
                got.held
            );
        }
        let latest = holders.iter().map(|h| h.3).max().unwrap_or(0);
        assert_eq!(c.int(&["PEXPIRETIME", key]), latest, "{key}");
    }
    let fresh = c.acquire("fresh", "zed", 60_000).expect("free");
    assert!(
        fresh > 1_882_737_165_619_691_520,
        "fences go on above the file's"
    );
    // A third permit is free; a fourth is not; the holders still hold.
    let third = c.call(&["LOCK.ACQUIRE", "pool", "c", "60000", "SHARED", "LIMIT", "3"]);
    assert!(matches!(third, Ok(redis::Value::Int(_))), "{third:?}");
    let fourth = c.call(&["LOCK.ACQUIRE", "pool", "d", "60000", "SHARED", "LIMIT", "3"]);
    assert_eq!(fourth, Ok(redis::Value::Nil));
    assert_eq!(c.int(&["LOCK.RELEASE", "pool", "worker-b"]), 1);
    assert_eq!(c.int(&["LOCK.RELEASE", "config", "reader-2"]), 0);
    assert_eq!(c.int(&["LOCK.RENEW", "job", "worker-7", "60000"]), 1);
}
