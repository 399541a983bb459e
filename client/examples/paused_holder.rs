//! The paused-holder scenario, end to end, against one server.
//!
//! Holder A takes the lock (lease 300 ms, watchdog off) and writes to a store
//! with its fence. Then A stops — here its thread sleeps past the lease, as a
//! GC pause or a SIGSTOP would stop it. The lease ends; holder B, waiting,
//! gets the lock with a higher fence and writes. A wakes up, still believing
//! it holds the lock, and writes with its old fence: the store, which keeps
//! the highest fence it has seen, refuses it.
//!
//! ```text
//! cargo run -p redislock-client --example paused_holder -- redis://127.0.0.1:6379/
//! ```
//! Exits 0 when the store refused A's late write and kept B's.

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use redislock_client::{blocking::Client, LockOptions};

/// A resource that refuses writes carrying a fence below the highest seen.
#[derive(Default)]
struct FencedStore {
    highest: u64,
    value: String,
}

impl FencedStore {
    fn write(&mut self, fence: u64, value: &str) -> Result<(), String> {
        if fence < self.highest {
            return Err(format!("fence {fence} is below {}", self.highest));
        }
        self.highest = fence;
        self.value = value.to_string();
        Ok(())
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "redis://127.0.0.1:6379/".into());
    let client = Client::open(url.as_str())?;
    let store = Arc::new(Mutex::new(FencedStore::default()));
    let lease = Duration::from_millis(300);

    let a = client.lock("account", &LockOptions::new(lease).watchdog(false))?;
    println!("A holds the lock with fence {}", a.fence());
    store
        .lock()
        .map_err(|e| e.to_string())?
        .write(a.fence(), "A: first write")?;

    // B waits for the lock (the server queues it) and writes once it has it.
    let b = {
        let (client, store) = (client.clone(), store.clone());
        thread::spawn(move || -> Result<u64, String> {
            let opts = LockOptions::new(Duration::from_secs(5)).wait(Duration::from_secs(5));
            let b = client.lock("account", &opts).map_err(|e| e.to_string())?;
            println!("B holds the lock with fence {}", b.fence());
            store
                .lock()
                .map_err(|e| e.to_string())?
                .write(b.fence(), "B: write")?;
            println!("B's write accepted");
            let fence = b.fence();
            b.release_all().map_err(|e| e.to_string())?;
            Ok(fence)
        })
    };

    // A is paused past its lease.
    thread::sleep(lease * 3);
    let b_fence = b.join().map_err(|_| "B panicked")??;
    println!("A wakes up (lock lost locally: {})", a.is_lost());
    let late = store
        .lock()
        .map_err(|e| e.to_string())?
        .write(a.fence(), "A: late write");
    match late {
        Err(why) => println!("A's late write refused: {why}"),
        Ok(()) => {
            println!("A's late write was accepted: the store is not safe");
            std::process::exit(1);
        }
    }
    let value = store.lock().map_err(|e| e.to_string())?.value.clone();
    println!("store holds {value:?} (fence {b_fence})");
    if value != "B: write" {
        std::process::exit(1);
    }
    // A's release is refused: its lease ended and B has had the lock since.
    println!(
        "A's release: {:?}",
        a.release_all().err().map(|e| e.to_string())
    );
    Ok(())
}
