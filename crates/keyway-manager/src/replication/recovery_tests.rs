//! Re-replication's pure plan (issue 13): the down grace, the replacement,
//! the removal of the dead replica, the priority and the caps.

use super::membership::{self, Recovery};
use crate::fencing::FencingGate;
use keyway_map::{NodeId, NodeInfo, NodeState, PartitionId, PartitionMap};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

const GRACE: Duration = Duration::from_millis(5_000);

fn map(nodes: u64, per_node: u16, rf: u8) -> PartitionMap {
    let nodes: Vec<NodeInfo> = (1..=nodes)
        .map(|i| NodeInfo::up(NodeId(i), format!("127.0.0.1:{}", 7000 + i)))
        .collect();
    PartitionMap::bootstrap_replicated(&nodes, per_node, rf).unwrap()
}

fn ids(v: &[u64]) -> BTreeSet<NodeId> {
    v.iter().map(|i| NodeId(*i)).collect()
}

fn dead(v: &[u64]) -> Recovery {
    Recovery {
        dead: ids(v),
        ..Recovery::none()
    }
}

fn plan(m: &PartitionMap, live: &[u64], r: &Recovery) -> membership::MembershipPlan {
    membership::plan_recovering(m, &ids(live), &BTreeSet::new(), &BTreeSet::new(), r)
}

/// Node `n` lost its lease and is marked Down.
fn down(m: &mut PartitionMap, n: u64) {
    m.nodes.get_mut(&NodeId(n)).unwrap().state = NodeState::Down;
}

/// The partitions owned by another node with a replica on `n`: those a
/// loss of `n` leaves a copy short.
fn hit_by(m: &PartitionMap, n: u64) -> Vec<PartitionId> {
    m.partitions
        .values()
        .filter(|p| p.owner != NodeId(n) && p.replicas.contains(&NodeId(n)))
        .map(|p| p.id)
        .collect()
}

/// The partitions `plan` gives a replacement for a dead replica.
fn replaced(plan: &membership::MembershipPlan) -> Vec<PartitionId> {
    plan.changes
        .iter()
        .filter(|c| c.reason == "replica_node_dead")
        .map(|c| c.partition)
        .collect()
}

/// The partition owned by a live node with a replica on `n`.
fn replicated_on(m: &PartitionMap, n: u64) -> PartitionId {
    m.partitions
        .values()
        .find(|p| p.owner != NodeId(n) && p.replicas.contains(&NodeId(n)))
        .unwrap()
        .id
}

#[test]
fn nothing_is_re_replicated_before_the_down_grace_then_a_replacement_is_added() {
    let mut m = map(4, 1, 2);
    down(&mut m, 2);
    let live = ids(&[1, 3, 4]);
    let mut gate = FencingGate::new(GRACE);
    let t0 = Instant::now();
    for t in [t0, t0 + GRACE / 2, t0 + GRACE - Duration::from_millis(1)] {
        let d = membership::dead_nodes(&mut gate, &m, &live, t);
        assert!(d.is_empty(), "dead within the grace: {d:?}");
        let r = Recovery {
            dead: d,
            ..Recovery::none()
        };
        let p = plan(&m, &[1, 3, 4], &r);
        assert!(p.changes.is_empty(), "a move on suspicion: {p:?}");
    }
    let d = membership::dead_nodes(&mut gate, &m, &live, t0 + GRACE);
    assert_eq!(d, ids(&[2]));
    let p = replicated_on(&m, 2);
    let plan = plan(
        &m,
        &[1, 3, 4],
        &Recovery {
            dead: d,
            ..Recovery::none()
        },
    );
    let c = plan.changes.iter().find(|c| c.partition == p).unwrap();
    assert_eq!(c.reason, "replica_node_dead");
    assert_eq!(c.removed, []);
    assert_eq!(c.added.len(), 1);
    assert!(![NodeId(2), m.partitions[&p].owner].contains(&c.added[0]));
    assert!(c.row.replicas.contains(&NodeId(2)), "kept until in sync");
    // The lease came back before the grace: the clock starts over.
    let mut gate = FencingGate::new(GRACE);
    membership::dead_nodes(&mut gate, &m, &live, t0);
    membership::dead_nodes(&mut gate, &m, &ids(&[1, 2, 3, 4]), t0 + GRACE / 2);
    assert!(membership::dead_nodes(&mut gate, &m, &live, t0 + GRACE).is_empty());
}

#[test]
fn the_dead_replica_is_removed_only_once_its_replacement_is_in_sync() {
    for dead_was_in_sync in [true, false] {
        let mut m = map(4, 1, 2);
        down(&mut m, 2);
        let p = replicated_on(&m, 2);
        if !dead_was_in_sync {
            m.partitions.get_mut(&p).unwrap().in_sync.clear();
        }
        let c = plan(&m, &[1, 3, 4], &dead(&[2]))
            .changes
            .into_iter()
            .find(|c| c.partition == p)
            .unwrap();
        let target = c.added[0];
        m.partitions.insert(p, c.row.clone());
        m.validate().unwrap();
        let again = plan(&m, &[1, 3, 4], &dead(&[2]));
        assert!(again.changes.iter().all(|c| c.partition != p), "{again:?}");
        assert!(
            again
                .skipped
                .iter()
                .any(|s| s.partition == p && s.reason == "waiting_for_catch_up"),
            "{again:?}"
        );
        // The primary copied the replacement and took it in.
        m.partitions.get_mut(&p).unwrap().in_sync.push(target);
        let done = plan(&m, &[1, 3, 4], &dead(&[2]));
        let c = done.changes.iter().find(|c| c.partition == p).unwrap();
        assert_eq!(c.reason, "dead_replica_replaced");
        assert_eq!(
            (c.added.as_slice(), c.removed.as_slice()),
            (&[][..], &[NodeId(2)][..])
        );
        assert_eq!(c.row.replicas, [target]);
        assert_eq!(c.row.in_sync, [target]);
        m.partitions.insert(p, c.row.clone());
        m.validate().unwrap();
        assert!(
            !m.partitions
                .values()
                .any(|p| p.has_copy(NodeId(2)) && p.owner != NodeId(2))
        );
    }
}

#[test]
fn the_partitions_with_the_fewest_in_sync_copies_go_first_within_the_total_cap() {
    // RF 3 on 5 nodes: node 5 dies. Of two partitions with a replica on
    // it, `a` keeps an in-sync replica besides its primary, `b` does not.
    let mut m = map(5, 2, 3);
    down(&mut m, 5);
    let hit = hit_by(&m, 5);
    assert!(hit.len() >= 2, "{hit:?}");
    let (a, b) = (hit[0], hit[1]);
    // b (the higher id) has lost its other replica's sync: one copy in flight.
    let other = *m.partitions[&b]
        .replicas
        .iter()
        .find(|r| **r != NodeId(5))
        .unwrap();
    m.partitions
        .get_mut(&b)
        .unwrap()
        .in_sync
        .retain(|r| *r != other);
    let r = Recovery {
        dead: ids(&[5]),
        max_copies_per_node: usize::MAX,
        // One in flight already (b's other replica): room for one more.
        max_copies: 2,
    };
    let plan = plan(&m, &[1, 2, 3, 4], &r);
    let added = replaced(&plan);
    assert_eq!(added, [b], "fewest in-sync copies first: {plan:?}");
    assert!(
        plan.skipped
            .iter()
            .any(|s| s.partition == a && s.reason == "recovery_throttled"),
        "{plan:?}"
    );
}

#[test]
fn a_target_node_gets_no_more_copies_in_flight_than_the_per_node_cap() {
    let mut m = map(4, 3, 2);
    down(&mut m, 4);
    let hit = hit_by(&m, 4);
    assert!(hit.len() >= 2, "{hit:?}");
    // A node is already the target of a copy in flight: its replica of a
    // partition whose primary holds its lease (only such a replica
    // copies) is out of sync.
    let (busy, busy_node) = m
        .partitions
        .values()
        .find_map(|p| {
            let r = p.replicas.iter().find(|r| **r != NodeId(4))?;
            (p.owner != NodeId(4)).then_some((p.id, *r))
        })
        .unwrap();
    m.partitions.get_mut(&busy).unwrap().in_sync.clear();
    let r = Recovery {
        dead: ids(&[4]),
        max_copies_per_node: 1,
        max_copies: usize::MAX,
    };
    let plan = plan(&m, &[1, 2, 3], &r);
    let mut per_node = std::collections::BTreeMap::<NodeId, usize>::new();
    for c in plan
        .changes
        .iter()
        .filter(|c| c.reason == "replica_node_dead")
    {
        for n in &c.added {
            *per_node.entry(*n).or_default() += 1;
        }
    }
    assert!(
        !per_node.contains_key(&busy_node),
        "node {busy_node} is at its cap: {plan:?}"
    );
    assert!(per_node.values().all(|c| *c <= 1), "{per_node:?}");
    let placed: usize = per_node.values().sum();
    let throttled = plan
        .skipped
        .iter()
        .filter(|s| s.reason == "recovery_throttled")
        .count();
    assert_eq!(placed + throttled, hit.len(), "{plan:?}");
    assert!(throttled > 0, "{plan:?}");
}

#[test]
fn out_of_sync_replicas_of_an_offline_partition_hold_no_recovery_slot() {
    // Node 3 is lost for good while its own partitions' replicas were out
    // of sync: those partitions are offline (no failover target), and
    // their replicas on nodes 1 and 2 copy nothing.
    let mut m = map(3, 2, 2);
    down(&mut m, 3);
    for p in m.partitions.values_mut() {
        if p.owner == NodeId(3) {
            p.in_sync.clear();
        }
    }
    let offline_replicas = m
        .partitions
        .values()
        .filter(|p| p.owner == NodeId(3))
        .map(|p| p.replicas.len())
        .sum::<usize>();
    assert!(offline_replicas >= 2, "{m:?}");
    let hit = hit_by(&m, 3);
    assert!(!hit.is_empty(), "{m:?}");
    // One copy in flight per node and in all: an offline partition's
    // replica counted as one would leave no slot for any replacement.
    let r = Recovery {
        dead: ids(&[3]),
        max_copies_per_node: 1,
        max_copies: 1,
    };
    let plan = plan(&m, &[1, 2], &r);
    let added = replaced(&plan);
    assert_eq!(added.len(), 1, "one replacement within the caps: {plan:?}");
    assert!(hit.contains(&added[0]), "{plan:?}");
    // The offline partitions themselves change nothing: they wait for
    // their primary.
    assert!(
        plan.changes
            .iter()
            .all(|c| m.partitions[&c.partition].owner != NodeId(3)),
        "{plan:?}"
    );
}
