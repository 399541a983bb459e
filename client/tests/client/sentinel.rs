//! Sentinel discovery: the client finds the master through a `redis-sentinel`,
//! and after a failover (`SENTINEL FAILOVER`) finds the new one: the old
//! master, now a replica, answers `READONLY`, the client drops that
//! connection and asks the Sentinel again.

use std::fs;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use redislock_client::{blocking::Client, Error, LockOptions};

use crate::harness::{wait_until, Server};

/// A `redis-sentinel` on loopback, killed on drop.
struct Sentinel {
    child: Child,
    port: u16,
    dir: std::path::PathBuf,
}

impl Sentinel {
    fn start(master: &Server) -> Sentinel {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let dir = std::env::temp_dir()
            .join("redislock-client-tests")
            .join(format!("sentinel-{}-{port}", std::process::id()));
        fs::create_dir_all(&dir).expect("sentinel dir");
        let conf = dir.join("sentinel.conf");
        let master_port = port_of(master);
        fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\nlogfile sentinel.log\n\
                 sentinel monitor m 127.0.0.1 {master_port} 1\n\
                 sentinel down-after-milliseconds m 2000\n\
                 sentinel failover-timeout m 10000\n",
                dir.display()
            ),
        )
        .expect("sentinel.conf");
        let child = Command::new("redis-sentinel")
            .arg(&conf)
            .current_dir(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-sentinel (apt-get install redis-sentinel)");
        Sentinel { child, port, dir }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn query<T: redis::FromRedisValue>(&self, args: &[&str]) -> Option<T> {
        let client = redis::Client::open(self.url()).ok()?;
        let mut conn = client
            .get_connection_with_timeout(Duration::from_secs(1))
            .ok()?;
        let mut cmd = redis::Cmd::new();
        cmd.arg(args);
        cmd.query(&mut conn).ok()
    }

    fn master_port(&self) -> Option<u16> {
        let addr: Option<(String, u16)> =
            self.query(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "m"])?;
        addr.map(|(_, port)| port)
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = fs::read_to_string(self.dir.join("sentinel.log")).unwrap_or_default();
            eprintln!("--- sentinel log ---\n{log}");
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn port_of(server: &Server) -> u16 {
    server
        .url()
        .trim_end_matches('/')
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("a port in the url")
}

#[test]
fn the_client_follows_the_master_sentinel_names_across_a_failover() {
    let master = Server::start();
    let replica = Server::builder()
        .config("replicaof", format!("127.0.0.1 {}", port_of(&master)))
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
        || sentinel.master_port() == Some(port_of(&replica)),
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
