//! The blocking API: the same shape as the async one, for code without an
//! async runtime.
//!
//! Each blocking client owns a small tokio runtime (one worker thread) on
//! which its watchdogs and background releases run, so a guard keeps its
//! lease while the calling thread is busy. Calls block the calling thread;
//! do not call them from inside an async runtime (use the async API there).
//! When the last handle (client or guard) goes, the runtime first waits, up
//! to 2 s, for releases still in flight, then its thread ends.

use std::sync::Arc;
use std::time::Duration;

use redis::IntoConnectionInfo;
use tokio::runtime::Runtime;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::client::{Client as AsyncClient, RwLock as AsyncRwLock, Semaphore as AsyncSemaphore};
use crate::conn::Conn;
use crate::error::{Error, LossReason};
use crate::guard::{Guard as AsyncGuard, LossSignal};
use crate::multi::MultiGuard as AsyncMultiGuard;
use crate::options::LockOptions;
use crate::redlock::{Redlock as AsyncRedlock, RedlockOptions};

/// How long dropping the last handle waits for background releases.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// The runtime of a blocking client and the tasks it must finish.
#[derive(Debug)]
struct Background {
    runtime: Runtime,
    tasks: TaskTracker,
}

impl Background {
    fn start() -> Result<Arc<Background>, Error> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("redislock-client")
            .enable_all()
            .build()
            .map_err(|e| Error::Transport(e.into()))?;
        Ok(Arc::new(Background {
            runtime,
            tasks: TaskTracker::new(),
        }))
    }

    fn block_on<F: std::future::Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }
}

impl Drop for Background {
    /// Lets releases handed over by dropped guards finish; the runtime
    /// (dropped next) then stops its thread.
    fn drop(&mut self) {
        self.tasks.close();
        let tasks = self.tasks.clone();
        self.runtime.block_on(async {
            let _ = tokio::time::timeout(DRAIN_TIMEOUT, tasks.wait()).await;
        });
    }
}

/// Blocking client for one server or one Redis Cluster; see
/// [`crate::Client`] for each method.
///
/// ```no_run
/// use redislock_client::{blocking::Client, LockOptions};
/// let client = Client::open("redis://127.0.0.1:6379/")?;
/// let mut guard = client.lock("orders:42", &LockOptions::default())?;
/// // ... write to the resource with guard.fence() ...
/// guard.release()?;
/// # Ok::<(), redislock_client::Error>(())
/// ```
#[derive(Clone)]
pub struct Client {
    inner: AsyncClient,
    bg: Arc<Background>,
}

impl Client {
    pub fn open(info: impl IntoConnectionInfo) -> Result<Client, Error> {
        let bg = Background::start()?;
        let conn = Conn::single(info, Duration::from_secs(2), Duration::from_secs(2))?;
        Ok(Client {
            inner: AsyncClient::with_conn(conn, bg.tasks.clone()),
            bg,
        })
    }

    /// The master that Redis Sentinel monitors as `name` (see the async
    /// `Client::sentinel`).
    pub fn sentinel<I: IntoConnectionInfo>(
        sentinels: impl IntoIterator<Item = I>,
        name: &str,
    ) -> Result<Client, Error> {
        let bg = Background::start()?;
        let conn = Conn::sentinel(
            sentinels,
            name,
            Duration::from_secs(2),
            Duration::from_secs(2),
        )?;
        Ok(Client {
            inner: AsyncClient::with_conn(conn, bg.tasks.clone()),
            bg,
        })
    }

    pub fn cluster<I: IntoConnectionInfo>(
        nodes: impl IntoIterator<Item = I>,
    ) -> Result<Client, Error> {
        let bg = Background::start()?;
        let conn = Conn::cluster(nodes, Duration::from_secs(2), Duration::from_secs(2))?;
        Ok(Client {
            inner: AsyncClient::with_conn(conn, bg.tasks.clone()),
            bg,
        })
    }

    /// Takes the lock if free; [`Error::WouldBlock`] if not ([`Error::Quarantine`]
    /// if free while the server is in its quarantine).
    pub fn try_lock(&self, key: &str, opts: &LockOptions) -> Result<Guard, Error> {
        let guard = self.bg.block_on(self.inner.try_lock(key, opts))?;
        Ok(self.wrap(guard))
    }

    /// Takes every one of `keys` at once or none; see
    /// [`crate::Client::try_lock_keys`].
    pub fn try_lock_keys<K: AsRef<str>>(
        &self,
        keys: &[K],
        opts: &LockOptions,
    ) -> Result<MultiGuard, Error> {
        let inner = self.bg.block_on(self.inner.try_lock_keys(keys, opts))?;
        Ok(MultiGuard {
            inner,
            bg: self.bg.clone(),
        })
    }

    /// Waits for every one of `keys` together; see
    /// [`crate::Client::lock_keys`].
    pub fn lock_keys<K: AsRef<str>>(
        &self,
        keys: &[K],
        opts: &LockOptions,
    ) -> Result<MultiGuard, Error> {
        let inner = self.bg.block_on(self.inner.lock_keys(keys, opts))?;
        Ok(MultiGuard {
            inner,
            bg: self.bg.clone(),
        })
    }

    /// Waits for the lock up to the options' wait; [`Error::TimedOut`] then.
    /// If the server's answer does not come within the wait plus a margin,
    /// the client gives up, closes the wait's connection and releases what
    /// may have been granted.
    pub fn lock(&self, key: &str, opts: &LockOptions) -> Result<Guard, Error> {
        let guard = self.bg.block_on(self.inner.lock(key, opts))?;
        Ok(self.wrap(guard))
    }

    /// Runs `f` under the lock, then releases it. `f` gets the loss signal
    /// (poll [`LossSignal::is_lost`]); if the lock was lost meanwhile, the
    /// result is [`Error::Lost`].
    pub fn with_lock<T>(
        &self,
        key: &str,
        opts: &LockOptions,
        f: impl FnOnce(&LossSignal) -> T,
    ) -> Result<T, Error> {
        let guard = self.lock(key, opts)?;
        run_with(guard, f)
    }

    /// The read side of a read-write lock (see [`crate::Client::read_lock`]).
    pub fn read_lock(&self, key: &str, opts: &LockOptions) -> Result<Guard, Error> {
        let guard = self.bg.block_on(self.inner.read_lock(key, opts))?;
        Ok(self.wrap(guard))
    }

    /// The read side at once, or [`Error::WouldBlock`].
    pub fn try_read_lock(&self, key: &str, opts: &LockOptions) -> Result<Guard, Error> {
        let guard = self.bg.block_on(self.inner.try_read_lock(key, opts))?;
        Ok(self.wrap(guard))
    }

    /// The write side of a read-write lock: the same as [`Client::lock`].
    pub fn write_lock(&self, key: &str, opts: &LockOptions) -> Result<Guard, Error> {
        self.lock(key, opts)
    }

    /// A read-write handle on `key` whose two sides share one owner (see
    /// [`crate::Client::rw_lock`]).
    pub fn rw_lock(&self, key: &str) -> RwLock {
        RwLock {
            inner: self.inner.rw_lock(key),
            client: self.clone(),
        }
    }

    /// Continues a hold taken elsewhere by its owner token (see
    /// [`crate::Client::resume`]).
    pub fn resume(
        &self,
        key: &str,
        owner: &str,
        fence: Option<u64>,
        opts: &LockOptions,
    ) -> Result<Guard, Error> {
        let guard = self
            .bg
            .block_on(self.inner.resume(key, owner, fence, opts))?;
        Ok(self.wrap(guard))
    }

    /// A counting semaphore of `limit` permits on `key` (see
    /// [`crate::Client::semaphore`]).
    pub fn semaphore(&self, key: &str, limit: u32) -> Result<Semaphore, Error> {
        Ok(Semaphore {
            inner: self.inner.semaphore(key, limit)?,
            client: self.clone(),
        })
    }

    /// Watchdogs and background releases alive now. For tests.
    #[doc(hidden)]
    pub fn background_tasks(&self) -> usize {
        self.bg.tasks.len()
    }

    fn wrap(&self, guard: AsyncGuard) -> Guard {
        Guard {
            inner: guard,
            bg: self.bg.clone(),
        }
    }
}

/// A blocking read-write handle; see [`crate::RwLock`].
#[derive(Clone)]
pub struct RwLock {
    inner: AsyncRwLock,
    client: Client,
}

impl RwLock {
    /// The read side, waiting up to the options' wait.
    pub fn read(&self, opts: &LockOptions) -> Result<Guard, Error> {
        let guard = self.client.bg.block_on(self.inner.read(opts))?;
        Ok(self.client.wrap(guard))
    }

    /// The read side at once, or [`Error::WouldBlock`].
    pub fn try_read(&self, opts: &LockOptions) -> Result<Guard, Error> {
        let guard = self.client.bg.block_on(self.inner.try_read(opts))?;
        Ok(self.client.wrap(guard))
    }

    /// The write side, waiting; [`Error::Upgrade`] while this handle reads.
    pub fn write(&self, opts: &LockOptions) -> Result<Guard, Error> {
        let guard = self.client.bg.block_on(self.inner.write(opts))?;
        Ok(self.client.wrap(guard))
    }

    /// The write side at once, [`Error::WouldBlock`], or [`Error::Upgrade`].
    pub fn try_write(&self, opts: &LockOptions) -> Result<Guard, Error> {
        let guard = self.client.bg.block_on(self.inner.try_write(opts))?;
        Ok(self.client.wrap(guard))
    }
}

/// A blocking counting semaphore; see [`crate::Semaphore`].
#[derive(Clone)]
pub struct Semaphore {
    inner: AsyncSemaphore,
    client: Client,
}

impl Semaphore {
    /// Takes a permit, waiting up to the options' wait.
    pub fn acquire(&self, opts: &LockOptions) -> Result<Guard, Error> {
        let guard = self.client.bg.block_on(self.inner.acquire(opts))?;
        Ok(self.client.wrap(guard))
    }

    /// Takes a permit at once, or [`Error::WouldBlock`].
    pub fn try_acquire(&self, opts: &LockOptions) -> Result<Guard, Error> {
        let guard = self.client.bg.block_on(self.inner.try_acquire(opts))?;
        Ok(self.client.wrap(guard))
    }

    /// Takes `permits` permits as one hold; see
    /// [`crate::Semaphore::acquire_permits`].
    pub fn acquire_permits(&self, permits: u32, opts: &LockOptions) -> Result<Guard, Error> {
        let guard = self
            .client
            .bg
            .block_on(self.inner.acquire_permits(permits, opts))?;
        Ok(self.client.wrap(guard))
    }

    /// [`Semaphore::acquire_permits`] at once, or [`Error::WouldBlock`].
    pub fn try_acquire_permits(&self, permits: u32, opts: &LockOptions) -> Result<Guard, Error> {
        let guard = self
            .client
            .bg
            .block_on(self.inner.try_acquire_permits(permits, opts))?;
        Ok(self.client.wrap(guard))
    }

    pub fn limit(&self) -> u32 {
        self.inner.limit()
    }
}

/// Blocking Redlock over N independent servers; see [`crate::Redlock`].
#[derive(Clone)]
pub struct Redlock {
    inner: AsyncRedlock,
    bg: Arc<Background>,
}

impl Redlock {
    pub fn new<I: IntoConnectionInfo>(
        servers: impl IntoIterator<Item = I>,
    ) -> Result<Redlock, Error> {
        Redlock::with_options(servers, RedlockOptions::default())
    }

    pub fn with_options<I: IntoConnectionInfo>(
        servers: impl IntoIterator<Item = I>,
        options: RedlockOptions,
    ) -> Result<Redlock, Error> {
        let bg = Background::start()?;
        let inner = AsyncRedlock::build(servers, options, bg.tasks.clone())?;
        Ok(Redlock { inner, bg })
    }

    pub fn quorum(&self) -> usize {
        self.inner.quorum()
    }

    /// One round; [`Error::NoQuorum`] if no majority granted in time.
    pub fn try_lock(&self, key: &str, opts: &LockOptions) -> Result<Guard, Error> {
        let guard = self.bg.block_on(self.inner.try_lock(key, opts))?;
        Ok(self.wrap(guard))
    }

    /// Rounds until granted or the wait ends ([`Error::TimedOut`]).
    pub fn lock(&self, key: &str, opts: &LockOptions) -> Result<Guard, Error> {
        let guard = self.bg.block_on(self.inner.lock(key, opts))?;
        Ok(self.wrap(guard))
    }

    /// Runs `f` under the lock, then releases it; see [`Client::with_lock`].
    pub fn with_lock<T>(
        &self,
        key: &str,
        opts: &LockOptions,
        f: impl FnOnce(&LossSignal) -> T,
    ) -> Result<T, Error> {
        let guard = self.lock(key, opts)?;
        run_with(guard, f)
    }

    #[doc(hidden)]
    pub fn background_tasks(&self) -> usize {
        self.bg.tasks.len()
    }

    fn wrap(&self, guard: AsyncGuard) -> Guard {
        Guard {
            inner: guard,
            bg: self.bg.clone(),
        }
    }
}

fn run_with<T>(guard: Guard, f: impl FnOnce(&LossSignal) -> T) -> Result<T, Error> {
    let loss = guard.loss();
    let out = f(&loss);
    let released = guard.release_all();
    match loss.reason() {
        Some(reason) => Err(Error::Lost(reason)),
        None => released.map(|()| out),
    }
}

/// A lock held through a blocking client; see [`crate::Guard`]. Dropping it
/// releases the lock in the background, without blocking.
#[derive(Debug)]
pub struct Guard {
    // Declared first, so it drops first: its release is handed to the
    // runtime before the runtime's last handle (below) can go.
    inner: AsyncGuard,
    bg: Arc<Background>,
}

impl Guard {
    pub fn key(&self) -> &str {
        self.inner.key()
    }

    pub fn fence(&self) -> u64 {
        self.inner.fence()
    }

    pub fn owner(&self) -> &str {
        self.inner.owner()
    }

    /// Until when the lease is surely valid here (monotonic clock).
    pub fn deadline(&self) -> std::time::Instant {
        self.inner.deadline()
    }

    pub fn count(&self) -> u64 {
        self.inner.count()
    }

    pub fn loss(&self) -> LossSignal {
        self.inner.loss()
    }

    pub fn is_lost(&self) -> bool {
        self.inner.is_lost()
    }

    /// Blocks until the lock is lost or `limit` passes; the reason if lost.
    pub fn wait_lost(&self, limit: Duration) -> Option<LossReason> {
        let loss = self.loss();
        let token: CancellationToken = loss.token();
        self.bg.block_on(async {
            let _ = tokio::time::timeout(limit, token.cancelled()).await;
        });
        loss.reason()
    }

    pub fn renew(&mut self) -> Result<(), Error> {
        self.bg.block_on(self.inner.renew())
    }

    /// Renews with a new ttl (see [`crate::Guard::renew_for`]).
    pub fn renew_for(&mut self, ttl: Duration) -> Result<(), Error> {
        self.bg.block_on(self.inner.renew_for(ttl))
    }

    /// Stops the watchdog without releasing (see
    /// [`crate::Guard::stop_renewing`]).
    pub fn stop_renewing(&mut self) {
        self.bg.block_on(self.inner.stop_renewing())
    }

    pub fn reenter(&mut self) -> Result<u64, Error> {
        self.bg.block_on(self.inner.reenter())
    }

    /// Releases one hold; the remaining count (0: free).
    pub fn release(&mut self) -> Result<u64, Error> {
        self.bg.block_on(self.inner.release())
    }

    /// Releases every hold now.
    pub fn release_all(self) -> Result<(), Error> {
        let Guard { inner, bg } = self;
        bg.block_on(inner.release_all())
    }
}

/// Several keys held at once through a blocking client; see
/// [`crate::MultiGuard`]. Dropping it releases every key in the background,
/// without blocking.
#[derive(Debug)]
pub struct MultiGuard {
    // Declared first, so it drops first (as [`Guard`]'s).
    inner: AsyncMultiGuard,
    bg: Arc<Background>,
}

impl MultiGuard {
    pub fn keys(&self) -> &[String] {
        self.inner.keys()
    }

    /// One fence per key, in the order of [`MultiGuard::keys`].
    pub fn fences(&self) -> &[u64] {
        self.inner.fences()
    }

    pub fn owner(&self) -> &str {
        self.inner.owner()
    }

    pub fn loss(&self) -> LossSignal {
        self.inner.loss()
    }

    pub fn is_lost(&self) -> bool {
        self.inner.is_lost()
    }

    pub fn is_held(&self) -> bool {
        self.inner.is_held()
    }

    pub fn renew(&mut self) -> Result<(), Error> {
        self.bg.block_on(self.inner.renew())
    }

    pub fn renew_for(&mut self, ttl: Duration) -> Result<(), Error> {
        self.bg.block_on(self.inner.renew_for(ttl))
    }

    /// Releases every key now.
    pub fn release(self) -> Result<(), Error> {
        let MultiGuard { inner, bg } = self;
        bg.block_on(inner.release())
    }
}
