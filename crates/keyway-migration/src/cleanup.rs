//! `CLEANUP → DONE`: after a grace period the source drops the range.
//!
//! Entering `CLEANUP` records the measured write pause and starts the grace
//! timer. When it fires (`GraceElapsed`, or a `Tick` past the deadline if
//! the timer was lost), the source drops the range and keeps the note
//! "moved to target at epoch e+1", so it keeps answering with a redirect
//! (invariant 3). `SourceDropped` ends the migration. Nothing here aborts:
//! the target owns the partition; outstanding commands are re-issued every
//! `retry_interval_ms`.
//!
//! Recovery: `StartGrace{remaining}` (the grace runs from entering
//! `CLEANUP`, a durable time), or `DropSourceRange` if it has passed.

use crate::command::Command;
use crate::event::CutoverSteps;
use crate::machine::{Migration, Outcome, RejectReason};
use crate::record::MigrationState;

impl Migration {
    pub(crate) fn enter_cleanup(&mut self, pause_ms: u64, steps: CutoverSteps) -> Vec<Command> {
        self.vol.drop_issued = false;
        self.vol.cleanup_failures = 0;
        let persist = self.transition(MigrationState::Cleanup, |r| {
            r.pause_ms = Some(pause_ms);
            r.cutover_steps = Some(steps);
        });
        vec![
            persist,
            Command::RecordPause { ms: pause_ms },
            Command::StartGrace {
                ms: self.cfg.cleanup_grace_ms,
            },
        ]
    }

    fn grace_deadline(&self) -> u64 {
        self.rec.state_entered_at_ms + self.cfg.cleanup_grace_ms
    }

    fn drop_source_range(&mut self) -> Vec<Command> {
        self.vol.drop_issued = true;
        self.vol.retry_at_ms = self.vol.clock_ms + self.cfg.retry_interval_ms;
        vec![Command::DropSourceRange {
            moved_to: self.rec.target,
            epoch: self.rec.flipped_epoch(),
        }]
    }

    pub(crate) fn on_grace_elapsed(&mut self) -> Outcome {
        if self.rec.state != MigrationState::Cleanup {
            return Err(self.reject("GraceElapsed", RejectReason::WrongState));
        }
        if self.vol.drop_issued {
            return Err(self.reject("GraceElapsed", RejectReason::Stale));
        }
        Ok(self.drop_source_range())
    }

    pub(crate) fn on_source_dropped(&mut self) -> Outcome {
        if self.rec.state != MigrationState::Cleanup || !self.vol.drop_issued {
            return Err(self.reject("SourceDropped", RejectReason::WrongState));
        }
        assert!(
            self.rec.flipped(),
            "the source range is dropped only after the flip"
        );
        let persist = self.transition(MigrationState::Done, |_| {});
        Ok(vec![persist, Command::Finish])
    }

    pub(crate) fn cleanup_tick(&mut self) -> Vec<Command> {
        if !self.vol.drop_issued {
            if self.vol.clock_ms >= self.grace_deadline() {
                return self.drop_source_range();
            }
            return Vec::new();
        }
        if self.retry_due() {
            return self.drop_source_range();
        }
        Vec::new()
    }

    pub(crate) fn resume_cleanup(&mut self) -> Vec<Command> {
        let deadline = self.grace_deadline();
        if self.vol.clock_ms >= deadline {
            return self.drop_source_range();
        }
        vec![Command::StartGrace {
            ms: deadline - self.vol.clock_ms,
        }]
    }
}

#[cfg(test)]
mod tests {
    use crate::Event;
    use crate::command::Command;
    use crate::event::Actor;
    use crate::machine::RejectReason;
    use crate::machine::fixture::*;
    use crate::record::MigrationState;
    use keyway_map::{Epoch, NodeId};

    const DROP: Command = Command::DropSourceRange {
        moved_to: NodeId(2),
        epoch: Epoch(5),
    };

    #[test]
    fn grace_elapsed_drops_the_source_range_with_a_moved_note() {
        let mut m = after(12);
        assert_eq!(m.handle(Event::GraceElapsed).unwrap(), vec![DROP]);
        assert_eq!(
            m.handle(Event::GraceElapsed).unwrap_err().why,
            RejectReason::Stale
        );
        assert_eq!(
            m.record().generation,
            7,
            "dropping is not a decision to persist"
        );
    }

    #[test]
    fn source_dropped_finishes() {
        let mut m = after(13);
        let cmds = m.handle(Event::SourceDropped).unwrap();
        assert_eq!(cmds, vec![persisted(&m), Command::Finish]);
        assert_eq!(m.state(), MigrationState::Done);
    }

    #[test]
    fn source_dropped_before_the_drop_was_asked_is_rejected() {
        let mut m = after(12);
        assert_eq!(
            m.handle(Event::SourceDropped).unwrap_err().why,
            RejectReason::WrongState
        );
        let mut m = after(9);
        assert_eq!(
            m.handle(Event::GraceElapsed).unwrap_err().why,
            RejectReason::WrongState
        );
    }

    #[test]
    fn a_lost_timer_is_covered_by_ticks_and_the_drop_is_retried() {
        let mut m = after(12); // CLEANUP entered at 1_035, grace 5_000
        assert_eq!(m.handle(Event::Tick { now: 6_034 }).unwrap(), vec![]);
        assert_eq!(m.handle(Event::Tick { now: 6_035 }).unwrap(), vec![DROP]);
        assert_eq!(m.handle(Event::Tick { now: 6_534 }).unwrap(), vec![]);
        assert_eq!(m.handle(Event::Tick { now: 6_535 }).unwrap(), vec![DROP]);
        // Nothing after the flip aborts, however long it takes (a failure
        // of the target is not the drop's).
        let failed = Event::ActorFailed {
            who: Actor::Target,
            detail: "down".into(),
        };
        assert_eq!(m.handle(failed).unwrap(), vec![]);
        let abort = m.handle(Event::AbortRequested {
            reason: "no".into(),
        });
        assert_eq!(abort.unwrap_err().why, RejectReason::AfterFlip);
        assert_eq!(
            m.handle(Event::Tick { now: 10_000_000 }).unwrap(),
            vec![DROP]
        );
        assert_eq!(m.state(), MigrationState::Cleanup);
    }

    #[test]
    fn recovery_restarts_the_remaining_grace_or_drops() {
        let mut m = after(13);
        let cmds = m.handle(Event::Recovered { now: 2_035 }).unwrap();
        assert_eq!(cmds, vec![Command::StartGrace { ms: 4_000 }]);
        // The re-issued drop was forgotten too: SourceDropped needs a new one.
        assert_eq!(
            m.handle(Event::SourceDropped).unwrap_err().why,
            RejectReason::WrongState
        );
        let cmds = m.handle(Event::Recovered { now: 7_000 }).unwrap();
        assert_eq!(cmds, vec![DROP]);
        assert_eq!(
            m.handle(Event::SourceDropped).unwrap(),
            vec![persisted(&m), Command::Finish]
        );
    }
}
