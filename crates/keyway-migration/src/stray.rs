//! Copies a migration leaves behind, and how a dead node cannot pin a range.
//!
//! Two commands delete a copy on a node that may be down: `DropTargetCopy`
//! (after an abort: the target's partial copy) and `DropSourceRange` (in
//! `CLEANUP`: the old source's range). Neither copy is served by anyone (the
//! map names another owner), so neither must keep the migration alive:
//!
//! - a failure of the node is reported as `ActorFailed`; the command is
//!   re-issued after a backoff of `retry_interval_ms` × 2^(failures − 1);
//! - after `cleanup_attempts` failures the record ends anyway: `CLEANUP`
//!   persists `DONE` with `stray` = the old source; `ABORTED` was persisted
//!   with `stray` = the target and just `Finish`es. The range is free for
//!   later moves, splits and merges from then on;
//! - the driver drives a `DONE`/`ABORTED` record whose `stray` is set again
//!   when that node is back (`Recovered` re-issues the drop); the drop's
//!   outcome (`SourceDropped` / `TargetDropped`) persists the record without
//!   the stray copy and `Finish`es. A decommissioned node's copy is gone
//!   with it (reported the same way).
//!
//! In a terminal state with no stray copy every event but `Tick` and
//! `Recovered` is rejected (`Terminal`).

use crate::abort::revert_commands;
use crate::command::Command;
use crate::event::{Actor, Event};
use crate::machine::{Migration, Outcome, RejectReason};
use crate::record::MigrationState;

impl Migration {
    /// An event in `DONE`/`ABORTED`: only the stray copy's outcome counts.
    pub(crate) fn on_terminal_event(&mut self, event: Event) -> Outcome {
        let name = event.name();
        if self.rec.stray.is_none() {
            return Err(self.reject(name, RejectReason::Terminal));
        }
        match (self.rec.state, event) {
            (MigrationState::Aborted, Event::TargetDropped) => Ok(self.stray_dropped()),
            (MigrationState::Done, Event::SourceDropped) if self.vol.drop_issued => {
                Ok(self.stray_dropped())
            }
            (MigrationState::Aborted, Event::ActorFailed { who, .. }) => match who {
                Actor::Target => Ok(self.on_cleanup_failed()),
                // The source's revert steps (dual off, fence off) are also
                // done by the source itself once it reads the ABORTED
                // record; a source that cannot be reached does not block
                // dropping the target's copy.
                Actor::Source => Ok(Vec::new()),
                Actor::Manager => {
                    let now = self.vol.clock_ms;
                    Ok(self.on_recovered(now))
                }
            },
            (MigrationState::Done, Event::ActorFailed { who, .. }) => match who {
                Actor::Source if self.vol.drop_issued => Ok(self.on_cleanup_failed()),
                Actor::Manager => {
                    let now = self.vol.clock_ms;
                    Ok(self.on_recovered(now))
                }
                _ => Err(self.reject(name, RejectReason::Stale)),
            },
            _ => Err(self.reject(name, RejectReason::Terminal)),
        }
    }

    fn stray_dropped(&mut self) -> Vec<Command> {
        self.vol.drop_issued = false;
        self.vol.cleanup_failures = 0;
        let persist = self.persist(|r| r.stray = None);
        vec![persist, Command::Finish]
    }

    /// The commands that drop the stray copy of a terminal record.
    fn drop_stray(&mut self) -> Vec<Command> {
        self.vol.retry_at_ms = self.vol.clock_ms + self.cfg.retry_interval_ms;
        self.vol.drop_issued = true;
        match self.rec.state {
            MigrationState::Aborted => {
                vec![Command::DropTargetCopy]
            }
            MigrationState::Done => {
                vec![Command::DropSourceRange {
                    moved_to: self.rec.target,
                    epoch: self.rec.flipped_epoch(),
                }]
            }
            other => unreachable!("a stray copy in {other}"),
        }
    }

    /// A node failed to drop the copy (`CLEANUP` after `DropSourceRange`, or
    /// a terminal record with a stray copy): back off, or give up.
    pub(crate) fn on_cleanup_failed(&mut self) -> Vec<Command> {
        self.vol.cleanup_failures += 1;
        let failures = self.vol.cleanup_failures;
        if failures >= self.cfg.cleanup_attempts {
            self.vol.cleanup_failures = 0;
            self.vol.drop_issued = false;
            if self.rec.state == MigrationState::Cleanup {
                // The target owns the range; the old source's stale copy
                // stays until it is back (its map names the new owner, so it
                // does not serve it meanwhile).
                let source = self.rec.source();
                let persist = self.transition(MigrationState::Done, |r| r.stray = Some(source));
                return vec![persist, Command::Finish];
            }
            assert!(self.rec.state.is_terminal() && self.rec.stray.is_some());
            return vec![Command::Finish];
        }
        let backoff = self.cfg.retry_interval_ms << (failures - 1);
        self.vol.retry_at_ms = self.vol.clock_ms + backoff;
        Vec::new()
    }

    /// `Tick` in `DONE`/`ABORTED`: re-issue the stray copy's drop when due.
    pub(crate) fn stray_tick(&mut self) -> Vec<Command> {
        if self.rec.stray.is_none() || !self.vol.drop_issued || !self.retry_due() {
            return Vec::new();
        }
        self.drop_stray()
    }

    /// `Recovered` in `DONE`/`ABORTED`.
    pub(crate) fn resume_terminal(&mut self) -> Vec<Command> {
        self.vol.cleanup_failures = 0;
        match (self.rec.state, self.rec.stray) {
            (_, None) => vec![Command::Finish],
            (MigrationState::Aborted, Some(_)) => {
                self.vol.retry_at_ms = self.vol.clock_ms + self.cfg.retry_interval_ms;
                self.vol.drop_issued = true;
                revert_commands(self.rec.aborted_from.expect("ABORTED records its state"))
            }
            _ => self.drop_stray(),
        }
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

    fn down(who: Actor) -> Event {
        Event::ActorFailed {
            who,
            detail: "unreachable".into(),
        }
    }

    #[test]
    fn a_dead_old_source_in_cleanup_ends_done_with_a_stray_copy_after_backoff() {
        let mut m = after(13); // CLEANUP, drop issued at 1_035 + grace
        // config: retry 500 ms, 3 attempts: backoff 500, then 1_000, then give up.
        assert_eq!(m.handle(down(Actor::Source)).unwrap(), vec![]);
        assert_eq!(m.handle(Event::Tick { now: 1_534 }).unwrap(), vec![]);
        assert_eq!(m.handle(Event::Tick { now: 1_535 }).unwrap(), vec![DROP]);
        assert_eq!(m.handle(down(Actor::Source)).unwrap(), vec![]);
        assert_eq!(m.handle(Event::Tick { now: 2_534 }).unwrap(), vec![]);
        assert_eq!(m.handle(Event::Tick { now: 2_535 }).unwrap(), vec![DROP]);
        let cmds = m.handle(down(Actor::Source)).unwrap();
        assert_eq!(cmds, vec![persisted(&m), Command::Finish]);
        let r = m.record();
        assert_eq!((r.state, r.stray), (MigrationState::Done, Some(NodeId(1))));
        assert!(r.flipped() && r.pause_ms.is_some());
        // Over: nothing re-issued until the driver drives it again.
        assert_eq!(m.handle(Event::Tick { now: 99_999 }).unwrap(), vec![]);
    }

    #[test]
    fn the_stray_source_copy_is_dropped_when_the_node_is_back() {
        let mut m = after(13);
        for _ in 0..3 {
            m.handle(down(Actor::Source)).unwrap();
        }
        assert_eq!(m.record().stray, Some(NodeId(1)));
        // A later driver (the source is reachable again) drives it.
        assert_eq!(
            m.handle(Event::Recovered { now: 80_000 }).unwrap(),
            vec![DROP]
        );
        let cmds = m.handle(Event::SourceDropped).unwrap();
        assert_eq!(cmds, vec![persisted(&m), Command::Finish]);
        let r = m.record();
        assert_eq!((r.state, r.stray), (MigrationState::Done, None));
        // Still down: bounded again, ends without a decision.
        let mut m = after(13);
        for _ in 0..3 {
            m.handle(down(Actor::Source)).unwrap();
        }
        let generation = m.record().generation;
        m.handle(Event::Recovered { now: 80_000 }).unwrap();
        m.handle(down(Actor::Source)).unwrap();
        m.handle(Event::Tick { now: 80_500 }).unwrap();
        m.handle(down(Actor::Source)).unwrap();
        m.handle(Event::Tick { now: 81_500 }).unwrap();
        assert_eq!(
            m.handle(down(Actor::Source)).unwrap(),
            vec![Command::Finish]
        );
        assert_eq!(m.record().generation, generation, "no new decision");
        assert_eq!(m.record().stray, Some(NodeId(1)));
    }

    #[test]
    fn an_abort_with_a_dead_target_ends_and_keeps_the_stray_copy() {
        let mut m = after(4);
        let cmds = m
            .handle(Event::AbortRequested {
                reason: "operator".into(),
            })
            .unwrap();
        assert_eq!(cmds, vec![persisted(&m), Command::DropTargetCopy]);
        assert_eq!(m.record().stray, Some(NodeId(2)));
        // The source's revert steps failing does not count.
        assert_eq!(m.handle(down(Actor::Source)).unwrap(), vec![]);
        assert_eq!(m.handle(down(Actor::Target)).unwrap(), vec![]);
        let t0 = m.record().state_entered_at_ms;
        assert_eq!(m.handle(Event::Tick { now: t0 + 499 }).unwrap(), vec![]);
        assert_eq!(
            m.handle(Event::Tick { now: t0 + 500 }).unwrap(),
            vec![Command::DropTargetCopy]
        );
        m.handle(down(Actor::Target)).unwrap();
        m.handle(Event::Tick { now: t0 + 1_500 }).unwrap();
        let generation = m.record().generation;
        assert_eq!(
            m.handle(down(Actor::Target)).unwrap(),
            vec![Command::Finish]
        );
        let r = m.record();
        assert_eq!(
            (r.state, r.stray, r.generation),
            (MigrationState::Aborted, Some(NodeId(2)), generation)
        );
        // Back: the revert is finished and forgotten.
        let cmds = m.handle(Event::Recovered { now: 90_000 }).unwrap();
        assert_eq!(cmds, vec![Command::DropTargetCopy]);
        assert_eq!(
            m.handle(Event::TargetDropped).unwrap(),
            vec![persisted(&m), Command::Finish]
        );
        assert_eq!(m.record().stray, None);
        assert_eq!(
            m.handle(Event::TargetDropped).unwrap_err().why,
            RejectReason::Terminal
        );
    }

    #[test]
    fn a_terminal_record_without_a_stray_copy_rejects_drop_outcomes() {
        let mut m = after(14);
        assert_eq!(m.record().stray, None);
        for event in [
            Event::SourceDropped,
            Event::TargetDropped,
            down(Actor::Source),
        ] {
            assert_eq!(m.handle(event).unwrap_err().why, RejectReason::Terminal);
        }
        // A drop outcome nobody asked for is not taken.
        let mut m = after(13);
        for _ in 0..3 {
            m.handle(down(Actor::Source)).unwrap();
        }
        assert_eq!(
            m.handle(Event::SourceDropped).unwrap_err().why,
            RejectReason::Terminal
        );
    }
}
