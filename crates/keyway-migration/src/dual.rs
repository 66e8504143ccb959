//! `DUAL → CUTOVER`: dual-writing closes the window before the flip.
//!
//! Entering `DUAL` asks the source to forward every new write in the range
//! to the target and to acknowledge it only after the target applied it.
//! `DualEnabled{at_seq}` confirms that every write with seq > `at_seq` is
//! dual-written; the writes up to `at_seq` arrive through the catch-up
//! stream. Once the target has applied through `at_seq` it holds every
//! acknowledged write and keeps holding them: that is seed 003's "destination
//! has all data", and only then does the migration enter `CUTOVER` (whose
//! first command fences the source). Entering `CUTOVER` persists `at_seq`,
//! which is the durable proof that the flip comes after `DualEnabled`.
//!
//! Recovery: `DUAL` re-issues `StartCatchup{S}` and `EnableDual` and waits
//! for a fresh `DualEnabled` (the source may have restarted since). A `DUAL`
//! stuck for `stuck_timeout_ms` (e.g. dual-writing never confirmed) aborts,
//! reverting ownership to the source, which never stopped being a valid
//! owner (seed 003).

use crate::command::Command;
use crate::machine::{Migration, Outcome, RejectReason};
use crate::record::MigrationState;

impl Migration {
    pub(crate) fn enter_dual(&mut self) -> Vec<Command> {
        self.vol.dual_at_seq = None;
        let persist = self.transition(MigrationState::Dual, |_| {});
        vec![persist, Command::EnableDual]
    }

    pub(crate) fn on_dual_enabled(&mut self, at_seq: u64) -> Outcome {
        if self.rec.state != MigrationState::Dual {
            let why = if self.rec.state > MigrationState::Dual {
                RejectReason::Stale
            } else {
                RejectReason::WrongState
            };
            return Err(self.reject("DualEnabled", why));
        }
        if self.vol.dual_at_seq.is_some() {
            return Err(self.reject("DualEnabled", RejectReason::Stale));
        }
        let snapshot = self.rec.snapshot_seq.expect("DUAL has a snapshot seq");
        if at_seq < snapshot {
            return Err(self.reject(
                "DualEnabled",
                RejectReason::Inconsistent("dual-writing from before the snapshot"),
            ));
        }
        self.vol.dual_at_seq = Some(at_seq);
        self.progressed();
        Ok(self.dual_catchup_advanced())
    }

    /// `CUTOVER` once dual-writing is confirmed and the target applied every
    /// write before it.
    pub(crate) fn dual_catchup_advanced(&mut self) -> Vec<Command> {
        match self.vol.dual_at_seq {
            Some(at_seq) if self.rec.catchup_applied_seq >= at_seq => self.enter_cutover(at_seq),
            _ => Vec::new(),
        }
    }

    pub(crate) fn resume_dual(&mut self) -> Vec<Command> {
        vec![
            Command::StartCatchup {
                after_seq: self.rec.snapshot_seq.expect("DUAL has a snapshot seq"),
            },
            Command::EnableDual,
        ]
    }
}

#[cfg(test)]
mod tests {
    use crate::Event;
    use crate::command::Command;
    use crate::machine::RejectReason;
    use crate::machine::fixture::*;
    use crate::record::MigrationState;

    #[test]
    fn dual_enabled_waits_for_the_catchup_to_reach_its_seq() {
        let mut m = after(6);
        assert_eq!(
            m.handle(Event::DualEnabled { at_seq: 205 }).unwrap(),
            vec![]
        );
        assert_eq!(m.state(), MigrationState::Dual);
        let stale = m.handle(Event::DualEnabled { at_seq: 210 });
        assert_eq!(stale.unwrap_err().why, RejectReason::Stale);
        assert_eq!(
            m.handle(Event::CatchupLag {
                applied_seq: 204,
                source_seq: 206
            })
            .unwrap(),
            vec![]
        );
        let cmds = m
            .handle(Event::CatchupLag {
                applied_seq: 205,
                source_seq: 206,
            })
            .unwrap();
        assert_eq!(cmds, vec![persisted(&m), Command::FenceSource]);
        assert_eq!(m.state(), MigrationState::Cutover);
        assert_eq!(m.record().dual_at_seq, Some(205), "persisted with CUTOVER");
    }

    #[test]
    fn dual_enabled_behind_the_catchup_enters_cutover_at_once() {
        let mut m = after(6); // applied 195
        let cmds = m.handle(Event::DualEnabled { at_seq: 190 }).unwrap();
        assert_eq!(cmds, vec![persisted(&m), Command::FenceSource]);
        assert_eq!(m.record().dual_at_seq, Some(190));
    }

    #[test]
    fn dual_enabled_outside_dual_or_before_the_snapshot_is_rejected() {
        let mut m = after(5);
        let early = m.handle(Event::DualEnabled { at_seq: 150 });
        assert_eq!(early.unwrap_err().why, RejectReason::WrongState);
        let mut m = after(6);
        let before = m.handle(Event::DualEnabled { at_seq: 99 });
        assert_eq!(
            before.unwrap_err().why,
            RejectReason::Inconsistent("dual-writing from before the snapshot")
        );
        let mut m = after(8);
        let late = m.handle(Event::DualEnabled { at_seq: 205 });
        assert_eq!(late.unwrap_err().why, RejectReason::Stale);
    }

    #[test]
    fn recovery_in_dual_needs_a_fresh_confirmation() {
        let mut m = after(7); // DualEnabled{205} seen, applied 195
        let cmds = m.handle(Event::Recovered { now: 3_000 }).unwrap();
        assert_eq!(
            cmds,
            vec![
                Command::StartCatchup { after_seq: 100 },
                Command::EnableDual
            ]
        );
        // The old confirmation is forgotten: reaching 205 alone is not enough.
        assert_eq!(
            m.handle(Event::CatchupLag {
                applied_seq: 205,
                source_seq: 206
            })
            .unwrap(),
            vec![]
        );
        let cmds = m.handle(Event::DualEnabled { at_seq: 206 }).unwrap();
        assert_eq!(cmds, vec![]);
        let cmds = m
            .handle(Event::CatchupLag {
                applied_seq: 206,
                source_seq: 206,
            })
            .unwrap();
        assert_eq!(cmds, vec![persisted(&m), Command::FenceSource]);
    }

    #[test]
    fn a_dual_that_is_never_confirmed_aborts_and_stops_dual_writing() {
        let mut m = after(6);
        let cmds = m.handle(Event::Tick { now: 11_000 }).unwrap();
        assert_eq!(
            cmds,
            vec![persisted(&m), Command::DisableDual, Command::DropTargetCopy]
        );
        assert_eq!(m.record().aborted_from, Some(MigrationState::Dual));
    }
}
