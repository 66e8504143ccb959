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

/// Removes `node` from the map. Refused while it owns a partition or takes
/// part in a live migration; without `force` the node must be draining
/// (so no move can target it meanwhile); with `force` it must hold no lease
/// (down). A removed node that starts again registers again, empty.
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
    if force {
        if meta.leases().await?.iter().any(|l| l.node == node) {
            return Err(NodeOpError::StillUp(node));
        }
    } else if !n.draining {
        return Err(NodeOpError::NotDraining(node));
    }
    // The store validates the result: a partition that reached the node
    // meanwhile makes the commit fail (its owner would be unknown).
    meta.commit(MapTxn::unconditional(vec![MapChange::RemoveNode {
        id: node,
    }]))
    .await?;
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
