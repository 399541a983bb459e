//! A held lock: the [`Guard`], its local lease deadline, the loss signal,
//! and the watchdog task that renews it.
//!
//! The guard works the same for one server and for Redlock: it talks to a
//! [`Backend`] that renews, reenters and releases (on one server, or on a
//! majority of several).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
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

/// Whose an owner token is: one guard's alone, or shared by the guards of
/// one read-write handle ([`crate::RwLock`]), whose two sides are one owner
/// on the server (so the writer's read is a reentry, and a reader's write
/// is refused as an upgrade).
#[derive(Clone)]
pub(crate) enum Owned {
    /// `LOCK.RELEASE … ALL` ends exactly this guard's holds, and may be
    /// sent again until it lands.
    Alone,
    /// The handle's guards that still have holds are counted: only the
    /// last one gives the owner's holds back with `ALL`; the others give
    /// back their own count, one `LOCK.RELEASE` each.
    Shared(Arc<HandleHolds>),
}

/// How many guards of one read-write handle have holds.
#[derive(Default)]
pub(crate) struct HandleHolds {
    live: AtomicUsize,
}

impl HandleHolds {
    fn live(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }
}

/// What a release sends.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum GiveBack {
    /// `LOCK.RELEASE … ALL`: idempotent, so retried until it lands.
    All,
    /// This many plain `LOCK.RELEASE`s: not idempotent, so sent once.
    Each(u64),
}

/// Gives holds back in the background path of every kind of release (a
/// dropped guard, a release that did not complete, a cancelled acquire):
/// `ALL` is retried after transport errors until it lands, the server
/// says the owner holds nothing, or `until` passes (the lease has ended
/// by then).
async fn give_back(backend: &dyn Backend, key: &str, owner: &str, what: GiveBack, until: Instant) {
    match what {
        GiveBack::Each(n) => {
            for _ in 0..n {
                if backend.release(key, owner, false).await.is_err() {
                    return;
                }
            }
        }
        GiveBack::All => loop {
            match backend.release(key, owner, true).await {
                Ok(_) | Err(Error::NotOwner) => return,
                Err(_) if Instant::now() >= until => return,
                Err(_) => tokio::time::sleep(RELEASE_RETRY).await,
            }
        },
    }
}

/// How soon a release that failed in transit is sent again.
const RELEASE_RETRY: Duration = Duration::from_millis(50);

/// What a lock call may hold before it hands out a [`Guard`]: a grant whose
/// reply may not have arrived yet, or that is still being confirmed. Every
/// acquire path (lock, try, read, write, permit, Redlock) arms one before
/// it sends. Dropped while armed (the call's future was dropped, or the
/// call gave up on a reply that may still come), it gives back in the
/// background what may have been granted, on the connection the acquire
/// went on (the shared one, after the acquire), and never blocks the drop.
pub(crate) struct Pending<'a> {
    ctx: Option<Context>,
    key: &'a str,
    owner: &'a str,
    owned: Owned,
    /// How long a grant could last: the retries stop then.
    ttl: Duration,
}

impl<'a> Pending<'a> {
    pub(crate) fn new(
        ctx: Context,
        key: &'a str,
        owner: &'a str,
        owned: Owned,
        ttl: Duration,
    ) -> Pending<'a> {
        Pending {
            ctx: Some(ctx),
            key,
            owner,
            owned,
            ttl,
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
        let what = match &self.owned {
            Owned::Alone => GiveBack::All,
            // Another guard of the handle holds under this owner: a grant
            // that crossed the cancel is a reentry of its hold, given back
            // with the handle's last release (`ALL`); releasing now could
            // take the other guard's hold instead.
            Owned::Shared(holds) if holds.live() > 0 => return,
            Owned::Shared(_) => GiveBack::All,
        };
        let backend = ctx.backend;
        let key = self.key.to_string();
        let owner = self.owner.to_string();
        let until = Instant::now() + self.ttl;
        let job = async move { give_back(&*backend, &key, &owner, what, until).await };
        ctx.tasks.spawn_on(job, &ctx.runtime);
    }
}

/// A release on its way. If the call sending it ends before the server
/// confirms it (dropped, or a transport error), the guard reports the lock
/// lost (release not confirmed) at once, and the release is sent again in
/// the background until it lands or the lease ends; the watchdog is
/// stopped first and an ephemeral hold's connection closed after.
struct Unconfirmed {
    job: Option<ReleaseJob>,
}

struct ReleaseJob {
    ctx: Context,
    key: String,
    owner: String,
    lease: Arc<Lease>,
    what: GiveBack,
    owned: Owned,
    watchdog: Option<Watchdog>,
    binding: Option<Watchdog>,
}

impl ReleaseJob {
    /// Runs the release in the background; `lose` first marks the lease
    /// lost (release not confirmed), for a guard the application still has.
    fn spawn(self, lose: bool) {
        if lose {
            self.lease.lose(LossReason::ReleaseUnconfirmed);
        }
        let ReleaseJob {
            ctx,
            key,
            owner,
            lease,
            what,
            owned,
            watchdog,
            binding,
        } = self;
        if let Owned::Shared(holds) = owned {
            holds.live.fetch_sub(1, Ordering::SeqCst);
        }
        let backend = ctx.backend.clone();
        let job = async move {
            if let Some(dog) = watchdog {
                dog.stop.cancel();
                let _ = dog.task.await;
            }
            // The server's lease end is at most the drift past ours.
            let (ttl, _) = lease.ttl();
            let until = lease.deadline() + crate::options::drift(ttl);
            give_back(&*backend, &key, &owner, what, until).await;
            if let Some(binding) = binding {
                binding.stop.cancel();
            }
        };
        ctx.tasks.spawn_on(job, &ctx.runtime);
    }
}

impl Unconfirmed {
    /// Confirmed: what the job held goes back to the guard.
    fn disarm(mut self) -> Option<ReleaseJob> {
        self.job.take()
    }
}

impl Drop for Unconfirmed {
    fn drop(&mut self) {
        if let Some(job) = self.job.take() {
            job.spawn(true);
        }
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
    owned: Owned,
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
        owned: Owned,
    ) -> Guard {
        if let Owned::Shared(holds) = &owned {
            holds.live.fetch_add(1, Ordering::SeqCst);
        }
        let mut guard = Guard {
            ctx,
            key,
            owner,
            fence,
            count: 1,
            lease: Arc::new(Lease::new(deadline, ttl, ttl_ms)),
            watchdog: None,
            auto_renew,
            owned,
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
    ///
    /// A release that does not complete (this future dropped, a timeout, a
    /// transport error) leaves the guard holding nothing: it reports the
    /// lock lost ([`LossReason::ReleaseUnconfirmed`]) and the release is
    /// sent again in the background until it lands or the lease ends.
    pub async fn release(&mut self) -> Result<u64, Error> {
        self.held()?;
        self.hand_back(false).await
    }

    /// Releases every hold now, whatever the count; cancelled or failed in
    /// transit, it goes on in the background as [`Guard::release`] does.
    pub async fn release_all(mut self) -> Result<(), Error> {
        self.held()?;
        self.hand_back(true).await.map(|_| ())
    }

    /// Whether this guard's holds are the last of its owner's: then `ALL`
    /// gives them back; otherwise (another guard of the same read-write
    /// handle holds too) its own count does.
    fn give_back_all(&self) -> GiveBack {
        match &self.owned {
            Owned::Shared(holds) if holds.live() > 1 => GiveBack::Each(self.count),
            _ => GiveBack::All,
        }
    }

    /// The one release path: every hold (`all`) or one.
    async fn hand_back(&mut self, all: bool) -> Result<u64, Error> {
        let finishing = all || self.count <= 1;
        let every = self.give_back_all();
        let what = if finishing { every } else { GiveBack::Each(1) };
        // From here the guard counts nothing as held until the server
        // confirms what is left; a release that does not finish (this
        // future dropped, even while the watchdog stops) keeps it so.
        let count = std::mem::take(&mut self.count);
        let mut pending = Unconfirmed {
            job: Some(ReleaseJob {
                ctx: self.ctx.clone(),
                key: self.key.clone(),
                owner: self.owner.clone(),
                lease: self.lease.clone(),
                // Unconfirmed, the guard is done: every hold goes back.
                what: every,
                owned: self.owned.clone(),
                // The retry stops the watchdog itself if it still runs.
                watchdog: self.watchdog.take(),
                binding: if finishing { self.binding.take() } else { None },
            }),
        };
        if finishing {
            // No renew may follow the release: stop the watchdog, and wait
            // until it has stopped, before sending.
            if let Some(dog) = pending.job.as_mut().and_then(|job| job.watchdog.take()) {
                dog.stop.cancel();
                let _ = dog.task.await;
            }
        }
        let reply = match what {
            GiveBack::All => self.ctx.backend.release(&self.key, &self.owner, true).await,
            GiveBack::Each(n) => {
                let mut left = Ok(0);
                for _ in 0..n {
                    left = self
                        .ctx
                        .backend
                        .release(&self.key, &self.owner, false)
                        .await;
                    if left.is_err() {
                        break;
                    }
                }
                left
            }
        };
        let reply = match reply {
            // Transport trouble: the release may or may not have landed.
            Err(err) if !matches!(err, Error::NotOwner) => return Err(err),
            other => other,
        };
        let Some(job) = pending.disarm() else {
            return reply;
        };
        self.watchdog = job.watchdog;
        let left = match (&self.owned, &reply) {
            // Only this guard's count is ours to keep; the server's count
            // includes the handle's other guards.
            (Owned::Shared(_), Ok(_)) if !finishing => count - 1,
            (Owned::Alone, Ok(left)) => *left,
            _ => 0,
        };
        self.count = left;
        if left > 0 {
            self.binding = self.binding.take().or(job.binding);
            if self.watchdog.is_none() {
                // More holds than we counted (a retried command): keep
                // renewing them.
                self.start_watchdog();
            }
        } else {
            if let Some(binding) = job.binding {
                binding.stop.cancel();
            }
            self.stop_watchdog().await;
            self.handle_done();
        }
        match reply {
            Ok(_) => Ok(left),
            Err(err) => {
                // The server no longer lists this owner: the hold was lost
                // before the release came.
                self.lease.lose(LossReason::NotOwner);
                Err(err)
            }
        }
    }

    /// This guard has no holds any more: a read-write handle counts one
    /// guard less.
    fn handle_done(&self) {
        if let Owned::Shared(holds) = &self.owned {
            holds.live.fetch_sub(1, Ordering::SeqCst);
        }
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
    /// then gives the holds back (retried until it lands or the lease
    /// ends), then closes an ephemeral hold's connection. Never blocks the
    /// dropping thread.
    fn drop(&mut self) {
        if self.count == 0 {
            if let Some(dog) = self.watchdog.take() {
                dog.stop.cancel();
            }
            return;
        }
        let what = match &self.owned {
            // A lost hold of a shared owner is gone; what the owner holds
            // now belongs to the handle's other guards.
            Owned::Shared(_) if self.is_lost() => GiveBack::Each(0),
            _ => self.give_back_all(),
        };
        let job = ReleaseJob {
            ctx: self.ctx.clone(),
            key: std::mem::take(&mut self.key),
            owner: std::mem::take(&mut self.owner),
            lease: self.lease.clone(),
            what,
            owned: self.owned.clone(),
            watchdog: self.watchdog.take(),
            binding: self.binding.take(),
        };
        job.spawn(false);
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
            // Lost some other way (a refused release, the connection of an
            // ephemeral hold): nothing left to watch.
            () = lease.lost.cancelled() => return,
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
