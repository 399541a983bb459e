//! Argument parsing: raw argument vectors into typed requests.
//!
//! Pure, so every rule of the order of checks is unit-tested here. Each parser checks,
//! in this order: too few arguments, then arguments past the grammar or
//! unknown options, then numbers, then the owner. Index 0 is the command
//! name, index 1 the key (the glue opens it), so parsers look from index 2.

use crate::error::LockError;
use crate::holds::Mode;
pub use crate::limits::{FENCE_AHEAD_MS, MAX_KEYS, MAX_LIMIT, MAX_MS, MAX_OWNER_LEN};

/// `LOCK.ACQUIRE key owner ttl-ms [SHARED [LIMIT n]] [EPHEMERAL] [WAIT timeout-ms]`
#[derive(Debug, PartialEq, Eq)]
pub struct Acquire<'a> {
    pub owner: &'a [u8],
    pub ttl_ms: u64,
    /// `Some(0)`: wait without limit.
    pub wait_ms: Option<u64>,
    /// Exclusive, or `SHARED` (with its `LIMIT`, if any).
    pub mode: Mode,
    /// `EPHEMERAL`: a fresh hold ends when the connection it is granted on
    /// closes.
    pub ephemeral: bool,
    /// `PERMITS k`: the semaphore's permits the hold is worth (1 without).
    pub permits: u32,
}

/// `LOCK.REENTER key owner [ttl-ms]`
#[derive(Debug, PartialEq, Eq)]
pub struct Reenter<'a> {
    pub owner: &'a [u8],
    pub ttl_ms: Option<u64>,
}

/// `LOCK.RELEASE key owner [ALL]`
#[derive(Debug, PartialEq, Eq)]
pub struct Release<'a> {
    pub owner: &'a [u8],
    pub all: bool,
}

/// `LOCK.RENEW key owner ttl-ms`
#[derive(Debug, PartialEq, Eq)]
pub struct Renew<'a> {
    pub owner: &'a [u8],
    pub ttl_ms: u64,
}

/// `LOCK.FENCE key owner min-fence`
#[derive(Debug, PartialEq, Eq)]
pub struct Fence<'a> {
    pub owner: &'a [u8],
    pub min_fence: u64,
}

/// The largest `min-fence` at wall-clock time `now_ms`:
/// `(now_ms + 1 hour) × 2^10`. A bound tied to the clock keeps any client
/// from pushing the counter to the end of the fence space, while leaving a
/// Redlock client room to raise servers whose clocks lag the others'.
pub fn max_min_fence(now_ms: u64) -> u64 {
    now_ms
        .saturating_add(FENCE_AHEAD_MS)
        .saturating_mul(1 << crate::fence::CLOCK_SHIFT)
        .min(crate::fence::MAX_FENCE)
}

/// `LOCK.APPLY key owner count fence [PXAT unix-ms]` (internal: replication
/// and AOF). Without `PXAT` the key keeps its TTL; the AOF rewrite relies on
/// that, as Redis writes a `PEXPIREAT` after the module's own commands.
#[derive(Debug, PartialEq, Eq)]
pub struct Apply<'a> {
    pub owner: &'a [u8],
    pub count: u64,
    pub fence: u64,
    pub expires_at: Option<u64>,
}

/// `max_ttl`: `lock.max-ttl` (0: no cap), for this and the other parsers
/// that read a `ttl-ms`.
pub fn parse_acquire<'a, A: AsRef<[u8]>>(
    args: &'a [A],
    max_ttl: u64,
) -> Result<Acquire<'a>, LockError> {
    let [_, _, owner, ttl, rest @ ..] = args else {
        return Err(LockError::WrongArity);
    };
    // The options, in any order, each at most once; their values are
    // checked only once the whole grammar is known to fit.
    let (mut wait, mut shared, mut limit, mut permits) = (None, false, None, None);
    let mut ephemeral = false;
    let mut rest = rest;
    while let [word, tail @ ..] = rest {
        rest = match tail {
            [value, tail @ ..] if is_word(word, "WAIT") && wait.is_none() => {
                wait = Some(value);
                tail
            }
            [value, tail @ ..] if is_word(word, "LIMIT") && limit.is_none() => {
                limit = Some(value);
                tail
            }
            [value, tail @ ..] if is_word(word, "PERMITS") && permits.is_none() => {
                permits = Some(value);
                tail
            }
            _ if is_word(word, "SHARED") && !shared => {
                shared = true;
                tail
            }
            _ if is_word(word, "EPHEMERAL") && !ephemeral => {
                ephemeral = true;
                tail
            }
            _ => return Err(LockError::Syntax),
        };
    }
    if (limit.is_some() && !shared) || (permits.is_some() && limit.is_none()) {
        return Err(LockError::Syntax);
    }
    let ttl_ms = parse_ttl(ttl, max_ttl)?;
    let wait_ms = wait.map(parse_timeout).transpose()?;
    let limit = limit.map(parse_limit).transpose()?;
    let permits = match (permits, limit) {
        (Some(k), Some(n)) => parse_int(k)
            .and_then(|k| u32::try_from(k).ok())
            .filter(|k| (1..=n).contains(k))
            .ok_or(LockError::BadPermits)?,
        _ => 1,
    };
    Ok(Acquire {
        permits,
        owner: parse_owner(owner)?,
        ttl_ms,
        wait_ms,
        mode: if shared {
            Mode::Shared { limit }
        } else {
            Mode::Exclusive
        },
        ephemeral,
    })
}

/// A command for several locks: `NAME numkeys key [key ...] rest…`. The
/// keys, and the arguments from the last key on, shaped as the single-lock
/// command's (name, key, rest…) so its own parser reads the rest.
pub struct Several<'a, A> {
    pub keys: Vec<&'a [u8]>,
    pub single: &'a [A],
}

/// Reads `numkeys` and the keys of a command for several locks: `numkeys`
/// in `1..=64` (else [`LockError::BadNumKeys`]), that many keys present
/// (else arity), and the rest handed on as a single-lock command's
/// arguments. Distinct keys are checked by [`distinct`], after the rest.
pub fn parse_several<A: AsRef<[u8]>>(args: &[A]) -> Result<Several<'_, A>, LockError> {
    let [_, numkeys, ..] = args else {
        return Err(LockError::WrongArity);
    };
    let n = parse_int(numkeys)
        .and_then(|n| usize::try_from(n).ok())
        .filter(|n| (1..=MAX_KEYS).contains(n))
        .ok_or(LockError::BadNumKeys)?;
    let keys = args.get(2..2 + n).ok_or(LockError::WrongArity)?;
    Ok(Several {
        keys: keys.iter().map(AsRef::as_ref).collect(),
        single: &args[n..],
    })
}

/// The keys of a command for several locks must be distinct.
pub fn distinct(keys: &[&[u8]]) -> Result<(), LockError> {
    let mut sorted = keys.to_vec();
    sorted.sort_unstable();
    if sorted.windows(2).any(|pair| pair[0] == pair[1]) {
        return Err(LockError::DuplicateKey);
    }
    Ok(())
}

/// `LOCK.MACQUIRE numkeys key [key ...] owner ttl-ms [options]`: the keys,
/// and the request as `LOCK.ACQUIRE`'s.
pub fn parse_acquire_all<A: AsRef<[u8]>>(
    args: &[A],
    max_ttl: u64,
) -> Result<(Vec<&[u8]>, Acquire<'_>), LockError> {
    let several = parse_several(args)?;
    let request = parse_acquire(several.single, max_ttl)?;
    distinct(&several.keys)?;
    Ok((several.keys, request))
}

/// `LOCK.MRELEASE numkeys key [key ...] owner [ALL]`.
pub fn parse_release_all<A: AsRef<[u8]>>(
    args: &[A],
) -> Result<(Vec<&[u8]>, Release<'_>), LockError> {
    let several = parse_several(args)?;
    let request = parse_release(several.single)?;
    distinct(&several.keys)?;
    Ok((several.keys, request))
}

/// `LOCK.MRENEW numkeys key [key ...] owner ttl-ms`.
pub fn parse_renew_all<A: AsRef<[u8]>>(
    args: &[A],
    max_ttl: u64,
) -> Result<(Vec<&[u8]>, Renew<'_>), LockError> {
    let several = parse_several(args)?;
    let request = parse_renew(several.single, max_ttl)?;
    distinct(&several.keys)?;
    Ok((several.keys, request))
}

pub fn parse_reenter<'a, A: AsRef<[u8]>>(
    args: &'a [A],
    max_ttl: u64,
) -> Result<Reenter<'a>, LockError> {
    let (owner, ttl) = match args {
        [_, _, owner] => (owner, None),
        [_, _, owner, ttl] => (owner, Some(ttl)),
        [_, _, _, _, ..] => return Err(LockError::Syntax),
        _ => return Err(LockError::WrongArity),
    };
    let ttl_ms = ttl.map(|ttl| parse_ttl(ttl, max_ttl)).transpose()?;
    Ok(Reenter {
        owner: parse_owner(owner)?,
        ttl_ms,
    })
}

pub fn parse_release<'a, A: AsRef<[u8]>>(args: &'a [A]) -> Result<Release<'a>, LockError> {
    let (owner, all) = match args {
        [_, _, owner] => (owner, false),
        [_, _, owner, word] if is_word(word, "ALL") => (owner, true),
        [_, _, _, ..] => return Err(LockError::Syntax),
        _ => return Err(LockError::WrongArity),
    };
    Ok(Release {
        owner: parse_owner(owner)?,
        all,
    })
}

pub fn parse_renew<'a, A: AsRef<[u8]>>(
    args: &'a [A],
    max_ttl: u64,
) -> Result<Renew<'a>, LockError> {
    let (owner, ttl) = match args {
        [_, _, owner, ttl] => (owner, ttl),
        [_, _, _, _, ..] => return Err(LockError::Syntax),
        _ => return Err(LockError::WrongArity),
    };
    let ttl_ms = parse_ttl(ttl, max_ttl)?;
    Ok(Renew {
        owner: parse_owner(owner)?,
        ttl_ms,
    })
}

/// `LOCK.FENCE key owner min-fence`, checked against the clock at `now_ms`.
pub fn parse_fence<'a, A: AsRef<[u8]>>(args: &'a [A], now_ms: u64) -> Result<Fence<'a>, LockError> {
    let (owner, min_fence) = match args {
        [_, _, owner, min_fence] => (owner, min_fence),
        [_, _, _, _, ..] => return Err(LockError::Syntax),
        _ => return Err(LockError::WrongArity),
    };
    let min_fence = parse_int(min_fence)
        .filter(|fence| (1..=max_min_fence(now_ms)).contains(fence))
        .ok_or(LockError::BadFence)?;
    Ok(Fence {
        owner: parse_owner(owner)?,
        min_fence,
    })
}

/// `LOCK.INFO key`: nothing to parse past the key.
pub fn parse_info<A: AsRef<[u8]>>(args: &[A]) -> Result<(), LockError> {
    match args.len() {
        0 | 1 => Err(LockError::WrongArity),
        2 => Ok(()),
        _ => Err(LockError::Syntax),
    }
}

fn parse_apply<'a, A: AsRef<[u8]>>(args: &'a [A]) -> Result<Apply<'a>, LockError> {
    let [_, _, owner, count, fence, rest @ ..] = args else {
        return Err(LockError::WrongArity);
    };
    let expires_at = match rest {
        [] => None,
        [word, at] if is_word(word, "PXAT") => Some(at),
        _ => return Err(LockError::Syntax),
    };
    let positive = |arg: &A| {
        parse_int(arg)
            .filter(|&n| n >= 1)
            .ok_or(LockError::BadNumber)
    };
    Ok(Apply {
        count: positive(count)?,
        fence: positive(fence)?,
        expires_at: expires_at.map(positive).transpose()?,
        owner: parse_owner(owner)?,
    })
}

/// What a `LOCK.APPLY` (internal: replication and AOF) carries, in one of
/// its forms, read by [`parse_applied`].
#[derive(Debug, PartialEq, Eq)]
pub enum Applied<'a> {
    /// `key owner count fence [PXAT unix-ms]`: an exclusive hold.
    Hold(Apply<'a>),
    /// `key PXAT unix-ms`: a renewal, the lease alone.
    Lease(u64),
    /// `key SHARED limit owner count fence lease since …`: a shared lock's
    /// whole state (an AOF rewrite).
    Holds(crate::holds::Holds),
    /// `key SHARE …` / `key UNSHARE owner`: one owner's share.
    Share(ShareChange<'a>),
}

/// `LOCK.APPLY` in any of its forms ([`Applied`]): the one parser the
/// command calls. The forms differ by their word after the key and their
/// number of arguments, so exactly one of them reads a given line.
pub fn parse_applied<'a, A: AsRef<[u8]>>(args: &'a [A]) -> Result<Applied<'a>, LockError> {
    if let Some(lease) = parse_apply_lease(args) {
        return lease.map(Applied::Lease);
    }
    if let Some(change) = parse_apply_share(args) {
        return change.map(Applied::Share);
    }
    if let Some(holds) = parse_apply_shared(args) {
        return holds.map(Applied::Holds);
    }
    parse_apply(args).map(Applied::Hold)
}

/// The short form `LOCK.APPLY key PXAT unix-ms` (internal: a renewal): the
/// hold in `key` keeps its owner, count and fence, and its lease moves to
/// `unix-ms`. `None` for any other shape, which [`parse_apply`] reads (the
/// full form has at least four arguments after the name, this one three).
fn parse_apply_lease<A: AsRef<[u8]>>(args: &[A]) -> Option<Result<u64, LockError>> {
    let [_, _, word, at] = args else {
        return None;
    };
    if !is_word(word, "PXAT") {
        return None;
    }
    Some(
        parse_int(at)
            .filter(|&n| n >= 1)
            .ok_or(LockError::BadNumber),
    )
}

/// The shared form `LOCK.APPLY key SHARED limit owner count fence lease
/// since [owner count fence lease since …]` (internal: replication and AOF):
/// the whole state of a lock held shared, oldest hold first; `limit` 0 for
/// none. `None` for any other shape (the other forms have at most five
/// arguments after the key, this one at least seven).
fn parse_apply_shared<A: AsRef<[u8]>>(
    args: &[A],
) -> Option<Result<crate::holds::Holds, LockError>> {
    let [_, _, word, limit, holders @ ..] = args else {
        return None;
    };
    // `SHAREDP`: each holder also has its permits.
    let width = match () {
        _ if is_word(word, "SHARED") => 5,
        _ if is_word(word, "SHAREDP") => 6,
        _ => return None,
    };
    if holders.is_empty() || holders.len() % width != 0 {
        return None;
    }
    let parse = || {
        let limit = parse_int(limit)
            .filter(|&n| n <= MAX_LIMIT)
            .ok_or(LockError::BadNumber)?;
        let positive = |arg: &A| {
            parse_int(arg)
                .filter(|&n| n >= 1)
                .ok_or(LockError::BadNumber)
        };
        let holders = holders
            .chunks_exact(width)
            .map(|h| {
                Ok(crate::holds::Holder {
                    owner: parse_owner(&h[0])?.to_vec(),
                    hold: crate::lock::Hold {
                        count: positive(&h[1])?,
                        fence: positive(&h[2])?,
                        expires_at: positive(&h[3])?,
                    },
                    since: parse_int(&h[4]).ok_or(LockError::BadNumber)?,
                    permits: h.get(5).map_or(Ok(1), parse_permits)?,
                })
            })
            .collect::<Result<Vec<_>, LockError>>()?;
        let limit = u32::try_from(limit).ok().filter(|&n| n > 0);
        Ok(crate::holds::Holds::from_parts(
            Mode::Shared { limit },
            holders,
        ))
    };
    Some(parse())
}

/// A change to one owner's share of a lock held shared, as a master sends
/// it (internal: replication and AOF).
#[derive(Debug, PartialEq, Eq)]
pub enum ShareChange<'a> {
    /// `LOCK.APPLY key SHARE limit owner count fence lease since`: the
    /// owner's hold now (a fresh one, or one reentered, renewed, released
    /// to above zero, fenced); `limit` 0 for none. A lock that is free or
    /// held exclusively there becomes this one share.
    Share(Mode, crate::holds::Holder),
    /// `LOCK.APPLY key UNSHARE owner`: the owner's hold ended (released to
    /// zero, its lease, taken back); the key goes with its last hold.
    Unshare(&'a [u8]),
}

/// The per-owner forms of `LOCK.APPLY` ([`ShareChange`]). `None` for any
/// other shape: the full forms have a different word or number of
/// arguments (an owner form has five or seven arguments, the shared state
/// nine or more with `SHARED`, the renewal four with `PXAT`).
fn parse_apply_share<'a, A: AsRef<[u8]>>(
    args: &'a [A],
) -> Option<Result<ShareChange<'a>, LockError>> {
    match args {
        [_, _, word, owner] if is_word(word, "UNSHARE") => {
            Some(parse_owner(owner).map(ShareChange::Unshare))
        }
        [_, _, word, limit, owner, count, fence, lease, since, rest @ ..]
            if is_word(word, "SHARE") =>
        {
            let positive = |arg: &A| {
                parse_int(arg)
                    .filter(|&n| n >= 1)
                    .ok_or(LockError::BadNumber)
            };
            // `PERMITS k` after the hold: a share worth more than one.
            let permits = match rest {
                [] => None,
                [word, k] if is_word(word, "PERMITS") => Some(k),
                _ => return None,
            };
            let parse = || {
                let limit = parse_int(limit)
                    .filter(|&n| n <= MAX_LIMIT)
                    .ok_or(LockError::BadNumber)?;
                let holder = crate::holds::Holder {
                    owner: parse_owner(owner)?.to_vec(),
                    hold: crate::lock::Hold {
                        count: positive(count)?,
                        fence: positive(fence)?,
                        expires_at: positive(lease)?,
                    },
                    since: parse_int(since).ok_or(LockError::BadNumber)?,
                    permits: permits.map_or(Ok(1), parse_permits)?,
                };
                let limit = u32::try_from(limit).ok().filter(|&n| n > 0);
                Ok(ShareChange::Share(Mode::Shared { limit }, holder))
            };
            Some(parse())
        }
        _ => None,
    }
}

/// `LOCK.LASTFENCE fence` (internal: the AOF after a rewrite, replication)
/// → the fence counter to observe, `1..=2^63-1`.
pub fn parse_last_fence<A: AsRef<[u8]>>(args: &[A]) -> Result<u64, LockError> {
    let [_, fence] = args else {
        return Err(LockError::WrongArity);
    };
    parse_int(fence)
        .filter(|&n| n >= 1)
        .ok_or(LockError::BadNumber)
}

/// A `ttl-ms`: `1..=2^40`, and at most `max_ttl` when that is set.
fn parse_ttl<A: AsRef<[u8]>>(arg: &A, max_ttl: u64) -> Result<u64, LockError> {
    let ttl = parse_int(arg)
        .filter(|ms| (1..=MAX_MS).contains(ms))
        .ok_or(LockError::BadTtl)?;
    if max_ttl > 0 && ttl > max_ttl {
        return Err(LockError::TtlAboveMax);
    }
    Ok(ttl)
}

fn parse_timeout<A: AsRef<[u8]>>(arg: &A) -> Result<u64, LockError> {
    parse_int(arg)
        .filter(|&ms| ms <= MAX_MS)
        .ok_or(LockError::BadTimeout)
}

/// A share's permits as a master sends them: `1..=1,000,000`.
fn parse_permits<A: AsRef<[u8]>>(arg: &A) -> Result<u32, LockError> {
    parse_int(arg)
        .filter(|n| (1..=MAX_LIMIT).contains(n))
        .and_then(|n| u32::try_from(n).ok())
        .ok_or(LockError::BadNumber)
}

/// A `LIMIT`: `1..=1,000,000` owners.
fn parse_limit<A: AsRef<[u8]>>(arg: &A) -> Result<u32, LockError> {
    parse_int(arg)
        .filter(|n| (1..=MAX_LIMIT).contains(n))
        .and_then(|n| u32::try_from(n).ok())
        .ok_or(LockError::BadLimit)
}

fn parse_owner<A: AsRef<[u8]>>(arg: &A) -> Result<&[u8], LockError> {
    let owner = arg.as_ref();
    if owner.is_empty() || owner.len() > MAX_OWNER_LEN {
        return Err(LockError::BadOwner);
    }
    Ok(owner)
}

/// A non-negative integer in Redis's strict form: ASCII digits only, no
/// sign, no spaces, no leading zeros (but "0"), and within `i64`. Negative
/// numbers parse to `None`: every number here must be ≥ 0 anyway.
fn parse_int<A: AsRef<[u8]>>(arg: &A) -> Option<u64> {
    let bytes = arg.as_ref();
    let digits_only = !bytes.is_empty() && bytes.iter().all(u8::is_ascii_digit);
    let leading_zero = bytes.len() > 1 && bytes[0] == b'0';
    if !digits_only || leading_zero {
        return None;
    }
    std::str::from_utf8(bytes)
        .ok()?
        .parse::<u64>()
        .ok()
        .filter(|&n| n <= i64::MAX as u64)
}

fn is_word<A: AsRef<[u8]>>(arg: &A, word: &str) -> bool {
    arg.as_ref().eq_ignore_ascii_case(word.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use LockError::*;

    fn v(line: &str) -> Vec<Vec<u8>> {
        line.split(' ').map(|s| s.as_bytes().to_vec()).collect()
    }

    #[test]
    fn several_locks_read_numkeys_keys_then_the_single_grammar() {
        let args = v("LOCK.MACQUIRE 2 a b o 100 SHARED WAIT 5");
        let (keys, req) = parse_acquire_all(&args, 0).unwrap();
        assert_eq!(keys, [b"a".as_slice(), b"b".as_slice()]);
        assert_eq!(req.owner, b"o");
        assert_eq!(req.ttl_ms, 100);
        assert_eq!(req.wait_ms, Some(5));
        assert_eq!(req.mode, Mode::Shared { limit: None });
        let line = v("LOCK.MRELEASE 1 a o ALL");
        let (keys, rel) = parse_release_all(&line).unwrap();
        assert_eq!((keys.len(), rel.all), (1, true));
        let line = v("LOCK.MRENEW 3 a b c o 7");
        let (keys, renew) = parse_renew_all(&line, 0).unwrap();
        assert_eq!((keys.len(), renew.ttl_ms), (3, 7));
        // (line, error), in the order of checks.
        let cases = [
            ("LOCK.MACQUIRE", WrongArity),
            ("LOCK.MACQUIRE 0 a o 100", BadNumKeys),
            ("LOCK.MACQUIRE 65 a o 100", BadNumKeys),
            ("LOCK.MACQUIRE -1 a o 100", BadNumKeys),
            ("LOCK.MACQUIRE x a o 100", BadNumKeys),
            ("LOCK.MACQUIRE 3 a b", WrongArity),
            ("LOCK.MACQUIRE 2 a b o", WrongArity),
            ("LOCK.MACQUIRE 2 a b o 100 BOGUS", Syntax),
            ("LOCK.MACQUIRE 2 a b o 0", BadTtl),
            ("LOCK.MACQUIRE 2 a a o 100", DuplicateKey),
            ("LOCK.MRELEASE 2 a b", WrongArity),
            ("LOCK.MRELEASE 2 a b o NOTALL", Syntax),
            ("LOCK.MRELEASE 2 b b o", DuplicateKey),
            ("LOCK.MRENEW 2 a b o", WrongArity),
            ("LOCK.MRENEW 2 a b o x", BadTtl),
        ];
        for (line, want) in cases {
            let args = v(line);
            let got = if line.starts_with("LOCK.MACQUIRE") {
                parse_acquire_all(&args, 0).map(drop)
            } else if line.starts_with("LOCK.MRELEASE") {
                parse_release_all(&args).map(drop)
            } else {
                parse_renew_all(&args, 0).map(drop)
            };
            assert_eq!(got, Err(want), "{line}");
        }
        let many = format!(
            "LOCK.MACQUIRE 64 {} o 100",
            (0..64)
                .map(|i| format!("k{i}"))
                .collect::<Vec<_>>()
                .join(" ")
        );
        assert_eq!(
            parse_acquire_all(&v(&many), 0).map(|(keys, _)| keys.len()),
            Ok(64)
        );
    }

    #[test]
    fn acquire_parses_with_and_without_wait() {
        let a = v("LOCK.ACQUIRE k o 100");
        assert_eq!(
            parse_acquire(&a, 0),
            Ok(Acquire {
                owner: b"o",
                ttl_ms: 100,
                wait_ms: None,
                mode: Mode::Exclusive,
                ephemeral: false,
                permits: 1,
            })
        );
        let a = v("lock.acquire k o 100 wait 0");
        assert_eq!(
            parse_acquire(&a, 0),
            Ok(Acquire {
                owner: b"o",
                ttl_ms: 100,
                wait_ms: Some(0),
                mode: Mode::Exclusive,
                ephemeral: false,
                permits: 1,
            })
        );
    }

    #[test]
    fn permits_need_a_limit_and_fit_within_it() {
        let got = |line: &str| parse_acquire(&v(line), 0).map(|a| (a.mode, a.permits));
        let sem = |n| Mode::Shared { limit: Some(n) };
        assert_eq!(got("x k o 5 SHARED LIMIT 4 PERMITS 3"), Ok((sem(4), 3)));
        assert_eq!(got("x k o 5 PERMITS 4 SHARED LIMIT 4"), Ok((sem(4), 4)));
        assert_eq!(got("x k o 5 SHARED LIMIT 4"), Ok((sem(4), 1)));
        assert_eq!(got("x k o 5 SHARED PERMITS 1"), Err(Syntax));
        assert_eq!(got("x k o 5 PERMITS 1"), Err(Syntax));
        assert_eq!(
            got("x k o 5 SHARED LIMIT 4 PERMITS 1 PERMITS 1"),
            Err(Syntax)
        );
        assert_eq!(got("x k o 5 SHARED LIMIT 4 PERMITS"), Err(Syntax));
        for bad in ["0", "5", "-1", "x", "01"] {
            let line = format!("x k o 5 SHARED LIMIT 4 PERMITS {bad}");
            assert_eq!(got(&line), Err(BadPermits), "{line}");
        }
        assert_eq!(got("x k o 5 SHARED LIMIT 0 PERMITS 1"), Err(BadLimit));
    }

    #[test]
    fn acquire_options_come_in_any_order_each_once() {
        const R: Mode = Mode::READ;
        const SEM3: Mode = Mode::Shared { limit: Some(3) };
        /// The mode and wait parsed, or the error.
        type Parsed = Result<(Mode, Option<u64>), LockError>;
        // (arguments after `ttl-ms`, expected)
        let table: [(&str, Parsed); 22] = [
            ("", Ok((Mode::Exclusive, None))),
            ("SHARED", Ok((R, None))),
            ("shared", Ok((R, None))),
            ("SHARED LIMIT 3", Ok((SEM3, None))),
            ("LIMIT 3 SHARED", Ok((SEM3, None))),
            ("SHARED WAIT 5", Ok((R, Some(5)))),
            ("WAIT 5 SHARED", Ok((R, Some(5)))),
            ("WAIT 5 SHARED LIMIT 3", Ok((SEM3, Some(5)))),
            ("LIMIT 3 WAIT 0 SHARED", Ok((SEM3, Some(0)))),
            (
                "SHARED limit 1000000",
                Ok((
                    Mode::Shared {
                        limit: Some(1_000_000),
                    },
                    None,
                )),
            ),
            ("LIMIT 3", Err(Syntax)),
            ("WAIT 5 LIMIT 3", Err(Syntax)),
            ("SHARED LIMIT", Err(Syntax)),
            ("SHARED WAIT", Err(Syntax)),
            ("SHARED SHARED", Err(Syntax)),
            ("SHARED LIMIT 3 LIMIT 3", Err(Syntax)),
            ("WAIT 1 WAIT 1", Err(Syntax)),
            ("SHARED LIMIT 0", Err(BadLimit)),
            ("SHARED LIMIT 1000001", Err(BadLimit)),
            ("SHARED LIMIT -1", Err(BadLimit)),
            ("SHARED LIMIT x", Err(BadLimit)),
            ("SHARED LIMIT 3 WAIT x", Err(BadTimeout)),
        ];
        for (options, expected) in table {
            let line = format!("LOCK.ACQUIRE k o 100 {options}");
            let argv = v(line.trim_end());
            let got = parse_acquire(&argv, 0).map(|a| (a.mode, a.wait_ms));
            assert_eq!(got, expected, "{line}");
        }
        // A bad ttl is reported before a bad limit, a bad owner after it.
        let argv = v("LOCK.ACQUIRE k o 0 SHARED LIMIT 0");
        assert_eq!(parse_acquire(&argv, 0), Err(BadTtl));
        let argv = vec![
            b"LOCK.ACQUIRE".to_vec(),
            b"k".to_vec(),
            Vec::new(),
            b"1".to_vec(),
            b"SHARED".to_vec(),
            b"LIMIT".to_vec(),
            b"0".to_vec(),
        ];
        assert_eq!(parse_acquire(&argv, 0), Err(BadLimit));
    }

    #[test]
    fn ephemeral_comes_in_any_order_once_in_both_modes() {
        const R: Mode = Mode::READ;
        const SEM3: Mode = Mode::Shared { limit: Some(3) };
        /// The mode, wait and ephemeral flag parsed, or the error.
        type Parsed = Result<(Mode, Option<u64>, bool), LockError>;
        // (arguments after `ttl-ms`, expected)
        let table: [(&str, Parsed); 18] = [
            ("", Ok((Mode::Exclusive, None, false))),
            ("EPHEMERAL", Ok((Mode::Exclusive, None, true))),
            ("ephemeral", Ok((Mode::Exclusive, None, true))),
            ("EPHEMERAL WAIT 5", Ok((Mode::Exclusive, Some(5), true))),
            ("WAIT 5 EPHEMERAL", Ok((Mode::Exclusive, Some(5), true))),
            ("SHARED EPHEMERAL", Ok((R, None, true))),
            ("EPHEMERAL SHARED", Ok((R, None, true))),
            ("SHARED LIMIT 3 EPHEMERAL WAIT 0", Ok((SEM3, Some(0), true))),
            ("EPHEMERAL LIMIT 3 SHARED", Ok((SEM3, None, true))),
            ("WAIT 1 EPHEMERAL LIMIT 3 SHARED", Ok((SEM3, Some(1), true))),
            ("SHARED LIMIT EPHEMERAL 3", Err(Syntax)),
            ("EPHEMERAL EPHEMERAL", Err(Syntax)),
            ("EPHEMERAL SHARED EPHEMERAL", Err(Syntax)),
            ("EPHEMERAL LIMIT 3", Err(Syntax)),
            ("EPHEMERAL WAIT", Err(Syntax)),
            ("EPHEMERAL 1", Err(Syntax)),
            ("EPHEMERALS", Err(Syntax)),
            ("EPHEMERAL WAIT x", Err(BadTimeout)),
        ];
        for (options, expected) in table {
            let line = format!("LOCK.ACQUIRE k o 100 {options}");
            let argv = v(line.trim_end());
            let got = parse_acquire(&argv, 0).map(|a| (a.mode, a.wait_ms, a.ephemeral));
            assert_eq!(got, expected, "{line}");
        }
        // The order of checks is unchanged: a bad ttl first, an empty owner last.
        assert_eq!(
            parse_acquire(&v("LOCK.ACQUIRE k o 0 EPHEMERAL"), 0),
            Err(BadTtl)
        );
        let argv = [&b"LOCK.ACQUIRE"[..], b"k", b"", b"1", b"EPHEMERAL"];
        assert_eq!(parse_acquire(&argv, 0), Err(BadOwner));
    }

    #[test]
    fn apply_reads_the_shared_form_and_leaves_the_others_alone() {
        let argv = v("LOCK.APPLY k SHARED 3 a 1 10 500 100 b 2 11 600 101");
        let holds = parse_apply_shared(&argv)
            .expect("the shared form")
            .expect("valid");
        assert_eq!(holds.mode(), Mode::Shared { limit: Some(3) });
        let got: Vec<_> = holds
            .holders()
            .map(|h| {
                (
                    h.owner.clone(),
                    h.hold.count,
                    h.hold.fence,
                    h.hold.expires_at,
                    h.since,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (b"a".to_vec(), 1, 10, 500, 100),
                (b"b".to_vec(), 2, 11, 600, 101)
            ]
        );
        let argv = v("LOCK.APPLY k SHARED 0 a 1 10 500 100");
        let holds = parse_apply_shared(&argv).unwrap().unwrap();
        assert_eq!(holds.mode(), Mode::READ);
        // The older forms, an owner named SHARED included, are not this one.
        for line in [
            "LOCK.APPLY k SHARED 1 2",
            "LOCK.APPLY k SHARED 1 2 PXAT 5",
            "LOCK.APPLY k PXAT 5",
            "LOCK.APPLY k SHARED 0 a 1 10 500",
        ] {
            assert!(parse_apply_shared(&v(line)).is_none(), "{line}");
        }
        for line in [
            "LOCK.APPLY k SHARED 0 a 0 10 500 100",
            "LOCK.APPLY k SHARED x a 1 10 500 100",
            "LOCK.APPLY k SHARED 1000001 a 1 10 500 100",
        ] {
            assert_eq!(
                parse_apply_shared(&v(line)).map(|r| r.err()),
                Some(Some(BadNumber)),
                "{line}"
            );
        }
    }

    #[test]
    fn errors_come_in_the_documented_order() {
        // (argument vector, expected error): each row breaks the rule of its
        // row and every later one, so only the earliest rule may answer.
        let table = [
            ("LOCK.ACQUIRE k o", WrongArity),
            ("LOCK.ACQUIRE k", WrongArity),
            ("LOCK.ACQUIRE k o nope EXTRA", Syntax),
            ("LOCK.ACQUIRE k o nope WAIT", Syntax),
            ("LOCK.ACQUIRE k o nope NOWAIT 5", Syntax),
            ("LOCK.ACQUIRE k o nope WAIT 5 6", Syntax),
            ("LOCK.ACQUIRE k  nope WAIT nope", BadTtl),
            ("LOCK.ACQUIRE k  5 WAIT nope", BadTimeout),
            ("LOCK.ACQUIRE k  5 WAIT 5", BadOwner),
            ("LOCK.REENTER k", WrongArity),
            ("LOCK.REENTER k  nope x", Syntax),
            ("LOCK.REENTER k  nope", BadTtl),
            ("LOCK.REENTER k  5", BadOwner),
            ("LOCK.RELEASE k", WrongArity),
            ("LOCK.RELEASE k  SOME", Syntax),
            ("LOCK.RELEASE k  ALL x", Syntax),
            ("LOCK.RELEASE k  ALL", BadOwner),
            ("LOCK.RENEW k o", WrongArity),
            ("LOCK.RENEW k  nope x", Syntax),
            ("LOCK.RENEW k  nope", BadTtl),
            ("LOCK.RENEW k  5", BadOwner),
            ("LOCK.FENCE k o", WrongArity),
            ("LOCK.FENCE k", WrongArity),
            ("LOCK.FENCE k  nope x", Syntax),
            ("LOCK.FENCE k  nope", BadFence),
            ("LOCK.FENCE k  0", BadFence),
            ("LOCK.FENCE k  5", BadOwner),
        ];
        for (line, want) in table {
            let args = v(line);
            let got = match line.split(' ').next() {
                Some("LOCK.ACQUIRE") => parse_acquire(&args, 0).err(),
                Some("LOCK.REENTER") => parse_reenter(&args, 0).err(),
                Some("LOCK.RELEASE") => parse_release(&args).err(),
                Some("LOCK.FENCE") => parse_fence(&args, NOW_MS).err(),
                _ => parse_renew(&args, 0).err(),
            };
            assert_eq!(got, Some(want), "{line}");
        }
    }

    /// A 2026 timestamp in ms, for the clock-bound `min-fence`.
    const NOW_MS: u64 = 1_790_000_000_000;

    #[test]
    fn fence_bounds_follow_the_clock() {
        let max = (NOW_MS + 3_600_000) << crate::fence::CLOCK_SHIFT;
        let (max_s, over_s) = (max.to_string(), (max + 1).to_string());
        let i64_max = i64::MAX.to_string();
        for (fence, ok) in [
            ("1", true),
            ("42", true),
            (max_s.as_str(), true),
            ("0", false),
            ("-1", false),
            (over_s.as_str(), false),
            (i64_max.as_str(), false),
            ("18446744073709551615", false),
            ("+5", false),
            ("05", false),
            ("5.0", false),
            ("", false),
        ] {
            let args: Vec<&[u8]> = vec![b"LOCK.FENCE", b"k", b"o", fence.as_bytes()];
            let want = if ok {
                Ok(Fence {
                    owner: b"o",
                    min_fence: fence.parse().unwrap_or(0),
                })
            } else {
                Err(BadFence)
            };
            assert_eq!(parse_fence(&args, NOW_MS), want, "min-fence {fence:?}");
        }
        // The bound moves with the clock: an hour later, `max + 1` is fine.
        let args: Vec<&[u8]> = vec![b"LOCK.FENCE", b"k", b"o", over_s.as_bytes()];
        assert!(parse_fence(&args, NOW_MS + 3_600_000).is_ok());
    }

    #[test]
    fn fence_bound_saturates_at_the_largest_fence() {
        assert_eq!(max_min_fence(u64::MAX), crate::fence::MAX_FENCE);
        assert_eq!(max_min_fence(0), 3_600_000 << crate::fence::CLOCK_SHIFT);
    }

    #[test]
    fn ttl_bounds() {
        let max = MAX_MS.to_string();
        let over = (MAX_MS + 1).to_string();
        for (ttl, ok) in [
            ("1", true),
            (max.as_str(), true),
            ("0", false),
            ("-1", false),
            (over.as_str(), false),
            ("+5", false),
            (" 5", false),
            ("05", false),
            ("5.0", false),
            ("1e3", false),
            ("99999999999999999999999", false),
            ("", false),
        ] {
            let args: Vec<&[u8]> = vec![b"LOCK.RENEW", b"k", b"o", ttl.as_bytes()];
            assert_eq!(parse_renew(&args, 0).is_ok(), ok, "ttl {ttl:?}");
        }
    }

    #[test]
    fn timeout_bounds_include_zero() {
        let max = MAX_MS.to_string();
        let over = (MAX_MS + 1).to_string();
        for (t, ok) in [
            ("0", true),
            (max.as_str(), true),
            (over.as_str(), false),
            ("-1", false),
        ] {
            let args: Vec<&[u8]> = vec![b"LOCK.ACQUIRE", b"k", b"o", b"5", b"WAIT", t.as_bytes()];
            assert_eq!(parse_acquire(&args, 0).is_ok(), ok, "timeout {t:?}");
        }
    }

    #[test]
    fn owner_bounds_and_binary_safety() {
        let long = vec![b'x'; MAX_OWNER_LEN];
        let too_long = vec![b'x'; MAX_OWNER_LEN + 1];
        let binary: &[u8] = b"\0\xff:1";
        for (owner, ok) in [
            (&long[..], true),
            (&too_long[..], false),
            (binary, true),
            (b"", false),
        ] {
            let args: Vec<&[u8]> = vec![b"LOCK.RELEASE", b"k", owner];
            assert_eq!(
                parse_release(&args).map(|r| r.owner),
                if ok { Ok(owner) } else { Err(BadOwner) }
            );
        }
    }

    #[test]
    fn max_ttl_caps_every_ttl_after_the_range_check() {
        // (line, lock.max-ttl, result)
        let table = [
            ("LOCK.ACQUIRE k o 1000", 1000, Ok(())),
            ("LOCK.ACQUIRE k o 1001", 1000, Err(TtlAboveMax)),
            ("LOCK.ACQUIRE k o 1001", 0, Ok(())),
            ("LOCK.ACQUIRE k o 0", 1000, Err(BadTtl)),
            ("LOCK.ACQUIRE k o 1001 WAIT nope", 1000, Err(TtlAboveMax)),
            ("LOCK.ACQUIRE k  1001", 1000, Err(TtlAboveMax)), // before the owner
            ("LOCK.REENTER k o 1001", 1000, Err(TtlAboveMax)),
            ("LOCK.REENTER k o", 1000, Ok(())),
            ("LOCK.RENEW k o 1001", 1000, Err(TtlAboveMax)),
            ("LOCK.RENEW k o 999", 1000, Ok(())),
        ];
        for (line, max, want) in table {
            let args = v(line);
            let got = match line.split(' ').next() {
                Some("LOCK.ACQUIRE") => parse_acquire(&args, max).map(|_| ()),
                Some("LOCK.REENTER") => parse_reenter(&args, max).map(|_| ()),
                _ => parse_renew(&args, max).map(|_| ()),
            };
            assert_eq!(got, want, "{line} with max {max}");
        }
    }

    #[test]
    fn keywords_are_case_insensitive() {
        assert_eq!(parse_release(&v("x k o aLl")).map(|r| r.all), Ok(true));
        assert_eq!(
            parse_acquire(&v("x k o 5 WaIt 7"), 0).map(|r| r.wait_ms),
            Ok(Some(7))
        );
    }

    #[test]
    fn reenter_and_info_shapes() {
        assert_eq!(
            parse_reenter(&v("x k o"), 0),
            Ok(Reenter {
                owner: b"o",
                ttl_ms: None
            })
        );
        assert_eq!(
            parse_reenter(&v("x k o 9"), 0),
            Ok(Reenter {
                owner: b"o",
                ttl_ms: Some(9)
            })
        );
        assert_eq!(parse_info(&v("x")), Err(WrongArity));
        assert_eq!(parse_info(&v("x k")), Ok(()));
        assert_eq!(parse_info(&v("x k extra")), Err(Syntax));
    }

    #[test]
    fn apply_reads_the_per_owner_forms_and_leaves_the_others_alone() {
        let argv = v("x k SHARE 3 o 2 99 1234 1000");
        let share = parse_apply_share(&argv);
        let Some(Ok(ShareChange::Share(mode, holder))) = share else {
            panic!("{share:?}");
        };
        assert_eq!(mode, Mode::Shared { limit: Some(3) });
        assert_eq!(
            (
                holder.owner.as_slice(),
                holder.hold.count,
                holder.hold.fence
            ),
            (&b"o"[..], 2, 99)
        );
        assert_eq!((holder.hold.expires_at, holder.since), (1234, 1000));
        assert!(matches!(
            parse_apply_share(&v("x k share 0 o 1 1 1 0")),
            Some(Ok(ShareChange::Share(Mode::Shared { limit: None }, _)))
        ));
        let argv = v("x k UNSHARE o");
        assert_eq!(
            parse_apply_share(&argv),
            Some(Ok(ShareChange::Unshare(b"o")))
        );
        for bad in [
            "x k SHARE 3 o 0 99 1234 1000",
            "x k SHARE 2000000 o 1 1 1 1",
        ] {
            assert_eq!(parse_apply_share(&v(bad)), Some(Err(BadNumber)), "{bad}");
        }
        for other in [
            "x k PXAT 1234",
            "x k o 2 99",
            "x k o 2 99 PXAT 1",
            "x k SHARED 0 o 1 1 1 1",
        ] {
            assert_eq!(parse_apply_share(&v(other)), None, "{other}");
        }
    }

    #[test]
    fn one_parser_reads_every_form_of_apply() {
        let forms = [
            ("x k o 2 99 PXAT 1234", "hold"),
            ("x k o 2 99", "hold"),
            ("x k PXAT 1234", "lease"),
            ("x k SHARED 0 o 1 5 1234 1000", "holds"),
            ("x k SHARE 0 o 1 5 1234 1000", "share"),
            ("x k UNSHARE o", "share"),
        ];
        for (line, want) in forms {
            let argv = v(line);
            let got = match parse_applied(&argv) {
                Ok(Applied::Hold(_)) => "hold",
                Ok(Applied::Lease(_)) => "lease",
                Ok(Applied::Holds(_)) => "holds",
                Ok(Applied::Share(_)) => "share",
                Err(e) => panic!("{line}: {e:?}"),
            };
            assert_eq!(got, want, "{line}");
        }
        assert_eq!(parse_applied(&v("x k o")), Err(WrongArity));
        assert_eq!(parse_applied(&v("x k o 2 99 PX 5")), Err(Syntax));
    }

    #[test]
    fn apply_parses_state_and_optional_expiry() {
        assert_eq!(
            parse_apply(&v("x k o 2 99 PXAT 1234")),
            Ok(Apply {
                owner: b"o",
                count: 2,
                fence: 99,
                expires_at: Some(1234)
            })
        );
        assert_eq!(
            parse_apply(&v("x k o 2 99")).map(|a| a.expires_at),
            Ok(None)
        );
        assert_eq!(parse_apply(&v("x k o 2")), Err(WrongArity));
        // The short form of a renewal, and shapes that are not it.
        assert_eq!(parse_apply_lease(&v("x k PXAT 1234")), Some(Ok(1234)));
        assert_eq!(parse_apply_lease(&v("x k pxat 1234")), Some(Ok(1234)));
        assert_eq!(parse_apply_lease(&v("x k PXAT 0")), Some(Err(BadNumber)));
        assert_eq!(parse_apply_lease(&v("x k o 2")), None);
        assert_eq!(parse_apply_lease(&v("x k o 2 99 PXAT 1234")), None);
        assert_eq!(parse_apply(&v("x k o 2 99 PX 5")), Err(Syntax));
        assert_eq!(parse_apply(&v("x k o 0 99")), Err(BadNumber));
        assert_eq!(parse_apply(&v("x k o 1 -1")), Err(BadNumber));
    }

    #[test]
    fn last_fence_takes_one_positive_integer() {
        let max = i64::MAX.to_string();
        let cases: &[(&str, Result<u64, LockError>)] = &[
            ("x 1", Ok(1)),
            ("x 1882695450317815809", Ok(1_882_695_450_317_815_809)),
            (&format!("x {max}"), Ok(i64::MAX as u64)),
            ("x", Err(WrongArity)),
            ("x 1 2", Err(WrongArity)),
            ("x 0", Err(BadNumber)),
            ("x -5", Err(BadNumber)),
            ("x 9223372036854775808", Err(BadNumber)),
            ("x 01", Err(BadNumber)),
            ("x abc", Err(BadNumber)),
        ];
        for (line, want) in cases {
            assert_eq!(parse_last_fence(&v(line)), *want, "{line}");
        }
    }
}
