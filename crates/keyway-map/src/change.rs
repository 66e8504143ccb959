//! Changes between map versions, and the ownership conditions a
//! compare-and-set checks before applying them.

use crate::{
    Epoch, Keyspace, KeyspaceId, MapError, MapVersion, NodeId, NodeInfo, PartitionId, PartitionMap,
    PartitionRecord,
};
use serde::{Deserialize, Serialize};

/// One change to the map. A metadata-store transaction is a list of these,
/// applied atomically and stamped with one new map version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum MapChange {
    UpsertPartition(PartitionRecord),
    RemovePartition {
        id: PartitionId,
    },
    UpsertNode(NodeInfo),
    RemoveNode {
        id: NodeId,
    },
    UpsertKeyspace(Keyspace),
    RemoveKeyspace {
        id: KeyspaceId,
    },
    /// Raises the partition-id allocator (ids are never reused).
    ReservePartitionIds {
        next: PartitionId,
    },
}

/// A compare-and-set guard: the partition must currently have exactly this
/// owner and epoch (invariant 6: the flip is conditional on `(source, e)`).
/// `expected: None` requires the partition to be absent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnershipCondition {
    pub partition: PartitionId,
    pub expected: Option<(NodeId, Epoch)>,
}

impl OwnershipCondition {
    /// Whether `map` satisfies the condition.
    pub fn holds(&self, map: &PartitionMap) -> bool {
        let current = map
            .partitions
            .get(&self.partition)
            .map(|p| (p.owner, p.epoch));
        current == self.expected
    }
}

impl PartitionMap {
    /// Applies `changes` as version `version`, checking that the version grows
    /// and that no partition's epoch goes down. The caller validates the result.
    pub fn apply(&mut self, version: MapVersion, changes: &[MapChange]) -> Result<(), MapError> {
        if version <= self.version {
            return Err(MapError::VersionNotIncreasing {
                have: self.version.0,
                got: version.0,
            });
        }
        for change in changes {
            self.apply_one(change)?;
        }
        self.version = version;
        self.reindex();
        Ok(())
    }

    fn apply_one(&mut self, change: &MapChange) -> Result<(), MapError> {
        match change {
            MapChange::UpsertPartition(p) => {
                if let Some(old) = self.partitions.get(&p.id)
                    && p.epoch < old.epoch
                {
                    return Err(MapError::EpochNotIncreasing {
                        partition: p.id,
                        have: old.epoch.0,
                        got: p.epoch.0,
                    });
                }
                if p.id >= self.next_partition_id {
                    self.next_partition_id = PartitionId(p.id.0 + 1);
                }
                self.partitions.insert(p.id, p.clone());
            }
            MapChange::RemovePartition { id } => {
                self.partitions
                    .remove(id)
                    .ok_or(MapError::NoSuchPartition(*id))?;
            }
            MapChange::UpsertNode(n) => {
                self.nodes.insert(n.id, n.clone());
            }
            MapChange::RemoveNode { id } => {
                self.nodes.remove(id);
            }
            MapChange::UpsertKeyspace(k) => {
                self.keyspaces.insert(k.id, k.clone());
            }
            MapChange::RemoveKeyspace { id } => {
                self.keyspaces.remove(id);
            }
            MapChange::ReservePartitionIds { next } => {
                self.next_partition_id = self.next_partition_id.max(*next);
            }
        }
        Ok(())
    }
}
