//! [`PeerClient`]: the typed client of another node's `Peer` service, and the
//! two data-moving loops built on it, [`copy_range`] and [`catch_up`].
//!
//! The channel is lazy and reconnecting (creating a client never fails for an
//! unreachable node). Every call has a deadline ([`PeerOptions::rpc_timeout`]);
//! a missed deadline or a transport failure is [`PeerError::Unavailable`]
//! (for `apply_foreign` / `drop_range_chunk` the outcome is then unknown, but
//! both are safe to repeat while their migration permits them).

use crate::migration::{MigrationRef, RefusalReason, reason_from_pb, ref_to_pb};
use crate::pb::{self, peer_client::PeerClient as PbClient};
use crate::{MAX_CHANGES_RECORDS, MAX_CHUNK_BYTES, MAX_MESSAGE_BYTES, MAX_SNAPSHOT_ENTRIES};
use bytes::Bytes;
use keyway_storage::{ChangeRecord, KeyRange, Mutation, RangeDigest, Seq, Value};
use prost::Message;
use std::time::Duration;
use tonic::Code;
use tonic::transport::Endpoint;

/// What a peer call can fail with.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum PeerError {
    /// The peer could not be reached or did not answer in time; retry later
    /// (a write's outcome is unknown, but every call is safe to repeat).
    #[error("peer unavailable: {0}")]
    Unavailable(String),
    /// The peer's change log no longer holds the records asked for (records
    /// `< log_start` were truncated): re-snapshot the range.
    #[error("peer change log truncated: oldest retained seq is {log_start}")]
    LogTruncated {
        /// Oldest seq still in the peer's log.
        log_start: Seq,
    },
    /// The request was malformed or out of bounds (a bug in the caller).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The peer does not know the thing asked about (e.g. a migration id it
    /// lost in a restart).
    #[error("not found at peer: {0}")]
    NotFound(String),
    /// The peer refused a data-changing call for its migration (see
    /// `keyway_node::migrate::receive`): it owns the range, receives it under
    /// another migration, does not receive this one, ... Not retryable.
    #[error("refused by peer ({reason:?}): {detail}")]
    Refused {
        reason: RefusalReason,
        detail: String,
    },
    /// Anything else the peer reported (storage failure, corrupt answer, ...).
    #[error("peer error: {0}")]
    Remote(String),
}

impl PeerError {
    fn from_status(status: &tonic::Status) -> Self {
        match status.code() {
            Code::FailedPrecondition => {
                let detail = pb::ErrorDetail::decode(status.details())
                    .ok()
                    .and_then(|d| d.kind);
                match detail {
                    Some(pb::error_detail::Kind::LogTruncated(t)) => PeerError::LogTruncated {
                        log_start: t.log_start,
                    },
                    Some(pb::error_detail::Kind::Refused(r)) => match reason_from_pb(r.reason) {
                        Some(reason) => PeerError::Refused {
                            reason,
                            detail: status.message().to_string(),
                        },
                        None => PeerError::Remote(status.message().to_string()),
                    },
                    None => PeerError::Remote(status.message().to_string()),
                }
            }
            Code::InvalidArgument => PeerError::InvalidArgument(status.message().to_string()),
            Code::NotFound => PeerError::NotFound(status.message().to_string()),
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown => {
                PeerError::Unavailable(format!("{:?}: {}", status.code(), status.message()))
            }
            code => PeerError::Remote(format!("{code:?}: {}", status.message())),
        }
    }
}

/// Tuning of a [`PeerClient`].
#[derive(Clone, Debug)]
pub struct PeerOptions {
    /// Deadline of every call (and of opening a connection); default 30 s
    /// (`digest` and `range_stats` read the whole range).
    pub rpc_timeout: Duration,
    /// HTTP/2 keep-alive ping interval and ack timeout; default 5 s.
    pub keep_alive: Duration,
    /// The cluster secret every call carries; default the process's
    /// ([`keyway_auth::process_secret`]).
    pub secret: Option<keyway_auth::ClusterSecret>,
}

impl Default for PeerOptions {
    fn default() -> Self {
        PeerOptions {
            rpc_timeout: Duration::from_secs(30),
            keep_alive: Duration::from_secs(5),
            secret: keyway_auth::process_secret(),
        }
    }
}

/// One snapshot entry: a key, its value at the source, and the source seq
/// of the engine snapshot it was read from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotEntry {
    /// Routing key.
    pub key: Bytes,
    /// The value (with the source's `version`, informational).
    pub value: Value,
    /// Every source record with `seq <= as_of` is reflected in `value`.
    pub as_of: Seq,
}

impl SnapshotEntry {
    /// The record that installs this entry at a target through
    /// `apply_foreign`: a `Put` with seq **`as_of`** (not `value.version`,
    /// which may come from another node's seq space; see the module docs of
    /// [`crate`]). Any later source record for the key (`seq > as_of`)
    /// replayed by catch-up wins over it; any earlier one is ignored.
    pub fn to_change_record(&self) -> ChangeRecord {
        ChangeRecord {
            batch_continues: false,
            seq: self.as_of,
            mutation: Mutation::Put {
                key: self.key.clone(),
                kind: self.value.kind,
                expire_at_ms: self.value.expire_at_ms,
                data: self.value.data.clone(),
            },
        }
    }
}

/// One page of a remote snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotChunk {
    /// Entries in key order.
    pub entries: Vec<SnapshotEntry>,
    /// Exclusive resume cursor; `None` = the range is exhausted.
    pub next: Option<Bytes>,
    /// Seq of the chunk's first engine snapshot (`<=` every entry's `as_of`).
    pub seq: Seq,
    /// Payload bytes (key + data) of `entries`.
    pub bytes: u64,
}

/// One answer of a remote `Changes` call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChangesChunk {
    /// Records in seq order (only those in the requested range, if any).
    pub records: Vec<ChangeRecord>,
    /// Resume cursor: every record `<= last_seq` was examined.
    pub last_seq: Seq,
    /// Oldest seq the source still retains.
    pub log_start: Seq,
    /// The source's last seq when read (`head_seq - last_seq` = lag).
    pub head_seq: Seq,
}

/// What an `ApplyForeign` call for a migration reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Applied {
    /// The peer's own last seq afterwards.
    pub last_seq: Seq,
    /// The peer's recent foreground latency, microseconds (0 = unknown).
    pub recent_latency_us: u64,
    /// Payload bytes (key + data) the peer applied (0 from an older node).
    pub bytes_written: u64,
}

/// A gRPC client of one node's `Peer` service; cheap to clone.
#[derive(Clone)]
pub struct PeerClient {
    client: PbClient<keyway_auth::AuthChannel>,
    addr: String,
    opts: PeerOptions,
}

impl std::fmt::Debug for PeerClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerClient")
            .field("addr", &self.addr)
            .field("opts", &self.opts)
            .finish()
    }
}

fn range_to_pb(range: &KeyRange) -> pb::KeyRange {
    pb::KeyRange {
        start: range.start.clone(),
        end: range.end.clone(),
    }
}

fn corrupt(what: &str, err: impl std::fmt::Display) -> PeerError {
    PeerError::Remote(format!("undecodable {what} from peer: {err}"))
}

fn to_u32(name: &str, v: usize) -> Result<u32, PeerError> {
    u32::try_from(v).map_err(|_| PeerError::InvalidArgument(format!("{name} {v} too large")))
}

impl PeerClient {
    /// A client of the node whose admin port is `admin_addr` (`host:port` or
    /// `http://host:port`, as in `NodeInfo.admin_addr`), default options.
    /// Does not connect yet.
    pub fn connect(admin_addr: &str) -> Result<Self, PeerError> {
        Self::connect_with(admin_addr, PeerOptions::default())
    }

    /// As [`Self::connect`], with options.
    pub fn connect_with(admin_addr: &str, opts: PeerOptions) -> Result<Self, PeerError> {
        let hostport = admin_addr
            .strip_prefix("http://")
            .unwrap_or(admin_addr)
            .trim_end_matches('/');
        if hostport.is_empty() || hostport.contains("://") || hostport.contains('/') {
            return Err(PeerError::InvalidArgument(format!(
                "peer address must be host:port, got {admin_addr:?}"
            )));
        }
        let endpoint = Endpoint::from_shared(format!("http://{hostport}"))
            .map_err(|e| PeerError::InvalidArgument(format!("peer address {admin_addr:?}: {e}")))?
            .connect_timeout(opts.rpc_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(opts.keep_alive)
            .keep_alive_timeout(opts.keep_alive)
            .keep_alive_while_idle(true);
        let channel = keyway_auth::auth_channel(endpoint.connect_lazy(), opts.secret.as_ref());
        let client = PbClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        Ok(PeerClient {
            client,
            addr: hostport.to_string(),
            opts,
        })
    }

    /// The peer's `host:port`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The generated client (for the streaming calls, see
    /// [`crate::replicate_stream`]).
    pub(crate) fn pb_client(&self) -> PbClient<keyway_auth::AuthChannel> {
        self.client.clone()
    }

    /// A failed call's status as a `PeerError` (credentials refused: said so).
    pub(crate) fn error_from(&self, status: &tonic::Status) -> PeerError {
        match status.code() {
            Code::Unauthenticated => PeerError::Remote(keyway_auth::refused_message(
                "node",
                &self.addr,
                status.message(),
            )),
            _ => PeerError::from_status(status),
        }
    }

    /// Runs one call under the deadline, mapping every failure to a `PeerError`.
    pub(super) async fn call<Req, T, F, Fut>(
        &self,
        what: &str,
        msg: Req,
        f: F,
    ) -> Result<T, PeerError>
    where
        F: FnOnce(PbClient<keyway_auth::AuthChannel>, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let mut req = tonic::Request::new(msg);
        // Lets the server give up when the client has.
        req.set_timeout(self.opts.rpc_timeout);
        match tokio::time::timeout(self.opts.rpc_timeout, f(self.client.clone(), req)).await {
            Ok(Ok(resp)) => Ok(resp.into_inner()),
            Ok(Err(status)) => Err(self.error_from(&status)),
            Err(_) => Err(PeerError::Unavailable(format!(
                "{what} to peer {} timed out after {:?}",
                self.addr, self.opts.rpc_timeout
            ))),
        }
    }

    /// One chunk of `range` after `after`: at most `limit` entries and
    /// `max_chunk_bytes` payload bytes (a single larger entry comes alone).
    /// Limits above [`MAX_SNAPSHOT_ENTRIES`] / [`MAX_CHUNK_BYTES`] are clamped
    /// by the server; zero is [`PeerError::InvalidArgument`].
    pub async fn snapshot_chunk(
        &self,
        range: &KeyRange,
        after: Option<&Bytes>,
        limit: usize,
        max_chunk_bytes: u64,
    ) -> Result<SnapshotChunk, PeerError> {
        let msg = pb::SnapshotRequest {
            range: Some(range_to_pb(range)),
            after: after.cloned(),
            limit: to_u32("limit", limit)?,
            max_chunk_bytes,
        };
        let resp = self
            .call(
                "Snapshot",
                msg,
                |mut c, r| async move { c.snapshot(r).await },
            )
            .await?;
        let mut entries = Vec::with_capacity(resp.entries.len());
        for e in resp.entries {
            match Mutation::decode(&e.put).map_err(|err| corrupt("snapshot entry", err))? {
                Mutation::Put {
                    key,
                    kind,
                    expire_at_ms,
                    data,
                } => entries.push(SnapshotEntry {
                    key,
                    value: Value {
                        kind,
                        expire_at_ms,
                        version: e.version,
                        data,
                    },
                    as_of: e.as_of,
                }),
                other => return Err(corrupt("snapshot entry", format!("not a Put: {other:?}"))),
            }
        }
        Ok(SnapshotChunk {
            entries,
            next: resp.next,
            seq: resp.seq,
            bytes: resp.bytes,
        })
    }

    /// Records after `after_seq` (examining at most `limit`, returning at most
    /// `max_bytes` encoded bytes), only those in `range` if given.
    /// [`PeerError::LogTruncated`] if the peer already dropped some of them.
    pub async fn changes(
        &self,
        after_seq: Seq,
        limit: usize,
        max_bytes: u64,
        range: Option<&KeyRange>,
    ) -> Result<ChangesChunk, PeerError> {
        let msg = pb::ChangesRequest {
            after_seq,
            limit: to_u32("limit", limit)?,
            max_bytes,
            range: range.map(range_to_pb),
        };
        let resp = self
            .call("Changes", msg, |mut c, r| async move { c.changes(r).await })
            .await?;
        let records = resp
            .records
            .iter()
            .map(|b| ChangeRecord::decode(b).map_err(|e| corrupt("change record", e)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ChangesChunk {
            records,
            last_seq: resp.last_seq,
            log_start: resp.log_start,
            head_seq: resp.head_seq,
        })
    }

    /// The peer's digest of `range` and the seq it reflects.
    pub async fn digest(&self, range: &KeyRange) -> Result<(RangeDigest, Seq), PeerError> {
        let msg = pb::DigestRequest {
            range: Some(range_to_pb(range)),
        };
        let r = self
            .call("Digest", msg, |mut c, r| async move { c.digest(r).await })
            .await?;
        Ok((
            RangeDigest {
                keys: r.keys,
                bytes: r.bytes,
                digest: r.digest,
            },
            r.seq,
        ))
    }

    /// Applies `records` (another node's log records) at a peer serving a
    /// bare engine (tests, tools: a node refuses a call that names no
    /// migration), versioned and idempotent; returns the peer's own last seq
    /// afterwards. At most [`crate::MAX_APPLY_RECORDS`] records per call.
    pub async fn apply_foreign(&self, records: &[ChangeRecord]) -> Result<Seq, PeerError> {
        Ok(self
            .apply_foreign_report(None, records, false)
            .await?
            .last_seq)
    }

    /// Applies `records` at the peer for migration `m` (the peer must have
    /// it registered as incoming and must not own the partition, else
    /// [`PeerError::Refused`]); with `sync` the peer fsyncs before answering:
    /// an `Ok` means the records survive a crash of the peer. Returns the
    /// peer's last seq, its recent foreground latency and the bytes it
    /// applied ([`Applied`]).
    pub async fn apply_foreign_for(
        &self,
        m: &MigrationRef,
        records: &[ChangeRecord],
        sync: bool,
    ) -> Result<Applied, PeerError> {
        self.apply_foreign_report(Some(m), records, sync).await
    }

    async fn apply_foreign_report(
        &self,
        m: Option<&MigrationRef>,
        records: &[ChangeRecord],
        sync: bool,
    ) -> Result<Applied, PeerError> {
        let msg = pb::ApplyForeignRequest {
            records: records.iter().map(|r| Bytes::from(r.encode())).collect(),
            sync,
            migration: m.map(ref_to_pb),
        };
        let r = self
            .call("ApplyForeign", msg, |mut c, r| async move {
                c.apply_foreign(r).await
            })
            .await?;
        Ok(Applied {
            last_seq: r.last_seq,
            recent_latency_us: r.recent_latency_us,
            bytes_written: r.bytes_written,
        })
    }

    /// One call of a replication stream or catch-up (see `keyway_node::replicate`).
    pub async fn replicate(
        &self,
        msg: pb::ReplicateRequest,
    ) -> Result<pb::ReplicateResponse, PeerError> {
        self.call(
            "Replicate",
            msg,
            |mut c, r| async move { c.replicate(r).await },
        )
        .await
    }

    /// Asks the primary of `partition` (at `epoch`) for a planned
    /// switchover to `to` (any in-sync replica when `None`), fenced for at
    /// most `timeout`; the new owner, epoch and the pause.
    pub async fn switchover(
        &self,
        partition: keyway_map::PartitionId,
        epoch: keyway_map::Epoch,
        to: Option<keyway_map::NodeId>,
        timeout: Duration,
    ) -> Result<(keyway_map::NodeId, keyway_map::Epoch, Duration), PeerError> {
        let msg = pb::SwitchoverRequest {
            partition: partition.0,
            epoch: epoch.0,
            to: to.map_or(0, |n| n.0),
            timeout_ms: timeout.as_millis() as u64,
        };
        let r = self
            .call("Switchover", msg, |mut c, r| async move {
                c.switchover(r).await
            })
            .await?;
        Ok((
            keyway_map::NodeId(r.owner),
            keyway_map::Epoch(r.epoch),
            Duration::from_micros(r.paused_us),
        ))
    }

    /// Deletes up to `limit` entries of `range` at a peer serving a bare
    /// engine (tests, tools: a node refuses a call that names no migration),
    /// no change records; `0` = the range is empty there.
    pub async fn drop_range_chunk(&self, range: &KeyRange, limit: usize) -> Result<u64, PeerError> {
        self.drop_range_chunk_report(None, range, limit).await
    }

    /// Deletes up to `limit` entries of `range` at the peer on behalf of
    /// migration `m` (its target's copy, or its source's range after the
    /// flip); [`PeerError::Refused`] if the peer owns part of the range or
    /// receives it under another migration. `0` = the range is empty there.
    pub async fn drop_range_chunk_for(
        &self,
        m: &MigrationRef,
        range: &KeyRange,
        limit: usize,
    ) -> Result<u64, PeerError> {
        self.drop_range_chunk_report(Some(m), range, limit).await
    }

    async fn drop_range_chunk_report(
        &self,
        m: Option<&MigrationRef>,
        range: &KeyRange,
        limit: usize,
    ) -> Result<u64, PeerError> {
        let msg = pb::DropRangeChunkRequest {
            range: Some(range_to_pb(range)),
            limit: to_u32("limit", limit)?,
            migration: m.map(ref_to_pb),
        };
        let r = self
            .call("DropRangeChunk", msg, |mut c, r| async move {
                c.drop_range_chunk(r).await
            })
            .await?;
        Ok(r.deleted)
    }

    /// `(keys, bytes)` of `range` at the peer.
    pub async fn range_stats(&self, range: &KeyRange) -> Result<(u64, u64), PeerError> {
        let msg = pb::RangeStatsRequest {
            range: Some(range_to_pb(range)),
        };
        let r = self
            .call("RangeStats", msg, |mut c, r| async move {
                c.range_stats(r).await
            })
            .await?;
        Ok((r.keys, r.bytes))
    }

    /// The load statistics of every partition the peer owns in its
    /// installed map (see `keyway_node::stats`).
    pub async fn partition_stats(&self) -> Result<crate::stats::NodeReport, PeerError> {
        let r = self
            .call(
                "PartitionStats",
                pb::PartitionStatsRequest {},
                |mut c, r| async move { c.partition_stats(r).await },
            )
            .await?;
        Ok(crate::stats::from_pb(r))
    }

    /// One `RangeScan` step (see `keyway_node::kw::rpc`): entries of a partition
    /// the peer owns at the request's epoch, or its refusal.
    pub async fn range_scan(
        &self,
        req: pb::RangeScanRequest,
    ) -> Result<pb::RangeScanResponse, PeerError> {
        self.call(
            "RangeScan",
            req,
            |mut c, r| async move { c.range_scan(r).await },
        )
        .await
    }

    /// The peer's last assigned seq.
    pub async fn last_seq(&self) -> Result<Seq, PeerError> {
        let r = self
            .call("LastSeq", pb::LastSeqRequest {}, |mut c, r| async move {
                c.last_seq(r).await
            })
            .await?;
        Ok(r.seq)
    }
}

/// Chunk sizes of [`copy_range`] and [`catch_up`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyChunk {
    /// Entries (snapshot) or examined records (catch-up) per call.
    pub entries: usize,
    /// Payload bytes per snapshot chunk / encoded bytes per changes answer.
    pub bytes: u64,
}

impl Default for CopyChunk {
    /// 1,000 entries / 1 MiB: a chunk's snapshot is short-lived and one
    /// `ApplyForeign` stays small.
    fn default() -> Self {
        CopyChunk {
            entries: 1_000,
            bytes: 1024 * 1024,
        }
    }
}

impl CopyChunk {
    fn clamped(self) -> (usize, u64) {
        (
            self.entries
                .clamp(1, MAX_SNAPSHOT_ENTRIES.min(MAX_CHANGES_RECORDS) as usize),
            self.bytes.clamp(1, MAX_CHUNK_BYTES),
        )
    }
}

/// What [`copy_range`] moved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyReport {
    /// Seq of the **first** snapshot chunk: catch up from here.
    pub snapshot_seq: Seq,
    /// Payload bytes (key + data) copied.
    pub bytes: u64,
    /// Entries copied.
    pub keys: u64,
}

/// Copies every live entry of `range` from `source` to `target` (snapshot
/// chunks applied with `ApplyForeign`, see [`SnapshotEntry::to_change_record`]).
/// The copy is fuzzy; follow it with [`catch_up`] from
/// [`CopyReport::snapshot_seq`]. The target's range should be empty first
/// (leftovers of an aborted attempt are not removed by the copy).
/// Unthrottled: a driver that needs a bandwidth cap pages itself with
/// [`PeerClient::snapshot_chunk`].
pub async fn copy_range(
    source: &PeerClient,
    target: &PeerClient,
    range: &KeyRange,
    chunk: CopyChunk,
) -> Result<CopyReport, PeerError> {
    let (limit, max_bytes) = chunk.clamped();
    let mut after: Option<Bytes> = None;
    let mut report: Option<CopyReport> = None;
    loop {
        let c = source
            .snapshot_chunk(range, after.as_ref(), limit, max_bytes)
            .await?;
        let r = report.get_or_insert(CopyReport {
            snapshot_seq: c.seq,
            bytes: 0,
            keys: 0,
        });
        if !c.entries.is_empty() {
            let records: Vec<_> = c
                .entries
                .iter()
                .map(SnapshotEntry::to_change_record)
                .collect();
            target.apply_foreign(&records).await?;
        }
        r.keys += c.entries.len() as u64;
        r.bytes += c.bytes;
        match c.next {
            Some(next) => after = Some(next),
            None => return Ok(*r),
        }
    }
}

/// Replays `source`'s change records for `range` after `after_seq` onto
/// `target`, until it reaches the source's last seq as of the first call (so
/// it ends even under a steady write load); returns the source seq up to
/// which everything in `range` is now applied (pass it as the next
/// `after_seq`). [`PeerError::LogTruncated`] = re-snapshot.
pub async fn catch_up(
    source: &PeerClient,
    target: &PeerClient,
    range: &KeyRange,
    after_seq: Seq,
) -> Result<Seq, PeerError> {
    let (limit, max_bytes) = CopyChunk::default().clamped();
    let mut after = after_seq;
    let mut goal: Option<Seq> = None;
    loop {
        let c = source.changes(after, limit, max_bytes, Some(range)).await?;
        if !c.records.is_empty() {
            target.apply_foreign(&c.records).await?;
        }
        let goal = *goal.get_or_insert(c.head_seq);
        let progressed = c.last_seq > after;
        after = c.last_seq.max(after);
        // `!progressed`: nothing after `after` exists (defensive; a gapless
        // log always yields a record while `after < head_seq`).
        if after >= goal || !progressed {
            return Ok(after);
        }
    }
}
