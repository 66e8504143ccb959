//! `PENDING → COPYING → CATCHUP`: the snapshot and its bulk copy.
//!
//! `Started` enters `COPYING` and asks the source for a snapshot. The
//! snapshot's seq S is persisted *before* the copy starts, because catch-up
//! after a restart must continue from exactly the snapshot the target holds.
//! `CopyProgress` is a progress report (not persisted; it restarts the stuck
//! timer while the copied bytes grow, up to the snapshot size). `CopyDone`
//! enters `CATCHUP` and starts streaming the change log after S.
//!
//! Recovery: `PENDING` re-issues nothing; `COPYING` re-issues `TakeSnapshot`
//! (S unknown) or `StartCopy{S}`, which the source refuses (reported as
//! `ActorFailed`, hence an abort) if it no longer holds snapshot S.

use crate::command::Command;
use crate::machine::{Migration, Outcome, RejectReason};
use crate::record::MigrationState;

impl Migration {
    pub(crate) fn on_started(&mut self, now: u64) -> Outcome {
        if self.rec.state != MigrationState::Pending {
            return Err(self.reject("Started", RejectReason::Stale));
        }
        self.advance(now);
        let persist = self.transition(MigrationState::Copying, |r| r.started_at_ms = now);
        Ok(vec![persist, Command::TakeSnapshot])
    }

    pub(crate) fn on_snapshot_taken(&mut self, seq: u64, total_bytes: u64) -> Outcome {
        match (self.rec.state, self.rec.snapshot_seq) {
            (MigrationState::Copying, None) => {}
            (MigrationState::Pending, _) => {
                return Err(self.reject("SnapshotTaken", RejectReason::WrongState));
            }
            _ => return Err(self.reject("SnapshotTaken", RejectReason::Stale)),
        }
        self.progressed();
        let persist = self.persist(|r| {
            r.snapshot_seq = Some(seq);
            r.total_bytes = total_bytes;
            r.copied_bytes = 0;
            r.catchup_applied_seq = seq;
        });
        Ok(vec![persist, Command::StartCopy { from_seq: seq }])
    }

    pub(crate) fn on_copy_progress(&mut self, bytes: u64) -> Outcome {
        if self.rec.state != MigrationState::Copying || self.rec.snapshot_seq.is_none() {
            return Err(self.reject("CopyProgress", self.copy_rejection()));
        }
        // Progress is bounded by the snapshot size, so the stuck timer
        // cannot be kept alive forever.
        let bytes = bytes.min(self.rec.total_bytes);
        if bytes <= self.rec.copied_bytes {
            return Err(self.reject("CopyProgress", RejectReason::Stale));
        }
        self.rec.copied_bytes = bytes;
        self.progressed();
        Ok(Vec::new())
    }

    /// The copy's cost (progress, not persisted): accepted while copying
    /// and later (a repeated or late report of a finished copy), never
    /// lowering what the record holds (a source that restarted would report
    /// less, but then the migration aborts anyway).
    pub(crate) fn on_copy_cost(&mut self, sent: u64, written: u64, duration_ms: u64) -> Outcome {
        if self.rec.state < MigrationState::Copying {
            return Err(self.reject("CopyCost", RejectReason::WrongState));
        }
        let r = &self.rec;
        if sent <= r.bytes_sent && written <= r.bytes_written && duration_ms <= r.copy_duration_ms {
            return Err(self.reject("CopyCost", RejectReason::Stale));
        }
        self.rec.bytes_sent = self.rec.bytes_sent.max(sent);
        self.rec.bytes_written = self.rec.bytes_written.max(written);
        self.rec.copy_duration_ms = self.rec.copy_duration_ms.max(duration_ms);
        Ok(Vec::new())
    }

    pub(crate) fn on_copy_done(&mut self) -> Outcome {
        let Some(snapshot) = self.rec.snapshot_seq else {
            return Err(self.reject("CopyDone", self.copy_rejection()));
        };
        if self.rec.state != MigrationState::Copying {
            return Err(self.reject("CopyDone", self.copy_rejection()));
        }
        let persist = self.transition(MigrationState::Catchup, |r| {
            r.copied_bytes = r.total_bytes;
        });
        Ok(vec![
            persist,
            Command::StartCatchup {
                after_seq: snapshot,
            },
        ])
    }

    fn copy_rejection(&self) -> RejectReason {
        if self.rec.state > MigrationState::Copying {
            RejectReason::Stale
        } else {
            RejectReason::WrongState
        }
    }

    pub(crate) fn resume_copying(&mut self) -> Vec<Command> {
        match self.rec.snapshot_seq {
            None => vec![Command::TakeSnapshot],
            Some(seq) => vec![Command::StartCopy { from_seq: seq }],
        }
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
    fn started_enters_copying_and_takes_a_snapshot() {
        let mut m = fresh();
        let cmds = m.handle(Event::Started { now: 1_500 }).unwrap();
        assert_eq!(cmds, vec![persisted(&m), Command::TakeSnapshot]);
        let r = m.record();
        assert_eq!(
            (r.state, r.generation, r.started_at_ms),
            (MigrationState::Copying, 1, 1_500)
        );
        assert_eq!(r.state_entered_at_ms, 1_500);
        assert_eq!(
            m.handle(Event::Started { now: 1_600 }).unwrap_err().why,
            RejectReason::Stale
        );
    }

    #[test]
    fn the_snapshot_seq_is_persisted_before_the_copy_starts() {
        let mut m = after(1);
        let cmds = m
            .handle(Event::SnapshotTaken {
                seq: 100,
                total_bytes: 4_096,
            })
            .unwrap();
        assert_eq!(
            cmds,
            vec![persisted(&m), Command::StartCopy { from_seq: 100 }]
        );
        let r = m.record();
        assert_eq!(
            (r.snapshot_seq, r.total_bytes, r.catchup_applied_seq),
            (Some(100), 4_096, 100)
        );
        assert_eq!(r.generation, 2);
        let dup = m.handle(Event::SnapshotTaken {
            seq: 120,
            total_bytes: 1,
        });
        assert_eq!(
            dup.unwrap_err().why,
            RejectReason::Stale,
            "a second snapshot is ignored"
        );
        assert_eq!(m.record().snapshot_seq, Some(100));
    }

    #[test]
    fn copy_progress_is_not_persisted_and_stale_reports_are_rejected() {
        let mut m = after(2);
        assert_eq!(
            m.handle(Event::CopyProgress { bytes: 1_000 }).unwrap(),
            vec![]
        );
        assert_eq!(m.record().copied_bytes, 1_000);
        assert_eq!(m.record().generation, 2);
        let stale = m.handle(Event::CopyProgress { bytes: 900 });
        assert_eq!(stale.unwrap_err().why, RejectReason::Stale);
        // Beyond the snapshot size counts only up to it.
        assert_eq!(
            m.handle(Event::CopyProgress { bytes: 10_000 }).unwrap(),
            vec![]
        );
        assert_eq!(m.record().copied_bytes, 4_096);
        let beyond = m.handle(Event::CopyProgress { bytes: 20_000 });
        assert_eq!(beyond.unwrap_err().why, RejectReason::Stale);
    }

    #[test]
    fn copy_done_enters_catchup_from_the_snapshot_seq() {
        let mut m = after(3);
        let cmds = m.handle(Event::CopyDone).unwrap();
        assert_eq!(
            cmds,
            vec![persisted(&m), Command::StartCatchup { after_seq: 100 }]
        );
        assert_eq!(m.state(), MigrationState::Catchup);
        assert_eq!(m.record().copied_bytes, 4_096);
        assert_eq!(
            m.handle(Event::CopyDone).unwrap_err().why,
            RejectReason::Stale
        );
    }

    #[test]
    fn the_copy_cost_is_kept_and_carried_by_the_persist_ending_copying() {
        let mut m = after(3);
        let cost = |s, w, d| Event::CopyCost {
            bytes_sent: s,
            bytes_written: w,
            copy_duration_ms: d,
        };
        assert_eq!(m.handle(cost(4_000, 3_900, 120)).unwrap(), vec![]);
        assert_eq!(
            m.record().generation,
            2,
            "a progress report is not persisted"
        );
        assert_eq!(
            m.handle(cost(4_000, 3_900, 120)).unwrap_err().why,
            RejectReason::Stale
        );
        assert_eq!(m.handle(cost(4_096, 4_096, 150)).unwrap(), vec![]);
        let cmds = m.handle(Event::CopyDone).unwrap();
        let Command::Persist(rec) = &cmds[0] else {
            panic!("CopyDone persists first: {cmds:?}");
        };
        assert_eq!(
            (rec.bytes_sent, rec.bytes_written, rec.copy_duration_ms),
            (4_096, 4_096, 150)
        );
        // A late, smaller report (a repeat of an older status) lowers nothing.
        assert!(m.handle(cost(10, 10, 10)).is_err());
        assert_eq!(m.record().bytes_sent, 4_096);
        // Before the copy started: refused.
        let mut m = fresh();
        assert_eq!(
            m.handle(cost(1, 1, 1)).unwrap_err().why,
            RejectReason::WrongState
        );
    }

    #[test]
    fn copy_events_before_the_snapshot_are_rejected() {
        let mut m = fresh();
        for e in [
            Event::CopyDone,
            Event::CopyProgress { bytes: 1 },
            Event::SnapshotTaken {
                seq: 1,
                total_bytes: 1,
            },
        ] {
            assert_eq!(m.handle(e).unwrap_err().why, RejectReason::WrongState);
        }
        let mut m = after(1);
        assert_eq!(
            m.handle(Event::CopyDone).unwrap_err().why,
            RejectReason::WrongState
        );
        assert_eq!(
            m.handle(Event::CopyProgress { bytes: 1 }).unwrap_err().why,
            RejectReason::WrongState
        );
    }

    #[test]
    fn recovery_reissues_the_snapshot_or_the_copy() {
        let mut m = fresh();
        assert_eq!(m.handle(Event::Recovered { now: 1_100 }).unwrap(), vec![]);
        assert_eq!(m.state(), MigrationState::Pending);
        let mut m = after(1);
        assert_eq!(
            m.handle(Event::Recovered { now: 1_100 }).unwrap(),
            vec![Command::TakeSnapshot]
        );
        let mut m = after(3);
        let cmds = m.handle(Event::Recovered { now: 1_100 }).unwrap();
        assert_eq!(cmds, vec![Command::StartCopy { from_seq: 100 }]);
        assert_eq!(m.record().generation, 2, "recovery itself persists nothing");
    }

    #[test]
    fn a_copy_without_progress_times_out_and_progress_restarts_the_timer() {
        let mut m = after(2);
        assert_eq!(m.handle(Event::Tick { now: 10_999 }).unwrap(), vec![]);
        assert_eq!(m.handle(Event::CopyProgress { bytes: 10 }).unwrap(), vec![]);
        assert_eq!(m.handle(Event::Tick { now: 20_998 }).unwrap(), vec![]);
        let cmds = m.handle(Event::Tick { now: 20_999 }).unwrap();
        assert_eq!(cmds, vec![persisted(&m), Command::DropTargetCopy]);
        assert_eq!(m.state(), MigrationState::Aborted);
    }
}
