//! Shared holds: read-write locks and semaphores, async and blocking. Each
//! guard is a hold of its own (fence, lease, watchdog); the server keeps one
//! queue, first come first served, for both modes.

use std::collections::HashMap;
use std::time::Duration;

use redislock_client::{blocking, Client, Error, LockOptions};

use redislock_testkit::{wait_until, Server};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// `LOCK.INFO key`'s integer fields and its holders' owners (empty: free).
fn info(server: &Server, key: &str) -> (HashMap<String, i64>, Vec<String>) {
    let reply: redis::Value = server.q(&["LOCK.INFO", key]);
    let mut ints = HashMap::new();
    let mut owners = Vec::new();
    let redis::Value::Array(items) = reply else {
        return (ints, owners);
    };
    for pair in items.chunks(2) {
        let [field, value] = pair else {
            continue;
        };
        let Some(field) = text(field) else {
            continue;
        };
        match value {
            redis::Value::Int(n) => {
                ints.insert(field, *n);
            }
            redis::Value::Array(holders) if field == "holders" => {
                for holder in holders {
                    let redis::Value::Array(fields) = holder else {
                        continue;
                    };
                    if let Some(owner) = fields.get(1).and_then(text) {
                        owners.push(owner);
                    }
                }
            }
            _ => {}
        }
    }
    (ints, owners)
}

fn text(value: &redis::Value) -> Option<String> {
    match value {
        redis::Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).to_string()),
        redis::Value::SimpleString(text) => Some(text.clone()),
        _ => None,
    }
}

fn waiters(server: &Server, key: &str) -> i64 {
    info(server, key).0.get("waiters").copied().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_and_the_writer_waits_for_every_one() {
    let server = Server::start();
    let client = Client::open(server.url()).unwrap();
    let opts = LockOptions::new(Duration::from_secs(30)).wait(Duration::from_secs(5));
    let mut first = client.read_lock("k", &opts).await.unwrap();
    let mut second = client.try_read_lock("k", &opts).await.unwrap();
    assert_ne!(first.fence(), second.fence());
    let (ints, owners) = info(&server, "k");
    assert_eq!(ints.get("count"), Some(&2), "{ints:?}");
    assert_eq!(owners, [first.owner(), second.owner()]);
    assert!(matches!(
        client.try_lock("k", &opts).await,
        Err(Error::WouldBlock)
    ));

    let writer = {
        let client = client.clone();
        let opts = opts.clone();
        tokio::spawn(async move { client.write_lock("k", &opts).await })
    };
    wait_until("the writer waits", Duration::from_secs(5), || {
        waiters(&server, "k") == 1
    });
    // A reader arriving now queues behind the writer: no barging.
    assert!(matches!(
        client.try_read_lock("k", &opts).await,
        Err(Error::WouldBlock)
    ));
    assert_eq!(first.release().await.unwrap(), 0);
    assert!(!writer.is_finished());
    let top = second.fence();
    assert_eq!(second.release().await.unwrap(), 0);
    let mut writer = writer.await.unwrap().unwrap();
    assert!(writer.fence() > top);
    assert_eq!(info(&server, "k").1, [writer.owner()]);
    writer.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_lets_limit_holders_in_and_hands_permits_on_in_order() {
    let server = Server::start();
    let client = Client::open(server.url()).unwrap();
    let pool = client.semaphore("pool", 2).unwrap();
    let opts = LockOptions::new(Duration::from_secs(30)).wait(Duration::from_secs(5));
    let mut a = pool.acquire(&opts).await.unwrap();
    let b = pool.try_acquire(&opts).await.unwrap();
    assert!(matches!(
        pool.try_acquire(&opts).await,
        Err(Error::WouldBlock)
    ));
    let waiter = {
        let pool = pool.clone();
        let opts = opts.clone();
        tokio::spawn(async move { pool.acquire(&opts).await })
    };
    wait_until("a permit is awaited", Duration::from_secs(5), || {
        waiters(&server, "pool") == 1
    });
    assert_eq!(info(&server, "pool").0.get("limit"), Some(&2));
    a.release().await.unwrap();
    let c = waiter.await.unwrap().unwrap();
    assert!(c.fence() > b.fence());
    assert_eq!(info(&server, "pool").1, [b.owner(), c.owner()]);

    // Another limit on the same key while permits are held: refused.
    let other = client.semaphore("pool", 3).unwrap();
    let refused = other.try_acquire(&opts).await;
    assert!(matches!(refused, Err(Error::LimitMismatch)), "{refused:?}");
    assert_eq!(info(&server, "pool").1.len(), 2);
    for bad in [0, 1_000_001] {
        assert!(matches!(
            client.semaphore("pool", bad),
            Err(Error::InvalidOptions(_))
        ));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_keeps_its_lease_with_its_own_watchdog_and_reports_its_loss() {
    let server = Server::start();
    let client = Client::open(server.url()).unwrap();
    let pool = client.semaphore("pool", 3).unwrap();
    let opts = LockOptions::new(ms(300));
    let kept = pool.acquire(&opts).await.unwrap();
    let lost = pool.acquire(&opts).await.unwrap();
    // Someone ends one permit: its watchdog hears NOTOWNER; the other renews on.
    let _: i64 = server.q(&["LOCK.RELEASE", "pool", lost.owner()]);
    tokio::time::timeout(Duration::from_secs(2), lost.loss().lost())
        .await
        .expect("the loss is reported");
    tokio::time::sleep(ms(900)).await; // three leases
    assert!(!kept.is_lost());
    assert_eq!(info(&server, "pool").1, [kept.owner()]);
}

#[test]
fn the_blocking_api_has_read_write_locks_and_semaphores() {
    let server = Server::start();
    let client = blocking::Client::open(server.url()).unwrap();
    let opts = LockOptions::new(Duration::from_secs(30)).wait(ms(200));
    let mut reader = client.read_lock("k", &opts).unwrap();
    let mut other = client.try_read_lock("k", &opts).unwrap();
    assert!(matches!(
        client.write_lock("k", &opts),
        Err(Error::TimedOut)
    ));
    reader.release().unwrap();
    other.release().unwrap();
    let mut writer = client.write_lock("k", &opts).unwrap();
    writer.release().unwrap();

    let pool = client.semaphore("pool", 1).unwrap();
    assert_eq!(pool.limit(), 1);
    let mut permit = pool.acquire(&opts).unwrap();
    assert!(matches!(pool.acquire(&opts), Err(Error::TimedOut)));
    permit.release().unwrap();
    assert!(info(&server, "pool").1.is_empty());
}

/// One read-write handle, one owner: its writer takes the read side at
/// once (a reentry), its reader asking for the write side is refused at
/// once instead of waiting out its wait behind its own read hold.
#[test]
fn a_read_write_handle_shares_its_owner_across_both_sides() {
    let server = Server::start();
    let client = redislock_client::blocking::Client::open(server.url()).unwrap();
    let opts = LockOptions::new(Duration::from_secs(30)).wait(Duration::from_secs(5));
    let rw = client.rw_lock("k");
    let mut write = rw.write(&opts).unwrap();
    let mut read = rw.read(&opts).unwrap();
    assert_eq!(read.owner(), write.owner());
    assert_eq!(server.lock_info("k").expect("held").count, 2);
    assert_eq!(read.release().unwrap(), 0, "the read side's own count");
    assert_eq!(write.release().unwrap(), 0);
    assert!(server.lock_info("k").is_none());

    let _read = rw.read(&opts).unwrap();
    let start = std::time::Instant::now();
    assert!(matches!(rw.write(&opts), Err(Error::Upgrade)));
    assert!(start.elapsed() < Duration::from_secs(1));
}

/// A reentry on one side of a read-write handle counts that side's holds
/// only: the server's count also has the other side's, and releasing the
/// reentered side back to nothing leaves the other side's hold alone.
#[test]
fn a_reentry_on_one_side_of_a_handle_counts_that_sides_holds_only() {
    let server = Server::start();
    let client = redislock_client::blocking::Client::open(server.url()).unwrap();
    let opts = LockOptions::new(Duration::from_secs(30)).wait(Duration::from_secs(5));
    let rw = client.rw_lock("k");
    let mut write = rw.write(&opts).unwrap();
    let mut read = rw.read(&opts).unwrap();
    assert_eq!(
        read.reenter().unwrap(),
        3,
        "the server counts the owner's holds"
    );
    assert_eq!(read.count(), 2, "the read side's own holds");
    assert_eq!(read.release().unwrap(), 1, "the read side's own holds left");
    assert_eq!(read.release().unwrap(), 0);
    let held = server.lock_info("k").expect("the write side still holds");
    assert_eq!(held.count, 1);
    assert!(!write.is_lost());
    assert_eq!(write.release().unwrap(), 0);
    assert!(server.lock_info("k").is_none());
}
