//! Integration tests: the module loaded into a real `redis-server`, driven over
//! TCP as a client would, against the contract in docs/ (commands, semantics, operations).
//!
//! Every test starts its own server(s) on a free loopback port with a temp dir
//! of its own (the workspace's test kit, `testkit/`, which `harness`
//! re-exports with what only this suite needs), so tests run in parallel. The module must be
//! built first: `cargo build --release` (`make test` does it), or point
//! `LOCK_MODULE` at another build. A failing test prints its servers' logs.
//!
//! The areas live beside this file, one `mod` each.

// The harness serves every area, including ones that use only part of it.
#[allow(dead_code)]
mod harness;

/// Leases, `WAIT` timeouts, quarantines and fences across steps of the
/// server's wall clock.
mod clock;
/// Redis Cluster: routing by key, hash tags, slot migration with locks held
/// and clients waiting, and failover of a master to its replica.
mod cluster;
/// Every reply of the commands, fencing, and the decided corner cases.
mod commands;
/// The module configs `lock.max-ttl` and `lock.quarantine`: set
/// at run time, in redis.conf, on the command line and by `MODULE LOADEX`;
/// bad values refused; the cap on every `ttl-ms`.
mod config;
/// What the server knows about each command: key specs (the ACL key
/// permission each needs), docs, ACL categories and the module's version.
mod conventions;
/// The release tarball (`make dist`): one folder, checksums that verify,
/// the same bytes from the same inputs, and its module loaded from
/// redis.conf, the command line and `MODULE LOAD`.
mod dist;
/// Ephemeral holds: a hold bound to its connection ends when it closes
/// (SIGKILL, `CLIENT KILL`, `QUIT`, the client timeout); bindings kept by
/// `DEBUG RELOAD`, `RENAME`, `MOVE`, absent on a replica.
mod ephemeral;
/// Bad input: each error, the order of checks, and that an error changes
/// nothing; the command table, OOM, and `LOCK.APPLY` closed to clients.
mod errors;
/// Sentinel-style promotion of a plain replica (`REPLICAOF NO ONE`): locks,
/// fences and waiters on the new master.
mod failover;
/// `LOCK.FENCE`: raising a hold's fence and the server's counter,
/// its errors in order, replication and persistence.
mod fence;
/// Thousands of random argument vectors: the server answers each and survives.
mod fuzz;
/// A release with waiters hands over inside the command: no later
/// command sees the lock free; release and grant reach the AOF together.
mod handoff;
/// The `INFO lock` section: gauges and counters.
mod info;
/// No lock lives forever: `PERSIST`, `EXPIRE` past the lease and
/// `RESTORE` without a TTL are undone; a lock waiting to end costs no CPU.
mod lease;
/// Bytes per held lock, with the owners the clients send, against the
/// `SET NX PX` recipe with the same owners in the same run.
mod memory;
/// `MIGRATE` inside `MULTI` or a Lua script with clients waiting:
/// the waiters follow the lock to the target, none is granted on the source.
mod migrate;
/// Several locks at once (`LOCK.MACQUIRE`, `MRELEASE`, `MRENEW`): all or
/// none, first come first served across keys, no deadlock in crossing
/// orders, waiters that leave, replication, restarts, bad input, and a
/// hand-off's cost behind few or many waiters.
mod multi;
/// Watching a lock: `LOCK.QUEUE`, and how long waits and holds last
/// (`INFO lock`'s `wait_usec` and `hold_usec`).
mod observe;
/// The oversell test: 16 worker processes (`examples/oversell_worker.rs`)
/// sell a stock of 500 under the lock; not one item more.
mod oversell;
/// A master cut off from its replicas (`min-replicas-to-write`): no
/// hand-off where Redis refuses writes, the lag in a promotion's
/// quarantine, `partition_safe` in `INFO lock`.
mod partition;
/// Writes paused: a lease that ends during `CLIENT PAUSE`, a
/// `FAILOVER` or a `SHUTDOWN` waiting for a replica hands off only after it.
mod pause;
/// RDB, AOF (with and without the RDB preamble), `DEBUG RELOAD`, `DUMP`/`RESTORE`,
/// `COPY`, and restarts with persistence off.
mod persistence;
/// The quarantine: no fresh hold for `lock.max-ttl` ms after a
/// start or a promotion; a lock lost in a failover or a crash is not given
/// to a second holder before its lease ends.
mod quarantine;
/// Blocked-client races: a hand-off against `CLIENT UNBLOCK` or
/// `CLIENT KILL` in the same pipeline, with and without I/O threads.
mod races;
/// Master and replica hold the same state; a read-only replica refuses writes;
/// a promoted replica keeps fences rising.
mod replication;
/// Sentinel failovers in network namespaces (needs root): partitions and
/// kills with clients on both sides, judged by overlaps, fences and a
/// fenced store.
mod sentinel;
/// What differs between Redis 7.0, Valkey 8.1, Redis 8.2 and Valkey 9.1:
/// a lock replaced by another type and the notifications each sends,
/// conditional deletes, hash-field expiry, when a hand-off after `DEL` runs,
/// and `CLIENT UNBLOCK` right after a grant.
mod servers;
/// Shared holds: read-write locks and semaphores, one queue for both modes.
mod shared;
/// What a shared lock's events cost: a hand-off and a refused try behind
/// few or many waiters, one reader's change beside few or many readers,
/// measured at two sizes in one run; the bytes replicas receive for it.
mod shared_cost;
/// Shared holds under stress: reader, writer and permit worker processes
/// (`examples/shared_worker.rs`) stopped past their lease and killed while
/// holding, judged by a fenced store and its log kept in the server; under
/// a write pause, a failover and an AOF restart.
mod shared_stress;
/// Upgrade: RDBs written by encoding versions 1 and 3 (`tests/fixtures/`)
/// load with their locks intact, and none is held forever.
mod upgrade;
/// Blocked waiters (`LOCK.ACQUIRE … WAIT`): FIFO hand-off on every way a lock
/// frees, no barging, timeouts, unblock and disconnect, replication, reloads.
mod waiting;
