//! Planning a split, as pure functions of the map: where exactly the
//! children meet, and the one compare-and-set that makes them.
//!
//! A hash keyspace's routing keys are `be16(slot) ++ key`, so its partitions
//! meet only at slot boundaries `be16(s)`: a key resolves to its slot, a
//! routing key reported by a node (a size or load split key) rounds to a
//! boundary next to it, and the boundary must lie strictly inside the
//! partition's slots `first < s <= last`. A range keyspace splits at any
//! key with `start < at < end`.

use super::{SplitAt, SplitError};
use bytes::Bytes;
use keyway_map::{
    Epoch, Keyspace, MapChange, OwnershipCondition, PartitionId, PartitionMap, PartitionRecord,
    Routing, SLOT_COUNT, key_hash_slot, slot_bound, to_hex,
};
use keyway_meta::MapTxn;

/// A split ready to commit: the parent as the map held it, both children,
/// and the transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitPlan {
    pub parent: PartitionRecord,
    pub left: PartitionRecord,
    pub right: PartitionRecord,
    pub txn: MapTxn,
}

/// The slot at which the right child of hash partition `p` should start to
/// split near the keyspace-local routing key `routing_key` (a node's size or
/// load split key): the key's own slot when that is strictly inside,
/// otherwise the next one. `None` when no boundary is strictly inside (a
/// single-slot partition) or the key is not a hash routing key.
pub fn hash_split_slot(p: &PartitionRecord, routing_key: &[u8]) -> Option<u16> {
    let (first, last) = p.slot_span();
    let slot = u16::from_be_bytes(*routing_key.first_chunk::<2>()?);
    if slot >= SLOT_COUNT || first == last {
        return None;
    }
    let at = if slot > first { slot } else { slot + 1 };
    (at > first && at <= last).then_some(at)
}

/// The bound (keyspace-local routing key) at which `at` splits `p`, checked
/// to be strictly inside and, in a hash keyspace, slot-aligned. `size_hint`
/// is the owner's `size_split_key`, used by [`SplitAt::Auto`] in a range
/// keyspace.
pub fn resolve_split_point(
    ks: &Keyspace,
    p: &PartitionRecord,
    at: &SplitAt,
    size_hint: Option<&[u8]>,
) -> Result<Bytes, SplitError> {
    let partition = p.id;
    match ks.routing {
        Routing::Hash => {
            let (first, last) = p.slot_span();
            if first == last {
                return Err(SplitError::SingleSlot {
                    partition,
                    slot: first,
                });
            }
            let slot = match at {
                SplitAt::Key(k) => key_hash_slot(k),
                SplitAt::Slot(s) => *s,
                SplitAt::Bound(b) => match b.first_chunk::<2>() {
                    Some(s) if b.len() == 2 && u16::from_be_bytes(*s) < SLOT_COUNT => {
                        u16::from_be_bytes(*s)
                    }
                    _ => {
                        return Err(SplitError::Unaligned {
                            partition,
                            at: format!("0x{}", to_hex(b)),
                        });
                    }
                },
                SplitAt::Auto => first + (last - first).div_ceil(2),
            };
            if slot <= first || slot > last {
                return Err(SplitError::NotInside {
                    partition,
                    at: format!("slot {slot}"),
                    range: format!("slots {first}-{last}"),
                });
            }
            Ok(Bytes::copy_from_slice(&slot_bound(slot)))
        }
        Routing::Range => {
            let point = match at {
                SplitAt::Key(k) | SplitAt::Bound(k) => k.clone(),
                SplitAt::Slot(_) => return Err(SplitError::NotHash { partition }),
                SplitAt::Auto => match size_hint {
                    Some(k) => Bytes::copy_from_slice(k),
                    None => {
                        return Err(SplitError::NoSplitPoint {
                            partition,
                            why: "a range partition has no middle without its owner's size split key; give a key",
                        });
                    }
                },
            };
            let inside = point > p.start && p.end.as_ref().is_none_or(|end| point < *end);
            if !inside {
                return Err(SplitError::NotInside {
                    partition,
                    at: crate::stats::key_text(&point),
                    range: range_text(p),
                });
            }
            Ok(point)
        }
    }
}

/// `[start, end)` in hex, for messages.
pub(crate) fn range_text(p: &PartitionRecord) -> String {
    let end = p.end.as_ref().map_or("end".to_string(), |e| to_hex(e));
    format!("[{}, {end})", to_hex(&p.start))
}

/// Plans splitting `partition` of `map` at `at`: the children get ids
/// `map.next_partition_id` and the next (the allocator is raised past
/// both), the parent's owner, replicas and in-sync set (each replica in
/// sync for the parent holds every acknowledged write of both halves),
/// epoch = parent epoch + 1, and
/// ranges `[start, point)`, `[point, end)`. The transaction is conditional
/// on the parent's `(owner, epoch)` and on both new ids being absent.
pub fn plan_split(
    map: &PartitionMap,
    partition: PartitionId,
    at: &SplitAt,
    size_hint: Option<&[u8]>,
) -> Result<SplitPlan, SplitError> {
    let parent = map
        .partitions
        .get(&partition)
        .ok_or(SplitError::UnknownPartition(partition))?;
    let ks = map
        .keyspaces
        .get(&parent.keyspace)
        .ok_or(SplitError::UnknownPartition(partition))?;
    let point = resolve_split_point(ks, parent, at, size_hint)?;
    let left_id = map.next_partition_id.max(PartitionId(1));
    let right_id = PartitionId(left_id.0 + 1);
    let epoch = Epoch(parent.epoch.0 + 1);
    let left = PartitionRecord {
        id: left_id,
        end: Some(point.clone()),
        epoch,
        ..parent.clone()
    };
    let right = PartitionRecord {
        id: right_id,
        start: point,
        epoch,
        ..parent.clone()
    };
    let txn = MapTxn {
        conditions: vec![
            OwnershipCondition {
                partition,
                expected: Some((parent.owner, parent.epoch)),
            },
            OwnershipCondition {
                partition: left_id,
                expected: None,
            },
            OwnershipCondition {
                partition: right_id,
                expected: None,
            },
        ],
        changes: vec![
            MapChange::RemovePartition { id: partition },
            MapChange::UpsertPartition(left.clone()),
            MapChange::UpsertPartition(right.clone()),
            MapChange::ReservePartitionIds {
                next: PartitionId(right_id.0 + 1),
            },
        ],
    };
    Ok(SplitPlan {
        parent: parent.clone(),
        left,
        right,
        txn,
    })
}
