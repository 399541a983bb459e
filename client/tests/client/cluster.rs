//! A Redis Cluster of three masters: each lock goes to the node serving its
//! key; the watchdog renews there; waits and drops behave as on one server.

use std::time::Duration;

use redislock_client::{blocking, Client, Error, LockOptions, LossReason};

use redislock_testkit::{wait_until, Cluster};

const SECOND: Duration = Duration::from_secs(1);

/// Keys on each of the three masters.
const KEYS: [&str; 3] = ["{a}lock", "{b}lock", "{c}lock"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guards_watchdog_and_waits_on_every_master() {
    let cluster = Cluster::start();
    let client = Client::cluster(cluster.urls()).unwrap();
    let opts = LockOptions::new(Duration::from_millis(300)).wait(SECOND * 5);
    let mut ports: Vec<u16> = KEYS.iter().map(|k| cluster.node_of(k).port()).collect();
    ports.dedup();
    assert_eq!(ports.len(), 3, "the keys cover the three masters");

    let mut guards = Vec::new();
    for key in KEYS {
        let guard = client.lock(key, &opts).await.unwrap();
        let node = cluster.node_of(key);
        assert_eq!(
            node.lock_info(key).map(|i| i.fence as u64),
            Some(guard.fence())
        );
        guards.push(guard);
    }
    // Several leases: each master saw renews for its key.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    for (key, guard) in KEYS.iter().zip(&guards) {
        assert!(!guard.is_lost(), "{key}");
        assert!(cluster.node_of(key).calls("lock.renew") >= 2, "{key}");
    }

    // A waiter on the first key gets it when its guard is dropped.
    let waiter = {
        let client = client.clone();
        let opts = opts.clone();
        tokio::spawn(async move { client.lock(KEYS[0], &opts).await })
    };
    let node = cluster.node_of(KEYS[0]);
    wait_until("one waiter", SECOND * 5, || {
        node.lock_info(KEYS[0]).map(|i| i.waiters) == Some(1)
    });
    let old = guards.remove(0);
    let old_fence = old.fence();
    drop(old);
    let handed = waiter.await.unwrap().unwrap();
    assert!(handed.fence() > old_fence);

    // A cancelled wait leaves nothing behind.
    let cancelled = {
        let client = client.clone();
        let opts = opts.clone();
        tokio::spawn(async move { client.lock(KEYS[1], &opts).await })
    };
    let node = cluster.node_of(KEYS[1]);
    wait_until("one waiter", SECOND * 5, || {
        node.lock_info(KEYS[1]).map(|i| i.waiters) == Some(1)
    });
    cancelled.abort();
    let _ = cancelled.await;
    wait_until("no waiter", SECOND * 5, || {
        node.lock_info(KEYS[1]).map(|i| i.waiters) == Some(0)
    });

    drop(handed);
    drop(guards);
    for key in KEYS {
        let node = cluster.node_of(key);
        wait_until(&format!("{key} is free"), SECOND * 5, || {
            node.lock_info(key).is_none()
        });
    }

    // A wait longer than the ttl: the lease starts at the grant, so the
    // guard is live and its master sees the watchdog keep it.
    let node = cluster.node_of(KEYS[2]);
    let _: i64 = node.q(&["LOCK.ACQUIRE", KEYS[2], "other", "700"]);
    let guard = client.lock(KEYS[2], &opts).await.unwrap();
    assert!(
        !guard.is_lost(),
        "lost at once: {:?}",
        guard.loss().reason()
    );
    let renews = node.calls("lock.renew");
    wait_until("four renews", SECOND * 5, || {
        node.calls("lock.renew") >= renews + 4
    });
    assert!(!guard.is_lost(), "lost: {:?}", guard.loss().reason());
    assert_eq!(
        node.lock_info(KEYS[2]).map(|i| i.owner_text()),
        Some(guard.owner().to_string())
    );
    drop(guard);
    wait_until("released", SECOND * 5, || node.lock_info(KEYS[2]).is_none());
    wait_until("no background task", SECOND * 5, || {
        client.background_tasks() == 0
    });
}

#[test]
fn blocking_guard_on_a_cluster_loses_its_lock_when_its_master_pauses() {
    let cluster = Cluster::start();
    let client = blocking::Client::cluster(cluster.urls()).unwrap();
    let opts = LockOptions::new(Duration::from_millis(400));
    let guard = client.try_lock(KEYS[2], &opts).unwrap();
    assert!(matches!(
        client.try_lock(KEYS[2], &opts),
        Err(Error::WouldBlock)
    ));
    let node = cluster.node_of(KEYS[2]);
    let _: () = node.q(&["CLIENT", "PAUSE", "1500", "WRITE"]);
    assert_eq!(guard.wait_lost(SECOND * 2), Some(LossReason::Expired));
    let _: () = node.q(&["CLIENT", "UNPAUSE"]);
    drop(guard);
    wait_until("released", SECOND * 5, || node.lock_info(KEYS[2]).is_none());
}
