//! One migration's task: feeds the machine and executes its batches until
//! `Finish`, until the seat stops leading (under the leadership the task was
//! started with), or until its record disappears.

use super::{Shared, load, now_ms, storage_range};
use crate::decisions::Decision;
use keyway_map::NodeId;
use keyway_meta::Leadership;
use keyway_migration::{
    Actor, Command, CutoverSteps, Event, Migration, MigrationRecord, MigrationState,
};
use keyway_peer::PeerError;
use keyway_storage::KeyRange;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use tokio::time::Instant;

/// What executing one command led to.
pub(super) enum Step {
    /// Done; nothing to report (or the report will come from polling).
    Done,
    /// Report this event to the machine.
    Report(Event),
    /// Drop the rest of the batch (the reason is in the task's flags).
    Halt,
    /// The migration is over: stop driving it.
    Finish,
}

pub(crate) struct Task {
    pub(super) shared: Arc<Shared>,
    pub(super) term: Leadership,
    pub(super) machine: Migration,
    pub(super) range: KeyRange,
    /// Admin addresses of the nodes this migration talks to (from the map;
    /// forgotten on an unreachable node, so a re-registration is picked up).
    pub(super) addrs: BTreeMap<NodeId, String>,
    /// `StartCopy`/`StartCatchup` succeeded since the last (re)load: poll
    /// the source's push status.
    pub(super) push_started: bool,
    /// When the grace timer of `StartGrace` fires.
    pub(super) grace_at: Option<Instant>,
    /// A `Persist` failed or the stored generation moved: reload the record
    /// and feed `Recovered` at the next poll.
    pub(super) need_reload: bool,
    /// A revert command failed: feed `Recovered` again at the next poll (the
    /// machine re-issues the revert of an `ABORTED` record).
    pub(super) need_recover: bool,
    /// `Finish` was executed, or the record is gone.
    pub(super) finished: bool,
    /// The last copy progress seen (for the copy rate).
    pub(super) last_copy: Option<(Instant, u64)>,
    /// The record was already over when the task started: it only drops a
    /// stray copy (not counted as a finished migration again).
    pub(super) cleanup_only: bool,
    /// The cutover's steps timed so far (reported with `TargetServing`).
    pub(super) cutover: CutoverSteps,
    /// The digests the source took with the current fence (consumed by the
    /// machine's `ComputeDigests`, which then needs no call of its own).
    pub(super) fence_digests: Option<keyway_peer::FenceDigests>,
}

impl Task {
    pub(crate) fn new(shared: Arc<Shared>, term: Leadership, machine: Migration) -> Task {
        let range = storage_range(machine.record());
        let cleanup_only = machine.record().state.is_terminal();
        Task {
            shared,
            term,
            machine,
            range,
            addrs: BTreeMap::new(),
            push_started: false,
            grace_at: None,
            need_reload: false,
            cutover: CutoverSteps::default(),
            fence_digests: None,
            need_recover: false,
            finished: false,
            last_copy: None,
            cleanup_only,
        }
    }

    pub(super) fn record(&self) -> &MigrationRecord {
        self.machine.record()
    }

    pub(super) fn id(&self) -> u64 {
        self.record().id.0
    }

    /// Whether this task may act: the seat leads, under the same leadership
    /// the task was started with.
    pub(super) fn leads(&self) -> bool {
        self.shared.seat.leading().as_ref() == Some(&self.term)
    }

    pub(crate) async fn run(mut self, first: Event) {
        self.publish();
        self.drive(first).await;
        let poll = self.shared.config.poll();
        while !self.finished && self.leads() {
            tokio::time::sleep(poll).await;
            if !self.leads() {
                break;
            }
            self.poll().await;
        }
        let id = self.record().id;
        tracing::debug!(migration = %id, state = %self.record().state, "migration task ends");
        self.shared.live.remove(&self.shared.metrics, id);
    }

    /// Shares the machine's record with the metrics and the admin route.
    pub(super) fn publish(&self) {
        self.shared
            .live
            .update(&self.shared.metrics, self.machine.record(), |_| {});
    }

    /// Feeds `first` and everything the commands it caused report, executing
    /// every batch in order. Each reported event is preceded by a `Tick`, so
    /// timeouts count the time the command took.
    pub(super) async fn drive(&mut self, first: Event) {
        let mut events = VecDeque::from([first]);
        while let Some(event) = events.pop_front() {
            if self.finished || self.need_reload || !self.leads() {
                return;
            }
            let name = event.name();
            let batch = match self.machine.handle(event) {
                Ok(batch) => batch,
                Err(rejected) => {
                    tracing::debug!(%rejected, "migration event rejected");
                    continue;
                }
            };
            self.publish();
            if !batch.is_empty() {
                tracing::debug!(
                    migration = self.id(), event = name, state = %self.record().state,
                    commands = ?batch.iter().map(Command::name).collect::<Vec<_>>(),
                    "migration step"
                );
            }
            let mut batch = batch.into_iter().peekable();
            while let Some(command) = batch.next() {
                if !self.leads() {
                    return;
                }
                // The flip request's persist and the flip CAS after it go
                // to the store as one transaction (`actions.rs`).
                let flip = match &command {
                    Command::Persist(rec) if super::actions::is_flip_request(rec) => {
                        batch.next_if(|c| matches!(c, Command::CommitFlip { .. }))
                    }
                    _ => None,
                };
                let step = match (command, flip) {
                    (
                        Command::Persist(rec),
                        Some(Command::CommitFlip {
                            condition,
                            new_record,
                        }),
                    ) => self.persist_and_flip(rec, condition, new_record).await,
                    (command, _) => self.execute(command).await,
                };
                match step {
                    Step::Done => {}
                    Step::Report(event) => {
                        let failed = matches!(event, Event::ActorFailed { .. });
                        events.push_back(Event::Tick { now: now_ms() });
                        events.push_back(event);
                        if failed {
                            // The rest of the batch assumed the actor works.
                            break;
                        }
                    }
                    Step::Halt => break,
                    Step::Finish => {
                        self.finish();
                        return;
                    }
                }
            }
        }
    }

    fn finish(&mut self) {
        self.finished = true;
        let state = self.record().state;
        let outcome = match state {
            MigrationState::Done => "done",
            _ => "aborted",
        };
        if !self.cleanup_only {
            self.shared.metrics.migration_finished(outcome);
        }
        let rec = self.record().clone();
        tracing::info!(
            migration = %rec.id, partition = %rec.partition_id(), %state,
            reason = ?rec.abort_reason, pause_ms = ?rec.pause_ms, stray = ?rec.stray,
            "migration finished"
        );
        let range = crate::split::range_text(&rec.partition);
        let subject = format!("stray-{}", rec.id);
        match rec.stray {
            Some(node) => {
                if !self.cleanup_only {
                    self.shared.metrics.migration_cleanup_give_ups.inc();
                }
                self.shared.decisions.record_once(
                    subject,
                    Decision::now(
                        "migration",
                        "leave_copy",
                        "node_unreachable",
                        Some(rec.partition_id()),
                        false,
                        format!(
                            "migration {} ({state}): gave up dropping the copy of {range} on node {node} \
                             after {} attempts; it is dropped when the node is back",
                            rec.id, self.shared.config.migration.cleanup_attempts
                        ),
                    ),
                );
            }
            None if self.cleanup_only => self.shared.decisions.record_once(
                subject,
                Decision::now(
                    "migration",
                    "drop_copy",
                    "node_back",
                    Some(rec.partition_id()),
                    true,
                    format!(
                        "migration {} ({state}): the copy of {range} left behind is gone",
                        rec.id
                    ),
                ),
            ),
            None => {}
        }
    }

    /// Re-reads the record into a fresh machine (forgetting everything
    /// volatile). False if it could not (store unreachable, record gone).
    pub(super) async fn reload(&mut self) -> bool {
        let id = self.record().id;
        let stored = match self.shared.meta.get_migration(id.0).await {
            Ok(Some(stored)) => stored,
            Ok(None) => {
                tracing::warn!(migration = %id, "migration record deleted; no longer driving it");
                self.finished = true;
                return false;
            }
            Err(err) => {
                tracing::debug!(migration = %id, %err, "cannot reload the migration record");
                return false;
            }
        };
        let machine = load(&stored).and_then(|rec| {
            Migration::new(rec, self.shared.config.migration.clone()).map_err(|e| {
                super::DriverError::BadRecord {
                    id,
                    detail: e.to_string(),
                }
            })
        });
        match machine {
            Ok(machine) => {
                self.machine = machine;
                self.push_started = false;
                self.grace_at = None;
                self.need_reload = false;
                self.need_recover = false;
                self.last_copy = None;
                self.addrs.clear();
                self.publish();
                true
            }
            Err(err) => {
                tracing::error!(%err, "cannot drive the reloaded migration record");
                self.finished = true;
                false
            }
        }
    }

    /// One poll: the stored generation, the grace timer, `Tick`, and the
    /// source's push status.
    async fn poll(&mut self) {
        let id = self.record().id;
        if !self.need_reload {
            match self.shared.meta.get_migration(id.0).await {
                Ok(Some(stored)) if stored.generation != self.record().generation => {
                    tracing::info!(
                        migration = %id, stored = stored.generation,
                        ours = self.record().generation,
                        "migration record changed in the store (operator abort?); reloading"
                    );
                    self.need_reload = true;
                }
                Ok(Some(_)) => {}
                Ok(None) => {
                    tracing::warn!(migration = %id, "migration record deleted; no longer driving it");
                    self.finished = true;
                    return;
                }
                Err(err) => {
                    tracing::debug!(migration = %id, %err, "cannot read the migration record")
                }
            }
        }
        if self.need_reload {
            if self.reload().await {
                self.drive(Event::Recovered { now: now_ms() }).await;
            }
            return;
        }
        if self.need_recover {
            self.need_recover = false;
            self.drive(Event::Recovered { now: now_ms() }).await;
            return;
        }
        if self.grace_at.is_some_and(|at| Instant::now() >= at) {
            self.grace_at = None;
            self.drive(Event::GraceElapsed).await;
        }
        self.drive(Event::Tick { now: now_ms() }).await;
        let polled = matches!(
            self.record().state,
            MigrationState::Copying | MigrationState::Catchup | MigrationState::Dual
        );
        if self.push_started && polled && !self.finished && !self.need_reload {
            for event in self.poll_push().await {
                self.drive(event).await;
            }
        }
    }

    /// The source's push status, as events.
    async fn poll_push(&mut self) -> Vec<Event> {
        let source = match self.peer(Actor::Source).await {
            Ok(p) => p,
            Err(_) => return Vec::new(),
        };
        let status = match self.shared.peers.migrate_status(&source, self.id()).await {
            Ok(status) => status,
            Err(PeerError::NotFound(detail)) => {
                return vec![Event::ActorFailed {
                    who: Actor::Source,
                    detail: format!("the source lost the migration: {detail}"),
                }];
            }
            Err(PeerError::Unavailable(detail)) => {
                // Transient: the stuck timeout aborts if it lasts.
                tracing::debug!(migration = self.id(), %detail, "source unreachable for status");
                self.addrs.remove(&source.node);
                return Vec::new();
            }
            Err(err) => {
                return vec![Event::ActorFailed {
                    who: Actor::Source,
                    detail: err.to_string(),
                }];
            }
        };
        if let Some(detail) = status.error {
            return vec![Event::ActorFailed {
                who: Actor::Target,
                detail,
            }];
        }
        let rec = self.record().clone();
        match rec.state {
            MigrationState::Copying => {
                let bytes = status.copied_bytes.min(rec.total_bytes);
                let now = Instant::now();
                let rate = self.last_copy.and_then(|(at, before)| {
                    let secs = now.duration_since(at).as_secs_f64();
                    (secs > 0.0).then(|| (status.copied_bytes.saturating_sub(before)) as f64 / secs)
                });
                self.last_copy = Some((now, status.copied_bytes));
                self.shared.live.update(&self.shared.metrics, &rec, |e| {
                    if let Some(rate) = rate {
                        e.copy_rate = Some(rate as u64);
                    }
                });
                let mut events = vec![Event::CopyProgress { bytes }];
                // The cost before `CopyDone`: the persist ending COPYING
                // carries the final figures (the push fixes them before it
                // reports the copy done).
                if status.copy_bytes_sent > 0 || status.copy_duration_ms > 0 {
                    events.push(Event::CopyCost {
                        bytes_sent: status.copy_bytes_sent,
                        bytes_written: status.copy_bytes_written,
                        copy_duration_ms: status.copy_duration_ms,
                    });
                }
                if status.copy_done {
                    events.push(Event::CopyDone);
                }
                events
            }
            _ => {
                let lag = status.head_seq.saturating_sub(status.acked_seq);
                self.shared
                    .live
                    .update(&self.shared.metrics, &rec, |e| e.lag = Some(lag));
                vec![Event::CatchupLag {
                    applied_seq: status.acked_seq,
                    source_seq: status.head_seq,
                }]
            }
        }
    }

    /// Forgets the address of an unreachable node (it may re-register).
    fn forget_unreachable(&mut self, who: Actor, err: &PeerError) {
        if matches!(err, PeerError::Unavailable(_)) {
            let node = match who {
                Actor::Source => Some(self.record().source()),
                Actor::Target => Some(self.record().target),
                Actor::Manager => None,
            };
            if let Some(node) = node {
                self.addrs.remove(&node);
            }
        }
    }

    /// A drop of a copy (`DropTargetCopy`, `DropSourceRange`) failed at
    /// `who`: always the machine's to count (it backs off, and ends the
    /// record with the copy as `stray` after `cleanup_attempts`).
    pub(super) fn drop_failed(&mut self, who: Actor, what: &str, err: PeerError) -> Step {
        self.forget_unreachable(who, &err);
        tracing::warn!(migration = self.id(), ?who, what, %err, "dropping a copy failed");
        Step::Report(Event::ActorFailed {
            who,
            detail: format!("{what}: {err}"),
        })
    }

    /// A command failed at `who`: before the flip request the migration
    /// aborts (`ActorFailed`); in a revert the source's steps are skipped
    /// (the source lifts its fence and stops its push itself once it reads
    /// the `ABORTED` record); after the flip request the machine re-issues
    /// on `Tick`.
    pub(super) fn failed(&mut self, who: Actor, what: &str, err: PeerError) -> Step {
        self.forget_unreachable(who, &err);
        let rec = self.record();
        if rec.state == MigrationState::Aborted {
            if who == Actor::Source {
                tracing::warn!(migration = %rec.id, what, %err, "revert step at the source failed; the source ends it itself");
                return Step::Done;
            }
            tracing::warn!(migration = %rec.id, ?who, what, %err, "revert step failed; retrying");
            self.need_recover = true;
            return Step::Halt;
        }
        if rec.flip_requested() || rec.state.is_terminal() || rec.state >= MigrationState::Cleanup {
            tracing::warn!(migration = %rec.id, ?who, what, %err, "step failed after the flip request; retrying");
            return Step::Done;
        }
        tracing::warn!(migration = %rec.id, ?who, what, %err, "migration actor failed");
        Step::Report(Event::ActorFailed {
            who,
            detail: format!("{what}: {err}"),
        })
    }
}
