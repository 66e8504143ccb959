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

/// The row with `change` applied at `epoch + 1`. A removal of the
/// `reads_from` node clears `reads_from` in the same row (DESIGN13
/// interface 1: it must stay a member of `in_sync`, or `validate` refuses).
pub fn changed_row(row: &PartitionRecord, change: &CasChange) -> PartitionRecord {
    let mut next = row.clone();
    match change {
        CasChange::Remove { replicas, .. } => {
            next.in_sync.retain(|r| !replicas.contains(r));
            if next.reads_from.is_some_and(|r| replicas.contains(&r)) {
                next.reads_from = None;
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replicate::rules::Reason;
    use keyway_map::{NodeId, NodeInfo, PartitionMap};

    /// A 3-node map whose first partition has both replicas in sync and
    /// reads switched to its first replica.
    fn map_reading_from_replica() -> (PartitionMap, PartitionId) {
        let nodes: Vec<NodeInfo> = (1..=3)
            .map(|i| NodeInfo::up(NodeId(i), format!("127.0.0.1:{}", 7000 + i)))
            .collect();
        let mut m = PartitionMap::bootstrap_replicated(&nodes, 1, 3).unwrap();
        let pid = *m.partitions.keys().next().unwrap();
        let row = m.partitions.get_mut(&pid).unwrap();
        row.in_sync = row.replicas.clone();
        row.reads_from = Some(row.replicas[0]);
        m.validate().unwrap();
        (m, pid)
    }

    #[test]
    fn every_removal_of_the_reads_from_node_clears_reads_from() {
        for reason in [
            Reason::LagTimeout,
            Reason::PrimaryRestarted,
            Reason::StreamLost,
        ] {
            let (mut m, pid) = map_reading_from_replica();
            let row = m.partitions[&pid].clone();
            let gone = row.replicas[0];
            let next = changed_row(
                &row,
                &CasChange::Remove {
                    replicas: vec![gone],
                    reason,
                },
            );
            assert_eq!(next.reads_from, None, "{reason:?}");
            assert!(!next.in_sync.contains(&gone));
            assert_eq!(next.epoch, Epoch(row.epoch.0 + 1));
            m.partitions.insert(pid, next);
            m.validate().unwrap_or_else(|e| panic!("{reason:?}: {e}"));
        }
    }

    #[test]
    fn removing_another_replica_or_adding_keeps_reads_from() {
        let (m, pid) = map_reading_from_replica();
        let row = m.partitions[&pid].clone();
        let next = changed_row(
            &row,
            &CasChange::Remove {
                replicas: vec![row.replicas[1]],
                reason: Reason::LagTimeout,
            },
        );
        assert_eq!(next.reads_from, Some(row.replicas[0]));
        let added = changed_row(
            &next,
            &CasChange::Add {
                replica: row.replicas[1],
            },
        );
        assert_eq!(added.reads_from, Some(row.replicas[0]));
    }
}
