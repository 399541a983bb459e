//! A step of the server's wall clock under a holder, for the module and the
//! two recipes. Each scenario gets a server of its own, started under the
//! test kit's preload shim, which moves its wall clock and leaves its
//! monotonic clock alone (as NTP stepping a drifted clock, a VM resumed
//! or migrated, or an operator's `date -s` would); every time here is read
//! on this process's monotonic clock.
//!
//! - **Forward**: A takes a 10 s lease and renews it every 3 s (as a
//!   watchdog does); 1 s in, the wall clock jumps forward by the step. B
//!   tries every 5 ms. Figures: how long after the step B first holds the
//!   lock, and how long that overlaps A's lease as A counts it (the send
//!   time of its last renew that succeeded, plus the lease).
//! - **Backward**: A takes a 2 s lease and crashes (sends nothing more);
//!   the wall clock jumps back by the step. B tries every 5 ms. Figure: how
//!   long after A's acquire B holds the lock (the lease says 2 s).
//!
//! The recipes' renewals are their compare-and-`PEXPIRE` scripts; B polls
//! in every case, so the figures say when the lock could be taken, not how
//! a waiter learns of it.

use std::fmt::Write as _;
use std::thread;
use std::time::{Duration, Instant};

use redis::Value;
use redislock_testkit::{ClockShift, Server};

use super::{owner, Ctx, Results};
use crate::locks::{Kind, HASH_ACQUIRE_LUA};
use crate::markdown::{millis, Table};
use crate::Res;

/// The subjects, in the order of the table's columns.
pub const KINDS: [Kind; 3] = [Kind::Module, Kind::StringRecipe, Kind::HashRecipe];

const FORWARD_LEASE: Duration = Duration::from_secs(10);
const RENEW_EVERY: Duration = Duration::from_secs(3);
const STEP_AFTER: Duration = Duration::from_secs(1);
/// How long B keeps trying after a forward step: past A's lease, had A
/// stopped renewing at the step.
const FORWARD_WINDOW: Duration = Duration::from_secs(12);
const BACKWARD_LEASE: Duration = Duration::from_secs(2);
const POLL: Duration = Duration::from_millis(5);

/// The recipes' renewals: KEYS[1] lock, ARGV[1] owner, ARGV[2] lease (ms);
/// 1 if renewed, 0 if the owner no longer holds it.
const STRING_RENEW_LUA: &str = "\
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0";
const HASH_RENEW_LUA: &str = "\
if redis.call('hexists', KEYS[1], ARGV[1]) == 1 then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0";

/// What one forward step did.
#[derive(Clone, Copy, Debug)]
pub struct Forward {
    /// When B first held the lock, ms after the step (None: not within
    /// the window).
    pub taken_after_ms: Option<f64>,
    /// How long B's hold overlapped A's lease as A counts it, ms.
    pub overlap_ms: f64,
}

/// Everything the section measured: kind → figure.
#[derive(Default)]
pub struct ClockResults {
    pub step: Duration,
    pub forward: Vec<(Kind, Forward)>,
    /// Kind → ms from A's acquire to B's hold (None: not within the cap).
    pub backward: Vec<(Kind, Option<f64>)>,
    pub cap: Duration,
}

/// Runs the section.
pub fn run(ctx: &Ctx, r: &mut Results) {
    let step = ctx.plan.clock_step;
    r.clock.step = step;
    r.clock.cap = step + BACKWARD_LEASE + Duration::from_secs(5);
    for kind in KINDS {
        let what = format!("clock step forward, {}", kind.label());
        if let Some(f) = r.attempt(&what, || forward(ctx, kind, step)) {
            eprintln!(
                "  +{} s, {:<14} B holds after {}, overlap {}",
                step.as_secs(),
                kind.label(),
                f.taken_after_ms.map_or("-".into(), millis),
                millis(f.overlap_ms)
            );
            r.clock.forward.push((kind, f));
        }
    }
    for kind in KINDS {
        let what = format!("clock step backward, {}", kind.label());
        let cap = r.clock.cap;
        if let Some(b) = r.attempt(&what, || backward(ctx, kind, step, cap)) {
            eprintln!(
                "  -{} s, {:<14} B holds {} after A's acquire",
                step.as_secs(),
                kind.label(),
                b.map_or("-".into(), millis)
            );
            r.clock.backward.push((kind, b));
        }
    }
}

fn server(ctx: &Ctx, shift: &ClockShift) -> Res<Server> {
    Ok(Server::builder()
        .label("clock step")
        .module(ctx.module)
        .clock_shift(shift)
        .try_start()?)
}

fn ms(d: Duration) -> String {
    d.as_millis().to_string()
}

fn since_ms(from: Instant, to: Instant) -> f64 {
    to.saturating_duration_since(from).as_secs_f64() * 1000.0
}

/// One attempt to take `key` for `who` with `lease`: whether it was taken.
fn acquire(
    c: &mut redis::Connection,
    kind: Kind,
    key: &str,
    who: &str,
    lease: Duration,
) -> Res<bool> {
    let reply: Value = match kind {
        Kind::Module => redis::cmd("LOCK.ACQUIRE")
            .arg(&[key, who, &ms(lease)])
            .query(c)?,
        Kind::StringRecipe | Kind::Raw => redis::cmd("SET")
            .arg(&[key, who, "NX", "PX", &ms(lease)])
            .query(c)?,
        Kind::HashRecipe => redis::cmd("EVAL")
            .arg(&[HASH_ACQUIRE_LUA, "1", key, &ms(lease), who])
            .query(c)?,
    };
    Ok(match kind {
        Kind::HashRecipe => matches!(reply, Value::Nil),
        _ => !matches!(reply, Value::Nil),
    })
}

/// One renewal of `who`'s hold: whether the server still counted it.
fn renew(
    c: &mut redis::Connection,
    kind: Kind,
    key: &str,
    who: &str,
    lease: Duration,
) -> Res<bool> {
    let script = match kind {
        Kind::Module => {
            let reply: redis::RedisResult<Value> = redis::cmd("LOCK.RENEW")
                .arg(&[key, who, &ms(lease)])
                .query(c);
            return match reply {
                Ok(_) => Ok(true),
                Err(e) if e.code() == Some("NOTOWNER") => Ok(false),
                Err(e) => Err(e.into()),
            };
        }
        Kind::HashRecipe => HASH_RENEW_LUA,
        Kind::StringRecipe | Kind::Raw => STRING_RENEW_LUA,
    };
    let renewed: i64 = redis::cmd("EVAL")
        .arg(&[script, "1", key, who, &ms(lease)])
        .query(c)?;
    Ok(renewed == 1)
}

/// One trial's start: a server of its own under a clock shift, A holding
/// the lock with `lease`, B's connection ready.
struct Scene {
    shift: ClockShift,
    _server: Server,
    a: redis::Connection,
    b: redis::Connection,
    key: &'static str,
    holder: String,
    taker: String,
    start: Instant,
}

impl Scene {
    fn new(ctx: &Ctx, kind: Kind, lease: Duration) -> Res<Scene> {
        let shift = ClockShift::new();
        let server = server(ctx, &shift)?;
        let mut a = server.try_conn()?;
        let b = server.try_conn()?;
        let (key, holder, taker) = ("clock:lock", owner(), owner());
        let start = Instant::now();
        if !acquire(&mut a, kind, key, &holder, lease)? {
            return Err("A could not take a free lock".into());
        }
        Ok(Scene {
            shift,
            _server: server,
            a,
            b,
            key,
            holder,
            taker,
            start,
        })
    }
}

fn forward(ctx: &Ctx, kind: Kind, step: Duration) -> Res<Forward> {
    let Scene {
        mut shift,
        _server,
        mut a,
        mut b,
        key,
        holder,
        taker,
        start,
    } = Scene::new(ctx, kind, FORWARD_LEASE)?;
    // A's lease as A counts it: from the send of its last confirmed call.
    let mut a_until = start + FORWARD_LEASE;
    let mut a_renews = true;
    let mut next_renew = start + RENEW_EVERY;
    let step_at = start + STEP_AFTER;
    let mut stepped: Option<Instant> = None;
    loop {
        let now = Instant::now();
        if stepped.is_none() && now >= step_at {
            shift.step(i64::try_from(step.as_millis())?);
            stepped = Some(Instant::now());
        }
        if a_renews && now >= next_renew {
            if renew(&mut a, kind, key, &holder, FORWARD_LEASE)? {
                a_until = now + FORWARD_LEASE;
            } else {
                a_renews = false;
            }
            next_renew += RENEW_EVERY;
        }
        if let Some(at) = stepped {
            if acquire(&mut b, kind, key, &taker, FORWARD_LEASE)? {
                let got = Instant::now();
                return Ok(Forward {
                    taken_after_ms: Some(since_ms(at, got)),
                    overlap_ms: since_ms(got, a_until),
                });
            }
            if now >= at + FORWARD_WINDOW {
                return Ok(Forward {
                    taken_after_ms: None,
                    overlap_ms: 0.0,
                });
            }
        }
        thread::sleep(POLL);
    }
}

fn backward(ctx: &Ctx, kind: Kind, step: Duration, cap: Duration) -> Res<Option<f64>> {
    let Scene {
        mut shift,
        _server,
        a,
        mut b,
        key,
        taker,
        start,
        ..
    } = Scene::new(ctx, kind, BACKWARD_LEASE)?;
    // A crashes: it sends nothing more.
    drop(a);
    shift.step(-i64::try_from(step.as_millis())?);
    while start.elapsed() < cap {
        if acquire(&mut b, kind, key, &taker, BACKWARD_LEASE)? {
            return Ok(Some(since_ms(start, Instant::now())));
        }
        thread::sleep(POLL);
    }
    Ok(None)
}

/// The section's table.
pub fn render(r: &Results, out: &mut String) {
    let c = &r.clock;
    if c.forward.is_empty() && c.backward.is_empty() {
        return;
    }
    let s = c.step.as_secs();
    let _ = writeln!(
        out,
        "### A step of the server's wall clock (its monotonic clock untouched)\n"
    );
    let mut header = vec!["step".to_string()];
    header.extend(KINDS.iter().map(|k| k.label().to_string()));
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut t = Table::new(&header);
    let mut row = vec![format!(
        "+{s} s while A holds a 10 s lease, renewing every 3 s: B holds after / overlap with A's lease"
    )];
    for kind in KINDS {
        row.push(match c.forward.iter().find(|(k, _)| *k == kind) {
            Some((_, f)) => match f.taken_after_ms {
                Some(after) => format!("{} / **{}**", millis(after), millis(f.overlap_ms)),
                None => format!("not within {} s / 0", FORWARD_WINDOW.as_secs()),
            },
            None => "error".into(),
        });
    }
    t.row(row);
    let mut row = vec![format!(
        "−{s} s, A holds a 2 s lease and crashes: B holds after"
    )];
    for kind in KINDS {
        row.push(match c.backward.iter().find(|(k, _)| *k == kind) {
            Some((_, Some(after))) => millis(*after),
            Some((_, None)) => format!("not within {} s", c.cap.as_secs()),
            None => "error".into(),
        });
    }
    t.row(row);
    out.push_str(&t.render());
    let _ = writeln!(
        out,
        "\nOne trial each, a server of its own per trial, times on the bench's monotonic clock; B tries every {} ms.\n",
        POLL.as_millis()
    );
}
