//! The merge policy, as a pure function of the map, one round's load, the
//! live migrations, the hot partitions and the birth history: which
//! neighbours to merge, which to co-locate first, and why others that
//! qualify on load and size are left alone.
//!
//! Per keyspace, in key order, a pair of neighbours is a *candidate* when
//! both owners reported them at their current epochs, each has been below
//! `merge_max_requests_per_sec` in every snapshot for `merge_cold_window_ms`
//! (a snapshot showing it at or above resets its window; a missing report
//! neither starts nor resets it) and their bytes together are below
//! `merge_max_bytes`. A candidate is held back, with the reason:
//! - `at_floor`: the keyspace has no more than `merge_min_partitions_per_node`
//!   × Up nodes partitions (recorded once per keyspace);
//! - `migrating`: either has a live migration;
//! - `hot`: either is above the split threshold (the split policy's view);
//! - `cooldown`: either was born by a split less than
//!   `merge_after_split_cooldown_ms` ago;
//! - `owner_down`: they live on different nodes and neither node takes
//!   partitions (Up and not draining); `move_limit`: another co-location move was chosen this round.
//!
//! Otherwise neighbours on one node merge (reason `cold`); on two nodes the
//! smaller moves to the other's owner first (action `Move`, reason
//! `colocate`) and a later round merges them. Each partition takes part in
//! at most one verdict per round, and merges stop at the floor.

use super::MergeConfig;
use crate::split::{Birth, Busy, History};
use crate::stats::ClusterLoad;
use keyway_map::{Epoch, NodeId, NodeState, PartitionId, PartitionMap, PartitionRecord};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// What to do with one pair of neighbours.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MergeAction {
    /// Merge them, conditional on the `(owner, epoch)` of each.
    Merge {
        left: PartitionId,
        right: PartitionId,
        expected: [(NodeId, Epoch); 2],
    },
    /// Move `partition` to `to` (the other half's owner) first.
    Move { partition: PartitionId, to: NodeId },
    /// Leave them alone (the verdict's reason says why).
    Hold,
}

/// One decision about a pair of neighbours (or a whole keyspace).
#[derive(Clone, Debug, PartialEq)]
pub struct MergeVerdict {
    /// What it concerns, for the decision log: `keyspace K` or `L+R`.
    pub subject: String,
    /// The pair, left first (`None` for a keyspace-wide verdict).
    pub pair: Option<(PartitionId, PartitionId)>,
    pub action: MergeAction,
    /// `cold`, `colocate`; or why not: `at_floor`, `migrating`, `hot`,
    /// `cooldown`, `owner_down`, `move_limit`.
    pub reason: &'static str,
    pub detail: String,
}

/// The merge policy's memory between rounds: since when each partition has
/// been cold.
#[derive(Default, Debug)]
pub struct MergePolicy {
    cold_since: HashMap<PartitionId, Instant>,
}

impl MergePolicy {
    /// Decides one round (see the module docs). `hot` holds the partitions
    /// the split policy sees above its threshold; `now` is when the load
    /// was measured.
    #[allow(clippy::too_many_arguments)]
    pub fn decide(
        &mut self,
        cfg: &MergeConfig,
        map: &PartitionMap,
        load: &ClusterLoad,
        busy: &Busy,
        hot: &HashSet<PartitionId>,
        history: &History,
        now: Instant,
    ) -> Vec<MergeVerdict> {
        self.cold_since
            .retain(|id, _| map.partitions.contains_key(id));
        for p in map.partitions.values() {
            if let Some(l) = crate::split::usable(load, p) {
                if l.requests_per_sec() < cfg.merge_max_requests_per_sec {
                    self.cold_since.entry(p.id).or_insert(now);
                } else {
                    self.cold_since.remove(&p.id);
                }
            }
        }
        let window = Duration::from_millis(cfg.merge_cold_window_ms);
        let cooldown = Duration::from_millis(cfg.merge_after_split_cooldown_ms);
        let cold = |p: &PartitionRecord| {
            self.cold_since
                .get(&p.id)
                .is_some_and(|since| now.saturating_duration_since(*since) >= window)
        };
        let up = map
            .nodes
            .values()
            .filter(|n| n.state == NodeState::Up)
            .count();
        let floor = cfg.merge_min_partitions_per_node as usize * up;
        let mut moved = false;
        let mut out = Vec::new();
        for ks in map.keyspaces.values() {
            let parts: Vec<&PartitionRecord> = map.keyspace_partitions(ks.id).collect();
            let mut count = parts.len();
            let at_floor = |count: usize| MergeVerdict {
                subject: format!("keyspace {}", ks.id),
                pair: None,
                action: MergeAction::Hold,
                reason: "at_floor",
                detail: format!(
                    "keyspace {} keeps {count} partitions: floor {} per node × {up} Up nodes",
                    ks.name, cfg.merge_min_partitions_per_node
                ),
            };
            if count <= floor {
                out.push(at_floor(count));
                continue;
            }
            let mut i = 0;
            while i + 1 < parts.len() {
                let (l, r) = (parts[i], parts[i + 1]);
                let loads = (crate::split::usable(load, l), crate::split::usable(load, r));
                let (Some(ll), Some(rl)) = loads else {
                    i += 1;
                    continue;
                };
                let bytes = ll.bytes + rl.bytes;
                if !(cold(l) && cold(r)) || bytes >= cfg.merge_max_bytes {
                    i += 1;
                    continue;
                }
                if count <= floor {
                    out.push(at_floor(count));
                    break;
                }
                let figures = format!(
                    "{:.0} + {:.0} requests/s, {bytes} bytes",
                    ll.requests_per_sec(),
                    rl.requests_per_sec()
                );
                let verdict = |action, reason, why: String| MergeVerdict {
                    subject: format!("{}+{}", l.id, r.id),
                    pair: Some((l.id, r.id)),
                    action,
                    reason,
                    detail: format!("{figures}; {why}"),
                };
                let hold = if let Some((m, state)) = busy.get(&l.id).or(busy.get(&r.id)) {
                    Some(("migrating", format!("migration {m} is in {state}")))
                } else if hot.contains(&l.id) || hot.contains(&r.id) {
                    Some(("hot", "one of them is above the split threshold".into()))
                } else if [l, r]
                    .iter()
                    .any(|p| history.born_within(p.id, cooldown, now) == Some(Birth::Split))
                {
                    Some((
                        "cooldown",
                        format!("born by a split less than {cooldown:?} ago"),
                    ))
                } else {
                    None
                };
                if let Some((reason, why)) = hold {
                    out.push(verdict(MergeAction::Hold, reason, why));
                    i += 1;
                    continue;
                }
                if l.owner == r.owner {
                    let action = MergeAction::Merge {
                        left: l.id,
                        right: r.id,
                        expected: [(l.owner, l.epoch), (r.owner, r.epoch)],
                    };
                    out.push(verdict(action, "cold", format!("both on node {}", l.owner)));
                    count -= 1;
                } else {
                    // The smaller one moves (ties: the right one), unless
                    // only the other's owner can take it.
                    let (small, big) = if ll.bytes < rl.bytes { (l, r) } else { (r, l) };
                    let takes = |n: NodeId| {
                        map.nodes
                            .get(&n)
                            .is_some_and(|n| n.state == NodeState::Up && !n.draining)
                    };
                    let (small, big) = if !takes(big.owner) && takes(small.owner) {
                        (big, small)
                    } else {
                        (small, big)
                    };
                    let (action, reason, why) = if !takes(big.owner) {
                        let why =
                            format!("neither node {} nor {} takes partitions", l.owner, r.owner);
                        (MergeAction::Hold, "owner_down", why)
                    } else if moved {
                        let why = "one co-location move per round".to_string();
                        (MergeAction::Hold, "move_limit", why)
                    } else {
                        moved = true;
                        let action = MergeAction::Move {
                            partition: small.id,
                            to: big.owner,
                        };
                        let why = format!("partition {} moves to node {}", small.id, big.owner);
                        (action, "colocate", why)
                    };
                    out.push(verdict(action, reason, why));
                }
                i += 2;
            }
        }
        out
    }

    /// Forgets every window (the manager stopped leading).
    pub fn clear(&mut self) {
        self.cold_since.clear();
    }
}
