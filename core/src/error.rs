//! The one error type of the module.
//!
//! Every failure a client can cause is a variant here, with its reply text;
//! the Redis glue turns it into an error reply at the boundary, so the
//! prefixes clients match on (`ERR`, `WRONGTYPE`, `NOTOWNER`) live in one place.

use crate::limits::{FENCE_AHEAD_MS, MAX_MS};

/// Why a command was refused. Checked in the order of the variants below
/// (the order of checks): the first that applies answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockError {
    /// Too few arguments: the server's standard arity error.
    WrongArity,
    /// `numkeys` is not an integer in `1..=64`.
    BadNumKeys,
    /// An argument past the grammar, or an unknown option.
    Syntax,
    /// `ttl-ms` is not an integer in `1..=2^40`.
    BadTtl,
    /// `ttl-ms` is above `lock.max-ttl`.
    TtlAboveMax,
    /// `timeout-ms` is not an integer in `0..=2^40`.
    BadTimeout,
    /// `LIMIT` is not an integer in `1..=1,000,000`.
    BadLimit,
    /// `PERMITS` is not an integer in `1..=LIMIT`.
    BadPermits,
    /// `min-fence` is not an integer in `1..=(unix_ms + 1 hour) × 2^10`.
    BadFence,
    /// An internal-command integer (count, fence, expiry) is out of range.
    BadNumber,
    /// The owner is empty or longer than [`crate::limits::MAX_OWNER_LEN`].
    BadOwner,
    /// A key named twice in one command for several locks.
    DuplicateKey,
    /// `EPHEMERAL` inside a Lua script or a function: the server does not
    /// tell a module which client called the script, so there is no
    /// connection to bind the hold to (and a silent ordinary hold would
    /// break the caller's expectation).
    EphemeralInScript,
    /// The key holds a value of another type.
    WrongType,
    /// A shared request whose limit (or lack of one) differs from the
    /// shared lock's, or from that of a shared request waiting on it.
    LimitMismatch,
    /// The owner of a shared hold asked again for another number of
    /// permits than its hold is worth.
    PermitsMismatch,
    /// The owner of a shared hold asked for an exclusive one: two readers
    /// upgrading would wait on each other for ever.
    Upgrade,
    /// The caller does not hold the lock (never held, released, or lease ended).
    NotOwner,
    /// The reentrancy count would overflow.
    CountOverflow,
    /// `min-replicas-to-write` is set and replicas are missing, or have not
    /// yet shown that they follow this master again after they were: the
    /// master may have been replaced. Redis's own refusal, same text.
    NoReplicas,
    /// `LOCK.APPLY` or `LOCK.LASTFENCE` sent by a normal client: only the
    /// master's replication stream and AOF loading may set a lock's state or
    /// the fence counter directly.
    InternalCommand,
    /// A bug caught at the boundary (a panic): the command changed nothing
    /// it could not undo and the server keeps running.
    Internal,
}

impl LockError {
    /// The error reply text, with its stable prefix.
    pub fn message(self) -> &'static str {
        match self {
            LockError::WrongArity => "ERR wrong number of arguments",
            LockError::BadNumKeys => NUMKEYS_MESSAGE,
            LockError::Syntax => "ERR syntax error",
            LockError::BadTtl => TTL_MESSAGE,
            LockError::TtlAboveMax => "ERR ttl-ms is above lock.max-ttl (CONFIG GET lock.max-ttl)",
            LockError::BadTimeout => TIMEOUT_MESSAGE,
            LockError::BadLimit => LIMIT_MESSAGE,
            LockError::BadPermits => "ERR PERMITS must be an integer from 1 to LIMIT",
            LockError::BadFence => FENCE_MESSAGE,
            LockError::BadNumber => "ERR value is not an integer or out of range",
            LockError::BadOwner => "ERR owner must be 1 to 1024 bytes long",
            LockError::DuplicateKey => "ERR the keys must be distinct",
            LockError::EphemeralInScript => {
                "ERR EPHEMERAL is not allowed inside a script or a function: the server does not tell the module which client called it, so no connection can be bound to the hold"
            }
            LockError::WrongType => {
                "WRONGTYPE Operation against a key holding the wrong kind of value"
            }
            LockError::LimitMismatch => {
                "ERR the lock is shared with another LIMIT (or a request waiting on it is)"
            }
            LockError::PermitsMismatch => {
                "ERR the owner holds the lock with another number of PERMITS"
            }
            LockError::Upgrade => {
                "ERR the owner holds the lock shared: release it before asking for it exclusively"
            }
            LockError::NotOwner => "NOTOWNER the lock is not held by this owner",
            LockError::CountOverflow => "ERR reentrancy count overflow",
            LockError::NoReplicas => "NOREPLICAS Not enough good replicas to write.",
            LockError::InternalCommand => {
                "ERR LOCK.APPLY and LOCK.LASTFENCE are internal: only replication and AOF loading may call them"
            }
            LockError::Internal => "ERR internal error in the lock module (see the server log)",
        }
    }
}

// Kept as consts so the bound printed is the bound enforced.
const TTL_MESSAGE: &str = "ERR ttl-ms must be an integer from 1 to 1099511627776";
const TIMEOUT_MESSAGE: &str = "ERR timeout-ms must be an integer from 0 to 1099511627776";
const NUMKEYS_MESSAGE: &str = "ERR numkeys must be an integer from 1 to 64";
const LIMIT_MESSAGE: &str = "ERR LIMIT must be an integer from 1 to 1000000";
const FENCE_MESSAGE: &str =
    "ERR min-fence must be an integer from 1 to (unix_ms + 3600000) * 2^10 of the server clock";
const _: () = assert!(FENCE_AHEAD_MS == 3_600_000);
const _: () = assert!(crate::fence::CLOCK_SHIFT == 10);
const _: () = assert!(crate::limits::MAX_LIMIT == 1_000_000);
const _: () = assert!(crate::limits::MAX_KEYS == 64);
const _: () = assert!(MAX_MS == 1_099_511_627_776);
