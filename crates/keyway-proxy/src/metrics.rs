//! The proxy's Prometheus metrics and its admin HTTP port: `/metrics`
//! (Prometheus text) and `/status` (JSON: readiness, map version, clients,
//! requests, rejections followed, upstream errors).
//!
//! Counters are registered without a `_total` suffix: prometheus-client adds
//! it (and panics in debug builds if the name already ends with it).

use crate::server::Core;
use axum::Router as HttpRouter;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Json};
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use serde::Serialize;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Label of a counter split by kind.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

/// Every metric a proxy exports.
pub struct Metrics {
    registry: Mutex<Registry>,
    /// The admin guard's refusals (`keyway_proxy_auth_refused`, `..._admin_limited`).
    pub auth: keyway_auth::AuthMetrics,
    /// Open client connections.
    pub clients: Gauge,
    pub clients_refused: Counter,
    /// Failed TLS handshakes and protected-mode refusals ([`keyway_tls::AccessMetrics`]).
    pub access: keyway_tls::AccessMetrics,
    /// Client requests, by how they were served (`local`, `forwarded`, `multikey`).
    pub requests: Family<KindLabel, Counter>,
    /// Client requests of every kind (the `/status` total).
    pub requests_total: Counter,
    /// Latency of forwarded requests, retries included.
    pub request_seconds: Histogram,
    /// Node rejections followed by a retry, by kind (`kwmoved`, `moved`,
    /// `clusterdown`, `unknown_keyspace`).
    pub rejections: Family<KindLabel, Counter>,
    pub rejections_total: Counter,
    /// Failed node round trips (connect, write, read, timeout).
    pub upstream_errors: Counter,
    /// Non-idempotent writes answered with an error because a node
    /// connection failed after they were sent (outcome unknown).
    pub unknown_outcomes: Counter,
    /// Requests answered with an error at the request deadline.
    pub timeouts: Counter,
    /// Malformed client input (connection closed).
    pub protocol_errors: Counter,
    /// Open node connections.
    pub upstream_connections: Gauge,
    /// Blocking commands (BLPOP, ...) sent on a node connection of their own.
    pub dedicated_calls: Counter,
    /// Version of the metadata store's map the proxy routes by.
    pub map_version: Gauge,
    /// Watch updates applied.
    pub map_updates: Counter,
    /// Whole-map loads (start, gaps).
    pub map_reloads: Counter,
    /// Rejection records patched into the map.
    pub map_patches: Counter,
    /// Reads routed by a partition's `reads_from`: `sent` to the replica,
    /// `fallback` to the owner after the replica refused.
    pub reads_from: Family<KindLabel, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers the ACL's metrics (`keyway_proxy_acl_*`).
    pub fn register_acl(&self, acl: &keyway_acl::AclMetrics) {
        let mut r = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        acl.register(&mut *r);
    }

    pub fn new() -> Self {
        let m = Metrics {
            registry: Mutex::new(Registry::with_prefix("keyway_proxy")),
            auth: keyway_auth::AuthMetrics::default(),
            clients: Gauge::default(),
            clients_refused: Counter::default(),
            access: Default::default(),
            requests: Family::default(),
            requests_total: Counter::default(),
            request_seconds: Histogram::new(exponential_buckets(0.000_05, 2.0, 18)),
            rejections: Family::default(),
            rejections_total: Counter::default(),
            upstream_errors: Counter::default(),
            unknown_outcomes: Counter::default(),
            timeouts: Counter::default(),
            protocol_errors: Counter::default(),
            upstream_connections: Gauge::default(),
            dedicated_calls: Counter::default(),
            map_version: Gauge::default(),
            map_updates: Counter::default(),
            map_reloads: Counter::default(),
            map_patches: Counter::default(),
            reads_from: Family::default(),
        };
        {
            let mut r = m.registry.lock().expect("fresh mutex");
            m.auth.register(&mut r);
            r.register("clients", "Open client connections", m.clients.clone());
            r.register(
                "clients_refused",
                "Connections refused at max_clients",
                m.clients_refused.clone(),
            );
            m.access.register(&mut r);
            r.register(
                "requests",
                "Client requests, by how they were served",
                m.requests.clone(),
            );
            r.register(
                "request_seconds",
                "Latency of a forwarded request, retries included",
                m.request_seconds.clone(),
            );
            r.register(
                "reads_from",
                "Reads routed by a partition's reads_from: sent to that replica, or fallback to the owner after it refused",
                m.reads_from.clone(),
            );
            r.register(
                "rejections_followed",
                "Node rejections followed by a retry, by kind",
                m.rejections.clone(),
            );
            r.register(
                "upstream_errors",
                "Failed node round trips (connect, write, read, timeout)",
                m.upstream_errors.clone(),
            );
            r.register(
                "unknown_outcomes",
                "Non-idempotent writes answered with an error after a node connection failed once they were sent",
                m.unknown_outcomes.clone(),
            );
            r.register(
                "timeouts",
                "Requests answered with an error at the request deadline",
                m.timeouts.clone(),
            );
            r.register(
                "protocol_errors",
                "Malformed client requests (connection closed)",
                m.protocol_errors.clone(),
            );
            r.register(
                "upstream_connections",
                "Open node connections",
                m.upstream_connections.clone(),
            );
            r.register(
                "dedicated_calls",
                "Blocking commands sent on a node connection of their own",
                m.dedicated_calls.clone(),
            );
            r.register(
                "map_version",
                "Version of the metadata store's map the proxy routes by",
                m.map_version.clone(),
            );
            r.register(
                "map_updates",
                "Map watch updates applied",
                m.map_updates.clone(),
            );
            r.register(
                "map_reloads",
                "Whole-map loads (start, gaps in the watch)",
                m.map_reloads.clone(),
            );
            r.register(
                "map_patches",
                "Rejection records patched into the map",
                m.map_patches.clone(),
            );
        }
        m
    }

    /// Counts one client request served `kind`.
    pub fn request(&self, kind: &'static str) {
        self.requests.get_or_create(&KindLabel { kind }).inc();
        self.requests_total.inc();
    }

    /// Counts one rejection of `kind` followed by a retry.
    pub fn rejection(&self, kind: &'static str) {
        self.rejections.get_or_create(&KindLabel { kind }).inc();
        self.rejections_total.inc();
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        prometheus_client::encoding::text::encode(&mut out, &registry)
            .expect("writing to a String cannot fail");
        out
    }
}

/// `/status`: the proxy at a glance.
#[derive(Serialize, Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// False until the first map is loaded (the RESP port is not open before).
    pub ready: bool,
    pub resp_addr: String,
    pub admin_addr: String,
    /// The TLS client listener's address, if TLS is on.
    pub tls_addr: Option<String>,
    /// Whether protected mode refuses non-loopback clients right now
    /// (`protected_mode` on and no `requirepass`).
    pub protected_mode_active: bool,
    /// Connections refused by protected mode so far.
    pub protected_mode_refused: u64,
    /// TLS handshakes that failed so far.
    pub tls_handshake_failures: u64,
    /// The metadata store's map version the proxy routes by.
    pub map_version: u64,
    pub partitions: usize,
    pub nodes: usize,
    pub clients: usize,
    pub requests: u64,
    pub rejections_followed: u64,
    pub upstream_errors: u64,
    pub unknown_outcomes: u64,
    pub timeouts: u64,
    /// Blocking commands sent on a node connection of their own.
    pub dedicated_calls: u64,
    /// Reads sent to a partition's `reads_from` replica.
    pub reads_from_sent: u64,
    /// ACL users in force (the default user included).
    pub acl_users: i64,
    /// Requests refused -NOPERM by the ACL.
    pub acl_denied: u64,
    /// Of those, refused there and sent to the owner instead.
    pub reads_from_fallbacks: u64,
}

impl Status {
    /// The status of the proxy `core` serves.
    pub fn of(core: &Core) -> Status {
        let view = core.router.view();
        let m = &core.metrics;
        // One statement each: a family's guard lives to the end of its
        // statement, and creating the other label takes its write lock.
        let reads_from_sent = m
            .reads_from
            .get_or_create(&KindLabel { kind: "sent" })
            .get();
        let reads_from_fallbacks = m
            .reads_from
            .get_or_create(&KindLabel { kind: "fallback" })
            .get();
        Status {
            ready: core.router.is_ready(),
            resp_addr: core.resp_addr.clone(),
            admin_addr: core.admin_addr.clone(),
            tls_addr: core.tls_addr.clone(),
            protected_mode_active: core.config.protected_mode && core.config.requirepass.is_none(),
            protected_mode_refused: m.access.protected_mode_refused.get(),
            tls_handshake_failures: m.access.tls_handshake_failures.get(),
            map_version: core.router.base_version().0,
            partitions: view.partitions.len(),
            nodes: view.nodes.len(),
            clients: core.clients.load(Ordering::SeqCst),
            requests: m.requests_total.get(),
            rejections_followed: m.rejections_total.get(),
            upstream_errors: m.upstream_errors.get(),
            unknown_outcomes: m.unknown_outcomes.get(),
            timeouts: m.timeouts.get(),
            dedicated_calls: m.dedicated_calls.get(),
            reads_from_sent,
            reads_from_fallbacks,
            acl_users: core.acl.metrics.users.get(),
            acl_denied: ["command", "key"]
                .iter()
                .map(|reason| {
                    core.acl
                        .metrics
                        .denied
                        .get_or_create(&keyway_acl::ReasonLabel { reason })
                        .get()
                })
                .sum(),
        }
    }
}

/// Serves `/metrics` and `/status` until shutdown.
pub async fn serve_admin(
    core: Arc<Core>,
    listener: TcpListener,
    mut shutdown: watch::Receiver<bool>,
) {
    let security = &core.config.admin;
    let guard = security.guard(core.metrics.auth.clone());
    let body_limit = usize::try_from(security.limits.max_body_bytes).unwrap_or(usize::MAX);
    let app = HttpRouter::new()
        .route("/metrics", get(metrics))
        .route("/status", get(status))
        .with_state(core)
        .layer(guard)
        .layer(axum::extract::DefaultBodyLimit::max(body_limit));
    let stop = async move {
        let _ = shutdown.changed().await;
    };
    if let Err(err) = axum::serve(listener, app)
        .with_graceful_shutdown(stop)
        .await
    {
        tracing::error!(%err, "admin HTTP server failed");
    }
}

async fn metrics(State(core): State<Arc<Core>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        core.metrics.encode(),
    )
}

/// `/status`: 200 once ready, 503 before (a readiness probe).
async fn status(State(core): State<Arc<Core>>) -> impl IntoResponse {
    let status = Status::of(&core);
    let code = if status.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, Json(status))
}
