//! A pipelined replication stream (`replica_stream_window_calls` 8) on a
//! real in-process 2-node cluster whose partitions each have the other
//! node as replica. While one node's replica side is stalled, the other's
//! stream keeps sending calls as its writers' records become durable, so
//! several are in flight; once the replica resumes they arrive at once and
//! race to its ordered section. Each call names the one it continues; the
//! replica applies it right after that one, waiting for it when it is
//! first. Checked: not one call is refused (a continuation refused, or one
//! whose wait for its predecessor timed out, a lost wake-up, would be),
//! every acknowledged write is on the replica, the two copies' digests
//! agree, and the replica counted calls that continued unanswered ones
//! (so the pipelined path ran).

use crate::common;

use common::replica::{
    assert_digests_equal, client, held, node_index, replicate_everything_with, wait_all_in_sync,
};
use keyway_cluster::{ClusterSpec, LocalCluster};
use keyway_map::{DEFAULT_KEYSPACE, key_hash_slot};
use keyway_testkit::eventually;
use std::sync::Arc;
use std::time::Duration;

const WINDOW_CALLS: u64 = 8;
const WRITERS: usize = 24;
const WRITES_PER_WRITER: usize = 15;
const ROUNDS: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_in_flight_race_to_the_replica_and_it_applies_them_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = ClusterSpec::ephemeral(2, dir.path().to_path_buf());
    spec.partitions_per_node = 2;
    spec.manager = None;
    spec.node.lease_ttl_ms = 30_000;
    // Far above the stalls: no replica leaves the in-sync set.
    spec.node.replica_lag_timeout_ms = 20_000;
    spec.node.replica_read_lease_ms = 400;
    spec.node.replica_heartbeat_ms = 100;
    spec.node.replica_stream_window_calls = WINDOW_CALLS;
    let c = LocalCluster::start(spec).await.expect("cluster starts");
    let map = replicate_everything_with(&c, 1).await;
    let cl = Arc::new(client(&c).await);
    let shared = |i: usize| c.node(i).unwrap().shared();
    let refusals = || -> u64 {
        (0..2)
            .map(|i| shared(i).replication.metrics.replica_refusals.get())
            .sum()
    };
    let refused_before = refusals();

    for round in 0..ROUNDS {
        let (stalled, primary) = (round % 2, 1 - round % 2);
        shared(stalled).replication.replica.set_paused(true);
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                let cl = cl.clone();
                tokio::spawn(async move {
                    let mut acked = Vec::new();
                    for i in 0..WRITES_PER_WRITER {
                        let (key, value) =
                            (format!("r{round}-w{w}-{i}"), format!("v{round}.{w}.{i}"));
                        cl.set(key.as_bytes(), value.as_bytes()).await.unwrap();
                        acked.push((key, value));
                    }
                    acked
                })
            })
            .collect();
        // The stalled replica's primary sends ahead: several calls in flight.
        eventually(
            "several stream calls in flight",
            Duration::from_secs(30),
            || async {
                let gauge = &shared(primary).replication.metrics.stream_calls_in_flight;
                (gauge.get() >= 3).then_some(())
            },
        )
        .await;
        shared(stalled).replication.replica.set_paused(false);
        for w in writers {
            for (key, value) in w.await.unwrap() {
                let p = map
                    .locate_slot(DEFAULT_KEYSPACE, key_hash_slot(key.as_bytes()))
                    .unwrap();
                let replica = node_index(&c, p.replicas[0]);
                // Acknowledged, so on the replica already (it may hold a
                // later write of the same writer only if it holds this one).
                assert_eq!(
                    held(&c, replica, key.as_bytes()).as_deref(),
                    Some(value.as_bytes()),
                    "{key} on its replica"
                );
            }
        }
    }
    assert_eq!(refusals(), refused_before, "no call refused by a replica");
    let map = wait_all_in_sync(&c).await;
    assert_digests_equal(&c, &map).await;
    let continued: u64 = (0..2)
        .map(|i| shared(i).replication.metrics.replica_continued_calls.get())
        .sum();
    let waits: u64 = (0..2)
        .map(|i| {
            shared(i)
                .replication
                .metrics
                .replica_continuation_waits
                .get()
        })
        .sum();
    eprintln!("continued calls {continued}, of which waited for their predecessor {waits}");
    assert!(
        continued >= ROUNDS as u64,
        "the pipelined path ran ({continued} continued calls)"
    );
    c.shutdown().await;
}
