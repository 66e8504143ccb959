//! The replica balancer's tests: hand-built maps in, planned moves asserted.

use super::replicas::{LiveReplicaMove, ReplicaInput, ReplicaPlan, plan_replicas};
use super::{DownPhase, RebalanceConfig};
use keyway_map::{NodeId, NodeInfo, PartitionMap};
use std::collections::{BTreeMap, BTreeSet};

/// Nodes `1..=zones.len()` (with those zones); partition i (ids from 1)
/// owned by `parts[i].0` with replicas `parts[i].1`.
fn world(zones: &[Option<&str>], parts: &[(u64, &[u64])]) -> PartitionMap {
    let first = NodeInfo::up(NodeId(1), "h:1".into());
    let mut map = PartitionMap::bootstrap(&[first], parts.len() as u16).unwrap();
    for (i, z) in zones.iter().enumerate() {
        let id = i as u64 + 1;
        let mut n = NodeInfo::up(NodeId(id), format!("h:{id}"));
        n.zone = z.map(str::to_string);
        map.nodes.insert(NodeId(id), n);
    }
    for (p, (owner, reps)) in map.partitions.values_mut().zip(parts) {
        p.owner = NodeId(*owner);
        p.replicas = reps.iter().map(|n| NodeId(*n)).collect();
        p.in_sync = p.replicas.clone();
    }
    map.validate().unwrap();
    map
}

fn run(
    map: &PartitionMap,
    live: &[LiveReplicaMove],
    config: &RebalanceConfig,
    uncapped: bool,
) -> ReplicaPlan {
    plan_replicas(&ReplicaInput {
        map,
        migrating: &BTreeSet::new(),
        live,
        down: &BTreeMap::<NodeId, DownPhase>::new(),
        config,
        uncapped,
    })
}

/// Applies the plan to the map and checks the copy rules hold.
fn after(map: &PartitionMap, plan: &ReplicaPlan) -> PartitionMap {
    let mut m = map.clone();
    for mv in &plan.moves {
        let row = m.partitions.get_mut(&mv.partition).unwrap();
        assert!(row.replicas.contains(&mv.from), "{mv:?}");
        assert!(!row.has_copy(mv.to), "never two copies on one node: {mv:?}");
        row.replicas.retain(|n| *n != mv.from);
        row.in_sync.retain(|n| *n != mv.from);
        row.replicas.push(mv.to);
    }
    m.validate().unwrap();
    m
}

fn replica_counts(map: &PartitionMap) -> Vec<usize> {
    map.nodes
        .keys()
        .map(|n| {
            map.partitions
                .values()
                .filter(|p| p.replicas.contains(n))
                .count()
        })
        .collect()
}

#[test]
fn replicas_piled_on_one_node_spread_to_their_share_and_primaries_stay() {
    // Primaries balanced (two each), replicas not: node 4 holds six.
    let map = world(
        &[None; 4],
        &[
            (1, &[4]),
            (1, &[4]),
            (2, &[4]),
            (2, &[4]),
            (3, &[4]),
            (3, &[4]),
            (4, &[1]),
            (4, &[1]),
        ],
    );
    assert_eq!(replica_counts(&map), [2, 0, 0, 6]);
    let config = RebalanceConfig::default();
    let whole = run(&map, &[], &config, true);
    assert!(whole.moves.iter().all(|m| m.from == NodeId(4)), "{whole:?}");
    let balanced = after(&map, &whole);
    assert_eq!(replica_counts(&balanced), [2, 2, 2, 2], "{whole:?}");
    assert_eq!(whole.stop.reason, "balanced");
    for p in balanced.partitions.values() {
        assert_eq!(
            p.owner, map.partitions[&p.id].owner,
            "primaries are not moved"
        );
    }
    // One round within the caps (2 in all, 1 per node): node 4 is the
    // donor of every move, so one move per round.
    let round = run(&map, &[], &config, false);
    assert_eq!(round.moves.len(), 1, "{round:?}");
    assert_eq!(round.stop.reason, "cap_reached");
    // A live replica move counts: projected as done, and against the caps.
    let live = [LiveReplicaMove {
        partition: round.moves[0].partition,
        from: round.moves[0].from,
        to: round.moves[0].to,
    }];
    let next = run(&map, &live, &config, false);
    assert!(next.moves.is_empty(), "node 4 is at its cap: {next:?}");
    let next = run(
        &map,
        &live,
        &RebalanceConfig {
            max_moves_per_node: 2,
            ..config.clone()
        },
        false,
    );
    assert_eq!(next.moves.len(), 1, "{next:?}");
    assert_ne!(
        next.moves[0].partition, live[0].partition,
        "a busy partition is left alone"
    );
    assert_ne!(
        next.moves[0].to, live[0].to,
        "the live move's target already has its share"
    );
}

#[test]
fn replica_moves_keep_zones_distinct_and_skip_draining_nodes() {
    // Zone a: nodes 1, 3; zone b: nodes 2, 4, 5. Every replica is on node 2
    // (zone b) of a zone-a primary.
    let mut map = world(
        &[Some("a"), Some("b"), Some("a"), Some("b"), Some("b")],
        &[(1, &[2]), (1, &[2]), (3, &[2]), (3, &[2]), (3, &[2])],
    );
    map.nodes.get_mut(&NodeId(5)).unwrap().draining = true;
    let plan = run(&map, &[], &RebalanceConfig::default(), true);
    assert!(!plan.moves.is_empty(), "{plan:?}");
    for m in &plan.moves {
        assert_eq!(
            m.to,
            NodeId(4),
            "only zone b keeps two zones; 5 drains: {plan:?}"
        );
    }
    let m = after(&map, &plan);
    for p in m.partitions.values() {
        let zones: BTreeSet<_> = p
            .copies()
            .map(|n| m.nodes[&n].zone.clone().unwrap())
            .collect();
        assert_eq!(zones.len(), 2, "{p:?}");
    }
    assert_eq!(plan.stop.reason, "no_improving_move", "{plan:?}");
}

#[test]
fn balanced_replicas_and_down_nodes_plan_nothing() {
    let mut map = world(&[None; 3], &[(1, &[2]), (2, &[3]), (3, &[1])]);
    let plan = run(&map, &[], &RebalanceConfig::default(), true);
    assert!(plan.moves.is_empty());
    assert_eq!(plan.stop.reason, "balanced");
    // Pile them on node 3, then mark node 2 down (within the grace).
    for p in map.partitions.values_mut() {
        p.replicas = vec![if p.owner == NodeId(3) {
            NodeId(1)
        } else {
            NodeId(3)
        }];
        p.in_sync = p.replicas.clone();
    }
    map.nodes.get_mut(&NodeId(2)).unwrap().state = keyway_map::NodeState::Down;
    let plan = run(&map, &[], &RebalanceConfig::default(), true);
    assert!(plan.moves.is_empty());
    assert_eq!(plan.stop.reason, "waiting_for_grace");
}
