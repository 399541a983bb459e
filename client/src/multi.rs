//! A hold on several keys at once ([`crate::Client::lock_keys`]): one
//! [`MultiGuard`] for all of them, whose watchdog renews them together.
//!
//! The guard machinery (lease, loss signal, watchdog, release retries,
//! cancellation) is [`Guard`]'s, unchanged: what differs is where its
//! renewals and releases go. [`Keys`] sends them to every key at once
//! (`LOCK.MRENEW`, `LOCK.MRELEASE`), which the server does all or none:
//! a renew refused because any one key is no longer held (deleted,
//! overwritten, expired) is a loss of the whole hold.

use std::sync::Arc;
use std::time::Duration;

use crate::conn;
use crate::error::Error;
use crate::guard::{Backend, BoxFuture, Guard, LossSignal};
use crate::server::{on_hold, Server};

/// The keys of one hold, renewed and released together.
pub(crate) struct Keys {
    server: Arc<Server>,
    keys: Vec<String>,
}

impl Keys {
    pub(crate) fn new(server: Arc<Server>, keys: Vec<String>) -> Keys {
        Keys { server, keys }
    }
}

/// The guard names the hold by its first key; the backend knows them all
/// and ignores that name.
impl Backend for Keys {
    fn renew<'a>(&'a self, _key: &'a str, owner: &'a str, ttl_ms: u64) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let reply = self
                .server
                .query::<i64>(&conn::mrenew(&self.keys, owner, ttl_ms))
                .await;
            on_hold(reply).map(|_| ())
        })
    }

    fn reenter<'a>(&'a self, _key: &'a str, _owner: &'a str, _ttl_ms: u64) -> BoxFuture<'a, u64> {
        Box::pin(async move {
            Err(Error::InvalidOptions(
                "a hold on several keys is not reentered: take another",
            ))
        })
    }

    fn release<'a>(&'a self, _key: &'a str, owner: &'a str, all: bool) -> BoxFuture<'a, u64> {
        Box::pin(async move {
            let reply = self
                .server
                .query::<Vec<u64>>(&conn::mrelease(&self.keys, owner, all))
                .await;
            // Every key was taken in one step, so every count is the same.
            on_hold(reply).map(|left| left.into_iter().max().unwrap_or(0))
        })
    }
}

/// A hold on several keys, taken all at once ([`crate::Client::lock_keys`]):
/// one owner, one lease, one watchdog for all of them. Lost when any key is
/// lost; released all together. Dropping it releases every key in the
/// background, as dropping a [`Guard`] does.
pub struct MultiGuard {
    guard: Guard,
    keys: Vec<String>,
    fences: Vec<u64>,
}

impl MultiGuard {
    pub(crate) fn new(guard: Guard, keys: Vec<String>, fences: Vec<u64>) -> MultiGuard {
        MultiGuard {
            guard,
            keys,
            fences,
        }
    }

    /// The keys, in the order they were asked for.
    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    /// One fence per key, in the order of [`MultiGuard::keys`]: send each
    /// key's fence with the writes to the resource that key guards.
    pub fn fences(&self) -> &[u64] {
        &self.fences
    }

    /// The fence of `key`, if it is one of this hold's keys.
    pub fn fence_of(&self, key: &str) -> Option<u64> {
        let at = self.keys.iter().position(|k| k == key)?;
        self.fences.get(at).copied()
    }

    /// The owner token the keys are held as.
    pub fn owner(&self) -> &str {
        self.guard.owner()
    }

    /// Until when the lease of every key is surely valid here.
    pub fn deadline(&self) -> std::time::Instant {
        self.guard.deadline()
    }

    /// The loss signal: fires when any key is lost.
    pub fn loss(&self) -> LossSignal {
        self.guard.loss()
    }

    pub fn is_lost(&self) -> bool {
        self.guard.is_lost()
    }

    /// Whether the keys are still held (not released, not lost).
    pub fn is_held(&self) -> bool {
        self.guard.count() > 0 && !self.guard.is_lost()
    }

    /// Renews every key now, all or none (`LOCK.MRENEW`).
    pub async fn renew(&mut self) -> Result<(), Error> {
        self.guard.renew().await
    }

    /// Renews every key with a new ttl; the watchdog renews for it from
    /// then on.
    pub async fn renew_for(&mut self, ttl: Duration) -> Result<(), Error> {
        self.guard.renew_for(ttl).await
    }

    /// Stops the watchdog without releasing (see [`Guard::stop_renewing`]).
    pub async fn stop_renewing(&mut self) {
        self.guard.stop_renewing().await
    }

    /// Releases every key now (`LOCK.MRELEASE … ALL`), all or none. A
    /// release that does not complete leaves the hold reported lost
    /// (release not confirmed) and is retried in the background.
    pub async fn release(self) -> Result<(), Error> {
        self.guard.release_all().await
    }
}

impl std::fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiGuard")
            .field("keys", &self.keys)
            .field("fences", &self.fences)
            .field("guard", &self.guard)
            .finish()
    }
}
