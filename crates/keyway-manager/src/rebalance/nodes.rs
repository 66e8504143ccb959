//! Node liveness and the operator's node calls.
//!
//! [`Liveness`] is the leader's view of which nodes hold a lease: a node
//! whose lease has been gone from `MetaStore::leases` for `MARK_DOWN_AFTER`
//! (or the grace, if shorter) is marked `Down` in the map, and marked `Up`
//! again as soon as a lease of its is back (registration also marks it Up;
//! a node whose lease lapsed re-grants one without registering). The grace
//! clock is a [`FencingGate`] with `down_grace_ms` as its margin: it starts
//! when this manager first sees the lease gone, so a new leader waits a
//! whole grace again (never less).
//!
//! The operator calls ([`set_draining`], [`set_weight`], [`decommission`])
//! write the node's record in the map, so every manager sees them and
//! re-registration keeps them.
//!
//! Node records carry no compare-and-set condition of their own: each call
//! re-reads the map right before it commits and changes only its field, so
//! a concurrent re-registration's new addresses can only be lost in that
//! short window (the node's next registration restores them).

use crate::fencing::{FencingGate, Verdict};
use crate::rebalance::plan::DownPhase;
use keyway_map::{MapChange, NodeId, NodeInfo, NodeState, PartitionMap};
use keyway_meta::{MapTxn, MetaError, MetaStore};
use keyway_migration::MigrationId;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How long a lease must stay gone before the node is marked Down (a node
/// registers just before it takes its first lease).
pub const MARK_DOWN_AFTER: Duration = Duration::from_secs(1);

/// The largest node weight accepted.
pub const MAX_WEIGHT: u32 = 10_000;

/// One change of a node's liveness, for the map and the decision log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LivenessChange {
    pub node: NodeId,
    pub to: NodeState,
    /// How long the lease has been gone (for `Down`).
    pub gone_for: Duration,
}

/// What one observation found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observation {
    /// Nodes to mark Down or Up.
    pub changes: Vec<LivenessChange>,
    /// The phase of every node that is Down once `changes` are applied.
    pub down: BTreeMap<NodeId, DownPhase>,
}

/// The leader's liveness tracker (memory only: a new leader starts over).
#[derive(Debug)]
pub struct Liveness {
    gate: FencingGate,
    grace: Duration,
}

impl Liveness {
    pub fn new(down_grace: Duration) -> Self {
        Liveness {
            gate: FencingGate::new(down_grace),
            grace: down_grace,
        }
    }

    /// Decides from the map and the nodes holding a lease, at `now`.
    pub fn observe(&mut self, map: &PartitionMap, live: &[NodeId], now: Instant) -> Observation {
        let mut out = Observation::default();
        for n in map.nodes.values() {
            let verdict = self.gate.check(n.id, live, now);
            let gone_for = match verdict {
                Verdict::LeaseLive => None,
                Verdict::Wait(left) => Some(self.grace.saturating_sub(left)),
                Verdict::Fenced => Some(self.grace),
            };
            let state = match (n.state, gone_for) {
                (NodeState::Down, None) => {
                    out.changes.push(LivenessChange {
                        node: n.id,
                        to: NodeState::Up,
                        gone_for: Duration::ZERO,
                    });
                    NodeState::Up
                }
                (NodeState::Up, Some(gone)) if gone >= MARK_DOWN_AFTER.min(self.grace) => {
                    out.changes.push(LivenessChange {
                        node: n.id,
                        to: NodeState::Down,
                        gone_for: gone,
                    });
                    NodeState::Down
                }
                (state, _) => state,
            };
            if state == NodeState::Down {
                let phase = match verdict {
                    Verdict::Wait(left) => DownPhase::WithinGrace {
                        left_ms: left.as_millis() as u64,
                    },
                    Verdict::Fenced | Verdict::LeaseLive => DownPhase::PastGrace,
                };
                out.down.insert(n.id, phase);
            }
        }
        out
    }
}

/// Commits `changes` (each only if the node is still registered and not
/// already in that state), re-reading the map first. Returns the applied ones.
pub async fn apply_liveness(
    meta: &dyn MetaStore,
    changes: &[LivenessChange],
) -> Result<Vec<LivenessChange>, MetaError> {
    if changes.is_empty() {
        return Ok(Vec::new());
    }
    let map = meta.get_map().await?;
    let mut applied = Vec::new();
    let mut upserts = Vec::new();
    for c in changes {
        if let Some(n) = map.nodes.get(&c.node).filter(|n| n.state != c.to) {
            upserts.push(MapChange::UpsertNode(NodeInfo {
                state: c.to,
                ..n.clone()
            }));
            applied.push(c.clone());
        }
    }
    if !upserts.is_empty() {
        meta.commit(MapTxn::unconditional(upserts)).await?;
    }
    Ok(applied)
}

/// What the operator's node calls refuse.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum NodeOpError {
    #[error(transparent)]
    Meta(#[from] MetaError),
    #[error("node {0} is not registered")]
    UnknownNode(NodeId),
    #[error("a node weight must be between 1 and {MAX_WEIGHT}, got {0}")]
    BadWeight(u32),
    #[error(
        "a zone label is 1-{MAX_ZONE_LEN} bytes of letters, digits, '_', '.' and '-', got {0:?}"
    )]
    BadZone(String),
    #[error(
        "node {node} still owns {owned} partition(s): drain it first (keyway ctl drain {node}) \
         and wait until it owns none"
    )]
    Owns { node: NodeId, owned: usize },
    #[error("node {node} takes part in migration {migration}: wait until it ends")]
    Migrating {
        node: NodeId,
        migration: MigrationId,
    },
    #[error(
        "node {0} is not draining: drain it first (keyway ctl drain {0}), or use --force for a \
         node that is down and owns nothing"
    )]
    NotDraining(NodeId),
    #[error(
        "node {0} still holds a lease (it is running): --force only removes a node that is down"
    )]
    StillUp(NodeId),
    #[error(
        "node {node} still holds {replicas} replica(s): while it drains the manager replaces \
         them; wait until it holds none (keyway ctl nodes), or --force for a node that is down"
    )]
    HoldsReplicas { node: NodeId, replicas: usize },
}

async fn node_record(meta: &dyn MetaStore, node: NodeId) -> Result<NodeInfo, NodeOpError> {
    let map = meta.get_map().await?;
    map.nodes
        .get(&node)
        .cloned()
        .ok_or(NodeOpError::UnknownNode(node))
}

/// Marks `node` draining (or not). Returns its record as written.
pub async fn set_draining(
    meta: &dyn MetaStore,
    node: NodeId,
    draining: bool,
) -> Result<NodeInfo, NodeOpError> {
    let mut n = node_record(meta, node).await?;
    if n.draining != draining {
        n.draining = draining;
        meta.commit(MapTxn::unconditional(vec![MapChange::UpsertNode(
            n.clone(),
        )]))
        .await?;
        tracing::info!(%node, draining, "node drain flag set");
    }
    Ok(n)
}

/// Sets `node`'s weight (1..=[`MAX_WEIGHT`]). Returns its record as written.
pub async fn set_weight(
    meta: &dyn MetaStore,
    node: NodeId,
    weight: u32,
) -> Result<NodeInfo, NodeOpError> {
    if !(1..=MAX_WEIGHT).contains(&weight) {
        return Err(NodeOpError::BadWeight(weight));
    }
    let mut n = node_record(meta, node).await?;
    if n.weight != weight {
        n.weight = weight;
        meta.commit(MapTxn::unconditional(vec![MapChange::UpsertNode(
            n.clone(),
        )]))
        .await?;
        tracing::info!(%node, weight, "node weight set");
    }
    Ok(n)
}

/// Longest zone label, in bytes.
pub const MAX_ZONE_LEN: usize = 64;

/// Checks a zone label: 1..=[`MAX_ZONE_LEN`] bytes of `[A-Za-z0-9_.-]`.
pub fn check_zone(zone: &str) -> Result<(), NodeOpError> {
    let ok = !zone.is_empty()
        && zone.len() <= MAX_ZONE_LEN
        && zone
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if ok {
        Ok(())
    } else {
        Err(NodeOpError::BadZone(zone.to_string()))
    }
}

/// Sets `node`'s zone label (`None` clears it); placement spreads a
/// partition's copies over distinct zones first. Re-registration keeps it.
pub async fn set_zone(
    meta: &dyn MetaStore,
    node: NodeId,
    zone: Option<String>,
) -> Result<NodeInfo, NodeOpError> {
    if let Some(z) = &zone {
        check_zone(z)?;
    }
    let mut n = node_record(meta, node).await?;
    if n.zone != zone {
        n.zone = zone;
        meta.commit(MapTxn::unconditional(vec![MapChange::UpsertNode(
            n.clone(),
        )]))
        .await?;
        tracing::info!(%node, zone = ?n.zone, "node zone set");
    }
    Ok(n)
}

/// Removes `node` from the map. Refused while it owns a partition or takes
/// part in a live migration; without `force` the node must be draining
/// (so no move can target it meanwhile) and hold no replica (the manager
/// replaces a draining node's replicas); with `force` it must hold no lease
/// (down), and it leaves every replica list and in-sync set in the same
/// commit (each row conditional on its owner and epoch, epoch + 1; the
/// manager then adds replicas elsewhere). A removed node that starts again
/// registers again, empty.
pub async fn decommission(
    meta: &dyn MetaStore,
    node: NodeId,
    force: bool,
) -> Result<NodeInfo, NodeOpError> {
    let map = meta.get_map().await?;
    let n = map
        .nodes
        .get(&node)
        .cloned()
        .ok_or(NodeOpError::UnknownNode(node))?;
    let owned = map.owned_by(node).count();
    if owned > 0 {
        return Err(NodeOpError::Owns { node, owned });
    }
    for stored in meta.migrations().await? {
        if let Ok(rec) = crate::driver::load(&stored)
            && !rec.state.is_terminal()
            && (rec.source() == node || rec.target == node)
        {
            return Err(NodeOpError::Migrating {
                node,
                migration: rec.id,
            });
        }
    }
    let replicated: Vec<&keyway_map::PartitionRecord> = map
        .partitions
        .values()
        .filter(|p| p.replicas.contains(&node))
        .collect();
    if force {
        if meta.leases().await?.iter().any(|l| l.node == node) {
            return Err(NodeOpError::StillUp(node));
        }
    } else if !n.draining {
        return Err(NodeOpError::NotDraining(node));
    } else if !replicated.is_empty() {
        return Err(NodeOpError::HoldsReplicas {
            node,
            replicas: replicated.len(),
        });
    }
    // The store validates the result: a partition that reached the node
    // meanwhile makes the commit fail (its owner would be unknown).
    let mut txn = MapTxn::unconditional(vec![MapChange::RemoveNode { id: node }]);
    for p in replicated {
        let mut row = p.clone();
        row.remove_replica(node);
        row.epoch = keyway_map::Epoch(p.epoch.0 + 1);
        txn.conditions.push(keyway_map::OwnershipCondition {
            partition: p.id,
            expected: Some((p.owner, p.epoch)),
        });
        txn.changes.push(MapChange::UpsertPartition(row));
    }
    meta.commit(txn).await?;
    tracing::info!(%node, force, "node decommissioned");
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyway_map::DEFAULT_NODE_WEIGHT;

    fn map(states: &[(u64, NodeState)]) -> PartitionMap {
        let nodes = states.iter().map(|&(id, state)| NodeInfo {
            id: NodeId(id),
            resp_addr: format!("h:{id}"),
            admin_addr: String::new(),
            state,
            weight: DEFAULT_NODE_WEIGHT,
            draining: false,
            zone: None,
            replica_addr: None,
        });
        PartitionMap::from_parts(Default::default(), Default::default(), [], nodes, [])
    }

    #[test]
    fn a_lost_lease_marks_down_then_the_grace_runs_out_and_a_lease_marks_up() {
        let grace = Duration::from_secs(300);
        let mut l = Liveness::new(grace);
        let t0 = Instant::now();
        let (a, b) = (NodeId(1), NodeId(2));
        let up = map(&[(1, NodeState::Up), (2, NodeState::Up)]);
        assert_eq!(l.observe(&up, &[a, b], t0), Observation::default());
        // Gone, but not for long enough: still Up, no phase.
        assert_eq!(l.observe(&up, &[a], t0), Observation::default());
        let obs = l.observe(&up, &[a], t0 + MARK_DOWN_AFTER);
        assert_eq!(
            obs.changes,
            vec![LivenessChange {
                node: b,
                to: NodeState::Down,
                gone_for: MARK_DOWN_AFTER
            }]
        );
        let left = (grace - MARK_DOWN_AFTER).as_millis() as u64;
        assert_eq!(obs.down[&b], DownPhase::WithinGrace { left_ms: left });
        let down = map(&[(1, NodeState::Up), (2, NodeState::Down)]);
        let obs = l.observe(&down, &[a], t0 + grace);
        assert!(obs.changes.is_empty());
        assert_eq!(obs.down[&b], DownPhase::PastGrace);
        // Its lease is back: Up again, and the clock starts over.
        let obs = l.observe(&down, &[a, b], t0 + grace * 2);
        assert_eq!(obs.changes[0].to, NodeState::Up);
        assert!(obs.down.is_empty());
        assert_eq!(l.observe(&up, &[a], t0 + grace * 3), Observation::default());
    }

    #[tokio::test]
    async fn decommission_of_a_replica_holder_waits_for_the_drain_or_strips_it_with_force() {
        let dir = tempfile::tempdir().unwrap();
        let meta = keyway_meta::EmbeddedMeta::open(dir.path(), Default::default()).unwrap();
        let mut ids = Vec::new();
        for i in 0..3 {
            ids.push(
                meta.register_node(None, format!("h:{i}"), format!("a:{i}"))
                    .await
                    .unwrap(),
            );
        }
        let rf = keyway_meta::Replication {
            factor: 2,
            min_in_sync: 1,
        };
        assert!(meta.bootstrap_if_empty_with(3, 1, rf).await.unwrap());
        // A fourth node holds a replica (and owns nothing).
        let four = meta
            .register_node(None, "h:4".into(), "a:4".into())
            .await
            .unwrap();
        let map = meta.get_map().await.unwrap();
        let mut row = map.partitions.values().next().unwrap().clone();
        let cond = keyway_map::OwnershipCondition {
            partition: row.id,
            expected: Some((row.owner, row.epoch)),
        };
        row.replicas.push(four);
        row.in_sync.push(four);
        row.epoch = keyway_map::Epoch(row.epoch.0 + 1);
        meta.commit(MapTxn {
            conditions: vec![cond],
            changes: vec![MapChange::UpsertPartition(row.clone())],
        })
        .await
        .unwrap();
        set_draining(&meta, four, true).await.unwrap();
        assert!(matches!(
            decommission(&meta, four, false).await,
            Err(NodeOpError::HoldsReplicas { replicas: 1, .. })
        ));
        decommission(&meta, four, true).await.unwrap();
        let map = meta.get_map().await.unwrap();
        assert!(!map.nodes.contains_key(&four));
        let after = &map.partitions[&row.id];
        assert!(!after.replicas.contains(&four) && !after.in_sync.contains(&four));
        assert_eq!(after.epoch.0, row.epoch.0 + 1);
    }

    #[tokio::test]
    async fn a_zone_is_checked_set_and_kept_by_re_registration() {
        let dir = tempfile::tempdir().unwrap();
        let meta = keyway_meta::EmbeddedMeta::open(dir.path(), Default::default()).unwrap();
        let id = meta
            .register_node(None, "h:1".into(), "h:2".into())
            .await
            .unwrap();
        for bad in ["", "a b", &"z".repeat(MAX_ZONE_LEN + 1)] {
            assert!(matches!(
                set_zone(&meta, id, Some(bad.to_string())).await,
                Err(NodeOpError::BadZone(_))
            ));
        }
        set_zone(&meta, id, Some("eu-1a".into())).await.unwrap();
        meta.register_node(Some(id), "h:3".into(), "h:4".into())
            .await
            .unwrap();
        let map = meta.get_map().await.unwrap();
        assert_eq!(map.nodes[&id].zone.as_deref(), Some("eu-1a"));
        assert_eq!(map.nodes[&id].resp_addr, "h:3");
        // Registration can carry a zone, in the same commit.
        let other = meta
            .register_node_in_zone(None, "h:5".into(), "h:6".into(), Some("eu-1b".into()))
            .await
            .unwrap();
        meta.register_node_in_zone(Some(id), "h:3".into(), "h:4".into(), Some("eu-1c".into()))
            .await
            .unwrap();
        let map = meta.get_map().await.unwrap();
        assert_eq!(map.nodes[&other].zone.as_deref(), Some("eu-1b"));
        assert_eq!(map.nodes[&id].zone.as_deref(), Some("eu-1c"));
    }

    #[test]
    fn a_node_already_down_waits_a_whole_grace_under_a_new_leader() {
        let mut l = Liveness::new(Duration::from_secs(60));
        let down = map(&[(1, NodeState::Down)]);
        let obs = l.observe(&down, &[], Instant::now());
        assert!(obs.changes.is_empty());
        assert_eq!(
            obs.down[&NodeId(1)],
            DownPhase::WithinGrace { left_ms: 60_000 }
        );
    }
}
