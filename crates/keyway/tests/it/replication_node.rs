//! Replication, node side, on a real in-process 2-node cluster whose
//! partitions each have the other node as replica: the replica holds every
//! acknowledged write (checked right at the acknowledgement, and by range
//! digests), a stalled replica is CASed out of the in-sync set after the
//! lag timeout while writes continue, then catches up and is CASed back,
//! and with `min_in_sync` 2 an out-of-sync replica means `-NOREPLICAS`
//! for writes while reads are served.

use crate::common;

use bytes::Bytes;
use common::replica::{
    assert_digests_equal, client, held, node_index, replicate_everything_with, wait_all_in_sync,
};
use keyway_client::ClientError;
use keyway_cluster::{ClusterSpec, LocalCluster};
use keyway_map::{
    DEFAULT_KEYSPACE, Epoch, MapChange, NodeId, OwnershipCondition, PartitionMap, PartitionRecord,
    key_hash_slot,
};
use keyway_meta::MapTxn;
use keyway_peer::PeerClient;
use keyway_resp::Frame;
use keyway_testkit::eventually;
use std::time::{Duration, Instant};

const LAG_MS: u64 = 1_000;

fn init_log() {
    let _ = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_test_writer()
        .try_init();
}

async fn cluster(dir: &std::path::Path) -> LocalCluster {
    init_log();
    let mut spec = ClusterSpec::ephemeral(2, dir.to_path_buf());
    spec.partitions_per_node = 2;
    spec.manager = None;
    spec.node.lease_ttl_ms = 30_000;
    spec.node.replica_lag_timeout_ms = LAG_MS;
    spec.node.replica_read_lease_ms = 400;
    spec.node.replica_heartbeat_ms = 100;
    LocalCluster::start(spec).await.expect("cluster starts")
}

/// The partition of `key` and its replica's node index.
fn replica_of(c: &LocalCluster, map: &PartitionMap, key: &[u8]) -> (PartitionRecord, usize) {
    let p = map
        .locate_slot(DEFAULT_KEYSPACE, key_hash_slot(key))
        .unwrap()
        .clone();
    let r = node_index(c, p.replicas[0]);
    (p, r)
}

/// `metric` (a counter's or histogram's `_count` line) summed over the
/// cluster's nodes, read as a scrape reads it.
fn metric_sum(c: &LocalCluster, metric: &str) -> u64 {
    (0..c.len())
        .map(|i| {
            let shared = c.node(i).unwrap().shared().clone();
            shared.metrics.observe_storage(&*shared.engine);
            let text = shared.metrics.encode();
            text.lines()
                .find_map(|l| l.strip_prefix(metric)?.strip_prefix(' '))
                .unwrap_or_else(|| panic!("no {metric} on node {i}: {text}"))
                .parse::<u64>()
                .unwrap()
        })
        .sum()
}

fn text(r: Result<Frame, ClientError>) -> String {
    match r {
        Ok(Frame::Simple(s)) => s,
        Ok(Frame::Error(e)) => e,
        Ok(other) => format!("{other:?}"),
        Err(e) => e.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_hold_every_acknowledged_write_and_a_stalled_replica_is_dropped_then_rejoins() {
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(dir.path()).await;
    // Some data before replication starts: the catch-up copies it.
    let cl = std::sync::Arc::new(client(&c).await);
    for i in 0..300 {
        cl.set(format!("old{i}").as_bytes(), b"before")
            .await
            .unwrap();
    }
    replicate_everything_with(&c, 1).await;
    let map = c.map().await.unwrap();
    for i in 0..300 {
        let key = format!("old{i}");
        let (_, r) = replica_of(&c, &map, key.as_bytes());
        assert_eq!(
            held(&c, r, key.as_bytes()).as_deref(),
            Some(&b"before"[..]),
            "{key} copied"
        );
    }
    let fsyncs_before = metric_sum(&c, "keyway_fsync_seconds_count");
    let opens_before = metric_sum(&c, "keyway_replication_stream_opens_total");
    let calls_before = metric_sum(&c, "keyway_replication_stream_calls_total");
    // (a)/(d): the replica has each write when its acknowledgement arrives.
    for i in 0..400 {
        let key = format!("k{i}");
        let value = format!("v{i}");
        cl.set(key.as_bytes(), value.as_bytes()).await.unwrap();
        let (_, r) = replica_of(&c, &map, key.as_bytes());
        assert_eq!(
            held(&c, r, key.as_bytes()).as_deref(),
            Some(value.as_bytes()),
            "{key} acknowledged before its replica had it"
        );
    }
    assert_digests_equal(&c, &map).await;
    // One write at a time (durability `group`): each was fsynced at its
    // primary and, before its acknowledgement, at its replica, and
    // `keyway_fsync_seconds` times both.
    let fsyncs_made = metric_sum(&c, "keyway_fsync_seconds_count") - fsyncs_before;
    assert!(
        fsyncs_made >= 800,
        "{fsyncs_made} fsyncs timed for 400 replicated writes, expected 2 each"
    );
    // Their calls rode the streams' long-lived `ReplicateStream`s: one
    // call or more per write, and a stream opened again only after a
    // failure (a call refused right after the in-sync CAS, when the
    // replica installed the new epoch first, happens in about one run in
    // fifteen), never per call.
    let calls = metric_sum(&c, "keyway_replication_stream_calls_total") - calls_before;
    let opens = metric_sum(&c, "keyway_replication_stream_opens_total") - opens_before;
    assert!(
        calls >= 400,
        "{calls} stream calls for 400 replicated writes"
    );
    assert!(
        opens <= 4,
        "{opens} streams opened while {calls} calls went through them"
    );
    // Those 400 keys were new, in partitions the catch-up had cleaned (so
    // their ranges' version bounds are known): each replica applied them
    // without reading the key, and its /metrics counts it.
    let skipped = metric_sum(&c, "keyway_storage_foreign_reads_skipped_total");
    assert!(
        skipped >= 400,
        "{skipped} replicated writes skipped the version read, expected every one of the 400"
    );

    // (b): stall node 1's replica side. The partitions it replicates lose it.
    let stalled = 1;
    let stalled_id = c.node_ids()[stalled].unwrap();
    let affected: Vec<PartitionRecord> = map
        .partitions
        .values()
        .filter(|p| p.replicas == vec![stalled_id])
        .cloned()
        .collect();
    assert!(!affected.is_empty());
    let key_of = |p: &PartitionRecord| {
        (0..100_000)
            .map(|i| format!("s{i}"))
            .find(|k| p.contains(&key_hash_slot(k.as_bytes()).to_be_bytes()))
            .unwrap()
    };
    // In sync, the replica holds a read lease from its primary's stream.
    let routing = c.node(stalled).unwrap().shared().routing.clone();
    let lease_of = |p: &PartitionRecord| {
        let routing = routing.clone();
        let (id, epoch) = (p.id, p.epoch);
        move || routing.replica_read_valid(id, epoch)
    };
    let in_sync_rows: Vec<PartitionRecord> = affected.clone();
    for p in &in_sync_rows {
        let valid = lease_of(p);
        eventually(
            "the replica holds a read lease",
            Duration::from_secs(5),
            || {
                let v = valid();
                async move { v.then_some(()) }
            },
        )
        .await;
    }
    c.node(stalled)
        .unwrap()
        .shared()
        .replication
        .replica
        .set_paused(true);
    // One write to each partition it replicates, at once: each waits for
    // the lag timeout, then its partition drops the stalled replica.
    let paused_at = Instant::now();
    let writes: Vec<_> = affected
        .iter()
        .map(|p| {
            let (cl, key) = (cl.clone(), key_of(p));
            tokio::spawn(async move {
                cl.set(key.as_bytes(), b"during-stall").await.unwrap();
                (key, paused_at.elapsed())
            })
        })
        .collect();
    let mut stall_keys = Vec::new();
    for w in writes {
        let (key, waited) = w.await.unwrap();
        assert!(
            waited >= Duration::from_millis(LAG_MS)
                && waited < Duration::from_millis(LAG_MS + 2_000),
            "{key} waited {waited:?}: about the lag timeout ({LAG_MS} ms), not forever"
        );
        stall_keys.push(key);
    }
    // Its read leases ran out before the lag timeout removed it.
    for p in &in_sync_rows {
        assert!(!lease_of(p)(), "partition {}: read lease still valid", p.id);
    }
    let removed = eventually(
        "the stalled replica is out of the in-sync set",
        Duration::from_secs(5),
        || async {
            let m = c.map().await.ok()?;
            affected
                .iter()
                .all(|p| m.partitions[&p.id].in_sync.is_empty())
                .then_some(m)
        },
    )
    .await;
    for p in &affected {
        assert_eq!(
            removed.partitions[&p.id].epoch,
            Epoch(p.epoch.0 + 1),
            "partition {}: removed by exactly one CAS",
            p.id
        );
    }
    // Observability: the primary's /status roles and metrics say so.
    let primary = c
        .node(node_index(&c, affected[0].owner))
        .unwrap()
        .shared()
        .clone();
    let status = primary.replication.status();
    assert!(
        status.roles.iter().any(|r| r.role == "primary"
            && r.partition == affected[0].id.0
            && r.peer == stalled_id.0
            && r.state != "in_sync"),
        "{status:?}"
    );
    let text = primary.metrics.encode();
    assert!(
        text.contains("keyway_replication_in_sync_changes_total{reason=\"lag_timeout\"}"),
        "{text}"
    );
    // Writes continue without waiting.
    for i in 0..50 {
        let started = Instant::now();
        let key = format!("{}-{i}", key_of(&affected[i % affected.len()]));
        cl.set(key.as_bytes(), b"no-wait").await.unwrap();
        assert!(
            started.elapsed() < Duration::from_millis(LAG_MS / 2),
            "write {i} waited"
        );
    }
    // Resume: it catches up and is CASed back in.
    c.node(stalled)
        .unwrap()
        .shared()
        .replication
        .replica
        .set_paused(false);
    let back = wait_all_in_sync(&c).await;
    for p in &affected {
        assert!(back.partitions[&p.id].epoch > removed.partitions[&p.id].epoch);
    }
    for key in &stall_keys {
        assert_eq!(
            held(&c, stalled, key.as_bytes()).as_deref(),
            Some(&b"during-stall"[..]),
            "{key} caught up"
        );
    }
    assert_digests_equal(&c, &back).await;
    // The stalled replica's calls went unanswered past the lag timeout:
    // the streams to it gave their `ReplicateStream`s up and opened new
    // ones, which carried the catch-up's stream calls.
    let reopened = metric_sum(&c, "keyway_replication_stream_opens_total") - opens_before;
    assert!(reopened >= 1, "no stream opened again after the stall");
    // `/status` shows the same count per node (read after the metric: a
    // stream may open meanwhile, its count never falls).
    let in_status: u64 = (0..c.len())
        .map(|i| {
            c.node(i)
                .unwrap()
                .shared()
                .replication
                .status()
                .stream_opens
        })
        .sum();
    let in_metrics = opens_before + reopened;
    assert!(
        (in_metrics..=in_metrics + 4).contains(&in_status),
        "/status stream_opens {in_status}, /metrics {in_metrics}"
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_in_sync_two_refuses_writes_with_noreplicas_while_reads_work() {
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(dir.path()).await;
    replicate_everything_with(&c, 2).await;
    let map = c.map().await.unwrap();
    let cl = client(&c).await;
    let key = b"guarded";
    cl.set(key, b"one").await.unwrap();
    let (p, r) = replica_of(&c, &map, key);
    c.node(r)
        .unwrap()
        .shared()
        .replication
        .replica
        .set_paused(true);
    eventually(
        "writes are refused with NOREPLICAS",
        Duration::from_secs(10),
        || async {
            let reply = text(cl.command(&[b"SET", key, b"two"]).await);
            (reply == "NOREPLICAS Not enough good replicas to write.").then_some(())
        },
    )
    .await;
    let m = c.map().await.unwrap();
    assert!(m.partitions[&p.id].in_sync.is_empty());
    // Reads are served (the last acknowledged value or the one written
    // before the replica was removed).
    let got = cl.get(key).await.unwrap().unwrap();
    assert!(
        got == Bytes::from_static(b"one") || got == Bytes::from_static(b"two"),
        "{got:?}"
    );
    assert!(
        c.node(node_index(&c, p.owner))
            .unwrap()
            .shared()
            .replication
            .metrics
            .norepl_refusals
            .get()
            >= 1
    );
    c.node(r)
        .unwrap()
        .shared()
        .replication
        .replica
        .set_paused(false);
    wait_all_in_sync(&c).await;
    cl.set(key, b"three").await.unwrap();
    assert_eq!(held(&c, r, key).as_deref(), Some(&b"three"[..]));
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switchover_moves_the_primary_to_the_in_sync_replica_without_losing_a_write() {
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(dir.path()).await;
    replicate_everything_with(&c, 1).await;
    let map = c.map().await.unwrap();
    let cl = client(&c).await;
    for i in 0..200 {
        cl.set(format!("w{i}").as_bytes(), b"x").await.unwrap();
    }
    let p = map.partitions.values().next().unwrap().clone();
    let owner = c.node(node_index(&c, p.owner)).unwrap();
    let admin = owner.admin_addr().to_string();
    let done = PeerClient::connect(&admin)
        .unwrap()
        .switchover(p.id, p.epoch, None, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!((done.0, done.1), (p.replicas[0], Epoch(p.epoch.0 + 1)));
    let m = c.map().await.unwrap();
    let row = &m.partitions[&p.id];
    assert_eq!(
        (row.owner, row.replicas.clone()),
        (p.replicas[0], vec![p.owner])
    );
    // The new primary serves every write of the partition, and re-syncs the old one.
    for i in 0..200 {
        let key = format!("w{i}");
        if p.contains(&key_hash_slot(key.as_bytes()).to_be_bytes()) {
            assert_eq!(
                cl.get(key.as_bytes()).await.unwrap().as_deref(),
                Some(&b"x"[..]),
                "{key}"
            );
        }
    }
    wait_all_in_sync(&c).await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_primary_removes_its_in_sync_replicas_before_acknowledging_then_resyncs() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(dir.path()).await;
    replicate_everything_with(&c, 1).await;
    let cl = client(&c).await;
    for i in 0..200 {
        cl.set(format!("r{i}").as_bytes(), b"before").await.unwrap();
    }
    drop(cl);
    let before = c.map().await.unwrap();
    let restarted = c.node_ids()[0].unwrap();
    let owned: Vec<PartitionRecord> = before.owned_by(restarted).cloned().collect();
    c.restart_node(0).await.unwrap();
    c.wait_serving(Duration::from_secs(30)).await.unwrap();
    // The first write acknowledged by the restarted primary comes after the
    // CAS that removed its in-sync replicas (their log positions are unknown).
    let cl = client(&c).await;
    let p = &owned[0];
    let key = (0..100_000)
        .map(|i| format!("after{i}"))
        .find(|k| p.contains(&key_hash_slot(k.as_bytes()).to_be_bytes()))
        .unwrap();
    cl.set(key.as_bytes(), b"after-restart").await.unwrap();
    let at_ack = c.map().await.unwrap();
    assert!(
        at_ack.partitions[&p.id].epoch > p.epoch,
        "partition {}: acknowledged at epoch {} with the pre-restart in-sync set",
        p.id,
        at_ack.partitions[&p.id].epoch
    );
    let changes = c
        .node(0)
        .unwrap()
        .shared()
        .replication
        .metrics
        .in_sync_changes
        .get_or_create(&keyway_node::replicate::metrics::ReasonLabel {
            reason: "primary_restarted",
        })
        .get();
    assert!(changes >= 1, "removed for primary_restarted");
    // It re-syncs them, and nothing acknowledged is lost.
    let back = wait_all_in_sync(&c).await;
    for q in &owned {
        assert!(
            back.partitions[&q.id].epoch.0 >= q.epoch.0 + 2,
            "out and back in"
        );
    }
    for i in 0..200 {
        let key = format!("r{i}");
        assert_eq!(
            cl.get(key.as_bytes()).await.unwrap().as_deref(),
            Some(&b"before"[..])
        );
        let (_, r) = replica_of(&c, &back, key.as_bytes());
        assert_eq!(
            held(&c, r, key.as_bytes()).as_deref(),
            Some(&b"before"[..]),
            "{key}"
        );
    }
    let (_, r) = replica_of(&c, &back, key.as_bytes());
    assert_eq!(
        held(&c, r, key.as_bytes()).as_deref(),
        Some(&b"after-restart"[..])
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_fell_past_log_retention_is_copied_again() {
    init_log();
    let dir = tempfile::tempdir().unwrap();
    let mut spec = ClusterSpec::ephemeral(2, dir.path().to_path_buf());
    spec.partitions_per_node = 1;
    spec.manager = None;
    spec.node.lease_ttl_ms = 30_000;
    spec.node.replica_lag_timeout_ms = LAG_MS;
    spec.node.replica_read_lease_ms = 400;
    spec.node.replica_heartbeat_ms = 100;
    spec.node.log_retention_bytes = 32 * 1024;
    spec.node.log_truncate_interval_ms = 50;
    let c = LocalCluster::start(spec).await.expect("cluster starts");
    replicate_everything_with(&c, 1).await;
    let map = c.map().await.unwrap();
    let cl = std::sync::Arc::new(client(&c).await);
    let stalled = 1;
    c.node(stalled)
        .unwrap()
        .shared()
        .replication
        .replica
        .set_paused(true);
    // Far more than the retention limit while the replica is stalled.
    let value = vec![b'x'; 200];
    for i in 0..1_000 {
        cl.set(format!("big{i}").as_bytes(), &value).await.unwrap();
    }
    let lost = c.node(0).unwrap().shared().metrics.encode();
    c.node(stalled)
        .unwrap()
        .shared()
        .replication
        .replica
        .set_paused(false);
    let back = wait_all_in_sync(&c).await;
    let stalled_id = c.node_ids()[stalled].unwrap();
    for p in map
        .partitions
        .values()
        .filter(|p| p.replicas == vec![stalled_id])
    {
        assert!(
            back.partitions[&p.id].epoch.0 >= p.epoch.0 + 2,
            "out and back in"
        );
    }
    for i in 0..1_000 {
        let key = format!("big{i}");
        let (_, r) = replica_of(&c, &back, key.as_bytes());
        assert_eq!(
            held(&c, r, key.as_bytes()).as_deref(),
            Some(&value[..]),
            "{key}"
        );
    }
    assert_digests_equal(&c, &back).await;
    // One guard of the metric family at a time (each holds its lock).
    let changes = |reason: &'static str| {
        c.node(0)
            .unwrap()
            .shared()
            .replication
            .metrics
            .in_sync_changes
            .get_or_create(&keyway_node::replicate::metrics::ReasonLabel { reason })
            .get()
    };
    let removals = changes("lag_timeout") + changes("stream_lost");
    assert!(removals >= 1, "{lost}");
    c.shutdown().await;
}

/// The catch-up copies every node started so far.
fn copies_started(c: &LocalCluster) -> Vec<u64> {
    (0..c.node_ids().len())
        .map(|i| {
            c.node(i)
                .unwrap()
                .shared()
                .replication
                .metrics
                .copies_started
                .get()
        })
        .collect()
}

/// DESIGN13 interface 2: a switchover keeps the old primary in sync, so a
/// switch back is a switchover too, with no catch-up copy, and every
/// acknowledged write reads back after both. The two nodes' seqs are made
/// far apart first (writes to another partition of the old primary that
/// has no replica), so the new primary's overwrites would lose to the old
/// primary's versions there if they were applied unstamped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switchover_keeps_the_old_primary_in_sync_so_switching_back_copies_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(dir.path()).await;
    replicate_everything_with(&c, 1).await;
    let map = c.map().await.unwrap();
    let cl = client(&c).await;
    let p = map.partitions.values().next().unwrap().clone();
    let (old, target) = (p.owner, p.replicas[0]);
    let in_part =
        |p: &PartitionRecord, k: &String| p.contains(&key_hash_slot(k.as_bytes()).to_be_bytes());
    let keys: Vec<String> = (0..5_000)
        .map(|i| format!("k{i}"))
        .filter(|k| in_part(&p, k))
        .take(100)
        .collect();
    // Another partition of the old primary, without a replica.
    let q = map
        .partitions
        .values()
        .find(|q| q.owner == old && q.id != p.id)
        .unwrap()
        .clone();
    c.meta()
        .commit(MapTxn {
            conditions: vec![OwnershipCondition {
                partition: q.id,
                expected: Some((old, q.epoch)),
            }],
            changes: vec![MapChange::UpsertPartition(PartitionRecord {
                replicas: vec![],
                in_sync: vec![],
                epoch: Epoch(q.epoch.0 + 1),
                ..q.clone()
            })],
        })
        .await
        .unwrap();
    let tag = (0..5_000)
        .map(|i| format!("{{t{i}}}"))
        .find(|k| in_part(&q, k))
        .unwrap();
    for round in 0..10 {
        let kv: Vec<String> = (0..500)
            .flat_map(|i| [format!("{tag}q{round}/{i}"), "x".to_string()])
            .collect();
        let mut args: Vec<&[u8]> = vec![b"MSET"];
        args.extend(kv.iter().map(|k| k.as_bytes()));
        eventually("MSET to q", Duration::from_secs(10), || async {
            matches!(cl.command(&args).await, Ok(Frame::Simple(_))).then_some(())
        })
        .await;
    }
    for k in &keys {
        cl.set(k.as_bytes(), b"v1").await.unwrap();
    }
    let last_seq = |id: NodeId| {
        c.node(node_index(&c, id))
            .unwrap()
            .shared()
            .engine
            .last_seq()
    };
    assert!(
        last_seq(old) > last_seq(target) + 4_000,
        "seqs apart: {} vs {}",
        last_seq(old),
        last_seq(target)
    );
    let before = copies_started(&c);
    let admin = |id: NodeId| c.node(node_index(&c, id)).unwrap().admin_addr().to_string();

    let (owner, e1, _) = PeerClient::connect(&admin(old))
        .unwrap()
        .switchover(p.id, p.epoch, Some(target), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!((owner, e1), (target, Epoch(p.epoch.0 + 1)));
    let after_first = c.map().await.unwrap().partitions[&p.id].clone();
    for k in &keys {
        cl.set(k.as_bytes(), b"v2").await.unwrap();
    }
    // The switch back needs the old primary in sync (it is at once here;
    // a copy would have to run first otherwise).
    let row = eventually(
        "the old primary in sync",
        Duration::from_secs(20),
        || async {
            let row = c.map().await.ok()?.partitions[&p.id].clone();
            (row.owner == target && row.in_sync.contains(&old)).then_some(row)
        },
    )
    .await;
    let (owner, e2, _) = PeerClient::connect(&admin(target))
        .unwrap()
        .switchover(p.id, row.epoch, Some(old), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(owner, old);
    for k in &keys {
        assert_eq!(
            cl.get(k.as_bytes()).await.unwrap().as_deref(),
            Some(&b"v2"[..]),
            "{k} after switching back"
        );
        assert_eq!(
            held(&c, node_index(&c, old), k.as_bytes()).as_deref(),
            Some(&b"v2"[..])
        );
    }
    // (a) No catch-up copy ran on either node.
    assert_eq!(
        copies_started(&c),
        before,
        "copies started during the switches"
    );
    // (c) The old primary was in the in-sync set right after the first switch.
    assert_eq!(
        (
            after_first.owner,
            after_first.in_sync.clone(),
            after_first.reads_from
        ),
        (target, vec![old], None)
    );
    let row = c.map().await.unwrap().partitions[&p.id].clone();
    assert_eq!(
        (row.owner, row.in_sync.clone(), row.epoch),
        (old, vec![target], e2)
    );
    let kept = |id: NodeId| {
        c.node(node_index(&c, id))
            .unwrap()
            .shared()
            .replication
            .metrics
            .switchover_kept_in_sync
            .get()
    };
    assert_eq!((kept(target), kept(old)), (1, 1));
    // Writes at the old primary again reach its replica.
    cl.set(keys[0].as_bytes(), b"v3").await.unwrap();
    assert_eq!(
        held(&c, node_index(&c, target), keys[0].as_bytes()).as_deref(),
        Some(&b"v3"[..])
    );
    assert_eq!(copies_started(&c), before);
    c.shutdown().await;
}
