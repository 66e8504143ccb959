//! The migration-role calls of [`PeerClient`]: what the manager asks of a
//! migration's source (start the push, dual-write, fence, stop) and of any
//! node (its view of a partition). See `proto/peer.proto` for the contract;
//! every call is keyed by migration id and safe to repeat, and
//! [`PeerError::NotFound`] means the node lost (or never had) the
//! migration's volatile state.

use crate::client::{PeerClient, PeerError};
use crate::migration::{MigrationRef, ref_to_pb};
use crate::pb;
use bytes::Bytes;
use keyway_map::{Epoch, MapVersion, NodeId, PartitionId};
use keyway_storage::{KeyRange, RangeDigest, Seq};

/// What [`PeerClient::migrate_start`] asks the source to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PushSpec {
    pub id: u64,
    pub partition: PartitionId,
    /// e: the partition's epoch in the migration record (the source must
    /// own it at exactly e; the target checks its writes against it).
    pub epoch: Epoch,
    /// The partition's storage range on the source.
    pub range: KeyRange,
    /// The target's admin address.
    pub target: String,
    /// Copy the snapshot first (`COPYING`); false = change log only.
    pub copy: bool,
    /// Stream change records with seq > `after_seq`.
    pub after_seq: Seq,
    pub throttle: Throttle,
}

/// How fast the source may copy a snapshot (seed 003: throttling is not optional).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Throttle {
    /// Snapshot bytes per second; 0 = unlimited.
    pub max_bytes_per_sec: u64,
    /// Back off while the slowest recent reply on the source or the target
    /// (last 100-200 ms) took longer than this many microseconds; 0 = never.
    pub backoff_latency_us: u64,
    /// Payload bytes per snapshot chunk; 0 = the node's default.
    pub chunk_bytes: u64,
}

impl Default for Throttle {
    /// 64 MiB/s, back off above 50 ms of foreground tail latency, 1 MiB chunks.
    fn default() -> Self {
        Throttle {
            max_bytes_per_sec: 64 * 1024 * 1024,
            backoff_latency_us: 50_000,
            chunk_bytes: 1024 * 1024,
        }
    }
}

/// The source's report on one push.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PushStatus {
    pub copied_bytes: u64,
    pub copied_keys: u64,
    pub copy_done: bool,
    /// Every record of the range with seq <= `acked_seq` is applied (and
    /// fsynced) at the target.
    pub acked_seq: Seq,
    /// The source's last assigned seq.
    pub head_seq: Seq,
    pub dual: bool,
    pub fenced: bool,
    /// The push failed for good: the migration must abort.
    pub error: Option<String>,
    /// Times the copy backed off for foreground latency.
    pub backoffs: u64,
    /// Source seq of the verified checkpoint (0 = none yet).
    pub checkpoint_seq: Seq,
    /// The copy's cost so far (all 0 without a copy; see `keyway_node::copies`).
    pub copy_bytes_sent: u64,
    pub copy_bytes_written: u64,
    /// So far, or from the push's start to `copy_done`.
    pub copy_duration_ms: u64,
    /// Unix ms.
    pub copy_started_at_ms: u64,
}

/// What [`PeerClient::migrate_digest`] reports: both sides' digests of the
/// range at the fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FenceDigests {
    pub source: RangeDigest,
    pub target: RangeDigest,
    /// Checkpoint plus the keys written since (false: full range scans).
    pub incremental: bool,
    /// Keys read on each side beyond the checkpoint.
    pub delta_keys: u64,
}

pub fn fence_digests_from_pb(r: pb::MigrateDigestResponse) -> FenceDigests {
    FenceDigests {
        source: digest_from_pb(r.source),
        target: digest_from_pb(r.target),
        incremental: r.incremental,
        delta_keys: r.delta_keys,
    }
}

pub fn digest_from_pb(d: Option<pb::DigestResponse>) -> RangeDigest {
    let d = d.unwrap_or_default();
    RangeDigest {
        keys: d.keys,
        bytes: d.bytes,
        digest: d.digest,
    }
}

pub fn digest_to_pb(d: RangeDigest) -> pb::DigestResponse {
    pb::DigestResponse {
        keys: d.keys,
        bytes: d.bytes,
        digest: d.digest,
        seq: 0,
    }
}

impl From<pb::MigrateStatusResponse> for PushStatus {
    fn from(r: pb::MigrateStatusResponse) -> Self {
        PushStatus {
            copied_bytes: r.copied_bytes,
            copied_keys: r.copied_keys,
            copy_done: r.copy_done,
            acked_seq: r.acked_seq,
            head_seq: r.head_seq,
            dual: r.dual,
            fenced: r.fenced,
            error: (!r.error.is_empty()).then_some(r.error),
            backoffs: r.backoffs,
            checkpoint_seq: r.checkpoint_seq,
            copy_bytes_sent: r.copy_bytes_sent,
            copy_bytes_written: r.copy_bytes_written,
            copy_duration_ms: r.copy_duration_ms,
            copy_started_at_ms: r.copy_started_at_ms,
        }
    }
}

/// A node's installed view of one partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartitionView {
    pub owner: NodeId,
    pub epoch: Epoch,
    pub map_version: MapVersion,
}

impl PeerClient {
    /// Source: start (or keep) pushing the range to the target.
    pub async fn migrate_start(&self, spec: &PushSpec) -> Result<PushStatus, PeerError> {
        let msg = pb::MigrateStartRequest {
            id: spec.id,
            partition: spec.partition.0,
            epoch: spec.epoch.0,
            range: Some(pb::KeyRange {
                start: spec.range.start.clone(),
                end: spec.range.end.clone(),
            }),
            target: spec.target.clone(),
            copy: spec.copy,
            after_seq: spec.after_seq,
            max_bytes_per_sec: spec.throttle.max_bytes_per_sec,
            backoff_latency_us: spec.throttle.backoff_latency_us,
            chunk_bytes: spec.throttle.chunk_bytes,
        };
        let r = self
            .call("MigrateStart", msg, |mut c, r| async move {
                c.migrate_start(r).await
            })
            .await?;
        Ok(r.into())
    }

    /// Source: progress of push `id`.
    pub async fn migrate_status(&self, id: u64) -> Result<PushStatus, PeerError> {
        let msg = pb::MigrateIdRequest { id };
        let r = self
            .call("MigrateStatus", msg, |mut c, r| async move {
                c.migrate_status(r).await
            })
            .await?;
        Ok(r.into())
    }

    /// Source: dual-write on/off; returns the seq after which every write is
    /// dual-written.
    pub async fn migrate_dual(&self, id: u64, on: bool) -> Result<Seq, PeerError> {
        let msg = pb::MigrateToggleRequest {
            id,
            on,
            with_digests: false,
        };
        let r = self
            .call("MigrateDual", msg, |mut c, r| async move {
                c.migrate_dual(r).await
            })
            .await?;
        Ok(r.at_seq)
    }

    /// Source: fence on/off; with `on`, answers once in-flight writes are
    /// drained and applied at the target, with the source's seq then.
    pub async fn migrate_fence(&self, id: u64, on: bool) -> Result<Seq, PeerError> {
        Ok(self.fence_call(id, on, false).await?.seq)
    }

    /// Source: fence push `id` and take both sides' digests at the fence in
    /// the same call (`None`: a node that answers the fence only; ask
    /// [`Self::migrate_digest`]).
    pub async fn migrate_fence_digests(
        &self,
        id: u64,
    ) -> Result<(Seq, Option<FenceDigests>), PeerError> {
        let r = self.fence_call(id, true, true).await?;
        Ok((r.seq, r.digests.map(fence_digests_from_pb)))
    }

    async fn fence_call(
        &self,
        id: u64,
        on: bool,
        with_digests: bool,
    ) -> Result<pb::MigrateFenceResponse, PeerError> {
        let msg = pb::MigrateToggleRequest {
            id,
            on,
            with_digests,
        };
        self.call("MigrateFence", msg, |mut c, r| async move {
            c.migrate_fence(r).await
        })
        .await
    }

    /// Source: move push `id`'s checkpoint to the present before a fence;
    /// `(checkpoint seq, whether it moved in time)`.
    pub async fn migrate_checkpoint(&self, id: u64) -> Result<(Seq, bool), PeerError> {
        let msg = pb::MigrateIdRequest { id };
        let r = self
            .call("MigrateCheckpoint", msg, |mut c, r| async move {
                c.migrate_checkpoint(r).await
            })
            .await?;
        Ok((r.seq, r.moved))
    }

    /// Source: stop push `id` (no-op for an unknown id).
    pub async fn migrate_stop(&self, id: u64) -> Result<(), PeerError> {
        let msg = pb::MigrateIdRequest { id };
        self.call("MigrateStop", msg, |mut c, r| async move {
            c.migrate_stop(r).await
        })
        .await?;
        Ok(())
    }

    /// Source, while fenced: both sides' digests of the range.
    pub async fn migrate_digest(&self, id: u64) -> Result<FenceDigests, PeerError> {
        let msg = pb::MigrateIdRequest { id };
        let r = self
            .call("MigrateDigest", msg, |mut c, r| async move {
                c.migrate_digest(r).await
            })
            .await?;
        Ok(fence_digests_from_pb(r))
    }

    /// The peer's digest over `keys`, in order (absent keys count).
    pub async fn keys_digest(&self, keys: &[Bytes]) -> Result<RangeDigest, PeerError> {
        let msg = pb::KeysDigestRequest {
            keys: keys.to_vec(),
        };
        let r = self
            .call("KeysDigest", msg, |mut c, r| async move {
                c.keys_digest(r).await
            })
            .await?;
        Ok(digest_from_pb(Some(r)))
    }

    /// Target: accept (`on`) foreign records for incoming migration `m`, or
    /// no longer. [`PeerError::Refused`] if the target owns the partition or
    /// it moved past `m.epoch`; [`PeerError::Unavailable`] while the
    /// target's map is behind (retry).
    pub async fn migrate_receive(&self, m: &MigrationRef, on: bool) -> Result<(), PeerError> {
        let msg = pb::MigrateReceiveRequest {
            migration: Some(ref_to_pb(m)),
            on,
        };
        self.call("MigrateReceive", msg, |mut c, r| async move {
            c.migrate_receive(r).await
        })
        .await?;
        Ok(())
    }

    /// Target: hold requests for `partition` while its map shows it at
    /// `epoch` under another owner, for at most `hold` (`on: false` lifts).
    pub async fn migrate_incoming(
        &self,
        partition: PartitionId,
        epoch: Epoch,
        on: bool,
        hold: std::time::Duration,
    ) -> Result<(), PeerError> {
        let msg = pb::MigrateIncomingRequest {
            partition: partition.0,
            epoch: epoch.0,
            on,
            hold_ms: hold.as_millis() as u64,
        };
        self.call("MigrateIncoming", msg, |mut c, r| async move {
            c.migrate_incoming(r).await
        })
        .await?;
        Ok(())
    }

    /// The partition as the peer's installed map has it (`None`: unknown there).
    pub async fn partition_view(
        &self,
        partition: PartitionId,
    ) -> Result<Option<PartitionView>, PeerError> {
        self.partition_view_wait(partition, Epoch(0), std::time::Duration::ZERO)
            .await
    }

    /// [`Self::partition_view`], answered once the peer's map shows the
    /// partition at `min_epoch` or later (or no longer shows it), or after
    /// `wait` (capped by the peer at [`crate::MAX_VIEW_WAIT_MS`]): a wait
    /// for an install without polling.
    pub async fn partition_view_wait(
        &self,
        partition: PartitionId,
        min_epoch: Epoch,
        wait: std::time::Duration,
    ) -> Result<Option<PartitionView>, PeerError> {
        let msg = pb::PartitionViewRequest {
            partition: partition.0,
            wait_epoch: min_epoch.0,
            wait_ms: wait.as_millis().min(u64::MAX as u128) as u64,
        };
        let r = self
            .call("PartitionView", msg, |mut c, r| async move {
                c.partition_view(r).await
            })
            .await?;
        Ok(r.found.then_some(PartitionView {
            owner: NodeId(r.owner),
            epoch: Epoch(r.epoch),
            map_version: MapVersion(r.map_version),
        }))
    }
}
