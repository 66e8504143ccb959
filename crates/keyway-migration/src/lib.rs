//! The live-migration protocol as pure logic: events in, commands out.
//!
//! A migration moves one partition from a source node to a target node
//! under live traffic (seed 003). This crate is its brain and nothing else:
//! no I/O, no clock, no threads. A driver (the manager, later) feeds it
//! [`Event`]s it observed and carries out the [`Command`]s it returns; the
//! nodes do the streaming, dual-writing and fencing; the metadata store
//! keeps the [`MigrationRecord`] and the partition map. Tests assert on the
//! returned commands (the openraft style).
//!
//! # The process
//!
//! ```text
//! PENDING ─Started→ COPYING ─CopyDone→ CATCHUP ─lag≤threshold→ DUAL ─dual confirmed
//!   and caught up→ CUTOVER ─TargetServing→ CLEANUP ─SourceDropped→ DONE
//!       any state before the flip request ─→ ABORTED (revert to the source)
//! ```
//!
//! 1. `COPYING`: the source snapshots the range at change-log seq S
//!    (persisted), the target copies it while the source keeps serving.
//! 2. `CATCHUP`: the target applies the source change log after S until the
//!    lag is below `catchup_lag_threshold`.
//! 3. `DUAL`: the source forwards every new write to the target before
//!    acknowledging it; once the target also applied everything before that,
//!    it holds every acknowledged write (invariant 5).
//! 4. `CUTOVER`: fence the source (the write pause starts), compare digests
//!    at the fence point, persist the flip request, then the flip: one CAS
//!    (source, e) → (target, e+1) (invariant 6); the target serves; the pause
//!    is measured.
//! 5. `CLEANUP`: after a grace period the source drops the range, keeping a
//!    "moved to target at epoch e+1" note (invariant 3).
//!
//! Abort is always safe before the flip request (the source never stopped
//! being the owner) and impossible after the flip (the target owns it).
//! While the CAS is in doubt (requested, outcome unknown) the machine
//! neither aborts nor proceeds: it re-sends the identical CAS until the
//! store answers. Every state is durable and resumable or aborts on
//! recovery (invariant 7); the rule per state is on [`Migration`].
//!
//! # Invariants asserted (in pairs: where decided, and on every batch)
//! - Every decision is a `Persist` leading its batch; `generation` grows by
//!   exactly one per `Persist`; a rejected event changes nothing.
//! - `CommitFlip` only in `CUTOVER`, after `SourceFenced`, after
//!   `DualEnabled` (persisted `dual_at_seq`), with equal digests, after the
//!   persisted flip request; its condition is (source, e) and its row
//!   (target, e+1); one flip decision per migration.
//! - `UnfenceSource`/`DisableDual`/`DropTargetCopy` only in an abort, never
//!   after the flip; an abort from `CUTOVER` always unfences; every abort
//!   drops the target's copy.
//!
//! # Layout
//! - `record.rs`: [`MigrationRecord`], [`MigrationState`], [`AbortReason`],
//!   the record invariant ([`MigrationRecord::validate`]).
//! - `codec.rs`: the record's compact binary encoding.
//! - `event.rs`: [`Event`], [`Actor`], [`RangeDigest`].
//! - `command.rs`: [`Command`] and the driver contract.
//! - `machine.rs`: [`Migration`], [`MigrationConfig`], dispatch, timeouts,
//!   recovery, and the per-batch invariant checks.
//! - `copy.rs`, `catchup.rs`, `dual.rs`, `cutover.rs`, `cleanup.rs`,
//!   `abort.rs`: one file per phase, each with its recovery rule.
//! - `stray.rs`: copies left behind (a dead target during an abort, a dead
//!   old source in `CLEANUP`): bounded attempts, then the record ends and
//!   keeps the copy as `stray`, dropped when the node is back.
//! - `tests/world.rs`: a model of source, target, metadata store and
//!   clients that applies the commands, with a proptest over random event
//!   orders, losses, duplicates, crashes and outages.

mod abort;
mod catchup;
mod cleanup;
mod codec;
mod command;
mod copy;
mod cutover;
mod dual;
mod event;
mod machine;
mod record;
mod stray;

pub use codec::{DecodeError, PRIMARY_MOVE_MAGIC, REPLICA_MOVE_MAGIC, is_replica_move_record};
pub use command::Command;
pub use event::{Actor, CutoverSteps, Event, FlipEvidence, RangeDigest};
pub use machine::{
    ConfigError, MAX_CLEANUP_ATTEMPTS, Migration, MigrationConfig, MigrationError, RejectReason,
    Rejected,
};
pub use record::{AbortReason, MigrationId, MigrationRecord, MigrationState, RecordError};
