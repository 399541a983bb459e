//! The async client for one server or one Redis Cluster.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::IntoConnectionInfo;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::conn::{self, Conn, Share};
use crate::error::Error;
use crate::guard::{Backend, BoxFuture, Context, Guard, Pending};
use crate::options::{deadline, LockOptions};

/// How long one reply may take on the shared connection.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Past the server's own `WAIT` timeout, how long the client still waits
/// for its answer before it gives up on its own.
const WAIT_MARGIN: Duration = Duration::from_secs(2);

/// Owner tokens: a random 128-bit id per client, and a counter per lock call,
/// as `<32 hex digits>:<n>`, so no two lock calls share an owner.
pub(crate) struct Owners {
    id: String,
    next: AtomicU64,
}

impl Owners {
    pub(crate) fn new() -> Owners {
        Owners {
            id: format!("{:032x}", rand::random::<u128>()),
            next: AtomicU64::new(1),
        }
    }

    pub(crate) fn next(&self) -> String {
        format!("{}:{}", self.id, self.next.fetch_add(1, Ordering::Relaxed))
    }
}

/// The async client (tokio) for one server or one Redis Cluster. Cheap to
/// clone; clones share connections.
///
/// ```no_run
/// # async fn demo() -> Result<(), redislock_client::Error> {
/// use redislock_client::{Client, LockOptions};
/// let client = Client::open("redis://127.0.0.1:6379/")?;
/// let guard = client.lock("orders:42", &LockOptions::default()).await?;
/// println!("fence {}", guard.fence());
/// drop(guard); // released in the background
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    server: Arc<Server>,
    owners: Owners,
    tasks: TaskTracker,
}

/// One server or cluster as a [`Backend`].
struct Server {
    conn: Conn,
}

impl Client {
    /// A client for one server (`redis://host:port/db`). Connects lazily.
    pub fn open(info: impl IntoConnectionInfo) -> Result<Client, Error> {
        let conn = Conn::single(info, RESPONSE_TIMEOUT, CONNECT_TIMEOUT)?;
        Ok(Client::with_conn(conn, TaskTracker::new()))
    }

    /// A client for the master that Redis Sentinel monitors as `name`, given
    /// some of the Sentinels (`redis://host:26379/`). Each new connection asks
    /// them where the master is, and checks its `ROLE`; a connection whose
    /// server answers `READONLY` (demoted) or `NOREPLICAS` (cut off from its
    /// replicas) is dropped, so the next command asks again.
    pub fn sentinel<I: IntoConnectionInfo>(
        sentinels: impl IntoIterator<Item = I>,
        name: &str,
    ) -> Result<Client, Error> {
        let conn = Conn::sentinel(sentinels, name, RESPONSE_TIMEOUT, CONNECT_TIMEOUT)?;
        Ok(Client::with_conn(conn, TaskTracker::new()))
    }

    /// A client for a Redis Cluster, given some of its nodes. Each command
    /// goes to the node serving its key.
    pub fn cluster<I: IntoConnectionInfo>(
        nodes: impl IntoIterator<Item = I>,
    ) -> Result<Client, Error> {
        let conn = Conn::cluster(nodes, RESPONSE_TIMEOUT, CONNECT_TIMEOUT)?;
        Ok(Client::with_conn(conn, TaskTracker::new()))
    }

    pub(crate) fn with_conn(conn: Conn, tasks: TaskTracker) -> Client {
        Client {
            inner: Arc::new(Inner {
                server: Arc::new(Server { conn }),
                owners: Owners::new(),
                tasks,
            }),
        }
    }

    /// Takes the lock if it is free, at once; [`Error::WouldBlock`] if not.
    pub async fn try_lock(&self, key: &str, opts: &LockOptions) -> Result<Guard, Error> {
        self.try_hold(key, opts, Share::Exclusive).await
    }

    /// Takes the lock, waiting for it up to the options' wait (the server
    /// queues waiters first come, first served); [`Error::TimedOut`] if the
    /// wait ends first.
    ///
    /// The wait runs on a connection of its own. Cancelling it (dropping the
    /// future) closes that connection, so the server drops the waiter, and
    /// sends `LOCK.RELEASE` for a grant that may have crossed the cancel.
    ///
    /// A waiter's lease starts when the server grants it, which the client
    /// cannot see. After a short wait the send time of the request bounds it
    /// closely enough; after a longer one (over a third of the ttl) the
    /// client renews once before handing out the guard, and counts the lease
    /// from that renew's send time.
    pub async fn lock(&self, key: &str, opts: &LockOptions) -> Result<Guard, Error> {
        self.hold(key, opts, Share::Exclusive).await
    }

    /// The read side of a read-write lock on `key`: held beside other
    /// readers, never beside the writer ([`Client::write_lock`]). Waits as
    /// [`Client::lock`] does, in the same queue: readers behind a waiting
    /// writer wait behind it. The guard has its own fence and watchdog.
    pub async fn read_lock(&self, key: &str, opts: &LockOptions) -> Result<Guard, Error> {
        self.hold(key, opts, Share::Read).await
    }

    /// [`Client::read_lock`] at once, or [`Error::WouldBlock`].
    pub async fn try_read_lock(&self, key: &str, opts: &LockOptions) -> Result<Guard, Error> {
        self.try_hold(key, opts, Share::Read).await
    }

    /// The write side of a read-write lock on `key`: an exclusive hold, the
    /// same as [`Client::lock`], granted once every reader's hold has ended.
    pub async fn write_lock(&self, key: &str, opts: &LockOptions) -> Result<Guard, Error> {
        self.lock(key, opts).await
    }

    /// A read-write lock on `key` as one handle: [`RwLock::read`] and
    /// [`RwLock::write`] take its two sides.
    pub fn rw_lock(&self, key: &str) -> RwLock {
        RwLock {
            client: self.clone(),
            key: key.to_string(),
        }
    }

    /// Continues a hold that another process took, from its owner token
    /// ([`Guard::owner`]) and, if known, its fence ([`Guard::fence`]): a
    /// scheduler acquires, a worker renews and releases. The hold is
    /// renewed at once for the options' ttl, which confirms it and starts
    /// the lease from this process's clock; without a fence the server is
    /// asked for it. The guard renews and releases as any other. Not for
    /// ephemeral holds: they end with the connection that took them.
    pub async fn resume(
        &self,
        key: &str,
        owner: &str,
        fence: Option<u64>,
        opts: &LockOptions,
    ) -> Result<Guard, Error> {
        if opts.is_ephemeral() {
            return Err(Error::InvalidOptions(
                "an ephemeral hold cannot be resumed: it ends with its connection",
            ));
        }
        let ttl_ms = opts.ttl_ms()?;
        let sent = Instant::now();
        self.inner.server.renew(key, owner, ttl_ms).await?;
        let fence = match fence {
            Some(fence) => fence,
            // The hold's own fence: raising it to at least 1 changes nothing.
            None => {
                self.inner
                    .server
                    .conn
                    .query(&conn::fence(key, owner, 1))
                    .await?
            }
        };
        let deadline = deadline(sent, opts.ttl());
        Ok(self.guard(key, owner.to_string(), fence, opts, ttl_ms, deadline))
    }

    /// A counting semaphore of `limit` permits (1 to 1,000,000) on `key`;
    /// each permit is a leased hold of its own. Every user of `key` must
    /// ask for the same limit while permits are held or awaited: the server
    /// refuses another.
    pub fn semaphore(&self, key: &str, limit: u32) -> Result<Semaphore, Error> {
        if !(1..=MAX_PERMITS).contains(&limit) {
            return Err(Error::InvalidOptions(
                "a semaphore's limit must be from 1 to 1,000,000",
            ));
        }
        Ok(Semaphore {
            client: self.clone(),
            key: key.to_string(),
            limit,
        })
    }

    async fn try_hold(&self, key: &str, opts: &LockOptions, share: Share) -> Result<Guard, Error> {
        let ttl_ms = opts.ttl_ms()?;
        let owner = self.inner.owners.next();
        let command = conn::acquire(key, &owner, ttl_ms, share, opts.is_ephemeral(), None);
        let (sent, fence, bound) = if opts.is_ephemeral() {
            // The hold is bound to the connection it is granted on: one of
            // its own, kept for the hold's life.
            let (mut link, closed) = self.inner.server.conn.bound(None).await?;
            let sent = Instant::now();
            let fence: Option<u64> = link.query(&command).await.map_err(Error::from_redis)?;
            (sent, fence, Some((link, closed)))
        } else {
            let sent = Instant::now();
            (sent, self.inner.server.conn.query(&command).await?, None)
        };
        let Some(fence) = fence else {
            return Err(Error::WouldBlock);
        };
        let mut guard = self.guard(key, owner, fence, opts, ttl_ms, deadline(sent, opts.ttl()));
        if let Some((link, closed)) = bound {
            guard.bind(link, closed);
        }
        Ok(guard)
    }

    /// A hold of `share`, waiting as [`Client::lock`] describes.
    async fn hold(&self, key: &str, opts: &LockOptions, share: Share) -> Result<Guard, Error> {
        let ttl_ms = opts.ttl_ms()?;
        let wait_ms = opts.wait_ms()?;
        let owner = self.inner.owners.next();
        let limit = opts.wait_limit().map(|wait| wait + WAIT_MARGIN);
        let (mut link, closed) = if opts.is_ephemeral() {
            let (link, closed) = self.inner.server.conn.bound(limit).await?;
            (link, Some(closed))
        } else {
            (self.inner.server.conn.dedicated(limit).await?, None)
        };
        // Armed until a guard holds the lock: dropping this future, giving
        // up on the server's answer, or failing to confirm a grant releases
        // what may have been granted.
        let mut pending = Pending::new(self.context(), key, &owner);
        let sent = Instant::now();
        let command = conn::acquire(
            key,
            &owner,
            ttl_ms,
            share,
            opts.is_ephemeral(),
            Some(wait_ms),
        );
        let reply = link.query::<Option<u64>>(&command).await;
        // A wait's link is done; an ephemeral hold's is kept for the hold.
        let bound = closed.map(|closed| (link, closed));
        let fence = match reply {
            Ok(Some(fence)) => fence,
            Ok(None) => {
                pending.disarm();
                return Err(Error::TimedOut);
            }
            Err(err) if err.is_timeout() => return Err(Error::TimedOut),
            Err(err) => return Err(Error::from_redis(err)),
        };
        let deadline = if sent.elapsed() > opts.ttl() / 3 {
            // The lease ends at least `ttl` after the grant, but the send of
            // the request tells little of when that was (after a wait longer
            // than the ttl, that lease would look over already). A renew
            // sent now pins it from its own send time. It is done before
            // the guard exists: a watchdog started on the stale deadline
            // would declare the lock lost before the renew came back.
            let renewed = Instant::now();
            self.inner.server.renew(key, &owner, ttl_ms).await?;
            deadline(renewed, opts.ttl())
        } else {
            // The grant came between the send and now: the lease runs at
            // least `ttl` from the send.
            deadline(sent, opts.ttl())
        };
        pending.disarm();
        let mut guard = self.guard(key, owner.clone(), fence, opts, ttl_ms, deadline);
        if let Some((link, closed)) = bound {
            guard.bind(link, closed);
        }
        Ok(guard)
    }

    /// Runs `f` under the lock (taken with [`Client::lock`]) and releases it
    /// after. `f` gets a token that is cancelled if the lock is lost; if it
    /// was, the result is [`Error::Lost`] whatever `f` returned.
    pub async fn with_lock<T, F, Fut>(
        &self,
        key: &str,
        opts: &LockOptions,
        f: F,
    ) -> Result<T, Error>
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.lock(key, opts).await?;
        guard.run(f).await
    }

    fn guard(
        &self,
        key: &str,
        owner: String,
        fence: u64,
        opts: &LockOptions,
        ttl_ms: u64,
        deadline: Instant,
    ) -> Guard {
        Guard::start(
            self.context(),
            key.to_string(),
            owner,
            fence,
            opts.ttl(),
            ttl_ms,
            deadline,
            opts.has_watchdog(),
        )
    }

    /// Background tasks alive now (watchdogs, releases after a drop): 0
    /// once every guard is released. For tests.
    #[doc(hidden)]
    pub fn background_tasks(&self) -> usize {
        self.inner.tasks.len()
    }

    /// Where guards of this client live and run their background tasks.
    fn context(&self) -> Context {
        Context {
            backend: self.inner.server.clone(),
            tasks: self.inner.tasks.clone(),
            runtime: tokio::runtime::Handle::current(),
        }
    }
}

/// A read-write lock on one key ([`Client::rw_lock`]): readers share it,
/// a writer holds it alone.
#[derive(Clone)]
pub struct RwLock {
    client: Client,
    key: String,
}

impl RwLock {
    /// The read side, waiting as [`Client::lock`] does.
    pub async fn read(&self, opts: &LockOptions) -> Result<Guard, Error> {
        self.client.read_lock(&self.key, opts).await
    }

    /// The read side at once, or [`Error::WouldBlock`].
    pub async fn try_read(&self, opts: &LockOptions) -> Result<Guard, Error> {
        self.client.try_read_lock(&self.key, opts).await
    }

    /// The write side, waiting as [`Client::lock`] does.
    pub async fn write(&self, opts: &LockOptions) -> Result<Guard, Error> {
        self.client.write_lock(&self.key, opts).await
    }

    /// The write side at once, or [`Error::WouldBlock`].
    pub async fn try_write(&self, opts: &LockOptions) -> Result<Guard, Error> {
        self.client.try_lock(&self.key, opts).await
    }

    pub fn key(&self) -> &str {
        &self.key
    }
}

/// The most permits a semaphore may have (the server's bound).
const MAX_PERMITS: u32 = 1_000_000;

/// A counting semaphore on one key ([`Client::semaphore`]): each
/// [`Semaphore::acquire`] takes one permit, a [`Guard`] with its own fence,
/// lease and watchdog, released as any guard is.
///
/// ```no_run
/// # async fn demo() -> Result<(), redislock_client::Error> {
/// use redislock_client::{Client, LockOptions};
/// let client = Client::open("redis://127.0.0.1:6379/")?;
/// let pool = client.semaphore("db:connections", 8)?;
/// let permit = pool.acquire(&LockOptions::default()).await?;
/// // ... at most 8 holders run here at once ...
/// drop(permit); // released in the background
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Semaphore {
    client: Client,
    key: String,
    limit: u32,
}

impl Semaphore {
    /// Takes a permit, waiting up to the options' wait in the server's queue
    /// (first come, first served); [`Error::TimedOut`] if none came.
    pub async fn acquire(&self, opts: &LockOptions) -> Result<Guard, Error> {
        let share = Share::Permit(self.limit);
        self.client.hold(&self.key, opts, share).await
    }

    /// Takes a permit at once, or [`Error::WouldBlock`].
    pub async fn try_acquire(&self, opts: &LockOptions) -> Result<Guard, Error> {
        let share = Share::Permit(self.limit);
        self.client.try_hold(&self.key, opts, share).await
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn limit(&self) -> u32 {
        self.limit
    }
}

impl Backend for Server {
    fn renew<'a>(&'a self, key: &'a str, owner: &'a str, ttl_ms: u64) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            self.conn
                .query::<i64>(&conn::renew(key, owner, ttl_ms))
                .await
                .map(|_| ())
        })
    }

    fn reenter<'a>(&'a self, key: &'a str, owner: &'a str, ttl_ms: u64) -> BoxFuture<'a, u64> {
        Box::pin(async move { self.conn.query(&conn::reenter(key, owner, ttl_ms)).await })
    }

    fn release<'a>(&'a self, key: &'a str, owner: &'a str, all: bool) -> BoxFuture<'a, u64> {
        Box::pin(async move { self.conn.query(&conn::release(key, owner, all)).await })
    }
}
