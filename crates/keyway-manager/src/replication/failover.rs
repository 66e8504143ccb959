//! The failover decision (pure: the map, the live leases and the time in;
//! the compare-and-sets to make and the reasons for not making others out).
//!
//! When the owner X of partition p has had no lease in the store for
//! `failover_margin_ms` ([`FencingGate`]: X's own deadline has certainly
//! passed, invariant 4), p gets a new primary R chosen among its **in-sync**
//! replicas that hold a lease (invariant 10: never an unclean election),
//! preferring one that is not draining, then the one owning the fewest
//! partitions (counting the promotions of the same round), then the lowest id. The CAS is conditional on
//! `(X, e)` and writes: owner = R, replicas = replicas − R + X (X stays
//! listed, out of sync, so it rejoins by re-copy when it returns), in_sync =
//! [] (the other in-sync replicas may be behind or ahead of R: they re-sync
//! from R), epoch e + 1.
//!
//! Each round re-plans from a freshly read map, so a row that changed under
//! a planned CAS (its condition fails) is simply planned again from its new
//! state the next round.

use crate::fencing::{FencingGate, Verdict};
use keyway_map::{Epoch, NodeId, PartitionId, PartitionMap, PartitionRecord};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// One planned promotion: the CAS and what it is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Promotion {
    pub partition: PartitionId,
    /// The condition: the old primary and the epoch it owned p at.
    pub expected: (NodeId, Epoch),
    /// The row the CAS writes (owner R, epoch + 1, in_sync empty).
    pub row: PartitionRecord,
    /// When this manager first saw the old primary's lease gone (the start
    /// of the failover-duration measure).
    pub lease_gone_since: Instant,
}

impl Promotion {
    pub fn from(&self) -> NodeId {
        self.expected.0
    }

    pub fn to(&self) -> NodeId {
        self.row.owner
    }
}

/// Why a partition whose primary lost its lease was not failed over (yet).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiting {
    pub partition: PartitionId,
    pub owner: NodeId,
    /// `within_margin`, `no_in_sync_replica_alive`, `unreplicated`.
    pub reason: &'static str,
    pub detail: String,
}

/// What one round decided.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FailoverPlan {
    /// At most one per partition.
    pub promotions: Vec<Promotion>,
    pub waiting: Vec<Waiting>,
}

/// The leader's failover state: when each node's lease was first seen gone
/// (memory only: a new leader waits a whole margin again, never less).
#[derive(Debug)]
pub struct Failover {
    gate: FencingGate,
    margin: Duration,
}

impl Failover {
    pub fn new(margin: Duration) -> Self {
        Failover {
            gate: FencingGate::new(margin),
            margin,
        }
    }

    /// Decides from `map` and the nodes holding a lease in the store, at `now`.
    pub fn plan(
        &mut self,
        map: &PartitionMap,
        live: &BTreeSet<NodeId>,
        now: Instant,
    ) -> FailoverPlan {
        let live_list: Vec<NodeId> = live.iter().copied().collect();
        let mut verdicts: BTreeMap<NodeId, Verdict> = BTreeMap::new();
        for id in map.nodes.keys() {
            verdicts.insert(*id, self.gate.check(*id, &live_list, now));
        }
        // Primaries per node, updated as promotions are planned.
        let mut primaries: BTreeMap<NodeId, usize> = BTreeMap::new();
        for p in map.partitions.values() {
            *primaries.entry(p.owner).or_default() += 1;
        }
        let mut out = FailoverPlan::default();
        for p in map.partitions.values() {
            let verdict = verdicts
                .get(&p.owner)
                .copied()
                .unwrap_or_else(|| self.gate.check(p.owner, &live_list, now));
            let wait = |reason, detail: String| Waiting {
                partition: p.id,
                owner: p.owner,
                reason,
                detail,
            };
            match verdict {
                Verdict::LeaseLive => continue,
                Verdict::Wait(left) => {
                    out.waiting.push(wait(
                        "within_margin",
                        format!(
                            "waiting: node {}'s lease is gone; failover in {} ms (failover_margin_ms {})",
                            p.owner,
                            left.as_millis(),
                            self.margin.as_millis()
                        ),
                    ));
                    continue;
                }
                Verdict::Fenced => {}
            }
            if p.replicas.is_empty() {
                out.waiting.push(wait(
                    "unreplicated",
                    format!(
                        "waiting: node {} is gone and holds the only copy (replication factor 1)",
                        p.owner
                    ),
                ));
                continue;
            }
            let Some(to) = choose(map, p, live, &primaries) else {
                out.waiting.push(wait(
                    "no_in_sync_replica_alive",
                    format!(
                        "waiting: no in-sync replica alive (node {} is gone; in_sync {:?}, replicas {:?}, live {:?}); \
                         only an in-sync replica may be promoted",
                        p.owner,
                        ids(&p.in_sync),
                        ids(&p.replicas),
                        p.replicas.iter().filter(|r| live.contains(r)).map(|r| r.0).collect::<Vec<_>>()
                    ),
                ));
                continue;
            };
            *primaries.entry(to).or_default() += 1;
            if let Some(n) = primaries.get_mut(&p.owner) {
                *n = n.saturating_sub(1);
            }
            let row = promoted(p, to);
            out.promotions.push(Promotion {
                partition: p.id,
                expected: (p.owner, p.epoch),
                row,
                lease_gone_since: self.gate.gone_since(p.owner).unwrap_or(now),
            });
        }
        out
    }
}

fn ids(nodes: &[NodeId]) -> Vec<u64> {
    nodes.iter().map(|n| n.0).collect()
}

/// The in-sync replica of `p` to promote: holds a lease; not draining
/// (unless all are), then fewest primaries, then lowest id. `None` if no
/// in-sync replica is alive.
fn choose(
    map: &PartitionMap,
    p: &PartitionRecord,
    live: &BTreeSet<NodeId>,
    primaries: &BTreeMap<NodeId, usize>,
) -> Option<NodeId> {
    p.in_sync
        .iter()
        .copied()
        .filter(|r| p.replicas.contains(r) && live.contains(r))
        .min_by_key(|r| {
            let draining = map.nodes.get(r).is_some_and(|n| n.draining);
            (draining, primaries.get(r).copied().unwrap_or(0), *r)
        })
}

/// `p` with `to` (an in-sync replica) as its primary: the old owner listed
/// as an out-of-sync replica, nobody in sync, no `reads_from`, epoch + 1.
pub fn promoted(p: &PartitionRecord, to: NodeId) -> PartitionRecord {
    assert!(
        p.is_in_sync_replica(to) && p.replicas.contains(&to),
        "partition {}: only an in-sync replica may be promoted, not node {to}",
        p.id
    );
    let mut row = p.clone();
    row.owner = to;
    row.replicas = p
        .replicas
        .iter()
        .copied()
        .filter(|r| *r != to)
        .chain(std::iter::once(p.owner))
        .collect();
    row.in_sync = Vec::new();
    // Reads follow the in-sync set (and the owner changes): interface 1.
    row.reads_from = None;
    row.epoch = Epoch(p.epoch.0 + 1);
    debug_assert!(!row.replicas.contains(&row.owner));
    row
}
