//! `redis-server` under callgrind, and its instruction counter.
//!
//! Callgrind counts the instructions the server executes (`Ir`), the same
//! whatever else the machine is doing. [`VgServer::count`] zeroes the counter
//! (`callgrind_control -z`), runs a workload and dumps the counter
//! (`callgrind_control -d`): the dump file's `totals:` line is what the server
//! executed meanwhile, in every thread. `serverCron` and everything it calls
//! are left out (`--toggle-collect`): they run 10 times a second whatever the
//! clients do, so they would count the valgrind-slowed wall time, not the work
//! per operation.
//!
//! Redis seeds its hash functions from `/dev/urandom` at start, and where a
//! command's name lands in the chains of the command table changes what
//! looking it up costs: up to ~300 instructions per `SET`+`DEL` pair between
//! two starts of the same binary. An `LD_PRELOAD` shim ([`SEED_SHIM_C`])
//! hands every server the same 64 bytes instead (from [`INSTR_SEED`], 1 by
//! default), so a run repeats the last one; another seed shows how much the
//! figures move with the layout.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use redislock_testkit::bench::compile_preload;
use redislock_testkit::Server;

use crate::resp::Conn;
use crate::server::{forget_child, track_child};
use crate::Res;

/// How long a server under valgrind gets to answer `PING` (it starts about
/// 50 times slower than natively).
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// Replaces `/dev/urandom` with the file named by `INSTR_RANDOM_FILE` for
/// `fopen`, which is how Redis reads the seed of its hash functions.
pub const SEED_SHIM_C: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static const char *pinned(const char *path) {
    const char *file = getenv("INSTR_RANDOM_FILE");
    return (file && path && strcmp(path, "/dev/urandom") == 0) ? file : path;
}
FILE *fopen(const char *path, const char *mode) {
    FILE *(*real)(const char *, const char *) = dlsym(RTLD_NEXT, "fopen");
    return real(pinned(path), mode);
}
FILE *fopen64(const char *path, const char *mode) {
    FILE *(*real)(const char *, const char *) = dlsym(RTLD_NEXT, "fopen64");
    return real(pinned(path), mode);
}
"#;

/// A directory to keep every counted run's callgrind dump in, named after
/// the figure (`callgrind_annotate <file>` shows where the instructions
/// went); unset, dumps are deleted once read.
pub const INSTR_DUMPS: &str = "INSTR_DUMPS";

/// The seed's name in the environment: a number, 1 if unset.
pub const INSTR_SEED: &str = "INSTR_SEED";

/// The shim and the bytes it hands out, built once per run.
pub struct Seed {
    pub value: u64,
    shim: PathBuf,
    random_file: PathBuf,
}

impl Seed {
    /// Compiles the shim with the C compiler (`CC`, default `cc`) and writes
    /// 4 KiB of bytes drawn from the seed.
    pub fn prepare(dir: &Path) -> Res<Seed> {
        let value: u64 = match std::env::var(INSTR_SEED) {
            Ok(v) => v
                .parse()
                .map_err(|_| format!("{INSTR_SEED}={v}: not a number"))?,
            Err(_) => 1,
        };
        let shim = compile_preload(dir, "seed", SEED_SHIM_C, "the seed shim")?;
        // splitmix64: any fixed bytes would do, as long as each seed has its own.
        let mut state = value;
        let mut bytes = Vec::with_capacity(4096);
        while bytes.len() < 4096 {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            bytes.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
        }
        let random_file = dir.join("random.bin");
        fs::write(&random_file, bytes)?;
        Ok(Seed {
            value,
            shim,
            random_file,
        })
    }
}

/// How a server is configured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Setup {
    pub module: bool,
    pub aof: bool,
}

impl Setup {
    pub fn label(self) -> String {
        format!(
            "{}, {}",
            if self.module {
                "module loaded"
            } else {
                "no module"
            },
            if self.aof {
                "appendonly yes"
            } else {
                "no persistence"
            }
        )
    }
}

/// One `redis-server` running under `valgrind --tool=callgrind`: a server of
/// the workspace's test kit, started through valgrind.
pub struct VgServer {
    server: Server,
    /// Its process id, which valgrind keeps for the server it runs.
    pid: u32,
    /// Callgrind's output file; dump `k` is written to `<out>.<k>`.
    out: PathBuf,
    dumps: usize,
    /// What it measures, for the names of kept dumps.
    name: String,
    /// `--vgdb-prefix`, which callgrind_control needs too.
    vgdb_prefix: String,
}

impl VgServer {
    /// Starts a server in `dir` on a free loopback port, with the module at
    /// `module` loaded or not, the AOF on or off, and waits until it answers.
    /// `name` says what it will measure (see [`INSTR_DUMPS`]).
    pub fn start(
        dir: &Path,
        name: &str,
        setup: Setup,
        module: &Path,
        seed: &Seed,
    ) -> Res<VgServer> {
        fs::create_dir_all(dir)?;
        let out = dir.join("callgrind.out");
        let path = |p: &Path| p.display().to_string();
        let valgrind_args: Vec<String> = vec![
            "--tool=callgrind".into(),
            format!("--callgrind-out-file={}", path(&out)),
            format!("--log-file={}", path(&dir.join("valgrind.log"))),
            // vgdb's FIFOs, through which callgrind_control talks to the
            // server, go in its dir: a killed valgrind leaves them behind.
            format!("--vgdb-prefix={}", path(&dir.join("vgdb"))),
            "--toggle-collect=serverCron".into(),
            // `--toggle-collect` turns collection off at start unless told.
            "--collect-atstart=yes".into(),
        ];
        let mut builder = Server::builder()
            .label(name)
            .dir(dir)
            .wrapper(&valgrind_bin(), &valgrind_args)
            .env("LD_PRELOAD", &seed.shim)
            .env("INSTR_RANDOM_FILE", &seed.random_file)
            .ready_timeout(READY_TIMEOUT)
            .config("appendonly", if setup.aof { "yes" } else { "no" })
            .config("maxclients", 4000)
            // Under valgrind a command may take over 10 ms of wall time, and
            // logging it would be counted; natively none is that slow.
            .config("slowlog-log-slower-than", -1);
        builder = if setup.module {
            builder.module(module)
        } else {
            builder.without_module()
        };
        let server = builder.try_start().map_err(|why| {
            let vg = fs::read_to_string(dir.join("valgrind.log")).unwrap_or_default();
            format!("redis-server under valgrind: {why}\n--- valgrind log ---\n{vg}")
        })?;
        let pid = server
            .pid()
            .ok_or("the server under valgrind is not running")?;
        track_child(pid);
        Ok(VgServer {
            server,
            pid,
            out,
            dumps: 0,
            vgdb_prefix: path(&dir.join("vgdb")),
            name: name
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
                .collect(),
        })
    }

    /// Waits for the server to be idle: see [`Idle`].
    pub fn idle(&self) -> Idle {
        Idle {
            syscall: PathBuf::from(format!("/proc/{0}/task/{0}/syscall", self.pid)),
        }
    }

    pub fn conn(&self) -> Res<Conn> {
        Ok(Conn::connect(self.server.port())?)
    }

    /// Instructions the server executed while `work` ran.
    pub fn count(&mut self, work: impl FnOnce() -> Res<()>) -> Res<u64> {
        self.control("-z")?;
        work()?;
        self.control("-d")?;
        self.dumps += 1;
        let file = PathBuf::from(format!("{}.{}", self.out.display(), self.dumps));
        let text = fs::read_to_string(&file)
            .map_err(|e| format!("callgrind dump {}: {e}", file.display()))?;
        let totals = text
            .lines()
            .find_map(|l| l.strip_prefix("totals:"))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| format!("callgrind dump {} has no totals line", file.display()))?;
        // Kept on request, to see where the instructions go.
        if let Some(keep) = std::env::var_os(INSTR_DUMPS) {
            let name = format!("{}-{}.callgrind", self.name, self.dumps);
            fs::create_dir_all(&keep)?;
            fs::copy(&file, Path::new(&keep).join(name))?;
        }
        let _ = fs::remove_file(&file);
        Ok(totals)
    }

    /// `callgrind_control <flag> <pid>`: returns once the server has done it.
    fn control(&self, flag: &str) -> Res<()> {
        let out = Command::new(callgrind_control_bin())
            .arg(format!("--vgdb-prefix={}", self.vgdb_prefix))
            .args([flag, &self.pid.to_string()])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run {}: {e}", callgrind_control_bin()))?;
        if !out.status.success() || !String::from_utf8_lossy(&out.stdout).contains("OK") {
            return Err(format!(
                "callgrind_control {flag} failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
            .into());
        }
        Ok(())
    }
}

/// The server's main thread, to see when it is idle: blocked in
/// `epoll_wait` with a timeout, so done with everything it had to do.
///
/// A workload sends each command only then, as a client that is slower than
/// the server would. Otherwise how many turns of the event loop an operation
/// takes would depend on timing: a module's blocked-client reply wakes the
/// loop once more through a pipe, and a command that arrives before that
/// turn shares it. Natively the server is always waiting by then; under
/// valgrind, 50 times slower, often not.
pub struct Idle {
    syscall: PathBuf,
}

impl Idle {
    pub fn wait(&self) -> Res<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let text = fs::read_to_string(&self.syscall)
                .map_err(|e| format!("{}: {e}", self.syscall.display()))?;
            let mut fields = text.split_whitespace();
            let number = fields.next();
            // epoll_wait(epfd, events, maxevents, timeout), epoll_pwait(…).
            let timeout = fields.nth(3);
            if matches!(number, Some("232" | "281")) && timeout != Some("0x0") {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(
                    format!("the server was not idle within 30 s ({})", text.trim()).into(),
                );
            }
            thread::sleep(Duration::from_micros(20));
        }
    }
}

impl Drop for VgServer {
    fn drop(&mut self) {
        // The kit's server kills and waits for its process as it drops.
        forget_child(self.pid);
    }
}

fn valgrind_bin() -> String {
    std::env::var("VALGRIND").unwrap_or_else(|_| "valgrind".into())
}

fn callgrind_control_bin() -> String {
    std::env::var("CALLGRIND_CONTROL").unwrap_or_else(|_| "callgrind_control".into())
}
