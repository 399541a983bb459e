//! One server or a Redis Cluster as the [`Backend`] of the holds taken
//! on it: their renewals, reentries and releases on the shared connection.

use redis::Cmd;

use crate::conn::{self, Conn};
use crate::error::Error;
use crate::guard::{Backend, BoxFuture};

/// One server or cluster as a [`Backend`].
pub(crate) struct Server {
    pub(crate) conn: Conn,
}

impl Server {
    /// A command on the shared connection.
    pub(crate) async fn query<T: redis::FromRedisValue>(&self, cmd: &Cmd) -> Result<T, Error> {
        self.conn.query(cmd).await
    }
}

/// A command on a hold the caller has: `WRONGTYPE` means the key was
/// overwritten by another type (`SET` over it), so the hold is gone, as
/// after `NOTOWNER`.
pub(crate) fn on_hold<T>(reply: Result<T, Error>) -> Result<T, Error> {
    match reply {
        Err(Error::Transport(err)) if err.code() == Some("WRONGTYPE") => Err(Error::NotOwner),
        other => other,
    }
}

impl Backend for Server {
    fn renew<'a>(&'a self, key: &'a str, owner: &'a str, ttl_ms: u64) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            on_hold(
                self.conn
                    .query::<i64>(&conn::renew(key, owner, ttl_ms))
                    .await,
            )
            .map(|_| ())
        })
    }

    fn reenter<'a>(&'a self, key: &'a str, owner: &'a str, ttl_ms: u64) -> BoxFuture<'a, u64> {
        Box::pin(async move { on_hold(self.conn.query(&conn::reenter(key, owner, ttl_ms)).await) })
    }

    fn release<'a>(&'a self, key: &'a str, owner: &'a str, all: bool) -> BoxFuture<'a, u64> {
        Box::pin(async move { on_hold(self.conn.query(&conn::release(key, owner, all)).await) })
    }
}
