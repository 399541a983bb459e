//! The test kit shared by every suite and bench: real `redis-server` (or
//! `valkey-server`) processes with the module loaded, and the helpers that
//! talk to them. The integration suite (`tests/integration/`), the Rust
//! client's tests (`client/`), `make bench-client` (`client/bench/`) and
//! both benches (`benches/lockbench/`, `benches/instr/`) start their servers
//! here.
//!
//! | module | what lives there |
//! |---|---|
//! | [`env`] | which module, server and cli: `LOCK_MODULE`, `LOCK_SERVER`, `LOCK_CLI` |
//! | [`port`] | free loopback ports, and cluster node ports whose bus port is free too |
//! | [`server`] | [`Server`] and its [`ServerBuilder`]: start, restart, stop, kill on drop |
//! | [`call`] | [`Call`]: one-line commands on a connection, error replies as text; [`LockInfo`]; [`wait_on`] |
//! | [`clockshift`] | [`ClockShift`]: steps a server's wall clock (a preload shim), its monotonic clock untouched |
//! | [`cluster`] | [`Cluster`]: three masters, slots split evenly |
//! | [`sentinel`] | [`Sentinel`]: a `redis-sentinel` watching one master |
//! | [`bench`] | what both benches share: their arguments, preloaded C shims, the checkout's revision |
//!
//! [`wait_until`] polls observable state: no suite sleeps for a fixed time.
//!
//! Environment (the same for every user): `LOCK_MODULE` overrides the
//! module path (default: the workspace's release build); `LOCK_SERVER` and
//! `LOCK_CLI` the server and cli binaries (default: `redis-server` and
//! `redis-cli` from `PATH`; `make test` runs each suite again with Valkey 8.1,
//! Redis 8.2 and Valkey 9.1). `REDIS_SERVER` and `REDIS_CLI`, the older
//! names, still work when the new ones are not set.

pub mod bench;
pub mod call;
pub mod clockshift;
pub mod cluster;
pub mod env;
pub mod port;
pub mod sentinel;
pub mod server;

use std::thread;
use std::time::{Duration, Instant};

pub use call::{
    error_text, handed_fence, show_args, text, wait_args, wait_on, wait_on_timed, Call, Hold,
    HolderInfo, LockInfo, Reply,
};
pub use clockshift::ClockShift;
pub use cluster::Cluster;
pub use env::{cli_bin, module_path, server_bin, try_module_path};
pub use port::{free_cluster_port, free_port};
pub use sentinel::Sentinel;
pub use server::{start_replica, Server, ServerBuilder, Stop};

/// How long a started server gets to answer `PING` with `PONG`.
pub const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long any one reply may take: a hung server fails the test, never hangs it.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

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
