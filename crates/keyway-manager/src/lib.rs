//! The Keyway manager: decides and drives moves, splits, merges and
//! recovery (later), off the request path, and leader-elected so that
//! exactly one `keyway manager` acts at a time.
//!
//! For now it is the seat: [`Seat`] runs the election loop against the
//! metadata store's leader election (`MetaStore::campaign` & co. on a
//! session lease) and publishes [`SeatState`]; [`Manager`] adds the admin
//! HTTP port (`/status`, `/metrics`). Whatever work the manager does as
//! leader must check [`SeatView::leading`] before each step: it turns false
//! at the lease deadline by this process's own clock, before the store can
//! hand the seat to a standby.
//!
//! # Layout
//! - `seat.rs`: [`Seat`], [`SeatConfig`], [`SeatState`], [`SeatView`].
//! - `fencing.rs`: [`FencingGate`]: never reassign from a node before its
//!   lease expired in the store plus the margin.
//! - `admin.rs`: the admin HTTP routes.
//! - `metrics.rs`: [`Metrics`].

pub mod admin;
pub mod fencing;
pub mod metrics;
pub mod seat;

pub use fencing::{FencingGate, Verdict};
pub use metrics::Metrics;
pub use seat::{MANAGER_ELECTION, Seat, SeatConfig, SeatState, SeatView};

use keyway_meta::MetaStore;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A running manager: the seat and the admin port.
pub struct Manager {
    seat: Seat,
    admin_addr: SocketAddr,
    admin_stop: watch::Sender<bool>,
    admin: JoinHandle<()>,
}

impl Manager {
    /// Binds the admin port and starts campaigning.
    pub async fn start(
        meta: Arc<dyn MetaStore>,
        seat: SeatConfig,
        admin_listen: SocketAddr,
    ) -> std::io::Result<Manager> {
        let listener = tokio::net::TcpListener::bind(admin_listen).await?;
        let admin_addr = listener.local_addr()?;
        let metrics = Arc::new(Metrics::new());
        let seat = Seat::start(meta, seat, metrics.clone());
        let (admin_stop, stop_rx) = watch::channel(false);
        let admin = tokio::spawn(admin::serve(seat.view(), metrics, listener, stop_rx));
        Ok(Manager {
            seat,
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

    /// Resigns (if leading), revokes the lease, stops the admin port.
    pub async fn shutdown(self) {
        self.seat.shutdown().await;
        let _ = self.admin_stop.send(true);
        let _ = self.admin.await;
    }
}
