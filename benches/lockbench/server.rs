//! The machine under test: `redis-server` processes with the module loaded,
//! CPU pinning, the seed shim for `redis-benchmark`, and the watchdog.
//!
//! Each [`Server`] is a server of the workspace's test kit
//! (`redislock-testkit`): a free loopback port, chosen by `LOCK_SERVER` as
//! for the tests, a dir of its own under the run's temp dir, no persistence
//! (`--save "" --appendonly no`), killed and waited for on drop. When the machine has two or more CPUs the server gets
//! one to itself and every client (this process, its threads and
//! `redis-benchmark`) runs on the others, so client load does not steal the
//! server's core and runs repeat better.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use redislock_testkit::bench::compile_preload;
use redislock_testkit::server_bin;

use crate::resp::Conn;
use crate::Res;

/// Processes this run started, for the watchdog to kill if the run overruns.
static CHILDREN: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// Remembers a child process until [`forget_child`].
pub fn track_child(pid: u32) {
    CHILDREN.lock().unwrap_or_else(|e| e.into_inner()).push(pid);
}

/// Forgets a child process that has been waited for.
pub fn forget_child(pid: u32) {
    CHILDREN
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|&p| p != pid);
}

/// Aborts the whole run after `limit`: kills the servers and load generators
/// it started (by their ids), then exits with an error. Every section has its
/// own bounds; this catches what they do not.
pub fn start_watchdog(limit: Duration) {
    thread::spawn(move || {
        thread::sleep(limit);
        eprintln!("lockbench: the run took longer than {limit:?}: aborting");
        let pids = CHILDREN.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for pid in pids {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
        std::process::exit(2);
    });
}

/// What the report says about the machine.
pub struct Machine {
    /// `nproc`: CPUs this process may run on.
    pub cores: usize,
    pub cpu_model: String,
    /// `redis-server --version`, first words.
    pub redis_version: String,
    /// `/proc/loadavg` when the run started: other load on a shared machine.
    pub load_at_start: String,
    pub pinning: Pinning,
}

/// Which CPUs the server and the clients run on (`taskset` lists).
pub struct Pinning {
    pub server: Option<String>,
    pub clients: Option<String>,
}

impl Machine {
    /// Reads the machine and pins this process to the client CPUs (before any
    /// thread starts, so every thread and child inherits it).
    pub fn probe_and_pin() -> Res<Machine> {
        let cpus = allowed_cpus().unwrap_or_default();
        let cores = if cpus.is_empty() {
            thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            cpus.len()
        };
        let pinning = match cpus.split_last() {
            Some((server, clients)) if !clients.is_empty() => {
                let clients = clients
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(",");
                let pinned = Command::new("taskset")
                    .args(["-pc", &clients, &std::process::id().to_string()])
                    .stdout(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success());
                if pinned {
                    Pinning {
                        server: Some(server.to_string()),
                        clients: Some(clients),
                    }
                } else {
                    Pinning::none()
                }
            }
            _ => Pinning::none(),
        };
        let cpu_model = fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|text| {
                text.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split(':').nth(1))
                    .map(|m| m.trim().to_string())
            })
            .unwrap_or_else(|| "unknown CPU".into());
        let out = Command::new(server_bin())
            .arg("--version")
            .output()
            .map_err(|e| format!("cannot run {}: {e}", server_bin()))?;
        let redis_version = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ");
        Ok(Machine {
            load_at_start: load_average(),
            cores,
            cpu_model,
            redis_version,
            pinning,
        })
    }
}

impl Pinning {
    fn none() -> Pinning {
        Pinning {
            server: None,
            clients: None,
        }
    }
}

/// The 1-minute load average and runnable tasks, from `/proc/loadavg`.
pub fn load_average() -> String {
    fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|t| t.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "unknown".into())
}

/// The CPUs this process may use, from `taskset -pc`.
fn allowed_cpus() -> Option<Vec<usize>> {
    let out = Command::new("taskset")
        .args(["-pc", &std::process::id().to_string()])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let list = text.rsplit(':').next()?.trim();
    let mut cpus = Vec::new();
    for part in list.split(',') {
        match part.split_once('-') {
            Some((a, b)) => cpus.extend(a.trim().parse::<usize>().ok()?..=b.trim().parse().ok()?),
            None => cpus.push(part.trim().parse().ok()?),
        }
    }
    Some(cpus)
}

pub fn redis_benchmark_bin() -> String {
    std::env::var("REDIS_BENCHMARK").unwrap_or_else(|_| "redis-benchmark".into())
}

/// What the checkout holding `path` is at: its commit, and whether its
/// `src/` had uncommitted changes (`git`; "unknown" without it). Given the
/// module's own path, this names the build measured even when `LOCK_MODULE`
/// points into another worktree than the bench's.
pub fn source_revision(path: &Path) -> String {
    let dir = if path.is_dir() {
        path
    } else {
        path.parent().unwrap_or(path)
    };
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match git(&["rev-parse", "--short", "HEAD"]) {
        Some(rev) => match git(&["status", "--porcelain", "--", ":/src"]) {
            Some(changes) if !changes.is_empty() => format!("{rev} + uncommitted changes in src/"),
            _ => rev,
        },
        None => "unknown".into(),
    }
}

/// The run's scratch dir (servers' dirs, the seed shim); removed on drop.
pub struct RunDir(pub PathBuf);

impl RunDir {
    pub fn create() -> Res<RunDir> {
        let dir = std::env::temp_dir().join(format!("lockbench-{}", std::process::id()));
        if dir.exists() {
            fs::remove_dir_all(&dir)?;
        }
        fs::create_dir_all(&dir)?;
        Ok(RunDir(dir))
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// `redis-benchmark` 7.0 seeds `random()` from the time and its pid and has no
/// `--seed` option (7.2 added one). The release run must hit exactly the keys
/// the acquire run took, so this `LD_PRELOAD` shim pins the seed: its
/// `srandom` passes `LOCKBENCH_SEED` on instead of the seed it was given.
const SEED_SHIM_C: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
void srandom(unsigned int seed) {
    void (*real)(unsigned int) = (void (*)(unsigned int))dlsym(RTLD_NEXT, "srandom");
    const char *pinned = getenv("LOCKBENCH_SEED");
    if (pinned) seed = (unsigned int)strtoul(pinned, 0, 10);
    real(seed);
}
"#;

/// Compiles the seed shim (see [`SEED_SHIM_C`]).
pub fn build_seed_shim(dir: &Path) -> Res<PathBuf> {
    Ok(compile_preload(
        dir,
        "seed",
        SEED_SHIM_C,
        "the redis-benchmark seed shim",
    )?)
}

/// One `redis-server` with the module loaded, known to the watchdog.
pub struct Server {
    pub port: u16,
    server: redislock_testkit::Server,
}

impl Server {
    /// Starts a server in `run_dir/<label>` and waits until it answers `PING`;
    /// with the module loaded unless `module` is `None` (the baseline of what
    /// the module's presence costs other commands). `maxclients` is raised
    /// for the waiter sections.
    pub fn start(
        run_dir: &Path,
        label: &str,
        module: Option<&Path>,
        pinning: &Pinning,
        maxclients: usize,
    ) -> Res<Server> {
        let mut builder = redislock_testkit::Server::builder()
            .label(label)
            .dir(&run_dir.join(label))
            .config("appendonly", "no")
            // DEBUG HTSTATS, to wait for the keyspace's rehashing to end.
            .config("enable-debug-command", "local")
            .config("maxclients", maxclients);
        builder = match module {
            Some(module) => builder.module(module),
            None => builder.without_module(),
        };
        if let Some(cpu) = &pinning.server {
            builder = builder.wrapper("taskset", &["-c".into(), cpu.clone()]);
        }
        let server = builder.try_start()?;
        if let Some(pid) = server.pid() {
            track_child(pid);
        }
        Ok(Server {
            port: server.port(),
            server,
        })
    }

    /// A `redis` crate connection, for control commands and bulk loads.
    pub fn control(&self) -> Res<redis::Connection> {
        let con = self.server.try_conn()?;
        con.set_read_timeout(Some(crate::resp::IO_TIMEOUT))?;
        con.set_write_timeout(Some(crate::resp::IO_TIMEOUT))?;
        Ok(con)
    }

    /// A raw RESP connection.
    pub fn conn(&self) -> io::Result<Conn> {
        Conn::connect(self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // The kit's server kills and waits for its process as it drops.
        if let Some(pid) = self.server.pid() {
            forget_child(pid);
        }
    }
}

/// `INFO <section>` as field → value.
pub fn info_map(con: &mut redis::Connection, section: &str) -> Res<HashMap<String, String>> {
    let text: String = redis::cmd("INFO").arg(section).query(con)?;
    Ok(text
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect())
}

/// Waits until the server has finished growing its keyspace hash tables
/// (Redis rehashes incrementally, mostly in its 10 Hz cron): a run that
/// started during a rehash would pay for it. `hz` is raised meanwhile.
pub fn settle_rehashing(con: &mut redis::Connection, limit: Duration) -> Res<()> {
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("hz")
        .arg("500")
        .query::<()>(con)?;
    let deadline = Instant::now() + limit;
    let result = loop {
        let stats: String = redis::cmd("DEBUG").arg("HTSTATS").arg("0").query(con)?;
        if !stats.contains("rehashing target") {
            break Ok(());
        }
        if Instant::now() > deadline {
            break Err(format!("the keyspace was still rehashing after {limit:?}").into());
        }
        thread::sleep(Duration::from_millis(20));
    };
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("hz")
        .arg("10")
        .query::<()>(con)?;
    result
}

/// One numeric `INFO` field.
pub fn info_f64(con: &mut redis::Connection, section: &str, field: &str) -> Res<f64> {
    info_map(con, section)?
        .get(field)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("INFO {section} has no numeric {field}").into())
}

/// Seconds of CPU the server's main thread has used (user + system): the
/// work of serving commands, without background threads.
pub fn server_cpu_seconds(con: &mut redis::Connection) -> Res<f64> {
    let info = info_map(con, "cpu")?;
    let field = |name: &str| info.get(name).and_then(|v| v.parse::<f64>().ok());
    match (
        field("used_cpu_user_main_thread"),
        field("used_cpu_sys_main_thread"),
    ) {
        (Some(u), Some(s)) => Ok(u + s),
        _ => match (field("used_cpu_user"), field("used_cpu_sys")) {
            (Some(u), Some(s)) => Ok(u + s),
            _ => Err("INFO cpu has no used_cpu_user/used_cpu_sys".into()),
        },
    }
}

/// Command calls since the last `CONFIG RESETSTAT`, from `INFO commandstats`,
/// without the bench's own bookkeeping (`INFO`, `CONFIG`, `HELLO`, `CLIENT`).
/// Commands run inside scripts count too: they are server work.
pub fn command_calls(con: &mut redis::Connection) -> Res<HashMap<String, u64>> {
    let mut calls = HashMap::new();
    for (name, value) in info_map(con, "commandstats")? {
        let Some(cmd) = name.strip_prefix("cmdstat_") else {
            continue;
        };
        let top = cmd.split('|').next().unwrap_or(cmd);
        if matches!(top, "info" | "config" | "hello" | "client") {
            continue;
        }
        let count = value
            .split(',')
            .find_map(|kv| kv.strip_prefix("calls="))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        calls.insert(cmd.to_string(), count);
    }
    Ok(calls)
}

/// The soft limit on open files of this process, from `/proc/self/limits`.
pub fn open_files_limit() -> Option<usize> {
    let text = fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}
