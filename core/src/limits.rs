//! The limits of the command grammar, in one place: the parsers enforce
//! them ([`crate::args`]) and the error texts print them ([`crate::error`]).

/// Largest `ttl-ms` / `timeout-ms`: 2^40 ms, about 35 years.
pub const MAX_MS: u64 = 1 << 40;

/// Longest owner token, in bytes.
pub const MAX_OWNER_LEN: usize = 1024;

/// How far ahead of the clock floor a `min-fence` may reach: one hour.
pub const FENCE_AHEAD_MS: u64 = 3_600_000;

/// Largest `LIMIT` of a shared lock: owners sharing it at once.
pub const MAX_LIMIT: u64 = 1_000_000;

/// Largest reentrancy count: a lock value stores it in 32 bits.
pub const MAX_COUNT: u64 = u32::MAX as u64;

/// Most locks one command for several (`LOCK.MACQUIRE`, …) may name.
pub const MAX_KEYS: usize = 64;
