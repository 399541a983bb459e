//! The test harness: a real `redis-server` per test with the module loaded, and
//! the client helpers every area shares.
//!
//! - [`Server`] owns one `redis-server` process: a free loopback port, its own
//!   temp dir, a readiness deadline, restart on the same port and dir, and
//!   kill-and-wait on drop. When the test panics, drop prints the server log and
//!   keeps the dir; when it passes, the dir is removed.
//! - [`Call`] extends `redis::Connection` with one-line commands whose error
//!   replies come back as text (`"NOTOWNER ..."`), and a [`LockInfo`] reader.
//! - [`wait_until`] polls observable state; tests never sleep for a fixed time.
//! - [`wait_on`] sends a blocking `LOCK.ACQUIRE … WAIT` from a thread of its
//!   own, on a plain or a cluster connection.
//! - [`ServerBuilder::cluster_node`] makes a Redis Cluster node: its port and
//!   its cluster bus port (port + 10000) are both free.
//!
//! Environment: `LOCK_MODULE` overrides the module path; `LOCK_SERVER` and
//! `LOCK_CLI` the server and cli binaries (default: `redis-server` and
//! `redis-cli` from `PATH`; `make test` runs the suite again with Valkey's
//! `valkey-server` and `valkey-cli`). `REDIS_SERVER` and `REDIS_CLI`, the
//! older names, still work when the new ones are not set.

use std::fmt::Write as _;
use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::{Connection, RedisError, ToRedisArgs, Value};

/// How long a started server gets to answer `PING` with `PONG`.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a stopped server gets to exit before it is killed.
const EXIT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long any one reply may take: a hung server fails the test, never hangs it.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// Attempts at a first start, each on a new port (another process may take a
/// port between our probe and the server's bind).
const PORT_ATTEMPTS: usize = 5;

/// A lease longer than any test runs.
pub const LONG: i64 = 600_000;

/// Gives every server of this test process its own dir name.
static SERVERS_STARTED: AtomicUsize = AtomicUsize::new(0);

/// The module under test: `LOCK_MODULE`, else the release build of this crate.
pub fn module_path() -> PathBuf {
    let path = match std::env::var_os("LOCK_MODULE") {
        Some(path) => PathBuf::from(path),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/libredislock.so"),
    };
    assert!(
        path.is_file(),
        "module {} not found: build it first: cargo build --release (make test does it)",
        path.display()
    );
    path
}

/// The server binary: `LOCK_SERVER`, else `REDIS_SERVER`, else `redis-server`.
pub fn server_bin() -> String {
    env_or(&["LOCK_SERVER", "REDIS_SERVER"], "redis-server")
}

/// The fields of `INFO lock`, in the order the module reports them.
pub const LOCK_INFO_FIELDS: &[&str] = &[
    "lock_held",
    "lock_waiting",
    "lock_acquired",
    "lock_reentered",
    "lock_released",
    "lock_renewed",
    "lock_handoffs",
    "lock_wait_timeouts",
    "lock_expired_held",
    "lock_notowner",
    "lock_last_fence",
    "lock_quarantine_ms",
    "lock_partition_safe",
];

/// A replica of `master`, started and with its link to the master up.
pub fn start_replica(master: &Server, label: &str) -> Server {
    let replica = Server::builder().label(label).replica_of(master).start();
    replica.wait_for_master_link();
    replica
}

/// The cli binary: `LOCK_CLI`, else `REDIS_CLI`, else `redis-cli`.
pub fn cli_bin() -> String {
    env_or(&["LOCK_CLI", "REDIS_CLI"], "redis-cli")
}

fn env_or(names: &[&str], default: &str) -> String {
    names
        .iter()
        .find_map(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
        .unwrap_or_else(|| default.into())
}

/// Milliseconds since the Unix epoch, as the module's fence clock reads them.
pub fn now_ms() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970");
    i64::try_from(since.as_millis()).expect("ms fit in i64")
}

/// The clock floor of a fence issued at `ms`: `ms × 2^20` (fencing).
pub fn clock_floor(ms: i64) -> i64 {
    ms << 20
}

/// Polls `ready` every few milliseconds until it holds; panics naming `what`
/// after `timeout`.
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

/// How to stop a server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// `SHUTDOWN NOSAVE NOW`: no RDB is written (the AOF, if on, is flushed).
    NoSave,
    /// `SHUTDOWN SAVE NOW`: an RDB is written first.
    Save,
    /// `SIGKILL`: a crash; only what already reached the disk survives.
    Kill,
}

/// Options for a [`Server`] before it starts. Each `config` becomes a
/// `--name value` argument; the value is split on whitespace into words (so
/// `replicaof` takes `"127.0.0.1 6379"`), and `""` stays one empty word.
pub struct ServerBuilder {
    label: String,
    config: Vec<(String, String)>,
    cluster: bool,
    load_module: bool,
    config_file: Option<String>,
}

impl ServerBuilder {
    /// Names the server in panics and in the log dump (`master`, `replica`).
    pub fn label(mut self, label: &str) -> Self {
        self.label = label.to_string();
        self
    }

    /// Sets a config directive given at startup; a later call for the same name
    /// replaces the earlier value.
    pub fn config(mut self, name: &str, value: impl ToString) -> Self {
        set_config(&mut self.config, name, value.to_string());
        self
    }

    /// AOF on, fsynced on every write, with or without the RDB preamble.
    pub fn appendonly(self, rdb_preamble: bool) -> Self {
        self.config("appendonly", "yes")
            .config("appendfsync", "always")
            .config(
                "aof-use-rdb-preamble",
                if rdb_preamble { "yes" } else { "no" },
            )
    }

    /// Starts as a replica of `master` (wait for the link with
    /// [`Server::wait_for_master_link`]).
    pub fn replica_of(self, master: &Server) -> Self {
        self.config("replicaof", format!("127.0.0.1 {}", master.port))
    }

    /// A Redis Cluster node (`cluster-enabled yes`, its `nodes.conf` in its
    /// own dir) that declares a silent peer failed after `node_timeout_ms`.
    /// Its port is chosen so that the cluster bus port, port + 10000, is free
    /// too.
    pub fn cluster_node(mut self, node_timeout_ms: u64) -> Self {
        self.cluster = true;
        self.config("cluster-enabled", "yes")
            .config("cluster-node-timeout", node_timeout_ms)
    }

    /// Starts without `--loadmodule`: the test loads the module itself
    /// (`MODULE LOAD`/`LOADEX`, or a `loadmodule` line in its config file).
    pub fn without_module(mut self) -> Self {
        self.load_module = false;
        self
    }

    /// Starts from a config file with this text (`redis.conf` in the
    /// server's dir, its path first on the command line). The `--name value`
    /// arguments follow it, so the server reads them after the file.
    pub fn config_file(mut self, text: &str) -> Self {
        self.config_file = Some(text.to_string());
        self
    }

    /// Starts the server and waits until it answers `PING`.
    pub fn start(self) -> Server {
        let module = module_path();
        let n = SERVERS_STARTED.fetch_add(1, Ordering::Relaxed);
        // Test threads are named after their test: the dir says whose it is.
        let test = thread::current()
            .name()
            .unwrap_or("test")
            .replace("::", "-")
            .replace(
                |c: char| !c.is_ascii_alphanumeric() && c != '-' && c != '_',
                "_",
            );
        let dir = std::env::temp_dir().join("redislock-tests").join(format!(
            "{test}-{}-{n}-{}",
            std::process::id(),
            self.label
        ));
        if dir.exists() {
            fs::remove_dir_all(&dir).expect("remove a stale test dir");
        }
        fs::create_dir_all(&dir).expect("create the test dir");
        let config_file = self.config_file.map(|text| {
            let path = dir.join("redis.conf");
            fs::write(&path, text).expect("write the config file");
            path
        });
        let mut server = Server {
            label: self.label,
            port: 0,
            dir,
            module: self.load_module.then_some(module),
            config_file,
            config: self.config,
            child: None,
        };
        let mut failures = String::new();
        for _ in 0..PORT_ATTEMPTS {
            server.port = if self.cluster {
                free_cluster_port()
            } else {
                free_port()
            };
            match server.launch() {
                Ok(()) => return server,
                Err(why) => {
                    let _ = writeln!(failures, "port {}: {why}", server.port);
                }
            }
        }
        // Dropping `server` as this panics prints its log.
        panic!("{} did not start:\n{failures}", server.label);
    }
}

fn set_config(config: &mut Vec<(String, String)>, name: &str, value: String) {
    match config.iter_mut().find(|(n, _)| n == name) {
        Some(entry) => entry.1 = value,
        None => config.push((name.to_string(), value)),
    }
}

/// A free loopback port: bind port 0 and let the kernel choose.
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    listener.local_addr().expect("local address").port()
}

/// A loopback port for a cluster node: it and its bus port (+ 10000) are free.
///
/// Both come from below the kernel's ephemeral range (32768 and up here and by
/// default), so no `free_port` server and no outgoing connection takes them:
/// ports from 10000 to 19999, bus ports from 20000 to 29999, so one node's bus
/// port is never another node's port.
fn free_cluster_port() -> u16 {
    use rand::Rng;
    let mut rng = rand::thread_rng();
    loop {
        let port: u16 = rng.gen_range(10_000..20_000);
        let free = |port: u16| TcpListener::bind(("127.0.0.1", port)).is_ok();
        if free(port) && free(port + 10_000) {
            return port;
        }
    }
}

/// One `redis-server` with the module loaded, owned by one test.
pub struct Server {
    label: String,
    port: u16,
    dir: PathBuf,
    /// `None`: started without `--loadmodule`.
    module: Option<PathBuf>,
    /// A config file the server reads before its `--name value` arguments.
    config_file: Option<PathBuf>,
    config: Vec<(String, String)>,
    child: Option<Child>,
}

impl Server {
    /// A server with the defaults: no RDB save points, no AOF.
    pub fn start() -> Server {
        Server::builder().start()
    }

    /// Options first, then [`ServerBuilder::start`].
    pub fn builder() -> ServerBuilder {
        ServerBuilder {
            label: "server".into(),
            config: Vec::new(),
            cluster: false,
            load_module: true,
            config_file: None,
        }
    }

    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's `dir`: its RDB, AOF and log live here.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Changes a startup directive for the next [`Server::start_again`].
    pub fn set_startup_config(&mut self, name: &str, value: impl ToString) {
        set_config(&mut self.config, name, value.to_string());
    }

    /// The command line, without the binary: the harness defaults, each
    /// replaced by the test's own value if it set one, then the test's config.
    fn args(&self) -> Vec<String> {
        let defaults = [
            ("port", self.port.to_string()),
            ("bind", "127.0.0.1".into()),
            ("daemonize", "no".into()),
            ("dir", self.dir.display().to_string()),
            ("logfile", self.dir.join("redis.log").display().to_string()),
            ("enable-debug-command", "yes".into()),
            ("save", String::new()),
            // A full sync to a replica starts at once instead of after 5 s.
            ("repl-diskless-sync-delay", "0".into()),
        ];
        let module = self
            .module
            .iter()
            .map(|path| ("loadmodule", path.display().to_string()));
        // The config file's path comes first, or the server takes none.
        let mut args: Vec<String> = self
            .config_file
            .iter()
            .map(|path| path.display().to_string())
            .collect();
        for (name, value) in defaults.into_iter().chain(module) {
            if !self.config.iter().any(|(n, _)| n == name) {
                // One word each, even a path with spaces in it.
                args.extend([format!("--{name}"), value]);
            }
        }
        for (name, value) in &self.config {
            args.push(format!("--{name}"));
            let words: Vec<&str> = value.split_whitespace().collect();
            if words.is_empty() {
                args.push(String::new());
            }
            args.extend(words.into_iter().map(String::from));
        }
        args
    }

    /// Spawns the process and waits until it answers `PING`.
    fn launch(&mut self) -> Result<(), String> {
        // Appended to, like redis.log, so a restart keeps the earlier runs.
        let output = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("stdout.log"))
            .expect("open stdout.log");
        let errors = output.try_clone().expect("clone stdout.log");
        let child = Command::new(server_bin())
            .args(self.args())
            .stdin(Stdio::null())
            .stdout(output)
            .stderr(errors)
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", server_bin()))?;
        self.child = Some(child);
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                return Err(format!("exited at start ({status})"));
            }
            if let Some(pid) = answering_pid(self.port) {
                // Another test's server may hold the port while ours fails to
                // bind it: only our own process counts as started.
                if Some(pid) == self.child.as_ref().map(Child::id) {
                    return Ok(());
                }
                self.kill_process();
                return Err(format!("port taken by process {pid}"));
            }
            if Instant::now() > deadline {
                self.kill_process();
                return Err(format!("no PONG within {READY_TIMEOUT:?}"));
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// Starts a stopped server again, on the same port, dir and config.
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "{} is still running", self.label);
        let mut failures = String::new();
        // The port was ours a moment ago; a retry covers a slow kernel.
        for _ in 0..3 {
            match self.launch() {
                Ok(()) => return,
                Err(why) => {
                    let _ = writeln!(failures, "{why}");
                    thread::sleep(Duration::from_millis(200));
                }
            }
        }
        panic!(
            "{} did not start again on port {}:\n{failures}",
            self.label, self.port
        );
    }

    /// Stops the server and waits until its process has exited.
    pub fn stop(&mut self, how: Stop) {
        match how {
            Stop::NoSave => self.send_shutdown("SHUTDOWN NOSAVE NOW"),
            Stop::Save => self.send_shutdown("SHUTDOWN SAVE NOW"),
            Stop::Kill => self.kill_process(),
        }
        let Some(mut child) = self.child.take() else {
            return;
        };
        let deadline = Instant::now() + EXIT_TIMEOUT;
        while child.try_wait().expect("wait for redis-server").is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{} did not exit after {how:?}", self.label);
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    fn send_shutdown(&mut self, command: &str) {
        let mut stream =
            TcpStream::connect(("127.0.0.1", self.port)).expect("connect for SHUTDOWN");
        stream.set_read_timeout(Some(REPLY_TIMEOUT)).ok();
        stream
            .write_all(format!("{command}\r\n").as_bytes())
            .expect("send SHUTDOWN");
        // The server closes the connection as it exits; an error reply means
        // it refused (e.g. the save failed), and the test should say so.
        let mut reply = String::new();
        let _ = stream.read_to_string(&mut reply);
        assert!(
            !reply.starts_with('-'),
            "{} refused {command}: {reply}",
            self.label
        );
    }

    fn kill_process(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// `SHUTDOWN NOSAVE`, then start again: what survives is what the server
    /// already persisted (an AOF, or an RDB written by `SAVE`).
    pub fn restart(&mut self) {
        self.stop(Stop::NoSave);
        self.start_again();
    }

    /// `SHUTDOWN SAVE`, then start again from the RDB it wrote.
    pub fn restart_saving(&mut self) {
        self.stop(Stop::Save);
        self.start_again();
    }

    /// `SIGKILL`: the server is gone, as after a crash or a failed machine.
    pub fn kill(&mut self) {
        self.stop(Stop::Kill);
    }

    /// `SIGKILL`, then start again: a crash and recovery.
    pub fn crash_restart(&mut self) {
        self.stop(Stop::Kill);
        self.start_again();
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `SIGSTOP`: the process freezes with its connections open, as a
    /// replica that stops acknowledging would. [`Server::resume`] undoes it;
    /// drop's `SIGKILL` ends a stopped process too.
    pub fn suspend(&self) {
        self.signal("STOP");
    }

    /// `SIGCONT`: a [`Server::suspend`]ed process runs on.
    pub fn resume(&self) {
        self.signal("CONT");
    }

    fn signal(&self, name: &str) {
        let pid = self
            .pid()
            .unwrap_or_else(|| panic!("{} is not running", self.label));
        let status = Command::new("kill")
            .args([format!("-{name}"), pid.to_string()])
            .status()
            .unwrap_or_else(|e| panic!("cannot run kill -{name}: {e}"));
        assert!(status.success(), "kill -{name} {pid} failed: {status}");
    }

    /// Whether the process is still running (it has not crashed).
    pub fn is_alive(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => child.try_wait().expect("poll redis-server").is_none(),
            None => false,
        }
    }

    /// The server log so far.
    pub fn log(&self) -> String {
        let mut log = fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
        let stdout = fs::read_to_string(self.dir.join("stdout.log")).unwrap_or_default();
        if !stdout.trim().is_empty() {
            log.push_str("--- stdout/stderr ---\n");
            log.push_str(&stdout);
        }
        log
    }

    fn url(&self, query: &str) -> String {
        format!("redis://127.0.0.1:{}/{query}", self.port)
    }

    fn connect(&self, url: &str) -> Connection {
        let client = redis::Client::open(url).expect("valid URL");
        let conn = client
            .get_connection_with_timeout(REPLY_TIMEOUT)
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.label));
        conn.set_read_timeout(Some(REPLY_TIMEOUT))
            .expect("read timeout");
        conn.set_write_timeout(Some(REPLY_TIMEOUT))
            .expect("write timeout");
        conn
    }

    /// A new RESP2 connection.
    pub fn conn(&self) -> Connection {
        self.connect(&self.url(""))
    }

    /// A new RESP3 connection (`HELLO 3`).
    pub fn conn_resp3(&self) -> Connection {
        self.connect(&self.url("?protocol=resp3"))
    }

    /// Runs `redis-cli --no-raw` with `flags` (e.g. `["-3"]`) then `args`;
    /// returns what it printed, trailing newline removed.
    pub fn cli_with(&self, flags: &[&str], args: &[&str]) -> String {
        let output = Command::new(cli_bin())
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "--no-raw"])
            .args(flags)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", cli_bin()));
        assert!(
            output.status.success(),
            "redis-cli {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout)
            .trim_end_matches('\n')
            .to_string()
    }

    /// `redis-cli --no-raw args…` over RESP2.
    pub fn cli(&self, args: &[&str]) -> String {
        self.cli_with(&[], args)
    }

    /// `redis-cli -3 --no-raw args…` over RESP3.
    pub fn cli3(&self, args: &[&str]) -> String {
        self.cli_with(&["-3"], args)
    }

    /// One field of `INFO section`, e.g. `info_field("lock", "lock_held")`.
    pub fn info_field(&self, section: &str, name: &str) -> String {
        let info: String = self.conn().value(&["INFO", section]);
        info.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .unwrap_or_else(|| panic!("no {name} in INFO {section}:\n{info}"))
            .trim()
            .to_string()
    }

    /// An integer field of `INFO section`.
    pub fn info_int(&self, section: &str, name: &str) -> i64 {
        let value = self.info_field(section, name);
        value
            .parse()
            .unwrap_or_else(|_| panic!("INFO {section} {name} is not an integer: {value}"))
    }

    /// Waits until this replica's link to its master is up.
    pub fn wait_for_master_link(&self) {
        wait_until(
            &format!("{} has master_link_status:up", self.label),
            READY_TIMEOUT,
            || self.info_field("replication", "master_link_status") == "up",
        );
    }

    /// Waits until this replica has applied everything `master` has sent so
    /// far, whichever client wrote it (`WAIT` covers only its own client's
    /// writes: see [`Call::wait_replicas`]).
    pub fn catch_up_with(&self, master: &Server) {
        let target = master.info_int("replication", "master_repl_offset");
        wait_until(
            &format!("{} reaches offset {target}", self.label),
            REPLY_TIMEOUT,
            || self.info_int("replication", "slave_repl_offset") >= target,
        );
    }

    /// Waits until no AOF rewrite is running or scheduled.
    pub fn wait_for_aof_rewrite(&self) {
        wait_until("the AOF rewrite is done", READY_TIMEOUT, || {
            self.info_int("persistence", "aof_rewrite_in_progress") == 0
                && self.info_int("persistence", "aof_rewrite_scheduled") == 0
        });
    }

    /// `DEBUG DIGEST`: a hash of the whole dataset, expiry times included.
    pub fn digest(&self) -> String {
        self.conn().value(&["DEBUG", "DIGEST"])
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill_process();
        if thread::panicking() {
            eprintln!(
                "--- {} (port {}, dir {}) log ---\n{}--- end of {} log ---",
                self.label,
                self.port,
                self.dir.display(),
                self.log(),
                self.label
            );
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// The process id of the server answering on `port`, once it answers `PING`
/// with `PONG` (not `-LOADING`).
fn answering_pid(port: u16) -> Option<u32> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).ok()?;
    let mut conn = client
        .get_connection_with_timeout(Duration::from_secs(1))
        .ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    let pong: String = redis::cmd("PING").query(&mut conn).ok()?;
    if pong != "PONG" {
        return None;
    }
    let info: String = redis::cmd("INFO").arg("server").query(&mut conn).ok()?;
    info.lines()
        .find_map(|line| line.strip_prefix("process_id:"))
        .and_then(|pid| pid.trim().parse().ok())
}

/// A reply, or the text of an error reply (`"NOTOWNER not the owner"`).
pub type Reply = Result<Value, String>;

/// The text of an error reply, code first, as the server sent it.
pub fn error_text(err: &RedisError) -> Option<String> {
    let code = err.code()?;
    Some(match err.detail() {
        Some(detail) => format!("{code} {detail}"),
        None => code.to_string(),
    })
}

/// A command for messages: `LOCK.ACQUIRE k "o\x00" 1000`.
pub fn show_args<A: ToRedisArgs>(args: &A) -> String {
    args.to_redis_args()
        .iter()
        .map(|arg| {
            let text = arg.escape_ascii().to_string();
            if text.is_empty() || text.len() != arg.len() || text.contains(' ') {
                format!("\"{text}\"")
            } else {
                text
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// One-line commands on a connection. Every method panics when the server
/// cannot be reached: a lost connection is a failed test, never an error reply.
pub trait Call {
    /// Sends one command (each element of `args` is one argument).
    fn call<A: ToRedisArgs>(&mut self, args: A) -> Reply;

    /// The integer reply of a command that must answer one.
    fn int<A: ToRedisArgs>(&mut self, args: A) -> i64 {
        let shown = show_args(&args);
        match self.call(args) {
            Ok(Value::Int(n)) => n,
            other => panic!("{shown}: expected an integer, got {other:?}"),
        }
    }

    /// The reply of a command that must succeed, converted.
    fn value<T: redis::FromRedisValue, A: ToRedisArgs>(&mut self, args: A) -> T {
        let shown = show_args(&args);
        match self.call(args) {
            Ok(value) => redis::from_redis_value(value.clone())
                .unwrap_or_else(|e| panic!("{shown}: unexpected reply {value:?}: {e}")),
            Err(err) => panic!("{shown}: error {err}"),
        }
    }

    /// Asserts a nil reply.
    fn nil<A: ToRedisArgs>(&mut self, args: A) {
        let shown = show_args(&args);
        match self.call(args) {
            Ok(Value::Nil) => {}
            other => panic!("{shown}: expected nil, got {other:?}"),
        }
    }

    /// The text of the error reply of a command that must fail.
    fn err<A: ToRedisArgs>(&mut self, args: A) -> String {
        let shown = show_args(&args);
        match self.call(args) {
            Err(text) => text,
            Ok(value) => panic!("{shown}: expected an error, got {value:?}"),
        }
    }

    /// `LOCK.ACQUIRE key owner ttl`: the fence, or `None` when another owner
    /// holds the lock. Panics on an error reply.
    fn acquire(&mut self, key: &str, owner: &str, ttl_ms: i64) -> Option<i64> {
        match self.call(&["LOCK.ACQUIRE", key, owner, &ttl_ms.to_string()]) {
            Ok(Value::Int(fence)) => Some(fence),
            Ok(Value::Nil) => None,
            other => panic!("LOCK.ACQUIRE {key} {owner} {ttl_ms}: got {other:?}"),
        }
    }

    /// `LOCK.INFO key`, RESP2 or RESP3, read field by field.
    fn lock_info(&mut self, key: &str) -> Option<LockInfo> {
        match self.call(&["LOCK.INFO", key]) {
            Ok(Value::Nil) => None,
            Ok(value) => Some(
                LockInfo::from_reply(&value)
                    .unwrap_or_else(|why| panic!("LOCK.INFO {key}: {why}: {value:?}")),
            ),
            Err(err) => panic!("LOCK.INFO {key}: error {err}"),
        }
    }

    /// `WAIT replicas`: returns once that many replicas acknowledged every
    /// write this connection made (another connection's writes do not count).
    fn wait_replicas(&mut self, replicas: i64) {
        let timeout_ms = REPLY_TIMEOUT.as_millis().to_string();
        let acked = self.int(&["WAIT", &replicas.to_string(), &timeout_ms]);
        assert_eq!(acked, replicas, "WAIT: replicas did not acknowledge");
    }

    /// `PTTL key`.
    fn pttl(&mut self, key: &str) -> i64 {
        self.int(&["PTTL", key])
    }

    /// An integer field of `INFO section` read on this connection, for a
    /// server that new connections cannot reach (it now wants a password).
    fn info_int(&mut self, section: &str, name: &str) -> i64 {
        let info: String = self.value(&["INFO", section]);
        info.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or_else(|| panic!("no integer {name} in INFO {section}:\n{info}"))
    }
}

/// Through a cluster client: each command goes to the node serving its key
/// (the key at position 1), following `MOVED` and `ASK` redirections.
impl Call for redis::cluster::ClusterConnection {
    fn call<A: ToRedisArgs>(&mut self, args: A) -> Reply {
        let shown = show_args(&args);
        let mut cmd = redis::Cmd::new();
        cmd.arg(args);
        cmd.query::<Value>(self).map_err(|err| {
            error_text(&err).unwrap_or_else(|| panic!("{shown}: cluster request failed: {err}"))
        })
    }
}

impl Call for Connection {
    fn call<A: ToRedisArgs>(&mut self, args: A) -> Reply {
        let shown = show_args(&args);
        let mut cmd = redis::Cmd::new();
        cmd.arg(args);
        cmd.query::<Value>(self).map_err(|err| {
            error_text(&err).unwrap_or_else(|| panic!("{shown}: connection failed: {err}"))
        })
    }
}

/// `LOCK.ACQUIRE key owner ttl WAIT timeout` sent on `conn` from a thread
/// of its own, as it may block; the thread returns the reply. Returns at
/// once: wait on the server's state (`LOCK.INFO` `waiters`) to know it waits.
pub fn wait_on<C: Call + Send + 'static>(
    mut conn: C,
    key: &str,
    owner: &str,
    ttl_ms: i64,
    timeout_ms: i64,
) -> JoinHandle<Reply> {
    let args = wait_args(key, owner, ttl_ms, timeout_ms);
    thread::spawn(move || conn.call(&args))
}

/// [`wait_on`], and when the reply arrived: for tests that time a hand-off.
pub fn wait_on_timed<C: Call + Send + 'static>(
    mut conn: C,
    key: &str,
    owner: &str,
    ttl_ms: i64,
    timeout_ms: i64,
) -> JoinHandle<(Reply, Instant)> {
    let args = wait_args(key, owner, ttl_ms, timeout_ms);
    thread::spawn(move || {
        let reply = conn.call(&args);
        (reply, Instant::now())
    })
}

/// The arguments of `LOCK.ACQUIRE key owner ttl-ms WAIT timeout-ms`.
pub fn wait_args(key: &str, owner: &str, ttl_ms: i64, timeout_ms: i64) -> [String; 6] {
    [
        "LOCK.ACQUIRE".to_string(),
        key.to_string(),
        owner.to_string(),
        ttl_ms.to_string(),
        "WAIT".to_string(),
        timeout_ms.to_string(),
    ]
}

/// The fence a waiter ([`wait_on`]) was handed; panics if it got anything
/// else.
pub fn handed_fence(waiter: JoinHandle<Reply>, who: &str) -> i64 {
    match waiter.join().expect("the waiter's thread") {
        Ok(Value::Int(fence)) => fence,
        other => panic!("{who} was not handed the lock: {other:?}"),
    }
}

/// A lock's owner, count and fence: what `LOCK.INFO` shows that does not move
/// with time.
pub type Hold = (Vec<u8>, i64, i64);

/// A held lock as `LOCK.INFO` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockInfo {
    pub owner: Vec<u8>,
    pub count: i64,
    pub fence: i64,
    /// Milliseconds left on the lease.
    pub ttl: i64,
    pub waiters: i64,
}

impl LockInfo {
    /// Reads the RESP2 field/value array or the RESP3 map by field name
    /// (the spec allows more fields later).
    pub fn from_reply(value: &Value) -> Result<LockInfo, String> {
        let pairs: Vec<(&Value, &Value)> = match value {
            Value::Array(items) if items.len() % 2 == 0 => {
                items.chunks(2).map(|pair| (&pair[0], &pair[1])).collect()
            }
            Value::Map(pairs) => pairs.iter().map(|(k, v)| (k, v)).collect(),
            _ => return Err("not a field/value array or map".into()),
        };
        let field = |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| text(k).as_deref() == Some(name))
                .map(|(_, v)| *v)
                .ok_or_else(|| format!("no field {name}"))
        };
        let int = |name: &str| match field(name)? {
            Value::Int(n) => Ok(*n),
            other => Err(format!("{name} is not an integer: {other:?}")),
        };
        let owner = match field("owner")? {
            Value::BulkString(bytes) => bytes.clone(),
            other => Err(format!("owner is not a bulk string: {other:?}"))?,
        };
        Ok(LockInfo {
            owner,
            count: int("count")?,
            fence: int("fence")?,
            ttl: int("ttl")?,
            waiters: int("waiters")?,
        })
    }

    /// What does not move with time: owner, count, fence.
    pub fn held(&self) -> Hold {
        (self.owner.clone(), self.count, self.fence)
    }
}

/// A bulk or simple string reply as text.
pub fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Okay => Some("OK".into()),
        _ => None,
    }
}
