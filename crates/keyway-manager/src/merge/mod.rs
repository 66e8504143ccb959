//! Merges: two adjacent cold, small partitions of one keyspace become one,
//! in one metadata compare-and-set, with no data moving (invariant 8). The
//! inverse of a split; both halves must live on the same node first.
//!
//! # The process
//!
//! 1. *Decide* (`decide.rs`, pure): the [`MergePolicy`] walks each
//!    keyspace's partitions in key order and pairs neighbours that are both
//!    cold (each below `merge_max_requests_per_sec` in every snapshot for
//!    `merge_cold_window_ms`) and small (together below `merge_max_bytes`),
//!    neither in a migration, neither hot, neither born by a split less than
//!    `merge_after_split_cooldown_ms` ago (hysteresis: a split is not undone
//!    at once), while the keyspace keeps more than
//!    `merge_min_partitions_per_node` × Up nodes partitions (the bootstrap
//!    layout is never merged away). Neighbours on different nodes are
//!    co-located first: the smaller moves to the other's owner through the
//!    migration driver ([`crate::request_move`]); a later round merges them.
//! 2. *Plan* ([`plan_merge`], pure): the [`MapTxn`] conditional on both
//!    `(owner, epoch)`s and on the new id being absent; it removes both and
//!    upserts `[left.start, right.end)` under a new id
//!    (`next_partition_id`, reserved past) at epoch max(both) + 1.
//! 3. *Apply* ([`merge_checked`]): refuse if a live migration covers part
//!    of either (checked by range after reading the map, then the commit is
//!    conditional on both rows as read: atomic with respect to any flip,
//!    see `split/apply.rs`), commit, and tell a lost CAS on either half
//!    ([`MergeError::Lost`]) from a lost race for the new id (re-planned).
//!
//! A request naming either half at its old epoch is then rejected with the
//! merged record; a migration of either half requested concurrently cannot
//! flip (its condition names an id that is gone) and aborts.

mod decide;
#[cfg(test)]
mod tests;

pub use decide::{MergeAction, MergePolicy, MergeVerdict};

use crate::split::{abort_raced, fmt_current, migration_over};
use keyway_map::{
    Epoch, MapChange, NodeId, OwnershipCondition, PartitionId, PartitionMap, PartitionRecord,
};
use keyway_meta::{MapTxn, MetaError, MetaStore};
use keyway_migration::{MigrationId, MigrationState};

/// Settings of automatic merges (the `--merge-*` flags).
#[derive(Clone, Debug, PartialEq)]
pub struct MergeConfig {
    /// Merge automatically at all (`--no-auto-merge` turns it off; manual
    /// `keyway ctl merge` always works).
    pub enabled: bool,
    /// Each of the two must be below this many requests/s.
    pub merge_max_requests_per_sec: f64,
    /// ... for at least this long (every snapshot in the window).
    pub merge_cold_window_ms: u64,
    /// Their payload bytes together must be below this.
    pub merge_max_bytes: u64,
    /// Neither may have been born by a split less than this long ago.
    pub merge_after_split_cooldown_ms: u64,
    /// A keyspace keeps at least this many partitions per Up node.
    pub merge_min_partitions_per_node: u32,
}

impl Default for MergeConfig {
    fn default() -> Self {
        MergeConfig {
            enabled: true,
            merge_max_requests_per_sec: 100.0,
            merge_cold_window_ms: 300_000,
            merge_max_bytes: 64 * 1024 * 1024,
            merge_after_split_cooldown_ms: 600_000,
            merge_min_partitions_per_node: 4,
        }
    }
}

impl MergeConfig {
    /// Checks every field; the error names the bad one.
    pub fn validate(&self) -> Result<(), String> {
        let rps = self.merge_max_requests_per_sec;
        if !(rps.is_finite() && rps >= 0.0) {
            return Err("merge_max_requests_per_sec must be a non-negative number".into());
        }
        if self.merge_max_bytes == 0 {
            return Err("merge_max_bytes must be positive".into());
        }
        if self.merge_min_partitions_per_node == 0 {
            return Err("merge_min_partitions_per_node must be positive".into());
        }
        Ok(())
    }

    /// Hysteresis against the split thresholds: a merged partition must not
    /// qualify for a split at once (checked when both are enabled).
    pub fn validate_against(&self, split: &crate::SplitConfig) -> Result<(), String> {
        if !(self.enabled && split.enabled) {
            return Ok(());
        }
        if self.merge_max_bytes >= split.split_max_bytes {
            return Err("merge_max_bytes must be below split_max_bytes".into());
        }
        if self.merge_max_requests_per_sec >= split.split_max_requests_per_sec {
            return Err(
                "merge_max_requests_per_sec must be below split_max_requests_per_sec".into(),
            );
        }
        Ok(())
    }
}

/// Why a merge was refused. Nothing changed in any case.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum MergeError {
    #[error(transparent)]
    Meta(#[from] MetaError),
    #[error("partition {0} is not in the map")]
    UnknownPartition(PartitionId),
    #[error("partitions {left} and {right} are not neighbours in one keyspace")]
    NotAdjacent {
        left: PartitionId,
        right: PartitionId,
    },
    #[error(
        "partitions {left} (node {left_owner}) and {right} (node {right_owner}) live on different nodes: move one first (keyway ctl move)"
    )]
    DifferentOwners {
        left: PartitionId,
        left_owner: NodeId,
        right: PartitionId,
        right_owner: NodeId,
    },
    #[error("partitions {left} and {right} have different replicas")]
    DifferentReplicas {
        left: PartitionId,
        right: PartitionId,
    },
    #[error(
        "partition {partition} has migration {migration} in {state}: it merges once the migration ended"
    )]
    Migrating {
        partition: PartitionId,
        migration: MigrationId,
        state: MigrationState,
    },
    #[error("partition {partition} changed under the merge (now {}): nothing changed", fmt_current(.current))]
    Lost {
        partition: PartitionId,
        current: Option<(NodeId, Epoch)>,
    },
    #[error("merge of {left} and {right}: gave up after {attempts} races for a new partition id")]
    Contended {
        left: PartitionId,
        right: PartitionId,
        attempts: u32,
    },
}

impl MergeError {
    /// The short machine-readable reason for the decision log and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            MergeError::Meta(_) => "store_error",
            MergeError::UnknownPartition(_) => "gone",
            MergeError::NotAdjacent { .. } => "not_adjacent",
            MergeError::DifferentOwners { .. } => "different_owners",
            MergeError::DifferentReplicas { .. } => "different_replicas",
            MergeError::Migrating { .. } => "migrating",
            MergeError::Lost { .. } | MergeError::Contended { .. } => "conflict",
        }
    }
}

/// A merge ready to commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MergePlan {
    pub left: PartitionRecord,
    pub right: PartitionRecord,
    pub merged: PartitionRecord,
    pub txn: MapTxn,
}

/// Plans merging partitions `a` and `b` of `map` (given in either order):
/// they must be neighbours in one keyspace with the same owner and the same
/// replicas (as sets). The merged row's in-sync set is the intersection of
/// the two: a replica holds every acknowledged write of the merged range
/// only if it held them for both halves (invariant 9).
pub fn plan_merge(
    map: &PartitionMap,
    a: PartitionId,
    b: PartitionId,
) -> Result<MergePlan, MergeError> {
    let get = |id| {
        map.partitions
            .get(&id)
            .ok_or(MergeError::UnknownPartition(id))
    };
    let (pa, pb) = (get(a)?, get(b)?);
    let meets = |l: &PartitionRecord, r: &PartitionRecord| {
        l.id != r.id && l.keyspace == r.keyspace && l.end.as_ref() == Some(&r.start)
    };
    let (left, right) = if meets(pa, pb) {
        (pa, pb)
    } else if meets(pb, pa) {
        (pb, pa)
    } else {
        return Err(MergeError::NotAdjacent { left: a, right: b });
    };
    if left.owner != right.owner {
        return Err(MergeError::DifferentOwners {
            left: left.id,
            left_owner: left.owner,
            right: right.id,
            right_owner: right.owner,
        });
    }
    let set = |v: &[NodeId]| v.iter().copied().collect::<std::collections::BTreeSet<_>>();
    if set(&left.replicas) != set(&right.replicas) {
        return Err(MergeError::DifferentReplicas {
            left: left.id,
            right: right.id,
        });
    }
    let id = map.next_partition_id.max(PartitionId(1));
    let in_sync: Vec<NodeId> = left
        .in_sync
        .iter()
        .copied()
        .filter(|n| right.in_sync.contains(n))
        .collect();
    // Reads stay switched only where both halves read from the same node
    // and it stays in sync (interface 1: `reads_from` is in `in_sync`).
    let reads_from = left
        .reads_from
        .filter(|r| right.reads_from == Some(*r) && in_sync.contains(r));
    let merged = PartitionRecord {
        id,
        end: right.end.clone(),
        epoch: Epoch(left.epoch.0.max(right.epoch.0) + 1),
        in_sync,
        reads_from,
        ..left.clone()
    };
    let held = |p: &PartitionRecord| OwnershipCondition {
        partition: p.id,
        expected: Some((p.owner, p.epoch)),
    };
    let txn = MapTxn {
        conditions: vec![
            held(left),
            held(right),
            OwnershipCondition {
                partition: id,
                expected: None,
            },
        ],
        changes: vec![
            MapChange::RemovePartition { id: left.id },
            MapChange::RemovePartition { id: right.id },
            MapChange::UpsertPartition(merged.clone()),
            MapChange::ReservePartitionIds {
                next: PartitionId(id.0 + 1),
            },
        ],
    };
    Ok(MergePlan {
        left: left.clone(),
        right: right.clone(),
        merged,
        txn,
    })
}

/// How many lost races for the new id a merge rides out.
const ID_RACE_ATTEMPTS: u32 = 8;

/// Merges neighbours `a` and `b` (either order) on one node, returning the
/// merged record. Metadata only: no data moves.
pub async fn merge_partitions(
    meta: &dyn MetaStore,
    a: PartitionId,
    b: PartitionId,
) -> Result<PartitionRecord, MergeError> {
    Ok(merge_checked(meta, a, b, None).await?.merged)
}

/// Applies a merge of `a` and `b`: refuses either in a live migration or no
/// longer at `expected` (`(owner, epoch)` of `a` and of `b`, what the caller
/// decided on), commits, and re-plans when only the race for the new id
/// was lost.
pub async fn merge_checked(
    meta: &dyn MetaStore,
    a: PartitionId,
    b: PartitionId,
    expected: Option<[(NodeId, Epoch); 2]>,
) -> Result<MergePlan, MergeError> {
    for _ in 0..ID_RACE_ATTEMPTS {
        let map = meta.get_map().await?;
        if let Some(expected) = expected {
            for (partition, want) in [a, b].into_iter().zip(expected) {
                let current = map.partitions.get(&partition).map(|p| (p.owner, p.epoch));
                if current != Some(want) {
                    return Err(MergeError::Lost { partition, current });
                }
            }
        }
        let plan = plan_merge(&map, a, b)?;
        // After reading the map; the commit is conditional on both rows.
        if let Some((partition, migration, state)) =
            migration_over(meta, &[&plan.left, &plan.right]).await?
        {
            return Err(MergeError::Migrating {
                partition,
                migration,
                state,
            });
        }
        match meta.commit(plan.txn.clone()).await {
            Ok(version) => {
                tracing::info!(
                    left = %plan.left.id, right = %plan.right.id, merged = %plan.merged.id,
                    epoch = %plan.merged.epoch, %version, "partitions merged"
                );
                abort_raced(meta, &[a, b]).await;
                return Ok(plan);
            }
            Err(MetaError::Conflict { partition, current }) if partition == a || partition == b => {
                return Err(MergeError::Lost { partition, current });
            }
            Err(MetaError::Conflict { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(MergeError::Contended {
        left: a,
        right: b,
        attempts: ID_RACE_ATTEMPTS,
    })
}
