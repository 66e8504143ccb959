//! The pure plans: failover, membership, the in-sync diff.

use super::failover::Failover;
use super::membership;
use super::observe;
use keyway_map::{Epoch, NodeId, NodeInfo, PartitionId, PartitionMap};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

const MARGIN: Duration = Duration::from_millis(1_000);

fn node(id: u64, zone: Option<&str>) -> NodeInfo {
    let mut n = NodeInfo::up(NodeId(id), format!("127.0.0.1:{}", 7000 + id));
    n.zone = zone.map(str::to_string);
    n
}

/// `nodes` nodes, one partition each, replication factor `rf`.
fn map(nodes: u64, rf: u8) -> PartitionMap {
    let nodes: Vec<NodeInfo> = (1..=nodes).map(|i| node(i, None)).collect();
    PartitionMap::bootstrap_replicated(&nodes, 1, rf).unwrap()
}

fn live(ids: &[u64]) -> BTreeSet<NodeId> {
    ids.iter().map(|i| NodeId(*i)).collect()
}

fn owned_by(map: &PartitionMap, node: u64) -> PartitionId {
    map.owned_by(NodeId(node)).next().unwrap().id
}

#[test]
fn nothing_fails_over_before_the_lease_is_gone_for_the_margin() {
    let m = map(3, 2);
    let mut f = Failover::new(MARGIN);
    let t0 = Instant::now();
    let plan = f.plan(&m, &live(&[1, 2, 3]), t0);
    assert!(plan.promotions.is_empty() && plan.waiting.is_empty());
    // Node 1's lease is gone: only waiting, until the margin has passed.
    let plan = f.plan(&m, &live(&[2, 3]), t0);
    assert!(plan.promotions.is_empty());
    assert_eq!(plan.waiting.len(), 1);
    assert_eq!(plan.waiting[0].reason, "within_margin");
    let plan = f.plan(&m, &live(&[2, 3]), t0 + MARGIN - Duration::from_millis(1));
    assert!(plan.promotions.is_empty(), "{plan:?}");
    let plan = f.plan(&m, &live(&[2, 3]), t0 + MARGIN);
    assert_eq!(plan.promotions.len(), 1, "{plan:?}");
    assert_eq!(plan.promotions[0].lease_gone_since, t0);
    // The lease came back before anything committed: the clock starts over.
    let plan = f.plan(&m, &live(&[1, 2, 3]), t0 + MARGIN * 2);
    assert!(plan.promotions.is_empty() && plan.waiting.is_empty());
    let plan = f.plan(&m, &live(&[2, 3]), t0 + MARGIN * 2);
    assert!(plan.promotions.is_empty());
}

#[test]
fn the_promotion_is_one_cas_to_an_in_sync_replica() {
    let m = map(3, 3);
    let p = owned_by(&m, 1);
    let old = m.partitions[&p].clone();
    assert_eq!(old.replicas, [NodeId(2), NodeId(3)]);
    let mut f = Failover::new(MARGIN);
    let t0 = Instant::now();
    f.plan(&m, &live(&[2, 3]), t0);
    let plan = f.plan(&m, &live(&[2, 3]), t0 + MARGIN);
    assert_eq!(plan.promotions.len(), 1, "one CAS per partition: {plan:?}");
    let pr = &plan.promotions[0];
    assert_eq!(pr.partition, p);
    assert_eq!(pr.expected, (NodeId(1), old.epoch));
    assert_eq!(pr.row.epoch, Epoch(old.epoch.0 + 1));
    // Node 2 and 3 own one partition each: the lowest id wins the tie.
    assert_eq!(pr.row.owner, NodeId(2));
    assert_eq!(pr.row.replicas, [NodeId(3), NodeId(1)]);
    assert!(pr.row.in_sync.is_empty(), "every copy re-syncs from R");
    let mut after = m.clone();
    after.partitions.insert(p, pr.row.clone());
    after.validate().unwrap();
}

#[test]
fn only_an_in_sync_replica_is_promoted_never_an_unclean_election() {
    let mut m = map(3, 3);
    let p = owned_by(&m, 1);
    // Node 2 fell out of the in-sync set; node 3 is in it but dead.
    m.partitions.get_mut(&p).unwrap().in_sync = vec![NodeId(3)];
    let mut f = Failover::new(MARGIN);
    let t0 = Instant::now();
    f.plan(&m, &live(&[2]), t0);
    let plan = f.plan(&m, &live(&[2]), t0 + MARGIN);
    assert!(
        plan.promotions.iter().all(|pr| pr.partition != p),
        "node 2 is alive but not in sync: {plan:?}"
    );
    let w = plan.waiting.iter().find(|w| w.partition == p).unwrap();
    assert_eq!(w.reason, "no_in_sync_replica_alive");
    assert!(
        w.detail.contains("waiting: no in-sync replica alive"),
        "{}",
        w.detail
    );
    // Node 3 is back: it is promoted, node 2 never.
    let plan = f.plan(&m, &live(&[2, 3]), t0 + MARGIN * 2);
    let pr = plan.promotions.iter().find(|pr| pr.partition == p).unwrap();
    assert_eq!(pr.row.owner, NodeId(3));
}

#[test]
fn the_replica_with_fewest_primaries_is_preferred() {
    let mut m = map(4, 3);
    // Partition of node 1 has replicas 2 and 3; give node 2 two more primaries.
    let p = owned_by(&m, 1);
    let (p3, p4) = (owned_by(&m, 3), owned_by(&m, 4));
    for q in [p3, p4] {
        let row = m.partitions.get_mut(&q).unwrap();
        row.owner = NodeId(2);
        row.replicas.retain(|r| *r != NodeId(2));
        row.in_sync.retain(|r| *r != NodeId(2));
    }
    m.validate().unwrap();
    let mut f = Failover::new(MARGIN);
    let t0 = Instant::now();
    f.plan(&m, &live(&[2, 3, 4]), t0);
    let plan = f.plan(&m, &live(&[2, 3, 4]), t0 + MARGIN);
    let pr = plan.promotions.iter().find(|pr| pr.partition == p).unwrap();
    assert_eq!(m.partitions[&p].replicas, [NodeId(2), NodeId(3)]);
    assert_eq!(
        pr.row.owner,
        NodeId(3),
        "node 2 has 3 primaries, node 3 one"
    );
}

#[test]
fn a_stale_row_is_re_planned_from_its_new_state() {
    let m = map(3, 3);
    let p = owned_by(&m, 1);
    let mut f = Failover::new(MARGIN);
    let t0 = Instant::now();
    f.plan(&m, &live(&[2, 3]), t0);
    let first = f.plan(&m, &live(&[2, 3]), t0 + MARGIN);
    assert_eq!(first.promotions[0].expected, (NodeId(1), Epoch(1)));
    // Meanwhile the row changed (node 2 left the in-sync set at epoch 2):
    // the CAS above fails; the next round plans from the new row.
    let mut m2 = m.clone();
    let row = m2.partitions.get_mut(&p).unwrap();
    row.in_sync = vec![NodeId(3)];
    row.epoch = Epoch(2);
    let again = f.plan(
        &m2,
        &live(&[2, 3]),
        t0 + MARGIN + Duration::from_millis(250),
    );
    let pr = &again.promotions[0];
    assert_eq!(pr.expected, (NodeId(1), Epoch(2)));
    assert_eq!((pr.row.owner, pr.row.epoch), (NodeId(3), Epoch(3)));
    assert_eq!(
        pr.lease_gone_since, t0,
        "the duration counts from the first sight"
    );
}

#[test]
fn an_unreplicated_partition_waits_with_its_reason() {
    let m = map(2, 1);
    let mut f = Failover::new(MARGIN);
    let t0 = Instant::now();
    f.plan(&m, &live(&[2]), t0);
    let plan = f.plan(&m, &live(&[2]), t0 + MARGIN);
    assert!(plan.promotions.is_empty());
    assert_eq!(plan.waiting[0].reason, "unreplicated");
}

#[test]
#[should_panic(expected = "only an in-sync replica may be promoted")]
fn promoting_a_replica_out_of_sync_is_refused_at_the_boundary() {
    let mut m = map(2, 2);
    let p = owned_by(&m, 1);
    let row = m.partitions.get_mut(&p).unwrap();
    row.in_sync.clear();
    super::promoted(row, NodeId(2));
}

// ---- membership ----

#[test]
fn membership_adds_on_a_distinct_zone_with_fewest_copies() {
    let nodes = vec![
        node(1, Some("a")),
        node(2, Some("a")),
        node(3, Some("b")),
        node(4, Some("b")),
    ];
    let mut m = PartitionMap::bootstrap_replicated(&nodes, 1, 1).unwrap();
    m.keyspaces.values_mut().next().unwrap().replication_factor = 2;
    let plan = membership::plan(&m, &live(&[1, 2, 3, 4]), &BTreeSet::new());
    assert_eq!(plan.changes.len(), 4, "one CAS per partition");
    for c in &plan.changes {
        let old = &m.partitions[&c.partition];
        assert_eq!(c.expected, (old.owner, old.epoch));
        assert_eq!(c.row.epoch, Epoch(old.epoch.0 + 1));
        assert_eq!(c.added.len(), 1);
        assert!(c.row.in_sync.is_empty(), "a new replica is not in sync");
        let owner_zone = &m.nodes[&old.owner].zone;
        let new_zone = &m.nodes[&c.added[0]].zone;
        assert_ne!(owner_zone, new_zone, "distinct zone first: {c:?}");
    }
    // Fewest copies: every node got exactly one replica.
    let mut per: Vec<u64> = plan.changes.iter().map(|c| c.added[0].0).collect();
    per.sort();
    assert_eq!(per, [1, 2, 3, 4]);
}

#[test]
fn membership_never_replaces_a_replica_that_is_merely_down() {
    let mut m = map(3, 2);
    // Node 2 lost its lease and is marked Down: its replicas stay.
    m.nodes.get_mut(&NodeId(2)).unwrap().state = keyway_map::NodeState::Down;
    let plan = membership::plan(&m, &live(&[1, 3]), &BTreeSet::new());
    assert!(plan.changes.is_empty(), "{plan:?}");
}

#[test]
fn membership_skips_down_draining_and_leaseless_nodes_and_migrations() {
    let mut m = map(3, 1);
    m.keyspaces.values_mut().next().unwrap().replication_factor = 2;
    m.nodes.get_mut(&NodeId(3)).unwrap().draining = true;
    let p1 = owned_by(&m, 1);
    let p2 = owned_by(&m, 2);
    let migrating: BTreeSet<PartitionId> = [p2].into();
    // Node 2 holds no lease: nothing is added there, and p of node 2 waits.
    let plan = membership::plan(&m, &live(&[1, 3]), &migrating);
    let c = plan.changes.iter().find(|c| c.partition == p1);
    assert!(c.is_none(), "only node 2 or 3 could take it: {plan:?}");
    let reasons: Vec<_> = plan.skipped.iter().map(|s| s.reason).collect();
    assert!(reasons.contains(&"no_eligible_node"), "{reasons:?}");
    assert!(reasons.contains(&"primary_gone"), "{reasons:?}");
    let plan = membership::plan(&m, &live(&[1, 2, 3]), &migrating);
    assert!(
        plan.skipped
            .iter()
            .any(|s| s.partition == p2 && s.reason == "migration_in_flight")
    );
    let c = plan.changes.iter().find(|c| c.partition == p1).unwrap();
    assert_eq!(c.added, [NodeId(2)]);
}

#[test]
fn membership_removes_out_of_sync_replicas_first_when_the_factor_shrinks() {
    let mut m = map(3, 3);
    m.keyspaces.values_mut().next().unwrap().replication_factor = 2;
    let p = owned_by(&m, 1);
    m.partitions.get_mut(&p).unwrap().in_sync = vec![NodeId(3)];
    let plan = membership::plan(&m, &live(&[1, 2, 3]), &BTreeSet::new());
    assert_eq!(plan.changes.len(), 3);
    let c = plan.changes.iter().find(|c| c.partition == p).unwrap();
    assert_eq!(c.removed, [NodeId(2)], "out of sync goes first");
    assert_eq!(c.row.replicas, [NodeId(3)]);
    assert_eq!(c.row.in_sync, [NodeId(3)]);
    assert_eq!(c.reason, "over_replicated");
}

#[test]
fn membership_caps_the_factor_at_the_node_count() {
    let mut m = map(2, 2);
    m.keyspaces.values_mut().next().unwrap().replication_factor = 3;
    let plan = membership::plan(&m, &live(&[1, 2]), &BTreeSet::new());
    assert!(
        plan.changes.is_empty() && plan.skipped.is_empty(),
        "{plan:?}"
    );
    assert_eq!(super::run::under_replicated(&m), 0);
}

// ---- the in-sync observer ----

#[test]
fn in_sync_diffs_name_what_changed() {
    let m = map(3, 3);
    let old = m.partitions.values().next().unwrap().clone();
    let mut new = old.clone();
    new.epoch = Epoch(2);
    assert!(observe::diff(&old, &old).is_none());
    new.in_sync = vec![old.in_sync[0]];
    let c = observe::diff(&old, &new).unwrap();
    assert_eq!(c.reason, "dropped");
    assert_eq!(c.dropped, [old.in_sync[1]]);
    assert!(c.detail.contains("in_sync [2, 3] -> [2]"), "{}", c.detail);
    let c = observe::diff(&new, &old).unwrap();
    assert_eq!(
        (c.reason, c.added.as_slice()),
        ("added", &[old.in_sync[1]][..])
    );
    let promoted = super::promoted(&old, NodeId(2));
    assert_eq!(
        observe::diff(&old, &promoted).unwrap().reason,
        "owner_changed"
    );
    let mut swapped = new.clone();
    swapped.in_sync = vec![old.in_sync[1]];
    assert_eq!(
        observe::diff(&new, &swapped).unwrap().reason,
        "dropped_and_added"
    );
}

#[test]
fn a_replica_on_a_draining_node_is_replaced_then_removed_once_the_replacement_is_in_sync() {
    let mut m = map(3, 2);
    m.nodes.get_mut(&NodeId(2)).unwrap().draining = true;
    let p = owned_by(&m, 1);
    assert_eq!(m.partitions[&p].replicas, [NodeId(2)]);
    let all = live(&[1, 2, 3]);
    let plan = membership::plan(&m, &all, &BTreeSet::new());
    let c = plan.changes.iter().find(|c| c.partition == p).unwrap();
    assert_eq!(
        (c.added.as_slice(), c.removed.as_slice()),
        (&[NodeId(3)][..], &[][..])
    );
    // Committed; node 3 is not in sync yet: node 2 stays.
    let mut m2 = m.clone();
    m2.partitions.insert(p, c.row.clone());
    let plan = membership::plan(&m2, &all, &BTreeSet::new());
    assert!(plan.changes.iter().all(|c| c.partition != p), "{plan:?}");
    assert!(
        plan.skipped
            .iter()
            .any(|s| s.partition == p && s.reason == "waiting_for_catch_up")
    );
    // Node 3 caught up (the primary added it): now node 2 goes.
    m2.partitions.get_mut(&p).unwrap().in_sync.push(NodeId(3));
    let plan = membership::plan(&m2, &all, &BTreeSet::new());
    let c = plan.changes.iter().find(|c| c.partition == p).unwrap();
    assert_eq!(c.removed, [NodeId(2)]);
    assert_eq!(c.row.replicas, [NodeId(3)]);
    assert_eq!(c.row.in_sync, [NodeId(3)]);
}
