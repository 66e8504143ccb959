//! [`Push`]: one migration's data stream from this node (the source) to the
//! target.
//!
//! Process overview:
//! 0. **Register at the target** (`MigrateReceive`): the target accepts
//!    foreign records only for a registered migration (id, partition, epoch
//!    e) of a partition it does not own (`receive.rs`); every write below
//!    names the migration and is refused otherwise, which fails the push
//!    (the migration aborts).
//! 1. **Clean the target** (only when copying): drop whatever an earlier,
//!    aborted attempt left of the range there, so the copy starts empty.
//! 2. **COPYING**: page through the range in chunks (each from its own
//!    short-lived engine snapshot; a long-open snapshot would pin old
//!    versions) and apply each chunk at the target as foreign `Put`s with the
//!    chunk's seq as version, fsynced. Throttled: at most
//!    `max_bytes_per_sec`, and backing off while the slowest recent reply on
//!    this node or the target took longer than `backoff_latency_us` (seed 003).
//! 3. **CATCHUP / DUAL**: replay this node's change log for the range after
//!    S (the snapshot seq), in order, applied at the target and fsynced;
//!    `acked_seq` advances to the last examined seq. This runs until the push
//!    is stopped: in `DUAL` it is what carries each new write to the target.
//! 4. **Dual writes**: a write in a dual-written partition hands its reply to
//!    [`Push::defer`]; the reply is released once `acked_seq` passes the
//!    write's seq, i.e. once the target has it durably. A reply that waits
//!    longer than `dual_ack_timeout` fails the push (the migration must then
//!    abort) and is released: the write is durable here, at the owner.
//!
//! The push holds this node's change log from `acked_seq + 1` on (a
//! [`crate::log_gc::HoldGuard`], advanced with `acked_seq`, released when the
//! push stops or fails), but once the checkpoint is taken at seq Y, from
//! Y + 1 on: the cutover's incremental digest reads the keys written after
//! Y from the log (`digest.rs`); if that hold would keep more than the node's
//! `log_retention_bytes`, the truncator fails the push with
//! [`crate::log_gc::RETENTION_EXCEEDED`].
//!
//! **Rolling checkpoint** (issue 15: the cutover's digest must not grow with
//! the time since the copy): every [`CHECKPOINT_REFRESH`] while it streams,
//! and once more right before the fence (the driver's `MigrateCheckpoint`,
//! `Migrations::checkpoint`, asks with [`Push::refresh_checkpoint_now`]),
//! but never while the partition is fenced, the push moves the checkpoint from Y
//! to Y2: the keys of the range written in `(Y, Y2]` are digested here at
//! one snapshot (seq Y2, [`keyway_storage::Engine::written_digests`]), the
//! stream is brought to exactly Y2 and holds there while the target digests
//! the same keys, and both sides' checkpoint digests are chained with their
//! parts. Sound for the reason the fence digest is (`digest.rs`): after Y
//! the target's copy changes only through the push's records, which carry
//! exactly the keys written after Y. A mismatch is kept in the chain (the
//! fence then aborts) and logged. The stream holds for one digest call of
//! the target (dual replies wait that long), so the fence's own digest only
//! covers what was written since the last refresh.
//!
//! Why the replay after S converges onto the snapshot is explained in
//! `crate::peer` (fuzzy snapshot plus replay from the first chunk's seq;
//! versions make every repeat harmless).

use super::{MigrationRef, RefusalReason};
use crate::copies::{Copies, CopyGuard, CopyKind, CopyReport};
use crate::executor::LatencyGauge;
use crate::metrics::Metrics;
use crate::peer::{PeerClient, PeerError, PushStatus, Throttle};
use bytes::Bytes;
use keyway_map::{Epoch, NodeId, PartitionId, PartitionRecord};
use keyway_resp::Frame;
use keyway_storage::{ChangeRecord, Engine, KeyRange, Mutation, RangeDigest, Seq, StorageError};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, oneshot, watch};

/// Entries per copy chunk at most.
const COPY_CHUNK_ENTRIES: usize = 4_000;
/// Change records examined per catch-up read at most.
const STREAM_BATCH_RECORDS: usize = 5_000;
/// Encoded change-record bytes per catch-up apply at most.
const STREAM_BATCH_BYTES: usize = 4 * 1024 * 1024;
/// Entries per target-cleaning call.
const CLEAN_CHUNK_ENTRIES: usize = 10_000;
/// How often an idle stream looks for records nobody announced.
const IDLE_POLL: Duration = Duration::from_millis(10);
/// Longest single back-off of the copy for foreground latency.
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// Back-offs in a row after which one chunk is copied anyway (progress).
const MAX_BACKOFFS_IN_A_ROW: u32 = 8;
/// How often a streaming push moves its checkpoint forward (see the
/// module docs, "Rolling checkpoint").
pub(crate) const CHECKPOINT_REFRESH: Duration = Duration::from_millis(100);

/// Limits of a push, from the node configuration.
#[derive(Clone, Copy, Debug)]
pub struct PushLimits {
    /// A dual write waiting longer than this for the target fails the push.
    pub dual_ack_timeout: Duration,
    /// A target failing every apply for this long fails the push.
    pub target_retry_timeout: Duration,
}

/// What the push was asked to do (see `MigrateStart` in `peer.proto`).
#[derive(Clone, Debug)]
pub struct PushPlan {
    pub id: u64,
    pub partition: PartitionId,
    /// e: the partition's epoch in the migration record.
    pub epoch: Epoch,
    pub range: KeyRange,
    pub copy: bool,
    pub after_seq: Seq,
    pub throttle: Throttle,
}

/// The range verified equal on both sides at one source seq (or found to
/// differ): taken right after the copy, it lets the fence-time digest read
/// only the keys written since (see [`crate::migrate::Migrations::fence_digests`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    /// Every source record of the range with seq <= this is in both digests.
    pub seq: Seq,
    pub source: RangeDigest,
    pub target: RangeDigest,
}

struct Waiter {
    seq: Seq,
    reply: oneshot::Sender<Frame>,
    frame: Frame,
    since: Instant,
}

/// The dual replies waiting for the target, and whether the push still
/// takes any: once it stopped or failed (`closed`), a reply handed to
/// [`Push::defer`] is sent at once. Both live under one lock, so a reply can
/// never be queued after the last release (it would never be answered, and
/// its client would see the connection's "shutting down" for an applied
/// write).
#[derive(Default)]
struct Waiters {
    queued: Vec<Waiter>,
    closed: bool,
}

/// The cost accounting of a push's copy (see `crate::copies`).
enum CopyCost {
    /// No copy (a catch-up-only push).
    None,
    /// Registered when the copy starts: the registry, the partition's row
    /// and the target node.
    Pending(Arc<Copies>, PartitionRecord, NodeId),
    Running(CopyGuard),
    Finished(CopyReport),
}

/// One running push; see the module docs.
pub struct Push {
    pub plan: PushPlan,
    target: PeerClient,
    engine: Arc<dyn Engine>,
    metrics: Arc<Metrics>,
    latency: Arc<LatencyGauge>,
    limits: PushLimits,
    copied_bytes: AtomicU64,
    copied_keys: AtomicU64,
    copy_done: AtomicBool,
    backoffs: AtomicU64,
    /// The target's recent foreground latency, from its last copy answer.
    target_latency_us: AtomicU64,
    acked: watch::Sender<Seq>,
    checkpoint: Mutex<Option<Checkpoint>>,
    /// Asked to move the checkpoint now (before a fence); the stream sends
    /// the checkpoint seq it reached on `refreshed`.
    refresh_asked: AtomicBool,
    refreshed: watch::Sender<Seq>,
    /// Whether the source has the partition fenced (the routing view's
    /// answer): nothing is written to the range until the fence lifts, and
    /// after a flip the target writes its own, so the checkpoint stays
    /// where the fence found it.
    fenced: Box<dyn Fn() -> bool + Send + Sync>,
    error: Mutex<Option<String>>,
    waiters: Mutex<Waiters>,
    wake: Notify,
    stopped: AtomicBool,
    pub(crate) dual: AtomicBool,
    /// This push's hold on the change log (see the module docs).
    hold: Mutex<Option<crate::log_gc::HoldGuard>>,
    /// The copy's bytes and duration.
    cost: Mutex<CopyCost>,
}

impl Push {
    /// `fenced` tells whether the source has the partition fenced now.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        plan: PushPlan,
        target: PeerClient,
        engine: Arc<dyn Engine>,
        metrics: Arc<Metrics>,
        latency: Arc<LatencyGauge>,
        limits: PushLimits,
        cost: Option<(Arc<Copies>, PartitionRecord, NodeId)>,
        fenced: Box<dyn Fn() -> bool + Send + Sync>,
    ) -> Arc<Push> {
        let after = plan.after_seq;
        let cost = match cost {
            Some((copies, row, target)) if plan.copy => CopyCost::Pending(copies, row, target),
            _ => CopyCost::None,
        };
        Arc::new(Push {
            cost: Mutex::new(cost),
            copy_done: AtomicBool::new(!plan.copy),
            plan,
            target,
            engine,
            metrics,
            latency,
            limits,
            copied_bytes: AtomicU64::new(0),
            copied_keys: AtomicU64::new(0),
            backoffs: AtomicU64::new(0),
            target_latency_us: AtomicU64::new(0),
            acked: watch::channel(after).0,
            checkpoint: Mutex::new(None),
            refresh_asked: AtomicBool::new(false),
            refreshed: watch::channel(0).0,
            fenced,
            error: Mutex::new(None),
            waiters: Mutex::new(Waiters::default()),
            wake: Notify::new(),
            stopped: AtomicBool::new(false),
            dual: AtomicBool::new(false),
            hold: Mutex::new(None),
        })
    }

    /// Holds the change log from `after_seq + 1` on for this push; the
    /// push fails if the truncator gives the hold up for retention.
    pub fn hold_log(
        self: &Arc<Self>,
        holds: &Arc<crate::log_gc::LogHolds>,
    ) -> Result<(), crate::log_gc::AlreadyTruncated> {
        let weak = Arc::downgrade(self);
        let guard = holds.hold(
            format!("migration {}", self.plan.id),
            self.acked_seq() + 1,
            Box::new(move |why| {
                if let Some(push) = weak.upgrade() {
                    push.fail(why.to_string());
                }
            }),
        )?;
        *self.hold.lock().unwrap_or_else(|e| e.into_inner()) = Some(guard);
        Ok(())
    }

    fn release_hold(&self) {
        let guard = self.hold.lock().unwrap_or_else(|e| e.into_inner()).take();
        drop(guard);
    }

    fn cost(&self) -> std::sync::MutexGuard<'_, CopyCost> {
        self.cost.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The copy's report (`None` without a copy, or before it started).
    pub fn copy_report(&self) -> Option<CopyReport> {
        match &*self.cost() {
            CopyCost::Running(g) => Some(g.report()),
            CopyCost::Finished(r) => Some(r.clone()),
            CopyCost::None | CopyCost::Pending(..) => None,
        }
    }

    /// Counts `sent` payload bytes acknowledged by the target, which
    /// reported `written` applied, while the copy runs.
    fn count(&self, sent: u64, written: u64) {
        if let CopyCost::Running(g) = &*self.cost() {
            g.shipped(sent, written);
        }
    }

    fn start_cost(&self) {
        let mut cost = self.cost();
        if let CopyCost::Pending(copies, row, target) = &*cost {
            let guard = copies.start(CopyKind::Migration, row, *target, self.plan.id);
            *cost = CopyCost::Running(guard);
        }
    }

    fn end_cost(&self, error: Option<String>) {
        let mut cost = self.cost();
        match std::mem::replace(&mut *cost, CopyCost::None) {
            CopyCost::Running(g) => match error {
                None => *cost = CopyCost::Finished(g.done()),
                Some(why) => *cost = CopyCost::Finished(g.failed(why)),
            },
            other => *cost = other,
        }
    }

    /// The progress report `MigrateStatus` answers with.
    pub fn status(&self, fenced: bool) -> PushStatus {
        let copy = self.copy_report();
        PushStatus {
            copy_bytes_sent: copy.as_ref().map_or(0, |c| c.bytes_sent),
            copy_bytes_written: copy.as_ref().map_or(0, |c| c.bytes_written),
            copy_duration_ms: copy.as_ref().map_or(0, |c| c.duration_ms),
            copy_started_at_ms: copy.as_ref().map_or(0, |c| c.started_at_ms),
            copied_bytes: self.copied_bytes.load(Ordering::Relaxed),
            copied_keys: self.copied_keys.load(Ordering::Relaxed),
            copy_done: self.copy_done.load(Ordering::Acquire),
            acked_seq: *self.acked.borrow(),
            head_seq: self.engine.last_seq(),
            dual: self.dual.load(Ordering::Acquire),
            fenced,
            error: self.error(),
            backoffs: self.backoffs.load(Ordering::Relaxed),
            checkpoint_seq: self.checkpoint().map(|c| c.seq).unwrap_or(0),
        }
    }

    /// The checkpoint, once taken.
    pub fn checkpoint(&self) -> Option<Checkpoint> {
        *self.checkpoint.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The migration every target write names.
    pub fn migration(&self) -> MigrationRef {
        MigrationRef {
            id: self.plan.id,
            partition: self.plan.partition,
            epoch: self.plan.epoch,
        }
    }

    /// The target's peer client.
    pub fn target(&self) -> &PeerClient {
        &self.target
    }

    pub fn error(&self) -> Option<String> {
        self.error.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Every record of the range with seq <= this is at the target.
    pub fn acked_seq(&self) -> Seq {
        *self.acked.borrow()
    }

    /// Takes over the released reply of a write with seq `seq`: sent once the
    /// target has the write, or at once if it already has it or the push
    /// stopped or failed. The reply is always the write's own: the write is
    /// durable here (the reply was released by this node's durability
    /// mode), and
    /// - before the flip this node owns the partition, so the write stands
    ///   whether or not the migration goes on (a stopped or failed push
    ///   means it aborts, back to this node);
    /// - a flip needs the fence, which waits until the target has every
    ///   write admitted before it (`acked_seq` past them), so after the flip
    ///   no reply is still waiting for the target.
    pub fn defer(&self, seq: Seq, reply: oneshot::Sender<Frame>, frame: Frame) {
        let mut waiters = self.waiters.lock().unwrap_or_else(|e| e.into_inner());
        // Checked under the lock `stop`/`fail` close it with: a reply is
        // either queued before the last release or sent here.
        if waiters.closed || self.acked_seq() >= seq {
            drop(waiters);
            let _ = reply.send(frame);
            return;
        }
        waiters.queued.push(Waiter {
            seq,
            reply,
            frame,
            since: Instant::now(),
        });
        drop(waiters);
        self.wake.notify_one();
        // The stream may have advanced between the check and the push.
        self.release_acked(self.acked_seq());
    }

    /// Waits until the target has every record up to `seq`; `Err` if the push
    /// failed or `timeout` passed first.
    pub async fn wait_acked(&self, seq: Seq, timeout: Duration) -> Result<(), String> {
        let mut rx = self.acked.subscribe();
        self.wake.notify_one();
        let wait = async {
            loop {
                if let Some(e) = self.error() {
                    return Err(e);
                }
                if *rx.borrow_and_update() >= seq {
                    return Ok(());
                }
                // The stream also wakes this on failure (it bumps `acked`).
                if rx.changed().await.is_err() {
                    return Err("push ended".to_string());
                }
            }
        };
        match tokio::time::timeout(timeout, wait).await {
            Ok(r) => r,
            Err(_) => Err(format!(
                "the target did not acknowledge seq {seq} within {} ms",
                timeout.as_millis()
            )),
        }
    }

    /// Ends the push; pending dual replies are released, and any deferred
    /// later is sent at once (see [`Self::defer`]: the writes are durable here).
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        self.wake.notify_one();
        self.release_all();
        self.release_hold();
    }

    fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// Marks the push failed for good and releases every waiting reply.
    /// The first failure is the one reported.
    fn fail(&self, why: String) {
        {
            let mut error = self.error.lock().unwrap_or_else(|e| e.into_inner());
            if error.is_some() {
                return;
            }
            tracing::warn!(migration = self.plan.id, %why, "migration push failed");
            *error = Some(why);
        }
        self.release_all();
        self.release_hold();
        self.wake.notify_one();
        self.acked.send_modify(|_| {});
    }

    /// Closes the queue (every later `defer` sends at once) and sends every
    /// queued reply.
    fn release_all(&self) {
        let queued = {
            let mut waiters = self.waiters.lock().unwrap_or_else(|e| e.into_inner());
            waiters.closed = true;
            std::mem::take(&mut waiters.queued)
        };
        for w in queued {
            let _ = w.reply.send(w.frame);
        }
    }

    fn release_acked(&self, acked: Seq) {
        let ready: Vec<Waiter> = {
            let mut waiters = self.waiters.lock().unwrap_or_else(|e| e.into_inner());
            let (ready, wait) = std::mem::take(&mut waiters.queued)
                .into_iter()
                .partition(|w| w.seq <= acked);
            waiters.queued = wait;
            ready
        };
        for w in ready {
            self.metrics
                .migration_dual_wait_seconds
                .observe(w.since.elapsed().as_secs_f64());
            let _ = w.reply.send(w.frame);
        }
    }

    /// The oldest dual reply has waited too long: the target is not keeping up.
    fn dual_overdue(&self) -> bool {
        self.waiters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .queued
            .iter()
            .any(|w| w.since.elapsed() > self.limits.dual_ack_timeout)
    }

    /// The push's task: copy (if asked), then stream until stopped.
    pub async fn run(self: Arc<Self>) {
        let m = self.migration();
        if let Err(e) = self.retry(|| self.target.migrate_receive(&m, true)).await {
            return self.fail(e);
        }
        if self.plan.copy {
            self.start_cost();
            let copied = match self.copy().await {
                Ok(()) => self.take_checkpoint().await,
                Err(e) => Err(e),
            };
            if let Err(e) = copied {
                self.end_cost(Some(e.clone()));
                return self.fail(e);
            }
            // Before `copy_done`: a status showing it done shows the final cost.
            self.end_cost(None);
            self.copy_done.store(true, Ordering::Release);
        }
        if let Err(e) = self.stream().await {
            self.fail(e);
        }
    }

    /// Copies the snapshot: reading the next chunk here overlaps applying
    /// the previous one at the target. Chunks are applied without an fsync
    /// each; one fsync at the end makes the whole copy durable before the
    /// checkpoint (a target that crashed meanwhile shows up there as a
    /// digest mismatch, and the migration aborts).
    async fn copy(&self) -> Result<(), String> {
        self.clean_target().await?;
        let started = Instant::now();
        let mut in_a_row = 0u32;
        let mut chunk = self.read_copy_chunk(None).await?;
        loop {
            if self.stopped() {
                return Err("stopped".into());
            }
            if let Some(e) = self.error() {
                return Err(e);
            }
            if let Some(pause) = self.backoff(&mut in_a_row) {
                tokio::time::sleep(pause).await;
                continue;
            }
            let next = chunk.next.clone();
            let (applied, read) = tokio::join!(self.apply_copy(&chunk.records), async {
                match next {
                    Some(after) => Some(self.read_copy_chunk(Some(after)).await),
                    None => None,
                }
            });
            self.count(chunk.bytes, applied?);
            let total = self.copied_bytes.fetch_add(chunk.bytes, Ordering::Relaxed) + chunk.bytes;
            self.copied_keys
                .fetch_add(chunk.records.len() as u64, Ordering::Relaxed);
            self.metrics.migration_copied_bytes.inc_by(chunk.bytes);
            chunk = match read {
                Some(next) => next?,
                None => break,
            };
            if let Some(wait) = rate_wait(&self.plan.throttle, total, started.elapsed()) {
                tokio::time::sleep(wait).await;
            }
        }
        // The one fsync of the copy.
        let m = self.migration();
        self.retry(|| self.target.apply_foreign_for(&m, &[], true))
            .await
            .map(|_| ())
    }

    async fn read_copy_chunk(&self, after: Option<Bytes>) -> Result<CopyChunk, String> {
        let engine = self.engine.clone();
        let range = self.plan.range.clone();
        let max_bytes = chunk_bytes(&self.plan.throttle);
        blocking(move || read_chunk(&*engine, &range, after, max_bytes)).await
    }

    /// Applies one copy chunk at the target; the bytes it applied.
    async fn apply_copy(&self, records: &[ChangeRecord]) -> Result<u64, String> {
        if records.is_empty() {
            return Ok(0);
        }
        let m = self.migration();
        let applied = self
            .retry(|| self.target.apply_foreign_for(&m, records, false))
            .await?;
        self.target_latency_us
            .store(applied.recent_latency_us, Ordering::Relaxed);
        Ok(applied.bytes_written)
    }

    /// How long to back off before the next chunk, if at all.
    fn backoff(&self, in_a_row: &mut u32) -> Option<Duration> {
        let limit = self.plan.throttle.backoff_latency_us;
        // Both sides' tail: the copy loads the source's reads and the
        // target's writes.
        let recent = self
            .latency
            .recent_max_micros()
            .max(self.target_latency_us.load(Ordering::Relaxed));
        if limit == 0 || recent <= limit || *in_a_row >= MAX_BACKOFFS_IN_A_ROW {
            *in_a_row = 0;
            return None;
        }
        *in_a_row += 1;
        self.backoffs.fetch_add(1, Ordering::Relaxed);
        self.metrics.migration_backoffs.inc();
        Some((Duration::from_millis(10) * 2u32.pow(*in_a_row)).min(MAX_BACKOFF))
    }

    async fn clean_target(&self) -> Result<(), String> {
        let m = self.migration();
        loop {
            let deleted = self
                .retry(|| {
                    self.target
                        .drop_range_chunk_for(&m, &self.plan.range, CLEAN_CHUNK_ENTRIES)
                })
                .await?;
            if deleted == 0 {
                return Ok(());
            }
        }
    }

    /// Digests the range here at one snapshot (seq Y), streams exactly the
    /// records up to Y, then digests the target, whose range changes only
    /// through this push: both digests describe the range at Y. Runs before
    /// dual writing, so pausing the stream for the target's scan holds up no
    /// client. A mismatch is kept and reported at the fence (the migration
    /// then aborts on it).
    async fn take_checkpoint(&self) -> Result<(), String> {
        let engine = self.engine.clone();
        let range = self.plan.range.clone();
        let (source, seq) = blocking(move || engine.digest(&range)).await?;
        while self.acked_seq() < seq {
            if self.stopped() {
                return Err("stopped".into());
            }
            self.step(seq).await?;
        }
        let (target, _) = self.retry(|| self.target.digest(&self.plan.range)).await?;
        if source != target {
            tracing::warn!(
                migration = self.plan.id,
                seq,
                ?source,
                ?target,
                "checkpoint digests differ"
            );
        }
        *self.checkpoint.lock().unwrap_or_else(|e| e.into_inner()) = Some(Checkpoint {
            seq,
            source,
            target,
        });
        Ok(())
    }

    async fn stream(&self) -> Result<(), String> {
        let mut refreshed_at = Instant::now();
        loop {
            if self.stopped() {
                return Ok(());
            }
            if let Some(e) = self.error() {
                return Err(e);
            }
            if self.dual_overdue() {
                return Err(format!(
                    "a dual write waited more than {} ms for the target",
                    self.limits.dual_ack_timeout.as_millis()
                ));
            }
            let asked = self.refresh_asked.swap(false, Ordering::AcqRel);
            if (asked || refreshed_at.elapsed() >= CHECKPOINT_REFRESH) && !(self.fenced)() {
                self.refresh_checkpoint().await?;
                refreshed_at = Instant::now();
                continue;
            }
            if self.acked_seq() >= self.engine.last_seq() {
                let _ = tokio::time::timeout(IDLE_POLL, self.wake.notified()).await;
                continue;
            }
            self.step(Seq::MAX).await?;
        }
    }

    /// Moves the checkpoint to the source's seq now (see the module docs,
    /// "Rolling checkpoint"); a no-op without a checkpoint or without
    /// records since it. Runs on the stream's task only.
    async fn refresh_checkpoint(&self) -> Result<(), String> {
        // Without a checkpoint (a catch-up-only push) nobody waits for one.
        let Some(cp) = self.checkpoint() else {
            return Ok(());
        };
        if self.engine.last_seq() <= cp.seq {
            self.refreshed.send_replace(cp.seq);
            return Ok(());
        }
        let engine = self.engine.clone();
        let range = self.plan.range.clone();
        let written = blocking(move || {
            engine.written_digests(&range, cp.seq, super::digest::KEYS_PER_DIGEST)
        })
        .await?;
        while self.acked_seq() < written.seq {
            if self.stopped() {
                return Err("stopped".into());
            }
            self.step(written.seq).await?;
        }
        // The target now holds exactly the records up to `written.seq`, and
        // nothing else reaches it until this returns.
        let mut target_parts = Vec::with_capacity(written.parts.len());
        for chunk in written.keys.chunks(super::digest::KEYS_PER_DIGEST) {
            let d = self
                .retry(|| self.target.keys_digest(chunk))
                .await
                .map_err(|e| format!("checkpoint refresh: {e}"))?;
            target_parts.push(d);
        }
        let next = Checkpoint {
            seq: written.seq,
            source: super::digest::chain(&cp.source, &written.parts),
            target: super::digest::chain(&cp.target, &target_parts),
        };
        if written.parts != target_parts && cp.source == cp.target {
            tracing::warn!(
                migration = self.plan.id,
                from = cp.seq,
                to = written.seq,
                keys = written.keys.len(),
                "checkpoint refresh: digests of the keys written since differ"
            );
        }
        *self.checkpoint.lock().unwrap_or_else(|e| e.into_inner()) = Some(next);
        self.metrics.migration_checkpoint_refreshes.inc();
        if let Some(hold) = &*self.hold.lock().unwrap_or_else(|e| e.into_inner()) {
            hold.advance(hold_from(self.acked_seq(), Some(next.seq)));
        }
        self.refreshed.send_replace(next.seq);
        Ok(())
    }

    /// Asks the stream to move the checkpoint now and waits (at most
    /// `timeout`) until it did: called before a fence, so the fence's own
    /// digest covers only what was written since. `false` if it did not
    /// happen in time (the fence digest then covers more; nothing else
    /// changes).
    pub async fn refresh_checkpoint_now(&self, timeout: Duration) -> bool {
        let mut rx = self.refreshed.subscribe();
        let target = self.engine.last_seq();
        if self.checkpoint().is_none_or(|cp| cp.seq >= target) {
            return true;
        }
        if (self.fenced)() {
            return false;
        }
        self.refresh_asked.store(true, Ordering::Release);
        self.wake.notify_one();
        let wait = async {
            loop {
                if *rx.borrow_and_update() >= target {
                    return true;
                }
                if self.error().is_some() || rx.changed().await.is_err() {
                    return false;
                }
            }
        };
        tokio::time::timeout(timeout, wait).await.unwrap_or(false)
    }

    /// Forwards one batch of the range's records after `acked_seq`, none
    /// after `upto`, and advances `acked_seq`.
    async fn step(&self, upto: Seq) -> Result<(), String> {
        let acked = self.acked_seq();
        let engine = self.engine.clone();
        let range = self.plan.range.clone();
        let (records, examined) =
            blocking(move || read_changes(&*engine, &range, acked, upto)).await?;
        if !records.is_empty() {
            self.apply(&records).await?;
            self.metrics
                .migration_forwarded_records
                .inc_by(records.len() as u64);
        }
        self.acked.send_replace(examined);
        if let Some(hold) = &*self.hold.lock().unwrap_or_else(|e| e.into_inner()) {
            hold.advance(hold_from(examined, self.checkpoint().map(|cp| cp.seq)));
        }
        self.release_acked(examined);
        Ok(())
    }

    /// Applies `records` at the target, fsynced, retrying transient failures.
    /// (While the copy runs, i.e. up to the checkpoint, counted as its cost.)
    async fn apply(&self, records: &[ChangeRecord]) -> Result<(), String> {
        let m = self.migration();
        let applied = self
            .retry(|| self.target.apply_foreign_for(&m, records, true))
            .await?;
        self.count(crate::copies::payload_bytes(records), applied.bytes_written);
        Ok(())
    }

    /// Retries `call` while it fails as unavailable, for at most
    /// `target_retry_timeout`; other errors fail at once, except that a
    /// target that no longer knows the migration (it restarted: the
    /// registration is volatile) is registered again, once per call, through
    /// the same checks as the first time (it must still not own the
    /// partition, at the same epoch, with no newer migration of it).
    async fn retry<T, F, Fut>(&self, mut call: F) -> Result<T, String>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, PeerError>>,
    {
        let started = Instant::now();
        let mut pause = Duration::from_millis(20);
        // Registering again: not yet / due / done (only once per call).
        let (mut register, mut registered_again) = (false, false);
        loop {
            let result = match register {
                true => match self.target.migrate_receive(&self.migration(), true).await {
                    Ok(()) => {
                        (register, registered_again) = (false, true);
                        continue;
                    }
                    Err(e) => Err(e),
                },
                false => call().await,
            };
            match result {
                Ok(v) => return Ok(v),
                Err(PeerError::Refused {
                    reason: RefusalReason::NotReceiving,
                    detail,
                }) if !registered_again && !self.stopped() => {
                    tracing::info!(migration = self.plan.id, %detail, "target lost the migration; registering again");
                    register = true;
                }
                Err(PeerError::Unavailable(e))
                    if started.elapsed() < self.limits.target_retry_timeout
                        && !self.stopped()
                        && !self.dual_overdue() =>
                {
                    tracing::debug!(migration = self.plan.id, %e, "target unavailable; retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
                Err(e) => return Err(format!("target {}: {e}", self.target.addr())),
            }
        }
    }
}

/// Payload bytes per copy chunk.
pub(crate) fn chunk_bytes(t: &Throttle) -> u64 {
    match t.chunk_bytes {
        0 => Throttle::default().chunk_bytes,
        n => n.min(crate::peer::MAX_CHUNK_BYTES),
    }
}

/// How long to wait so that `copied` bytes after `elapsed` stay under the cap.
pub(crate) fn rate_wait(t: &Throttle, copied: u64, elapsed: Duration) -> Option<Duration> {
    if t.max_bytes_per_sec == 0 {
        return None;
    }
    let due = Duration::from_secs_f64(copied as f64 / t.max_bytes_per_sec as f64);
    due.checked_sub(elapsed).filter(|d| !d.is_zero())
}

pub(crate) struct CopyChunk {
    pub(crate) records: Vec<ChangeRecord>,
    pub(crate) next: Option<Bytes>,
    pub(crate) bytes: u64,
}

/// One copy chunk: foreign `Put`s versioned with the seq of the engine
/// snapshot they were read from (`as_of`, see `crate::peer`).
pub(crate) fn read_chunk(
    engine: &dyn Engine,
    range: &KeyRange,
    after: Option<Bytes>,
    max_bytes: u64,
) -> Result<CopyChunk, StorageError> {
    let chunk = engine.scan(range, after.as_deref(), COPY_CHUNK_ENTRIES)?;
    let mut records = Vec::with_capacity(chunk.entries.len());
    let mut bytes = 0u64;
    let mut next = chunk.next;
    for (key, value) in chunk.entries {
        let size = (key.len() + value.data.len()) as u64;
        if !records.is_empty() && bytes + size > max_bytes {
            // Resume after the last key taken.
            next = records
                .last()
                .map(|r: &ChangeRecord| r.mutation.key().clone());
            break;
        }
        bytes += size;
        records.push(ChangeRecord {
            batch_continues: false,
            seq: chunk.seq,
            mutation: Mutation::Put {
                key,
                kind: value.kind,
                expire_at_ms: value.expire_at_ms,
                data: value.data,
            },
        });
    }
    Ok(CopyChunk {
        records,
        next,
        bytes,
    })
}

/// This node's change records for `range` after `after` and up to `upto`
/// (one bounded read), and the last seq examined.
fn read_changes(
    engine: &dyn Engine,
    range: &KeyRange,
    after: Seq,
    upto: Seq,
) -> Result<(Vec<ChangeRecord>, Seq), StorageError> {
    let all = engine.changes_since(after, STREAM_BATCH_RECORDS)?;
    let mut examined = after;
    let mut bytes = 0usize;
    let mut out = Vec::new();
    for r in all {
        if r.seq > upto {
            break;
        }
        if range.contains(r.mutation.key()) {
            let size = r.mutation.key().len() + mutation_data_len(&r.mutation);
            if !out.is_empty() && bytes + size > STREAM_BATCH_BYTES {
                break;
            }
            bytes += size;
            out.push(r.clone());
        }
        examined = r.seq;
    }
    Ok((out, examined))
}

fn mutation_data_len(m: &Mutation) -> usize {
    match m {
        Mutation::Put { data, .. } => data.len(),
        _ => 0,
    }
}

pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StorageError> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| format!("engine task failed: {e}"))?
        .map_err(|e| format!("source storage: {e}"))
}

/// The first seq the push's log hold keeps once `examined` is at the
/// target: the next record, but never past the records after the
/// checkpoint, which the cutover's incremental digest reads from the log
/// (`digest::fence_digests`) until the push stops.
fn hold_from(examined: Seq, checkpoint: Option<Seq>) -> Seq {
    match checkpoint {
        Some(cp) => (examined + 1).min(cp + 1),
        None => examined + 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A push to a target nobody listens on (nothing here runs it).
    fn idle_push() -> Arc<Push> {
        let plan = PushPlan {
            id: 1,
            partition: PartitionId(1),
            epoch: Epoch(1),
            range: KeyRange::prefix(Bytes::from_static(b"m/")),
            copy: false,
            after_seq: 0,
            throttle: Throttle::default(),
        };
        Push::new(
            plan,
            PeerClient::connect("127.0.0.1:9").unwrap(),
            Arc::new(keyway_storage::MemEngine::new()),
            Arc::new(Metrics::new()),
            Arc::new(LatencyGauge::default()),
            PushLimits {
                dual_ack_timeout: Duration::from_secs(60),
                target_retry_timeout: Duration::from_secs(60),
            },
            None,
            Box::new(|| false),
        )
    }

    fn reply(text: &str) -> Frame {
        Frame::Simple(text.into())
    }

    /// The ordering of the race: the storage thread took the push under the
    /// routing guard and applied the write, the migration was stopped, and
    /// only then (after the fsync) the write's reply reaches `defer`. The
    /// write is durable at the owner: its client gets its reply, at once.
    #[test]
    fn the_log_hold_stops_at_the_checkpoint_the_cutover_digest_reads_from() {
        assert_eq!(hold_from(10, None), 11);
        assert_eq!(hold_from(10, Some(20)), 11);
        assert_eq!(hold_from(30, Some(20)), 21);
    }

    #[tokio::test]
    async fn a_reply_deferred_after_stop_gets_the_writes_reply() {
        let push = idle_push();
        push.stop();
        let (tx, mut rx) = oneshot::channel();
        push.defer(5, tx, reply("OK"));
        assert_eq!(rx.try_recv(), Ok(reply("OK")));
    }

    #[tokio::test]
    async fn a_reply_deferred_after_a_failure_gets_the_writes_reply() {
        let push = idle_push();
        push.fail("the target is gone".into());
        let (tx, mut rx) = oneshot::channel();
        push.defer(5, tx, reply("OK"));
        assert_eq!(rx.try_recv(), Ok(reply("OK")));
    }

    /// Queued replies wait for the target, then are all answered by stop.
    #[tokio::test]
    async fn replies_queued_before_stop_are_answered_by_stop() {
        let push = idle_push();
        let (tx, mut rx) = oneshot::channel();
        push.defer(5, tx, reply("first"));
        let (tx2, mut rx2) = oneshot::channel();
        push.defer(6, tx2, Frame::Integer(2));
        assert!(rx.try_recv().is_err(), "the target does not have seq 5 yet");
        push.release_acked(5);
        assert_eq!(rx.try_recv(), Ok(reply("first")));
        assert!(rx2.try_recv().is_err());
        push.stop();
        assert_eq!(rx2.try_recv(), Ok(Frame::Integer(2)));
    }

    #[test]
    fn the_rate_cap_paces_the_copy() {
        let t = Throttle {
            max_bytes_per_sec: 1_000,
            backoff_latency_us: 0,
            chunk_bytes: 0,
        };
        assert_eq!(
            rate_wait(&t, 500, Duration::from_millis(100)),
            Some(Duration::from_millis(400))
        );
        assert_eq!(rate_wait(&t, 500, Duration::from_millis(600)), None);
        let unlimited = Throttle {
            max_bytes_per_sec: 0,
            ..t
        };
        assert_eq!(rate_wait(&unlimited, u64::MAX, Duration::ZERO), None);
    }
}
