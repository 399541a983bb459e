//! A small harness of its own: real `redis-server`/`valkey-server` processes
//! with the module loaded, on free loopback ports, each in its own temp dir,
//! killed on drop (the log is printed if the test failed).
//!
//! Environment: `LOCK_MODULE` (default `../target/release/libredislock.so`
//! from this crate), `LOCK_SERVER` (default `redis-server`).

use std::fs;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use redis::{Connection, FromRedisValue, ToRedisArgs};

static STARTED: AtomicUsize = AtomicUsize::new(0);

pub fn module_path() -> PathBuf {
    let path = match std::env::var_os("LOCK_MODULE") {
        Some(path) => PathBuf::from(path),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/libredislock.so"),
    };
    assert!(
        path.is_file(),
        "module {} not found: cargo build --release at the repository root",
        path.display()
    );
    path
}

pub fn server_bin() -> String {
    std::env::var("LOCK_SERVER")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "redis-server".into())
}

/// Polls `ready` every 2 ms until it holds; panics after `timeout`.
pub fn wait_until(what: &str, timeout: Duration, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !ready() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting until {what}"
        );
        thread::sleep(Duration::from_millis(2));
    }
}

/// One server process.
pub struct Server {
    pub port: u16,
    dir: PathBuf,
    args: Vec<String>,
    child: Option<Child>,
}

/// Options before a start.
pub struct Builder {
    config: Vec<(String, String)>,
    module: bool,
    port: Option<u16>,
}

impl Builder {
    pub fn config(mut self, name: &str, value: impl ToString) -> Self {
        self.config.push((name.into(), value.to_string()));
        self
    }

    /// No module: what a client sees on a plain server.
    pub fn without_module(mut self) -> Self {
        self.module = false;
        self
    }

    /// AOF on, fsynced at every write: a killed server keeps every reply it sent.
    pub fn durable(self) -> Self {
        self.config("appendonly", "yes")
            .config("appendfsync", "always")
    }

    /// Listen on `port` (a cluster node needs port + 10000 free as well).
    pub fn port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }

    pub fn start(self) -> Server {
        let n = STARTED.fetch_add(1, Ordering::Relaxed);
        let name = thread::current()
            .name()
            .unwrap_or("test")
            .replace(|c: char| !c.is_ascii_alphanumeric(), "_");
        let dir = std::env::temp_dir()
            .join("redislock-client-tests")
            .join(format!("{name}-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("create the test dir");
        let port = self.port.unwrap_or_else(free_port);
        let mut args: Vec<String> = vec![
            "--port".into(),
            port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--dir".into(),
            dir.display().to_string(),
            "--logfile".into(),
            "server.log".into(),
            "--save".into(),
            String::new(),
            "--enable-debug-command".into(),
            "yes".into(),
        ];
        if self.module {
            args.extend(["--loadmodule".into(), module_path().display().to_string()]);
        }
        for (name, value) in self.config {
            args.push(format!("--{name}"));
            args.extend(value.split_whitespace().map(String::from));
        }
        let mut server = Server {
            port,
            dir,
            args,
            child: None,
        };
        server.launch();
        server
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// A port below the ephemeral range whose +10000 bus port is free too.
pub fn free_cluster_port() -> u16 {
    use rand::Rng;
    loop {
        let port: u16 = rand::thread_rng().gen_range(10_000..20_000);
        let free = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(port) && free(port + 10_000) {
            return port;
        }
    }
}

impl Server {
    pub fn builder() -> Builder {
        Builder {
            config: Vec::new(),
            module: true,
            port: None,
        }
    }

    pub fn start() -> Server {
        Server::builder().start()
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn launch(&mut self) {
        let child = Command::new(server_bin())
            .args(&self.args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", server_bin()));
        self.child = Some(child);
        wait_until("the server answers PING", Duration::from_secs(10), || {
            self.try_conn()
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c).ok())
                .is_some()
        });
    }

    fn try_conn(&self) -> Option<Connection> {
        let client = redis::Client::open(self.url()).ok()?;
        let conn = client
            .get_connection_with_timeout(Duration::from_secs(1))
            .ok()?;
        conn.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        Some(conn)
    }

    /// A new plain connection (replies may take up to 10 s).
    pub fn conn(&self) -> Connection {
        self.try_conn().expect("connect to the test server")
    }

    /// One command that must succeed.
    pub fn q<T: FromRedisValue>(&self, args: impl ToRedisArgs) -> T {
        let mut cmd = redis::Cmd::new();
        cmd.arg(args);
        cmd.query(&mut self.conn())
            .unwrap_or_else(|e| panic!("command failed: {e}"))
    }

    /// `SIGKILL`: a crash.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts again on the same port and dir (after [`Server::kill`]).
    pub fn start_again(&mut self) {
        self.kill();
        self.launch();
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// A field of `INFO section` as an integer.
    pub fn info_int(&self, section: &str, field: &str) -> i64 {
        let info: String = self.q(&["INFO", section]);
        info.lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {field} in INFO {section}"))
    }

    /// Calls of a command so far (`INFO commandstats`), 0 if never called.
    pub fn calls(&self, command: &str) -> i64 {
        let info: String = self.q(&["INFO", "commandstats"]);
        let prefix = format!("cmdstat_{command}:calls=");
        info.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next()?.parse().ok())
            .unwrap_or(0)
    }

    /// `LOCK.INFO key` as (owner, fence, waiters), or `None` if free.
    pub fn lock_info(&self, key: &str) -> Option<(String, i64, i64)> {
        let reply: Option<Vec<redis::Value>> = self.q(&["LOCK.INFO", key]);
        let fields = reply?;
        let mut owner = String::new();
        let (mut fence, mut waiters) = (0, 0);
        for pair in fields.chunks(2) {
            let name: String = redis::from_redis_value_ref(&pair[0]).unwrap_or_default();
            match name.as_str() {
                "owner" => owner = redis::from_redis_value_ref(&pair[1]).unwrap_or_default(),
                "fence" => fence = redis::from_redis_value_ref(&pair[1]).unwrap_or_default(),
                "waiters" => waiters = redis::from_redis_value_ref(&pair[1]).unwrap_or_default(),
                _ => {}
            }
        }
        Some((owner, fence, waiters))
    }

    /// The log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
        if thread::panicking() {
            eprintln!("--- server {} log ---\n{}", self.port, self.log());
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// A Redis Cluster of three masters, no replicas, slots split evenly.
pub struct Cluster {
    pub nodes: Vec<Server>,
}

impl Cluster {
    pub fn start() -> Cluster {
        let nodes: Vec<Server> = (0..3)
            .map(|_| {
                Server::builder()
                    .port(free_cluster_port())
                    .config("cluster-enabled", "yes")
                    .config("cluster-node-timeout", 2000)
                    .start()
            })
            .collect();
        let ranges = [(0, 5460), (5461, 10922), (10923, 16383)];
        for (node, (from, to)) in nodes.iter().zip(ranges) {
            let _: () = node.q(&[
                "CLUSTER",
                "ADDSLOTSRANGE",
                &from.to_string(),
                &to.to_string(),
            ]);
        }
        for node in &nodes[1..] {
            let _: () = nodes[0].q(&["CLUSTER", "MEET", "127.0.0.1", &node.port.to_string()]);
        }
        wait_until(
            "the cluster is ok on every node",
            Duration::from_secs(20),
            || {
                nodes.iter().all(|n| {
                    let info: String = n.q(&["CLUSTER", "INFO"]);
                    info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:3")
                })
            },
        );
        Cluster { nodes }
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Server::url).collect()
    }

    /// The node serving `key`.
    pub fn node_of(&self, key: &str) -> &Server {
        let slot: i64 = self.nodes[0].q(&["CLUSTER", "KEYSLOT", key]);
        let index = match slot {
            0..=5460 => 0,
            5461..=10922 => 1,
            _ => 2,
        };
        &self.nodes[index]
    }
}
