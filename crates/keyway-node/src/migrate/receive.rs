//! The target role: the incoming migrations this node accepts foreign
//! records for, and the checks of every data-changing peer call.
//!
//! `ApplyForeign` and `DropRangeChunk` change data outside the client path,
//! so a late or stale one could do what no client write may: overwrite an
//! acknowledged write at a new owner, resurrect a deleted key, or delete a
//! range its node owns. Each names the migration it acts for
//! ([`MigrationRef`]: the record's id and the partition at the epoch e the
//! record was created at), and the node checks it against its own map and
//! its incoming migrations **under the routing read guard, in the same
//! critical section as the engine write** (invariant 2: a map install, e.g.
//! the flip that makes this node the owner, cannot slip between the check
//! and the effect):
//!
//! - a migration's source registers it at the target before its first
//!   write there ([`register`], the `MigrateReceive` call), accepted only if
//!   this node's map shows the partition at exactly e under another owner;
//! - `ApplyForeign` is accepted only for the registered migration (same id,
//!   partition and e), only while this node does not own the partition, and
//!   only for keys inside the partition's range ([`check_apply`]). After the
//!   flip the map shows this node as owner at e+1, the registration is gone
//!   ([`retain`]) and a late record for e is refused;
//! - `DropRangeChunk` is refused for a range overlapping any partition this
//!   node owns in its map, or one it is receiving under another migration
//!   ([`check_drop`]).
//!
//! Everything here is pure logic over the map and the registrations; the
//! state lives in `crate::routing` (under the same lock as the map).

use keyway_map::{Epoch, NodeId, PartitionId, PartitionMap, PartitionRecord};
use keyway_storage::KeyRange;
use std::collections::BTreeMap;

pub use keyway_peer::{MigrationRef, RefusalReason};

/// One incoming migration this node accepts foreign records for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Receiving {
    pub id: u64,
    /// e: the partition's epoch in this node's map when it was registered.
    pub epoch: Epoch,
    /// The partition's storage range as this node's map has it.
    pub range: KeyRange,
}

/// The incoming migrations, by partition.
pub type Incoming = BTreeMap<PartitionId, Receiving>;

/// A refused data-changing peer call: the reason and a sentence for logs.
#[derive(thiserror::Error, Clone, Debug, PartialEq, Eq)]
#[error("{detail}")]
pub struct Refusal {
    pub reason: RefusalReason,
    pub detail: String,
}

fn refuse(reason: RefusalReason, detail: String) -> Refusal {
    Refusal { reason, detail }
}

/// Whether two storage ranges share a key.
pub fn ranges_overlap(a: &KeyRange, b: &KeyRange) -> bool {
    let below = |x: &KeyRange, y: &KeyRange| x.end.as_ref().is_none_or(|end| y.start < *end);
    !a.is_empty() && !b.is_empty() && below(a, b) && below(b, a)
}

/// A partition's storage range.
pub fn storage_range(p: &PartitionRecord) -> KeyRange {
    let (start, end) = p.storage_bounds();
    KeyRange::new(start, end)
}

/// Registers `m` as incoming: this node's map must show the partition at
/// exactly `m.epoch` under another owner. A repeat changes nothing; a
/// registration of a newer migration of the partition replaces an older
/// one (ids are allocated increasing and never reused), never the reverse.
pub fn register(
    map: &PartitionMap,
    me: NodeId,
    incoming: &mut Incoming,
    m: MigrationRef,
) -> Result<(), Refusal> {
    let p = match map.partitions.get(&m.partition) {
        None => {
            return Err(refuse(
                RefusalReason::MapBehind,
                format!(
                    "{m}: partition unknown in this node's map (version {})",
                    map.version
                ),
            ));
        }
        Some(p) => p,
    };
    if p.epoch < m.epoch {
        return Err(refuse(
            RefusalReason::MapBehind,
            format!(
                "{m}: this node's map has the partition at epoch {}",
                p.epoch
            ),
        ));
    }
    if p.owner == me {
        return Err(refuse(
            RefusalReason::Owned,
            format!("{m}: this node owns the partition at epoch {}", p.epoch),
        ));
    }
    if p.epoch > m.epoch {
        return Err(refuse(
            RefusalReason::Stale,
            format!("{m}: the partition moved on to epoch {}", p.epoch),
        ));
    }
    if let Some(have) = incoming.get(&m.partition)
        && have.id > m.id
    {
        return Err(refuse(
            RefusalReason::Stale,
            format!(
                "{m}: newer migration {} of the partition registered",
                have.id
            ),
        ));
    }
    incoming.insert(
        m.partition,
        Receiving {
            id: m.id,
            epoch: m.epoch,
            range: storage_range(p),
        },
    );
    Ok(())
}

/// Ends incoming migration `m` (only if it is the registered one).
pub fn unregister(incoming: &mut Incoming, m: MigrationRef) -> bool {
    let ours = incoming
        .get(&m.partition)
        .is_some_and(|r| r.id == m.id && r.epoch == m.epoch);
    if ours {
        incoming.remove(&m.partition);
    }
    ours
}

/// After a map install: keeps the registrations whose partition is still at
/// their epoch (a flip, split or merge ends one).
pub fn retain(incoming: &mut Incoming, map: &PartitionMap) {
    incoming.retain(|pid, r| map.partitions.get(pid).is_some_and(|p| p.epoch == r.epoch));
}

/// May foreign records with `keys` be applied for `m`?
pub fn check_apply<'k>(
    map: &PartitionMap,
    me: NodeId,
    incoming: &Incoming,
    m: MigrationRef,
    mut keys: impl Iterator<Item = &'k [u8]>,
) -> Result<(), Refusal> {
    let p = map.partitions.get(&m.partition);
    if let Some(p) = p
        && p.owner == me
    {
        return Err(refuse(
            RefusalReason::Owned,
            format!("{m}: this node owns the partition at epoch {}", p.epoch),
        ));
    }
    let Some(r) = incoming
        .get(&m.partition)
        .filter(|r| r.id == m.id && r.epoch == m.epoch)
    else {
        return Err(refuse(
            RefusalReason::NotReceiving,
            format!("{m}: not an incoming migration of this node"),
        ));
    };
    // `retain` ends a registration whose partition moved on; asserted here
    // because the check depends on it.
    assert!(
        p.is_some_and(|p| p.epoch == r.epoch),
        "{m}: registered while the map has the partition at another epoch"
    );
    if let Some(key) = keys.find(|k| !r.range.contains(k)) {
        return Err(refuse(
            RefusalReason::OutOfRange,
            format!("{m}: record key {key:?} outside the partition's range"),
        ));
    }
    Ok(())
}

/// May `range` be dropped here on behalf of `m` (a target's stale copy at
/// copy start or on abort, or a source's range after the flip)?
pub fn check_drop(
    map: &PartitionMap,
    me: NodeId,
    incoming: &Incoming,
    m: MigrationRef,
    range: &KeyRange,
) -> Result<(), Refusal> {
    if let Some(p) = map
        .partitions
        .values()
        .find(|p| p.owner == me && ranges_overlap(&storage_range(p), range))
    {
        return Err(refuse(
            RefusalReason::Owned,
            format!(
                "{m}: this node owns partition {} at epoch {}, inside the range",
                p.id, p.epoch
            ),
        ));
    }
    if let Some((pid, r)) = incoming
        .iter()
        .find(|(_, r)| r.id != m.id && ranges_overlap(&r.range, range))
    {
        return Err(refuse(
            RefusalReason::ReceivingOther,
            format!(
                "{m}: this node receives partition {pid} under migration {}, inside the range",
                r.id
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyway_map::{MapVersion, NodeInfo};

    fn map() -> PartitionMap {
        let nodes: Vec<NodeInfo> = (1..=2)
            .map(|i| NodeInfo::up(NodeId(i), format!("127.0.0.1:{}", 7000 + i)))
            .collect();
        PartitionMap::bootstrap(&nodes, 2).unwrap()
    }

    /// The first partition not owned by `me`.
    fn foreign(map: &PartitionMap, me: NodeId) -> PartitionRecord {
        map.partitions
            .values()
            .find(|p| p.owner != me)
            .unwrap()
            .clone()
    }

    fn mref(id: u64, p: &PartitionRecord) -> MigrationRef {
        MigrationRef {
            id,
            partition: p.id,
            epoch: p.epoch,
        }
    }

    fn key_in(p: &PartitionRecord) -> Vec<u8> {
        let mut k = storage_range(p).start.to_vec();
        k.extend_from_slice(b"key");
        k
    }

    #[test]
    fn records_are_accepted_only_for_the_registered_migration_in_its_range() {
        let (map, me) = (map(), NodeId(1));
        let p = foreign(&map, me);
        let mut inc = Incoming::new();
        let k = key_in(&p);
        let keys = || std::iter::once(&k[..]);
        let err = check_apply(&map, me, &inc, mref(7, &p), keys()).unwrap_err();
        assert_eq!(err.reason, RefusalReason::NotReceiving);
        register(&map, me, &mut inc, mref(7, &p)).unwrap();
        check_apply(&map, me, &inc, mref(7, &p), keys()).unwrap();
        let other = check_apply(&map, me, &inc, mref(6, &p), keys()).unwrap_err();
        assert_eq!(other.reason, RefusalReason::NotReceiving);
        let outside = b"\xff\xff\xff\xffzz".to_vec();
        let err = check_apply(&map, me, &inc, mref(7, &p), std::iter::once(&outside[..]));
        assert_eq!(err.unwrap_err().reason, RefusalReason::OutOfRange);
        // An older migration never replaces a newer one.
        let err = register(&map, me, &mut inc, mref(5, &p)).unwrap_err();
        assert_eq!(err.reason, RefusalReason::Stale);
        register(&map, me, &mut inc, mref(8, &p)).unwrap();
        let err = check_apply(&map, me, &inc, mref(7, &p), keys()).unwrap_err();
        assert_eq!(err.reason, RefusalReason::NotReceiving);
        assert!(!unregister(&mut inc, mref(7, &p)));
        assert!(unregister(&mut inc, mref(8, &p)));
        assert!(inc.is_empty());
    }

    #[test]
    fn after_the_flip_the_registration_ends_and_records_are_refused() {
        let (mut map, me) = (map(), NodeId(1));
        let p = foreign(&map, me);
        let mut inc = Incoming::new();
        register(&map, me, &mut inc, mref(7, &p)).unwrap();
        let mut flipped = p.clone();
        flipped.owner = me;
        flipped.epoch = Epoch(p.epoch.0 + 1);
        map.partitions.insert(p.id, flipped);
        map.version = MapVersion(map.version.0 + 1);
        retain(&mut inc, &map);
        assert!(inc.is_empty());
        let k = key_in(&p);
        let err = check_apply(&map, me, &inc, mref(7, &p), std::iter::once(&k[..]));
        assert_eq!(err.unwrap_err().reason, RefusalReason::Owned);
        let err = register(&map, me, &mut inc, mref(7, &p)).unwrap_err();
        assert_eq!(err.reason, RefusalReason::Owned);
    }

    #[test]
    fn registration_waits_for_the_map_and_refuses_an_owned_or_moved_partition() {
        let (map, me) = (map(), NodeId(1));
        let p = foreign(&map, me);
        let mut inc = Incoming::new();
        let ahead = MigrationRef {
            epoch: Epoch(p.epoch.0 + 1),
            ..mref(7, &p)
        };
        let err = register(&map, me, &mut inc, ahead).unwrap_err();
        assert_eq!(err.reason, RefusalReason::MapBehind);
        let unknown = MigrationRef {
            partition: PartitionId(999_999),
            ..mref(7, &p)
        };
        let err = register(&map, me, &mut inc, unknown).unwrap_err();
        assert_eq!(err.reason, RefusalReason::MapBehind);
        let mine = map.partitions.values().find(|p| p.owner == me).unwrap();
        let err = register(&map, me, &mut inc, mref(7, mine)).unwrap_err();
        assert_eq!(err.reason, RefusalReason::Owned);
        let mut moved = map.clone();
        moved.partitions.get_mut(&p.id).unwrap().epoch = Epoch(p.epoch.0 + 1);
        let err = register(&moved, me, &mut inc, mref(7, &p)).unwrap_err();
        assert_eq!(err.reason, RefusalReason::Stale);
        assert!(inc.is_empty());
    }

    #[test]
    fn a_drop_is_refused_over_an_owned_range_or_another_migrations_copy() {
        let (map, me) = (map(), NodeId(1));
        let p = foreign(&map, me);
        let mine = map
            .partitions
            .values()
            .find(|p| p.owner == me)
            .unwrap()
            .clone();
        let mut inc = Incoming::new();
        check_drop(&map, me, &inc, mref(7, &p), &storage_range(&p)).unwrap();
        let err = check_drop(&map, me, &inc, mref(7, &p), &storage_range(&mine)).unwrap_err();
        assert_eq!(err.reason, RefusalReason::Owned);
        let err = check_drop(&map, me, &inc, mref(7, &p), &KeyRange::all()).unwrap_err();
        assert_eq!(err.reason, RefusalReason::Owned);
        register(&map, me, &mut inc, mref(8, &p)).unwrap();
        check_drop(&map, me, &inc, mref(8, &p), &storage_range(&p)).unwrap();
        let err = check_drop(&map, me, &inc, mref(7, &p), &storage_range(&p)).unwrap_err();
        assert_eq!(err.reason, RefusalReason::ReceivingOther);
    }
}
