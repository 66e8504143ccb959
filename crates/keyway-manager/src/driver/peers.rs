//! [`MigrationPeers`]: every call the driver makes to a node, behind one
//! small async trait, so the driver can be tested against in-memory nodes.
//! [`RpcPeers`] is the real implementation over [`PeerClient`] (one cached
//! client per admin address).

use keyway_map::{Epoch, NodeId, PartitionId};
use keyway_peer::{
    FenceDigests, MigrationRef, PartitionView, PeerClient, PeerError, PushSpec, PushStatus,
};
use keyway_storage::{KeyRange, Seq};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// A node as the driver addresses it: its id (for logs and fakes) and its
/// admin address (`NodeInfo::admin_addr`, where its `Peer` service listens).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PeerAddr {
    pub node: NodeId,
    pub admin_addr: String,
}

/// The node-side calls of a migration (see `keyway_peer` for their
/// contracts). Every call is safe to repeat; [`PeerError::NotFound`] from a
/// `migrate_*` call means the node lost (or never had) the migration.
#[async_trait::async_trait]
pub trait MigrationPeers: Send + Sync + 'static {
    /// The node's last assigned change-log seq.
    async fn last_seq(&self, node: &PeerAddr) -> Result<Seq, PeerError>;
    /// `(keys, bytes)` of `range` at the node.
    async fn range_stats(&self, node: &PeerAddr, range: &KeyRange)
    -> Result<(u64, u64), PeerError>;
    /// Deletes up to `limit` entries of `range` on behalf of `migration`;
    /// 0 = the range is empty there. [`PeerError::Refused`]: the node owns
    /// part of the range or receives it under another migration (its data
    /// there is not this migration's to drop).
    async fn drop_range_chunk(
        &self,
        node: &PeerAddr,
        migration: &MigrationRef,
        range: &KeyRange,
        limit: usize,
    ) -> Result<u64, PeerError>;
    /// Source: start (or keep) pushing `spec.range` to `spec.target`.
    async fn migrate_start(
        &self,
        node: &PeerAddr,
        spec: &PushSpec,
    ) -> Result<PushStatus, PeerError>;
    /// Source: progress of push `id`.
    async fn migrate_status(&self, node: &PeerAddr, id: u64) -> Result<PushStatus, PeerError>;
    /// Source: dual-writing on/off; the seq after which every write is dual-written.
    async fn migrate_dual(&self, node: &PeerAddr, id: u64, on: bool) -> Result<Seq, PeerError>;
    /// Source: fence on/off; with `on`, answers once in-flight writes drained.
    async fn migrate_fence(&self, node: &PeerAddr, id: u64, on: bool) -> Result<Seq, PeerError>;
    /// Source: fence on, and both sides' digests at the fence in the same
    /// call; `None` digests: ask [`Self::migrate_digest`] (the default
    /// fences only, as a node without the flag answers).
    async fn migrate_fence_digests(
        &self,
        node: &PeerAddr,
        id: u64,
    ) -> Result<(Seq, Option<FenceDigests>), PeerError> {
        Ok((self.migrate_fence(node, id, true).await?, None))
    }
    /// Source: stop push `id`, dual-writing and the fence (ok for an unknown id).
    async fn migrate_stop(&self, node: &PeerAddr, id: u64) -> Result<(), PeerError>;
    /// The partition as the node's installed map has it, answered once it
    /// shows the partition at `min_epoch` or later (or no longer shows it)
    /// or after `wait` (zero: at once).
    async fn partition_view(
        &self,
        node: &PeerAddr,
        partition: PartitionId,
        min_epoch: Epoch,
        wait: Duration,
    ) -> Result<Option<PartitionView>, PeerError>;
    /// Source, right before a fence: move push `id`'s checkpoint to the
    /// present; `(checkpoint seq, moved in time)`.
    async fn migrate_checkpoint(&self, node: &PeerAddr, id: u64) -> Result<(Seq, bool), PeerError>;
    /// Source, while fenced: both sides' digests of migration `id`'s range
    /// (incremental since the push's checkpoint when it has one).
    async fn migrate_digest(&self, node: &PeerAddr, id: u64) -> Result<FenceDigests, PeerError>;
}

/// [`MigrationPeers`] over the nodes' `Peer` gRPC service.
#[derive(Default)]
pub struct RpcPeers {
    clients: Mutex<HashMap<String, PeerClient>>,
}

impl RpcPeers {
    pub fn new() -> Self {
        Self::default()
    }

    fn client(&self, node: &PeerAddr) -> Result<PeerClient, PeerError> {
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = clients.get(&node.admin_addr) {
            return Ok(c.clone());
        }
        let c = PeerClient::connect(&node.admin_addr)?;
        clients.insert(node.admin_addr.clone(), c.clone());
        Ok(c)
    }
}

#[async_trait::async_trait]
impl MigrationPeers for RpcPeers {
    async fn last_seq(&self, node: &PeerAddr) -> Result<Seq, PeerError> {
        self.client(node)?.last_seq().await
    }

    async fn range_stats(
        &self,
        node: &PeerAddr,
        range: &KeyRange,
    ) -> Result<(u64, u64), PeerError> {
        self.client(node)?.range_stats(range).await
    }

    async fn drop_range_chunk(
        &self,
        node: &PeerAddr,
        migration: &MigrationRef,
        range: &KeyRange,
        limit: usize,
    ) -> Result<u64, PeerError> {
        self.client(node)?
            .drop_range_chunk_for(migration, range, limit)
            .await
    }

    async fn migrate_start(
        &self,
        node: &PeerAddr,
        spec: &PushSpec,
    ) -> Result<PushStatus, PeerError> {
        self.client(node)?.migrate_start(spec).await
    }

    async fn migrate_status(&self, node: &PeerAddr, id: u64) -> Result<PushStatus, PeerError> {
        self.client(node)?.migrate_status(id).await
    }

    async fn migrate_dual(&self, node: &PeerAddr, id: u64, on: bool) -> Result<Seq, PeerError> {
        self.client(node)?.migrate_dual(id, on).await
    }

    async fn migrate_fence(&self, node: &PeerAddr, id: u64, on: bool) -> Result<Seq, PeerError> {
        self.client(node)?.migrate_fence(id, on).await
    }
    async fn migrate_fence_digests(
        &self,
        node: &PeerAddr,
        id: u64,
    ) -> Result<(Seq, Option<FenceDigests>), PeerError> {
        self.client(node)?.migrate_fence_digests(id).await
    }

    async fn migrate_stop(&self, node: &PeerAddr, id: u64) -> Result<(), PeerError> {
        self.client(node)?.migrate_stop(id).await
    }

    async fn partition_view(
        &self,
        node: &PeerAddr,
        partition: PartitionId,
        min_epoch: Epoch,
        wait: Duration,
    ) -> Result<Option<PartitionView>, PeerError> {
        self.client(node)?
            .partition_view_wait(partition, min_epoch, wait)
            .await
    }

    async fn migrate_checkpoint(&self, node: &PeerAddr, id: u64) -> Result<(Seq, bool), PeerError> {
        self.client(node)?.migrate_checkpoint(id).await
    }

    async fn migrate_digest(&self, node: &PeerAddr, id: u64) -> Result<FenceDigests, PeerError> {
        self.client(node)?.migrate_digest(id).await
    }
}
