//! The [`MetaStore`] trait every backend implements (embedded, remote, and
//! later etcd), and the plain types its calls take and return.

use crate::MetaError;
use keyway_map::{MapChange, MapVersion, NodeId, OwnershipCondition, PartitionMap};
use std::pin::Pin;

/// A lease's id: allocated by the store (1, 2, 3, ...), never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseId(pub u64);

impl std::fmt::Display for LeaseId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A live lease as the store sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseInfo {
    pub lease: LeaseId,
    pub node: NodeId,
    /// Milliseconds until the store considers it expired, by the store's clock.
    pub remaining_ms: u64,
}

/// One compare-and-set transaction: every condition must hold, then all the
/// changes apply together as one new map version (invariant 6).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MapTxn {
    pub conditions: Vec<OwnershipCondition>,
    pub changes: Vec<MapChange>,
}

impl MapTxn {
    /// A transaction with no conditions.
    pub fn unconditional(changes: Vec<MapChange>) -> Self {
        MapTxn {
            conditions: Vec::new(),
            changes,
        }
    }
}

/// A migration record's compare-and-set ([`MetaStore::put_migration`]'s
/// arguments) riding with a map commit in
/// [`MetaStore::commit_with_migration`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MigrationPut {
    pub id: u64,
    /// The generation stored now (`None`: no record yet).
    pub expected: Option<u64>,
    pub generation: u64,
    pub record: Vec<u8>,
}

/// How a reader catches up from the map version it has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MapUpdate {
    /// The changes of every version after the reader's, contiguous and in
    /// order. Empty when the reader is current.
    Delta(Vec<(MapVersion, Vec<MapChange>)>),
    /// The whole map: the reader's version is older than the retained history
    /// (or newer than the store's, which means the store was replaced).
    Full(PartitionMap),
}

impl MapUpdate {
    /// The map version a reader is at after applying this update, or `None`
    /// for an empty delta.
    pub fn version(&self) -> Option<MapVersion> {
        match self {
            MapUpdate::Delta(entries) => entries.last().map(|(v, _)| *v),
            MapUpdate::Full(map) => Some(map.version),
        }
    }

    /// Brings `map` up to date: replaces it for `Full`, applies each delta
    /// entry (skipping versions `map` already has) and validates the result.
    /// A delta that does not continue from `map`'s version is refused with
    /// [`MetaError::InvalidArgument`] and leaves `map` untouched: the reader
    /// should re-read the whole map.
    pub fn apply_to(&self, map: &mut PartitionMap) -> Result<(), MetaError> {
        match self {
            MapUpdate::Full(full) => {
                full.validate()?;
                *map = full.clone();
            }
            MapUpdate::Delta(entries) => {
                let mut next = map.clone();
                for (version, changes) in entries {
                    if *version <= next.version {
                        continue;
                    }
                    if version.0 != next.version.0 + 1 {
                        return Err(MetaError::InvalidArgument(format!(
                            "delta jumps from map version {} to {}",
                            next.version, version
                        )));
                    }
                    next.apply(*version, changes)?;
                }
                next.validate()?;
                *map = next;
            }
        }
        Ok(())
    }
}

/// A stream of map updates; see [`MetaStore::watch`].
pub type MapWatch =
    Pin<Box<dyn futures::Stream<Item = Result<MapUpdate, MetaError>> + Send + 'static>>;

/// A won election: who leads which election, under which lease, and an
/// opaque token naming this one candidacy (etcd: the leader key and its
/// create revision; embedded: a never-reused candidacy number).
///
/// Two `Leadership`s are equal only if they are the same candidacy: a
/// candidate that resigned and won again holds a different token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leadership {
    pub election: String,
    pub candidate: String,
    pub lease: LeaseId,
    pub token: Vec<u8>,
}

/// A stream of an election's leader; see [`MetaStore::observe`].
pub type LeaderWatch =
    Pin<Box<dyn futures::Stream<Item = Result<Option<Leadership>, MetaError>> + Send + 'static>>;

/// One stored migration record: opaque bytes (the store never interprets
/// them) plus the generation they were written at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredMigration {
    pub id: u64,
    pub generation: u64,
    pub record: Vec<u8>,
}

/// The argument checks every backend makes before a
/// [`MetaStore::put_migration`] looks at what is stored: ids start at 1, and
/// the new generation must exceed the expected one (>= 1 when creating).
pub(crate) fn check_migration_put(
    id: u64,
    expected: Option<u64>,
    generation: u64,
) -> Result<(), MetaError> {
    if id == 0 {
        return Err(MetaError::InvalidArgument(
            "migration ids start at 1".into(),
        ));
    }
    if generation <= expected.unwrap_or(0) {
        return Err(MetaError::InvalidArgument(format!(
            "migration {id}: generation {generation} does not exceed the expected {}",
            expected.map_or_else(|| "0 (creating)".to_string(), |g| g.to_string())
        )));
    }
    Ok(())
}

/// The error for creating a record under an id the store never allocated.
pub(crate) fn migration_id_not_allocated(id: u64) -> MetaError {
    MetaError::InvalidArgument(format!(
        "migration id {id} was never allocated by this metadata store"
    ))
}

/// The error for [`MetaStore::commit_with_migration`] asked to create a
/// record (records are created with [`MetaStore::put_migration`]).
pub(crate) fn create_with_commit(id: u64) -> MetaError {
    MetaError::InvalidArgument(format!(
        "migration {id}: a record is created with put_migration, not with a map commit"
    ))
}

/// What the election methods of a backend without leader election return.
pub fn election_unsupported() -> MetaError {
    MetaError::Internal("leader election not supported by this backend".into())
}

/// One ACL user record: the user's name and its rules as `ACL LIST` prints
/// them after `user <name> ` (opaque to the store; `keyway-acl` writes and
/// reads them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AclRecord {
    pub name: String,
    pub rules: String,
}

/// What the ACL methods of a backend without ACL records return.
pub fn acl_unsupported() -> MetaError {
    MetaError::Internal("ACL records not supported by this backend".into())
}

/// The metadata store: authoritative home of the partition map, the node
/// registry and leases.
///
/// Every implementation passes [`crate::conformance`]. Callers hold it as
/// `Arc<dyn MetaStore>` (see [`crate::connect`]).
#[async_trait::async_trait]
pub trait MetaStore: Send + Sync + 'static {
    /// The current map (validated).
    async fn get_map(&self) -> Result<PartitionMap, MetaError>;

    /// What changed after `since`: the list of (version, changes) in order
    /// (empty when `since` is current), or the whole map when `since` is older
    /// than the retained history (or newer than the current version).
    async fn changes_since(&self, since: MapVersion) -> Result<MapUpdate, MetaError>;

    /// A stream of updates after `since` (first item: anything already newer
    /// than `since`). No version is skipped: an entry is delivered for every
    /// version in order, except that a watcher that fell too far behind gets
    /// a `Full` map and continues from its version. Ends with an error item if
    /// the store goes away; the caller re-watches from its last version.
    async fn watch(&self, since: MapVersion) -> Result<MapWatch, MetaError>;

    /// Atomically: check every condition, apply the changes as version
    /// current+1, validate the resulting map (a map that fails `validate()` is
    /// refused with [`MetaError::InvalidMap`] and nothing changes), persist
    /// durably, then publish to watchers. Returns the new version.
    ///
    /// A failed condition gives [`MetaError::Conflict`] with the first failing
    /// partition and what it holds now.
    async fn commit(&self, txn: MapTxn) -> Result<MapVersion, MetaError>;

    /// A migration record's compare-and-set and a map commit as **one**
    /// transaction: both apply, or neither does. The record must exist
    /// (`put.expected` is `Some`). The record's conditions are
    /// checked first ([`MetaError::InvalidArgument`], then
    /// [`MetaError::MigrationConflict`]: the map is untouched), then the
    /// map's ([`MetaError::Conflict`], [`MetaError::InvalidMap`]: the record
    /// is untouched). An unknown outcome ([`MetaError::Unavailable`]) is
    /// settled by reading the record: its new generation means both applied.
    ///
    /// The migration driver's flip uses it: the flip request and the flip
    /// CAS cost one durable write inside the write pause instead of two, and
    /// the request is still durable no later than the CAS (see
    /// `keyway_migration::Command`'s contract).
    ///
    async fn commit_with_migration(
        &self,
        txn: MapTxn,
        put: MigrationPut,
    ) -> Result<MapVersion, MetaError>;

    /// Registers a node: with `id: None` allocates a new [`NodeId`] (1, 2, 3,
    /// ...; never reused); with `Some(id)` re-registers (updates addresses,
    /// state Up; keeps the weight, the draining flag and the zone), refusing an id this store never allocated with
    /// [`MetaError::InvalidArgument`]. Upserts the node record in the map
    /// (bumps the version). Returns the id.
    async fn register_node(
        &self,
        id: Option<NodeId>,
        resp_addr: String,
        admin_addr: String,
    ) -> Result<NodeId, MetaError> {
        self.register_node_in_zone(id, resp_addr, admin_addr, None)
            .await
    }

    /// [`MetaStore::register_node`] that also sets the node's zone label in
    /// the same commit (`None` keeps the one it has), so a bootstrap that
    /// this registration completes already places copies by zone.
    async fn register_node_in_zone(
        &self,
        id: Option<NodeId>,
        resp_addr: String,
        admin_addr: String,
        zone: Option<String>,
    ) -> Result<NodeId, MetaError>;

    /// Grants a lease to a registered node for `ttl_ms` (> 0) milliseconds.
    async fn grant_lease(&self, node: NodeId, ttl_ms: u64) -> Result<LeaseId, MetaError>;

    /// Renews for the lease's full TTL; returns the TTL granted (ms).
    /// `Err(MetaError::LeaseNotFound)` once it expired or was revoked.
    async fn keep_alive(&self, lease: LeaseId) -> Result<u64, MetaError>;

    /// Ends a lease now. `Err(MetaError::LeaseNotFound)` if it is not live.
    async fn revoke_lease(&self, lease: LeaseId) -> Result<(), MetaError>;

    /// Live leases with their node and remaining ms (as the store sees it),
    /// ordered by lease id.
    async fn leases(&self) -> Result<Vec<LeaseInfo>, MetaError>;

    // ---- Leader election (the manager's seat). ----
    //
    // An election is a queue of candidacies, each held under a lease; the
    // head of the queue leads. A candidacy ends when its holder resigns, when
    // its lease expires or is revoked (the next candidate then leads at
    // once), or when a campaign call still waiting is dropped/cancelled. At
    // most one candidacy leads an election at any time, as the store sees
    // it; a leader that cannot renew its lease must stop acting by its own
    // clock before the store would expire it (as nodes do, invariant 4).

    /// Grants a lease not tied to a node (for election candidates), for
    /// `ttl_ms` (> 0) milliseconds. Renew it with [`MetaStore::keep_alive`],
    /// end it with [`MetaStore::revoke_lease`]. Session leases are not listed
    /// by [`MetaStore::leases`] (which lists node leases).
    async fn grant_session_lease(&self, ttl_ms: u64) -> Result<LeaseId, MetaError> {
        let _ = ttl_ms;
        Err(election_unsupported())
    }

    /// Joins `election` (non-empty) as `candidate` under `lease` (which the
    /// caller keeps alive) and waits until it leads; candidates are served
    /// first come, first served. Returns at once if nobody leads.
    ///
    /// A lease holds at most one candidacy per election: campaigning again
    /// under the same lease (e.g. after a dropped connection) rejoins the
    /// same candidacy at the same place in the queue (returning the same
    /// token if it already leads) and sets its candidate name.
    ///
    /// `Err(MetaError::LeaseNotFound)` if the lease is not live, or expires
    /// or is revoked while waiting. Dropping the future before it resolves
    /// withdraws a candidacy that does not lead yet; waiters are in any case
    /// tied to their lease, so a dead process's candidacy ends with its lease.
    async fn campaign(
        &self,
        election: &str,
        candidate: &str,
        lease: LeaseId,
    ) -> Result<Leadership, MetaError> {
        let _ = (election, candidate, lease);
        Err(election_unsupported())
    }

    /// The current leader of `election` (the same [`Leadership`] its
    /// `campaign` returned), or `None` if nobody leads.
    async fn leader(&self, election: &str) -> Result<Option<Leadership>, MetaError> {
        let _ = election;
        Err(election_unsupported())
    }

    /// A stream of `election`'s leader: the first item is the current leader
    /// (`None`: nobody leads), then one item each time that changes
    /// (consecutive items differ, but a change that is quickly undone may be
    /// missed). Ends with an error item if the store goes away; the caller
    /// observes again.
    async fn observe(&self, election: &str) -> Result<LeaderWatch, MetaError> {
        let _ = election;
        Err(election_unsupported())
    }

    /// Ends `leadership`'s candidacy (the next candidate leads at once).
    /// Does not revoke the lease. `Ok` also when that candidacy had already
    /// ended (resigning is idempotent).
    async fn resign(&self, leadership: &Leadership) -> Result<(), MetaError> {
        let _ = leadership;
        Err(election_unsupported())
    }

    // ---- Migration records (invariant 7). ----
    //
    // Every state of a live partition migration is a durable record here,
    // opaque to the store, and each transition is a compare-and-set on
    // (id, generation). Generations of one id only increase.

    /// Allocates a migration id (1, 2, 3, ... on the embedded store; never
    /// reused, also across restarts; an allocation whose answer was lost
    /// may skip one).
    async fn allocate_migration_id(&self) -> Result<u64, MetaError>;

    /// Compare-and-set: writes `record` at `generation` only if the stored
    /// generation is `expected` (`None`: no record for `id` yet), otherwise
    /// [`MetaError::MigrationConflict`] with the generation stored now.
    ///
    /// [`MetaError::InvalidArgument`] (checked first, nothing read) when
    /// `generation` does not exceed `expected` (or is 0 when creating), for
    /// id 0, and when creating a record under an id this store never
    /// allocated.
    async fn put_migration(
        &self,
        id: u64,
        expected: Option<u64>,
        generation: u64,
        record: Vec<u8>,
    ) -> Result<(), MetaError>;

    /// The record of `id`, or `None`.
    async fn get_migration(&self, id: u64) -> Result<Option<StoredMigration>, MetaError>;

    /// All records, ordered by id.
    async fn migrations(&self) -> Result<Vec<StoredMigration>, MetaError>;

    /// Deletes a (finished) record if its stored generation is still
    /// `expected`; otherwise [`MetaError::MigrationConflict`] (`current:
    /// None` when there is no record). The id stays allocated.
    async fn delete_migration(&self, id: u64, expected: u64) -> Result<(), MetaError>;

    // ---- ACL users (shared by every node and proxy). ----
    //
    // One record per user name; a write replaces the user's record whole
    // (last writer wins), durably, before it returns.

    /// Every ACL record, ordered by name.
    async fn acl_users(&self) -> Result<Vec<AclRecord>, MetaError> {
        Err(acl_unsupported())
    }

    /// Creates or replaces the record of `record.name`.
    async fn put_acl_user(&self, record: AclRecord) -> Result<(), MetaError> {
        let _ = record;
        Err(acl_unsupported())
    }

    /// Deletes the record of `name`; whether there was one.
    async fn delete_acl_user(&self, name: &str) -> Result<bool, MetaError> {
        let _ = name;
        Err(acl_unsupported())
    }

    /// If the map has no keyspace yet and at least `min_nodes` nodes are
    /// registered, creates the bootstrap map
    /// ([`PartitionMap::bootstrap`] over the registered nodes sorted by id,
    /// `partitions_per_node` each) in one commit conditional on it still
    /// being empty. Returns true if this call bootstrapped.
    async fn bootstrap_if_empty(
        &self,
        min_nodes: usize,
        partitions_per_node: u16,
    ) -> Result<bool, MetaError> {
        self.bootstrap_if_empty_with(min_nodes, partitions_per_node, Replication::default())
            .await
    }

    /// [`MetaStore::bootstrap_if_empty`] with keyspace 0 replicated:
    /// `replication.factor` copies per partition placed by
    /// [`PartitionMap::bootstrap_replicated`] (distinct nodes, distinct zones
    /// first; capped at the node count) and `replication.min_in_sync`.
    /// [`MetaError::InvalidArgument`] if the pair fails
    /// [`keyway_map::check_replication`].
    async fn bootstrap_if_empty_with(
        &self,
        min_nodes: usize,
        partitions_per_node: u16,
        replication: Replication,
    ) -> Result<bool, MetaError>;
}

/// The replication settings of a keyspace being created (keyspace 0 at
/// bootstrap): copies per partition and the in-sync copies a write needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Replication {
    pub factor: u8,
    pub min_in_sync: u8,
}

impl Default for Replication {
    /// One copy, one needed: no replication.
    fn default() -> Self {
        Replication {
            factor: 1,
            min_in_sync: 1,
        }
    }
}

impl Replication {
    /// Checks the pair ([`keyway_map::check_replication`]).
    pub fn check(&self) -> Result<(), MetaError> {
        keyway_map::check_replication(self.factor, self.min_in_sync)
            .map_err(MetaError::InvalidArgument)
    }
}

/// The transaction that bootstraps `map` (which has no keyspace yet): the
/// default keyspace and its partitions from [`PartitionMap::bootstrap_replicated`]
/// over `map`'s nodes (with `replication`), with partition ids starting at `map.next_partition_id` so
/// ids stay never-reused, each conditional on its partition being absent.
/// `None` if there are fewer than `min_nodes` (or no) nodes.
pub fn bootstrap_txn(
    map: &PartitionMap,
    min_nodes: usize,
    partitions_per_node: u16,
    replication: Replication,
) -> Result<Option<MapTxn>, MetaError> {
    if partitions_per_node == 0 {
        return Err(MetaError::InvalidArgument(
            "partitions_per_node must be positive".into(),
        ));
    }
    replication.check()?;
    if !map.keyspaces.is_empty() || map.nodes.is_empty() || map.nodes.len() < min_nodes {
        return Ok(None);
    }
    let nodes: Vec<_> = map.nodes.values().cloned().collect();
    let mut boot =
        PartitionMap::bootstrap_replicated(&nodes, partitions_per_node, replication.factor)?;
    for ks in boot.keyspaces.values_mut() {
        ks.min_in_sync = replication.min_in_sync;
    }
    // Bootstrap numbers partitions from 1; shift past any id already handed out.
    let offset = map.next_partition_id.0.max(1) - 1;
    let mut txn = MapTxn::default();
    txn.changes.extend(
        boot.keyspaces
            .values()
            .cloned()
            .map(MapChange::UpsertKeyspace),
    );
    for p in boot.partitions.values() {
        let mut p = p.clone();
        p.id.0 += offset;
        txn.conditions.push(OwnershipCondition {
            partition: p.id,
            expected: None,
        });
        txn.changes.push(MapChange::UpsertPartition(p));
    }
    txn.changes.push(MapChange::ReservePartitionIds {
        next: keyway_map::PartitionId(boot.next_partition_id.0 + offset),
    });
    Ok(Some(txn))
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyway_map::{NodeInfo, PartitionId};

    fn node(id: u64) -> MapChange {
        MapChange::UpsertNode(NodeInfo::up(NodeId(id), format!("h:{id}")))
    }

    #[test]
    fn apply_to_follows_deltas_and_refuses_gaps() {
        let mut map = PartitionMap::new();
        let delta = MapUpdate::Delta(vec![
            (MapVersion(1), vec![node(1)]),
            (MapVersion(2), vec![node(2)]),
        ]);
        delta.apply_to(&mut map).unwrap();
        assert_eq!((map.version, map.nodes.len()), (MapVersion(2), 2));
        // Replaying what the map already has is a no-op.
        delta.apply_to(&mut map).unwrap();
        assert_eq!(map.version, MapVersion(2));
        let gap = MapUpdate::Delta(vec![(MapVersion(4), vec![node(4)])]);
        assert!(matches!(
            gap.apply_to(&mut map),
            Err(MetaError::InvalidArgument(_))
        ));
        assert_eq!(
            map.version,
            MapVersion(2),
            "a refused update leaves the map alone"
        );
        assert_eq!(delta.version(), Some(MapVersion(2)));
        assert_eq!(MapUpdate::Delta(vec![]).version(), None);
    }

    #[test]
    fn bootstrap_txn_keeps_partition_ids_never_reused() {
        let mut map = PartitionMap::new();
        map.apply(
            MapVersion(1),
            &[
                node(1),
                node(2),
                MapChange::ReservePartitionIds {
                    next: PartitionId(10),
                },
            ],
        )
        .unwrap();
        assert!(
            bootstrap_txn(&map, 3, 2, Replication::default())
                .unwrap()
                .is_none(),
            "too few nodes"
        );
        assert!(bootstrap_txn(&map, 2, 0, Replication::default()).is_err());
        let txn = bootstrap_txn(&map, 2, 2, Replication::default())
            .unwrap()
            .unwrap();
        let mut booted = map.clone();
        booted.apply(MapVersion(2), &txn.changes).unwrap();
        booted.validate().unwrap();
        let ids: Vec<u64> = booted.partitions.keys().map(|p| p.0).collect();
        assert_eq!(ids, vec![10, 11, 12, 13]);
        assert_eq!(booted.next_partition_id, PartitionId(14));
        assert!(
            txn.conditions
                .iter()
                .all(|c| c.expected.is_none() && !c.holds(&booted))
        );
        assert!(
            bootstrap_txn(&booted, 1, 2, Replication::default())
                .unwrap()
                .is_none(),
            "already bootstrapped"
        );
    }
}
