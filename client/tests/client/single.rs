//! One server: the guard, the watchdog (renews, connection killed, server
//! paused past the lease, `NOTOWNER`), a wait longer than the ttl,
//! cancelling a wait, dropping guards in async code, `with_lock`, and the
//! blocking API.

use std::time::Duration;

use redislock_client::{blocking, Client, Error, LockOptions, LossReason};

use redislock_testkit::{wait_until, Server};

const SECOND: Duration = Duration::from_secs(1);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Waits until the client has no watchdog or release task left.
async fn no_tasks_left(client: &Client) {
    for _ in 0..1000 {
        if client.background_tasks() == 0 {
            return;
        }
        tokio::time::sleep(ms(2)).await;
    }
    panic!("{} background task(s) left", client.background_tasks());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_reports_fence_owner_and_counts_holds() {
    let server = Server::start();
    let client = Client::open(server.url()).unwrap();
    let opts = LockOptions::new(Duration::from_secs(30));
    let mut guard = client.try_lock("k", &opts).await.unwrap();
    let info = server.lock_info("k").expect("held");
    assert_eq!(info.owner_text(), guard.owner());
    assert_eq!(info.fence as u64, guard.fence());
    assert!(guard.deadline() > std::time::Instant::now() + Duration::from_secs(29));

    let other = client.try_lock("k", &opts).await;
    assert!(matches!(other, Err(Error::WouldBlock)), "{other:?}");

    assert_eq!(guard.reenter().await.unwrap(), 2);
    assert_eq!(guard.release().await.unwrap(), 1);
    assert!(server.lock_info("k").is_some(), "one hold left");
    assert_eq!(guard.release().await.unwrap(), 0);
    assert_eq!(server.lock_info("k"), None);
    assert!(matches!(guard.release().await, Err(Error::NotOwner)));
    drop(guard);
    no_tasks_left(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_the_module_is_named_as_such() {
    let server = Server::builder().without_module().start();
    let client = Client::open(server.url()).unwrap();
    let err = client.try_lock("k", &LockOptions::default()).await.err();
    assert!(matches!(err, Some(Error::ModuleMissing)), "{err:?}");
    let text = err.map(|e| e.to_string()).unwrap_or_default();
    assert!(text.contains("load the redislock module"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_renews_and_stops_before_the_release() {
    let server = Server::start();
    let client = Client::open(server.url()).unwrap();
    let mut guard = client
        .try_lock("k", &LockOptions::new(ms(300)))
        .await
        .unwrap();
    // Five leases long: held only if renewed.
    tokio::time::sleep(ms(1500)).await;
    assert!(!guard.is_lost());
    assert_eq!(
        server.lock_info("k").map(|i| i.owner_text()),
        Some(guard.owner().to_string())
    );
    let renews = server.calls("lock.renew");
    assert!(renews >= 3, "only {renews} renews in 5 leases");

    assert_eq!(guard.release().await.unwrap(), 0);
    let after_release = server.calls("lock.renew");
    tokio::time::sleep(ms(400)).await;
    assert_eq!(
        server.calls("lock.renew"),
        after_release,
        "a renew after the release"
    );
    no_tasks_left(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_survives_a_killed_connection() {
    let server = Server::start();
    let client = Client::open(server.url()).unwrap();
    let guard = client
        .try_lock("k", &LockOptions::new(ms(600)))
        .await
        .unwrap();
    let renews = server.calls("lock.renew");
    for _ in 0..3 {
        // Every client but the one that sends the kill.
        let killed: i64 = server.q(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
        assert!(killed >= 1, "the client's connection was not there");
        tokio::time::sleep(ms(300)).await;
    }
    // The watchdog reconnected and kept renewing past the first lease.
    assert!(!guard.is_lost(), "lost: {:?}", guard.loss().reason());
    assert!(server.calls("lock.renew") > renews);
    assert_eq!(
        server.lock_info("k").map(|i| i.owner_text()),
        Some(guard.owner().to_string())
    );
    drop(guard);
    wait_until("the dropped guard is released", SECOND * 5, || {
        server.lock_info("k").is_none()
    });
    no_tasks_left(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loss_fires_when_the_server_is_paused_past_the_lease() {
    let server = Server::start();
    let client = Client::open(server.url()).unwrap();
    let guard = client
        .try_lock("k", &LockOptions::new(ms(400)))
        .await
        .unwrap();
    let loss = guard.loss();
    let deadline = guard.deadline();
    let _: () = server.q(&["CLIENT", "PAUSE", "1500", "WRITE"]);
    let reason = tokio::time::timeout(SECOND, loss.lost())
        .await
        .expect("loss signalled");
    assert_eq!(reason, LossReason::Expired);
    // Not before the local deadline the last renew gave.
    assert!(std::time::Instant::now() >= deadline);
    assert!(guard.is_lost());
    let _: () = server.q(&["CLIENT", "UNPAUSE"]);
    drop(guard);
    no_tasks_left(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notowner_on_renew_is_a_loss_at_once() {
    let server = Server::start();
    let client = Client::open(server.url()).unwrap();
    let guard = client
        .try_lock("k", &LockOptions::new(ms(300)))
        .await
        .unwrap();
    // An operator forces the lock free.
    let _: i64 = server.q(&["DEL", "k"]);
    let reason = tokio::time::timeout(SECOND, guard.loss().lost())
        .await
        .expect("loss");
    assert_eq!(reason, LossReason::NotOwner);
    drop(guard);
    no_tasks_left(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_waits_first_come_first_served() {
    let server = Server::start();
    let client = Client::open(server.url()).unwrap();
    let opts = LockOptions::new(Duration::from_secs(10)).wait(Duration::from_secs(5));
    let first = client.lock("k", &opts).await.unwrap();
    let waiter = {
        let client = client.clone();
        let opts = opts.clone();
        tokio::spawn(async move { client.lock("k", &opts).await })
    };
    wait_until("one waiter", SECOND * 5, || {
        server.lock_info("k").map(|i| i.waiters) == Some(1)
    });
    let fence = first.fence();
    drop(first);
    let second = waiter.await.unwrap().unwrap();
    assert!(second.fence() > fence);
    assert_eq!(
        server.lock_info("k").map(|i| i.owner_text()),
        Some(second.owner().to_string())
    );

    // A wait that times out on the server: TimedOut, and no waiter left.
    let short = LockOptions::new(Duration::from_secs(10)).wait(ms(100));
    let err = client.lock("k", &short).await.err();
    assert!(matches!(err, Some(Error::TimedOut)), "{err:?}");
    assert_eq!(server.lock_info("k").map(|i| i.waiters), Some(0));
}

/// Another owner takes `key` for `lease` ms and lets its lease run out: a
/// waiter is granted the lock then, after waiting that long.
fn held_by_another_for(server: &Server, key: &str, lease: u64) {
    let fence: i64 = server.q(&["LOCK.ACQUIRE", key, "other", &lease.to_string()]);
    assert!(fence > 0);
}

/// A lease granted to a waiter starts at the grant, so a wait longer than
/// the ttl must still hand over a live guard, which the watchdog keeps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_longer_than_the_ttl_hands_over_a_live_guard() {
    let server = Server::start();
    let client = Client::open(server.url()).unwrap();
    let ttl = ms(400);
    let opts = LockOptions::new(ttl).wait(SECOND * 5);

    held_by_another_for(&server, "wl", 700);
    let asked = std::time::Instant::now();
    let guard = client.lock("wl", &opts).await.unwrap();
    let granted = std::time::Instant::now();
    assert!(granted - asked > ttl, "waited only {:?}", granted - asked);
    assert!(
        !guard.is_lost(),
        "lost at once: {:?}",
        guard.loss().reason()
    );
    assert!(
        guard.deadline() > granted + ttl / 2,
        "deadline {:?} after the grant",
        guard.deadline().saturating_duration_since(granted)
    );
    // Over two more leases the watchdog keeps it.
    let renews = server.calls("lock.renew");
    wait_until("six renews", SECOND * 5, || {
        server.calls("lock.renew") >= renews + 6
    });
    assert!(!guard.is_lost(), "lost: {:?}", guard.loss().reason());
    assert_eq!(
        server.lock_info("wl").map(|i| i.owner_text()),
        Some(guard.owner().to_string())
    );
    drop(guard);
    wait_until("released", SECOND * 5, || server.lock_info("wl").is_none());

    // with_lock after such a wait: the closure runs under a live lock.
    held_by_another_for(&server, "wl", 700);
    let result = client
        .with_lock("wl", &opts, |token| async move { token.is_cancelled() })
        .await;
    assert!(matches!(result, Ok(false)), "{result:?}");
    no_tasks_left(&client).await;
}

/// After a long wait the local deadline is never past the server's lease
/// end: without the watchdog the loss fires before the server lets go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_long_wait_the_loss_comes_before_the_server_lease_ends() {
    let server = Server::start();
    let client = Client::open(server.url()).unwrap();
    let ttl = ms(400);
    let opts = LockOptions::new(ttl).wait(SECOND * 5).watchdog(false);
    held_by_another_for(&server, "wl", 700);
    let guard = client.lock("wl", &opts).await.unwrap();
    let granted = std::time::Instant::now();
    assert!(
        !guard.is_lost(),
        "lost at once: {:?}",
        guard.loss().reason()
    );
    let deadline = guard.deadline();
    assert!(deadline > granted + ttl / 2);
    wait_until("the server lease ends", SECOND * 5, || {
        server.lock_info("wl").is_none()
    });
    let ended = std::time::Instant::now();
    assert!(
        deadline <= ended,
        "local deadline {:?} past the server lease end",
        deadline - ended
    );
    let reason = tokio::time::timeout(SECOND, guard.loss().lost())
        .await
        .expect("loss");
    assert_eq!(reason, LossReason::Expired);
    drop(guard);
    no_tasks_left(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_wait_leaves_no_waiter_and_no_grant() {
    let server = Server::start();
    let client = Client::open(server.url()).unwrap();
    let opts = LockOptions::new(Duration::from_secs(60)).wait(Duration::from_secs(60));
    for round in 0..10 {
        let _: i64 = server.q(&["LOCK.ACQUIRE", "k", "holder", "60000"]);
        let waiting = {
            let client = client.clone();
            let opts = opts.clone();
            tokio::spawn(async move { client.lock("k", &opts).await })
        };
        wait_until("the client waits", SECOND * 5, || {
            server.lock_info("k").map(|i| i.waiters) == Some(1)
        });
        if round % 2 == 0 {
            // Cancel while parked: the server drops the waiter.
            waiting.abort();
            let _ = waiting.await;
            wait_until("no waiter", SECOND * 5, || {
                server.lock_info("k").map(|i| i.waiters) == Some(0)
            });
            let _: i64 = server.q(&["LOCK.RELEASE", "k", "holder"]);
        } else {
            // Cancel as the grant crosses: the hold must not stay behind.
            let _: i64 = server.q(&["LOCK.RELEASE", "k", "holder"]);
            waiting.abort();
            let _ = waiting.await;
        }
        wait_until(
            &format!("round {round}: the lock is free"),
            SECOND * 5,
            || server.lock_info("k").is_none(),
        );
    }
    no_tasks_left(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guards_dropped_in_async_code_are_released_in_the_background() {
    let server = Server::start();
    let client = Client::open(server.url()).unwrap();
    let opts = LockOptions::new(Duration::from_secs(30));
    for i in 0..20 {
        let mut guard = client.try_lock(&format!("k{i}"), &opts).await.unwrap();
        if i % 2 == 0 {
            guard.reenter().await.unwrap();
        }
        // Dropped inside async code: nothing blocks here.
    }
    wait_until("all 20 locks are free", SECOND * 5, || {
        let n: i64 = server.q(&["DBSIZE"]);
        n == 0
    });
    no_tasks_left(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lock_runs_the_closure_and_reports_a_loss() {
    let server = Server::start();
    let client = Client::open(server.url()).unwrap();
    let opts = LockOptions::new(ms(400));
    let out = client
        .with_lock("k", &opts, |_token| async { 42 })
        .await
        .unwrap();
    assert_eq!(out, 42);
    assert_eq!(server.lock_info("k"), None);

    // Paused past the lease inside the closure: the token is cancelled and
    // the call says the lock was lost.
    let pauser = server.conn();
    let result = client
        .with_lock("k", &opts, |token| async move {
            let mut pauser = pauser;
            let _: () = redis::cmd("CLIENT")
                .arg(&["PAUSE", "1200", "WRITE"])
                .query(&mut pauser)
                .unwrap();
            tokio::time::timeout(SECOND * 2, token.cancelled())
                .await
                .is_ok()
        })
        .await;
    assert!(
        matches!(result, Err(Error::Lost(LossReason::Expired))),
        "{result:?}"
    );
    no_tasks_left(&client).await;
}

#[test]
fn blocking_api_has_the_same_shape() {
    let server = Server::start();
    let client = blocking::Client::open(server.url()).unwrap();
    let opts = LockOptions::new(ms(300)).wait(SECOND);
    let mut guard = client.lock("k", &opts).unwrap();
    assert!(matches!(
        client.try_lock("k", &opts),
        Err(Error::WouldBlock)
    ));
    std::thread::sleep(ms(900));
    assert!(
        !guard.is_lost(),
        "the watchdog renews while this thread sleeps"
    );
    assert!(server.calls("lock.renew") >= 2);
    assert_eq!(guard.reenter().unwrap(), 2);
    assert_eq!(guard.release().unwrap(), 1);
    drop(guard);
    wait_until("released on drop", SECOND * 5, || {
        server.lock_info("k").is_none()
    });

    // A wait that ends: TimedOut, no waiter left.
    let _: i64 = server.q(&["LOCK.ACQUIRE", "k", "holder", "60000"]);
    let short = LockOptions::new(SECOND).wait(ms(150));
    assert!(matches!(client.lock("k", &short), Err(Error::TimedOut)));
    assert_eq!(server.lock_info("k").map(|i| i.waiters), Some(0));
    let _: i64 = server.q(&["LOCK.RELEASE", "k", "holder"]);

    let out = client
        .with_lock("k", &opts, |loss| !loss.is_lost())
        .unwrap();
    assert!(out);

    // A wait longer than the ttl: the guard is live and the watchdog keeps it.
    held_by_another_for(&server, "k", 500);
    let guard = client.lock("k", &opts).unwrap();
    assert!(
        !guard.is_lost(),
        "lost at once: {:?}",
        guard.loss().reason()
    );
    assert_eq!(guard.wait_lost(ms(700)), None);
    assert_eq!(
        server.lock_info("k").map(|i| i.owner_text()),
        Some(guard.owner().to_string())
    );
    drop(guard);
    wait_until("released on drop", SECOND * 5, || {
        server.lock_info("k").is_none()
    });
    held_by_another_for(&server, "k", 500);
    let out = client.with_lock("k", &opts, |loss| loss.is_lost());
    assert!(matches!(out, Ok(false)), "{out:?}");

    // Watchdog off: the loss signal fires at the local deadline.
    let guard = client
        .lock("k", &LockOptions::new(ms(200)).watchdog(false))
        .unwrap();
    assert_eq!(guard.wait_lost(SECOND), Some(LossReason::Expired));
    assert!(std::time::Instant::now() >= guard.deadline());
    drop(guard);
    wait_until("no background task", SECOND * 5, || {
        client.background_tasks() == 0
    });
}

/// `release()` dropped while writes are paused (its `LOCK.RELEASE` lands
/// after the pause): the guard no longer says it holds the lock, it reports
/// the loss (release not confirmed), and the release lands by itself after
/// the pause, so another owner gets the lock long before its lease ends.
/// Before, the guard said `count() == 1` and `is_lost() == false` for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_release_reports_the_loss_and_lands_later() {
    let server = Server::start();
    let client = Client::open(server.url()).unwrap();
    let mut guard = client
        .try_lock("k", &LockOptions::new(Duration::from_secs(30)))
        .await
        .unwrap();
    let _: String = server.q(&["CLIENT", "PAUSE", "500", "WRITE"]);
    let cancelled = tokio::time::timeout(ms(100), guard.release()).await;
    assert!(cancelled.is_err(), "the release waited out the pause");
    assert_eq!(guard.count(), 0);
    assert!(guard.is_lost());
    assert_eq!(guard.loss().reason(), Some(LossReason::ReleaseUnconfirmed));
    let other = client
        .lock(
            "k",
            &LockOptions::new(Duration::from_secs(30)).wait(ms(3_000)),
        )
        .await
        .expect("the release landed after the pause");
    assert_eq!(guard.count(), 0);
    assert!(guard.is_lost());
    drop(other);
    no_tasks_left(&client).await;
}

/// A try whose grant is in flight when it is dropped (writes paused, so
/// the grant lands after the drop) gives the grant back on its own, long
/// before the 30 s lease; so does a try that gave up on a late reply
/// (`DEBUG SLEEP` past the client's response timeout). Before, both left
/// a hold nobody owned for the whole lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_cancelled_with_its_grant_in_flight_leaves_nothing_held() {
    let server = Server::start();
    let client = Client::open(server.url()).unwrap();
    let opts = LockOptions::new(Duration::from_secs(30));
    drop(client.try_lock("warm", &opts).await.unwrap());
    let _: String = server.q(&["CLIENT", "PAUSE", "800", "WRITE"]);
    let paused = tokio::time::Instant::now();
    let cancelled = tokio::time::timeout(ms(200), client.try_lock("k", &opts)).await;
    assert!(cancelled.is_err());
    let sem = client.semaphore("s", 2).unwrap();
    let cancelled = tokio::time::timeout(ms(200), sem.try_acquire(&opts)).await;
    assert!(cancelled.is_err());
    // The grants land once the pause is over.
    tokio::time::sleep_until(paused + ms(1_000)).await;
    wait_until("both grants are given back", Duration::from_secs(3), || {
        server.lock_info("k").is_none() && server.lock_info("s").is_none()
    });
    no_tasks_left(&client).await;
}

/// A wait too long for the clock (`Duration::MAX`) is a wait without a
/// limit, not an overflow: the call waits, and is cancelled cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_longer_than_the_clock_can_add_waits_without_overflow() {
    let server = Server::start();
    let client = Client::open(server.url()).unwrap();
    held_by_another_for(&server, "k", 60_000);
    let opts = LockOptions::new(Duration::from_secs(10)).wait(Duration::MAX);
    let waited = tokio::time::timeout(ms(500), client.lock("k", &opts)).await;
    assert!(waited.is_err(), "still waiting after 500 ms: {waited:?}");
    wait_until("the waiter is gone", Duration::from_secs(3), || {
        server.lock_info("k").is_some_and(|i| i.waiters == 0)
    });
    no_tasks_left(&client).await;
}
