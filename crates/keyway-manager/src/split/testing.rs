//! Builders shared by the split, merge and splitter tests: maps, loads and
//! an embedded metadata store.

use crate::stats::{ClusterLoad, HotKey, PartitionLoad};
use bytes::Bytes;
use keyway_map::{
    Epoch, Keyspace, KeyspaceId, MapVersion, NodeId, NodeInfo, PartitionId, PartitionMap,
    PartitionRecord, PartitionState, Routing, slot_bound,
};
use keyway_meta::{EmbeddedMeta, EmbeddedOptions, MetaStore};
use std::sync::Arc;

/// The range keyspace [`with_range_keyspace`] adds.
pub const RANGE_KS: KeyspaceId = KeyspaceId(1);

/// An Up node (built from JSON so fields added later keep their defaults).
pub fn node(id: u64) -> NodeInfo {
    serde_json::from_value(serde_json::json!({
        "id": id,
        "resp_addr": format!("127.0.0.1:{}", 7000 + id),
        "admin_addr": format!("127.0.0.1:{}", 8000 + id),
        "state": "up",
    }))
    .expect("a node record")
}

/// The bootstrap map over nodes `1..=nodes`, `per_node` hash partitions each.
pub fn hash_map(nodes: u64, per_node: u16) -> PartitionMap {
    let nodes: Vec<NodeInfo> = (1..=nodes).map(node).collect();
    PartitionMap::bootstrap(&nodes, per_node).expect("bootstrap")
}

/// `map` plus a range keyspace split at `bounds` (one partition more than
/// bounds), owned by `owner`, with fresh ids.
pub fn with_range_keyspace(map: &PartitionMap, bounds: &[&str], owner: NodeId) -> PartitionMap {
    let mut starts = vec![Bytes::new()];
    starts.extend(bounds.iter().map(|b| Bytes::copy_from_slice(b.as_bytes())));
    let first = map.next_partition_id.0;
    let parts: Vec<PartitionRecord> = starts
        .iter()
        .enumerate()
        .map(|(i, start)| PartitionRecord {
            id: PartitionId(first + i as u64),
            keyspace: RANGE_KS,
            start: start.clone(),
            end: starts.get(i + 1).cloned(),
            owner,
            replicas: Vec::new(),
            in_sync: Vec::new(),
            reads_from: None,
            epoch: Epoch(1),
            state: PartitionState::Active,
        })
        .collect();
    let keyspace = Keyspace {
        id: RANGE_KS,
        name: "ordered".into(),
        routing: Routing::Range,
        replication_factor: 1,
        min_in_sync: 1,
    };
    let out = PartitionMap::from_parts(
        MapVersion(map.version.0 + 1),
        PartitionId(first + parts.len() as u64),
        map.keyspaces.values().cloned().chain([keyspace]),
        map.nodes.values().cloned(),
        map.partitions.values().cloned().chain(parts),
    );
    out.validate().expect("a valid map");
    out
}

/// A hash routing key in `slot`.
pub fn routing_key(slot: u16, key: &str) -> Bytes {
    Bytes::from([&slot_bound(slot)[..], key.as_bytes()].concat())
}

/// `p` as its owner reports it: idle, `bytes` bytes, no split keys.
pub fn load_of(p: &PartitionRecord, bytes: u64, requests_per_sec: f64) -> PartitionLoad {
    PartitionLoad {
        partition: p.id,
        epoch: p.epoch,
        node: p.owner,
        keys: bytes / 100,
        bytes,
        reads_per_sec: requests_per_sec / 2.0,
        writes_per_sec: requests_per_sec / 2.0,
        load_split_key: None,
        size_split_key: None,
        hot_keys: vec![HotKey {
            key: Bytes::from_static(b"k"),
            per_sec: requests_per_sec / 100.0,
        }],
        top_key_share: 0.01,
    }
}

/// A cluster load of these partitions.
pub fn cluster_load(loads: impl IntoIterator<Item = PartitionLoad>) -> ClusterLoad {
    ClusterLoad {
        partitions: loads.into_iter().map(|l| (l.partition, l)).collect(),
        unreachable: Vec::new(),
        copies: Default::default(),
    }
}

/// Every partition of `map` reported with `bytes` bytes at `rps` requests/s.
pub fn uniform_load(map: &PartitionMap, bytes: u64, rps: f64) -> ClusterLoad {
    cluster_load(map.partitions.values().map(|p| load_of(p, bytes, rps)))
}

/// An embedded store with `nodes` registered nodes and the bootstrap map of
/// `per_node` partitions each.
pub async fn store(nodes: usize, per_node: u16) -> (Arc<EmbeddedMeta>, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let meta = Arc::new(EmbeddedMeta::open(dir.path(), EmbeddedOptions::default()).expect("open"));
    for i in 1..=nodes {
        meta.register_node(None, format!("r{i}:6379"), format!("node-{i}:7000"))
            .await
            .expect("register");
    }
    assert!(
        meta.bootstrap_if_empty(nodes, per_node)
            .await
            .expect("bootstrap")
    );
    (meta, dir)
}
