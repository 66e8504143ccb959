//! The proxy's partition map, kept fresh by watching the metadata store and
//! corrected by the nodes' rejections; locating a key's owner.
//!
//! Two layers make the map the proxy routes by (its *view*):
//! - the **base**: exactly the metadata store's map at some version,
//!   advanced by the watch's deltas (a gap, or an update that does not
//!   apply, reloads the whole map);
//! - **patches**: partition records learnt from `-KWMOVED` rejections that
//!   the base does not know yet. A patch replaces every view partition it
//!   overlaps only if all of them carry a lower epoch (a move, split or
//!   merge always raises the epoch of the records it writes), and is
//!   dropped once the base holds an overlapping record at its epoch or
//!   later. A patch may leave a gap in the view (a split child learnt
//!   before its sibling); keys in the gap wait for the watch.
//!
//! Every change of the view bumps a counter that requests waiting for a
//! fresher map ([`Router::changed_since`]) are woken by.

use crate::metrics::Metrics;
use futures::StreamExt;
use keyway_map::{
    DEFAULT_KEYSPACE, Epoch, Keyspace, KeyspaceId, MapVersion, NodeInfo, PartitionId, PartitionMap,
    PartitionRecord,
};
use keyway_meta::{MapUpdate, MetaStore};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio::sync::watch;

/// Where one request goes: the partition it names, at which epoch, and the
/// owner's RESP address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    pub partition: PartitionId,
    pub epoch: Epoch,
    pub addr: String,
    /// The RESP address of the partition's `reads_from` replica, if any
    /// (reads switched ahead of writes: its reads go there, `READONLY`).
    pub reads_from_addr: Option<String>,
}

/// A record learnt from a rejection, with its owner's address.
#[derive(Clone, Debug)]
struct Patch {
    record: PartitionRecord,
    owner_addr: String,
}

struct Layers {
    base: PartitionMap,
    patches: Vec<Patch>,
}

/// The map the proxy routes by.
pub struct Router {
    layers: Mutex<Layers>,
    view: RwLock<Arc<PartitionMap>>,
    /// Bumped on every change of the view; `ready` once the first map is in.
    changes: watch::Sender<u64>,
    ready: watch::Sender<bool>,
    metrics: Arc<Metrics>,
}

impl Router {
    /// A router with no map yet (not ready).
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Router {
            layers: Mutex::new(Layers {
                base: PartitionMap::new(),
                patches: Vec::new(),
            }),
            view: RwLock::new(Arc::new(PartitionMap::new())),
            changes: watch::channel(0).0,
            ready: watch::channel(false).0,
            metrics,
        }
    }

    /// The current view (a cheap clone of an `Arc`).
    pub fn view(&self) -> Arc<PartitionMap> {
        self.view.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The version of the metadata store's map the view is based on.
    pub fn base_version(&self) -> MapVersion {
        self.lock().base.version
    }

    /// Whether the first map has been installed.
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Resolves once the first map has been installed.
    pub async fn wait_ready(&self) {
        let mut rx = self.ready.subscribe();
        // The sender lives in `self`, so `wait_for` can only end with `Ok`.
        let _ = rx.wait_for(|ready| *ready).await;
    }

    /// A receiver of the change counter: `changed()` resolves on the next
    /// change of the view after this call.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Layers> {
        self.layers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The owner of hash `slot` of keyspace 0.
    pub fn locate_slot(&self, slot: u16) -> Option<Route> {
        let view = self.view();
        route(&view, view.locate_slot(DEFAULT_KEYSPACE, slot)?)
    }

    /// The owner of keyspace-local routing key `local` of keyspace `ks`.
    pub fn locate(&self, ks: KeyspaceId, local: &[u8]) -> Option<Route> {
        let view = self.view();
        route(&view, view.locate(ks, local)?)
    }

    /// The keyspace named `arg`, or with numeric id `arg` (as a node resolves it).
    pub fn keyspace(&self, arg: &[u8]) -> Option<Keyspace> {
        keyway_command::kw::resolve_keyspace(&self.view(), arg).ok()
    }

    /// Installs the metadata store's map `map` as the new base (if it is
    /// newer), keeping the patches it does not supersede.
    pub fn install_base(&self, map: PartitionMap) {
        let mut layers = self.lock();
        if map.version < layers.base.version {
            return;
        }
        layers.base = map;
        self.rebuild(&mut layers);
        drop(layers);
        self.ready.send_replace(true);
    }

    /// Applies one watch update to the base. `false` if it does not apply
    /// (a delta that does not continue the base, or a map that fails
    /// validation): the caller reloads the whole map.
    pub fn apply_update(&self, update: &MapUpdate) -> bool {
        let mut layers = self.lock();
        if update.version().is_none() {
            return true;
        }
        match update.apply_to(&mut layers.base) {
            Ok(()) => {
                self.rebuild(&mut layers);
                true
            }
            Err(err) => {
                tracing::warn!(%err, "map update does not apply; reloading the whole map");
                false
            }
        }
    }

    /// Patches the view from a rejection's record. Returns whether the view
    /// changed (false: the view already knew that record or a newer one).
    pub fn patch(&self, record: PartitionRecord, owner_addr: String) -> bool {
        let mut layers = self.lock();
        let mut view = (**self.view.read().unwrap_or_else(|e| e.into_inner())).clone();
        let patch = Patch { record, owner_addr };
        if !apply_patch(&mut view, &patch) {
            return false;
        }
        view.reindex();
        layers.patches.push(patch);
        self.metrics.map_patches.inc();
        self.publish(view);
        true
    }

    /// Patches the view from a `-KWREADS`: the partition at that epoch
    /// reads from that node. Returns whether the view changed. Not kept
    /// across rebuilds (the store's map brings `reads_from` itself).
    pub fn patch_reads_from(&self, reads: &keyway_map::KwReads) -> bool {
        let _layers = self.lock();
        let mut view = (**self.view.read().unwrap_or_else(|e| e.into_inner())).clone();
        let Some(p) = view.partitions.get_mut(&reads.partition) else {
            return false;
        };
        if p.epoch != reads.epoch || p.reads_from == Some(reads.reads_from) {
            return false;
        }
        p.reads_from = Some(reads.reads_from);
        view.nodes
            .entry(reads.reads_from)
            .or_insert_with(|| keyway_map::NodeInfo::up(reads.reads_from, reads.addr.clone()));
        self.metrics.map_patches.inc();
        self.publish(view);
        true
    }

    /// Rebuilds the view from the base and the patches it does not supersede.
    fn rebuild(&self, layers: &mut Layers) {
        let mut view = layers.base.clone();
        layers.patches.retain(|p| apply_patch(&mut view, p));
        view.reindex();
        self.metrics.map_version.set(layers.base.version.0 as i64);
        self.publish(view);
    }

    fn publish(&self, view: PartitionMap) {
        *self.view.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(view);
        self.changes.send_modify(|n| *n += 1);
    }
}

fn route(view: &PartitionMap, p: &PartitionRecord) -> Option<Route> {
    let node = view.nodes.get(&p.owner)?;
    let reads_from_addr = p
        .reads_from
        .filter(|r| *r != p.owner)
        .and_then(|r| view.nodes.get(&r))
        .map(|n| n.resp_addr.clone());
    Some(Route {
        partition: p.id,
        epoch: p.epoch,
        addr: node.resp_addr.clone(),
        reads_from_addr,
    })
}

fn overlaps(a: &PartitionRecord, b: &PartitionRecord) -> bool {
    a.keyspace == b.keyspace
        && b.end.as_ref().is_none_or(|end| a.start < *end)
        && a.end.as_ref().is_none_or(|end| b.start < *end)
}

/// Applies `patch` to `view` (without reindexing) if every partition it
/// overlaps (or shares its id) carries a lower epoch. Returns whether it did.
fn apply_patch(view: &mut PartitionMap, patch: &Patch) -> bool {
    let fresh = &patch.record;
    let touched: Vec<&PartitionRecord> = view
        .partitions
        .values()
        .filter(|p| p.id == fresh.id || overlaps(p, fresh))
        .collect();
    if touched.iter().any(|p| p.epoch >= fresh.epoch) {
        return false;
    }
    let stale: Vec<PartitionId> = touched.iter().map(|p| p.id).collect();
    for id in stale {
        view.partitions.remove(&id);
    }
    let node = view
        .nodes
        .entry(fresh.owner)
        .or_insert_with(|| NodeInfo::up(fresh.owner, patch.owner_addr.clone()));
    node.resp_addr = patch.owner_addr.clone();
    view.partitions.insert(fresh.id, fresh.clone());
    true
}

/// Loads the first map (retrying until it succeeds), then keeps the base
/// fresh from the store's watch until `shutdown`: deltas are applied in
/// order; a delta that does not apply reloads the whole map; a broken watch
/// is re-opened from the last version, with a bounded back-off.
pub async fn watch_loop(
    router: Arc<Router>,
    meta: Arc<dyn MetaStore>,
    mut shutdown: watch::Receiver<bool>,
) {
    const FIRST_BACKOFF: Duration = Duration::from_millis(50);
    const MAX_BACKOFF: Duration = Duration::from_secs(2);
    let mut backoff = FIRST_BACKOFF;
    let mut need_full = true;
    loop {
        if need_full {
            let loaded = tokio::select! {
                m = meta.get_map() => m,
                _ = shutdown.changed() => return,
            };
            match loaded {
                Ok(map) => {
                    router.metrics.map_reloads.inc();
                    router.install_base(map);
                    need_full = false;
                    backoff = FIRST_BACKOFF;
                }
                Err(err) => tracing::warn!(%err, "cannot load the partition map"),
            }
        }
        if !need_full {
            let since = router.base_version();
            let stream = tokio::select! {
                s = meta.watch(since) => s,
                _ = shutdown.changed() => return,
            };
            match stream {
                Ok(mut stream) => loop {
                    let item = tokio::select! {
                        item = stream.next() => item,
                        _ = shutdown.changed() => return,
                    };
                    match item {
                        Some(Ok(update)) => {
                            backoff = FIRST_BACKOFF;
                            router.metrics.map_updates.inc();
                            if !router.apply_update(&update) {
                                need_full = true;
                                break;
                            }
                        }
                        Some(Err(err)) => {
                            tracing::warn!(%err, "map watch broke; re-watching");
                            break;
                        }
                        None => break,
                    }
                },
                Err(err) => tracing::warn!(%err, "cannot watch the partition map"),
            }
            if need_full {
                continue;
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = shutdown.changed() => return,
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use keyway_map::{MapChange, NodeId, key_hash_slot, slot_bound};

    fn nodes() -> Vec<NodeInfo> {
        (1..=3)
            .map(|i| NodeInfo::up(NodeId(i), format!("127.0.0.1:{}", 7000 + i)))
            .collect()
    }

    fn router() -> (Router, PartitionMap) {
        let map = PartitionMap::bootstrap(&nodes(), 2).unwrap();
        let r = Router::new(Arc::new(Metrics::new()));
        assert!(!r.is_ready());
        r.install_base(map.clone());
        assert!(r.is_ready());
        (r, map)
    }

    #[test]
    fn a_newer_rejection_patches_and_an_older_one_is_ignored() {
        let (r, map) = router();
        let slot = key_hash_slot(b"foo");
        let before = r.locate_slot(slot).unwrap();
        let mut moved = map.partitions[&before.partition].clone();
        moved.owner = NodeId(1);
        moved.epoch = Epoch(moved.epoch.0 + 1);
        assert!(r.patch(moved.clone(), "127.0.0.1:9999".into()));
        let after = r.locate_slot(slot).unwrap();
        assert_eq!(
            (after.partition, after.epoch, after.addr.as_str()),
            (before.partition, moved.epoch, "127.0.0.1:9999")
        );
        // The same record again, or the old one, changes nothing.
        assert!(!r.patch(moved.clone(), "127.0.0.1:9999".into()));
        assert!(!r.patch(map.partitions[&before.partition].clone(), "x:1".into()));
    }

    #[test]
    fn a_split_child_leaves_a_gap_until_the_base_catches_up() {
        let (r, map) = router();
        let slot = key_hash_slot(b"foo");
        let parent = map.partitions[&r.locate_slot(slot).unwrap().partition].clone();
        let (first, end) = parent.slot_span();
        let mid = first + (end - first) / 2;
        let mut right = parent.clone();
        right.id = map.next_partition_id;
        right.start = Bytes::copy_from_slice(&slot_bound(mid));
        right.epoch = Epoch(parent.epoch.0 + 1);
        let mut left = parent.clone();
        left.end = Some(right.start.clone());
        left.epoch = right.epoch;
        assert!(r.patch(right.clone(), "127.0.0.1:7003".into()));
        assert_eq!(r.locate_slot(mid).unwrap().partition, right.id);
        assert_eq!(
            r.locate_slot(first),
            None,
            "left half unknown until the watch"
        );
        // The store's map with the split supersedes the patch.
        let mut next = map.clone();
        next.apply(
            MapVersion(map.version.0 + 1),
            &[
                MapChange::UpsertPartition(left.clone()),
                MapChange::UpsertPartition(right.clone()),
                MapChange::ReservePartitionIds {
                    next: PartitionId(right.id.0 + 1),
                },
            ],
        )
        .unwrap();
        r.install_base(next);
        assert_eq!(r.locate_slot(first).unwrap().partition, left.id);
        assert_eq!(r.lock().patches.len(), 0, "superseded patch dropped");
    }

    #[test]
    fn a_patch_newer_than_the_base_survives_a_base_update() {
        let (r, map) = router();
        let slot = key_hash_slot(b"bar");
        let pid = r.locate_slot(slot).unwrap().partition;
        let mut moved = map.partitions[&pid].clone();
        moved.owner = NodeId(2);
        moved.epoch = Epoch(moved.epoch.0 + 1);
        assert!(r.patch(moved.clone(), "127.0.0.1:7002".into()));
        let mut next = map.clone();
        next.apply(MapVersion(map.version.0 + 1), &[]).unwrap();
        r.install_base(next);
        assert_eq!(r.locate_slot(slot).unwrap().epoch, moved.epoch);
    }
}
