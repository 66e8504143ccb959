//! How the driver carries out each [`Command`]: the store and node calls,
//! and the event each outcome is reported as.
//!
//! Failure rules: a failed `Persist` halts the batch and reloads; a node
//! error goes through [`Task::failed`] (before the flip request it aborts the
//! migration, after it the machine re-issues on `Tick`; a source that
//! cannot undo its side of a revert is skipped: it ends its fence and push
//! itself once it reads the `ABORTED` record); an unreachable node is
//! retried a few times first. The two drops of a copy (`DropTargetCopy`,
//! `DropSourceRange`) report every failure to the machine
//! ([`Task::drop_failed`]), which backs off and, after
//! `cleanup_attempts`, ends the record with the copy as `stray`; a node
//! that was decommissioned took its copy with it (reported as dropped).
//!
//! A flip conflict is reported with the map's evidence (`evidence.rs`).
//! After the flip the partition id may be gone (split or merged after the
//! flip): the target's and the source's views are then read on a row that
//! now covers the range.

use super::PeerAddr;
use super::evidence::flip_evidence;
use super::now_ms;
use super::run::{Step, Task};
use keyway_map::{
    Epoch, MapChange, NodeId, OwnershipCondition, PartitionId, PartitionMap, PartitionRecord,
};
use keyway_meta::{MapTxn, MetaError, MigrationPut};
use keyway_migration::{
    Actor, Command, CutoverSteps, Event, MigrationRecord, MigrationState, RangeDigest,
};
use keyway_peer::{MigrationRef, PeerError, PushSpec};
use keyway_storage::KeyRange;
use std::time::Duration;
use tokio::time::Instant;

/// Attempts of a node call that finds the node unreachable before the
/// failure counts.
const UNAVAILABLE_ATTEMPTS: u32 = 3;
/// How long to wait before asking a node's view again when it answered
/// early without the view waited for (see `Task::wait_view`).
const VIEW_POLL: Duration = Duration::from_millis(2);
/// Longest single wait at a node for an install (`PartitionView` with a
/// wait; the node caps it at `keyway_peer::MAX_VIEW_WAIT_MS`).
const VIEW_WAIT: Duration = Duration::from_secs(1);

/// The cutover step a command belongs to, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CutoverStep {
    Digest,
    Flip,
    Serve,
}

fn cutover_step(command: &Command) -> Option<CutoverStep> {
    match command {
        Command::ComputeDigests => Some(CutoverStep::Digest),
        // The flip request's persist and the CAS (the flip's outcome is
        // persisted with `CLEANUP`, after the pause).
        Command::Persist(rec) if is_flip_request(rec) => Some(CutoverStep::Flip),
        Command::CommitFlip { .. } => Some(CutoverStep::Flip),
        Command::AwaitTargetServing { .. } => Some(CutoverStep::Serve),
        _ => None,
    }
}

/// Whether `rec` is the flip request (in `CUTOVER` the flip's outcome is
/// never persisted: it goes with `CLEANUP`), which the driver writes in one
/// store transaction with the `CommitFlip` that follows it
/// ([`Task::persist_and_flip`]).
pub(super) fn is_flip_request(rec: &MigrationRecord) -> bool {
    rec.state == MigrationState::Cutover && rec.flip_requested()
}

fn convert(d: keyway_storage::RangeDigest) -> RangeDigest {
    RangeDigest {
        keys: d.keys,
        bytes: d.bytes,
        digest: d.digest,
    }
}

impl Task {
    /// Runs `command`, timing it if it is a step of the cutover (see
    /// [`CutoverSteps`]; the fence times itself, from its request on).
    pub(super) async fn execute(&mut self, command: Command) -> Step {
        let timed = cutover_step(&command);
        let started = Instant::now();
        let mut step = self.run_command(command).await;
        if let Some(which) = timed {
            let us = started.elapsed().as_micros().min(u64::MAX as u128) as u64;
            let slot = match which {
                CutoverStep::Digest => &mut self.cutover.digest_us,
                CutoverStep::Flip => &mut self.cutover.flip_us,
                CutoverStep::Serve => &mut self.cutover.serve_us,
            };
            *slot += us;
        }
        if let Step::Report(Event::TargetServing { steps, .. }) = &mut step {
            *steps = self.cutover;
            self.shared.metrics.cutover_steps(steps);
        }
        step
    }

    async fn run_command(&mut self, command: Command) -> Step {
        match command {
            Command::Persist(rec) => self.persist(rec).await,
            Command::TakeSnapshot => self.take_snapshot().await,
            Command::StartCopy { from_seq } => self.start_push(true, from_seq).await,
            Command::StartCatchup { after_seq } => self.start_push(false, after_seq).await,
            Command::EnableDual => self.toggle(Toggle::Dual, true).await,
            Command::DisableDual => self.toggle(Toggle::Dual, false).await,
            Command::FenceSource => self.toggle(Toggle::Fence, true).await,
            Command::UnfenceSource => self.toggle(Toggle::Fence, false).await,
            Command::ComputeDigests => self.digests().await,
            Command::CommitFlip {
                condition,
                new_record,
            } => self.commit_flip(condition, new_record).await,
            Command::AwaitTargetServing { epoch } => self.await_target(epoch).await,
            Command::DropTargetCopy => self.drop_target_copy().await,
            Command::StartGrace { ms } => {
                self.grace_at = Some(Instant::now() + Duration::from_millis(ms));
                Step::Done
            }
            Command::DropSourceRange { moved_to, epoch } => {
                self.drop_source_range(moved_to, epoch).await
            }
            Command::RecordPause { ms } => {
                self.shared.metrics.cutover_pause_ms.observe(ms as f64);
                Step::Done
            }
            Command::Finish => Step::Finish,
        }
    }

    /// The node playing `who` and its admin address (from the map). `Err`
    /// is the step to take instead: an unregistered node failed; an
    /// unreadable registry (the store, not the node) halts the batch and
    /// reloads at the next poll.
    pub(super) async fn peer(&mut self, who: Actor) -> Result<PeerAddr, Step> {
        let node = match who {
            Actor::Source => self.record().source(),
            Actor::Target => self.record().target,
            Actor::Manager => unreachable!("the manager is not a node"),
        };
        if let Some(addr) = self.addrs.get(&node) {
            return Ok(PeerAddr {
                node,
                admin_addr: addr.clone(),
            });
        }
        let map = match self.shared.meta.get_map().await {
            Ok(map) => map,
            Err(err) => {
                tracing::debug!(migration = self.id(), %err, "cannot read the node registry");
                self.need_reload = true;
                return Err(Step::Halt);
            }
        };
        match self.address(&map, node) {
            Some(addr) => Ok(addr),
            None => {
                let err = PeerError::Remote(format!("node {node} is not registered"));
                Err(self.failed(who, "resolve", err))
            }
        }
    }

    /// `node`'s address in `map` (remembered), `None` if it is not registered.
    fn address(&mut self, map: &PartitionMap, node: NodeId) -> Option<PeerAddr> {
        let info = map.nodes.get(&node)?;
        self.addrs.insert(node, info.admin_addr.clone());
        Some(PeerAddr {
            node,
            admin_addr: info.admin_addr.clone(),
        })
    }

    /// Whether `node` owns any row of `map` overlapping the range.
    fn owns_part(&self, map: &PartitionMap, node: NodeId) -> bool {
        map.partitions.values().any(|p| {
            let (start, end) = p.storage_bounds();
            // A replica's copy is as live as the owner's (an in-sync one
            // holds every acknowledged write): never dropped either.
            p.has_copy(node) && super::ranges_overlap(&KeyRange::new(start, end), &self.range)
        })
    }

    /// The row to read a node's view on after the flip: the partition at
    /// `epoch` while it exists, else (split or merged after the flip) a row
    /// `owner` now holds over the range, at that row's epoch.
    fn moved_row(&self, map: &PartitionMap, owner: NodeId, epoch: Epoch) -> (PartitionId, Epoch) {
        let pid = self.record().partition_id();
        if map.partitions.contains_key(&pid) {
            return (pid, epoch);
        }
        map.partitions
            .values()
            .find(|p| {
                let (start, end) = p.storage_bounds();
                p.owner == owner && super::ranges_overlap(&KeyRange::new(start, end), &self.range)
            })
            .map_or((pid, epoch), |p| (p.id, p.epoch))
    }

    /// Runs a node call, retrying an unreachable node a few times.
    async fn call<T, F, Fut>(&self, mut f: F) -> Result<T, PeerError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, PeerError>>,
    {
        let mut attempt = 1;
        loop {
            match f().await {
                Err(PeerError::Unavailable(detail))
                    if attempt < UNAVAILABLE_ATTEMPTS && self.leads() =>
                {
                    tracing::debug!(migration = self.id(), %detail, attempt, "node unreachable; retrying");
                    attempt += 1;
                    tokio::time::sleep(self.shared.config.poll()).await;
                }
                other => return other,
            }
        }
    }

    async fn persist(&mut self, rec: MigrationRecord) -> Step {
        let expected = rec.generation - 1;
        let result = self
            .shared
            .meta
            .put_migration(rec.id.0, Some(expected), rec.generation, rec.encode())
            .await;
        match result {
            Ok(()) => {
                // Records are created at generation 1 (PENDING): generation 2
                // in COPYING is `Started` taking effect.
                if rec.state == MigrationState::Copying && rec.generation == 2 {
                    self.shared.metrics.migrations_started.inc();
                }
                Step::Done
            }
            Err(err) => {
                let level_conflict = matches!(err, MetaError::MigrationConflict { .. });
                tracing::warn!(
                    migration = %rec.id, generation = rec.generation, %err, conflict = level_conflict,
                    "persisting the migration record failed; reloading"
                );
                self.need_reload = true;
                Step::Halt
            }
        }
    }

    async fn take_snapshot(&mut self) -> Step {
        let source = match self.peer(Actor::Source).await {
            Ok(p) => p,
            Err(step) => return step,
        };
        let peers = self.shared.peers.clone();
        let seq = match self.call(|| peers.last_seq(&source)).await {
            Ok(seq) => seq,
            Err(e) => return self.failed(Actor::Source, "LastSeq", e),
        };
        let range = self.range.clone();
        match self.call(|| peers.range_stats(&source, &range)).await {
            Ok((_keys, bytes)) => Step::Report(Event::SnapshotTaken {
                seq,
                total_bytes: bytes,
            }),
            Err(e) => self.failed(Actor::Source, "RangeStats", e),
        }
    }

    /// `StartCopy` (`copy`) or `StartCatchup`: the source pushes to the
    /// target; progress comes from polling its status.
    async fn start_push(&mut self, copy: bool, after_seq: u64) -> Step {
        let source = match self.peer(Actor::Source).await {
            Ok(p) => p,
            Err(step) => return step,
        };
        let target = match self.peer(Actor::Target).await {
            Ok(p) => p,
            Err(step) => return step,
        };
        let spec = PushSpec {
            id: self.id(),
            partition: self.record().partition_id(),
            epoch: self.record().epoch(),
            range: self.range.clone(),
            target: target.admin_addr,
            copy,
            after_seq,
            throttle: self.shared.config.throttle,
        };
        let peers = self.shared.peers.clone();
        match self.call(|| peers.migrate_start(&source, &spec)).await {
            Ok(_) => {
                self.push_started = true;
                self.last_copy = None;
                Step::Done
            }
            Err(e) => self.failed(Actor::Source, "MigrateStart", e),
        }
    }

    /// Dual-writing or the fence on the source, on or off. Turning off is a
    /// revert step: a source that lost the migration (`NotFound`) has
    /// nothing left to undo.
    async fn toggle(&mut self, what: Toggle, on: bool) -> Step {
        let source = match self.peer(Actor::Source).await {
            Ok(p) => p,
            Err(step) => return step,
        };
        let (peers, id) = (self.shared.peers.clone(), self.id());
        if matches!(what, Toggle::Fence) && on {
            // Before the pause: the source moves its checkpoint to the
            // present, so the digest inside the pause covers only what is
            // written from here to the fence. Best effort: without it the
            // digest covers more (a push that is gone fails the fence next).
            match peers.migrate_checkpoint(&source, id).await {
                Ok((seq, moved)) => {
                    tracing::debug!(migration = id, seq, moved, "checkpoint before the fence")
                }
                Err(e) => tracing::debug!(migration = id, %e, "checkpoint before the fence"),
            }
        }
        // The pause starts when the fence is asked for (measured, never
        // under-reported).
        let asked_at = now_ms();
        let asked = Instant::now();
        self.fence_digests = None;
        let result = match what {
            Toggle::Dual => self.call(|| peers.migrate_dual(&source, id, on)).await,
            // The digests come with the fence (`digests` below uses them).
            Toggle::Fence if on => self
                .call(|| peers.migrate_fence_digests(&source, id))
                .await
                .map(|(seq, digests)| {
                    self.fence_digests = digests;
                    seq
                }),
            Toggle::Fence => self.call(|| peers.migrate_fence(&source, id, on)).await,
        };
        if matches!(what, Toggle::Fence) && on {
            // The first step of a new cutover.
            self.cutover = CutoverSteps {
                fence_us: asked.elapsed().as_micros().min(u64::MAX as u128) as u64,
                ..CutoverSteps::default()
            };
        }
        match (result, what, on) {
            (Ok(at_seq), Toggle::Dual, true) => Step::Report(Event::DualEnabled { at_seq }),
            (Ok(_), Toggle::Fence, true) => Step::Report(Event::SourceFenced { now: asked_at }),
            (Ok(_), _, false) | (Err(PeerError::NotFound(_)), _, false) => Step::Done,
            (Err(e), Toggle::Dual, _) => self.failed(Actor::Source, "MigrateDual", e),
            (Err(e), Toggle::Fence, _) => self.failed(Actor::Source, "MigrateFence", e),
        }
    }

    /// Both digests come from the fenced source, which reads the target's
    /// side itself: incrementally since the push's checkpoint, so the cost
    /// (inside the write pause) follows the writes since the checkpoint, not
    /// the partition's size. A failure of either side is the source's report.
    /// The source normally answered them with the fence (taken there, after
    /// the drain, while the target's incoming hold was set): no call then.
    async fn digests(&mut self) -> Step {
        let node = match self.peer(Actor::Source).await {
            Ok(p) => p,
            Err(step) => return step,
        };
        let (peers, id) = (self.shared.peers.clone(), self.id());
        let with_fence = self.fence_digests.take();
        let result = match with_fence {
            Some(d) => Ok(d),
            None => self.call(|| peers.migrate_digest(&node, id)).await,
        };
        match result {
            Ok(d) => {
                tracing::debug!(
                    migration = id,
                    incremental = d.incremental,
                    delta_keys = d.delta_keys,
                    "fence digests"
                );
                Step::Report(Event::Digests {
                    source: convert(d.source),
                    target: convert(d.target),
                })
            }
            Err(e) => self.failed(Actor::Source, "MigrateDigest", e),
        }
    }

    /// The flip: one CAS on (source, e) writing the row (target, e + 1).
    async fn commit_flip(
        &mut self,
        condition: OwnershipCondition,
        new_record: PartitionRecord,
    ) -> Step {
        let partition = condition.partition;
        let txn = MapTxn {
            conditions: vec![condition],
            changes: vec![MapChange::UpsertPartition(new_record)],
        };
        match self.shared.meta.commit(txn).await {
            Ok(version) => {
                tracing::info!(migration = self.id(), %partition, %version, "flip committed");
                Step::Report(Event::FlipCommitted { now: now_ms() })
            }
            Err(MetaError::Conflict { current, .. }) => {
                let (row, read_at) = (self.record().partition.clone(), self.record().map_version);
                let meta = &*self.shared.meta;
                let evidence = flip_evidence(meta, &row, read_at, &self.range, current).await;
                tracing::warn!(migration = self.id(), %partition, ?evidence, "flip conflict");
                Step::Report(Event::FlipConflict { evidence })
            }
            Err(MetaError::Unavailable(detail)) => {
                tracing::warn!(migration = self.id(), %detail, "flip outcome unknown; will re-send");
                Step::Report(Event::FlipUnavailable)
            }
            Err(err) => {
                // Not a condition failure, so not provably "never applied":
                // the machine re-sends the identical CAS.
                tracing::error!(migration = self.id(), %err, "flip refused; will re-send");
                Step::Report(Event::FlipUnavailable)
            }
        }
    }

    /// The flip request (`rec`) and the flip CAS as one store transaction
    /// (`MetaStore::commit_with_migration`): one durable write inside the
    /// write pause instead of two. The machine's contract holds: the
    /// request is durable no later than the CAS, since neither applies
    /// without the other.
    ///
    /// Any failure but a refusal of the record's own condition (a flip
    /// conflict, an unknown outcome, a metadata server without the call)
    /// falls back to the two writes in order, which is what the machine
    /// asked for: the persist CASes the record on the same generation the
    /// combined write did, so at most one of them applies (a combined write
    /// that did apply makes the persist conflict: the driver reloads and
    /// finds the flip in doubt), and the flip CAS then reports what it
    /// finds (a conflict with the map's evidence, or `FlipUnavailable`).
    /// A refused record condition halts and reloads, as a failed persist.
    pub(super) async fn persist_and_flip(
        &mut self,
        rec: MigrationRecord,
        condition: OwnershipCondition,
        new_record: PartitionRecord,
    ) -> Step {
        debug_assert!(is_flip_request(&rec));
        let started = Instant::now();
        let txn = MapTxn {
            conditions: vec![condition.clone()],
            changes: vec![MapChange::UpsertPartition(new_record.clone())],
        };
        let put = MigrationPut {
            id: rec.id.0,
            expected: Some(rec.generation - 1),
            generation: rec.generation,
            record: rec.encode(),
        };
        let result = self.shared.meta.commit_with_migration(txn, put).await;
        let step = match result {
            Ok(version) => {
                tracing::info!(migration = self.id(), partition = %condition.partition, %version, "flip committed");
                Step::Report(Event::FlipCommitted { now: now_ms() })
            }
            Err(err @ (MetaError::MigrationConflict { .. } | MetaError::InvalidArgument(_))) => {
                // The record's condition refused it: nothing applied.
                tracing::warn!(
                    migration = %rec.id, generation = rec.generation, %err,
                    "persisting the flip request failed; reloading"
                );
                self.need_reload = true;
                Step::Halt
            }
            Err(err) => {
                // A map conflict, an unknown outcome, or a store that cannot
                // say (a metadata server without the call answers Internal).
                tracing::warn!(migration = self.id(), %err, "flip with its request failed; writing them in turn");
                match self.persist(rec).await {
                    Step::Done => self.commit_flip(condition, new_record).await,
                    other => other,
                }
            }
        };
        self.cutover.flip_us += started.elapsed().as_micros().min(u64::MAX as u128) as u64;
        step
    }

    /// Polls the target's view of the partition until it serves it at
    /// `epoch`, for at most the retry interval (the machine re-issues).
    async fn await_target(&mut self, epoch: Epoch) -> Step {
        let target = match self.peer(Actor::Target).await {
            Ok(p) => p,
            Err(step) => return step,
        };
        let owner = self.record().target;
        // The common case first, without reading the map: the partition
        // kept its id, and the target's install of the flip wakes the wait.
        let first = self.shared.peers.partition_view(
            &target,
            self.record().partition_id(),
            epoch,
            VIEW_WAIT.min(self.shared.config.retry()),
        );
        if let Ok(Some(v)) = first.await
            && v.owner == owner
            && v.epoch >= epoch
        {
            return Step::Report(Event::TargetServing {
                now: now_ms(),
                steps: CutoverSteps::default(),
            });
        }
        let (pid, epoch) = match self.shared.meta.get_map().await {
            Ok(map) => self.moved_row(&map, owner, epoch),
            Err(_) => (self.record().partition_id(), epoch),
        };
        let done = self
            .wait_view(&target, pid, epoch, |v| {
                v.owner == owner && v.epoch >= epoch
            })
            .await;
        match done {
            Some(true) => Step::Report(Event::TargetServing {
                now: now_ms(),
                steps: CutoverSteps::default(),
            }),
            _ => {
                tracing::debug!(migration = self.id(), partition = %pid, "target not serving yet");
                Step::Done
            }
        }
    }

    /// Waits until `node`'s view of the partition satisfies `ok`, for at
    /// most the retry interval: each call waits at the node until its map
    /// shows the partition at `min_epoch` or later (an install wakes it, no
    /// polling interval in the write pause), then `ok` decides; a view that
    /// answers without satisfying it (a split or merge took the id, an
    /// error) is asked again after [`VIEW_POLL`]. `Some(true)`: it held;
    /// `Some(false)`: timed out; `None`: leadership lost.
    async fn wait_view(
        &self,
        node: &PeerAddr,
        pid: PartitionId,
        min_epoch: Epoch,
        ok: impl Fn(&keyway_peer::PartitionView) -> bool,
    ) -> Option<bool> {
        let deadline = Instant::now() + self.shared.config.retry();
        loop {
            if !self.leads() {
                return None;
            }
            let wait = deadline
                .saturating_duration_since(Instant::now())
                .min(VIEW_WAIT);
            let asked = Instant::now();
            match self
                .shared
                .peers
                .partition_view(node, pid, min_epoch, wait)
                .await
            {
                Ok(Some(view)) if ok(&view) => return Some(true),
                Ok(_) => {}
                Err(err) => tracing::debug!(migration = self.id(), %err, "partition view"),
            }
            if Instant::now() + VIEW_POLL >= deadline {
                return Some(false);
            }
            // The node answered before its wait ended without the view we
            // want: do not ask again at once.
            if asked.elapsed() < wait {
                tokio::time::sleep(VIEW_POLL).await;
            }
        }
    }

    /// Deletes the range at `node` chunk by chunk, pausing between chunks.
    /// `Ok(false)`: leadership lost on the way. Every call names this
    /// migration; the node refuses ([`PeerError::Refused`]) a range it owns
    /// or receives under another migration.
    async fn drop_range(&self, node: &PeerAddr) -> Result<bool, PeerError> {
        let (peers, range) = (self.shared.peers.clone(), self.range.clone());
        let rec = self.record();
        let m = MigrationRef {
            id: rec.id.0,
            partition: rec.partition_id(),
            epoch: rec.epoch(),
        };
        let chunk = self.shared.config.drop_chunk_entries;
        let pause = Duration::from_millis(self.shared.config.drop_pause_ms);
        loop {
            if !self.leads() {
                return Ok(false);
            }
            let deleted = self
                .call(|| peers.drop_range_chunk(node, &m, &range, chunk))
                .await?;
            if deleted == 0 {
                return Ok(true);
            }
            tokio::time::sleep(pause).await;
        }
    }

    /// Abort: stop the push, then delete the target's partial copy.
    /// `TargetDropped` when the copy is gone (or was never to be dropped);
    /// a failure at the target goes to the machine ([`Task::drop_failed`]).
    async fn drop_target_copy(&mut self) -> Step {
        let id = self.id();
        let (source_id, target_id) = (self.record().source(), self.record().target);
        let map = match self.shared.meta.get_map().await {
            Ok(map) => map,
            Err(err) => {
                let err = PeerError::Unavailable(format!("reading the map: {err}"));
                return self.drop_failed(Actor::Target, "map check", err);
            }
        };
        // Best effort: a source that cannot be reached ends the push itself
        // once it reads the ABORTED record (and a dead one lost it).
        if let Some(source) = self.address(&map, source_id) {
            let peers = self.shared.peers.clone();
            match self.call(|| peers.migrate_stop(&source, id)).await {
                Ok(()) | Err(PeerError::NotFound(_)) => {}
                Err(err) => {
                    tracing::warn!(migration = id, %err, "cannot stop the push at the source; it ends it itself");
                    self.addrs.remove(&source_id);
                }
            }
        }
        // Never delete a copy the target owns: only the map says who owns,
        // and after a split or merge another id may cover part of the range.
        if self.owns_part(&map, target_id) {
            tracing::error!(
                migration = id, partition = %self.record().partition_id(),
                "the target owns (part of) the range; not dropping its copy"
            );
            return Step::Report(Event::TargetDropped);
        }
        let Some(target) = self.address(&map, target_id) else {
            tracing::info!(migration = id, node = %target_id, "the target was decommissioned: its copy went with it");
            return Step::Report(Event::TargetDropped);
        };
        match self.drop_range(&target).await {
            Ok(true) => Step::Report(Event::TargetDropped),
            Ok(false) => Step::Halt,
            // Not a copy of ours (the target owns the range, or receives it
            // under a newer migration, whose copy start cleaned ours):
            // nothing left to revert, and retrying would never end.
            Err(PeerError::Refused { reason, detail }) => {
                tracing::error!(migration = id, partition = %self.record().partition_id(), ?reason, %detail,
                    "the target refuses to drop the range; its data there is not our copy");
                Step::Report(Event::TargetDropped)
            }
            Err(e) => self.drop_failed(Actor::Target, "DropRangeChunk", e),
        }
    }

    /// Cleanup: once the source installed the flipped map (it answers with
    /// a redirect, never "not found"), stop the push and drop the range.
    /// Also the later drop of a stray copy on an old source that is back.
    async fn drop_source_range(&mut self, moved_to: NodeId, epoch: Epoch) -> Step {
        let source_id = self.record().source();
        let map = match self.shared.meta.get_map().await {
            Ok(map) => map,
            Err(err) => {
                let err = PeerError::Unavailable(format!("reading the map: {err}"));
                return self.drop_failed(Actor::Source, "map check", err);
            }
        };
        if self.owns_part(&map, source_id) {
            // Moved back by a later migration, which cleaned the range first:
            // what is there now is the owner's data.
            tracing::warn!(
                migration = self.id(),
                "the old source owns (part of) the range again; nothing to drop"
            );
            return Step::Report(Event::SourceDropped);
        }
        let Some(source) = self.address(&map, source_id) else {
            tracing::info!(migration = self.id(), node = %source_id, "the old source was decommissioned: its copy went with it");
            return Step::Report(Event::SourceDropped);
        };
        let (pid, epoch) = self.moved_row(&map, moved_to, epoch);
        let installed = self
            .wait_view(&source, pid, epoch, |v| {
                v.owner != source_id && v.epoch >= epoch
            })
            .await;
        match installed {
            Some(true) => {}
            Some(false) => {
                let err = PeerError::Unavailable("it has not installed the flipped map".into());
                return self.drop_failed(Actor::Source, "PartitionView", err);
            }
            None => return Step::Halt,
        }
        let (peers, id) = (self.shared.peers.clone(), self.id());
        match self.call(|| peers.migrate_stop(&source, id)).await {
            Ok(()) | Err(PeerError::NotFound(_)) => {}
            Err(e) => return self.drop_failed(Actor::Source, "MigrateStop", e),
        }
        match self.drop_range(&source).await {
            Ok(true) => Step::Report(Event::SourceDropped),
            Ok(false) => Step::Halt,
            // The source owns (part of) the range again, or receives it
            // under another migration: what it holds there is live data, not
            // our leftover (a bug or a later move). Never drop it; the
            // cleanup has nothing left to do, and retrying would never end.
            Err(PeerError::Refused { reason, detail }) => {
                tracing::error!(migration = id, ?reason, %detail,
                    "the source refuses to drop the range; finishing without dropping");
                Step::Report(Event::SourceDropped)
            }
            Err(e) => self.drop_failed(Actor::Source, "DropRangeChunk", e),
        }
    }
}

#[derive(Clone, Copy)]
enum Toggle {
    Dual,
    Fence,
}
