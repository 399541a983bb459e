//! Shared holds as Redis users build them today: read-write locks and
//! semaphores with leased permits, written here from the libraries'
//! documented algorithms (the Lua is ours), and the seam where the module's
//! own shared holds join them.
//!
//! - **Redisson's `RReadWriteLock`**: one hash per lock. Its `mode` field is
//!   `read` or `write`; every other field is a holder and its reentry count
//!   (a reader's field is its owner id, a writer's the owner id + `:write`).
//!   The hash's TTL is the lock's lease. Readers also keep one timeout key per
//!   reentry (`{lock}:<owner>:rwlock_timeout:<n>`), each with the reader's
//!   lease, because one hash TTL cannot hold several readers' leases: a
//!   reader's release recomputes the hash's TTL as the longest timeout key
//!   left, and deletes the hash when none is left. A read is granted when the
//!   lock is free, in read mode (whoever waits: readers never queue behind a
//!   writer), or write-held by the same owner; a write only when the lock is
//!   free or write-held by the same owner. A busy attempt answers the lock's
//!   `PTTL`. Renewal (the watchdog's) resets the hash's TTL and every reader's
//!   timeout keys, if the caller's field is still there; it answers 0 once
//!   the hold is gone, which is how a client learns it lost it. A release
//!   `PUBLISH`es on the lock's channel for waiters that listen; the bench
//!   polls instead, as Redisson's `tryLock` without a listener does.
//! - **Redisson's `RPermitExpirableSemaphore`**: a string key with the count
//!   of available permits (set once, `trySetPermits`) and a sorted set of the
//!   permits handed out, each a random id scored by its lease end (client
//!   time, ms). Acquiring first takes back the permits whose lease ended
//!   (removed from the set, added back to the count), then takes one if the
//!   count allows: count − 1, the id added with its lease end. Release removes
//!   the id and adds the permit back, only if the id was still in the set; a
//!   lease update re-scores an id still in the set and not yet expired.
//! - **npm `redis-semaphore`'s `Semaphore`**: one sorted set of holders'
//!   ids scored by the time (client time, ms) they acquired or last
//!   refreshed. One script drops every entry older than the lease
//!   (`ZREMRANGEBYSCORE -inf now−lease`), then adds the caller if `ZCARD` is
//!   below the limit and sets the set's TTL to the lease. Refresh drops the
//!   expired the same way and re-stamps the caller if it is still there;
//!   release is `ZREM`. Waiters retry after a fixed interval (its default
//!   10 ms; the bench uses the same short poll as for the others).
//! - **The module** ([`Recipe::Module`]): `LOCK.ACQUIRE key owner ttl-ms
//!   SHARED [LIMIT n] WAIT ms` for a read or a permit, without `SHARED` for a
//!   write; `LOCK.RENEW` to check a hold, `LOCK.RELEASE` to end it. It waits
//!   in the server's queue instead of polling. The section runs it only when
//!   the loaded build answers `SHARED` (see [`module_has_shared`]).

use std::io;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::resp::{Conn, Reply};
use crate::stats::uuid;

/// Read acquire. KEYS[1] lock hash, KEYS[2] the caller's timeout-key prefix;
/// ARGV[1] lease (ms), ARGV[2] reader field, ARGV[3] the caller's write field.
/// Nil when granted, else the lock's PTTL.
pub const RW_READ_ACQUIRE_LUA: &str = "\
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false or mode == 'read'
   or (mode == 'write' and redis.call('hexists', KEYS[1], ARGV[3]) == 1) then
  if mode == false then
    redis.call('hset', KEYS[1], 'mode', 'read')
  end
  local n = redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('set', KEYS[2] .. ':' .. n, 1, 'px', ARGV[1])
  local left = redis.call('pttl', KEYS[1])
  redis.call('pexpire', KEYS[1], math.max(left, tonumber(ARGV[1])))
  return nil
end
return redis.call('pttl', KEYS[1])";

/// Write acquire. KEYS[1] lock hash; ARGV[1] lease (ms), ARGV[2] write
/// field. Nil when granted (fresh or reentered), else the lock's PTTL.
pub const RW_WRITE_ACQUIRE_LUA: &str = "\
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
  redis.call('hset', KEYS[1], 'mode', 'write', ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end
if mode == 'write' and redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], redis.call('pttl', KEYS[1]) + tonumber(ARGV[1]))
  return nil
end
return redis.call('pttl', KEYS[1])";

/// Read release. KEYS[1] lock hash, KEYS[2] the caller's timeout-key prefix,
/// KEYS[3] the lock's key prefix (`{lock}`, to name other readers' timeout
/// keys), KEYS[4] channel; ARGV[1] reader field. Nil if the caller holds no
/// read (its hold was lost), 0 if others still hold, 1 when the lock is free.
pub const RW_READ_RELEASE_LUA: &str = "\
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false or redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
  return nil
end
local n = redis.call('hincrby', KEYS[1], ARGV[1], -1)
if n == 0 then
  redis.call('hdel', KEYS[1], ARGV[1])
end
redis.call('del', KEYS[2] .. ':' .. (n + 1))
if redis.call('hlen', KEYS[1]) > 1 then
  local longest = -3
  for _, field in ipairs(redis.call('hkeys', KEYS[1])) do
    local count = tonumber(redis.call('hget', KEYS[1], field))
    if count then
      for i = count, 1, -1 do
        local key = KEYS[3] .. ':' .. field .. ':rwlock_timeout:' .. i
        longest = math.max(longest, redis.call('pttl', key))
      end
    end
  end
  if longest > 0 then
    redis.call('pexpire', KEYS[1], longest)
    return 0
  end
  if mode == 'write' then
    return 0
  end
end
redis.call('del', KEYS[1])
redis.call('publish', KEYS[4], 'read')
return 1";

/// Write release. KEYS[1] lock hash, KEYS[2] channel; ARGV[1] lease (ms),
/// ARGV[2] write field. Nil if the caller holds no write, 0 if it still
/// holds it (reentered), 1 when its write hold ends (the lock is free, or
/// read-held by the same owner: a downgrade).
pub const RW_WRITE_RELEASE_LUA: &str = "\
local mode = redis.call('hget', KEYS[1], 'mode')
if mode ~= 'write' or redis.call('hexists', KEYS[1], ARGV[2]) == 0 then
  return nil
end
if redis.call('hincrby', KEYS[1], ARGV[2], -1) > 0 then
  redis.call('pexpire', KEYS[1], ARGV[1])
  return 0
end
redis.call('hdel', KEYS[1], ARGV[2])
if redis.call('hlen', KEYS[1]) == 1 then
  redis.call('del', KEYS[1])
  redis.call('publish', KEYS[2], 'write')
else
  redis.call('hset', KEYS[1], 'mode', 'read')
end
return 1";

/// Read renewal. KEYS[1] lock hash, KEYS[2] the lock's key prefix; ARGV[1]
/// lease (ms), ARGV[2] reader field. 1 if the caller still reads, else 0.
pub const RW_READ_RENEW_LUA: &str = "\
if redis.call('hexists', KEYS[1], ARGV[2]) == 0 then
  return 0
end
redis.call('pexpire', KEYS[1], ARGV[1])
for _, field in ipairs(redis.call('hkeys', KEYS[1])) do
  local count = tonumber(redis.call('hget', KEYS[1], field))
  if count then
    for i = count, 1, -1 do
      redis.call('pexpire', KEYS[2] .. ':' .. field .. ':rwlock_timeout:' .. i, ARGV[1])
    end
  end
end
return 1";

/// Write renewal. KEYS[1] lock hash; ARGV[1] lease (ms), ARGV[2] write
/// field. 1 if the caller still writes, else 0.
pub const RW_WRITE_RENEW_LUA: &str = "\
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  redis.call('pexpire', KEYS[1], ARGV[1])
  return 1
end
return 0";

/// Permit acquire. KEYS[1] available count, KEYS[2] permits' sorted set;
/// ARGV[1] permit id, ARGV[2] its lease end (ms), ARGV[3] now (ms).
/// 1 when granted, else 0.
pub const PERMITS_ACQUIRE_LUA: &str = "\
local expired = redis.call('zrangebyscore', KEYS[2], '-inf', ARGV[3])
if #expired > 0 then
  redis.call('zrem', KEYS[2], unpack(expired))
  redis.call('incrby', KEYS[1], #expired)
end
local available = tonumber(redis.call('get', KEYS[1]) or '0')
if available > 0 then
  redis.call('decr', KEYS[1])
  redis.call('zadd', KEYS[2], ARGV[2], ARGV[1])
  return 1
end
return 0";

/// Permit release. KEYS[1] available count, KEYS[2] permits' sorted set,
/// KEYS[3] channel; ARGV[1] permit id. 1 if the permit was still out (now
/// back), 0 if it had expired and been taken back.
pub const PERMITS_RELEASE_LUA: &str = "\
if redis.call('zrem', KEYS[2], ARGV[1]) == 1 then
  redis.call('incr', KEYS[1])
  redis.call('publish', KEYS[3], 1)
  return 1
end
return 0";

/// Permit lease update. KEYS[1] permits' sorted set; ARGV[1] permit id,
/// ARGV[2] new lease end (ms), ARGV[3] now (ms). 1 if the permit was still
/// out and unexpired (now extended), else 0.
pub const PERMITS_RENEW_LUA: &str = "\
local ends = redis.call('zscore', KEYS[1], ARGV[1])
if ends and tonumber(ends) > tonumber(ARGV[3]) then
  redis.call('zadd', KEYS[1], ARGV[2], ARGV[1])
  return 1
end
return 0";

/// Semaphore acquire (`redis-semaphore`). KEYS[1] holders' sorted set;
/// ARGV[1] limit, ARGV[2] holder id, ARGV[3] lease (ms), ARGV[4] now (ms).
/// 1 when granted, else 0.
pub const SEMAPHORE_ACQUIRE_LUA: &str = "\
redis.call('zremrangebyscore', KEYS[1], '-inf', tonumber(ARGV[4]) - tonumber(ARGV[3]))
if redis.call('zcard', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('zadd', KEYS[1], ARGV[4], ARGV[2])
  redis.call('pexpire', KEYS[1], ARGV[3])
  return 1
end
return 0";

/// Semaphore refresh (`redis-semaphore`). KEYS[1] holders' sorted set;
/// ARGV[1] holder id, ARGV[2] lease (ms), ARGV[3] now (ms). 1 if the caller
/// still holds (now re-stamped), else 0.
pub const SEMAPHORE_REFRESH_LUA: &str = "\
redis.call('zremrangebyscore', KEYS[1], '-inf', tonumber(ARGV[3]) - tonumber(ARGV[2]))
if redis.call('zscore', KEYS[1], ARGV[1]) then
  redis.call('zadd', KEYS[1], ARGV[3], ARGV[1])
  redis.call('pexpire', KEYS[1], ARGV[2])
  return 1
end
return 0";

/// The scripts' SHA1s on one server.
pub struct SharedScripts {
    rw_read_acquire: String,
    rw_write_acquire: String,
    rw_read_release: String,
    rw_write_release: String,
    rw_read_renew: String,
    rw_write_renew: String,
    permits_acquire: String,
    permits_release: String,
    permits_renew: String,
    semaphore_acquire: String,
    semaphore_refresh: String,
}

impl SharedScripts {
    pub fn load(con: &mut Conn) -> io::Result<SharedScripts> {
        let mut load = |body: &str| -> io::Result<String> {
            match con.call(&["SCRIPT", "LOAD", body])?.check("SCRIPT LOAD")? {
                Reply::Bulk(sha) => Ok(String::from_utf8_lossy(&sha).into_owned()),
                other => Err(io::Error::other(format!("SCRIPT LOAD answered {other:?}"))),
            }
        };
        Ok(SharedScripts {
            rw_read_acquire: load(RW_READ_ACQUIRE_LUA)?,
            rw_write_acquire: load(RW_WRITE_ACQUIRE_LUA)?,
            rw_read_release: load(RW_READ_RELEASE_LUA)?,
            rw_write_release: load(RW_WRITE_RELEASE_LUA)?,
            rw_read_renew: load(RW_READ_RENEW_LUA)?,
            rw_write_renew: load(RW_WRITE_RENEW_LUA)?,
            permits_acquire: load(PERMITS_ACQUIRE_LUA)?,
            permits_release: load(PERMITS_RELEASE_LUA)?,
            permits_renew: load(PERMITS_RENEW_LUA)?,
            semaphore_acquire: load(SEMAPHORE_ACQUIRE_LUA)?,
            semaphore_refresh: load(SEMAPHORE_REFRESH_LUA)?,
        })
    }
}

/// Whether the loaded module grants shared holds: `LOCK.ACQUIRE k o 1000
/// SHARED` answers a fence (or nil), not a syntax error.
pub fn module_has_shared(con: &mut Conn) -> io::Result<bool> {
    let key = format!("probe:shared:{}", uuid());
    let reply = con.call(&["LOCK.ACQUIRE", &key, "probe", "1000", "SHARED"])?;
    con.call(&["DEL", &key])?;
    Ok(matches!(reply, Reply::Int(_) | Reply::Nil))
}

/// What a client asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// A shared hold of a read-write lock.
    Read,
    /// The exclusive hold of a read-write lock.
    Write,
    /// One permit of a semaphore.
    Permit,
}

impl Mode {
    pub fn label(self) -> &'static str {
        match self {
            Mode::Read => "read",
            Mode::Write => "write",
            Mode::Permit => "permit",
        }
    }
}

/// Who implements the shared holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Recipe {
    /// Redisson's `RReadWriteLock` (read and write modes).
    RedissonRw,
    /// Redisson's `RPermitExpirableSemaphore` (permits).
    RedissonPermits,
    /// npm `redis-semaphore`'s `Semaphore` (permits).
    RedisSemaphore,
    /// The module's own shared holds, every mode: the seam for the
    /// comparison. Its commands are written below; the section adds it only
    /// when the loaded build answers `SHARED` (see [`module_has_shared`]).
    Module,
}

impl Recipe {
    pub fn label(self) -> &'static str {
        match self {
            Recipe::RedissonRw => "Redisson RReadWriteLock",
            Recipe::RedissonPermits => "Redisson RPermitExpirableSemaphore",
            Recipe::RedisSemaphore => "redis-semaphore (npm)",
            Recipe::Module => "module (SHARED, WAIT)",
        }
    }
}

/// How long a polling client sleeps between attempts.
pub const POLL: Duration = Duration::from_millis(1);

/// The hold a client has now.
struct Held {
    mode: Mode,
    /// The permit id (Redisson's semaphore hands out one per acquisition).
    permit: Option<String>,
}

/// One client of one shared lock: its connection, its owner id, and what it
/// holds. Every recipe uses one key prefix, so a run's keys are `key*`.
pub struct SharedClient {
    recipe: Recipe,
    /// Shared by every client of a run (each call clones the handle, not
    /// the SHAs, to call with them while the connection is borrowed).
    scripts: Arc<SharedScripts>,
    con: Conn,
    key: String,
    owner: String,
    lease_ms: u64,
    limit: usize,
    held: Option<Held>,
}

/// Milliseconds since the epoch: the recipes' clients stamp leases with
/// their own clock.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl SharedClient {
    pub fn connect(
        port: u16,
        recipe: Recipe,
        scripts: &Arc<SharedScripts>,
        key: &str,
        lease_ms: u64,
        limit: usize,
    ) -> io::Result<SharedClient> {
        Ok(SharedClient {
            recipe,
            scripts: Arc::clone(scripts),
            con: Conn::connect(port)?,
            key: key.to_string(),
            owner: format!("{}:1", uuid()),
            lease_ms,
            limit,
            held: None,
        })
    }

    /// Sets up a fresh lock of this recipe (deletes what a run left):
    /// Redisson's semaphore needs its permits set once.
    pub fn reset(con: &mut Conn, recipe: Recipe, key: &str, limit: usize) -> io::Result<()> {
        let k = Keys::of(key);
        con.call(&["DEL", key, &k.available, &k.permits])?
            .check("DEL")?;
        // Readers' timeout keys of earlier runs expire on their own; the
        // run's owners are fresh ids, so none is read again.
        if recipe == Recipe::RedissonPermits {
            con.call(&["SET", &k.available, &limit.to_string(), "NX"])?
                .check("SET")?;
        }
        Ok(())
    }

    /// Runs one command; error replies are errors.
    pub fn call(&mut self, args: &[&str]) -> io::Result<Reply> {
        self.con
            .call(args)?
            .check(args.first().copied().unwrap_or(""))
    }

    /// Takes a `mode` hold, waiting until `give_up`: the module in the
    /// server's queue, the recipes by polling every [`POLL`].
    pub fn acquire(&mut self, mode: Mode, give_up: Instant) -> io::Result<bool> {
        if self.held.is_some() {
            return Err(io::Error::other("acquire while holding"));
        }
        if self.recipe == Recipe::Module {
            return self.acquire_module(mode, give_up);
        }
        loop {
            if self.try_once(mode)? {
                return Ok(true);
            }
            if Instant::now() + POLL > give_up {
                return Ok(false);
            }
            thread::sleep(POLL);
        }
    }

    /// One attempt of a recipe; records the hold if granted.
    fn try_once(&mut self, mode: Mode) -> io::Result<bool> {
        let k = Keys::of(&self.key);
        let lease = self.lease_ms.to_string();
        let s = Arc::clone(&self.scripts);
        let owner = self.owner.clone();
        let (granted, permit) = match (self.recipe, mode) {
            (Recipe::RedissonRw, Mode::Read) => {
                let reply = self.call(&[
                    "EVALSHA",
                    &s.rw_read_acquire,
                    "2",
                    &self.key.clone(),
                    &k.timeouts(&owner),
                    &lease,
                    &owner,
                    &k.write_field(&owner),
                ])?;
                (reply == Reply::Nil, None)
            }
            (Recipe::RedissonRw, Mode::Write) => {
                let reply = self.call(&[
                    "EVALSHA",
                    &s.rw_write_acquire,
                    "1",
                    &self.key.clone(),
                    &lease,
                    &k.write_field(&owner),
                ])?;
                (reply == Reply::Nil, None)
            }
            (Recipe::RedissonPermits, Mode::Permit) => {
                let id = uuid();
                let now = now_ms();
                let reply = self.call(&[
                    "EVALSHA",
                    &s.permits_acquire,
                    "2",
                    &k.available,
                    &k.permits,
                    &id,
                    &(now + self.lease_ms).to_string(),
                    &now.to_string(),
                ])?;
                (reply == Reply::Int(1), Some(id))
            }
            (Recipe::RedisSemaphore, Mode::Permit) => {
                let reply = self.call(&[
                    "EVALSHA",
                    &s.semaphore_acquire,
                    "1",
                    &self.key.clone(),
                    &self.limit.to_string(),
                    &owner,
                    &lease,
                    &now_ms().to_string(),
                ])?;
                (reply == Reply::Int(1), None)
            }
            (recipe, mode) => {
                return Err(io::Error::other(format!(
                    "{} has no {} hold",
                    recipe.label(),
                    mode.label()
                )))
            }
        };
        if granted {
            self.held = Some(Held { mode, permit });
        }
        Ok(granted)
    }

    fn acquire_module(&mut self, mode: Mode, give_up: Instant) -> io::Result<bool> {
        let left = give_up.saturating_duration_since(Instant::now());
        // WAIT 0 would mean "forever": wait at least 1 ms.
        let wait_ms = (left.as_millis() as u64).max(1).to_string();
        let lease = self.lease_ms.to_string();
        let limit = self.limit.to_string();
        let (key, owner) = (self.key.clone(), self.owner.clone());
        let mut args = vec!["LOCK.ACQUIRE", &key, &owner, &lease];
        match mode {
            Mode::Read => args.push("SHARED"),
            Mode::Write => {}
            Mode::Permit => args.extend(["SHARED", "LIMIT", &limit]),
        }
        args.extend(["WAIT", &wait_ms]);
        let granted = matches!(self.call(&args)?, Reply::Int(_));
        if granted {
            self.held = Some(Held { mode, permit: None });
        }
        Ok(granted)
    }

    /// The lease check: renews the hold for a full lease and answers whether
    /// the client still had it (each recipe's own renewal, as its watchdog
    /// runs it).
    pub fn still_holds(&mut self) -> io::Result<bool> {
        let Some(held) = &self.held else {
            return Ok(false);
        };
        let (mode, permit) = (held.mode, held.permit.clone());
        let k = Keys::of(&self.key);
        let (key, owner) = (self.key.clone(), self.owner.clone());
        let lease = self.lease_ms.to_string();
        let s = Arc::clone(&self.scripts);
        let reply = match (self.recipe, mode) {
            (Recipe::Module, _) => {
                let args = ["LOCK.RENEW", &key, &owner, &lease];
                return self.module_own(&args, |r| *r == Reply::Int(1));
            }
            (Recipe::RedissonRw, Mode::Read) => self.call(&[
                "EVALSHA",
                &s.rw_read_renew,
                "2",
                &key,
                &k.prefix,
                &lease,
                &owner,
            ])?,
            (Recipe::RedissonRw, _) => self.call(&[
                "EVALSHA",
                &s.rw_write_renew,
                "1",
                &key,
                &lease,
                &k.write_field(&owner),
            ])?,
            (Recipe::RedissonPermits, _) => {
                let now = now_ms();
                self.call(&[
                    "EVALSHA",
                    &s.permits_renew,
                    "1",
                    &k.permits,
                    permit.as_deref().unwrap_or(""),
                    &(now + self.lease_ms).to_string(),
                    &now.to_string(),
                ])?
            }
            (Recipe::RedisSemaphore, _) => self.call(&[
                "EVALSHA",
                &s.semaphore_refresh,
                "1",
                &key,
                &owner,
                &lease,
                &now_ms().to_string(),
            ])?,
        };
        Ok(reply == Reply::Int(1))
    }

    /// A module command on the caller's own hold: whether `ok` accepts the
    /// answer; `Ok(false)` for `-NOTOWNER` (the hold is gone).
    fn module_own(&mut self, args: &[&str], ok: fn(&Reply) -> bool) -> io::Result<bool> {
        match self.con.call(args)? {
            Reply::Error(e) if e.starts_with("NOTOWNER") => Ok(false),
            reply if ok(&reply) => Ok(true),
            other => Err(io::Error::other(format!(
                "{} answered {other:?}",
                args.first().copied().unwrap_or("")
            ))),
        }
    }

    /// Ends the hold. `Ok(false)` if the recipe says the client no longer
    /// had it (its lease ended and another took its place).
    pub fn release(&mut self) -> io::Result<bool> {
        let Some(held) = self.held.take() else {
            return Err(io::Error::other("release without a hold"));
        };
        let k = Keys::of(&self.key);
        let (key, owner) = (self.key.clone(), self.owner.clone());
        let lease = self.lease_ms.to_string();
        let s = Arc::clone(&self.scripts);
        let reply = match (self.recipe, held.mode) {
            (Recipe::Module, _) => {
                let args = ["LOCK.RELEASE", &key, &owner];
                return self.module_own(&args, |r| matches!(r, Reply::Int(_)));
            }
            (Recipe::RedissonRw, Mode::Read) => self.call(&[
                "EVALSHA",
                &s.rw_read_release,
                "4",
                &key,
                &k.timeouts(&owner),
                &k.prefix,
                &k.channel,
                &owner,
            ])?,
            (Recipe::RedissonRw, _) => self.call(&[
                "EVALSHA",
                &s.rw_write_release,
                "2",
                &key,
                &k.channel,
                &lease,
                &k.write_field(&owner),
            ])?,
            (Recipe::RedissonPermits, _) => self.call(&[
                "EVALSHA",
                &s.permits_release,
                "3",
                &k.available,
                &k.permits,
                &k.channel,
                held.permit.as_deref().unwrap_or(""),
            ])?,
            (Recipe::RedisSemaphore, _) => self.call(&["ZREM", &key, &owner])?,
        };
        // The read-write lock's releases answer nil once the hold is gone
        // (0: released, others still hold); the semaphores' answer 0.
        Ok(match self.recipe {
            Recipe::RedissonRw => matches!(reply, Reply::Int(_)),
            _ => reply == Reply::Int(1),
        })
    }
}

/// The keys of one lock, named as the libraries name theirs.
struct Keys {
    /// `{lock}`: the hash tag every other key of the lock starts with.
    prefix: String,
    channel: String,
    available: String,
    permits: String,
}

impl Keys {
    fn of(key: &str) -> Keys {
        let prefix = format!("{{{key}}}");
        Keys {
            channel: format!("{prefix}:channel"),
            available: format!("{prefix}:available"),
            permits: format!("{prefix}:permits"),
            prefix,
        }
    }

    /// A reader's timeout-key prefix (`:<n>` is appended per reentry).
    fn timeouts(&self, owner: &str) -> String {
        format!("{}:{owner}:rwlock_timeout", self.prefix)
    }

    fn write_field(&self, owner: &str) -> String {
        format!("{owner}:write")
    }
}
