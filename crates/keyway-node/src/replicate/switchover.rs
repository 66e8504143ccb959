//! Planned switchover: move a partition's primaryship to an in-sync replica
//! with a pause bounded like a migration cutover.
//!
//! Process overview (primary P, partition p at epoch e, target T):
//! 1. Check: P owns p at exactly e, T is in p's in-sync set in P's map and
//!    in sync in P's rules (its stream's acks are meaningful).
//! 2. **Read leases** (invariant 11): stop vouching p's read leases and
//!    wait until the last one granted to a replica other than T ended (T
//!    does not know them, and after the CAS it acknowledges writes the
//!    others may not have yet). Before the fence: no added write pause.
//! 3. **Fence** p: requests are held (parked); taking the fence waits for
//!    every request admitted before it, so the last seq then covers them.
//! 4. Wait until T's stream acked ≥ that seq (bounded by `timeout`): T
//!    holds every write P accepted. Then wait up to `switchover_grace`
//!    (`replica_switchover_grace_ms`) more for the other in-sync replicas'
//!    streams to ack it too: they run beside T's and may be a batch behind.
//! 5. **One CAS** conditional on (P, e): owner = T, replicas = (replicas
//!    without T) with P, in_sync = [P], reads_from = None, epoch e + 1.
//!    P may stay in sync: it is fenced (no write after h, the last seq at
//!    the fence) and T acknowledged ≥ h, so P and T hold the same data for
//!    p, every acknowledged write included. Another in-sync replica X
//!    whose stream acknowledged ≥ h holds the same records (all P ever
//!    shipped of p, no write after h), so it stays in sync too; one that
//!    did not may lack writes only T acknowledged, so it drops out and T
//!    copies it again. T's rules recognise the shape (first sight at e + 1,
//!    in sync at e, P in the in-sync set) and keep streaming to P and X
//!    with no copy, in one era (`era.rs`), so a move back is a switchover
//!    too and a bystander replica is not copied again.
//! 6. Install the committed map here before lifting the fence, so the held
//!    requests re-run against it and get `-MOVED` to T (never run here).
//!
//! On any failure before the CAS the fence is lifted and P keeps serving.

use super::Replication;
use super::rules::ReplicaState;
use keyway_map::{Epoch, MapChange, NodeId, OwnershipCondition, PartitionId, PartitionRecord};
use keyway_meta::MapTxn;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the switchover re-checks the target's acknowledged seq.
const POLL: Duration = Duration::from_millis(1);

/// The outcome of a switchover.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Switched {
    pub owner: NodeId,
    pub epoch: Epoch,
    /// Fence to lift.
    pub paused: Duration,
}

/// Why a switchover did not happen.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum SwitchoverError {
    /// The request does not fit this node's state (not the owner at that
    /// epoch, no in-sync target).
    #[error("{0}")]
    Refused(String),
    /// The target did not catch up in time, or the CAS failed.
    #[error("{0}")]
    Failed(String),
}

/// The row a switchover of `row` to `target` commits (step 5): owner =
/// target, replicas = replicas − target + the old owner, in_sync = [the old
/// owner] + `caught_up` (the other in-sync replicas whose stream had
/// acknowledged the last seq at the fence), reads_from = None, epoch + 1.
pub fn switched_row(
    row: &PartitionRecord,
    target: NodeId,
    caught_up: &[NodeId],
) -> PartitionRecord {
    assert!(
        row.in_sync.contains(&target),
        "switchover to a replica not in sync"
    );
    assert!(
        caught_up
            .iter()
            .all(|r| *r != target && row.in_sync.contains(r)),
        "only other in-sync replicas stay in sync"
    );
    let mut next = row.clone();
    next.owner = target;
    next.replicas.retain(|r| *r != target);
    next.replicas.push(row.owner);
    next.in_sync = std::iter::once(row.owner)
        .chain(
            row.in_sync
                .iter()
                .copied()
                .filter(|r| caught_up.contains(r)),
        )
        .collect();
    next.reads_from = None;
    next.epoch = Epoch(row.epoch.0 + 1);
    next
}

/// Whether `replica` is in sync for `partition` in these rules (its
/// stream's acknowledgements count).
fn in_sync_in(rules: &super::rules::Rules, partition: PartitionId, replica: NodeId) -> bool {
    rules
        .parts()
        .get(&partition)
        .and_then(|p| p.replicas.get(&replica).cloned())
        == Some(ReplicaState::InSync)
}

/// Runs a switchover of `partition` (see the module docs).
pub async fn switchover(
    repl: &Arc<Replication>,
    partition: PartitionId,
    epoch: Epoch,
    to: Option<NodeId>,
    timeout: Duration,
) -> Result<Switched, SwitchoverError> {
    let refused = |s: String| Err(SwitchoverError::Refused(s));
    let map = repl.routing.map();
    let Some(row) = map.partitions.get(&partition).cloned() else {
        return refused(format!("partition {partition} is not in this node's map"));
    };
    if row.owner != repl.me || row.epoch != epoch {
        return refused(format!(
            "this node does not own partition {partition} at epoch {epoch} (owner {}, epoch {})",
            row.owner, row.epoch
        ));
    }
    let in_sync_here = |r: &NodeId| in_sync_in(&repl.lock().rules, partition, *r);
    let target = match to {
        Some(t) if row.in_sync.contains(&t) && in_sync_here(&t) => t,
        Some(t) => {
            return refused(format!(
                "node {t} is not an in-sync replica of partition {partition}"
            ));
        }
        None => match row.in_sync.iter().find(|r| in_sync_here(r)) {
            Some(t) => *t,
            None => return refused(format!("partition {partition} has no in-sync replica")),
        },
    };
    // Invariant 11: the new owner does not know the read leases granted
    // here, so no replica but the target may hold one when the CAS commits.
    // Stop vouching them and wait for the last to end, before the fence,
    // so the wait adds nothing to the write pause.
    let leases_end = repl.lock().rules.stop_switch_leases(partition, target);
    if let Some(until) = leases_end {
        if until > Instant::now() + timeout {
            repl.lock().rules.resume_switch_leases(partition);
            return Err(SwitchoverError::Failed(format!(
                "replica read leases of partition {partition} outlast the {} ms timeout",
                timeout.as_millis()
            )));
        }
        tokio::time::sleep_until(until.into()).await;
    }
    let fenced_at = Instant::now();
    repl.routing.set_fenced(partition, true);
    let result = async {
        let head = repl.engine.last_seq();
        let deadline = fenced_at + timeout;
        while repl.lock().rules.acked_for(partition, target) < head {
            if Instant::now() >= deadline {
                return Err(SwitchoverError::Failed(format!(
                    "replica {target} did not acknowledge seq {head} within {} ms",
                    timeout.as_millis()
                )));
            }
            tokio::time::sleep(POLL).await;
        }
        // Other in-sync replicas that hold every record up to `head` (the
        // fence keeps it the last seq) hold exactly what T holds: they stay
        // in sync with the same era at T, so nothing is copied again. Their
        // streams run beside T's, so one may be a batch behind when T's
        // ack arrives: the fence waits for them a bounded grace (their
        // acks are due anyway, the writes admitted before the fence wait
        // for them) rather than drop one and copy the whole partition.
        let others: Vec<NodeId> = {
            let inner = repl.lock();
            row.in_sync
                .iter()
                .copied()
                .filter(|r| *r != target && in_sync_in(&inner.rules, partition, *r))
                .collect()
        };
        let acked_head = |rs: &[NodeId]| {
            let inner = repl.lock();
            rs.iter()
                .copied()
                .filter(|r| inner.rules.acked_for(partition, *r) >= head)
                .collect::<Vec<NodeId>>()
        };
        let grace_end = deadline.min(Instant::now() + repl.cfg.switchover_grace);
        let mut caught_up = acked_head(&others);
        while caught_up.len() < others.len() && Instant::now() < grace_end {
            tokio::time::sleep(POLL).await;
            caught_up = acked_head(&others);
        }
        let late: Vec<NodeId> = others
            .iter()
            .copied()
            .filter(|r| !caught_up.contains(r))
            .collect();
        let next = switched_row(&row, target, &caught_up);
        let txn = MapTxn {
            conditions: vec![OwnershipCondition {
                partition,
                expected: Some((repl.me, epoch)),
            }],
            changes: vec![MapChange::UpsertPartition(next)],
        };
        let version = repl
            .meta
            .commit(txn)
            .await
            .map_err(|e| SwitchoverError::Failed(format!("switchover CAS: {e}")))?;
        if !late.is_empty() {
            repl.metrics.switchover_dropped.inc_by(late.len() as u64);
            tracing::info!(%partition, ?late, grace_ms = repl.cfg.switchover_grace.as_millis() as u64,
                "switchover: replicas that had not acknowledged the fence's seq left the in-sync set");
        }
        // Held requests must re-run against the committed map.
        while repl.routing.map().version < version {
            match repl.meta.get_map().await {
                Ok(m) if m.version >= version => {
                    if let Err(e) = repl.routing.install(m) {
                        tracing::warn!(%e, "cannot install the map after a switchover");
                    }
                }
                _ => tokio::time::sleep(POLL).await,
            }
        }
        Ok(Epoch(epoch.0 + 1))
    }
    .await;
    repl.routing.set_fenced(partition, false);
    let paused = fenced_at.elapsed();
    if result.is_err() {
        repl.lock().rules.resume_switch_leases(partition);
    }
    let new_epoch = result?;
    tracing::info!(%partition, to = %target, epoch = %new_epoch, paused_us = paused.as_micros() as u64, "switchover");
    Ok(Switched {
        owner: target,
        epoch: new_epoch,
        paused,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyway_map::{NodeInfo, PartitionMap};

    #[test]
    fn the_switched_row_keeps_the_old_primary_in_sync_and_clears_reads_from() {
        let nodes: Vec<NodeInfo> = (1..=3)
            .map(|i| NodeInfo::up(NodeId(i), format!("127.0.0.1:{}", 7000 + i)))
            .collect();
        let mut m = PartitionMap::bootstrap_replicated(&nodes, 1, 3).unwrap();
        let pid = *m.partitions.keys().next().unwrap();
        let row = m.partitions.get_mut(&pid).unwrap();
        row.in_sync = row.replicas.clone();
        // Reads switched to the target, and to the other replica.
        for reads_from in [row.replicas[0], row.replicas[1]] {
            let mut row = m.partitions[&pid].clone();
            row.reads_from = Some(reads_from);
            let (old, target, other) = (row.owner, row.replicas[0], row.replicas[1]);
            let next = switched_row(&row, target, &[]);
            assert_eq!(next.owner, target);
            assert_eq!(next.replicas, vec![other, old]);
            assert_eq!(next.in_sync, vec![old], "the other replica drops out");
            // Unless it had acknowledged the last seq at the fence.
            let kept = switched_row(&row, target, &[other]);
            assert_eq!(kept.in_sync, vec![old, other]);
            let mut m3 = m.clone();
            m3.partitions.insert(pid, kept);
            m3.validate().unwrap();
            assert_eq!(next.reads_from, None);
            assert_eq!(next.epoch, Epoch(row.epoch.0 + 1));
            let mut m2 = m.clone();
            m2.partitions.insert(pid, next);
            m2.validate().unwrap();
        }
    }
}
