//! The versioned partition map with O(log P) lookup.
//!
//! Invariant (checked by [`PartitionMap::validate`] where a map is produced and
//! again where it is applied): within every keyspace the partitions, sorted by
//! `start`, begin at the keyspace's lowest bound, each `end` equals the next
//! `start`, and the last `end` is `None`. Hash-keyspace bounds are slot-aligned.

use crate::{
    Epoch, Keyspace, KeyspaceId, MapError, MapVersion, NodeId, NodeInfo, PartitionId,
    PartitionRecord, PartitionState, Routing, SLOT_COUNT, slot_bound,
};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// All partition records, keyspaces and nodes, at one map version.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionMap {
    pub version: MapVersion,
    /// Next partition id to hand out; ids are never reused.
    pub next_partition_id: PartitionId,
    pub keyspaces: BTreeMap<KeyspaceId, Keyspace>,
    pub nodes: BTreeMap<NodeId, NodeInfo>,
    pub partitions: BTreeMap<PartitionId, PartitionRecord>,
    /// Derived: per keyspace, partition start -> id. Rebuilt by [`Self::reindex`].
    #[serde(skip)]
    index: BTreeMap<KeyspaceId, BTreeMap<Bytes, PartitionId>>,
}

impl PartitionMap {
    /// An empty map at version 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// Builds a map from its parts, indexing it. Does not validate.
    pub fn from_parts(
        version: MapVersion,
        next_partition_id: PartitionId,
        keyspaces: impl IntoIterator<Item = Keyspace>,
        nodes: impl IntoIterator<Item = NodeInfo>,
        partitions: impl IntoIterator<Item = PartitionRecord>,
    ) -> Self {
        let mut map = PartitionMap {
            version,
            next_partition_id,
            keyspaces: keyspaces.into_iter().map(|k| (k.id, k)).collect(),
            nodes: nodes.into_iter().map(|n| (n.id, n)).collect(),
            partitions: partitions.into_iter().map(|p| (p.id, p)).collect(),
            index: BTreeMap::new(),
        };
        map.reindex();
        map
    }

    /// The initial map: keyspace `0` (hash) split evenly into
    /// `nodes.len() * partitions_per_node` slot-aligned partitions, each node
    /// owning a contiguous run of them, all at epoch 1, one copy each.
    pub fn bootstrap(nodes: &[NodeInfo], partitions_per_node: u16) -> Result<Self, MapError> {
        Self::bootstrap_replicated(nodes, partitions_per_node, 1)
    }

    /// [`Self::bootstrap`] with `replication_factor` copies per partition:
    /// the replicas of each partition are the next nodes after its owner (by
    /// position), preferring zones not yet used by the partition's copies
    /// ([`place_replicas`]). Every replica starts in the in-sync set: all
    /// copies are empty and no write was acknowledged yet.
    /// `replication_factor` is capped at the number of nodes.
    pub fn bootstrap_replicated(
        nodes: &[NodeInfo],
        partitions_per_node: u16,
        replication_factor: u8,
    ) -> Result<Self, MapError> {
        assert!(!nodes.is_empty(), "bootstrap needs at least one node");
        assert!(
            partitions_per_node > 0,
            "partitions_per_node must be positive"
        );
        let count = (nodes.len() as u32 * partitions_per_node as u32).min(SLOT_COUNT as u32);
        crate::keyspace::check_replication(replication_factor, 1).map_err(|why| {
            MapError::BadReplication {
                keyspace: crate::DEFAULT_KEYSPACE,
                why,
            }
        })?;
        let mut keyspace = Keyspace::new(crate::DEFAULT_KEYSPACE, "default", Routing::Hash);
        keyspace.replication_factor = replication_factor;
        let ks_id = keyspace.id;
        let partitions = (0..count).map(|i| {
            let first = (i * SLOT_COUNT as u32 / count) as u16;
            let next = ((i + 1) * SLOT_COUNT as u32 / count) as u16;
            let owner_at = (i as usize * nodes.len()) / count as usize;
            let owner = nodes[owner_at].id;
            let replicas = place_replicas(nodes, owner_at, replication_factor);
            PartitionRecord {
                id: PartitionId(i as u64 + 1),
                keyspace: ks_id,
                start: Bytes::copy_from_slice(&slot_bound(first)),
                end: (i + 1 < count).then(|| Bytes::copy_from_slice(&slot_bound(next))),
                owner,
                in_sync: replicas.clone(),
                reads_from: None,
                replicas,
                epoch: Epoch(1),
                state: PartitionState::Active,
            }
        });
        let map = Self::from_parts(
            MapVersion(1),
            PartitionId(count as u64 + 1),
            [keyspace],
            nodes.iter().cloned(),
            partitions.collect::<Vec<_>>(),
        );
        map.validate()?;
        Ok(map)
    }

    /// Rebuilds the lookup index from the partition records.
    pub fn reindex(&mut self) {
        self.index.clear();
        for p in self.partitions.values() {
            self.index
                .entry(p.keyspace)
                .or_default()
                .insert(p.start.clone(), p.id);
        }
    }

    /// The partition of keyspace `ks` containing the keyspace-local routing key. O(log P).
    pub fn locate(&self, ks: KeyspaceId, local_key: &[u8]) -> Option<&PartitionRecord> {
        let starts = self.index.get(&ks)?;
        let (_, id) = starts
            .range::<[u8], _>((
                std::ops::Bound::Unbounded,
                std::ops::Bound::Included(local_key),
            ))
            .next_back()?;
        let p = self.partitions.get(id)?;
        p.contains(local_key).then_some(p)
    }

    /// The partition of a hash keyspace holding `slot`.
    pub fn locate_slot(&self, ks: KeyspaceId, slot: u16) -> Option<&PartitionRecord> {
        self.locate(ks, &slot_bound(slot))
    }

    /// Partitions of keyspace `ks` in key order.
    pub fn keyspace_partitions(&self, ks: KeyspaceId) -> impl Iterator<Item = &PartitionRecord> {
        self.index
            .get(&ks)
            .into_iter()
            .flat_map(|m| m.values())
            .filter_map(|id| self.partitions.get(id))
    }

    /// Keyspace by name.
    pub fn keyspace_by_name(&self, name: &str) -> Option<&Keyspace> {
        self.keyspaces.values().find(|k| k.name == name)
    }

    /// Partitions owned by `node`.
    pub fn owned_by(&self, node: NodeId) -> impl Iterator<Item = &PartitionRecord> {
        self.partitions.values().filter(move |p| p.owner == node)
    }

    /// Checks the coverage invariant for every keyspace and that owners exist.
    pub fn validate(&self) -> Result<(), MapError> {
        for p in self.partitions.values() {
            if !self.keyspaces.contains_key(&p.keyspace) {
                return Err(MapError::UnknownKeyspace(p.id));
            }
            if !self.nodes.contains_key(&p.owner) {
                return Err(MapError::UnknownOwner {
                    partition: p.id,
                    node: p.owner,
                });
            }
            validate_copies(p)?;
        }
        for ks in self.keyspaces.values() {
            self.validate_keyspace(ks)?;
        }
        Ok(())
    }

    fn validate_keyspace(&self, ks: &Keyspace) -> Result<(), MapError> {
        let mut parts: Vec<&PartitionRecord> = self
            .partitions
            .values()
            .filter(|p| p.keyspace == ks.id)
            .collect();
        parts.sort_by(|a, b| a.start.cmp(&b.start));
        if parts.is_empty() {
            return Err(MapError::KeyspaceUncovered(ks.id));
        }
        let mut expected_start = ks.min_bound();
        for (i, p) in parts.iter().enumerate() {
            let err = |f: fn(KeyspaceId, PartitionId) -> MapError| Err(f(ks.id, p.id));
            if p.start != expected_start {
                return err(|keyspace, partition| MapError::CoverageBroken {
                    keyspace,
                    partition,
                });
            }
            let last = i + 1 == parts.len();
            if last != p.end.is_none() {
                return err(|keyspace, partition| MapError::CoverageBroken {
                    keyspace,
                    partition,
                });
            }
            if let Some(end) = &p.end {
                if end <= &p.start {
                    return err(|keyspace, partition| MapError::EmptyRange {
                        keyspace,
                        partition,
                    });
                }
                expected_start = end.clone();
            }
            if ks.routing == Routing::Hash && !hash_bounds_aligned(p) {
                return err(|keyspace, partition| MapError::UnalignedBoundary {
                    keyspace,
                    partition,
                });
            }
        }
        Ok(())
    }
}

/// The replicas of a partition whose owner is `nodes[owner_at]`: up to
/// `replication_factor - 1` other nodes, walking on from the owner, taking
/// first the nodes whose zone no copy has yet, then any (so a cluster with
/// fewer zones than copies still gets its copies).
pub fn place_replicas(nodes: &[NodeInfo], owner_at: usize, replication_factor: u8) -> Vec<NodeId> {
    let wanted = (replication_factor as usize)
        .saturating_sub(1)
        .min(nodes.len().saturating_sub(1));
    let ring: Vec<&NodeInfo> = (1..nodes.len())
        .map(|k| &nodes[(owner_at + k) % nodes.len()])
        .collect();
    let mut zones: Vec<&Option<String>> = vec![&nodes[owner_at].zone];
    let mut chosen: Vec<NodeId> = Vec::with_capacity(wanted);
    for n in &ring {
        if chosen.len() == wanted {
            break;
        }
        let new_zone = n.zone.is_none() || !zones.contains(&&n.zone);
        if new_zone {
            chosen.push(n.id);
            zones.push(&n.zone);
        }
    }
    for n in &ring {
        if chosen.len() == wanted {
            break;
        }
        if !chosen.contains(&n.id) {
            chosen.push(n.id);
        }
    }
    chosen
}

/// A partition's copies: replicas distinct and not the owner, the in-sync
/// set a subset of the replicas (the producing half of the pair whose
/// applying half is [`PartitionMap::validate`] where a map is installed).
fn validate_copies(p: &PartitionRecord) -> Result<(), MapError> {
    let bad = |why| {
        Err(MapError::BadReplicas {
            partition: p.id,
            why,
        })
    };
    if p.replicas.contains(&p.owner) {
        return bad("the owner is listed as its own replica");
    }
    if p.replicas
        .iter()
        .enumerate()
        .any(|(i, r)| p.replicas[..i].contains(r))
    {
        return bad("a replica is listed twice");
    }
    if p.in_sync.iter().any(|r| !p.replicas.contains(r)) {
        return bad("an in-sync node is not a replica");
    }
    if p.in_sync
        .iter()
        .enumerate()
        .any(|(i, r)| p.in_sync[..i].contains(r))
    {
        return bad("an in-sync node is listed twice");
    }
    if p.reads_from.is_some_and(|r| !p.in_sync.contains(&r)) {
        return bad("the reads-from node is not in sync");
    }
    Ok(())
}

fn hash_bounds_aligned(p: &PartitionRecord) -> bool {
    let aligned = |b: &Bytes| b.len() == 2 && u16::from_be_bytes([b[0], b[1]]) < SLOT_COUNT;
    aligned(&p.start) && p.end.as_ref().is_none_or(aligned)
}
