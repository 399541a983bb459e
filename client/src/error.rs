//! The one error type of the client, and why a held lock can be lost.

use std::fmt;

/// Why a lock call failed. Every method of the crate returns this.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// `try_lock`: another owner holds the lock right now.
    WouldBlock,
    /// `try_lock`: the lock is free, but the server begins no hold for now
    /// (its quarantine, `lock.max-ttl` ms after a start or a promotion):
    /// try again later, or wait (`lock`), which is served when it ends.
    Quarantine,
    /// `lock`: the wait ended before the lock was granted.
    TimedOut,
    /// The server says this owner does not hold the lock (released, or its
    /// lease ended): `-NOTOWNER`.
    NotOwner,
    /// The lock was lost while held; the reason says how. Returned by
    /// `with_lock` when the loss happened while its closure ran.
    Lost(LossReason),
    /// Redlock: fewer servers than a majority granted (or confirmed) the lock
    /// within its validity.
    NoQuorum {
        /// Servers that answered yes.
        granted: usize,
        /// The majority needed: N / 2 + 1.
        needed: usize,
    },
    /// The server does not know the `LOCK.*` commands: load the module
    /// (`loadmodule /path/to/libredislock.so` or `MODULE LOAD`).
    ModuleMissing,
    /// A read-write handle holding the read side asked for the write side:
    /// the server refuses an upgrade at once (two readers upgrading would
    /// wait on each other for ever). Release the read side first.
    Upgrade,
    /// A semaphore asked with another limit than the one in force on its
    /// key (or than a request already waiting there).
    LimitMismatch,
    /// Options the client refuses before sending anything (a zero ttl, an
    /// even number of Redlock servers, …).
    InvalidOptions(&'static str),
    /// Sentinel discovery found no master: no Sentinel answered, none knows
    /// the name, or the server named is not (yet) a master.
    NoMaster(&'static str),
    /// Anything else from the connection or the server: I/O, timeouts,
    /// cluster redirections that did not settle, unexpected error replies.
    Transport(redis::RedisError),
}

/// How a held lock was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// A renew was answered `-NOTOWNER` (Redlock: by so many servers that
    /// no majority can confirm the lock any more).
    NotOwner,
    /// The local lease deadline passed without a renew confirming the lock
    /// (server unreachable or paused, or the watchdog is off).
    Expired,
    /// An ephemeral hold's own connection closed: the server ended the hold.
    Disconnected,
    /// A release did not complete (cancelled, timed out, a transport
    /// error): the guard no longer counts the lock as held, and the release
    /// is retried in the background until it lands or the lease ends.
    ReleaseUnconfirmed,
}

/// How the server's refusal of an upgrade begins (after `ERR `).
const UPGRADE: &str = "the owner holds the lock shared";
/// How the server's refusal of another semaphore limit begins.
const LIMIT_MISMATCH: &str = "the lock is shared with another LIMIT";

impl Error {
    /// Sorts a `redis` error into the variants callers act on.
    pub(crate) fn from_redis(err: redis::RedisError) -> Error {
        match err.code() {
            Some("NOTOWNER") => Error::NotOwner,
            Some("ERR")
                if err
                    .detail()
                    .is_some_and(|d| d.starts_with("unknown command") && d.contains("LOCK.")) =>
            {
                Error::ModuleMissing
            }
            Some("ERR") if err.detail().is_some_and(|d| d.starts_with(UPGRADE)) => Error::Upgrade,
            Some("ERR") if err.detail().is_some_and(|d| d.starts_with(LIMIT_MISMATCH)) => {
                Error::LimitMismatch
            }
            _ => Error::Transport(err),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::WouldBlock => write!(f, "the lock is held by another owner"),
            Error::Quarantine => write!(
                f,
                "the server begins no hold during its quarantine (after a start or a \
                 promotion): try again"
            ),
            Error::TimedOut => write!(f, "timed out waiting for the lock"),
            Error::NotOwner => write!(f, "the lock is not held by this owner"),
            Error::Lost(LossReason::NotOwner) => {
                write!(
                    f,
                    "the lock was lost: the server no longer lists this owner"
                )
            }
            Error::Lost(LossReason::Expired) => {
                write!(f, "the lock was lost: its lease ran out before a renew")
            }
            Error::Lost(LossReason::Disconnected) => {
                write!(
                    f,
                    "the lock was lost: its ephemeral hold's connection closed"
                )
            }
            Error::Lost(LossReason::ReleaseUnconfirmed) => write!(
                f,
                "the lock was lost: its release did not complete (retried in the background)"
            ),
            Error::Upgrade => write!(
                f,
                "this owner holds the read side: release it before asking for the write side"
            ),
            Error::LimitMismatch => write!(
                f,
                "the semaphore is in use with another limit (or a request waiting on it is)"
            ),
            Error::NoQuorum { granted, needed } => write!(
                f,
                "no Redlock majority: {granted} server(s) agreed, {needed} needed"
            ),
            Error::ModuleMissing => write!(
                f,
                "the server does not know LOCK.* commands: load the redislock module \
                 (loadmodule /path/to/libredislock.so)"
            ),
            Error::InvalidOptions(why) => write!(f, "invalid options: {why}"),
            Error::NoMaster(why) => write!(f, "no master found through Sentinel: {why}"),
            Error::Transport(err) => write!(f, "redis: {err}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Transport(err) => Some(err),
            _ => None,
        }
    }
}

impl From<redis::RedisError> for Error {
    fn from(err: redis::RedisError) -> Error {
        Error::from_redis(err)
    }
}
