//! One worker of the shared-hold stress tests (`tests/integration/shared_stress.rs`):
//! a reader or a writer of a read-write lock, or a permit holder of a
//! semaphore, looping until its run time is over.
//!
//! Usage: `shared_worker <ports> <role> <owner> <run-ms>`, where `<ports>` is
//! a comma-separated list of loopback ports (it talks to whichever is a
//! master, so a promoted replica takes over) and `<role>` is `reader`,
//! `writer` or `permit`.
//!
//! Each round: acquire (`writer`: exclusive; `reader`: `SHARED`; `permit`:
//! `SHARED LIMIT 3`; all with `WAIT`), then `LOCK.RENEW` at once, so the
//! worker knows a moment (unix ms) before which its lease surely still runs:
//! the renewal ran after it was sent. Then [`OPS`] operations, each through
//! the server-side script [`STORE`] with its fence and that moment; then
//! release. The test may
//! `SIGSTOP` it past its lease: it wakes believing it holds and carries on,
//! which is the point — the store must refuse it.
//!
//! Output, one item per line: `fence <n>` per hold, `ok`, `stale` or
//! `lapsed` per operation (the script's verdict), `lost` when the release
//! was refused, `timeout` per `WAIT` that ended without the lock,
//! `reconnect` per connection lost and found again (the worker then gives
//! up any hold it may have and begins a new round); `done` at the end.

use std::io::{self, Write};
use std::process::exit;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::{Connection, Value};

/// Each hold's lease. The test stops workers for longer than this.
const LEASE_MS: u64 = 1000;
/// The store counts an operation as within its lease only this long before
/// the lease's end as the worker reckons it: more than the server's
/// millisecond rounding of leases.
const MARGIN_MS: u64 = 50;
const WAIT_MS: &str = "5000";
/// Operations per hold, and the pause after each: a hold lasts long enough
/// for the test to catch a worker holding.
const OPS: usize = 3;
const OP_PAUSE: Duration = Duration::from_millis(10);
/// How long a worker keeps trying to reach a master after losing it.
const RECONNECT_FOR: Duration = Duration::from_secs(20);

/// The fenced store and its log, run atomically in the server.
///
/// KEYS: the lock, the store's fences (a hash: `seen`, the highest fence of
/// any operation; `written`, the fence of the last write), the log (a list),
/// the tallies (a hash). ARGV: the operation (`write`, `read`, `permit`), the
/// owner, the fence (below 2^53, so exact as a Lua number; it is stored and
/// logged as the text it came as), and the unix ms before which
/// the hold's lease surely runs, as the worker reckons it: an operation the
/// server runs before then is *within* its lease (worker and server share a
/// clock, one machine).
///
/// The store's rule: a write is accepted only with a fence at or above every
/// fence it has seen (equal: the same hold writing again, as fences are
/// unique); a read only with a fence at or above the last write's; a permit
/// operation only while the server counts the hold. Each operation also
/// asks the server (`LOCK.INFO`) whether the caller's hold, with this fence
/// and, for a write, exclusively, is what the lock holds now: `held`.
/// Accepted operations go to the log as
/// `op owner fence seconds microseconds held within holders`; the tallies
/// count them by verdict, and `inlease-…` counts refusals within a lease.
const STORE: &str = r"
local op, owner, fence = ARGV[1], ARGV[2], tonumber(ARGV[3])
if not fence then return redis.error_reply('ERR a fence is a number') end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local within = '0'
if now_ms < tonumber(ARGV[4]) then within = '1' end
-- LOCK.INFO's field names and its mode are status replies, which Lua sees
-- as {ok = text}.
local function text(v)
  if type(v) == 'table' and v.ok then return v.ok end
  return v
end
local function fields(reply)
  local f = {}
  for i = 1, #reply, 2 do f[text(reply[i])] = text(reply[i + 1]) end
  return f
end
local held, holders = 0, 0
local info = redis.call('LOCK.INFO', KEYS[1])
if info then
  local f = fields(info)
  holders = #f['holders']
  for _, h in ipairs(f['holders']) do
    local hf = fields(h)
    if hf['owner'] == owner and hf['fence'] == fence
        and (op ~= 'write' or f['mode'] == 'exclusive') then
      held = 1
    end
  end
end
local seen = tonumber(redis.call('HGET', KEYS[2], 'seen')) or 0
local written = tonumber(redis.call('HGET', KEYS[2], 'written')) or 0
local verdict = 'ok'
if op == 'write' then
  if fence < seen then verdict = 'stale' end
elseif op == 'read' then
  if fence < written then verdict = 'stale' end
elseif held == 0 then
  verdict = 'lapsed'
end
if verdict ~= 'ok' then
  redis.call('HINCRBY', KEYS[4], verdict .. '-' .. op, 1)
  if within == '1' then
    redis.call('HINCRBY', KEYS[4], 'inlease-' .. verdict .. '-' .. op, 1)
  end
  return verdict
end
if fence > seen then redis.call('HSET', KEYS[2], 'seen', ARGV[3]) end
if op == 'write' then redis.call('HSET', KEYS[2], 'written', ARGV[3]) end
redis.call('RPUSH', KEYS[3], table.concat(
  {op, owner, ARGV[3], t[1], t[2], held, within, holders}, ' '))
redis.call('HINCRBY', KEYS[4], 'accepted-' .. op, 1)
if held == 0 then
  redis.call('HINCRBY', KEYS[4], 'unheld-' .. op, 1)
  return 'lapsed'
end
return 'ok'
";

#[derive(Clone, Copy, PartialEq)]
enum Role {
    Reader,
    Writer,
    Permit,
}

impl Role {
    fn parse(text: &str) -> Option<Role> {
        match text {
            "reader" => Some(Role::Reader),
            "writer" => Some(Role::Writer),
            "permit" => Some(Role::Permit),
            _ => None,
        }
    }

    /// The lock, then the store's keys, as [`STORE`] takes them.
    fn keys(self) -> [&'static str; 4] {
        match self {
            Role::Permit => ["sem:lock", "sem:fences", "sem:log", "sem:tally"],
            _ => ["rw:lock", "rw:fences", "rw:log", "rw:tally"],
        }
    }

    fn op(self) -> &'static str {
        match self {
            Role::Reader => "read",
            Role::Writer => "write",
            Role::Permit => "permit",
        }
    }

    fn mode_args(self) -> &'static [&'static str] {
        match self {
            Role::Reader => &["SHARED"],
            Role::Writer => &[],
            Role::Permit => &["SHARED", "LIMIT", "3"],
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, ports, role, owner, run_ms] = args.as_slice() else {
        eprintln!("usage: shared_worker <ports> <reader|writer|permit> <owner> <run-ms>");
        exit(1);
    };
    let (Some(role), Ok(run_ms)) = (Role::parse(role), run_ms.parse::<u64>()) else {
        eprintln!("usage: shared_worker <ports> <reader|writer|permit> <owner> <run-ms>");
        exit(1);
    };
    let ports: Vec<&str> = ports.split(',').collect();
    if let Err(why) = run(&ports, role, owner, Duration::from_millis(run_ms)) {
        eprintln!("{owner}: {why}");
        exit(1);
    }
}

/// A command's outcome: a reply, an error reply, or the connection lost
/// (the command may or may not have run).
enum Outcome {
    Reply(Value),
    Refused(String),
    Lost,
}

struct Link<'a> {
    ports: &'a [&'a str],
    conn: Connection,
    /// The digest of [`STORE`] once loaded on the current server.
    digest: Option<String>,
}

impl Link<'_> {
    fn send(&mut self, args: &[&str]) -> Outcome {
        match redis::cmd(args[0]).arg(&args[1..]).query(&mut self.conn) {
            Ok(value) => Outcome::Reply(value),
            // Restarted and loading its data: as good as not there yet.
            Err(err) if err.code() == Some("LOADING") => Outcome::Lost,
            Err(err) if err.code().is_some() => Outcome::Refused(err.to_string()),
            Err(_) => Outcome::Lost,
        }
    }

    /// Runs [`STORE`] by its digest, loading it first when the server does
    /// not have it (at the start, and after a restart or a failover).
    fn store(&mut self, keys: &[&str], argv: &[&str]) -> Outcome {
        for _ in 0..2 {
            if self.digest.is_none() {
                match self.send(&["SCRIPT", "LOAD", STORE]) {
                    Outcome::Reply(Value::BulkString(digest)) => {
                        self.digest = Some(String::from_utf8_lossy(&digest).into_owned())
                    }
                    other => return other,
                }
            }
            let digest = self.digest.clone().unwrap_or_default();
            let numkeys = keys.len().to_string();
            let mut args = vec!["EVALSHA", digest.as_str(), numkeys.as_str()];
            args.extend_from_slice(keys);
            args.extend_from_slice(argv);
            match self.send(&args) {
                Outcome::Refused(why) if why.contains("NOSCRIPT") => self.digest = None,
                other => return other,
            }
        }
        Outcome::Refused("NOSCRIPT after SCRIPT LOAD".into())
    }

    /// Finds a master among the ports again, for as long as
    /// [`RECONNECT_FOR`]: the server restarts or a replica is promoted.
    fn reconnect(&mut self) -> Result<(), String> {
        let until = Instant::now() + RECONNECT_FOR;
        while Instant::now() < until {
            if let Some(conn) = master(self.ports) {
                self.conn = conn;
                self.digest = None;
                return Ok(());
            }
            thread::sleep(Duration::from_millis(20));
        }
        Err(format!("no master among ports {:?}", self.ports))
    }

    /// After a lost connection the worker cannot know whether its last
    /// command ran (an acquisition or a release may have), so it finds a
    /// master again and gives up any hold it may have there: otherwise its
    /// next acquisition could reenter a hold it thinks it released.
    fn recover(&mut self, lock: &str, owner: &str) -> Result<(), String> {
        loop {
            self.reconnect()?;
            if !matches!(
                self.send(&["LOCK.RELEASE", lock, owner, "ALL"]),
                Outcome::Lost
            ) {
                return Ok(());
            }
        }
    }
}

/// A connection to the first port whose server says it is a master.
fn master(ports: &[&str]) -> Option<Connection> {
    for port in ports {
        let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{port}/")) else {
            continue;
        };
        let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_secs(1)) else {
            continue;
        };
        // Longer than the WAIT, so a wait always ends with the server's reply.
        if conn
            .set_read_timeout(Some(Duration::from_secs(10)))
            .is_err()
        {
            continue;
        }
        // A server loading its data answers PING with an error.
        if redis::cmd("PING").query::<String>(&mut conn).is_err() {
            continue;
        }
        let role: Result<Vec<Value>, _> = redis::cmd("ROLE").query(&mut conn);
        if let Ok(role) = role {
            if matches!(role.first(), Some(Value::BulkString(r)) if r == b"master") {
                return Some(conn);
            }
        }
    }
    None
}

fn run(ports: &[&str], role: Role, owner: &str, run_for: Duration) -> Result<(), String> {
    let conn = master(ports).ok_or_else(|| format!("no master among ports {ports:?}"))?;
    let mut link = Link {
        ports,
        conn,
        digest: None,
    };
    let mut out = io::LineWriter::new(io::stdout().lock());
    let mut say = |line: &str| writeln!(out, "{line}").map_err(|e| e.to_string());
    let [lock, fences, log, tally] = role.keys();
    let lease = LEASE_MS.to_string();
    let stop_at = Instant::now() + run_for;
    while Instant::now() < stop_at {
        let mut acquire = vec!["LOCK.ACQUIRE", lock, owner, lease.as_str()];
        acquire.extend_from_slice(role.mode_args());
        acquire.extend_from_slice(&["WAIT", WAIT_MS]);
        let fence = match link.send(&acquire) {
            Outcome::Reply(Value::Int(fence)) => fence,
            Outcome::Reply(Value::Nil) => {
                say("timeout")?;
                continue;
            }
            Outcome::Lost => {
                say("reconnect")?;
                link.recover(lock, owner)?;
                continue;
            }
            other => return Err(format!("LOCK.ACQUIRE: {}", show(&other))),
        };
        say(&format!("fence {fence}"))?;
        let fence = fence.to_string();

        // The renewal happens after it is sent: the lease runs surely until
        // `sent + LEASE_MS`, whenever the grant came. The worker shares the
        // server's wall clock (one machine), so the store can judge each
        // operation by when it runs, late as a pause or a stop may make it.
        let sent = unix_ms();
        let within_until = match link.send(&["LOCK.RENEW", lock, owner, &lease]) {
            Outcome::Reply(Value::Int(1)) => sent + LEASE_MS - MARGIN_MS,
            _ => sent,
        }
        .to_string();
        let mut released = false;
        for _ in 0..OPS {
            // The pause comes first, so a worker stopped while holding
            // almost always has an operation still to send when it wakes.
            thread::sleep(OP_PAUSE);
            match link.store(
                &[lock, fences, log, tally],
                &[role.op(), owner, &fence, &within_until],
            ) {
                Outcome::Reply(Value::BulkString(verdict)) => {
                    say(&String::from_utf8_lossy(&verdict))?
                }
                Outcome::Reply(Value::SimpleString(verdict)) => say(&verdict)?,
                Outcome::Lost => {
                    say("reconnect")?;
                    link.recover(lock, owner)?;
                    released = true;
                    break;
                }
                other => return Err(format!("the store: {}", show(&other))),
            }
        }
        if released {
            continue;
        }
        match link.send(&["LOCK.RELEASE", lock, owner]) {
            Outcome::Reply(Value::Int(0)) => {}
            Outcome::Refused(why) if why.contains("NOTOWNER") => say("lost")?,
            Outcome::Lost => {
                say("reconnect")?;
                link.recover(lock, owner)?;
            }
            other => return Err(format!("LOCK.RELEASE: {}", show(&other))),
        }
    }
    say("done")
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
}

fn show(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Reply(value) => format!("replied {value:?}"),
        Outcome::Refused(why) => format!("refused: {why}"),
        Outcome::Lost => "connection lost".into(),
    }
}
