//! A switchover and the switch back under a running writer (DESIGN13
//! interface 2), on a real in-process 2-node cluster whose partitions each
//! have the other node as an in-sync replica: writes race the new
//! primary's install (admitted before its replication rules saw the map),
//! no catch-up copy runs, and every acknowledged write reads back, at the
//! primary and at its replica, after both switches.

use keyway_client::{Client, ClientConfig};
use keyway_cluster::{ClusterSpec, LocalCluster};
use keyway_map::{
    DEFAULT_KEYSPACE, Epoch, Keyspace, MapChange, NodeId, OwnershipCondition, PartitionMap,
    PartitionRecord, Routing as KeyRouting, key_hash_slot,
};
use keyway_meta::MapTxn;
use keyway_peer::PeerClient;
use keyway_testkit::eventually;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

async fn cluster(dir: &std::path::Path) -> LocalCluster {
    let mut spec = ClusterSpec::ephemeral(2, dir.to_path_buf());
    spec.partitions_per_node = 2;
    spec.manager = None;
    spec.node.lease_ttl_ms = 30_000;
    spec.node.replica_lag_timeout_ms = 1_000;
    spec.node.replica_read_lease_ms = 400;
    spec.node.replica_heartbeat_ms = 100;
    LocalCluster::start(spec).await.expect("cluster starts")
}

/// Every partition replicated on the other node, and in sync.
async fn replicate_everything(c: &LocalCluster) -> PartitionMap {
    let map = c.map().await.unwrap();
    let mut ks = Keyspace::new(DEFAULT_KEYSPACE, "default", KeyRouting::Hash);
    ks.replication_factor = 2;
    c.meta()
        .commit(MapTxn::unconditional(vec![MapChange::UpsertKeyspace(ks)]))
        .await
        .unwrap();
    for p in map.partitions.values() {
        let other = *map.nodes.keys().find(|n| **n != p.owner).unwrap();
        c.meta()
            .commit(MapTxn {
                conditions: vec![OwnershipCondition {
                    partition: p.id,
                    expected: Some((p.owner, p.epoch)),
                }],
                changes: vec![MapChange::UpsertPartition(PartitionRecord {
                    replicas: vec![other],
                    epoch: Epoch(p.epoch.0 + 1),
                    ..p.clone()
                })],
            })
            .await
            .unwrap();
    }
    eventually("every replica in sync", Duration::from_secs(30), || async {
        let map = c.map().await.ok()?;
        map.partitions
            .values()
            .all(|p| !p.replicas.is_empty() && p.in_sync == p.replicas)
            .then_some(map)
    })
    .await
}

async fn client(c: &LocalCluster) -> Client {
    let seeds: Vec<String> = c.resp_addrs().into_iter().flatten().collect();
    let seeds: Vec<&str> = seeds.iter().map(|s| s.as_str()).collect();
    Client::connect(&seeds, ClientConfig::default())
        .await
        .unwrap()
}

fn index(c: &LocalCluster, id: NodeId) -> usize {
    c.node_ids().iter().position(|n| *n == Some(id)).unwrap()
}

/// What the writer knows of each key: the last acknowledged value, and
/// the values written after it whose outcome is unknown.
#[derive(Default)]
struct Written {
    acked: BTreeMap<String, u64>,
    unknown: BTreeMap<String, Vec<u64>>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switching_over_and_back_under_writes_copies_nothing_and_loses_no_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(dir.path()).await;
    let map = replicate_everything(&c).await;
    let p = map.partitions.values().next().unwrap().clone();
    let (old, target) = (p.owner, p.replicas[0]);
    let keys: Vec<String> = (0..5_000)
        .map(|i| format!("k{i}"))
        .filter(|k| p.contains(&key_hash_slot(k.as_bytes()).to_be_bytes()))
        .take(20)
        .collect();
    let copies = || -> Vec<u64> {
        (0..c.node_ids().len())
            .map(|i| {
                let r = &c.node(i).unwrap().shared().replication;
                r.metrics.copies_started.get()
            })
            .collect()
    };
    let before = copies();

    let written = Arc::new(Mutex::new(Written::default()));
    let acks = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (cl, written, acks, stop, keys) = (
            client(&c).await,
            written.clone(),
            acks.clone(),
            stop.clone(),
            keys.clone(),
        );
        tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Acquire) {
                i += 1;
                let k = &keys[i as usize % keys.len()];
                let ok = cl.set(k.as_bytes(), i.to_string().as_bytes()).await.is_ok();
                let mut w = written.lock().unwrap();
                if ok {
                    w.acked.insert(k.clone(), i);
                    w.unknown.remove(k);
                    acks.fetch_add(1, Ordering::AcqRel);
                } else {
                    w.unknown.entry(k.clone()).or_default().push(i);
                }
            }
        })
    };
    let acked_past = |n: u64| {
        let acks = acks.clone();
        async move {
            eventually("the writer goes on", Duration::from_secs(20), || async {
                (acks.load(Ordering::Acquire) >= n).then_some(())
            })
            .await
        }
    };
    let admin = |id: NodeId| c.node(index(&c, id)).unwrap().admin_addr().to_string();

    acked_past(300).await;
    let (owner, e1, _) = PeerClient::connect(&admin(old))
        .unwrap()
        .switchover(p.id, p.epoch, Some(target), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(owner, target);
    acked_past(acks.load(Ordering::Acquire) + 300).await;
    let row = c.map().await.unwrap().partitions[&p.id].clone();
    assert_eq!((row.owner, row.in_sync.clone()), (target, vec![old]));
    let (owner, _, _) = PeerClient::connect(&admin(target))
        .unwrap()
        .switchover(p.id, e1, Some(old), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(owner, old);
    acked_past(acks.load(Ordering::Acquire) + 300).await;
    stop.store(true, Ordering::Release);
    writer.await.unwrap();

    assert_eq!(copies(), before, "no catch-up copy ran");
    let allowed: BTreeMap<String, Vec<u64>> = {
        let w = written.lock().unwrap();
        keys.iter()
            .map(|k| {
                let mut v = vec![w.acked[k]];
                v.extend(w.unknown.get(k).into_iter().flatten().copied());
                (k.clone(), v)
            })
            .collect()
    };
    let allowed = |k: &String| allowed[k].clone();
    let cl = client(&c).await;
    for k in &keys {
        let got: u64 = String::from_utf8(cl.get(k.as_bytes()).await.unwrap().unwrap().to_vec())
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            allowed(k).contains(&got),
            "{k}: read {got}, allowed {:?}",
            allowed(k)
        );
    }
    // The replica (the first switch's new primary) holds the same.
    let held = |node: NodeId, k: &str| {
        let engine = c.node(index(&c, node)).unwrap().shared().engine.clone();
        let ks = Keyspace::new(DEFAULT_KEYSPACE, "default", KeyRouting::Hash);
        engine
            .get(&ks.storage_key(k.as_bytes()))
            .unwrap()
            .map(|v| v.data)
    };
    for k in &keys {
        eventually(
            "the replica holds the primary's value",
            Duration::from_secs(10),
            || async { (held(target, k) == held(old, k)).then_some(()) },
        )
        .await;
    }
    c.shutdown().await;
}
