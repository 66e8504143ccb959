//! Creating and listing keyspaces.
//!
//! [`create_keyspace`] allocates the next [`KeyspaceId`], places the new
//! keyspace's partitions on the nodes that are up, and commits everything in
//! one [`MapTxn`]: the keyspace, its partitions (epoch 1) and the raised
//! partition-id allocator, guarded by "partition absent" conditions on the
//! new ids. Two concurrent creations therefore cannot both commit the same
//! ids; the loser re-reads the map and tries again (a bounded number of
//! times), and a keyspace id or name taken meanwhile is caught by the store's
//! map validation or the name check on the re-read map.
//!
//! Placement:
//! - `range`: one partition `[empty, end)` by default (a range keyspace's key
//!   distribution is unknown; the splitter cuts it later), owned by the up
//!   node owning the fewest partitions (lowest id on a tie). Draining nodes
//!   get nothing.
//! - `hash`: `partitions` slot-aligned partitions (default: one per up node),
//!   dealt round-robin over the up nodes, least-loaded first.
//! - replicas (replication factor N > 1): the next N − 1 of those nodes
//!   after each partition's owner, distinct zones first
//!   ([`keyway_map::place_replicas`]), capped at the node count; all start
//!   in the in-sync set (every copy is empty and nothing was acknowledged).
//!
//! [`set_replication`] changes a keyspace's replication factor and
//! `min_in_sync` later; the manager's membership reconciler then adds or
//! removes replicas (`crate::replication`).

use bytes::Bytes;
use keyway_map::{
    DEFAULT_KEYSPACE, Epoch, Keyspace, KeyspaceId, MapChange, NodeId, NodeState,
    OwnershipCondition, PartitionId, PartitionMap, PartitionRecord, PartitionState, Routing,
    SLOT_COUNT, slot_bound,
};
use keyway_meta::{MapTxn, MetaError, MetaStore, Replication};
use std::collections::BTreeMap;

/// Longest keyspace name, in bytes.
pub const MAX_KEYSPACE_NAME_LEN: usize = 64;
/// Most partitions a new hash keyspace may start with (one per slot at most).
pub const MAX_INITIAL_PARTITIONS: u16 = SLOT_COUNT;
/// How many times a creation that lost a race to another map change is retried.
const COMMIT_ATTEMPTS: usize = 5;

/// Why a keyspace could not be created.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum KeyspaceError {
    /// The name is empty, too long, or has characters outside `[A-Za-z0-9_.-]`,
    /// or does not start with a letter (so it never reads as a numeric id).
    #[error("invalid keyspace name {name:?}: {why}")]
    InvalidName { name: String, why: String },
    /// A keyspace with this name exists.
    #[error("keyspace '{0}' already exists")]
    NameTaken(String),
    /// The partition count does not suit the routing.
    #[error("invalid partition count: {0}")]
    InvalidPartitions(String),
    /// No node is up to own the partitions.
    #[error("no node is up to own the keyspace's partitions")]
    NoNodeUp,
    /// The map has not been bootstrapped yet (keyspace 0 does not exist).
    #[error("the cluster's map is not bootstrapped yet")]
    NotBootstrapped,
    /// Every keyspace id is taken.
    #[error("no keyspace id left")]
    IdsExhausted,
    /// The creation kept losing races with other map changes.
    #[error("the map kept changing; gave up after {COMMIT_ATTEMPTS} attempts: {0}")]
    Contended(MetaError),
    /// The replication factor / min_in_sync pair is invalid.
    #[error("invalid replication setting: {0}")]
    BadReplication(String),
    /// No keyspace has this name.
    #[error("no keyspace named '{0}'")]
    UnknownKeyspace(String),
    /// The metadata store failed.
    #[error("metadata store: {0}")]
    Meta(#[from] MetaError),
}

/// Checks a keyspace name: 1..=[`MAX_KEYSPACE_NAME_LEN`] bytes of
/// `[A-Za-z0-9_.-]`, starting with a letter.
pub fn validate_name(name: &str) -> Result<(), KeyspaceError> {
    let bad = |why: &str| {
        Err(KeyspaceError::InvalidName {
            name: name.to_string(),
            why: why.to_string(),
        })
    };
    if name.is_empty() {
        return bad("empty");
    }
    if name.len() > MAX_KEYSPACE_NAME_LEN {
        return bad(&format!("longer than {MAX_KEYSPACE_NAME_LEN} bytes"));
    }
    if !name.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return bad("must start with a letter");
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
    {
        return bad("only letters, digits, '_', '.' and '-' are allowed");
    }
    Ok(())
}

/// Creates keyspace `name` with `routing`; see the module docs for the
/// placement and `partitions` (`None` = the routing's default).
pub async fn create_keyspace(
    meta: &dyn MetaStore,
    name: &str,
    routing: Routing,
    partitions: Option<u16>,
) -> Result<Keyspace, KeyspaceError> {
    create_keyspace_with(meta, name, routing, partitions, Replication::default()).await
}

/// [`create_keyspace`] with `replication` (checked first).
pub async fn create_keyspace_with(
    meta: &dyn MetaStore,
    name: &str,
    routing: Routing,
    partitions: Option<u16>,
    replication: Replication,
) -> Result<Keyspace, KeyspaceError> {
    validate_name(name)?;
    check(replication)?;
    let mut last = None;
    for _ in 0..COMMIT_ATTEMPTS {
        let map = meta.get_map().await?;
        let (keyspace, txn) = plan_with(&map, name, routing, partitions, replication)?;
        match meta.commit(txn).await {
            Ok(_) => return Ok(keyspace),
            // Another change took the ids (or the keyspace id) meanwhile: re-plan.
            Err(e @ (MetaError::Conflict { .. } | MetaError::InvalidMap(_))) => last = Some(e),
            Err(e) => return Err(e.into()),
        }
    }
    Err(KeyspaceError::Contended(
        last.expect("at least one attempt"),
    ))
}

fn check(r: Replication) -> Result<(), KeyspaceError> {
    keyway_map::check_replication(r.factor, r.min_in_sync).map_err(KeyspaceError::BadReplication)
}

/// Sets keyspace `name`'s replication factor and/or `min_in_sync` (`None`
/// keeps the current value), checked as a pair. Returns the keyspace as
/// written. Replicas follow through the manager's membership reconciler.
pub async fn set_replication(
    meta: &dyn MetaStore,
    name: &str,
    factor: Option<u8>,
    min_in_sync: Option<u8>,
) -> Result<Keyspace, KeyspaceError> {
    let map = meta.get_map().await?;
    let mut ks = map
        .keyspace_by_name(name)
        .cloned()
        .ok_or_else(|| KeyspaceError::UnknownKeyspace(name.to_string()))?;
    let next = Replication {
        factor: factor.unwrap_or(ks.replication_factor),
        min_in_sync: min_in_sync.unwrap_or(ks.min_in_sync),
    };
    check(next)?;
    if (ks.replication_factor, ks.min_in_sync) != (next.factor, next.min_in_sync) {
        ks.replication_factor = next.factor;
        ks.min_in_sync = next.min_in_sync;
        meta.commit(MapTxn::unconditional(vec![MapChange::UpsertKeyspace(
            ks.clone(),
        )]))
        .await?;
        tracing::info!(keyspace = %name, factor = next.factor, min_in_sync = next.min_in_sync, "replication set");
    }
    Ok(ks)
}

/// Every keyspace in the map, by id.
pub async fn list(meta: &dyn MetaStore) -> Result<Vec<Keyspace>, KeyspaceError> {
    Ok(meta.get_map().await?.keyspaces.into_values().collect())
}

/// The keyspace and the transaction creating it in `map` (pure).
pub fn plan(
    map: &PartitionMap,
    name: &str,
    routing: Routing,
    partitions: Option<u16>,
) -> Result<(Keyspace, MapTxn), KeyspaceError> {
    plan_with(map, name, routing, partitions, Replication::default())
}

/// [`plan`] with `replication` copies per partition (see the module docs).
pub fn plan_with(
    map: &PartitionMap,
    name: &str,
    routing: Routing,
    partitions: Option<u16>,
    replication: Replication,
) -> Result<(Keyspace, MapTxn), KeyspaceError> {
    validate_name(name)?;
    check(replication)?;
    if map.keyspace_by_name(name).is_some() {
        return Err(KeyspaceError::NameTaken(name.to_string()));
    }
    // Keyspace 0 is the default (Redis) keyspace, made by the bootstrap.
    let last = match map.keyspaces.keys().next_back() {
        Some(last) if map.keyspaces.contains_key(&DEFAULT_KEYSPACE) => *last,
        _ => return Err(KeyspaceError::NotBootstrapped),
    };
    let id = KeyspaceId(last.0.checked_add(1).ok_or(KeyspaceError::IdsExhausted)?);
    let owners = up_nodes_least_loaded(map);
    if owners.is_empty() {
        return Err(KeyspaceError::NoNodeUp);
    }
    let bounds = match routing {
        Routing::Range => match partitions.unwrap_or(1) {
            1 => vec![(Bytes::new(), None)],
            n => {
                return Err(KeyspaceError::InvalidPartitions(format!(
                    "a range keyspace starts as one partition (asked for {n}): its key distribution is unknown until keys arrive"
                )));
            }
        },
        Routing::Hash => {
            let n = partitions.unwrap_or(owners.len().min(SLOT_COUNT as usize) as u16);
            if n == 0 || n > MAX_INITIAL_PARTITIONS {
                return Err(KeyspaceError::InvalidPartitions(format!(
                    "a hash keyspace needs 1..={MAX_INITIAL_PARTITIONS} partitions, not {n}"
                )));
            }
            hash_bounds(n)
        }
    };
    let keyspace = Keyspace {
        id,
        name: name.to_string(),
        routing,
        replication_factor: replication.factor,
        min_in_sync: replication.min_in_sync,
    };
    let infos: Vec<keyway_map::NodeInfo> = owners.iter().map(|n| map.nodes[n].clone()).collect();
    let first = map.next_partition_id.0.max(1);
    let mut txn = MapTxn {
        conditions: Vec::new(),
        changes: vec![MapChange::UpsertKeyspace(keyspace.clone())],
    };
    for (i, (start, end)) in bounds.into_iter().enumerate() {
        let pid = PartitionId(first + i as u64);
        let replicas = keyway_map::place_replicas(&infos, i % infos.len(), replication.factor);
        txn.conditions.push(OwnershipCondition {
            partition: pid,
            expected: None,
        });
        txn.changes
            .push(MapChange::UpsertPartition(PartitionRecord {
                id: pid,
                keyspace: id,
                start,
                end,
                owner: owners[i % owners.len()],
                in_sync: replicas.clone(),
                reads_from: None,
                replicas,
                epoch: Epoch(1),
                state: PartitionState::Active,
            }));
    }
    let next = PartitionId(first + txn.conditions.len() as u64);
    txn.changes.push(MapChange::ReservePartitionIds { next });
    Ok((keyspace, txn))
}

/// `n` slot-aligned ranges covering every slot, in order.
fn hash_bounds(n: u16) -> Vec<(Bytes, Option<Bytes>)> {
    let n = u32::from(n);
    let count = u32::from(SLOT_COUNT);
    (0..n)
        .map(|i| {
            let first = (i * count / n) as u16;
            let next = ((i + 1) * count / n) as u16;
            (
                Bytes::copy_from_slice(&slot_bound(first)),
                (i + 1 < n).then(|| Bytes::copy_from_slice(&slot_bound(next))),
            )
        })
        .collect()
}

/// Up nodes that are not draining, fewest owned partitions first (lowest id
/// on a tie).
fn up_nodes_least_loaded(map: &PartitionMap) -> Vec<NodeId> {
    let mut owned: BTreeMap<NodeId, usize> = map
        .nodes
        .values()
        .filter(|n| n.state == NodeState::Up && !n.draining)
        .map(|n| (n.id, 0))
        .collect();
    for p in map.partitions.values() {
        if let Some(count) = owned.get_mut(&p.owner) {
            *count += 1;
        }
    }
    let mut nodes: Vec<(usize, NodeId)> = owned.into_iter().map(|(id, c)| (c, id)).collect();
    nodes.sort();
    nodes.into_iter().map(|(_, id)| id).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyway_map::{MapVersion, NodeInfo};
    use keyway_meta::{EmbeddedMeta, EmbeddedOptions};

    fn nodes(n: u64) -> Vec<NodeInfo> {
        (1..=n)
            .map(|i| NodeInfo::up(NodeId(i), format!("127.0.0.1:{}", 7000 + i)))
            .collect()
    }

    fn apply(map: &mut PartitionMap, txn: &MapTxn) {
        assert!(txn.conditions.iter().all(|c| c.holds(map)));
        let v = MapVersion(map.version.0 + 1);
        map.apply(v, &txn.changes).unwrap();
        map.validate().unwrap();
    }

    #[test]
    fn names_are_checked() {
        for bad in ["", "1abc", "a b", "x/y", &"a".repeat(65)] {
            assert!(
                matches!(validate_name(bad), Err(KeyspaceError::InvalidName { .. })),
                "{bad:?}"
            );
        }
        for good in ["events", "a", "user-profiles.v2_x", &"a".repeat(64)] {
            validate_name(good).unwrap();
        }
    }

    #[test]
    fn a_range_keyspace_is_one_partition_on_the_least_loaded_node() {
        let mut map = PartitionMap::bootstrap(&nodes(3), 2).unwrap();
        // Node 3 gives a partition to node 1: node 3 is now the least loaded.
        let mut p = map.owned_by(NodeId(3)).next().unwrap().clone();
        p.owner = NodeId(1);
        p.epoch = Epoch(2);
        map.apply(MapVersion(2), &[MapChange::UpsertPartition(p)])
            .unwrap();
        let (ks, txn) = plan(&map, "events", Routing::Range, None).unwrap();
        assert_eq!(ks.id, KeyspaceId(1));
        apply(&mut map, &txn);
        let parts: Vec<_> = map.keyspace_partitions(ks.id).collect();
        assert_eq!(parts.len(), 1);
        assert_eq!((parts[0].owner, parts[0].epoch), (NodeId(3), Epoch(1)));
        assert!(parts[0].start.is_empty() && parts[0].end.is_none());
        assert_eq!(parts[0].id, PartitionId(7));
        assert_eq!(map.next_partition_id, PartitionId(8));
        assert_eq!(
            plan(&map, "events", Routing::Hash, None).unwrap_err(),
            KeyspaceError::NameTaken("events".into())
        );
        assert!(matches!(
            plan(&map, "other", Routing::Range, Some(3)),
            Err(KeyspaceError::InvalidPartitions(_))
        ));
    }

    #[test]
    fn a_hash_keyspace_spreads_slot_aligned_partitions_round_robin() {
        let mut map = PartitionMap::bootstrap(&nodes(3), 1).unwrap();
        let (ks, txn) = plan(&map, "h", Routing::Hash, Some(6)).unwrap();
        apply(&mut map, &txn);
        let parts: Vec<_> = map.keyspace_partitions(ks.id).collect();
        assert_eq!(parts.len(), 6);
        for n in 1..=3 {
            assert_eq!(parts.iter().filter(|p| p.owner == NodeId(n)).count(), 2);
        }
        let (ks2, txn) = plan(&map, "h2", Routing::Hash, None).unwrap();
        assert_eq!(ks2.id, KeyspaceId(2));
        apply(&mut map, &txn);
        assert_eq!(
            map.keyspace_partitions(ks2.id).count(),
            3,
            "one per up node"
        );
        assert!(plan(&map, "h3", Routing::Hash, Some(0)).is_err());
        assert!(plan(&map, "h3", Routing::Hash, Some(SLOT_COUNT + 1)).is_err());
        assert_eq!(
            plan(&PartitionMap::new(), "h3", Routing::Hash, None).unwrap_err(),
            KeyspaceError::NotBootstrapped
        );
        let mut down = map.clone();
        for n in down.nodes.values_mut() {
            n.state = NodeState::Down;
        }
        assert_eq!(
            plan(&down, "h3", Routing::Hash, None).unwrap_err(),
            KeyspaceError::NoNodeUp
        );
    }

    #[test]
    fn a_replicated_keyspace_places_its_copies_on_distinct_nodes() {
        let mut map = PartitionMap::bootstrap(&nodes(3), 1).unwrap();
        let rf = |factor, min_in_sync| Replication {
            factor,
            min_in_sync,
        };
        let (ks, txn) = plan_with(&map, "h", Routing::Hash, Some(6), rf(2, 2)).unwrap();
        assert_eq!((ks.replication_factor, ks.min_in_sync), (2, 2));
        apply(&mut map, &txn);
        for p in map.keyspace_partitions(ks.id) {
            assert_eq!(p.replicas.len(), 1);
            assert_ne!(p.replicas[0], p.owner);
            assert_eq!(p.in_sync, p.replicas);
        }
        // Capped at the node count.
        let (_, txn) = plan_with(&map, "r", Routing::Range, None, rf(5, 1)).unwrap();
        apply(&mut map, &txn);
        let r = map.keyspace_by_name("r").unwrap().id;
        assert_eq!(map.keyspace_partitions(r).next().unwrap().replicas.len(), 2);
        for (f, m) in [(0, 1), (6, 1), (2, 3), (2, 0)] {
            assert!(
                matches!(
                    plan_with(&map, "x", Routing::Hash, None, rf(f, m)),
                    Err(KeyspaceError::BadReplication(_))
                ),
                "{f} {m}"
            );
        }
    }

    #[tokio::test]
    async fn set_replication_checks_the_pair_and_keeps_what_is_not_given() {
        let dir = tempfile::tempdir().unwrap();
        let meta = EmbeddedMeta::open(dir.path(), EmbeddedOptions::default()).unwrap();
        for _ in 0..2 {
            meta.register_node(None, "127.0.0.1:1".into(), "127.0.0.1:2".into())
                .await
                .unwrap();
        }
        meta.bootstrap_if_empty(2, 2).await.unwrap();
        let ks = set_replication(&meta, "default", Some(3), None)
            .await
            .unwrap();
        assert_eq!((ks.replication_factor, ks.min_in_sync), (3, 1));
        let ks = set_replication(&meta, "default", None, Some(2))
            .await
            .unwrap();
        assert_eq!((ks.replication_factor, ks.min_in_sync), (3, 2));
        let err = set_replication(&meta, "default", Some(1), None)
            .await
            .unwrap_err();
        assert!(matches!(err, KeyspaceError::BadReplication(_)), "{err}");
        assert!(err.to_string().contains("min_in_sync"), "{err}");
        assert!(matches!(
            set_replication(&meta, "nope", Some(2), None).await,
            Err(KeyspaceError::UnknownKeyspace(_))
        ));
        let map = meta.get_map().await.unwrap();
        let stored = &map.keyspaces[&DEFAULT_KEYSPACE];
        assert_eq!((stored.replication_factor, stored.min_in_sync), (3, 2));
    }

    #[tokio::test]
    async fn create_commits_once_and_refuses_a_taken_name() {
        let dir = tempfile::tempdir().unwrap();
        let meta = EmbeddedMeta::open(dir.path(), EmbeddedOptions::default()).unwrap();
        for _ in 0..2 {
            meta.register_node(None, "127.0.0.1:1".into(), "127.0.0.1:2".into())
                .await
                .unwrap();
        }
        meta.bootstrap_if_empty(2, 2).await.unwrap();
        let ks = create_keyspace(&meta, "events", Routing::Range, None)
            .await
            .unwrap();
        assert_eq!(ks.id, KeyspaceId(1));
        let map = meta.get_map().await.unwrap();
        let p = map.keyspace_partitions(ks.id).next().unwrap();
        assert_eq!(p.epoch, Epoch(1));
        assert_eq!(
            create_keyspace(&meta, "events", Routing::Range, None)
                .await
                .unwrap_err(),
            KeyspaceError::NameTaken("events".into())
        );
        let names: Vec<String> = list(&meta)
            .await
            .unwrap()
            .into_iter()
            .map(|k| k.name)
            .collect();
        assert_eq!(names, ["default", "events"]);
    }
}
