//! What every area shares: the test kit (`testkit/`), a server with a
//! connected driver, and the checks made after a scenario ends.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use redislock_testkit::*;

use crate::driver::Driver;

/// Milliseconds since the Unix epoch, as `PEXPIRETIME` counts them.
pub fn now_ms() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970");
    i64::try_from(since.as_millis()).expect("ms fit in i64")
}

/// A fresh server and a driver connected to it.
pub fn setup() -> (Server, Driver) {
    let server = Server::start();
    let driver = Driver::connected(&server);
    (server, driver)
}

/// `PEXPIRETIME key`: the server's lease end, in Unix ms.
pub fn pexpiretime(server: &Server, key: &str) -> i64 {
    server.q(&["PEXPIRETIME", key])
}

/// Clients blocked in a command right now (`INFO clients`).
pub fn blocked(server: &Server) -> i64 {
    server.info_int("clients", "blocked_clients")
}

/// Waits until `key` is free on `server`.
pub fn free_within(server: &Server, key: &str, within: Duration) {
    wait_until(&format!("{key} is free"), within, || {
        server.lock_info(key).is_none()
    });
}

/// After a cancel: the lock is free (not only at its lease end: `within`
/// is far shorter), nobody is parked, and the client runs nothing more.
pub fn nothing_left(server: &Server, driver: &mut Driver, key: &str, within: Duration) {
    free_within(server, key, within);
    wait_until("no client is blocked", within, || blocked(server) == 0);
    driver.no_leaks(within);
}

/// A second connection's hold on `key` (the "other client" of a scenario).
pub fn hold_elsewhere(server: &Server, key: &str, owner: &str) {
    let fence = server.conn().acquire(key, owner, 600_000);
    assert!(fence.is_some(), "{key} is free for {owner}");
}

/// Waits until `key` has `n` waiters.
pub fn waiters(server: &Server, key: &str, n: i64) {
    wait_until(
        &format!("{key} has {n} waiter(s)"),
        Duration::from_secs(10),
        || server.lock_info(key).map(|i| i.waiters) == Some(n),
    );
}
