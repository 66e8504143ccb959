//! A machine crash of both copies cannot lose a write acknowledged at
//! replication factor 2 under `group`: the replica fsyncs a stream call's
//! records before answering (invariant 9). Under `periodic` the replica
//! only hands them to the OS, as the primary does (issue 15): the same crash
//! loses acknowledged writes there, which shows the test can fail.
//!
//! Both nodes run in-process on crashable [`FaultyEngine`]s, whose
//! `crash()` keeps only what a successful `sync()` covered.

use bytes::Bytes;
use keyway_client::{Client, ClientConfig};
use keyway_cluster::{ClusterSpec, LocalCluster};
use keyway_map::{DEFAULT_KEYSPACE, KeyRouting, Keyspace};
use keyway_node::{Durability, EngineKind};
use keyway_storage::{Engine, FaultyEngine, MemEngine};
use keyway_testkit::eventually;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

const WRITERS: usize = 4;
/// Acknowledged writes to collect before the crash (the writers keep going).
const ACKED_BEFORE_CRASH: usize = 300;

/// Acknowledged keys, and for each node the acknowledged keys its durable
/// state lacks after both engines crashed at once.
async fn crash_both_copies(durability: Durability) -> (usize, Vec<Vec<String>>) {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = ClusterSpec::ephemeral(2, dir.path().to_path_buf());
    spec.partitions_per_node = 2;
    spec.manager = None;
    spec.replication = keyway_meta::Replication {
        factor: 2,
        min_in_sync: 2,
    };
    spec.node.engine = EngineKind::Memory;
    spec.node.durability = durability;
    // Long enough that `periodic`'s background fsync does not run between
    // the writes and the crash.
    spec.node.periodic_sync_ms = 600_000;
    let mut c = LocalCluster::start(spec).await.expect("cluster starts");
    let engines: Vec<Arc<FaultyEngine>> = (0..2)
        .map(|_| Arc::new(FaultyEngine::crashable()))
        .collect();
    for (i, engine) in engines.iter().enumerate() {
        c.stop_node(i).await.unwrap();
        c.start_node_with_engine(i, engine.clone()).await.unwrap();
    }
    c.wait_serving(Duration::from_secs(30)).await.unwrap();
    // min_in_sync 2: a write is acknowledged only with its replica in sync.
    c.wait_replicas_serving(Duration::from_secs(30))
        .await
        .unwrap();
    let seeds: Vec<String> = c.resp_addrs().into_iter().flatten().collect();
    let seeds: Vec<&str> = seeds.iter().map(|s| s.as_str()).collect();
    let client = Arc::new(Client::connect(&seeds, ClientConfig::default()).await.unwrap());
    let acked_count = Arc::new(AtomicUsize::new(0));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let client = client.clone();
            let acked_count = acked_count.clone();
            tokio::spawn(async move {
                let mut acked = Vec::new();
                for i in 0.. {
                    let key = format!("rc:{w}:{i}");
                    match client.set(key.as_bytes(), b"v").await {
                        Ok(()) => {
                            acked.push(key);
                            acked_count.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(_) => break,
                    }
                }
                acked
            })
        })
        .collect();
    eventually(
        "writes acknowledged before the crash",
        Duration::from_secs(60),
        || {
            let n = acked_count.load(Ordering::SeqCst);
            async move { (n >= ACKED_BEFORE_CRASH).then_some(()) }
        },
    )
    .await;
    // Both machines crash: each keeps only what it fsynced.
    let disks: Vec<MemEngine> = engines
        .iter()
        .map(|e| e.crash().expect("a crashable engine"))
        .collect();
    let mut acked = Vec::new();
    for w in writers {
        acked.extend(w.await.unwrap());
    }
    let keyspace = Keyspace::new(DEFAULT_KEYSPACE, "default", KeyRouting::Hash);
    let lost = disks
        .iter()
        .map(|disk| {
            acked
                .iter()
                .filter(|k| {
                    disk.get(&keyspace.storage_key(k.as_bytes()))
                        .unwrap()
                        .map(|v| v.data)
                        != Some(Bytes::from_static(b"v"))
                })
                .cloned()
                .collect()
        })
        .collect();
    c.shutdown().await;
    (acked.len(), lost)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_writes_acknowledged_at_factor_two_survive_a_crash_of_both_copies() {
    let (acked, lost) = crash_both_copies(Durability::Group).await;
    assert!(acked >= ACKED_BEFORE_CRASH);
    for (node, lost) in lost.iter().enumerate() {
        assert!(
            lost.is_empty(),
            "node {node} lost {} of {acked} acknowledged writes: {:?}",
            lost.len(),
            &lost[..lost.len().min(5)]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_replicas_do_not_fsync_each_call_so_the_same_crash_loses_writes() {
    let (acked, lost) = crash_both_copies(Durability::Periodic).await;
    assert!(acked >= ACKED_BEFORE_CRASH);
    // Neither copy fsynced: every acknowledged write is gone from both.
    for (node, lost) in lost.iter().enumerate() {
        assert!(
            lost.len() * 2 > acked,
            "node {node} kept {} of {acked} acknowledged writes",
            acked - lost.len()
        );
    }
}
