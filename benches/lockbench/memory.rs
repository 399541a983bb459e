//! Held locks in bulk: the pipelined loader, and memory per held lock
//! (measurement 4).
//!
//! Each lock has its own owner, a 36-character UUID + ":1" (a client token and
//! a thread id), and a long lease, so each key also has an entry in the
//! server's expires table, as real locks do.

use crate::locks::{Kind, Scripts};
use crate::resp::Reply;
use crate::server::{info_f64, Server};
use crate::stats::uuid;
use crate::Res;

/// Commands per pipelined batch when loading.
const BATCH: usize = 1_000;
/// Lease of loaded locks: they must outlive the run.
const TTL: &str = "3600000";

/// Takes `n` locks named `<prefix><i>`, lock `i` of kind `kinds[i % len]`,
/// each by its own owner; fails unless every acquisition succeeds.
pub fn fill(server: &Server, scripts: &Scripts, kinds: &[Kind], prefix: &str, n: usize) -> Res<()> {
    let mut con = server.conn()?;
    let mut start = 0;
    while start < n {
        let end = (start + BATCH).min(n);
        let mut sent = Vec::with_capacity(end - start);
        for i in start..end {
            let kind = kinds[i % kinds.len()];
            let key = format!("{prefix}{i}");
            let owner = format!("{}:1", uuid());
            let args = kind.acquire(scripts, &key, &owner, TTL);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            con.queue(&args);
            sent.push(kind);
        }
        con.flush()?;
        for kind in sent {
            let reply = con.read()?;
            if !kind.took(&reply) {
                return Err(format!("loading {}: acquire answered {reply:?}", kind.label()).into());
            }
        }
        start = end;
    }
    Ok(())
}

/// `used_memory` per held lock of `kind`, in bytes: `n` locks taken on an
/// empty server, then freed again.
pub fn bytes_per_lock(server: &Server, scripts: &Scripts, kind: Kind, n: usize) -> Res<f64> {
    let mut con = server.control()?;
    redis::cmd("FLUSHALL").arg("SYNC").query::<()>(&mut con)?;
    let before = info_f64(&mut con, "memory", "used_memory")?;
    fill(server, scripts, &[kind], "mem:", n)?;
    let after = info_f64(&mut con, "memory", "used_memory")?;
    let keys: u64 = redis::cmd("DBSIZE").query(&mut con)?;
    redis::cmd("FLUSHALL").arg("SYNC").query::<()>(&mut con)?;
    if keys != n as u64 {
        return Err(format!("{}: {keys} keys held, expected {n}", kind.label()).into());
    }
    Ok((after - before) / n as f64)
}

/// `MEMORY USAGE` of one lock of `kind` (what the server reports for a key,
/// for comparison with the `used_memory` delta).
pub fn memory_usage_of_one(server: &Server, scripts: &Scripts, kind: Kind) -> Res<i64> {
    let mut con = server.conn()?;
    let key = "mem:probe";
    let args = kind.acquire(scripts, key, &format!("{}:1", uuid()), TTL);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    con.call(&args)?.check("acquire")?;
    let usage = con.call(&["MEMORY", "USAGE", key])?;
    con.call(&["DEL", key])?;
    match usage {
        Reply::Int(n) => Ok(n),
        other => Err(format!("MEMORY USAGE answered {other:?}").into()),
    }
}
