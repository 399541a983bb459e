//! The Rust client's driver for the conformance suite (`tests/conformance/`
//! at the repository root): reads requests of the line protocol in
//! `docs/conformance.md` on standard input, runs each on a task of its own
//! over this crate's async API, and writes replies and `! lost` events on
//! standard output.
//!
//! ```text
//! cargo build --release -p redislock-client --examples
//! LOCK_DRIVER=target/release/examples/conformance_driver \
//!   cargo test --release --test conformance
//! ```
//!
//! How the protocol's words map onto this client: `obj` names a read-write
//! handle ([`Client::rw_lock`]) or a [`Semaphore`]; for `kind=lock` it has
//! no meaning, since every lock call has an owner of its own. `thread` is
//! accepted and has no effect for the same reason. `cancel=<ms>` drops the
//! call's future after that long, the way `tokio::time::timeout` does.

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redislock_client::{
    Client, Error, Guard, LockOptions, LossReason, LossSignal, MultiGuard, Redlock, RwLock,
    Semaphore,
};
use tokio::io::{AsyncBufReadExt, BufReader};

/// Where the locks are: one server (or cluster, or Sentinel) or Redlock.
#[derive(Clone)]
enum Target {
    One(Client),
    Redlock(Redlock),
}

/// One hold the suite named with `h=`: the guard while this driver still
/// has it, and its loss signal, which outlives a guard consumed by a
/// release of every hold.
struct Hold {
    guard: Option<Held>,
    loss: LossSignal,
    fence: u64,
}

/// A guard on one key, or on several at once (`keys=`).
enum Held {
    One(Guard),
    Many(MultiGuard),
}

impl Held {
    fn held(&self) -> bool {
        match self {
            Held::One(guard) => guard.count() > 0,
            Held::Many(guard) => guard.is_held(),
        }
    }

    async fn renew(&mut self, ttl: Option<Duration>) -> Result<(), Error> {
        match (self, ttl) {
            (Held::One(guard), Some(ttl)) => guard.renew_for(ttl).await,
            (Held::One(guard), None) => guard.renew().await,
            (Held::Many(guard), Some(ttl)) => guard.renew_for(ttl).await,
            (Held::Many(guard), None) => guard.renew().await,
        }
    }

    async fn stop_renewing(&mut self) {
        match self {
            Held::One(guard) => guard.stop_renewing().await,
            Held::Many(guard) => guard.stop_renewing().await,
        }
    }
}

/// A shared object the suite named with `obj=`.
#[derive(Clone)]
enum Obj {
    Rw(RwLock),
    Sem(Semaphore),
}

#[derive(Default)]
struct State {
    target: Option<Target>,
    holds: HashMap<String, Arc<tokio::sync::Mutex<Hold>>>,
    objs: HashMap<String, Obj>,
}

type Shared = Arc<Mutex<State>>;

/// One line out, flushed: replies and events never interleave mid-line.
fn emit(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// A failed request: its kind, and a message for people.
struct Fail(&'static str, String);

impl Fail {
    fn bad(why: impl Into<String>) -> Fail {
        Fail("bad-request", why.into())
    }
}

impl From<Error> for Fail {
    fn from(err: Error) -> Fail {
        let kind = match &err {
            Error::WouldBlock | Error::NoQuorum { .. } => "not-obtained",
            Error::TimedOut => "timeout",
            Error::NotOwner => "not-owner",
            Error::Lost(_) => "lost",
            Error::Upgrade => "upgrade",
            Error::LimitMismatch => "limit-mismatch",
            Error::Quarantine => "quarantine",
            Error::InvalidOptions(_) => "refused",
            _ => "transport",
        };
        Fail(kind, err.to_string())
    }
}

fn reason_word(reason: LossReason) -> &'static str {
    match reason {
        LossReason::Expired => "expired",
        LossReason::NotOwner => "not-owner",
        LossReason::Disconnected => "disconnected",
        LossReason::ReleaseUnconfirmed => "release-unconfirmed",
        _ => "unknown",
    }
}

/// A request's `name=value` arguments.
struct Args(HashMap<String, String>);

impl Args {
    fn parse(words: &[&str]) -> Result<Args, Fail> {
        let mut map = HashMap::new();
        for word in words {
            let (name, value) = word
                .split_once('=')
                .ok_or_else(|| Fail::bad(format!("not name=value: {word}")))?;
            map.insert(name.to_string(), value.to_string());
        }
        Ok(Args(map))
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    fn need(&self, name: &str) -> Result<&str, Fail> {
        self.get(name)
            .ok_or_else(|| Fail::bad(format!("missing {name}=")))
    }

    fn ms(&self, name: &str) -> Result<Option<u64>, Fail> {
        self.get(name)
            .map(|v| {
                v.parse::<u64>()
                    .map_err(|_| Fail::bad(format!("{name}= is not a number of ms: {v}")))
            })
            .transpose()
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let state: Shared = Arc::default();
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut running = Vec::new();
    while let Ok(Some(line)) = lines.next_line().await {
        let words: Vec<&str> = line.split_whitespace().collect();
        let (Some(id), Some(verb)) = (words.first(), words.get(1)) else {
            continue;
        };
        let id = id.to_string();
        if *verb == "quit" {
            emit(&format!("{id} ok"));
            std::process::exit(0);
        }
        let verb = verb.to_string();
        let args = Args::parse(&words[2..]);
        let state = state.clone();
        running.push(tokio::spawn(async move {
            let reply = match args {
                Ok(args) => run(&state, &verb, &args).await,
                Err(fail) => Err(fail),
            };
            match reply {
                Ok(fields) if fields.is_empty() => emit(&format!("{id} ok")),
                Ok(fields) => emit(&format!("{id} ok {fields}")),
                Err(Fail(kind, text)) => emit(&format!("{id} err {kind} {text}")),
            }
        }));
    }
    // Standard input closed: holds still open are abandoned, as a crashing
    // application would leave them.
    std::process::exit(0);
}

async fn run(state: &Shared, verb: &str, args: &Args) -> Result<String, Fail> {
    match verb {
        "connect" => connect(state, args).map(|()| String::new()),
        "acquire" => acquire(state, args).await,
        "renew" => {
            let hold = hold(state, args)?;
            let ttl = args.ms("ttl")?.map(Duration::from_millis);
            let mut hold = hold.lock().await;
            let guard = hold.guard.as_mut().ok_or_else(released)?;
            guard.renew(ttl).await?;
            Ok(String::new())
        }
        "release" => release(state, args).await,
        "stop-renew" => {
            let hold = hold(state, args)?;
            let mut hold = hold.lock().await;
            let guard = hold.guard.as_mut().ok_or_else(released)?;
            guard.stop_renewing().await;
            Ok(String::new())
        }
        "resume" => resume(state, args).await,
        "status" => {
            let hold = hold(state, args)?;
            let hold = hold.lock().await;
            let lost = hold.loss.is_lost();
            let held = !lost && hold.guard.as_ref().is_some_and(Held::held);
            let reason = hold.loss.reason().map_or("-", reason_word);
            Ok(format!(
                "held={} lost={} reason={reason} fence={}",
                u8::from(held),
                u8::from(lost),
                hold.fence
            ))
        }
        "leaks" => {
            let target = target(state)?;
            let running = match target {
                Target::One(client) => client.background_tasks(),
                Target::Redlock(redlock) => redlock.background_tasks(),
            };
            Ok(format!("running={running}"))
        }
        other => Err(Fail("unsupported", format!("unknown verb {other}"))),
    }
}

fn released() -> Fail {
    Fail("not-owner", "this handle was released".into())
}

fn target(state: &Shared) -> Result<Target, Fail> {
    let state = state.lock().unwrap_or_else(|e| e.into_inner());
    state
        .target
        .clone()
        .ok_or_else(|| Fail::bad("connect first"))
}

fn hold(state: &Shared, args: &Args) -> Result<Arc<tokio::sync::Mutex<Hold>>, Fail> {
    let h = args.need("h")?;
    let state = state.lock().unwrap_or_else(|e| e.into_inner());
    state
        .holds
        .get(h)
        .cloned()
        .ok_or_else(|| Fail::bad(format!("no hold h={h}")))
}

fn connect(state: &Shared, args: &Args) -> Result<(), Fail> {
    let topology = args.get("topology").unwrap_or("single");
    let target = match topology {
        "single" => Target::One(Client::open(args.need("url")?)?),
        "cluster" => Target::One(Client::cluster([args.need("url")?])?),
        "sentinel" => Target::One(Client::sentinel([args.need("url")?], args.need("master")?)?),
        "redlock" => Target::Redlock(Redlock::new(
            args.need("urls")?.split(',').collect::<Vec<_>>(),
        )?),
        other => return Err(Fail::bad(format!("unknown topology {other}"))),
    };
    state.lock().unwrap_or_else(|e| e.into_inner()).target = Some(target);
    Ok(())
}

/// The lock options an `acquire` or `resume` asks for.
fn options(args: &Args) -> Result<LockOptions, Fail> {
    let mut opts = match args.ms("ttl")? {
        Some(ttl) => LockOptions::new(Duration::from_millis(ttl)),
        None => LockOptions::default(),
    };
    opts = match args.get("wait") {
        None => opts,
        Some("forever") => opts.wait_forever(),
        Some(_) => opts.wait(Duration::from_millis(args.ms("wait")?.unwrap_or(0))),
    };
    match args.get("renew") {
        None | Some("auto") => {}
        Some("off") => opts = opts.watchdog(false),
        Some(other) => return Err(Fail::bad(format!("renew={other}"))),
    }
    match args.get("ephemeral") {
        None | Some("0") => {}
        Some("1") => opts = opts.ephemeral(true),
        Some(other) => return Err(Fail::bad(format!("ephemeral={other}"))),
    }
    Ok(opts)
}

/// Runs `call`, dropping it after `cancel=` ms if given.
async fn cancellable<T>(
    args: &Args,
    call: impl std::future::Future<Output = Result<T, Error>>,
) -> Result<T, Fail> {
    match args.ms("cancel")? {
        None => Ok(call.await?),
        Some(ms) => match tokio::time::timeout(Duration::from_millis(ms), call).await {
            Ok(reply) => Ok(reply?),
            Err(_) => Err(Fail("cancelled", format!("cancelled after {ms} ms"))),
        },
    }
}

/// The read-write handle or semaphore named `obj=`, made on first use.
fn object(state: &Shared, args: &Args, target: &Target, kind: &str) -> Result<Obj, Fail> {
    let Target::One(client) = target else {
        return Err(Fail(
            "unsupported",
            "Redlock has exclusive locks only".into(),
        ));
    };
    let key = args.need("key")?;
    let made = |limit: u32| -> Result<Obj, Fail> {
        Ok(match kind {
            "permit" => Obj::Sem(client.semaphore(key, limit)?),
            _ => Obj::Rw(client.rw_lock(key)),
        })
    };
    let limit = match args.get("limit") {
        None => 1,
        Some(v) => v.parse().map_err(|_| Fail::bad(format!("limit={v}")))?,
    };
    let Some(name) = args.get("obj") else {
        return made(limit);
    };
    let mut state = state.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(obj) = state.objs.get(name) {
        return Ok(obj.clone());
    }
    let obj = made(limit)?;
    state.objs.insert(name.to_string(), obj.clone());
    Ok(obj)
}

async fn acquire(state: &Shared, args: &Args) -> Result<String, Fail> {
    let h = args.need("h")?.to_string();
    let kind = args.get("kind").unwrap_or("lock");
    let opts = options(args)?;
    let wait = args.get("wait").is_some();
    let target = target(state)?;
    if let Some(keys) = args.get("keys") {
        let keys: Vec<&str> = keys.split(',').collect();
        let (Target::One(client), "lock") = (&target, kind) else {
            return Err(Fail(
                "unsupported",
                "several keys at once: exclusive locks on one server".into(),
            ));
        };
        let guard = if wait {
            cancellable(args, client.lock_keys(&keys, &opts)).await?
        } else {
            cancellable(args, client.try_lock_keys(&keys, &opts)).await?
        };
        return Ok(keep_many(state, h, guard));
    }
    let key = args.need("key")?.to_string();
    let permits = match args.get("permits") {
        None => 1,
        Some(v) => v.parse().map_err(|_| Fail::bad(format!("permits={v}")))?,
    };
    let guard = match (kind, &target) {
        ("lock", Target::One(client)) => {
            if wait {
                cancellable(args, client.lock(&key, &opts)).await?
            } else {
                cancellable(args, client.try_lock(&key, &opts)).await?
            }
        }
        ("lock", Target::Redlock(redlock)) => {
            if wait {
                cancellable(args, redlock.lock(&key, &opts)).await?
            } else {
                cancellable(args, redlock.try_lock(&key, &opts)).await?
            }
        }
        ("read" | "write" | "permit", _) => match object(state, args, &target, kind)? {
            Obj::Rw(rw) => match (kind, wait) {
                ("read", true) => cancellable(args, rw.read(&opts)).await?,
                ("read", false) => cancellable(args, rw.try_read(&opts)).await?,
                (_, true) => cancellable(args, rw.write(&opts)).await?,
                (_, false) => cancellable(args, rw.try_write(&opts)).await?,
            },
            Obj::Sem(sem) => {
                if wait {
                    cancellable(args, sem.acquire_permits(permits, &opts)).await?
                } else {
                    cancellable(args, sem.try_acquire_permits(permits, &opts)).await?
                }
            }
        },
        (other, _) => return Err(Fail::bad(format!("kind={other}"))),
    };
    Ok(keep(state, h, guard))
}

/// Files a new guard under `h`, reports its loss as an event, and gives
/// the reply's fields.
fn keep(state: &Shared, h: String, guard: Guard) -> String {
    let fields = format!("fence={} owner={}", guard.fence(), guard.owner());
    let (fence, loss) = (guard.fence(), guard.loss());
    file(state, h, fence, loss, Held::One(guard));
    fields
}

/// [`keep`] for a hold on several keys: `fence=` is the first key's,
/// `fences=` every key's in order.
fn keep_many(state: &Shared, h: String, guard: MultiGuard) -> String {
    let fences: Vec<String> = guard.fences().iter().map(u64::to_string).collect();
    let fence = guard.fences().first().copied().unwrap_or(0);
    let fields = format!(
        "fence={fence} fences={} owner={}",
        fences.join(","),
        guard.owner()
    );
    let loss = guard.loss();
    file(state, h, fence, loss, Held::Many(guard));
    fields
}

fn file(state: &Shared, h: String, fence: u64, loss: LossSignal, guard: Held) {
    let hold = Hold {
        fence,
        loss: loss.clone(),
        guard: Some(guard),
    };
    state
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .holds
        .insert(h.clone(), Arc::new(tokio::sync::Mutex::new(hold)));
    tokio::spawn(async move {
        let reason = loss.lost().await;
        emit(&format!("! lost h={h} reason={}", reason_word(reason)));
    });
}

async fn release(state: &Shared, args: &Args) -> Result<String, Fail> {
    let hold = hold(state, args)?;
    let mut hold = hold.lock().await;
    // A hold on several keys is released whole, `all=1` or not.
    if matches!(hold.guard, Some(Held::Many(_))) {
        let Some(Held::Many(guard)) = hold.guard.take() else {
            return Err(released());
        };
        cancellable(args, guard.release()).await?;
        return Ok("left=0".into());
    }
    let Some(Held::One(guard)) = hold.guard.as_mut() else {
        return Err(released());
    };
    if args.get("all") == Some("1") {
        let Some(Held::One(guard)) = hold.guard.take() else {
            return Err(released());
        };
        cancellable(args, guard.release_all()).await?;
        return Ok(String::new());
    }
    let left = cancellable(args, guard.release()).await?;
    Ok(format!("left={left}"))
}

async fn resume(state: &Shared, args: &Args) -> Result<String, Fail> {
    let h = args.need("h")?.to_string();
    let key = args.need("key")?;
    let owner = args.need("owner")?;
    if args.get("ttl").is_none() {
        return Err(Fail::bad("resume needs ttl="));
    }
    let opts = options(args)?;
    let fence = args.ms("fence")?;
    let Target::One(client) = target(state)? else {
        return Err(Fail("unsupported", "resume on Redlock".into()));
    };
    let guard = cancellable(args, client.resume(key, owner, fence, &opts)).await?;
    Ok(keep(state, h, guard))
}
