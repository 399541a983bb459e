//! Blocked waiters (fair hand-off and cleanup, `WAIT` in `LOCK.ACQUIRE`): a
//! waiting client is handed the lock the moment it frees, in arrival order,
//! whatever freed it; nobody barges; a waiter that times out, is unblocked or
//! disconnects leaves the queue and never holds the lock; `MULTI`, Lua and
//! functions never block; a hand-off reaches replicas; reloads and restarts
//! leave no stuck or leaked waiter.
//!
//! Each waiting client runs on a thread of its own with its own connection
//! ([`Waiter`]). Tests wait on what the server shows (`LOCK.INFO` `waiters`,
//! `INFO clients` `blocked_clients`, `INFO lock`), never on fixed sleeps; a
//! short sleep only shows that something did *not* happen.

use std::process::{Child, Command, Stdio};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::{Connection, Value};

use crate::harness::{
    cli_bin, clock_floor, error_text, now_ms, start_replica, wait_args, wait_until, Call, Server,
    CLOCK_SHIFT, LONG,
};

/// How long a test waits for something that should happen at once.
const SOON: Duration = Duration::from_secs(5);

/// How long a test watches for something that must not happen.
const A_WHILE: Duration = Duration::from_millis(200);

/// How late after its due time a hand-off or a `WAIT` timeout may reply. The
/// command reference says "within a few milliseconds"; this is generous, not a benchmark.
const PROMPT_MS: i64 = 50;

/// How a waiting client's `LOCK.ACQUIRE … WAIT` ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    /// Handed the lock: its fence.
    Fence(i64),
    /// Timed out, or woken by `CLIENT UNBLOCK`.
    Nil,
    /// An error reply, code first (`UNBLOCKED …`).
    Error(String),
    /// The connection ended without a reply.
    Lost,
}

/// The end of a wait, as the waiting client saw it.
#[derive(Debug)]
struct Ended {
    outcome: Outcome,
    /// From just before the command was sent until its reply.
    waited: Duration,
    /// Unix µs when the reply arrived.
    at_us: i64,
}

/// Now, unix µs (the server runs on this machine's clock).
fn now_us() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970");
    i64::try_from(since.as_micros()).expect("µs fit in i64")
}

/// A client blocked in `LOCK.ACQUIRE key owner ttl WAIT timeout`, on a thread
/// of its own.
struct Waiter {
    owner: String,
    /// Its `CLIENT ID`, for `CLIENT UNBLOCK` and `CLIENT KILL`.
    id: i64,
    thread: JoinHandle<Ended>,
}

impl Waiter {
    /// Sends the command on `conn` from a new thread; returns at once.
    fn send(mut conn: Connection, key: &str, owner: &str, ttl_ms: i64, timeout_ms: i64) -> Waiter {
        let id = conn.int(&["CLIENT", "ID"]);
        let args = wait_args(key, owner, ttl_ms, timeout_ms);
        let thread = thread::spawn(move || {
            let sent = Instant::now();
            let reply = redis::cmd(&args[0])
                .arg(&args[1..])
                .query::<Value>(&mut conn);
            let (waited, at_us) = (sent.elapsed(), now_us());
            let outcome = match reply {
                Ok(Value::Int(fence)) => Outcome::Fence(fence),
                Ok(Value::Nil) => Outcome::Nil,
                Ok(other) => panic!("LOCK.ACQUIRE … WAIT replied {other:?}"),
                Err(err) => error_text(&err).map_or(Outcome::Lost, Outcome::Error),
            };
            Ended {
                outcome,
                waited,
                at_us,
            }
        });
        Waiter {
            owner: owner.to_string(),
            id,
            thread,
        }
    }

    /// Whether it is still waiting for its reply.
    fn is_waiting(&self) -> bool {
        !self.thread.is_finished()
    }

    /// Waits for its reply.
    fn end(self) -> Ended {
        wait_until(&format!("{} gets a reply", self.owner), SOON, || {
            self.thread.is_finished()
        });
        self.thread.join().expect("the waiter's thread")
    }

    /// Waits until it is handed the lock; its fence.
    fn fence(self) -> i64 {
        let owner = self.owner.clone();
        match self.end().outcome {
            Outcome::Fence(fence) => fence,
            other => panic!("{owner} was not handed the lock: {other:?}"),
        }
    }
}

/// A waiting `redis-cli` process: killing it is a real client disconnect.
struct CliWaiter(Child);

impl CliWaiter {
    fn start(server: &Server, key: &str, owner: &str) -> CliWaiter {
        let cli = cli_bin();
        let port = server.port().to_string();
        let ttl = LONG.to_string();
        let child = Command::new(&cli)
            .args(["-h", "127.0.0.1", "-p", &port])
            .args(["LOCK.ACQUIRE", key, owner, &ttl, "WAIT", "0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {cli}: {e}"));
        CliWaiter(child)
    }

    /// SIGKILL: the kernel closes its socket, as when a client crashes.
    fn kill(mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for CliWaiter {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A connection with database `db` selected.
fn conn_db(server: &Server, db: i64) -> Connection {
    let mut c = server.conn();
    let _: () = c.value(&["SELECT", &db.to_string()]);
    c
}

/// `LOCK.INFO key` `waiters` (0 when the lock is free).
fn waiters(c: &mut Connection, key: &str) -> i64 {
    c.lock_info(key).map_or(0, |info| info.waiters)
}

/// `LOCK.INFO key` `owner`, if held.
fn owner(c: &mut Connection, key: &str) -> Option<String> {
    c.lock_info(key)
        .map(|info| String::from_utf8_lossy(&info.owner).into_owned())
}

fn blocked_clients(server: &Server) -> i64 {
    server.info_int("clients", "blocked_clients")
}

fn lock_info_int(server: &Server, field: &str) -> i64 {
    server.info_int("lock", &format!("lock_{field}"))
}

/// Asserts that no client waits any more, on any lock.
fn assert_no_one_waits(server: &Server) {
    assert_eq!(lock_info_int(server, "waiting"), 0, "INFO lock_waiting");
    assert_eq!(blocked_clients(server), 0, "INFO blocked_clients");
}

/// Starts `owner` waiting on `key` in database `db` and returns once `key`
/// shows one more waiter: waiters queued one after another by this are in a
/// known order.
fn queue_in(
    server: &Server,
    db: i64,
    key: &str,
    owner: &str,
    ttl_ms: i64,
    timeout_ms: i64,
) -> Waiter {
    let mut watch = conn_db(server, db);
    let before = waiters(&mut watch, key);
    let waiter = Waiter::send(conn_db(server, db), key, owner, ttl_ms, timeout_ms);
    wait_until(&format!("{owner} waits on {key}"), SOON, || {
        assert!(
            waiter.is_waiting(),
            "{owner} did not wait on {key}: it replied at once"
        );
        waiters(&mut watch, key) == before + 1
    });
    waiter
}

/// [`queue_in`] database 0.
fn queue(server: &Server, key: &str, owner: &str, ttl_ms: i64, timeout_ms: i64) -> Waiter {
    queue_in(server, 0, key, owner, ttl_ms, timeout_ms)
}

// ---------------------------------------------------------------------------
// Hand-off on release, in arrival order, with no barging.
// ---------------------------------------------------------------------------

#[test]
fn release_hands_the_lock_to_the_waiter_with_a_higher_fence() {
    let server = Server::start();
    let mut c = server.conn();
    let alice = c.acquire("k", "alice", LONG).expect("free");
    let bob = queue(&server, "k", "bob", 5_000, 10_000);
    assert!(bob.is_waiting());
    assert_eq!(waiters(&mut c, "k"), 1);
    assert_eq!(lock_info_int(&server, "waiting"), 1);
    assert_eq!(blocked_clients(&server), 1);

    assert_eq!(c.int(&["LOCK.RELEASE", "k", "alice"]), 0);
    let fence = bob.fence();
    assert!(fence > alice, "bob's fence {fence} <= alice's {alice}");
    let info = c.lock_info("k").expect("bob holds k");
    assert_eq!(info.held(), (b"bob".to_vec(), 1, fence));
    assert_eq!(info.waiters, 0);
    assert!(info.ttl > 4_000 && info.ttl <= 5_000, "bob's ttl: {info:?}");
    assert_no_one_waits(&server);
    assert_eq!(lock_info_int(&server, "handoffs"), 1);
    assert_eq!(lock_info_int(&server, "acquired"), 2, "hand-offs count");

    // Bob holds it like any holder.
    assert_eq!(c.int(&["LOCK.RELEASE", "k", "bob"]), 0);
    assert_eq!(c.lock_info("k"), None);
}

#[test]
fn waiters_are_served_first_come_first_served_one_per_release() {
    let server = Server::start();
    let mut c = server.conn();
    let mut last_fence = c.acquire("k", "holder", LONG).expect("free");
    let mut holder = "holder".to_string();
    let mut queued: Vec<Waiter> = (0..6)
        .map(|i| queue(&server, "k", &format!("w{i}"), LONG, 0))
        .collect();
    assert_eq!(waiters(&mut c, "k"), 6);

    while !queued.is_empty() {
        let next = queued.remove(0);
        assert_eq!(c.int(&["LOCK.RELEASE", "k", &holder]), 0);
        wait_until(&format!("k is handed on from {holder}"), SOON, || {
            owner(&mut c, "k").is_some_and(|o| o != holder)
        });
        let info = c.lock_info("k").expect("held");
        assert_eq!(
            String::from_utf8_lossy(&info.owner),
            next.owner,
            "the longest-waiting client must be served first"
        );
        assert_eq!(info.waiters, queued.len() as i64);
        for later in &queued {
            assert!(later.is_waiting(), "{} was answered early", later.owner);
        }
        holder = next.owner.clone();
        let fence = next.fence();
        assert_eq!(fence, info.fence);
        assert!(fence > last_fence, "fence {fence} <= previous {last_fence}");
        last_fence = fence;
    }
    assert_eq!(lock_info_int(&server, "handoffs"), 6);
    assert_no_one_waits(&server);
}

#[test]
fn a_newcomer_cannot_take_a_freed_lock_from_its_waiter() {
    let server = Server::start();
    let mut c = server.conn();
    c.acquire("k", "alice", LONG).expect("free");
    let bob = queue(&server, "k", "bob", LONG, 0);

    // In one transaction nothing runs between the release and carol's
    // attempt: the lock is free then, and bob not served yet. Carol's `WAIT`
    // inside MULTI is a single attempt too.
    let (released, carol, carol_waiting): (i64, Option<i64>, Option<i64>) = redis::pipe()
        .atomic()
        .cmd("LOCK.RELEASE")
        .arg(&["k", "alice"])
        .cmd("LOCK.ACQUIRE")
        .arg(&["k", "carol", "1000"])
        .cmd("LOCK.ACQUIRE")
        .arg(&["k", "carol", "1000", "WAIT", "0"])
        .query(&mut c)
        .expect("MULTI/EXEC");
    assert_eq!((released, carol, carol_waiting), (0, None, None));
    let fence = bob.fence();
    assert_eq!(
        c.lock_info("k").expect("held").held(),
        (b"bob".to_vec(), 1, fence)
    );

    // The same as separate commands in one pipeline.
    let dave = queue(&server, "k", "dave", LONG, 0);
    let (released, erin): (i64, Option<i64>) = redis::pipe()
        .cmd("LOCK.RELEASE")
        .arg(&["k", "bob"])
        .cmd("LOCK.ACQUIRE")
        .arg(&["k", "erin", "1000"])
        .query(&mut c)
        .expect("pipeline");
    assert_eq!((released, erin), (0, None));
    let fence = dave.fence();
    assert_eq!(
        c.lock_info("k").expect("held").held(),
        (b"dave".to_vec(), 1, fence)
    );
    assert_no_one_waits(&server);
}

#[test]
fn the_holder_reenters_while_others_wait() {
    let server = Server::start();
    let mut c = server.conn();
    let alice = c.acquire("k", "alice", LONG).expect("free");
    let bob = queue(&server, "k", "bob", LONG, 0);

    assert_eq!(c.acquire("k", "alice", LONG), Some(alice));
    // `WAIT` does not make the holder wait behind bob.
    assert_eq!(
        c.int(&[
            "LOCK.ACQUIRE",
            "k",
            "alice",
            &LONG.to_string(),
            "WAIT",
            "1000"
        ]),
        alice
    );
    assert_eq!(c.int(&["LOCK.REENTER", "k", "alice"]), 4);
    let info = c.lock_info("k").expect("held");
    assert_eq!(
        (info.held(), info.waiters),
        ((b"alice".to_vec(), 4, alice), 1)
    );

    // Only the release to 0 hands off.
    assert_eq!(c.int(&["LOCK.RELEASE", "k", "alice"]), 3);
    thread::sleep(A_WHILE);
    assert!(
        bob.is_waiting(),
        "bob was answered while alice still held k"
    );
    assert_eq!(owner(&mut c, "k").as_deref(), Some("alice"));
    assert_eq!(c.int(&["LOCK.RELEASE", "k", "alice", "ALL"]), 0);
    let fence = bob.fence();
    assert!(fence > alice);
    assert_eq!(owner(&mut c, "k").as_deref(), Some("bob"));
}

#[test]
fn waiters_and_lock_waiting_count_the_clients_blocked_on_each_lock() {
    let server = Server::start();
    let mut c = server.conn();
    let mut c1 = conn_db(&server, 1);
    c.acquire("a", "alice", LONG).expect("free");
    c.acquire("b", "alice", LONG).expect("free");
    // Same key name in another database: another lock.
    c1.acquire("a", "alice", LONG).expect("free");
    let on_a: Vec<Waiter> = (0..3)
        .map(|i| queue(&server, "a", &format!("a{i}"), LONG, 0))
        .collect();
    let on_b: Vec<Waiter> = (0..2)
        .map(|i| queue(&server, "b", &format!("b{i}"), LONG, 0))
        .collect();
    let on_a1 = queue_in(&server, 1, "a", "x", LONG, 0);
    assert_eq!(waiters(&mut c, "a"), 3);
    assert_eq!(waiters(&mut c, "b"), 2);
    assert_eq!(waiters(&mut c1, "a"), 1);
    assert_eq!(lock_info_int(&server, "waiting"), 6);
    assert_eq!(blocked_clients(&server), 6);

    assert_eq!(c.int(&["CLIENT", "UNBLOCK", &on_a[1].id.to_string()]), 1);
    wait_until("a shows 2 waiters", SOON, || waiters(&mut c, "a") == 2);
    assert_eq!(lock_info_int(&server, "waiting"), 5);

    assert_eq!(c.int(&["LOCK.RELEASE", "b", "alice"]), 0);
    let mut on_b = on_b.into_iter();
    on_b.next().expect("b0").fence();
    assert_eq!(waiters(&mut c, "b"), 1);
    assert_eq!(waiters(&mut c, "a"), 2);
    assert_eq!(waiters(&mut c1, "a"), 1);
    assert_eq!(lock_info_int(&server, "waiting"), 4);
    assert_eq!(blocked_clients(&server), 4);
    assert!(on_a1.is_waiting());
}

// ---------------------------------------------------------------------------
// Every way a lock frees hands it off.
// ---------------------------------------------------------------------------

/// Alice holds `k` with bob waiting; `free` runs on another connection; bob
/// must then be handed `k`. Returns alice's fence and bob's.
fn hand_off_after(server: &Server, free: impl FnOnce(&mut Connection)) -> (i64, i64) {
    let mut c = server.conn();
    let elsewhere = lock_info_int(server, "waiting");
    let alice = c.acquire("k", "alice", LONG).expect("free");
    let bob = queue(server, "k", "bob", LONG, 0);
    free(&mut server.conn());
    let fence = bob.fence();
    assert!(fence > alice, "bob's fence {fence} <= alice's {alice}");
    let info = c.lock_info("k").expect("bob holds k");
    assert_eq!(
        (info.held(), info.waiters),
        ((b"bob".to_vec(), 1, fence), 0)
    );
    assert_eq!(lock_info_int(server, "handoffs"), 1);
    // Only clients waiting on other locks are left.
    assert_eq!(
        lock_info_int(server, "waiting"),
        elsewhere,
        "INFO lock_waiting"
    );
    assert_eq!(blocked_clients(server), elsewhere, "INFO blocked_clients");
    (alice, fence)
}

/// Lease-end hand-offs measured by [`a_lease_end_hands_off_within_milliseconds_and_not_before`].
const LEASE_END_TRIALS: usize = 5;

/// How late the median of those may reply after the key's end: the lease
/// check fires at the first µs Redis counts the key as ended (a fraction
/// of a ms on an idle machine); this allows for a loaded one.
const LEASE_END_MEDIAN_MS: i64 = 10;

#[test]
fn a_lease_end_hands_off_within_milliseconds_and_not_before() {
    let server = Server::start();
    let mut c = server.conn();
    let mut late_us = Vec::new();
    for trial in 0..LEASE_END_TRIALS {
        let key = format!("k{trial}");
        // Leases of 500 ms and a bit (time for bob to queue on a loaded
        // machine): the trials end at different points of a millisecond.
        let ttl = 500 + i64::try_from(trial).expect("few trials") * 7;
        let alice = c.acquire(&key, "alice", ttl).expect("free");
        let bob = queue(&server, &key, "bob", LONG, 10_000);
        // Redis counts the key live through this millisecond, ended from
        // the first µs of the next.
        let lease_end = c.int(&["PEXPIRETIME", &key]);
        let ended_from_us = (lease_end + 1) * 1_000;
        let ended = bob.end();
        let Outcome::Fence(fence) = ended.outcome else {
            panic!("bob was not handed {key} at the lease end: {ended:?}")
        };
        assert!(fence > alice);
        // A fence is max(last + 1, ms × 2^10): its high bits are the
        // server's clock at the grant, which must be past the lease end.
        let granted_ms = fence >> CLOCK_SHIFT;
        assert!(
            granted_ms > lease_end,
            "granted at {granted_ms}, while Redis counts {key} live through {lease_end}"
        );
        let late = ended.at_us - ended_from_us;
        assert!(
            (0..=PROMPT_MS * 1_000).contains(&late),
            "bob's reply came {late} µs after {key} ended (unix ms {})",
            lease_end + 1
        );
        late_us.push(late);
        assert_eq!(owner(&mut c, &key).as_deref(), Some("bob"));
    }
    late_us.sort_unstable();
    let median = late_us[late_us.len() / 2];
    assert!(
        median <= LEASE_END_MEDIAN_MS * 1_000,
        "hand-offs {late_us:?} µs after the keys ended"
    );
    let trials = i64::try_from(LEASE_END_TRIALS).expect("few trials");
    assert_eq!(lock_info_int(&server, "handoffs"), trials);
    assert_eq!(lock_info_int(&server, "expired_held"), trials);
    assert_no_one_waits(&server);
}

#[test]
fn del_hands_off() {
    let server = Server::start();
    hand_off_after(&server, |c| assert_eq!(c.int(&["DEL", "k"]), 1));
}

#[test]
fn unlink_hands_off() {
    let server = Server::start();
    hand_off_after(&server, |c| assert_eq!(c.int(&["UNLINK", "k"]), 1));
}

#[test]
fn rename_away_hands_off_the_source_and_moves_the_hold() {
    let server = Server::start();
    let (alice, _) = hand_off_after(&server, |c| {
        let _: () = c.value(&["RENAME", "k", "moved"]);
    });
    let moved = server.conn().lock_info("moved").expect("moved is held");
    assert_eq!(moved.held(), (b"alice".to_vec(), 1, alice));
}

#[test]
fn move_to_another_db_hands_off_and_moves_the_hold() {
    let server = Server::start();
    let (alice, _) = hand_off_after(&server, |c| assert_eq!(c.int(&["MOVE", "k", "1"]), 1));
    let moved = conn_db(&server, 1)
        .lock_info("k")
        .expect("k is held in db 1");
    assert_eq!(moved.held(), (b"alice".to_vec(), 1, alice));
}

#[test]
fn eviction_hands_off() {
    let server = Server::start();
    let mut c = server.conn();
    let evicted_before = server.info_int("stats", "evicted_keys");
    let alice = c.acquire("k", "alice", LONG).expect("free");
    let bob = queue(&server, "k", "bob", LONG, 0);
    let _: () = c.value(&["CONFIG", "SET", "maxmemory-policy", "allkeys-random"]);
    // No dataset fits in 1 byte: every key is evicted, the lock (the only
    // key) with it, and bob is handed the lock at once. Where the server
    // runs post-notification jobs (Valkey) the hand-off happens inside the
    // eviction loop, which then evicts bob's new hold too: so this test
    // checks the hand-off itself (bob's fence, the counter), not that bob
    // still holds the key afterwards.
    let _: () = c.value(&["CONFIG", "SET", "maxmemory", "1"]);
    let fence = bob.fence();
    let _: () = c.value(&["CONFIG", "SET", "maxmemory", "0"]);
    assert!(fence > alice, "bob's fence {fence} <= alice's {alice}");
    assert_eq!(lock_info_int(&server, "handoffs"), 1);
    assert_eq!(lock_info_int(&server, "waiting"), 0);
    assert!(
        server.info_int("stats", "evicted_keys") > evicted_before,
        "nothing was evicted"
    );
}

#[test]
fn flushdb_hands_off_and_only_in_its_db() {
    let server = Server::start();
    let mut c1 = conn_db(&server, 1);
    c1.acquire("k", "carol", LONG).expect("free");
    let dave = queue_in(&server, 1, "k", "dave", LONG, 0);
    hand_off_after(&server, |c| {
        let _: () = c.value(&["FLUSHDB"]);
    });
    // Bob was served before the checks in `hand_off_after`: dave's turn in
    // db 1, untouched by the flush of db 0, has not come.
    assert!(dave.is_waiting(), "FLUSHDB of db 0 served a waiter in db 1");
    let info = c1.lock_info("k").expect("held in db 1");
    assert_eq!((info.owner, info.waiters), (b"carol".to_vec(), 1));
}

#[test]
fn flushall_hands_off() {
    let server = Server::start();
    hand_off_after(&server, |c| {
        let _: () = c.value(&["FLUSHALL"]);
    });
}

#[test]
fn swapdb_hands_off_when_the_lock_swaps_out() {
    let server = Server::start();
    let (alice, _) = hand_off_after(&server, |c| {
        // Db 1 has no k: after the swap, k in db 0 is free.
        let _: () = c.value(&["SWAPDB", "0", "1"]);
    });
    let swapped = conn_db(&server, 1)
        .lock_info("k")
        .expect("k is held in db 1");
    assert_eq!(swapped.held(), (b"alice".to_vec(), 1, alice));
}

#[test]
fn a_set_over_the_lock_keeps_waiters_waiting_until_that_key_is_gone() {
    let server = Server::start();
    let mut c = server.conn();
    let alice = c.acquire("k", "alice", LONG).expect("free");
    let bob = queue(&server, "k", "bob", LONG, 0);

    let _: () = c.value(&["SET", "k", "a string"]);
    thread::sleep(A_WHILE);
    assert!(bob.is_waiting(), "bob was answered while k is a string");
    assert_eq!(lock_info_int(&server, "waiting"), 1);
    assert_eq!(blocked_clients(&server), 1);
    let refused = c.err(&["LOCK.ACQUIRE", "k", "carol", "1000"]);
    assert!(refused.starts_with("WRONGTYPE"), "{refused}");

    assert_eq!(c.int(&["DEL", "k"]), 1);
    let fence = bob.fence();
    assert!(fence > alice);
    assert_eq!(owner(&mut c, "k").as_deref(), Some("bob"));
    assert_no_one_waits(&server);
}

#[test]
fn a_string_with_a_ttl_over_the_lock_hands_off_when_it_expires() {
    let server = Server::start();
    let mut c = server.conn();
    c.acquire("k", "alice", LONG).expect("free");
    let bob = queue(&server, "k", "bob", LONG, 0);
    let _: () = c.value(&["SET", "k", "a string", "PX", "300"]);
    let string_end = c.int(&["PEXPIRETIME", "k"]);
    let fence = bob.fence();
    assert!(
        fence >> CLOCK_SHIFT >= string_end,
        "bob was granted k at {}, before the string expired at {string_end}",
        fence >> CLOCK_SHIFT
    );
    assert_eq!(owner(&mut c, "k").as_deref(), Some("bob"));
}

// ---------------------------------------------------------------------------
// Leaving the queue: timeout, CLIENT UNBLOCK, disconnect.
// ---------------------------------------------------------------------------

#[test]
fn wait_timeout_replies_nil_at_its_deadline_and_passes_the_turn_on() {
    let server = Server::start();
    let mut c = server.conn();
    c.acquire("k", "alice", LONG).expect("free");
    let bob = queue(&server, "k", "bob", LONG, 300);
    let carol = queue(&server, "k", "carol", LONG, 0);

    let ended = bob.end();
    assert_eq!(ended.outcome, Outcome::Nil);
    let waited = ended.waited.as_millis() as i64;
    assert!(
        (300..=300 + PROMPT_MS).contains(&waited),
        "WAIT 300 replied after {waited} ms"
    );
    assert_eq!(lock_info_int(&server, "wait_timeouts"), 1);
    assert_eq!(lock_info_int(&server, "waiting"), 1);
    assert_eq!(blocked_clients(&server), 1);
    let info = c.lock_info("k").expect("held");
    assert_eq!((info.owner, info.waiters), (b"alice".to_vec(), 1));

    assert_eq!(c.int(&["LOCK.RELEASE", "k", "alice"]), 0);
    carol.fence();
    assert_eq!(owner(&mut c, "k").as_deref(), Some("carol"));
    assert_no_one_waits(&server);
    assert_eq!(lock_info_int(&server, "wait_timeouts"), 1);
}

/// Asserts that `waiter` was answered nil `timeout_ms` after it was sent,
/// and at most [`PROMPT_MS`] late.
fn timed_out_at(waiter: Waiter, timeout_ms: i64) {
    let owner = waiter.owner.clone();
    let ended = waiter.end();
    assert_eq!(ended.outcome, Outcome::Nil, "{owner}");
    let waited = ended.waited.as_millis() as i64;
    assert!(
        (timeout_ms..=timeout_ms + PROMPT_MS).contains(&waited),
        "{owner}: WAIT {timeout_ms} replied after {waited} ms"
    );
}

#[test]
fn deadlines_end_on_time_whatever_order_they_come_in() {
    // The module keeps every deadline and one timer for the earliest: a
    // deadline earlier than all others, one armed after a waiter was
    // served before its own, and the latest must each end on time.
    let server = Server::start();
    let mut c = server.conn();
    c.acquire("a", "alice", LONG).expect("free");
    c.acquire("b", "alice", LONG).expect("free");
    let late = queue(&server, "a", "late", LONG, 1_500);
    let served = queue(&server, "b", "served", LONG, 400);
    let early = queue(&server, "a", "early", LONG, 300);
    assert_eq!(c.int(&["LOCK.RELEASE", "b", "alice"]), 0);
    served.fence();
    let behind = queue(&server, "b", "behind", LONG, 200);

    timed_out_at(early, 300);
    timed_out_at(behind, 200);
    timed_out_at(late, 1_500);
    assert_eq!(lock_info_int(&server, "wait_timeouts"), 3);
    // Served before its deadline: the lock stays with it after that time.
    assert_eq!(owner(&mut c, "b").as_deref(), Some("served"));
    assert_no_one_waits(&server);
}

#[test]
fn wait_zero_waits_without_a_limit() {
    let server = Server::start();
    let mut c = server.conn();
    c.acquire("k", "alice", LONG).expect("free");
    let bob = queue(&server, "k", "bob", LONG, 0);
    thread::sleep(Duration::from_millis(400));
    assert!(bob.is_waiting(), "WAIT 0 ended on its own");
    assert_eq!(blocked_clients(&server), 1);
    assert_eq!(lock_info_int(&server, "wait_timeouts"), 0);
    assert_eq!(c.int(&["LOCK.RELEASE", "k", "alice"]), 0);
    bob.fence();
    assert_eq!(owner(&mut c, "k").as_deref(), Some("bob"));
}

#[test]
fn client_unblock_wakes_a_waiter_with_nil_or_error_and_it_never_holds_the_lock() {
    let server = Server::start();
    let mut c = server.conn();
    c.acquire("k", "alice", LONG).expect("free");
    let bob = queue(&server, "k", "bob", LONG, 0);
    let carol = queue(&server, "k", "carol", LONG, 0);
    let dave = queue(&server, "k", "dave", LONG, 0);

    assert_eq!(c.int(&["CLIENT", "UNBLOCK", &bob.id.to_string()]), 1);
    assert_eq!(bob.end().outcome, Outcome::Nil);
    assert_eq!(waiters(&mut c, "k"), 2);

    assert_eq!(
        c.int(&["CLIENT", "UNBLOCK", &carol.id.to_string(), "ERROR"]),
        1
    );
    match carol.end().outcome {
        Outcome::Error(text) if text.starts_with("UNBLOCKED") => {}
        other => panic!("CLIENT UNBLOCK … ERROR: carol got {other:?}"),
    }
    assert_eq!(waiters(&mut c, "k"), 1);
    assert_eq!(lock_info_int(&server, "waiting"), 1);
    assert_eq!(blocked_clients(&server), 1);

    assert_eq!(c.int(&["LOCK.RELEASE", "k", "alice"]), 0);
    dave.fence();
    assert_eq!(owner(&mut c, "k").as_deref(), Some("dave"));
    // Bob and carol left the queue: once dave releases, nobody is served.
    assert_eq!(c.int(&["LOCK.RELEASE", "k", "dave"]), 0);
    thread::sleep(A_WHILE);
    assert_eq!(c.lock_info("k"), None, "an unblocked client was handed k");
    assert_no_one_waits(&server);
    assert_eq!(lock_info_int(&server, "handoffs"), 1);
    assert_eq!(
        lock_info_int(&server, "wait_timeouts"),
        0,
        "unblocks are not timeouts"
    );
}

#[test]
fn a_waiter_that_disconnects_leaves_the_queue_and_the_next_is_served() {
    let server = Server::start();
    let mut c = server.conn();
    c.acquire("k", "alice", LONG).expect("free");
    let bob = CliWaiter::start(&server, "k", "bob");
    wait_until("bob's redis-cli waits on k", SOON, || {
        waiters(&mut c, "k") == 1
    });
    let carol = queue(&server, "k", "carol", LONG, 0);
    let dave = queue(&server, "k", "dave", LONG, 0);
    assert_eq!(blocked_clients(&server), 3);

    bob.kill();
    wait_until("bob's disconnect leaves the queue", SOON, || {
        waiters(&mut c, "k") == 2 && blocked_clients(&server) == 2
    });
    assert_eq!(c.int(&["CLIENT", "KILL", "ID", &carol.id.to_string()]), 1);
    assert_eq!(carol.end().outcome, Outcome::Lost);
    wait_until("carol's disconnect leaves the queue", SOON, || {
        waiters(&mut c, "k") == 1 && blocked_clients(&server) == 1
    });
    assert_eq!(lock_info_int(&server, "waiting"), 1);

    assert_eq!(c.int(&["LOCK.RELEASE", "k", "alice"]), 0);
    dave.fence();
    assert_eq!(owner(&mut c, "k").as_deref(), Some("dave"));
    assert_eq!(c.int(&["LOCK.RELEASE", "k", "dave"]), 0);
    thread::sleep(A_WHILE);
    assert_eq!(c.lock_info("k"), None, "a disconnected client was handed k");
    assert_no_one_waits(&server);
    assert_eq!(
        lock_info_int(&server, "wait_timeouts"),
        0,
        "disconnects are not timeouts"
    );
}

// ---------------------------------------------------------------------------
// Where WAIT cannot block.
// ---------------------------------------------------------------------------

#[test]
fn wait_inside_multi_lua_or_a_function_never_blocks() {
    let server = Server::start();
    let mut c = server.conn();
    c.acquire("k", "alice", LONG).expect("free");
    let _: String = c.value(&[
        "FUNCTION",
        "LOAD",
        "#!lua name=waiting\n\
         redis.register_function('acquire_waiting', function(keys, args)\n\
           return redis.call('LOCK.ACQUIRE', keys[1], args[1], '1000', 'WAIT', '0')\n\
         end)",
    ]);
    let script = "return redis.call('LOCK.ACQUIRE', KEYS[1], ARGV[1], '1000', 'WAIT', '0')";
    let tries = |c: &mut Connection, key: &str| -> (Option<i64>, Option<i64>, Option<i64>) {
        let (multi,): (Option<i64>,) = redis::pipe()
            .atomic()
            .cmd("LOCK.ACQUIRE")
            .arg(&[key, "bob", "1000", "WAIT", "0"])
            .query(c)
            .expect("MULTI/EXEC");
        let lua: Option<i64> = redis::cmd("EVAL")
            .arg(&[script, "1", key, "bob"])
            .query(c)
            .expect("EVAL");
        let function: Option<i64> = redis::cmd("FCALL")
            .arg(&["acquire_waiting", "1", key, "bob"])
            .query(c)
            .expect("FCALL");
        (multi, lua, function)
    };

    // A call that blocked would hang until the connection's reply timeout
    // and fail here; the nil replies and the empty queue show it did not.
    assert_eq!(tries(&mut c, "k"), (None, None, None));
    assert_eq!(waiters(&mut c, "k"), 0);
    assert_no_one_waits(&server);
    assert_eq!(owner(&mut c, "k").as_deref(), Some("alice"));

    // A single attempt, not a refusal: each grants a free lock. Lua holds
    // integers as doubles, and fences stay below 2^53, so a script sees the
    // fence exactly. Raising alice's fence ahead of the clock makes the next
    // one odd, which a double rounding it would show.
    let odd = clock_floor(now_ms() + 1_800_000) + 1;
    assert_eq!(c.int(&["LOCK.FENCE", "k", "alice", &odd.to_string()]), odd);
    let (multi, lua, function) = tries(&mut c, "free");
    let multi = multi.expect("MULTI did not grant a free lock");
    assert_eq!(multi, odd + 1);
    assert_eq!(lua, Some(multi), "bob reenters from Lua: same fence");
    assert_eq!(
        function,
        Some(multi),
        "bob reenters from a function: same fence"
    );
    assert_eq!(c.lock_info("free").expect("held").count, 3);
}

// ---------------------------------------------------------------------------
// Replication, reload, restart.
// ---------------------------------------------------------------------------

#[test]
fn hand_offs_reach_the_replica_with_the_same_owner_and_fence() {
    let master = Server::builder().label("master").start();
    let replica = start_replica(&master, "replica");
    let (mut m, mut r) = (master.conn(), replica.conn());
    let assert_replicated = |m: &mut Connection, r: &mut Connection, step: &str| {
        replica.catch_up_with(&master);
        let held = m.lock_info("k").map(|info| info.held());
        assert!(held.is_some(), "{step}: k is held on the master");
        assert_eq!(
            r.lock_info("k").map(|info| info.held()),
            held,
            "{step}: replica"
        );
        assert_eq!(
            r.int(&["PEXPIRETIME", "k"]),
            m.int(&["PEXPIRETIME", "k"]),
            "{step}: lease end on the replica"
        );
    };

    m.acquire("k", "alice", LONG).expect("free");
    let bob = queue(&master, "k", "bob", LONG, 0);
    assert_eq!(m.int(&["LOCK.RELEASE", "k", "alice"]), 0);
    let fence = bob.fence();
    assert_replicated(&mut m, &mut r, "hand-off on release");
    assert_eq!(r.lock_info("k").expect("held").fence, fence);

    // A hand-off made by the module's lease timer, not by a client command.
    let carol = queue(&master, "k", "carol", LONG, 0);
    assert_eq!(m.int(&["LOCK.RENEW", "k", "bob", "200"]), 1);
    let fence = carol.fence();
    assert_replicated(&mut m, &mut r, "hand-off at the lease end");
    assert_eq!(r.lock_info("k").expect("held").fence, fence);
    assert_eq!(
        replica.info_int("lock", "lock_handoffs"),
        0,
        "not the replica's clients"
    );
    assert_eq!(master.info_int("lock", "lock_handoffs"), 2);
}

#[test]
fn debug_reload_keeps_waiters_waiting_and_they_are_served_after() {
    let server = Server::start();
    let mut c = server.conn();
    let alice = c.acquire("k", "alice", LONG).expect("free");
    let bob = queue(&server, "k", "bob", LONG, 0);
    let carol = queue(&server, "k", "carol", LONG, 0);

    let _: () = c.value(&["DEBUG", "RELOAD"]);
    // The end of loading makes the module look at every lock with waiters:
    // give that a moment, then nothing must have changed.
    thread::sleep(A_WHILE);
    assert!(
        bob.is_waiting() && carol.is_waiting(),
        "a waiter was answered by the reload"
    );
    let info = c.lock_info("k").expect("held");
    assert_eq!(
        (info.held(), info.waiters),
        ((b"alice".to_vec(), 1, alice), 2)
    );
    assert_eq!(lock_info_int(&server, "waiting"), 2);
    assert_eq!(blocked_clients(&server), 2);

    assert_eq!(c.int(&["LOCK.RELEASE", "k", "alice"]), 0);
    let bob_fence = bob.fence();
    assert_eq!(owner(&mut c, "k").as_deref(), Some("bob"));
    assert_eq!(c.int(&["LOCK.RELEASE", "k", "bob"]), 0);
    let carol_fence = carol.fence();
    assert!(alice < bob_fence && bob_fence < carol_fence);
    assert_eq!(owner(&mut c, "k").as_deref(), Some("carol"));
    assert_no_one_waits(&server);
}

#[test]
fn restart_ends_waiting_connections_and_leaves_no_waiter_behind() {
    let mut server = Server::start();
    let alice = server.conn().acquire("k", "alice", LONG).expect("free");
    let bob = queue(&server, "k", "bob", LONG, 0);
    let carol = queue(&server, "k", "carol", LONG, 0);

    // SHUTDOWN SAVE: the lock survives in the RDB, its waiters cannot.
    server.restart_saving();
    assert_eq!(bob.end().outcome, Outcome::Lost);
    assert_eq!(carol.end().outcome, Outcome::Lost);

    let mut c = server.conn();
    let info = c.lock_info("k").expect("k survives the restart");
    assert_eq!(
        (info.held(), info.waiters),
        ((b"alice".to_vec(), 1, alice), 0)
    );
    assert_no_one_waits(&server);
    assert_eq!(c.int(&["LOCK.RELEASE", "k", "alice"]), 0);
    // A leftover waiter would make this nil (no barging).
    let dave = c.acquire("k", "dave", LONG).expect("k is free for anyone");
    assert!(dave > alice);
}
