//! The migration driver: carries out live partition migrations (issue 4).
//!
//! The protocol itself is the pure state machine of `keyway-migration`
//! ([`Migration`]: events in, commands out). The driver is its hands: it
//! feeds the machine what it observes (node answers, store outcomes, the
//! wall clock) and executes the commands it returns against the metadata
//! store and the nodes' `Peer` service ([`MigrationPeers`]).
//!
//! # How it runs
//! - [`Driver::start`] spawns the discovery loop. While the seat leads, every
//!   `discover_interval_ms` it lists the stored migration records and spawns
//!   one task per non-terminal record it does not drive yet (one per
//!   partition range at a time, oldest id first), feeding `Started` to a `PENDING`
//!   record and `Recovered` to any other. When the seat stops leading (or
//!   leads under a new candidacy), every task is stopped; each task also
//!   checks [`SeatView::leading`] (under the leadership it was started with)
//!   before every command.
//! - A task (`run.rs`) executes each batch in order; a failed `Persist`
//!   drops the rest of the batch, reloads the record and feeds `Recovered`.
//!   Every `poll_interval_ms` it re-reads the stored generation (a change
//!   means an operator aborted: reload, `Recovered`), feeds `Tick`, and while
//!   the push runs polls the source's `MigrateStatus` for copy progress and
//!   catch-up lag. Every event a command produced is preceded by a `Tick`,
//!   so the machine's timeouts (the fence timeout bounding the write pause)
//!   hold even when a command was slow.
//! - `discover.rs` is the discovery loop; `actions.rs` maps each
//!   [`Command`] to node and store calls;
//!   `evidence.rs` reads what the map (and its history) shows after a flip
//!   conflict.
//! - Copies left behind: a record that ended with a `stray` copy (a dead
//!   target during an abort, a dead old source in `CLEANUP`, or a revert a
//!   crashed leader did not finish) is over — the range is free — but
//!   discovery drives it again, one drop attempt at a time, every
//!   `stray_retry_interval_ms` while its node is not marked down, until the
//!   copy is gone (or the node was decommissioned). Live migrations are
//!   started first, and a cleanup never runs beside a task on an
//!   overlapping range. Each give-up is in the decision log (`migration`,
//!   `leave_copy`) and `keyway_manager_migration_stray_copies` counts them.
//! - Operators create records with [`request_move`] and ask for an abort with
//!   [`request_abort`] (a CAS write of the `ABORTED` record the machine
//!   decides); the running task notices the new generation and reverts.
//!
//! Time fed to the machine is wall-clock milliseconds since the UNIX epoch.

mod actions;
mod discover;
mod evidence;
mod peers;
mod run;
#[cfg(test)]
mod tests;

pub use peers::{MigrationPeers, PeerAddr, RpcPeers};

use crate::decisions::DecisionLog;
use crate::metrics::Metrics;
use crate::seat::SeatView;
use keyway_map::{NodeId, NodeState, PartitionId};
use keyway_meta::{MetaError, MetaStore, StoredMigration};
use keyway_migration::{
    AbortReason, Command, Event, Migration, MigrationConfig, MigrationId, MigrationRecord,
    MigrationState,
};
use keyway_peer::Throttle;
use keyway_storage::KeyRange;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Settings of a [`Driver`].
#[derive(Clone, Debug)]
pub struct DriverConfig {
    /// The state machine's tunables (timeouts, grace, retry interval).
    pub migration: MigrationConfig,
    /// How fast sources copy snapshots.
    pub throttle: Throttle,
    /// How often a task polls the store and the source, and feeds `Tick`.
    pub poll_interval_ms: u64,
    /// How often the leader lists the stored migration records.
    pub discover_interval_ms: u64,
    /// Entries deleted per `DropRangeChunk` call when dropping a copy.
    pub drop_chunk_entries: usize,
    /// Pause between two drop chunks (keeps foreground traffic flowing).
    pub drop_pause_ms: u64,
    /// How often a copy left behind on an unreachable node (a record's
    /// `stray`) is tried again.
    pub stray_retry_interval_ms: u64,
}

impl Default for DriverConfig {
    fn default() -> Self {
        DriverConfig {
            migration: MigrationConfig::default(),
            throttle: Throttle::default(),
            poll_interval_ms: 100,
            discover_interval_ms: 500,
            drop_chunk_entries: 1000,
            drop_pause_ms: 5,
            stray_retry_interval_ms: 30_000,
        }
    }
}

impl DriverConfig {
    /// Checks every field (and the migration config).
    pub fn validate(&self) -> Result<(), DriverError> {
        let bad = |what: &str| Err(DriverError::Config(what.to_string()));
        if let Err(e) = self.migration.validate() {
            return Err(DriverError::Config(e.0.to_string()));
        }
        if self.poll_interval_ms == 0 {
            return bad("poll_interval_ms must be positive");
        }
        if self.discover_interval_ms == 0 {
            return bad("discover_interval_ms must be positive");
        }
        if self.drop_chunk_entries == 0 {
            return bad("drop_chunk_entries must be positive");
        }
        if self.drop_chunk_entries > keyway_peer::MAX_DROP_ENTRIES as usize {
            return bad("drop_chunk_entries exceeds the node's MAX_DROP_ENTRIES");
        }
        if self.stray_retry_interval_ms == 0 {
            return bad("stray_retry_interval_ms must be positive");
        }
        Ok(())
    }

    pub(crate) fn poll(&self) -> Duration {
        Duration::from_millis(self.poll_interval_ms)
    }

    pub(crate) fn retry(&self) -> Duration {
        Duration::from_millis(self.migration.retry_interval_ms)
    }
}

/// What the driver's operator calls (and its config check) can fail with.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum DriverError {
    #[error(transparent)]
    Meta(#[from] MetaError),
    #[error("invalid driver config: {0}")]
    Config(String),
    #[error("partition {0} is not in the map")]
    UnknownPartition(PartitionId),
    #[error("node {0} is not registered")]
    UnknownNode(NodeId),
    #[error("node {0} is down")]
    NodeDown(NodeId),
    #[error("partition {partition} is already owned by node {node}")]
    AlreadyOwner {
        partition: PartitionId,
        node: NodeId,
    },
    /// A migration would clean the replica's copy (in sync or not) for its
    /// own; primaryship moves to a replica by a switchover instead.
    #[error(
        "node {node} holds a replica of partition {partition}: make it the primary with \
         keyway ctl failover {partition} --to {node} instead of moving it"
    )]
    HoldsReplica {
        partition: PartitionId,
        node: NodeId,
    },
    #[error("partition {partition} already has migration {migration} in {state}")]
    Busy {
        partition: PartitionId,
        migration: MigrationId,
        state: MigrationState,
    },
    #[error("partition {partition} has a replica move or primary move ({id}) in flight")]
    ReplicaMoving { partition: PartitionId, id: u64 },
    #[error("migration {0} not found")]
    NotFound(MigrationId),
    #[error("migration {id}: the stored record is unusable: {detail}")]
    BadRecord { id: MigrationId, detail: String },
    #[error("migration {id} cannot be aborted in {state}: {why}")]
    CannotAbort {
        id: MigrationId,
        state: MigrationState,
        why: String,
    },
    #[error("migration {id}: gave up after {attempts} conflicting concurrent writes")]
    Contended { id: MigrationId, attempts: u32 },
}

/// Wall-clock milliseconds since the UNIX epoch (the machine's time).
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The partition's storage range (`be32(keyspace) ++ bound`).
pub(crate) fn storage_range(rec: &MigrationRecord) -> KeyRange {
    let (start, end) = rec.partition.storage_bounds();
    KeyRange::new(start, end)
}

/// Whether two key ranges share a key.
pub(crate) fn ranges_overlap(a: &KeyRange, b: &KeyRange) -> bool {
    let below = |x: &KeyRange, y: &KeyRange| x.end.as_ref().is_none_or(|end| y.start < *end);
    !a.is_empty() && !b.is_empty() && below(a, b) && below(b, a)
}

/// Decodes a stored record; the store's generation is authoritative.
pub(crate) fn load(stored: &StoredMigration) -> Result<MigrationRecord, DriverError> {
    let id = MigrationId(stored.id);
    let mut rec = MigrationRecord::decode(&stored.record).map_err(|e| DriverError::BadRecord {
        id,
        detail: e.to_string(),
    })?;
    if rec.id != id {
        return Err(DriverError::BadRecord {
            id,
            detail: format!("the record names migration {}", rec.id),
        });
    }
    rec.generation = stored.generation;
    Ok(rec)
}

// ---- Live state (metrics and `/migrations`). ----

/// What the driver knows of one migration it drives, fresher than the store
/// (progress fields are persisted only with the next decision).
#[derive(Clone, Debug)]
pub(crate) struct LiveEntry {
    pub record: MigrationRecord,
    /// Last catch-up lag reported by the source (`head_seq - acked_seq`).
    pub lag: Option<u64>,
    /// Copy rate over the last poll, bytes/s.
    pub copy_rate: Option<u64>,
}

/// The migrations being driven, shared between the tasks, the metrics and
/// the admin route.
#[derive(Default)]
pub(crate) struct Live {
    entries: Mutex<BTreeMap<MigrationId, LiveEntry>>,
    /// Records over with a copy still left on a node (last discovery round).
    stray_copies: std::sync::atomic::AtomicU64,
}

impl Live {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<MigrationId, LiveEntry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Updates (or creates) the entry of `record`, then the gauges.
    pub(crate) fn update(
        &self,
        metrics: &Metrics,
        record: &MigrationRecord,
        f: impl FnOnce(&mut LiveEntry),
    ) {
        let mut entries = self.lock();
        let entry = entries.entry(record.id).or_insert_with(|| LiveEntry {
            record: record.clone(),
            lag: None,
            copy_rate: None,
        });
        entry.record = record.clone();
        f(entry);
        Self::refresh(metrics, &entries);
    }

    pub(crate) fn remove(&self, metrics: &Metrics, id: MigrationId) {
        let mut entries = self.lock();
        entries.remove(&id);
        Self::refresh(metrics, &entries);
    }

    fn get(&self, id: MigrationId) -> Option<LiveEntry> {
        self.lock().get(&id).cloned()
    }

    fn refresh(metrics: &Metrics, entries: &BTreeMap<MigrationId, LiveEntry>) {
        let active: Vec<_> = entries
            .values()
            .filter(|e| !e.record.state.is_terminal())
            .collect();
        let gauge = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        metrics.migrations_active.set(gauge(active.len() as u64));
        let remaining = active.iter().map(|e| {
            let r = &e.record;
            match r.state {
                MigrationState::Pending | MigrationState::Copying => {
                    r.total_bytes.saturating_sub(r.copied_bytes)
                }
                _ => 0,
            }
        });
        metrics
            .migration_bytes_remaining
            .set(gauge(remaining.sum()));
        let copying = |e: &&&LiveEntry| e.record.state == MigrationState::Copying;
        let rate = active.iter().filter(copying).filter_map(|e| e.copy_rate);
        metrics.migration_copy_rate.set(gauge(rate.sum()));
        let lagging = |e: &&&LiveEntry| {
            matches!(
                e.record.state,
                MigrationState::Catchup | MigrationState::Dual
            )
        };
        let lag = active.iter().filter(lagging).filter_map(|e| e.lag).max();
        metrics.migration_catchup_lag.set(gauge(lag.unwrap_or(0)));
    }
}

/// One migration as `GET /migrations` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct MigrationSummary {
    pub id: MigrationId,
    /// `PENDING`, `COPYING`, ... (`UNREADABLE`: the stored bytes do not decode).
    pub state: String,
    pub partition: PartitionId,
    pub source: NodeId,
    pub target: NodeId,
    /// The partition's epoch when the migration was created (e).
    pub epoch: u64,
    pub generation: u64,
    pub copied_bytes: u64,
    pub total_bytes: u64,
    /// The copy's cost (the record's `bytes_sent`, `bytes_written`,
    /// `copy_duration_ms`: final once `COPYING` ended).
    pub bytes_sent: u64,
    pub bytes_written: u64,
    pub copy_duration_ms: u64,
    /// Catch-up lag in change-log records (while this manager drives it).
    pub lag: Option<u64>,
    /// Copy rate over the last poll, bytes/s (while this manager drives it).
    pub copy_rate_bytes_per_sec: Option<u64>,
    /// The measured cutover write pause.
    pub pause_ms: Option<u64>,
    pub abort_reason: Option<AbortReason>,
    /// A node still holding a copy of the range this migration left behind
    /// (dropped when it is reachable again).
    pub stray: Option<NodeId>,
    pub started_at_ms: u64,
    pub state_entered_at_ms: u64,
    /// When it reached `DONE` or `ABORTED`.
    pub ended_at_ms: Option<u64>,
    /// Whether this manager is driving it right now.
    pub driven: bool,
    /// Why the record could not be read (state `UNREADABLE`).
    pub error: Option<String>,
}

impl MigrationSummary {
    fn new(rec: &MigrationRecord, live: Option<&LiveEntry>) -> Self {
        MigrationSummary {
            id: rec.id,
            state: rec.state.name().to_string(),
            partition: rec.partition_id(),
            source: rec.source(),
            target: rec.target,
            epoch: rec.epoch().0,
            generation: rec.generation,
            copied_bytes: rec.copied_bytes,
            total_bytes: rec.total_bytes,
            bytes_sent: rec.bytes_sent,
            bytes_written: rec.bytes_written,
            copy_duration_ms: rec.copy_duration_ms,
            lag: live.and_then(|l| l.lag),
            copy_rate_bytes_per_sec: live.and_then(|l| l.copy_rate),
            pause_ms: rec.pause_ms,
            abort_reason: rec.abort_reason.clone(),
            stray: rec.stray,
            started_at_ms: rec.started_at_ms,
            state_entered_at_ms: rec.state_entered_at_ms,
            ended_at_ms: rec.state.is_terminal().then_some(rec.state_entered_at_ms),
            driven: live.is_some(),
            error: None,
        }
    }
}

/// A read handle on the migrations (for the admin port).
#[derive(Clone)]
pub struct DriverView {
    meta: Arc<dyn MetaStore>,
    live: Arc<Live>,
}

impl DriverView {
    /// Every stored migration record, ordered by id, with the driver's
    /// fresher progress for those it drives.
    pub async fn migrations(&self) -> Result<Vec<MigrationSummary>, MetaError> {
        let stored = self.meta.migrations().await?;
        Ok(stored
            .iter()
            .filter(|s| !crate::replication::moves::is_replica_move(s))
            .map(|s| match load(s) {
                Ok(rec) => {
                    let live = self.live.get(rec.id);
                    let newest = match &live {
                        Some(l) if l.record.generation >= rec.generation => &l.record,
                        _ => &rec,
                    };
                    MigrationSummary::new(newest, live.as_ref())
                }
                Err(e) => MigrationSummary {
                    id: MigrationId(s.id),
                    state: "UNREADABLE".into(),
                    partition: PartitionId(0),
                    source: NodeId(0),
                    target: NodeId(0),
                    epoch: 0,
                    generation: s.generation,
                    copied_bytes: 0,
                    total_bytes: 0,
                    bytes_sent: 0,
                    bytes_written: 0,
                    copy_duration_ms: 0,
                    lag: None,
                    copy_rate_bytes_per_sec: None,
                    pause_ms: None,
                    abort_reason: None,
                    stray: None,
                    started_at_ms: 0,
                    state_entered_at_ms: 0,
                    ended_at_ms: None,
                    driven: false,
                    error: Some(e.to_string()),
                },
            })
            .collect())
    }

    /// Records over with a copy still left on a node, as of the last
    /// discovery round of this manager (0 while it does not lead).
    pub fn stray_copies(&self) -> u64 {
        self.live
            .stray_copies
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

// ---- The driver. ----

/// What every task shares.
pub(crate) struct Shared {
    pub meta: Arc<dyn MetaStore>,
    pub peers: Arc<dyn MigrationPeers>,
    pub seat: SeatView,
    pub config: DriverConfig,
    pub metrics: Arc<Metrics>,
    pub live: Arc<Live>,
    pub decisions: DecisionLog,
}

/// The running driver; see the module docs.
pub struct Driver {
    view: DriverView,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Driver {
    /// Starts driving migrations (whenever `seat` leads) over the nodes'
    /// `Peer` gRPC service. `config` must pass [`DriverConfig::validate`]
    /// (panics otherwise).
    pub fn start(
        meta: Arc<dyn MetaStore>,
        seat: SeatView,
        config: DriverConfig,
        metrics: Arc<Metrics>,
        decisions: DecisionLog,
    ) -> Driver {
        let peers = Arc::new(RpcPeers::new());
        Self::start_with_peers(meta, seat, peers, config, metrics, decisions)
    }

    /// [`Driver::start`] with another way to reach the nodes.
    pub fn start_with_peers(
        meta: Arc<dyn MetaStore>,
        seat: SeatView,
        peers: Arc<dyn MigrationPeers>,
        config: DriverConfig,
        metrics: Arc<Metrics>,
        decisions: DecisionLog,
    ) -> Driver {
        if let Err(e) = config.validate() {
            panic!("Driver::start: {e}");
        }
        let live = Arc::new(Live::default());
        let view = DriverView {
            meta: meta.clone(),
            live: live.clone(),
        };
        let shared = Arc::new(Shared {
            meta,
            peers,
            seat,
            config,
            metrics,
            live,
            decisions,
        });
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(discover::discover_loop(shared, stop_rx));
        Driver { view, stop, task }
    }

    pub fn view(&self) -> DriverView {
        self.view.clone()
    }

    /// Stops the discovery loop and every migration task (they resume under
    /// the next leader from their durable records).
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

// ---- Operator calls (`keyway ctl`). ----

/// Creates a `PENDING` migration record (generation 1) moving `partition`
/// from its current owner to `target`; the leader's driver starts it.
///
/// Refuses an unknown partition, an unregistered or down target, a target
/// that already owns the partition, and a partition that already has a
/// non-terminal migration.
pub async fn request_move(
    meta: &dyn MetaStore,
    partition: PartitionId,
    target: NodeId,
) -> Result<MigrationRecord, DriverError> {
    let map = meta.get_map().await?;
    let row = map
        .partitions
        .get(&partition)
        .ok_or(DriverError::UnknownPartition(partition))?;
    let node = map
        .nodes
        .get(&target)
        .ok_or(DriverError::UnknownNode(target))?;
    if node.state != NodeState::Up {
        return Err(DriverError::NodeDown(target));
    }
    if row.owner == target {
        return Err(DriverError::AlreadyOwner {
            partition,
            node: target,
        });
    }
    if row.replicas.contains(&target) {
        return Err(DriverError::HoldsReplica {
            partition,
            node: target,
        });
    }
    for stored in meta.migrations().await? {
        let moving = crate::replication::ReplicaMove::load(&stored)
            .map(|m| m.partition)
            .or_else(|| crate::replication::PrimaryMove::load(&stored).map(|m| m.partition));
        if let Some(moving) = moving {
            if moving == partition {
                return Err(DriverError::ReplicaMoving {
                    partition,
                    id: stored.id,
                });
            }
            continue;
        }
        match load(&stored) {
            Ok(rec) if rec.partition_id() == partition && !rec.state.is_terminal() => {
                return Err(DriverError::Busy {
                    partition,
                    migration: rec.id,
                    state: rec.state,
                });
            }
            Ok(_) => {}
            Err(err) => tracing::warn!(%err, "request_move: skipping an unreadable record"),
        }
    }
    let id = MigrationId(meta.allocate_migration_id().await?);
    let mut rec = MigrationRecord::new(id, row.clone(), target, now_ms());
    rec.generation = 1;
    rec.map_version = map.version.0;
    rec.validate().map_err(|e| DriverError::BadRecord {
        id,
        detail: e.to_string(),
    })?;
    meta.put_migration(id.0, None, rec.generation, rec.encode())
        .await?;
    tracing::info!(migration = %id, %partition, source = %rec.source(), %target, "migration requested");
    Ok(rec)
}

/// How many generation conflicts [`request_abort`] rides out.
const ABORT_ATTEMPTS: u32 = 20;

/// Asks for migration `id` to be reverted: the machine decides the `ABORTED`
/// record, which is CAS-written over the stored generation (reloading on a
/// conflict). The leader's driver notices it and carries out the revert.
/// A migration past the flip request (or over) cannot be aborted.
pub async fn request_abort(
    meta: &dyn MetaStore,
    id: MigrationId,
) -> Result<MigrationRecord, DriverError> {
    // Timeouts that never fire: only the operator's request decides here.
    let config = MigrationConfig {
        stuck_timeout_ms: u64::MAX,
        fence_timeout_ms: u64::MAX,
        ..MigrationConfig::default()
    };
    for _ in 0..ABORT_ATTEMPTS {
        let stored = meta
            .get_migration(id.0)
            .await?
            .ok_or(DriverError::NotFound(id))?;
        let rec = load(&stored)?;
        let bad = |e: &dyn std::fmt::Display| DriverError::BadRecord {
            id,
            detail: e.to_string(),
        };
        let mut machine = Migration::new(rec, config.clone()).map_err(|e| bad(&e))?;
        // Only moves the machine's clock to now (the abort's time).
        let _ = machine.handle(Event::Tick { now: now_ms() });
        let commands = machine
            .handle(Event::AbortRequested {
                reason: "operator".into(),
            })
            .map_err(|r| DriverError::CannotAbort {
                id,
                state: r.state,
                why: r.why.to_string(),
            })?;
        let Some(Command::Persist(aborted)) = commands.into_iter().next() else {
            return Err(bad(&"the abort decided no record"));
        };
        match meta
            .put_migration(
                id.0,
                Some(stored.generation),
                aborted.generation,
                aborted.encode(),
            )
            .await
        {
            Ok(()) => {
                tracing::info!(migration = %id, "migration abort requested");
                return Ok(aborted);
            }
            Err(MetaError::MigrationConflict { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(DriverError::Contended {
        id,
        attempts: ABORT_ATTEMPTS,
    })
}
