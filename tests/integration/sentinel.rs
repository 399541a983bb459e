//! Failovers as operators run them: three servers and three `redis-sentinel`s,
//! each in a network namespace of its own, joined by veth pairs to a bridge,
//! on addresses that exist only in those namespaces. Clients beside each
//! server — the Rust client and redis-py's `Sentinel` with the Python `Lock`,
//! both finding the master through Sentinel — loop lock → read-modify-write
//! on a store that refuses lower fences on reads and writes → release.
//! Each round either cuts the master's link (with the clients beside it)
//! until Sentinel has promoted a replica, then heals it, or kills it
//! (`SIGKILL`) and starts it again; every few partition rounds a second
//! failover follows the first at once. The rounds are judged from the
//! clients' grant and release times and the store: no two holds of one lock
//! overlap, no fence is issued twice, no update is lost.
//!
//! With `lock.max-ttl` alone an isolated master keeps granting, and the
//! same run shows overlapping holds: the test can fail.
//!
//! Needs root (`ip netns`); CI runs as root. Without it the tests fail and
//! say so. `LOCK_PARTITION_ROUNDS=n` sets the rounds of each kind (`make
//! partition` runs 20); the default is a short run for the integration suite.
//! The store and every control command go over unix sockets, which reach
//! into any network namespace; only the servers', Sentinels' and clients'
//! own traffic crosses the bridge.

use std::collections::HashMap;
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use redis::{Connection, Value};

use crate::harness::{module_path, server_bin, wait_until};

/// Sentinel's `down-after-milliseconds`: the module's gate refuses grants
/// within `min-replicas-max-lag` (1 s) of the cut, and a promoted node's
/// quarantine waits that lag plus `lock.max-ttl`, so Sentinel need only
/// promote after the cut; this is the docs' example, equal to the lag.
const DOWN_AFTER_MS: u64 = 1_000;
/// The control run (`lock.max-ttl` alone) keeps the old 2 s: its partitions
/// last longer, so its overlaps show on a loaded machine too (at 1 s, one
/// round showed none in 4 of 7 runs on a shared 2-core machine; at 2 s, 170
/// in a run between them).
const CONTROL_DOWN_AFTER_MS: u64 = 2_000;
/// The most partition rounds the control run makes to show an overlap.
const CONTROL_ROUNDS: usize = 4;
/// `lock.max-ttl`, the clients' lease.
const MAX_TTL_MS: u64 = 1_000;
/// How long a cut master stays cut after the promotion: the promoted node's
/// quarantine (`lock.max-ttl`, plus the lag with the recommended settings)
/// and a second more with both sides up.
const PARTITION_LINGER: Duration = Duration::from_millis(3 * MAX_TTL_MS);
/// Locks the clients share: few, so that both sides contend.
const LOCKS: usize = 3;
/// How long any one step of a round may take.
const STEP: Duration = Duration::from_secs(40);

static RUNS: AtomicUsize = AtomicUsize::new(0);

fn run(cmd: &str, args: &[&str]) {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
}

/// The namespaces, the bridge and the links; all deleted on drop, whatever
/// happened.
struct Net {
    hub: String,
    members: Vec<String>,
    subnet: u8,
}

impl Net {
    /// A hub namespace with a bridge, and `count` member namespaces, member
    /// `k` at `198.18.subnet.(10 + k)`.
    fn new(tag: &str, count: usize, subnet: u8) -> Net {
        let mut net = Net {
            hub: format!("rl{tag}h"),
            members: Vec::new(),
            subnet,
        };
        run("ip", &["netns", "add", &net.hub]);
        run("ip", &["-n", &net.hub, "link", "set", "lo", "up"]);
        run(
            "ip",
            &["-n", &net.hub, "link", "add", "br0", "type", "bridge"],
        );
        run("ip", &["-n", &net.hub, "link", "set", "br0", "up"]);
        for k in 0..count {
            let ns = format!("rl{tag}m{k}");
            run("ip", &["netns", "add", &ns]);
            net.members.push(ns.clone());
            let peer = format!("p{k}");
            run(
                "ip",
                &[
                    "-n", &ns, "link", "add", "eth0", "type", "veth", "peer", "name", &peer,
                    "netns", &net.hub,
                ],
            );
            run(
                "ip",
                &["-n", &net.hub, "link", "set", &peer, "master", "br0"],
            );
            run("ip", &["-n", &net.hub, "link", "set", &peer, "up"]);
            let addr = format!("{}/24", net.addr(k));
            run("ip", &["-n", &ns, "addr", "add", &addr, "dev", "eth0"]);
            run("ip", &["-n", &ns, "link", "set", "eth0", "up"]);
            run("ip", &["-n", &ns, "link", "set", "lo", "up"]);
        }
        net
    }

    fn addr(&self, k: usize) -> String {
        format!("198.18.{}.{}", self.subnet, 10 + k)
    }

    /// Cuts (`false`) or restores member `k`'s link to the bridge.
    fn link(&self, k: usize, up: bool) {
        let state = if up { "up" } else { "down" };
        run(
            "ip",
            &["-n", &self.hub, "link", "set", &format!("p{k}"), state],
        );
    }

    /// `cmd` inside member `k`'s namespace.
    fn command(&self, k: usize, program: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.members[k], program]);
        cmd
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in self.members.iter().chain([&self.hub]) {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// A process killed (and waited for) on drop.
struct Proc {
    child: Option<Child>,
    log: PathBuf,
}

impl Proc {
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
        if thread::panicking() {
            let log = fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!("--- {} (last lines) ---", self.log.display());
            for line in tail.iter().rev() {
                eprintln!("{line}");
            }
        }
    }
}

/// The settings under test.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Settings {
    /// What the docs recommend: `lock.max-ttl` and `min-replicas-*`.
    Recommended,
    /// `lock.max-ttl` only.
    MaxTtlOnly,
}

/// What the rounds produced.
#[derive(Debug, Default)]
struct Verdict {
    failovers: usize,
    holds: usize,
    /// Releases that failed (a master that died or was cut off): the
    /// holder had stopped using the lock when it sent them.
    failed_releases: usize,
    overlaps: usize,
    longest_overlap_ms: f64,
    fences_twice: usize,
    lost_updates: i64,
    /// Holds per client process (`rust@1`: the Rust client beside server 1).
    holds_by_worker: HashMap<String, usize>,
}

/// Three servers, three Sentinels, clients beside each server, the store.
struct Setup {
    // Dropped in this order: clients, Sentinels, servers, store, then the
    // namespaces (processes first, so none outlives its namespace).
    workers: Vec<Proc>,
    sentinels: Vec<Proc>,
    servers: Vec<Option<Proc>>,
    /// Kept for its drop: the store stops with the setup.
    _store: Proc,
    net: Net,
    dir: PathBuf,
    settings: Settings,
    stop_file: PathBuf,
    lines: Arc<Mutex<Vec<String>>>,
    readers: Vec<JoinHandle<()>>,
}

const SERVERS: usize = 3;
const SENTINELS: usize = 3;

impl Setup {
    fn start(settings: Settings) -> Setup {
        assert!(
            is_root(),
            "the partition tests need root for `ip netns` (CI runs as root); \
             run them as root rather than skip them"
        );
        let run_no = RUNS.fetch_add(1, Ordering::Relaxed);
        let tag = format!("{:x}{run_no}", std::process::id() % 0xfff);
        let dir = PathBuf::from(format!("/tmp/rlp-{tag}"));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("the test dir");
        let subnet = u8::try_from((std::process::id() as usize + run_no) % 250 + 1).unwrap_or(1);
        let net = Net::new(&tag, SERVERS + SENTINELS, subnet);
        let store = start_store(&dir);
        let mut setup = Setup {
            workers: Vec::new(),
            sentinels: Vec::new(),
            servers: Vec::new(),
            _store: store,
            net,
            stop_file: dir.join("stop"),
            dir,
            settings,
            lines: Arc::new(Mutex::new(Vec::new())),
            readers: Vec::new(),
        };
        for k in 0..SERVERS {
            let server = setup.start_server(k, k != 0);
            setup.servers.push(Some(server));
        }
        for k in 0..SERVERS {
            wait_until("the server answers", STEP, || setup.try_conn(k).is_some());
        }
        wait_until("both replicas are in sync", STEP, || {
            setup.info(0, "replication", "connected_slaves") == Some(2)
        });
        for j in 0..SENTINELS {
            let sentinel = setup.start_sentinel(j);
            setup.sentinels.push(sentinel);
        }
        wait_until("every Sentinel knows the others", STEP, || {
            (0..SENTINELS).all(|j| setup.sentinel_peers(j) == Some(SENTINELS - 1))
        });
        setup.start_workers();
        setup
    }

    fn server_dir(&self, k: usize) -> PathBuf {
        self.dir.join(format!("n{k}"))
    }

    fn socket(&self, k: usize) -> PathBuf {
        self.dir.join(format!("n{k}.sock"))
    }

    fn start_server(&self, k: usize, replica: bool) -> Proc {
        let dir = self.server_dir(k);
        fs::create_dir_all(&dir).expect("server dir");
        let log = dir.join("redis.log");
        let module = module_path();
        let mut args: Vec<String> = vec![
            "--port".into(),
            "6379".into(),
            "--bind".into(),
            self.net.addr(k),
            "--protected-mode".into(),
            "no".into(),
            "--unixsocket".into(),
            self.socket(k).display().to_string(),
            "--unixsocketperm".into(),
            "700".into(),
            "--dir".into(),
            dir.display().to_string(),
            "--logfile".into(),
            log.display().to_string(),
            "--save".into(),
            "".into(),
            "--appendonly".into(),
            "no".into(),
            "--loadmodule".into(),
            module.display().to_string(),
            "--lock.max-ttl".into(),
            MAX_TTL_MS.to_string(),
        ];
        if self.settings == Settings::Recommended {
            for (name, value) in [
                ("min-replicas-to-write", "1"),
                ("min-replicas-max-lag", "1"),
            ] {
                args.push(format!("--{name}"));
                args.push(value.into());
            }
        }
        if replica {
            args.push("--replicaof".into());
            args.push(self.net.addr(0));
            args.push("6379".into());
        }
        let child = self
            .net
            .command(k, &server_bin())
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        Proc {
            child: Some(child),
            log,
        }
    }

    fn start_sentinel(&self, j: usize) -> Proc {
        let member = SERVERS + j;
        let dir = self.dir.join(format!("s{j}"));
        fs::create_dir_all(&dir).expect("sentinel dir");
        let log = dir.join("sentinel.log");
        let conf = dir.join("sentinel.conf");
        let text = format!(
            "port 26379\nbind {addr}\nprotected-mode no\nunixsocket {sock}\nunixsocketperm 700\n\
             dir {dir}\nlogfile {log}\n\
             sentinel monitor m {master} 6379 2\n\
             sentinel down-after-milliseconds m {down_after}\n\
             sentinel failover-timeout m 10000\n\
             sentinel parallel-syncs m 2\n",
            addr = self.net.addr(member),
            sock = self.sentinel_socket(j).display(),
            dir = dir.display(),
            log = log.display(),
            master = self.net.addr(0),
            down_after = match self.settings {
                Settings::Recommended => DOWN_AFTER_MS,
                Settings::MaxTtlOnly => CONTROL_DOWN_AFTER_MS,
            },
        );
        fs::write(&conf, text).expect("sentinel.conf");
        let child = self
            .net
            .command(member, "redis-sentinel")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-sentinel (apt-get install redis-sentinel)");
        Proc {
            child: Some(child),
            log,
        }
    }

    fn sentinel_socket(&self, j: usize) -> PathBuf {
        self.dir.join(format!("s{j}.sock"))
    }

    fn sentinel_addrs(&self) -> String {
        (0..SENTINELS)
            .map(|j| format!("{}:26379", self.net.addr(SERVERS + j)))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn start_workers(&mut self) {
        let rust = worker_bin();
        let python = python_bin();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/tests/partition_worker.py");
        let sentinels = self.sentinel_addrs();
        let store = self.dir.join("store.sock").display().to_string();
        let stop = self.stop_file.display().to_string();
        let locks = LOCKS.to_string();
        for k in 0..SERVERS {
            let rust_worker = self
                .net
                .command(k, &rust.display().to_string())
                .args([&sentinels, "m", &store, &locks, "2", &stop])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("start the Rust worker");
            let py_worker = self
                .net
                .command(k, &python)
                .arg(&script)
                .args([&sentinels, "m", &store, &locks, "2", &stop])
                .env(
                    "PYTHONPATH",
                    Path::new(env!("CARGO_MANIFEST_DIR")).join("python"),
                )
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("start the Python worker");
            for (kind, mut child) in [("rust", rust_worker), ("python", py_worker)] {
                let out = child.stdout.take().expect("worker stdout");
                let lines = self.lines.clone();
                let label = format!("{kind}@{k}");
                self.readers.push(thread::spawn(move || {
                    for line in BufReader::new(out).lines().map_while(Result::ok) {
                        lines.lock().expect("lines").push(format!("{label} {line}"));
                    }
                }));
                self.workers.push(Proc {
                    child: Some(child),
                    log: self.dir.join("worker.log"),
                });
            }
        }
    }

    fn try_conn(&self, k: usize) -> Option<Connection> {
        let url = format!("redis+unix://{}", self.socket(k).display());
        let client = redis::Client::open(url).ok()?;
        client
            .get_connection_with_timeout(Duration::from_secs(1))
            .ok()
    }

    fn info(&self, k: usize, section: &str, field: &str) -> Option<i64> {
        let mut c = self.try_conn(k)?;
        let text: String = redis::cmd("INFO").arg(section).query(&mut c).ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse().ok())
    }

    fn role(&self, k: usize) -> Option<String> {
        let mut c = self.try_conn(k)?;
        let role: Vec<Value> = redis::cmd("ROLE").query(&mut c).ok()?;
        match role.first()? {
            Value::BulkString(word) => Some(String::from_utf8_lossy(word).into_owned()),
            _ => None,
        }
    }

    fn sentinel_conn(&self, j: usize) -> Option<Connection> {
        let url = format!("redis+unix://{}", self.sentinel_socket(j).display());
        redis::Client::open(url)
            .ok()?
            .get_connection_with_timeout(Duration::from_secs(1))
            .ok()
    }

    fn sentinel_peers(&self, j: usize) -> Option<usize> {
        let mut c = self.sentinel_conn(j)?;
        let peers: Vec<Value> = redis::cmd("SENTINEL")
            .arg("SENTINELS")
            .arg("m")
            .query(&mut c)
            .ok()?;
        Some(peers.len())
    }

    /// The master every Sentinel names, if they agree.
    fn master(&self) -> Option<usize> {
        let mut named = None;
        for j in 0..SENTINELS {
            let mut c = self.sentinel_conn(j)?;
            let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg("m")
                .query(&mut c)
                .ok()?;
            let (host, _) = addr?;
            let k = (0..SERVERS).find(|&k| self.net.addr(k) == host)?;
            if named.is_some_and(|n| n != k) {
                return None;
            }
            named = Some(k);
        }
        named
    }

    /// Waits until Sentinel names a master other than `old`, and it is one.
    fn await_new_master(&self, old: usize) -> usize {
        let mut new = old;
        wait_until("Sentinel promotes a replica", STEP, || {
            match self.master() {
                Some(k) if k != old && self.role(k).as_deref() == Some("master") => {
                    new = k;
                    true
                }
                _ => false,
            }
        });
        new
    }

    /// Waits until server `k` replicates the current master with its link up.
    fn await_replica(&self, k: usize) {
        wait_until("the old master rejoins as a replica", STEP, || {
            self.role(k).as_deref() == Some("slave")
                && self.info(k, "replication", "master_sync_in_progress") == Some(0)
                && self
                    .try_conn(k)
                    .and_then(|mut c| {
                        redis::cmd("INFO")
                            .arg("replication")
                            .query::<String>(&mut c)
                            .ok()
                    })
                    .is_some_and(|text| text.contains("master_link_status:up"))
        });
    }

    /// Lets the clients run for a while on a healthy group.
    fn steady(&self, how_long: Duration) {
        thread::sleep(how_long);
    }

    /// One partition round: cut the master's link until Sentinel has
    /// promoted a replica and the promoted node's quarantine has ended, then
    /// heal; `double`: cut the new master as soon as it is promoted, too.
    /// Returns the failovers it made.
    fn partition_round(&self, double: bool) -> usize {
        let old = self.master().expect("Sentinels agree on a master");
        self.net.link(old, false);
        let new = self.await_new_master(old);
        // Both sides may grant only once the new master's quarantine (the
        // lease cap) has ended: healing sooner turns the old master into a
        // replica before the sides ever overlap, and the control run would
        // show nothing, as it did when the heal came first.
        thread::sleep(PARTITION_LINGER);
        let mut failovers = 1;
        if double {
            // The old master rejoins while the new one is cut off at once.
            self.net.link(old, true);
            self.net.link(new, false);
            let third = self.await_new_master(new);
            assert_ne!(third, new);
            self.net.link(new, true);
            self.await_replica(new);
            failovers += 1;
        } else {
            self.net.link(old, true);
        }
        self.await_replica(old);
        failovers
    }

    /// One kill round: `SIGKILL` the master, wait for the promotion, start
    /// it again (empty: no persistence), and wait until it is a replica.
    fn kill_round(&mut self) -> usize {
        let old = self.master().expect("Sentinels agree on a master");
        if let Some(mut server) = self.servers[old].take() {
            server.kill();
        }
        self.await_new_master(old);
        let _ = fs::remove_file(self.socket(old));
        // It starts as a master (its own start quarantine, and no replica:
        // with min-replicas it takes no write) until Sentinel turns it.
        self.servers[old] = Some(self.start_server(old, false));
        self.await_replica(old);
        1
    }

    /// The overlaps among the holds the clients have printed so far.
    fn overlaps_so_far(&self) -> usize {
        let lines = self.lines.lock().expect("lines").clone();
        judge(&lines, |_| 0).overlaps
    }

    /// Stops the clients and judges what they saw.
    fn finish(mut self, failovers: usize) -> Verdict {
        fs::write(&self.stop_file, b"stop").expect("stop file");
        let deadline = Instant::now() + Duration::from_secs(20);
        for worker in &mut self.workers {
            while Instant::now() < deadline {
                let done = worker
                    .child
                    .as_mut()
                    .is_none_or(|c| c.try_wait().ok().flatten().is_some());
                if done {
                    break;
                }
                thread::sleep(Duration::from_millis(20));
            }
            worker.kill();
        }
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
        let lines = self.lines.lock().expect("lines").clone();
        // Kept beside the logs, for a look after a failure.
        let _ = fs::write(self.dir.join("holds.txt"), lines.join("\n"));
        let mut store = {
            let url = format!("redis+unix://{}", self.dir.join("store.sock").display());
            redis::Client::open(url)
                .expect("store url")
                .get_connection()
                .expect("the store")
        };
        let mut verdict = judge(&lines, |key| {
            redis::cmd("GET")
                .arg(key)
                .query::<Option<i64>>(&mut store)
                .ok()
                .flatten()
                .unwrap_or(0)
        });
        verdict.failovers = failovers;
        verdict
    }
}

/// Reads the holds the clients printed and judges them.
fn judge(lines: &[String], mut stored: impl FnMut(&str) -> i64) -> Verdict {
    /// From the grant's reply to the release's send.
    struct Hold {
        fence: u64,
        from: u128,
        to: u128,
        wrote: bool,
    }
    let mut by_lock: HashMap<String, Vec<Hold>> = HashMap::new();
    let mut verdict = Verdict::default();
    for line in lines {
        let words: Vec<&str> = line.split_whitespace().collect();
        if let [worker, "hold", key, fence, from, to, released, wrote] = words.as_slice() {
            *verdict
                .holds_by_worker
                .entry(worker.to_string())
                .or_default() += 1;
            if *released == "0" {
                verdict.failed_releases += 1;
            }
            let (Ok(fence), Ok(from), Ok(to)) = (fence.parse(), from.parse(), to.parse()) else {
                continue;
            };
            by_lock.entry(key.to_string()).or_default().push(Hold {
                fence,
                from,
                to,
                wrote: *wrote == "1",
            });
        }
    }
    let mut fences: HashMap<u64, usize> = HashMap::new();
    for (key, holds) in &mut by_lock {
        holds.sort_by_key(|h| h.from);
        verdict.holds += holds.len();
        let mut latest_end: u128 = 0;
        for hold in holds.iter() {
            if hold.from < latest_end {
                verdict.overlaps += 1;
                let ms = (latest_end - hold.from) as f64 / 1000.0;
                verdict.longest_overlap_ms = verdict.longest_overlap_ms.max(ms);
            }
            latest_end = latest_end.max(hold.to);
            *fences.entry(hold.fence).or_default() += 1;
        }
        let wrote = holds.iter().filter(|h| h.wrote).count() as i64;
        verdict.lost_updates += wrote - stored(key);
    }
    verdict.fences_twice = fences.values().filter(|&&n| n > 1).count();
    verdict
}

fn start_store(dir: &Path) -> Proc {
    let log = dir.join("store.log");
    let child = Command::new(server_bin())
        .args(["--port", "0", "--unixsocket"])
        .arg(dir.join("store.sock"))
        .args([
            "--unixsocketperm",
            "777",
            "--save",
            "",
            "--appendonly",
            "no",
            "--logfile",
        ])
        .arg(&log)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the store");
    let sock = dir.join("store.sock");
    wait_until("the store answers", STEP, || {
        redis::Client::open(format!("redis+unix://{}", sock.display()))
            .ok()
            .and_then(|c| c.get_connection().ok())
            .is_some()
    });
    Proc {
        child: Some(child),
        log,
    }
}

/// The Rust client's worker (`cargo build --release -p redislock-client
/// --examples`; `make test` builds it).
fn worker_bin() -> PathBuf {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/examples/partition_worker");
    assert!(
        path.is_file(),
        "{} not found: cargo build --release -p redislock-client --examples",
        path.display()
    );
    path
}

/// Python with redis-py and the `redislock` package: the Makefile's venv.
fn python_bin() -> String {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/pyenv/bin/python");
    assert!(
        venv.is_file(),
        "{} not found: make python-env",
        venv.display()
    );
    venv.display().to_string()
}

fn rounds() -> usize {
    std::env::var("LOCK_PARTITION_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1)
}

/// The run with the recommended settings: not one overlap, duplicate fence
/// or lost update, through partitions (some followed by a second failover
/// at once) and kills.
#[test]
fn with_the_recommended_settings_no_failover_breaks_mutual_exclusion() {
    let mut setup = Setup::start(Settings::Recommended);
    let rounds = rounds();
    let started = Instant::now();
    let mut failovers = (0, 0);
    setup.steady(Duration::from_secs(2));
    for round in 0..rounds {
        failovers.0 += setup.partition_round(round % 4 == 0);
        setup.steady(Duration::from_secs(1));
        failovers.1 += setup.kill_round();
        setup.steady(Duration::from_secs(1));
    }
    let verdict = setup.finish(failovers.0 + failovers.1);
    eprintln!(
        "recommended settings: {} partition failovers, {} kills in {:?}: {verdict:?}",
        failovers.0,
        failovers.1,
        started.elapsed()
    );
    assert!(
        verdict.holds > 10 * rounds,
        "the clients made progress: {verdict:?}"
    );
    assert_eq!(verdict.overlaps, 0, "overlapping holds: {verdict:?}");
    assert_eq!(verdict.fences_twice, 0, "fences issued twice: {verdict:?}");
    assert_eq!(verdict.lost_updates, 0, "lost updates: {verdict:?}");
}

/// The same partitions with `lock.max-ttl` alone: the isolated master keeps
/// granting on its side, and holds overlap.
#[test]
fn with_max_ttl_alone_a_partition_gives_overlapping_holds() {
    let setup = Setup::start(Settings::MaxTtlOnly);
    let rounds = rounds().div_ceil(2);
    let mut failovers = 0;
    setup.steady(Duration::from_secs(2));
    // On a starved machine one partition can pass with the two sides never
    // granting the same lock at once: a few more rounds, until one does.
    for round in 0..rounds.max(CONTROL_ROUNDS) {
        failovers += setup.partition_round(false);
        setup.steady(Duration::from_secs(1));
        if round + 1 >= rounds && setup.overlaps_so_far() > 0 {
            break;
        }
    }
    let verdict = setup.finish(failovers);
    eprintln!("lock.max-ttl alone: {verdict:?}");
    assert!(
        verdict.overlaps > 0,
        "an isolated master without min-replicas keeps granting: {verdict:?}"
    );
}
