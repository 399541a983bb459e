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

/// Whose an owner token is: one guard's alone, or shared by the guards of
/// one read-write handle ([`crate::RwLock`]), whose two sides are one owner
/// on the server (so the writer's read is a reentry, and a reader's write
/// is refused as an upgrade).
#[derive(Clone)]
pub(crate) enum Owned {
    /// `LOCK.RELEASE … ALL` ends exactly this guard's holds, and may be
    /// sent again until it lands.
    Alone,
    /// One owner for the handle's guards and acquires: see [`HandleHolds`].
    Shared(Arc<HandleHolds>),
}

/// What one read-write handle has going on under its one owner.
///
/// `LOCK.RELEASE … ALL` ends every hold of the owner, so it is sent only
/// when the handle goes idle (no guard holds, no acquire is between its
/// send and its outcome): sent earlier, it would also end a hold another
/// guard has, or a grant still on its way to another acquire. While the
/// handle is busy, a guard gives back its own count, and a cancelled
/// acquire whose grant may have crossed the cancel leaves that grant
/// owed, given back with the `ALL` sent when the handle goes idle. A new
/// acquire on the handle waits until such an `ALL` has landed (or given
/// up at the lease end), so that the `ALL` can never reach the server
/// after the new grant, whatever connection each goes on.
#[derive(Default)]
pub(crate) struct HandleHolds {
    state: Mutex<HandleState>,
    /// Woken when an `ALL` in flight lands.
    settled: Notify,
}

#[derive(Default)]
struct HandleState {
    /// Guards with holds.
    live: usize,
    /// Acquires between their send and their outcome.
    acquiring: usize,
    /// A grant that may have crossed a cancel is not given back yet.
    owed: bool,
    /// `ALL`s in flight.
    giving: usize,
}

impl HandleState {
    fn idle(&self) -> bool {
        self.live == 0 && self.acquiring == 0
    }

    /// The handle went idle: whatever the owner may hold goes back with
    /// `ALL`, and new acquires wait for it.
    fn give_all(&mut self, holds: &Arc<HandleHolds>) -> Giving {
        self.owed = false;
        self.giving += 1;
        Giving(holds.clone())
    }
}

impl HandleHolds {
    fn state(&self) -> std::sync::MutexGuard<'_, HandleState> {
        // The state is a few counters changed in one step each: a panic
        // elsewhere cannot leave it half-changed.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until no `ALL` of the handle is in flight, then counts an
    /// acquire as going out.
    async fn enter(&self) {
        loop {
            let landed = self.settled.notified();
            {
                let mut state = self.state();
                if state.giving == 0 {
                    state.acquiring += 1;
                    return;
                }
            }
            landed.await;
        }
    }

    /// An acquire's outcome is known (`crossed`: its grant may have come
    /// after it gave up): what to send now, if anything.
    fn settle(self: &Arc<Self>, crossed: bool) -> Option<Giving> {
        let mut state = self.state();
        state.acquiring -= 1;
        state.owed |= crossed;
        (state.idle() && state.owed).then(|| state.give_all(self))
    }

    fn join(&self) {
        self.state().live += 1;
    }

    /// A guard with `count` holds is done: `ALL` if the handle is idle now,
    /// otherwise the guard's own count.
    fn leave(self: &Arc<Self>, count: u64) -> (GiveBack, Option<Giving>) {
        let mut state = self.state();
        state.live -= 1;
        match state.idle() {
            true => (GiveBack::All, Some(state.give_all(self))),
            false => (GiveBack::Each(count), None),
        }
    }
}

/// An `ALL` of a read-write handle in flight: dropped once it has landed
/// (or given up), which lets the handle's new acquires go out.
pub(crate) struct Giving(Arc<HandleHolds>);

impl Drop for Giving {
    fn drop(&mut self) {
        self.0.state().giving -= 1;
        self.0.settled.notify_waiters();
    }
}

/// What a guard with `count` holds gives back when it is done, and for a
/// read-write handle whether that is the handle's `ALL` in flight.
fn finish(owned: &Owned, count: u64) -> (GiveBack, Option<Giving>) {
    match owned {
        Owned::Alone => (GiveBack::All, None),
        Owned::Shared(holds) => holds.leave(count),
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
/// Through a read-write handle, that give-back waits until the handle is
/// idle (see [`HandleHolds`]).
pub(crate) struct Pending<'a> {
    ctx: Context,
    armed: bool,
    key: &'a str,
    owner: &'a str,
    owned: Owned,
    /// How long a grant could last: the retries stop then.
    ttl: Duration,
}

impl<'a> Pending<'a> {
    /// Armed right before the send; through a read-write handle, after any
    /// `ALL` of the handle still in flight has landed.
    pub(crate) async fn new(
        ctx: Context,
        key: &'a str,
        owner: &'a str,
        owned: Owned,
        ttl: Duration,
    ) -> Pending<'a> {
        if let Owned::Shared(holds) = &owned {
            holds.enter().await;
        }
        Pending {
            ctx,
            armed: true,
            key,
            owner,
            owned,
            ttl,
        }
    }

    /// Nothing to undo: no grant, a release already done, or a guard now
    /// holds the lock.
    pub(crate) fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        let giving = match &self.owned {
            Owned::Alone if self.armed => None,
            Owned::Alone => return,
            // Through a read-write handle, a grant that crossed the cancel
            // goes back with the handle's `ALL` once it is idle: sent
            // earlier, the `ALL` would end the holds of the handle's other
            // guards and acquires too.
            Owned::Shared(holds) => match holds.settle(self.armed) {
                Some(giving) => Some(giving),
                None => return,
            },
        };
        let backend = self.ctx.backend.clone();
        let key = self.key.to_string();
        let owner = self.owner.to_string();
        let until = Instant::now() + self.ttl;
        let job = async move {
            give_back(&*backend, &key, &owner, GiveBack::All, until).await;
            drop(giving);
        };
        self.ctx.tasks.spawn_on(job, &self.ctx.runtime);
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
    /// What goes back; `None`: what the guard's `count` holds come to
    /// when it is done (decided when the job runs).
    what: Option<(GiveBack, Option<Giving>)>,
    count: u64,
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
            count,
            owned,
            watchdog,
            binding,
        } = self;
        let (what, giving) = what.unwrap_or_else(|| finish(&owned, count));
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
            drop(giving);
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
            holds.join();
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
    /// reentry needs its own [`Guard::release`]. Returns the server's
    /// count of the owner's holds, which on a read-write handle has the
    /// other side's too; [`Guard::count`] is this guard's own.
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
        self.count = match self.owned {
            Owned::Alone => count,
            // The server counts the owner's holds, the handle's other
            // guards' included: this guard keeps its own, as a release
            // does, so that releasing them never takes another's hold.
            Owned::Shared(_) => self.count.saturating_add(1),
        };
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

    /// The one release path: every hold (`all`) or one.
    async fn hand_back(&mut self, all: bool) -> Result<u64, Error> {
        let finishing = all || self.count <= 1;
        // From here the guard counts nothing as held until the server
        // confirms what is left; a release that does not finish (this
        // future dropped, even while the watchdog stops) keeps it so.
        let count = std::mem::take(&mut self.count);
        // Finishing, the guard is done: `ALL`, or its own count while
        // others of its read-write handle hold or acquire.
        let (what, every) = match finishing {
            true => {
                let every = finish(&self.owned, count);
                (every.0, Some(every))
            }
            false => (GiveBack::Each(1), None),
        };
        let mut pending = Unconfirmed {
            job: Some(ReleaseJob {
                ctx: self.ctx.clone(),
                key: self.key.clone(),
                owner: self.owner.clone(),
                lease: self.lease.clone(),
                // Unconfirmed, the guard is done: every hold goes back.
                what: every,
                count,
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
            if let (Owned::Shared(holds), false) = (&self.owned, finishing) {
                // A release of one hold that found the owner gone: the guard
                // is done all the same (and the handle, idle now, gives
                // back a grant it still owes).
                let done = ReleaseJob {
                    ctx: self.ctx.clone(),
                    key: self.key.clone(),
                    owner: self.owner.clone(),
                    lease: self.lease.clone(),
                    what: Some(holds.leave(0)),
                    count: 0,
                    owned: self.owned.clone(),
                    watchdog: None,
                    binding: None,
                };
                done.spawn(false);
            }
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
            // now belongs to the handle's other guards (or, the handle
            // idle, goes back with its `ALL`, with any grant it owes).
            Owned::Shared(holds) if self.is_lost() => holds.leave(0),
            _ => finish(&self.owned, self.count),
        };
        let job = ReleaseJob {
            ctx: self.ctx.clone(),
            key: std::mem::take(&mut self.key),
            owner: std::mem::take(&mut self.owner),
            lease: self.lease.clone(),
            what: Some(what),
            count: self.count,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A grant that may have crossed a cancel while another acquire of the
    /// handle is under way is owed, not given back (an `ALL` then would
    /// end that acquire's grant too); it goes back with the `ALL` sent when
    /// the handle goes idle.
    #[test]
    fn a_crossed_grant_waits_for_the_handle_to_go_idle() {
        let holds = Arc::new(HandleHolds::default());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        runtime.block_on(holds.enter());
        runtime.block_on(holds.enter());
        assert!(
            holds.settle(true).is_none(),
            "ALL sent while another acquire is under way"
        );
        holds.join();
        assert!(holds.settle(false).is_none());
        match holds.leave(1) {
            (GiveBack::All, Some(giving)) => drop(giving),
            (what, _) => panic!("the idle handle gave back {what:?}, not ALL"),
        }
        assert!(!holds.state().owed);
    }

    /// A guard done while another guard of the handle holds gives back its
    /// own count; the last one gives back with `ALL`.
    #[test]
    fn only_the_idle_handle_gives_back_with_all() {
        let holds = Arc::new(HandleHolds::default());
        holds.join();
        holds.join();
        assert!(matches!(holds.leave(2), (GiveBack::Each(2), None)));
        assert!(matches!(holds.leave(1), (GiveBack::All, Some(_))));
    }

    /// An acquire through the handle waits while an `ALL` is in flight.
    #[test]
    fn an_acquire_waits_for_the_handle_all_in_flight() {
        let holds = Arc::new(HandleHolds::default());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime");
        holds.join();
        let (_, giving) = holds.leave(1);
        let giving = giving.expect("ALL from the idle handle");
        runtime.block_on(async {
            let early = tokio::time::timeout(Duration::from_millis(50), holds.enter()).await;
            assert!(early.is_err(), "the acquire went out before the ALL landed");
            drop(giving);
            tokio::time::timeout(Duration::from_secs(5), holds.enter())
                .await
                .expect("the acquire goes out once the ALL landed");
        });
        assert_eq!(holds.state().acquiring, 1);
    }
}
