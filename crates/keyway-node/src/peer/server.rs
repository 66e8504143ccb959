//! The `Peer` service over an `Arc<dyn Engine>`.
//!
//! Stateless: every call validates its arguments, runs its engine work in one
//! `spawn_blocking` task (fjall must never run on async workers) and answers.
//! Errors: bad arguments → `INVALID_ARGUMENT`; `changes_since` behind the
//! log's start → `FAILED_PRECONDITION` with a [`pb::LogTruncated`] detail;
//! storage failures → `INTERNAL`.
//!
//! On a node, the data-changing calls (`ApplyForeign`, `DropRangeChunk`)
//! must name their migration and are checked against the node's map and
//! incoming migrations (`crate::migrate::receive`) under the routing read
//! guard, each engine sub-batch in the same critical section as its check:
//! a refusal is `FAILED_PRECONDITION` with a [`pb::PeerRefusal`] detail
//! (`UNAVAILABLE` while the node's map is behind). A service over a bare
//! engine has no map and checks nothing (tests and tools).

use super::pb::{self, peer_server};
use super::{
    MAX_APPLY_RECORDS, MAX_CHANGES_RECORDS, MAX_CHUNK_BYTES, MAX_DROP_ENTRIES, MAX_MESSAGE_BYTES,
    MAX_SNAPSHOT_ENTRIES, SCAN_BATCH,
};
use bytes::Bytes;
use keyway_storage::{ChangeRecord, Engine, KeyRange, Mutation, ScanChunk, StorageError};
use prost::Message;
use std::sync::Arc;
use tokio::net::TcpListener;
use tonic::{Code, Request, Response, Status};

use crate::migrate::{MigrationRef, Migrations, Refusal, RefusalReason, RoleError};
use crate::peer::PushSpec;
use crate::routing::Routing;
use keyway_map::PartitionId;
use keyway_peer::control::digest_to_pb;
use keyway_peer::migration::{reason_to_pb, ref_from_pb};

/// The `Peer` gRPC service over one engine. Cheap to clone.
#[derive(Clone)]
pub struct PeerService {
    engine: Arc<dyn Engine>,
    /// The node's migration roles and routing view (`None` when serving a
    /// bare engine: the `Migrate*` and `PartitionView` calls are then
    /// `UNIMPLEMENTED`).
    node: Option<NodeRoles>,
}

/// What the role calls need of a running node.
#[derive(Clone)]
pub struct NodeRoles {
    pub migrations: Arc<Migrations>,
    pub routing: Arc<Routing>,
    /// The node's foreground latency (reported to a copying source).
    pub latency: Arc<crate::executor::LatencyGauge>,
    /// The node's load statistics (`PartitionStats`).
    pub stats: Arc<crate::stats::Stats>,
    /// The node's copies (`PartitionStats` carries them to the manager).
    pub copies: Arc<crate::copies::Copies>,
    /// The node's metrics (refused peer writes are counted).
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Queues a read on a storage thread (`RangeScan` steps).
    pub reads: crate::kw::owned::SubmitRead,
    /// How long a `LastSeq` answer holds the change log after it.
    pub snapshot_hold: std::time::Duration,
    /// Replication: the replica side of `Replicate`, and `Switchover`.
    pub replication: Arc<crate::replicate::Replication>,
    /// The node's shutdown signal (long-lived calls end on it).
    pub shutdown: tokio::sync::watch::Receiver<bool>,
}

impl std::fmt::Debug for PeerService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerService").finish_non_exhaustive()
    }
}

impl PeerService {
    /// A service answering from `engine`.
    pub fn new(engine: Arc<dyn Engine>) -> Self {
        PeerService { engine, node: None }
    }

    /// A service for a running node: data calls and the migration roles.
    pub fn for_node(engine: Arc<dyn Engine>, node: NodeRoles) -> Self {
        PeerService {
            engine,
            node: Some(node),
        }
    }

    /// The routing view a data-changing call for `migration` is checked
    /// against: `None` on a bare engine; on a node the migration is required.
    fn write_guard(
        &self,
        what: &str,
        migration: Option<pb::MigrationRef>,
    ) -> Result<Option<(Arc<Routing>, MigrationRef)>, Status> {
        let Some(node) = &self.node else {
            return Ok(None);
        };
        let m = migration.map(ref_from_pb).ok_or_else(|| {
            Status::invalid_argument(format!("a node accepts {what} only for a named migration"))
        })?;
        Ok(Some((node.routing.clone(), m)))
    }

    /// Counts and logs a refused call; its status.
    fn refused(&self, what: &str, r: Refusal) -> Status {
        if let Some(node) = &self.node {
            node.metrics
                .peer_refusals
                .get_or_create(&crate::metrics::KindLabel {
                    kind: r.reason.label(),
                })
                .inc();
        }
        if r.reason == RefusalReason::MapBehind {
            tracing::debug!(what, %r, "peer write deferred: map behind");
        } else if what == "Replicate" && r.reason == RefusalReason::Stale {
            // A late or superseded stream call (an earlier call of a stream
            // that restarted, or a primary deposed since): expected around
            // every in-sync change and failover; counted in the metric.
            tracing::debug!(what, %r, "stale replication call refused");
        } else {
            tracing::warn!(what, reason = r.reason.label(), %r, "peer write refused");
        }
        status_from_refusal(r)
    }

    /// A failed `Replicate` call's status (a refusal counted and logged).
    fn replica_status(&self, e: crate::replicate::replica::ReplicaError) -> Status {
        use crate::replicate::replica::ReplicaError;
        match e {
            ReplicaError::Refused(r) => self.refused("Replicate", r),
            ReplicaError::Invalid(why) => Status::invalid_argument(why),
            ReplicaError::Storage(e) => status_from_storage(e),
        }
    }

    fn node(&self) -> Result<&NodeRoles, Status> {
        self.node
            .as_ref()
            .ok_or_else(|| Status::unimplemented("this server has no migration roles"))
    }

    /// The tonic server wrapping this service, with our message-size limits.
    pub fn into_server(self) -> peer_server::PeerServer<Self> {
        peer_server::PeerServer::new(self)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }

    /// Runs `f` on the blocking pool (never on an async worker).
    async fn blocking<T, F>(&self, f: F) -> Result<T, Status>
    where
        T: Send + 'static,
        F: FnOnce(&dyn Engine) -> Result<T, StorageError> + Send + 'static,
    {
        let engine = self.engine.clone();
        tokio::task::spawn_blocking(move || f(&*engine))
            .await
            .map_err(|e| Status::internal(format!("engine task failed: {e}")))?
            .map_err(status_from_storage)
    }
}

/// Adds the `Peer` service over `engine` to `router` (the admin HTTP router):
/// gRPC requests (`/keyway.peer.v1.Peer/*`) go to the service, everything
/// else to the router's own routes. `router` must have no fallback.
pub fn merge_routes(router: axum::Router, service: PeerService) -> axum::Router {
    tonic::service::Routes::from(router)
        .add_service(service.into_server())
        .prepare()
        .into_axum_router()
}

/// Serves only the `Peer` service over `engine` on `listener` until
/// `shutdown` resolves (tests and tools; a node serves it on its admin port).
pub async fn serve_engine(
    engine: Arc<dyn Engine>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = merge_routes(axum::Router::new(), PeerService::new(engine));
    axum::serve(keyway_peer::admin::nodelay(listener), app)
        .with_graceful_shutdown(shutdown)
        .await
}

/// Maps a storage error to the status the client decodes (see `client.rs`).
pub(crate) fn status_from_storage(err: StorageError) -> Status {
    match &err {
        StorageError::LogTruncated { after, log_start } => {
            let detail = pb::ErrorDetail {
                kind: Some(pb::error_detail::Kind::LogTruncated(pb::LogTruncated {
                    after: *after,
                    log_start: *log_start,
                })),
            };
            Status::with_details(
                Code::FailedPrecondition,
                err.to_string(),
                detail.encode_to_vec().into(),
            )
        }
        StorageError::InvalidArgument(_) | StorageError::InvalidKey { .. } => {
            Status::invalid_argument(err.to_string())
        }
        _ => Status::internal(err.to_string()),
    }
}

/// Records per engine call when applying a large `ApplyForeign` (each
/// checked under its own routing guard).
const APPLY_SUB_BATCH: usize = 128;

/// Entries per engine call of a `DropRangeChunk` (each checked under its
/// own routing guard, so a map install never waits for a whole chunk).
const DROP_SUB_CHUNK_ENTRIES: usize = 1_000;

/// `FAILED_PRECONDITION` with a [`pb::PeerRefusal`] detail; `UNAVAILABLE`
/// (retry) while the node's map is behind.
pub(crate) fn status_from_refusal(r: Refusal) -> Status {
    let detail = pb::ErrorDetail {
        kind: Some(pb::error_detail::Kind::Refused(pb::PeerRefusal {
            reason: reason_to_pb(r.reason) as i32,
        })),
    };
    let code = match r.reason {
        RefusalReason::MapBehind => Code::Unavailable,
        _ => Code::FailedPrecondition,
    };
    Status::with_details(code, r.detail, detail.encode_to_vec().into())
}

/// Longest incoming hold a source may ask for.
const MAX_INCOMING_HOLD_MS: u64 = 60_000;

fn status_from_role(err: RoleError) -> Status {
    match err {
        RoleError::Unknown(_) => Status::not_found(err.to_string()),
        RoleError::Refused(_) | RoleError::Failed(_) => {
            Status::failed_precondition(err.to_string())
        }
    }
}

fn status_to_pb(s: crate::peer::PushStatus) -> pb::MigrateStatusResponse {
    pb::MigrateStatusResponse {
        copied_bytes: s.copied_bytes,
        copied_keys: s.copied_keys,
        copy_done: s.copy_done,
        acked_seq: s.acked_seq,
        head_seq: s.head_seq,
        dual: s.dual,
        fenced: s.fenced,
        error: s.error.unwrap_or_default(),
        backoffs: s.backoffs,
        checkpoint_seq: s.checkpoint_seq,
        copy_bytes_sent: s.copy_bytes_sent,
        copy_bytes_written: s.copy_bytes_written,
        copy_duration_ms: s.copy_duration_ms,
        copy_started_at_ms: s.copy_started_at_ms,
    }
}

fn range_from_pb(range: Option<pb::KeyRange>) -> Result<KeyRange, Status> {
    let r = range.ok_or_else(|| Status::invalid_argument("range is required"))?;
    Ok(KeyRange::new(r.start, r.end))
}

/// `value` clamped to `max`; `0` is refused.
fn clamp(name: &str, value: u64, max: u64) -> Result<u64, Status> {
    if value == 0 {
        Err(Status::invalid_argument(format!(
            "{name} must be at least 1"
        )))
    } else {
        Ok(value.min(max))
    }
}

/// Fills one `Snapshot` chunk: engine scans of at most [`SCAN_BATCH`]
/// entries (each its own short-lived snapshot) until `limit` entries or
/// `max_bytes` payload bytes; the first entry is always taken, so a chunk
/// makes progress even when one entry alone exceeds the cap.
pub(crate) fn read_snapshot(
    engine: &dyn Engine,
    range: &KeyRange,
    after: Option<Bytes>,
    limit: usize,
    max_bytes: u64,
) -> Result<pb::SnapshotResponse, StorageError> {
    let mut entries = Vec::new();
    let mut bytes = 0u64;
    let mut first_seq = None;
    let mut cursor = after;
    loop {
        let want = (limit - entries.len()).min(SCAN_BATCH);
        let ScanChunk {
            entries: got,
            next,
            seq,
        } = engine.scan(range, cursor.as_deref(), want)?;
        let first = *first_seq.get_or_insert(seq);
        let exhausted = next.is_none() || got.is_empty();
        for (key, value) in got {
            let size = (key.len() + value.data.len()) as u64;
            if !entries.is_empty() && bytes + size > max_bytes {
                return Ok(pb::SnapshotResponse {
                    entries,
                    next: cursor,
                    seq: first,
                    bytes,
                });
            }
            bytes += size;
            cursor = Some(key.clone());
            let version = value.version;
            let put = Mutation::Put {
                key,
                kind: value.kind,
                expire_at_ms: value.expire_at_ms,
                data: value.data,
            };
            entries.push(pb::SnapshotEntry {
                put: put.encode().into(),
                version,
                as_of: seq,
            });
        }
        if exhausted {
            return Ok(pb::SnapshotResponse {
                entries,
                next: None,
                seq: first,
                bytes,
            });
        }
        if entries.len() >= limit || bytes >= max_bytes {
            return Ok(pb::SnapshotResponse {
                entries,
                next: cursor,
                seq: first,
                bytes,
            });
        }
    }
}

/// One `Changes` answer: examines up to `limit` records after `after`, keeps
/// those in `range` (all if `None`) up to `max_bytes` encoded bytes (at least
/// one), and reports how far it examined.
pub(crate) fn read_changes(
    engine: &dyn Engine,
    after: u64,
    limit: usize,
    max_bytes: u64,
    range: Option<&KeyRange>,
) -> Result<pb::ChangesResponse, StorageError> {
    // At most `limit` (the engine reads on to the end of a batch; the
    // RPC's bound holds: its callers, a migration's catch-up, apply into a
    // target that serves nothing of the range before the flip, and the
    // flip comes only after every record up to the fence).
    let mut records = engine.changes_since(after, limit)?;
    records.truncate(limit);
    let log_start = engine.log_start();
    let head_seq = engine.last_seq();
    let mut out: Vec<Bytes> = Vec::new();
    let mut bytes = 0u64;
    let mut cursor = after;
    for rec in records {
        if range.is_none_or(|r| r.contains(rec.mutation.key())) {
            let enc = rec.encode();
            if !out.is_empty() && bytes + enc.len() as u64 > max_bytes {
                break;
            }
            bytes += enc.len() as u64;
            out.push(enc.into());
        }
        cursor = rec.seq;
    }
    Ok(pb::ChangesResponse {
        records: out,
        last_seq: cursor,
        log_start,
        head_seq: head_seq.max(cursor),
    })
}

#[tonic::async_trait]
impl peer_server::Peer for PeerService {
    async fn snapshot(
        &self,
        req: Request<pb::SnapshotRequest>,
    ) -> Result<Response<pb::SnapshotResponse>, Status> {
        let req = req.into_inner();
        let range = range_from_pb(req.range)?;
        let limit = clamp("limit", req.limit.into(), MAX_SNAPSHOT_ENTRIES.into())? as usize;
        let max_bytes = clamp("max_chunk_bytes", req.max_chunk_bytes, MAX_CHUNK_BYTES)?;
        let after = req.after;
        let resp = self
            .blocking(move |e| read_snapshot(e, &range, after, limit, max_bytes))
            .await?;
        Ok(Response::new(resp))
    }

    async fn changes(
        &self,
        req: Request<pb::ChangesRequest>,
    ) -> Result<Response<pb::ChangesResponse>, Status> {
        let req = req.into_inner();
        let limit = clamp("limit", req.limit.into(), MAX_CHANGES_RECORDS.into())? as usize;
        let max_bytes = clamp("max_bytes", req.max_bytes, MAX_CHUNK_BYTES)?;
        let range = req.range.map(|r| KeyRange::new(r.start, r.end));
        let after = req.after_seq;
        let resp = self
            .blocking(move |e| read_changes(e, after, limit, max_bytes, range.as_ref()))
            .await?;
        Ok(Response::new(resp))
    }

    async fn digest(
        &self,
        req: Request<pb::DigestRequest>,
    ) -> Result<Response<pb::DigestResponse>, Status> {
        let range = range_from_pb(req.into_inner().range)?;
        let (d, seq) = self.blocking(move |e| e.digest(&range)).await?;
        Ok(Response::new(pb::DigestResponse {
            keys: d.keys,
            bytes: d.bytes,
            digest: d.digest,
            seq,
        }))
    }

    async fn migrate_start(
        &self,
        req: Request<pb::MigrateStartRequest>,
    ) -> Result<Response<pb::MigrateStatusResponse>, Status> {
        let node = self.node()?;
        let r = req.into_inner();
        if r.target.is_empty() {
            return Err(Status::invalid_argument("target is required"));
        }
        let spec = PushSpec {
            id: r.id,
            partition: PartitionId(r.partition),
            epoch: keyway_map::Epoch(r.epoch),
            range: range_from_pb(r.range)?,
            target: r.target,
            copy: r.copy,
            after_seq: r.after_seq,
            throttle: crate::peer::Throttle {
                max_bytes_per_sec: r.max_bytes_per_sec,
                backoff_latency_us: r.backoff_latency_us,
                chunk_bytes: r.chunk_bytes,
            },
        };
        let status = node.migrations.start(spec).map_err(status_from_role)?;
        Ok(Response::new(status_to_pb(status)))
    }

    async fn migrate_status(
        &self,
        req: Request<pb::MigrateIdRequest>,
    ) -> Result<Response<pb::MigrateStatusResponse>, Status> {
        let id = req.into_inner().id;
        let status = self
            .node()?
            .migrations
            .status(id)
            .map_err(status_from_role)?;
        Ok(Response::new(status_to_pb(status)))
    }

    async fn migrate_dual(
        &self,
        req: Request<pb::MigrateToggleRequest>,
    ) -> Result<Response<pb::MigrateDualResponse>, Status> {
        let r = req.into_inner();
        let at_seq = self
            .node()?
            .migrations
            .dual(r.id, r.on)
            .map_err(status_from_role)?;
        Ok(Response::new(pb::MigrateDualResponse { at_seq }))
    }

    async fn migrate_fence(
        &self,
        req: Request<pb::MigrateToggleRequest>,
    ) -> Result<Response<pb::MigrateFenceResponse>, Status> {
        let r = req.into_inner();
        let migrations = &self.node()?.migrations;
        let (seq, digests) = match r.on {
            true => migrations.fence_on(r.id, r.with_digests).await,
            false => migrations.fence(r.id, false).await.map(|seq| (seq, None)),
        }
        .map_err(status_from_role)?;
        Ok(Response::new(pb::MigrateFenceResponse {
            seq,
            digests: digests.map(digests_to_pb),
        }))
    }

    async fn migrate_checkpoint(
        &self,
        req: Request<pb::MigrateIdRequest>,
    ) -> Result<Response<pb::MigrateCheckpointResponse>, Status> {
        let (seq, moved) = self
            .node()?
            .migrations
            .checkpoint(req.into_inner().id)
            .await
            .map_err(status_from_role)?;
        Ok(Response::new(pb::MigrateCheckpointResponse { seq, moved }))
    }

    async fn migrate_stop(
        &self,
        req: Request<pb::MigrateIdRequest>,
    ) -> Result<Response<pb::MigrateStopResponse>, Status> {
        self.node()?.migrations.stop(req.into_inner().id);
        Ok(Response::new(pb::MigrateStopResponse {}))
    }

    async fn migrate_digest(
        &self,
        req: Request<pb::MigrateIdRequest>,
    ) -> Result<Response<pb::MigrateDigestResponse>, Status> {
        let id = req.into_inner().id;
        let d = self
            .node()?
            .migrations
            .fence_digests(id)
            .await
            .map_err(status_from_role)?;
        Ok(Response::new(digests_to_pb(d)))
    }

    async fn keys_digest(
        &self,
        req: Request<pb::KeysDigestRequest>,
    ) -> Result<Response<pb::DigestResponse>, Status> {
        let keys = req.into_inner().keys;
        if keys.len() > crate::migrate::KEYS_PER_DIGEST {
            return Err(Status::invalid_argument(format!(
                "{} keys in one KeysDigest, at most {}",
                keys.len(),
                crate::migrate::KEYS_PER_DIGEST
            )));
        }
        let d = self
            .blocking(move |e| crate::migrate::keys_digest(e, &keys))
            .await?;
        Ok(Response::new(digest_to_pb(d)))
    }

    async fn migrate_receive(
        &self,
        req: Request<pb::MigrateReceiveRequest>,
    ) -> Result<Response<pb::MigrateStopResponse>, Status> {
        let r = req.into_inner();
        let routing = &self.node()?.routing;
        let m = r
            .migration
            .map(ref_from_pb)
            .ok_or_else(|| Status::invalid_argument("migration is required"))?;
        routing
            .set_receiving(m, r.on)
            .map_err(|e| self.refused("MigrateReceive", e))?;
        tracing::info!(migration = m.id, partition = %m.partition, epoch = %m.epoch, on = r.on,
            "incoming migration");
        Ok(Response::new(pb::MigrateStopResponse {}))
    }

    async fn migrate_incoming(
        &self,
        req: Request<pb::MigrateIncomingRequest>,
    ) -> Result<Response<pb::MigrateStopResponse>, Status> {
        let r = req.into_inner();
        let routing = &self.node()?.routing;
        let pid = PartitionId(r.partition);
        let hold = r.on.then(|| {
            let hold = std::time::Duration::from_millis(r.hold_ms.min(MAX_INCOMING_HOLD_MS));
            (keyway_map::Epoch(r.epoch), hold)
        });
        routing.set_incoming(pid, hold);
        Ok(Response::new(pb::MigrateStopResponse {}))
    }

    async fn switchover(
        &self,
        req: Request<pb::SwitchoverRequest>,
    ) -> Result<Response<pb::SwitchoverResponse>, Status> {
        let r = req.into_inner();
        let to = (r.to != 0).then_some(keyway_map::NodeId(r.to));
        let timeout = std::time::Duration::from_millis(r.timeout_ms.max(1));
        let repl = &self.node()?.replication;
        let pid = PartitionId(r.partition);
        let done = crate::replicate::switchover::switchover(
            repl,
            pid,
            keyway_map::Epoch(r.epoch),
            to,
            timeout,
        )
        .await
        .map_err(|e| Status::failed_precondition(e.to_string()))?;
        Ok(Response::new(pb::SwitchoverResponse {
            owner: done.owner.0,
            epoch: done.epoch.0,
            paused_us: done.paused.as_micros() as u64,
        }))
    }

    async fn replicate(
        &self,
        req: Request<pb::ReplicateRequest>,
    ) -> Result<Response<pb::ReplicateResponse>, Status> {
        let node = self.node()?;
        match node
            .replication
            .replica
            .clone()
            .serve(req.into_inner())
            .await
        {
            Ok(resp) => Ok(Response::new(resp)),
            Err(e) => Err(self.replica_status(e)),
        }
    }

    type ReplicateStreamStream = std::pin::Pin<
        Box<dyn futures::Stream<Item = Result<pb::ReplicateResponse, Status>> + Send + 'static>,
    >;

    async fn replicate_stream(
        &self,
        req: Request<tonic::Streaming<pb::ReplicateRequest>>,
    ) -> Result<Response<Self::ReplicateStreamStream>, Status> {
        let replica = self.node()?.replication.replica.clone();
        let this = self.clone();
        let shutdown = self.node()?.shutdown.clone();
        let served =
            super::replicate_stream::Served::new(replica, req.into_inner(), shutdown, move |e| {
                this.replica_status(e)
            });
        Ok(Response::new(Box::pin(served)))
    }

    async fn partition_stats(
        &self,
        _req: Request<pb::PartitionStatsRequest>,
    ) -> Result<Response<pb::PartitionStatsResponse>, Status> {
        let node = self.node()?;
        let mut report = node.stats.report();
        report.copies = node.copies.list();
        Ok(Response::new(keyway_peer::stats::to_pb(&report)))
    }

    async fn range_scan(
        &self,
        req: Request<pb::RangeScanRequest>,
    ) -> Result<Response<pb::RangeScanResponse>, Status> {
        let node = self.node()?;
        let resp = crate::kw::rpc::serve_range_scan(
            node.routing.clone(),
            node.reads.clone(),
            req.into_inner(),
        )
        .await?;
        Ok(Response::new(resp))
    }

    async fn partition_view(
        &self,
        req: Request<pb::PartitionViewRequest>,
    ) -> Result<Response<pb::PartitionViewResponse>, Status> {
        let req = req.into_inner();
        let pid = PartitionId(req.partition);
        let routing = &self.node()?.routing;
        let map = match req.wait_ms {
            0 => routing.map(),
            ms => {
                let wait = std::time::Duration::from_millis(ms.min(keyway_peer::MAX_VIEW_WAIT_MS));
                let epoch = keyway_map::Epoch(req.wait_epoch);
                routing
                    .wait_for(wait, |map| {
                        map.partitions.get(&pid).is_none_or(|p| p.epoch >= epoch)
                    })
                    .await
            }
        };
        let resp = match map.partitions.get(&pid) {
            Some(p) => pb::PartitionViewResponse {
                found: true,
                owner: p.owner.0,
                epoch: p.epoch.0,
                map_version: map.version.0,
            },
            None => pb::PartitionViewResponse {
                found: false,
                map_version: map.version.0,
                ..Default::default()
            },
        };
        Ok(Response::new(resp))
    }

    async fn apply_foreign(
        &self,
        req: Request<pb::ApplyForeignRequest>,
    ) -> Result<Response<pb::ApplyForeignResponse>, Status> {
        let req = req.into_inner();
        let guard = self.write_guard("ApplyForeign", req.migration)?;
        let sync = req.sync;
        let raw = req.records;
        if raw.len() > MAX_APPLY_RECORDS {
            return Err(Status::invalid_argument(format!(
                "{} records in one ApplyForeign, at most {MAX_APPLY_RECORDS}",
                raw.len()
            )));
        }
        let records = raw
            .iter()
            .enumerate()
            .map(|(i, b)| {
                ChangeRecord::decode(b)
                    .map_err(|e| Status::invalid_argument(format!("record {i}: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        // Sub-batches: each takes the engine's write lock (and on a node the
        // routing read guard, checked first) on its own, so a large copy
        // chunk never holds foreground writes or a map install up for long.
        let applied = self
            .blocking(move |e| {
                let mut seq = e.last_seq();
                let mut written = 0u64;
                // An empty call (the copy's closing fsync) is checked too.
                let parts: Vec<&[ChangeRecord]> = match records.is_empty() {
                    true => vec![&[]],
                    false => records.chunks(APPLY_SUB_BATCH).collect(),
                };
                for part in parts {
                    let view = guard.as_ref().map(|(routing, _)| routing.read());
                    if let (Some(view), Some((_, m))) = (&view, &guard)
                        && let Err(refusal) =
                            view.check_apply(*m, part.iter().map(|r| &r.mutation.key()[..]))
                    {
                        return Ok(Err(refusal));
                    }
                    if !part.is_empty() {
                        seq = e.apply_foreign(part)?;
                        written += crate::copies::payload_bytes(part);
                    }
                    // The effect is in the engine: only now may the map move.
                    drop(view);
                }
                if sync {
                    e.sync()?;
                }
                Ok(Ok((seq, written)))
            })
            .await?;
        let (last_seq, bytes_written) = applied.map_err(|r| self.refused("ApplyForeign", r))?;
        let recent_latency_us = self
            .node
            .as_ref()
            .map_or(0, |n| n.latency.recent_max_micros());
        Ok(Response::new(pb::ApplyForeignResponse {
            last_seq,
            recent_latency_us,
            bytes_written,
        }))
    }

    async fn drop_range_chunk(
        &self,
        req: Request<pb::DropRangeChunkRequest>,
    ) -> Result<Response<pb::DropRangeChunkResponse>, Status> {
        let req = req.into_inner();
        let guard = self.write_guard("DropRangeChunk", req.migration)?;
        let range = range_from_pb(req.range)?;
        let limit = clamp("limit", req.limit.into(), MAX_DROP_ENTRIES.into())? as usize;
        let dropped = self
            .blocking(move |e| {
                let mut deleted = 0;
                // At least one round: an empty range is checked too.
                while deleted < limit {
                    let want = (limit - deleted).min(DROP_SUB_CHUNK_ENTRIES);
                    let view = guard.as_ref().map(|(routing, _)| routing.read());
                    if let (Some(view), Some((_, m))) = (&view, &guard)
                        && let Err(refusal) = view.check_drop(*m, &range)
                    {
                        return Ok(Err(refusal));
                    }
                    let n = e.delete_range_chunk(&range, want)?;
                    drop(view);
                    deleted += n;
                    if n < want {
                        break;
                    }
                }
                Ok(Ok(deleted))
            })
            .await?;
        let deleted = dropped.map_err(|r| self.refused("DropRangeChunk", r))?;
        Ok(Response::new(pb::DropRangeChunkResponse {
            deleted: deleted as u64,
        }))
    }

    async fn range_stats(
        &self,
        req: Request<pb::RangeStatsRequest>,
    ) -> Result<Response<pb::RangeStatsResponse>, Status> {
        let range = range_from_pb(req.into_inner().range)?;
        let (keys, bytes) = self.blocking(move |e| e.range_stats(&range)).await?;
        Ok(Response::new(pb::RangeStatsResponse { keys, bytes }))
    }

    async fn last_seq(
        &self,
        _req: Request<pb::LastSeqRequest>,
    ) -> Result<Response<pb::LastSeqResponse>, Status> {
        // A node keeps the records after this seq for a while: a migration's
        // catch-up starts after it once its push registers (`crate::log_gc`).
        let holds = self
            .node
            .as_ref()
            .map(|n| (n.migrations.holds().clone(), n.snapshot_hold));
        let (seq, log_start) = self
            .blocking(move |e| {
                // Records on before the seq is read: every record after it
                // is kept (`log_gc`: they may have been switched off).
                if let Some((holds, _)) = &holds {
                    holds.arm();
                }
                let seq = e.last_seq();
                if let Some((holds, ttl)) = holds {
                    holds.lease("snapshot", seq + 1, ttl);
                }
                Ok((seq, e.log_start()))
            })
            .await?;
        Ok(Response::new(pb::LastSeqResponse { seq, log_start }))
    }
}

fn digests_to_pb(d: crate::peer::FenceDigests) -> pb::MigrateDigestResponse {
    pb::MigrateDigestResponse {
        source: Some(digest_to_pb(d.source)),
        target: Some(digest_to_pb(d.target)),
        incremental: d.incremental,
        delta_keys: d.delta_keys,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyway_storage::{MemEngine, ValueKind};

    fn put(key: &str, len: usize) -> Mutation {
        Mutation::Put {
            key: Bytes::copy_from_slice(key.as_bytes()),
            kind: ValueKind::String,
            expire_at_ms: None,
            data: Bytes::from(vec![b'x'; len]),
        }
    }

    #[test]
    fn snapshot_pages_by_count_and_bytes() {
        let e = MemEngine::new();
        let muts: Vec<_> = (0..1000).map(|i| put(&format!("k{i:04}"), 10)).collect();
        e.apply(&muts).unwrap();
        let range = KeyRange::prefix(Bytes::from_static(b"k"));
        // Count limit across several scan batches.
        let r = read_snapshot(&e, &range, None, 600, u64::MAX).unwrap();
        assert_eq!(r.entries.len(), 600);
        assert_eq!(r.next.as_deref(), Some(&b"k0599"[..]));
        assert_eq!(r.bytes, 600 * 15);
        // Byte cap: 15 bytes per entry, cap 100 → 6 entries.
        let r = read_snapshot(&e, &range, r.next, 600, 100).unwrap();
        assert_eq!(r.entries.len(), 6);
        assert_eq!(r.next.as_deref(), Some(&b"k0605"[..]));
        // Cap smaller than one entry: still one entry (progress).
        let r = read_snapshot(&e, &range, r.next, 600, 1).unwrap();
        assert_eq!(r.entries.len(), 1);
        // To the end: next is None.
        let r = read_snapshot(&e, &range, r.next, 10_000, u64::MAX).unwrap();
        assert_eq!(r.entries.len(), 1000 - 607);
        assert_eq!(r.next, None);
        assert!(r.entries.iter().all(|x| x.as_of == 1000 && x.version > 0));
    }

    #[test]
    fn changes_filter_advances_cursor() {
        let e = MemEngine::new();
        for m in [put("a1", 1), put("b1", 1), put("a2", 1), put("b2", 1)] {
            e.apply(&[m]).unwrap();
        }
        let range = KeyRange::prefix(Bytes::from_static(b"b"));
        let r = read_changes(&e, 0, 1, u64::MAX, Some(&range)).unwrap();
        assert!(r.records.is_empty());
        assert_eq!((r.last_seq, r.head_seq, r.log_start), (1, 4, 1));
        let r = read_changes(&e, 1, 10, u64::MAX, Some(&range)).unwrap();
        assert_eq!(r.records.len(), 2);
        assert_eq!(r.last_seq, 4);
        let r = read_changes(&e, 4, 10, u64::MAX, None).unwrap();
        assert!(r.records.is_empty());
        assert_eq!(r.last_seq, 4);
        // The RPC's limit holds inside a batch too.
        e.apply(&[put("b3", 1), put("a3", 1), put("b4", 1)])
            .unwrap();
        let r = read_changes(&e, 4, 1, u64::MAX, Some(&range)).unwrap();
        assert_eq!((r.records.len(), r.last_seq), (1, 5));
    }

    #[test]
    fn log_truncated_status_carries_log_start() {
        let s = status_from_storage(StorageError::LogTruncated {
            after: 3,
            log_start: 10,
        });
        assert_eq!(s.code(), Code::FailedPrecondition);
        let d = pb::ErrorDetail::decode(s.details()).unwrap();
        assert_eq!(
            d.kind,
            Some(pb::error_detail::Kind::LogTruncated(pb::LogTruncated {
                after: 3,
                log_start: 10
            }))
        );
    }
}
