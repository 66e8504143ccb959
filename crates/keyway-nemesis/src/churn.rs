//! The topology churn: live moves, splits and merges through `keyway ctl`,
//! several at once, beside the fault schedule. With replication a move goes
//! only to a node without a copy of the partition, and a merge pairs only
//! neighbours with one owner and the same replicas (others are refused).

use crate::cluster::ctl;
use crate::faults::{CTL_TIMEOUT, Target, current_map};
use keyway_map::{DEFAULT_KEYSPACE, PartitionMap};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::time::Duration;

/// Most partitions churn splits up to (beyond it, it merges instead).
const MAX_PARTITIONS: usize = 40;
/// Pause between two churn actions of one worker, milliseconds.
const CHURN_GAP_MS: std::ops::Range<u64> = 200..1_500;

/// A topology change the churn makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ChurnKind {
    Move,
    Split,
    Merge,
}

impl ChurnKind {
    pub fn name(self) -> &'static str {
        match self {
            ChurnKind::Move => "move",
            ChurnKind::Split => "split",
            ChurnKind::Merge => "merge",
        }
    }
}

/// Requested and failed churn actions by kind.
#[derive(Clone, Debug, Default)]
pub struct ChurnCounts {
    pub requested: BTreeMap<ChurnKind, u64>,
    pub failed: BTreeMap<ChurnKind, u64>,
}

/// One churn worker: until `stop`, every few hundred milliseconds one
/// random move, split or merge (of the enabled kinds) through `keyway ctl`.
/// Failures are expected under faults: they are counted, not errors.
pub async fn churn_worker(
    target: Target,
    seed: u64,
    kinds: Vec<ChurnKind>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> ChurnCounts {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut counts = ChurnCounts::default();
    if kinds.is_empty() {
        return counts;
    }
    while !*stop.borrow() {
        tokio::time::sleep(Duration::from_millis(rng.random_range(CHURN_GAP_MS))).await;
        if *stop.borrow() {
            break;
        }
        let kind = kinds[rng.random_range(0..kinds.len())];
        let pick: u64 = rng.random();
        let Some(map) = current_map(&target).await else {
            *counts.failed.entry(kind).or_default() += 1;
            *counts.requested.entry(kind).or_default() += 1;
            continue;
        };
        let Some((kind, args)) = churn_args(&map, kind, &kinds, pick) else {
            continue;
        };
        *counts.requested.entry(kind).or_default() += 1;
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        match ctl(
            &target.bin,
            &target.meta_url,
            &target.secret_file,
            &refs,
            CTL_TIMEOUT,
        )
        .await
        {
            Ok(_) => target.log.note(&format!("ctl {}", args.join(" "))),
            Err(e) => {
                *counts.failed.entry(kind).or_default() += 1;
                target
                    .log
                    .note(&format!("ctl {} failed: {e}", args.join(" ")));
            }
        }
    }
    counts
}

/// Whether two partitions have the same replicas (a merge needs it).
fn same_replicas(a: &keyway_map::PartitionRecord, b: &keyway_map::PartitionRecord) -> bool {
    let mut x = a.replicas.clone();
    let mut y = b.replicas.clone();
    x.sort();
    y.sort();
    x == y
}

/// The `keyway ctl` arguments of one churn action on `map` (`pick` chooses
/// among the candidates). A split beyond [`MAX_PARTITIONS`] becomes a merge;
/// a merge with no two neighbours on one node becomes a move that makes some.
fn churn_args(
    map: &PartitionMap,
    kind: ChurnKind,
    enabled: &[ChurnKind],
    pick: u64,
) -> Option<(ChurnKind, Vec<String>)> {
    let parts: Vec<_> = map.keyspace_partitions(DEFAULT_KEYSPACE).collect();
    let nodes: Vec<_> = map.nodes.keys().copied().collect();
    if parts.is_empty() || nodes.is_empty() {
        return None;
    }
    let nth = |n: usize| (pick % n as u64) as usize;
    let kind = if kind == ChurnKind::Split
        && parts.len() >= MAX_PARTITIONS
        && enabled.contains(&ChurnKind::Merge)
    {
        ChurnKind::Merge
    } else {
        kind
    };
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    match kind {
        ChurnKind::Move => {
            let p = parts[nth(parts.len())];
            // Never to a node with a copy already (the primary or a
            // replica: a move to a replica is refused).
            let others: Vec<_> = nodes.iter().filter(|n| !p.has_copy(**n)).collect();
            if others.is_empty() {
                return None;
            }
            let to = others[(pick / 7 % others.len() as u64) as usize].to_string();
            Some((
                kind,
                s(&["move", &p.id.to_string(), "--to", &to, "--detach"]),
            ))
        }
        ChurnKind::Split => {
            if parts.len() >= MAX_PARTITIONS {
                return None;
            }
            let splittable: Vec<_> = parts
                .iter()
                .filter(|p| {
                    let (a, b) = p.slot_span();
                    b > a
                })
                .collect();
            if splittable.is_empty() {
                return None;
            }
            let p = splittable[nth(splittable.len())];
            Some((kind, s(&["split", &p.id.to_string()])))
        }
        ChurnKind::Merge => {
            let pairs: Vec<_> = parts
                .windows(2)
                .filter(|w| w[0].owner == w[1].owner && same_replicas(w[0], w[1]))
                .collect();
            if pairs.is_empty() {
                // Make a mergeable pair for a later round, if moves are allowed.
                if !enabled.contains(&ChurnKind::Move) || parts.len() < 2 {
                    return None;
                }
                let i = nth(parts.len() - 1);
                let (a, b) = (parts[i], parts[i + 1]);
                return Some((
                    ChurnKind::Move,
                    s(&[
                        "move",
                        &b.id.to_string(),
                        "--to",
                        &a.owner.to_string(),
                        "--detach",
                    ]),
                ));
            }
            let w = pairs[nth(pairs.len())];
            Some((
                kind,
                s(&["merge", &w[0].id.to_string(), &w[1].id.to_string()]),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicated_churn_moves_only_to_nodes_without_a_copy() {
        use keyway_map::{NodeId, NodeInfo};
        let nodes: Vec<NodeInfo> = (1..=4)
            .map(|i| NodeInfo::up(NodeId(i), format!("127.0.0.1:{i}")))
            .collect();
        let mut map = PartitionMap::bootstrap_replicated(&nodes, 2, 2).unwrap();
        map.reindex();
        for pick in 0..200u64 {
            let (kind, args) = churn_args(&map, ChurnKind::Move, &[ChurnKind::Move], pick).unwrap();
            assert_eq!(kind, ChurnKind::Move);
            let id = keyway_map::PartitionId(args[1].parse().unwrap());
            let to = NodeId::parse(&args[3]).unwrap();
            assert!(!map.partitions[&id].has_copy(to), "{args:?}");
        }
        // Merges pair only neighbours with one owner and the same replicas.
        for pick in 0..50u64 {
            if let Some((ChurnKind::Merge, args)) =
                churn_args(&map, ChurnKind::Merge, &[ChurnKind::Merge], pick)
            {
                let a = &map.partitions[&keyway_map::PartitionId(args[1].parse().unwrap())];
                let b = &map.partitions[&keyway_map::PartitionId(args[2].parse().unwrap())];
                assert!(a.owner == b.owner && same_replicas(a, b));
            }
        }
    }
}
