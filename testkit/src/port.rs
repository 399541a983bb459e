//! Free loopback ports.

use std::net::TcpListener;

/// A free loopback port: bind port 0 and let the kernel choose.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("bind a loopback port")
}

/// A loopback port for a cluster node: it and its bus port (+ 10000) are free.
///
/// Both come from below the kernel's ephemeral range (32768 and up here and by
/// default), so no [`free_port`] server and no outgoing connection takes them:
/// ports from 10000 to 19999, bus ports from 20000 to 29999, so one node's bus
/// port is never another node's port.
pub fn free_cluster_port() -> u16 {
    use rand::Rng;
    let mut rng = rand::thread_rng();
    loop {
        let port: u16 = rng.gen_range(10_000..20_000);
        let free = |port: u16| TcpListener::bind(("127.0.0.1", port)).is_ok();
        if free(port) && free(port + 10_000) {
            return port;
        }
    }
}
