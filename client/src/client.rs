//! The async client for one server or one Redis Cluster.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::{Cmd, IntoConnectionInfo};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::conn::{self, Conn, Link, Share};
use crate::error::Error;
use crate::guard::{Backend, Context, Guard, HandleHolds, Owned, Pending};
use crate::multi::{Keys, MultiGuard};
use crate::options::{deadline, LockOptions};
use crate::server::Server;

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

    /// Takes the lock if it is free, at once; [`Error::WouldBlock`] if not
    /// ([`Error::Quarantine`] if free while the server is in its quarantine).
    pub async fn try_lock(&self, key: &str, opts: &LockOptions) -> Result<Guard, Error> {
        self.try_hold(key, opts, Share::Exclusive, None).await
    }

    /// Takes every one of `keys` at once, or none: [`Error::WouldBlock`]
    /// if any of them is held by another owner (or has a client waiting),
    /// and then nothing is held on any key. 1 to 64 distinct keys; in a
    /// cluster they must share a hash slot.
    pub async fn try_lock_keys<K: AsRef<str>>(
        &self,
        keys: &[K],
        opts: &LockOptions,
    ) -> Result<MultiGuard, Error> {
        let req = self.keys_request(keys)?;
        let (guard, fences) = self.try_request(&req, opts, None).await?;
        Ok(MultiGuard::new(guard, req.keys, fences))
    }

    /// Takes every one of `keys` together, waiting up to the options' wait:
    /// the server queues the request on every key at once and grants it
    /// when all of them can be granted in the same step, never some of
    /// them while it waits, so requests for the same keys in any order
    /// never deadlock, and no later request takes any of its keys first.
    /// One guard for all of them: one watchdog (one `LOCK.MRENEW` per
    /// period), lost when any key is lost, released all together.
    /// Cancelling it leaves nothing held on any key, as [`Client::lock`].
    pub async fn lock_keys<K: AsRef<str>>(
        &self,
        keys: &[K],
        opts: &LockOptions,
    ) -> Result<MultiGuard, Error> {
        let req = self.keys_request(keys)?;
        let (guard, fences) = self.hold_request(&req, opts, None).await?;
        Ok(MultiGuard::new(guard, req.keys, fences))
    }

    /// A request for several keys at once, checked before anything is
    /// sent (the server would refuse the same, with less to say).
    fn keys_request<K: AsRef<str>>(&self, keys: &[K]) -> Result<Request, Error> {
        let keys: Vec<String> = keys.iter().map(|k| k.as_ref().to_string()).collect();
        if keys.is_empty() || keys.len() > MAX_KEYS {
            return Err(Error::InvalidOptions(
                "a lock on several keys takes 1 to 64 keys",
            ));
        }
        let mut sorted: Vec<&String> = keys.iter().collect();
        sorted.sort();
        if sorted.windows(2).any(|pair| pair[0] == pair[1]) {
            return Err(Error::InvalidOptions(
                "a lock on several keys names each key once",
            ));
        }
        let backend = Arc::new(Keys::new(self.inner.server.clone(), keys.clone()));
        Ok(Request {
            keys,
            several: true,
            share: Share::Exclusive,
            ctx: self.context_on(backend),
        })
    }

    /// A request for one key.
    fn key_request(&self, key: &str, share: Share) -> Request {
        Request {
            keys: vec![key.to_string()],
            several: false,
            share,
            ctx: self.context(),
        }
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
        self.hold(key, opts, Share::Exclusive, None).await
    }

    /// The read side of a read-write lock on `key`: held beside other
    /// readers, never beside the writer ([`Client::write_lock`]). Waits as
    /// [`Client::lock`] does, in the same queue: readers behind a waiting
    /// writer wait behind it. The guard has its own fence and watchdog.
    pub async fn read_lock(&self, key: &str, opts: &LockOptions) -> Result<Guard, Error> {
        self.hold(key, opts, Share::Read, None).await
    }

    /// [`Client::read_lock`] at once, or [`Error::WouldBlock`].
    pub async fn try_read_lock(&self, key: &str, opts: &LockOptions) -> Result<Guard, Error> {
        self.try_hold(key, opts, Share::Read, None).await
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
            owner: self.inner.owners.next(),
            holds: Arc::default(),
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
        let req = self.key_request(key, Share::Exclusive);
        Ok(self.guard(
            &req,
            owner.to_string(),
            fence,
            opts,
            ttl_ms,
            deadline,
            Owned::Alone,
        ))
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

    /// The owner a lock call holds under: a new one, or its read-write
    /// handle's.
    fn owner_for(&self, handle: Option<&RwLock>) -> (String, Owned) {
        match handle {
            Some(rw) => (rw.owner.clone(), Owned::Shared(rw.holds.clone())),
            None => (self.inner.owners.next(), Owned::Alone),
        }
    }

    async fn try_hold(
        &self,
        key: &str,
        opts: &LockOptions,
        share: Share,
        handle: Option<&RwLock>,
    ) -> Result<Guard, Error> {
        let req = self.key_request(key, share);
        let (guard, _) = self.try_request(&req, opts, handle).await?;
        Ok(guard)
    }

    /// A try of any request: the guard and the fences, in key order.
    async fn try_request(
        &self,
        req: &Request,
        opts: &LockOptions,
        handle: Option<&RwLock>,
    ) -> Result<(Guard, Vec<u64>), Error> {
        let key = req.key();
        let ttl_ms = opts.ttl_ms()?;
        let (owner, owned) = self.owner_for(handle);
        let command = req.command(&owner, ttl_ms, opts.is_ephemeral(), None);
        // The hold of an ephemeral try is bound to the connection it is
        // granted on: one of its own, kept for the hold's life.
        let bound = match opts.is_ephemeral() {
            true => Some(self.inner.server.conn.bound(None).await?),
            false => None,
        };
        // Armed from the send until a guard holds the lock: a try dropped
        // with its reply in flight, or whose reply did not come in time,
        // gives back what the server may grant after all, on the shared
        // connection behind the acquire (an ephemeral hold's connection
        // closes instead, which ends it).
        let mut pending =
            Pending::new(req.ctx.clone(), key, &owner, owned.clone(), opts.ttl()).await;
        let sent = Instant::now();
        let (reply, bound) = match bound {
            Some((mut link, closed)) => {
                let reply = req.send(&mut link, &command).await;
                (reply.map_err(Error::from_redis), Some((link, closed)))
            }
            None => (
                req.send_shared(&self.inner.server.conn, &command).await,
                None,
            ),
        };
        let fences = match reply {
            Ok(Some(fences)) => fences,
            Ok(None) => {
                pending.disarm();
                return Err(self.why_not_obtained(&req.keys).await);
            }
            Err(err) => {
                if !may_have_granted(&err) {
                    pending.disarm();
                }
                return Err(err);
            }
        };
        pending.disarm();
        let deadline = deadline(sent, opts.ttl());
        let fence = highest(&fences);
        let mut guard = self.guard(req, owner.clone(), fence, opts, ttl_ms, deadline, owned);
        if let Some((link, closed)) = bound {
            guard.bind(link, closed);
        }
        Ok((guard, fences))
    }

    /// Why a try was answered nil: another owner holds the lock
    /// ([`Error::WouldBlock`]), or it is free and the server is in its
    /// quarantine ([`Error::Quarantine`]). Anything unclear (a transport
    /// error, a cluster's per-node `INFO`) counts as held.
    async fn why_not_obtained(&self, keys: &[String]) -> Error {
        let conn = &self.inner.server.conn;
        for key in keys {
            let info = conn
                .query::<redis::Value>(redis::cmd("LOCK.INFO").arg(key))
                .await;
            if !matches!(info, Ok(redis::Value::Nil)) {
                return Error::WouldBlock;
            }
        }
        match conn.query::<String>(redis::cmd("INFO").arg("lock")).await {
            Ok(stats) if quarantine_left(&stats) => Error::Quarantine,
            _ => Error::WouldBlock,
        }
    }

    /// A hold of `share`, waiting as [`Client::lock`] describes. A grant
    /// whose confirming renew finds the lock gone (`NOTOWNER`: a failover
    /// between the grant and the renew, a `DEL`) was not a hold: the call
    /// waits again with what is left of its wait.
    async fn hold(
        &self,
        key: &str,
        opts: &LockOptions,
        share: Share,
        handle: Option<&RwLock>,
    ) -> Result<Guard, Error> {
        let req = self.key_request(key, share);
        let (guard, _) = self.hold_request(&req, opts, handle).await?;
        Ok(guard)
    }

    /// A wait of any request: the guard and the fences, in key order.
    async fn hold_request(
        &self,
        req: &Request,
        opts: &LockOptions,
        handle: Option<&RwLock>,
    ) -> Result<(Guard, Vec<u64>), Error> {
        let ttl_ms = opts.ttl_ms()?;
        opts.wait_ms()?;
        let (owner, owned) = self.owner_for(handle);
        // A wait too long for the clock to add is no limit at all.
        let until = opts
            .wait_limit()
            .and_then(|wait| Instant::now().checked_add(wait));
        let mut first = true;
        loop {
            let left = until.map(|until| until.saturating_duration_since(Instant::now()));
            if !first && left == Some(Duration::ZERO) {
                return Err(Error::TimedOut);
            }
            first = false;
            let round = Round {
                req,
                opts,
                owner: &owner,
                owned: &owned,
                ttl_ms,
                wait: left,
            };
            if let Some(held) = self.hold_once(round).await? {
                return Ok(held);
            }
        }
    }

    /// One wait in the server's queue: the guard, or `None` when the grant
    /// was gone before its confirming renew.
    async fn hold_once(&self, round: Round<'_>) -> Result<Option<(Guard, Vec<u64>)>, Error> {
        let Round {
            req,
            opts,
            owner,
            owned,
            ttl_ms,
            wait,
        } = round;
        let wait_ms = match wait {
            None => 0,
            // `WAIT 0` means "forever" to the server: a zero wait is 1 ms.
            // The server takes waits up to 2^40 ms.
            Some(wait) => u64::try_from(wait.as_millis())
                .unwrap_or(u64::MAX)
                .clamp(1, 1 << 40),
        };
        let limit = wait.map(|wait| wait.saturating_add(WAIT_MARGIN));
        let (mut link, closed) = if opts.is_ephemeral() {
            let (link, closed) = self.inner.server.conn.bound(limit).await?;
            (link, Some(closed))
        } else {
            (self.inner.server.conn.dedicated(limit).await?, None)
        };
        // Armed until a guard holds the lock: dropping this future, giving
        // up on the server's answer, or failing to confirm a grant releases
        // what may have been granted.
        let key = req.key();
        let mut pending =
            Pending::new(req.ctx.clone(), key, owner, owned.clone(), opts.ttl()).await;
        let sent = Instant::now();
        let command = req.command(owner, ttl_ms, opts.is_ephemeral(), Some(wait_ms));
        let reply = req.send(&mut link, &command).await;
        // A wait's link is done; an ephemeral hold's is kept for the hold.
        let bound = closed.map(|closed| (link, closed));
        let fences = match reply {
            Ok(Some(fences)) => fences,
            Ok(None) => {
                pending.disarm();
                return Err(Error::TimedOut);
            }
            Err(err) if err.is_timeout() => return Err(Error::TimedOut),
            Err(err) => {
                let err = Error::from_redis(err);
                if !may_have_granted(&err) {
                    pending.disarm();
                }
                return Err(err);
            }
        };
        let deadline = if sent.elapsed() > opts.ttl() / 3 {
            // The lease ends at least `ttl` after the grant, but the send of
            // the request tells little of when that was (after a wait longer
            // than the ttl, that lease would look over already). A renew
            // sent now pins it from its own send time. It is done before
            // the guard exists: a watchdog started on the stale deadline
            // would declare the lock lost before the renew came back.
            let renewed = Instant::now();
            match req.ctx.backend.renew(key, owner, ttl_ms).await {
                Ok(()) => {}
                Err(Error::NotOwner) => {
                    // Nothing of ours is there to release.
                    pending.disarm();
                    return Ok(None);
                }
                Err(err) => return Err(err),
            }
            deadline(renewed, opts.ttl())
        } else {
            // The grant came between the send and now: the lease runs at
            // least `ttl` from the send.
            deadline(sent, opts.ttl())
        };
        pending.disarm();
        let fence = highest(&fences);
        let mut guard = self.guard(
            req,
            owner.to_string(),
            fence,
            opts,
            ttl_ms,
            deadline,
            owned.clone(),
        );
        if let Some((link, closed)) = bound {
            guard.bind(link, closed);
        }
        Ok(Some((guard, fences)))
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

    #[allow(clippy::too_many_arguments)]
    fn guard(
        &self,
        req: &Request,
        owner: String,
        fence: u64,
        opts: &LockOptions,
        ttl_ms: u64,
        deadline: Instant,
        owned: Owned,
    ) -> Guard {
        Guard::start(
            req.ctx.clone(),
            req.key().to_string(),
            owner,
            fence,
            opts.ttl(),
            ttl_ms,
            deadline,
            opts.has_watchdog(),
            owned,
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
        self.context_on(self.inner.server.clone())
    }

    /// The same, with renewals and releases going to `backend` (the keys
    /// of a hold on several).
    fn context_on(&self, backend: Arc<dyn Backend>) -> Context {
        Context {
            backend,
            tasks: self.inner.tasks.clone(),
            runtime: tokio::runtime::Handle::current(),
        }
    }
}

/// A read-write lock on one key as one handle ([`Client::rw_lock`]):
/// readers share it, a writer holds it alone. Both sides of one handle (and
/// its clones) hold under one owner, so the writer may take the read side
/// (a reentry of its hold, granted at once), and a reader asking for the
/// write side gets [`Error::Upgrade`] at once instead of waiting behind its
/// own read hold. Each call gives its own [`Guard`]; the handle's last
/// guard to go gives the owner's holds back.
#[derive(Clone)]
pub struct RwLock {
    client: Client,
    key: String,
    owner: String,
    holds: Arc<HandleHolds>,
}

impl RwLock {
    /// The read side, waiting as [`Client::lock`] does.
    pub async fn read(&self, opts: &LockOptions) -> Result<Guard, Error> {
        self.client
            .hold(&self.key, opts, Share::Read, Some(self))
            .await
    }

    /// The read side at once, or [`Error::WouldBlock`].
    pub async fn try_read(&self, opts: &LockOptions) -> Result<Guard, Error> {
        self.client
            .try_hold(&self.key, opts, Share::Read, Some(self))
            .await
    }

    /// The write side, waiting as [`Client::lock`] does;
    /// [`Error::Upgrade`] at once while this handle holds the read side.
    pub async fn write(&self, opts: &LockOptions) -> Result<Guard, Error> {
        self.client
            .hold(&self.key, opts, Share::Exclusive, Some(self))
            .await
    }

    /// The write side at once, [`Error::WouldBlock`], or [`Error::Upgrade`].
    pub async fn try_write(&self, opts: &LockOptions) -> Result<Guard, Error> {
        self.client
            .try_hold(&self.key, opts, Share::Exclusive, Some(self))
            .await
    }

    pub fn key(&self) -> &str {
        &self.key
    }
}

/// Whether a failed acquire may have been granted all the same: a reply
/// lost in transit or given up on may carry a grant; an error reply from
/// the server never does.
fn may_have_granted(err: &Error) -> bool {
    match err {
        Error::Transport(err) => err.code().is_none(),
        _ => false,
    }
}

/// The most keys one `LOCK.MACQUIRE` names (the server's bound).
const MAX_KEYS: usize = 64;

/// What one lock call asks the server for: one key (`LOCK.ACQUIRE`) or
/// several at once (`LOCK.MACQUIRE`), in which share, and where its
/// guard's renewals and releases go (the key, or all the keys together).
struct Request {
    /// Never empty.
    keys: Vec<String>,
    several: bool,
    share: Share,
    ctx: Context,
}

impl Request {
    /// The key a guard is named by: the first.
    fn key(&self) -> &str {
        self.keys.first().map_or("", String::as_str)
    }

    fn command(&self, owner: &str, ttl_ms: u64, ephemeral: bool, wait_ms: Option<u64>) -> Cmd {
        if self.several {
            conn::macquire(&self.keys, owner, ttl_ms, self.share, ephemeral, wait_ms)
        } else {
            conn::acquire(self.key(), owner, ttl_ms, self.share, ephemeral, wait_ms)
        }
    }

    /// Sends the acquire on `link`: the fences in key order, or `None`
    /// (not granted).
    async fn send(&self, link: &mut Link, command: &Cmd) -> redis::RedisResult<Option<Vec<u64>>> {
        if self.several {
            link.query(command).await
        } else {
            let fence: Option<u64> = link.query(command).await?;
            Ok(fence.map(|fence| vec![fence]))
        }
    }

    /// [`Request::send`] on the shared connection.
    async fn send_shared(&self, conn: &Conn, command: &Cmd) -> Result<Option<Vec<u64>>, Error> {
        if self.several {
            conn.query(command).await
        } else {
            let fence: Option<u64> = conn.query(command).await?;
            Ok(fence.map(|fence| vec![fence]))
        }
    }
}

/// A guard's own fence: the highest of its keys' (every one issued by the
/// same server, so above every fence issued before the grant).
fn highest(fences: &[u64]) -> u64 {
    fences.iter().copied().max().unwrap_or(0)
}

/// One round of [`Client::hold_request`].
struct Round<'a> {
    req: &'a Request,
    opts: &'a LockOptions,
    owner: &'a str,
    owned: &'a Owned,
    ttl_ms: u64,
    wait: Option<Duration>,
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
        self.acquire_permits(1, opts).await
    }

    /// Takes a permit at once, or [`Error::WouldBlock`].
    pub async fn try_acquire(&self, opts: &LockOptions) -> Result<Guard, Error> {
        self.try_acquire_permits(1, opts).await
    }

    /// Takes `permits` of the semaphore's permits (1 to its limit) as one
    /// hold: one guard, one fence, one lease, released together. Waits in
    /// the server's queue, first come first served: a request for more
    /// permits than are free waits at the head of the queue, and smaller
    /// requests behind it wait behind it (a big request is never starved).
    pub async fn acquire_permits(&self, permits: u32, opts: &LockOptions) -> Result<Guard, Error> {
        let share = self.share(permits)?;
        self.client.hold(&self.key, opts, share, None).await
    }

    /// [`Semaphore::acquire_permits`] at once, or [`Error::WouldBlock`]
    /// (too few permits free, or a request waiting ahead).
    pub async fn try_acquire_permits(
        &self,
        permits: u32,
        opts: &LockOptions,
    ) -> Result<Guard, Error> {
        let share = self.share(permits)?;
        self.client.try_hold(&self.key, opts, share, None).await
    }

    fn share(&self, permits: u32) -> Result<Share, Error> {
        if !(1..=self.limit).contains(&permits) {
            return Err(Error::InvalidOptions(
                "a semaphore's request takes 1 to its limit of permits",
            ));
        }
        Ok(Share::Permit {
            limit: self.limit,
            permits,
        })
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn limit(&self) -> u32 {
        self.limit
    }
}

/// Whether `INFO lock` shows a quarantine running (`lock_quarantine_ms`
/// above 0).
fn quarantine_left(stats: &str) -> bool {
    stats
        .lines()
        .filter_map(|line| line.trim().strip_prefix("lock_quarantine_ms:"))
        .any(|ms| ms.parse::<u64>().is_ok_and(|ms| ms > 0))
}
