//! The durable migration record: what the metadata store keeps for one
//! migration, and the only thing a restarted driver has to resume from.
//!
//! Every write of a record is a compare-and-set on `(id, generation)`: the
//! machine bumps `generation` by exactly one per [`crate::Command::Persist`],
//! and the driver writes the record only if the stored one still has
//! `generation - 1`. Two drivers can therefore never both advance the same
//! migration.
//!
//! The record keeps the partition row as the map held it when the migration
//! was created (`owner` = source, `epoch` = e), so the flip's condition
//! `(source, e)` and its new row `(target, e + 1)` are derived from one place
//! and can never disagree ([`MigrationRecord::flip_condition`],
//! [`MigrationRecord::flipped_partition`]).
//!
//! [`MigrationRecord::validate`] is the record's invariant. It runs in a pair:
//! where a record is produced (before every `Persist`, as an assertion) and
//! where one is loaded ([`crate::Migration::new`], as an error).

use crate::event::{Actor, RangeDigest};
use keyway_map::{Epoch, NodeId, OwnershipCondition, PartitionId, PartitionRecord};
use serde::{Deserialize, Serialize};
use std::fmt;

/// A migration's id, allocated by the manager, never reused.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct MigrationId(pub u64);

impl fmt::Display for MigrationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The durable states of seed 003's machine, in protocol order:
/// `PENDING → COPYING → CATCHUP → DUAL → CUTOVER → CLEANUP → DONE`, and
/// `ABORTED` from any state before the flip is requested.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MigrationState {
    /// Target allocated, nothing copied; the source owns everything.
    Pending,
    /// The source snapshot (at change-log seq S) streams to the target.
    Copying,
    /// The target applies the source's change log after S.
    Catchup,
    /// Every write the source accepts is applied at the target before it is
    /// acknowledged; the source still owns reads and writes.
    Dual,
    /// The source is fenced; digests gate the flip; the flip CAS; the
    /// target starts serving. The write pause lives here.
    Cutover,
    /// The target owns the partition; after a grace period the source
    /// drops the range, keeping a "moved to target at epoch e+1" note.
    Cleanup,
    /// Finished; the target owns the partition at epoch e+1 (the old
    /// source's copy is dropped, or still to be while `stray` names it).
    Done,
    /// Reverted to the source before the flip; the target's copy dropped
    /// (or, while `stray` names the target, still to be dropped).
    Aborted,
}

impl MigrationState {
    /// Every state, in protocol order.
    pub const ALL: [MigrationState; 8] = [
        MigrationState::Pending,
        MigrationState::Copying,
        MigrationState::Catchup,
        MigrationState::Dual,
        MigrationState::Cutover,
        MigrationState::Cleanup,
        MigrationState::Done,
        MigrationState::Aborted,
    ];

    /// The name the design brief uses (`PENDING`, `COPYING`, ...).
    pub fn name(self) -> &'static str {
        match self {
            MigrationState::Pending => "PENDING",
            MigrationState::Copying => "COPYING",
            MigrationState::Catchup => "CATCHUP",
            MigrationState::Dual => "DUAL",
            MigrationState::Cutover => "CUTOVER",
            MigrationState::Cleanup => "CLEANUP",
            MigrationState::Done => "DONE",
            MigrationState::Aborted => "ABORTED",
        }
    }

    /// `DONE` or `ABORTED`: nothing but `Recovered` and `Tick` is accepted.
    pub fn is_terminal(self) -> bool {
        matches!(self, MigrationState::Done | MigrationState::Aborted)
    }

    pub(crate) fn code(self) -> u8 {
        self as u8
    }

    pub(crate) fn from_code(code: u8) -> Option<MigrationState> {
        MigrationState::ALL.get(code as usize).copied()
    }
}

impl fmt::Display for MigrationState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a migration was aborted (kept in the record for operators).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AbortReason {
    /// An operator or the manager asked.
    Requested { reason: String },
    /// A pre-flip state made no progress for `stuck_timeout_ms`.
    StuckTimeout {
        state: MigrationState,
        waited_ms: u64,
    },
    /// The source stayed fenced for `fence_timeout_ms` without the flip
    /// being requested (the write pause is bounded).
    FenceTimeout { waited_ms: u64 },
    /// The range digests at the fence point differ.
    DigestMismatch {
        source: RangeDigest,
        target: RangeDigest,
    },
    /// The flip CAS failed its condition and the map does not show our flip:
    /// it never applied and never will (epochs are never reused).
    FlipConflict { current: Option<(NodeId, Epoch)> },
    /// The source or the target failed before the flip; its volatile
    /// migration state (snapshot, streams) is gone.
    ActorFailed { who: Actor, detail: String },
    /// The driver restarted in a state that cannot resume (see
    /// [`crate::Migration`]'s recovery rules).
    NotResumable { state: MigrationState },
}

/// One migration's durable record.
///
/// Fields marked *progress* change between persists (they are reports, not
/// decisions) and are carried by the next `Persist`; every other field
/// changes only together with a `Persist` and a generation bump.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigrationRecord {
    pub id: MigrationId,
    /// The partition as the map held it at creation: `owner` is the source,
    /// `epoch` is e. Never changed afterwards.
    pub partition: PartitionRecord,
    pub target: NodeId,
    pub state: MigrationState,
    /// CAS token: grows by exactly one on every persist.
    pub generation: u64,
    /// When the migration was started (creation time while `PENDING`).
    pub started_at_ms: u64,
    /// When the current state was entered.
    pub state_entered_at_ms: u64,
    /// S: the source change-log seq of the snapshot being copied.
    pub snapshot_seq: Option<u64>,
    /// Size of the snapshot (as the source estimated it).
    pub total_bytes: u64,
    /// *Progress*: snapshot bytes the target has (≤ `total_bytes`).
    pub copied_bytes: u64,
    /// *Progress*: the last source seq the target applied (≥ S).
    pub catchup_applied_seq: u64,
    /// The source seq from which every write is dual-written (set on
    /// entering `CUTOVER`: the flip requires dual-writing).
    pub dual_at_seq: Option<u64>,
    /// When the source confirmed the fence (start of the write pause);
    /// persisted with the flip request.
    pub fence_started_ms: Option<u64>,
    /// When the flip CAS was first requested. From here on abort is
    /// impossible unless a conflict proves the CAS never applied.
    pub flip_requested_ms: Option<u64>,
    /// When the flip CAS was known to have applied.
    pub flip_done_ms: Option<u64>,
    /// The measured write pause: fence confirmed → target serving.
    pub pause_ms: Option<u64>,
    /// The cutover's steps as the driver timed them (recorded with
    /// `pause_ms`; `None` in records written before this field existed).
    #[serde(default)]
    pub cutover_steps: Option<crate::event::CutoverSteps>,
    /// The state an abort happened in (decides what reverting undoes).
    pub aborted_from: Option<MigrationState>,
    pub abort_reason: Option<AbortReason>,
    /// Work left after the migration ended: a node that may still hold a
    /// copy of the range and must drop it once it is reachable again (or
    /// forget it when the node is decommissioned). `ABORTED` is persisted
    /// with the target here (its partial copy is dropped next, then this is
    /// cleared); `DONE` carries the old source when it could not be reached
    /// within the cleanup attempts. Only in `DONE`/`ABORTED`: a record with
    /// a stray copy is over (the range is free for later moves, splits and
    /// merges), and the driver drops the copy when the node is back.
    #[serde(default)]
    pub stray: Option<NodeId>,
    /// The map version `partition` was read at when the migration was
    /// requested (0: unknown). The row was `(source, e)` then, so the map's
    /// history after this version tells what replaced it: the evidence a
    /// flip conflict is decided from needs no older history.
    #[serde(default)]
    pub map_version: u64,
    /// *Progress*, the copy's cost as the source's push counts it
    /// (keyway-node `copies.rs`): payload bytes (key + data) shipped to the
    /// target and acknowledged, during the copy phase (the snapshot and the
    /// records streamed up to its checkpoint). Reported by the source's
    /// `MigrateStatus` and carried by the driver into the record with the
    /// persist that ends `COPYING` (final from then on; 0 in records
    /// written before this field existed, and in a migration that never
    /// copied).
    #[serde(default)]
    pub bytes_sent: u64,
    /// *Progress*: the bytes the target reported it applied in that phase.
    #[serde(default)]
    pub bytes_written: u64,
    /// *Progress*: the copy phase's duration at the source (push start to
    /// copy done), ms.
    #[serde(default)]
    pub copy_duration_ms: u64,
}

/// A record that breaks the record invariant.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
#[error("invalid migration record {id} ({state}): {what}")]
pub struct RecordError {
    pub id: MigrationId,
    pub state: MigrationState,
    pub what: &'static str,
}

impl MigrationRecord {
    /// A new `PENDING` record at generation 0 for moving `partition` (as the
    /// map holds it now: owner = source, epoch = e) to `target`. Check it
    /// with [`MigrationRecord::validate`] (e.g. source ≠ target).
    pub fn new(
        id: MigrationId,
        partition: PartitionRecord,
        target: NodeId,
        now_ms: u64,
    ) -> MigrationRecord {
        MigrationRecord {
            id,
            partition,
            target,
            state: MigrationState::Pending,
            generation: 0,
            started_at_ms: now_ms,
            state_entered_at_ms: now_ms,
            snapshot_seq: None,
            total_bytes: 0,
            copied_bytes: 0,
            catchup_applied_seq: 0,
            dual_at_seq: None,
            fence_started_ms: None,
            flip_requested_ms: None,
            flip_done_ms: None,
            pause_ms: None,
            cutover_steps: None,
            aborted_from: None,
            abort_reason: None,
            stray: None,
            map_version: 0,
            bytes_sent: 0,
            bytes_written: 0,
            copy_duration_ms: 0,
        }
    }

    pub fn partition_id(&self) -> PartitionId {
        self.partition.id
    }

    /// The node the partition moves away from.
    pub fn source(&self) -> NodeId {
        self.partition.owner
    }

    /// e: the partition's epoch when the migration was created.
    pub fn epoch(&self) -> Epoch {
        self.partition.epoch
    }

    /// e + 1: the epoch the target owns the partition at after the flip.
    pub fn flipped_epoch(&self) -> Epoch {
        Epoch(self.partition.epoch.0 + 1)
    }

    /// The flip's guard: the partition is still owned by the source at e.
    pub fn flip_condition(&self) -> OwnershipCondition {
        OwnershipCondition {
            partition: self.partition.id,
            expected: Some((self.source(), self.epoch())),
        }
    }

    /// The partition row the flip writes: owner target, epoch e + 1, the
    /// target off the replica list (if it was on it, the source takes its
    /// place, so the copy count stays at the replication factor), and an
    /// empty in-sync set: the target's log positions differ from the
    /// source's, so every replica re-syncs from it; `reads_from` is cleared
    /// with it (it must name an in-sync replica, and the owner changes).
    pub fn flipped_partition(&self) -> PartitionRecord {
        let mut row = self.partition.clone();
        row.owner = self.target;
        row.epoch = self.flipped_epoch();
        if row.replicas.contains(&self.target) {
            row.replicas.retain(|r| *r != self.target);
            row.replicas.push(self.source());
        }
        row.in_sync.clear();
        row.reads_from = None;
        debug_assert!(!row.replicas.contains(&row.owner));
        row
    }

    /// The flip CAS has been requested (persisted before it was sent).
    pub fn flip_requested(&self) -> bool {
        self.flip_requested_ms.is_some()
    }

    /// The flip CAS is known to have applied: the target owns the partition.
    pub fn flipped(&self) -> bool {
        self.flip_done_ms.is_some()
    }

    /// The flip was requested and its outcome is not known yet.
    pub fn flip_in_doubt(&self) -> bool {
        self.flip_requested() && !self.flipped()
    }

    /// Whether an abort is still possible: not terminal, flip never requested.
    pub fn can_abort(&self) -> bool {
        !self.state.is_terminal() && !self.flip_requested()
    }

    /// Checks the record invariant: fields agree with each other and with
    /// the state.
    pub fn validate(&self) -> Result<(), RecordError> {
        use MigrationState::*;
        let state = self.state;
        let fail = |what| {
            Err(RecordError {
                id: self.id,
                state,
                what,
            })
        };
        let at_least = |s: MigrationState| match state {
            Aborted => self.aborted_from.is_some_and(|from| from >= s),
            _ => state >= s,
        };
        if self.source() == self.target {
            return fail("source and target are the same node");
        }
        if self.partition.epoch.0 == u64::MAX {
            return fail("epoch e has no successor");
        }
        if self.started_at_ms > self.state_entered_at_ms {
            return fail("state entered before the migration started");
        }
        if (state == Aborted) != self.aborted_from.is_some()
            || (state == Aborted) != self.abort_reason.is_some()
        {
            return fail("abort fields set iff ABORTED");
        }
        if self
            .aborted_from
            .is_some_and(|from| !matches!(from, Pending | Copying | Catchup | Dual | Cutover))
        {
            return fail("aborted from a state after the flip");
        }
        if self.copied_bytes > self.total_bytes {
            return fail("copied more bytes than the snapshot holds");
        }
        match self.snapshot_seq {
            None if at_least(Catchup) => return fail("no snapshot seq after COPYING"),
            None if self.copied_bytes > 0 || self.total_bytes > 0 => {
                return fail("copy progress without a snapshot");
            }
            Some(_) if state == Pending => return fail("snapshot seq while PENDING"),
            Some(s) if self.catchup_applied_seq < s => {
                return fail("catch-up applied seq below the snapshot seq");
            }
            _ => {}
        }
        match self.dual_at_seq {
            None if at_least(Cutover) => return fail("CUTOVER without dual-writing"),
            Some(_) if !at_least(Dual) => return fail("dual-writing before DUAL"),
            Some(d) if self.snapshot_seq.is_none_or(|s| d < s) => {
                return fail("dual-writing from before the snapshot");
            }
            _ => {}
        }
        if self.fence_started_ms.is_some() && !at_least(Cutover) {
            return fail("fence time before CUTOVER");
        }
        if self.flip_requested() && self.fence_started_ms.is_none() {
            return fail("flip requested without a fence");
        }
        if self.flipped() && !self.flip_requested() {
            return fail("flip done without a flip request");
        }
        if matches!(state, Cleanup | Done) && (!self.flipped() || self.pause_ms.is_none()) {
            return fail("CLEANUP/DONE without a completed flip and a measured pause");
        }
        if self.pause_ms.is_some() && !matches!(state, Cleanup | Done) {
            return fail("pause measured outside CLEANUP/DONE");
        }
        match (state, self.stray) {
            (_, None) => {}
            (Aborted, Some(node)) if node == self.target => {}
            (Done, Some(node)) if node == self.source() => {}
            (Aborted | Done, Some(_)) => {
                return fail("a stray copy on a node that is not the one left holding it");
            }
            (_, Some(_)) => return fail("a stray copy before the migration is over"),
        }
        if self.aborted_from.is_some() {
            if self.flipped() {
                return fail("aborted after the flip");
            }
            let proven_not_applied = match &self.abort_reason {
                Some(AbortReason::FlipConflict { current }) => {
                    *current != Some((self.target, self.flipped_epoch()))
                        && *current != Some((self.source(), self.epoch()))
                }
                _ => false,
            };
            if self.flip_requested() && !proven_not_applied {
                return fail("aborted with the flip in doubt");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use bytes::Bytes;
    use keyway_map::{KeyspaceId, PartitionState};

    pub(crate) fn partition() -> PartitionRecord {
        PartitionRecord {
            id: PartitionId(7),
            keyspace: KeyspaceId(0),
            start: Bytes::from_static(&[0x10, 0x00]),
            end: Some(Bytes::from_static(&[0x20, 0x00])),
            owner: NodeId(1),
            replicas: vec![NodeId(2), NodeId(3)],
            in_sync: Vec::new(),
            reads_from: None,
            epoch: Epoch(4),
            state: PartitionState::Active,
        }
    }

    pub(crate) fn record() -> MigrationRecord {
        MigrationRecord::new(MigrationId(9), partition(), NodeId(2), 1_000)
    }

    #[test]
    fn flip_is_derived_from_the_partition_row() {
        let r = record();
        assert_eq!(
            (r.source(), r.epoch(), r.partition_id()),
            (NodeId(1), Epoch(4), PartitionId(7))
        );
        let c = r.flip_condition();
        assert_eq!(c.partition, PartitionId(7));
        assert_eq!(c.expected, Some((NodeId(1), Epoch(4))));
        let row = r.flipped_partition();
        assert_eq!((row.owner, row.epoch), (NodeId(2), Epoch(5)));
        assert_eq!(
            row.replicas,
            vec![NodeId(3), NodeId(1)],
            "the target leaves the replica list, the source takes its place"
        );
        assert_eq!(
            (row.start, row.end),
            (r.partition.start.clone(), r.partition.end.clone())
        );
    }

    #[test]
    fn a_replicated_flip_keeps_the_copy_count_and_empties_the_in_sync_set() {
        let mut p = partition();
        p.in_sync = vec![NodeId(2), NodeId(3)];
        // To a node with no copy: the replicas stay, the source leaves.
        let row =
            MigrationRecord::new(MigrationId(9), p.clone(), NodeId(4), 1_000).flipped_partition();
        assert_eq!(row.owner, NodeId(4));
        assert_eq!(row.replicas, [NodeId(2), NodeId(3)]);
        assert!(
            row.in_sync.is_empty(),
            "replicas re-sync from the new primary"
        );
        // To a replica: the source stays as a replica in its place.
        let row = MigrationRecord::new(MigrationId(9), p, NodeId(3), 1_000).flipped_partition();
        assert_eq!(row.replicas, [NodeId(2), NodeId(1)]);
        assert!(row.in_sync.is_empty());
    }

    #[test]
    fn a_flip_clears_reads_from() {
        let mut p = partition();
        p.in_sync = vec![NodeId(2), NodeId(3)];
        p.reads_from = Some(NodeId(3));
        for target in [NodeId(3), NodeId(4)] {
            let row =
                MigrationRecord::new(MigrationId(9), p.clone(), target, 1_000).flipped_partition();
            assert_eq!(
                row.reads_from, None,
                "the flip empties in_sync, so reads_from must go with it"
            );
        }
    }

    #[test]
    fn validate_accepts_a_new_record_and_names_each_broken_rule() {
        record().validate().unwrap();
        let broken = |f: fn(&mut MigrationRecord), what: &str| {
            let mut r = record();
            f(&mut r);
            let err = r.validate().unwrap_err();
            assert_eq!(err.what, what, "{r:?}");
        };
        broken(
            |r| r.target = NodeId(1),
            "source and target are the same node",
        );
        broken(
            |r| r.partition.epoch = Epoch(u64::MAX),
            "epoch e has no successor",
        );
        broken(
            |r| r.started_at_ms = 2_000,
            "state entered before the migration started",
        );
        broken(
            |r| r.copied_bytes = 1,
            "copied more bytes than the snapshot holds",
        );
        broken(|r| r.snapshot_seq = Some(3), "snapshot seq while PENDING");
        broken(
            |r| {
                r.state = MigrationState::Catchup;
            },
            "no snapshot seq after COPYING",
        );
        broken(
            |r| {
                r.state = MigrationState::Copying;
                r.snapshot_seq = Some(5);
                r.catchup_applied_seq = 4;
            },
            "catch-up applied seq below the snapshot seq",
        );
        broken(
            |r| {
                r.state = MigrationState::Copying;
                r.snapshot_seq = Some(5);
                r.catchup_applied_seq = 5;
                r.dual_at_seq = Some(6);
            },
            "dual-writing before DUAL",
        );
        broken(
            |r| {
                r.state = MigrationState::Aborted;
            },
            "abort fields set iff ABORTED",
        );
        broken(
            |r| {
                r.state = MigrationState::Aborted;
                r.aborted_from = Some(MigrationState::Cleanup);
                r.abort_reason = Some(AbortReason::Requested { reason: "x".into() });
            },
            "aborted from a state after the flip",
        );
        broken(
            |r| r.stray = Some(NodeId(2)),
            "a stray copy before the migration is over",
        );
        broken(
            |r| {
                r.state = MigrationState::Aborted;
                r.aborted_from = Some(MigrationState::Copying);
                r.abort_reason = Some(AbortReason::Requested { reason: "x".into() });
                r.stray = Some(NodeId(1));
            },
            "a stray copy on a node that is not the one left holding it",
        );
    }

    #[test]
    fn states_round_trip_through_their_codes_and_print_the_brief_names() {
        for s in MigrationState::ALL {
            assert_eq!(MigrationState::from_code(s.code()), Some(s));
        }
        assert_eq!(MigrationState::from_code(8), None);
        assert_eq!(MigrationState::Catchup.to_string(), "CATCHUP");
        assert!(MigrationState::Done.is_terminal() && MigrationState::Aborted.is_terminal());
        assert!(!MigrationState::Cleanup.is_terminal());
    }
}
