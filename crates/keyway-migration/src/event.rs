//! Events: what the drivers observe and feed into [`crate::Migration::handle`].
//!
//! An event is a fact reported by the source, the target, the metadata store
//! or the driver's own clock. Events may arrive late, twice, or in the wrong
//! state; the machine rejects those without changing anything. Times are
//! milliseconds on the driver's clock; the machine only ever moves its
//! notion of "now" forward.

use keyway_map::{Epoch, NodeId};
use serde::{Deserialize, Serialize};

/// A range's content fingerprint as each side computes it at the fence
/// point (mirrors `keyway_storage::RangeDigest`; this crate stays free of
/// the storage engine). Equal digests gate the flip.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RangeDigest {
    /// Number of live keys.
    pub keys: u64,
    /// Sum of key and value bytes.
    pub bytes: u64,
    /// Checksum over the entries.
    pub digest: u64,
}

/// What the driver found in the map when the flip CAS failed its
/// condition: the facts (owners and epochs) the machine decides from whether
/// that CAS applied ([`crate::Migration`] in `cutover.rs`). Never "someone
/// else's epoch, so not ours": a split or merge after a flip whose answer
/// was lost removes the partition id, and only the map's history can tell
/// whose row it was.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FlipEvidence {
    /// The partition's row now, `(owner, epoch)`; `None` if it is gone
    /// (split or merged away).
    pub current: Option<(NodeId, Epoch)>,
    /// From the retained map history: what replaced the partition's row
    /// `(source, e)`: the `(owner, epoch)` of the partition's own next row,
    /// or of the row(s) a split or merge put in its place (a split or merge
    /// keeps the owner, so their owner is the owner the row had when it was
    /// removed). `None`: the history does not reach back to `(source, e)`
    /// or could not be read.
    pub successor: Option<(NodeId, Epoch)>,
    /// `(owner, epoch)` of every row covering part of the range now.
    pub covering: Vec<(NodeId, Epoch)>,
}

impl FlipEvidence {
    /// Evidence of only the partition's row (no history, no covering rows).
    pub fn row(current: Option<(NodeId, Epoch)>) -> FlipEvidence {
        FlipEvidence {
            current,
            covering: current.into_iter().collect(),
            successor: None,
        }
    }
}

/// The cutover's steps as the driver timed them, in microseconds: where
/// the write pause goes (seed 003's fence window, issue 15). `fence_us`
/// runs from the fence request to the source's answer (it includes the
/// drain: the target has every write the source admitted, fsynced); the
/// write pause starts inside it, when the source fences. The others follow
/// in order: `digest_us` (both sides' digests at the fence point),
/// `flip_us` (persisting the flip request, then the CAS), `serve_us` (until
/// the target answers that it serves at e + 1). A step repeated after a
/// retry adds up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CutoverSteps {
    pub fence_us: u64,
    pub digest_us: u64,
    pub flip_us: u64,
    pub serve_us: u64,
}

impl CutoverSteps {
    /// Fence request to target serving: the longest any write waited.
    pub fn total_us(&self) -> u64 {
        self.fence_us + self.digest_us + self.flip_us + self.serve_us
    }
}

/// Who failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Actor {
    Source,
    Target,
    /// The driver itself lost its in-memory state (e.g. a stream or timer
    /// task died): handled exactly like [`Event::Recovered`].
    Manager,
}

/// Something a driver observed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// The manager starts a `PENDING` migration.
    Started { now: u64 },
    /// The source took the snapshot at change-log seq `seq`.
    SnapshotTaken { seq: u64, total_bytes: u64 },
    /// The target holds `bytes` of the snapshot (cumulative).
    CopyProgress { bytes: u64 },
    /// The target holds the whole snapshot.
    CopyDone,
    /// The copy's cost so far, as the source's push counts it (a progress
    /// report, like `CopyProgress`: kept in the record's `bytes_sent`,
    /// `bytes_written`, `copy_duration_ms` and carried by the next persist;
    /// the driver reports it before `CopyDone`, so the persist ending
    /// `COPYING` carries the final cost).
    CopyCost {
        bytes_sent: u64,
        bytes_written: u64,
        copy_duration_ms: u64,
    },
    /// The target applied the source change log up to `applied_seq`; the
    /// source is at `source_seq`.
    CatchupLag { applied_seq: u64, source_seq: u64 },
    /// The source forwards every write with seq > `at_seq` to the target and
    /// acknowledges it only after the target applied it.
    DualEnabled { at_seq: u64 },
    /// The source stopped serving the range and drained in-flight writes.
    SourceFenced { now: u64 },
    /// The range digests of both sides, computed while the source is fenced.
    Digests {
        source: RangeDigest,
        target: RangeDigest,
    },
    /// The flip CAS applied.
    FlipCommitted { now: u64 },
    /// The flip CAS failed its condition (`MetaError::Conflict`); what the
    /// map shows now and what its history shows replaced `(source, e)`.
    FlipConflict { evidence: FlipEvidence },
    /// The metadata store could not be reached: the CAS outcome is unknown
    /// (`MetaError::Unavailable`).
    FlipUnavailable,
    /// The target serves the partition at epoch e + 1; `steps` is what the
    /// driver measured of the cutover's steps (recorded with the pause).
    TargetServing { now: u64, steps: CutoverSteps },
    /// The grace timer started by `StartGrace` fired.
    GraceElapsed,
    /// The source dropped the range and keeps the "moved" note (in `DONE`
    /// with a stray copy: the old source's copy is gone).
    SourceDropped,
    /// `ABORTED`: the target's copy of the range is gone (dropped, or the
    /// target was decommissioned, or it owns part of the range now and
    /// nothing of it may be dropped).
    TargetDropped,
    /// Time passes; drives timeouts and retries.
    Tick { now: u64 },
    /// An operator or the manager wants the migration reverted.
    AbortRequested { reason: String },
    /// An actor failed or restarted, losing its volatile migration state.
    ActorFailed { who: Actor, detail: String },
    /// The driver restarted and reloaded the record: re-issue the current
    /// state's commands (or abort where resuming is impossible).
    Recovered { now: u64 },
}

impl Event {
    /// The variant's name, for logs and rejections.
    pub fn name(&self) -> &'static str {
        match self {
            Event::Started { .. } => "Started",
            Event::SnapshotTaken { .. } => "SnapshotTaken",
            Event::CopyProgress { .. } => "CopyProgress",
            Event::CopyDone => "CopyDone",
            Event::CopyCost { .. } => "CopyCost",
            Event::CatchupLag { .. } => "CatchupLag",
            Event::DualEnabled { .. } => "DualEnabled",
            Event::SourceFenced { .. } => "SourceFenced",
            Event::Digests { .. } => "Digests",
            Event::FlipCommitted { .. } => "FlipCommitted",
            Event::FlipConflict { .. } => "FlipConflict",
            Event::FlipUnavailable => "FlipUnavailable",
            Event::TargetServing { .. } => "TargetServing",
            Event::GraceElapsed => "GraceElapsed",
            Event::SourceDropped => "SourceDropped",
            Event::TargetDropped => "TargetDropped",
            Event::Tick { .. } => "Tick",
            Event::AbortRequested { .. } => "AbortRequested",
            Event::ActorFailed { .. } => "ActorFailed",
            Event::Recovered { .. } => "Recovered",
        }
    }
}
