//! Node registration and bootstrap: both are map commits
//! ([`Inner::commit_with`]), so they race safely with every other commit.
//!
//! A registration allocates its id in the same transaction that upserts
//! the node record: the transaction is conditional on the map (and so the
//! allocator, which only registrations move, and only together with the map)
//! being what was read, so concurrent registrations get distinct ids 1, 2,
//! 3, ... with none skipped, and an id is never handed out twice.

use super::Inner;
use super::map::Step;
use crate::{MapTxn, MetaError, bootstrap_txn};
use keyway_map::{MapChange, NodeId, NodeInfo, NodeState};

impl Inner {
    /// See [`crate::MetaStore::register_node`].
    pub(super) async fn register_node(
        &self,
        id: Option<NodeId>,
        resp_addr: String,
        admin_addr: String,
        zone: Option<String>,
    ) -> Result<NodeId, MetaError> {
        let (_, id) = self
            .commit_with(|snap| {
                let next = snap.next_node_id;
                let id = match id {
                    None => NodeId(next),
                    Some(id) if id.0 == 0 || id.0 >= next => {
                        return Err(MetaError::InvalidArgument(format!(
                            "node id {} was never allocated by this metadata store",
                            id.0
                        )));
                    }
                    Some(id) => id,
                };
                // Re-registration keeps what operators set (weight, draining, zone).
                let kept = snap.map.nodes.get(&id);
                let node = NodeInfo {
                    id,
                    resp_addr: resp_addr.clone(),
                    admin_addr: admin_addr.clone(),
                    state: NodeState::Up,
                    weight: kept.map_or(keyway_map::DEFAULT_NODE_WEIGHT, |n| n.weight),
                    draining: kept.is_some_and(|n| n.draining),
                    zone: zone.clone().or_else(|| kept.and_then(|n| n.zone.clone())),
                    // The node re-advertises its replica endpoint after registering.
                    replica_addr: kept.and_then(|n| n.replica_addr.clone()),
                };
                Ok(Step::Commit {
                    txn: MapTxn::unconditional(vec![MapChange::UpsertNode(node)]),
                    next_node_id: (id.0 >= next).then_some(id.0 + 1),
                    result: id,
                })
            })
            .await?;
        Ok(id)
    }

    /// See [`crate::MetaStore::bootstrap_if_empty`]: one commit, conditional
    /// (through the map version) on the map still having no keyspace.
    pub(super) async fn bootstrap_if_empty(
        &self,
        min_nodes: usize,
        partitions_per_node: u16,
        replication: crate::Replication,
    ) -> Result<bool, MetaError> {
        let (_, booted) = self
            .commit_with(|snap| {
                Ok(
                    match bootstrap_txn(&snap.map, min_nodes, partitions_per_node, replication)? {
                        None => Step::Done(false),
                        Some(txn) => Step::Commit {
                            txn,
                            next_node_id: None,
                            result: true,
                        },
                    },
                )
            })
            .await?;
        Ok(booted)
    }
}
