//! The map observer: polls the partition map (`keyway ctl --json map`)
//! through the run and counts the changes of owner it sees, telling a
//! failover (the manager promoted a replica) apart from the flip of a
//! migration (a record in `keyway ctl migrations` moving that partition
//! from the old owner to the new one). A poll sees the map at one version,
//! so two changes of one partition between polls count as one.
//!
//! It also times rejoins: a node restarted with its old data (`kill`,
//! `primary-kill`) is reported by its injector ([`Recoveries::restarted`]);
//! the observer measures from that restart to the first poll in which the
//! node is in the in-sync set of every partition it is a replica of
//! ([`in_sync_everywhere`]), so to within [`MAP_POLL_MS`].

use crate::faults::{CTL_TIMEOUT, Target, current_map};
use crate::permanent_loss::LossRecord;
use keyway_map::{NodeId, PartitionId, PartitionMap};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A node restarted with its old data directory, as its injector saw it.
#[derive(Clone, Debug)]
pub struct Restart {
    /// The cluster slot (`nodeI`).
    pub node: usize,
    pub id: NodeId,
    /// When the restart began (before the process was spawned).
    pub at: Instant,
    /// Whether it owned fewer partitions when it was back than when it was
    /// killed (it was failed over: it must rejoin those as a replica);
    /// `None` if either map could not be read.
    pub after_failover: Option<bool>,
}

/// One restart's time to in sync, as the observer measured it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejoin {
    pub node: usize,
    pub after_failover: Option<bool>,
    /// Restart to the first poll showing it in sync everywhere; `None` if
    /// it was killed again (or the run ended) first.
    pub in_sync_ms: Option<u64>,
}

/// What the fault injectors report for the summary and the judge: every
/// permanent loss, and restarts the observer still has to time.
#[derive(Debug, Default)]
pub struct Recoveries {
    losses: Mutex<Vec<LossRecord>>,
    restarts: Mutex<Vec<Restart>>,
}

impl Recoveries {
    pub fn lost(&self, record: LossRecord) {
        self.losses
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(record);
    }

    pub fn restarted(&self, restart: Restart) {
        self.restarts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(restart);
    }

    pub fn losses(&self) -> Vec<LossRecord> {
        self.losses
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn take_restarts(&self) -> Vec<Restart> {
        std::mem::take(&mut *self.restarts.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Whether `id` is in the in-sync set of every partition listing it as a
/// replica (vacuously true if it replicates nothing).
pub fn in_sync_everywhere(map: &PartitionMap, id: NodeId) -> bool {
    map.partitions
        .values()
        .filter(|p| p.replicas.contains(&id))
        .all(|p| p.in_sync.contains(&id))
}

/// Restarts not timed yet, by node id: a newer restart of the same node
/// ends the older one untimed.
#[derive(Debug, Default)]
struct RejoinTimer {
    pending: BTreeMap<NodeId, Restart>,
    done: Vec<Rejoin>,
}

impl RejoinTimer {
    fn add(&mut self, r: Restart) {
        if let Some(old) = self.pending.insert(r.id, r) {
            self.done.push(Rejoin {
                node: old.node,
                after_failover: old.after_failover,
                in_sync_ms: None,
            });
        }
    }

    /// Times every pending restart `map` (read at `now`) shows in sync.
    /// Without replication (every keyspace at factor 1) there is nothing
    /// to time: pending restarts are dropped.
    fn poll(&mut self, map: &PartitionMap, now: Instant) {
        if map.keyspaces.values().all(|k| k.replication_factor <= 1) {
            self.pending.clear();
            return;
        }
        let ready: Vec<NodeId> = self
            .pending
            .keys()
            .copied()
            .filter(|id| in_sync_everywhere(map, *id))
            .collect();
        for id in ready {
            let r = self.pending.remove(&id).expect("listed above");
            self.done.push(Rejoin {
                node: r.node,
                after_failover: r.after_failover,
                in_sync_ms: Some(now.saturating_duration_since(r.at).as_millis() as u64),
            });
        }
    }

    fn finish(mut self) -> Vec<Rejoin> {
        for r in std::mem::take(&mut self.pending).into_values() {
            self.done.push(Rejoin {
                node: r.node,
                after_failover: r.after_failover,
                in_sync_ms: None,
            });
        }
        self.done
    }
}

/// Pause between two polls of the map.
pub const MAP_POLL_MS: u64 = 500;

/// What the observer saw.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MapChanges {
    /// Polls that read a map.
    pub polls: u64,
    /// Owner changes of a partition between two polls (either kind).
    pub owner_changes: u64,
    /// Owner changes no migration record explains: failovers.
    pub failovers: u64,
    /// Partitions seen with fewer in-sync copies than the replication
    /// factor at some poll (catch-up after a fault), counted once each.
    pub under_replicated: u64,
    /// Restarted nodes' times to in sync.
    pub rejoins: Vec<Rejoin>,
}

/// One owner change: partition, old owner, new owner.
type Change = (PartitionId, NodeId, NodeId);

/// The owner changes from `old` to `new` (partitions in both).
fn owner_changes(old: &PartitionMap, new: &PartitionMap) -> Vec<Change> {
    new.partitions
        .values()
        .filter_map(|p| {
            let before = old.partitions.get(&p.id)?;
            (before.owner != p.owner).then_some((p.id, before.owner, p.owner))
        })
        .collect()
}

/// The owner changes no migration (`(partition, source, target)`) explains.
fn unexplained(changes: &[Change], moves: &BTreeSet<Change>) -> Vec<Change> {
    changes
        .iter()
        .filter(|c| !moves.contains(c))
        .copied()
        .collect()
}

/// `(partition, source, target)` of every migration record not aborted.
async fn migration_moves(target: &Target) -> Option<BTreeSet<Change>> {
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
            .filter(|r| r.get("state").and_then(|s| s.as_str()) != Some("ABORTED"))
            .filter_map(|r| {
                let id = r.get("partition")?.as_u64()?;
                let from = NodeId::parse(r.get("source")?.as_str()?)?;
                let to = NodeId::parse(r.get("target")?.as_str()?)?;
                Some((PartitionId(id), from, to))
            })
            .collect(),
    )
}

/// Polls until `stop`; what it saw.
pub async fn observe_map(
    target: Target,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> MapChanges {
    let mut seen = MapChanges::default();
    let mut last: Option<PartitionMap> = None;
    let mut under: BTreeSet<PartitionId> = BTreeSet::new();
    let mut rejoins = RejoinTimer::default();
    while !*stop.borrow() {
        for r in target.recoveries.take_restarts() {
            rejoins.add(r);
        }
        if let Some(map) = current_map(&target).await {
            seen.polls += 1;
            rejoins.poll(&map, Instant::now());
            let rf: BTreeMap<_, _> = map
                .keyspaces
                .iter()
                .map(|(id, k)| (*id, usize::from(k.replication_factor)))
                .collect();
            for p in map.partitions.values() {
                if p.in_sync_copies() < rf.get(&p.keyspace).copied().unwrap_or(1) {
                    under.insert(p.id);
                }
            }
            if let Some(old) = &last {
                let changes = owner_changes(old, &map);
                if !changes.is_empty() {
                    seen.owner_changes += changes.len() as u64;
                    // Without the migration records, nothing is called a failover.
                    if let Some(moves) = migration_moves(&target).await {
                        let failovers = unexplained(&changes, &moves);
                        seen.failovers += failovers.len() as u64;
                        for c in &failovers {
                            target.log.note(&format!(
                                "map: partition {} owner {} -> {} (failover)",
                                c.0, c.1, c.2
                            ));
                        }
                    }
                }
            }
            last = Some(map);
        }
        let gap = Duration::from_millis(MAP_POLL_MS);
        let _ = tokio::time::timeout(gap, stop.changed()).await;
    }
    seen.under_replicated = under.len() as u64;
    for r in target.recoveries.take_restarts() {
        rejoins.add(r);
    }
    seen.rejoins = rejoins.finish();
    seen
}

/// Waits until every partition of keyspace 0 has all its copies in sync
/// (`replication_factor` of them, the primary included); how long it took,
/// or which partitions were still short at the deadline.
pub async fn wait_in_sync(
    target: &Target,
    replication_factor: u8,
    within: Duration,
) -> Result<Duration, String> {
    let started = std::time::Instant::now();
    let want = usize::from(replication_factor);
    let mut last = String::from("the map was never read");
    loop {
        if let Some(map) = current_map(target).await {
            let short: Vec<String> = map
                .keyspace_partitions(keyway_map::DEFAULT_KEYSPACE)
                .filter(|p| p.in_sync_copies() < want)
                .map(|p| format!("{} ({} of {want} in sync)", p.id, p.in_sync_copies()))
                .collect();
            if short.is_empty() {
                return Ok(started.elapsed());
            }
            last = format!("partitions {}", short.join(", "));
        }
        if started.elapsed() >= within {
            return Err(last);
        }
        tokio::time::sleep(Duration::from_millis(MAP_POLL_MS)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyway_map::NodeInfo;

    #[test]
    fn owner_changes_are_found_per_partition() {
        let nodes: Vec<NodeInfo> = (1..=3)
            .map(|i| NodeInfo::up(NodeId(i), format!("127.0.0.1:{i}")))
            .collect();
        let old = PartitionMap::bootstrap_replicated(&nodes, 2, 2).unwrap();
        let mut new = old.clone();
        let first = *new.partitions.keys().next().unwrap();
        let p = new.partitions.get_mut(&first).unwrap();
        let was = p.owner;
        let to = p.replicas[0];
        p.owner = to;
        p.replicas = vec![was];
        p.in_sync.clear();
        let changes = owner_changes(&old, &new);
        assert_eq!(changes, vec![(first, was, to)]);
        assert!(owner_changes(&old, &old).is_empty());
        // A migration from the old owner to the new one explains it; one
        // to another node, or of another partition, does not.
        let moved: BTreeSet<Change> = [(first, was, to)].into();
        assert!(unexplained(&changes, &moved).is_empty());
        let other: BTreeSet<Change> =
            [(first, was, NodeId(99)), (PartitionId(999), was, to)].into();
        assert_eq!(unexplained(&changes, &other), changes);
    }

    #[test]
    fn a_restart_is_timed_once_the_node_is_in_sync_wherever_it_replicates() {
        let nodes: Vec<NodeInfo> = (1..=3)
            .map(|i| NodeInfo::up(NodeId(i), format!("127.0.0.1:{i}")))
            .collect();
        let mut map = PartitionMap::bootstrap_replicated(&nodes, 2, 2).unwrap();
        let id = NodeId(2);
        assert!(map.partitions.values().any(|p| p.replicas.contains(&id)));
        // Every replica out of sync (a primary's restart rule, say).
        for p in map.partitions.values_mut() {
            p.in_sync.clear();
        }
        assert!(!in_sync_everywhere(&map, id));
        assert!(in_sync_everywhere(&map, NodeId(99)), "replicates nothing");
        let t0 = Instant::now();
        let mut timer = RejoinTimer::default();
        let restart = |node, at| Restart {
            node,
            id,
            at,
            after_failover: Some(true),
        };
        timer.add(restart(1, t0));
        timer.poll(&map, t0 + Duration::from_millis(100));
        assert!(timer.done.is_empty(), "not in sync yet");
        // A second restart of the same node ends the first one untimed.
        let t1 = t0 + Duration::from_millis(200);
        timer.add(restart(1, t1));
        assert_eq!(timer.done[0].in_sync_ms, None);
        for p in map.partitions.values_mut() {
            p.in_sync = p.replicas.clone();
        }
        timer.poll(&map, t1 + Duration::from_millis(700));
        assert_eq!(timer.done[1].in_sync_ms, Some(700));
        assert!(timer.pending.is_empty());
        // One partition dropping it again is not in sync everywhere.
        let first = map
            .partitions
            .values_mut()
            .find(|p| p.replicas.contains(&id))
            .unwrap();
        first.in_sync.retain(|r| *r != id);
        assert!(!in_sync_everywhere(&map, id));
        timer.add(restart(1, t1));
        let done = timer.finish();
        assert_eq!(done.len(), 3);
        assert_eq!(done[2].in_sync_ms, None, "never in sync before the end");
    }
}
