//! The locks under comparison: the module, the two classic recipes (written
//! here, as their users write them) and raw Redis; and one waiting client per
//! way of waiting.
//!
//! - **String recipe**: `SET key token NX PX ttl` to acquire; a Lua
//!   compare-and-delete to release; waiters poll with a sleep (20 ms or 1 ms).
//! - **Hash recipe** (as Redisson does it): a Lua script that `HINCRBY`s the
//!   owner's field and `PEXPIRE`s the key, returning nil when acquired or the
//!   lock's `PTTL` when not; a Lua release that counts down, deletes at zero
//!   and `PUBLISH`es on the lock's channel; waiters subscribe and retry on each
//!   message, or when the `PTTL` they were told has passed.
//! - **Raw**: `SET NX PX` + `DEL`, no owner check: the server's ceiling for a
//!   write pair on one key.
//! - **`BLPOP` token** (contended runs only): no lock at all, Redis's own
//!   first-come-first-served hand-off. One token sits in a list; a client
//!   "holds" while it has popped it (`BLPOP`) and hands it on with `RPUSH`.
//!   It has no owner and no lease, so it is a yardstick for the hand-off, not
//!   a lock anyone should use.

use std::io;
use std::thread;
use std::time::{Duration, Instant};

use crate::resp::{Conn, Reply};
use crate::Res;

/// Compare-and-delete: KEYS[1] lock, ARGV[1] owner token.
pub const STRING_RELEASE_LUA: &str = "\
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0";

/// Reentrant acquire: KEYS[1] lock, ARGV[1] lease (ms), ARGV[2] owner.
/// Nil when acquired (fresh or reentered), else the lock's PTTL.
pub const HASH_ACQUIRE_LUA: &str = "\
if redis.call('exists', KEYS[1]) == 0 or redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end
return redis.call('pttl', KEYS[1])";

/// Reentrant release: KEYS[1] lock, ARGV[1] lease (ms), ARGV[2] owner.
/// Nil if not the owner, 0 if still held, 1 when freed (and announced on
/// `lockchan:<key>`). The channel is derived here rather than passed as
/// KEYS[2] so that a `redis-benchmark` command draws one random key, not two.
pub const HASH_RELEASE_LUA: &str = "\
if redis.call('hexists', KEYS[1], ARGV[2]) == 0 then
  return nil
end
if redis.call('hincrby', KEYS[1], ARGV[2], -1) > 0 then
  redis.call('pexpire', KEYS[1], ARGV[1])
  return 0
end
redis.call('del', KEYS[1])
redis.call('publish', 'lockchan:' .. KEYS[1], '0')
return 1";

/// The pub/sub channel the hash recipe announces a release of `key` on.
pub fn channel(key: &str) -> String {
    format!("lockchan:{key}")
}

/// The scripts' SHA1s on one server (`SCRIPT LOAD`).
#[derive(Clone)]
pub struct Scripts {
    pub string_release: String,
    pub hash_acquire: String,
    pub hash_release: String,
}

impl Scripts {
    pub fn load(con: &mut redis::Connection) -> Res<Scripts> {
        let mut load = |body: &str| -> Res<String> {
            Ok(redis::cmd("SCRIPT").arg("LOAD").arg(body).query(con)?)
        };
        Ok(Scripts {
            string_release: load(STRING_RELEASE_LUA)?,
            hash_acquire: load(HASH_ACQUIRE_LUA)?,
            hash_release: load(HASH_RELEASE_LUA)?,
        })
    }
}

/// A kind of lock: which commands take and free it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Module,
    StringRecipe,
    HashRecipe,
    Raw,
}

impl Kind {
    pub fn label(self) -> &'static str {
        match self {
            Kind::Module => "module",
            Kind::StringRecipe => "string recipe",
            Kind::HashRecipe => "hash recipe",
            Kind::Raw => "raw SET NX PX + DEL",
        }
    }

    /// The acquire command (no waiting).
    pub fn acquire(self, s: &Scripts, key: &str, owner: &str, ttl: &str) -> Vec<String> {
        let v = |a: &[&str]| a.iter().map(ToString::to_string).collect();
        match self {
            Kind::Module => v(&["LOCK.ACQUIRE", key, owner, ttl]),
            Kind::StringRecipe | Kind::Raw => v(&["SET", key, owner, "NX", "PX", ttl]),
            Kind::HashRecipe => v(&["EVALSHA", &s.hash_acquire, "1", key, ttl, owner]),
        }
    }

    /// The release command.
    pub fn release(self, s: &Scripts, key: &str, owner: &str, ttl: &str) -> Vec<String> {
        let v = |a: &[&str]| a.iter().map(ToString::to_string).collect();
        match self {
            Kind::Module => v(&["LOCK.RELEASE", key, owner]),
            Kind::StringRecipe => v(&["EVALSHA", &s.string_release, "1", key, owner]),
            Kind::HashRecipe => v(&["EVALSHA", &s.hash_release, "1", key, ttl, owner]),
            Kind::Raw => v(&["DEL", key]),
        }
    }

    /// Whether `reply` to [`Kind::acquire`] means the lock was taken.
    pub fn took(self, reply: &Reply) -> bool {
        match self {
            Kind::Module => matches!(reply, Reply::Int(_)),
            Kind::StringRecipe | Kind::Raw => matches!(reply, Reply::Status(s) if s == "OK"),
            Kind::HashRecipe => matches!(reply, Reply::Nil),
        }
    }
}

/// How a client waits for a lock someone else holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Waiting {
    /// The module: `LOCK.ACQUIRE … WAIT timeout`, served first come first served.
    ModuleWait,
    /// The string recipe: retry `SET NX` after sleeping this long.
    Poll(Duration),
    /// The hash recipe: subscribe, retry on each release message or when the
    /// holder's lease should have ended.
    PubSub,
    /// Raw Redis: `BLPOP` the one token of a list, `RPUSH` it back to release.
    /// Not in [`Waiting::ALL`]: a token has no lease, so the takeover section
    /// has nothing to measure for it.
    BlpopToken,
}

impl Waiting {
    /// Every way of waiting, with the lock kind it goes with.
    pub const ALL: [Waiting; 4] = [
        Waiting::ModuleWait,
        Waiting::Poll(Duration::from_millis(20)),
        Waiting::Poll(Duration::from_millis(1)),
        Waiting::PubSub,
    ];

    /// Every way of waiting the contended runs measure: the locks, then
    /// Redis's own hand-off as their yardstick.
    pub const CONTENDED: [Waiting; 5] = [
        Waiting::ModuleWait,
        Waiting::Poll(Duration::from_millis(20)),
        Waiting::Poll(Duration::from_millis(1)),
        Waiting::PubSub,
        Waiting::BlpopToken,
    ];

    /// The lock kind a way of waiting goes with; the token is raw Redis.
    pub fn kind(self) -> Kind {
        match self {
            Waiting::ModuleWait => Kind::Module,
            Waiting::Poll(_) => Kind::StringRecipe,
            Waiting::PubSub => Kind::HashRecipe,
            Waiting::BlpopToken => Kind::Raw,
        }
    }

    pub fn label(self) -> String {
        match self {
            Waiting::ModuleWait => "module (WAIT)".into(),
            Waiting::Poll(d) => format!("string recipe, {} ms poll", d.as_millis()),
            Waiting::PubSub => "hash recipe, pub/sub".into(),
            Waiting::BlpopToken => "raw BLPOP token".into(),
        }
    }
}

/// The list the `BLPOP` token clients pass their one token through: the
/// lock's key with a suffix, so a run that uses both never mixes them.
pub fn token_list(key: &str) -> String {
    format!("{key}:token")
}

/// One client of one lock: its own connection (plus a subscriber connection
/// for the hash recipe), its owner token, and the way it waits.
pub struct Client {
    waiting: Waiting,
    scripts: Scripts,
    key: String,
    owner: String,
    ttl: String,
    con: Conn,
    /// The hash recipe's pub/sub connection (RESP2, subscribed while waiting).
    sub: Option<Conn>,
}

impl Client {
    pub fn connect(
        port: u16,
        waiting: Waiting,
        scripts: &Scripts,
        key: &str,
        owner: &str,
        ttl_ms: u64,
    ) -> io::Result<Client> {
        let sub = match waiting {
            Waiting::PubSub => Some(Conn::connect(port)?),
            _ => None,
        };
        Ok(Client {
            waiting,
            scripts: scripts.clone(),
            key: key.to_string(),
            owner: owner.to_string(),
            ttl: ttl_ms.to_string(),
            con: Conn::connect(port)?,
            sub,
        })
    }

    /// Runs one command on the client's connection; error replies are errors.
    pub fn call(&mut self, args: &[&str]) -> io::Result<Reply> {
        self.con
            .call(args)?
            .check(args.first().copied().unwrap_or(""))
    }

    /// Takes the lock, waiting the client's way; gives up at `give_up`.
    /// Returns whether it got the lock.
    pub fn acquire(&mut self, give_up: Instant) -> io::Result<bool> {
        match self.waiting {
            Waiting::ModuleWait => self.acquire_module(give_up),
            Waiting::Poll(every) => self.acquire_polling(every, give_up),
            Waiting::PubSub => self.acquire_pubsub(give_up),
            Waiting::BlpopToken => self.acquire_token(give_up),
        }
    }

    /// One attempt, no waiting.
    fn try_once(&mut self) -> io::Result<Reply> {
        let kind = self.waiting.kind();
        let args = kind.acquire(&self.scripts, &self.key, &self.owner, &self.ttl);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.call(&args)
    }

    fn acquire_module(&mut self, give_up: Instant) -> io::Result<bool> {
        let left = give_up.saturating_duration_since(Instant::now());
        // WAIT 0 would mean "forever": wait at least 1 ms.
        let wait_ms = (left.as_millis() as u64).max(1).to_string();
        let args = [
            "LOCK.ACQUIRE",
            &self.key,
            &self.owner,
            &self.ttl,
            "WAIT",
            &wait_ms,
        ];
        let reply = self.con.call(&args)?.check("LOCK.ACQUIRE")?;
        Ok(Kind::Module.took(&reply))
    }

    /// `BLPOP` with the time left as its timeout, as the module's `WAIT` is
    /// given it: served in the order the clients blocked.
    fn acquire_token(&mut self, give_up: Instant) -> io::Result<bool> {
        let left = give_up.saturating_duration_since(Instant::now());
        // A 0 timeout would mean "forever": block at least 1 ms.
        let secs = format!("{:.3}", left.as_secs_f64().max(0.001));
        let list = token_list(&self.key);
        let reply = self.con.call(&["BLPOP", &list, &secs])?.check("BLPOP")?;
        Ok(matches!(reply, Reply::Array(_)))
    }

    fn acquire_polling(&mut self, every: Duration, give_up: Instant) -> io::Result<bool> {
        loop {
            let reply = self.try_once()?;
            if Kind::StringRecipe.took(&reply) {
                return Ok(true);
            }
            if Instant::now() + every > give_up {
                return Ok(false);
            }
            thread::sleep(every);
        }
    }

    /// Redisson's `lock()`: try; if busy, subscribe, then loop { try; wait for
    /// a release message or the PTTL the try returned }; unsubscribe once
    /// done. A message that arrived while trying wakes the next wait at once,
    /// as Redisson's semaphore does.
    fn acquire_pubsub(&mut self, give_up: Instant) -> io::Result<bool> {
        if Kind::HashRecipe.took(&self.try_once()?) {
            return Ok(true);
        }
        let channel = channel(&self.key);
        self.sub_conn()?.send(&["SUBSCRIBE", &channel])?;
        let got = loop {
            let reply = self.try_once()?;
            if Kind::HashRecipe.took(&reply) {
                break true;
            }
            if Instant::now() >= give_up {
                break false;
            }
            let ttl = Duration::from_millis(reply.int().unwrap_or(0).max(0) as u64);
            let until = (Instant::now() + ttl).min(give_up);
            // Wait for one release message (the subscribe reply is not one).
            let sub = self.sub_conn()?;
            while let Some(msg) = sub.read_until(until)? {
                if msg.is_pubsub("message") {
                    break;
                }
            }
        };
        let sub = self.sub_conn()?;
        sub.send(&["UNSUBSCRIBE", &channel])?;
        // Messages may still come before the unsubscribe reply: drop them.
        while !sub.read()?.is_pubsub("unsubscribe") {}
        Ok(got)
    }

    fn sub_conn(&mut self) -> io::Result<&mut Conn> {
        self.sub
            .as_mut()
            .ok_or_else(|| io::Error::other("the hash recipe client has no pub/sub connection"))
    }

    /// Frees the lock; an answer other than "freed" is an error.
    pub fn release(&mut self) -> io::Result<()> {
        if self.waiting == Waiting::BlpopToken {
            // One token in all: the list is empty while anyone holds it.
            let list = token_list(&self.key);
            return match self.call(&["RPUSH", &list, "x"])? {
                Reply::Int(1) => Ok(()),
                other => Err(io::Error::other(format!(
                    "RPUSH of the token by {} answered {other:?} (more than one token?)",
                    self.owner
                ))),
            };
        }
        let kind = self.waiting.kind();
        let args = kind.release(&self.scripts, &self.key, &self.owner, &self.ttl);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let reply = self.call(&args)?;
        match reply {
            Reply::Int(0) if kind == Kind::Module => Ok(()),
            Reply::Int(1) if kind != Kind::Module => Ok(()),
            other => Err(io::Error::other(format!(
                "{} release by {} answered {other:?}",
                kind.label(),
                self.owner
            ))),
        }
    }
}
