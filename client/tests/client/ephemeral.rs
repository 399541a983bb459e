//! Ephemeral holds: the guard keeps a connection of its own for the hold's
//! life; the server ends the hold when that connection closes, and the
//! guard's loss signal says so.

use std::time::Duration;

use redislock_client::{blocking, Client, Error, LockOptions, LossReason};

use redislock_testkit::{wait_until, Server};

fn opts() -> LockOptions {
    LockOptions::new(Duration::from_secs(30))
        .wait(Duration::from_secs(5))
        .ephemeral(true)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_hold_connection_frees_the_lock_at_once_and_fires_the_loss() {
    let server = Server::start();
    let client = Client::open(server.url()).unwrap();
    let guard = client.try_lock("k", &opts()).await.unwrap();
    let info = server.lock_info("k").expect("held");
    assert_eq!(info.fence as u64, guard.fence());
    let waiter = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .lock("k", &LockOptions::new(Duration::from_secs(30)))
                .await
        })
    };
    wait_until("the waiter waits", Duration::from_secs(5), || {
        server.lock_info("k").is_some_and(|i| i.waiters == 1)
    });
    // The hold's own connection is the one speaking RESP3.
    let killed: i64 = server.q(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
    assert!(killed >= 1);
    let reason = tokio::time::timeout(Duration::from_secs(2), guard.loss().lost())
        .await
        .expect("the loss fires when the connection closes");
    assert_eq!(reason, LossReason::Disconnected);
    // The waiter's own connection was killed too (it was a normal client):
    // what matters is that the 30 s lease did not keep the lock.
    let _ = waiter.await;
    wait_until("the hold ended", Duration::from_secs(2), || {
        server
            .lock_info("k")
            .is_none_or(|i| i.owner_text() != guard.owner())
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_ephemeral_hold_closes_its_connection_and_reports_no_loss() {
    let server = Server::start();
    let client = Client::open(server.url()).unwrap();
    let mut guard = client.lock("k", &opts()).await.unwrap();
    // The hold's own connection is the one speaking RESP3.
    let holding: String = server.q(&["CLIENT", "LIST"]);
    assert!(holding.contains("resp=3"), "{holding}");
    assert_eq!(guard.release().await.unwrap(), 0);
    assert_eq!(server.lock_info("k"), None);
    wait_until(
        "the hold's connection closed",
        Duration::from_secs(2),
        || {
            let now: String = server.q(&["CLIENT", "LIST"]);
            !now.contains("resp=3")
        },
    );
    assert!(!guard.is_lost());
}

#[test]
fn ephemeral_holds_need_one_server_and_work_from_the_blocking_api() {
    let server = Server::start();
    let client = blocking::Client::open(server.url()).unwrap();
    let mut guard = client.try_lock("k", &opts()).unwrap();
    let held = server.lock_info("k").expect("held");
    assert_eq!(held.owner_text(), guard.owner());
    guard.release().unwrap();

    let cluster = blocking::Client::cluster(["redis://127.0.0.1:1/"]).unwrap();
    let refused = cluster.try_lock("k", &opts());
    assert!(
        matches!(refused, Err(Error::InvalidOptions(_))),
        "{refused:?}"
    );
}

/// A `release_all` dropped while writes are paused: the release goes on in
/// the background and, once it lands, the hold's task and its RESP3
/// connection are gone (before, both stayed for the process's life).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_release_all_leaves_no_task_or_connection() {
    let server = Server::start();
    let client = Client::open(server.url()).unwrap();
    let guard = client.try_lock("k", &opts()).await.unwrap();
    let loss = guard.loss();
    let _: String = server.q(&["CLIENT", "PAUSE", "500", "WRITE"]);
    let cancelled = tokio::time::timeout(Duration::from_millis(100), guard.release_all()).await;
    assert!(cancelled.is_err(), "the release waited out the pause");
    assert_eq!(loss.reason(), Some(LossReason::ReleaseUnconfirmed));
    wait_until("the release landed", Duration::from_secs(3), || {
        server.lock_info("k").is_none()
    });
    wait_until("no task runs", Duration::from_secs(3), || {
        client.background_tasks() == 0
    });
    wait_until(
        "the hold's connection is closed",
        Duration::from_secs(3),
        || {
            let clients: String = server.q(&["CLIENT", "LIST"]);
            !clients.contains("resp=3")
        },
    );
}
