//! `CUTOVER`: fence, verify, flip, serve. The write pause lives here.
//!
//! Sub-steps (all in `CUTOVER`):
//! 1. *fencing*: entered with `FenceSource`. `SourceFenced` (in-flight
//!    writes drained; the pause starts) → `ComputeDigests`.
//! 2. *verifying*: `Digests` equal → persist the flip request, then
//!    `CommitFlip` (the one CAS of invariant 6: (source, e) → (target, e+1));
//!    a driver may send the two as one store transaction (see `command.rs`).
//!    Unequal → abort. Steps 1–2 abort after `fence_timeout_ms`.
//! 3. *flip in doubt*: from the persisted request on, abort is impossible
//!    unless a conflict proves the CAS never applied. `FlipCommitted` → 4.
//!    `FlipConflict` carries [`FlipEvidence`] and is decided from the map's
//!    history, never from "someone else's epoch" (a split or merge after a
//!    flip whose answer was lost shows neither (source, e) nor (target, e+1)
//!    although the flip applied):
//!    - the row is (target, e+1): our CAS applied, its answer was lost → 4;
//!    - the history shows what replaced (source, e): owned by the target →
//!      our flip (only a flip changes the owner; a split or merge of the
//!      flipped row keeps it) → 4; anything else at a later epoch → the
//!      CAS never applied and never will ((source, e) never comes back) →
//!      abort;
//!    - no history (too old, unreadable): if every row covering the range
//!      is the target's at an epoch > e the flip applied → 4; otherwise the
//!      outcome is not proven: stay in doubt (keep the fence, re-send) —
//!      never abort on ambiguity.
//!
//!    `FlipUnavailable` means the outcome is
//!    unknown (`MetaError::Unavailable`): the source stays fenced and the
//!    identical CAS is re-sent every `retry_interval_ms`, without a timeout.
//!    Unfencing here could leave two owners if the CAS did apply; and while
//!    the store is unreachable no node can renew its lease, so the source
//!    would stop serving anyway (invariant 4): holding the fence costs
//!    nothing the outage does not already cost. Seed 003's "timeout that
//!    aborts by reverting to the source" is the stuck timeout of `DUAL` and
//!    the fence timeout of steps 1–2, where the source is still the owner.
//! 4. *flipped*: `AwaitTargetServing{e+1}` until `TargetServing`, which
//!    ends the pause (recorded) and enters `CLEANUP`. The flip's outcome is
//!    not persisted on its own (a store write inside the pause): it goes
//!    with the `CLEANUP` transition; a driver that restarts first finds the
//!    flip in doubt and step 3 re-learns it from the store.
//!
//! Recovery: before the flip request → abort (the fence confirmation and
//! the digests were in memory; the pause must not outlive the driver); in
//! doubt → `CommitFlip` again; flipped → `AwaitTargetServing` again.

use crate::command::Command;
use crate::event::RangeDigest;
use crate::event::{CutoverSteps, FlipEvidence};
use crate::machine::{Migration, Outcome, RejectReason};
use crate::record::{AbortReason, MigrationState};
use keyway_map::{Epoch, NodeId};

/// What a failed flip condition proves about our CAS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FlipOutcome {
    Applied,
    NotApplied,
    Unknown,
    Inconsistent(&'static str),
}

impl Migration {
    pub(crate) fn enter_cutover(&mut self, dual_at_seq: u64) -> Vec<Command> {
        self.vol.fence_started_ms = None;
        let persist = self.transition(MigrationState::Cutover, |r| {
            r.dual_at_seq = Some(dual_at_seq);
        });
        vec![persist, Command::FenceSource]
    }

    /// Why an event of steps 1–2 does not apply now.
    fn before_flip_rejection(&self) -> Option<RejectReason> {
        match self.rec.state {
            MigrationState::Cutover if !self.rec.flip_requested() => None,
            s if s >= MigrationState::Cutover => Some(RejectReason::Stale),
            _ => Some(RejectReason::WrongState),
        }
    }

    pub(crate) fn on_source_fenced(&mut self, now: u64) -> Outcome {
        if let Some(why) = self.before_flip_rejection() {
            return Err(self.reject("SourceFenced", why));
        }
        if self.vol.fence_started_ms.is_some() {
            return Err(self.reject("SourceFenced", RejectReason::Stale));
        }
        self.advance(now);
        self.vol.fence_started_ms = Some(now);
        Ok(vec![Command::ComputeDigests])
    }

    pub(crate) fn on_digests(&mut self, source: RangeDigest, target: RangeDigest) -> Outcome {
        if let Some(why) = self.before_flip_rejection() {
            return Err(self.reject("Digests", why));
        }
        let Some(fenced_at) = self.vol.fence_started_ms else {
            // Digests are only meaningful at the fence point.
            return Err(self.reject("Digests", RejectReason::WrongState));
        };
        if source != target {
            return Ok(self.abort(AbortReason::DigestMismatch { source, target }));
        }
        // The decision to flip, made once (the other half of check_step's
        // CommitFlip assertions): fenced, dual-writing, digests equal.
        assert_eq!(source, target);
        assert!(self.rec.dual_at_seq.is_some(), "flip without DualEnabled");
        assert!(!self.rec.flip_requested(), "a second flip decision");
        let now = self.vol.clock_ms;
        let persist = self.persist(|r| {
            r.fence_started_ms = Some(fenced_at);
            r.flip_requested_ms = Some(now);
        });
        self.vol.retry_at_ms = now + self.cfg.retry_interval_ms;
        Ok(vec![persist, self.commit_flip()])
    }

    /// The flip CAS, identical every time it is (re-)sent.
    fn commit_flip(&self) -> Command {
        Command::CommitFlip {
            condition: self.rec.flip_condition(),
            new_record: self.rec.flipped_partition(),
        }
    }

    /// Why an answer to the flip CAS does not apply now.
    fn in_doubt_rejection(&self) -> Option<RejectReason> {
        match self.rec.state {
            MigrationState::Cutover if self.rec.flip_in_doubt() => None,
            MigrationState::Cutover if self.rec.flipped() => Some(RejectReason::Stale),
            MigrationState::Cleanup => Some(RejectReason::Stale),
            _ => Some(RejectReason::WrongState),
        }
    }

    pub(crate) fn on_flip_committed(&mut self, now: u64) -> Outcome {
        if let Some(why) = self.in_doubt_rejection() {
            return Err(self.reject("FlipCommitted", why));
        }
        self.advance(now);
        Ok(self.flip_done(now))
    }

    pub(crate) fn on_flip_conflict(&mut self, evidence: FlipEvidence) -> Outcome {
        if let Some(why) = self.in_doubt_rejection() {
            return Err(self.reject("FlipConflict", why));
        }
        let current = evidence.current;
        match self.flip_outcome(&evidence) {
            FlipOutcome::Inconsistent(what) => {
                Err(self.reject("FlipConflict", RejectReason::Inconsistent(what)))
            }
            FlipOutcome::Applied => {
                // Our CAS applied earlier and its answer was lost.
                let now = self.vol.clock_ms;
                Ok(self.flip_done(now))
            }
            // The map's history replaced (source, e) with something else:
            // our CAS never applied, and (source, e) never comes back, so
            // it never will.
            FlipOutcome::NotApplied => Ok(self.abort(AbortReason::FlipConflict { current })),
            FlipOutcome::Unknown => {
                // Not proven either way: keep the fence, re-send later.
                self.vol.retry_at_ms = self.vol.clock_ms + self.cfg.retry_interval_ms;
                Ok(Vec::new())
            }
        }
    }

    /// What the evidence of a failed flip condition proves (module docs).
    fn flip_outcome(&self, ev: &FlipEvidence) -> FlipOutcome {
        let (target, e) = (self.rec.target, self.rec.epoch());
        let ours = (target, self.rec.flipped_epoch());
        if ev.current == Some(ours) {
            return FlipOutcome::Applied;
        }
        if ev.current == Some((self.rec.source(), e)) {
            return FlipOutcome::Inconsistent("a conflict showing the expected owner and epoch");
        }
        match ev.successor {
            Some((owner, _)) if owner == target => FlipOutcome::Applied,
            Some((_, epoch)) if epoch > e => FlipOutcome::NotApplied,
            Some(_) => FlipOutcome::Inconsistent("a successor of (source, e) at an epoch <= e"),
            None => {
                let targets = |(owner, epoch): &(NodeId, Epoch)| *owner == target && *epoch > e;
                if !ev.covering.is_empty() && ev.covering.iter().all(targets) {
                    FlipOutcome::Applied
                } else {
                    FlipOutcome::Unknown
                }
            }
        }
    }

    pub(crate) fn on_flip_unavailable(&mut self) -> Outcome {
        if let Some(why) = self.in_doubt_rejection() {
            return Err(self.reject("FlipUnavailable", why));
        }
        // Outcome unknown: keep the fence, re-send after the retry interval.
        self.vol.retry_at_ms = self.vol.clock_ms + self.cfg.retry_interval_ms;
        Ok(Vec::new())
    }

    fn flip_done(&mut self, now: u64) -> Vec<Command> {
        assert!(self.rec.flip_in_doubt(), "flip done without a request");
        assert_eq!(self.rec.state, MigrationState::Cutover);
        // Not persisted here but with the `CLEANUP` transition: a store write
        // at this point would sit inside the write pause (issue 15: three
        // store writes were most of it). A driver that restarts before then
        // reloads the flip as in doubt and re-sends the identical CAS, whose
        // conflict the map's evidence decides as applied (step 3).
        self.rec.flip_done_ms = Some(now);
        self.vol.retry_at_ms = self.vol.clock_ms + self.cfg.retry_interval_ms;
        vec![Command::AwaitTargetServing {
            epoch: self.rec.flipped_epoch(),
        }]
    }

    pub(crate) fn on_target_serving(&mut self, now: u64, steps: CutoverSteps) -> Outcome {
        match self.rec.state {
            MigrationState::Cutover if self.rec.flipped() => {}
            MigrationState::Cleanup => {
                return Err(self.reject("TargetServing", RejectReason::Stale));
            }
            _ => return Err(self.reject("TargetServing", RejectReason::WrongState)),
        }
        self.advance(now);
        let fenced_at = self
            .rec
            .fence_started_ms
            .expect("a flipped record has a fence time");
        Ok(self.enter_cleanup(now.saturating_sub(fenced_at), steps))
    }

    pub(crate) fn cutover_tick(&mut self) -> Vec<Command> {
        if !self.rec.flip_requested() {
            let waited = self
                .vol
                .clock_ms
                .saturating_sub(self.rec.state_entered_at_ms);
            if waited >= self.cfg.fence_timeout_ms {
                return self.abort(AbortReason::FenceTimeout { waited_ms: waited });
            }
            return Vec::new();
        }
        if !self.retry_due() {
            return Vec::new();
        }
        if self.rec.flipped() {
            vec![Command::AwaitTargetServing {
                epoch: self.rec.flipped_epoch(),
            }]
        } else {
            vec![self.commit_flip()]
        }
    }

    pub(crate) fn resume_cutover(&mut self) -> Vec<Command> {
        if !self.rec.flip_requested() {
            return self.abort(AbortReason::NotResumable {
                state: MigrationState::Cutover,
            });
        }
        if self.rec.flipped() {
            vec![Command::AwaitTargetServing {
                epoch: self.rec.flipped_epoch(),
            }]
        } else {
            vec![self.commit_flip()]
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::command::Command;
    use crate::event::{Actor, CutoverSteps, FlipEvidence, RangeDigest};
    use crate::machine::RejectReason;
    use crate::machine::fixture::*;
    use crate::record::{AbortReason, MigrationState};
    use crate::{Event, Migration};
    use keyway_map::{Epoch, NodeId};

    fn flip(m: &Migration) -> Command {
        Command::CommitFlip {
            condition: m.record().flip_condition(),
            new_record: m.record().flipped_partition(),
        }
    }

    fn revert(m: &Migration) -> Vec<Command> {
        vec![
            persisted(m),
            Command::DisableDual,
            Command::UnfenceSource,
            Command::DropTargetCopy,
        ]
    }

    fn conflict(
        current: Option<(NodeId, Epoch)>,
        successor: Option<(NodeId, Epoch)>,
        covering: &[(NodeId, Epoch)],
    ) -> Event {
        Event::FlipConflict {
            evidence: FlipEvidence {
                current,
                successor,
                covering: covering.to_vec(),
            },
        }
    }

    #[test]
    fn fenced_then_digests_then_one_flip_cas() {
        let mut m = after(8);
        assert_eq!(
            m.handle(Event::SourceFenced { now: 1_005 }).unwrap(),
            vec![Command::ComputeDigests]
        );
        let dup = m.handle(Event::SourceFenced { now: 1_006 });
        assert_eq!(dup.unwrap_err().why, RejectReason::Stale);
        let cmds = m
            .handle(Event::Digests {
                source: DIGEST,
                target: DIGEST,
            })
            .unwrap();
        assert_eq!(cmds, vec![persisted(&m), flip(&m)]);
        let Command::CommitFlip {
            condition,
            new_record,
        } = &cmds[1]
        else {
            unreachable!()
        };
        assert_eq!(condition.expected, Some((NodeId(1), Epoch(4))));
        assert_eq!((new_record.owner, new_record.epoch), (NodeId(2), Epoch(5)));
        let r = m.record();
        assert_eq!(
            (r.fence_started_ms, r.flip_requested_ms, r.flip_done_ms),
            (Some(1_005), Some(1_005), None)
        );
        let again = m.handle(Event::Digests {
            source: DIGEST,
            target: DIGEST,
        });
        assert_eq!(
            again.unwrap_err().why,
            RejectReason::Stale,
            "no second flip decision"
        );
    }

    #[test]
    fn digests_before_the_fence_are_rejected() {
        let mut m = after(8);
        let early = m.handle(Event::Digests {
            source: DIGEST,
            target: DIGEST,
        });
        assert_eq!(early.unwrap_err().why, RejectReason::WrongState);
        let mut m = after(7);
        let early = m.handle(Event::Digests {
            source: DIGEST,
            target: DIGEST,
        });
        assert_eq!(early.unwrap_err().why, RejectReason::WrongState);
    }

    #[test]
    fn a_digest_mismatch_aborts_and_unfences() {
        let mut m = after(9);
        let other = RangeDigest {
            digest: 1,
            ..DIGEST
        };
        let cmds = m
            .handle(Event::Digests {
                source: DIGEST,
                target: other,
            })
            .unwrap();
        assert_eq!(cmds, revert(&m));
        assert_eq!(
            m.record().abort_reason,
            Some(AbortReason::DigestMismatch {
                source: DIGEST,
                target: other
            })
        );
    }

    #[test]
    fn the_fence_is_bounded_before_the_flip_request() {
        let mut m = after(9);
        assert_eq!(m.handle(Event::Tick { now: 1_999 }).unwrap(), vec![]);
        let cmds = m.handle(Event::Tick { now: 2_000 }).unwrap();
        assert_eq!(cmds, revert(&m));
        assert_eq!(
            m.record().abort_reason,
            Some(AbortReason::FenceTimeout { waited_ms: 1_000 })
        );
    }

    /// No store write between the CAS and the target serving (it would sit
    /// in the write pause): the outcome goes with the `CLEANUP` persist.
    #[test]
    fn flip_committed_awaits_the_target_without_a_store_write() {
        let mut m = after(10);
        let generation = m.record().generation;
        let cmds = m.handle(Event::FlipCommitted { now: 1_015 }).unwrap();
        assert_eq!(cmds, vec![Command::AwaitTargetServing { epoch: Epoch(5) }]);
        assert_eq!(m.record().flip_done_ms, Some(1_015));
        assert_eq!(m.record().generation, generation);
        assert_eq!(
            m.handle(Event::FlipCommitted { now: 1_016 })
                .unwrap_err()
                .why,
            RejectReason::Stale
        );
    }

    #[test]
    fn a_conflict_showing_our_flip_is_a_commit() {
        let mut m = after(10);
        let cmds = m
            .handle(conflict(Some((NodeId(2), Epoch(5))), None, &[]))
            .unwrap();
        assert_eq!(cmds, vec![Command::AwaitTargetServing { epoch: Epoch(5) }]);
        assert!(m.record().flipped());
    }

    #[test]
    fn a_history_showing_another_successor_of_source_e_aborts() {
        for (current, successor) in [
            // A replica change, a foreign move, a split of (source, e).
            (Some((NodeId(1), Epoch(5))), Some((NodeId(1), Epoch(5)))),
            (Some((NodeId(3), Epoch(6))), Some((NodeId(3), Epoch(5)))),
            (None, Some((NodeId(1), Epoch(5)))),
        ] {
            let mut m = after(10);
            let cmds = m.handle(conflict(current, successor, &[])).unwrap();
            assert_eq!(cmds, revert(&m));
            assert_eq!(
                m.record().abort_reason,
                Some(AbortReason::FlipConflict { current })
            );
        }
        let mut m = after(10);
        let odd = m.handle(conflict(Some((NodeId(1), Epoch(4))), None, &[]));
        assert!(matches!(
            odd.unwrap_err().why,
            RejectReason::Inconsistent(_)
        ));
        let odd = m.handle(conflict(None, Some((NodeId(1), Epoch(4))), &[]));
        assert!(matches!(
            odd.unwrap_err().why,
            RejectReason::Inconsistent(_)
        ));
    }

    /// The bug of issue 11: the flip applied, its answer was lost, then the
    /// partition (now the target's) was split: the re-sent CAS conflicts
    /// showing the partition gone. That is not "never applied".
    #[test]
    fn a_split_after_a_lost_flip_is_recognised_as_applied() {
        let children = [(NodeId(2), Epoch(6)), (NodeId(2), Epoch(6))];
        // From the history: the split removed the row while the target owned it.
        let mut m = after(10);
        let cmds = m
            .handle(conflict(None, Some((NodeId(2), Epoch(5))), &children))
            .unwrap();
        assert_eq!(cmds, vec![Command::AwaitTargetServing { epoch: Epoch(5) }]);
        assert!(m.record().flipped());
        // No history left: the covering rows are all the target's.
        let mut m = after(10);
        m.handle(conflict(None, None, &children)).unwrap();
        assert!(m.record().flipped());
        assert_ne!(m.state(), MigrationState::Aborted);
    }

    #[test]
    fn an_unproven_outcome_stays_in_doubt_and_keeps_resending() {
        for covering in [
            vec![],
            vec![(NodeId(1), Epoch(5))],
            vec![(NodeId(2), Epoch(6)), (NodeId(1), Epoch(5))],
        ] {
            let mut m = after(10);
            let before = m.record().clone();
            assert_eq!(m.handle(conflict(None, None, &covering)).unwrap(), vec![]);
            assert_eq!(*m.record(), before, "no decision");
            assert!(m.record().flip_in_doubt());
            assert_eq!(m.handle(Event::Tick { now: 1_504 }).unwrap(), vec![]);
            assert_eq!(
                m.handle(Event::Tick { now: 1_505 }).unwrap(),
                vec![flip(&m)]
            );
        }
    }

    #[test]
    fn an_unavailable_store_keeps_the_fence_and_resends_the_same_cas_forever() {
        let mut m = after(10);
        assert_eq!(m.handle(Event::FlipUnavailable).unwrap(), vec![]);
        assert_eq!(m.handle(Event::Tick { now: 1_504 }).unwrap(), vec![]);
        assert_eq!(
            m.handle(Event::Tick { now: 1_505 }).unwrap(),
            vec![flip(&m)]
        );
        assert_eq!(m.handle(Event::Tick { now: 1_600 }).unwrap(), vec![]);
        // Far past every timeout: still no abort, still the same CAS.
        assert_eq!(
            m.handle(Event::Tick { now: 1_000_000 }).unwrap(),
            vec![flip(&m)]
        );
        let abort = m.handle(Event::AbortRequested {
            reason: "operator".into(),
        });
        assert_eq!(abort.unwrap_err().why, RejectReason::FlipInDoubt);
        let failed = Event::ActorFailed {
            who: Actor::Target,
            detail: "restart".into(),
        };
        assert_eq!(m.handle(failed).unwrap(), vec![]);
        assert!(m.record().flip_in_doubt() && m.state() == MigrationState::Cutover);
    }

    #[test]
    fn target_serving_records_the_pause_and_enters_cleanup() {
        let mut m = after(11);
        let steps = CutoverSteps {
            fence_us: 2_000,
            digest_us: 500,
            flip_us: 1_500,
            serve_us: 700,
        };
        let cmds = m
            .handle(Event::TargetServing { now: 1_035, steps })
            .unwrap();
        assert_eq!(
            cmds,
            vec![
                persisted(&m),
                Command::RecordPause { ms: 30 },
                Command::StartGrace { ms: 5_000 }
            ]
        );
        // The steps are persisted with the pause, in the same record write.
        assert_eq!(
            (m.state(), m.record().pause_ms, m.record().cutover_steps),
            (MigrationState::Cleanup, Some(30), Some(steps))
        );
        let early = after(10).handle(Event::TargetServing {
            now: 2_030,
            steps: Default::default(),
        });
        assert_eq!(early.unwrap_err().why, RejectReason::WrongState);
    }

    #[test]
    fn recovery_before_the_flip_request_aborts() {
        for steps in [8, 9] {
            let mut m = after(steps);
            let cmds = m.handle(Event::Recovered { now: 2_100 }).unwrap();
            assert_eq!(cmds, revert(&m));
            assert_eq!(
                m.record().abort_reason,
                Some(AbortReason::NotResumable {
                    state: MigrationState::Cutover
                })
            );
        }
    }

    #[test]
    fn recovery_in_doubt_resends_the_cas_and_after_the_flip_awaits_the_target() {
        let mut m = after(10);
        assert_eq!(
            m.handle(Event::Recovered { now: 2_100 }).unwrap(),
            vec![flip(&m)]
        );
        let mut m = after(11);
        let cmds = m.handle(Event::Recovered { now: 2_100 }).unwrap();
        assert_eq!(cmds, vec![Command::AwaitTargetServing { epoch: Epoch(5) }]);
        assert_eq!(m.handle(Event::Tick { now: 2_599 }).unwrap(), vec![]);
        let cmds = m.handle(Event::Tick { now: 2_600 }).unwrap();
        assert_eq!(cmds, vec![Command::AwaitTargetServing { epoch: Epoch(5) }]);
    }

    #[test]
    fn a_reloaded_record_keeps_the_pause_start() {
        let m = after(10);
        let mut reloaded = Migration::new(m.record().clone(), config()).unwrap();
        reloaded.handle(Event::Recovered { now: 2_050 }).unwrap();
        reloaded
            .handle(Event::FlipCommitted { now: 2_060 })
            .unwrap();
        reloaded
            .handle(Event::TargetServing {
                now: 2_070,
                steps: Default::default(),
            })
            .unwrap();
        assert_eq!(reloaded.record().pause_ms, Some(1_065));
    }
}
