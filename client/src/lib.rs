//! Rust client for the `redislock` module (distributed locks inside
//! `redis-server`): guards with a watchdog, waiting locks served first come
//! first served by the server, and Redlock over several servers with fences
//! that rise from holder to holder.
//!
//! ```no_run
//! # async fn demo() -> Result<(), redislock_client::Error> {
//! use std::time::Duration;
//! use redislock_client::{Client, LockOptions};
//!
//! let client = Client::open("redis://127.0.0.1:6379/")?;
//! let opts = LockOptions::new(Duration::from_secs(10)).wait(Duration::from_secs(5));
//! let mut guard = client.lock("stock:sku-1", &opts).await?;
//! // Send guard.fence() along with every write to the resource.
//! assert!(!guard.is_lost());
//! let left = guard.release().await?; // 0: the lock is free
//! # let _ = left; Ok(()) }
//! ```
//!
//! | file | what lives there |
//! |---|---|
//! | `client.rs` | [`Client`]: one server or a Redis Cluster (async); read-write locks and [`Semaphore`] |
//! | `redlock.rs` | [`Redlock`]: N independent servers, majority, fence round |
//! | `guard.rs` | [`Guard`], its lease deadline, [`LossSignal`], the watchdog |
//! | `multi.rs` | [`MultiGuard`]: several keys held at once, renewed and released together |
//! | `blocking.rs` | [`blocking`]: the same API without async |
//! | `options.rs` | [`LockOptions`], drift and renew timing |
//! | `server.rs` | one server or cluster as the backend of its holds (renew, reenter, release on the shared connection) |
//! | `conn.rs` | connections (shared, reopened; one of its own per wait) |
//! | `error.rs` | [`Error`], [`LossReason`] |
//!
//! The async API needs a tokio runtime. Each lock call gets its own owner
//! token, so a guard is the only holder of its hold; reentry is explicit
//! ([`Guard::reenter`]).

pub mod blocking;
mod client;
mod conn;
mod error;
mod guard;
mod multi;
mod options;
mod redlock;
mod server;

pub use client::{Client, RwLock, Semaphore};
pub use error::{Error, LossReason};
pub use guard::{Guard, LossSignal};
pub use multi::MultiGuard;
pub use options::{drift, LockOptions};
pub use redlock::{Redlock, RedlockOptions};
pub use tokio_util::sync::CancellationToken;

/// This crate's README examples compile (`cargo test --doc`).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ClientReadmeExamples;
