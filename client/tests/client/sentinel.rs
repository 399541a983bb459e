//! Sentinel discovery: the client finds the master through a `redis-sentinel`,
//! and after a failover (`SENTINEL FAILOVER`) finds the new one: the old
//! master, now a replica, answers `READONLY`, the client drops that
//! connection and asks the Sentinel again.

use std::time::Duration;

use redislock_client::{blocking::Client, Error, LockOptions};

use redislock_testkit::{wait_until, Sentinel, Server};

#[test]
fn the_client_follows_the_master_sentinel_names_across_a_failover() {
    let master = Server::start();
    let replica = Server::builder()
        .config("replicaof", format!("127.0.0.1 {}", master.port()))
        .start();
    wait_until("the replica is in sync", Duration::from_secs(10), || {
        master.info_int("replication", "connected_slaves") == 1
    });
    let sentinel = Sentinel::start(&master);
    wait_until(
        "the Sentinel knows the replica",
        Duration::from_secs(20),
        || {
            sentinel
                .query::<Vec<redis::Value>>(&["SENTINEL", "REPLICAS", "m"])
                .is_some_and(|r| r.len() == 1)
        },
    );
    let client = Client::sentinel([sentinel.url()], "m").expect("a Sentinel client");
    let opts = LockOptions::new(Duration::from_secs(5)).watchdog(false);
    let mut guard = client.lock("job", &opts).expect("the lock, on the master");
    assert!(master.lock_info("job").is_some(), "held on the master");
    guard.release().expect("released");

    // Refused (NOGOODSLAVE) until the Sentinel has read the replica's INFO.
    wait_until(
        "Sentinel starts a failover",
        Duration::from_secs(30),
        || {
            sentinel
                .query::<String>(&["SENTINEL", "FAILOVER", "m"])
                .is_some_and(|ok| ok == "OK")
        },
    );
    wait_until(
        "Sentinel names the replica",
        Duration::from_secs(30),
        || sentinel.master_port() == Some(replica.port()),
    );
    // While its role changes a server may close a new connection (Redis 8.2
    // did once): ask again rather than fail.
    wait_until(
        "the old master is a replica",
        Duration::from_secs(30),
        || connected_replicas(&master) == Some(0) && connected_replicas(&replica) == Some(1),
    );
    // The shared connection still points at the old master: READONLY, then
    // the next command asks the Sentinel again.
    let mut taken = None;
    wait_until(
        "the client takes the lock on the new master",
        Duration::from_secs(20),
        || match client.try_lock("job", &opts) {
            Ok(guard) => {
                taken = Some(guard);
                true
            }
            Err(Error::Transport(_) | Error::NoMaster(_)) => false,
            Err(other) => panic!("unexpected: {other}"),
        },
    );
    assert!(replica.lock_info("job").is_some(), "held on the new master");
    if let Some(mut guard) = taken {
        guard.release().expect("released on the new master");
    }
}

/// `connected_slaves` in `INFO replication`, or `None` if the server could
/// not be asked just now.
fn connected_replicas(server: &Server) -> Option<i64> {
    let mut conn = redis::Client::open(server.url())
        .ok()?
        .get_connection()
        .ok()?;
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query(&mut conn)
        .ok()?;
    info.lines()
        .find_map(|line| line.strip_prefix("connected_slaves:"))
        .and_then(|n| n.trim().parse().ok())
}
