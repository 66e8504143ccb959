//! Crash tests that can see a missing fsync, and fail-stop after an fsync
//! failure.
//!
//! `kill -9` keeps the page cache, so `crash.rs` passes even without a
//! single fsync. Here the node runs in-process on a crashable
//! [`FaultyEngine`]: its `crash()` keeps only what a successful `sync()`
//! covered (the harshest machine crash), the node restarts on that durable
//! state, and every write acknowledged before the crash must be there. With
//! `none` durability the same test loses acknowledged writes, which shows it
//! can fail.

use bytes::Bytes;
use keyway_client::{Client, ClientConfig};
use keyway_cluster::{ClusterSpec, LocalCluster};
use keyway_node::{Durability, EngineKind};
use keyway_storage::{Engine, FaultyEngine, MemEngine};
use keyway_testkit::eventually;
use std::sync::Arc;
use std::time::Duration;

use crate::common;
use common::crash_writers::CrashWriters;

const WRITERS: usize = 4;
/// Acknowledged writes to collect before the crash (the writers keep going).
const ACKED_BEFORE_CRASH: usize = 400;

/// A one-node cluster whose node runs on `engine`.
async fn one_node_on(
    dir: &std::path::Path,
    durability: Durability,
    engine: Arc<dyn Engine>,
) -> LocalCluster {
    let mut spec = ClusterSpec::ephemeral(1, dir.to_path_buf());
    spec.node.engine = EngineKind::Memory;
    spec.node.durability = durability;
    // `periodic`: the background fsync runs often (the fsync-failure test
    // waits for it); the crash tests never use `periodic`.
    spec.node.periodic_sync_ms = 50;
    spec.manager = None;
    let mut c = LocalCluster::start(spec).await.expect("cluster starts");
    // Restart the node on the injected engine (same id, same data dir).
    c.stop_node(0).await.unwrap();
    c.start_node_with_engine(0, engine).await.unwrap();
    c.wait_serving(Duration::from_secs(10)).await.unwrap();
    c
}

async fn client(c: &LocalCluster) -> Client {
    let seeds: Vec<String> = c.resp_addrs().into_iter().flatten().collect();
    Client::connect(
        &seeds.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
        ClientConfig::default(),
    )
    .await
    .unwrap()
}

/// Writes until the crash, crashes mid-stream, restarts on the durable
/// state; returns (acknowledged, acknowledged but lost).
async fn crash_mid_stream(durability: Durability) -> (usize, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let faulty = Arc::new(FaultyEngine::crashable());
    let mut c = one_node_on(dir.path(), durability, faulty.clone()).await;
    let writers = CrashWriters::start(
        Arc::new(client(&c).await),
        WRITERS,
        |w, i| format!("crash:{{{w}}}:{i}"),
        |i| format!("v{i}"),
    );
    writers
        .wait_acked(ACKED_BEFORE_CRASH, Duration::from_secs(30))
        .await;
    let disk = faulty.crash().expect("a crashable engine");
    let acked = writers.join().await;
    c.stop_node(0).await.unwrap();
    c.start_node_with_engine(0, Arc::new(FaultyEngine::recover(disk)))
        .await
        .unwrap();
    c.wait_serving(Duration::from_secs(10)).await.unwrap();
    let client = self::client(&c).await;
    let mut lost = Vec::new();
    for key in &acked {
        let i = key.rsplit(':').next().unwrap();
        let want = Bytes::from(format!("v{i}"));
        if client.get(key.as_bytes()).await.unwrap() != Some(want) {
            lost.push(key.clone());
        }
    }
    c.shutdown().await;
    (acked.len(), lost)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_commit_acknowledged_writes_survive_a_crash_that_drops_unsynced_writes() {
    let (acked, lost) = crash_mid_stream(Durability::Group).await;
    assert!(acked >= ACKED_BEFORE_CRASH);
    assert!(
        lost.is_empty(),
        "group: {} of {acked} acknowledged writes lost: {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn always_acknowledged_writes_survive_a_crash_that_drops_unsynced_writes() {
    let (acked, lost) = crash_mid_stream(Durability::Always).await;
    assert!(acked >= ACKED_BEFORE_CRASH);
    assert!(
        lost.is_empty(),
        "always: {} of {acked} acknowledged writes lost: {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
}

/// The control: without fsyncs the same crash loses acknowledged writes,
/// so the two tests above can fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn none_durability_loses_acknowledged_writes_to_the_same_crash() {
    let (acked, lost) = crash_mid_stream(Durability::None).await;
    assert!(acked >= ACKED_BEFORE_CRASH);
    assert_eq!(
        lost.len(),
        acked,
        "none never syncs: the crash keeps nothing"
    );
}

fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

/// fsyncgate: one failed fsync and the node refuses every data command for
/// good, even once fsync works again; `/status`'s storage and the
/// `keyway_storage_failed` gauge say so.
async fn one_failed_fsync_stops_the_node(durability: Durability) {
    let dir = tempfile::tempdir().unwrap();
    let faulty = Arc::new(FaultyEngine::wrap(Arc::new(MemEngine::new())));
    let c = one_node_on(dir.path(), durability, faulty.clone()).await;
    let client = client(&c).await;
    client.set(b"before", b"1").await.unwrap();
    let shared = c.node(0).unwrap().shared().clone();
    assert_eq!(shared.storage_health.status(), "ok");
    assert_eq!(
        metric(&shared.metrics.encode(), "keyway_storage_failed"),
        Some(0.0)
    );

    faulty.fail_next_syncs(1);
    let err = client.set(b"during", b"2").await.unwrap_err().to_string();
    assert!(err.contains("fsync failed"), "{durability:?}: {err}");
    faulty.heal();
    assert_eq!(faulty.state().sync_failures, 1);
    let syncs = faulty.state().sync_calls;

    // Healed, but a later successful fsync proves nothing: no write, no read.
    for attempt in 0..3 {
        let err = client.set(b"after", b"3").await.unwrap_err().to_string();
        assert!(
            err.contains("storage failed (fsync error") && err.contains("no longer serves"),
            "{durability:?} write {attempt}: {err}"
        );
        let err = client.get(b"before").await.unwrap_err().to_string();
        assert!(err.contains("storage failed"), "{durability:?} read: {err}");
    }
    assert_eq!(
        faulty.state().sync_calls,
        syncs,
        "no fsync after the failure"
    );
    assert!(
        shared
            .storage_health
            .status()
            .starts_with("failed: fsync error"),
        "{}",
        shared.storage_health.status()
    );
    let metrics = shared.metrics.encode();
    assert_eq!(metric(&metrics, "keyway_storage_failed"), Some(1.0));
    assert_eq!(metric(&metrics, "keyway_fsync_errors_total"), Some(1.0));
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_one_failed_fsync_stops_reads_and_writes_for_good() {
    one_failed_fsync_stops_the_node(Durability::Group).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn always_one_failed_fsync_stops_reads_and_writes_for_good() {
    one_failed_fsync_stops_the_node(Durability::Always).await;
}

/// `periodic`: the background fsync fails, nothing is in flight, and the
/// node still stops serving from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_a_failed_background_fsync_stops_reads_and_writes_for_good() {
    let dir = tempfile::tempdir().unwrap();
    let faulty = Arc::new(FaultyEngine::wrap(Arc::new(MemEngine::new())));
    let c = one_node_on(dir.path(), Durability::Periodic, faulty.clone()).await;
    let client = client(&c).await;
    client.set(b"before", b"1").await.unwrap();
    let shared = c.node(0).unwrap().shared().clone();
    faulty.fail_syncs();
    eventually("the periodic fsync fails", Duration::from_secs(10), || {
        let failed = shared.storage_health.failure().is_some();
        async move { failed.then_some(()) }
    })
    .await;
    faulty.heal();
    let err = client.set(b"after", b"2").await.unwrap_err().to_string();
    assert!(err.contains("storage failed (fsync error"), "{err}");
    let err = client.get(b"before").await.unwrap_err().to_string();
    assert!(err.contains("storage failed"), "{err}");
    assert_eq!(
        metric(&shared.metrics.encode(), "keyway_storage_failed"),
        Some(1.0)
    );
    c.shutdown().await;
}
