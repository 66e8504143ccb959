//! `CATCHUP → DUAL`: the target applies the source's change log after S.
//!
//! `CatchupLag{applied_seq, source_seq}` reports where the target is. The
//! applied seq is a progress field (not persisted: after a restart the
//! target itself knows what it applied and skips it). A new minimum lag is
//! progress; lags are non-negative, so a catch-up that never converges runs
//! out of progress and hits the stuck timeout instead of running forever.
//! Once the lag is at most `catchup_lag_threshold` records the migration
//! enters `DUAL`. The catch-up stream keeps running in `DUAL` (it delivers
//! the writes from before dual-writing began), so lag reports are also
//! accepted there and handed to the dual phase.
//!
//! Recovery: `CATCHUP` re-issues `StartCatchup{S}`; the source refuses (and
//! the migration aborts via `ActorFailed`) if its change log no longer
//! reaches back to S.

use crate::command::Command;
use crate::machine::{Migration, Outcome, RejectReason};
use crate::record::MigrationState;

impl Migration {
    pub(crate) fn on_catchup_lag(&mut self, applied_seq: u64, source_seq: u64) -> Outcome {
        let state = self.rec.state;
        if !matches!(state, MigrationState::Catchup | MigrationState::Dual) {
            let why = if state > MigrationState::Dual {
                RejectReason::Stale
            } else {
                RejectReason::WrongState
            };
            return Err(self.reject("CatchupLag", why));
        }
        let snapshot = self.rec.snapshot_seq.expect("CATCHUP has a snapshot seq");
        if applied_seq < snapshot {
            return Err(self.reject(
                "CatchupLag",
                RejectReason::Inconsistent("applied seq before the snapshot"),
            ));
        }
        if applied_seq > source_seq {
            return Err(self.reject(
                "CatchupLag",
                RejectReason::Inconsistent("applied seq beyond the source"),
            ));
        }
        if applied_seq < self.rec.catchup_applied_seq {
            return Err(self.reject("CatchupLag", RejectReason::Stale));
        }
        self.rec.catchup_applied_seq = applied_seq;
        let lag = source_seq - applied_seq;
        if self.vol.min_lag.is_none_or(|min| lag < min) {
            self.vol.min_lag = Some(lag);
            self.progressed();
        }
        match state {
            MigrationState::Catchup if lag <= self.cfg.catchup_lag_threshold => {
                Ok(self.enter_dual())
            }
            MigrationState::Catchup => Ok(Vec::new()),
            _ => Ok(self.dual_catchup_advanced()),
        }
    }

    pub(crate) fn resume_catchup(&mut self) -> Vec<Command> {
        vec![Command::StartCatchup {
            after_seq: self.rec.snapshot_seq.expect("CATCHUP has a snapshot seq"),
        }]
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
    fn a_large_lag_stays_in_catchup_without_persisting() {
        let mut m = after(4);
        let cmds = m
            .handle(Event::CatchupLag {
                applied_seq: 150,
                source_seq: 200,
            })
            .unwrap();
        assert_eq!(cmds, vec![]);
        assert_eq!(
            (m.state(), m.record().catchup_applied_seq),
            (MigrationState::Catchup, 150)
        );
        assert_eq!(m.record().generation, 3);
    }

    #[test]
    fn a_small_lag_enters_dual_and_enables_dual_writing() {
        let mut m = after(5);
        let cmds = m
            .handle(Event::CatchupLag {
                applied_seq: 190,
                source_seq: 200,
            })
            .unwrap();
        assert_eq!(cmds, vec![persisted(&m), Command::EnableDual]);
        assert_eq!(m.state(), MigrationState::Dual);
        assert_eq!(m.record().catchup_applied_seq, 190);
    }

    #[test]
    fn impossible_and_stale_lag_reports_are_rejected() {
        let mut m = after(5);
        let reject = |m: &mut crate::Migration, a, s| {
            m.handle(Event::CatchupLag {
                applied_seq: a,
                source_seq: s,
            })
            .unwrap_err()
            .why
        };
        assert_eq!(
            reject(&mut m, 99, 200),
            RejectReason::Inconsistent("applied seq before the snapshot")
        );
        assert_eq!(
            reject(&mut m, 201, 200),
            RejectReason::Inconsistent("applied seq beyond the source")
        );
        assert_eq!(reject(&mut m, 149, 150), RejectReason::Stale);
        assert_eq!(m.state(), MigrationState::Catchup);
        let mut early = after(2);
        assert_eq!(reject(&mut early, 100, 100), RejectReason::WrongState);
    }

    #[test]
    fn a_lag_that_never_converges_hits_the_stuck_timeout() {
        let mut m = after(4);
        // The lag hovers above the threshold: no new minimum, no progress.
        for (i, now) in (2_000..11_000).step_by(1_000).enumerate() {
            let applied = 150 + i as u64;
            m.handle(Event::CatchupLag {
                applied_seq: applied,
                source_seq: applied + 60,
            })
            .unwrap();
            assert_eq!(m.handle(Event::Tick { now }).unwrap(), vec![], "at {now}");
        }
        let cmds = m.handle(Event::Tick { now: 11_000 }).unwrap();
        assert_eq!(cmds, vec![persisted(&m), Command::DropTargetCopy]);
    }

    #[test]
    fn recovery_restarts_the_stream_from_the_snapshot_seq() {
        let mut m = after(5);
        let cmds = m.handle(Event::Recovered { now: 3_000 }).unwrap();
        assert_eq!(cmds, vec![Command::StartCatchup { after_seq: 100 }]);
        assert_eq!(m.state(), MigrationState::Catchup);
    }
}
