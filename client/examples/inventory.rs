//! An inventory worker that never oversells: each sale reads the stock,
//! waits a moment (as real work would), and writes it back minus one, all
//! under the lock. Run several at once against one server:
//!
//! ```text
//! redis-cli SET stock 100
//! cargo run -p redislock-client --example inventory -- redis://127.0.0.1:6379/ worker-1 &
//! cargo run -p redislock-client --example inventory -- redis://127.0.0.1:6379/ worker-2
//! ```
//!
//! Each sale is logged to the list `sales` as `<worker>:<fence>`; the fences
//! rise along the list. Without the lock, the read-then-write would sell the
//! same item twice.

use std::time::Duration;

use redislock_client::{blocking::Client, LockOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "redis://127.0.0.1:6379/".into());
    let worker = args.next().unwrap_or_else(|| "worker".into());

    let locks = Client::open(url.as_str())?;
    let mut store = redis::Client::open(url.as_str())?.get_connection()?;
    let opts = LockOptions::new(Duration::from_secs(5)).wait(Duration::from_secs(30));
    let mut sold = 0;
    loop {
        let mut guard = locks.lock("stock-lock", &opts)?;
        let stock: i64 = redis::cmd("GET").arg("stock").query(&mut store)?;
        if stock <= 0 {
            guard.release()?;
            break;
        }
        // Work between the read and the write: the window an unlocked
        // competitor would sell into.
        std::thread::sleep(Duration::from_micros(300));
        redis::cmd("SET")
            .arg("stock")
            .arg(stock - 1)
            .query::<()>(&mut store)?;
        let entry = format!("{worker}:{}", guard.fence());
        redis::cmd("RPUSH")
            .arg("sales")
            .arg(entry)
            .query::<()>(&mut store)?;
        guard.release()?;
        sold += 1;
    }
    println!("{worker} sold {sold}");
    Ok(())
}
