//! Applying a split to the metadata store: refuse a partition in a live
//! migration, commit the planned compare-and-set, and sort out a lost one.
//!
//! # Why the migration check is atomic with the commit
//!
//! A split must never race a flip whose outcome is in doubt (issue 11: the
//! flip applied, its answer was lost; a split of the now-target-owned row
//! removes the id, and the re-sent flip's conflict could be misread). The
//! store has no transaction over both a map row and a migration record
//! (`MapTxn` conditions are `(owner, epoch)` per partition), so the check is
//! made *between* reading the map and committing, and the commit is
//! conditional on the row as read:
//!
//! 1. read the map (version V) and take the row `(owner, epoch)`;
//! 2. then list the migration records and refuse if any live (non-terminal)
//!    one covers a range overlapping the row — by range, not by id: a
//!    record names the id it was created for, and after a split or merge
//!    the same keys have other ids ([`migration_over`]);
//! 3. commit conditional on the row's `(owner, epoch)`.
//!
//! Every flip is itself a commit conditional on one row. A flip that
//! applied before step 1 belongs to a record that stays live until its
//! driver learns the outcome, and step 2 reads after step 1, so it sees the
//! record (or the outcome is already decided). A flip that applies after
//! step 1 changes the row's `(owner, epoch)`, so step 3's condition fails
//! and nothing changes. A move *requested* after step 2 can never flip: its
//! condition names the row the split removes; the split asks it to abort at
//! once ([`abort_raced`]), and its flip conflict is decided from the map's
//! history (the removed row was the source's: never applied). The driver
//! never runs two migrations of overlapping ranges at once, and never drops
//! a target's copy of a range the target owns any part of.

use super::{Busy, SplitAt, SplitError, SplitPlan, plan_split};
use bytes::Bytes;
use keyway_map::{Epoch, NodeId, PartitionId, PartitionRecord};
use keyway_meta::{MetaError, MetaStore};
use keyway_migration::{MigrationId, MigrationState};
use keyway_storage::KeyRange;
use std::collections::HashMap;

/// How many lost races for the new partition ids a split rides out (each
/// re-reads the map and re-plans with fresh ids).
const ID_RACE_ATTEMPTS: u32 = 8;

/// Every partition with a non-terminal migration record (unreadable records
/// are skipped with a warning, as [`crate::request_move`] does).
pub async fn live_migrations(meta: &dyn MetaStore) -> Result<Busy, MetaError> {
    let mut busy = HashMap::new();
    for stored in meta.migrations().await? {
        if crate::replication::moves::is_replica_move(&stored) {
            continue;
        }
        match crate::driver::load(&stored) {
            Ok(rec) if !rec.state.is_terminal() => {
                busy.insert(rec.partition_id(), (rec.id, rec.state));
            }
            Ok(_) => {}
            Err(err) => {
                tracing::warn!(%err, "split/merge: skipping an unreadable migration record")
            }
        }
    }
    Ok(busy)
}

/// The first live (non-terminal) migration whose range overlaps one of
/// `rows`: `(row id, migration, state)`. Read it after the map the rows
/// come from (see the module docs).
pub async fn migration_over(
    meta: &dyn MetaStore,
    rows: &[&PartitionRecord],
) -> Result<Option<(PartitionId, MigrationId, MigrationState)>, MetaError> {
    for stored in meta.migrations().await? {
        if crate::replication::moves::is_replica_move(&stored) {
            continue;
        }
        let rec = match crate::driver::load(&stored) {
            Ok(rec) if !rec.state.is_terminal() => rec,
            Ok(_) => continue,
            Err(err) => {
                tracing::warn!(%err, "split/merge: skipping an unreadable migration record");
                continue;
            }
        };
        let moving = crate::driver::storage_range(&rec);
        for row in rows {
            let (start, end) = row.storage_bounds();
            if crate::driver::ranges_overlap(&KeyRange::new(start, end), &moving) {
                return Ok(Some((row.id, rec.id, rec.state)));
            }
        }
    }
    Ok(None)
}

/// After a split or merge removed the partitions `gone`: asks every
/// migration of theirs that was requested after the check (the race in the
/// module docs) to abort now, instead of copying on until its flip
/// conflicts. Best effort: the flip's condition is the guarantee.
pub(crate) async fn abort_raced(meta: &dyn MetaStore, gone: &[PartitionId]) {
    let busy = match live_migrations(meta).await {
        Ok(busy) => busy,
        Err(err) => {
            tracing::debug!(%err, "cannot list migrations after a split or merge");
            return;
        }
    };
    for partition in gone {
        if let Some(&(migration, _)) = busy.get(partition) {
            match crate::request_abort(meta, migration).await {
                Ok(_) => tracing::warn!(
                    %migration, %partition,
                    "aborting a migration of a partition split or merged under it"
                ),
                Err(err) => tracing::warn!(
                    %migration, %partition, %err,
                    "cannot abort the migration of a split or merged partition (its flip will conflict)"
                ),
            }
        }
    }
}

/// One split to apply.
#[derive(Clone, Debug)]
pub struct SplitRequest {
    pub partition: PartitionId,
    pub at: SplitAt,
    /// Split only if the partition still has this owner and epoch (what the
    /// caller decided on); `None`: whatever the map holds now.
    pub expected: Option<(NodeId, Epoch)>,
    /// The owner's `size_split_key`, for [`SplitAt::Auto`] in a range keyspace.
    pub size_hint: Option<Bytes>,
}

/// Splits `partition` at `at` (see [`SplitAt`]), returning the two children
/// (left, right). Metadata only: no data moves.
pub async fn split_partition(
    meta: &dyn MetaStore,
    partition: PartitionId,
    at: SplitAt,
) -> Result<(PartitionRecord, PartitionRecord), SplitError> {
    let request = SplitRequest {
        partition,
        at,
        expected: None,
        size_hint: None,
    };
    let plan = split_checked(meta, &request).await?;
    Ok((plan.left, plan.right))
}

/// Applies `request`: refuses a partition in a live migration (of any
/// record whose range overlaps it, checked after reading the map; see the
/// module docs) or no longer at `expected`, commits the plan, and re-plans
/// when only the race for the new ids was lost. Returns the committed plan.
pub async fn split_checked(
    meta: &dyn MetaStore,
    request: &SplitRequest,
) -> Result<SplitPlan, SplitError> {
    let partition = request.partition;
    for _ in 0..ID_RACE_ATTEMPTS {
        let map = meta.get_map().await?;
        let current = map.partitions.get(&partition).map(|p| (p.owner, p.epoch));
        if request.expected.is_some() && current != request.expected {
            return Err(match current {
                None => SplitError::UnknownPartition(partition),
                current => SplitError::Lost { partition, current },
            });
        }
        let plan = plan_split(&map, partition, &request.at, request.size_hint.as_deref())?;
        let parent = &map.partitions[&partition];
        if let Some((_, migration, state)) = migration_over(meta, &[parent]).await? {
            return Err(SplitError::Migrating {
                partition,
                migration,
                state,
            });
        }
        // Conditional on the parent's (owner, epoch) as read above.
        match meta.commit(plan.txn.clone()).await {
            Ok(version) => {
                tracing::info!(
                    %partition, %version, left = %plan.left.id, right = %plan.right.id,
                    at = %request.at, epoch = %plan.left.epoch, "partition split"
                );
                abort_raced(meta, &[partition]).await;
                return Ok(plan);
            }
            Err(MetaError::Conflict {
                partition: p,
                current,
            }) if p == partition => return Err(SplitError::Lost { partition, current }),
            // Another commit took one of the new ids first: re-plan.
            Err(MetaError::Conflict { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(SplitError::Contended {
        partition,
        attempts: ID_RACE_ATTEMPTS,
    })
}
