//! Redlock over independent servers: majority, renew and loss, a cancelled
//! acquisition, the fence round (and what goes wrong without it), and a
//! fenced store hammered by workers while servers are killed, restarted and
//! paused.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use redislock_client::{blocking, Error, LockOptions, LossReason, Redlock, RedlockOptions};

use redislock_testkit::{wait_until, Server};

const SECOND: Duration = Duration::from_secs(1);

fn servers(n: usize) -> Vec<Server> {
    (0..n).map(|_| Server::start()).collect()
}

fn urls(servers: &[Server]) -> Vec<String> {
    servers.iter().map(Server::url).collect()
}

#[test]
fn an_even_or_small_server_count_is_refused() {
    for n in [1, 2, 4] {
        let urls: Vec<String> = (0..n)
            .map(|i| format!("redis://127.0.0.1:{}/", 1000 + i))
            .collect();
        assert!(
            matches!(Redlock::new(urls), Err(Error::InvalidOptions(_))),
            "{n}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn majority_grants_and_a_minority_is_released() {
    let s = servers(3);
    let redlock = Redlock::new(urls(&s)).unwrap();
    let opts = LockOptions::new(SECOND * 10);

    // One server busy: 2 of 3 is a majority.
    let _: i64 = s[2].q(&["LOCK.ACQUIRE", "k", "other", "60000"]);
    let guard = redlock.try_lock("k", &opts).await.unwrap();
    for server in &s[..2] {
        let info = server.lock_info("k").expect("held");
        assert_eq!(info.owner_text(), guard.owner());
        assert_eq!(
            info.fence as u64,
            guard.fence(),
            "raised to the quorum's fence"
        );
    }
    guard.release_all().await.unwrap();
    assert!(s[0].lock_info("k").is_none() && s[1].lock_info("k").is_none());

    // Two busy: no majority, and the one server that granted is released.
    let _: i64 = s[1].q(&["LOCK.ACQUIRE", "k", "other", "60000"]);
    let err = redlock.try_lock("k", &opts).await.err();
    assert!(
        matches!(
            err,
            Some(Error::NoQuorum {
                granted: 1,
                needed: 2
            })
        ),
        "{err:?}"
    );
    assert!(
        s[0].lock_info("k").is_none(),
        "the minority grant was released"
    );
    let short = opts.clone().wait(Duration::from_millis(300));
    assert!(matches!(
        redlock.lock("k", &short).await,
        Err(Error::TimedOut)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_needs_a_majority_and_loss_follows_without_one() {
    let mut s = servers(3);
    let redlock = Redlock::new(urls(&s)).unwrap();
    let guard = redlock
        .try_lock("k", &LockOptions::new(Duration::from_millis(600)))
        .await
        .unwrap();
    s[0].kill();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(!guard.is_lost(), "two of three still renew");
    assert!(s[1].calls("lock.renew") >= 2);
    s[1].kill();
    let reason = tokio::time::timeout(SECOND * 2, guard.loss().lost())
        .await
        .expect("loss");
    assert_eq!(reason, LossReason::Expired);
    // The one server left sees no renew after the guard's release.
    drop(guard);
    wait_until("released where reachable", SECOND * 5, || {
        s[2].lock_info("k").is_none()
    });
    let calls = s[2].calls("lock.renew");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(s[2].calls("lock.renew"), calls);
    assert_eq!(redlock.background_tasks(), 0);
}

/// A Redlock acquisition cancelled mid-round (its future dropped) while one
/// server is slow: the fast servers had granted, the slow one grants after
/// the cancel. Nothing may stay held: every server is released in the
/// background, and another client gets the lock at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_acquisition_releases_on_every_server() {
    let s = servers(3);
    // Answers may take longer than the slow server's pause: the client keeps
    // its link to it, so the acquire and the release after it both run
    // there once the pause ends (a link given up would take both along).
    let patient = RedlockOptions {
        server_timeout: SECOND,
        ..RedlockOptions::default()
    };
    let redlock = Redlock::with_options(urls(&s), patient).unwrap();
    let other = Redlock::new(urls(&s)).unwrap();
    let opts = LockOptions::new(SECOND * 10);
    // Connections open first, so the cancel lands mid-round, not mid-connect.
    let warm = redlock.try_lock("warm", &opts).await.unwrap();
    warm.release_all().await.unwrap();

    for call in ["lock", "try_lock"] {
        let acquires = s[2].calls("lock.acquire");
        // Writes wait on the slow server; its grant comes after the cancel.
        let _: () = s[2].q(&["CLIENT", "PAUSE", "300", "WRITE"]);
        let limit = Duration::from_millis(30);
        let attempt = match call {
            "lock" => tokio::time::timeout(limit, redlock.lock("rk", &opts)).await,
            _ => tokio::time::timeout(limit, redlock.try_lock("rk", &opts)).await,
        };
        assert!(attempt.is_err(), "{call}: not cancelled: {attempt:?}");
        wait_until(
            &format!("{call}: the slow server ran the acquire"),
            SECOND * 5,
            || s[2].calls("lock.acquire") > acquires,
        );
        wait_until(
            &format!("{call}: rk is free on every server"),
            SECOND * 3,
            || s.iter().all(|server| server.lock_info("rk").is_none()),
        );
        let guard = other.try_lock("rk", &opts).await;
        assert!(guard.is_ok(), "{call}: {:?}", guard.err());
        if let Ok(guard) = guard {
            guard.release_all().await.unwrap();
        }
    }
    wait_until("no background task", SECOND * 5, || {
        redlock.background_tasks() == 0
    });
}

/// The scenario that needs the fence round. Server 0's counter runs ahead
/// (as a server whose clock is ahead would be). Holder A gets servers
/// {0, 1}, so its fence comes from server 0; holder B, later, gets {1, 2},
/// whose counters are behind. Without the round, B's fence is below A's and
/// a fenced resource would refuse the rightful holder; with it, A raised
/// server 1 above its fence, so B's is higher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fence_round_makes_fences_rise_from_holder_to_holder() {
    let s = servers(3);
    let ahead = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
        + 1_800_000)
        << 10;
    let _: i64 = s[0].q(&["LOCK.ACQUIRE", "scratch", "x", "60000"]);
    let _: i64 = s[0].q(&["LOCK.FENCE", "scratch", "x", &ahead.to_string()]);
    let _: i64 = s[0].q(&["LOCK.RELEASE", "scratch", "x"]);

    let opts = LockOptions::new(SECOND * 10);
    let run = |skip: bool| {
        let urls = urls(&s);
        let s = &s;
        let opts = opts.clone();
        async move {
            let options = RedlockOptions {
                skip_fence_round: skip,
                ..RedlockOptions::default()
            };
            let redlock = Redlock::with_options(urls, options).unwrap();
            let key = format!("resource-{skip}");
            let _: i64 = s[2].q(&["LOCK.ACQUIRE", &key, "blocker", "60000"]);
            let a = redlock.try_lock(&key, &opts).await.unwrap();
            let fence_a = a.fence();
            a.release_all().await.unwrap();
            let _: i64 = s[2].q(&["LOCK.RELEASE", &key, "blocker"]);
            let _: i64 = s[0].q(&["LOCK.ACQUIRE", &key, "blocker", "60000"]);
            let b = redlock.try_lock(&key, &opts).await.unwrap();
            let fence_b = b.fence();
            b.release_all().await.unwrap();
            (fence_a, fence_b)
        }
    };
    let (a, b) = run(true).await;
    assert!(a >= ahead as u64, "A's fence came from the server ahead");
    assert!(
        b < a,
        "without the fence round B's fence {b} is below A's {a}"
    );
    let (a, b) = run(false).await;
    assert!(b > a, "with the fence round B's fence {b} is above A's {a}");
}

/// A resource that keeps the highest fence it has seen and refuses writes
/// below it; it logs what it accepted.
#[derive(Default)]
struct Store {
    highest: u64,
    /// (owner, fence) of every accepted write, in order.
    accepted: Vec<(String, u64)>,
    refused: usize,
    /// Fence of each holder's first write: these must rise strictly.
    claims: Vec<u64>,
}

impl Store {
    fn write(&mut self, owner: &str, fence: u64, first: bool) -> bool {
        if fence < self.highest {
            self.refused += 1;
            return false;
        }
        if first {
            self.claims.push(fence);
        }
        self.highest = fence;
        self.accepted.push((owner.to_string(), fence));
        true
    }

    /// Every holder's accepted writes form one run (no stale write slipped
    /// in after another holder's), and fences rise strictly between runs and
    /// between claims.
    fn check(&self) -> usize {
        let mut done = HashSet::new();
        let mut runs = 0;
        for pair in self.accepted.windows(2) {
            let ((a, fa), (b, fb)) = (&pair[0], &pair[1]);
            if a != b {
                assert!(fb > fa, "fence fell from {fa} ({a}) to {fb} ({b})");
                assert!(done.insert(a.clone()), "a stale write by {a} was accepted");
                assert!(!done.contains(b), "a stale write by {b} was accepted");
                runs += 1;
            }
        }
        for pair in self.claims.windows(2) {
            assert!(pair[1] > pair[0], "claims not rising: {:?}", pair);
        }
        runs
    }
}

/// Workers take the lock through Redlock and write to the store; one of them
/// sometimes sleeps past its lease (watchdog off) before writing again. A
/// chaos thread kills and restarts servers and pauses them. The AOF is
/// fsynced at every write, so a killed server forgets no lock it granted and
/// no fence it raised: that is the persistence the fence round assumes; and
/// `lock.max-ttl` is on, as recommended for Redlock, so a restarted server
/// sits out its quarantine before it grants again.
/// The hammer's `lock.max-ttl`: above every lease its workers ask for.
const MAX_TTL_MS: u64 = 1_000;

fn hammer(n: usize) {
    let s: Vec<Server> = (0..n)
        .map(|_| {
            Server::builder()
                .appendonly(true)
                .config("lock.max-ttl", MAX_TTL_MS)
                .start()
        })
        .collect();
    // A server's start-up quarantine: wait it out before the workers begin.
    for server in &s {
        while server.info_int("lock", "lock_quarantine_ms") > 0 {
            thread::sleep(Duration::from_millis(20));
        }
    }
    let urls = urls(&s);
    let store = Arc::new(Mutex::new(Store::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let holdings = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for w in 0..4 {
        let (urls, store, stop, holdings) =
            (urls.clone(), store.clone(), stop.clone(), holdings.clone());
        workers.push(thread::spawn(move || {
            let redlock = blocking::Redlock::new(urls).unwrap();
            let sleeper = w == 0;
            let ttl = Duration::from_millis(if sleeper { 300 } else { 800 });
            let opts = LockOptions::new(ttl).wait(SECOND).watchdog(!sleeper);
            let mut round = 0;
            while !stop.load(Ordering::Relaxed) {
                let Ok(guard) = redlock.lock("resource", &opts) else {
                    continue;
                };
                round += 1;
                let (owner, fence) = (guard.owner().to_string(), guard.fence());
                for i in 0..3 {
                    if sleeper && round % 3 == 0 && i == 1 {
                        // A paused holder: past its lease, then it writes.
                        thread::sleep(ttl * 2);
                    }
                    store.lock().unwrap().write(&owner, fence, i == 0);
                    thread::sleep(Duration::from_millis(2));
                }
                holdings.fetch_add(1, Ordering::Relaxed);
                drop(guard);
            }
        }));
    }
    let mut s = s;
    let started = Instant::now();
    let mut events = 0;
    while started.elapsed() < Duration::from_secs(6) {
        thread::sleep(Duration::from_millis(600));
        let victim = events % n;
        if events % 2 == 0 {
            s[victim].kill();
            thread::sleep(Duration::from_millis(200));
            s[victim].start_again();
        } else {
            let _: () = s[victim].q(&["CLIENT", "PAUSE", "300", "WRITE"]);
        }
        events += 1;
    }
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.join().expect("worker");
    }
    let store = store.lock().unwrap();
    let runs = store.check();
    let holdings = holdings.load(Ordering::Relaxed);
    eprintln!(
        "redlock {n} servers: {holdings} holdings, {runs} holder changes, {} writes accepted, \
         {} stale writes refused, {events} kills/pauses",
        store.accepted.len(),
        store.refused
    );
    assert!(holdings >= 20, "only {holdings} holdings");
    assert!(events >= 8);
}

#[test]
fn hammered_with_3_servers_no_stale_write_and_rising_fences() {
    hammer(3);
}

#[test]
fn hammered_with_5_servers_no_stale_write_and_rising_fences() {
    hammer(5);
}
