//! The membership reconciler's decision (pure: the map, the live leases and
//! the partitions in migration in; one compare-and-set per partition out).
//!
//! It keeps `1 + replicas.len() == replication_factor` for every partition,
//! the factor capped at the number of registered nodes:
//! - **too few copies**: add replicas on nodes that are Up, hold a lease,
//!   are not draining and have no copy of p: a node whose zone no copy of p
//!   has yet first, then the fewest copies over the whole map (counting the
//!   additions of the same round), then the lowest id. A new replica is not
//!   in sync: the primary copies it and grows the in-sync set itself.
//! - **too many copies** (the factor was lowered): remove replicas,
//!   out-of-sync ones first, then the ones on nodes with the most copies,
//!   then the highest id.
//! - **replicas on draining nodes** do not count towards the factor: a
//!   replacement is added elsewhere, and the draining replica is removed
//!   only once every staying copy is in sync (the replacement caught up),
//!   so the partition never has fewer in-sync copies for the drain.
//!
//! A replica on a node that is merely Down still counts as a copy: it is
//! never replaced within the grace (invariant 12, no move on suspicion).
//! **Re-replication** (issue 13): a replica on a node in [`Recovery::dead`]
//! (lease gone past `rebalance_down_grace_ms`) is treated like one on a
//! draining node: a replacement is added, and the dead replica is removed
//! only once every staying copy is in sync. The dead node stays listed
//! until then even when it was out of sync: an out-of-sync replica gates no
//! acknowledgement, so keeping it costs nothing, and one rule for both
//! cases means the row never shows fewer copies than it has. The
//! partitions with the fewest staying in-sync copies are planned first, and
//! a replacement for a dead replica is only placed on a node with fewer
//! than `max_copies_per_node` copies in flight (replicas not yet in sync
//! of partitions whose primary holds a lease, this round's additions
//! included) while fewer than `max_copies` are in
//! flight in total; a partition over a cap waits (`recovery_throttled`).
//! Partitions whose primary holds no lease (the
//! failover's business) or that are in a live migration (its flip writes the
//! row it read at creation, so a membership change would abort it) are left
//! alone this round, with the reason; so are partitions with a live replica
//! move (`moves.rs`: it holds one copy more than the factor on purpose until
//! its target is in sync).

use crate::fencing::{FencingGate, Verdict};
use keyway_map::{Epoch, NodeId, NodeState, PartitionId, PartitionMap, PartitionRecord};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// One planned membership change: the CAS and what it changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MembershipChange {
    pub partition: PartitionId,
    /// The condition: the row's (owner, epoch) as planned from.
    pub expected: (NodeId, Epoch),
    /// The row the CAS writes (epoch + 1).
    pub row: PartitionRecord,
    pub added: Vec<NodeId>,
    pub removed: Vec<NodeId>,
    /// `under_replicated`, `over_replicated`, `replica_node_dead` (a
    /// replacement for a replica on a node down past the grace) or
    /// `dead_replica_replaced` (that replica removed, the replacement in sync).
    pub reason: &'static str,
}

/// A partition whose copy count is off but which is left alone this round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    pub partition: PartitionId,
    /// `primary_gone`, `migration_in_flight`, `replica_move_in_flight`,
    /// `no_eligible_node`, `waiting_for_catch_up`, `recovery_throttled`.
    pub reason: &'static str,
    pub detail: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MembershipPlan {
    pub changes: Vec<MembershipChange>,
    pub skipped: Vec<Skipped>,
}

/// The copies `p` should have: its keyspace's factor, capped at `nodes`.
pub fn wanted_copies(map: &PartitionMap, p: &PartitionRecord) -> usize {
    let rf = map
        .keyspaces
        .get(&p.keyspace)
        .map_or(1, |k| k.replication_factor.max(1)) as usize;
    rf.min(map.nodes.len().max(1))
}

/// The re-replication inputs: the nodes down past the grace and the caps
/// on copies in flight.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recovery {
    /// Nodes whose lease has been gone longer than the down grace.
    pub dead: BTreeSet<NodeId>,
    /// Copies in flight (replicas not yet in sync) a node may be the target
    /// of before it gets no further replacement replica.
    pub max_copies_per_node: usize,
    /// Copies in flight over the whole map before no further replacement
    /// replica is added.
    pub max_copies: usize,
}

impl Recovery {
    /// No node is dead: nothing is re-replicated.
    pub fn none() -> Self {
        Recovery {
            dead: BTreeSet::new(),
            max_copies_per_node: usize::MAX,
            max_copies: usize::MAX,
        }
    }
}

/// The registered nodes whose lease `gate` (margin: the down grace) has
/// seen gone for the whole grace at `now`: the dead ones. A node within the
/// grace is never dead (invariant 12, no move on suspicion).
pub fn dead_nodes(
    gate: &mut FencingGate,
    map: &PartitionMap,
    live: &BTreeSet<NodeId>,
    now: Instant,
) -> BTreeSet<NodeId> {
    let live: Vec<NodeId> = live.iter().copied().collect();
    map.nodes
        .keys()
        .copied()
        .filter(|n| gate.check(*n, &live, now) == Verdict::Fenced)
        .collect()
}

/// The nodes to decommission automatically: no lease for `after` (by the
/// grace clock of `gate`, which [`dead_nodes`] keeps), owning nothing and
/// holding no replica.
pub fn auto_decommissions(
    gate: &FencingGate,
    map: &PartitionMap,
    live: &BTreeSet<NodeId>,
    after: Duration,
    now: Instant,
) -> Vec<NodeId> {
    map.nodes
        .keys()
        .copied()
        .filter(|n| !live.contains(n))
        .filter(|n| {
            gate.gone_since(*n)
                .is_some_and(|t| now.saturating_duration_since(t) >= after)
        })
        .filter(|n| !map.partitions.values().any(|p| p.has_copy(*n)))
        .collect()
}

/// Plans this round's changes; see the module docs.
pub fn plan(
    map: &PartitionMap,
    live: &BTreeSet<NodeId>,
    migrating: &BTreeSet<PartitionId>,
) -> MembershipPlan {
    plan_with(map, live, migrating, &BTreeSet::new())
}

/// [`plan`], also leaving alone the partitions in `replica_moving` (a live
/// replica move: its extra copy is intended, see `moves.rs`).
pub fn plan_with(
    map: &PartitionMap,
    live: &BTreeSet<NodeId>,
    migrating: &BTreeSet<PartitionId>,
    replica_moving: &BTreeSet<PartitionId>,
) -> MembershipPlan {
    plan_recovering(map, live, migrating, replica_moving, &Recovery::none())
}

/// [`plan_with`], also replacing the replicas on `recovery.dead` nodes.
pub fn plan_recovering(
    map: &PartitionMap,
    live: &BTreeSet<NodeId>,
    migrating: &BTreeSet<PartitionId>,
    replica_moving: &BTreeSet<PartitionId>,
    recovery: &Recovery,
) -> MembershipPlan {
    let dead = |n: &NodeId| recovery.dead.contains(n);
    let mut copies: BTreeMap<NodeId, usize> = map.nodes.keys().map(|n| (*n, 0)).collect();
    for p in map.partitions.values() {
        for n in p.copies() {
            *copies.entry(n).or_default() += 1;
        }
    }
    // Copies in flight: replicas on a node not dead that are not in sync,
    // of a partition whose primary holds a lease. One whose primary is
    // gone copies nothing (the failover's business, or offline for good):
    // counted, the out-of-sync replicas of a lost node's offline
    // partitions held their nodes' recovery slots for good, and every
    // other partition needing those nodes waited `recovery_throttled`
    // forever (`copy_cost`'s catch-up, once, under the suite's load).
    let mut in_flight: BTreeMap<NodeId, usize> = BTreeMap::new();
    for p in map.partitions.values().filter(|p| live.contains(&p.owner)) {
        for r in p
            .replicas
            .iter()
            .filter(|r| !dead(r) && !p.in_sync.contains(r))
        {
            *in_flight.entry(*r).or_default() += 1;
        }
    }
    let mut in_flight_total: usize = in_flight.values().sum();
    let leaving = |n: &NodeId| dead(n) || map.nodes.get(n).is_some_and(|n| n.draining);
    // The partitions with the fewest staying in-sync copies first.
    let mut order: Vec<&PartitionRecord> = map.partitions.values().collect();
    order.sort_by_key(|p| (1 + p.in_sync.iter().filter(|r| !leaving(r)).count(), p.id));
    let mut out = MembershipPlan::default();
    for p in order {
        let wanted = wanted_copies(map, p);
        let have = 1 + p.replicas.len();
        let staying = 1 + p.replicas.iter().filter(|r| !leaving(r)).count();
        if have == wanted && staying == wanted {
            continue;
        }
        let skip = |reason, detail: String| Skipped {
            partition: p.id,
            reason,
            detail,
        };
        if !live.contains(&p.owner) {
            out.skipped.push(skip(
                "primary_gone",
                format!(
                    "{have} of {wanted} copies, but primary node {} holds no lease (failover first)",
                    p.owner
                ),
            ));
            continue;
        }
        if migrating.contains(&p.id) {
            out.skipped.push(skip(
                "migration_in_flight",
                format!("{have} of {wanted} copies; waiting for its migration to end"),
            ));
            continue;
        }
        if replica_moving.contains(&p.id) {
            out.skipped.push(skip(
                "replica_move_in_flight",
                format!("{have} of {wanted} copies; waiting for its replica move to end"),
            ));
            continue;
        }
        let mut row = p.clone();
        let (mut added, mut removed) = (Vec::new(), Vec::new());
        let staying_of =
            |row: &PartitionRecord| 1 + row.replicas.iter().filter(|r| !leaving(r)).count();
        let recovering = p.replicas.iter().any(dead);
        if staying < wanted {
            let mut throttled = false;
            while staying_of(&row) < wanted {
                if recovering && in_flight_total >= recovery.max_copies {
                    throttled = true;
                    break;
                }
                let under_cap = |n: NodeId| {
                    !recovering
                        || in_flight.get(&n).copied().unwrap_or(0) < recovery.max_copies_per_node
                };
                let Some(n) = pick_new_replica(map, &row, live, &copies, under_cap) else {
                    throttled |= recovering
                        && pick_new_replica(map, &row, live, &copies, |_| true).is_some();
                    break;
                };
                row.replicas.push(n);
                *copies.entry(n).or_default() += 1;
                *in_flight.entry(n).or_default() += 1;
                in_flight_total += 1;
                added.push(n);
            }
            if added.is_empty() && throttled {
                out.skipped.push(skip(
                    "recovery_throttled",
                    format!(
                        "{staying} of {wanted} copies left after a node down past the grace; \
                         waiting for a recovery copy slot ({in_flight_total} in flight, at most {} \
                         in total and {} per node)",
                        recovery.max_copies, recovery.max_copies_per_node
                    ),
                ));
                continue;
            }
            if added.is_empty() {
                out.skipped.push(skip(
                    "no_eligible_node",
                    format!(
                        "{have} of {wanted} copies ({staying} not draining); no Up, non-draining node with a lease lacks a copy"
                    ),
                ));
                continue;
            }
        } else {
            // A replica on a draining node goes once the staying copies
            // are all in sync (its replacement caught up), never before.
            let staying_in_sync = 1 + row.in_sync.iter().filter(|r| !leaving(r)).count();
            let mut victims: Vec<NodeId> = Vec::new();
            if staying_in_sync >= wanted {
                victims.extend(row.replicas.iter().copied().filter(|r| leaving(r)));
            }
            let mut keep: Vec<NodeId> = row
                .replicas
                .iter()
                .copied()
                .filter(|r| !leaving(r))
                .collect();
            while 1 + keep.len() > wanted {
                let v = keep
                    .iter()
                    .copied()
                    .max_by_key(|r| {
                        (
                            !row.in_sync.contains(r),
                            copies.get(r).copied().unwrap_or(0),
                            *r,
                        )
                    })
                    .expect("more copies than wanted means a replica exists");
                keep.retain(|r| *r != v);
                victims.push(v);
            }
            if victims.is_empty() {
                out.skipped.push(skip(
                    "waiting_for_catch_up",
                    format!(
                        "a replica on a draining node leaves once the {wanted} staying copies are in sync \
                         ({staying_in_sync} are)"
                    ),
                ));
                continue;
            }
            for v in victims {
                row.remove_replica(v);
                if let Some(c) = copies.get_mut(&v) {
                    *c = c.saturating_sub(1);
                }
                removed.push(v);
            }
        }
        row.epoch = Epoch(p.epoch.0 + 1);
        debug_assert!(!row.replicas.contains(&row.owner));
        debug_assert!(row.in_sync.iter().all(|r| row.replicas.contains(r)));
        out.changes.push(MembershipChange {
            partition: p.id,
            expected: (p.owner, p.epoch),
            row,
            reason: match (added.is_empty(), recovering) {
                (false, true) => "replica_node_dead",
                (false, false) => "under_replicated",
                (true, true) => "dead_replica_replaced",
                (true, false) => "over_replicated",
            },
            added,
            removed,
        });
    }
    out
}

/// The node to add as a replica of `p`: Up, holding a lease, not draining,
/// no copy of `p`; a zone no copy has first, then fewest copies, then id.
fn pick_new_replica(
    map: &PartitionMap,
    p: &PartitionRecord,
    live: &BTreeSet<NodeId>,
    copies: &BTreeMap<NodeId, usize>,
    under_cap: impl Fn(NodeId) -> bool,
) -> Option<NodeId> {
    let used_zones: BTreeSet<&str> = p
        .copies()
        .filter_map(|n| map.nodes.get(&n).and_then(|n| n.zone.as_deref()))
        .collect();
    map.nodes
        .values()
        .filter(|n| {
            n.state == NodeState::Up
                && !n.draining
                && live.contains(&n.id)
                && !p.has_copy(n.id)
                && under_cap(n.id)
        })
        .min_by_key(|n| {
            let zone_used = n.zone.as_deref().is_some_and(|z| used_zones.contains(z));
            (zone_used, copies.get(&n.id).copied().unwrap_or(0), n.id)
        })
        .map(|n| n.id)
}
