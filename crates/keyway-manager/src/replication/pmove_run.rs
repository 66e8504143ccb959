//! The leader's side of primary moves: one [`pmoves::step`] per live move
//! each round, carried out (a map CAS, a record write, a switchover call in
//! a task of its own so a slow fence never delays failovers, the record's
//! deletion), with every action and every change of waiting reason in the
//! decision log, the outcome counter, the phase gauge and `/status`.

use super::pmoves::{self, PStep, Phase, PrimaryMove, PrimaryMoveOutcome};
use super::run::{Loop, Outcome};
use super::{DUTY, PhaseLabel, PrimaryMoveView};
use crate::decisions::Decision;
use crate::metrics::OutcomeLabel;
use keyway_map::{NodeId, PartitionId, PartitionMap};
use keyway_meta::{Leadership, MetaError};
use std::collections::{BTreeMap, BTreeSet};

impl Loop {
    pub(super) async fn drive_primary_moves(
        &self,
        term: &Leadership,
        map: &PartitionMap,
        list: &[PrimaryMove],
        migrating: &BTreeSet<PartitionId>,
    ) -> Result<(), MetaError> {
        let now = crate::driver::now_ms();
        let mut seen = BTreeSet::new();
        let mut views = Vec::new();
        let mut phases: BTreeMap<Phase, i64> = Phase::ALL.iter().map(|p| (*p, 0)).collect();
        for mv in list {
            let first = seen.insert(mv.partition);
            let switching = self.is_switching(mv.id);
            let step = pmoves::step(
                mv,
                map,
                first,
                migrating.contains(&mv.partition),
                switching,
                now,
                self.config.replica_move_timeout_ms,
            );
            *phases.entry(mv.phase).or_default() += 1;
            let what = format!(
                "primary move {}: partition {} node {} -> node {} ({})",
                mv.id,
                mv.partition,
                mv.from,
                mv.to,
                mv.phase.name()
            );
            let mut view = |doing| {
                views.push(PrimaryMoveView {
                    record: mv.clone(),
                    doing,
                    fail_back_left_ms: (mv.phase == Phase::FailBackWindow)
                        .then(|| mv.window_ends_at_ms().map(|e| e.saturating_sub(now)))
                        .flatten(),
                })
            };
            match step {
                PStep::Wait { why } => {
                    view(why);
                    self.decisions.record_once(
                        format!("primary move {}", mv.id),
                        Decision::now(
                            DUTY,
                            "primary_move_wait",
                            why,
                            Some(mv.partition),
                            false,
                            what,
                        ),
                    );
                }
                PStep::Cas {
                    expected,
                    row,
                    action,
                    reason,
                } => {
                    view(action);
                    match self.commit(term, mv.partition, expected, &row).await? {
                        Outcome::Committed => {
                            let list = |v: &[NodeId]| v.iter().map(|n| n.0).collect::<Vec<_>>();
                            self.decisions.record(Decision::now(
                                DUTY,
                                action,
                                reason,
                                Some(mv.partition),
                                true,
                                format!(
                                    "{what}: epoch {}: replicas {:?}, in sync {:?}, reads from {:?}",
                                    row.epoch,
                                    list(&row.replicas),
                                    list(&row.in_sync),
                                    row.reads_from.map(|n| n.0)
                                ),
                            ));
                        }
                        Outcome::Stale(why) => {
                            tracing::debug!(%why, "{what}: row changed; re-planned next round")
                        }
                        Outcome::NotLeading => return Ok(()),
                    }
                }
                PStep::Advance { next, why } => {
                    view(why);
                    if self.seat.leading().as_ref() != Some(term) {
                        return Ok(());
                    }
                    match self
                        .meta
                        .put_migration(mv.id, Some(mv.generation), mv.generation + 1, next.encode())
                        .await
                    {
                        Ok(()) => self.decisions.record(Decision::now(
                            DUTY,
                            "primary_move_phase",
                            why,
                            Some(mv.partition),
                            true,
                            format!("{what} -> {}", next.phase.name()),
                        )),
                        // Changed under us (e.g. `ctl move --back`): next round.
                        Err(MetaError::MigrationConflict { .. }) => {}
                        Err(e) => return Err(e),
                    }
                }
                PStep::Switchover { from, to, epoch } => {
                    view("switching");
                    if self.seat.leading().as_ref() != Some(term) {
                        return Ok(());
                    }
                    self.start_switchover(mv, from, to, epoch, what);
                }
                PStep::Finish { outcome, reason } => {
                    if self.seat.leading().as_ref() != Some(term) {
                        return Ok(());
                    }
                    match self.meta.delete_migration(mv.id, mv.generation).await {
                        Ok(()) => {}
                        Err(MetaError::MigrationConflict { .. }) => continue,
                        Err(e) => return Err(e),
                    }
                    self.metrics
                        .primary_moves
                        .get_or_create(&OutcomeLabel {
                            outcome: outcome.name(),
                        })
                        .inc();
                    self.status.update(|v| match outcome {
                        PrimaryMoveOutcome::Done => v.primary_moves_done += 1,
                        PrimaryMoveOutcome::MovedBack => v.primary_moves_moved_back += 1,
                        PrimaryMoveOutcome::Abandoned => v.primary_moves_abandoned += 1,
                    });
                    let took = now.saturating_sub(mv.requested_at_ms);
                    self.decisions.record(Decision::now(
                        DUTY,
                        match outcome {
                            PrimaryMoveOutcome::Done => "primary_move_done",
                            PrimaryMoveOutcome::MovedBack => "primary_move_moved_back",
                            PrimaryMoveOutcome::Abandoned => "primary_move_abandoned",
                        },
                        reason,
                        Some(mv.partition),
                        true,
                        format!("{what}: {} after {took} ms", outcome.name()),
                    ));
                }
            }
        }
        for (phase, n) in phases {
            self.metrics
                .primary_move_phases
                .get_or_create(&PhaseLabel {
                    phase: phase.name(),
                })
                .set(n);
        }
        self.status.update(|v| v.primary_moves = views);
        Ok(())
    }

    fn is_switching(&self, id: u64) -> bool {
        self.switching
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&id)
    }

    /// Calls `from`'s switchover to `to` in a task of its own (the fence
    /// may take up to the switchover timeout); the move waits meanwhile.
    fn start_switchover(
        &self,
        mv: &PrimaryMove,
        from: NodeId,
        to: NodeId,
        epoch: keyway_map::Epoch,
        what: String,
    ) {
        let (id, partition) = (mv.id, mv.partition);
        self.switching
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id);
        let meta = self.meta.clone();
        let decisions = self.decisions.clone();
        let switching = self.switching.clone();
        tokio::spawn(async move {
            let timeout = crate::switchover::DEFAULT_SWITCHOVER_TIMEOUT_MS;
            // The row the step planned from must still be there.
            let current = meta
                .get_map()
                .await
                .ok()
                .and_then(|m| m.partitions.get(&partition).map(|p| (p.owner, p.epoch)));
            let decision = if current != Some((from, epoch)) {
                Decision::now(
                    DUTY,
                    "no_switchover",
                    "row_changed",
                    Some(partition),
                    false,
                    format!("{what}: the row moved on; re-planned next round"),
                )
            } else {
                match crate::switchover::switchover(&*meta, partition, Some(to), timeout).await {
                    Ok(o) => Decision::now(
                        DUTY,
                        "switchover",
                        "primary_move",
                        Some(partition),
                        true,
                        format!(
                            "{what}: node {} -> node {} at epoch {}, requests paused {} us",
                            o.from, o.owner, o.epoch, o.paused_us
                        ),
                    ),
                    Err(e) => Decision::now(
                        DUTY,
                        "no_switchover",
                        "switchover_failed",
                        Some(partition),
                        false,
                        format!("{what}: {e}; retried next round"),
                    ),
                }
            };
            // One entry per change of outcome (a failing call is retried
            // every round).
            decisions.record_once(format!("primary move {id} switchover"), decision);
            switching
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id);
        });
    }
}
