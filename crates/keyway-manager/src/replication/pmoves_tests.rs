//! The primary move's pure step, phase by phase: add, wait, reads first,
//! switch, fail-back window, move back, remove the old primary; failover
//! mid-move, the target dropping out of sync, the abandon paths.

use super::pmoves::{self, MoveBackError, PStep, Phase, PrimaryMove, PrimaryMoveOutcome};
use keyway_map::{Epoch, NodeId, NodeInfo, PartitionId, PartitionMap};
use keyway_meta::StoredMigration;

const TIMEOUT_MS: u64 = 10_000;
const HOLD_MS: u64 = 2_000;
const WINDOW_MS: u64 = 30_000;
const T0: u64 = 1_000_000;

fn map(nodes: u64, rf: u8) -> PartitionMap {
    let nodes: Vec<NodeInfo> = (1..=nodes)
        .map(|i| NodeInfo::up(NodeId(i), format!("127.0.0.1:{}", 7000 + i)))
        .collect();
    PartitionMap::bootstrap_replicated(&nodes, 1, rf).unwrap()
}

fn ids(v: &[u64]) -> Vec<NodeId> {
    v.iter().map(|n| NodeId(*n)).collect()
}

fn p_of(map: &PartitionMap, owner: u64) -> PartitionId {
    map.owned_by(NodeId(owner)).next().unwrap().id
}

fn pmove(p: PartitionId, from: u64, to: u64, reads_first: bool) -> PrimaryMove {
    PrimaryMove::new(
        7,
        p,
        NodeId(from),
        NodeId(to),
        reads_first,
        HOLD_MS,
        WINDOW_MS,
        T0,
    )
}

fn step(m: &PrimaryMove, map: &PartitionMap, now_ms: u64) -> PStep {
    pmoves::step(m, map, true, false, false, now_ms, TIMEOUT_MS)
}

/// Carries out one step as the loop and the store would: a CAS must hold
/// its condition, be at epoch + 1 and leave a valid map; an advance
/// replaces the record. Returns a short name of what it did.
fn apply(map: &mut PartitionMap, m: &mut PrimaryMove, s: PStep) -> String {
    match s {
        PStep::Cas {
            expected,
            row,
            action,
            ..
        } => {
            let cur = &map.partitions[&row.id];
            assert_eq!(expected, (cur.owner, cur.epoch), "conditional on the row");
            assert_eq!(row.epoch, Epoch(cur.epoch.0 + 1), "at epoch + 1");
            map.partitions.insert(row.id, row);
            map.validate().unwrap();
            action.to_string()
        }
        PStep::Advance { next, .. } => {
            let generation = m.generation + 1;
            *m = PrimaryMove {
                generation,
                ..*next
            };
            format!("-> {}", m.phase.name())
        }
        other => panic!("not a CAS or an advance: {other:?}"),
    }
}

fn advance(map: &mut PartitionMap, m: &mut PrimaryMove, now_ms: u64) -> String {
    let s = step(m, map, now_ms);
    apply(map, m, s)
}

/// What the primary does: sets the in-sync set (the node clears
/// `reads_from` with its node, interface 1).
fn primary_sets_in_sync(map: &mut PartitionMap, p: PartitionId, in_sync: &[u64]) {
    let row = map.partitions.get_mut(&p).unwrap();
    row.in_sync = ids(in_sync);
    if row.reads_from.is_some_and(|r| !row.in_sync.contains(&r)) {
        row.reads_from = None;
    }
    row.epoch = Epoch(row.epoch.0 + 1);
    map.validate().unwrap();
}

/// The node's switchover CAS as interface 2 defines it: owner = T,
/// replicas − T + P, in_sync = [P], reads_from = None, epoch + 1.
fn switchover(map: &mut PartitionMap, p: PartitionId, to: u64) {
    let row = map.partitions.get_mut(&p).unwrap();
    let old = row.owner;
    row.replicas.retain(|r| *r != NodeId(to));
    row.replicas.push(old);
    row.owner = NodeId(to);
    row.in_sync = vec![old];
    row.reads_from = None;
    row.epoch = Epoch(row.epoch.0 + 1);
    map.validate().unwrap();
}

/// Runs the move from the request to the switch call (T in sync, reads
/// first if asked); returns the time reached.
fn to_switch(map: &mut PartitionMap, m: &mut PrimaryMove, p: PartitionId) -> u64 {
    let t = m.to.0;
    assert_eq!(advance(map, m, T0), "add_target");
    assert_eq!(advance(map, m, T0 + 1), "-> wait_in_sync");
    let mut in_sync: Vec<u64> = map.partitions[&p].in_sync.iter().map(|n| n.0).collect();
    in_sync.push(t);
    primary_sets_in_sync(map, p, &in_sync);
    let mut now = T0 + 2;
    if m.reads_first {
        assert_eq!(advance(map, m, now), "-> reads_first");
        assert_eq!(advance(map, m, now + 1), "reads_to_target");
        assert_eq!(advance(map, m, now + 2), "-> reads_hold");
        now += 2 + HOLD_MS;
    }
    assert_eq!(advance(map, m, now), "-> switch");
    now
}

#[test]
fn a_primary_move_adds_the_target_switches_keeps_the_old_primary_then_removes_it() {
    let mut m = map(3, 2);
    let p = p_of(&m, 1);
    assert_eq!(m.partitions[&p].replicas, ids(&[2]));
    let mut mv = pmove(p, 1, 3, false);
    // AddReplica: T joins out of sync.
    assert_eq!(advance(&mut m, &mut mv, T0), "add_target");
    assert_eq!(m.partitions[&p].replicas, ids(&[2, 3]));
    assert!(!m.partitions[&p].in_sync.contains(&NodeId(3)));
    assert_eq!(advance(&mut m, &mut mv, T0 + 1), "-> wait_in_sync");
    // WaitInSync: nothing until the primary CASes T in.
    assert_eq!(
        step(&mv, &m, T0 + TIMEOUT_MS - 1),
        PStep::Wait { why: "catching_up" }
    );
    primary_sets_in_sync(&mut m, p, &[2, 3]);
    assert_eq!(advance(&mut m, &mut mv, T0 + 5), "-> switch");
    // Switch: the old primary's switchover RPC, to T, at the row's epoch.
    let epoch = m.partitions[&p].epoch;
    assert_eq!(
        step(&mv, &m, T0 + 6),
        PStep::Switchover {
            from: NodeId(1),
            to: NodeId(3),
            epoch
        }
    );
    // While the call is out, nothing else.
    assert_eq!(
        pmoves::step(&mv, &m, true, false, true, T0 + 6, TIMEOUT_MS),
        PStep::Wait { why: "switching" }
    );
    switchover(&mut m, p, 3);
    assert_eq!(advance(&mut m, &mut mv, T0 + 7), "-> fail_back_window");
    assert_eq!(mv.switched_at_ms, Some(T0 + 7));
    // FailBackWindow: P stays listed (and in sync) for the whole window.
    for dt in [0, 1, WINDOW_MS - 1] {
        assert_eq!(
            step(&mv, &m, T0 + 7 + dt),
            PStep::Wait {
                why: "fail_back_window"
            }
        );
    }
    assert!(m.partitions[&p].in_sync.contains(&NodeId(1)));
    // Window over: RemoveOld takes P out (3 copies > RF 2).
    assert_eq!(
        advance(&mut m, &mut mv, T0 + 7 + WINDOW_MS),
        "-> remove_old"
    );
    assert_eq!(
        advance(&mut m, &mut mv, T0 + 8 + WINDOW_MS),
        "remove_old_primary"
    );
    let row = &m.partitions[&p];
    assert_eq!((row.owner, row.replicas.clone()), (NodeId(3), ids(&[2])));
    assert!(!row.in_sync.contains(&NodeId(1)));
    assert_eq!(
        step(&mv, &m, T0 + 9 + WINDOW_MS),
        PStep::Finish {
            outcome: PrimaryMoveOutcome::Done,
            reason: "completed"
        }
    );
}

#[test]
fn reads_first_sets_reads_from_holds_then_switches() {
    let mut m = map(3, 2);
    let p = p_of(&m, 1);
    let mut mv = pmove(p, 1, 3, true);
    advance(&mut m, &mut mv, T0);
    advance(&mut m, &mut mv, T0 + 1);
    primary_sets_in_sync(&mut m, p, &[2, 3]);
    assert_eq!(advance(&mut m, &mut mv, T0 + 2), "-> reads_first");
    let owner_before = m.partitions[&p].owner;
    assert_eq!(advance(&mut m, &mut mv, T0 + 3), "reads_to_target");
    assert_eq!(m.partitions[&p].reads_from, Some(NodeId(3)));
    assert_eq!(m.partitions[&p].owner, owner_before, "writes stay on P");
    assert_eq!(advance(&mut m, &mut mv, T0 + 4), "-> reads_hold");
    // The hold runs from the phase's start.
    assert_eq!(
        step(&mv, &m, T0 + 4 + HOLD_MS - 1),
        PStep::Wait {
            why: "reads_first_hold"
        }
    );
    assert_eq!(advance(&mut m, &mut mv, T0 + 4 + HOLD_MS), "-> switch");
    assert!(matches!(
        step(&mv, &m, T0 + 5 + HOLD_MS),
        PStep::Switchover { .. }
    ));
}

#[test]
fn the_target_dropping_out_of_sync_goes_back_to_waiting_and_may_time_out() {
    let mut m = map(3, 2);
    let p = p_of(&m, 1);
    let mut mv = pmove(p, 1, 3, true);
    let now = to_switch(&mut m, &mut mv, p);
    assert_eq!(mv.phase, Phase::Switch);
    // The primary CASes T out (and with it reads_from).
    primary_sets_in_sync(&mut m, p, &[2]);
    assert_eq!(m.partitions[&p].reads_from, None);
    assert_eq!(advance(&mut m, &mut mv, now + 1), "-> wait_in_sync");
    // Never switched to an out-of-sync T; the timeout runs anew.
    assert_eq!(
        step(&mv, &m, now + TIMEOUT_MS),
        PStep::Wait { why: "catching_up" }
    );
    // Also from the reads-first hold.
    let mut m2 = map(3, 2);
    let mut mv2 = pmove(p, 1, 3, true);
    advance(&mut m2, &mut mv2, T0);
    advance(&mut m2, &mut mv2, T0 + 1);
    primary_sets_in_sync(&mut m2, p, &[2, 3]);
    advance(&mut m2, &mut mv2, T0 + 2);
    advance(&mut m2, &mut mv2, T0 + 3);
    advance(&mut m2, &mut mv2, T0 + 4);
    assert_eq!(mv2.phase, Phase::ReadsHold);
    primary_sets_in_sync(&mut m2, p, &[2]);
    assert_eq!(advance(&mut m2, &mut mv2, T0 + 5), "-> wait_in_sync");
    // Abandon at the timeout: Ending, T removed, P kept, finished.
    assert_eq!(advance(&mut m2, &mut mv2, T0 + 5 + TIMEOUT_MS), "-> ending");
    assert_eq!(
        advance(&mut m2, &mut mv2, T0 + 6 + TIMEOUT_MS),
        "remove_target"
    );
    let row = &m2.partitions[&p];
    assert_eq!((row.owner, row.replicas.clone()), (NodeId(1), ids(&[2])));
    assert_eq!(
        step(&mv2, &m2, T0 + 7 + TIMEOUT_MS),
        PStep::Finish {
            outcome: PrimaryMoveOutcome::Abandoned,
            reason: "timeout"
        }
    );
}

#[test]
fn a_target_that_never_catches_up_is_abandoned_at_the_timeout() {
    let mut m = map(3, 2);
    let p = p_of(&m, 1);
    let mut mv = pmove(p, 1, 3, false);
    advance(&mut m, &mut mv, T0);
    advance(&mut m, &mut mv, T0 + 1);
    assert_eq!(
        step(&mv, &m, T0 + TIMEOUT_MS),
        PStep::Wait { why: "catching_up" }
    );
    assert_eq!(advance(&mut m, &mut mv, T0 + 1 + TIMEOUT_MS), "-> ending");
    assert_eq!(mv.outcome, Some(PrimaryMoveOutcome::Abandoned));
    assert_eq!(
        advance(&mut m, &mut mv, T0 + 2 + TIMEOUT_MS),
        "remove_target"
    );
    assert_eq!(m.partitions[&p].owner, NodeId(1), "P kept");
    assert_eq!(m.partitions[&p].replicas, ids(&[2]));
    assert_eq!(
        step(&mv, &m, T0 + 3 + TIMEOUT_MS),
        PStep::Finish {
            outcome: PrimaryMoveOutcome::Abandoned,
            reason: "timeout"
        }
    );
}

#[test]
fn a_failover_mid_move_to_another_replica_abandons_and_to_the_target_counts_as_the_switch() {
    // P fails before the switch; replica 2 is promoted: abandoned, T removed.
    let mut m = map(3, 2);
    let p = p_of(&m, 1);
    let mut mv = pmove(p, 1, 3, false);
    advance(&mut m, &mut mv, T0);
    advance(&mut m, &mut mv, T0 + 1);
    let promoted = super::promoted(&m.partitions[&p], NodeId(2));
    m.partitions.insert(p, promoted);
    m.validate().unwrap();
    assert_eq!(advance(&mut m, &mut mv, T0 + 2), "-> ending");
    assert_eq!(mv.reason, "primary_changed");
    let s = step(&mv, &m, T0 + 3);
    let PStep::Cas { expected, .. } = &s else {
        panic!("{s:?}")
    };
    assert_eq!(expected.0, NodeId(2), "conditional on the new primary");
    assert_eq!(apply(&mut m, &mut mv, s), "remove_target");
    assert_eq!(m.partitions[&p].replicas, ids(&[1]), "RF 2 kept");
    assert!(matches!(
        step(&mv, &m, T0 + 4),
        PStep::Finish {
            outcome: PrimaryMoveOutcome::Abandoned,
            ..
        }
    ));

    // P fails with T in sync and T is promoted: the window starts, P (now
    // out of sync) cannot be moved back, and is removed after the window.
    let mut m = map(3, 2);
    let mut mv = pmove(p, 1, 3, false);
    to_switch(&mut m, &mut mv, p);
    let promoted = super::promoted(&m.partitions[&p], NodeId(3));
    m.partitions.insert(p, promoted);
    m.validate().unwrap();
    assert_eq!(advance(&mut m, &mut mv, T0 + 10), "-> fail_back_window");
    assert!(matches!(
        pmoves::request_back(&mv, &m, T0 + 11),
        Err(MoveBackError::NotInSync { .. })
    ));
    assert_eq!(
        advance(&mut m, &mut mv, T0 + 10 + WINDOW_MS),
        "-> remove_old"
    );
    assert_eq!(
        advance(&mut m, &mut mv, T0 + 11 + WINDOW_MS),
        "remove_old_primary"
    );
    assert_eq!(m.partitions[&p].replicas, ids(&[2]));
}

#[test]
fn move_back_inside_the_window_switches_back_and_removes_the_target() {
    let mut m = map(3, 2);
    let p = p_of(&m, 1);
    let mut mv = pmove(p, 1, 3, false);
    to_switch(&mut m, &mut mv, p);
    switchover(&mut m, p, 3);
    let at = T0 + 100;
    advance(&mut m, &mut mv, at);
    assert_eq!(mv.phase, Phase::FailBackWindow);
    // Asked inside the window, P in sync: accepted.
    let back = pmoves::request_back(&mv, &m, at + WINDOW_MS - 1).unwrap();
    mv = PrimaryMove {
        generation: mv.generation + 1,
        ..back
    };
    // Honoured even when the manager sees it after the window's end.
    assert_eq!(
        advance(&mut m, &mut mv, at + WINDOW_MS + 5),
        "-> switch_back"
    );
    assert_eq!(
        step(&mv, &m, at + WINDOW_MS + 6),
        PStep::Switchover {
            from: NodeId(3),
            to: NodeId(1),
            epoch: m.partitions[&p].epoch
        }
    );
    switchover(&mut m, p, 1);
    assert_eq!(advance(&mut m, &mut mv, at + WINDOW_MS + 7), "-> ending");
    assert_eq!(mv.outcome, Some(PrimaryMoveOutcome::MovedBack));
    // T is the extra copy: removed; the row is P with its replica 2 again.
    assert_eq!(
        advance(&mut m, &mut mv, at + WINDOW_MS + 8),
        "remove_target"
    );
    let row = &m.partitions[&p];
    assert_eq!((row.owner, row.replicas.clone()), (NodeId(1), ids(&[2])));
    assert_eq!(
        step(&mv, &m, at + WINDOW_MS + 9),
        PStep::Finish {
            outcome: PrimaryMoveOutcome::MovedBack,
            reason: "moved_back"
        }
    );
}

#[test]
fn move_back_is_refused_outside_the_window_before_the_switch_or_with_p_out_of_sync() {
    let mut m = map(3, 2);
    let p = p_of(&m, 1);
    let mut mv = pmove(p, 1, 3, false);
    assert!(matches!(
        pmoves::request_back(&mv, &m, T0),
        Err(MoveBackError::NotSwitched { .. })
    ));
    to_switch(&mut m, &mut mv, p);
    switchover(&mut m, p, 3);
    let at = T0 + 100;
    advance(&mut m, &mut mv, at);
    assert!(matches!(
        pmoves::request_back(&mv, &m, at + WINDOW_MS),
        Err(MoveBackError::WindowOver { .. })
    ));
    // P dropped out of sync: refused by the ctl check ...
    let mut m2 = m.clone();
    primary_sets_in_sync(&mut m2, p, &[2]);
    assert!(matches!(
        pmoves::request_back(&mv, &m2, at + 1),
        Err(MoveBackError::NotInSync { .. })
    ));
    // ... and by the manager if it happened after the request: the request
    // is dropped and the window goes on (no switchover to an out-of-sync P).
    let mut back = pmoves::request_back(&mv, &m, at + 1).unwrap();
    back.generation += 1;
    let s = step(&back, &m2, at + 2);
    let PStep::Advance { next, why } = &s else {
        panic!("{s:?}")
    };
    assert_eq!(*why, "back_old_primary_not_in_sync");
    assert_eq!(
        (next.phase, next.back_requested_at_ms),
        (Phase::FailBackWindow, None)
    );
    // A request stamped after the window is dropped too.
    let mut late = back.clone();
    late.back_requested_at_ms = Some(at + WINDOW_MS);
    let s = step(&late, &m, at + WINDOW_MS);
    assert!(matches!(
        s,
        PStep::Advance {
            why: "back_outside_window",
            ..
        }
    ));
}

#[test]
fn remove_old_never_goes_below_the_replication_factor() {
    // The target was already a replica: the copy count never exceeded the
    // factor, so the old primary stays as a replica (a switchover, in effect).
    let mut m = map(3, 2);
    let p = p_of(&m, 1);
    primary_sets_in_sync(&mut m, p, &[2]);
    let mut mv = pmove(p, 1, 2, false);
    mv.fail_back_window_ms = 0;
    assert_eq!(advance(&mut m, &mut mv, T0), "-> wait_in_sync");
    assert_eq!(advance(&mut m, &mut mv, T0 + 1), "-> switch");
    switchover(&mut m, p, 2);
    assert_eq!(advance(&mut m, &mut mv, T0 + 2), "-> fail_back_window");
    assert_eq!(advance(&mut m, &mut mv, T0 + 2), "-> remove_old");
    assert_eq!(
        step(&mv, &m, T0 + 3),
        PStep::Finish {
            outcome: PrimaryMoveOutcome::Done,
            reason: "old_primary_kept"
        }
    );
    assert_eq!(m.partitions[&p].replicas, ids(&[1]));
}

#[test]
fn every_primary_move_cas_clears_a_reads_from_it_would_invalidate() {
    // reads_from on the old primary's replica 2 ... and P itself in sync.
    let mut m = map(3, 3);
    let p = p_of(&m, 1);
    let mut mv = pmove(p, 1, 2, false);
    primary_sets_in_sync(&mut m, p, &[2, 3]);
    assert_eq!(advance(&mut m, &mut mv, T0), "-> wait_in_sync");
    assert_eq!(advance(&mut m, &mut mv, T0 + 1), "-> switch");
    switchover(&mut m, p, 2);
    // Someone set reads_from = P (in sync) during the window.
    {
        let row = m.partitions.get_mut(&p).unwrap();
        row.reads_from = Some(NodeId(1));
        row.replicas.push(NodeId(4));
    }
    m.nodes
        .insert(NodeId(4), NodeInfo::up(NodeId(4), "127.0.0.1:7004".into()));
    advance(&mut m, &mut mv, T0 + 2);
    assert_eq!(
        advance(&mut m, &mut mv, T0 + 2 + WINDOW_MS),
        "-> remove_old"
    );
    // Removing P from in_sync must clear reads_from = P (apply validates).
    assert_eq!(
        advance(&mut m, &mut mv, T0 + 3 + WINDOW_MS),
        "remove_old_primary"
    );
    assert_eq!(m.partitions[&p].reads_from, None);
}

#[test]
fn duplicates_gone_partitions_migrations_and_a_draining_target() {
    let mut m = map(3, 2);
    let p = p_of(&m, 1);
    let mv = pmove(p, 1, 3, false);
    assert_eq!(
        pmoves::step(&mv, &m, false, false, false, T0, TIMEOUT_MS),
        PStep::Finish {
            outcome: PrimaryMoveOutcome::Abandoned,
            reason: "duplicate"
        }
    );
    assert_eq!(
        pmoves::step(&mv, &m, true, true, false, T0, TIMEOUT_MS),
        PStep::Wait {
            why: "migration_in_flight"
        }
    );
    m.nodes.get_mut(&NodeId(3)).unwrap().draining = true;
    let s = step(&mv, &m, T0);
    assert!(
        matches!(&s, PStep::Advance { why: "target_draining", next } if next.phase == Phase::Ending),
        "{s:?}"
    );
    m.partitions.remove(&p);
    assert_eq!(
        step(&mv, &m, T0),
        PStep::Finish {
            outcome: PrimaryMoveOutcome::Abandoned,
            reason: "partition_gone"
        }
    );
}

#[test]
fn the_record_round_trips_and_is_no_migration_or_replica_move() {
    let mut mv = pmove(PartitionId(3), 2, 4, true);
    mv.phase = Phase::FailBackWindow;
    mv.switched_at_ms = Some(T0 + 5);
    mv.back_requested_at_ms = Some(T0 + 9);
    mv.outcome = Some(PrimaryMoveOutcome::MovedBack);
    mv.reason = "moved_back".into();
    let stored = StoredMigration {
        id: 7,
        generation: 5,
        record: mv.encode(),
    };
    assert!(pmoves::is_primary_move(&stored));
    assert!(
        super::moves::is_replica_move(&stored),
        "every reader skips it"
    );
    assert!(keyway_migration::is_replica_move_record(&stored.record));
    assert_eq!(
        PrimaryMove::load(&stored).unwrap(),
        PrimaryMove {
            generation: 5,
            ..mv
        }
    );
    assert_eq!(super::ReplicaMove::load(&stored), None);
    assert!(keyway_migration::MigrationRecord::decode(&stored.record).is_err());
    assert_eq!(
        PrimaryMove::load(&StoredMigration { id: 8, ..stored }),
        None
    );
    for phase in Phase::ALL {
        let r = PrimaryMove {
            phase,
            ..pmove(PartitionId(1), 1, 2, false)
        };
        let s = StoredMigration {
            id: 7,
            generation: 1,
            record: r.encode(),
        };
        assert_eq!(PrimaryMove::load(&s).unwrap().phase, phase);
    }
}

#[test]
fn a_target_without_a_lease_abandons_the_move_and_a_down_old_primary_ends_the_window() {
    let mut m = map(3, 2);
    let p = p_of(&m, 1);
    let mv = pmove(p, 1, 3, false);
    m.nodes.get_mut(&NodeId(3)).unwrap().state = keyway_map::NodeState::Down;
    let s = step(&mv, &m, T0);
    assert!(
        matches!(&s, PStep::Advance { why: "target_down", next } if next.phase == Phase::Ending),
        "{s:?}"
    );
    // Switched: T (3) is primary and P (1) an in-sync replica in the window.
    let mut m = map(3, 2);
    let p = p_of(&m, 1);
    let row = m.partitions.get_mut(&p).unwrap();
    let x = row.replicas[0];
    let t = if x == NodeId(2) { 3 } else { 2 };
    row.owner = NodeId(t);
    row.replicas = vec![x, NodeId(1)];
    row.in_sync = vec![NodeId(1)];
    m.reindex();
    let mut mv = pmove(p, 1, t, false);
    mv.phase = Phase::FailBackWindow;
    mv.switched_at_ms = Some(T0);
    mv.phase_at_ms = T0;
    assert_eq!(
        step(&mv, &m, T0 + 1),
        PStep::Wait {
            why: "fail_back_window"
        }
    );
    let mut bystander_down = m.clone();
    m.nodes.get_mut(&NodeId(1)).unwrap().state = keyway_map::NodeState::Down;
    let s = step(&mv, &m, T0 + 1);
    assert!(
        matches!(&s, PStep::Advance { why: "old_primary_down", next } if next.phase == Phase::RemoveOld),
        "{s:?}"
    );
    // The other replica without a lease: the move ends, P kept.
    bystander_down.nodes.get_mut(&x).unwrap().state = keyway_map::NodeState::Down;
    let s = step(&mv, &bystander_down, T0 + 1);
    assert!(
        matches!(&s, PStep::Advance { why: "old_primary_kept", next }
            if next.phase == Phase::Ending && next.outcome == Some(PrimaryMoveOutcome::Done)),
        "{s:?}"
    );
}
