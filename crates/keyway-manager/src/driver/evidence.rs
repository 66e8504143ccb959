//! What the driver reads from the map when the flip CAS failed its
//! condition: the [`FlipEvidence`] the machine decides from whether our
//! CAS applied (`keyway-migration`'s `cutover.rs` has the rule).
//!
//! - `current`: the partition's row now (`None`: split or merged away).
//! - `covering`: `(owner, epoch)` of every row now covering part of the
//!   migration's range.
//! - `successor`: from the store's retained history (`changes_since`, the
//!   deltas watchers use): the change that replaced the row `(source, e)`:
//!   the first change to that partition id after a version at which it was
//!   `(source, e)` — its own next row, or, when it was removed, the rows the
//!   same version put over its range (a split or merge keeps the owner).
//!   That version is the record's `map_version` (the map the move was
//!   requested from), so the history needed spans the migration's own
//!   lifetime. Records without one (0) search back for the version that
//!   wrote `(source, e)`, widening from the last
//!   [`HISTORY_PROBE_VERSIONS`] versions by ×8. When the store answers with
//!   a full map (history trimmed) the successor is `None`, and the machine
//!   falls back to the covering rows or stays in doubt.
//!
//! Pure ([`successor_in`]) where it can be.

use super::ranges_overlap;
use keyway_map::{Epoch, MapChange, MapVersion, NodeId, PartitionRecord};
use keyway_meta::{MapUpdate, MetaStore};
use keyway_migration::FlipEvidence;
use keyway_storage::KeyRange;

/// The first history window searched, in map versions (then ×8 per step).
pub(crate) const HISTORY_PROBE_VERSIONS: u64 = 64;

/// What one history window says about the row `(source, e)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Search {
    /// The change that replaced the row: `(owner, epoch)` of what followed.
    Found((NodeId, Epoch)),
    /// The window holds the row's creation and nothing replaced it since (or
    /// what replaced it cannot be read: rows of different owners).
    Unreplaced,
    /// The window starts after the row was written: look further back.
    TooShort,
}

fn row_range(p: &PartitionRecord) -> KeyRange {
    let (start, end) = p.storage_bounds();
    KeyRange::new(start, end)
}

/// Searches `history` (contiguous versions, oldest first) for what
/// replaced `row` (the migration's partition at `(source, e)`). `known`:
/// the history starts right after a version at which the row held (the
/// record's `map_version`); otherwise it must contain the row's write.
pub(crate) fn successor_in(
    history: &[(MapVersion, Vec<MapChange>)],
    row: &PartitionRecord,
    known: bool,
) -> Search {
    let is_row = |c: &MapChange| {
        matches!(c, MapChange::UpsertPartition(p)
            if p.id == row.id && (p.owner, p.epoch) == (row.owner, row.epoch))
    };
    let after = match history.iter().position(|(_, cs)| cs.iter().any(is_row)) {
        Some(at) => at + 1,
        None if known => 0,
        None => return Search::TooShort,
    };
    let range = row_range(row);
    for (_, changes) in &history[after..] {
        for change in changes {
            match change {
                MapChange::UpsertPartition(p)
                    if p.id == row.id && (p.owner, p.epoch) != (row.owner, row.epoch) =>
                {
                    return Search::Found((p.owner, p.epoch));
                }
                MapChange::RemovePartition { id } if *id == row.id => {
                    return replaced_by(changes, row, &range);
                }
                _ => {}
            }
        }
    }
    Search::Unreplaced
}

/// The rows one version put over a removed partition's range: a split or
/// a merge, which keep the owner.
fn replaced_by(changes: &[MapChange], gone: &PartitionRecord, range: &KeyRange) -> Search {
    let rows: Vec<(NodeId, Epoch)> = changes
        .iter()
        .filter_map(|c| match c {
            MapChange::UpsertPartition(p)
                if p.id != gone.id && ranges_overlap(&row_range(p), range) =>
            {
                Some((p.owner, p.epoch))
            }
            _ => None,
        })
        .collect();
    let Some(&(owner, _)) = rows.first() else {
        return Search::Unreplaced;
    };
    if rows.iter().any(|(o, _)| *o != owner) {
        return Search::Unreplaced;
    }
    let epoch = rows.iter().map(|(_, e)| *e).min().expect("non-empty");
    Search::Found((owner, epoch))
}

/// Reads the evidence for the migration of `row` (its partition at
/// `(source, e)`, read at map version `read_at`, 0 if unknown) over
/// `range`. `hint` is the row the conflict reported, used when the map
/// cannot be read.
pub(crate) async fn flip_evidence(
    meta: &dyn MetaStore,
    row: &PartitionRecord,
    read_at: u64,
    range: &KeyRange,
    hint: Option<(NodeId, Epoch)>,
) -> FlipEvidence {
    let map = match meta.get_map().await {
        Ok(map) => map,
        Err(err) => {
            tracing::debug!(%err, "flip evidence: cannot read the map");
            return FlipEvidence {
                current: hint,
                successor: None,
                covering: Vec::new(),
            };
        }
    };
    let current = map.partitions.get(&row.id).map(|p| (p.owner, p.epoch));
    let covering = map
        .partitions
        .values()
        .filter(|p| ranges_overlap(&row_range(p), range))
        .map(|p| (p.owner, p.epoch))
        .collect();
    let successor = match read_at {
        0 => history_successor(meta, row, map.version).await,
        v => known_successor(meta, row, MapVersion(v)).await,
    };
    FlipEvidence {
        current,
        successor,
        covering,
    }
}

/// The successor from the history after `read_at` (when the row held).
async fn known_successor(
    meta: &dyn MetaStore,
    row: &PartitionRecord,
    read_at: MapVersion,
) -> Option<(NodeId, Epoch)> {
    match meta.changes_since(read_at).await {
        Ok(MapUpdate::Delta(entries)) => match successor_in(&entries, row, true) {
            Search::Found(successor) => Some(successor),
            Search::Unreplaced | Search::TooShort => None,
        },
        Ok(MapUpdate::Full(_)) => None,
        Err(err) => {
            tracing::debug!(%err, "flip evidence: cannot read the map history");
            None
        }
    }
}

async fn history_successor(
    meta: &dyn MetaStore,
    row: &PartitionRecord,
    now: MapVersion,
) -> Option<(NodeId, Epoch)> {
    let mut back = HISTORY_PROBE_VERSIONS;
    loop {
        let since = MapVersion(now.0.saturating_sub(back));
        match meta.changes_since(since).await {
            Ok(MapUpdate::Delta(entries)) => match successor_in(&entries, row, false) {
                Search::Found(successor) => return Some(successor),
                Search::Unreplaced => return None,
                Search::TooShort if since.0 == 0 => return None,
                Search::TooShort => back = back.saturating_mul(8),
            },
            Ok(MapUpdate::Full(_)) => return None,
            Err(err) => {
                tracing::debug!(%err, "flip evidence: cannot read the map history");
                return None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use keyway_map::{KeyspaceId, PartitionId, PartitionState};

    const S: NodeId = NodeId(1);
    const T: NodeId = NodeId(2);

    fn row(id: u64, owner: NodeId, epoch: u64, start: &[u8], end: &[u8]) -> PartitionRecord {
        PartitionRecord {
            id: PartitionId(id),
            keyspace: KeyspaceId(0),
            start: Bytes::copy_from_slice(start),
            end: Some(Bytes::copy_from_slice(end)),
            owner,
            replicas: vec![],
            in_sync: Vec::new(),
            reads_from: None,
            epoch: Epoch(epoch),
            state: PartitionState::Active,
        }
    }

    fn up(p: &PartitionRecord) -> MapChange {
        MapChange::UpsertPartition(p.clone())
    }

    fn split(parent: &PartitionRecord, owner: NodeId, epoch: u64) -> Vec<MapChange> {
        vec![
            MapChange::RemovePartition { id: parent.id },
            up(&row(8, owner, epoch, &[0x10], &[0x18])),
            up(&row(9, owner, epoch, &[0x18], &[0x20])),
        ]
    }

    #[test]
    fn the_history_names_what_replaced_source_e() {
        let p = row(7, S, 4, &[0x10], &[0x20]);
        let flipped = row(7, T, 5, &[0x10], &[0x20]);
        let v = |n| MapVersion(n);
        // Flip, then a split of the target's row: the split's children are T's.
        let h = vec![
            (v(1), vec![up(&p)]),
            (v(2), vec![up(&flipped)]),
            (v(3), split(&flipped, T, 6)),
        ];
        assert_eq!(successor_in(&h, &p, false), Search::Found((T, Epoch(5))));
        // No flip, a split of (S, e): children at e + 1 owned by S.
        let h = vec![(v(1), vec![up(&p)]), (v(2), split(&p, S, 5))];
        assert_eq!(successor_in(&h, &p, false), Search::Found((S, Epoch(5))));
        // The row's creation is older than the window.
        let h = vec![(v(5), split(&flipped, T, 6))];
        assert_eq!(successor_in(&h, &p, false), Search::TooShort);
        // Created, never replaced.
        let h = vec![(v(1), vec![up(&p)]), (v(2), vec![])];
        assert_eq!(successor_in(&h, &p, false), Search::Unreplaced);
        // A replacement by rows of two owners says nothing.
        let mixed = vec![
            MapChange::RemovePartition { id: p.id },
            up(&row(8, S, 5, &[0x10], &[0x18])),
            up(&row(9, T, 5, &[0x18], &[0x20])),
        ];
        let h = vec![(v(1), vec![up(&p)]), (v(2), mixed)];
        assert_eq!(successor_in(&h, &p, false), Search::Unreplaced);
        // From the record's map version: the row's write may be older.
        let h = vec![(v(5), vec![up(&flipped)]), (v(6), split(&flipped, T, 6))];
        assert_eq!(successor_in(&h, &p, true), Search::Found((T, Epoch(5))));
        let h = vec![(v(5), vec![]), (v(6), split(&p, S, 5))];
        assert_eq!(successor_in(&h, &p, true), Search::Found((S, Epoch(5))));
        // Rows of other ranges in the same version do not count.
        let mut merge = vec![MapChange::RemovePartition { id: p.id }];
        merge.push(up(&row(10, S, 9, &[0x00], &[0x20])));
        merge.push(up(&row(11, T, 3, &[0x30], &[0x40])));
        let h = vec![(v(1), vec![up(&p)]), (v(2), merge)];
        assert_eq!(successor_in(&h, &p, false), Search::Found((S, Epoch(9))));
    }
}
