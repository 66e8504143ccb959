//! The replication loop against an embedded metadata store and a real seat:
//! a primary "dies" (its lease is revoked) and the leader promotes.

use super::*;
use crate::seat::{Seat, SeatConfig};
use keyway_map::{Epoch, MapChange, NodeId, OwnershipCondition, PartitionId, PartitionMap};
use keyway_meta::{EmbeddedMeta, EmbeddedOptions, LeaseId, MapTxn};
use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(15);

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
    duty: Replication,
}

impl Env {
    /// `nodes` nodes holding leases, 2 partitions each at factor `rf`;
    /// `prepare` runs on the store before the duty starts.
    async fn new(nodes: u64, rf: u8, config: ReplicationConfig) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let meta = Arc::new(EmbeddedMeta::open(dir.path(), EmbeddedOptions::default()).unwrap());
        let mut leases = BTreeMap::new();
        for i in 1..=nodes {
            let id = meta
                .register_node(None, format!("r{i}:6379"), format!("a{i}:7000"))
                .await
                .unwrap();
            leases.insert(id, meta.grant_lease(id, 60_000).await.unwrap());
        }
        let replication = keyway_meta::Replication {
            factor: rf,
            min_in_sync: 1,
        };
        assert!(
            meta.bootstrap_if_empty_with(nodes as usize, 2, replication)
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
        let duty = Replication::start(
            meta.clone(),
            seat.view(),
            config,
            decisions.clone(),
            &metrics,
            crate::copies::CopyTracker::default(),
        );
        Env {
            meta,
            _dir: dir,
            seat,
            metrics,
            decisions,
            leases,
            duty,
        }
    }

    async fn map(&self) -> PartitionMap {
        self.meta.get_map().await.unwrap()
    }

    /// The node "dies": its lease is gone from the store.
    async fn kill(&mut self, node: u64) {
        let lease = self.leases.remove(&NodeId(node)).unwrap();
        self.meta.revoke_lease(lease).await.unwrap();
    }

    async fn revive(&mut self, node: u64) {
        let lease = self.meta.grant_lease(NodeId(node), 60_000).await.unwrap();
        self.leases.insert(NodeId(node), lease);
    }

    /// Sets `p`'s in-sync set by CAS (as its primary would).
    async fn set_in_sync(&self, p: PartitionId, in_sync: &[u64]) {
        cas_in_sync(&*self.meta, p, in_sync).await
    }

    async fn shutdown(self) {
        self.duty.shutdown().await;
        self.seat.shutdown().await;
    }
}

/// Sets `p`'s in-sync set by CAS (as its primary would).
async fn cas_in_sync(meta: &dyn MetaStore, p: PartitionId, in_sync: &[u64]) {
    let map = meta.get_map().await.unwrap();
    let mut row = map.partitions[&p].clone();
    let cond = OwnershipCondition {
        partition: p,
        expected: Some((row.owner, row.epoch)),
    };
    row.in_sync = in_sync.iter().map(|n| NodeId(*n)).collect();
    row.epoch = Epoch(row.epoch.0 + 1);
    meta.commit(MapTxn {
        conditions: vec![cond],
        changes: vec![MapChange::UpsertPartition(row)],
    })
    .await
    .unwrap();
}

fn fast() -> ReplicationConfig {
    ReplicationConfig {
        failover_margin_ms: 200,
        interval_ms: 20,
        ..ReplicationConfig::default()
    }
}

#[tokio::test]
async fn a_dead_primary_s_partitions_go_to_in_sync_replicas_by_one_cas_each() {
    let mut env = Env::new(3, 2, fast()).await;
    let before = env.map().await;
    let owned: Vec<_> = before.owned_by(NodeId(1)).cloned().collect();
    assert_eq!(owned.len(), 2);
    env.kill(1).await;
    let after = eventually("node 1's partitions to fail over", || {
        let meta = env.meta.clone();
        async move {
            let map = meta.get_map().await.ok()?;
            (map.owned_by(NodeId(1)).count() == 0).then_some(map)
        }
    })
    .await;
    for old in &owned {
        let new = &after.partitions[&old.id];
        assert_eq!(
            new.epoch,
            Epoch(old.epoch.0 + 1),
            "exactly one CAS: {new:?}"
        );
        assert!(
            old.in_sync.contains(&new.owner),
            "promoted from in_sync: {new:?}"
        );
        assert!(
            new.replicas.contains(&NodeId(1)),
            "the old primary stays listed"
        );
        assert!(new.in_sync.is_empty());
    }
    // Nobody else moved.
    for p in before.partitions.values().filter(|p| p.owner != NodeId(1)) {
        assert_eq!(after.partitions[&p.id], *p);
    }
    let text = env.metrics.encode();
    assert!(
        text.contains(r#"keyway_manager_failovers_total{reason="lease_expired"} 2"#),
        "{text}"
    );
    assert!(
        text.contains("keyway_manager_failover_duration_ms_count 2"),
        "{text}"
    );
    let d: Vec<_> = env
        .decisions
        .recent()
        .into_iter()
        .filter(|d| d.action == "failover")
        .collect();
    assert_eq!(d.len(), 2, "{d:?}");
    for f in &d {
        eprintln!("failover decision: {}", f.detail);
    }
    // Each promotion waited out the margin after the lease vanished.
    assert!(env.duty.status().get().failovers == 2);
    // The observer saw both in-sync changes.
    eventually("the observer to log the owner changes", || {
        let n = env
            .decisions
            .recent()
            .iter()
            .filter(|d| d.action == "in_sync_change" && d.reason == "owner_changed")
            .count();
        async move { (n == 2).then_some(()) }
    })
    .await;
    // The partitions are under-replicated now: nothing is in sync.
    eventually("the under-replicated gauge", || {
        let text = env.metrics.encode();
        async move {
            text.contains("keyway_manager_under_replicated_partitions 2")
                .then_some(())
        }
    })
    .await;
    env.shutdown().await;
}

#[tokio::test]
async fn a_replica_out_of_sync_is_never_promoted() {
    let mut env = Env::new(3, 3, fast()).await;
    let map = env.map().await;
    let p = map.owned_by(NodeId(1)).next().unwrap().id;
    let q = map.owned_by(NodeId(1)).nth(1).unwrap().id;
    // p: only node 3 is in sync; q: nobody is.
    env.set_in_sync(p, &[3]).await;
    env.set_in_sync(q, &[]).await;
    env.kill(3).await;
    env.kill(1).await;
    eventually("the decision not to promote", || {
        let found = env.decisions.recent().iter().any(|d| {
            d.partition == Some(p)
                && d.reason == "no_in_sync_replica_alive"
                && d.detail.contains("waiting: no in-sync replica alive")
        });
        async move { found.then_some(()) }
    })
    .await;
    // Ten more rounds later nothing moved: node 2 is alive but not in sync.
    let before = env.map().await;
    let rounds = |text: &str| -> u64 {
        let key = r#"keyway_manager_decisions_total{duty="replication",action="no_failover",reason="no_in_sync_replica_alive"} "#;
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    let start = rounds(&env.metrics.encode());
    eventually("ten more rounds", || {
        let n = rounds(&env.metrics.encode());
        async move { (n >= start + 20).then_some(()) }
    })
    .await;
    let map = env.map().await;
    assert_eq!(map.partitions[&p], before.partitions[&p]);
    assert_eq!(map.partitions[&p].owner, NodeId(1));
    assert_eq!(map.partitions[&q].owner, NodeId(1));
    assert!(
        env.metrics
            .encode()
            .contains("keyway_manager_offline_partitions 2")
    );
    // Node 3 is back: p goes to it, q still waits.
    env.revive(3).await;
    let map = eventually("p to fail over to node 3", || {
        let meta = env.meta.clone();
        async move {
            let map = meta.get_map().await.ok()?;
            (map.partitions[&p].owner == NodeId(3)).then_some(map)
        }
    })
    .await;
    assert_eq!(map.partitions[&q].owner, NodeId(1));
    env.shutdown().await;
}

#[tokio::test]
async fn raising_the_factor_adds_replicas_and_lowering_it_removes_them() {
    let env = Env::new(3, 1, fast()).await;
    let mut map = env.map().await;
    let mut ks = map.keyspaces[&keyway_map::DEFAULT_KEYSPACE].clone();
    ks.replication_factor = 3;
    env.meta
        .commit(MapTxn::unconditional(vec![MapChange::UpsertKeyspace(
            ks.clone(),
        )]))
        .await
        .unwrap();
    let grown = eventually("two replicas per partition", || {
        let meta = env.meta.clone();
        async move {
            let map = meta.get_map().await.ok()?;
            map.partitions
                .values()
                .all(|p| p.replicas.len() == 2)
                .then_some(map)
        }
    })
    .await;
    for p in grown.partitions.values() {
        assert!(p.in_sync.is_empty(), "added replicas start out of sync");
        assert_eq!(p.epoch, Epoch(map.partitions[&p.id].epoch.0 + 1), "one CAS");
    }
    map = grown;
    ks.replication_factor = 2;
    env.meta
        .commit(MapTxn::unconditional(vec![MapChange::UpsertKeyspace(ks)]))
        .await
        .unwrap();
    eventually("one replica per partition", || {
        let meta = env.meta.clone();
        async move {
            let m = meta.get_map().await.ok()?;
            m.partitions
                .values()
                .all(|p| p.replicas.len() == 1)
                .then_some(())
        }
    })
    .await;
    let text = env.metrics.encode();
    let added = 2 * map.partitions.len();
    assert!(
        text.contains(&format!("keyway_manager_replicas_added_total {added}")),
        "{text}"
    );
    env.shutdown().await;
}

/// A partition owned by node 1, its replica, and a node with no copy.
fn move_candidate(map: &PartitionMap) -> (PartitionId, NodeId, NodeId) {
    let row = map.owned_by(NodeId(1)).next().unwrap();
    let from = row.replicas[0];
    let to = *map.nodes.keys().find(|n| !row.has_copy(**n)).unwrap();
    (row.id, from, to)
}

#[tokio::test]
async fn a_replica_move_adds_the_target_and_removes_the_source_once_in_sync() {
    let env = Env::new(4, 2, fast()).await;
    let before = env.map().await;
    let (p, from, to) = move_candidate(&before);
    let mv = request_replica_move(&*env.meta, p, from, to).await.unwrap();
    // A second move of the same partition, and a migration of it, are
    // refused while this one lives (to the other node without a copy: `to`
    // may have been added already).
    let other = *before
        .nodes
        .keys()
        .find(|n| !before.partitions[&p].has_copy(**n) && **n != to)
        .unwrap();
    let err = request_replica_move(&*env.meta, p, from, other)
        .await
        .unwrap_err();
    assert!(matches!(err, ReplicaMoveError::Busy { .. }), "{err}");
    let err = crate::request_move(&*env.meta, p, other).await.unwrap_err();
    assert!(err.to_string().contains("replica move"), "{err}");
    let added = eventually("the target added, out of sync", || {
        let meta = env.meta.clone();
        async move {
            let map = meta.get_map().await.ok()?;
            let row = map.partitions[&p].clone();
            row.replicas.contains(&to).then_some(row)
        }
    })
    .await;
    assert_eq!(added.replicas, [from, to]);
    assert_eq!(added.in_sync, [from]);
    eventually("the loop to wait for the catch-up", || {
        let view = env.duty.status().get();
        async move {
            (view.replica_moves.len() == 1 && view.replica_moves[0].phase == "catching_up")
                .then_some(())
        }
    })
    .await;
    // The primary's part: Y caught up (this unwraps only if Y is still
    // listed: the reconciler did not undo the move).
    env.set_in_sync(p, &[from.0, to.0]).await;
    let done = eventually("the source removed", || {
        let meta = env.meta.clone();
        async move {
            let map = meta.get_map().await.ok()?;
            let row = map.partitions[&p].clone();
            (!row.replicas.contains(&from)).then_some(row)
        }
    })
    .await;
    assert_eq!(
        done.owner,
        NodeId(1),
        "a replica move never changes the primary"
    );
    assert_eq!(done.replicas, [to]);
    assert_eq!(done.in_sync, [to]);
    eventually("the record deleted", || {
        let meta = env.meta.clone();
        async move {
            let left = moves::read_replica_moves(&*meta).await.ok()?;
            left.is_empty().then_some(())
        }
    })
    .await;
    assert!(env.meta.get_migration(mv.id).await.unwrap().is_none());
    let decisions = env.decisions.recent();
    let of_p: Vec<(&str, &str)> = decisions
        .iter()
        .filter(|d| d.partition == Some(p) && d.acted)
        .map(|d| (d.action, d.reason))
        .collect();
    assert_eq!(
        of_p,
        [
            ("add_target", "replica_move"),
            ("remove_source", "target_in_sync"),
            ("replica_move_done", "completed")
        ],
        "{decisions:?}"
    );
    let text = env.metrics.encode();
    assert!(
        text.contains("keyway_manager_replica_moves_total{outcome=\"done\"} 1"),
        "{text}"
    );
    assert_eq!(env.duty.status().get().replica_moves_done, 1);
    env.shutdown().await;
}

#[tokio::test]
async fn a_replica_move_that_never_catches_up_is_abandoned_and_the_source_kept() {
    let config = ReplicationConfig {
        replica_move_timeout_ms: 300,
        ..fast()
    };
    let env = Env::new(4, 2, config).await;
    let before = env.map().await;
    let (p, from, to) = move_candidate(&before);
    request_replica_move(&*env.meta, p, from, to).await.unwrap();
    eventually("the move abandoned", || {
        let view = env.duty.status().get();
        async move { (view.replica_moves_abandoned == 1).then_some(()) }
    })
    .await;
    let row = env.map().await.partitions[&p].clone();
    assert_eq!(row.replicas, [from], "the target removed, the source kept");
    assert_eq!(row.in_sync, before.partitions[&p].in_sync);
    assert!(
        moves::read_replica_moves(&*env.meta)
            .await
            .unwrap()
            .is_empty()
    );
    let text = env.metrics.encode();
    assert!(
        text.contains("keyway_manager_replica_moves_total{outcome=\"abandoned\"} 1"),
        "{text}"
    );
    env.shutdown().await;
}

#[tokio::test]
async fn a_new_leader_finishes_a_replica_move_the_old_one_started() {
    let mut env = Env::new(4, 2, fast()).await;
    let before = env.map().await;
    let (p, from, to) = move_candidate(&before);
    request_replica_move(&*env.meta, p, from, to).await.unwrap();
    eventually("the target added", || {
        let meta = env.meta.clone();
        async move {
            let map = meta.get_map().await.ok()?;
            map.partitions[&p].replicas.contains(&to).then_some(())
        }
    })
    .await;
    // The leader's loop dies mid-move; the target catches up meanwhile.
    let old = env.duty;
    old.shutdown().await;
    cas_in_sync(&*env.meta, p, &[from.0, to.0]).await;
    assert_eq!(
        moves::read_replica_moves(&*env.meta).await.unwrap().len(),
        1
    );
    // A new loop (no memory of the move) finishes it from the record and
    // the row.
    let metrics = Arc::new(Metrics::new());
    env.duty = Replication::start(
        env.meta.clone(),
        env.seat.view(),
        fast(),
        env.decisions.clone(),
        &metrics,
        crate::copies::CopyTracker::default(),
    );
    let row = eventually("the source removed by the new loop", || {
        let meta = env.meta.clone();
        async move {
            let map = meta.get_map().await.ok()?;
            let row = map.partitions[&p].clone();
            (!row.replicas.contains(&from)).then_some(row)
        }
    })
    .await;
    assert_eq!(
        (row.replicas.as_slice(), row.in_sync.as_slice()),
        (&[to][..], &[to][..])
    );
    eventually("the record deleted", || {
        let meta = env.meta.clone();
        async move {
            let left = moves::read_replica_moves(&*meta).await.ok()?;
            left.is_empty().then_some(())
        }
    })
    .await;
    assert_eq!(env.duty.status().get().replica_moves_done, 1);
    env.shutdown().await;
}

const GRACE: Duration = Duration::from_millis(1_500);

#[tokio::test]
async fn a_node_down_past_the_grace_is_replaced_on_the_survivors_and_then_dropped() {
    let config = ReplicationConfig {
        down_grace_ms: GRACE.as_millis() as u64,
        ..fast()
    };
    let env = re_replicate_node_4(config).await;
    // Off by default: the dead node stays registered.
    assert!(env.map().await.nodes.contains_key(&NodeId(4)));
    env.shutdown().await;
}

#[tokio::test]
async fn a_node_that_holds_nothing_is_decommissioned_after_auto_decommission_after_ms() {
    let config = ReplicationConfig {
        down_grace_ms: GRACE.as_millis() as u64,
        auto_decommission_after_ms: GRACE.as_millis() as u64 * 2,
        ..fast()
    };
    let env = re_replicate_node_4(config).await;
    eventually("node 4 to be decommissioned", || {
        let meta = env.meta.clone();
        async move {
            let map = meta.get_map().await.ok()?;
            (!map.nodes.contains_key(&NodeId(4))).then_some(())
        }
    })
    .await;
    assert!(
        env.decisions
            .recent()
            .iter()
            .any(|d| d.action == "decommission" && d.acted)
    );
    assert_eq!(env.duty.status().get().recovery.auto_decommissioned, [4]);
    env.shutdown().await;
}

/// 4 nodes at RF 2; node 4's lease is revoked for good; checks the
/// replacements come after the grace only and node 4 ends holding nothing.
async fn re_replicate_node_4(config: ReplicationConfig) -> Env {
    let grace = GRACE;
    let mut env = Env::new(4, 2, config).await;
    let before = env.map().await;
    let hit: Vec<PartitionId> = before
        .partitions
        .values()
        .filter(|p| p.has_copy(NodeId(4)))
        .map(|p| p.id)
        .collect();
    assert!(hit.len() >= 2, "{before:?}");
    let t0 = std::time::Instant::now();
    env.kill(4).await;
    eventually("node 4's partitions to fail over", || {
        let meta = env.meta.clone();
        async move {
            let map = meta.get_map().await.ok()?;
            (map.owned_by(NodeId(4)).count() == 0).then_some(())
        }
    })
    .await;
    // Within the grace: no replacement, and the wait is in view.
    let within = env.map().await;
    if t0.elapsed() < grace {
        for p in within.partitions.values() {
            assert_eq!(1 + p.replicas.len(), 2, "a move on suspicion: {p:?}");
        }
        let view = eventually("the grace wait in /status", || {
            let v = env.duty.status().get().recovery;
            async move { (!v.waiting_for_grace.is_empty()).then_some(v) }
        })
        .await;
        assert_eq!(view.waiting_for_grace[0].node, 4, "{view:?}");
        assert!(
            env.decisions
                .recent()
                .iter()
                .any(|d| d.reason == "within_down_grace" && !d.acted)
        );
    }
    // After the grace: a replacement for every partition with a copy on 4.
    let added = eventually("a replacement for every copy on node 4", || {
        let meta = env.meta.clone();
        let hit = hit.clone();
        async move {
            let map = meta.get_map().await.ok()?;
            hit.iter()
                .all(|p| map.partitions[p].replicas.len() == 2)
                .then_some(map)
        }
    })
    .await;
    assert!(t0.elapsed() >= grace, "replaced before the grace");
    // The round that committed them ends by publishing its view.
    let view = eventually("node 4 dead in /status and /decisions", || {
        let v = env.duty.status().get().recovery;
        let logged = env
            .decisions
            .recent()
            .iter()
            .any(|d| d.action == "re_replicate" && d.acted);
        async move { (logged && v.dead_nodes == [4]).then_some(v) }
    })
    .await;
    assert_eq!(view.dead_nodes, [4], "{view:?}");
    for p in &hit {
        let row = &added.partitions[p];
        assert!(
            row.replicas.contains(&NodeId(4)),
            "kept until in sync: {row:?}"
        );
        assert_ne!(row.owner, NodeId(4));
    }
    // The dead replica stays until the primary takes the replacement in.
    for p in &hit {
        let row = &added.partitions[p];
        let new: Vec<u64> = row
            .replicas
            .iter()
            .filter(|r| **r != NodeId(4))
            .map(|r| r.0)
            .collect();
        env.set_in_sync(*p, &new).await;
    }
    let after = eventually("node 4 to hold nothing", || {
        let meta = env.meta.clone();
        async move {
            let map = meta.get_map().await.ok()?;
            (!map.partitions.values().any(|p| p.has_copy(NodeId(4)))).then_some(map)
        }
    })
    .await;
    for p in after.partitions.values() {
        assert_eq!(1 + p.replicas.len(), 2, "back to RF 2: {p:?}");
        assert_eq!(p.in_sync_copies(), 2, "{p:?}");
    }
    let removed = env
        .decisions
        .recent()
        .iter()
        .filter(|d| d.reason == "dead_replica_replaced")
        .count();
    assert_eq!(removed, hit.len());
    let text = env.metrics.encode();
    assert!(
        text.contains(&format!(
            "keyway_manager_recovered_replicas_total {}",
            hit.len()
        )),
        "{text}"
    );
    env
}
