//! The Keyway manager: decides and drives moves, splits and merges
//! (recovery later), off the request path, and leader-elected so that
//! exactly one `keyway manager` acts at a time.
//!
//! [`Seat`] runs the election loop against the metadata store's leader
//! election (`MetaStore::campaign` & co. on a session lease) and publishes
//! [`SeatState`]; [`Driver`] carries out live partition migrations (the
//! `keyway-migration` state machine) while the seat leads; [`Splitter`]
//! splits big or hot partitions and merges cold neighbours from each load
//! round; [`Manager`] runs them and the admin HTTP port (`/status`,
//! `/migrations`, `/decisions`, `/metrics`).
//! Whatever work the manager does as leader must check
//! [`SeatView::leading`] before each step: it turns false at the lease
//! deadline by this process's own clock, before the store can hand the seat
//! to a standby.
//!
//! # Layout
//! - `seat.rs`: [`Seat`], [`SeatConfig`], [`SeatState`], [`SeatView`].
//! - `fencing.rs`: [`FencingGate`]: never reassign from a node before its
//!   lease expired in the store plus the margin.
//! - `driver/`: the migration driver. `mod.rs`: [`Driver`],
//!   [`DriverConfig`], [`DriverError`], the discovery loop, the live view
//!   behind `/migrations`, and the operator calls [`request_move`] and
//!   [`request_abort`]; `run.rs`: one migration's task (batches, polling,
//!   reload on a failed persist or a changed generation); `actions.rs`: each
//!   command as store and node calls; `peers.rs`: [`MigrationPeers`] (the
//!   node calls, faked in the tests) and [`RpcPeers`] over `PeerClient`;
//!   `tests/`: the driver against an embedded store and two in-memory nodes.
//! - `keyspace.rs`: [`create_keyspace`] (placement and one guarded commit)
//!   and listing keyspaces.
//! - `stats.rs`: the load types ([`ClusterLoad`], [`PartitionLoad`]) and
//!   [`StatsSource`]; `stats_rpc.rs`: [`RpcStats`], over the nodes'
//!   `PartitionStats` RPC; `monitor.rs`: [`LoadMonitor`], the leader's
//!   periodic load round published on a `watch` channel, the skew gauges and
//!   `/load`.
//! - `split/`: splits, one metadata CAS each. `mod.rs`: the process,
//!   [`SplitAt`], [`SplitError`], [`SplitConfig`]; `plan.rs`: split points
//!   and the transaction (pure); `apply.rs`: [`split_partition`] against the
//!   store; `decide.rs`: the split policy (pure); `history.rs`: births, for
//!   the cooldowns; `tests.rs`.
//! - `merge/`: merges of cold neighbours. `mod.rs`: the process,
//!   [`MergeConfig`], [`MergeError`], the transaction and
//!   [`merge_partitions`]; `decide.rs`: the merge policy (pure); `tests.rs`.
//! - `splitter.rs`: [`Splitter`], the loop that runs both policies on every
//!   load snapshot while leading, records every decision, and its metrics.
//! - `rebalance/`: the rebalancer. `mod.rs`: [`Rebalancer`] (the leader's
//!   loop: node liveness, planning within the caps, `request_move`, the
//!   decisions and metrics); `plan.rs`: the pure planner; `config.rs`:
//!   [`RebalanceConfig`]; `nodes.rs`: Up/Down from the leases and the
//!   operator's drain, weight and decommission; `tests.rs`, `loop_tests.rs`.
//! - `replication/`: failover (promote an in-sync replica once the
//!   primary's lease is gone past `failover_margin_ms`), the replica
//!   membership reconciler (keep every partition at its replication factor)
//!   and the in-sync observer (every in-sync change in `/decisions`); pure
//!   plans in `failover.rs` and `membership.rs`, the loop in `run.rs`.
//! - `switchover.rs`: the planned switchover (`Switchover` Peer RPC on the
//!   primary) for `keyway ctl failover` and `ctl drain`.
//! - `copies.rs`: [`copies::CopyTracker`]: the copies the nodes report in
//!   the load rounds, with bytes remaining, rate and ETA;
//!   [`copies::CopyTracker::copy_progress`].
//! - `admin.rs`: the admin HTTP routes.
//! - `ui.rs`, `ui/`: the live dashboard at `/ui` ([`ui::Ui`]: the page,
//!   `/ui/state`, the skew history).
//! - `metrics.rs`: [`Metrics`].

pub mod admin;
pub mod copies;
pub mod decisions;
pub mod driver;
pub mod fencing;
pub mod keyspace;
pub mod merge;
pub mod metrics;
pub mod monitor;
pub mod rebalance;
pub mod replication;
pub mod seat;
pub mod split;
pub mod splitter;
pub mod stats;
pub mod stats_rpc;
pub mod switchover;
pub mod ui;

pub use decisions::{Decision, DecisionLog};
pub use driver::{
    Driver, DriverConfig, DriverError, DriverView, MigrationPeers, MigrationSummary, PeerAddr,
    RpcPeers, request_abort, request_move,
};
pub use fencing::{FencingGate, Verdict};
pub use keyspace::{KeyspaceError, create_keyspace, create_keyspace_with, set_replication};
pub use merge::{MergeConfig, MergeError, merge_partitions};
pub use metrics::Metrics;
pub use monitor::{LoadMonitor, LoadReceiver, MonitorConfig};
pub use rebalance::{RebalanceConfig, Rebalancer};
pub use replication::{
    PrimaryMove, PrimaryMoveError, ReplicaMove, ReplicaMoveError, Replication, ReplicationConfig,
    ReplicationStatus, ReplicationView, request_move_back, request_primary_move,
    request_replica_move,
};
pub use seat::{MANAGER_ELECTION, Seat, SeatConfig, SeatState, SeatView};
pub use split::{SplitAt, SplitConfig, SplitError, split_partition};
pub use splitter::Splitter;
pub use stats::{ClusterLoad, HotKey, LoadSnapshot, PartitionLoad, StatsSource};
pub use stats_rpc::RpcStats;
pub use switchover::{SwitchoverError, SwitchoverOutcome, switch_primaries_away, switchover};

use keyway_meta::MetaStore;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Everything a manager is configured with, one part per duty.
#[derive(Clone, Debug, Default)]
pub struct ManagerConfig {
    /// The migration driver.
    pub driver: DriverConfig,
    /// The load monitor (the nodes' statistics, gathered while leading).
    pub monitor: MonitorConfig,
    /// Automatic splits (the splitter).
    pub split: SplitConfig,
    /// Automatic merges of cold neighbours (the splitter).
    pub merge: MergeConfig,
    /// The rebalancer (moves, drains, node liveness).
    pub rebalance: RebalanceConfig,
    /// Failover and replica membership.
    pub replication: ReplicationConfig,
    /// The dashboard (`/ui`).
    pub ui: ui::UiConfig,
    /// The admin listener's cluster secret, limits and loopback opt-out.
    pub admin: keyway_auth::AdminSecurity,
}

impl ManagerConfig {
    /// Checks every part; the error names the first bad setting.
    pub fn validate(&self) -> Result<(), String> {
        self.driver.validate().map_err(|e| e.to_string())?;
        self.monitor.validate()?;
        self.split.validate()?;
        self.merge.validate()?;
        self.merge.validate_against(&self.split)?;
        self.rebalance.validate()?;
        self.replication.validate()?;
        self.ui.validate()
    }
}

/// A running manager: the seat, the migration driver and the admin port.
pub struct Manager {
    seat: Seat,
    driver: Driver,
    monitor: LoadMonitor,
    splitter: Splitter,
    rebalancer: Rebalancer,
    replication: Replication,
    copies: copies::CopyTracker,
    copies_task: JoinHandle<()>,
    ui_task: JoinHandle<()>,
    admin_addr: SocketAddr,
    admin_stop: watch::Sender<bool>,
    admin: JoinHandle<()>,
}

impl Manager {
    /// Binds the admin port, starts campaigning and the migration driver
    /// (default [`ManagerConfig`]).
    pub async fn start(
        meta: Arc<dyn MetaStore>,
        seat: SeatConfig,
        admin_listen: SocketAddr,
    ) -> std::io::Result<Manager> {
        Self::start_with(meta, seat, admin_listen, ManagerConfig::default()).await
    }

    /// [`Manager::start`] with a configuration (refused with `InvalidInput`
    /// if it fails [`ManagerConfig::validate`]).
    pub async fn start_with(
        meta: Arc<dyn MetaStore>,
        seat: SeatConfig,
        admin_listen: SocketAddr,
        config: ManagerConfig,
    ) -> std::io::Result<Manager> {
        config
            .validate()
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let ManagerConfig {
            driver,
            monitor,
            split,
            merge,
            rebalance,
            replication,
            ui,
            admin: admin_security,
        } = config;
        admin_security
            .validate(admin_listen)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let listener = tokio::net::TcpListener::bind(admin_listen).await?;
        let admin_addr = listener.local_addr()?;
        let metrics = Arc::new(Metrics::new());
        let decisions = DecisionLog::new(&metrics);
        let seat = Seat::start(meta.clone(), seat, metrics.clone());
        let monitor = LoadMonitor::start(
            meta.clone(),
            seat.view(),
            Arc::new(RpcStats::new()),
            monitor,
            &metrics,
        );
        let splitter = Splitter::start(
            meta.clone(),
            seat.view(),
            monitor.subscribe(),
            split,
            merge,
            decisions.clone(),
            &metrics,
        );
        // One down grace for the rebalancer and re-replication.
        let replication = ReplicationConfig {
            down_grace_ms: rebalance.down_grace_ms,
            ..replication
        };
        let rebalancer = Rebalancer::start(
            meta.clone(),
            seat.view(),
            rebalance,
            monitor.subscribe(),
            decisions.clone(),
            &metrics,
        );
        // The nodes' copies, from the load rounds (recovery progress).
        let copies = copies::CopyTracker::default();
        let copies_task = copies.follow(monitor.subscribe());
        let replication = Replication::start(
            meta.clone(),
            seat.view(),
            replication,
            decisions.clone(),
            &metrics,
            copies.clone(),
        );
        let meta_for_ui = meta.clone();
        let driver = Driver::start(
            meta,
            seat.view(),
            driver,
            metrics.clone(),
            decisions.clone(),
        );
        let (ui, ui_task) = ui::Ui::start(
            &ui,
            meta_for_ui,
            seat.view(),
            driver.view(),
            decisions.clone(),
            monitor.subscribe(),
            replication.status(),
            copies.clone(),
            &metrics,
        );
        let (admin_stop, stop_rx) = watch::channel(false);
        let admin = tokio::spawn(admin::serve(
            seat.view(),
            metrics,
            driver.view(),
            decisions.clone(),
            monitor.subscribe(),
            replication.status(),
            ui,
            listener,
            admin_security,
            stop_rx,
        ));
        Ok(Manager {
            seat,
            driver,
            monitor,
            splitter,
            rebalancer,
            replication,
            copies,
            copies_task,
            ui_task,
            admin_addr,
            admin_stop,
            admin,
        })
    }

    pub fn seat(&self) -> &Seat {
        &self.seat
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// The migration driver's read handle.
    pub fn driver(&self) -> DriverView {
        self.driver.view()
    }

    /// Failover and replica membership as of the leader's last round.
    pub fn replication(&self) -> ReplicationView {
        self.replication.status().get()
    }

    /// The copies the nodes reported in the latest load round, with
    /// progress ([`copies::CopyTracker::copy_progress`]).
    pub fn copies(&self) -> copies::CopyTracker {
        self.copies.clone()
    }

    /// The load monitor's latest round (`None` while not leading).
    pub fn load(&self) -> LoadReceiver {
        self.monitor.subscribe()
    }

    /// Stops the migration driver and the load monitor, resigns (if
    /// leading), revokes the lease, stops the admin port.
    pub async fn shutdown(self) {
        self.splitter.shutdown().await;
        self.rebalancer.shutdown().await;
        self.replication.shutdown().await;
        self.driver.shutdown().await;
        self.monitor.shutdown().await;
        self.copies_task.abort();
        self.ui_task.abort();
        self.seat.shutdown().await;
        let _ = self.admin_stop.send(true);
        let _ = self.admin.await;
    }
}
