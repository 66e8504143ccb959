//! When each partition was born, and how: the memory behind the split
//! cooldown (a partition is not split again right after it was made) and
//! the merge hysteresis (a split is not undone at once by a merge).
//!
//! Births come from the manager's own splits and merges
//! ([`History::born`]) and from comparing each round's map with the
//! previous one ([`History::observe`]): a new id whose range lies inside a
//! removed one was born by a split (an operator's `keyway ctl split`, say),
//! one that covers a removed one by a merge. The history lives in memory: a
//! new leader starts with none (its load windows start empty too).

use keyway_map::{PartitionId, PartitionMap, PartitionRecord};
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// How a partition came to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Birth {
    Split,
    Merge,
}

/// Births of the partitions seen since this manager started leading.
#[derive(Default, Debug)]
pub struct History {
    born: HashMap<PartitionId, (Birth, Instant)>,
    previous: Option<BTreeMap<PartitionId, PartitionRecord>>,
}

impl History {
    /// Notes that `partition` was born by `how` at `at`.
    pub fn born(&mut self, partition: PartitionId, how: Birth, at: Instant) {
        self.born.insert(partition, (how, at));
    }

    /// Compares `map` with the map of the previous round: ids that appeared
    /// are noted as born at `now` (by a split if inside a removed range, by
    /// a merge otherwise); ids that vanished are forgotten. The first map
    /// only sets the baseline.
    pub fn observe(&mut self, map: &PartitionMap, now: Instant) {
        if let Some(previous) = &self.previous {
            let removed: Vec<&PartitionRecord> = previous
                .values()
                .filter(|p| !map.partitions.contains_key(&p.id))
                .collect();
            for p in map.partitions.values() {
                if previous.contains_key(&p.id) || self.born.contains_key(&p.id) {
                    continue;
                }
                let split = removed
                    .iter()
                    .any(|old| old.keyspace == p.keyspace && contains(old, p));
                let how = if split { Birth::Split } else { Birth::Merge };
                self.born.insert(p.id, (how, now));
            }
        }
        self.born.retain(|id, _| map.partitions.contains_key(id));
        self.previous = Some(map.partitions.clone());
    }

    /// How `partition` was born, if within `window` before `now`.
    pub fn born_within(
        &self,
        partition: PartitionId,
        window: Duration,
        now: Instant,
    ) -> Option<Birth> {
        let &(how, at) = self.born.get(&partition)?;
        (now.saturating_duration_since(at) < window).then_some(how)
    }

    /// Forgets everything (the manager stopped leading).
    pub fn clear(&mut self) {
        self.born.clear();
        self.previous = None;
    }
}

/// Whether `outer` covers `inner`'s whole range.
fn contains(outer: &PartitionRecord, inner: &PartitionRecord) -> bool {
    let end_ok = match (&outer.end, &inner.end) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(o), Some(i)) => i <= o,
    };
    inner.start >= outer.start && end_ok
}
