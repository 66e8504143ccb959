//! Interface 1 on the manager side: every writer that changes the owner or
//! takes the `reads_from` node out of `in_sync` clears `reads_from` in the
//! same record, or the store's `validate` refuses the CAS. Each writer is
//! fed a row whose `reads_from` its change would make invalid, and its row
//! must pass `PartitionMap::validate`. (The migration flip's test is in
//! keyway-migration's `record.rs`; the primary move's in `pmoves_tests.rs`.)

use super::membership::{self, Recovery};
use super::moves::{self, ReplicaMove, Step};
use keyway_map::{Epoch, KeyspaceId, NodeId, NodeInfo, PartitionId, PartitionMap};
use std::collections::BTreeSet;

fn map(nodes: u64, rf: u8) -> PartitionMap {
    let nodes: Vec<NodeInfo> = (1..=nodes)
        .map(|i| NodeInfo::up(NodeId(i), format!("127.0.0.1:{}", 7000 + i)))
        .collect();
    PartitionMap::bootstrap_replicated(&nodes, 1, rf).unwrap()
}

fn set(v: &[u64]) -> BTreeSet<NodeId> {
    v.iter().map(|n| NodeId(*n)).collect()
}

/// Node 1's partition with every replica in sync and reads on `reads`.
fn reading_from(m: &mut PartitionMap, reads: u64) -> PartitionId {
    let p = m.owned_by(NodeId(1)).next().unwrap().id;
    let row = m.partitions.get_mut(&p).unwrap();
    row.in_sync = row.replicas.clone();
    row.reads_from = Some(NodeId(reads));
    row.epoch = Epoch(row.epoch.0 + 1);
    m.validate().unwrap();
    p
}

/// Installs `row` as the store would: it must validate.
fn install(m: &mut PartitionMap, row: keyway_map::PartitionRecord) {
    m.partitions.insert(row.id, row);
    m.validate()
        .expect("the writer's row must be valid (reads_from in in_sync)");
}

#[test]
fn a_failover_clears_reads_from() {
    let mut m = map(3, 3);
    let p = reading_from(&mut m, 3);
    let row = super::promoted(&m.partitions[&p], NodeId(2));
    assert_eq!(row.reads_from, None);
    install(&mut m, row);
}

#[test]
fn a_replica_move_removing_the_reads_from_node_clears_it() {
    let mut m = map(4, 2);
    let p = reading_from(&mut m, 2);
    let mv = ReplicaMove {
        id: 1,
        generation: 1,
        partition: p,
        from: NodeId(2),
        to: NodeId(4),
        started_at_ms: 0,
    };
    // Y (4) is listed and in sync: X (2), the reads-from node, goes.
    let row = m.partitions.get_mut(&p).unwrap();
    row.replicas.push(NodeId(4));
    row.in_sync.push(NodeId(4));
    let Step::Cas { row, action, .. } = moves::step(&mv, &m, true, false, 1, 10_000) else {
        panic!("expected the removal")
    };
    assert_eq!(action, "remove_source");
    assert_eq!(row.reads_from, None);
    install(&mut m, row);
}

#[test]
fn a_membership_shrink_removing_the_reads_from_node_clears_it() {
    let mut m = map(3, 3);
    let p = reading_from(&mut m, 3);
    m.keyspaces
        .get_mut(&KeyspaceId(0))
        .unwrap()
        .replication_factor = 2;
    let plan = membership::plan(&m, &set(&[1, 2, 3]), &BTreeSet::new());
    let c = plan.changes.iter().find(|c| c.partition == p).unwrap();
    assert_eq!(c.removed, vec![NodeId(3)], "{c:?}");
    assert_eq!(c.row.reads_from, None);
    install(&mut m, c.row.clone());
}

#[test]
fn a_dead_replica_removal_clears_reads_from_on_it() {
    let mut m = map(4, 2);
    let p = reading_from(&mut m, 2);
    // The replacement (4) is in sync; the dead replica 2 (reads_from) goes.
    let row = m.partitions.get_mut(&p).unwrap();
    row.replicas.push(NodeId(4));
    row.in_sync.push(NodeId(4));
    let recovery = Recovery {
        dead: set(&[2]),
        ..Recovery::none()
    };
    let plan = membership::plan_recovering(
        &m,
        &set(&[1, 3, 4]),
        &BTreeSet::new(),
        &BTreeSet::new(),
        &recovery,
    );
    let c = plan.changes.iter().find(|c| c.partition == p).unwrap();
    assert_eq!(c.reason, "dead_replica_replaced");
    assert_eq!(c.row.reads_from, None);
    install(&mut m, c.row.clone());
}
