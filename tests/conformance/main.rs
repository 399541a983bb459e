//! The client conformance suite: every client of the project, driven
//! through the same scenarios against real servers, checked from outside.
//!
//! Each scenario starts its own server (the workspace's test kit,
//! `testkit/`) and the driver of the client under test (`LOCK_DRIVER`, a
//! shell command line; default: the Rust client's driver), talks to the
//! driver over the line protocol of docs/conformance.md, moves the server
//! underneath (`CLIENT PAUSE`, `CLIENT KILL`, `DEBUG SLEEP`, an ACL change,
//! `DEL` or `SET` over the lock) and judges the client by what the server
//! shows (`LOCK.INFO`, `PEXPIRETIME`, `INFO clients`, `INFO commandstats`)
//! against what the driver reports. The rules are those of docs/clients.md;
//! one `mod` per area of it.
//!
//! ```text
//! LOCK_DRIVER="…" cargo test --release --test conformance
//! ```

// The harness serves every area, including ones that use only part of it.
#[allow(dead_code)]
mod driver;
#[allow(dead_code)]
mod harness;

/// Acquire, try, wait, release and the error kinds: the plain path.
mod basics;
/// Cancellation at every point: before the send, while parked, while the
/// grant's reply is in flight, during the confirming renew, and a try whose
/// reply comes too late: nothing held, nothing parked, nothing running.
mod cancel;
/// A grant whose confirming renew finds the lock gone is not a hold: the
/// call waits again within what is left of its wait.
mod confirm;
/// Durations of 2^31 ms and more: no overflow, no timer spinning.
mod durations;
/// Ephemeral holds on every acquire kind, ended by their connection; or
/// refused where they cannot be kept (Redlock).
mod ephemeral;
/// Renew with a new ttl, stop renewing without releasing, and a hold
/// continued by its owner token in another process.
mod handover;
/// The loss signal: never later than the server's lease end, at once on
/// `NOTOWNER` and `WRONGTYPE`, and never cleared by a later acquire.
mod loss;
/// A release that did not complete: the hold is no longer reported held,
/// and the release lands later.
mod release;
/// Read-write handles: one owner for both sides; the writer may read, a
/// reader asking to write is refused at once.
mod rw;
/// Several at once: a lock on several keys, all or none, released
/// together, lost when any key is; several permits of a semaphore, first
/// come first served.
mod several;
