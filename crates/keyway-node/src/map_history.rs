//! The node's bounded history of map changes, for `KW.MAP SINCE <version>`.
//!
//! The node keeps the changes of the last `map_history_versions` map
//! versions it installed one by one (from the metadata store's deltas), so a
//! client that was idle through many changes catches up with one small
//! delta instead of the whole map. The history always ends at the installed
//! map's version and is consecutive; installing a whole map whose changes the
//! node did not see (a full update, a lease re-read that jumped) empties it,
//! and from then on it grows again from that version.

use keyway_map::{MapChange, MapSince, MapVersion, PartitionMap};
use std::collections::VecDeque;
use std::sync::Arc;

/// The default of `map_history_versions`.
pub const DEFAULT_MAP_HISTORY_VERSIONS: usize = 1024;

/// One version's changes, shared with readers without copying.
pub type HistoryEntry = (MapVersion, Arc<Vec<MapChange>>);

/// What a node answers for `KW.MAP SINCE v`: a delta of shared entries, or
/// the whole map.
#[derive(Clone, Debug)]
pub enum HistoryAnswer {
    Delta(Vec<HistoryEntry>),
    Full(Arc<PartitionMap>),
}

impl HistoryAnswer {
    /// The reply bytes ([`keyway_map::encode_since`]'s format).
    pub fn encode(&self) -> Vec<u8> {
        match self {
            HistoryAnswer::Full(map) => keyway_map::encode_map(map),
            HistoryAnswer::Delta(entries) => {
                keyway_map::encode_delta(entries.iter().map(|(v, c)| (*v, c.as_slice())))
            }
        }
    }

    /// The same answer as an owned [`MapSince`].
    pub fn to_since(&self) -> MapSince {
        match self {
            HistoryAnswer::Full(map) => MapSince::Full((**map).clone()),
            HistoryAnswer::Delta(entries) => MapSince::Delta(
                entries
                    .iter()
                    .map(|(v, c)| (*v, c.as_ref().clone()))
                    .collect(),
            ),
        }
    }
}

/// The last `limit` versions' changes, consecutive, ending at the installed
/// map's version.
#[derive(Clone, Debug)]
pub struct MapHistory {
    limit: usize,
    entries: VecDeque<HistoryEntry>,
}

impl MapHistory {
    /// An empty history keeping at most `limit` versions (at least 1).
    pub fn new(limit: usize) -> Self {
        MapHistory {
            limit: limit.max(1),
            entries: VecDeque::new(),
        }
    }

    /// Changes the bound, dropping the oldest entries beyond it.
    pub fn set_limit(&mut self, limit: usize) {
        self.limit = limit.max(1);
        self.trim();
    }

    /// Versions retained.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The oldest version whose changes are retained.
    pub fn first_version(&self) -> Option<MapVersion> {
        self.entries.front().map(|(v, _)| *v)
    }

    /// Whether the history ends at `version` (an empty one ends nowhere).
    pub fn ends_at(&self, version: MapVersion) -> bool {
        self.entries.back().is_some_and(|(v, _)| *v == version)
    }

    /// Forgets everything (a whole map was installed).
    pub fn reset(&mut self) {
        self.entries.clear();
    }

    /// Records the changes that took the map from version `from` to the last
    /// entry's version. Entries at or below `from` are skipped; if the rest
    /// do not start at `from + 1`, or the history does not end at `from`
    /// (when it holds anything), the history restarts from the entries (or
    /// is emptied when they are not consecutive).
    pub fn record(&mut self, from: MapVersion, entries: impl IntoIterator<Item = HistoryEntry>) {
        if self.entries.back().is_some_and(|(v, _)| *v != from) {
            self.entries.clear();
        }
        let mut expect = from.0 + 1;
        for (version, changes) in entries {
            if version.0 < expect {
                continue;
            }
            if version.0 != expect {
                self.entries.clear();
                return;
            }
            self.entries.push_back((version, changes));
            expect += 1;
        }
        self.trim();
    }

    fn trim(&mut self) {
        while self.entries.len() > self.limit {
            self.entries.pop_front();
        }
    }

    /// The answer to `KW.MAP SINCE since` for a node whose map is `map`
    /// (the history must end at `map.version` when it is not empty): the
    /// changes after `since` when the history reaches back to it, an empty
    /// delta when `since` is current, otherwise the whole map (`since` too
    /// old, or newer than `map`: the metadata store was replaced).
    pub fn since(&self, map: &Arc<PartitionMap>, since: MapVersion) -> HistoryAnswer {
        if since == map.version {
            return HistoryAnswer::Delta(Vec::new());
        }
        match self.first_version() {
            Some(first)
                if since < map.version && self.ends_at(map.version) && first.0 <= since.0 + 1 =>
            {
                HistoryAnswer::Delta(
                    self.entries
                        .iter()
                        .filter(|(v, _)| *v > since)
                        .cloned()
                        .collect(),
                )
            }
            _ => HistoryAnswer::Full(map.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyway_map::{Epoch, NodeId, NodeInfo};

    fn nodes() -> Vec<NodeInfo> {
        (1..=2)
            .map(|i| NodeInfo::up(NodeId(i), format!("127.0.0.1:{}", 7000 + i)))
            .collect()
    }

    /// `count` versions after `map`'s, each moving one partition to the
    /// other node; returns the maps at each version and the entries.
    fn moves(map: &PartitionMap, count: usize) -> (Vec<PartitionMap>, Vec<HistoryEntry>) {
        let mut cur = map.clone();
        let (mut maps, mut entries) = (Vec::new(), Vec::new());
        let ids: Vec<_> = cur.partitions.keys().copied().collect();
        for i in 0..count {
            let mut p = cur.partitions[&ids[i % ids.len()]].clone();
            p.owner = if p.owner == NodeId(1) {
                NodeId(2)
            } else {
                NodeId(1)
            };
            p.epoch = Epoch(p.epoch.0 + 1);
            let v = MapVersion(cur.version.0 + 1);
            let changes = vec![MapChange::UpsertPartition(p)];
            cur.apply(v, &changes).unwrap();
            maps.push(cur.clone());
            entries.push((v, Arc::new(changes)));
        }
        (maps, entries)
    }

    fn apply(map: &PartitionMap, answer: &HistoryAnswer) -> PartitionMap {
        match answer.to_since() {
            MapSince::Full(m) => m,
            MapSince::Delta(entries) => {
                let mut m = map.clone();
                for (v, changes) in entries {
                    m.apply(v, &changes).unwrap();
                }
                m
            }
        }
    }

    #[test]
    fn a_delta_brings_an_old_map_to_the_new_one_and_the_bound_forces_full() {
        let v1 = PartitionMap::bootstrap(&nodes(), 4).unwrap();
        let (maps, entries) = moves(&v1, 12);
        let mut h = MapHistory::new(10);
        h.record(v1.version, entries);
        let now = Arc::new(maps.last().unwrap().clone());
        assert_eq!((h.len(), h.first_version()), (10, Some(MapVersion(4))));
        // Within the bound: a delta, and applying it gives exactly the new map.
        for since in [MapVersion(3), MapVersion(7), MapVersion(12)] {
            let old = &maps[since.0 as usize - 2];
            let answer = h.since(&now, since);
            let HistoryAnswer::Delta(d) = &answer else {
                panic!("since {since}: expected a delta");
            };
            assert_eq!(d.len() as u64, now.version.0 - since.0);
            assert_eq!(apply(old, &answer), *now);
            // And through the wire encoding.
            let decoded = keyway_map::decode_since(&answer.encode()).unwrap();
            assert_eq!(decoded, answer.to_since());
        }
        // Current: an empty delta.
        assert!(matches!(h.since(&now, now.version), HistoryAnswer::Delta(d) if d.is_empty()));
        // Older than the bound, or newer than the node's map: the whole map.
        for since in [MapVersion(1), MapVersion(2), MapVersion(14), MapVersion(99)] {
            assert!(
                matches!(h.since(&now, since), HistoryAnswer::Full(m) if *m == *now),
                "since {since}"
            );
        }
    }

    #[test]
    fn a_full_install_or_a_gap_resets_the_history() {
        let v1 = PartitionMap::bootstrap(&nodes(), 4).unwrap();
        let (maps, entries) = moves(&v1, 6);
        let mut h = MapHistory::new(100);
        h.record(v1.version, entries[..3].iter().cloned());
        assert_eq!(h.len(), 3);
        // Replayed entries are skipped; the rest continue.
        h.record(MapVersion(4), entries[..5].iter().cloned());
        assert_eq!(h.len(), 5);
        // A record that does not continue from where the history ends restarts it.
        h.record(MapVersion(2), entries[1..].iter().cloned());
        assert_eq!(h.first_version(), Some(MapVersion(3)));
        let now = Arc::new(maps.last().unwrap().clone());
        assert!(matches!(
            h.since(&now, MapVersion(1)),
            HistoryAnswer::Full(_)
        ));
        assert!(matches!(h.since(&now, MapVersion(2)), HistoryAnswer::Delta(d) if d.len() == 5));
        // A gap inside the entries empties it.
        h.record(
            MapVersion(7),
            [entries[0].clone()]
                .into_iter()
                .map(|(_, c)| (MapVersion(9), c)),
        );
        assert!(h.is_empty());
        h.reset();
        assert!(matches!(
            h.since(&now, MapVersion(6)),
            HistoryAnswer::Full(_)
        ));
        h.set_limit(0);
        h.record(MapVersion(1), entries.iter().cloned());
        assert_eq!(h.len(), 1, "the bound is at least one version");
    }
}
