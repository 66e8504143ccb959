//! Balancing replicas (issue 12, item 1: primaries and replicas are balanced
//! separately). Pure: the map, the partitions busy with a migration or a
//! replica move, and the live replica moves in; planned replica moves
//! (`crate::request_replica_move`) and why planning stopped out.
//!
//! # The rule
//!
//! The *balanced* nodes are the Up, non-draining ones (replicas on draining
//! nodes are the membership reconciler's: it replaces them). Node i's
//! replica count `c_i` counts every live replica move as done; its fair
//! share is `s_i = C × weight_i / Σ weight`, `C = Σ c_i`. While a node holds
//! more than `(1 + tolerance) × s_i` and at least one replica over its
//! share, one of its replicas goes to the node most below its share (a
//! ratio `c / s` under 1) that can take it:
//! - the target holds no copy of the partition (never two copies of a
//!   partition on one node);
//! - the partition's copies keep at least as many distinct zones;
//! - the move strictly lowers the pair's distance from share
//!   (`|c_d - s_d| + |c_r - s_r|`);
//! - the partition has no live migration or replica move;
//! - caps, as for primary moves: at most `max_moves` live replica moves in
//!   all and `max_moves_per_node` per node (as source or target), live ones
//!   included.
//!
//! The donor's replica with the lowest partition id that qualifies moves.
//! Nothing is planned while a node is Down within the grace (it may come
//! back); a node Down past the grace neither gives nor receives (its
//! replicas are never moved on suspicion, invariant 12).

use super::config::RebalanceConfig;
use super::plan::{DownPhase, Stop};
use keyway_map::{NodeId, NodeState, PartitionId, PartitionMap};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// A live replica move as the planner counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct LiveReplicaMove {
    pub partition: PartitionId,
    pub from: NodeId,
    pub to: NodeId,
}

/// Everything the replica balancer decides from.
#[derive(Clone, Copy, Debug)]
pub struct ReplicaInput<'a> {
    pub map: &'a PartitionMap,
    /// Partitions with a live migration (or one planned this round).
    pub migrating: &'a BTreeSet<PartitionId>,
    pub live: &'a [LiveReplicaMove],
    pub down: &'a BTreeMap<NodeId, DownPhase>,
    pub config: &'a RebalanceConfig,
    pub uncapped: bool,
}

/// One planned replica move.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PlannedReplicaMove {
    pub partition: PartitionId,
    pub from: NodeId,
    pub to: NodeId,
}

/// A balanced node's replica count before and after the plan.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReplicaNode {
    pub node: NodeId,
    pub replicas: usize,
    pub replicas_after: usize,
    pub share: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReplicaPlan {
    pub moves: Vec<PlannedReplicaMove>,
    pub stop: Stop,
    pub nodes: Vec<ReplicaNode>,
}

fn stop(reason: &'static str, detail: impl Into<String>) -> Stop {
    Stop {
        reason,
        detail: detail.into(),
    }
}

/// Plans one round of replica moves; see the module docs.
pub fn plan_replicas(input: &ReplicaInput<'_>) -> ReplicaPlan {
    let map = input.map;
    let cfg = input.config;
    let balanced: Vec<NodeId> = map
        .nodes
        .values()
        .filter(|n| n.state == NodeState::Up && !n.draining)
        .map(|n| n.id)
        .collect();
    // Projected replicas per partition (live moves done).
    let mut replicas: BTreeMap<PartitionId, Vec<NodeId>> = map
        .partitions
        .values()
        .map(|p| (p.id, p.replicas.clone()))
        .collect();
    let mut busy: BTreeSet<PartitionId> = input.migrating.clone();
    let mut per_node: BTreeMap<NodeId, usize> = BTreeMap::new();
    for m in input.live {
        if let Some(r) = replicas.get_mut(&m.partition) {
            r.retain(|n| *n != m.from);
            if !r.contains(&m.to) {
                r.push(m.to);
            }
        }
        busy.insert(m.partition);
        *per_node.entry(m.from).or_default() += 1;
        *per_node.entry(m.to).or_default() += 1;
    }
    let count = |replicas: &BTreeMap<PartitionId, Vec<NodeId>>, n: NodeId| {
        replicas.values().filter(|r| r.contains(&n)).count()
    };
    let before: BTreeMap<NodeId, usize> = balanced
        .iter()
        .map(|n| (*n, count(&replicas, *n)))
        .collect();
    let total: usize = before.values().sum();
    let weights: f64 = balanced
        .iter()
        .map(|n| f64::from(map.nodes[n].weight))
        .sum();
    let share: BTreeMap<NodeId, f64> = balanced
        .iter()
        .map(|n| {
            let w = f64::from(map.nodes[n].weight);
            (
                *n,
                if weights > 0.0 {
                    total as f64 * w / weights
                } else {
                    0.0
                },
            )
        })
        .collect();
    let mut counts = before.clone();
    let mut moves = Vec::new();
    let mut in_flight = input.live.len();
    let finish = |moves, stop, counts: &BTreeMap<NodeId, usize>| ReplicaPlan {
        moves,
        stop,
        nodes: balanced
            .iter()
            .map(|n| ReplicaNode {
                node: *n,
                replicas: before[n],
                replicas_after: counts[n],
                share: share[n],
            })
            .collect(),
    };
    let waiting: Vec<String> = map
        .nodes
        .values()
        .filter(|n| n.state == NodeState::Down)
        .filter(|n| !matches!(input.down.get(&n.id), Some(DownPhase::PastGrace)))
        .map(|n| format!("node {}", n.id))
        .collect();
    if !waiting.is_empty() {
        let detail = format!("down within the grace: {}", waiting.join(", "));
        return finish(moves, stop("waiting_for_grace", detail), &counts);
    }
    if total == 0 || balanced.len() < 2 {
        return finish(moves, stop("balanced", "no replicas to spread"), &counts);
    }
    let zone = |n: NodeId| map.nodes.get(&n).and_then(|i| i.zone.as_deref());
    let zones_of = |copies: &[NodeId]| {
        copies
            .iter()
            .filter_map(|n| zone(*n))
            .collect::<BTreeSet<_>>()
            .len()
    };
    let guard = 2 * total + 16;
    for _ in 0..guard {
        let ratio = |c: &BTreeMap<NodeId, usize>, n: NodeId| {
            c[&n] as f64 / share[&n].max(f64::MIN_POSITIVE)
        };
        let mut donors: Vec<NodeId> = balanced
            .iter()
            .copied()
            .filter(|n| {
                let c = counts[n] as f64;
                c > share[n] * (1.0 + cfg.tolerance) && c >= share[n] + 1.0
            })
            .collect();
        if donors.is_empty() {
            let detail = format!(
                "every node within {:.1}% (or one replica) of its replica share",
                cfg.tolerance * 100.0
            );
            return finish(moves, stop("balanced", detail), &counts);
        }
        donors.sort_by(|a, b| {
            ratio(&counts, *b)
                .total_cmp(&ratio(&counts, *a))
                .then(a.cmp(b))
        });
        let mut receivers: Vec<NodeId> = balanced
            .iter()
            .copied()
            .filter(|n| (counts[n] as f64) < share[n])
            .collect();
        receivers.sort_by(|a, b| {
            ratio(&counts, *a)
                .total_cmp(&ratio(&counts, *b))
                .then(a.cmp(b))
        });
        let fits = |per_node: &BTreeMap<NodeId, usize>, in_flight: usize, a: NodeId, b: NodeId| {
            let per = |n| per_node.get(&n).copied().unwrap_or(0);
            input.uncapped
                || (in_flight < cfg.max_moves
                    && per(a) < cfg.max_moves_per_node
                    && per(b) < cfg.max_moves_per_node)
        };
        let mut capped = false;
        let mut chosen = None;
        'pairs: for &d in &donors {
            for &r in &receivers {
                let dist = |cd: f64, cr: f64| (cd - share[&d]).abs() + (cr - share[&r]).abs();
                let (cd, cr) = (counts[&d] as f64, counts[&r] as f64);
                if dist(cd - 1.0, cr + 1.0) >= dist(cd, cr) {
                    continue;
                }
                if !fits(&per_node, in_flight, d, r) {
                    capped = true;
                    continue;
                }
                for (pid, reps) in &replicas {
                    if busy.contains(pid) || !reps.contains(&d) {
                        continue;
                    }
                    let owner = map.partitions[pid].owner;
                    if owner == r || reps.contains(&r) {
                        continue;
                    }
                    let copies: Vec<NodeId> =
                        std::iter::once(owner).chain(reps.iter().copied()).collect();
                    let after: Vec<NodeId> = copies
                        .iter()
                        .copied()
                        .map(|n| if n == d { r } else { n })
                        .collect();
                    if zones_of(&after) < zones_of(&copies) {
                        continue;
                    }
                    chosen = Some((*pid, d, r));
                    break 'pairs;
                }
            }
        }
        let Some((p, d, r)) = chosen else {
            let detail = "nodes above their replica share have no replica a node below it can take";
            let s = if capped {
                stop("cap_reached", format!("{detail} within the caps"))
            } else {
                stop("no_improving_move", detail)
            };
            return finish(moves, s, &counts);
        };
        let reps = replicas.get_mut(&p).expect("chosen from replicas");
        reps.retain(|n| *n != d);
        reps.push(r);
        busy.insert(p);
        *counts.get_mut(&d).expect("balanced") -= 1;
        *counts.get_mut(&r).expect("balanced") += 1;
        *per_node.entry(d).or_default() += 1;
        *per_node.entry(r).or_default() += 1;
        in_flight += 1;
        moves.push(PlannedReplicaMove {
            partition: p,
            from: d,
            to: r,
        });
    }
    finish(
        moves,
        stop("no_improving_move", "planning stopped after its move limit"),
        &counts,
    )
}
