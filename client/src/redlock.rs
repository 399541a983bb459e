//! Redlock: one lock over N independent servers (N odd, at least 3), each
//! running the module, with fences that rise from holder to holder.
//!
//! # Acquiring
//! One round sends `LOCK.ACQUIRE key owner ttl` to every server at once,
//! each with a short timeout. The lock is ours when a majority (N/2 + 1)
//! granted it and time is left: `validity = ttl − elapsed − drift > 0`,
//! where drift is 1 % of the ttl + 2 ms. Otherwise the round releases on
//! every server and `lock` tries again after a random delay.
//!
//! # Fences that rise
//! Each server issues its own fences. The client takes the highest fence the
//! majority returned, `F`, and raises each of those servers to it with
//! `LOCK.FENCE key owner F`; it hands `F` out only once a majority has
//! answered that round. Then every server of that majority will issue only
//! fences above `F`. The next holder's majority shares at least one server
//! with it, and that server granted the next holder only after our hold on
//! it ended — so after our `FENCE` reached it — so the next holder's
//! highest fence is above `F`. That takes no clock assumption: no two
//! servers need to agree on time.
//!
//! What it still assumes: a server of the majority must not forget its raised
//! counter. The module keeps it in the RDB and the AOF (with the RDB
//! preamble, Redis's default); a server restarted without its data forgets
//! it, and falls back to its clock floor (`unix_ms × 2^10`), which is above
//! `F` only if its clock is not behind the others' by more than the time it
//! was down. Set `lock.max-ttl` on every Redlock server: after a restart the
//! server grants nothing for that long (its quarantine), which is what keeps
//! mutual exclusion across a restart that lost data (the Redlock design's
//! "delayed restart"), and gives its clock that much time to pass fences
//! issued before.
//!
//! A server whose clock lags the highest by more than an hour refuses the
//! raise (`min-fence` is bounded by its clock + 1 h): it counts as a server
//! that did not answer.
//!
//! # Cancelling
//! Dropping a `lock` or `try_lock` future before it returns (a
//! `tokio::time::timeout`, a `select!` branch that lost) gives the lock up:
//! the client sends `LOCK.RELEASE key owner ALL` to every server in the
//! background, without blocking the drop. Each goes on the link its
//! `LOCK.ACQUIRE` went on, after it, so a server that grants only after the
//! cancel (a slow one, whose reply had not come back) is released too.
//! Nothing stays held for the ttl, and other clients can get a majority at
//! once.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use rand::Rng;
use redis::IntoConnectionInfo;
use tokio::time::{timeout, Instant};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::client::Owners;
use crate::conn::{self, Conn, Share};
use crate::error::Error;
use crate::guard::{Backend, BoxFuture, Context, Guard, Owned, Pending};
use crate::options::{deadline, LockOptions};

/// Options of a [`Redlock`].
#[derive(Debug, Clone)]
pub struct RedlockOptions {
    /// How long each server gets to answer one command (default 50 ms):
    /// small against the ttl, so a dead server costs little.
    pub server_timeout: Duration,
    /// Between two rounds of `lock`, a random delay up to this (default
    /// 100 ms), so that contenders stop colliding.
    pub retry_delay: Duration,
    /// Test only: skip the `LOCK.FENCE` round, and hand out the highest fence
    /// the majority returned as it is. Fences may then go down from one
    /// holder to the next; the tests show it.
    #[doc(hidden)]
    pub skip_fence_round: bool,
}

impl Default for RedlockOptions {
    fn default() -> Self {
        RedlockOptions {
            server_timeout: Duration::from_millis(50),
            retry_delay: Duration::from_millis(100),
            skip_fence_round: false,
        }
    }
}

/// A lock over N independent servers; see the module docs for the design.
/// Cheap to clone.
#[derive(Clone)]
pub struct Redlock {
    inner: Arc<Inner>,
}

struct Inner {
    servers: Arc<Servers>,
    owners: Owners,
    tasks: TaskTracker,
}

/// The servers, as one [`Backend`] that needs a majority.
struct Servers {
    nodes: Vec<Conn>,
    quorum: usize,
    options: RedlockOptions,
}

impl Redlock {
    /// A Redlock over `servers` (odd count, at least 3), default options.
    pub fn new<I: IntoConnectionInfo>(
        servers: impl IntoIterator<Item = I>,
    ) -> Result<Redlock, Error> {
        Redlock::with_options(servers, RedlockOptions::default())
    }

    pub fn with_options<I: IntoConnectionInfo>(
        servers: impl IntoIterator<Item = I>,
        options: RedlockOptions,
    ) -> Result<Redlock, Error> {
        Redlock::build(servers, options, TaskTracker::new())
    }

    pub(crate) fn build<I: IntoConnectionInfo>(
        servers: impl IntoIterator<Item = I>,
        options: RedlockOptions,
        tasks: TaskTracker,
    ) -> Result<Redlock, Error> {
        let nodes = servers
            .into_iter()
            .map(|info| Conn::single(info, options.server_timeout, options.server_timeout))
            .collect::<Result<Vec<_>, _>>()?;
        if nodes.len() < 3 || nodes.len() % 2 == 0 {
            return Err(Error::InvalidOptions(
                "Redlock needs an odd number of servers, at least 3",
            ));
        }
        let quorum = nodes.len() / 2 + 1;
        Ok(Redlock {
            inner: Arc::new(Inner {
                servers: Arc::new(Servers {
                    nodes,
                    quorum,
                    options,
                }),
                owners: Owners::new(),
                tasks,
            }),
        })
    }

    /// The majority: N / 2 + 1.
    pub fn quorum(&self) -> usize {
        self.inner.servers.quorum
    }

    /// One round: the lock if a majority grants it in time, else
    /// [`Error::NoQuorum`] (after releasing on every server).
    ///
    /// Cancelling it (dropping the future) releases on every server in the
    /// background, grants still in flight included.
    pub async fn try_lock(&self, key: &str, opts: &LockOptions) -> Result<Guard, Error> {
        let ttl_ms = opts.ttl_ms()?;
        refuse_ephemeral(opts)?;
        let owner = self.inner.owners.next();
        let servers = &self.inner.servers;
        // Armed until a guard holds the lock or the round has released.
        // Each server's release goes on the link its acquire went on, after
        // it, so it also undoes a grant whose reply had not come back yet.
        let mut pending = Pending::new(self.context(), key, &owner, Owned::Alone, opts.ttl()).await;
        let round = servers.acquire_round(key, &owner, opts.ttl(), ttl_ms).await;
        match round {
            Ok((fence, deadline)) => {
                pending.disarm();
                Ok(self.guard(key, owner.clone(), fence, opts, ttl_ms, deadline))
            }
            Err(err) => {
                servers.release_everywhere(key, &owner).await;
                pending.disarm();
                Err(err)
            }
        }
    }

    /// Rounds until a majority grants the lock, or the options' wait ends
    /// ([`Error::TimedOut`]); a random delay between rounds. Cancelling it
    /// releases as [`Redlock::try_lock`] does.
    pub async fn lock(&self, key: &str, opts: &LockOptions) -> Result<Guard, Error> {
        refuse_ephemeral(opts)?;
        let until = opts.wait_limit().map(|wait| Instant::now() + wait);
        loop {
            match self.try_lock(key, opts).await {
                Err(Error::NoQuorum { .. } | Error::Transport(_)) => {}
                other => return other,
            }
            let max = self
                .inner
                .servers
                .options
                .retry_delay
                .max(Duration::from_millis(1));
            let pause = rand::thread_rng().gen_range(Duration::ZERO..max);
            if until.is_some_and(|until| Instant::now() + pause >= until) {
                return Err(Error::TimedOut);
            }
            tokio::time::sleep(pause).await;
        }
    }

    /// Runs `f` under the lock and releases it after; see
    /// [`crate::Client::with_lock`].
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
            Owned::Alone,
        )
    }

    /// Where guards of this Redlock live and run their background tasks.
    fn context(&self) -> Context {
        Context {
            backend: self.inner.servers.clone(),
            tasks: self.inner.tasks.clone(),
            runtime: tokio::runtime::Handle::current(),
        }
    }

    /// Background tasks alive now (watchdogs, releases after a drop). For tests.
    #[doc(hidden)]
    pub fn background_tasks(&self) -> usize {
        self.inner.tasks.len()
    }
}

/// Redlock holds on several servers; an ephemeral hold is bound to one
/// connection, and a hold that ends whenever one of N connections drops is
/// not one Redlock can keep: refused, never silently an ordinary hold.
fn refuse_ephemeral(opts: &LockOptions) -> Result<(), Error> {
    if opts.is_ephemeral() {
        return Err(Error::InvalidOptions(
            "Redlock does not take ephemeral holds: use a client of one server",
        ));
    }
    Ok(())
}

impl Servers {
    /// Sends `cmd` to every server at once, each bounded by the server
    /// timeout; the replies in server order.
    async fn everywhere<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
    ) -> Vec<Result<T, Error>> {
        let limit = self.options.server_timeout;
        join_all(self.nodes.iter().map(|node| async move {
            match timeout(limit, node.query::<T>(cmd)).await {
                Ok(reply) => reply,
                Err(_) => Err(Error::TimedOut),
            }
        }))
        .await
    }

    /// Acquire on all, then (unless skipped) raise the majority to the
    /// highest fence. Returns the fence and the local deadline.
    async fn acquire_round(
        &self,
        key: &str,
        owner: &str,
        ttl: Duration,
        ttl_ms: u64,
    ) -> Result<(u64, Instant), Error> {
        let start = Instant::now();
        // Measured from the send: a server may have granted right then.
        let valid_until = deadline(start, ttl);
        let replies = self
            .everywhere::<Option<u64>>(&conn::acquire(
                key,
                owner,
                ttl_ms,
                Share::Exclusive,
                false,
                None,
            ))
            .await;
        if let Some(Err(Error::ModuleMissing)) = replies.iter().find(|r| r.is_err()) {
            return Err(Error::ModuleMissing);
        }
        let granted: Vec<(usize, u64)> = replies
            .iter()
            .enumerate()
            .filter_map(|(i, reply)| match reply {
                Ok(Some(fence)) => Some((i, *fence)),
                _ => None,
            })
            .collect();
        let no_quorum = |granted: usize| Error::NoQuorum {
            granted,
            needed: self.quorum,
        };
        if granted.len() < self.quorum || Instant::now() >= valid_until {
            return Err(no_quorum(granted.len()));
        }
        let highest = granted.iter().map(|&(_, f)| f).max().unwrap_or(0);
        if !self.options.skip_fence_round {
            let limit = self.options.server_timeout;
            let cmd = conn::fence(key, owner, highest);
            let raised = join_all(granted.iter().map(|&(i, _)| {
                let cmd = &cmd;
                async move { timeout(limit, self.nodes[i].query::<u64>(cmd)).await }
            }))
            .await;
            let confirmed = raised
                .iter()
                .filter(|reply| matches!(reply, Ok(Ok(f)) if *f >= highest))
                .count();
            if confirmed < self.quorum {
                return Err(no_quorum(confirmed));
            }
        }
        if Instant::now() >= valid_until {
            return Err(no_quorum(granted.len()));
        }
        Ok((highest, valid_until))
    }

    /// `LOCK.RELEASE key owner ALL` on every server (best effort).
    async fn release_everywhere(&self, key: &str, owner: &str) {
        let _ = self
            .everywhere::<u64>(&conn::release(key, owner, true))
            .await;
    }

    /// A command that must succeed on a majority: the largest integer
    /// reply; `NOTOWNER` when so many refused that no majority can agree.
    fn majority(&self, replies: Vec<Result<u64, Error>>) -> Result<u64, Error> {
        let ok: Vec<u64> = replies
            .iter()
            .filter_map(|r| r.as_ref().ok().copied())
            .collect();
        let refused = replies
            .iter()
            .filter(|r| matches!(r, Err(Error::NotOwner)))
            .count();
        if ok.len() >= self.quorum {
            return Ok(ok.iter().copied().max().unwrap_or(0));
        }
        if refused > self.nodes.len() - self.quorum {
            return Err(Error::NotOwner);
        }
        Err(Error::NoQuorum {
            granted: ok.len(),
            needed: self.quorum,
        })
    }
}

impl Backend for Servers {
    fn renew<'a>(&'a self, key: &'a str, owner: &'a str, ttl_ms: u64) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let replies = self
                .everywhere::<u64>(&conn::renew(key, owner, ttl_ms))
                .await;
            self.majority(replies).map(|_| ())
        })
    }

    fn reenter<'a>(&'a self, key: &'a str, owner: &'a str, ttl_ms: u64) -> BoxFuture<'a, u64> {
        Box::pin(async move {
            let replies = self
                .everywhere::<u64>(&conn::reenter(key, owner, ttl_ms))
                .await;
            self.majority(replies)
        })
    }

    /// Goes to every server; succeeds if any still held it (a minority may
    /// have lost it already: their lease ended or they restarted).
    fn release<'a>(&'a self, key: &'a str, owner: &'a str, all: bool) -> BoxFuture<'a, u64> {
        Box::pin(async move {
            let replies = self
                .everywhere::<u64>(&conn::release(key, owner, all))
                .await;
            let left = replies
                .iter()
                .filter_map(|r| r.as_ref().ok().copied())
                .max();
            match left {
                Some(left) => Ok(left),
                None if replies.iter().all(|r| matches!(r, Err(Error::NotOwner))) => {
                    Err(Error::NotOwner)
                }
                None => Err(Error::NoQuorum {
                    granted: 0,
                    needed: self.quorum,
                }),
            }
        })
    }
}
