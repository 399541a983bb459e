//! One worker of the oversell test (`tests/integration/oversell.rs`): a
//! process that sells items from a shared stock, one at a time, under the lock.
//!
//! Usage: `oversell_worker <port> <owner>`
//!
//! Each round: `LOCK.ACQUIRE inventory:lock <owner> 5000 WAIT 10000`, then,
//! holding the lock, `RPUSH fences <fence>` (so the server keeps the global
//! order of acquisitions), `GET stock`, and if it is above 0 `SET stock n-1`
//! with `n-1` computed here — without the lock, two workers would read the
//! same `n` and sell the same item — then `LOCK.RELEASE`. It stops after the
//! round in which it reads a stock of 0 or less.
//!
//! Output, one item per line: `fence <n>` for each acquisition, `sale` after
//! each sale, `timeout` for each `WAIT` that ended without the lock,
//! `negative <n>` if it ever reads a stock below 0; then the summary
//! `sales <n>`. Exit status 2 if it lost the lock while holding it (the
//! release was refused), 1 on any other failure.

use std::io::{self, Write};
use std::process::exit;
use std::time::Duration;

use redis::{Connection, Value};

const LOCK: &str = "inventory:lock";
const LEASE_MS: &str = "5000";
const WAIT_MS: &str = "10000";

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, port, owner] = args.as_slice() else {
        eprintln!("usage: oversell_worker <port> <owner>");
        exit(1);
    };
    if let Err(why) = run(port, owner) {
        eprintln!("{owner}: {why}");
        exit(1);
    }
}

fn run(port: &str, owner: &str) -> Result<(), String> {
    let mut conn = connect(port)?;
    let mut out = io::BufWriter::new(io::stdout().lock());
    let mut sales = 0u64;
    loop {
        let fence: i64 = match query(
            &mut conn,
            &["LOCK.ACQUIRE", LOCK, owner, LEASE_MS, "WAIT", WAIT_MS],
        )? {
            Value::Int(fence) => fence,
            Value::Nil => {
                writeln!(out, "timeout").map_err(|e| e.to_string())?;
                continue;
            }
            other => return Err(format!("LOCK.ACQUIRE replied {other:?}")),
        };
        writeln!(out, "fence {fence}").map_err(|e| e.to_string())?;
        query(&mut conn, &["RPUSH", "fences", &fence.to_string()])?;
        let stock: i64 = match query(&mut conn, &["GET", "stock"])? {
            Value::BulkString(bytes) => String::from_utf8_lossy(&bytes)
                .parse()
                .map_err(|_| format!("stock is not an integer: {bytes:?}"))?,
            other => return Err(format!("GET stock replied {other:?}")),
        };
        if stock < 0 {
            writeln!(out, "negative {stock}").map_err(|e| e.to_string())?;
        }
        if stock > 0 {
            query(&mut conn, &["SET", "stock", &(stock - 1).to_string()])?;
            sales += 1;
            writeln!(out, "sale").map_err(|e| e.to_string())?;
        }
        match redis::cmd("LOCK.RELEASE")
            .arg(&[LOCK, owner])
            .query::<Value>(&mut conn)
        {
            Ok(Value::Int(0)) => {}
            Ok(other) => return Err(format!("LOCK.RELEASE replied {other:?}")),
            Err(err) => {
                // Flush what it did first: the test shows it.
                let _ = writeln!(out, "sales {sales}");
                let _ = out.flush();
                eprintln!("{owner}: lost the lock holding fence {fence}: {err}");
                exit(2);
            }
        }
        if stock <= 0 {
            break;
        }
    }
    writeln!(out, "sales {sales}").map_err(|e| e.to_string())?;
    out.flush().map_err(|e| e.to_string())
}

fn connect(port: &str) -> Result<Connection, String> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .map_err(|e| format!("bad address: {e}"))?;
    let conn = client
        .get_connection_with_timeout(Duration::from_secs(10))
        .map_err(|e| format!("cannot connect: {e}"))?;
    // Longer than the WAIT, so a wait always ends with the server's reply.
    conn.set_read_timeout(Some(Duration::from_secs(20)))
        .map_err(|e| e.to_string())?;
    Ok(conn)
}

fn query(conn: &mut Connection, args: &[&str]) -> Result<Value, String> {
    redis::cmd(args[0])
        .arg(&args[1..])
        .query(conn)
        .map_err(|e| format!("{}: {e}", args.join(" ")))
}
