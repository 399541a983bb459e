//! [`Call`]: one-line commands on a `redis` crate connection, plain or
//! cluster, whose error replies come back as text (`"NOTOWNER ..."`); the
//! [`LockInfo`] reader; and [`wait_on`], a blocking `LOCK.ACQUIRE … WAIT`
//! sent from a thread of its own.

use std::thread::{self, JoinHandle};
use std::time::Instant;

use redis::{Connection, RedisError, ToRedisArgs, Value};

use crate::REPLY_TIMEOUT;

/// A reply, or the text of an error reply (`"NOTOWNER not the owner"`).
pub type Reply = Result<Value, String>;

/// The text of an error reply, code first, as the server sent it.
pub fn error_text(err: &RedisError) -> Option<String> {
    let code = err.code()?;
    Some(match err.detail() {
        Some(detail) => format!("{code} {detail}"),
        None => code.to_string(),
    })
}

/// A command for messages: `LOCK.ACQUIRE k "o\x00" 1000`.
pub fn show_args<A: ToRedisArgs>(args: &A) -> String {
    args.to_redis_args()
        .iter()
        .map(|arg| {
            let text = arg.escape_ascii().to_string();
            if text.is_empty() || text.len() != arg.len() || text.contains(' ') {
                format!("\"{text}\"")
            } else {
                text
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// One-line commands on a connection. Every method panics when the server
/// cannot be reached: a lost connection is a failed test, never an error reply.
pub trait Call {
    /// Sends one command (each element of `args` is one argument).
    fn call<A: ToRedisArgs>(&mut self, args: A) -> Reply;

    /// The integer reply of a command that must answer one.
    fn int<A: ToRedisArgs>(&mut self, args: A) -> i64 {
        let shown = show_args(&args);
        match self.call(args) {
            Ok(Value::Int(n)) => n,
            other => panic!("{shown}: expected an integer, got {other:?}"),
        }
    }

    /// The reply of a command that must succeed, converted.
    fn value<T: redis::FromRedisValue, A: ToRedisArgs>(&mut self, args: A) -> T {
        let shown = show_args(&args);
        match self.call(args) {
            Ok(value) => redis::from_redis_value(value.clone())
                .unwrap_or_else(|e| panic!("{shown}: unexpected reply {value:?}: {e}")),
            Err(err) => panic!("{shown}: error {err}"),
        }
    }

    /// Asserts a nil reply.
    fn nil<A: ToRedisArgs>(&mut self, args: A) {
        let shown = show_args(&args);
        match self.call(args) {
            Ok(Value::Nil) => {}
            other => panic!("{shown}: expected nil, got {other:?}"),
        }
    }

    /// The text of the error reply of a command that must fail.
    fn err<A: ToRedisArgs>(&mut self, args: A) -> String {
        let shown = show_args(&args);
        match self.call(args) {
            Err(text) => text,
            Ok(value) => panic!("{shown}: expected an error, got {value:?}"),
        }
    }

    /// `LOCK.ACQUIRE key owner ttl`: the fence, or `None` when another owner
    /// holds the lock. Panics on an error reply.
    fn acquire(&mut self, key: &str, owner: &str, ttl_ms: i64) -> Option<i64> {
        match self.call(&["LOCK.ACQUIRE", key, owner, &ttl_ms.to_string()]) {
            Ok(Value::Int(fence)) => Some(fence),
            Ok(Value::Nil) => None,
            other => panic!("LOCK.ACQUIRE {key} {owner} {ttl_ms}: got {other:?}"),
        }
    }

    /// `LOCK.INFO key`, RESP2 or RESP3, read field by field.
    fn lock_info(&mut self, key: &str) -> Option<LockInfo> {
        match self.call(&["LOCK.INFO", key]) {
            Ok(Value::Nil) => None,
            Ok(value) => Some(
                LockInfo::from_reply(&value)
                    .unwrap_or_else(|why| panic!("LOCK.INFO {key}: {why}: {value:?}")),
            ),
            Err(err) => panic!("LOCK.INFO {key}: error {err}"),
        }
    }

    /// `WAIT replicas`: returns once that many replicas acknowledged every
    /// write this connection made (another connection's writes do not count).
    fn wait_replicas(&mut self, replicas: i64) {
        let timeout_ms = REPLY_TIMEOUT.as_millis().to_string();
        let acked = self.int(&["WAIT", &replicas.to_string(), &timeout_ms]);
        assert_eq!(acked, replicas, "WAIT: replicas did not acknowledge");
    }

    /// `PTTL key`.
    fn pttl(&mut self, key: &str) -> i64 {
        self.int(&["PTTL", key])
    }

    /// An integer field of `INFO section` read on this connection, for a
    /// server that new connections cannot reach (it now wants a password).
    fn info_int(&mut self, section: &str, name: &str) -> i64 {
        let info: String = self.value(&["INFO", section]);
        info.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or_else(|| panic!("no integer {name} in INFO {section}:\n{info}"))
    }
}

/// Through a cluster client: each command goes to the node serving its key
/// (the key at position 1), following `MOVED` and `ASK` redirections.
impl Call for redis::cluster::ClusterConnection {
    fn call<A: ToRedisArgs>(&mut self, args: A) -> Reply {
        let shown = show_args(&args);
        let mut cmd = redis::Cmd::new();
        cmd.arg(args);
        cmd.query::<Value>(self).map_err(|err| {
            error_text(&err).unwrap_or_else(|| panic!("{shown}: cluster request failed: {err}"))
        })
    }
}

impl Call for Connection {
    fn call<A: ToRedisArgs>(&mut self, args: A) -> Reply {
        let shown = show_args(&args);
        let mut cmd = redis::Cmd::new();
        cmd.arg(args);
        cmd.query::<Value>(self).map_err(|err| {
            error_text(&err).unwrap_or_else(|| panic!("{shown}: connection failed: {err}"))
        })
    }
}

/// `LOCK.ACQUIRE key owner ttl WAIT timeout` sent on `conn` from a thread
/// of its own, as it may block; the thread returns the reply. Returns at
/// once: wait on the server's state (`LOCK.INFO` `waiters`) to know it waits.
pub fn wait_on<C: Call + Send + 'static>(
    mut conn: C,
    key: &str,
    owner: &str,
    ttl_ms: i64,
    timeout_ms: i64,
) -> JoinHandle<Reply> {
    let args = wait_args(key, owner, ttl_ms, timeout_ms);
    thread::spawn(move || conn.call(&args))
}

/// [`wait_on`], and when the reply arrived: for tests that time a hand-off.
pub fn wait_on_timed<C: Call + Send + 'static>(
    mut conn: C,
    key: &str,
    owner: &str,
    ttl_ms: i64,
    timeout_ms: i64,
) -> JoinHandle<(Reply, Instant)> {
    let args = wait_args(key, owner, ttl_ms, timeout_ms);
    thread::spawn(move || {
        let reply = conn.call(&args);
        (reply, Instant::now())
    })
}

/// The arguments of `LOCK.ACQUIRE key owner ttl-ms WAIT timeout-ms`.
pub fn wait_args(key: &str, owner: &str, ttl_ms: i64, timeout_ms: i64) -> [String; 6] {
    [
        "LOCK.ACQUIRE".to_string(),
        key.to_string(),
        owner.to_string(),
        ttl_ms.to_string(),
        "WAIT".to_string(),
        timeout_ms.to_string(),
    ]
}

/// The fence a waiter ([`wait_on`]) was handed; panics if it got anything
/// else.
pub fn handed_fence(waiter: JoinHandle<Reply>, who: &str) -> i64 {
    match waiter.join().expect("the waiter's thread") {
        Ok(Value::Int(fence)) => fence,
        other => panic!("{who} was not handed the lock: {other:?}"),
    }
}

/// A lock's owner, count and fence: what `LOCK.INFO` shows that does not move
/// with time.
pub type Hold = (Vec<u8>, i64, i64);

/// A held lock as `LOCK.INFO` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockInfo {
    pub owner: Vec<u8>,
    pub count: i64,
    pub fence: i64,
    /// Milliseconds left on the lease.
    pub ttl: i64,
    pub waiters: i64,
    /// `exclusive` or `shared`.
    pub mode: String,
    /// The shared limit (0: none, or exclusive).
    pub limit: i64,
    /// One entry per owner, oldest hold first.
    pub holders: Vec<HolderInfo>,
}

/// One owner's hold as `LOCK.INFO` lists it under `holders`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HolderInfo {
    pub owner: String,
    pub count: i64,
    pub fence: i64,
    pub ttl: i64,
    /// Milliseconds since the hold began.
    pub held: i64,
    /// Whether the hold is bound to its connection (`EPHEMERAL`).
    pub ephemeral: bool,
}

/// The field/value pairs of a RESP2 flat array or a RESP3 map.
fn pairs(value: &Value) -> Result<Vec<(&Value, &Value)>, String> {
    match value {
        Value::Array(items) if items.len() % 2 == 0 => {
            Ok(items.chunks(2).map(|pair| (&pair[0], &pair[1])).collect())
        }
        Value::Map(pairs) => Ok(pairs.iter().map(|(k, v)| (k, v)).collect()),
        _ => Err("not a field/value array or map".into()),
    }
}

/// The value of field `name` among `pairs` (from [`pairs`]).
fn field<'a>(pairs: &[(&'a Value, &'a Value)], name: &str) -> Result<&'a Value, String> {
    pairs
        .iter()
        .find(|(k, _)| text(k).as_deref() == Some(name))
        .map(|(_, v)| *v)
        .ok_or_else(|| format!("no field {name}"))
}

/// Field `name` among `pairs`, which must be an integer.
fn int(pairs: &[(&Value, &Value)], name: &str) -> Result<i64, String> {
    match field(pairs, name)? {
        Value::Int(n) => Ok(*n),
        other => Err(format!("{name} is not an integer: {other:?}")),
    }
}

impl HolderInfo {
    fn from_reply(value: &Value) -> Result<HolderInfo, String> {
        let pairs = pairs(value)?;
        let field = |name: &str| field(&pairs, name).map_err(|e| format!("holder: {e}"));
        let int = |name: &str| int(&pairs, name).map_err(|e| format!("holder: {e}"));
        Ok(HolderInfo {
            owner: text(field("owner")?).ok_or("holder owner is not a string")?,
            count: int("count")?,
            fence: int("fence")?,
            ttl: int("ttl")?,
            held: int("held")?,
            ephemeral: int("ephemeral")? == 1,
        })
    }
}

impl LockInfo {
    /// Reads the RESP2 field/value array or the RESP3 map by field name
    /// (the command reference allows more fields later).
    pub fn from_reply(value: &Value) -> Result<LockInfo, String> {
        let pairs = pairs(value)?;
        let field = |name: &str| field(&pairs, name);
        let int = |name: &str| int(&pairs, name);
        let owner = match field("owner")? {
            Value::BulkString(bytes) => bytes.clone(),
            // A shared lock has no one owner.
            Value::Nil => Vec::new(),
            other => Err(format!("owner is not a bulk string: {other:?}"))?,
        };
        let holders = match field("holders") {
            Ok(Value::Array(items)) => items
                .iter()
                .map(HolderInfo::from_reply)
                .collect::<Result<_, _>>()?,
            Ok(other) => Err(format!("holders is not an array: {other:?}"))?,
            Err(_) => Vec::new(),
        };
        Ok(LockInfo {
            owner,
            count: int("count")?,
            fence: int("fence")?,
            ttl: int("ttl")?,
            waiters: int("waiters")?,
            mode: field("mode").ok().and_then(text).unwrap_or_default(),
            limit: int("limit").unwrap_or(0),
            holders,
        })
    }

    /// The owner as text (an owner that is not UTF-8 shows replacement
    /// characters).
    pub fn owner_text(&self) -> String {
        String::from_utf8_lossy(&self.owner).into_owned()
    }

    /// What does not move with time: owner, count, fence.
    pub fn held(&self) -> Hold {
        (self.owner.clone(), self.count, self.fence)
    }
}

/// A bulk or simple string reply as text.
pub fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Okay => Some("OK".into()),
        _ => None,
    }
}
