//! The replication loop carrying a primary move out against an embedded
//! store and a real seat. There are no nodes: the test plays the primary
//! (its in-sync CAS) and the nodes' switchover CAS; the loop's own
//! switchover calls fail (nobody listens), which the test checks too.

use super::*;
use crate::seat::{Seat, SeatConfig};
use keyway_map::{Epoch, MapChange, NodeId, OwnershipCondition, PartitionId, PartitionRecord};
use keyway_meta::{EmbeddedMeta, EmbeddedOptions, MapTxn};
use std::future::Future;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(30);

async fn eventually<T, F: Future<Output = Option<T>>>(what: &str, probe: impl FnMut() -> F) -> T {
    keyway_testkit::eventually(what, DEADLINE, probe).await
}

/// Rewrites `p`'s row by CAS at epoch + 1 (as a primary or a node's
/// switchover would).
async fn cas_row(meta: &dyn MetaStore, p: PartitionId, f: impl FnOnce(&mut PartitionRecord)) {
    let map = meta.get_map().await.unwrap();
    let mut row = map.partitions[&p].clone();
    let cond = OwnershipCondition {
        partition: p,
        expected: Some((row.owner, row.epoch)),
    };
    f(&mut row);
    row.epoch = Epoch(row.epoch.0 + 1);
    meta.commit(MapTxn {
        conditions: vec![cond],
        changes: vec![MapChange::UpsertPartition(row)],
    })
    .await
    .unwrap();
}

/// The switchover CAS of interface 2: owner `to`, the old owner kept in sync.
fn switched(row: &mut PartitionRecord, to: NodeId) {
    let old = row.owner;
    row.replicas.retain(|r| *r != to);
    row.replicas.push(old);
    row.owner = to;
    row.in_sync = vec![old];
    row.reads_from = None;
}

#[tokio::test]
async fn the_loop_adds_reads_switches_keeps_the_window_and_moves_back() {
    let dir = tempfile::tempdir().unwrap();
    let meta = Arc::new(EmbeddedMeta::open(dir.path(), EmbeddedOptions::default()).unwrap());
    for i in 1..=3 {
        let id = meta
            .register_node(None, format!("r{i}:6379"), format!("127.0.0.1:{}", 1 + i))
            .await
            .unwrap();
        meta.grant_lease(id, 60_000).await.unwrap();
    }
    let replication = keyway_meta::Replication {
        factor: 2,
        min_in_sync: 1,
    };
    assert!(
        meta.bootstrap_if_empty_with(3, 2, replication)
            .await
            .unwrap()
    );
    let metrics = Arc::new(Metrics::new());
    let decisions = DecisionLog::new(&metrics);
    let seat = Seat::start(
        meta.clone(),
        SeatConfig::new("m", Duration::from_millis(2_000)),
        metrics.clone(),
    );
    eventually("the seat to lead", || {
        let l = seat.leading();
        async move { l }
    })
    .await;
    let config = ReplicationConfig {
        interval_ms: 20,
        failover_margin_ms: 200,
        ..ReplicationConfig::default()
    };
    let duty = Replication::start(
        meta.clone(),
        seat.view(),
        config,
        decisions.clone(),
        &metrics,
        crate::copies::CopyTracker::default(),
    );
    let map = meta.get_map().await.unwrap();
    let row = map.owned_by(NodeId(1)).next().unwrap().clone();
    let (p, x) = (row.id, row.replicas[0]);
    let t = *map.nodes.keys().find(|n| !row.has_copy(**n)).unwrap();
    cas_row(&*meta, p, |r| r.in_sync = vec![x]).await;

    let mv = request_primary_move(&*meta, p, t, true, 100, 60_000)
        .await
        .unwrap();
    // Busy: no second move, no migration, no replica move of p meanwhile.
    assert!(matches!(
        request_primary_move(&*meta, p, t, false, 100, 0).await,
        Err(PrimaryMoveError::Busy { .. })
    ));
    assert!(crate::request_move(&*meta, p, t).await.is_err());
    let record = |meta: Arc<EmbeddedMeta>| async move {
        meta.get_migration(mv.id)
            .await
            .unwrap()
            .and_then(|s| PrimaryMove::load(&s))
    };
    let row_of = |meta: Arc<EmbeddedMeta>| async move {
        meta.get_map().await.unwrap().partitions[&p].clone()
    };

    eventually("T added as a replica", || {
        let meta = meta.clone();
        async move { row_of(meta).await.replicas.contains(&t).then_some(()) }
    })
    .await;
    // The primary CASes T in; the loop gives T the reads, holds, switches.
    cas_row(&*meta, p, |r| r.in_sync = vec![x, t]).await;
    eventually("reads on T", || {
        let meta = meta.clone();
        async move { (row_of(meta).await.reads_from == Some(t)).then_some(()) }
    })
    .await;
    assert_eq!(row_of(meta.clone()).await.owner, NodeId(1), "writes stay");
    eventually("the switchover called (and failing: no node)", || {
        let d = decisions.clone();
        async move {
            d.recent()
                .iter()
                .any(|d| d.reason == "switchover_failed")
                .then_some(())
        }
    })
    .await;
    assert_eq!(record(meta.clone()).await.unwrap().phase, Phase::Switch);
    let status = duty.status().get();
    assert_eq!(status.primary_moves.len(), 1, "{status:?}");
    assert_eq!(status.primary_moves[0].record.phase, Phase::Switch);

    // The node's switchover: T owner, P kept in sync.
    cas_row(&*meta, p, |r| switched(r, t)).await;
    eventually("the fail-back window", || {
        let meta = meta.clone();
        async move {
            record(meta)
                .await
                .filter(|m| m.phase == Phase::FailBackWindow)
        }
    })
    .await;
    let back = request_move_back(&*meta, p).await.unwrap();
    assert!(back.back_requested_at_ms.is_some());
    assert!(request_move_back(&*meta, p).await.is_err(), "once");
    eventually("the switch back", || {
        let meta = meta.clone();
        async move { record(meta).await.filter(|m| m.phase == Phase::SwitchBack) }
    })
    .await;
    cas_row(&*meta, p, |r| switched(r, NodeId(1))).await;
    eventually("the move ended", || {
        let meta = meta.clone();
        async move { record(meta).await.is_none().then_some(()) }
    })
    .await;
    let row = row_of(meta.clone()).await;
    assert_eq!((row.owner, row.replicas.clone()), (NodeId(1), vec![x]));
    let text = metrics.encode();
    assert!(
        text.contains(r#"keyway_manager_primary_moves_total{outcome="moved_back"} 1"#),
        "{text}"
    );
    assert!(
        decisions
            .recent()
            .iter()
            .any(|d| d.action == "primary_move_moved_back" && d.reason == "moved_back")
    );
    assert!(matches!(
        request_move_back(&*meta, p).await,
        Err(PrimaryMoveError::Back(pmoves::MoveBackError::NoMove(_)))
    ));
    duty.shutdown().await;
    seat.shutdown().await;
}
