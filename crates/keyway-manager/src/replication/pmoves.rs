//! Moving a partition's primary by adding a replica (issue 13, item 3; the
//! seed-003 way): the target T is added as a replica of p, caught up by the
//! primary P's stream, optionally given p's reads first, then made primary
//! by P's planned switchover, and P is kept as an in-sync replica — the
//! reverse stream — for a fail-back window before it is removed.
//!
//! # The phases (the record's [`Phase`]; every map change is one CAS at
//! epoch + 1 conditional on `(owner, epoch)`)
//!
//! 1. **AddReplica**: T joins `replicas`, out of sync (the primary copies it
//!    and CASes it into `in_sync` itself, as for any new replica).
//! 2. **WaitInSync**: until the map shows T in `in_sync`, bounded by
//!    `replica_move_timeout_ms` from the phase's start; at the timeout the
//!    move is abandoned (T removed, P kept).
//! 3. **ReadsFirst** (with `--reads-first`): CAS `reads_from = T` (the smart
//!    client and the proxy send p's reads to T, writes stay on P), then
//!    **ReadsHold** for `reads_first_hold_ms`.
//! 4. **Switch**: P's `Switchover` RPC to T (`crate::switchover`); the
//!    node's CAS makes T owner, keeps P as an in-sync replica and clears
//!    `reads_from`.
//! 5. **FailBackWindow**: `fail_back_window_ms` from the switch. `ctl move
//!    --back` inside it (and while P is in sync) asks for **SwitchBack**:
//!    T's switchover to P — no copy, P holds every write.
//! 6. **RemoveOld**: once the window is over, P leaves `replicas` and
//!    `in_sync` if the partition has more copies than its replication
//!    factor (never fewer: a P the factor needs stays a replica).
//! 7. **Ending**: the outcome is fixed (`done`, `moved_back`, `abandoned`);
//!    an abandoned or moved-back move removes T again if it is an extra
//!    copy, then the record is deleted (the decision log and
//!    `keyway_manager_primary_moves{outcome}` keep the history).
//!
//! # Pure, durable, resumable
//!
//! The record (magic `P`, beside the replica moves' `R` in the metadata
//! store's migration records; every migration reader skips both) holds the
//! intent and the phase with its start time; [`step`] is a pure function of
//! (record, map, clock) that returns one action: wait, a map CAS, a phase
//! change (a generation-CAS write of the record), a switchover call, or the
//! end. A new leader resumes from the record and the map; a failover
//! mid-move only changes the row the next step is planned against: T
//! promoted counts as the switch, any other new owner abandons the move.

use super::membership::wanted_copies;
use keyway_map::wire::{Reader, Writer};
use keyway_map::{Epoch, NodeId, NodeState, PartitionId, PartitionMap, PartitionRecord};
use keyway_meta::StoredMigration;
use serde::Serialize;

const MAGIC: u8 = keyway_migration::PRIMARY_MOVE_MAGIC;
const FORMAT: u8 = 1;

/// The default fail-back window, ms: the old primary stays an in-sync
/// replica this long after the switch.
pub const DEFAULT_FAIL_BACK_WINDOW_MS: u64 = 30_000;
/// The longest fail-back window accepted (a day).
pub const MAX_FAIL_BACK_WINDOW_MS: u64 = 86_400_000;
/// The default time reads are served by the target before the write switch, ms.
pub const DEFAULT_READS_FIRST_HOLD_MS: u64 = 2_000;
/// The longest reads-first hold accepted (ten minutes).
pub const MAX_READS_FIRST_HOLD_MS: u64 = 600_000;

/// Where a primary move is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    AddReplica,
    WaitInSync,
    ReadsFirst,
    ReadsHold,
    Switch,
    FailBackWindow,
    SwitchBack,
    RemoveOld,
    Ending,
}

impl Phase {
    pub const ALL: [Phase; 9] = [
        Phase::AddReplica,
        Phase::WaitInSync,
        Phase::ReadsFirst,
        Phase::ReadsHold,
        Phase::Switch,
        Phase::FailBackWindow,
        Phase::SwitchBack,
        Phase::RemoveOld,
        Phase::Ending,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Phase::AddReplica => "add_replica",
            Phase::WaitInSync => "wait_in_sync",
            Phase::ReadsFirst => "reads_first",
            Phase::ReadsHold => "reads_hold",
            Phase::Switch => "switch",
            Phase::FailBackWindow => "fail_back_window",
            Phase::SwitchBack => "switch_back",
            Phase::RemoveOld => "remove_old",
            Phase::Ending => "ending",
        }
    }

    fn code(self) -> u8 {
        Phase::ALL.iter().position(|p| *p == self).expect("listed") as u8 + 1
    }

    fn from_code(c: u8) -> Option<Phase> {
        Phase::ALL.get(usize::from(c).checked_sub(1)?).copied()
    }

    /// Before the write switch (P is owner).
    fn before_switch(self) -> bool {
        matches!(
            self,
            Phase::AddReplica
                | Phase::WaitInSync
                | Phase::ReadsFirst
                | Phase::ReadsHold
                | Phase::Switch
        )
    }
}

/// How a primary move ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PrimaryMoveOutcome {
    Done,
    MovedBack,
    Abandoned,
}

impl PrimaryMoveOutcome {
    pub const ALL: [PrimaryMoveOutcome; 3] = [
        PrimaryMoveOutcome::Done,
        PrimaryMoveOutcome::MovedBack,
        PrimaryMoveOutcome::Abandoned,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PrimaryMoveOutcome::Done => "done",
            PrimaryMoveOutcome::MovedBack => "moved_back",
            PrimaryMoveOutcome::Abandoned => "abandoned",
        }
    }

    fn code(self) -> u8 {
        match self {
            PrimaryMoveOutcome::Done => 1,
            PrimaryMoveOutcome::MovedBack => 2,
            PrimaryMoveOutcome::Abandoned => 3,
        }
    }

    fn from_code(c: u8) -> Option<Self> {
        PrimaryMoveOutcome::ALL.into_iter().find(|o| o.code() == c)
    }
}

/// A primary move (the durable record).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PrimaryMove {
    /// Its id in the migration-record id space.
    pub id: u64,
    /// The store's generation of the record (not encoded).
    pub generation: u64,
    pub partition: PartitionId,
    /// P: the primary when requested.
    pub from: NodeId,
    /// T: the node that becomes primary.
    pub to: NodeId,
    pub reads_first: bool,
    pub reads_first_hold_ms: u64,
    pub fail_back_window_ms: u64,
    /// Unix ms when requested.
    pub requested_at_ms: u64,
    pub phase: Phase,
    /// Unix ms when `phase` was entered (timeouts and holds run from here).
    pub phase_at_ms: u64,
    /// Unix ms when T was first seen owner (the window runs from here).
    pub switched_at_ms: Option<u64>,
    /// Unix ms when `ctl move --back` asked to switch back.
    pub back_requested_at_ms: Option<u64>,
    /// Set in [`Phase::Ending`]: the outcome and its reason.
    pub outcome: Option<PrimaryMoveOutcome>,
    pub reason: String,
}

impl PrimaryMove {
    /// A new record in [`Phase::AddReplica`].
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: u64,
        partition: PartitionId,
        from: NodeId,
        to: NodeId,
        reads_first: bool,
        reads_first_hold_ms: u64,
        fail_back_window_ms: u64,
        now_ms: u64,
    ) -> Self {
        PrimaryMove {
            id,
            generation: 1,
            partition,
            from,
            to,
            reads_first,
            reads_first_hold_ms,
            fail_back_window_ms,
            requested_at_ms: now_ms,
            phase: Phase::AddReplica,
            phase_at_ms: now_ms,
            switched_at_ms: None,
            back_requested_at_ms: None,
            outcome: None,
            reason: String::new(),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(48);
        w.u8(MAGIC);
        w.u8(FORMAT);
        w.var(self.id);
        w.var(self.partition.0);
        w.var(self.from.0);
        w.var(self.to.0);
        w.u8(u8::from(self.reads_first));
        w.var(self.reads_first_hold_ms);
        w.var(self.fail_back_window_ms);
        w.var(self.requested_at_ms);
        w.u8(self.phase.code());
        w.var(self.phase_at_ms);
        w.opt(self.switched_at_ms);
        w.opt(self.back_requested_at_ms);
        w.u8(self.outcome.map_or(0, |o| o.code()));
        w.bytes(self.reason.as_bytes());
        w.into_inner()
    }

    /// Decodes a stored record; `None` if it is not a primary move.
    pub fn load(stored: &StoredMigration) -> Option<PrimaryMove> {
        if !is_primary_move(stored) {
            return None;
        }
        let mut r = Reader::new(&stored.record[1..]);
        if r.u8().ok()? != FORMAT {
            return None;
        }
        let mut mv = PrimaryMove {
            id: r.var().ok()?,
            generation: stored.generation,
            partition: PartitionId(r.var().ok()?),
            from: NodeId(r.var().ok()?),
            to: NodeId(r.var().ok()?),
            reads_first: r.u8().ok()? != 0,
            reads_first_hold_ms: r.var().ok()?,
            fail_back_window_ms: r.var().ok()?,
            requested_at_ms: r.var().ok()?,
            phase: Phase::from_code(r.u8().ok()?)?,
            phase_at_ms: r.var().ok()?,
            switched_at_ms: r.opt().ok()?,
            back_requested_at_ms: r.opt().ok()?,
            outcome: None,
            reason: String::new(),
        };
        mv.outcome = match r.u8().ok()? {
            0 => None,
            c => Some(PrimaryMoveOutcome::from_code(c)?),
        };
        mv.reason = r.string().ok()?;
        r.finish().ok()?;
        (mv.id == stored.id).then_some(mv)
    }

    /// The end of the fail-back window (once switched).
    pub fn window_ends_at_ms(&self) -> Option<u64> {
        self.switched_at_ms
            .map(|at| at.saturating_add(self.fail_back_window_ms))
    }

    /// This record in `phase`, entered at `now_ms`.
    fn entering(&self, phase: Phase, now_ms: u64) -> PrimaryMove {
        PrimaryMove {
            phase,
            phase_at_ms: now_ms,
            ..self.clone()
        }
    }
}

/// Whether a stored migration record is a primary move.
pub fn is_primary_move(stored: &StoredMigration) -> bool {
    stored.record.first() == Some(&MAGIC)
}

/// What the leader does for one primary move this round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PStep {
    /// Nothing this round.
    Wait { why: &'static str },
    /// One map CAS conditional on `expected`, writing `row` (epoch + 1).
    Cas {
        expected: (NodeId, Epoch),
        row: PartitionRecord,
        /// `add_target`, `reads_to_target`, `remove_old_primary`, `remove_target`.
        action: &'static str,
        reason: &'static str,
    },
    /// Write `next` over the stored record (generation CAS).
    Advance {
        next: Box<PrimaryMove>,
        /// Why the phase changes (for the decision log).
        why: &'static str,
    },
    /// Ask `from` (p's primary at `epoch`) to switch primaryship to `to`.
    Switchover {
        from: NodeId,
        to: NodeId,
        epoch: Epoch,
    },
    /// The move ended: delete its record.
    Finish {
        outcome: PrimaryMoveOutcome,
        reason: &'static str,
    },
}

/// Every reason a primary move ends with (the record stores it as text).
pub const END_REASONS: [&str; 12] = [
    "completed",
    "old_primary_kept",
    "moved_back",
    "primary_changed",
    "primary_changed_after_switch",
    "target_gone",
    "target_draining",
    "target_down",
    "target_removed",
    "timeout",
    "switch_timeout",
    "partition_gone",
];

/// The stored reason as one of [`END_REASONS`] (`"unknown"` otherwise).
pub fn end_reason(text: &str) -> &'static str {
    END_REASONS
        .into_iter()
        .find(|r| *r == text)
        .unwrap_or("unknown")
}

/// The next step of `mv` (pure; see the module docs). `first`: `mv` is the
/// oldest live move of its partition (a later one is a duplicate);
/// `migrating`: the partition has a live migration; `switching`: a
/// switchover this leader started for `mv` has not answered yet.
pub fn step(
    mv: &PrimaryMove,
    map: &PartitionMap,
    first: bool,
    migrating: bool,
    switching: bool,
    now_ms: u64,
    timeout_ms: u64,
) -> PStep {
    let (p, t) = (mv.from, mv.to);
    let finish = |outcome, reason: &'static str| PStep::Finish { outcome, reason };
    let advance = |phase, why| PStep::Advance {
        next: Box::new(mv.entering(phase, now_ms)),
        why,
    };
    let end = |outcome: PrimaryMoveOutcome, reason: &'static str| {
        let mut next = mv.entering(Phase::Ending, now_ms);
        next.outcome = Some(outcome);
        next.reason = reason.to_string();
        PStep::Advance {
            next: Box::new(next),
            why: reason,
        }
    };
    let Some(row) = map.partitions.get(&mv.partition) else {
        return finish(
            mv.outcome.unwrap_or(PrimaryMoveOutcome::Abandoned),
            "partition_gone",
        );
    };
    if !first && mv.phase != Phase::Ending {
        return finish(PrimaryMoveOutcome::Abandoned, "duplicate");
    }
    if switching {
        return PStep::Wait { why: "switching" };
    }
    if migrating {
        return PStep::Wait {
            why: "migration_in_flight",
        };
    }
    let expected = (row.owner, row.epoch);
    let cas = |mut next: PartitionRecord, action, reason| {
        next.epoch = Epoch(row.epoch.0 + 1);
        debug_assert!(!next.replicas.contains(&next.owner));
        debug_assert!(next.in_sync.iter().all(|r| next.replicas.contains(r)));
        debug_assert!(next.reads_from.is_none_or(|r| next.in_sync.contains(&r)));
        PStep::Cas {
            expected,
            row: next,
            action,
            reason,
        }
    };
    let without = |n: NodeId| {
        let mut r = row.clone();
        r.remove_replica(n);
        r
    };
    let copies = 1 + row.replicas.len();
    let rf = wanted_copies(map, row);
    if mv.phase == Phase::Ending {
        let outcome = mv.outcome.unwrap_or(PrimaryMoveOutcome::Abandoned);
        // T goes again if the move did not leave it primary and it is an
        // extra copy (never below the factor).
        if outcome != PrimaryMoveOutcome::Done
            && row.owner != t
            && row.replicas.contains(&t)
            && copies > rf
        {
            return cas(without(t), "remove_target", outcome.name());
        }
        return finish(outcome, end_reason(&mv.reason));
    }
    if mv.phase.before_switch() {
        if row.owner == t {
            // The switch (or a failover to T): the window starts now.
            let mut next = mv.entering(Phase::FailBackWindow, now_ms);
            next.switched_at_ms = Some(now_ms);
            return PStep::Advance {
                next: Box::new(next),
                why: "target_is_primary",
            };
        }
        if row.owner != p {
            return end(PrimaryMoveOutcome::Abandoned, "primary_changed");
        }
        match map.nodes.get(&t) {
            None => return end(PrimaryMoveOutcome::Abandoned, "target_gone"),
            Some(n) if n.draining => {
                return end(PrimaryMoveOutcome::Abandoned, "target_draining");
            }
            // A target without a lease cannot catch up or take over; the
            // move must not hold the partition (the reconciler leaves a
            // partition with a live move alone) while it may be gone.
            Some(n) if n.state == NodeState::Down => {
                return end(PrimaryMoveOutcome::Abandoned, "target_down");
            }
            Some(_) => {}
        }
        let t_in_sync = row.in_sync.contains(&t);
        match mv.phase {
            Phase::AddReplica => {
                if row.has_copy(t) {
                    return advance(Phase::WaitInSync, "target_added");
                }
                let mut r = row.clone();
                r.replicas.push(t);
                return cas(r, "add_target", "primary_move");
            }
            Phase::WaitInSync => {
                if !row.replicas.contains(&t) {
                    return end(PrimaryMoveOutcome::Abandoned, "target_removed");
                }
                if t_in_sync {
                    let next = if mv.reads_first {
                        Phase::ReadsFirst
                    } else {
                        Phase::Switch
                    };
                    return advance(next, "target_in_sync");
                }
                if now_ms >= mv.phase_at_ms.saturating_add(timeout_ms) {
                    return end(PrimaryMoveOutcome::Abandoned, "timeout");
                }
                return PStep::Wait { why: "catching_up" };
            }
            _ if !t_in_sync => return advance(Phase::WaitInSync, "target_out_of_sync"),
            Phase::ReadsFirst => {
                if row.reads_from == Some(t) {
                    return advance(Phase::ReadsHold, "reads_on_target");
                }
                let mut r = row.clone();
                r.reads_from = Some(t);
                return cas(r, "reads_to_target", "reads_first");
            }
            Phase::ReadsHold => {
                if row.reads_from != Some(t) {
                    return advance(Phase::ReadsFirst, "reads_from_cleared");
                }
                if now_ms >= mv.phase_at_ms.saturating_add(mv.reads_first_hold_ms) {
                    return advance(Phase::Switch, "reads_first_held");
                }
                return PStep::Wait {
                    why: "reads_first_hold",
                };
            }
            Phase::Switch => {
                if now_ms >= mv.phase_at_ms.saturating_add(timeout_ms) {
                    return end(PrimaryMoveOutcome::Abandoned, "switch_timeout");
                }
                return PStep::Switchover {
                    from: p,
                    to: t,
                    epoch: row.epoch,
                };
            }
            _ => unreachable!("before_switch covers these"),
        }
    }
    // After the switch: T is expected to be primary.
    if mv.phase == Phase::SwitchBack && row.owner == p {
        return end(PrimaryMoveOutcome::MovedBack, "moved_back");
    }
    if row.owner != t {
        // A failover after the switch: the move's switch happened; what
        // the row holds now is the failover's business.
        return end(PrimaryMoveOutcome::Done, "primary_changed_after_switch");
    }
    let p_in_sync = row.in_sync.contains(&p);
    let window_end = mv.window_ends_at_ms().unwrap_or(mv.phase_at_ms);
    match mv.phase {
        Phase::FailBackWindow => {
            if let Some(at) = mv.back_requested_at_ms {
                let refuse = |why| {
                    let mut next = mv.clone();
                    next.back_requested_at_ms = None;
                    PStep::Advance {
                        next: Box::new(next),
                        why,
                    }
                };
                if at >= window_end {
                    return refuse("back_outside_window");
                }
                if !p_in_sync {
                    return refuse("back_old_primary_not_in_sync");
                }
                return advance(Phase::SwitchBack, "back_requested");
            }
            if now_ms >= window_end {
                return advance(Phase::RemoveOld, "fail_back_window_over");
            }
            // Another replica without a lease: the move ends now, keeping
            // P (in sync) as its copy, so re-replication (which leaves a
            // partition with a live move alone) is not held up by the window.
            if row
                .replicas
                .iter()
                .any(|r| *r != p && map.nodes.get(r).is_none_or(|n| n.state == NodeState::Down))
            {
                return end(PrimaryMoveOutcome::Done, "old_primary_kept");
            }
            // No failing back to a node without a lease: the window ends
            // so the copy count (and re-replication) is not held up.
            if map.nodes.get(&p).is_none_or(|n| n.state == NodeState::Down) {
                return advance(Phase::RemoveOld, "old_primary_down");
            }
            PStep::Wait {
                why: "fail_back_window",
            }
        }
        Phase::SwitchBack => {
            if !p_in_sync || now_ms >= mv.phase_at_ms.saturating_add(timeout_ms) {
                // Back to the window (or past it): P stays a replica.
                let mut next = mv.entering(Phase::FailBackWindow, mv.phase_at_ms);
                next.back_requested_at_ms = None;
                return PStep::Advance {
                    next: Box::new(next),
                    why: if p_in_sync {
                        "switch_back_timeout"
                    } else {
                        "back_old_primary_not_in_sync"
                    },
                };
            }
            PStep::Switchover {
                from: t,
                to: p,
                epoch: row.epoch,
            }
        }
        Phase::RemoveOld => {
            if !row.has_copy(p) {
                return finish(PrimaryMoveOutcome::Done, "completed");
            }
            if copies > rf {
                return cas(without(p), "remove_old_primary", "fail_back_window_over");
            }
            finish(PrimaryMoveOutcome::Done, "old_primary_kept")
        }
        _ => unreachable!("the phases after the switch"),
    }
}

/// Why `ctl move --back` cannot switch back now.
#[derive(thiserror::Error, Debug, PartialEq, Eq)]
pub enum MoveBackError {
    #[error("partition {0} has no primary move in progress (nothing to move back)")]
    NoMove(PartitionId),
    #[error(
        "primary move {id} of partition {partition} is in phase {phase}: it can be moved back only in its fail-back window, after the switch"
    )]
    NotSwitched {
        id: u64,
        partition: PartitionId,
        phase: &'static str,
    },
    #[error(
        "primary move {id} of partition {partition}: the fail-back window ({window_ms} ms) ended {ago_ms} ms ago; the old primary is no longer kept for a move back"
    )]
    WindowOver {
        id: u64,
        partition: PartitionId,
        window_ms: u64,
        ago_ms: u64,
    },
    #[error(
        "primary move {id} of partition {partition}: the old primary node {node} is not in sync (in sync: {in_sync:?}); a move back would need a copy, use `ctl move` instead"
    )]
    NotInSync {
        id: u64,
        partition: PartitionId,
        node: NodeId,
        in_sync: Vec<u64>,
    },
    #[error("primary move {id} of partition {partition}: a move back is already requested")]
    AlreadyRequested { id: u64, partition: PartitionId },
}

/// Checks that `mv` may be moved back at `now_ms` (pure), and returns the
/// record asking for it.
pub fn request_back(
    mv: &PrimaryMove,
    map: &PartitionMap,
    now_ms: u64,
) -> Result<PrimaryMove, MoveBackError> {
    let (id, partition) = (mv.id, mv.partition);
    if mv.phase != Phase::FailBackWindow {
        return Err(MoveBackError::NotSwitched {
            id,
            partition,
            phase: mv.phase.name(),
        });
    }
    if mv.back_requested_at_ms.is_some() {
        return Err(MoveBackError::AlreadyRequested { id, partition });
    }
    let end = mv.window_ends_at_ms().unwrap_or(0);
    if now_ms >= end {
        return Err(MoveBackError::WindowOver {
            id,
            partition,
            window_ms: mv.fail_back_window_ms,
            ago_ms: now_ms - end,
        });
    }
    let row = map
        .partitions
        .get(&partition)
        .ok_or(MoveBackError::NoMove(partition))?;
    if row.owner != mv.to || !row.in_sync.contains(&mv.from) {
        return Err(MoveBackError::NotInSync {
            id,
            partition,
            node: mv.from,
            in_sync: row.in_sync.iter().map(|n| n.0).collect(),
        });
    }
    let mut next = mv.clone();
    next.back_requested_at_ms = Some(now_ms);
    Ok(next)
}
