//! The in-sync observer: follows the map watch and records every change of
//! a partition's in-sync set it sees (old row against new row) as a decision
//! of duty `replication`, with the reason it infers from the rows (the map
//! does not say who changed it or why; the primary's own reasons are in its
//! `keyway_replication_in_sync_changes{reason}`):
//! - `owner_changed`: a failover, a switchover or a migration's flip (the
//!   new primary starts with an empty in-sync set);
//! - `dropped`: replicas left the set under the same primary (lag timeout,
//!   a primary restart, or a membership removal);
//! - `added`: replicas joined it (caught up);
//! - `dropped_and_added`: both in one change.
//!
//! It runs whether or not this manager leads (it only observes), and
//! re-watches from its last version after a watch error.

use crate::decisions::{Decision, DecisionLog};
use keyway_map::{MapVersion, NodeId, PartitionId, PartitionMap, PartitionRecord};
use keyway_meta::MetaStore;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Wait before re-watching after the store failed.
const REWATCH_BACKOFF: Duration = Duration::from_millis(500);

/// One observed change of a partition's in-sync set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InSyncChange {
    pub partition: PartitionId,
    pub reason: &'static str,
    pub dropped: Vec<NodeId>,
    pub added: Vec<NodeId>,
    pub detail: String,
}

/// The in-sync change from `old` to `new` (the same partition), if any.
pub fn diff(old: &PartitionRecord, new: &PartitionRecord) -> Option<InSyncChange> {
    if old.in_sync == new.in_sync && old.owner == new.owner {
        return None;
    }
    let dropped: Vec<NodeId> = old
        .in_sync
        .iter()
        .copied()
        .filter(|n| !new.in_sync.contains(n))
        .collect();
    let added: Vec<NodeId> = new
        .in_sync
        .iter()
        .copied()
        .filter(|n| !old.in_sync.contains(n))
        .collect();
    let reason = if old.owner != new.owner {
        "owner_changed"
    } else {
        match (dropped.is_empty(), added.is_empty()) {
            (true, true) => return None,
            (false, true) => "dropped",
            (true, false) => "added",
            (false, false) => "dropped_and_added",
        }
    };
    if reason == "owner_changed" && old.in_sync.is_empty() && new.in_sync.is_empty() {
        return None;
    }
    let list = |v: &[NodeId]| v.iter().map(|n| n.0).collect::<Vec<_>>();
    let detail = format!(
        "epoch {} -> {}: owner {} -> {}, in_sync {:?} -> {:?}, replicas {:?} -> {:?}",
        old.epoch,
        new.epoch,
        old.owner,
        new.owner,
        list(&old.in_sync),
        list(&new.in_sync),
        list(&old.replicas),
        list(&new.replicas)
    );
    Some(InSyncChange {
        partition: new.id,
        reason,
        dropped,
        added,
        detail,
    })
}

/// Every in-sync change between two versions of the map (partitions in both).
pub fn diff_maps(old: &PartitionMap, new: &PartitionMap) -> Vec<InSyncChange> {
    new.partitions
        .values()
        .filter_map(|n| old.partitions.get(&n.id).and_then(|o| diff(o, n)))
        .collect()
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InSyncLabel {
    pub reason: &'static str,
}

/// Follows the map until `stop`; see the module docs.
pub async fn run(
    meta: Arc<dyn MetaStore>,
    decisions: DecisionLog,
    seen: Family<InSyncLabel, Counter>,
    mut stop: watch::Receiver<bool>,
) {
    let mut map: Option<PartitionMap> = None;
    while !*stop.borrow_and_update() {
        let since = map.as_ref().map_or(MapVersion(0), |m| m.version);
        if map.is_none() {
            match meta.get_map().await {
                Ok(m) => map = Some(m),
                Err(err) => {
                    tracing::debug!(%err, "in-sync observer: cannot read the map");
                    if backoff(&mut stop).await {
                        return;
                    }
                    continue;
                }
            }
            continue;
        }
        let mut stream = match meta.watch(since).await {
            Ok(s) => s,
            Err(err) => {
                tracing::debug!(%err, "in-sync observer: cannot watch the map");
                if backoff(&mut stop).await {
                    return;
                }
                continue;
            }
        };
        loop {
            let item = tokio::select! {
                item = futures::StreamExt::next(&mut stream) => item,
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() { return }
                    continue;
                }
            };
            let update = match item {
                Some(Ok(u)) => u,
                Some(Err(err)) => {
                    tracing::debug!(%err, "in-sync observer: watch ended");
                    break;
                }
                None => break,
            };
            let old = map.as_ref().expect("read before watching");
            let mut next = old.clone();
            if let Err(err) = update.apply_to(&mut next) {
                tracing::debug!(%err, "in-sync observer: re-reading the whole map");
                map = None;
                break;
            }
            for c in diff_maps(old, &next) {
                seen.get_or_create(&InSyncLabel { reason: c.reason }).inc();
                decisions.record(Decision::now(
                    super::DUTY,
                    "in_sync_change",
                    c.reason,
                    Some(c.partition),
                    false,
                    c.detail,
                ));
            }
            map = Some(next);
        }
        if backoff(&mut stop).await {
            return;
        }
    }
}

/// Sleeps [`REWATCH_BACKOFF`]; true if told to stop meanwhile.
async fn backoff(stop: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        () = tokio::time::sleep(REWATCH_BACKOFF) => false,
        changed = stop.changed() => changed.is_err() || *stop.borrow(),
    }
}
