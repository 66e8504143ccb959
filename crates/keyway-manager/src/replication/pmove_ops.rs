//! The operator's calls on primary moves (`keyway ctl move`, `--back`, and
//! the rebalancer): write the intent, ask for a move back. The leader's
//! replication loop carries them out (`pmoves.rs`, `pmove_run.rs`).

use super::moves::ReplicaMove;
use super::pmoves::{
    MAX_FAIL_BACK_WINDOW_MS, MAX_READS_FIRST_HOLD_MS, MoveBackError, PrimaryMove, request_back,
};
use keyway_map::{NodeId, NodeState, PartitionId, PartitionMap};
use keyway_meta::{MetaError, MetaStore};

/// Why a primary move cannot be requested.
#[derive(thiserror::Error, Debug)]
pub enum PrimaryMoveError {
    #[error(transparent)]
    Meta(#[from] MetaError),
    #[error("partition {0} is not in the map")]
    UnknownPartition(PartitionId),
    #[error("node {0} is not registered")]
    UnknownNode(NodeId),
    #[error("node {node} is already the primary of partition {partition}")]
    AlreadyOwner {
        partition: PartitionId,
        node: NodeId,
    },
    #[error("partition {0}'s keyspace has replication factor 1: its primary moves by a migration")]
    NotReplicated(PartitionId),
    #[error("node {0} is down or draining: not a primary move target")]
    NotEligible(NodeId),
    #[error("partition {partition} has a live migration, replica move or primary move ({id})")]
    Busy { partition: PartitionId, id: u64 },
    #[error("{name} must be in {min}..={max} ms, got {got}")]
    BadSetting {
        name: &'static str,
        min: u64,
        max: u64,
        got: u64,
    },
    #[error(transparent)]
    Back(#[from] MoveBackError),
}

/// Whether `partition`'s keyspace keeps more than one copy (its primary then
/// moves by a replica addition, not a single-owner migration).
pub fn is_replicated(map: &PartitionMap, partition: PartitionId) -> bool {
    map.partitions
        .get(&partition)
        .and_then(|p| map.keyspaces.get(&p.keyspace))
        .is_some_and(|k| k.replication_factor >= 2)
}

/// Every primary move stored, by id.
pub async fn read_primary_moves(meta: &dyn MetaStore) -> Result<Vec<PrimaryMove>, MetaError> {
    Ok(meta
        .migrations()
        .await?
        .iter()
        .filter_map(PrimaryMove::load)
        .collect())
}

/// Checks the two settings of a primary move.
pub fn check_settings(
    reads_first_hold_ms: u64,
    fail_back_window_ms: u64,
) -> Result<(), PrimaryMoveError> {
    if reads_first_hold_ms == 0 || reads_first_hold_ms > MAX_READS_FIRST_HOLD_MS {
        return Err(PrimaryMoveError::BadSetting {
            name: "reads_first_hold_ms",
            min: 1,
            max: MAX_READS_FIRST_HOLD_MS,
            got: reads_first_hold_ms,
        });
    }
    if fail_back_window_ms > MAX_FAIL_BACK_WINDOW_MS {
        return Err(PrimaryMoveError::BadSetting {
            name: "fail_back_window_ms",
            min: 0,
            max: MAX_FAIL_BACK_WINDOW_MS,
            got: fail_back_window_ms,
        });
    }
    Ok(())
}

/// Writes the intent to move `partition`'s primaryship to `to` by adding it
/// as a replica (see `pmoves.rs`). Refuses a partition of replication
/// factor 1, a `to` that is the owner, not registered, not Up or draining,
/// and a partition with a live migration, replica move or primary move.
pub async fn request_primary_move(
    meta: &dyn MetaStore,
    partition: PartitionId,
    to: NodeId,
    reads_first: bool,
    reads_first_hold_ms: u64,
    fail_back_window_ms: u64,
) -> Result<PrimaryMove, PrimaryMoveError> {
    check_settings(reads_first_hold_ms, fail_back_window_ms)?;
    let map = meta.get_map().await?;
    let row = map
        .partitions
        .get(&partition)
        .ok_or(PrimaryMoveError::UnknownPartition(partition))?;
    let node = map
        .nodes
        .get(&to)
        .ok_or(PrimaryMoveError::UnknownNode(to))?;
    if row.owner == to {
        return Err(PrimaryMoveError::AlreadyOwner {
            partition,
            node: to,
        });
    }
    if !is_replicated(&map, partition) {
        return Err(PrimaryMoveError::NotReplicated(partition));
    }
    if node.state != NodeState::Up || node.draining {
        return Err(PrimaryMoveError::NotEligible(to));
    }
    if let Some(id) = busy(meta, partition).await? {
        return Err(PrimaryMoveError::Busy { partition, id });
    }
    let id = meta.allocate_migration_id().await?;
    let mv = PrimaryMove::new(
        id,
        partition,
        row.owner,
        to,
        reads_first,
        reads_first_hold_ms,
        fail_back_window_ms,
        crate::driver::now_ms(),
    );
    meta.put_migration(mv.id, None, mv.generation, mv.encode())
        .await?;
    tracing::info!(id, %partition, from = %mv.from, %to, reads_first, "primary move requested");
    Ok(mv)
}

/// The id of a live migration, replica move or primary move of `partition`.
pub async fn busy(meta: &dyn MetaStore, partition: PartitionId) -> Result<Option<u64>, MetaError> {
    for stored in meta.migrations().await? {
        let busy = if let Some(mv) = ReplicaMove::load(&stored) {
            mv.partition == partition
        } else if let Some(mv) = PrimaryMove::load(&stored) {
            mv.partition == partition
        } else {
            crate::driver::load(&stored)
                .is_ok_and(|m| m.partition_id() == partition && !m.state.is_terminal())
        };
        if busy {
            return Ok(Some(stored.id));
        }
    }
    Ok(None)
}

/// How many generation conflicts [`request_move_back`] rides out.
const BACK_ATTEMPTS: u32 = 20;

/// Asks the live primary move of `partition` to switch back to its old
/// primary (`ctl move --back`): allowed only inside the fail-back window
/// while the old primary is in sync ([`request_back`]); the leader's loop
/// then calls the switchover back (no copy) and ends the move `moved_back`.
pub async fn request_move_back(
    meta: &dyn MetaStore,
    partition: PartitionId,
) -> Result<PrimaryMove, PrimaryMoveError> {
    for _ in 0..BACK_ATTEMPTS {
        let map = meta.get_map().await?;
        let mv = read_primary_moves(meta)
            .await?
            .into_iter()
            .filter(|m| m.partition == partition)
            .min_by_key(|m| m.id)
            .ok_or(MoveBackError::NoMove(partition))?;
        let next = request_back(&mv, &map, crate::driver::now_ms())?;
        match meta
            .put_migration(mv.id, Some(mv.generation), mv.generation + 1, next.encode())
            .await
        {
            Ok(()) => {
                return Ok(PrimaryMove {
                    generation: mv.generation + 1,
                    ..next
                });
            }
            Err(MetaError::MigrationConflict { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(MetaError::Unavailable("the primary move record kept changing".into()).into())
}
