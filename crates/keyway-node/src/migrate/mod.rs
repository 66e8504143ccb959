//! This node's part in live migrations: the source role.
//!
//! The manager drives each migration (`keyway-manager`, over the
//! `keyway-migration` state machine) and asks the source, through the `Peer`
//! service's `Migrate*` calls, to:
//! - **start** a [`Push`] (copy the snapshot, then stream the change log to
//!   the target, see `push.rs`);
//! - turn **dual** writing on: the partition's writes are acknowledged only
//!   once the target has them ([`crate::routing::RoutingGuard::dual`]);
//! - **fence** the partition: requests for it are held (parked on their
//!   storage thread, see `crate::executor`) — never refused, never `ASK` or
//!   `TRYAGAIN` — until the flip moves the partition away (they then get
//!   `-MOVED`) or the fence lifts (they run);
//! - **stop**.
//!
//! The target's role is small (`receive.rs`): the push registers the
//! migration there before its first write (`MigrateReceive`), the target
//! accepts `ApplyForeign` only for a registered migration of a partition it
//! does not own, and starts serving when its map says it owns the partition
//! (which ends the registration).
//!
//! All of this is volatile. A source that restarts forgets its pushes (the
//! manager sees `NOT_FOUND` and aborts), but a fence must outlive a crash: if
//! the source restarted during `CUTOVER` and served the range again, a flip
//! that commits afterwards would lose those writes. So at start a node reads
//! the migration records and fences every partition it is the source of in a
//! `CUTOVER` record ([`recover_fences`]), until the record leaves `CUTOVER`.

mod digest;
pub(crate) mod push;
pub(crate) mod receive;

pub use digest::{KEYS_PER_DIGEST, keys_digest};
pub use push::{Push, PushLimits, PushPlan};
pub use receive::{MigrationRef, Receiving, Refusal, RefusalReason};

use crate::executor::LatencyGauge;
use crate::metrics::Metrics;
use crate::peer::{PeerClient, PushSpec, PushStatus};
use crate::routing::Routing;
use keyway_map::PartitionId;
use keyway_meta::MetaStore;
use keyway_migration::{MigrationRecord, MigrationState};
use keyway_storage::{Engine, Seq};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a `MigrateCheckpoint` waits for the checkpoint to move to the
/// present (`Migrations::checkpoint`).
const CHECKPOINT_WAIT: Duration = Duration::from_secs(1);

/// Why a role call failed.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum RoleError {
    /// This node has no push for the id (it restarted, or it was stopped).
    #[error("no migration {0} on this node")]
    Unknown(u64),
    /// The call does not fit this node's state (e.g. it does not own the partition).
    #[error("{0}")]
    Refused(String),
    /// The push failed or the target did not keep up in time.
    #[error("{0}")]
    Failed(String),
}

/// Limits of the source role, from the node configuration.
#[derive(Clone, Copy, Debug)]
pub struct RoleLimits {
    pub push: PushLimits,
    /// How long a fence waits for the target to hold every accepted write.
    pub fence_drain_timeout: Duration,
    /// How long the target holds the partition's requests after the fence.
    pub incoming_hold: Duration,
    /// How long `MigrateCheckpoint` (asked right before the fence) waits
    /// for the target to acknowledge every write so far.
    pub fence_catch_up: Duration,
}

/// The migrations this node is the source of.
/// The replication side's part in a cutover (invariant 11): a flip takes
/// every replica out of the in-sync set without waiting for the read
/// leases this node granted them, so before fencing, the source stops
/// granting them for the partition and waits until the last one ended.
/// Otherwise a replica cut off from the flip could serve a read the new
/// owner's writes have made stale.
pub trait ReadLeaseGate: Send + Sync {
    /// Stops vouching read leases for `partition`; returns when the last
    /// one granted ends (`None`: no replica holds one).
    fn stop_read_leases(&self, partition: PartitionId) -> Option<Instant>;
}

pub struct Migrations {
    /// Set once by the replication side (it is built after this).
    read_lease_gate: std::sync::OnceLock<std::sync::Weak<dyn ReadLeaseGate>>,
    engine: Arc<dyn Engine>,
    routing: Arc<Routing>,
    metrics: Arc<Metrics>,
    latency: Arc<LatencyGauge>,
    limits: RoleLimits,
    /// The change-log holds each push registers (see `crate::log_gc`).
    holds: Arc<crate::log_gc::LogHolds>,
    pushes: Mutex<BTreeMap<u64, Arc<Push>>>,
    /// Where each push's copy is accounted (`crate::copies`).
    copies: Arc<crate::copies::Copies>,
    /// Fences set at start from `CUTOVER` records (migration id → partition).
    recovered: Mutex<BTreeMap<u64, PartitionId>>,
}

impl Migrations {
    pub fn new(
        engine: Arc<dyn Engine>,
        routing: Arc<Routing>,
        metrics: Arc<Metrics>,
        latency: Arc<LatencyGauge>,
        limits: RoleLimits,
        holds: Arc<crate::log_gc::LogHolds>,
        copies: Arc<crate::copies::Copies>,
    ) -> Self {
        Migrations {
            read_lease_gate: std::sync::OnceLock::new(),
            copies,
            engine,
            routing,
            metrics,
            latency,
            limits,
            holds,
            pushes: Mutex::new(BTreeMap::new()),
            recovered: Mutex::new(BTreeMap::new()),
        }
    }

    /// The partitions this node runs a push for (it is their source).
    pub fn pushing_partitions(&self) -> std::collections::BTreeSet<PartitionId> {
        self.pushes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|p| p.plan.partition)
            .collect()
    }

    /// The node's change-log holds.
    pub fn holds(&self) -> &Arc<crate::log_gc::LogHolds> {
        &self.holds
    }

    fn push(&self, id: u64) -> Result<Arc<Push>, RoleError> {
        self.pushes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .cloned()
            .ok_or(RoleError::Unknown(id))
    }

    /// Starts push `spec.id` (a repeat for a running id only reports).
    pub fn start(&self, spec: PushSpec) -> Result<PushStatus, RoleError> {
        if let Ok(push) = self.push(spec.id) {
            return Ok(self.status_of(&push));
        }
        let map = self.routing.map();
        let me = self.routing.node_id();
        let row = map
            .partitions
            .get(&spec.partition)
            .filter(|p| p.owner == me && p.epoch == spec.epoch);
        let Some(row) = row.cloned() else {
            return Err(RoleError::Refused(format!(
                "this node does not own partition {} at epoch {} (map version {})",
                spec.partition, spec.epoch, map.version
            )));
        };
        let target_node = map
            .nodes
            .values()
            .find(|n| n.admin_addr == spec.target)
            .map_or(keyway_map::NodeId(0), |n| n.id);
        let target = PeerClient::connect(&spec.target)
            .map_err(|e| RoleError::Refused(format!("target address: {e}")))?;
        let plan = PushPlan {
            id: spec.id,
            partition: spec.partition,
            epoch: spec.epoch,
            range: spec.range,
            copy: spec.copy,
            after_seq: spec.after_seq,
            throttle: spec.throttle,
        };
        let push = Push::new(
            plan,
            target,
            self.engine.clone(),
            self.metrics.clone(),
            self.latency.clone(),
            self.limits.push,
            Some((self.copies.clone(), row, target_node)),
            {
                let (routing, pid) = (self.routing.clone(), spec.partition);
                Box::new(move || routing.is_fenced(pid))
            },
        );
        let mut pushes = self.pushes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(running) = pushes.get(&spec.id) {
            return Ok(self.status_of(running));
        }
        // The records after `after_seq` must still be there, and stay.
        push.hold_log(&self.holds).map_err(|e| {
            RoleError::Refused(format!("migration {}: cannot catch up: {e}", spec.id))
        })?;
        tokio::spawn(push.clone().run());
        pushes.insert(spec.id, push.clone());
        self.metrics.migration_pushes.set(pushes.len() as i64);
        drop(pushes);
        tracing::info!(migration = spec.id, partition = %spec.partition, target = %spec.target,
            copy = spec.copy, after_seq = spec.after_seq, "migration push started");
        Ok(self.status_of(&push))
    }

    /// Progress of push `id`.
    pub fn status(&self, id: u64) -> Result<PushStatus, RoleError> {
        let push = self.push(id)?;
        let status = self.status_of(&push);
        self.metrics
            .migration_lag_records
            .set(status.head_seq.saturating_sub(status.acked_seq) as i64);
        Ok(status)
    }

    fn status_of(&self, push: &Push) -> PushStatus {
        push.status(self.routing.is_fenced(push.plan.partition))
    }

    /// Dual writing on or off; returns the seq after which every write of
    /// the partition is dual-written.
    pub fn dual(&self, id: u64, on: bool) -> Result<Seq, RoleError> {
        let push = match (self.push(id), on) {
            (Ok(push), _) => push,
            (Err(_), false) => return Ok(self.engine.last_seq()),
            (Err(e), true) => return Err(e),
        };
        if let Some(e) = push.error() {
            return Err(RoleError::Failed(e));
        }
        let engine = self.engine.clone();
        let pid = push.plan.partition;
        push.dual.store(on, std::sync::atomic::Ordering::Release);
        let at = self
            .routing
            .set_dual(pid, on.then(|| push.clone()), || engine.last_seq());
        tracing::info!(migration = id, partition = %pid, on, at_seq = at, "dual writing");
        Ok(at)
    }

    /// Connects the replication side's read-lease rules (once).
    pub fn set_read_lease_gate(&self, gate: std::sync::Weak<dyn ReadLeaseGate>) {
        let _ = self.read_lease_gate.set(gate);
    }

    /// Fence on: hold the partition's requests, drain in-flight writes, and
    /// answer once the target has every write accepted (the seq then).
    /// Fence off: held requests run again. Off also lifts a fence recovered
    /// at start for `id`.
    pub async fn fence(&self, id: u64, on: bool) -> Result<Seq, RoleError> {
        if on {
            return self.fence_on(id, false).await.map(|(seq, _)| seq);
        }
        if let Some(pid) = self.take_recovered(id) {
            self.routing.set_fenced(pid, false);
        }
        if let Ok(push) = self.push(id) {
            self.routing.set_fenced(push.plan.partition, false);
            Self::lift_incoming(&push);
        }
        Ok(self.engine.last_seq())
    }

    /// Fence on; `with_digests` also takes both sides' digests at the fence
    /// (what [`Self::fence_digests`] answers), so the driver's
    /// `MigrateDigest` round trip leaves the write pause.
    pub async fn fence_on(
        &self,
        id: u64,
        with_digests: bool,
    ) -> Result<(Seq, Option<crate::peer::FenceDigests>), RoleError> {
        let push = self.push(id)?;
        if let Some(e) = push.error() {
            return Err(RoleError::Failed(e));
        }
        let pid = push.plan.partition;
        let mut clock = StepClock::new(&self.metrics);
        // Read leases first (see `ReadLeaseGate`), before the fence, so the
        // wait does not add to the write pause.
        let gate = self
            .read_lease_gate
            .get()
            .and_then(std::sync::Weak::upgrade);
        if let Some(until) = gate.and_then(|g| g.stop_read_leases(pid)) {
            tokio::time::sleep_until(until.into()).await;
        }
        let lease_wait_ms = clock.step("lease_wait");
        // The target holds the partition's requests until it has the flip,
        // so a client this node redirects after the flip is not sent back.
        // Asked for first and awaited last: its round trip overlaps the
        // fence's other steps instead of adding to the write pause. Set a
        // moment before the fence, it holds nothing a client should get:
        // until the flip the target does not serve the partition anyway.
        let epoch = self
            .routing
            .map()
            .partitions
            .get(&pid)
            .map(|p| p.epoch)
            .ok_or_else(|| RoleError::Refused(format!("partition {pid} left the map")))?;
        let hold =
            timed(
                push.target()
                    .migrate_incoming(pid, epoch, true, self.limits.incoming_hold),
            );
        let fence = async {
            // Taking the fence waits for every request admitted before it:
            // their writes are in the engine, at or below `head`.
            self.routing.set_fenced(pid, true);
            let head = self.engine.last_seq();
            let drain_ms = clock.step("drain");
            push.wait_acked(head, self.limits.fence_drain_timeout)
                .await
                .map_err(RoleError::Failed)?;
            let acked_ms = clock.step("acked");
            let digests = match with_digests {
                true => Some(
                    digest::fence_digests(&self.engine, &push, head)
                        .await
                        .map_err(RoleError::Failed)?,
                ),
                false => None,
            };
            let digests_ms = clock.step("digests");
            Ok::<_, RoleError>((head, digests, [drain_ms, acked_ms, digests_ms]))
        };
        let ((hold, hold_ms), fenced) = tokio::join!(hold, fence);
        let (head, digests, [drain_ms, acked_ms, digests_ms]) = fenced?;
        hold.map_err(|e| RoleError::Failed(format!("target incoming hold: {e}")))?;
        let hold_wait_ms = clock.step("hold_wait");
        tracing::info!(
            migration = id, partition = %pid, seq = head, lease_wait_ms, drain_ms, acked_ms,
            digests_ms, hold_ms, hold_wait_ms, "source fenced"
        );
        Ok((head, digests))
    }

    /// Lifts the target's incoming hold (best effort, in the background: it
    /// also lapses by itself).
    fn lift_incoming(push: &Arc<Push>) {
        let push = push.clone();
        tokio::spawn(async move {
            let pid = push.plan.partition;
            if let Err(e) = push
                .target()
                .migrate_incoming(pid, keyway_map::Epoch(0), false, Duration::ZERO)
                .await
            {
                tracing::debug!(partition = %pid, %e, "could not lift the target's incoming hold");
            }
        });
    }

    /// Ends the target's registration of the migration (best effort, in the
    /// background: the target also ends it once its map moves the
    /// partition, and a newer migration's registration replaces it).
    fn end_receiving(push: &Arc<Push>) {
        let push = push.clone();
        tokio::spawn(async move {
            if let Err(e) = push
                .target()
                .migrate_receive(&push.migration(), false)
                .await
            {
                tracing::debug!(migration = push.plan.id, %e, "could not end the target's registration");
            }
        });
    }

    /// Moves push `id`'s checkpoint to the present (the driver asks right
    /// before it fences, so the digest inside the write pause covers only
    /// what is written from then to the fence: `push.rs`, "Rolling
    /// checkpoint"); `(checkpoint seq, moved in time)`. Not in time: the
    /// fence digest covers more, nothing else changes.
    ///
    /// Then it waits (up to `fence_catch_up`) for the target to acknowledge
    /// every write so far, so the fence's own wait for the target, inside
    /// the write pause, covers only what is written in between. A target
    /// busy at that moment (flushing what the copy brought, say) delays the
    /// fence instead of lengthening it; writes keep flowing meanwhile. Not
    /// caught up in time: the fence waits for the rest, as before.
    pub async fn checkpoint(&self, id: u64) -> Result<(Seq, bool), RoleError> {
        let push = self.push(id)?;
        if let Some(e) = push.error() {
            return Err(RoleError::Failed(e));
        }
        let moved = push.refresh_checkpoint_now(CHECKPOINT_WAIT).await;
        if !self.limits.fence_catch_up.is_zero() {
            let mut clock = StepClock::new(&self.metrics);
            let head = self.engine.last_seq();
            let caught_up = push
                .wait_acked(head, self.limits.fence_catch_up)
                .await
                .is_ok();
            let catch_up_ms = clock.step("catch_up");
            tracing::debug!(
                migration = id,
                seq = head,
                caught_up,
                catch_up_ms,
                "caught up before the fence"
            );
        }
        Ok((push.checkpoint().map_or(0, |c| c.seq), moved))
    }

    /// Both sides' digests of the range at the fence (see `digest.rs`).
    /// Refused unless the partition is fenced.
    pub async fn fence_digests(&self, id: u64) -> Result<crate::peer::FenceDigests, RoleError> {
        let push = self.push(id)?;
        if !self.routing.is_fenced(push.plan.partition) {
            return Err(RoleError::Refused(format!(
                "migration {id}: digests are compared only while the source is fenced"
            )));
        }
        let head = self.engine.last_seq();
        push.wait_acked(head, self.limits.fence_drain_timeout)
            .await
            .map_err(RoleError::Failed)?;
        digest::fence_digests(&self.engine, &push, head)
            .await
            .map_err(RoleError::Failed)
    }

    /// Stops push `id`: dual writing off, fence lifted, stream ended.
    pub fn stop(&self, id: u64) {
        if let Some(pid) = self.take_recovered(id) {
            self.routing.set_fenced(pid, false);
        }
        let push = {
            let mut pushes = self.pushes.lock().unwrap_or_else(|e| e.into_inner());
            let push = pushes.remove(&id);
            self.metrics.migration_pushes.set(pushes.len() as i64);
            push
        };
        if let Some(push) = push {
            let pid = push.plan.partition;
            self.routing.set_dual(pid, None, || ());
            self.routing.set_fenced(pid, false);
            Self::lift_incoming(&push);
            push.stop();
            Self::end_receiving(&push);
            tracing::info!(migration = id, partition = %pid, "migration push stopped");
        }
    }

    /// Whether a fence for `partition` may go, given its migration record:
    /// not while the record is in `CUTOVER` with the flip not known to be
    /// done, and after the flip only once this node's installed map has
    /// moved the partition away (else it would serve at the old epoch).
    fn may_lift(&self, rec: Option<&MigrationRecord>, partition: PartitionId) -> bool {
        let Some(rec) = rec else {
            return true;
        };
        let flipped =
            rec.flipped() || matches!(rec.state, MigrationState::Cleanup | MigrationState::Done);
        if flipped {
            let me = self.routing.node_id();
            return self
                .routing
                .map()
                .partitions
                .get(&partition)
                .is_some_and(|p| p.owner != me);
        }
        rec.state != MigrationState::Cutover
    }

    fn take_recovered(&self, id: u64) -> Option<PartitionId> {
        self.recovered
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id)
    }

    /// Ids of fences recovered at start that are still in place.
    pub fn recovered_fences(&self) -> Vec<(u64, PartitionId)> {
        self.recovered
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(id, pid)| (*id, *pid))
            .collect()
    }
}

/// At start: fences every partition this node is the source of in a
/// `CUTOVER` record whose flip is not known to be done (see the module
/// docs). Returns how many.
pub async fn recover_fences(
    migrations: &Migrations,
    meta: &dyn MetaStore,
) -> Result<usize, keyway_meta::MetaError> {
    let me = migrations.routing.node_id();
    let mut fenced = 0;
    for stored in meta.migrations().await? {
        if keyway_migration::is_replica_move_record(&stored.record) {
            continue;
        }
        let Ok(rec) = MigrationRecord::decode(&stored.record) else {
            tracing::warn!(id = stored.id, "undecodable migration record; ignored");
            continue;
        };
        if in_cutover_from(&rec, me) {
            migrations.routing.set_fenced(rec.partition_id(), true);
            migrations
                .recovered
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(stored.id, rec.partition_id());
            tracing::warn!(migration = stored.id, partition = %rec.partition_id(),
                "restarted during a migration cutover: partition fenced until the record leaves CUTOVER");
            fenced += 1;
        }
    }
    Ok(fenced)
}

fn in_cutover_from(rec: &MigrationRecord, me: keyway_map::NodeId) -> bool {
    rec.state == MigrationState::Cutover && rec.source() == me && !rec.flipped()
}

/// Keeps this node's migration roles in line with the durable records, so
/// no fence or push outlives its migration even when no manager is left to
/// end it (e.g. an operator aborted while the manager was down): every
/// `every`, while anything is in place,
/// - a fence recovered at start is lifted once its record left `CUTOVER`;
/// - a push whose record is over (`DONE`, `ABORTED`) is stopped (dual
///   writing off, fence lifted) — after a flip only once this node's map
///   has moved the partition away.
///
/// A store that cannot be read changes nothing.
pub async fn watch_fences(
    migrations: Arc<Migrations>,
    meta: Arc<dyn MetaStore>,
    every: Duration,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.changed() => return,
        }
        for (id, pid) in migrations.recovered_fences() {
            let Some(rec) = record(&*meta, id).await else {
                continue;
            };
            if migrations.may_lift(rec.as_ref(), pid) && migrations.take_recovered(id).is_some() {
                migrations.routing.set_fenced(pid, false);
                tracing::info!(migration = id, partition = %pid, "recovered fence lifted");
            }
        }
        let pushes: Vec<(u64, PartitionId)> = migrations
            .pushes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(id, p)| (*id, p.plan.partition))
            .collect();
        for (id, pid) in pushes {
            let Some(rec) = record(&*meta, id).await else {
                continue;
            };
            // No record: a push started by hand (tools, tests); left alone.
            let over = rec.as_ref().is_some_and(|r| r.state.is_terminal());
            if over && migrations.may_lift(rec.as_ref(), pid) {
                tracing::info!(
                    migration = id,
                    "migration over in the store: stopping its push"
                );
                migrations.stop(id);
            }
        }
    }
}

/// The decoded record of `id`: `Some(None)` when there is none (or it does
/// not decode), `None` when the store could not be read.
async fn record(meta: &dyn MetaStore, id: u64) -> Option<Option<MigrationRecord>> {
    match meta.get_migration(id).await {
        Ok(Some(s)) => Some(MigrationRecord::decode(&s.record).ok()),
        Ok(None) => Some(None),
        Err(_) => None,
    }
}

/// `fut`'s output and how long it took, in ms.
async fn timed<T>(fut: impl std::future::Future<Output = T>) -> (T, f64) {
    let at = Instant::now();
    let out = fut.await;
    (out, ms(at.elapsed()))
}

/// `d` in milliseconds, to the microsecond (for log fields).
fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// Times the fence's steps into `migration_fence_step_seconds`.
struct StepClock<'a> {
    metrics: &'a Metrics,
    at: Instant,
}

impl<'a> StepClock<'a> {
    fn new(metrics: &'a Metrics) -> Self {
        StepClock {
            metrics,
            at: Instant::now(),
        }
    }

    /// Records the step that ends now; its length in ms (for the log).
    fn step(&mut self, kind: &'static str) -> f64 {
        let now = Instant::now();
        let took = now.duration_since(self.at);
        self.at = now;
        self.metrics
            .migration_fence_step_seconds
            .get_or_create(&crate::metrics::KindLabel { kind })
            .observe(took.as_secs_f64());
        ms(took)
    }
}
