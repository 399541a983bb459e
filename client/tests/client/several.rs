//! Several at once: a lock on several keys ([`Client::lock_keys`]), all or
//! none, one watchdog for every key, lost when any key is, released
//! together; and several permits of a semaphore as one hold.

use std::time::Duration;

use redislock_client::{Client, Error, LockOptions, LossReason};

use redislock_testkit::{wait_until, Call, Server};

fn held(server: &Server, key: &str) -> bool {
    server.lock_info(key).is_some()
}

fn waiters(server: &Server, key: &str) -> i64 {
    server.lock_info(key).map_or(0, |info| info.waiters)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_is_taken_with_a_fence_each_or_none() {
    let server = Server::start();
    let client = Client::open(server.url()).unwrap();
    let opts = LockOptions::new(Duration::from_secs(10));
    let keys = ["acct:1", "acct:2", "acct:3"];
    let guard = client.try_lock_keys(&keys, &opts).await.unwrap();
    assert_eq!(guard.keys(), keys);
    let fences = guard.fences().to_vec();
    assert_eq!(fences.len(), 3);
    assert!(
        fences.windows(2).all(|pair| pair[0] < pair[1]),
        "{fences:?}"
    );
    for (key, fence) in keys.iter().zip(&fences) {
        let info = server.lock_info(key).expect("held");
        assert_eq!(info.owner_text(), guard.owner());
        assert_eq!(info.fence, i64::try_from(*fence).unwrap());
        assert_eq!(guard.fence_of(key), Some(*fence));
    }
    guard.release().await.unwrap();
    assert!(keys.iter().all(|key| !held(&server, key)));

    // One key held elsewhere: none is taken.
    let other = client.try_lock("acct:2", &opts).await.unwrap();
    assert!(matches!(
        client.try_lock_keys(&keys, &opts).await,
        Err(Error::WouldBlock)
    ));
    assert!(!held(&server, "acct:1") && !held(&server, "acct:3"));
    drop(other);

    for bad in [&[][..], &["a", "b", "a"][..]] {
        assert!(matches!(
            client.try_lock_keys(bad, &opts).await,
            Err(Error::InvalidOptions(_))
        ));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_on_the_same_keys_in_crossing_orders_are_served_in_turn() {
    let server = Server::start();
    let client = Client::open(server.url()).unwrap();
    let opts = LockOptions::new(Duration::from_secs(10)).wait(Duration::from_secs(10));
    let blocker = client.try_lock("x", &opts).await.unwrap();
    let forward = {
        let (client, opts) = (client.clone(), opts.clone());
        tokio::spawn(async move { client.lock_keys(&["x", "y"], &opts).await })
    };
    wait_until("the first waits", Duration::from_secs(5), || {
        waiters(&server, "x") == 1
    });
    let backward = {
        let (client, opts) = (client.clone(), opts.clone());
        tokio::spawn(async move { client.lock_keys(&["y", "x"], &opts).await })
    };
    wait_until("both wait", Duration::from_secs(5), || {
        waiters(&server, "x") == 2
    });
    assert!(!held(&server, "y"), "y granted out of turn");
    blocker.release_all().await.unwrap();
    let first = forward.await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!backward.is_finished(), "both granted at once");
    first.release().await.unwrap();
    let second = backward.await.unwrap().unwrap();
    assert_eq!(second.keys(), ["y", "x"]);
    second.release().await.unwrap();
    assert!(!held(&server, "x") && !held(&server, "y"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_watchdog_keeps_every_key_and_any_lost_key_loses_the_lock() {
    let server = Server::start();
    let client = Client::open(server.url()).unwrap();
    let opts = LockOptions::new(Duration::from_millis(1_500));
    let keys = ["k1", "k2", "k3"];
    let guard = client.try_lock_keys(&keys, &opts).await.unwrap();
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert!(guard.is_held());
    assert!(keys.iter().all(|key| held(&server, key)), "a key expired");
    server.conn().int(&["DEL", "k2"]);
    let reason = tokio::time::timeout(Duration::from_secs(5), guard.loss().lost())
        .await
        .expect("lost within 5 s");
    assert_eq!(reason, LossReason::NotOwner);
    assert!(!guard.is_held());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_dropped_while_parked_leaves_no_key_held() {
    let server = Server::start();
    let client = Client::open(server.url()).unwrap();
    let opts = LockOptions::new(Duration::from_secs(10)).wait_forever();
    let blocker = client.try_lock("k2", &opts).await.unwrap();
    let waited = tokio::time::timeout(
        Duration::from_millis(300),
        client.lock_keys(&["k1", "k2"], &opts),
    )
    .await;
    assert!(waited.is_err(), "the wait was not parked");
    wait_until("the waiter is gone", Duration::from_secs(3), || {
        waiters(&server, "k2") == 0
    });
    blocker.release_all().await.unwrap();
    wait_until("every key free", Duration::from_secs(3), || {
        !held(&server, "k1") && !held(&server, "k2")
    });
    wait_until("nothing running", Duration::from_secs(3), || {
        client.background_tasks() == 0
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_are_one_hold_and_a_big_request_is_not_overtaken() {
    let server = Server::start();
    let client = Client::open(server.url()).unwrap();
    let opts = LockOptions::new(Duration::from_secs(10)).wait(Duration::from_secs(10));
    let pool = client.semaphore("pool", 4).unwrap();
    assert!(matches!(
        pool.try_acquire_permits(5, &opts).await,
        Err(Error::InvalidOptions(_))
    ));
    let first = pool.acquire_permits(2, &opts).await.unwrap();
    let big = {
        let (pool, opts) = (pool.clone(), opts.clone());
        tokio::spawn(async move { pool.acquire_permits(3, &opts).await })
    };
    wait_until("the big request waits", Duration::from_secs(5), || {
        waiters(&server, "pool") == 1
    });
    // Two permits are free, but the big request came first.
    assert!(matches!(
        pool.try_acquire(&opts).await,
        Err(Error::WouldBlock)
    ));
    first.release_all().await.unwrap();
    let big = big.await.unwrap().unwrap();
    assert_eq!(server.lock_info("pool").expect("held").holders.len(), 1);
    let one = pool.try_acquire(&opts).await.unwrap();
    assert!(matches!(
        pool.try_acquire(&opts).await,
        Err(Error::WouldBlock)
    ));
    big.release_all().await.unwrap();
    one.release_all().await.unwrap();
    assert!(!held(&server, "pool"));
}

#[test]
fn the_blocking_api_takes_several_keys_and_several_permits() {
    let server = Server::start();
    let client = redislock_client::blocking::Client::open(server.url()).unwrap();
    let opts = LockOptions::new(Duration::from_secs(10));
    let guard = client.try_lock_keys(&["b1", "b2"], &opts).unwrap();
    assert_eq!(guard.fences().len(), 2);
    assert!(held(&server, "b1") && held(&server, "b2"));
    assert!(matches!(
        client.try_lock_keys(&["b2", "b3"], &opts),
        Err(Error::WouldBlock)
    ));
    guard.release().unwrap();
    assert!(!held(&server, "b1") && !held(&server, "b2"));
    let pool = client.semaphore("bp", 3).unwrap();
    let two = pool.try_acquire_permits(2, &opts).unwrap();
    assert!(matches!(
        pool.try_acquire_permits(2, &opts),
        Err(Error::WouldBlock)
    ));
    two.release_all().unwrap();
}
