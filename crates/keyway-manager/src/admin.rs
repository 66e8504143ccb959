//! The admin HTTP port: `/status` (this manager at a glance, JSON),
//! `/migrations` (every migration record, JSON), `/decisions` (the recent
//! decisions of the manager's duties, JSON), `/load` (the latest load round,
//! JSON) and `/metrics` (Prometheus text).

use crate::decisions::DecisionLog;
use crate::driver::DriverView;
use crate::metrics::Metrics;
use crate::seat::SeatView;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Json};
use axum::routing::get;
use serde::Serialize;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::watch;

#[derive(Clone)]
struct Admin {
    seat: SeatView,
    metrics: Arc<Metrics>,
    migrations: DriverView,
    decisions: DecisionLog,
    load: crate::monitor::LoadReceiver,
    replication: crate::replication::ReplicationStatus,
}

/// Serves the admin routes until `shutdown` turns true (one read handle
/// per duty it reports on).
#[allow(clippy::too_many_arguments)]
pub async fn serve(
    seat: SeatView,
    metrics: Arc<Metrics>,
    migrations: DriverView,
    decisions: DecisionLog,
    load: crate::monitor::LoadReceiver,
    replication: crate::replication::ReplicationStatus,
    ui: crate::ui::Ui,
    listener: TcpListener,
    security: keyway_auth::AdminSecurity,
    mut shutdown: watch::Receiver<bool>,
) {
    let guard = security.guard(metrics.auth.clone());
    let body_limit = usize::try_from(security.limits.max_body_bytes).unwrap_or(usize::MAX);
    let app = Router::new()
        .route("/status", get(status))
        .route("/migrations", get(migrations_json))
        .route("/decisions", get(decisions_json))
        .route("/load", get(load_json))
        .route("/metrics", get(metrics_text))
        .with_state(Admin {
            seat,
            metrics,
            migrations,
            decisions,
            load,
            replication,
        })
        .merge(crate::ui::router(ui));
    // The cluster secret and the admin limits guard every route (merged
    // routes included): see keyway_auth::AdminGuard.
    let app = app
        .layer(guard)
        .layer(axum::extract::DefaultBodyLimit::max(body_limit));
    let stop = async move {
        while !*shutdown.borrow_and_update() {
            if shutdown.changed().await.is_err() {
                return;
            }
        }
    };
    if let Err(err) = axum::serve(keyway_peer::admin::nodelay(listener), app)
        .with_graceful_shutdown(stop)
        .await
    {
        tracing::error!(%err, "admin HTTP server failed");
    }
}

/// `/status`.
#[derive(Debug, Serialize)]
pub struct Status {
    /// This manager's candidate name.
    pub name: String,
    /// Whether this manager holds the seat and may act right now.
    pub leading: bool,
    /// Who leads, as far as this manager knows (`null`: nobody, or unknown).
    pub leader: Option<String>,
    /// Milliseconds left before this manager's own lease deadline.
    pub lease_remaining_ms: u64,
    /// Migrations over with a copy still left on an unreachable node.
    pub migration_stray_copies: u64,
    /// Failover and replica membership as of the leader's last round.
    pub replication: crate::replication::ReplicationView,
}

async fn status(State(admin): State<Admin>) -> impl IntoResponse {
    Json(Status {
        name: admin.seat.name().to_string(),
        leading: admin.seat.leading().is_some(),
        leader: admin.seat.leader(),
        lease_remaining_ms: admin.seat.lease_remaining().as_millis() as u64,
        migration_stray_copies: admin.migrations.stray_copies(),
        replication: admin.replication.get(),
    })
}

/// `/migrations`: every stored migration record (see
/// [`crate::driver::MigrationSummary`]), ordered by id; 503 when the
/// metadata store cannot be read.
async fn migrations_json(State(admin): State<Admin>) -> axum::response::Response {
    match admin.migrations.migrations().await {
        Ok(list) => Json(list).into_response(),
        Err(err) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({ "error": err.to_string() })),
        )
            .into_response(),
    }
}

/// `/decisions`: the kept decisions (see [`crate::decisions::Decision`]), oldest first.
async fn decisions_json(State(admin): State<Admin>) -> impl IntoResponse {
    Json(admin.decisions.recent())
}

/// `/load`: the load monitor's latest round (see [`crate::monitor::LoadView`]);
/// 503 while there is none.
async fn load_json(State(admin): State<Admin>) -> axum::response::Response {
    crate::monitor::load_response(&admin.load)
}

async fn metrics_text(State(admin): State<Admin>) -> impl IntoResponse {
    admin
        .metrics
        .lease_remaining_ms
        .set(admin.seat.lease_remaining().as_millis() as i64);
    admin
        .metrics
        .leading
        .set(i64::from(admin.seat.leading().is_some()));
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        admin.metrics.encode(),
    )
}
