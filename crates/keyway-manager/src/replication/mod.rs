//! Replication's control plane (issue 12): failover, replica membership and
//! the in-sync observer. The manager decides *membership* (who is in
//! `replicas`) and *failover* (who is owner after the owner's lease
//! expired); the primary decides its in-sync set (`keyway-node`).
//!
//! Every change is one compare-and-set at epoch + 1 conditional on the
//! row's `(owner, epoch)`, decided by pure functions from a freshly read map
//! (`failover.rs`, `membership.rs`) and carried out by the leader's loop
//! (`run.rs`), so a row that changed under a planned CAS is re-planned from
//! its new state the next round.
//!
//! # Layout
//! - `mod.rs`: [`ReplicationConfig`], [`ReplicationMetrics`],
//!   [`ReplicationView`] (`/status`), [`Replication`] (start / shutdown).
//! - `failover.rs`: [`Failover`]: who to promote, and why not (pure).
//! - `membership.rs`: the replica reconciler's plan (pure).
//! - `moves.rs`: replica moves: the durable intent and its next step (pure).
//! - `pmoves.rs`: primary moves by replica addition (issue 13): the record,
//!   its phases and next step (pure); `pmove_ops.rs`: the operator's calls
//!   (request, `--back`); `pmove_run.rs`: the loop carrying them out.
//! - `observe.rs`: the in-sync observer over the map watch.
//! - `run.rs`: the leader's loop: rounds, CASes, decisions, metrics.
//! - `tests.rs`, `moves_tests.rs`: the pure plans; `loop_tests.rs`: the
//!   loop against an embedded store.

mod failover;
#[cfg(test)]
mod loop_tests;
pub mod membership;
pub mod moves;
#[cfg(test)]
mod moves_tests;
pub mod observe;
#[cfg(test)]
mod pmove_loop_tests;
pub mod pmove_ops;
mod pmove_run;
pub mod pmoves;
#[cfg(test)]
mod pmoves_tests;
#[cfg(test)]
mod reads_from_tests;
#[cfg(test)]
mod recovery_tests;
mod run;
#[cfg(test)]
mod tests;

pub use failover::{Failover, FailoverPlan, Promotion, Waiting, promoted};
pub use membership::{MembershipChange, MembershipPlan, Recovery, Skipped};
pub use moves::{
    MoveOutcome, ReplicaMove, ReplicaMoveError, Step, read_replica_moves, request_replica_move,
};
pub use pmove_ops::{
    PrimaryMoveError, is_replicated, read_primary_moves, request_move_back, request_primary_move,
};
pub use pmoves::{PStep, Phase, PrimaryMove, PrimaryMoveOutcome};

use crate::decisions::DecisionLog;
use crate::metrics::{Metrics, OutcomeLabel, ReasonLabel};
use crate::seat::SeatView;
use keyway_meta::MetaStore;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use serde::Serialize;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The duty name in `/decisions` and `keyway_manager_decisions`.
pub const DUTY: &str = "replication";

/// The longest margin or interval accepted (a minute).
pub const MAX_REPLICATION_MS: u64 = 60_000;

/// Buckets of the failover-duration histogram, in milliseconds.
pub const FAILOVER_BUCKETS_MS: [f64; 12] = [
    10.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 1500.0, 2000.0, 3000.0, 5000.0, 10000.0, 30000.0,
];

/// Settings of failover and replica membership.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicationConfig {
    /// Promote an in-sync replica when a primary's lease is gone.
    pub failover: bool,
    /// How long a primary's lease must have been gone from the store before
    /// its partitions fail over. The node stops serving at its own deadline,
    /// `lease_margin_ms` before the store can expire its lease (invariant
    /// 4), so once the store's lease is gone the node has already stopped;
    /// this margin covers clock-rate differences between the node, the store
    /// and this manager on top of that, and defaults to the node's default
    /// `lease_margin_ms` (1000 ms). 0 is refused: it would leave only the
    /// node's own margin between two primaries.
    pub failover_margin_ms: u64,
    /// Keep every partition at its keyspace's replication factor (add and
    /// remove replicas).
    pub reconcile: bool,
    /// How often the leader checks the leases and the copy counts. Failover
    /// time is at most lease TTL + margin + this (+ the CAS).
    pub interval_ms: u64,
    /// A replica move whose target is not in sync this long after it was
    /// requested is abandoned (the target removed again, the source kept).
    pub replica_move_timeout_ms: u64,
    /// A node whose lease has been gone this long is dead: its replicas are
    /// replaced (re-replication). Not a flag of its own: the manager copies
    /// the rebalancer's `down_grace_ms` here at start (one grace).
    pub down_grace_ms: u64,
    /// Re-replication copies in flight (replicas not yet in sync) one target
    /// node may have before it gets no further replacement replica.
    pub recovery_max_copies_per_node: usize,
    /// Re-replication copies in flight over the whole cluster.
    pub recovery_max_copies: usize,
    /// Decommission a node that has held no lease this long and owns and
    /// holds nothing (its copies re-replicated), ms; 0 = never.
    pub auto_decommission_after_ms: u64,
}

/// The longest `auto_decommission_after_ms` accepted (a week).
pub const MAX_AUTO_DECOMMISSION_AFTER_MS: u64 = 7 * 24 * 3_600_000;

/// The largest `recovery_max_copies_per_node` / `recovery_max_copies` accepted.
pub const MAX_RECOVERY_COPIES: usize = 1_024;

impl Default for ReplicationConfig {
    fn default() -> Self {
        ReplicationConfig {
            failover: true,
            failover_margin_ms: 1_000,
            reconcile: true,
            interval_ms: 250,
            replica_move_timeout_ms: moves::DEFAULT_REPLICA_MOVE_TIMEOUT_MS,
            down_grace_ms: 300_000,
            recovery_max_copies_per_node: 2,
            recovery_max_copies: 16,
            auto_decommission_after_ms: 0,
        }
    }
}

impl ReplicationConfig {
    /// Checks every field; the error names the first bad setting.
    pub fn validate(&self) -> Result<(), String> {
        if self.failover_margin_ms == 0 || self.failover_margin_ms > MAX_REPLICATION_MS {
            return Err(format!(
                "failover_margin_ms must be in 1..={MAX_REPLICATION_MS}, got {}",
                self.failover_margin_ms
            ));
        }
        if self.interval_ms == 0 || self.interval_ms > MAX_REPLICATION_MS {
            return Err(format!(
                "replication_interval_ms must be in 1..={MAX_REPLICATION_MS}, got {}",
                self.interval_ms
            ));
        }
        let max = moves::MAX_REPLICA_MOVE_TIMEOUT_MS;
        if self.replica_move_timeout_ms == 0 || self.replica_move_timeout_ms > max {
            return Err(format!(
                "replica_move_timeout_ms must be in 1..={max}, got {}",
                self.replica_move_timeout_ms
            ));
        }
        if self.auto_decommission_after_ms > MAX_AUTO_DECOMMISSION_AFTER_MS {
            return Err(format!(
                "auto_decommission_after_ms must be at most {MAX_AUTO_DECOMMISSION_AFTER_MS} (0 = off), got {}",
                self.auto_decommission_after_ms
            ));
        }
        for (name, v) in [
            (
                "recovery_max_copies_per_node",
                self.recovery_max_copies_per_node,
            ),
            ("recovery_max_copies", self.recovery_max_copies),
        ] {
            if v == 0 || v > MAX_RECOVERY_COPIES {
                return Err(format!(
                    "{name} must be in 1..={MAX_RECOVERY_COPIES}, got {v}"
                ));
            }
        }
        Ok(())
    }
}

/// The replication metrics (registered under `keyway_manager_*`).
#[derive(Clone)]
pub struct ReplicationMetrics {
    /// Primary moves ended, by outcome (`done`, `moved_back`, `abandoned`).
    pub primary_moves: Family<OutcomeLabel, Counter>,
    /// Live primary moves by phase.
    pub primary_move_phases: Family<PhaseLabel, Gauge>,
    /// Promotions committed, by reason (`lease_expired`).
    pub failovers: Family<ReasonLabel, Counter>,
    /// Lease gone first seen → promotion CAS committed, ms.
    pub failover_duration_ms: Histogram,
    /// Partitions with fewer in-sync copies than their replication factor.
    pub under_replicated: Gauge,
    /// Partitions whose primary is gone with no in-sync replica alive.
    pub offline: Gauge,
    /// Replicas added / removed by the reconciler.
    pub replicas_added: Counter,
    pub replicas_removed: Counter,
    /// In-sync changes seen in the map watch, by inferred reason.
    pub in_sync_changes_seen: Family<observe::InSyncLabel, Counter>,
    /// Replica moves ended, by outcome (`done`, `abandoned`).
    pub replica_moves: Family<OutcomeLabel, Counter>,
    /// Re-replication copies by state (`in_flight`: replacements not yet
    /// in sync; `throttled`: partitions waiting for a copy slot;
    /// `waiting_for_grace`: partitions with a replica on a node Down within
    /// the grace).
    pub recovery_copies: Family<StateLabel, Gauge>,
    /// Dead replicas removed after their replacement caught up.
    pub recovered: Counter,
    /// Nodes decommissioned by `auto_decommission_after_ms`.
    pub auto_decommissions: Counter,
    /// The running copies the nodes reported in the latest load round:
    /// bytes left against the senders' estimates, and their summed rate.
    pub copy_bytes_remaining: Gauge,
    pub copy_rate_bytes_per_sec: Gauge,
}

/// The `phase` label of `keyway_manager_primary_move_phases`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct PhaseLabel {
    pub phase: &'static str,
}

/// The `state` label of `keyway_manager_recovery_copies`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct StateLabel {
    pub state: &'static str,
}

impl ReplicationMetrics {
    pub fn register(metrics: &Metrics) -> Self {
        let m = ReplicationMetrics {
            primary_moves: Family::default(),
            primary_move_phases: Family::default(),
            failovers: Family::default(),
            failover_duration_ms: Histogram::new(FAILOVER_BUCKETS_MS),
            under_replicated: Gauge::default(),
            offline: Gauge::default(),
            replicas_added: Counter::default(),
            replicas_removed: Counter::default(),
            in_sync_changes_seen: Family::default(),
            replica_moves: Family::default(),
            recovery_copies: Family::default(),
            recovered: Counter::default(),
            auto_decommissions: Counter::default(),
            copy_bytes_remaining: Gauge::default(),
            copy_rate_bytes_per_sec: Gauge::default(),
        };
        metrics.register(
            "primary_moves",
            "Primary moves by replica addition ended, by outcome (done, moved_back, abandoned)",
            m.primary_moves.clone(),
        );
        metrics.register(
            "primary_move_phases",
            "Live primary moves by phase (add_replica, wait_in_sync, reads_first, reads_hold, switch, fail_back_window, switch_back, remove_old, ending)",
            m.primary_move_phases.clone(),
        );
        metrics.register(
            "failovers",
            "Partitions failed over to an in-sync replica, by reason",
            m.failovers.clone(),
        );
        metrics.register(
            "failover_duration_ms",
            "From the old primary's lease first seen gone to the promotion committed, ms",
            m.failover_duration_ms.clone(),
        );
        metrics.register(
            "under_replicated_partitions",
            "Partitions with fewer in-sync copies (primary included) than their replication factor (capped at the node count)",
            m.under_replicated.clone(),
        );
        metrics.register(
            "offline_partitions",
            "Partitions whose primary's lease is gone past the margin with no in-sync replica alive to promote",
            m.offline.clone(),
        );
        metrics.register(
            "replicas_added",
            "Replicas the membership reconciler added",
            m.replicas_added.clone(),
        );
        metrics.register(
            "replicas_removed",
            "Replicas the membership reconciler removed (replication factor lowered)",
            m.replicas_removed.clone(),
        );
        metrics.register(
            "in_sync_changes_seen",
            "In-sync set changes seen in the map watch, by inferred reason",
            m.in_sync_changes_seen.clone(),
        );
        metrics.register(
            "replica_moves",
            "Replica moves ended, by outcome (done, abandoned)",
            m.replica_moves.clone(),
        );
        metrics.register(
            "recovery_copies",
            "Re-replication after a node down past the grace: in_flight (replacement replicas not yet in sync), throttled (partitions waiting for a copy slot), waiting_for_grace (partitions with a replica on a node Down within the grace)",
            m.recovery_copies.clone(),
        );
        metrics.register(
            "recovered_replicas",
            "Replicas on nodes down past the grace removed once their replacement was in sync",
            m.recovered.clone(),
        );
        metrics.register(
            "auto_decommissions",
            "Nodes removed by the manager after auto_decommission_after_ms without a lease, owning and holding nothing",
            m.auto_decommissions.clone(),
        );
        metrics.register(
            "copy_bytes_remaining",
            "Running copies (replica catch-ups, migration copies) as the nodes last reported them: payload bytes left against the senders' size estimates",
            m.copy_bytes_remaining.clone(),
        );
        metrics.register(
            "copy_rate_bytes_per_sec",
            "Running copies as the nodes last reported them: bytes sent per second, summed (over the last load round)",
            m.copy_rate_bytes_per_sec.clone(),
        );
        m
    }
}

/// `/status`'s `replication` field: the last round of the leader.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ReplicationView {
    pub failover_enabled: bool,
    pub failover_margin_ms: u64,
    pub reconcile_enabled: bool,
    pub failovers: u64,
    pub under_replicated_partitions: usize,
    /// Partitions waiting for a failover that cannot happen (no in-sync
    /// replica alive), by id.
    pub offline_partitions: Vec<u64>,
    pub replicas_added: u64,
    pub replicas_removed: u64,
    pub replica_move_timeout_ms: u64,
    /// Live replica moves with their phase, by id.
    pub replica_moves: Vec<ReplicaMoveView>,
    pub replica_moves_done: u64,
    pub replica_moves_abandoned: u64,
    /// Re-replication: see [`RecoveryView`].
    pub recovery: RecoveryView,
    /// Live primary moves (issue 13), by id.
    pub primary_moves: Vec<PrimaryMoveView>,
    pub primary_moves_done: u64,
    pub primary_moves_moved_back: u64,
    pub primary_moves_abandoned: u64,
}

/// One live primary move in `/status`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PrimaryMoveView {
    #[serde(flatten)]
    pub record: PrimaryMove,
    /// What the move waits for this round (`catching_up`,
    /// `reads_first_hold`, `fail_back_window`, `switching`, ...), or the
    /// action it took.
    pub doing: &'static str,
    /// Ms left in the fail-back window (`ctl move --back` is possible while > 0).
    pub fail_back_left_ms: Option<u64>,
}

/// `/status`'s `replication.recovery` (and `keyway ctl recovery`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RecoveryView {
    pub down_grace_ms: u64,
    pub max_copies_per_node: usize,
    pub max_copies: usize,
    /// Nodes down past the grace (their replicas are being replaced).
    pub dead_nodes: Vec<u64>,
    /// Nodes Down within the grace, with the ms left before recovery starts.
    pub waiting_for_grace: Vec<GraceWait>,
    /// Replacement replicas not yet in sync: (partition, target node),
    /// with the copy's progress as the primary last reported it.
    pub copies_in_flight: Vec<RecoveryCopy>,
    /// Every copy running in the cluster (replica catch-ups and migration
    /// copies), as the nodes reported them in the latest load round, and
    /// their totals: bytes remaining, rate, ETA (see [`crate::copies`]).
    pub copies_running: Vec<crate::copies::CopyProgress>,
    pub copy_totals: crate::copies::CopyTotals,
    /// Partitions waiting for a copy slot.
    pub throttled_partitions: Vec<u64>,
    /// Dead replicas removed since this manager started.
    pub recovered_replicas: u64,
    /// 0 = off.
    pub auto_decommission_after_ms: u64,
    /// Nodes this manager decommissioned automatically.
    pub auto_decommissioned: Vec<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GraceWait {
    pub node: u64,
    pub left_ms: u64,
    /// Partitions with a copy on it.
    pub partitions: usize,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RecoveryCopy {
    pub partition: u64,
    pub target: u64,
    /// The catch-up's progress (`None`: the primary has not reported a
    /// copy to the target yet: not started, or the next load round is due).
    pub progress: Option<crate::copies::CopyProgress>,
}

/// One live replica move in `/status`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReplicaMoveView {
    #[serde(flatten)]
    pub intent: ReplicaMove,
    /// `adding_target`, `catching_up`, `removing_source`, `ending`.
    pub phase: &'static str,
}

/// A shared, cheap-to-clone handle on the [`ReplicationView`].
#[derive(Clone, Default)]
pub struct ReplicationStatus(Arc<Mutex<ReplicationView>>);

impl ReplicationStatus {
    pub fn get(&self) -> ReplicationView {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn update(&self, f: impl FnOnce(&mut ReplicationView)) {
        f(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()));
    }
}

/// The running duty: the leader's loop and the in-sync observer.
pub struct Replication {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    status: ReplicationStatus,
}

impl Replication {
    /// Starts both. `config` must pass [`ReplicationConfig::validate`]
    /// (panics otherwise).
    pub fn start(
        meta: Arc<dyn MetaStore>,
        seat: SeatView,
        config: ReplicationConfig,
        decisions: DecisionLog,
        metrics: &Metrics,
        copies: crate::copies::CopyTracker,
    ) -> Replication {
        if let Err(e) = config.validate() {
            panic!("Replication::start: {e}");
        }
        let (stop, stop_rx) = watch::channel(false);
        let m = ReplicationMetrics::register(metrics);
        let status = ReplicationStatus::default();
        status.update(|v| {
            v.failover_enabled = config.failover;
            v.failover_margin_ms = config.failover_margin_ms;
            v.reconcile_enabled = config.reconcile;
            v.replica_move_timeout_ms = config.replica_move_timeout_ms;
            v.recovery.down_grace_ms = config.down_grace_ms;
            v.recovery.max_copies_per_node = config.recovery_max_copies_per_node;
            v.recovery.max_copies = config.recovery_max_copies;
            v.recovery.auto_decommission_after_ms = config.auto_decommission_after_ms;
        });
        let observer = tokio::spawn(observe::run(
            meta.clone(),
            decisions.clone(),
            m.in_sync_changes_seen.clone(),
            stop_rx.clone(),
        ));
        let state = run::Loop::new(meta, seat, config, decisions, m, status.clone(), copies);
        let lp = tokio::spawn(state.run(stop_rx));
        Replication {
            stop,
            tasks: vec![observer, lp],
            status,
        }
    }

    pub fn status(&self) -> ReplicationStatus {
        self.status.clone()
    }

    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
    }
}
