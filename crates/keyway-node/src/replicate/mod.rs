//! Replication, node side: the primary's streams to its replicas, the
//! replica's side of them, the catch-up of a replica not in sync, and the
//! in-sync set changes the primary makes by compare-and-set (issue 12;
//! DESIGN.md invariants 9–12).
//!
//! Process overview (primary P of partition p, replica R):
//! 1. **One stream per replica node** (`stream.rs`): P reads its change log
//!    once, up to its *durable seq* (never a record a crash could still
//!    lose), and ships, in `Replicate` calls, every record of a partition P
//!    owns and R is a replica of (once that partition's catch-up cleaned R's
//!    copy). R checks each call under its routing guard and applies it with
//!    `apply_foreign` + fsync (`replica.rs`). The stream's *acked seq* is
//!    the last seq it examined and R applied durably. An empty call every
//!    `replica_heartbeat_ms` carries the read leases.
//! 2. **Replies wait** (`Replication::defer`): a write of p with seq s (a read:
//!    the last seq at the read) is answered once it is durable here *and*
//!    every waited-for replica's stream acked ≥ s. The in-sync rules
//!    (`rules.rs`, pure) decide who is waited for and when a lagging replica
//!    is CASed out (`cas.rs`): never releasing a reply as success on a failed
//!    CAS, and only after the removed replica's read lease has passed.
//! 3. **Catch-up** (`copy.rs`): a replica not in sync is cleaned, shipped
//!    from then on, copied chunk by chunk (versioned like a migration's
//!    copy), joins (waited for from s0 on), and is CASed in once acked ≥ s0.
//! 4. **The driver** ([`Replication::run`]) feeds the rules every installed
//!    map and a tick, runs their commands, and keeps one stream per replica
//!    node the rules know.
//! 5. Admission refuses a write with `-NOREPLICAS` when the partition's
//!    in-sync copies are fewer than its keyspace's `min_in_sync` ([`norepl`]).
//!
//! A planned switchover (`switchover.rs`) fences p, waits for the target's
//! stream, and CASes the owner over, keeping the old primary in sync: the
//! new primary's rules recognise the switch and keep streaming to it with
//! no copy (an *era*, `rules.rs`).

mod cas;
mod copy;
mod era;
pub mod metrics;
pub mod replica;
pub mod rules;
mod state;
mod stream;
pub mod switchover;

use crate::executor::{Deferral, DurableSeq, LatencyGauge};
use crate::log_gc::LogHolds;
use crate::peer::Throttle;
use crate::routing::Routing;
use keyway_map::{NodeId, PartitionId, PartitionMap, PartitionRecord};
use keyway_meta::MetaStore;
use keyway_resp::Frame;
use keyway_storage::{Engine, Seq};
use metrics::ReplicationMetrics;
use rules::{Command, Row, Rules, RulesConfig, WaiterId};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use stream::Stream;
use tokio::sync::{mpsc, oneshot, watch};

/// Redis's own refusal when too few copies are in sync.
pub const NOREPLICAS: &str = "NOREPLICAS Not enough good replicas to write.";

/// A reply whose write is applied here but whose replication could not be
/// confirmed (a CAS failed, the node was deposed or lost its lease).
pub const NOT_CONFIRMED: &str =
    "ERR replication not confirmed: the write was applied here but may not survive a failover";

/// How often the driver ticks the rules.
const TICK: Duration = Duration::from_millis(20);

/// Whether a write to `p` must be refused: fewer in-sync copies than its
/// keyspace's `min_in_sync` (copies counted with the primary).
pub fn norepl(map: &PartitionMap, p: &PartitionRecord) -> bool {
    let min = map.keyspaces.get(&p.keyspace).map_or(1, |k| k.min_in_sync);
    p.in_sync_copies() < usize::from(min)
}

/// Limits of replication, from the node configuration.
#[derive(Clone, Copy, Debug)]
pub struct ReplicationConfig {
    pub lag_timeout: Duration,
    pub read_lease: Duration,
    pub heartbeat: Duration,
    /// Calls each stream keeps in flight (`replica_stream_window_calls`).
    pub stream_window_calls: usize,
    /// How long a switchover's fence waits, once its target caught up, for
    /// the other in-sync replicas to catch up too (`switchover.rs`).
    pub switchover_grace: Duration,
    /// The catch-up copy's throttle (the migration copy's defaults).
    pub throttle: Throttle,
}

/// A reply waiting on replication.
struct Pending {
    tx: oneshot::Sender<Frame>,
    frame: Frame,
    /// Then hand it on (a migration's dual write waits for its target too).
    then: Option<Deferral>,
}

struct Inner {
    rules: Rules,
    pending: HashMap<WaiterId, Pending>,
}

/// The lock on [`Inner`]; on release it publishes whether any partition
/// has a replica ([`Replication::has_waited`]'s lock-free answer).
struct InnerGuard<'a> {
    guard: std::sync::MutexGuard<'a, Inner>,
    tracked: &'a std::sync::atomic::AtomicBool,
}

impl std::ops::Deref for InnerGuard<'_> {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.guard
    }
}

impl std::ops::DerefMut for InnerGuard<'_> {
    fn deref_mut(&mut self) -> &mut Inner {
        &mut self.guard
    }
}

impl Drop for InnerGuard<'_> {
    fn drop(&mut self) {
        let tracked = self
            .guard
            .rules
            .parts()
            .values()
            .any(|p| !p.replicas.is_empty());
        self.tracked
            .store(tracked, std::sync::atomic::Ordering::Release);
    }
}

/// The node's replication roles (see the module docs).
pub struct Replication {
    me: NodeId,
    engine: Arc<dyn Engine>,
    routing: Arc<Routing>,
    meta: Arc<dyn MetaStore>,
    durable: Arc<DurableSeq>,
    holds: Arc<LogHolds>,
    migrations: Arc<crate::migrate::Migrations>,
    /// Where catch-up copies are accounted (`crate::copies`).
    copies: Arc<crate::copies::Copies>,
    pub metrics: Arc<ReplicationMetrics>,
    cfg: ReplicationConfig,
    inner: Mutex<Inner>,
    /// Whether any partition has a replica (see [`InnerGuard`]).
    tracked: std::sync::atomic::AtomicBool,
    cmds: mpsc::UnboundedSender<Command>,
    cmd_rx: Mutex<Option<mpsc::UnboundedReceiver<Command>>>,
    streams: Mutex<BTreeMap<NodeId, Arc<Stream>>>,
    /// The replica side of other primaries' streams.
    pub replica: Arc<replica::ReplicaSide>,
}

/// What `Replication::new` needs of the node.
pub struct ReplicationParts {
    pub me: NodeId,
    pub engine: Arc<dyn Engine>,
    pub routing: Arc<Routing>,
    pub meta: Arc<dyn MetaStore>,
    pub durable: Arc<DurableSeq>,
    pub holds: Arc<LogHolds>,
    pub latency: Arc<LatencyGauge>,
    /// This node's migration pushes: no in-sync growth of a partition
    /// being migrated away (see `Rules::set_migrating`).
    pub migrations: Arc<crate::migrate::Migrations>,
    /// The node's copy accounting (catch-ups are `replica` copies).
    pub copies: Arc<crate::copies::Copies>,
}

impl Replication {
    pub fn new(
        parts: ReplicationParts,
        cfg: ReplicationConfig,
        node_metrics: &crate::metrics::Metrics,
    ) -> Arc<Self> {
        let (cmds, rx) = mpsc::unbounded_channel();
        let rules = Rules::new(
            RulesConfig {
                lag_timeout: cfg.lag_timeout,
                read_lease: cfg.read_lease,
                retry_backoff: cfg.lag_timeout,
            },
            Instant::now(),
        );
        let metrics = ReplicationMetrics::register(node_metrics);
        Arc::new(Replication {
            me: parts.me,
            replica: Arc::new(replica::ReplicaSide::new(
                parts.me,
                parts.engine.clone(),
                parts.routing.clone(),
                parts.latency.clone(),
                metrics.clone(),
                parts.durable.clone(),
                parts.holds.clone(),
            )),
            engine: parts.engine,
            routing: parts.routing,
            meta: parts.meta,
            durable: parts.durable,
            holds: parts.holds,
            migrations: parts.migrations,
            copies: parts.copies,
            metrics,
            cfg,
            inner: Mutex::new(Inner {
                rules,
                pending: HashMap::new(),
            }),
            tracked: std::sync::atomic::AtomicBool::new(true),
            cmds,
            cmd_rx: Mutex::new(Some(rx)),
            streams: Mutex::new(BTreeMap::new()),
        })
    }

    fn lock(&self) -> InnerGuard<'_> {
        InnerGuard {
            guard: self.inner.lock().unwrap_or_else(|e| e.into_inner()),
            tracked: &self.tracked,
        }
    }

    /// Connects this node's migrations to the read-lease rules (see
    /// [`crate::migrate::ReadLeaseGate`]).
    pub fn gate_migrations(self: &Arc<Self>) {
        let me: Arc<dyn crate::migrate::ReadLeaseGate> = self.clone();
        self.migrations.set_read_lease_gate(Arc::downgrade(&me));
    }

    /// Whether a reply of `partition` waits on replication now.
    pub fn has_waited(&self, partition: PartitionId) -> bool {
        // No partition has a replica: nothing is waited for, and the lock
        // (taken by every write otherwise) is not needed. Set under the
        // lock, so this is as fresh as taking the lock a moment earlier.
        if !self.tracked.load(std::sync::atomic::Ordering::Acquire) {
            return false;
        }
        self.lock().rules.has_waited(partition, Instant::now())
    }

    /// Takes over the released reply of a write (or read) of `partition`
    /// at `seq`: sent once every waited-for replica acknowledged `seq`
    /// (then handed to `then`, if any), or answered [`NOT_CONFIRMED`].
    /// `in_sync` is the partition's in-sync set in the map it was admitted by.
    pub fn defer(
        &self,
        partition: PartitionId,
        seq: Seq,
        in_sync: &[NodeId],
        tx: oneshot::Sender<Frame>,
        frame: Frame,
        then: Option<Deferral>,
    ) {
        let mut inner = self.lock();
        let (id, cmds) = inner.rules.queue(partition, seq, in_sync, Instant::now());
        // Already covered (a read, or replicas ahead): released at once,
        // without the round trip through `pending` (every read of a
        // replicated partition comes here).
        if let [Command::Release { waiter, ok: true }] = cmds.as_slice()
            && *waiter == id
        {
            drop(inner);
            match then {
                Some(then) => then(tx, frame),
                None => {
                    let _ = tx.send(frame);
                }
            }
            return;
        }
        inner.pending.insert(id, Pending { tx, frame, then });
        self.finish(inner, cmds);
    }

    /// Runs `f` on the rules and executes its commands.
    fn with_rules(&self, f: impl FnOnce(&mut Rules) -> Vec<Command>) {
        let mut inner = self.lock();
        let cmds = f(&mut inner.rules);
        self.finish(inner, cmds);
    }

    /// Executes `cmds`: releases inline (after dropping the lock), the
    /// rest on the driver.
    fn finish(&self, mut inner: InnerGuard<'_>, cmds: Vec<Command>) {
        let mut out = Vec::new();
        for cmd in cmds {
            match cmd {
                Command::Release { waiter, ok } => {
                    if let Some(p) = inner.pending.remove(&waiter) {
                        out.push((p, ok));
                    }
                }
                other => {
                    let _ = self.cmds.send(other);
                }
            }
        }
        drop(inner);
        for (p, ok) in out {
            match (ok, p.then) {
                (true, Some(then)) => then(p.tx, p.frame),
                (true, None) => {
                    let _ = p.tx.send(p.frame);
                }
                (false, _) => {
                    self.metrics.not_confirmed.inc();
                    let _ = p.tx.send(Frame::Error(NOT_CONFIRMED.into()));
                }
            }
        }
    }

    /// The driver: feeds the rules every map and a tick, runs their
    /// commands, keeps the streams; until `shutdown`.
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let Some(mut rx) = self.cmd_rx.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return;
        };
        let mut changes = self.routing.subscribe();
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut seen: Option<Arc<PartitionMap>> = None;
        loop {
            tokio::select! {
                Some(cmd) = rx.recv() => self.spawn_command(cmd),
                r = changes.changed() => {
                    if r.is_err() {
                        break;
                    }
                    self.on_map(&mut seen);
                }
                _ = tick.tick() => {
                    let lease = self.routing.lease_valid();
                    let migrating = self.migrations.pushing_partitions();
                    self.with_rules(|r| {
                        let mut out = r.set_migrating(migrating);
                        out.extend(r.tick(Instant::now(), lease));
                        out
                    });
                    self.on_map(&mut seen);
                    self.publish_gauges();
                }
                _ = shutdown.changed() => break,
            }
        }
        for s in self
            .streams
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
        {
            s.stop();
        }
    }

    /// Feeds the rules a map not seen yet, each owned partition with its
    /// row in the previously seen map `seen` (a switchover is recognised
    /// by the two, see `rules.rs`).
    fn on_map(self: &Arc<Self>, seen: &mut Option<Arc<PartitionMap>>) {
        let map = self.routing.map();
        if seen.as_ref().map(|m| m.version) != Some(map.version) {
            let prev = seen.replace(map.clone());
            let prior = |p: &PartitionRecord| {
                let before = prev.as_ref()?.partitions.get(&p.id)?;
                (before.owner != self.me).then(|| rules::Prior {
                    owner: before.owner,
                    epoch: before.epoch,
                    in_sync_here: before.in_sync.contains(&self.me),
                    floor: self.replica.applied_seq(p.id),
                })
            };
            let rows: Vec<Row> = map
                .owned_by(self.me)
                .map(|p| Row {
                    id: p.id,
                    epoch: p.epoch,
                    range: crate::migrate::receive::storage_range(p),
                    replicas: p.replicas.clone(),
                    in_sync: p.in_sync.clone(),
                    prior: prior(p),
                    replica_applied: self.replica.applied_seq(p.id),
                })
                .collect();
            let mut kept = 0;
            self.with_rules(|r| {
                let before = r.kept_in_sync();
                let out = r.map_installed(&rows, Instant::now());
                kept = r.kept_in_sync() - before;
                out
            });
            if kept > 0 {
                self.metrics.switchover_kept_in_sync.inc_by(kept);
                tracing::info!(kept, "switchover: old primary kept in sync, no copy");
            }
        }
        self.sync_streams(&map);
    }

    /// One stream per replica node the rules know; lost streams start over
    /// once nothing waits on them.
    fn sync_streams(self: &Arc<Self>, map: &PartitionMap) {
        let now = Instant::now();
        // Lock order: the streams, then the rules (`Stream::start`).
        let lost: Vec<NodeId> = self
            .streams
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, s)| s.is_lost())
            .map(|(r, _)| *r)
            .collect();
        let (wanted, restartable): (Vec<NodeId>, Vec<NodeId>) = {
            let inner = self.lock();
            let wanted = inner.rules.replica_nodes().into_iter().collect();
            let restartable = lost
                .into_iter()
                .filter(|r| inner.rules.may_restart_stream(*r, now))
                .collect();
            (wanted, restartable)
        };
        let mut streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        for r in restartable {
            if let Some(s) = streams.remove(&r) {
                s.stop();
            }
        }
        streams.retain(|r, s| {
            let keep = wanted.contains(r);
            if !keep {
                s.stop();
            }
            keep
        });
        for r in wanted {
            if streams.contains_key(&r) {
                continue;
            }
            let Some(addr) = map.nodes.get(&r).map(|n| n.admin_addr.clone()) else {
                continue;
            };
            match Stream::start(self, r, &addr) {
                Ok(stream) => {
                    streams.insert(r, stream);
                }
                Err(e) => tracing::warn!(replica = %r, %e, "cannot start a replication stream"),
            }
        }
    }

    fn stream(&self, replica: NodeId) -> Option<Arc<Stream>> {
        self.streams
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&replica)
            .cloned()
    }

    fn spawn_command(self: &Arc<Self>, cmd: Command) {
        match cmd {
            Command::Release { .. } => unreachable!("released inline"),
            Command::Cas {
                partition,
                epoch,
                change,
            } => {
                tokio::spawn(cas::run(self.clone(), partition, epoch, change));
            }
            Command::StartCopy { partition, replica } => {
                self.metrics.copies_started.inc();
                self.sync_streams(&self.routing.map());
                match self.stream(replica) {
                    Some(stream) => {
                        tokio::spawn(copy::run(self.clone(), stream, partition, replica));
                    }
                    None => self
                        .lock()
                        .rules
                        .copy_failed(partition, replica, Instant::now()),
                }
            }
        }
    }

    fn publish_gauges(&self) {
        let inner = self.lock();
        let now = Instant::now();
        let last = self.engine.last_seq();
        let mut oldest: BTreeMap<PartitionId, Duration> = BTreeMap::new();
        for w in inner.rules.waiters().values() {
            let age = now.saturating_duration_since(w.since);
            let e = oldest.entry(w.partition).or_default();
            *e = (*e).max(age);
        }
        // Only partitions this node replicates now.
        self.metrics.lag_records.clear();
        self.metrics.lag_ms.clear();
        self.metrics.in_sync_copies.clear();
        for (pid, p) in inner.rules.parts() {
            let lag = p
                .replicas
                .keys()
                .map(|r| last.saturating_sub(inner.rules.acked_for(*pid, *r)))
                .max()
                .unwrap_or(0);
            let label = metrics::PartitionLabel { partition: pid.0 };
            self.metrics
                .lag_records
                .get_or_create(&label)
                .set(lag as i64);
            self.metrics
                .lag_ms
                .get_or_create(&label)
                .set(oldest.get(pid).map_or(0, |d| d.as_millis() as i64));
            let in_sync = p
                .replicas
                .values()
                .filter(|s| **s == rules::ReplicaState::InSync)
                .count();
            self.metrics
                .in_sync_copies
                .get_or_create(&label)
                .set(1 + in_sync as i64);
        }
    }

    /// This node's replication roles (`/status`).
    pub fn status(&self) -> ReplicationStatus {
        let inner = self.lock();
        let last = self.engine.last_seq();
        let mut roles = Vec::new();
        for (pid, p) in inner.rules.parts() {
            for (r, s) in &p.replicas {
                let acked = inner.rules.acked_for(*pid, *r);
                roles.push(RoleView {
                    partition: pid.0,
                    role: "primary",
                    peer: r.0,
                    state: s.label().to_string(),
                    epoch: p.epoch.0,
                    acked_seq: Some(acked),
                    lag_records: Some(last.saturating_sub(acked)),
                });
            }
        }
        drop(inner);
        let map = self.routing.map();
        for p in map
            .partitions
            .values()
            .filter(|p| p.replicas.contains(&self.me))
        {
            let state = match p.in_sync.contains(&self.me) {
                true if self.routing.replica_read_valid(p.id, p.epoch) => "in_sync_serving_reads",
                true => "in_sync",
                false => "catching_up",
            };
            roles.push(RoleView {
                partition: p.id.0,
                role: "replica",
                peer: p.owner.0,
                state: state.to_string(),
                epoch: p.epoch.0,
                acked_seq: None,
                lag_records: None,
            });
        }
        ReplicationStatus {
            durable_seq: self.durable.get(&*self.engine),
            waiting_replies: self.lock().pending.len(),
            copies_started: self.metrics.copies_started.get(),
            switchover_kept_in_sync: self.metrics.switchover_kept_in_sync.get(),
            stream_opens: self.metrics.stream_opens.get(),
            roles,
        }
    }
}

/// The `replication` field of `/status`.
#[derive(Serialize, Debug, Clone)]
pub struct ReplicationStatus {
    /// The last seq covered by an fsync (what streams ship up to).
    pub durable_seq: Seq,
    /// Replies waiting for replicas now.
    pub waiting_replies: usize,
    /// Catch-up copies this node started as primary since it started.
    pub copies_started: u64,
    /// Old primaries that switchovers to this node kept in sync (no copy).
    pub switchover_kept_in_sync: u64,
    /// `ReplicateStream`s this node's streams opened since it started
    /// (`keyway_replication_stream_opens`): one per stream start, and one
    /// after each failure.
    pub stream_opens: u64,
    pub roles: Vec<RoleView>,
}

/// One replica role of this node in `/status`.
#[derive(Serialize, Debug, Clone)]
pub struct RoleView {
    pub partition: u64,
    /// `primary` (this node streams to `peer`) or `replica` (of `peer`).
    pub role: &'static str,
    pub peer: u64,
    pub state: String,
    pub epoch: u64,
    /// Primary side: the stream's acknowledged seq and the lag behind the last seq.
    pub acked_seq: Option<Seq>,
    pub lag_records: Option<Seq>,
}

/// Runs engine work on the blocking pool (fjall blocks).
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, keyway_storage::StorageError> + Send + 'static,
) -> Result<T, keyway_storage::StorageError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| keyway_storage::StorageError::Failed(format!("engine task failed: {e}")))?
}

impl crate::migrate::ReadLeaseGate for Replication {
    fn stop_read_leases(&self, partition: PartitionId) -> Option<Instant> {
        self.lock().rules.stop_read_leases(partition)
    }
}
