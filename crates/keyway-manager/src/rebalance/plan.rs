//! The pure planner: the map, the live migrations, the load and the node
//! liveness in; planned moves and the reason it stopped out. No I/O and no
//! clock (`now_ms` is an input), so every decision is tested by asserting
//! the returned [`Plan`].
//!
//! # The rule
//!
//! The *balanced* nodes are the Up, non-draining ones. The total load `T` is
//! what the balanced and the draining nodes hold (counting every live
//! migration as done: its partition is the target's), and node i's fair
//! share is `T × weight_i / Σ weight` over the balanced nodes.
//!
//! 1. *Drain*: every partition of a draining node (largest first) goes to the
//!    balanced node that ends least loaded relative to its share.
//! 2. *Balance*: while some balanced node is outside `tolerance` of its
//!    share, move one partition at a time from a node above its share to a
//!    node below it. Every move fixes a node outside the tolerance: while
//!    some node is below `1 - tolerance` of its share, only those receive
//!    (from any node above its share); otherwise only nodes above `1 +
//!    tolerance` give, and only to the node most below its share. Pairs are
//!    tried most-above first, most-below first; within a pair the partition
//!    is the one whose load is closest to what the pair needs, `want =
//!    min(donor's excess, receiver's deficit)`. A move must strictly lower
//!    the pair's peak relative to shares (`max(load/share)` of the two) and
//!    the pair's largest deviation from share, and it must not overshoot.
//!    In order of preference (the first pair with a move of the best class
//!    wins):
//!    - class 0: the donor ends no lower than `1 - tolerance` of its share
//!      and the receiver no higher than `1 + tolerance`;
//!    - class 1: each side overshoots its share by less than the move fixed
//!      there (`l < 2 × want`);
//!    - class 2: the pair's total distance from share (`|L_d - S_d| + |L_r -
//!      S_r|`) falls by at least half the moved load `l` (partitions too
//!      coarse for class 1 that still improve the pair).
//!
//!    Planning stops when every node is within the tolerance (`balanced`),
//!    when no move qualifies (`no_improving_move`, `cooldown`,
//!    `cap_reached`), and after a bounded number of moves in any case.
//!
//! A node that joins empty is the one most below its share until it holds
//! it, and every donor gives about its excess, so a join moves about the new
//! node's fair share, all of it to the new node.
//!
//! Never moved: a partition with a live migration; to balance (a drain
//! still moves it), a partition moved less than `move_cooldown_ms` ago; the
//! partitions of a Down node (the only copy is there). Nothing at all is
//! planned while a node is down within `down_grace_ms` (it may come back).
//! Caps: at most `max_moves` live migrations in all and
//! `max_moves_per_node` per node (as source or target), live ones included
//! (`uncapped` lifts them, for `keyway ctl rebalance --plan`).
//!
//! # Primaries and replicas
//!
//! The objective is the load of the partitions a node is **primary** of
//! (owner): a replica serves no writes and, unless clients read with
//! `READONLY`, no reads. Replicas are counted apart ([`NodePlan::replicas`])
//! and placed by the manager's membership reconciler (a distinct zone
//! first, then the node with the fewest copies), not by moves. A move never
//! targets a node holding a replica of the partition: its copy would be
//! cleaned for the migration's, and primaryship goes to a replica by a
//! switchover (`keyway ctl failover`) instead.

use super::config::{Objective, RebalanceConfig};
use crate::stats::ClusterLoad;
use keyway_map::{NodeId, NodeState, PartitionId, PartitionMap};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// A non-terminal migration, as the planner counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct LiveMove {
    pub partition: PartitionId,
    pub source: NodeId,
    pub target: NodeId,
}

/// How long a node the map shows Down has been down.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DownPhase {
    /// Down for less than `down_grace_ms`: it may come back; plan nothing.
    WithinGrace { left_ms: u64 },
    /// Down for longer: its partitions are stuck (it holds the only copy).
    PastGrace,
}

/// Everything one round decides from.
#[derive(Clone, Copy, Debug)]
pub struct PlanInput<'a> {
    pub map: &'a PartitionMap,
    /// The latest load picture (`None`: none yet).
    pub load: Option<&'a ClusterLoad>,
    /// Every non-terminal migration.
    pub live: &'a [LiveMove],
    /// When each partition last moved (or its move ended), unix ms.
    pub moved_at: &'a BTreeMap<PartitionId, u64>,
    /// The phase of each node the map shows Down (a Down node missing here
    /// counts as within the grace).
    pub down: &'a BTreeMap<NodeId, DownPhase>,
    pub now_ms: u64,
    pub config: &'a RebalanceConfig,
    /// Ignore the caps: the whole plan to balance, not one round's.
    pub uncapped: bool,
}

/// Why a move is planned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MoveReason {
    /// Off a draining node.
    Drain,
    /// From a node above its share to one below it.
    Balance,
}

impl MoveReason {
    pub fn name(self) -> &'static str {
        match self {
            MoveReason::Drain => "drain",
            MoveReason::Balance => "balance",
        }
    }
}

/// One planned move.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PlannedMove {
    pub partition: PartitionId,
    pub from: NodeId,
    pub to: NodeId,
    /// The partition's load under the objective.
    pub load: f64,
    /// Its payload bytes as last reported (0 if unknown).
    pub bytes: u64,
    pub reason: MoveReason,
}

/// What the planner makes of a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Up and not draining: balanced, and a possible target.
    Balanced,
    /// Up and draining: every partition moves away.
    Draining,
    /// Down: never a source or a target.
    Down,
}

/// One node before and after the plan.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NodePlan {
    pub node: NodeId,
    pub role: Role,
    pub weight: u32,
    /// Partitions it owns once the live migrations are done.
    pub partitions: usize,
    pub partitions_after: usize,
    /// Partitions it holds a replica of (and of those, in sync): placed by
    /// the membership reconciler, not balanced here.
    pub replicas: usize,
    pub in_sync_replicas: usize,
    /// Its load once the live migrations are done, and after the plan.
    pub load: f64,
    pub load_after: f64,
    /// Its fair share (0 unless balanced).
    pub share: f64,
    /// Payload bytes, before and after the plan (as last reported).
    pub bytes: u64,
    pub bytes_after: u64,
}

/// Why the planner stopped adding moves (one per round).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Stop {
    /// `balanced`, `cap_reached`, `migrations_in_flight`, `cooldown`,
    /// `no_improving_move`, `waiting_for_grace`, `load_missing`,
    /// `load_incomplete`, `no_target`.
    pub reason: &'static str,
    pub detail: String,
}

/// A node down past the grace that still owns partitions.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Stuck {
    pub node: NodeId,
    pub partitions: Vec<PartitionId>,
}

/// The planner's answer.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plan {
    pub objective: Objective,
    /// In the order to start them.
    pub moves: Vec<PlannedMove>,
    pub stop: Stop,
    /// Every node of the map, by id.
    pub nodes: Vec<NodePlan>,
    /// The load being spread (balanced and draining nodes).
    pub total: f64,
    pub total_bytes: u64,
    pub stuck: Vec<Stuck>,
}

impl Plan {
    /// Payload bytes the planned moves copy.
    pub fn moved_bytes(&self) -> u64 {
        self.moves.iter().map(|m| m.bytes).sum()
    }

    /// The largest `load / share` over the balanced nodes after the plan
    /// (1.0 is perfect; `None` with no load).
    pub fn peak_after(&self) -> Option<f64> {
        self.nodes
            .iter()
            .filter(|n| n.role == Role::Balanced && n.share > 0.0)
            .map(|n| n.load_after / n.share)
            .max_by(f64::total_cmp)
    }
}

/// Plans one round; see the module docs.
pub fn plan(input: &PlanInput<'_>) -> Plan {
    let mut s = State::new(input);
    let stop = s.run();
    s.finish(stop)
}

/// The planner's working state.
struct State<'a> {
    input: &'a PlanInput<'a>,
    cfg: &'a RebalanceConfig,
    role: BTreeMap<NodeId, Role>,
    weight: BTreeMap<NodeId, u32>,
    /// Projected owner of every partition (live migrations done).
    owner: BTreeMap<PartitionId, NodeId>,
    busy: BTreeSet<PartitionId>,
    /// Partition loads (balanced and draining nodes only).
    part_load: BTreeMap<PartitionId, f64>,
    /// Per node: load now (projected) and as moves are planned.
    load0: BTreeMap<NodeId, f64>,
    load: BTreeMap<NodeId, f64>,
    share: BTreeMap<NodeId, f64>,
    /// Live plus planned migrations, per node and in all.
    per_node: BTreeMap<NodeId, usize>,
    in_flight: usize,
    moves: Vec<PlannedMove>,
    total: f64,
}

impl<'a> State<'a> {
    fn new(input: &'a PlanInput<'a>) -> Self {
        let map = input.map;
        let role: BTreeMap<NodeId, Role> = map
            .nodes
            .values()
            .map(|n| {
                let role = match (n.state, n.draining) {
                    (NodeState::Down, _) => Role::Down,
                    (NodeState::Up, true) => Role::Draining,
                    (NodeState::Up, false) => Role::Balanced,
                };
                (n.id, role)
            })
            .collect();
        let weight = map.nodes.values().map(|n| (n.id, n.weight)).collect();
        let mut owner: BTreeMap<PartitionId, NodeId> =
            map.partitions.values().map(|p| (p.id, p.owner)).collect();
        let mut busy = BTreeSet::new();
        let mut per_node = BTreeMap::new();
        for m in input.live {
            if let Some(o) = owner.get_mut(&m.partition) {
                *o = m.target;
            }
            busy.insert(m.partition);
            *per_node.entry(m.source).or_insert(0) += 1;
            *per_node.entry(m.target).or_insert(0) += 1;
        }
        State {
            input,
            cfg: input.config,
            role,
            weight,
            owner,
            busy,
            part_load: BTreeMap::new(),
            load0: BTreeMap::new(),
            load: BTreeMap::new(),
            share: BTreeMap::new(),
            per_node,
            in_flight: input.live.len(),
            moves: Vec::new(),
            total: 0.0,
        }
    }

    fn role(&self, n: NodeId) -> Role {
        self.role.get(&n).copied().unwrap_or(Role::Down)
    }

    fn balanced(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.role
            .iter()
            .filter(|(_, r)| **r == Role::Balanced)
            .map(|(n, _)| *n)
    }

    fn stop(reason: &'static str, detail: impl Into<String>) -> Stop {
        Stop {
            reason,
            detail: detail.into(),
        }
    }

    /// Everything up to the moves; returns why planning stopped.
    fn run(&mut self) -> Stop {
        let input = self.input;
        let objective = self.cfg.objective;
        // Loads of what the balanced and draining nodes hold.
        let mut missing = Vec::new();
        for (&p, &o) in &self.owner {
            if self.role(o) == Role::Down {
                continue;
            }
            let report = input.load.and_then(|l| l.partitions.get(&p));
            match objective.of(report) {
                Some(l) => {
                    self.part_load.insert(p, l);
                }
                None => missing.push(p),
            }
        }
        for (&n, &r) in &self.role {
            if r != Role::Down {
                let owned = self.owner.iter().filter(|(_, o)| **o == n);
                let sum = owned.filter_map(|(p, _)| self.part_load.get(p)).sum();
                self.load0.insert(n, sum);
            }
        }
        self.load = self.load0.clone();
        self.total = self.load0.values().sum();
        let weights: f64 = self.balanced().map(|n| f64::from(self.weight[&n])).sum();
        if weights > 0.0 {
            for n in self.balanced().collect::<Vec<_>>() {
                let share = self.total * f64::from(self.weight[&n]) / weights;
                self.share.insert(n, share);
            }
        }
        // Reasons not to plan at all.
        let waiting: Vec<String> = input
            .map
            .nodes
            .values()
            .filter(|n| n.state == NodeState::Down)
            .filter_map(|n| match input.down.get(&n.id) {
                Some(DownPhase::PastGrace) => None,
                Some(DownPhase::WithinGrace { left_ms }) => {
                    Some(format!("node {} ({left_ms} ms left)", n.id))
                }
                None => Some(format!("node {}", n.id)),
            })
            .collect();
        if !waiting.is_empty() {
            return Self::stop(
                "waiting_for_grace",
                format!(
                    "down within rebalance_down_grace_ms: {}; nothing moves until it is back \
                     or the grace has passed",
                    waiting.join(", ")
                ),
            );
        }
        if objective.needs_load() && input.load.is_none() {
            return Self::stop("load_missing", "no load picture from the nodes yet");
        }
        if !missing.is_empty() {
            let some: Vec<String> = missing.iter().take(8).map(|p| p.to_string()).collect();
            return Self::stop(
                "load_incomplete",
                format!(
                    "{} partition(s) of live nodes have no load report (e.g. {})",
                    missing.len(),
                    some.join(", ")
                ),
            );
        }
        if !input.uncapped && self.in_flight >= self.cfg.max_moves {
            return Self::stop(
                "migrations_in_flight",
                format!(
                    "{} live migration(s), rebalance_max_moves {}",
                    self.in_flight, self.cfg.max_moves
                ),
            );
        }
        if self.balanced().next().is_none() {
            let draining = self.role.values().any(|r| *r == Role::Draining);
            return Self::stop(
                if draining { "no_target" } else { "balanced" },
                "no Up, non-draining node",
            );
        }
        let capped = self.drain();
        self.balance(capped)
    }

    /// Whether `n` holds a replica of `p`: never a move's target (its copy
    /// would be cleaned for the migration's own, and an in-sync replica
    /// must keep every acknowledged write); primaryship goes there by a
    /// switchover instead (`keyway ctl failover`).
    fn holds_replica(&self, p: PartitionId, n: NodeId) -> bool {
        self.input
            .map
            .partitions
            .get(&p)
            .is_some_and(|row| row.replicas.contains(&n))
    }

    fn fits(&self, a: NodeId, b: NodeId) -> bool {
        let per = |n| self.per_node.get(&n).copied().unwrap_or(0);
        self.input.uncapped
            || (self.in_flight < self.cfg.max_moves
                && per(a) < self.cfg.max_moves_per_node
                && per(b) < self.cfg.max_moves_per_node)
    }

    fn add(&mut self, partition: PartitionId, to: NodeId, reason: MoveReason) {
        let from = self.owner[&partition];
        let load = self.part_load.get(&partition).copied().unwrap_or(0.0);
        *self.load.entry(from).or_insert(0.0) -= load;
        *self.load.entry(to).or_insert(0.0) += load;
        self.owner.insert(partition, to);
        self.busy.insert(partition);
        *self.per_node.entry(from).or_insert(0) += 1;
        *self.per_node.entry(to).or_insert(0) += 1;
        self.in_flight += 1;
        self.moves.push(PlannedMove {
            partition,
            from,
            to,
            load,
            bytes: self.bytes_of(partition),
            reason,
        });
    }

    fn bytes_of(&self, p: PartitionId) -> u64 {
        self.input
            .load
            .and_then(|l| l.partitions.get(&p))
            .map_or(0, |l| l.bytes)
    }

    /// Plans the drain moves; returns whether a cap held one back.
    fn drain(&mut self) -> bool {
        let mut parts: Vec<(PartitionId, f64)> = self
            .owner
            .iter()
            .filter(|(p, o)| self.role(**o) == Role::Draining && !self.busy.contains(p))
            .map(|(p, _)| (*p, self.part_load[p]))
            .collect();
        parts.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut capped = false;
        for (p, l) in parts {
            let from = self.owner[&p];
            let target = self
                .balanced()
                .filter(|&t| self.fits(from, t) && !self.holds_replica(p, t))
                .map(|t| {
                    let share = self.share[&t];
                    let after = if share > 0.0 {
                        (self.load[&t] + l) / share
                    } else {
                        0.0
                    };
                    let count = self.owner.values().filter(|o| **o == t).count() as f64;
                    (after, count / f64::from(self.weight[&t].max(1)), t)
                })
                .min_by(|a, b| {
                    a.0.total_cmp(&b.0)
                        .then(a.1.total_cmp(&b.1))
                        .then(a.2.cmp(&b.2))
                });
            match target {
                Some((_, _, t)) => self.add(p, t, MoveReason::Drain),
                None => capped = true,
            }
        }
        capped
    }

    /// Load relative to share (1.0 = at its share).
    fn ratio(&self, n: NodeId) -> f64 {
        self.load[&n] / self.share[&n]
    }

    /// Plans the balance moves; returns why it stopped.
    fn balance(&mut self, drain_capped: bool) -> Stop {
        let tol = self.cfg.tolerance;
        if self.total <= 0.0 {
            return self.after_balance(drain_capped, Self::stop("balanced", "no load to spread"));
        }
        if self.total < self.cfg.min_total() {
            let detail = format!(
                "{:.0} {} in all, below the {:.0} worth balancing",
                self.total,
                self.cfg.objective,
                self.cfg.min_total()
            );
            return self.after_balance(drain_capped, Self::stop("too_little_load", detail));
        }
        let guard = 4 * self.owner.len() + 16;
        for _ in 0..guard {
            let mut nodes: Vec<(NodeId, f64)> =
                self.balanced().map(|n| (n, self.ratio(n))).collect();
            let worst = nodes
                .iter()
                .map(|(_, r)| (r - 1.0).abs())
                .fold(0.0, f64::max);
            if worst <= tol {
                let detail = format!(
                    "every node within {:.1}% of its share (worst {:.1}%)",
                    tol * 100.0,
                    worst * 100.0
                );
                return self.after_balance(drain_capped, Self::stop("balanced", detail));
            }
            nodes.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            // Every move fixes a node outside the tolerance: while some node
            // is below it, only those receive (a join fills the new node and
            // nothing else); otherwise only nodes above it give, and only to
            // the node most below its share (if that one is at its cap, the
            // donor waits rather than load a node that needs nothing).
            let low = nodes.iter().any(|n| n.1 < 1.0 - tol);
            let (give, take) = if low {
                (1.0, 1.0 - tol)
            } else {
                (1.0 + tol, 1.0)
            };
            let donors: Vec<NodeId> = nodes.iter().filter(|n| n.1 > give).map(|n| n.0).collect();
            let receivers: Vec<NodeId> = nodes
                .iter()
                .rev()
                .filter(|n| n.1 < take)
                .map(|n| n.0)
                .take(if low { usize::MAX } else { 1 })
                .collect();
            let mut capped = false;
            let mut cooled = false;
            // The first pair (most above, most below) with a move of the
            // best class: a clean move of a lesser pair beats an overshooting
            // one of the first pair.
            let mut chosen: Option<(u8, PartitionId, NodeId)> = None;
            'pairs: for &d in &donors {
                for &r in &receivers {
                    if !self.fits(d, r) {
                        capped = true;
                        continue;
                    }
                    let (pick, cool) = self.best_move(d, r);
                    cooled |= cool;
                    if let Some((class, p)) = pick
                        && chosen.is_none_or(|c| class < c.0)
                    {
                        chosen = Some((class, p, r));
                        if class == 0 {
                            break 'pairs;
                        }
                    }
                }
            }
            let Some((_, p, r)) = chosen else {
                let detail = format!("worst node {:.1}% off its share", worst * 100.0);
                let stop = if capped {
                    Self::stop(
                        "cap_reached",
                        format!("{detail}; every useful pair is at its cap"),
                    )
                } else if cooled {
                    Self::stop(
                        "cooldown",
                        format!(
                            "{detail}; the useful partitions moved within rebalance_move_cooldown_ms"
                        ),
                    )
                } else {
                    Self::stop(
                        "no_improving_move",
                        format!("{detail}; no single partition move lowers the imbalance"),
                    )
                };
                return self.after_balance(drain_capped, stop);
            };
            self.add(p, r, MoveReason::Balance);
        }
        Self::stop("no_improving_move", "planning stopped after its move limit")
    }

    fn after_balance(&self, drain_capped: bool, stop: Stop) -> Stop {
        if drain_capped {
            Self::stop(
                "cap_reached",
                "partitions of draining nodes wait for a free migration slot",
            )
        } else {
            stop
        }
    }

    /// The best partition to move from `d` to `r` (see the module docs) with
    /// its class, and whether a cooling partition would have qualified.
    fn best_move(&self, d: NodeId, r: NodeId) -> (Option<(u8, PartitionId)>, bool) {
        let tol = self.cfg.tolerance;
        let (sd, sr) = (self.share[&d], self.share[&r]);
        let (ld, lr) = (self.load[&d], self.load[&r]);
        let (a, b) = (ld / sd, lr / sr);
        let want = (ld - sd).min(sr - lr);
        let dev_before = (a - 1.0).abs().max((b - 1.0).abs());
        let dist_before = (ld - sd).abs() + (lr - sr).abs();
        let cooldown = self.cfg.move_cooldown_ms;
        let now = self.input.now_ms;
        // (class, |l - want|, l, id) of the best so far; class 0: no side
        // ends past the tolerance, 1: each side overshoots its share by less
        // than the move fixed there, 2: the pair's distance from share
        // falls by at least l/2.
        let mut best: Option<(u8, f64, f64, PartitionId)> = None;
        let mut cooled = false;
        for (&p, _) in self.owner.iter().filter(|(_, o)| **o == d) {
            if self.busy.contains(&p) || self.holds_replica(p, r) {
                continue;
            }
            let l = self.part_load[&p];
            if l <= 0.0 {
                continue;
            }
            let (a2, b2) = ((ld - l) / sd, (lr + l) / sr);
            let dist_after = (ld - l - sd).abs() + (lr + l - sr).abs();
            let class = if a2 >= 1.0 - tol && b2 <= 1.0 + tol {
                0
            } else if l < 2.0 * want {
                1
            } else if dist_before - dist_after >= l / 2.0 {
                2
            } else {
                continue;
            };
            let improves = a2.max(b2) < a && (a2 - 1.0).abs().max((b2 - 1.0).abs()) < dev_before;
            if !improves {
                continue;
            }
            let moved = self.input.moved_at.get(&p);
            if moved.is_some_and(|&at| now < at.saturating_add(cooldown)) {
                cooled = true;
                continue;
            }
            let cand = (class, (l - want).abs(), l, p);
            let better = best.is_none_or(|b| {
                cand.0
                    .cmp(&b.0)
                    .then(cand.1.total_cmp(&b.1))
                    .then(cand.2.total_cmp(&b.2))
                    .then(cand.3.cmp(&b.3))
                    .is_lt()
            });
            if better {
                best = Some(cand);
            }
        }
        (best.map(|b| (b.0, b.3)), cooled)
    }

    fn finish(self, stop: Stop) -> Plan {
        let input = self.input;
        let bytes = |p: &PartitionId| self.bytes_of(*p);
        let mut before_owner: BTreeMap<PartitionId, NodeId> = input
            .map
            .partitions
            .values()
            .map(|p| (p.id, p.owner))
            .collect();
        for m in input.live {
            before_owner.insert(m.partition, m.target);
        }
        let nodes = input
            .map
            .nodes
            .values()
            .map(|n| {
                let owned_before = before_owner.iter().filter(|(_, o)| **o == n.id);
                let owned_after = self.owner.iter().filter(|(_, o)| **o == n.id);
                NodePlan {
                    node: n.id,
                    role: self.role(n.id),
                    weight: n.weight,
                    partitions: owned_before.clone().count(),
                    partitions_after: owned_after.clone().count(),
                    replicas: self
                        .input
                        .map
                        .partitions
                        .values()
                        .filter(|p| p.replicas.contains(&n.id))
                        .count(),
                    in_sync_replicas: self
                        .input
                        .map
                        .partitions
                        .values()
                        .filter(|p| p.is_in_sync_replica(n.id))
                        .count(),
                    load: self.load0.get(&n.id).copied().unwrap_or(0.0),
                    load_after: self.load.get(&n.id).copied().unwrap_or(0.0),
                    share: self.share.get(&n.id).copied().unwrap_or(0.0),
                    bytes: owned_before.map(|(p, _)| bytes(p)).sum(),
                    bytes_after: owned_after.map(|(p, _)| bytes(p)).sum(),
                }
            })
            .collect();
        let stuck = input
            .map
            .nodes
            .values()
            .filter(|n| input.down.get(&n.id) == Some(&DownPhase::PastGrace))
            .map(|n| Stuck {
                node: n.id,
                partitions: input.map.owned_by(n.id).map(|p| p.id).collect(),
            })
            .filter(|s| !s.partitions.is_empty())
            .collect();
        let total_bytes = before_owner
            .iter()
            .filter(|(_, o)| self.role(**o) != Role::Down)
            .map(|(p, _)| bytes(p))
            .sum();
        Plan {
            objective: self.cfg.objective,
            moves: self.moves,
            stop,
            nodes,
            total: self.total,
            total_bytes,
            stuck,
        }
    }
}
