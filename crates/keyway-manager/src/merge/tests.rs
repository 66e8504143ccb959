//! Merges: the policy's every rule (pure), the planned transaction, and
//! refusals against a real embedded metadata store.

use super::*;
use crate::split::testing::*;
use crate::split::{Birth, Busy, History};
use keyway_map::{MapVersion, NodeState};
use std::collections::HashSet;
use std::time::{Duration, Instant};

fn pid(n: u64) -> PartitionId {
    PartitionId(n)
}

fn cfg(min_per_node: u32) -> MergeConfig {
    MergeConfig {
        merge_max_requests_per_sec: 100.0,
        merge_cold_window_ms: 0,
        merge_max_bytes: 10_000,
        merge_after_split_cooldown_ms: 600_000,
        merge_min_partitions_per_node: min_per_node,
        ..MergeConfig::default()
    }
}

struct Round<'a> {
    cfg: MergeConfig,
    busy: Busy,
    hot: HashSet<PartitionId>,
    history: History,
    map: &'a PartitionMap,
}

impl<'a> Round<'a> {
    fn new(map: &'a PartitionMap, min_per_node: u32) -> Self {
        Round {
            cfg: cfg(min_per_node),
            busy: Busy::new(),
            hot: HashSet::new(),
            history: History::default(),
            map,
        }
    }

    fn run(&self, policy: &mut MergePolicy, load: &ClusterLoad, now: Instant) -> Vec<MergeVerdict> {
        policy.decide(
            &self.cfg,
            self.map,
            load,
            &self.busy,
            &self.hot,
            &self.history,
            now,
        )
    }

    /// `(subject, reason)` of one round with a fresh policy.
    fn reasons(&self, load: &ClusterLoad) -> Vec<(String, &'static str)> {
        let verdicts = self.run(&mut MergePolicy::default(), load, Instant::now());
        verdicts
            .into_iter()
            .map(|v| (v.subject, v.reason))
            .collect()
    }
}

fn pairs(list: &[(&str, &'static str)]) -> Vec<(String, &'static str)> {
    list.iter().map(|(s, r)| (s.to_string(), *r)).collect()
}

use crate::stats::ClusterLoad;

#[test]
fn cold_small_neighbours_on_one_node_merge_pairwise_down_to_the_floor() {
    let map = hash_map(2, 4); // p1-p4 on node 1, p5-p8 on node 2
    let cold = uniform_load(&map, 1_000, 1.0);
    let verdicts = Round::new(&map, 3).run(&mut MergePolicy::default(), &cold, Instant::now());
    assert_eq!(
        verdicts[0].action,
        MergeAction::Merge {
            left: pid(1),
            right: pid(2),
            expected: [(NodeId(1), Epoch(1)), (NodeId(1), Epoch(1))],
        }
    );
    let got: Vec<_> = verdicts
        .iter()
        .map(|v| (v.subject.clone(), v.reason))
        .collect();
    assert_eq!(
        got,
        pairs(&[("1+2", "cold"), ("3+4", "cold"), ("keyspace 0", "at_floor")]),
        "8 partitions, floor 3 × 2 nodes: two merges"
    );
    assert_eq!(
        Round::new(&map, 4).reasons(&cold),
        pairs(&[("keyspace 0", "at_floor")]),
        "the bootstrap layout (4 per node) is never merged away"
    );
}

#[test]
fn hot_migrating_and_freshly_split_partitions_are_held_back() {
    let map = hash_map(2, 4);
    let cold = uniform_load(&map, 1_000, 1.0);
    let mut round = Round::new(&map, 1);
    round.hot.insert(pid(2));
    round.busy.insert(
        pid(6),
        (
            keyway_migration::MigrationId(3),
            keyway_migration::MigrationState::Dual,
        ),
    );
    let now = Instant::now();
    round
        .history
        .born(pid(8), Birth::Split, now - Duration::from_secs(300));
    round
        .history
        .born(pid(3), Birth::Merge, now - Duration::from_secs(1));
    assert_eq!(
        round.reasons(&cold),
        pairs(&[
            ("1+2", "hot"),
            ("2+3", "hot"),
            ("3+4", "cold"),
            ("5+6", "migrating"),
            ("6+7", "migrating"),
            ("7+8", "cooldown"),
        ]),
        "4+5 are on different nodes but 4 is taken by 3+4"
    );
    // Once the split is old enough, 7+8 merge.
    round
        .history
        .born(pid(8), Birth::Split, now - Duration::from_secs(601));
    assert!(round.reasons(&cold).contains(&("7+8".to_string(), "cold")));
}

#[test]
fn only_neighbours_that_are_cold_and_small_together_are_candidates() {
    let map = hash_map(2, 4);
    let mut load = uniform_load(&map, 1_000, 1.0);
    // p2 warm: 1+2 and 2+3 are no candidates, and 1+3 are not neighbours.
    *load.partitions.get_mut(&pid(2)).unwrap() = load_of(&map.partitions[&pid(2)], 1_000, 100.0);
    // 5+6 too big together; 7's report is from another epoch (stale).
    load.partitions.get_mut(&pid(5)).unwrap().bytes = 9_500;
    load.partitions.get_mut(&pid(7)).unwrap().epoch = Epoch(9);
    let round = Round::new(&map, 1);
    assert_eq!(round.reasons(&load), pairs(&[("3+4", "cold")]));
}

#[test]
fn cold_means_cold_for_the_whole_window() {
    let map = hash_map(2, 4);
    let mut round = Round::new(&map, 1);
    round.cfg.merge_cold_window_ms = 60_000;
    let t0 = Instant::now();
    let at = |s: u64| t0 + Duration::from_secs(s);
    let cold = uniform_load(&map, 1_000, 1.0);
    let mut warm = cold.clone();
    *warm.partitions.get_mut(&pid(1)).unwrap() = load_of(&map.partitions[&pid(1)], 1_000, 150.0);
    let mut policy = MergePolicy::default();
    assert!(round.run(&mut policy, &cold, at(0)).is_empty());
    assert!(round.run(&mut policy, &warm, at(30)).is_empty());
    let subjects = |v: Vec<MergeVerdict>| v.into_iter().map(|v| v.subject).collect::<Vec<_>>();
    assert_eq!(
        subjects(round.run(&mut policy, &cold, at(60))),
        ["2+3", "4+5", "6+7"],
        "p1 was warm at 30 s: its window restarted"
    );
    assert_eq!(subjects(round.run(&mut policy, &cold, at(110)))[0], "2+3");
    assert_eq!(subjects(round.run(&mut policy, &cold, at(120)))[0], "1+2");
}

#[test]
fn neighbours_on_two_nodes_are_colocated_first_the_smaller_moving() {
    let map = hash_map(3, 2); // p1,p2 on 1; p3,p4 on 2; p5,p6 on 3
    let mut load = uniform_load(&map, 100, 1.0);
    for warm in [1, 6] {
        *load.partitions.get_mut(&pid(warm)).unwrap() =
            load_of(&map.partitions[&pid(warm)], 100, 500.0);
    }
    load.partitions.get_mut(&pid(3)).unwrap().bytes = 50;
    let verdicts = Round::new(&map, 1).run(&mut MergePolicy::default(), &load, Instant::now());
    let got: Vec<_> = verdicts.iter().map(|v| (&v.action, v.reason)).collect();
    assert_eq!(
        got,
        [
            (
                &MergeAction::Move {
                    partition: pid(3),
                    to: NodeId(1)
                },
                "colocate"
            ),
            (&MergeAction::Hold, "move_limit"),
        ]
    );
    // A node that takes no partitions (down) is never moved to: the other
    // half moves instead, and the floor counts Up nodes only.
    let mut down = map.clone();
    down.nodes.get_mut(&NodeId(1)).unwrap().state = NodeState::Down;
    let verdicts = Round::new(&down, 1).run(&mut MergePolicy::default(), &load, Instant::now());
    assert_eq!(
        verdicts[0].action,
        MergeAction::Move {
            partition: pid(2),
            to: NodeId(2)
        }
    );
}

#[test]
fn merge_txn_conditions_on_both_halves_and_a_fresh_id() {
    let map = hash_map(2, 2);
    let plan = plan_merge(&map, pid(2), pid(1)).unwrap();
    let (p1, p2) = (&map.partitions[&pid(1)], &map.partitions[&pid(2)]);
    assert_eq!(
        (plan.left.id, plan.right.id),
        (pid(1), pid(2)),
        "either order"
    );
    assert_eq!(plan.merged.id, pid(5));
    assert_eq!((&plan.merged.start, &plan.merged.end), (&p1.start, &p2.end));
    assert_eq!(plan.merged.epoch, Epoch(2));
    assert_eq!(
        plan.txn.conditions,
        vec![
            OwnershipCondition {
                partition: pid(1),
                expected: Some((p1.owner, Epoch(1)))
            },
            OwnershipCondition {
                partition: pid(2),
                expected: Some((p2.owner, Epoch(1)))
            },
            OwnershipCondition {
                partition: pid(5),
                expected: None
            },
        ]
    );
    let mut next = map.clone();
    next.apply(MapVersion(map.version.0 + 1), &plan.txn.changes)
        .unwrap();
    next.validate().unwrap();
    assert_eq!(next.next_partition_id, pid(6));
    assert_eq!(
        plan_merge(&map, pid(1), pid(3)),
        Err(MergeError::NotAdjacent {
            left: pid(1),
            right: pid(3)
        })
    );
    assert!(matches!(
        plan_merge(&map, pid(2), pid(3)),
        Err(MergeError::DifferentOwners { .. })
    ));
    assert!(matches!(
        plan_merge(&map, pid(1), pid(1)),
        Err(MergeError::NotAdjacent { .. })
    ));
    // The last hash partition and the first range one are not neighbours.
    let both = with_range_keyspace(&map, &[], NodeId(2));
    assert!(matches!(
        plan_merge(&both, pid(4), pid(5)),
        Err(MergeError::NotAdjacent { .. })
    ));
}

#[test]
fn a_merge_of_replicated_halves_keeps_only_replicas_in_sync_for_both() {
    let nodes: Vec<_> = (1..=3).map(node).collect();
    // Partitions 1 and 2 are node 1's, replicas [2, 3], all in sync.
    let mut map = PartitionMap::bootstrap_replicated(&nodes, 2, 3).unwrap();
    map.partitions.get_mut(&pid(1)).unwrap().in_sync = vec![NodeId(2), NodeId(3)];
    {
        let right = map.partitions.get_mut(&pid(2)).unwrap();
        right.replicas = vec![NodeId(3), NodeId(2)];
        right.in_sync = vec![NodeId(3)];
    }
    let plan = plan_merge(&map, pid(1), pid(2)).unwrap();
    assert_eq!(
        plan.merged.replicas,
        [NodeId(2), NodeId(3)],
        "same set, any order"
    );
    assert_eq!(
        plan.merged.in_sync,
        [NodeId(3)],
        "node 2 was not in sync for the right half"
    );
    // Reads on node 2 for the left half cannot stay: it is not in sync
    // for the merged range (the row would not validate).
    map.partitions.get_mut(&pid(1)).unwrap().reads_from = Some(NodeId(2));
    assert_eq!(
        plan_merge(&map, pid(1), pid(2)).unwrap().merged.reads_from,
        None
    );
    // On node 3 for both halves (in sync for both): kept.
    map.partitions.get_mut(&pid(1)).unwrap().reads_from = Some(NodeId(3));
    map.partitions.get_mut(&pid(2)).unwrap().reads_from = Some(NodeId(3));
    assert_eq!(
        plan_merge(&map, pid(1), pid(2)).unwrap().merged.reads_from,
        Some(NodeId(3))
    );
    map.partitions.get_mut(&pid(1)).unwrap().reads_from = None;
    map.partitions.get_mut(&pid(2)).unwrap().reads_from = None;
    // Different replica sets do not merge.
    map.partitions.get_mut(&pid(2)).unwrap().replicas = vec![NodeId(3)];
    map.partitions.get_mut(&pid(2)).unwrap().in_sync = vec![];
    assert!(matches!(
        plan_merge(&map, pid(1), pid(2)),
        Err(MergeError::DifferentReplicas { .. })
    ));
}

#[test]
fn merge_config_keeps_hysteresis_with_splits() {
    let split = crate::SplitConfig::default();
    let merge = MergeConfig::default();
    assert_eq!(merge.validate(), Ok(()));
    assert_eq!(merge.validate_against(&split), Ok(()));
    let big = MergeConfig {
        merge_max_bytes: split.split_max_bytes,
        ..MergeConfig::default()
    };
    assert!(
        big.validate_against(&split)
            .unwrap_err()
            .contains("merge_max_bytes")
    );
    let busy = MergeConfig {
        merge_max_requests_per_sec: 6_000.0,
        ..MergeConfig::default()
    };
    assert!(busy.validate_against(&split).is_err());
    let off = MergeConfig {
        enabled: false,
        ..busy
    };
    assert_eq!(off.validate_against(&split), Ok(()));
    let zero = MergeConfig {
        merge_min_partitions_per_node: 0,
        ..MergeConfig::default()
    };
    assert!(zero.validate().is_err());
}

#[tokio::test]
async fn a_merge_decided_on_old_epochs_loses_cleanly() {
    let (meta, _dir) = store(2, 2).await;
    let map = meta.get_map().await.unwrap();
    let (p1, p2) = (&map.partitions[&pid(1)], &map.partitions[&pid(2)]);
    let expected = [(p1.owner, p1.epoch), (p2.owner, p2.epoch)];
    // p2 changes (split) after the decision.
    crate::split_partition(&*meta, pid(2), crate::SplitAt::Auto)
        .await
        .unwrap();
    let after = meta.get_map().await.unwrap();
    assert_eq!(
        merge_checked(&*meta, pid(1), pid(2), Some(expected)).await,
        Err(MergeError::Lost {
            partition: pid(2),
            current: None
        })
    );
    assert_eq!(meta.get_map().await.unwrap(), after);
    assert!(matches!(
        merge_partitions(&*meta, pid(2), pid(3)).await,
        Err(MergeError::UnknownPartition(_))
    ));
    assert!(matches!(
        merge_partitions(&*meta, pid(4), pid(3)).await,
        Ok(merged) if merged.epoch == Epoch(2)
    ));
}
