//! The rebalancer's loop against a real embedded metadata store and a real
//! seat (no driver: requested migrations stay `PENDING`, which is what the
//! caps count).

use super::*;
use crate::seat::{Seat, SeatConfig};
use crate::stats::{ClusterLoad, LoadSnapshot, PartitionLoad};
use keyway_map::PartitionMap;
use keyway_meta::{EmbeddedMeta, EmbeddedOptions, LeaseId};
use std::future::Future;

const DEADLINE: Duration = Duration::from_secs(15);

/// Polls `probe` until it returns `Some`, failing after DEADLINE.
async fn eventually<T, F: Future<Output = Option<T>>>(what: &str, probe: impl FnMut() -> F) -> T {
    keyway_testkit::eventually(what, DEADLINE, probe).await
}

struct Env {
    meta: Arc<EmbeddedMeta>,
    _dir: tempfile::TempDir,
    seat: Seat,
    metrics: Arc<Metrics>,
    decisions: DecisionLog,
    leases: BTreeMap<NodeId, LeaseId>,
    load: watch::Sender<Option<Arc<LoadSnapshot>>>,
}

impl Env {
    /// Three nodes with 4 partitions of 1 MB each, and a fourth, empty node.
    async fn new() -> Env {
        let dir = tempfile::tempdir().unwrap();
        let meta = Arc::new(EmbeddedMeta::open(dir.path(), EmbeddedOptions::default()).unwrap());
        let mut leases = BTreeMap::new();
        for i in 1..=4 {
            let id = meta
                .register_node(None, format!("r{i}:6379"), format!("a{i}:7000"))
                .await
                .unwrap();
            leases.insert(id, meta.grant_lease(id, 60_000).await.unwrap());
            if i == 3 {
                assert!(meta.bootstrap_if_empty(3, 4).await.unwrap());
            }
        }
        let map = meta.get_map().await.unwrap();
        let mut load = ClusterLoad::default();
        for p in map.partitions.values() {
            load.partitions.insert(
                p.id,
                PartitionLoad {
                    partition: p.id,
                    epoch: p.epoch,
                    node: p.owner,
                    keys: 1000,
                    bytes: 1 << 20,
                    reads_per_sec: 0.0,
                    writes_per_sec: 0.0,
                    load_split_key: None,
                    size_split_key: None,
                    hot_keys: Vec::new(),
                    top_key_share: 0.0,
                },
            );
        }
        let snapshot = LoadSnapshot {
            map: Arc::new(map),
            load,
            taken_at: Instant::now(),
        };
        let (load, _) = watch::channel(Some(Arc::new(snapshot)));
        let metrics = Arc::new(Metrics::new());
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
        let decisions = DecisionLog::new(&metrics);
        Env {
            meta,
            _dir: dir,
            seat,
            metrics,
            decisions,
            leases,
            load,
        }
    }

    fn start(&self, config: RebalanceConfig) -> Rebalancer {
        Rebalancer::start(
            self.meta.clone(),
            self.seat.view(),
            config,
            self.load.subscribe(),
            self.decisions.clone(),
            &self.metrics,
        )
    }

    fn reasons(&self) -> Vec<&'static str> {
        self.decisions.recent().iter().map(|d| d.reason).collect()
    }

    async fn map(&self) -> PartitionMap {
        self.meta.get_map().await.unwrap()
    }
}

fn fast() -> RebalanceConfig {
    RebalanceConfig {
        interval_ms: 20,
        min_total_bytes: 0,
        min_total_requests_per_sec: 0.0,
        ..RebalanceConfig::default()
    }
}

#[tokio::test]
async fn a_joined_node_gets_one_move_at_a_time_and_it_is_recorded() {
    let env = Env::new().await;
    let rebalancer = env.start(fast());
    let recs = eventually("a move to node 4", || async {
        let (live, _) = read_migrations(&*env.meta).await.unwrap();
        (!live.is_empty()).then_some(live)
    })
    .await;
    assert_eq!(recs[0].target, NodeId(4));
    // The next rounds see node 4 at its cap and record why they wait.
    eventually("cap_reached", || async {
        env.reasons().contains(&"cap_reached").then_some(())
    })
    .await;
    let before = env.decisions.recent().len();
    eventually("more rounds", || async {
        let text = env.metrics.encode();
        let counted = text.lines().any(|l| {
            l.starts_with(r#"keyway_manager_decisions_total{duty="rebalance",action="no_move",reason="cap_reached"}"#)
                && l.split(' ').next_back().and_then(|n| n.parse::<u64>().ok()) >= Some(3)
        });
        counted.then_some(())
    })
    .await;
    let (live, moved_at) = read_migrations(&*env.meta).await.unwrap();
    assert_eq!(live.len(), 1, "one migration per node at a time: {live:?}");
    assert!(moved_at.contains_key(&live[0].partition));
    assert_eq!(
        env.decisions.recent().len(),
        before,
        "steady non-actions are kept once"
    );
    let moves: Vec<_> = env
        .decisions
        .recent()
        .into_iter()
        .filter(|d| d.acted && d.action == "move")
        .collect();
    assert_eq!(moves.len(), 1);
    assert_eq!(
        (moves[0].reason, moves[0].partition),
        ("balance", Some(live[0].partition))
    );
    let text = env.metrics.encode();
    for line in [
        r#"keyway_manager_rebalance_moves_started_total{reason="balance"} 1"#,
        r#"keyway_manager_rebalance_moves_planned_total{reason="balance"} 1"#,
        "keyway_manager_rebalance_nodes_down 0",
    ] {
        assert!(text.contains(line), "{line} missing from\n{text}");
    }
    rebalancer.shutdown().await;
}

#[tokio::test]
async fn a_lost_lease_marks_the_node_down_and_nothing_moves_within_the_grace() {
    let env = Env::new().await;
    let rebalancer = env.start(fast());
    // Let the first move happen, then take node 2's lease away.
    eventually("a first move", || async {
        env.reasons().contains(&"balance").then_some(())
    })
    .await;
    env.meta.revoke_lease(env.leases[&NodeId(2)]).await.unwrap();
    eventually("node 2 marked down", || async {
        (env.map().await.nodes[&NodeId(2)].state == NodeState::Down).then_some(())
    })
    .await;
    eventually("waiting_for_grace", || async {
        env.reasons().contains(&"waiting_for_grace").then_some(())
    })
    .await;
    assert!(env.reasons().contains(&"lease_gone"));
    assert!(
        env.metrics
            .encode()
            .contains("keyway_manager_rebalance_nodes_down 1")
    );
    let (live, _) = read_migrations(&*env.meta).await.unwrap();
    assert_eq!(live.len(), 1, "nothing new while node 2 may come back");
    // Its lease is back (as after a lapse: granted again, no registration).
    env.meta.grant_lease(NodeId(2), 60_000).await.unwrap();
    eventually("node 2 marked up", || async {
        (env.map().await.nodes[&NodeId(2)].state == NodeState::Up).then_some(())
    })
    .await;
    assert!(env.reasons().contains(&"lease_back"));
    rebalancer.shutdown().await;
}

#[tokio::test]
async fn past_the_grace_a_down_nodes_partitions_are_recorded_as_stuck() {
    let env = Env::new().await;
    env.meta.revoke_lease(env.leases[&NodeId(3)]).await.unwrap();
    let rebalancer = env.start(RebalanceConfig {
        down_grace_ms: 0,
        ..fast()
    });
    let d = eventually("down_past_grace", || async {
        env.decisions
            .recent()
            .into_iter()
            .find(|d| d.reason == "down_past_grace")
    })
    .await;
    assert!(d.detail.contains("4 partition(s)"), "{}", d.detail);
    assert!(d.detail.contains("decommission --force"), "{}", d.detail);
    eventually("the stuck gauge", || async {
        env.metrics
            .encode()
            .contains("keyway_manager_rebalance_stuck_partitions 4")
            .then_some(())
    })
    .await;
    // The others still balance with node 4; nothing leaves node 3.
    let live = eventually("a move", || async {
        let (live, _) = read_migrations(&*env.meta).await.unwrap();
        (!live.is_empty()).then_some(live)
    })
    .await;
    assert!(
        live.iter()
            .all(|m| m.source != NodeId(3) && m.target == NodeId(4))
    );
    rebalancer.shutdown().await;
}

#[tokio::test]
async fn a_disabled_rebalancer_keeps_liveness_but_moves_nothing() {
    let env = Env::new().await;
    env.meta.revoke_lease(env.leases[&NodeId(1)]).await.unwrap();
    let rebalancer = env.start(RebalanceConfig {
        enabled: false,
        ..fast()
    });
    eventually("disabled and node 1 down", || async {
        let down = env.map().await.nodes[&NodeId(1)].state == NodeState::Down;
        (down && env.reasons().contains(&"disabled")).then_some(())
    })
    .await;
    let (live, _) = read_migrations(&*env.meta).await.unwrap();
    assert!(live.is_empty());
    rebalancer.shutdown().await;
}

#[tokio::test]
async fn operator_calls_set_weight_drain_and_refuse_unsafe_decommissions() {
    let env = Env::new().await;
    let meta = &*env.meta;
    assert_eq!(set_weight(meta, NodeId(1), 250).await.unwrap().weight, 250);
    assert_eq!(
        set_weight(meta, NodeId(1), 0).await,
        Err(NodeOpError::BadWeight(0))
    );
    assert_eq!(
        set_weight(meta, NodeId(9), 100).await,
        Err(NodeOpError::UnknownNode(NodeId(9)))
    );
    assert!(set_draining(meta, NodeId(2), true).await.unwrap().draining);
    let map = env.map().await;
    assert_eq!(map.nodes[&NodeId(1)].weight, 250);
    assert!(map.nodes[&NodeId(2)].draining);
    // Owning partitions: refused, forced or not.
    for force in [false, true] {
        assert!(matches!(
            decommission(meta, NodeId(2), force).await,
            Err(NodeOpError::Owns { owned: 4, .. })
        ));
    }
    // Node 4 owns nothing: not draining and running, so refused both ways.
    assert_eq!(
        decommission(meta, NodeId(4), false).await,
        Err(NodeOpError::NotDraining(NodeId(4)))
    );
    assert_eq!(
        decommission(meta, NodeId(4), true).await,
        Err(NodeOpError::StillUp(NodeId(4)))
    );
    // A migration to it: refused while it lasts.
    let p = map.owned_by(NodeId(1)).next().unwrap().id;
    let rec = crate::request_move(meta, p, NodeId(4)).await.unwrap();
    set_draining(meta, NodeId(4), true).await.unwrap();
    assert_eq!(
        decommission(meta, NodeId(4), false).await,
        Err(NodeOpError::Migrating {
            node: NodeId(4),
            migration: rec.id
        })
    );
    crate::request_abort(meta, rec.id).await.unwrap();
    let removed = decommission(meta, NodeId(4), false).await.unwrap();
    assert_eq!(removed.id, NodeId(4));
    assert!(!env.map().await.nodes.contains_key(&NodeId(4)));
    // --force: down (no lease) and owning nothing.
    meta.revoke_lease(env.leases[&NodeId(4)]).await.unwrap();
    let n5 = meta
        .register_node(None, "r5:1".into(), "a5:1".into())
        .await
        .unwrap();
    assert_eq!(decommission(meta, n5, true).await.unwrap().id, n5);
}

#[tokio::test]
async fn a_replicated_partitions_primary_moves_by_replica_addition_not_by_migration() {
    let env = Env::new().await;
    let mut ks = env.map().await.keyspaces[&keyway_map::KeyspaceId(0)].clone();
    ks.replication_factor = 2;
    env.meta
        .commit(keyway_meta::MapTxn::unconditional(vec![
            keyway_map::MapChange::UpsertKeyspace(ks),
        ]))
        .await
        .unwrap();
    let rebalancer = env.start(RebalanceConfig {
        fail_back_window_ms: 1_234,
        ..fast()
    });
    let moves = eventually("a primary move to node 4", || async {
        let m = crate::replication::read_primary_moves(&*env.meta)
            .await
            .unwrap();
        (!m.is_empty()).then_some(m)
    })
    .await;
    assert_eq!(moves[0].to, NodeId(4));
    assert_eq!(moves[0].fail_back_window_ms, 1_234);
    assert!(!moves[0].reads_first);
    // It counts as the partition's live move (no second one, no migration).
    let (live, _) = read_migrations(&*env.meta).await.unwrap();
    assert_eq!(live.len(), 1, "{live:?}");
    assert_eq!(live[0].partition, moves[0].partition);
    let stored = env.meta.migrations().await.unwrap();
    assert!(
        stored
            .iter()
            .all(crate::replication::moves::is_replica_move),
        "no single-owner migration was requested"
    );
    assert!(
        env.decisions
            .recent()
            .iter()
            .any(|d| d.acted && d.action == "move_primary")
    );
    rebalancer.shutdown().await;
}
