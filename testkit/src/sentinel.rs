//! [`Sentinel`]: a `redis-sentinel` on loopback watching one master (named
//! `m`, quorum 1), killed on drop; its log is printed if the owner panicked.

use std::fs;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::Duration;

use crate::port::free_port;
use crate::server::Server;

/// How long a silent master may stay silent before the Sentinel fails it over.
const DOWN_AFTER_MS: u64 = 2_000;

pub struct Sentinel {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Sentinel {
    /// Starts watching `master` under the name `m`.
    pub fn start(master: &Server) -> Sentinel {
        let port = free_port();
        let dir = std::env::temp_dir()
            .join("redislock-tests")
            .join(format!("sentinel-{}-{port}", std::process::id()));
        fs::create_dir_all(&dir).expect("sentinel dir");
        let conf = dir.join("sentinel.conf");
        fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\nlogfile sentinel.log\n\
                 sentinel monitor m 127.0.0.1 {} 1\n\
                 sentinel down-after-milliseconds m {DOWN_AFTER_MS}\n\
                 sentinel failover-timeout m 10000\n",
                dir.display(),
                master.port()
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

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// One command, or `None` if the Sentinel could not answer just now.
    pub fn query<T: redis::FromRedisValue>(&self, args: &[&str]) -> Option<T> {
        let client = redis::Client::open(self.url()).ok()?;
        let mut conn = client
            .get_connection_with_timeout(Duration::from_secs(1))
            .ok()?;
        let mut cmd = redis::Cmd::new();
        cmd.arg(args);
        cmd.query(&mut conn).ok()
    }

    /// The port of the master it names now.
    pub fn master_port(&self) -> Option<u16> {
        let addr: Option<(String, u16)> =
            self.query(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "m"])?;
        addr.map(|(_, port)| port)
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if thread::panicking() {
            let log = fs::read_to_string(self.dir.join("sentinel.log")).unwrap_or_default();
            eprintln!("--- sentinel log ---\n{log}");
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}
