//! The client's cached map, and patching it from a `-KWMOVED` rejection.
//!
//! A rejection names one partition as the node knows it: id, epoch, range,
//! owner and the owner's address. Patching replaces every cached partition
//! of that keyspace whose range overlaps it, if all of them have a lower
//! epoch (a split or merge changes ranges), and records the owner's
//! address. The cache may have gaps afterwards; a lookup that finds none
//! refreshes the map.

use keyway_map::{NodeInfo, PartitionId, PartitionMap, PartitionRecord};
use std::sync::{Arc, RwLock};
use std::time::Instant;

pub use keyway_map::KwMoved;

/// Parses the text of a `KWMOVED` error (without the leading `-`).
pub fn parse_kwmoved(msg: &str) -> Option<KwMoved> {
    KwMoved::parse(msg)
}

fn overlaps(a: &PartitionRecord, b: &PartitionRecord) -> bool {
    let a_before_b_end = b.end.as_ref().is_none_or(|end| a.start < *end);
    let b_before_a_end = a.end.as_ref().is_none_or(|end| b.start < *end);
    a.keyspace == b.keyspace && a_before_b_end && b_before_a_end
}

/// Applies a rejection to `map`: when every cached partition overlapping
/// the rejection's range has a lower epoch, they are replaced by the
/// rejection's record (a split or merge changes ranges) and the owner's
/// address is recorded. Returns false, changing nothing, when the cache
/// already knows something at least as new.
pub fn patch_map(map: &mut PartitionMap, moved: &KwMoved) -> bool {
    let fresh = &moved.partition;
    let overlapping: Vec<&PartitionRecord> = map
        .partitions
        .values()
        .filter(|p| overlaps(p, fresh))
        .collect();
    let same_id = map.partitions.get(&fresh.id);
    if overlapping
        .iter()
        .chain(same_id.iter())
        .any(|p| p.epoch >= fresh.epoch)
    {
        return false;
    }
    let stale: Vec<PartitionId> = overlapping.iter().map(|p| p.id).collect();
    for id in stale {
        map.partitions.remove(&id);
    }
    map.partitions.remove(&fresh.id);
    map.nodes
        .entry(fresh.owner)
        .or_insert_with(|| NodeInfo::up(fresh.owner, moved.owner_addr.clone()));
    if let Some(node) = map.nodes.get_mut(&fresh.owner) {
        node.resp_addr = moved.owner_addr.clone();
    }
    map.partitions.insert(fresh.id, fresh.clone());
    map.reindex();
    true
}

/// The client's cached map.
///
/// `base` is exactly a map some node had at `base.version` (the last
/// refresh, or the warm cache file); deltas apply to it. `view` is what
/// requests route by: `base` plus the rejections patched in since, which a
/// refresh re-applies while they are still newer than what it brought.
pub struct Cache {
    state: RwLock<State>,
}

struct State {
    base: Arc<PartitionMap>,
    view: Arc<PartitionMap>,
    /// Rejections patched in since `base`, one per partition id (newest).
    patches: Vec<KwMoved>,
    /// When a refresh last confirmed the whole cache (`None`: never).
    resolved_at: Option<Instant>,
    /// Bumped by every refresh: a caller that routed by an older generation
    /// knows a refresh has happened since.
    generation: u64,
}

/// What one request routes by.
pub struct Snapshot {
    pub view: Arc<PartitionMap>,
    pub generation: u64,
    pub resolved_at: Option<Instant>,
}

impl Default for Cache {
    fn default() -> Self {
        let empty = Arc::new(PartitionMap::new());
        Cache {
            state: RwLock::new(State {
                base: empty.clone(),
                view: empty,
                patches: Vec::new(),
                resolved_at: None,
                generation: 0,
            }),
        }
    }
}

impl Cache {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    pub fn snapshot(&self) -> Snapshot {
        let s = self.read();
        Snapshot {
            view: s.view.clone(),
            generation: s.generation,
            resolved_at: s.resolved_at,
        }
    }

    /// The map requests route by.
    pub fn view(&self) -> Arc<PartitionMap> {
        self.read().view.clone()
    }

    /// The last map a node sent, unpatched.
    pub fn base(&self) -> Arc<PartitionMap> {
        self.read().base.clone()
    }

    pub fn generation(&self) -> u64 {
        self.read().generation
    }

    /// Installs `base` as the refreshed map (`resolved`: when a refresh
    /// confirmed it; `None` for a map loaded from the cache file), then
    /// re-applies the patches that are still newer than it.
    pub fn install(&self, base: PartitionMap, resolved: Option<Instant>) {
        let base = Arc::new(base);
        let mut s = self.write();
        let mut view = (*base).clone();
        s.patches.retain(|m| patch_map(&mut view, m));
        s.view = if s.patches.is_empty() {
            base.clone()
        } else {
            Arc::new(view)
        };
        s.base = base;
        s.resolved_at = resolved.or(s.resolved_at);
        s.generation += 1;
    }

    /// A refresh found the cache current (an empty delta).
    pub fn confirm(&self, now: Instant) {
        let mut s = self.write();
        s.resolved_at = Some(now);
        s.generation += 1;
    }

    /// Patches a `-KWREADS` into the view: the partition at that epoch
    /// reads from that node; true if it changed anything. Not kept across
    /// refreshes (a refresh brings `reads_from` itself).
    pub fn patch_reads_from(&self, reads: &keyway_map::KwReads) -> bool {
        let mut s = self.write();
        let Some(p) = s.view.partitions.get(&reads.partition) else {
            return false;
        };
        if p.epoch != reads.epoch || p.reads_from == Some(reads.reads_from) {
            return false;
        }
        let mut view = (*s.view).clone();
        if let Some(p) = view.partitions.get_mut(&reads.partition) {
            p.reads_from = Some(reads.reads_from);
        }
        view.nodes
            .entry(reads.reads_from)
            .or_insert_with(|| NodeInfo::up(reads.reads_from, reads.addr.clone()));
        s.view = Arc::new(view);
        true
    }

    /// Patches a rejection into the view; true if it changed anything.
    pub fn patch(&self, moved: KwMoved) -> bool {
        let mut s = self.write();
        let mut view = (*s.view).clone();
        if !patch_map(&mut view, &moved) {
            return false;
        }
        s.view = Arc::new(view);
        let id = moved.partition.id;
        s.patches.retain(|m| m.partition.id != id);
        s.patches.push(moved);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyway_map::{Epoch, NodeId};

    fn map() -> PartitionMap {
        let nodes: Vec<NodeInfo> = (1..=2)
            .map(|i| NodeInfo::up(NodeId(i), format!("127.0.0.1:{}", 7000 + i)))
            .collect();
        PartitionMap::bootstrap(&nodes, 2).unwrap()
    }

    fn moved(p: &PartitionRecord, epoch: u64, owner: u64) -> KwMoved {
        KwMoved {
            partition: PartitionRecord {
                epoch: Epoch(epoch),
                owner: NodeId(owner),
                ..p.clone()
            },
            owner_addr: format!("127.0.0.1:{}", 7100 + owner),
        }
    }

    #[test]
    fn patches_only_apply_when_newer_and_survive_an_older_refresh() {
        let base = map();
        let p = base.partitions.values().next().unwrap().clone();
        let cache = Cache::default();
        cache.install(base.clone(), None);
        // Same or lower epoch: nothing to do.
        assert!(!cache.patch(moved(&p, p.epoch.0, 2)));
        assert!(cache.patch(moved(&p, p.epoch.0 + 2, 2)));
        assert!(!cache.patch(moved(&p, p.epoch.0 + 1, 1)), "never back");
        let view = cache.view();
        assert_eq!(view.partitions[&p.id].owner, NodeId(2));
        assert_eq!(view.nodes[&NodeId(2)].resp_addr, "127.0.0.1:7102");
        assert_eq!(cache.base().partitions[&p.id], p, "the base is unpatched");
        // A refresh that does not know the move yet keeps the patch...
        let generation = cache.generation();
        cache.install(base.clone(), Some(Instant::now()));
        assert_eq!(cache.generation(), generation + 1);
        assert_eq!(cache.view().partitions[&p.id].epoch, Epoch(p.epoch.0 + 2));
        // ...one that knows it (or later) drops it.
        let mut newer = base.clone();
        newer
            .apply(
                keyway_map::MapVersion(base.version.0 + 1),
                &[keyway_map::MapChange::UpsertPartition(PartitionRecord {
                    epoch: Epoch(p.epoch.0 + 3),
                    ..p.clone()
                })],
            )
            .unwrap();
        cache.install(newer.clone(), Some(Instant::now()));
        assert!(Arc::ptr_eq(&cache.view(), &cache.base()));
        assert_eq!(*cache.view(), newer);
    }
}
