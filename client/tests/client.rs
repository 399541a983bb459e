//! The client against real servers (`redis-server` or `valkey-server` with
//! the module): one binary, one `mod` per area, each test with servers of its
//! own, started by the workspace's test kit (`redislock-testkit`). Build the
//! module first (`cargo build --release` at the root).

/// A Redis Cluster of three masters: guards, watchdog, waits and drops
/// routed by key.
#[path = "client/cluster.rs"]
mod cluster;
/// Ephemeral holds: a connection of their own, kept for the hold's life.
#[path = "client/ephemeral.rs"]
mod ephemeral;
/// The examples in `examples/`, run as processes.
#[path = "client/examples.rs"]
mod examples;
/// Redlock over 3 and 5 servers: quorum, renew and loss, a cancelled
/// acquisition, fences that rise (and fall without the fence round), and a
/// fenced store hammered while servers are killed, restarted and paused.
#[path = "client/redlock.rs"]
mod redlock;
/// Sentinel discovery: the master found through a `redis-sentinel`, and the
/// new one after a failover.
#[path = "client/sentinel.rs"]
mod sentinel;
/// Several at once: locks on several keys, and several permits as one hold.
#[path = "client/several.rs"]
mod several;
/// Shared holds: read-write locks and semaphores, async and blocking.
#[path = "client/shared.rs"]
mod shared;
/// One server: guard, watchdog, waits (longer than the ttl too) and their
/// cancellation, drops, `with_lock`, the blocking API.
#[path = "client/single.rs"]
mod single;
