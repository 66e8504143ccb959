//! The replica move's pure step: add, wait, remove; abandon; failover.

use super::membership;
use super::moves::{self, MoveOutcome, ReplicaMove, Step};
use keyway_map::{Epoch, NodeId, NodeInfo, PartitionId, PartitionMap};
use keyway_meta::StoredMigration;
use std::collections::BTreeSet;

const TIMEOUT_MS: u64 = 10_000;
const T0: u64 = 1_000_000;

/// `nodes` nodes, one partition each, replication factor `rf`.
fn map(nodes: u64, rf: u8) -> PartitionMap {
    let nodes: Vec<NodeInfo> = (1..=nodes)
        .map(|i| NodeInfo::up(NodeId(i), format!("127.0.0.1:{}", 7000 + i)))
        .collect();
    PartitionMap::bootstrap_replicated(&nodes, 1, rf).unwrap()
}

fn ids(v: &[u64]) -> Vec<NodeId> {
    v.iter().map(|n| NodeId(*n)).collect()
}

fn mv(p: PartitionId, from: u64, to: u64) -> ReplicaMove {
    ReplicaMove {
        id: 7,
        generation: 1,
        partition: p,
        from: NodeId(from),
        to: NodeId(to),
        started_at_ms: T0,
    }
}

fn step(m: &ReplicaMove, map: &PartitionMap, now_ms: u64) -> Step {
    moves::step(m, map, true, false, now_ms, TIMEOUT_MS)
}

/// Applies a CAS step as the store would: the condition must hold, the
/// result must validate. Returns (action, reason).
fn apply(map: &mut PartitionMap, s: Step) -> (&'static str, &'static str) {
    let Step::Cas {
        expected,
        row,
        action,
        reason,
    } = s
    else {
        panic!("expected a CAS, got {s:?}");
    };
    let cur = &map.partitions[&row.id];
    assert_eq!(expected, (cur.owner, cur.epoch), "conditional on the row");
    assert_eq!(row.epoch, Epoch(cur.epoch.0 + 1), "at epoch + 1");
    map.partitions.insert(row.id, row);
    map.validate().unwrap();
    (action, reason)
}

/// The next step, applied (it must be a CAS).
fn advance(map: &mut PartitionMap, m: &ReplicaMove, now_ms: u64) -> (&'static str, &'static str) {
    let s = step(m, map, now_ms);
    apply(map, s)
}

/// What the primary does: sets the in-sync set by CAS at epoch + 1.
fn primary_sets_in_sync(map: &mut PartitionMap, p: PartitionId, in_sync: &[u64]) {
    let row = map.partitions.get_mut(&p).unwrap();
    row.in_sync = ids(in_sync);
    row.epoch = Epoch(row.epoch.0 + 1);
    map.validate().unwrap();
}

fn p_of(map: &PartitionMap, owner: u64) -> PartitionId {
    map.owned_by(NodeId(owner)).next().unwrap().id
}

#[test]
fn a_replica_move_adds_the_target_then_removes_the_source_once_it_is_in_sync() {
    let mut m = map(4, 2);
    let p = p_of(&m, 1);
    assert_eq!(m.partitions[&p].replicas, ids(&[2]));
    let r = mv(p, 2, 4);
    // 1. Y joins, out of sync (the primary copies it).
    assert_eq!(advance(&mut m, &r, T0), ("add_target", "replica_move"));
    assert_eq!(m.partitions[&p].replicas, ids(&[2, 4]));
    assert_eq!(m.partitions[&p].in_sync, ids(&[2]));
    // 2. No removal before Y is in sync, however many rounds pass.
    for dt in [0, 1, TIMEOUT_MS - 1] {
        assert_eq!(step(&r, &m, T0 + dt), Step::Wait { why: "catching_up" });
    }
    assert_eq!(moves::phase(&r, &m), "catching_up");
    // 3. The primary CASes Y into in_sync; now X goes (from in_sync too).
    primary_sets_in_sync(&mut m, p, &[2, 4]);
    assert_eq!(moves::phase(&r, &m), "removing_source");
    assert_eq!(
        advance(&mut m, &r, T0 + 5),
        ("remove_source", "target_in_sync")
    );
    assert_eq!(m.partitions[&p].replicas, ids(&[4]));
    assert_eq!(m.partitions[&p].in_sync, ids(&[4]));
    assert_eq!(m.partitions[&p].owner, NodeId(1));
    // 4. Done (also after the timeout: the row says so).
    let done = Step::Finish {
        outcome: MoveOutcome::Done,
        reason: "completed",
    };
    assert_eq!(step(&r, &m, T0 + 6), done);
    assert_eq!(step(&r, &m, T0 + 2 * TIMEOUT_MS), done);
}

#[test]
fn a_move_whose_target_never_catches_up_is_abandoned_at_the_timeout() {
    let mut m = map(4, 2);
    let p = p_of(&m, 1);
    let r = mv(p, 2, 4);
    advance(&mut m, &r, T0);
    assert_eq!(
        step(&r, &m, T0 + TIMEOUT_MS - 1),
        Step::Wait { why: "catching_up" }
    );
    assert_eq!(
        advance(&mut m, &r, T0 + TIMEOUT_MS),
        ("remove_target", "timeout")
    );
    assert_eq!(m.partitions[&p].replicas, ids(&[2]), "X kept");
    assert_eq!(m.partitions[&p].in_sync, ids(&[2]), "X stays in sync");
    assert_eq!(
        step(&r, &m, T0 + TIMEOUT_MS + 1),
        Step::Finish {
            outcome: MoveOutcome::Abandoned,
            reason: "timeout"
        }
    );
    // A move timed out before it even added Y ends without a CAS.
    let m2 = map(4, 2);
    assert_eq!(
        step(&mv(p, 2, 4), &m2, T0 + TIMEOUT_MS),
        Step::Finish {
            outcome: MoveOutcome::Abandoned,
            reason: "timeout"
        }
    );
}

#[test]
fn a_failover_mid_move_continues_against_the_new_row() {
    let mut m = map(5, 3);
    let p = p_of(&m, 1);
    assert_eq!(m.partitions[&p].replicas, ids(&[2, 3]));
    let r = mv(p, 3, 5);
    advance(&mut m, &r, T0);
    assert_eq!(m.partitions[&p].replicas, ids(&[2, 3, 5]));
    // Node 1 fails; in-sync replica 2 is promoted (failover's row shape).
    {
        let row = m.partitions.get_mut(&p).unwrap();
        row.owner = NodeId(2);
        row.replicas = ids(&[3, 5, 1]);
        row.in_sync.clear();
        row.epoch = Epoch(row.epoch.0 + 1);
    }
    m.validate().unwrap();
    // The new primary re-syncs everyone; nothing is removed meanwhile.
    assert_eq!(step(&r, &m, T0 + 1), Step::Wait { why: "catching_up" });
    primary_sets_in_sync(&mut m, p, &[5]);
    let s = step(&r, &m, T0 + 2);
    let Step::Cas { expected, .. } = &s else {
        panic!("{s:?}")
    };
    assert_eq!(expected.0, NodeId(2), "conditional on the new primary");
    assert_eq!(apply(&mut m, s).0, "remove_source");
    assert_eq!(m.partitions[&p].replicas, ids(&[5, 1]));
    assert!(matches!(
        step(&r, &m, T0 + 3),
        Step::Finish {
            outcome: MoveOutcome::Done,
            ..
        }
    ));
}

#[test]
fn a_move_whose_source_was_promoted_is_abandoned_and_its_target_removed() {
    let mut m = map(4, 2);
    let p = p_of(&m, 1);
    let r = mv(p, 2, 4);
    advance(&mut m, &r, T0);
    {
        let row = m.partitions.get_mut(&p).unwrap();
        row.owner = NodeId(2);
        row.replicas = ids(&[4, 1]);
        row.in_sync.clear();
        row.epoch = Epoch(row.epoch.0 + 1);
    }
    assert_eq!(
        advance(&mut m, &r, T0 + 1),
        ("remove_target", "source_promoted")
    );
    assert_eq!(m.partitions[&p].replicas, ids(&[1]));
    assert!(matches!(
        step(&r, &m, T0 + 2),
        Step::Finish {
            outcome: MoveOutcome::Abandoned,
            reason: "source_promoted"
        }
    ));
}

#[test]
fn duplicates_gone_partitions_and_migrations() {
    let mut m = map(4, 2);
    let p = p_of(&m, 1);
    let r = mv(p, 2, 4);
    let abandoned = |reason| Step::Finish {
        outcome: MoveOutcome::Abandoned,
        reason,
    };
    assert_eq!(
        moves::step(&r, &m, false, false, T0, TIMEOUT_MS),
        abandoned("duplicate")
    );
    assert_eq!(
        moves::step(&r, &m, true, true, T0, TIMEOUT_MS),
        Step::Wait {
            why: "migration_in_flight"
        }
    );
    m.nodes.get_mut(&NodeId(4)).unwrap().draining = true;
    assert_eq!(step(&r, &m, T0), abandoned("target_draining"));
    m.partitions.remove(&p);
    assert_eq!(step(&r, &m, T0), abandoned("partition_gone"));
}

#[test]
fn the_reconciler_leaves_a_partition_with_a_live_replica_move_alone() {
    let mut m = map(4, 2);
    let p = p_of(&m, 1);
    let r = mv(p, 2, 4);
    advance(&mut m, &r, T0);
    let live: BTreeSet<NodeId> = ids(&[1, 2, 3, 4]).into_iter().collect();
    let none = BTreeSet::new();
    // Without the move in view it would undo it (remove the out-of-sync Y).
    let blind = membership::plan(&m, &live, &none);
    assert_eq!(blind.changes.len(), 1, "{blind:?}");
    assert_eq!(blind.changes[0].removed, ids(&[4]));
    let moving: BTreeSet<PartitionId> = [p].into_iter().collect();
    let plan = membership::plan_with(&m, &live, &none, &moving);
    assert!(plan.changes.is_empty(), "{plan:?}");
    assert_eq!(plan.skipped.len(), 1);
    assert_eq!(plan.skipped[0].reason, "replica_move_in_flight");
}

#[test]
fn the_record_round_trips_and_is_not_a_migration_record() {
    let r = mv(PartitionId(3), 2, 4);
    let stored = StoredMigration {
        id: 7,
        generation: 5,
        record: r.encode(),
    };
    assert!(moves::is_replica_move(&stored));
    let back = ReplicaMove::load(&stored).unwrap();
    assert_eq!(back, ReplicaMove { generation: 5, ..r });
    assert!(keyway_migration::MigrationRecord::decode(&stored.record).is_err());
    let wrong_id = StoredMigration { id: 8, ..stored };
    assert_eq!(ReplicaMove::load(&wrong_id), None);
}
