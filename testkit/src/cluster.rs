//! [`Cluster`]: a Redis Cluster of three masters with the module, no
//! replicas, slots split evenly, made by hand (`CLUSTER ADDSLOTSRANGE`,
//! `CLUSTER MEET`). The integration suite's six-node cluster, made by
//! `redis-cli --cluster create` as an operator would, stays in its own area.

use std::time::Duration;

use crate::server::Server;
use crate::wait_until;

/// How long a silent node may stay silent before its peers call it failed.
const NODE_TIMEOUT_MS: u64 = 2_000;
/// The slots each master serves, inclusive.
const RANGES: [(u16, u16); 3] = [(0, 5460), (5461, 10922), (10923, 16383)];

/// Three masters that agree on the cluster (`cluster_state:ok`).
pub struct Cluster {
    pub nodes: Vec<Server>,
}

impl Cluster {
    pub fn start() -> Cluster {
        let nodes: Vec<Server> = (0..3)
            .map(|k| {
                Server::builder()
                    .label(&format!("node{k}"))
                    .cluster_node(NODE_TIMEOUT_MS)
                    .start()
            })
            .collect();
        for (node, (from, to)) in nodes.iter().zip(RANGES) {
            let _: () = node.q(&[
                "CLUSTER",
                "ADDSLOTSRANGE",
                &from.to_string(),
                &to.to_string(),
            ]);
        }
        for node in &nodes[1..] {
            let _: () = nodes[0].q(&["CLUSTER", "MEET", "127.0.0.1", &node.port().to_string()]);
        }
        wait_until(
            "the cluster is ok on every node",
            Duration::from_secs(20),
            || {
                nodes.iter().all(|n| {
                    let info: String = n.q(&["CLUSTER", "INFO"]);
                    info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:3")
                })
            },
        );
        Cluster { nodes }
    }

    /// Every node's URL, for a cluster client.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Server::url).collect()
    }

    /// The node serving `key`.
    pub fn node_of(&self, key: &str) -> &Server {
        let slot: u16 = self.nodes[0].q(&["CLUSTER", "KEYSLOT", key]);
        let index = RANGES
            .iter()
            .position(|&(from, to)| (from..=to).contains(&slot))
            .expect("a slot in one range");
        &self.nodes[index]
    }
}
