//! [`Driver`]: the client under test, as a child process speaking the line
//! protocol of docs/conformance.md on its standard input and output.
//!
//! The command is `LOCK_DRIVER` (a shell command line, run with `sh -c`);
//! without it, the Rust client's driver built by `cargo build --release -p
//! redislock-client --examples`. A reader thread files each reply under its
//! id and each `! lost` event in order, with the time it was read, so a
//! scenario can time an event against the server's own clock. When a
//! scenario fails, drop prints the whole conversation and the driver's
//! standard error.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::harness::{now_ms, Server};

/// How long any reply may take before the scenario fails (a hung driver
/// fails the test, never hangs it).
pub const REPLY_LIMIT: Duration = Duration::from_secs(20);

static DRIVERS_STARTED: AtomicUsize = AtomicUsize::new(0);

/// The driver's command line.
pub fn driver_command() -> String {
    if let Some(cmd) = std::env::var("LOCK_DRIVER")
        .ok()
        .filter(|c| !c.trim().is_empty())
    {
        return cmd;
    }
    let rust =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/examples/conformance_driver");
    assert!(
        rust.is_file(),
        "no LOCK_DRIVER given and the Rust driver {} is not built: \
         cargo build --release -p redislock-client --examples",
        rust.display()
    );
    rust.display().to_string()
}

/// A reply line: `<id> ok name=value…` or `<id> err <kind> text`.
#[derive(Clone, Debug)]
pub struct Reply {
    pub ok: bool,
    /// The error kind (`timeout`, `not-owner`, …); empty when ok.
    pub kind: String,
    pub fields: HashMap<String, String>,
    pub line: String,
    /// When the suite read it.
    pub at: Instant,
}

impl Reply {
    /// A field the reply must have.
    pub fn field(&self, name: &str) -> &str {
        self.fields
            .get(name)
            .unwrap_or_else(|| panic!("no {name}= in reply {:?}", self.line))
    }

    /// An integer field the reply must have.
    pub fn int(&self, name: &str) -> i64 {
        let value = self.field(name);
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value} is not an integer in {:?}", self.line))
    }
}

/// An event line: `! <name> name=value…`.
#[derive(Clone, Debug)]
pub struct Event {
    pub name: String,
    pub fields: HashMap<String, String>,
    pub at: Instant,
    /// When the suite read it, in ms since the Unix epoch (the server's
    /// clock: `PEXPIRETIME` is on the same machine).
    pub unix_ms: i64,
}

impl Event {
    pub fn field(&self, name: &str) -> &str {
        self.fields.get(name).map(String::as_str).unwrap_or("")
    }
}

#[derive(Default)]
struct Inbox {
    replies: HashMap<u64, Reply>,
    events: Vec<Event>,
    closed: bool,
    transcript: String,
}

/// One driver process.
pub struct Driver {
    child: Child,
    stdin: Option<ChildStdin>,
    next: u64,
    inbox: Arc<(Mutex<Inbox>, Condvar)>,
    stderr: PathBuf,
    started: Instant,
}

fn pairs<'a>(words: impl Iterator<Item = &'a str>) -> HashMap<String, String> {
    words
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

impl Driver {
    /// Starts a driver, not connected yet.
    pub fn start() -> Driver {
        let n = DRIVERS_STARTED.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join("redislock-conformance");
        fs::create_dir_all(&dir).expect("temp dir for driver logs");
        let test = thread::current()
            .name()
            .unwrap_or("test")
            .replace("::", "-");
        let stderr = dir.join(format!("{test}-{}-{n}.stderr", std::process::id()));
        let errors = fs::File::create(&stderr).expect("driver stderr file");
        let command = driver_command();
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(&command)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(errors)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the driver `{command}`: {e}"));
        let stdout = child.stdout.take().expect("driver stdout");
        let stdin = child.stdin.take();
        let inbox: Arc<(Mutex<Inbox>, Condvar)> = Arc::default();
        let started = Instant::now();
        let reader = inbox.clone();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let at = Instant::now();
                let unix_ms = now_ms();
                let (lock, ready) = &*reader;
                let mut inbox = lock.lock().unwrap_or_else(|e| e.into_inner());
                let _ = writeln!(
                    inbox.transcript,
                    "{:>7.3}s <- {line}",
                    (at - started).as_secs_f64()
                );
                let mut words = line.split(' ');
                match words.next() {
                    Some("!") => {
                        let name = words.next().unwrap_or("").to_string();
                        let fields = pairs(words);
                        inbox.events.push(Event {
                            name,
                            fields,
                            at,
                            unix_ms,
                        });
                    }
                    Some(id) => {
                        if let Ok(id) = id.parse::<u64>() {
                            let status = words.next().unwrap_or("");
                            let ok = status == "ok";
                            let (kind, fields) = if ok {
                                (String::new(), pairs(words))
                            } else {
                                (words.next().unwrap_or("").to_string(), HashMap::new())
                            };
                            inbox.replies.insert(
                                id,
                                Reply {
                                    ok,
                                    kind,
                                    fields,
                                    line: line.clone(),
                                    at,
                                },
                            );
                        }
                    }
                    None => {}
                }
                ready.notify_all();
            }
            let (lock, ready) = &*reader;
            lock.lock().unwrap_or_else(|e| e.into_inner()).closed = true;
            ready.notify_all();
        });
        Driver {
            child,
            stdin,
            next: 1,
            inbox,
            stderr,
            started,
        }
    }

    /// A driver connected to `server`.
    pub fn connected(server: &Server) -> Driver {
        let mut driver = Driver::start();
        driver.ok(&format!("connect url={}", server.url()));
        driver
    }

    /// Sends a request (`acquire h=a key=k`); returns its id at once.
    pub fn send(&mut self, request: &str) -> u64 {
        let id = self.next;
        self.next += 1;
        let line = format!("{id} {request}");
        {
            let (lock, _) = &*self.inbox;
            let mut inbox = lock.lock().unwrap_or_else(|e| e.into_inner());
            let _ = writeln!(
                inbox.transcript,
                "{:>7.3}s -> {line}",
                self.started.elapsed().as_secs_f64()
            );
        }
        let stdin = self.stdin.as_mut().expect("driver stdin open");
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .unwrap_or_else(|e| panic!("write to the driver: {e}"));
        id
    }

    /// The reply to `id`, if it comes within `within`.
    pub fn reply_within(&self, id: u64, within: Duration) -> Option<Reply> {
        let deadline = Instant::now() + within;
        let (lock, ready) = &*self.inbox;
        let mut inbox = lock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(reply) = inbox.replies.get(&id) {
                return Some(reply.clone());
            }
            let now = Instant::now();
            if now >= deadline || inbox.closed {
                return None;
            }
            inbox = ready
                .wait_timeout(inbox, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// The reply to `id`; fails the scenario if none comes.
    pub fn reply(&self, id: u64) -> Reply {
        self.reply_within(id, REPLY_LIMIT)
            .unwrap_or_else(|| panic!("no reply to request {id} within {REPLY_LIMIT:?}"))
    }

    /// Sends and waits for the reply.
    pub fn call(&mut self, request: &str) -> Reply {
        let id = self.send(request);
        self.reply(id)
    }

    /// A request that must succeed.
    pub fn ok(&mut self, request: &str) -> Reply {
        let reply = self.call(request);
        assert!(reply.ok, "{request}: expected ok, got {:?}", reply.line);
        reply
    }

    /// A request that must fail; returns the reply.
    pub fn err(&mut self, request: &str) -> Reply {
        let reply = self.call(request);
        assert!(
            !reply.ok,
            "{request}: expected an error, got {:?}",
            reply.line
        );
        reply
    }

    /// A request that must fail with one of `kinds`.
    pub fn err_kind(&mut self, request: &str, kinds: &[&str]) -> Reply {
        let reply = self.err(request);
        assert!(
            kinds.contains(&reply.kind.as_str()),
            "{request}: expected err {kinds:?}, got {:?}",
            reply.line
        );
        reply
    }

    /// The `! lost` event of hold `h`, if it comes within `within`.
    pub fn lost_within(&self, h: &str, within: Duration) -> Option<Event> {
        let deadline = Instant::now() + within;
        let (lock, ready) = &*self.inbox;
        let mut inbox = lock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(event) = inbox
                .events
                .iter()
                .find(|e| e.name == "lost" && e.field("h") == h)
            {
                return Some(event.clone());
            }
            let now = Instant::now();
            if now >= deadline || inbox.closed {
                return None;
            }
            inbox = ready
                .wait_timeout(inbox, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// The `! lost` event of `h`, which must come within `within`.
    pub fn lost(&self, h: &str, within: Duration) -> Event {
        self.lost_within(h, within)
            .unwrap_or_else(|| panic!("no `! lost h={h}` within {within:?}"))
    }

    /// `status h=<h>`.
    pub fn status(&mut self, h: &str) -> Status {
        let reply = self.ok(&format!("status h={h}"));
        Status {
            held: reply.int("held") == 1,
            lost: reply.int("lost") == 1,
            reason: reply.field("reason").to_string(),
        }
    }

    /// Waits until `leaks` reports nothing running.
    pub fn no_leaks(&mut self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let running = self.ok("leaks").int("running");
            if running == 0 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "`leaks` still reports running={running} after {within:?}"
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// The driver's process id (the `sh -c` wrapper: its process tree is
    /// the driver).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// What `status` says of a hold.
#[derive(Debug, PartialEq, Eq)]
pub struct Status {
    pub held: bool,
    pub lost: bool,
    pub reason: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        // Closing stdin ends a driver that keeps the protocol; a driver that
        // does not is killed after a moment.
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(2);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if thread::panicking() {
            let (lock, _) = &*self.inbox;
            let inbox = lock.lock().unwrap_or_else(|e| e.into_inner());
            eprintln!(
                "--- driver `{}` conversation ---\n{}--- driver stderr ---\n{}--- end of driver ---",
                driver_command(),
                inbox.transcript,
                fs::read_to_string(&self.stderr).unwrap_or_default()
            );
        } else {
            let _ = fs::remove_file(&self.stderr);
        }
    }
}

/// CPU time (user + system) of process `pid` and all its descendants, in
/// ms, from `/proc`.
pub fn tree_cpu_ms(pid: u32) -> u64 {
    let mut stats: Vec<(u32, u32, u64)> = Vec::new();
    if let Ok(dir) = fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(p) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(stat) = fs::read_to_string(format!("/proc/{p}/stat")) else {
                continue;
            };
            // Fields after the command name, which may hold spaces: state
            // ppid … utime (14th field overall) stime (15th).
            let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
                continue;
            };
            let f: Vec<&str> = rest.split_whitespace().collect();
            let ppid = f.get(1).and_then(|v| v.parse().ok()).unwrap_or(0);
            let utime: u64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0);
            let stime: u64 = f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
            stats.push((p, ppid, utime + stime));
        }
    }
    let mut tree = vec![pid];
    let mut ticks = 0;
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        for &(p, ppid, t) in &stats {
            if p == parent {
                ticks += t;
            }
            if ppid == parent && !tree.contains(&p) {
                tree.push(p);
            }
        }
        i += 1;
    }
    // Linux reports in clock ticks of 1/100 s on every common build.
    ticks * 10
}
