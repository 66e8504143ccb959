//! The `permanent-loss` fault ([`lose_node`]): a node is gone for good.
//!
//! 0. It waits (at most `RunConfig::recovery_timeout_ms`) until losing
//!    node `i` is survivable at replication factor 2 with one failure
//!    ([`safe_to_lose`]): every partition it is the primary of has another
//!    in-sync copy, and no live migration targets it. Right after a
//!    restart, say, a primary has emptied its in-sync sets (the restart
//!    rule) and holds the only current copy: losing its disk then is a
//!    second failure, which loses acknowledged writes at `--min-in-sync 1`
//!    by design. Never safe within the bound: the loss is skipped (and
//!    reported), not injected.
//! 1. `kill -9` of node `i` and deletion of its data directory.
//! 2. It stays down while the map is polled: first its primaries fail
//!    over, then, once the leading manager has seen its lease gone for
//!    `--rebalance-down-grace-ms` (the harness passes
//!    `RunConfig::down_grace_ms`), its replicas are replaced on the
//!    survivors. The wait ends when no partition lists the node and every
//!    partition has its replication factor of in-sync copies
//!    ([`replicated_without`]), or after `RunConfig::recovery_timeout_ms`.
//! 3. `keyway ctl decommission --force` of the lost id (retried until the
//!    same bound: a migration the churn started towards the node before it
//!    was known down refuses it until the manager aborts that migration),
//!    then a new empty node in slot `i` (`Cluster::replace_node`: new
//!    addresses, the slot's network namespace, an empty data directory, so
//!    the store gives it a new id), so later faults still have `--nodes`
//!    nodes. New addresses matter: a node on the lost one's address would
//!    receive what is still addressed to the lost id (a migration push to
//!    it, say).
//!
//! What it saw is a [`LossRecord`] (kill to failover, kill to full
//! replication); `judge::judge_recoveries` fails a run whose loss was not
//! re-replicated within the bound.

use crate::NemesisError;
use crate::faults::{CTL_TIMEOUT, Target, current_map};
use keyway_map::{NodeId, PartitionMap};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// Pause between two looks at the map while waiting for re-replication.
const LOSS_POLL_MS: u64 = 250;

/// One permanent loss, as the fault saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LossRecord {
    /// The cluster slot (`nodeI`).
    pub node: usize,
    /// Why it was not injected (never [`safe_to_lose`] within the bound).
    pub skipped: Option<String>,
    /// Waited for [`safe_to_lose`] before the kill.
    pub waited_ms: u64,
    /// The id lost with the data directory (`None`: it had none on disk yet).
    pub lost: Option<NodeId>,
    /// The new node's id (`None`: it was not started or wrote none).
    pub replacement: Option<NodeId>,
    /// Partitions it was the primary of just before the kill (`None`: the
    /// map could not be read).
    pub owned_at_kill: Option<usize>,
    /// Kill to the first map in which the lost node owns nothing (`None`
    /// also when it owned nothing to fail over).
    pub failover_ms: Option<u64>,
    /// Kill to the first map with every partition at its replication
    /// factor of in-sync copies and none on the lost node.
    pub replicated_ms: Option<u64>,
    /// What was still short when the wait gave up.
    pub short: Option<String>,
    /// `keyway ctl decommission --force` succeeded.
    pub decommissioned: bool,
}

/// `Ok` if losing `node` for good loses no acknowledged write with one
/// failure: every partition it is the primary of has an in-sync replica
/// (on another node), and no live migration (`migration_targets`: targets
/// of records neither DONE nor ABORTED) would make it a primary with an
/// empty in-sync set by its flip; else why not.
pub fn safe_to_lose(
    map: &PartitionMap,
    node: NodeId,
    migration_targets: &BTreeSet<NodeId>,
) -> Result<(), String> {
    if migration_targets.contains(&node) {
        return Err("a live migration targets it".to_string());
    }
    let alone: Vec<String> = map
        .owned_by(node)
        .filter(|p| p.in_sync.iter().all(|r| *r == node))
        .map(|p| p.id.to_string())
        .collect();
    if alone.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "it is the only in-sync copy of partitions {}",
            alone.join(", ")
        ))
    }
}

/// Targets of the migration records neither DONE nor ABORTED, per `keyway
/// ctl --json migrations` (`None` if it cannot be read).
async fn live_migration_targets(target: &Target) -> Option<BTreeSet<NodeId>> {
    let out = crate::cluster::ctl(
        &target.bin,
        &target.meta_url,
        &target.secret_file,
        &["--json", "migrations"],
        CTL_TIMEOUT,
    )
    .await
    .ok()?;
    let rows: Vec<serde_json::Value> = serde_json::from_str(&out).ok()?;
    Some(
        rows.iter()
            .filter(|r| {
                !matches!(
                    r.get("state").and_then(|s| s.as_str()),
                    Some("DONE" | "ABORTED")
                )
            })
            .filter_map(|r| NodeId::parse(r.get("target")?.as_str()?))
            .collect(),
    )
}

/// Waits until [`safe_to_lose`] holds for `lost`, at most `within`; `Err`
/// with the last reason if it never did.
async fn wait_safe_to_lose(target: &Target, lost: NodeId, within: Duration) -> Result<(), String> {
    let started = Instant::now();
    let mut last = "the map was never read".to_string();
    loop {
        if let (Some(map), Some(moving)) = (
            current_map(target).await,
            live_migration_targets(target).await,
        ) {
            match safe_to_lose(&map, lost, &moving) {
                Ok(()) => return Ok(()),
                Err(why) => last = why,
            }
        }
        if started.elapsed() >= within {
            return Err(last);
        }
        tokio::time::sleep(Duration::from_millis(LOSS_POLL_MS)).await;
    }
}

/// `Ok` once no partition has a copy on `lost` and every partition has its
/// keyspace's replication factor of in-sync copies (the primary included);
/// else what is still short.
pub fn replicated_without(map: &PartitionMap, lost: NodeId) -> Result<(), String> {
    let mut short = Vec::new();
    for p in map.partitions.values() {
        let rf = map
            .keyspaces
            .get(&p.keyspace)
            .map_or(1, |k| usize::from(k.replication_factor));
        if p.has_copy(lost) {
            short.push(format!("{} still lists node id {}", p.id, lost.0));
        } else if p.in_sync_copies() < rf {
            short.push(format!("{} ({} of {rf} in sync)", p.id, p.in_sync_copies()));
        }
    }
    if short.is_empty() {
        Ok(())
    } else {
        short.truncate(8);
        Err(short.join(", "))
    }
}

/// Kills node `node`, wipes it, waits for re-replication (bounded by the
/// target's `recovery_timeout`), decommissions it and starts a new empty
/// node in its slot. `Err` only when the cluster could not be driven (a
/// process that would not start); a re-replication that did not come is
/// the record's `replicated_ms: None`.
pub async fn lose_node(target: &Target, node: usize) -> Result<LossRecord, NemesisError> {
    let lost = target.blocking(move |c| Ok(c.node_id(node))).await?;
    let who = lost.map_or("no id yet".to_string(), |id| format!("id {}", id.0));
    let mut record = LossRecord {
        node,
        skipped: None,
        waited_ms: 0,
        lost,
        replacement: None,
        owned_at_kill: None,
        failover_ms: None,
        replicated_ms: None,
        short: None,
        decommissioned: false,
    };
    if let Some(id) = lost {
        let waiting = Instant::now();
        let safe = wait_safe_to_lose(target, id, target.recovery_timeout).await;
        record.waited_ms = waiting.elapsed().as_millis() as u64;
        if let Err(why) = safe {
            target.log.note(&format!(
                "permanent loss of node{node} ({who}) skipped: not survivable within {:?}: {why}",
                target.recovery_timeout
            ));
            record.skipped = Some(why);
            return Ok(record);
        }
        record.owned_at_kill = current_map(target).await.map(|m| m.owned_by(id).count());
    }
    let owned_at_kill = record.owned_at_kill;
    target.log.note(&format!(
        "kill -9 node{node} ({who}) and delete its data directory (permanent loss; waited {} ms until survivable)",
        record.waited_ms
    ));
    let t0 = Instant::now();
    target.blocking(move |c| c.wipe_node(node)).await?;
    let ms = |t: Instant| t.duration_since(t0).as_millis() as u64;
    if let Some(lost) = lost {
        let mut last = "the map was never read".to_string();
        loop {
            if let Some(map) = current_map(target).await {
                if record.failover_ms.is_none()
                    && owned_at_kill != Some(0)
                    && map.owned_by(lost).count() == 0
                {
                    record.failover_ms = Some(ms(Instant::now()));
                    target
                        .log
                        .note(&format!("map: node{node} (id {}) owns nothing", lost.0));
                }
                match replicated_without(&map, lost) {
                    Ok(()) => {
                        record.replicated_ms = Some(ms(Instant::now()));
                        break;
                    }
                    Err(why) => last = why,
                }
            }
            if t0.elapsed() >= target.recovery_timeout {
                record.short = Some(last.clone());
                break;
            }
            tokio::time::sleep(Duration::from_millis(LOSS_POLL_MS)).await;
        }
        match record.replicated_ms {
            Some(took) => target.log.note(&format!(
                "every partition at its replication factor without node{node} (id {}) {took} ms after the kill",
                lost.0
            )),
            None => target.log.note(&format!(
                "node{node} (id {}) not re-replicated within {:?}: {last}",
                lost.0, target.recovery_timeout
            )),
        }
        if record.replicated_ms.is_some() {
            record.decommissioned = decommission(target, lost, t0).await;
        }
    }
    target.blocking(move |c| c.replace_node(node)).await?;
    record.replacement = target.blocking(move |c| Ok(c.node_id(node))).await?;
    target.log.note(&format!(
        "node{node} replaced by a new empty node ({})",
        record
            .replacement
            .map_or("id unknown".to_string(), |id| format!("id {}", id.0))
    ));
    Ok(record)
}

/// `keyway ctl decommission --force LOST`, retried until the recovery
/// bound (counted from the kill at `t0`) has passed.
async fn decommission(target: &Target, lost: NodeId, t0: Instant) -> bool {
    let id = lost.to_string();
    let last = loop {
        match crate::cluster::ctl(
            &target.bin,
            &target.meta_url,
            &target.secret_file,
            &["decommission", "--force", &id],
            CTL_TIMEOUT,
        )
        .await
        {
            Ok(_) => {
                target
                    .log
                    .note(&format!("decommissioned node id {} (--force)", lost.0));
                return true;
            }
            Err(why) if t0.elapsed() >= target.recovery_timeout => break why,
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(LOSS_POLL_MS)).await;
    };
    target.log.note(&format!(
        "decommission --force of node id {} failed: {last}",
        lost.0
    ));
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyway_map::NodeInfo;

    #[test]
    fn replicated_means_nothing_on_the_lost_node_and_every_copy_in_sync() {
        let nodes: Vec<NodeInfo> = (1..=3)
            .map(|i| NodeInfo::up(NodeId(i), format!("127.0.0.1:{i}")))
            .collect();
        let mut map = PartitionMap::bootstrap_replicated(&nodes, 2, 2).unwrap();
        let lost = NodeId(3);
        // Bootstrap: node 3 holds copies.
        let why = replicated_without(&map, lost).unwrap_err();
        assert!(why.contains("still lists"), "{why}");
        // Move every copy off node 3 (out of sync first, then in sync).
        for p in map.partitions.values_mut() {
            let others: Vec<NodeId> = [1, 2].map(NodeId).to_vec();
            if p.owner == lost {
                p.owner = others[0];
            }
            p.replicas = others.iter().copied().filter(|n| *n != p.owner).collect();
            p.in_sync.clear();
        }
        let why = replicated_without(&map, lost).unwrap_err();
        assert!(why.contains("1 of 2 in sync"), "{why}");
        for p in map.partitions.values_mut() {
            p.in_sync = p.replicas.clone();
        }
        assert_eq!(replicated_without(&map, lost), Ok(()));
        // One row still naming node 3 as an (in-sync) replica is not done.
        let first = *map.partitions.keys().next().unwrap();
        let p = map.partitions.get_mut(&first).unwrap();
        p.replicas.push(lost);
        p.in_sync.push(lost);
        assert!(
            replicated_without(&map, lost)
                .unwrap_err()
                .contains("still lists")
        );
    }

    #[test]
    fn a_node_is_safe_to_lose_only_if_everything_it_owns_has_another_in_sync_copy() {
        let nodes: Vec<NodeInfo> = (1..=3)
            .map(|i| NodeInfo::up(NodeId(i), format!("127.0.0.1:{i}")))
            .collect();
        let mut map = PartitionMap::bootstrap_replicated(&nodes, 2, 2).unwrap();
        let node = NodeId(1);
        let none = BTreeSet::new();
        for p in map.partitions.values_mut() {
            p.in_sync = p.replicas.clone();
        }
        assert_eq!(safe_to_lose(&map, node, &none), Ok(()));
        let why = safe_to_lose(&map, node, &[node].into()).unwrap_err();
        assert!(why.contains("migration"), "{why}");
        assert_eq!(safe_to_lose(&map, node, &[NodeId(2)].into()), Ok(()));
        // Its primaries' in-sync sets emptied (a restart): not survivable.
        let owned = map.owned_by(node).next().unwrap().id;
        map.partitions.get_mut(&owned).unwrap().in_sync.clear();
        let why = safe_to_lose(&map, node, &none).unwrap_err();
        assert!(why.contains(&owned.to_string()), "{why}");
        // A partition it only replicates, out of sync, is no obstacle.
        let replicas = map.partitions[&owned].replicas.clone();
        map.partitions.get_mut(&owned).unwrap().in_sync = replicas;
        let replicated = map
            .partitions
            .values()
            .find(|p| p.replicas.contains(&node))
            .unwrap()
            .id;
        map.partitions.get_mut(&replicated).unwrap().in_sync.clear();
        assert_eq!(safe_to_lose(&map, node, &none), Ok(()));
    }
}
