//! Connections: one shared, multiplexed link per server (or per cluster),
//! opened lazily and opened again after it broke; and links of their own for
//! commands that park on the server (`LOCK.ACQUIRE … WAIT`). Behind Sentinel,
//! each new link asks the Sentinels where the master is now.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{
    AsyncConnectionConfig, Cmd, ConnectionInfo, FromRedisValue, IntoConnectionInfo, PushInfo,
    PushKind,
};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tokio::sync::Mutex;

use crate::error::Error;

/// Where the lock commands go.
#[derive(Clone)]
enum Target {
    Single(Box<redis::Client>),
    Cluster(Vec<ConnectionInfo>),
    /// The master Sentinels know by `name`.
    Sentinel {
        sentinels: Vec<ConnectionInfo>,
        name: String,
    },
}

/// A live link to a server or a cluster; cheap to clone (multiplexed).
#[derive(Clone)]
pub(crate) enum Link {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Link {
    pub(crate) async fn query<T: FromRedisValue>(&mut self, cmd: &Cmd) -> redis::RedisResult<T> {
        match self {
            Link::Single(conn) => cmd.query_async(conn).await,
            Link::Cluster(conn) => cmd.query_async(conn).await,
        }
    }
}

/// A server (or cluster) and its shared link.
pub(crate) struct Conn {
    target: Target,
    /// How long one reply may take on the shared link.
    response_timeout: Duration,
    connect_timeout: Duration,
    shared: Mutex<Option<Link>>,
}

impl Conn {
    pub(crate) fn single(
        info: impl IntoConnectionInfo,
        response_timeout: Duration,
        connect_timeout: Duration,
    ) -> Result<Conn, Error> {
        Ok(Conn::new(
            Target::Single(Box::new(redis::Client::open(info)?)),
            response_timeout,
            connect_timeout,
        ))
    }

    pub(crate) fn cluster<I: IntoConnectionInfo>(
        nodes: impl IntoIterator<Item = I>,
        response_timeout: Duration,
        connect_timeout: Duration,
    ) -> Result<Conn, Error> {
        let nodes = nodes
            .into_iter()
            .map(IntoConnectionInfo::into_connection_info)
            .collect::<Result<Vec<_>, _>>()?;
        if nodes.is_empty() {
            return Err(Error::InvalidOptions("a cluster needs at least one node"));
        }
        Ok(Conn::new(
            Target::Cluster(nodes),
            response_timeout,
            connect_timeout,
        ))
    }

    pub(crate) fn sentinel<I: IntoConnectionInfo>(
        sentinels: impl IntoIterator<Item = I>,
        name: &str,
        response_timeout: Duration,
        connect_timeout: Duration,
    ) -> Result<Conn, Error> {
        let sentinels = sentinels
            .into_iter()
            .map(IntoConnectionInfo::into_connection_info)
            .collect::<Result<Vec<_>, _>>()?;
        if sentinels.is_empty() {
            return Err(Error::InvalidOptions("Sentinel discovery needs a Sentinel"));
        }
        Ok(Conn::new(
            Target::Sentinel {
                sentinels,
                name: name.to_string(),
            },
            response_timeout,
            connect_timeout,
        ))
    }

    fn new(target: Target, response_timeout: Duration, connect_timeout: Duration) -> Conn {
        Conn {
            target,
            response_timeout,
            connect_timeout,
            shared: Mutex::new(None),
        }
    }

    /// Sends `cmd` on the shared link. A link that broke is forgotten, so
    /// the next call opens a new one (a server restarted, `CLIENT KILL`).
    pub(crate) async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, Error> {
        let mut link = self.shared_link().await?;
        let reply = link.query(cmd).await;
        if let Err(err) = &reply {
            let broken =
                err.is_io_error() || err.is_connection_dropped() || err.is_unrecoverable_error();
            // Behind Sentinel, a demoted master answers READONLY, and one cut
            // off from its replicas NOREPLICAS: ask the Sentinels again.
            let moved = matches!(self.target, Target::Sentinel { .. })
                && matches!(err.code(), Some("READONLY" | "NOREPLICAS"));
            if broken || moved {
                *self.shared.lock().await = None;
            }
        }
        reply.map_err(Error::from_redis)
    }

    async fn shared_link(&self) -> Result<Link, Error> {
        let mut shared = self.shared.lock().await;
        if let Some(link) = shared.as_ref() {
            return Ok(link.clone());
        }
        let link = self.open(Some(self.response_timeout)).await?;
        *shared = Some(link.clone());
        Ok(link)
    }

    /// A new link of its own, closed when dropped, whose replies may take
    /// up to `response_timeout` (`None`: forever). A parked command blocks
    /// whatever is pipelined behind it on its link, so waits never share.
    pub(crate) async fn dedicated(
        &self,
        response_timeout: Option<Duration>,
    ) -> Result<Link, Error> {
        self.open(response_timeout).await
    }

    /// A link of its own to the one server, for an ephemeral hold: the
    /// server ends the hold when this connection closes, so it stays open
    /// as long as the hold, and [`Closed`] says when it closed. It speaks
    /// RESP3, whose client reports the close. Sentinel and cluster clients
    /// reconnect on their own, so they are refused.
    pub(crate) async fn bound(
        &self,
        response_timeout: Option<Duration>,
    ) -> Result<(Link, Closed), Error> {
        let Target::Single(client) = &self.target else {
            return Err(Error::InvalidOptions(
                "ephemeral holds need a client of one server, not Sentinel or a cluster",
            ));
        };
        let info = client.get_connection_info().clone();
        let settings = info
            .redis_settings()
            .clone()
            .set_protocol(redis::ProtocolVersion::RESP3);
        let client = redis::Client::open(info.set_redis_settings(settings))?;
        let (tx, rx) = unbounded_channel();
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(response_timeout)
            .set_push_sender(tx);
        let conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        Ok((Link::Single(conn), Closed(rx)))
    }

    async fn open(&self, response_timeout: Option<Duration>) -> Result<Link, Error> {
        match &self.target {
            Target::Single(client) => Ok(Link::Single(
                self.open_single(client, response_timeout).await?,
            )),
            Target::Sentinel { sentinels, name } => {
                let mut last = None;
                for sentinel in sentinels {
                    match self.master_via(sentinel, name, response_timeout).await {
                        Ok(conn) => return Ok(Link::Single(conn)),
                        Err(err) => last = Some(err),
                    }
                }
                Err(last.unwrap_or(Error::NoMaster("no Sentinel")))
            }
            Target::Cluster(nodes) => {
                // The cluster client wants a bound: a very long one stands
                // for "forever".
                let timeout = response_timeout.unwrap_or(Duration::from_secs(30 * 24 * 3600));
                let client = ClusterClient::builder(nodes.clone())
                    .connection_timeout(self.connect_timeout)
                    .response_timeout(timeout)
                    .build()?;
                Ok(Link::Cluster(client.get_async_connection().await?))
            }
        }
    }
}

impl Conn {
    async fn open_single(
        &self,
        client: &redis::Client,
        response_timeout: Option<Duration>,
    ) -> Result<MultiplexedConnection, Error> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(response_timeout);
        Ok(client
            .get_multiplexed_async_connection_with_config(&config)
            .await?)
    }

    /// Asks `sentinel` where the master `name` is, connects there and checks
    /// with `ROLE` that it is a master (a Sentinel that has not yet seen a
    /// failover may name the old one, now a replica).
    async fn master_via(
        &self,
        sentinel: &ConnectionInfo,
        name: &str,
        response_timeout: Option<Duration>,
    ) -> Result<MultiplexedConnection, Error> {
        let asked = redis::Client::open(sentinel.clone())?;
        let mut conn = self
            .open_single(&asked, Some(self.response_timeout))
            .await?;
        let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(name)
            .query_async(&mut conn)
            .await?;
        let (host, port) =
            addr.ok_or(Error::NoMaster("the Sentinel knows no master by that name"))?;
        let master = redis::Client::open(format!("redis://{host}:{port}/"))?;
        let mut conn = self.open_single(&master, response_timeout).await?;
        let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut conn).await?;
        match role.first() {
            Some(redis::Value::BulkString(word)) if word == b"master" => Ok(conn),
            _ => Err(Error::NoMaster("the server Sentinel named is not a master")),
        }
    }
}

/// Tells when a [`Conn::bound`] link's connection closed.
pub(crate) struct Closed(UnboundedReceiver<PushInfo>);

impl Closed {
    /// Completes once the connection has closed.
    pub(crate) async fn wait(&mut self) {
        while let Some(push) = self.0.recv().await {
            if push.kind == PushKind::Disconnection {
                return;
            }
        }
    }
}

/// What a lock call asks for: the lock alone, or a share of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Share {
    /// An exclusive hold: a mutex, or a read-write lock's write side.
    Exclusive,
    /// A shared hold without a limit: a read-write lock's read side.
    Read,
    /// Permits of a semaphore: this many of its `limit`, as one hold.
    Permit { limit: u32, permits: u32 },
}

/// `LOCK.ACQUIRE key owner ttl-ms [SHARED [LIMIT n]] [WAIT timeout-ms]`
pub(crate) fn acquire(
    key: &str,
    owner: &str,
    ttl_ms: u64,
    share: Share,
    ephemeral: bool,
    wait_ms: Option<u64>,
) -> Cmd {
    let mut cmd = redis::cmd("LOCK.ACQUIRE");
    cmd.arg(key).arg(owner).arg(ttl_ms);
    options(&mut cmd, share, ephemeral, wait_ms);
    cmd
}

/// `LOCK.MACQUIRE numkeys key [key ...] owner ttl-ms [SHARED [LIMIT n [PERMITS k]]]
/// [EPHEMERAL] [WAIT timeout-ms]`: every key or none, in one step.
pub(crate) fn macquire(
    keys: &[String],
    owner: &str,
    ttl_ms: u64,
    share: Share,
    ephemeral: bool,
    wait_ms: Option<u64>,
) -> Cmd {
    let mut cmd = redis::cmd("LOCK.MACQUIRE");
    cmd.arg(keys.len()).arg(keys).arg(owner).arg(ttl_ms);
    options(&mut cmd, share, ephemeral, wait_ms);
    cmd
}

/// The options `LOCK.ACQUIRE` and `LOCK.MACQUIRE` share, after the ttl.
fn options(cmd: &mut Cmd, share: Share, ephemeral: bool, wait_ms: Option<u64>) {
    match share {
        Share::Exclusive => {}
        Share::Read => {
            cmd.arg("SHARED");
        }
        Share::Permit { limit, permits } => {
            cmd.arg("SHARED").arg("LIMIT").arg(limit);
            // One permit is the server's default: servers that predate
            // `PERMITS` keep serving single permits.
            if permits != 1 {
                cmd.arg("PERMITS").arg(permits);
            }
        }
    }
    if ephemeral {
        cmd.arg("EPHEMERAL");
    }
    if let Some(wait) = wait_ms {
        cmd.arg("WAIT").arg(wait);
    }
}

/// `LOCK.MRENEW numkeys key [key ...] owner ttl-ms`: all or none.
pub(crate) fn mrenew(keys: &[String], owner: &str, ttl_ms: u64) -> Cmd {
    let mut cmd = redis::cmd("LOCK.MRENEW");
    cmd.arg(keys.len()).arg(keys).arg(owner).arg(ttl_ms);
    cmd
}

/// `LOCK.MRELEASE numkeys key [key ...] owner [ALL]`: all or none.
pub(crate) fn mrelease(keys: &[String], owner: &str, all: bool) -> Cmd {
    let mut cmd = redis::cmd("LOCK.MRELEASE");
    cmd.arg(keys.len()).arg(keys).arg(owner);
    if all {
        cmd.arg("ALL");
    }
    cmd
}

/// `LOCK.RENEW key owner ttl-ms`
pub(crate) fn renew(key: &str, owner: &str, ttl_ms: u64) -> Cmd {
    let mut cmd = redis::cmd("LOCK.RENEW");
    cmd.arg(key).arg(owner).arg(ttl_ms);
    cmd
}

/// `LOCK.REENTER key owner ttl-ms`
pub(crate) fn reenter(key: &str, owner: &str, ttl_ms: u64) -> Cmd {
    let mut cmd = redis::cmd("LOCK.REENTER");
    cmd.arg(key).arg(owner).arg(ttl_ms);
    cmd
}

/// `LOCK.RELEASE key owner [ALL]`
pub(crate) fn release(key: &str, owner: &str, all: bool) -> Cmd {
    let mut cmd = redis::cmd("LOCK.RELEASE");
    cmd.arg(key).arg(owner);
    if all {
        cmd.arg("ALL");
    }
    cmd
}

/// `LOCK.FENCE key owner min-fence`
pub(crate) fn fence(key: &str, owner: &str, min_fence: u64) -> Cmd {
    let mut cmd = redis::cmd("LOCK.FENCE");
    cmd.arg(key).arg(owner).arg(min_fence);
    cmd
}
