//! What the manager knows of the load: per partition its size, request rate
//! and the sampled keys the node reports, gathered from every node by a
//! [`StatsSource`]. The splitter, the merger and the rebalancer decide from
//! one [`ClusterLoad`] each round; none of them reads a node directly, so each
//! is tested against a hand-built `ClusterLoad`.

use bytes::Bytes;
use keyway_map::{Epoch, NodeId, PartitionId, PartitionMap};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One sampled key and its estimated request rate.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct HotKey {
    /// The user key (not the routing key).
    #[serde(with = "lossy_text")]
    pub key: Bytes,
    /// Estimated requests per second on this key over the node's window.
    pub per_sec: f64,
}

/// One partition as its owner reported it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct PartitionLoad {
    pub partition: PartitionId,
    /// The epoch of the partition in the map the node reported under.
    pub epoch: Epoch,
    /// The node that reported it (its owner in that node's map).
    pub node: NodeId,
    /// Live keys and their payload bytes (key + value), as of the node's last
    /// size scan.
    pub keys: u64,
    pub bytes: u64,
    /// Requests per second over the node's rate window.
    pub reads_per_sec: f64,
    pub writes_per_sec: f64,
    /// A keyspace-local routing key that splits the sampled load into two
    /// halves of similar rate (`None`: too few samples, or one key dominates).
    #[serde(with = "lossy_opt")]
    pub load_split_key: Option<Bytes>,
    /// A keyspace-local routing key at about half the partition's bytes
    /// (`None`: fewer than two keys).
    #[serde(with = "lossy_opt")]
    pub size_split_key: Option<Bytes>,
    /// The busiest sampled keys, busiest first (bounded top-k).
    pub hot_keys: Vec<HotKey>,
    /// Share (0..=1) of the sampled requests that went to the busiest key.
    pub top_key_share: f64,
}

impl PartitionLoad {
    /// Reads plus writes per second.
    pub fn requests_per_sec(&self) -> f64 {
        self.reads_per_sec + self.writes_per_sec
    }
}

/// Every partition's load, from one round of asking every node.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct ClusterLoad {
    pub partitions: BTreeMap<PartitionId, PartitionLoad>,
    /// Nodes that did not answer this round (their partitions are absent).
    pub unreachable: Vec<NodeId>,
    /// The copies each answering node sends (running, then its last
    /// finished ones; see [`crate::copies`]).
    pub copies: BTreeMap<NodeId, Vec<keyway_peer::copies::CopyReport>>,
}

/// One round of the load monitor: the map it asked under and the answers.
/// Published on a `watch` channel; consumers decide from the latest.
#[derive(Clone, Debug)]
pub struct LoadSnapshot {
    pub map: Arc<PartitionMap>,
    pub load: ClusterLoad,
    pub taken_at: Instant,
}

/// Gathers a [`ClusterLoad`] from the nodes of `map`. Real: one RPC per node;
/// fakes in tests.
#[async_trait::async_trait]
pub trait StatsSource: Send + Sync + 'static {
    async fn collect(&self, map: &PartitionMap, timeout: Duration) -> ClusterLoad;
}

/// Bytes as text for JSON: UTF-8 when it is, else `0x`-prefixed hex.
pub fn key_text(b: &[u8]) -> String {
    match std::str::from_utf8(b) {
        Ok(s) if !s.starts_with("0x") => s.to_string(),
        _ => format!("0x{}", keyway_map::to_hex(b)),
    }
}

mod lossy_text {
    pub fn serialize<S: serde::Serializer>(b: &bytes::Bytes, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::key_text(b))
    }
}

mod lossy_opt {
    pub fn serialize<S: serde::Serializer>(
        b: &Option<bytes::Bytes>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match b {
            Some(b) => s.serialize_some(&format!("0x{}", keyway_map::to_hex(b))),
            None => s.serialize_none(),
        }
    }
}
