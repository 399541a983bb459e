//! A held lock: the [`Guard`], its local lease deadline, the loss signal,
//! and the watchdog task that renews it.
//!
//! The guard works the same for one server and for Redlock: it talks to a
//! [`Backend`] that renews, reenters and releases (on one server, or on a
//! majority of several).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, timeout_at, Instant};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::conn::{Closed, Link};
use crate::error::{Error, LossReason};
use crate::options::{deadline, renew_period, retry_period, LockOptions};

pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, Error>> + Send + 'a>>;

/// What a guard needs from where the lock lives.
pub(crate) trait Backend: Send + Sync + 'static {
    /// `LOCK.RENEW`: Ok once the lease is `ttl_ms` from the send time.
    fn renew<'a>(&'a self, key: &'a str, owner: &'a str, ttl_ms: u64) -> BoxFuture<'a, ()>;
    /// `LOCK.REENTER` with a new lease: the new count.
    fn reenter<'a>(&'a self, key: &'a str, owner: &'a str, ttl_ms: u64) -> BoxFuture<'a, u64>;
    /// `LOCK.RELEASE [ALL]`: the remaining count.
    fn release<'a>(&'a self, key: &'a str, owner: &'a str, all: bool) -> BoxFuture<'a, u64>;
}

/// The local view of a lease: until when it is surely valid, and whether it
/// was lost. Shared by the guard and its watchdog.
pub(crate) struct Lease {
    deadline: Mutex<Instant>,
    /// The ttl every renew asks for, as a duration and in whole ms: set at
    /// the acquire, changed by a renew with a new ttl.
    ttl: Mutex<(Duration, u64)>,
    /// Wakes the watchdog when a manual renew moved the deadline.
    moved: Notify,
    lost: CancellationToken,
    reason: Mutex<Option<LossReason>>,
}

impl Lease {
    pub(crate) fn new(deadline: Instant, ttl: Duration, ttl_ms: u64) -> Lease {
        Lease {
            deadline: Mutex::new(deadline),
            ttl: Mutex::new((ttl, ttl_ms)),
            moved: Notify::new(),
            lost: CancellationToken::new(),
            reason: Mutex::new(None),
        }
    }

    fn deadline(&self) -> Instant {
        *self.deadline.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn ttl(&self) -> (Duration, u64) {
        *self.ttl.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A renew with a new ttl, sent at `sent`, succeeded: from now on the
    /// lease is `ttl`, and it runs to `sent + ttl − drift`, even if that is
    /// sooner than before (a shorter lease asked for).
    fn reset(&self, sent: Instant, ttl: Duration, ttl_ms: u64) {
        *self.ttl.lock().unwrap_or_else(|e| e.into_inner()) = (ttl, ttl_ms);
        let mut current = self.deadline.lock().unwrap_or_else(|e| e.into_inner());
        if !self.lost.is_cancelled() {
            *current = deadline(sent, ttl);
        }
        drop(current);
        self.moved.notify_waiters();
    }

    /// A renew sent at `sent` succeeded: the lease runs to `sent + ttl − drift`.
    fn extend(&self, sent: Instant, ttl: Duration) {
        let new = deadline(sent, ttl);
        let mut current = self.deadline.lock().unwrap_or_else(|e| e.into_inner());
        // Renews can overlap (watchdog and a manual one): keep the later.
        if new > *current && !self.lost.is_cancelled() {
            *current = new;
        }
        drop(current);
        self.moved.notify_waiters();
    }

    fn lose(&self, why: LossReason) {
        let mut reason = self.reason.lock().unwrap_or_else(|e| e.into_inner());
        if reason.is_none() {
            *reason = Some(why);
        }
        drop(reason);
        self.lost.cancel();
    }

    fn reason(&self) -> Option<LossReason> {
        *self.reason.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The loss signal of a held lock: poll it, await it, or hand its token to
/// code that should stop when the lock is gone.
#[derive(Clone)]
pub struct LossSignal {
    lease: Arc<Lease>,
}

impl LossSignal {
    /// Whether the lock is lost (the watchdog could not keep it).
    pub fn is_lost(&self) -> bool {
        self.lease.lost.is_cancelled()
    }

    /// Why the lock was lost, once it is.
    pub fn reason(&self) -> Option<LossReason> {
        self.lease.reason()
    }

    /// Completes when the lock is lost; never, while it is held.
    pub async fn lost(&self) -> LossReason {
        self.lease.lost.cancelled().await;
        self.lease.reason().unwrap_or(LossReason::Expired)
    }

    /// A token cancelled when the lock is lost (for `tokio::select!`).
    pub fn token(&self) -> CancellationToken {
        self.lease.lost.clone()
    }
}

/// Everything a guard shares with its client: where the lock lives, which
/// background tasks it runs, on which runtime.
#[derive(Clone)]
pub(crate) struct Context {
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) tasks: TaskTracker,
    pub(crate) runtime: tokio::runtime::Handle,
}

/// What a lock call may hold before it hands out a [`Guard`]: a grant whose
/// reply may not have arrived yet, or that is still being confirmed. Dropped
/// while armed (the call's future was dropped, or the call gave up), it sends
/// `LOCK.RELEASE … ALL` in the background and never blocks the drop.
pub(crate) struct Pending<'a> {
    ctx: Option<Context>,
    key: &'a str,
    owner: &'a str,
}

impl<'a> Pending<'a> {
    pub(crate) fn new(ctx: Context, key: &'a str, owner: &'a str) -> Pending<'a> {
        Pending {
            ctx: Some(ctx),
            key,
            owner,
        }
    }

    /// Nothing to undo: no grant, a release already done, or a guard now
    /// holds the lock.
    pub(crate) fn disarm(&mut self) {
        self.ctx = None;
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        let Some(ctx) = self.ctx.take() else {
            return;
        };
        let backend = ctx.backend;
        let key = self.key.to_string();
        let owner = self.owner.to_string();
        let job = async move {
            // Best effort: if it fails, the lease ends by itself.
            let _ = backend.release(&key, &owner, true).await;
        };
        ctx.tasks.spawn_on(job, &ctx.runtime);
    }
}

/// A lock held by this client. Dropping it releases the lock in the
/// background (it never blocks); [`Guard::release`] releases it now and
/// says what is left.
///
/// While the watchdog is on (the default) the lease is renewed every third
/// of the ttl; if renewing fails until the local deadline, or the server
/// says this owner lost the lock, the [`LossSignal`] fires.
pub struct Guard {
    ctx: Context,
    key: String,
    owner: String,
    fence: u64,
    /// Holds this guard has (1 + reentries − releases); 0: released.
    count: u64,
    lease: Arc<Lease>,
    watchdog: Option<Watchdog>,
    auto_renew: bool,
    /// An ephemeral hold's connection, kept open by this task, which fires
    /// the loss signal if it closes; stopped (and the connection closed)
    /// once the hold is released.
    binding: Option<Watchdog>,
}

/// A running watchdog: its stop switch and its task.
struct Watchdog {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Guard {
    /// `with_lock`'s body, for every kind of client: runs `f` with the
    /// loss token, then releases; a loss wins over `f`'s result.
    pub(crate) async fn run<T, F, Fut>(self, f: F) -> Result<T, Error>
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = T>,
    {
        let loss = self.loss();
        let out = f(loss.token()).await;
        let released = self.release_all().await;
        match loss.reason() {
            Some(reason) => Err(Error::Lost(reason)),
            None => released.map(|()| out),
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start(
        ctx: Context,
        key: String,
        owner: String,
        fence: u64,
        ttl: Duration,
        ttl_ms: u64,
        deadline: Instant,
        auto_renew: bool,
    ) -> Guard {
        let mut guard = Guard {
            ctx,
            key,
            owner,
            fence,
            count: 1,
            lease: Arc::new(Lease::new(deadline, ttl, ttl_ms)),
            watchdog: None,
            auto_renew,
            binding: None,
        };
        guard.start_watchdog();
        guard
    }

    /// Keeps an ephemeral hold's connection open for the hold's life; the
    /// server ends the hold when it closes, and so the loss fires then.
    pub(crate) fn bind(&mut self, link: Link, mut closed: Closed) {
        let stop = CancellationToken::new();
        let lease = self.lease.clone();
        let quit = stop.clone();
        let job = async move {
            tokio::select! {
                biased;
                () = quit.cancelled() => {}
                () = closed.wait() => lease.lose(LossReason::Disconnected),
            }
            drop(link);
        };
        let task = self.ctx.tasks.spawn_on(job, &self.ctx.runtime);
        self.binding = Some(Watchdog { stop, task });
    }

    /// Closes an ephemeral hold's connection, once the hold is released.
    fn unbind(&mut self) {
        if let Some(binding) = self.binding.take() {
            binding.stop.cancel();
        }
    }

    /// The lock's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The fencing token: send it with every write to the guarded resource,
    /// which should refuse writes carrying a lower fence than it has seen.
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// The owner token this guard holds the lock as (unique per lock call).
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Until when the lease is surely valid here, on the monotonic clock:
    /// last successful send + ttl − drift.
    pub fn deadline(&self) -> std::time::Instant {
        self.lease.deadline().into_std()
    }

    /// How many holds this guard has (reentries count).
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The loss signal (poll, await, or take its token).
    pub fn loss(&self) -> LossSignal {
        LossSignal {
            lease: self.lease.clone(),
        }
    }

    /// Whether the lock is lost.
    pub fn is_lost(&self) -> bool {
        self.lease.lost.is_cancelled()
    }

    /// Renews the lease now, for the ttl it was taken with (the watchdog
    /// does it on its own).
    pub async fn renew(&mut self) -> Result<(), Error> {
        self.held()?;
        let (ttl, ttl_ms) = self.lease.ttl();
        let sent = Instant::now();
        match self.ctx.backend.renew(&self.key, &self.owner, ttl_ms).await {
            Ok(()) => {
                self.lease.extend(sent, ttl);
                Ok(())
            }
            Err(Error::NotOwner) => {
                self.lease.lose(LossReason::NotOwner);
                Err(Error::NotOwner)
            }
            Err(err) => Err(err),
        }
    }

    /// Renews the lease with a new ttl: the lease becomes `ttl` from now
    /// (longer or shorter than before), and the watchdog renews for `ttl`
    /// from then on, every third of it.
    pub async fn renew_for(&mut self, ttl: Duration) -> Result<(), Error> {
        self.held()?;
        let ttl_ms = LockOptions::new(ttl).ttl_ms()?;
        let sent = Instant::now();
        match self.ctx.backend.renew(&self.key, &self.owner, ttl_ms).await {
            Ok(()) => {
                self.lease.reset(sent, ttl, ttl_ms);
                Ok(())
            }
            Err(Error::NotOwner) => {
                self.lease.lose(LossReason::NotOwner);
                Err(Error::NotOwner)
            }
            Err(err) => Err(err),
        }
    }

    /// Stops the watchdog without releasing: the hold stays until its lease
    /// ends (or a [`Guard::renew`] extends it), and the loss signal still
    /// fires at the local deadline. Returns once the watchdog has stopped,
    /// so no renew is sent after it.
    pub async fn stop_renewing(&mut self) {
        if !self.auto_renew {
            return;
        }
        self.auto_renew = false;
        self.stop_watchdog().await;
        if self.count > 0 {
            // Still watched: the deadline still passes without renewals.
            self.start_watchdog();
        }
    }

    /// Takes the lock once more (reentry): count + 1, lease reset. Each
    /// reentry needs its own [`Guard::release`].
    pub async fn reenter(&mut self) -> Result<u64, Error> {
        self.held()?;
        let (ttl, ttl_ms) = self.lease.ttl();
        let sent = Instant::now();
        let count = self
            .ctx
            .backend
            .reenter(&self.key, &self.owner, ttl_ms)
            .await?;
        self.lease.extend(sent, ttl);
        self.count = count;
        Ok(count)
    }

    /// Releases one hold; returns how many are left (0: the lock is free).
    /// Before the last hold goes, the watchdog is stopped and awaited, so
    /// no renew is sent after the release.
    pub async fn release(&mut self) -> Result<u64, Error> {
        self.held()?;
        let last = self.count <= 1;
        if last {
            self.stop_watchdog().await;
        }
        let reply = self
            .ctx
            .backend
            .release(&self.key, &self.owner, false)
            .await;
        if !matches!(reply, Ok(left) if left > 0) {
            self.unbind();
        }
        match reply {
            Ok(left) => {
                self.count = left;
                if left > 0 && self.watchdog.is_none() {
                    // More holds than we counted (a retried command): keep
                    // renewing them.
                    self.start_watchdog();
                }
                Ok(left)
            }
            Err(err) => {
                // NOTOWNER: nothing left to hold. Anything else: the lease
                // ends by itself; we stop renewing it either way.
                self.stop_watchdog().await;
                self.count = 0;
                Err(err)
            }
        }
    }

    /// Releases every hold now, whatever the count.
    pub async fn release_all(mut self) -> Result<(), Error> {
        self.held()?;
        self.stop_watchdog().await;
        self.count = 0;
        let released = self
            .ctx
            .backend
            .release(&self.key, &self.owner, true)
            .await
            .map(|_| ());
        self.unbind();
        released
    }

    fn held(&self) -> Result<(), Error> {
        if self.count == 0 {
            return Err(Error::NotOwner);
        }
        Ok(())
    }

    fn start_watchdog(&mut self) {
        let stop = CancellationToken::new();
        let job = watch(
            self.ctx.backend.clone(),
            self.key.clone(),
            self.owner.clone(),
            self.lease.clone(),
            stop.clone(),
            self.auto_renew,
        );
        let task = self.ctx.tasks.spawn_on(job, &self.ctx.runtime);
        self.watchdog = Some(Watchdog { stop, task });
    }

    async fn stop_watchdog(&mut self) {
        if let Some(dog) = self.watchdog.take() {
            dog.stop.cancel();
            let _ = dog.task.await;
        }
    }
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("key", &self.key)
            .field("owner", &self.owner)
            .field("fence", &self.fence)
            .field("count", &self.count)
            .field("lost", &self.lease.reason())
            .finish()
    }
}

impl Drop for Guard {
    /// Releases in the background: stops the watchdog, waits for it to end,
    /// then sends `LOCK.RELEASE … ALL`. Never blocks the dropping thread.
    fn drop(&mut self) {
        let dog = self.watchdog.take();
        if let Some(dog) = &dog {
            dog.stop.cancel();
        }
        let binding = self.binding.take();
        if self.count == 0 {
            return;
        }
        let backend = self.ctx.backend.clone();
        let key = std::mem::take(&mut self.key);
        let owner = std::mem::take(&mut self.owner);
        let job = async move {
            if let Some(dog) = dog {
                let _ = dog.task.await;
            }
            // Best effort: if it fails, the lease ends by itself (and an
            // ephemeral hold with its connection, closed just after).
            let _ = backend.release(&key, &owner, true).await;
            if let Some(binding) = binding {
                binding.stop.cancel();
            }
        };
        self.ctx.tasks.spawn_on(job, &self.ctx.runtime);
    }
}

/// The watchdog: renews every third of the lease while `auto_renew`, and
/// fires the loss signal on `NOTOWNER` or when the local deadline passes
/// without a renew confirming the lock. Ends when `stop` is cancelled (and
/// then sends nothing more) or when the lock is lost.
#[allow(clippy::too_many_arguments)]
async fn watch(
    backend: Arc<dyn Backend>,
    key: String,
    owner: String,
    lease: Arc<Lease>,
    stop: CancellationToken,
    auto_renew: bool,
) {
    let mut next_renew = Instant::now() + renew_period(lease.ttl().0);
    loop {
        // A renew with a new ttl changes it between two rounds.
        let (ttl, ttl_ms) = lease.ttl();
        let deadline = lease.deadline();
        let wake = if auto_renew {
            next_renew.min(deadline)
        } else {
            deadline
        };
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            () = lease.moved.notified() => {
                // A shorter ttl may have come: renew within a third of it.
                next_renew = next_renew.min(Instant::now() + renew_period(lease.ttl().0));
                continue;
            }
            () = sleep_until(wake) => {}
        }
        if Instant::now() >= lease.deadline() {
            lease.lose(LossReason::Expired);
            return;
        }
        if !auto_renew || Instant::now() < next_renew {
            continue;
        }
        let sent = Instant::now();
        let attempt = tokio::select! {
            biased;
            () = stop.cancelled() => return,
            reply = timeout_at(lease.deadline(), backend.renew(&key, &owner, ttl_ms)) => reply,
        };
        match attempt {
            Ok(Ok(())) => {
                lease.extend(sent, ttl);
                next_renew = sent + renew_period(ttl);
            }
            Ok(Err(Error::NotOwner)) => {
                lease.lose(LossReason::NotOwner);
                return;
            }
            // Transport trouble or no majority: try again soon; the
            // deadline check above ends the retries.
            Ok(Err(_)) => next_renew = Instant::now() + retry_period(ttl),
            Err(_deadline_passed) => {
                lease.lose(LossReason::Expired);
                return;
            }
        }
    }
}
