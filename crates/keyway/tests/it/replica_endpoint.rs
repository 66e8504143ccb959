//! The replica endpoint's registration (`--replica-listen`, on by
//! default): a node writes its address into its `NodeInfo`, restores it
//! when an upsert of a stale record dropped it, keeps it across a restart,
//! and shows it in `/status` and `/metrics`; with it redis-py sees every
//! node of a replicated cluster as a primary. The reads it serves are in
//! `replica_reads.rs`.

use crate::common;

use common::replica::raw_command;
use keyway_cluster::{ClusterSpec, LocalCluster};
use keyway_map::{
    DEFAULT_KEYSPACE, Epoch, MapChange, NodeId, OwnershipCondition, PartitionRecord, key_hash_slot,
};
use keyway_meta::MapTxn;
use keyway_resp::Frame;
use keyway_testkit::eventually;
use std::time::Duration;

/// A node registers its replica endpoint in its `NodeInfo` (on by
/// default), writes it again when an upsert of a stale record dropped it,
/// and keeps it (same port) across a restart; `off` registers none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_advertises_its_replica_endpoint_and_restores_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = ClusterSpec::ephemeral(2, dir.path().to_path_buf());
    spec.manager = None;
    let mut c = LocalCluster::start(spec).await.expect("cluster starts");
    let advertised = |c: &LocalCluster, i: usize| {
        let id = c.node(i).unwrap().id();
        let meta = c.meta().clone();
        async move {
            meta.get_map().await.unwrap().nodes[&id]
                .replica_addr
                .clone()
        }
    };
    let a = c.node(0).unwrap();
    let addr = a.replica_addr().expect("on by default").to_string();
    assert_ne!(addr, a.resp_addr());
    assert_eq!(advertised(&c, 0).await.as_deref(), Some(&*addr));
    // An unconditional upsert of a record without it (as a stale copy
    // written back would be): the node writes it again.
    let mut stale = c.map().await.unwrap().nodes[&a.id()].clone();
    stale.replica_addr = None;
    c.meta()
        .commit(MapTxn::unconditional(vec![MapChange::UpsertNode(stale)]))
        .await
        .unwrap();
    eventually("the node re-advertises", Duration::from_secs(10), || {
        let got = advertised(&c, 0);
        let addr = addr.clone();
        async move { (got.await.as_deref() == Some(&*addr)).then_some(()) }
    })
    .await;
    // `/status` and `/metrics` show it.
    let admin_port: u16 = a.admin_addr().rsplit_once(':').unwrap().1.parse().unwrap();
    let _open = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let rid = a.id().replica_role_id();
    let status = tokio::task::spawn_blocking(move || common::http_get(admin_port, "/status"))
        .await
        .unwrap()
        .expect("/status answers");
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["replica_addr"], serde_json::json!(addr));
    assert_eq!(status["replica_node_id"], serde_json::json!(rid));
    // (The node counts the connection once its task runs.)
    eventually(
        "/metrics counts the open replica endpoint connection",
        Duration::from_secs(10),
        || async move {
            let metrics =
                tokio::task::spawn_blocking(move || common::http_get(admin_port, "/metrics"))
                    .await
                    .unwrap()?;
            metrics
                .contains("keyway_replica_endpoint_connections 1")
                .then_some(())
        },
    )
    .await;
    // A restart keeps the port (the fixture binds it again).
    c.restart_node(0).await.unwrap();
    assert_eq!(c.node(0).unwrap().replica_addr(), Some(&*addr));
    assert_eq!(advertised(&c, 0).await.as_deref(), Some(&*addr));
    c.shutdown().await;

    let dir = tempfile::tempdir().unwrap();
    let mut spec = ClusterSpec::ephemeral(1, dir.path().to_path_buf());
    spec.manager = None;
    spec.node.replica_listen = keyway_node::replica_endpoint::ReplicaListen::Off;
    let c = LocalCluster::start(spec).await.expect("cluster starts");
    assert_eq!(c.node(0).unwrap().replica_addr(), None);
    assert_eq!(advertised(&c, 0).await, None);
    c.shutdown().await;
}

const REDIS_PY_SCAN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/scan_all.py");

/// 3 nodes, every partition replicated on the next node (in sync): each
/// node is the primary of its ranges and a replica of its predecessor's.
/// redis-py gives an address the role of its first appearance in
/// `CLUSTER SLOTS`; with a node's replica role at its replica endpoint, it
/// sees the 3 main addresses as the primaries and the 3 replica endpoints
/// as the replicas, so `scan_iter` and `DBSIZE` (sent to every primary)
/// reach every key. (With both roles at one address redis-py saw 1 primary
/// of 3 and scanned a third of the keys.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_py_sees_every_node_as_a_primary_and_scans_every_key() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = ClusterSpec::ephemeral(3, dir.path().to_path_buf());
    spec.node.lease_ttl_ms = 60_000;
    spec.manager = None;
    let c = LocalCluster::start(spec).await.expect("cluster starts");
    let map = c.map().await.unwrap();
    let index_of = |id: NodeId| {
        (0..c.len())
            .find(|i| c.node(*i).unwrap().id() == id)
            .unwrap()
    };
    // The keys are written first, each to its owner.
    let mut conns = Vec::new();
    for i in 0..c.len() {
        conns.push(
            tokio::net::TcpStream::connect(c.node(i).unwrap().resp_addr())
                .await
                .unwrap(),
        );
    }
    let keys = 300;
    for k in 0..keys {
        let key = format!("scan-key-{k}");
        let owner = map
            .locate_slot(DEFAULT_KEYSPACE, key_hash_slot(key.as_bytes()))
            .unwrap()
            .owner;
        assert_eq!(
            raw_command(&mut conns[index_of(owner)], &["SET", &key, "v"]).await,
            Frame::ok()
        );
    }
    // Then every partition gets an in-sync replica on the next node.
    let ids: Vec<NodeId> = map.nodes.keys().copied().collect();
    assert_eq!(ids.len(), 3);
    let next = |id: NodeId| ids[(ids.iter().position(|n| *n == id).unwrap() + 1) % ids.len()];
    let mut conditions = Vec::new();
    let mut changes = Vec::new();
    for p in map.keyspace_partitions(DEFAULT_KEYSPACE) {
        conditions.push(OwnershipCondition {
            partition: p.id,
            expected: Some((p.owner, p.epoch)),
        });
        changes.push(MapChange::UpsertPartition(PartitionRecord {
            replicas: vec![next(p.owner)],
            // Out of sync: the primary copies each replica and CASes it in,
            // so a map with every in-sync set non-empty is one the
            // primaries made (not this commit, which a primary would first
            // undo: it cannot know a replica it did not copy is in sync).
            in_sync: Vec::new(),
            epoch: Epoch(p.epoch.0 + 1),
            ..p.clone()
        }));
    }
    let version = c
        .meta()
        .commit(MapTxn {
            conditions,
            changes,
        })
        .await
        .unwrap();
    // Every node routes by a map in which every replica joined the in-sync set.
    for i in 0..c.len() {
        let node = c.node(i).unwrap();
        eventually(
            "every node routes by the replicated map, every replica in sync",
            Duration::from_secs(30),
            || {
                let map = node.shared().routing.map();
                let ok = map.version >= version
                    && map.nodes.values().all(|n| n.replica_addr.is_some())
                    && map
                        .keyspace_partitions(DEFAULT_KEYSPACE)
                        .all(|p| !p.in_sync.is_empty());
                async move { ok.then_some(()) }
            },
        )
        .await;
    }
    let port = c
        .node(0)
        .unwrap()
        .resp_addr()
        .rsplit_once(':')
        .unwrap()
        .1
        .to_string();
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let out = tokio::process::Command::new(&python)
        .args([REDIS_PY_SCAN, &port])
        .output()
        .await
        .unwrap_or_else(|e| panic!("run {python} {REDIS_PY_SCAN}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = |name: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ').map(str::to_string))
            .unwrap_or_else(|| panic!("no {name} in {stdout}"))
    };
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v.join(",")
    };
    let mains = sorted(
        (0..3)
            .map(|i| c.node(i).unwrap().resp_addr().to_string())
            .collect(),
    );
    let replicas = sorted(
        (0..3)
            .map(|i| c.node(i).unwrap().replica_addr().unwrap().to_string())
            .collect(),
    );
    assert_eq!(line("primaries"), mains, "{stdout}");
    assert_eq!(line("replicas"), replicas, "{stdout}");
    assert_eq!(line("scanned"), keys.to_string(), "{stdout}");
    assert_eq!(line("dbsize"), keys.to_string(), "{stdout}");
    c.shutdown().await;
}
