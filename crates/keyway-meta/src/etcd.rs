//! [`EtcdMeta`]: the metadata store on an etcd v3 cluster (tested against
//! etcd 3.4), for production: the map survives any minority of etcd members
//! failing, and several Keyway processes share one store.
//!
//! Every map commit is ONE etcd transaction: it compares the mod revision of
//! `<p>/map/meta` (which every commit rewrites, so an unchanged meta key
//! means an unchanged map) and of each [`keyway_map::OwnershipCondition`]'s
//! partition record against what was read, then writes the changed records,
//! the new version and the version's history entry. The conditions and the
//! resulting map's `validate()` are checked on the map as read, before the
//! transaction is sent; when only the version moved (a concurrent, unrelated
//! commit) the commit re-reads and tries again, and when a condition no
//! longer holds it is refused with [`MetaError::Conflict`] exactly like the
//! embedded store. A commit whose transaction got no answer (a member died
//! mid-request) looks for its own token in the history before trying again,
//! so it is applied at most once and its caller learns whether it was.
//!
//! Watches are etcd watches on `<p>/history/`: each put there is one
//! version's changes, delivered in revision (= version) order; a watch
//! resumes from the last revision it saw on another member when its stream
//! breaks, and falls back to the whole map when etcd compacted past it.
//!
//! Leases are etcd leases (whole seconds, rounded up), with the holder in
//! `<p>/leases/<id>` attached to the lease, so the record disappears with it.
//!
//! Every RPC has a deadline ([`EtcdOptions::rpc_timeout`]) and moves on to
//! another member when one is down or has no leader; a call no member
//! answered in time fails with [`MetaError::Unavailable`].
//!
//! # Layout
//! - `etcd/conn.rs`: per-endpoint clients, the deadline-and-failover call,
//!   error classification, URL parsing.
//! - `etcd/layout.rs`: the key layout and value encodings.
//! - `etcd/map.rs`: reading the map (one range read at one revision),
//!   `changes_since`, and the commit transaction with its retries.
//! - `etcd/nodes.rs`: node registration and bootstrap (commits).
//! - `etcd/lease.rs`: leases.
//! - `etcd/watch.rs`: the map watch stream.
//! - `etcd/acl.rs`: ACL user records (`<p>/acl/users/<name>`).
//! - `etcd/migration.rs`: migration records and their id allocator
//!   (compare-and-set transactions on `<p>/migrations/`).
//! - `etcd/election.rs`: leader election (etcd's `Campaign`, plus direct
//!   reads, watches and deletes of the same keys).
//!
//! See `docs/etcd.md` for the key layout and the etcd behaviours relied on.

mod acl;
mod conn;
mod election;
mod layout;
mod lease;
mod map;
mod migration;
mod nodes;
mod watch;

use crate::{
    LeaderWatch, Leadership, LeaseId, LeaseInfo, MapTxn, MapUpdate, MapWatch, MetaError, MetaStore,
    MigrationPut, StoredMigration,
};
use conn::Conn;
use keyway_map::{MapVersion, NodeId, PartitionMap};
use layout::Layout;
use std::sync::Arc;
use std::time::Duration;

/// Tuning of an [`EtcdMeta`].
#[derive(Clone, Debug)]
pub struct EtcdOptions {
    /// Deadline of every call (each RPC, including its failover to other
    /// members); a call that no member answered in time fails with
    /// [`MetaError::Unavailable`].
    pub rpc_timeout: Duration,
    /// How many recent versions' changes are kept in `<p>/history/` for
    /// `changes_since` and watches (at least 1); older readers get the full
    /// map.
    pub history_versions: usize,
    /// The etcd server's `--max-txn-ops` (etcd's default: 128). A commit
    /// with more writes than this is split into nested transactions inside
    /// the one transaction (still atomic).
    pub max_txn_ops: usize,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            rpc_timeout: Duration::from_secs(2),
            history_versions: 4096,
            max_txn_ops: 128,
        }
    }
}

/// The metadata store on etcd. Cheap to share (`Arc` inside); watch streams
/// keep their own reference and outlive the handle.
#[derive(Clone)]
pub struct EtcdMeta {
    inner: Arc<Inner>,
}

struct Inner {
    conn: Conn,
    layout: Layout,
    opts: EtcdOptions,
    /// Test-only fault injection.
    #[cfg(test)]
    faults: Faults,
}

/// Faults unit tests inject.
#[cfg(test)]
#[derive(Default)]
struct Faults {
    /// How many more commit transactions lose their answer after etcd
    /// applied them (as when the member dies right after applying).
    lose_commit_answers: std::sync::atomic::AtomicUsize,
}

impl std::fmt::Debug for EtcdMeta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdMeta")
            .field("endpoints", &self.inner.conn.endpoints())
            .field("prefix", &self.inner.layout.prefix())
            .finish_non_exhaustive()
    }
}

impl EtcdMeta {
    /// Opens `etcd://host:port[,host:port...]/<key prefix>` with default
    /// options. Lazy: succeeds while etcd is down (calls then fail with
    /// [`MetaError::Unavailable`]); a malformed URL is refused with
    /// [`MetaError::InvalidArgument`] saying what is wrong.
    pub async fn connect(url: &str) -> Result<Self, MetaError> {
        Self::connect_with(url, EtcdOptions::default()).await
    }

    /// [`Self::connect`] with options.
    pub async fn connect_with(url: &str, opts: EtcdOptions) -> Result<Self, MetaError> {
        let (endpoints, prefix) = conn::parse_url(url)?;
        Self::open(endpoints, &prefix, opts).await
    }

    /// The store under key `prefix` (e.g. `/keyway/prod`; one per Keyway
    /// cluster) on the etcd members at `endpoints` (`host:port` each).
    pub async fn open(
        endpoints: Vec<String>,
        prefix: &str,
        opts: EtcdOptions,
    ) -> Result<Self, MetaError> {
        if endpoints.is_empty() {
            return Err(MetaError::InvalidArgument(
                "an etcd metadata store needs at least one endpoint".into(),
            ));
        }
        let trimmed = prefix.trim_matches('/');
        if trimmed.is_empty() {
            return Err(MetaError::InvalidArgument(
                "an etcd metadata store needs a non-empty key prefix, as in /keyway/prod".into(),
            ));
        }
        if opts.rpc_timeout.is_zero() {
            return Err(MetaError::InvalidArgument(
                "rpc_timeout must be positive".into(),
            ));
        }
        if opts.max_txn_ops < 4 {
            return Err(MetaError::InvalidArgument(format!(
                "max_txn_ops {} is too small (etcd's default is 128)",
                opts.max_txn_ops
            )));
        }
        let opts = EtcdOptions {
            history_versions: opts.history_versions.max(1),
            ..opts
        };
        let conn = Conn::connect(endpoints, opts.rpc_timeout).await?;
        Ok(EtcdMeta {
            inner: Arc::new(Inner {
                conn,
                layout: Layout::new(format!("/{trimmed}")),
                opts,
                #[cfg(test)]
                faults: Faults::default(),
            }),
        })
    }

    /// The key prefix every key of this store is under (`/a/b`).
    pub fn prefix(&self) -> &str {
        self.inner.layout.prefix()
    }

    /// The etcd client endpoints (`host:port`).
    pub fn endpoints(&self) -> &[String] {
        self.inner.conn.endpoints()
    }

    /// The options in force.
    pub fn options(&self) -> &EtcdOptions {
        &self.inner.opts
    }
}

impl EtcdMeta {
    /// A map commit of `txn` as given, with `put` in the same etcd
    /// transaction when there is one.
    async fn commit_txn(
        &self,
        txn: MapTxn,
        put: Option<&MigrationPut>,
    ) -> Result<MapVersion, MetaError> {
        self.inner
            .commit_with_record(put, |_| {
                Ok(map::Step::Commit {
                    txn: txn.clone(),
                    next_node_id: None,
                    result: (),
                })
            })
            .await
            .map(|(version, ())| version)
    }
}

#[async_trait::async_trait]
impl MetaStore for EtcdMeta {
    async fn get_map(&self) -> Result<PartitionMap, MetaError> {
        Ok(self.inner.read_snapshot(None).await?.map)
    }

    async fn changes_since(&self, since: MapVersion) -> Result<MapUpdate, MetaError> {
        Ok(self.inner.changes_since(since).await?.update)
    }

    async fn watch(&self, since: MapVersion) -> Result<MapWatch, MetaError> {
        watch::watch(self.inner.clone(), since).await
    }

    async fn commit(&self, txn: MapTxn) -> Result<MapVersion, MetaError> {
        self.commit_txn(txn, None).await
    }

    async fn commit_with_migration(
        &self,
        txn: MapTxn,
        put: MigrationPut,
    ) -> Result<MapVersion, MetaError> {
        self.commit_txn(txn, Some(&put)).await
    }

    async fn register_node_in_zone(
        &self,
        id: Option<NodeId>,
        resp_addr: String,
        admin_addr: String,
        zone: Option<String>,
    ) -> Result<NodeId, MetaError> {
        self.inner
            .register_node(id, resp_addr, admin_addr, zone)
            .await
    }

    async fn grant_lease(&self, node: NodeId, ttl_ms: u64) -> Result<LeaseId, MetaError> {
        self.inner.grant_lease(Some(node), ttl_ms).await
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<u64, MetaError> {
        self.inner.keep_alive(lease).await
    }

    async fn revoke_lease(&self, lease: LeaseId) -> Result<(), MetaError> {
        self.inner.revoke_lease(lease).await
    }

    async fn leases(&self) -> Result<Vec<LeaseInfo>, MetaError> {
        self.inner.leases().await
    }

    async fn grant_session_lease(&self, ttl_ms: u64) -> Result<LeaseId, MetaError> {
        self.inner.grant_lease(None, ttl_ms).await
    }

    async fn campaign(
        &self,
        election: &str,
        candidate: &str,
        lease: LeaseId,
    ) -> Result<Leadership, MetaError> {
        self.inner.campaign(election, candidate, lease).await
    }

    async fn leader(&self, election: &str) -> Result<Option<Leadership>, MetaError> {
        self.inner.leader(election).await
    }

    async fn observe(&self, election: &str) -> Result<LeaderWatch, MetaError> {
        election::observe(self.inner.clone(), election).await
    }

    async fn resign(&self, leadership: &Leadership) -> Result<(), MetaError> {
        self.inner.resign(leadership).await
    }

    async fn allocate_migration_id(&self) -> Result<u64, MetaError> {
        self.inner.allocate_migration_id().await
    }

    async fn put_migration(
        &self,
        id: u64,
        expected: Option<u64>,
        generation: u64,
        record: Vec<u8>,
    ) -> Result<(), MetaError> {
        self.inner
            .put_migration(id, expected, generation, record)
            .await
    }

    async fn get_migration(&self, id: u64) -> Result<Option<StoredMigration>, MetaError> {
        self.inner.get_migration(id).await
    }

    async fn migrations(&self) -> Result<Vec<StoredMigration>, MetaError> {
        self.inner.migrations().await
    }

    async fn delete_migration(&self, id: u64, expected: u64) -> Result<(), MetaError> {
        self.inner.delete_migration(id, expected).await
    }

    async fn acl_users(&self) -> Result<Vec<crate::AclRecord>, MetaError> {
        self.inner.acl_users().await
    }

    async fn put_acl_user(&self, record: crate::AclRecord) -> Result<(), MetaError> {
        self.inner.put_acl_user(record).await
    }

    async fn delete_acl_user(&self, name: &str) -> Result<bool, MetaError> {
        self.inner.delete_acl_user(name).await
    }

    async fn bootstrap_if_empty_with(
        &self,
        min_nodes: usize,
        partitions_per_node: u16,
        replication: crate::Replication,
    ) -> Result<bool, MetaError> {
        self.inner
            .bootstrap_if_empty(min_nodes, partitions_per_node, replication)
            .await
    }
}
