//! [`Server`]: one `redis-server` process with the module loaded, owned by
//! one test or bench: a free loopback port, its own dir, a readiness
//! deadline, restart on the same port and dir, and kill-and-wait on drop.
//! When the owner panics, drop prints the server log and keeps the dir;
//! otherwise a dir the kit made is removed.

use std::fmt::Write as _;
use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use redis::{Connection, FromRedisValue, ToRedisArgs};

use crate::call::{Call, LockInfo};
use crate::clockshift::ClockShift;
use crate::env::{cli_bin, server_bin, try_module_path};
use crate::port::{free_cluster_port, free_port};
use crate::{wait_until, READY_TIMEOUT, REPLY_TIMEOUT};

/// How long a stopped server gets to exit before it is killed.
const EXIT_TIMEOUT: Duration = Duration::from_secs(10);
/// Attempts at a first start, each on a new port (another process may take a
/// port between our probe and the server's bind).
const PORT_ATTEMPTS: usize = 5;

/// Gives every server of this process its own dir name.
static SERVERS_STARTED: AtomicUsize = AtomicUsize::new(0);

/// A replica of `master`, started and with its link to the master up.
pub fn start_replica(master: &Server, label: &str) -> Server {
    let replica = Server::builder().label(label).replica_of(master).start();
    replica.wait_for_master_link();
    replica
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
    /// The module file to load instead of [`try_module_path`]'s.
    module: Option<PathBuf>,
    config_file: Option<String>,
    dir: Option<PathBuf>,
    port: Option<u16>,
    wrapper: Option<(String, Vec<String>)>,
    env: Vec<(String, PathBuf)>,
    ready_timeout: Duration,
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

    /// AOF on, fsynced on every write, with or without the RDB preamble: a
    /// killed server keeps every reply it sent.
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
    /// (`MODULE LOAD`/`LOADEX`, or a `loadmodule` line in its config file),
    /// or measures a server without it.
    pub fn without_module(mut self) -> Self {
        self.load_module = false;
        self
    }

    /// Loads this module file rather than the one `LOCK_MODULE` names.
    pub fn module(mut self, path: &Path) -> Self {
        self.module = Some(path.to_path_buf());
        self
    }

    /// Starts from a config file with this text (`redis.conf` in the
    /// server's dir, its path first on the command line). The `--name value`
    /// arguments follow it, so the server reads them after the file.
    pub fn config_file(mut self, text: &str) -> Self {
        self.config_file = Some(text.to_string());
        self
    }

    /// Uses this dir (created if missing) instead of one of the kit's own;
    /// it belongs to the caller and is left in place on drop.
    pub fn dir(mut self, dir: &Path) -> Self {
        self.dir = Some(dir.to_path_buf());
        self
    }

    /// Listens on this port rather than a free one found at start.
    pub fn port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }

    /// Runs the server through `program args…` (`taskset -c 1`, `valgrind
    /// …`), which must exec it in the same process: readiness is checked
    /// against the server's `process_id`.
    pub fn wrapper(mut self, program: &str, args: &[String]) -> Self {
        self.wrapper = Some((program.to_string(), args.to_vec()));
        self
    }

    /// Runs the server with its wall clock offset by `shift` (see
    /// [`ClockShift`]); its monotonic clock stays the real one.
    pub fn clock_shift(mut self, shift: &ClockShift) -> Self {
        for (name, value) in shift.env() {
            self.env.push((name.to_string(), value));
        }
        self
    }

    /// Sets an environment variable of the server process.
    pub fn env(mut self, name: &str, value: &Path) -> Self {
        self.env.push((name.to_string(), value.to_path_buf()));
        self
    }

    /// How long the server gets to answer `PING` (default 10 s; a server
    /// under valgrind needs more).
    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.ready_timeout = timeout;
        self
    }

    /// Starts the server and waits until it answers `PING`; panics if it
    /// does not (the server log is printed).
    pub fn start(self) -> Server {
        let (mut server, cluster, fixed) = self.prepare().unwrap_or_else(|why| panic!("{why}"));
        if let Err(failures) = server.launch_first(cluster, fixed) {
            // Dropping `server` as this panics prints its log.
            panic!("{} did not start:\n{failures}", server.label);
        }
        server
    }

    /// [`ServerBuilder::start`], with an error (the server log in it) instead
    /// of a panic: for the benches, which report and go on.
    pub fn try_start(self) -> Result<Server, String> {
        let (mut server, cluster, fixed) = self.prepare()?;
        match server.launch_first(cluster, fixed) {
            Ok(()) => Ok(server),
            Err(failures) => Err(format!(
                "{} did not start:\n{failures}--- log ---\n{}",
                server.label,
                server.log()
            )),
        }
    }

    /// The server, its dir made, not started yet.
    fn prepare(self) -> Result<(Server, bool, Option<u16>), String> {
        let module = match (self.load_module, self.module) {
            (false, _) => None,
            (true, Some(path)) => Some(path),
            (true, None) => Some(try_module_path()?),
        };
        let own_dir = self.dir.is_none();
        let dir = match self.dir {
            Some(dir) => dir,
            None => {
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
                    fs::remove_dir_all(&dir)
                        .map_err(|e| format!("remove a stale dir {}: {e}", dir.display()))?;
                }
                dir
            }
        };
        fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let config_file = match self.config_file {
            Some(text) => {
                let path = dir.join("redis.conf");
                fs::write(&path, text).map_err(|e| format!("write {}: {e}", path.display()))?;
                Some(path)
            }
            None => None,
        };
        let server = Server {
            label: self.label,
            port: 0,
            dir,
            own_dir,
            module,
            config_file,
            config: self.config,
            wrapper: self.wrapper,
            env: self.env,
            ready_timeout: self.ready_timeout,
            child: None,
        };
        Ok((server, self.cluster, self.port))
    }
}

fn set_config(config: &mut Vec<(String, String)>, name: &str, value: String) {
    match config.iter_mut().find(|(n, _)| n == name) {
        Some(entry) => entry.1 = value,
        None => config.push((name.to_string(), value)),
    }
}

/// One `redis-server` with the module loaded.
pub struct Server {
    label: String,
    port: u16,
    dir: PathBuf,
    /// The kit made the dir, so it removes it (unless the owner panicked).
    own_dir: bool,
    /// `None`: started without `--loadmodule`.
    module: Option<PathBuf>,
    /// A config file the server reads before its `--name value` arguments.
    config_file: Option<PathBuf>,
    config: Vec<(String, String)>,
    wrapper: Option<(String, Vec<String>)>,
    env: Vec<(String, PathBuf)>,
    ready_timeout: Duration,
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
            module: None,
            config_file: None,
            dir: None,
            port: None,
            wrapper: None,
            env: Vec::new(),
            ready_timeout: READY_TIMEOUT,
        }
    }

    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/`, for clients.
    pub fn url(&self) -> String {
        self.url_with("")
    }

    /// The server's `dir`: its RDB, AOF and log live here.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Changes a startup directive for the next [`Server::start_again`].
    pub fn set_startup_config(&mut self, name: &str, value: impl ToString) {
        set_config(&mut self.config, name, value.to_string());
    }

    /// The command line, without the binary: the kit's defaults, each
    /// replaced by the owner's own value if it set one, then the owner's config.
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

    /// The first start: on `fixed` if given, else on a new free port each
    /// attempt. Returns what went wrong on each port.
    fn launch_first(&mut self, cluster: bool, fixed: Option<u16>) -> Result<(), String> {
        let mut failures = String::new();
        let attempts = if fixed.is_some() { 1 } else { PORT_ATTEMPTS };
        for _ in 0..attempts {
            self.port = match fixed {
                Some(port) => port,
                None if cluster => free_cluster_port(),
                None => free_port(),
            };
            match self.launch() {
                Ok(()) => return Ok(()),
                Err(why) => {
                    let _ = writeln!(failures, "port {}: {why}", self.port);
                }
            }
        }
        Err(failures)
    }

    /// Spawns the process and waits until it answers `PING`.
    fn launch(&mut self) -> Result<(), String> {
        // Appended to, like redis.log, so a restart keeps the earlier runs.
        let output = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("stdout.log"))
            .map_err(|e| format!("open stdout.log: {e}"))?;
        let errors = output
            .try_clone()
            .map_err(|e| format!("clone stdout.log: {e}"))?;
        let mut command = match &self.wrapper {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(server_bin());
                command
            }
            None => Command::new(server_bin()),
        };
        let program = command.get_program().to_string_lossy().into_owned();
        let child = command
            .args(self.args())
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(output)
            .stderr(errors)
            .spawn()
            .map_err(|e| format!("cannot run {program}: {e}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + self.ready_timeout;
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
                // Another server may hold the port while ours fails to bind
                // it: only our own process counts as started.
                if Some(pid) == self.pid() {
                    return Ok(());
                }
                self.kill_process();
                return Err(format!("port taken by process {pid}"));
            }
            if Instant::now() > deadline {
                self.kill_process();
                return Err(format!("no PONG within {:?}", self.ready_timeout));
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

    fn url_with(&self, query: &str) -> String {
        format!("redis://127.0.0.1:{}/{query}", self.port)
    }

    fn connect(&self, url: &str) -> Connection {
        self.try_connect(url)
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.label))
    }

    fn try_connect(&self, url: &str) -> redis::RedisResult<Connection> {
        let client = redis::Client::open(url)?;
        let conn = client.get_connection_with_timeout(REPLY_TIMEOUT)?;
        conn.set_read_timeout(Some(REPLY_TIMEOUT))?;
        conn.set_write_timeout(Some(REPLY_TIMEOUT))?;
        Ok(conn)
    }

    /// A new RESP2 connection; replies may take up to 10 s.
    pub fn conn(&self) -> Connection {
        self.connect(&self.url())
    }

    /// [`Server::conn`] with an error instead of a panic, for the benches.
    pub fn try_conn(&self) -> redis::RedisResult<Connection> {
        self.try_connect(&self.url())
    }

    /// A new RESP3 connection (`HELLO 3`).
    pub fn conn_resp3(&self) -> Connection {
        self.connect(&self.url_with("?protocol=resp3"))
    }

    /// One command on a new connection that must succeed, its reply converted.
    pub fn q<T: FromRedisValue>(&self, args: impl ToRedisArgs) -> T {
        self.conn().value(args)
    }

    /// `LOCK.INFO key` on a new connection: the hold, or `None` if free.
    pub fn lock_info(&self, key: &str) -> Option<LockInfo> {
        self.conn().lock_info(key)
    }

    /// Calls of a command so far (`INFO commandstats`), 0 if never called.
    pub fn calls(&self, command: &str) -> i64 {
        let info: String = self.q(&["INFO", "commandstats"]);
        let prefix = format!("cmdstat_{command}:calls=");
        info.lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next()?.parse().ok())
            .unwrap_or(0)
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
        } else if self.own_dir {
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
