//! The admin HTTP port: `/metrics` (Prometheus text), `/map` (the node's
//! partition map as JSON), `/status` (this node at a glance, JSON) and
//! `/hotkeys` (per owned partition, the sampled hot keys, JSON), plus
//! the `Peer` gRPC service of [`crate::peer`] (migration data plane).
//! With `fault_injection` on (testing only), also `GET /fault`,
//! `POST /fault/fsync-fail` and `POST /fault/heal`; without it they are 404.

use crate::server::Shared;
use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Json};
use axum::routing::{get, post};
use keyway_peer::admin::nodelay;
use serde::Serialize;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Serves the admin routes until shutdown.
/// With `secret`, every path (the `Peer` gRPC service included) needs it
/// (see [`keyway_auth::AdminGuard`]); the admin limits apply to plain HTTP.
pub async fn serve(
    shared: Arc<Shared>,
    listener: TcpListener,
    secret: Option<keyway_auth::ClusterSecret>,
    mut shutdown: watch::Receiver<bool>,
) {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/map", get(map))
        .route("/status", get(status))
        .route("/hotkeys", get(hotkeys));
    let app = if shared.faults.is_some() {
        app.route("/fault", get(fault_state))
            .route("/fault/fsync-fail", post(fault_fsync_fail))
            .route("/fault/heal", post(fault_heal))
    } else {
        app
    };
    let app = app.with_state(shared.clone());
    // The migration data plane (`Peer` gRPC, h2c) shares this port.
    let service = crate::peer::PeerService::for_node(
        shared.engine.clone(),
        crate::peer::NodeRoles {
            migrations: shared.migrations.clone(),
            routing: shared.routing.clone(),
            latency: shared.executor.latency().clone(),
            stats: shared.stats.clone(),
            copies: shared.copies.clone(),
            metrics: shared.metrics.clone(),
            reads: {
                let shared = shared.clone();
                std::sync::Arc::new(move |task| {
                    let shared = shared.clone();
                    Box::pin(async move { shared.executor.submit_node_wide(task).await })
                })
            },
            snapshot_hold: std::time::Duration::from_millis(shared.config.log_snapshot_hold_ms),
            replication: shared.replication.clone(),
            shutdown: shutdown.clone(),
        },
    );
    let app = crate::peer::merge_routes(app, service);
    let limits = shared.config.admin_limits();
    let app = app
        .layer(keyway_auth::AdminGuard::new(
            "admin",
            secret,
            Some(limits),
            shared.metrics.auth.clone(),
        ))
        .layer(axum::extract::DefaultBodyLimit::max(
            usize::try_from(limits.max_body_bytes).unwrap_or(usize::MAX),
        ));
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
    shared.metrics.observe_storage(&*shared.engine);
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
    /// The replica endpoint (`--replica-listen`), if it listens.
    pub replica_addr: Option<String>,
    /// Its replica role's Redis node id (`CLUSTER MYID` there).
    pub replica_node_id: Option<String>,
    pub admin_addr: String,
    pub serving: bool,
    pub lease_remaining_ms: u64,
    pub map_version: u64,
    pub partitions_owned: usize,
    pub clients: usize,
    /// Requests parked behind an earlier parked request of their slot, since start.
    pub held_in_order: u64,
    pub durability: crate::Durability,
    pub last_seq: u64,
    /// Incoming migrations this node accepts foreign records for.
    pub receiving: Vec<ReceivingView>,
    /// `"ok"`, or `"failed: <reason>"` once an fsync failed (for good).
    pub storage: String,
    /// Started with `fault_injection` (testing only).
    pub fault_injection: bool,
    /// The change log: retained range and size, and what holds it.
    pub change_log: ChangeLogStatus,
    /// The storage engine's block cache and memtables, bytes.
    pub storage_memory: StorageMemoryView,
    /// Keys removed by the active expiry pass since start.
    pub expired_keys_removed: u64,
    /// This node's replica roles: per partition, primary (with each
    /// replica's state, acked seq and lag) or replica (of whom, in sync or not).
    pub replication: crate::replicate::ReplicationStatus,
    /// `READONLY` reads of partitions this node does not own, since start.
    pub replica_reads: ReplicaReadsView,
    /// The copies this node sends (migration pushes' copy phases, replica
    /// catch-ups) with their cost: running first, then the last
    /// `FINISHED_COPIES_KEPT` finished (see [`crate::copies`]).
    pub copies: Vec<crate::copies::CopyReport>,
    /// MULTI/EXEC outcomes since start ([`crate::multi`]): `executed`,
    /// `watch_aborted`, `execabort`, `crossslot`, `discarded`.
    pub transactions: std::collections::BTreeMap<String, u64>,
    /// FLUSHALL/FLUSHDB requests completed, and the entries they deleted.
    pub flushes: u64,
    pub flush_deleted_entries: u64,
    /// Entries in the slow log and its `slowlog-log-slower-than` (µs).
    pub slowlog_len: usize,
    pub slowlog_log_slower_than_us: i64,
    /// Clients blocked by BLPOP and the like.
    pub blocking: crate::blocking::BlockingStatus,
    /// Lua scripts: cached, running now, busy (past `lua-time-limit`).
    pub scripts: crate::script::ScriptsStatus,
    /// KEYS and RANDOMKEY answered, and the entries they walked.
    pub key_walks: crate::node_keys::KeyWalksStatus,
    /// Whether this admin port (and its `Peer` service) needs the cluster
    /// secret (`--cluster-secret-file`), and the requests it refused so far.
    pub admin_auth: AdminAuthView,
}

/// The `admin_auth` field of `/status`.
#[derive(Serialize)]
pub struct AdminAuthView {
    pub cluster_secret: bool,
    /// Refused for a missing, malformed or wrong secret (`keyway_auth_refused`).
    pub refused: u64,
}

/// The `replica_reads` field of `/status` (`keyway_replica_reads`).
#[derive(Serialize)]
pub struct ReplicaReadsView {
    /// Served from this node's copy as an in-sync replica with a read lease.
    pub served: u64,
    /// Answered `-MOVED` to the primary.
    pub moved: u64,
    /// Of `served`, those of partitions whose `reads_from` is this node.
    pub served_reads_from: u64,
}

/// One incoming migration in `/status`.
#[derive(Serialize)]
pub struct ReceivingView {
    pub migration: u64,
    pub partition: u64,
    pub epoch: u64,
}

/// The `storage_memory` field of `/status`: [`keyway_storage::EngineMemory`].
#[derive(Serialize)]
pub struct StorageMemoryView {
    pub cache_bytes: u64,
    pub cache_capacity_bytes: u64,
    pub write_buffer_bytes: u64,
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
    /// Whether writes keep change records now (off after
    /// `log_keep_idle_ms` without a hold; `log_gc`).
    pub records_kept: bool,
    pub holds: Vec<crate::log_gc::HoldView>,
}

async fn status(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    let map = shared.routing.map();
    Json(Status {
        node_id: shared.me.to_string(),
        resp_addr: shared.resp_addr.clone(),
        replica_addr: shared.replica_addr.clone(),
        replica_node_id: shared
            .replica_addr
            .as_ref()
            .map(|_| shared.me.replica_role_id()),
        admin_addr: shared.admin_addr.clone(),
        serving: shared.routing.lease_valid(),
        lease_remaining_ms: shared.routing.lease_remaining_ms(),
        map_version: map.version.0,
        partitions_owned: map.owned_by(shared.me).count(),
        clients: shared.clients.load(std::sync::atomic::Ordering::SeqCst),
        held_in_order: shared.metrics.held_in_order.get(),
        durability: shared.config.durability,
        last_seq: shared.engine.last_seq(),
        receiving: shared
            .routing
            .receiving()
            .into_iter()
            .map(|(pid, r)| ReceivingView {
                migration: r.id,
                partition: pid.0,
                epoch: r.epoch.0,
            })
            .collect(),
        storage: shared.storage_health.status(),
        fault_injection: shared.faults.is_some(),
        change_log: ChangeLogStatus {
            first_seq: shared.engine.log_start(),
            last_seq: shared.engine.last_seq(),
            records: (shared.engine.last_seq() + 1).saturating_sub(shared.engine.log_start()),
            bytes: shared.engine.log_bytes(),
            retention_bytes: shared.config.log_retention_bytes,
            records_kept: shared.engine.log_kept(),
            holds: shared.migrations.holds().list(),
        },
        storage_memory: {
            let m = shared.engine.memory();
            StorageMemoryView {
                cache_bytes: m.cache_bytes,
                cache_capacity_bytes: m.cache_capacity_bytes,
                write_buffer_bytes: m.write_buffer_bytes,
            }
        },
        expired_keys_removed: shared.active_expiry.removed.get(),
        replication: shared.replication.status(),
        replica_reads: ReplicaReadsView {
            served: shared.metrics.replica_reads_count(true),
            moved: shared.metrics.replica_reads_count(false),
            served_reads_from: shared.metrics.reads_from_served_count(),
        },
        copies: shared.copies.list(),
        transactions: shared.tx_metrics.snapshot().into_iter().collect(),
        flushes: shared.flush_metrics.flushes.get(),
        flush_deleted_entries: shared.flush_metrics.deleted.get(),
        slowlog_len: shared.server.slowlog.len(),
        slowlog_log_slower_than_us: shared.server.slowlog.slower_than_us(),
        blocking: shared.blocking.status(),
        scripts: shared.scripts.status(),
        key_walks: shared.key_walks.status(),
        admin_auth: AdminAuthView {
            cluster_secret: shared.config.cluster_secret_file.is_some(),
            refused: ["missing", "malformed", "wrong"]
                .into_iter()
                .map(|reason| shared.metrics.auth.refused_count("admin", reason))
                .sum(),
        },
    })
}

/// `GET /fault`: the injector's state (routes exist only with `fault_injection`).
#[derive(Serialize)]
pub struct FaultView {
    /// `none`, `always` or `next <n>`.
    pub sync_fault: String,
    pub sync_calls: u64,
    pub sync_failures: u64,
    /// As in `/status`.
    pub storage: String,
}

fn fault_view(shared: &Shared) -> Json<FaultView> {
    let state = shared
        .faults
        .as_ref()
        .expect("fault routes are registered only with an injector")
        .state();
    Json(FaultView {
        sync_fault: match state.sync_fault {
            keyway_storage::SyncFault::None => "none".into(),
            keyway_storage::SyncFault::Always => "always".into(),
            keyway_storage::SyncFault::Next(n) => format!("next {n}"),
        },
        sync_calls: state.sync_calls,
        sync_failures: state.sync_failures,
        storage: shared.storage_health.status(),
    })
}

async fn fault_state(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    fault_view(&shared)
}

/// `POST /fault/fsync-fail`: every later fsync fails.
async fn fault_fsync_fail(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    if let Some(f) = &shared.faults {
        tracing::warn!("fault injection: every later fsync fails");
        f.fail_syncs();
    }
    fault_view(&shared)
}

/// `POST /fault/heal`: later fsyncs reach the disk again (a node whose
/// storage already failed stays failed: see [`crate::storage_health`]).
async fn fault_heal(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    if let Some(f) = &shared.faults {
        f.heal();
    }
    fault_view(&shared)
}
