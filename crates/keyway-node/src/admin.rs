//! The admin HTTP port: `/metrics` (Prometheus text), `/map` (the node's
//! partition map as JSON), `/status` (this node at a glance, JSON) and
//! `/hotkeys` (per owned partition, the sampled hot keys, JSON), plus
//! the `Peer` gRPC service of [`crate::peer`] (migration data plane).

use crate::server::Shared;
use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Json};
use axum::routing::get;
use serde::Serialize;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Serves the admin routes until shutdown.
pub async fn serve(
    shared: Arc<Shared>,
    listener: TcpListener,
    mut shutdown: watch::Receiver<bool>,
) {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/map", get(map))
        .route("/status", get(status))
        .route("/hotkeys", get(hotkeys))
        .with_state(shared.clone());
    // The migration data plane (`Peer` gRPC, h2c) shares this port.
    let service = crate::peer::PeerService::for_node(
        shared.engine.clone(),
        crate::peer::NodeRoles {
            migrations: shared.migrations.clone(),
            routing: shared.routing.clone(),
            latency: shared.executor.latency().clone(),
            stats: shared.stats.clone(),
            snapshot_hold: std::time::Duration::from_millis(shared.config.log_snapshot_hold_ms),
        },
    );
    let app = crate::peer::merge_routes(app, service);
    let stop = async move {
        let _ = shutdown.changed().await;
    };
    if let Err(err) = axum::serve(nodelay(listener), app)
        .with_graceful_shutdown(stop)
        .await
    {
        tracing::error!(%err, "admin HTTP server failed");
    }
}

/// `listener` with `TCP_NODELAY` on every accepted connection. HTTP/2 (the
/// `Peer` gRPC service) writes a reply as several small frames; with Nagle's
/// algorithm the second waits for the peer's delayed ACK, up to 40 ms, on
/// every call — measured here as 40 ms added to each migration's cutover
/// pause (the wait for the target's view) before this was set.
pub fn nodelay(
    listener: tokio::net::TcpListener,
) -> impl axum::serve::Listener<Io = tokio::net::TcpStream, Addr = std::net::SocketAddr> {
    use axum::serve::ListenerExt;
    listener.tap_io(|tcp| {
        if let Err(err) = tcp.set_nodelay(true) {
            tracing::debug!(%err, "cannot set TCP_NODELAY");
        }
    })
}

async fn metrics(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    crate::watcher::publish_gauges(&shared);
    shared.stats.publish_gauges();
    shared
        .log_gc
        .observe(&*shared.engine, shared.migrations.holds().list().len());
    shared
        .metrics
        .lease_remaining_ms
        .set(shared.routing.lease_remaining_ms() as i64);
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        shared.metrics.encode(),
    )
}

/// `/hotkeys`: per owned partition, the sampled hot keys (see [`crate::stats`]).
async fn hotkeys(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    Json(shared.stats.hot_keys_view())
}

async fn map(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    Json((*shared.routing.map()).clone())
}

/// `/status`: who this node is and whether it is serving.
#[derive(Serialize)]
pub struct Status {
    pub node_id: String,
    pub resp_addr: String,
    pub admin_addr: String,
    pub serving: bool,
    pub lease_remaining_ms: u64,
    pub map_version: u64,
    pub partitions_owned: usize,
    pub clients: usize,
    pub durability: crate::Durability,
    pub last_seq: u64,
    /// The change log: retained range and size, and what holds it.
    pub change_log: ChangeLogStatus,
    /// Keys removed by the active expiry pass since start.
    pub expired_keys_removed: u64,
}

/// The `change_log` field of `/status`.
#[derive(Serialize)]
pub struct ChangeLogStatus {
    /// Oldest seq retained (`log_start`).
    pub first_seq: u64,
    pub last_seq: u64,
    pub records: u64,
    pub bytes: u64,
    pub retention_bytes: u64,
    pub holds: Vec<crate::log_gc::HoldView>,
}

async fn status(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    let map = shared.routing.map();
    Json(Status {
        node_id: shared.me.to_string(),
        resp_addr: shared.resp_addr.clone(),
        admin_addr: shared.admin_addr.clone(),
        serving: shared.routing.lease_valid(),
        lease_remaining_ms: shared.routing.lease_remaining_ms(),
        map_version: map.version.0,
        partitions_owned: map.owned_by(shared.me).count(),
        clients: shared.clients.load(std::sync::atomic::Ordering::SeqCst),
        durability: shared.config.durability,
        last_seq: shared.engine.last_seq(),
        change_log: ChangeLogStatus {
            first_seq: shared.engine.log_start(),
            last_seq: shared.engine.last_seq(),
            records: (shared.engine.last_seq() + 1).saturating_sub(shared.engine.log_start()),
            bytes: shared.engine.log_bytes(),
            retention_bytes: shared.config.log_retention_bytes,
            holds: shared.migrations.holds().list(),
        },
        expired_keys_removed: shared.active_expiry.removed.get(),
    })
}
