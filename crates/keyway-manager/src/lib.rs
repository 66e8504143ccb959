//! The Keyway manager: decides and drives moves (splits, merges and
//! recovery later), off the request path, and leader-elected so that
//! exactly one `keyway manager` acts at a time.
//!
//! [`Seat`] runs the election loop against the metadata store's leader
//! election (`MetaStore::campaign` & co. on a session lease) and publishes
//! [`SeatState`]; [`Driver`] carries out live partition migrations (the
//! `keyway-migration` state machine) while the seat leads; [`Manager`] runs
//! both and the admin HTTP port (`/status`, `/migrations`, `/metrics`).
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
//! - `admin.rs`: the admin HTTP routes.
//! - `metrics.rs`: [`Metrics`].

pub mod admin;
pub mod decisions;
pub mod driver;
pub mod fencing;
pub mod metrics;
pub mod seat;
pub mod stats;

pub use decisions::{Decision, DecisionLog};
pub use driver::{
    Driver, DriverConfig, DriverError, DriverView, MigrationPeers, MigrationSummary, PeerAddr,
    RpcPeers, request_abort, request_move,
};
pub use fencing::{FencingGate, Verdict};
pub use metrics::Metrics;
pub use seat::{MANAGER_ELECTION, Seat, SeatConfig, SeatState, SeatView};
pub use stats::{ClusterLoad, HotKey, LoadSnapshot, PartitionLoad, StatsSource};

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
}

impl ManagerConfig {
    /// Checks every part; the error names the first bad setting.
    pub fn validate(&self) -> Result<(), String> {
        self.driver.validate().map_err(|e| e.to_string())
    }
}

/// A running manager: the seat, the migration driver and the admin port.
pub struct Manager {
    seat: Seat,
    driver: Driver,
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
        let ManagerConfig { driver } = config;
        let listener = tokio::net::TcpListener::bind(admin_listen).await?;
        let admin_addr = listener.local_addr()?;
        let metrics = Arc::new(Metrics::new());
        let decisions = DecisionLog::new(&metrics);
        let seat = Seat::start(meta.clone(), seat, metrics.clone());
        let driver = Driver::start(meta, seat.view(), driver, metrics.clone());
        let (admin_stop, stop_rx) = watch::channel(false);
        let admin = tokio::spawn(admin::serve(
            seat.view(),
            metrics,
            driver.view(),
            decisions.clone(),
            listener,
            stop_rx,
        ));
        Ok(Manager {
            seat,
            driver,
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

    /// Stops the migration driver, resigns (if leading), revokes the lease,
    /// stops the admin port.
    pub async fn shutdown(self) {
        self.driver.shutdown().await;
        self.seat.shutdown().await;
        let _ = self.admin_stop.send(true);
        let _ = self.admin.await;
    }
}
