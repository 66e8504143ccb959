//! Helpers of the replica tests (`replica_reads.rs`, `replica_endpoint.rs`,
//! `reads_from.rs`, `replica_batches.rs`): one RESP request on a raw
//! connection, a partition row committed conditionally (and waited for),
//! every partition replicated on the other node of a 2-node cluster, and
//! what a node holds (a key's value, a partition's digest).

use bytes::Bytes;
use keyway_cluster::LocalCluster;
use keyway_map::{
    DEFAULT_KEYSPACE, Epoch, Keyspace, MapChange, NodeId, OwnershipCondition, PartitionMap,
    PartitionRecord, Routing as KeyRouting,
};
use keyway_meta::MapTxn;
use keyway_peer::PeerClient;
use keyway_resp::Frame;
use keyway_testkit::eventually;
use std::time::Duration;

pub async fn raw_command(conn: &mut tokio::net::TcpStream, args: &[&str]) -> Frame {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut out = bytes::BytesMut::new();
    let frame = Frame::Array(
        args.iter()
            .map(|a| Frame::Bulk(Bytes::copy_from_slice(a.as_bytes())))
            .collect(),
    );
    keyway_resp::encode(&frame, keyway_resp::Protocol::Resp2, &mut out);
    conn.write_all(&out).await.unwrap();
    let mut parser = keyway_resp::ResponseParser::new(keyway_resp::Limits::default());
    let mut buf = bytes::BytesMut::new();
    loop {
        if let Some(f) = parser.parse(&mut buf).unwrap() {
            return f;
        }
        assert!(
            conn.read_buf(&mut buf).await.unwrap() > 0,
            "connection closed"
        );
    }
}

pub fn bulk(s: &str) -> Frame {
    Frame::Bulk(Bytes::copy_from_slice(s.as_bytes()))
}

/// Commits `row` (epoch + 1 of `prev`) conditional on `prev`'s owner and
/// epoch, plus `extra` changes, and waits until node `at` routes by it.
pub async fn commit(
    c: &LocalCluster,
    at: usize,
    prev: &PartitionRecord,
    row: PartitionRecord,
    extra: Vec<MapChange>,
) -> PartitionRecord {
    assert_eq!(row.epoch, Epoch(prev.epoch.0 + 1));
    let mut changes = extra;
    changes.push(MapChange::UpsertPartition(row.clone()));
    c.meta()
        .commit(MapTxn {
            conditions: vec![OwnershipCondition {
                partition: prev.id,
                expected: Some((prev.owner, prev.epoch)),
            }],
            changes,
        })
        .await
        .unwrap();
    let node = c.node(at).unwrap();
    eventually(
        "the node installs the new row",
        Duration::from_secs(10),
        || {
            let map = node.shared().routing.map();
            let seen = map.partitions.get(&row.id).map(|p| p.epoch);
            async move { (seen == Some(row.epoch)).then_some(()) }
        },
    )
    .await;
    row
}

/// One CAS at epoch + 1 conditional on (owner, epoch) with `f` applied.
pub async fn cas(c: &LocalCluster, p: &PartitionRecord, f: impl FnOnce(&mut PartitionRecord)) {
    let mut row = PartitionRecord {
        epoch: Epoch(p.epoch.0 + 1),
        ..p.clone()
    };
    f(&mut row);
    c.meta()
        .commit(MapTxn {
            conditions: vec![OwnershipCondition {
                partition: p.id,
                expected: Some((p.owner, p.epoch)),
            }],
            changes: vec![MapChange::UpsertPartition(row)],
        })
        .await
        .unwrap();
}

/// Every partition replicated on the other node, and in sync.
pub async fn replicate_everything(c: &LocalCluster) -> PartitionMap {
    replicate_everything_with(c, 1).await
}

/// [`replicate_everything`] with `min_in_sync` for the keyspace.
pub async fn replicate_everything_with(c: &LocalCluster, min_in_sync: u8) -> PartitionMap {
    let map = c.map().await.unwrap();
    let mut ks = Keyspace::new(DEFAULT_KEYSPACE, "default", KeyRouting::Hash);
    ks.replication_factor = 2;
    ks.min_in_sync = min_in_sync;
    c.meta()
        .commit(MapTxn::unconditional(vec![MapChange::UpsertKeyspace(ks)]))
        .await
        .unwrap();
    for p in map.partitions.values() {
        let other = *map.nodes.keys().find(|n| **n != p.owner).unwrap();
        cas(c, p, |r| r.replicas = vec![other]).await;
    }
    wait_all_in_sync(c).await
}

/// Every replica in sync in the store's map, and every running node routing
/// by that map (or a later one): a write right after must not meet a
/// primary that has not installed the CAS that put its replica back.
pub async fn wait_all_in_sync(c: &LocalCluster) -> PartitionMap {
    eventually("every replica in sync", Duration::from_secs(30), || async {
        let map = c.map().await.ok()?;
        let all = map
            .partitions
            .values()
            .all(|p| !p.replicas.is_empty() && p.in_sync == p.replicas);
        let installed = (0..c.len())
            .filter_map(|i| c.node(i))
            .all(|n| n.shared().routing.map().version >= map.version);
        (all && installed).then_some(map)
    })
    .await
}

/// Keyspace 0 as the tests' clients see it.
pub fn default_keyspace() -> Keyspace {
    Keyspace::new(DEFAULT_KEYSPACE, "default", KeyRouting::Hash)
}

/// The index of node `id` in the cluster.
pub fn node_index(c: &LocalCluster, id: NodeId) -> usize {
    c.node_ids().iter().position(|n| *n == Some(id)).unwrap()
}

/// The value the node at `index` holds for `key`, read from its engine.
pub fn held(c: &LocalCluster, index: usize, key: &[u8]) -> Option<Bytes> {
    let engine = c.node(index).unwrap().shared().engine.clone();
    engine
        .get(&default_keyspace().storage_key(key))
        .unwrap()
        .map(|v| v.data)
}

/// Every partition's digest is the same at its primary and its replica.
pub async fn assert_digests_equal(c: &LocalCluster, map: &PartitionMap) {
    for p in map.partitions.values() {
        let (start, end) = p.storage_bounds();
        let range = keyway_storage::KeyRange::new(start, end);
        let at = |id: NodeId| {
            let admin = c.node(node_index(c, id)).unwrap().admin_addr().to_string();
            let range = range.clone();
            async move {
                PeerClient::connect(&admin)
                    .unwrap()
                    .digest(&range)
                    .await
                    .unwrap()
                    .0
            }
        };
        let (primary, replica) = (at(p.owner).await, at(p.replicas[0]).await);
        assert_eq!(primary, replica, "partition {}: primary vs replica", p.id);
        assert!(primary.keys > 0, "partition {} got writes", p.id);
    }
}

/// A smart client seeded with every running node.
pub async fn client(c: &LocalCluster) -> keyway_client::Client {
    let seeds: Vec<String> = c.resp_addrs().into_iter().flatten().collect();
    let seeds: Vec<&str> = seeds.iter().map(|s| s.as_str()).collect();
    keyway_client::Client::connect(&seeds, keyway_client::ClientConfig::default())
        .await
        .unwrap()
}
