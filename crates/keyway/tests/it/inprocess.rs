//! In-process cluster tests: the smart client follows epoch rejections,
//! data survives a restart of the whole cluster, and a node without a
//! lease serves nothing.

use crate::common;

use bytes::Bytes;
use common::replica::raw_command;
use keyway_client::{Client, ClientConfig};
use keyway_cluster::{ClusterSpec, LocalCluster};
use keyway_map::{
    DEFAULT_KEYSPACE, Epoch, MapChange, OwnershipCondition, PartitionRecord, key_hash_slot,
};
use keyway_meta::MapTxn;
use keyway_resp::Frame;
use std::time::Duration;

async fn cluster(dir: &std::path::Path) -> LocalCluster {
    let mut spec = ClusterSpec::ephemeral(3, dir.to_path_buf());
    spec.node.lease_ttl_ms = 60_000;
    // These tests hand partitions over by hand: no rebalancer meanwhile.
    if let Some(m) = spec.manager.as_mut() {
        m.config.rebalance.enabled = false;
    }
    LocalCluster::start(spec).await.expect("cluster starts")
}

fn seeds(c: &LocalCluster) -> Vec<String> {
    c.resp_addrs().into_iter().flatten().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smart_client_follows_an_epoch_rejection_without_a_full_refresh() {
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(dir.path()).await;
    let seeds = seeds(&c);
    let client = Client::connect(
        &seeds.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
        ClientConfig::default(),
    )
    .await
    .unwrap();
    for i in 0..200 {
        client
            .set(format!("key{i}").as_bytes(), b"v")
            .await
            .unwrap();
    }
    assert_eq!(client.stats().rejections, 0);

    // Hand the partition of "moved-key" to another node (metadata only; this test is about routing).
    let map = c.map().await.unwrap();
    let p: PartitionRecord = map
        .locate_slot(DEFAULT_KEYSPACE, key_hash_slot(b"moved-key"))
        .unwrap()
        .clone();
    let new_owner = *map.nodes.keys().find(|n| **n != p.owner).unwrap();
    let moved = PartitionRecord {
        owner: new_owner,
        epoch: Epoch(p.epoch.0 + 1),
        ..p.clone()
    };
    c.meta()
        .commit(MapTxn {
            conditions: vec![OwnershipCondition {
                partition: p.id,
                expected: Some((p.owner, p.epoch)),
            }],
            changes: vec![MapChange::UpsertPartition(moved)],
        })
        .await
        .unwrap();
    c.wait_serving(Duration::from_secs(10)).await.unwrap();

    let before = client.stats();
    client.set(b"moved-key", b"there").await.unwrap();
    assert_eq!(
        client.get(b"moved-key").await.unwrap(),
        Some(Bytes::from_static(b"there"))
    );
    let stats = client.stats();
    assert_eq!(
        stats.rejections, 1,
        "one rejection, patched from its payload"
    );
    assert_eq!(
        stats.refreshes_full, before.refreshes_full,
        "no full refresh needed (the hybrid client re-resolves by delta)"
    );
    let cached = client.map();
    let p_now = cached
        .locate_slot(DEFAULT_KEYSPACE, key_hash_slot(b"moved-key"))
        .unwrap();
    assert_eq!(
        (p_now.owner, p_now.epoch),
        (new_owner, Epoch(p.epoch.0 + 1))
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_a_full_cluster_restart() {
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(dir.path()).await;
    let client = Client::connect(&[seeds(&c)[0].as_str()], ClientConfig::default())
        .await
        .unwrap();
    for i in 0..2000 {
        client
            .set(format!("durable{i}").as_bytes(), format!("v{i}").as_bytes())
            .await
            .unwrap();
    }
    for i in 0..2000 {
        if i % 2 == 0 {
            assert!(client.del(format!("durable{i}").as_bytes()).await.unwrap());
        }
    }
    let map_before = c.map().await.unwrap();
    drop(client);
    c.shutdown().await;

    let c = cluster(dir.path()).await;
    let map_after = c.map().await.unwrap();
    assert_eq!(
        map_before.partitions, map_after.partitions,
        "the map survives the restart"
    );
    let client = Client::connect(&[seeds(&c)[1].as_str()], ClientConfig::default())
        .await
        .unwrap();
    for i in 0..2000 {
        let got = client.get(format!("durable{i}").as_bytes()).await.unwrap();
        let want = (i % 2 == 1).then(|| Bytes::from(format!("v{i}")));
        assert_eq!(got, want, "key durable{i}");
    }
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_a_lease_serves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(dir.path()).await;
    let node = c.node(0).unwrap();
    let addr = node.resp_addr().to_string();
    let client = Client::connect(&[addr.as_str()], ClientConfig::default())
        .await
        .unwrap();
    let map = client.map();
    // A key this node owns.
    let key = (0..10_000)
        .map(|i| format!("lease{i}"))
        .find(|k| {
            map.locate_slot(DEFAULT_KEYSPACE, key_hash_slot(k.as_bytes()))
                .unwrap()
                .owner
                == node.id()
        })
        .unwrap();
    client.set(key.as_bytes(), b"v").await.unwrap();
    node.shared().routing.revoke_lease();
    let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let reply = raw_command(&mut conn, &["GET", &key]).await;
    assert_eq!(
        reply,
        Frame::Error("CLUSTERDOWN The cluster is down (node lease lapsed)".into())
    );
    let reply = raw_command(&mut conn, &["SET", &key, "w"]).await;
    assert!(matches!(reply, Frame::Error(e) if e.starts_with("CLUSTERDOWN")));
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_node_restarts_on_its_port_with_its_data_and_id() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(dir.path()).await;
    let client = Client::connect(&[seeds(&c)[0].as_str()], ClientConfig::default())
        .await
        .unwrap();
    for i in 0..300 {
        client
            .set(format!("r{i}").as_bytes(), b"kept")
            .await
            .unwrap();
    }
    let (id, addr) = (
        c.node(1).unwrap().id(),
        c.node(1).unwrap().resp_addr().to_string(),
    );
    c.restart_node(1).await.unwrap();
    c.wait_serving(Duration::from_secs(20)).await.unwrap();
    assert_eq!(c.node(1).unwrap().id(), id);
    assert_eq!(c.node(1).unwrap().resp_addr(), addr);
    for i in 0..300 {
        assert_eq!(
            client
                .get(format!("r{i}").as_bytes())
                .await
                .unwrap()
                .as_deref(),
            Some(&b"kept"[..])
        );
    }
    c.shutdown().await;
}

/// Invariant 2: a write either took effect before a new map was installed or
/// was rejected by it. Writers hammer one partition while the node installs a
/// map that hands the partition away; every acknowledged write must carry a
/// change-log sequence number no later than the engine's last one at the
/// moment the install returned (the install waits for in-flight commands).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_write_applies_with_authority_checked_before_a_map_install() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = ClusterSpec::ephemeral(2, dir.path().to_path_buf());
    spec.node.lease_ttl_ms = 60_000;
    if let Some(m) = spec.manager.as_mut() {
        m.config.rebalance.enabled = false;
    }
    let c = LocalCluster::start(spec).await.unwrap();
    let node = c.node(0).unwrap();
    let shared = node.shared().clone();
    let map = shared.routing.map();
    let p = map.owned_by(node.id()).next().unwrap().clone();
    let (first_slot, _) = p.slot_span();
    // Keys of that partition: a hash tag that lands in its first slot.
    let tag = (0..1_000_000)
        .map(|i| format!("t{i}"))
        .find(|t| key_hash_slot(t.as_bytes()) == first_slot)
        .unwrap();
    let addr = node.resp_addr().to_string();

    let writers: Vec<_> = (0..4)
        .map(|w| {
            let (addr, tag) = (addr.clone(), tag.clone());
            tokio::spawn(async move {
                let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
                let mut acked = Vec::new();
                for i in 0.. {
                    let key = format!("{{{tag}}}:{w}:{i}");
                    match raw_command(&mut conn, &["SET", &key, "v"]).await {
                        Frame::Simple(_) => acked.push(key),
                        Frame::Error(e) if e.starts_with("MOVED") => return acked,
                        other => panic!("unexpected reply {other:?}"),
                    }
                }
                unreachable!()
            })
        })
        .collect();
    // Let writes flow, then hand the partition to the other node.
    while shared.engine.last_seq() < 500 {
        tokio::task::yield_now().await;
    }
    let mut next = (*map).clone();
    let other = *next.nodes.keys().find(|n| **n != node.id()).unwrap();
    let mut moved = p.clone();
    moved.owner = other;
    moved.epoch = Epoch(p.epoch.0 + 1);
    next.apply(
        keyway_map::MapVersion(map.version.0 + 1),
        &[MapChange::UpsertPartition(moved)],
    )
    .unwrap();
    let routing = shared.routing.clone();
    let engine = shared.engine.clone();
    let fence_seq = tokio::task::spawn_blocking(move || {
        routing.install(next).unwrap();
        engine.last_seq()
    })
    .await
    .unwrap();
    let mut total = 0;
    for w in writers {
        for key in w.await.unwrap() {
            let storage_key = shared.keyspace.storage_key(key.as_bytes());
            let value = shared
                .engine
                .get(&storage_key)
                .unwrap()
                .expect("acknowledged write present");
            assert!(
                value.version <= fence_seq,
                "{key} applied at seq {} after the install at {fence_seq}",
                value.version
            );
            total += 1;
        }
    }
    assert!(total >= 500);
    c.shutdown().await;
}
