//! Moving a replica (issue 12, item 7): partition p's copy on node X (a
//! replica) goes to node Y (no copy of p) without pausing writes.
//!
//! # The steps (each a CAS at epoch + 1 conditional on `(owner, epoch)`)
//!
//! 1. **add**: Y joins `replicas`, out of sync. The primary copies it and,
//!    once caught up, CASes it into `in_sync` itself (it only streams: no
//!    fence, no write pause).
//! 2. **remove**: once the map shows Y in `in_sync` (or Y became the primary
//!    by a failover), X leaves `replicas` (and `in_sync` if there). The
//!    manager removes a node from `in_sync` only here, with the reason
//!    logged; the primary waits X's read lease out before it releases a
//!    reply X has not got (`keyway-node/src/replicate/rules.rs`), so this is
//!    safe.
//!
//! If Y is not in sync `replica_move_timeout_ms` after the move was
//! requested, or Y is gone / draining, or X was promoted to primary, the
//! move is **abandoned**: Y is removed again, X kept.
//!
//! # The intent is durable
//!
//! Between the two steps the partition has replication factor + 1 copies;
//! the membership reconciler would remove the out-of-sync Y. So the move is
//! a record in the metadata store's migration records (the only durable
//! compare-and-set store besides the map; no map field is needed), under a
//! magic byte of its own (`R`, where migration records have `M`), and the
//! reconciler leaves a partition with a live move alone. Every migration
//! reader of the manager skips these records ([`is_replica_move`]). The
//! record holds only the intent (`from`, `to`, when); the progress is the
//! row itself, so [`step`] is a pure function of (record, map, clock) and a
//! new leader resumes (or abandons) a move exactly where the map says it is.
//! The record is deleted once the move is done or abandoned (the decision
//! log and `keyway_manager_replica_moves{outcome}` keep the history).

use keyway_map::wire::{Reader, Writer};
use keyway_map::{Epoch, NodeId, NodeState, PartitionId, PartitionMap, PartitionRecord};
use keyway_meta::{MetaError, MetaStore, StoredMigration};
use serde::Serialize;

const MAGIC: u8 = keyway_migration::REPLICA_MOVE_MAGIC;
const FORMAT: u8 = 1;

/// The default `replica_move_timeout_ms`: ten minutes to copy and catch up.
pub const DEFAULT_REPLICA_MOVE_TIMEOUT_MS: u64 = 600_000;
/// The longest `replica_move_timeout_ms` accepted (a day).
pub const MAX_REPLICA_MOVE_TIMEOUT_MS: u64 = 86_400_000;

/// A requested replica move (the durable intent).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReplicaMove {
    /// Its id in the migration-record id space.
    pub id: u64,
    /// The store's generation of the record (not encoded).
    pub generation: u64,
    pub partition: PartitionId,
    pub from: NodeId,
    pub to: NodeId,
    /// Unix ms when requested; the timeout runs from here.
    pub started_at_ms: u64,
}

impl ReplicaMove {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(24);
        w.u8(MAGIC);
        w.u8(FORMAT);
        w.var(self.id);
        w.var(self.partition.0);
        w.var(self.from.0);
        w.var(self.to.0);
        w.var(self.started_at_ms);
        w.into_inner()
    }

    /// Decodes a stored record; `None` if it is not a replica move.
    pub fn load(stored: &StoredMigration) -> Option<ReplicaMove> {
        if stored.record.first() != Some(&MAGIC) {
            return None;
        }
        let mut r = Reader::new(&stored.record[1..]);
        if r.u8().ok()? != FORMAT {
            return None;
        }
        let mv = ReplicaMove {
            id: r.var().ok()?,
            generation: stored.generation,
            partition: PartitionId(r.var().ok()?),
            from: NodeId(r.var().ok()?),
            to: NodeId(r.var().ok()?),
            started_at_ms: r.var().ok()?,
        };
        r.finish().ok()?;
        (mv.id == stored.id).then_some(mv)
    }
}

/// Whether a stored migration record is a move record — a replica move or
/// a primary move (`pmoves.rs`, magic `P`) — not a migration. Every
/// migration reader skips these.
pub fn is_replica_move(stored: &StoredMigration) -> bool {
    keyway_migration::is_replica_move_record(&stored.record)
}

/// Every replica move stored, by id.
pub async fn read_replica_moves(meta: &dyn MetaStore) -> Result<Vec<ReplicaMove>, MetaError> {
    Ok(meta
        .migrations()
        .await?
        .iter()
        .filter_map(ReplicaMove::load)
        .collect())
}

/// Why a replica move cannot be requested.
#[derive(thiserror::Error, Debug)]
pub enum ReplicaMoveError {
    #[error(transparent)]
    Meta(#[from] MetaError),
    #[error("partition {0} is not in the map")]
    UnknownPartition(PartitionId),
    #[error("node {0} is not registered")]
    UnknownNode(NodeId),
    #[error("node {node} is not a replica of partition {partition}")]
    NotAReplica {
        partition: PartitionId,
        node: NodeId,
    },
    #[error("node {node} already holds a copy of partition {partition}")]
    HasCopy {
        partition: PartitionId,
        node: NodeId,
    },
    #[error("node {0} is down or draining: not a replica move target")]
    NotEligible(NodeId),
    #[error("partition {partition} has a live migration or replica move ({id})")]
    Busy { partition: PartitionId, id: u64 },
}

/// Writes the intent to move `partition`'s replica on `from` to `to` (the
/// leader's replication loop carries it out). Refuses a `from` that is not
/// a replica, a `to` holding a copy or not Up / draining, and a partition
/// with a live migration or replica move. Two requests racing past these
/// checks both write a record; the leader acts on the older one only and
/// abandons the other (`duplicate`).
pub async fn request_replica_move(
    meta: &dyn MetaStore,
    partition: PartitionId,
    from: NodeId,
    to: NodeId,
) -> Result<ReplicaMove, ReplicaMoveError> {
    let map = meta.get_map().await?;
    let row = map
        .partitions
        .get(&partition)
        .ok_or(ReplicaMoveError::UnknownPartition(partition))?;
    let node = map
        .nodes
        .get(&to)
        .ok_or(ReplicaMoveError::UnknownNode(to))?;
    if !row.replicas.contains(&from) {
        return Err(ReplicaMoveError::NotAReplica {
            partition,
            node: from,
        });
    }
    if row.has_copy(to) {
        return Err(ReplicaMoveError::HasCopy {
            partition,
            node: to,
        });
    }
    if node.state != NodeState::Up || node.draining {
        return Err(ReplicaMoveError::NotEligible(to));
    }
    if let Some(id) = super::pmove_ops::busy(meta, partition).await? {
        return Err(ReplicaMoveError::Busy { partition, id });
    }
    let mv = ReplicaMove {
        id: meta.allocate_migration_id().await?,
        generation: 1,
        partition,
        from,
        to,
        started_at_ms: crate::driver::now_ms(),
    };
    meta.put_migration(mv.id, None, mv.generation, mv.encode())
        .await?;
    Ok(mv)
}

/// How a move ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MoveOutcome {
    Done,
    Abandoned,
}

impl MoveOutcome {
    pub fn name(self) -> &'static str {
        match self {
            MoveOutcome::Done => "done",
            MoveOutcome::Abandoned => "abandoned",
        }
    }
}

/// What the leader does for one move this round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing this round.
    Wait {
        /// `catching_up`, `migration_in_flight`, `queued`.
        why: &'static str,
    },
    /// One CAS conditional on `expected`, writing `row` (epoch + 1).
    Cas {
        expected: (NodeId, Epoch),
        row: PartitionRecord,
        /// `add_target`, `remove_source`, `remove_target`.
        action: &'static str,
        /// `replica_move` (add), `target_in_sync` (remove X), or the
        /// abandon reason (remove Y).
        reason: &'static str,
    },
    /// The move ended: delete its record.
    Finish {
        outcome: MoveOutcome,
        /// `completed`, `timeout`, `partition_gone`, `source_gone`,
        /// `source_promoted`, `target_gone`, `target_draining`, `duplicate`.
        reason: &'static str,
    },
}

/// Where a live move is, from its row (for `/status` and `ctl`).
pub fn phase(mv: &ReplicaMove, map: &PartitionMap) -> &'static str {
    match map.partitions.get(&mv.partition) {
        None => "ending",
        Some(row) if row.has_copy(mv.to) && !row.has_copy(mv.from) => "ending",
        Some(row) if row.owner == mv.to || row.in_sync.contains(&mv.to) => "removing_source",
        Some(row) if row.replicas.contains(&mv.to) => "catching_up",
        Some(_) => "adding_target",
    }
}

/// The next step of `mv` (pure; see the module docs). `first` is whether
/// `mv` is the oldest live move of its partition (a later one is a
/// duplicate); `migrating` whether the partition has a live migration (its
/// flip writes the row it read, so no CAS now).
pub fn step(
    mv: &ReplicaMove,
    map: &PartitionMap,
    first: bool,
    migrating: bool,
    now_ms: u64,
    timeout_ms: u64,
) -> Step {
    let finish = |outcome, reason| Step::Finish { outcome, reason };
    let Some(row) = map.partitions.get(&mv.partition) else {
        return finish(MoveOutcome::Abandoned, "partition_gone");
    };
    if !first {
        return finish(MoveOutcome::Abandoned, "duplicate");
    }
    let (x, y) = (mv.from, mv.to);
    if row.has_copy(y) && !row.has_copy(x) {
        return finish(MoveOutcome::Done, "completed");
    }
    if migrating {
        return Step::Wait {
            why: "migration_in_flight",
        };
    }
    let expected = (row.owner, row.epoch);
    let cas = |mut next: PartitionRecord, action, reason| {
        next.epoch = Epoch(next.epoch.0 + 1);
        debug_assert!(!next.replicas.contains(&next.owner));
        debug_assert!(next.in_sync.iter().all(|r| next.replicas.contains(r)));
        Step::Cas {
            expected,
            row: next,
            action,
            reason,
        }
    };
    let without = |n: NodeId| {
        let mut r = row.clone();
        r.remove_replica(n);
        r
    };
    let y_caught_up = row.owner == y || row.in_sync.contains(&y);
    if y_caught_up && row.replicas.contains(&x) {
        return cas(without(x), "remove_source", "target_in_sync");
    }
    // Abandon: remove Y if it is listed (never when X holds no copy: then
    // Y is the copy that stays, handled by `completed` above).
    let abandon = |reason| {
        if row.replicas.contains(&y) {
            cas(without(y), "remove_target", reason)
        } else {
            finish(MoveOutcome::Abandoned, reason)
        }
    };
    if !row.has_copy(x) {
        return abandon("source_gone");
    }
    if row.owner == x {
        return abandon("source_promoted");
    }
    match map.nodes.get(&y) {
        None => return abandon("target_gone"),
        Some(n) if n.draining => return abandon("target_draining"),
        Some(_) => {}
    }
    if now_ms >= mv.started_at_ms.saturating_add(timeout_ms) {
        return abandon("timeout");
    }
    if !row.has_copy(y) {
        let mut r = row.clone();
        r.replicas.push(y);
        return cas(r, "add_target", "replica_move");
    }
    Step::Wait { why: "catching_up" }
}
