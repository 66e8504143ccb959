//! The primary's in-sync set changes: one compare-and-set each, at epoch + 1,
//! conditional on (this node, epoch).
//!
//! The row committed is the partition's row in this node's map with only
//! `in_sync` changed (and the epoch bumped). If the map's row is not at the
//! expected epoch any more, the CAS is not tried (it would fail). When the
//! store is unreachable the outcome is unknown: the store's map is re-read
//! until it tells (the row at epoch + 1 with our change: committed; at the
//! epoch: not, try again; anything else: failed).

use super::Replication;
use super::rules::CasChange;
use keyway_map::{Epoch, MapChange, OwnershipCondition, PartitionId, PartitionRecord};
use keyway_meta::{MapTxn, MetaError};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Tries of a CAS whose outcome stays unknown before it counts as failed.
const MAX_UNKNOWN_TRIES: u32 = 20;

/// Commits `change` and reports the outcome to the rules.
pub async fn run(repl: Arc<Replication>, partition: PartitionId, epoch: Epoch, change: CasChange) {
    let ok = commit(&repl, partition, epoch, &change).await;
    let reason = change.reason();
    if ok {
        repl.metrics
            .in_sync_changes
            .get_or_create(&super::metrics::ReasonLabel {
                reason: reason.label(),
            })
            .inc();
    }
    tracing::info!(%partition, %epoch, ?change, ok, reason = reason.label(), "in-sync set change");
    repl.with_rules(|r| r.cas_result(partition, epoch, &change, ok, Instant::now()));
}

/// The row with `change` applied at `epoch + 1`.
pub fn changed_row(row: &PartitionRecord, change: &CasChange) -> PartitionRecord {
    let mut next = row.clone();
    match change {
        CasChange::Remove { replicas, .. } => next.in_sync.retain(|r| !replicas.contains(r)),
        CasChange::Add { replica } => {
            if next.replicas.contains(replica) && !next.in_sync.contains(replica) {
                next.in_sync.push(*replica);
            }
        }
    }
    next.epoch = Epoch(row.epoch.0 + 1);
    next
}

async fn commit(
    repl: &Replication,
    partition: PartitionId,
    epoch: Epoch,
    change: &CasChange,
) -> bool {
    let map = repl.routing.map();
    let Some(row) = map.partitions.get(&partition) else {
        return false;
    };
    if row.owner != repl.me || row.epoch != epoch {
        return false;
    }
    if let CasChange::Add { replica } = change
        && !row.replicas.contains(replica)
    {
        return false;
    }
    let next = changed_row(row, change);
    let txn = MapTxn {
        conditions: vec![OwnershipCondition {
            partition,
            expected: Some((repl.me, epoch)),
        }],
        changes: vec![MapChange::UpsertPartition(next.clone())],
    };
    let mut pause = Duration::from_millis(20);
    for _ in 0..MAX_UNKNOWN_TRIES {
        match repl.meta.commit(txn.clone()).await {
            Ok(_) => return true,
            Err(MetaError::Unavailable(why)) => {
                tracing::warn!(%partition, %why, "in-sync CAS outcome unknown; re-reading the map");
            }
            Err(e) => {
                tracing::info!(%partition, %e, "in-sync CAS refused");
                return false;
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(500));
        match repl.meta.get_map().await {
            Ok(m) => match m.partitions.get(&partition) {
                Some(p) if *p == next => return true,
                Some(p) if p.owner == repl.me && p.epoch == epoch => continue,
                _ => return false,
            },
            Err(_) => continue,
        }
    }
    false
}
