//! The machine: [`Migration`] takes one [`Event`], updates its record and
//! returns the [`Command`]s the drivers must carry out. It does no I/O and
//! reads no clock; time arrives in events.
//!
//! This file holds what is common to every phase: configuration, dispatch,
//! timeouts (`Tick`), recovery (`Recovered`), the persist helpers, and the
//! step checks that assert the protocol's invariants on every batch
//! ([`check_step`]). Each phase's handlers live in their own file.

use crate::command::Command;
use crate::event::Event;
use crate::record::{AbortReason, MigrationId, MigrationRecord, MigrationState, RecordError};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Tunables of one migration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigrationConfig {
    /// `CATCHUP → DUAL` once the target is within this many change-log
    /// records of the source.
    pub catchup_lag_threshold: u64,
    /// A pre-flip state (`PENDING` to `DUAL`) that makes no progress for this
    /// long aborts. Progress is bounded per state (copied bytes up to the
    /// snapshot size, a new minimum catch-up lag, dual-writing confirmed), so
    /// every pre-flip state ends in finite time.
    pub stuck_timeout_ms: u64,
    /// The longest the source may stay fenced in `CUTOVER` before the flip
    /// is requested; past it the migration aborts and unfences the source.
    /// Bounds the write pause; must not exceed `stuck_timeout_ms`.
    pub fence_timeout_ms: u64,
    /// How long the source keeps the range after the flip before dropping it.
    pub cleanup_grace_ms: u64,
    /// After the flip is requested nothing aborts: outstanding commands
    /// (`CommitFlip` in doubt, `AwaitTargetServing`, `DropSourceRange`) are
    /// re-issued at this interval until their outcome arrives.
    pub retry_interval_ms: u64,
    /// Attempts at dropping a copy the migration leaves behind (the old
    /// source's range in `CLEANUP`, the target's partial copy after an
    /// abort) while its node fails, with backoff (`retry_interval_ms`
    /// doubling per failure), before the record ends anyway and keeps the
    /// copy as `stray`, dropped when the node is back. 1..=16.
    pub cleanup_attempts: u32,
}

impl Default for MigrationConfig {
    fn default() -> Self {
        MigrationConfig {
            catchup_lag_threshold: 1_000,
            stuck_timeout_ms: 60_000,
            fence_timeout_ms: 5_000,
            cleanup_grace_ms: 30_000,
            retry_interval_ms: 1_000,
            cleanup_attempts: 5,
        }
    }
}

/// The largest [`MigrationConfig::cleanup_attempts`] (the last backoff is
/// `retry_interval_ms` × 2^15).
pub const MAX_CLEANUP_ATTEMPTS: u32 = 16;

/// A configuration [`MigrationConfig::validate`] refuses.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
#[error("invalid migration config: {0}")]
pub struct ConfigError(pub &'static str);

impl MigrationConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.stuck_timeout_ms == 0 {
            return Err(ConfigError("stuck_timeout_ms must be positive"));
        }
        if self.fence_timeout_ms == 0 {
            return Err(ConfigError("fence_timeout_ms must be positive"));
        }
        if self.fence_timeout_ms > self.stuck_timeout_ms {
            return Err(ConfigError(
                "fence_timeout_ms must not exceed stuck_timeout_ms",
            ));
        }
        if self.retry_interval_ms == 0 {
            return Err(ConfigError("retry_interval_ms must be positive"));
        }
        if !(1..=MAX_CLEANUP_ATTEMPTS).contains(&self.cleanup_attempts) {
            return Err(ConfigError("cleanup_attempts must be between 1 and 16"));
        }
        Ok(())
    }
}

/// Why [`Migration::new`] refused its inputs.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum MigrationError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Record(#[from] RecordError),
}

/// Why an event was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RejectReason {
    /// The event does not belong to the current state (or sub-step).
    WrongState,
    /// A late or duplicate report of something already taken into account.
    Stale,
    /// The migration is `DONE` or `ABORTED`.
    Terminal,
    /// Abort asked while the flip CAS is in doubt: only its outcome decides.
    FlipInDoubt,
    /// Abort asked after the flip: the only way is forward.
    AfterFlip,
    /// The event contradicts the record (e.g. a seq before the snapshot).
    Inconsistent(&'static str),
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RejectReason::WrongState => f.write_str("not expected in this state"),
            RejectReason::Stale => f.write_str("stale or duplicate"),
            RejectReason::Terminal => f.write_str("the migration is over"),
            RejectReason::FlipInDoubt => f.write_str("the flip is in doubt"),
            RejectReason::AfterFlip => f.write_str("the flip already happened"),
            RejectReason::Inconsistent(what) => write!(f, "inconsistent: {what}"),
        }
    }
}

/// An event the machine refused. Nothing changed; worth a log line, harmless.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
#[error("migration {id}: {event} rejected in {state}: {why}")]
pub struct Rejected {
    pub id: MigrationId,
    pub state: MigrationState,
    pub event: &'static str,
    pub why: RejectReason,
}

pub(crate) type Outcome = Result<Vec<Command>, Rejected>;

/// One migration's state machine.
///
/// Recovery rule per state (`Recovered`: the driver restarted and reloaded
/// the record; in-memory facts such as a confirmed fence are forgotten):
///
/// | state | on `Recovered` |
/// |---|---|
/// | `PENDING` | nothing to re-issue; waits for `Started` (or times out) |
/// | `COPYING` | `TakeSnapshot` if S is unknown, else `StartCopy{S}`; a source that lost snapshot S reports `ActorFailed` → abort |
/// | `CATCHUP` | `StartCatchup{S}` (the target skips what it applied) |
/// | `DUAL` | `StartCatchup{S}`, `EnableDual`, and waits for a fresh `DualEnabled` |
/// | `CUTOVER`, flip not requested | **abort** (unfence, drop the copy): the fence confirmation and digests were volatile and the write pause must not outlive the driver; reverting is always safe here |
/// | `CUTOVER`, flip in doubt | `CommitFlip` again (identical CAS: it applies, or conflicts showing whether ours applied) |
/// | `CUTOVER`, flipped | `AwaitTargetServing{e+1}` |
/// | `CLEANUP` | `StartGrace{remaining}`, or `DropSourceRange` if the grace has passed |
/// | `DONE` | `Finish`; with a stray copy on the old source: `DropSourceRange` first |
/// | `ABORTED` | with the target's copy still stray: the revert commands again (`DisableDual`/`UnfenceSource` as the abort state requires, `DropTargetCopy`); else `Finish` |
#[derive(Clone, Debug)]
pub struct Migration {
    pub(crate) rec: MigrationRecord,
    pub(crate) cfg: MigrationConfig,
    pub(crate) vol: Volatile,
}

/// What the machine knows only in memory: lost on `Recovered`.
#[derive(Clone, Debug, Default)]
pub(crate) struct Volatile {
    /// The latest time seen in any event (never goes back).
    pub(crate) clock_ms: u64,
    /// Last progress in a pre-flip state (the stuck timeout runs from here).
    pub(crate) progress_at_ms: u64,
    /// Smallest catch-up lag seen in this state.
    pub(crate) min_lag: Option<u64>,
    /// `DUAL`: the source confirmed dual-writing from this seq.
    pub(crate) dual_at_seq: Option<u64>,
    /// `CUTOVER`: the source confirmed the fence at this time.
    pub(crate) fence_started_ms: Option<u64>,
    /// When outstanding post-flip commands are next re-issued.
    pub(crate) retry_at_ms: u64,
    /// `CLEANUP` (or `DONE` with a stray copy): `DropSourceRange` was issued.
    pub(crate) drop_issued: bool,
    /// Failed attempts at dropping a copy left behind (see `stray.rs`).
    pub(crate) cleanup_failures: u32,
}

impl Migration {
    /// A machine for `record`: a new `PENDING` record (then feed `Started`)
    /// or one reloaded after a restart (then feed `Recovered`).
    pub fn new(record: MigrationRecord, config: MigrationConfig) -> Result<Self, MigrationError> {
        config.validate()?;
        record.validate()?;
        let clock = [
            Some(record.state_entered_at_ms),
            record.fence_started_ms,
            record.flip_requested_ms,
            record.flip_done_ms,
        ]
        .into_iter()
        .flatten()
        .max()
        .unwrap_or(0);
        Ok(Migration {
            rec: record,
            cfg: config,
            vol: Volatile {
                clock_ms: clock,
                progress_at_ms: clock,
                retry_at_ms: clock,
                ..Volatile::default()
            },
        })
    }

    /// The record as the machine holds it: the last persisted one plus
    /// progress fields.
    pub fn record(&self) -> &MigrationRecord {
        &self.rec
    }

    pub fn state(&self) -> MigrationState {
        self.rec.state
    }

    pub fn config(&self) -> &MigrationConfig {
        &self.cfg
    }

    /// Feeds one event. `Ok` carries the commands to execute in order
    /// (possibly none); `Err` means the event was refused and nothing
    /// changed.
    pub fn handle(&mut self, event: Event) -> Result<Vec<Command>, Rejected> {
        let before = self.rec.clone();
        let outcome = self.dispatch(event);
        match &outcome {
            Ok(commands) => check_step(&before, &self.rec, commands),
            Err(_) => assert_eq!(before, self.rec, "a rejected event changed the record"),
        }
        outcome
    }

    fn dispatch(&mut self, event: Event) -> Outcome {
        let name = event.name();
        match event {
            Event::Tick { now } => Ok(self.on_tick(now)),
            Event::Recovered { now } => Ok(self.on_recovered(now)),
            _ if self.rec.state.is_terminal() => self.on_terminal_event(event),
            Event::AbortRequested { reason } => self.on_abort_requested(reason),
            Event::ActorFailed { who, detail } => Ok(self.on_actor_failed(who, detail)),
            Event::Started { now } => self.on_started(now),
            Event::SnapshotTaken { seq, total_bytes } => self.on_snapshot_taken(seq, total_bytes),
            Event::CopyProgress { bytes } => self.on_copy_progress(bytes),
            Event::CopyDone => self.on_copy_done(),
            Event::CopyCost {
                bytes_sent,
                bytes_written,
                copy_duration_ms,
            } => self.on_copy_cost(bytes_sent, bytes_written, copy_duration_ms),
            Event::CatchupLag {
                applied_seq,
                source_seq,
            } => self.on_catchup_lag(applied_seq, source_seq),
            Event::DualEnabled { at_seq } => self.on_dual_enabled(at_seq),
            Event::SourceFenced { now } => self.on_source_fenced(now),
            Event::Digests { source, target } => self.on_digests(source, target),
            Event::FlipCommitted { now } => self.on_flip_committed(now),
            Event::FlipConflict { evidence } => self.on_flip_conflict(evidence),
            Event::FlipUnavailable => self.on_flip_unavailable(),
            Event::TargetServing { now, steps } => self.on_target_serving(now, steps),
            Event::GraceElapsed => self.on_grace_elapsed(),
            Event::SourceDropped => self.on_source_dropped(),
            Event::TargetDropped => Err(self.reject(name, RejectReason::WrongState)),
        }
    }

    fn on_tick(&mut self, now: u64) -> Vec<Command> {
        self.advance(now);
        match self.rec.state {
            MigrationState::Pending
            | MigrationState::Copying
            | MigrationState::Catchup
            | MigrationState::Dual => {
                let waited = self.vol.clock_ms.saturating_sub(self.vol.progress_at_ms);
                if waited < self.cfg.stuck_timeout_ms {
                    return Vec::new();
                }
                let state = self.rec.state;
                self.abort(AbortReason::StuckTimeout {
                    state,
                    waited_ms: waited,
                })
            }
            MigrationState::Cutover => self.cutover_tick(),
            MigrationState::Cleanup => self.cleanup_tick(),
            MigrationState::Done | MigrationState::Aborted => self.stray_tick(),
        }
    }

    pub(crate) fn on_recovered(&mut self, now: u64) -> Vec<Command> {
        self.advance(now);
        let clock = self.vol.clock_ms;
        self.vol = Volatile {
            clock_ms: clock,
            progress_at_ms: clock,
            retry_at_ms: clock + self.cfg.retry_interval_ms,
            ..Volatile::default()
        };
        match self.rec.state {
            MigrationState::Pending => Vec::new(),
            MigrationState::Copying => self.resume_copying(),
            MigrationState::Catchup => self.resume_catchup(),
            MigrationState::Dual => self.resume_dual(),
            MigrationState::Cutover => self.resume_cutover(),
            MigrationState::Cleanup => self.resume_cleanup(),
            MigrationState::Done | MigrationState::Aborted => self.resume_terminal(),
        }
    }

    /// Moves the clock forward (never back).
    pub(crate) fn advance(&mut self, now: u64) {
        self.vol.clock_ms = self.vol.clock_ms.max(now);
    }

    /// Marks progress in a pre-flip state (restarts the stuck timeout).
    pub(crate) fn progressed(&mut self) {
        self.vol.progress_at_ms = self.vol.clock_ms;
    }

    /// Whether outstanding commands are due to be re-issued; if so, schedules
    /// the next retry.
    pub(crate) fn retry_due(&mut self) -> bool {
        if self.vol.clock_ms < self.vol.retry_at_ms {
            return false;
        }
        self.vol.retry_at_ms = self.vol.clock_ms + self.cfg.retry_interval_ms;
        true
    }

    pub(crate) fn reject(&self, event: &'static str, why: RejectReason) -> Rejected {
        Rejected {
            id: self.rec.id,
            state: self.rec.state,
            event,
            why,
        }
    }

    /// A durable change without a state change: bumps the generation and
    /// returns the `Persist` that must lead the batch.
    pub(crate) fn persist(&mut self, change: impl FnOnce(&mut MigrationRecord)) -> Command {
        change(&mut self.rec);
        self.rec.generation += 1;
        if let Err(e) = self.rec.validate() {
            panic!("the machine produced an invalid record: {e}");
        }
        Command::Persist(self.rec.clone())
    }

    /// A state change: like [`Migration::persist`], and the new state starts
    /// with fresh timers.
    pub(crate) fn transition(
        &mut self,
        to: MigrationState,
        change: impl FnOnce(&mut MigrationRecord),
    ) -> Command {
        let from = self.rec.state;
        assert!(
            legal_transition(from, to),
            "illegal transition {from} → {to}"
        );
        let now = self.vol.clock_ms;
        self.vol.progress_at_ms = now;
        self.vol.min_lag = None;
        self.vol.retry_at_ms = now + self.cfg.retry_interval_ms;
        self.persist(|r| {
            r.state = to;
            r.state_entered_at_ms = now;
            change(r);
        })
    }
}

/// The state machine's edges.
pub(crate) fn legal_transition(from: MigrationState, to: MigrationState) -> bool {
    use MigrationState::*;
    matches!(
        (from, to),
        (Pending, Copying)
            | (Copying, Catchup)
            | (Catchup, Dual)
            | (Dual, Cutover)
            | (Cutover, Cleanup)
            | (Cleanup, Done)
            | (Pending | Copying | Catchup | Dual | Cutover, Aborted)
    )
}

/// The record without its progress fields: what may change only with a
/// `Persist`. `flip_done_ms` is an observation, not a decision: the CAS
/// it records applied in the store whether or not the record says so, and
/// a reloaded record that does not re-learns it from the store (the flip
/// in doubt re-sends the identical CAS, whose conflict the map's evidence
/// decides as applied); it is persisted with the `CLEANUP` transition,
/// outside the write pause (`cutover.rs`).
fn decisions(r: &MigrationRecord) -> MigrationRecord {
    MigrationRecord {
        flip_done_ms: None,
        copied_bytes: 0,
        catchup_applied_seq: 0,
        bytes_sent: 0,
        bytes_written: 0,
        copy_duration_ms: 0,
        ..r.clone()
    }
}

/// The invariants every accepted step must keep, asserted on the batch the
/// step produced (the other half of each pair is asserted where the decision
/// is made, in the phase files).
pub(crate) fn check_step(before: &MigrationRecord, after: &MigrationRecord, cmds: &[Command]) {
    use MigrationState::*;
    // Invariant 4 (durable, resumable): every decision is persisted first,
    // one generation at a time.
    let persists = cmds
        .iter()
        .filter(|c| matches!(c, Command::Persist(_)))
        .count();
    assert!(persists <= 1, "more than one Persist in a batch: {cmds:?}");
    if persists == 1 {
        assert!(
            matches!(&cmds[0], Command::Persist(r) if r == after),
            "the Persist must lead its batch and carry the new record: {cmds:?}"
        );
        assert_eq!(after.generation, before.generation + 1, "generation +1");
        assert!(before.state == after.state || legal_transition(before.state, after.state));
    } else {
        assert_eq!(
            after.generation, before.generation,
            "generation without Persist"
        );
        assert_eq!(after.state, before.state, "state change without Persist");
        assert_eq!(
            decisions(before),
            decisions(after),
            "decision without Persist"
        );
    }
    // The flip is requested once and never forgotten; a done flip stays done.
    assert!(!before.flip_requested() || after.flip_requested() || after.state == Aborted);
    assert!(!before.flipped() || after.flipped(), "a flip was undone");
    if !before.flip_requested() && after.flip_requested() {
        assert!(
            matches!(cmds, [Command::Persist(_), Command::CommitFlip { .. }]),
            "the flip request is persisted, then sent: {cmds:?}"
        );
    }
    for cmd in cmds {
        match cmd {
            // Invariants 1, 2, 5, 6: only from CUTOVER, fenced, dual-writing,
            // requested durably; (source, e) → (target, e + 1).
            Command::CommitFlip {
                condition,
                new_record,
            } => {
                assert_eq!(after.state, Cutover, "CommitFlip outside CUTOVER");
                assert!(
                    after.flip_in_doubt(),
                    "CommitFlip not persisted as requested"
                );
                assert!(
                    after.fence_started_ms.is_some(),
                    "CommitFlip without SourceFenced"
                );
                assert!(
                    after.dual_at_seq.is_some(),
                    "CommitFlip without DualEnabled"
                );
                assert_eq!(*condition, after.flip_condition());
                assert_eq!(*new_record, after.flipped_partition());
                assert_eq!(condition.expected, Some((before.source(), before.epoch())));
                assert_eq!(new_record.owner, after.target);
                assert_eq!(new_record.epoch.0, after.epoch().0 + 1);
            }
            // Invariant 3: reverting only ever happens before the flip.
            Command::UnfenceSource | Command::DisableDual | Command::DropTargetCopy => {
                assert_eq!(after.state, Aborted, "{} outside an abort", cmd.name());
                assert!(!after.flipped(), "{} after the flip", cmd.name());
                assert_eq!(after.stray, Some(after.target), "revert with no stray copy");
            }
            Command::FenceSource => assert!(after.state == Cutover && !after.flip_requested()),
            Command::EnableDual => assert_eq!(after.state, Dual),
            Command::TakeSnapshot | Command::StartCopy { .. } => assert_eq!(after.state, Copying),
            Command::StartCatchup { .. } => assert!(matches!(after.state, Catchup | Dual)),
            Command::ComputeDigests => assert!(after.state == Cutover && !after.flip_requested()),
            Command::AwaitTargetServing { epoch } => {
                assert!(after.state == Cutover && after.flipped());
                assert_eq!(*epoch, after.flipped_epoch());
            }
            Command::RecordPause { .. } | Command::StartGrace { .. } => {
                assert!(after.state == Cleanup && after.flipped());
            }
            Command::DropSourceRange { moved_to, epoch } => {
                assert!(matches!(after.state, Cleanup | Done) && after.flipped());
                if after.state == Done {
                    assert_eq!(after.stray, Some(after.source()), "drop with no stray copy");
                }
                assert_eq!((*moved_to, *epoch), (after.target, after.flipped_epoch()));
            }
            Command::Finish => assert!(after.state.is_terminal()),
            Command::Persist(_) => {}
        }
    }
    // A stray copy is recorded only on entering DONE (the old source) or
    // ABORTED (the target), and afterwards only cleared.
    if after.stray.is_some() && after.stray != before.stray {
        assert!(after.state.is_terminal() && before.state != after.state);
    }
    // Invariant 3: an abort happens before the flip and reverts everything.
    if after.state == Aborted && before.state != Aborted {
        assert!(!before.flipped(), "abort after the flip");
        assert!(
            cmds.contains(&Command::DropTargetCopy),
            "abort without DropTargetCopy"
        );
        if before.state == Cutover {
            assert!(
                cmds.contains(&Command::UnfenceSource),
                "abort without UnfenceSource"
            );
        }
    }
}

#[cfg(test)]
pub(crate) mod fixture {
    //! A standard migration and its happy path, for the phase tests.
    use super::*;
    use crate::event::RangeDigest;
    use crate::record::tests::record;

    pub(crate) fn config() -> MigrationConfig {
        MigrationConfig {
            catchup_lag_threshold: 10,
            stuck_timeout_ms: 10_000,
            fence_timeout_ms: 1_000,
            cleanup_grace_ms: 5_000,
            retry_interval_ms: 500,
            cleanup_attempts: 3,
        }
    }

    pub(crate) fn fresh() -> Migration {
        Migration::new(record(), config()).unwrap()
    }

    pub(crate) const DIGEST: RangeDigest = RangeDigest {
        keys: 3,
        bytes: 90,
        digest: 0xfeed,
    };

    /// The happy path, one event per step, each tagged with the state it
    /// leads to.
    pub(crate) fn happy_path() -> Vec<(Event, MigrationState)> {
        use MigrationState::*;
        vec![
            (Event::Started { now: 1_000 }, Copying),
            (
                Event::SnapshotTaken {
                    seq: 100,
                    total_bytes: 4_096,
                },
                Copying,
            ),
            (Event::CopyProgress { bytes: 2_048 }, Copying),
            (Event::CopyDone, Catchup),
            (
                Event::CatchupLag {
                    applied_seq: 150,
                    source_seq: 200,
                },
                Catchup,
            ),
            (
                Event::CatchupLag {
                    applied_seq: 195,
                    source_seq: 200,
                },
                Dual,
            ),
            (Event::DualEnabled { at_seq: 205 }, Dual),
            (
                Event::CatchupLag {
                    applied_seq: 205,
                    source_seq: 206,
                },
                Cutover,
            ),
            (Event::SourceFenced { now: 1_005 }, Cutover),
            (
                Event::Digests {
                    source: DIGEST,
                    target: DIGEST,
                },
                Cutover,
            ),
            (Event::FlipCommitted { now: 1_015 }, Cutover),
            (
                Event::TargetServing {
                    now: 1_035,
                    steps: Default::default(),
                },
                Cleanup,
            ),
            (Event::GraceElapsed, Cleanup),
            (Event::SourceDropped, Done),
        ]
    }

    /// A machine that went through the first `steps` happy-path events.
    pub(crate) fn after(steps: usize) -> Migration {
        let mut m = fresh();
        for (event, state) in happy_path().into_iter().take(steps) {
            m.handle(event.clone())
                .unwrap_or_else(|e| panic!("{event:?}: {e}"));
            assert_eq!(m.state(), state, "after {event:?}");
        }
        m
    }

    /// The record `m` would persist next (for exact command comparisons).
    pub(crate) fn persisted(m: &Migration) -> Command {
        Command::Persist(m.record().clone())
    }
}

#[cfg(test)]
mod tests {
    use super::fixture::*;
    use super::*;
    use crate::record::tests::record;

    #[test]
    fn config_validation_names_each_rule() {
        MigrationConfig::default().validate().unwrap();
        config().validate().unwrap();
        let bad = |f: fn(&mut MigrationConfig)| {
            let mut c = config();
            f(&mut c);
            c.validate().unwrap_err()
        };
        assert_eq!(
            bad(|c| c.stuck_timeout_ms = 0).0,
            "stuck_timeout_ms must be positive"
        );
        assert_eq!(
            bad(|c| c.fence_timeout_ms = 0).0,
            "fence_timeout_ms must be positive"
        );
        assert_eq!(
            bad(|c| c.fence_timeout_ms = c.stuck_timeout_ms + 1).0,
            "fence_timeout_ms must not exceed stuck_timeout_ms"
        );
        assert_eq!(
            bad(|c| c.retry_interval_ms = 0).0,
            "retry_interval_ms must be positive"
        );
        for attempts in [0, 17] {
            let mut c = config();
            c.cleanup_attempts = attempts;
            assert_eq!(
                c.validate().unwrap_err().0,
                "cleanup_attempts must be between 1 and 16"
            );
        }
    }

    #[test]
    fn new_refuses_a_bad_config_or_record() {
        let mut c = config();
        c.retry_interval_ms = 0;
        assert!(matches!(
            Migration::new(record(), c),
            Err(MigrationError::Config(_))
        ));
        let mut r = record();
        r.target = r.source();
        assert!(matches!(
            Migration::new(r, config()),
            Err(MigrationError::Record(_))
        ));
    }

    #[test]
    fn the_happy_path_bumps_the_generation_once_per_persist() {
        let mut m = fresh();
        let mut generation = 0;
        for (event, _) in happy_path() {
            let cmds = m.handle(event).unwrap();
            let persists = cmds
                .iter()
                .filter(|c| matches!(c, Command::Persist(_)))
                .count();
            generation += persists as u64;
            assert_eq!(m.record().generation, generation);
        }
        assert_eq!(generation, 8, "8 durable decisions on the happy path");
        assert_eq!(m.state(), MigrationState::Done);
    }

    #[test]
    fn terminal_states_reject_everything_but_tick_and_recovered() {
        let mut m = after(happy_path().len());
        let before = m.record().clone();
        for event in [
            Event::CopyDone,
            Event::AbortRequested {
                reason: "late".into(),
            },
            Event::SourceDropped,
            Event::ActorFailed {
                who: crate::Actor::Target,
                detail: "x".into(),
            },
        ] {
            let err = m.handle(event).unwrap_err();
            assert_eq!(err.why, RejectReason::Terminal);
        }
        assert_eq!(m.handle(Event::Tick { now: 99_999 }).unwrap(), vec![]);
        assert_eq!(
            m.handle(Event::Recovered { now: 99_999 }).unwrap(),
            vec![Command::Finish]
        );
        assert_eq!(*m.record(), before);
    }

    #[test]
    fn rejections_print_what_happened() {
        let mut m = fresh();
        let err = m.handle(Event::CopyDone).unwrap_err();
        assert_eq!(
            err.to_string(),
            "migration 9: CopyDone rejected in PENDING: not expected in this state"
        );
    }

    #[test]
    fn the_clock_never_goes_back() {
        let mut m = after(1);
        m.handle(Event::Tick { now: 5_000 }).unwrap();
        m.handle(Event::Tick { now: 10 }).unwrap();
        assert_eq!(m.vol.clock_ms, 5_000);
    }

    #[test]
    fn legal_transitions_are_the_protocol_order_and_abort_before_the_flip() {
        use MigrationState::*;
        let legal: Vec<_> = MigrationState::ALL
            .iter()
            .flat_map(|a| MigrationState::ALL.iter().map(move |b| (*a, *b)))
            .filter(|(a, b)| legal_transition(*a, *b))
            .collect();
        assert_eq!(legal.len(), 11);
        for s in [Cleanup, Done, Aborted] {
            assert!(!legal_transition(s, Aborted), "{s} → ABORTED");
        }
    }
}
