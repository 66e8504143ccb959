//! `→ ABORTED`: reverting to the source, possible only before the flip.
//!
//! Before the flip request the source is the map owner at e and never
//! stopped being a valid one, so reverting is always safe: persist
//! `ABORTED` (with the target as `stray`: it may hold a partial copy), then
//! undo what the abort state set up, in this order: `DisableDual` (from
//! `DUAL`/`CUTOVER`: the source stops forwarding, so no write waits on a
//! target about to drop its copy), `UnfenceSource` (from `CUTOVER`: the
//! source serves again), `DropTargetCopy` (always). `TargetDropped` then
//! persists the record without the stray copy and `Finish`es; a target that
//! cannot be reached ends the record anyway after the bounded attempts of
//! `stray.rs`, leaving the copy to be dropped when it is back. The range is
//! free from the `ABORTED` persist on: the source owns it and serves it.
//!
//! Once the flip is requested an abort is refused (`FlipInDoubt`), except
//! for the one proof that the CAS never applied: a `FlipConflict` whose
//! evidence shows the map's history replaced (source, e) with something
//! other than our flip (see `cutover.rs`). Once it is done, abort is
//! impossible (`AfterFlip`): the target owns the partition and the only way
//! is forward.
//!
//! Failures: before the flip request a failed source or target aborts (its
//! snapshot, streams or dual-writing state may be gone; reverting is
//! cheaper to reason about than repairing). After it, a failure changes
//! nothing: the outstanding command is re-issued at the next retry. A
//! failed `Manager` (the driver lost its in-memory state) is `Recovered`.
//!
//! Recovery: `ABORTED` with the stray copy re-issues the revert commands
//! (all idempotent); without it, `Finish`. A new leader drives every
//! `ABORTED` record that still has a stray copy, so a revert interrupted by
//! a manager crash is finished.

use crate::command::Command;
use crate::event::Actor;
use crate::machine::{Migration, Outcome, RejectReason};
use crate::record::{AbortReason, MigrationState};

impl Migration {
    /// Aborts now. The caller has checked that abort is allowed.
    pub(crate) fn abort(&mut self, reason: AbortReason) -> Vec<Command> {
        let from = self.rec.state;
        assert!(!from.is_terminal(), "abort from {from}");
        assert!(!self.rec.flipped(), "abort after the flip");
        assert!(
            !self.rec.flip_requested() || matches!(reason, AbortReason::FlipConflict { .. }),
            "abort with the flip in doubt"
        );
        let persist = self.transition(MigrationState::Aborted, |r| {
            r.aborted_from = Some(from);
            r.abort_reason = Some(reason);
            r.stray = Some(r.target);
        });
        self.vol.cleanup_failures = 0;
        self.vol.drop_issued = true;
        let mut cmds = vec![persist];
        cmds.extend(revert_commands(from));
        cmds
    }

    pub(crate) fn on_abort_requested(&mut self, reason: String) -> Outcome {
        if self.rec.flipped() || self.rec.state == MigrationState::Cleanup {
            return Err(self.reject("AbortRequested", RejectReason::AfterFlip));
        }
        if self.rec.flip_requested() {
            return Err(self.reject("AbortRequested", RejectReason::FlipInDoubt));
        }
        Ok(self.abort(AbortReason::Requested { reason }))
    }

    pub(crate) fn on_actor_failed(&mut self, who: Actor, detail: String) -> Vec<Command> {
        match who {
            Actor::Manager => {
                let now = self.vol.clock_ms;
                self.on_recovered(now)
            }
            Actor::Source | Actor::Target if self.rec.can_abort() => {
                self.abort(AbortReason::ActorFailed { who, detail })
            }
            Actor::Source if self.rec.state == MigrationState::Cleanup && self.vol.drop_issued => {
                self.on_cleanup_failed()
            }
            Actor::Source | Actor::Target => Vec::new(),
        }
    }
}

/// What reverting from `from` must undo, in order.
pub(crate) fn revert_commands(from: MigrationState) -> Vec<Command> {
    let mut cmds = Vec::new();
    if matches!(from, MigrationState::Dual | MigrationState::Cutover) {
        cmds.push(Command::DisableDual);
    }
    if from == MigrationState::Cutover {
        cmds.push(Command::UnfenceSource);
    }
    cmds.push(Command::DropTargetCopy);
    cmds
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Event;
    use crate::machine::fixture::*;

    /// Steps into the happy path at which each pre-flip state holds.
    const PRE_FLIP: [(usize, MigrationState); 6] = [
        (0, MigrationState::Pending),
        (2, MigrationState::Copying),
        (4, MigrationState::Catchup),
        (6, MigrationState::Dual),
        (8, MigrationState::Cutover),
        (9, MigrationState::Cutover), // fenced
    ];

    #[test]
    fn abort_before_the_flip_reverts_exactly_what_the_state_set_up() {
        for (steps, state) in PRE_FLIP {
            let mut m = after(steps);
            assert_eq!(m.state(), state);
            let generation = m.record().generation;
            let cmds = m
                .handle(Event::AbortRequested {
                    reason: "operator".into(),
                })
                .unwrap();
            let mut expected = vec![persisted(&m)];
            expected.extend(revert_commands(state));
            assert_eq!(cmds, expected, "from {state}");
            let r = m.record();
            assert_eq!(
                (r.state, r.aborted_from, r.generation),
                (MigrationState::Aborted, Some(state), generation + 1)
            );
            assert_eq!(
                r.abort_reason,
                Some(AbortReason::Requested {
                    reason: "operator".into()
                })
            );
        }
        assert_eq!(
            revert_commands(MigrationState::Pending),
            vec![Command::DropTargetCopy]
        );
        assert_eq!(
            revert_commands(MigrationState::Cutover),
            vec![
                Command::DisableDual,
                Command::UnfenceSource,
                Command::DropTargetCopy,
            ]
        );
    }

    #[test]
    fn abort_is_refused_once_the_flip_is_requested() {
        let mut m = after(10);
        let err = m
            .handle(Event::AbortRequested { reason: "x".into() })
            .unwrap_err();
        assert_eq!(err.why, RejectReason::FlipInDoubt);
        for steps in [11, 12, 13] {
            let mut m = after(steps);
            let err = m
                .handle(Event::AbortRequested { reason: "x".into() })
                .unwrap_err();
            assert_eq!(err.why, RejectReason::AfterFlip, "after {steps} steps");
        }
    }

    #[test]
    fn a_failed_source_or_target_aborts_before_the_flip_only() {
        for who in [Actor::Source, Actor::Target] {
            for (steps, state) in PRE_FLIP {
                let mut m = after(steps);
                let cmds = m
                    .handle(Event::ActorFailed {
                        who,
                        detail: "restarted".into(),
                    })
                    .unwrap();
                assert_eq!(cmds.last(), Some(&Command::DropTargetCopy));
                assert_eq!(m.record().aborted_from, Some(state));
                assert_eq!(
                    m.record().abort_reason,
                    Some(AbortReason::ActorFailed {
                        who,
                        detail: "restarted".into()
                    })
                );
            }
            for steps in [10, 11, 12, 13] {
                let mut m = after(steps);
                let before = m.record().clone();
                assert_eq!(
                    m.handle(Event::ActorFailed {
                        who,
                        detail: "x".into()
                    })
                    .unwrap(),
                    vec![]
                );
                assert_eq!(*m.record(), before);
            }
        }
    }

    #[test]
    fn a_failed_manager_is_a_recovery() {
        let mut m = after(4);
        let cmds = m
            .handle(Event::ActorFailed {
                who: Actor::Manager,
                detail: "timer".into(),
            })
            .unwrap();
        assert_eq!(cmds, vec![Command::StartCatchup { after_seq: 100 }]);
        let mut m = after(9);
        let cmds = m
            .handle(Event::ActorFailed {
                who: Actor::Manager,
                detail: "timer".into(),
            })
            .unwrap();
        assert_eq!(m.state(), MigrationState::Aborted);
        assert_eq!(cmds[1..], revert_commands(MigrationState::Cutover)[..]);
    }

    #[test]
    fn recovery_after_an_abort_repeats_the_revert() {
        for (steps, state) in PRE_FLIP {
            let mut m = after(steps);
            m.handle(Event::AbortRequested { reason: "x".into() })
                .unwrap();
            let generation = m.record().generation;
            let cmds = m.handle(Event::Recovered { now: 50_000 }).unwrap();
            assert_eq!(cmds, revert_commands(state));
            assert_eq!(m.record().generation, generation);
            // The copy is dropped: the record forgets it, then it is over.
            let cmds = m.handle(Event::TargetDropped).unwrap();
            assert_eq!(cmds, vec![persisted(&m), Command::Finish]);
            assert_eq!(m.record().stray, None);
            assert_eq!(
                m.handle(Event::Recovered { now: 50_001 }).unwrap(),
                vec![Command::Finish],
                "a finished revert is not repeated"
            );
        }
    }
}
