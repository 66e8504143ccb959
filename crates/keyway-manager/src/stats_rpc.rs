//! [`RpcStats`]: the real [`StatsSource`], over the nodes' `PartitionStats`
//! Peer RPC.
//!
//! One call per `Up` node of the map, all in parallel, each bounded by the
//! timeout; a node that fails or misses it is listed in
//! [`ClusterLoad::unreachable`] (nodes marked `Down` are not asked, and not
//! listed). A node's answer is kept only for partitions it owns **in the
//! map asked under, at the same epoch**, and whose size it has measured
//! over their current range: a node behind or ahead of the map, or one
//! still scanning a partition it just received or that was just split, is
//! left out rather than reported with a stale owner, range or a size of 0.

use crate::stats::{ClusterLoad, HotKey, PartitionLoad, StatsSource};
use keyway_map::{NodeId, NodeState, PartitionMap};
use keyway_peer::stats::{NodeReport, PartitionReport};
use keyway_peer::{PeerClient, PeerError, PeerOptions};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// [`StatsSource`] over the `PartitionStats` RPC (one cached client per
/// admin address and timeout).
#[derive(Default)]
pub struct RpcStats {
    clients: Mutex<HashMap<(String, Duration), PeerClient>>,
}

impl RpcStats {
    pub fn new() -> Self {
        Self::default()
    }

    fn client(&self, admin_addr: &str, timeout: Duration) -> Result<PeerClient, PeerError> {
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        let key = (admin_addr.to_string(), timeout);
        if let Some(c) = clients.get(&key) {
            return Ok(c.clone());
        }
        let opts = PeerOptions {
            rpc_timeout: timeout,
            ..PeerOptions::default()
        };
        let c = PeerClient::connect_with(admin_addr, opts)?;
        clients.insert(key, c.clone());
        Ok(c)
    }

    /// One node's report (bounded by `timeout`).
    pub async fn node_report(
        &self,
        admin_addr: &str,
        timeout: Duration,
    ) -> Result<NodeReport, PeerError> {
        let client = self.client(admin_addr, timeout)?;
        match tokio::time::timeout(timeout, client.partition_stats()).await {
            Ok(r) => r,
            Err(_) => Err(PeerError::Unavailable(format!(
                "PartitionStats to {admin_addr} timed out after {timeout:?}"
            ))),
        }
    }
}

#[async_trait::async_trait]
impl StatsSource for RpcStats {
    async fn collect(&self, map: &PartitionMap, timeout: Duration) -> ClusterLoad {
        let asks = map
            .nodes
            .values()
            .filter(|n| n.state == NodeState::Up)
            .map(|n| async move { (n.id, self.node_report(&n.admin_addr, timeout).await) });
        let answers = futures::future::join_all(asks).await;
        let mut load = ClusterLoad::default();
        for (node, answer) in answers {
            match answer {
                Ok(mut report) => {
                    load.copies.insert(node, std::mem::take(&mut report.copies));
                    merge_report(map, node, report, &mut load)
                }
                Err(err) => {
                    tracing::debug!(%node, %err, "load statistics: node did not answer");
                    load.unreachable.push(node);
                }
            }
        }
        load
    }
}

/// Adds the partitions of `node`'s report that `map` agrees with (owner
/// and epoch) and whose size is known.
pub fn merge_report(map: &PartitionMap, node: NodeId, report: NodeReport, load: &mut ClusterLoad) {
    for p in report.partitions {
        let agrees = map
            .partitions
            .get(&p.partition)
            .is_some_and(|rec| rec.owner == node && rec.epoch == p.epoch);
        if agrees && p.size_known {
            load.partitions.insert(p.partition, to_load(node, p));
        }
    }
}

/// A node's partition report as the manager's [`PartitionLoad`].
pub fn to_load(node: NodeId, p: PartitionReport) -> PartitionLoad {
    PartitionLoad {
        partition: p.partition,
        epoch: p.epoch,
        node,
        keys: p.keys,
        bytes: p.bytes,
        reads_per_sec: p.reads_per_sec,
        writes_per_sec: p.writes_per_sec,
        load_split_key: p.load_split_key,
        size_split_key: p.size_split_key,
        hot_keys: p
            .hot_keys
            .into_iter()
            .map(|h| HotKey {
                key: h.key,
                per_sec: h.per_sec,
            })
            .collect(),
        top_key_share: p.top_key_share,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use keyway_map::{Epoch, NodeInfo, PartitionId};

    fn report(partition: u64, epoch: u64, size_known: bool) -> PartitionReport {
        PartitionReport {
            partition: PartitionId(partition),
            epoch: Epoch(epoch),
            size_known,
            keys: 3,
            bytes: 30,
            reads_per_sec: 1.0,
            writes_per_sec: 2.0,
            load_split_key: None,
            size_split_key: Some(Bytes::from_static(&[0, 9])),
            hot_keys: vec![keyway_peer::stats::HotKeyReport {
                key: Bytes::from_static(b"k"),
                per_sec: 2.0,
            }],
            top_key_share: 0.6,
            samples: 10.0,
        }
    }

    fn map() -> PartitionMap {
        let nodes: Vec<NodeInfo> = (1..=2)
            .map(|i| NodeInfo {
                id: NodeId(i),
                resp_addr: format!("127.0.0.1:{i}"),
                admin_addr: format!("127.0.0.1:{}", 100 + i),
                state: NodeState::Up,
                weight: keyway_map::DEFAULT_NODE_WEIGHT,
                draining: false,
                zone: None,
                replica_addr: None,
            })
            .collect();
        PartitionMap::bootstrap(&nodes, 2).unwrap()
    }

    #[test]
    fn only_partitions_the_map_agrees_with_and_has_sized_are_kept() {
        let map = map();
        // Node 1 owns partitions 1 and 2 at epoch 1; node 2 owns 3 and 4.
        let node_report = NodeReport {
            node: NodeId(1),
            map_version: map.version.0,
            window_ms: 10_000,
            partitions: vec![
                report(1, 1, true),
                report(2, 1, false),
                report(3, 1, true),
                report(4, 2, true),
            ],
            copies: Vec::new(),
        };
        let mut load = ClusterLoad::default();
        merge_report(&map, NodeId(1), node_report, &mut load);
        assert_eq!(
            load.partitions.keys().copied().collect::<Vec<_>>(),
            [PartitionId(1)]
        );
        let p = &load.partitions[&PartitionId(1)];
        assert_eq!((p.node, p.keys, p.bytes), (NodeId(1), 3, 30));
        assert_eq!(p.requests_per_sec(), 3.0);
        assert_eq!(p.hot_keys[0].key, Bytes::from_static(b"k"));
    }

    #[tokio::test]
    async fn unreachable_nodes_are_listed_within_the_timeout() {
        // Nothing listens on these ports.
        let mut map = map();
        for n in map.nodes.values_mut() {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            n.admin_addr = l.local_addr().unwrap().to_string();
        }
        map.nodes.get_mut(&NodeId(2)).unwrap().state = NodeState::Down;
        let started = std::time::Instant::now();
        let load = RpcStats::new()
            .collect(&map, Duration::from_millis(500))
            .await;
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(load.unreachable, [NodeId(1)], "down nodes are not asked");
        assert!(load.partitions.is_empty());
    }
}
