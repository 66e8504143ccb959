//! Commands: what [`crate::Migration::handle`] tells the drivers to do.
//!
//! The driver contract:
//! - Execute a batch in order. A `Persist` is always first in its batch; it
//!   is a compare-and-set of the record on `(id, generation - 1)`. If it
//!   fails (conflict, or store unreachable so the outcome is unknown), drop
//!   the rest of the batch, reload the record and feed `Recovered`.
//! - A `Persist` of the flip request and the `CommitFlip` right after it may
//!   go to the store as one transaction (both or neither: the manager's
//!   driver does, `MetaStore::commit_with_migration`): the request is then
//!   durable no later than the CAS, which is what the order is for.
//! - Every command is idempotent: it may be executed again after a crash,
//!   and the machine re-issues commands after `Recovered` and on retries.
//!   Nodes recognise repeats by migration id.
//! - Report outcomes as [`crate::Event`]s; a command that cannot be carried
//!   out (e.g. the source no longer holds snapshot S) is reported as
//!   `ActorFailed`.

use keyway_map::{Epoch, NodeId, OwnershipCondition, PartitionRecord};
use serde::{Deserialize, Serialize};

use crate::MigrationRecord;

/// One thing a driver must do.
// `Persist` carries the whole record (a few hundred bytes); commands live in
// batches of a handful and are never stored in bulk, so boxing it buys nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case")]
pub enum Command {
    /// CAS-write this record (generation g over g - 1) before anything else
    /// in the batch.
    Persist(MigrationRecord),
    /// Source: take a consistent snapshot of the range; report `SnapshotTaken`.
    TakeSnapshot,
    /// Source → target: stream snapshot `from_seq` (throttled); report
    /// `CopyProgress`/`CopyDone`.
    StartCopy { from_seq: u64 },
    /// Source → target: stream change-log records with seq > `after_seq`
    /// (the target skips what it already applied); report `CatchupLag`.
    StartCatchup { after_seq: u64 },
    /// Source: forward every new write in the range to the target before
    /// acknowledging it; report `DualEnabled`.
    EnableDual,
    /// Source: stop forwarding writes to the target (abort only).
    DisableDual,
    /// Source: stop serving the range, drain in-flight writes; report
    /// `SourceFenced`.
    FenceSource,
    /// Both: digest the range; report `Digests`.
    ComputeDigests,
    /// Metadata store: the flip, one CAS (invariant 6): `condition` is
    /// (source, e), `new_record` is the row with owner target at e + 1.
    /// Report `FlipCommitted`, `FlipConflict` or `FlipUnavailable`. Re-sent
    /// identically while the outcome is unknown; at most one can apply.
    CommitFlip {
        condition: OwnershipCondition,
        new_record: PartitionRecord,
    },
    /// Target: serve the partition at `epoch` (push the committed map to it
    /// if it has not seen it yet); report `TargetServing`.
    AwaitTargetServing { epoch: Epoch },
    /// Source: lift the fence; it serves the range again (abort only).
    UnfenceSource,
    /// Target: stop any stream of this migration and delete the partial
    /// copy (abort only).
    DropTargetCopy,
    /// Driver: report `GraceElapsed` after `ms`.
    StartGrace { ms: u64 },
    /// Source: drop the range, keeping the note "moved to `moved_to` at
    /// `epoch`" so it answers with a redirect, never "not found"
    /// (invariant 3); report `SourceDropped`.
    DropSourceRange { moved_to: NodeId, epoch: Epoch },
    /// Metrics: the measured cutover write pause. Reported at most once (a
    /// crash right after the `Persist` may lose it, and it is not re-issued
    /// on recovery, so a histogram never counts a move twice); the durable
    /// `pause_ms` in the record is the measurement of record.
    RecordPause { ms: u64 },
    /// Driver: the migration is over (`DONE` or `ABORTED`); stop driving it.
    Finish,
}

impl Command {
    /// The variant's name, for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Persist(_) => "Persist",
            Command::TakeSnapshot => "TakeSnapshot",
            Command::StartCopy { .. } => "StartCopy",
            Command::StartCatchup { .. } => "StartCatchup",
            Command::EnableDual => "EnableDual",
            Command::DisableDual => "DisableDual",
            Command::FenceSource => "FenceSource",
            Command::ComputeDigests => "ComputeDigests",
            Command::CommitFlip { .. } => "CommitFlip",
            Command::AwaitTargetServing { .. } => "AwaitTargetServing",
            Command::UnfenceSource => "UnfenceSource",
            Command::DropTargetCopy => "DropTargetCopy",
            Command::StartGrace { .. } => "StartGrace",
            Command::DropSourceRange { .. } => "DropSourceRange",
            Command::RecordPause { .. } => "RecordPause",
            Command::Finish => "Finish",
        }
    }
}
