//! In-memory nodes for the driver tests: each node is a `BTreeMap` of keys
//! with a change-log seq; a push copies the source's range into the target
//! (lazily, on status polls). Every node "installed" the latest map: a
//! partition view reads the metadata store. Faults are switched at run time.

use crate::driver::{MigrationPeers, PeerAddr};
use bytes::Bytes;
use keyway_map::{Epoch, NodeId, PartitionId};
use keyway_meta::{EmbeddedMeta, MetaStore};
use keyway_peer::{
    FenceDigests, MigrationRef, PartitionView, PeerError, PushSpec, PushStatus, RefusalReason,
};
use keyway_storage::{KeyRange, RangeDigest, Seq};
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What goes wrong, switchable while a migration runs.
#[derive(Clone, Debug, Default)]
pub(crate) struct Faults {
    /// The copy stops half-way (never done) until cleared.
    pub hold_copy: bool,
    /// The target silently loses this key when it is copied.
    pub lose_on_target: Option<Bytes>,
    /// The source answers `NotFound` to every `migrate_*` call (it restarted).
    pub lose_migration: bool,
    /// This node refuses every drop as owned (what a node answers for a
    /// range it owns).
    pub refuse_drops: Option<NodeId>,
    /// Nodes that are down: every call to them is `Unavailable`.
    pub down: std::collections::BTreeSet<NodeId>,
    /// Nodes that died after the flip: the calls of a cleanup
    /// (`DropRangeChunk`, `PartitionView`, `MigrateStop`) are `Unavailable`.
    pub down_for_cleanup: std::collections::BTreeSet<NodeId>,
}

#[derive(Debug)]
struct Push {
    range: KeyRange,
    target: NodeId,
    /// Keys still to copy (empty once the snapshot is copied).
    pending: Option<Vec<Bytes>>,
    copied_bytes: u64,
    dual: bool,
    fenced: bool,
}

#[derive(Debug, Default)]
struct Node {
    data: BTreeMap<Bytes, Bytes>,
    seq: Seq,
    pushes: BTreeMap<u64, Push>,
}

#[derive(Default)]
struct State {
    nodes: BTreeMap<NodeId, Node>,
    addrs: BTreeMap<String, NodeId>,
    faults: Faults,
    /// Every call, e.g. `n1 fence 3 off`.
    log: Vec<String>,
}

pub(crate) struct FakeCluster {
    meta: Arc<EmbeddedMeta>,
    state: Mutex<State>,
}

/// The fake's range digest: keys, bytes, and a hash of the entries.
fn digest_of(data: &BTreeMap<Bytes, Bytes>, range: &KeyRange) -> RangeDigest {
    let mut d = RangeDigest {
        keys: 0,
        bytes: 0,
        digest: 0,
    };
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for (k, v) in in_range(data, range) {
        d.keys += 1;
        d.bytes += size(k, v);
        (k, v).hash(&mut h);
    }
    d.digest = h.finish();
    d
}

fn in_range<'a>(
    data: &'a BTreeMap<Bytes, Bytes>,
    range: &'a KeyRange,
) -> impl Iterator<Item = (&'a Bytes, &'a Bytes)> {
    data.iter().filter(|(k, _)| range.contains(k))
}

fn size(k: &Bytes, v: &Bytes) -> u64 {
    (k.len() + v.len()) as u64
}

impl FakeCluster {
    pub(crate) fn new(meta: Arc<EmbeddedMeta>, nodes: &[(NodeId, &str)]) -> Arc<Self> {
        let mut state = State::default();
        for (id, addr) in nodes {
            state.nodes.insert(*id, Node::default());
            state.addrs.insert(addr.to_string(), *id);
        }
        Arc::new(FakeCluster {
            meta,
            state: Mutex::new(state),
        })
    }

    /// Adds an (empty) node at `addr`.
    pub(crate) fn add_node(&self, id: NodeId, addr: &str) {
        let mut st = self.lock();
        st.nodes.insert(id, Node::default());
        st.addrs.insert(addr.to_string(), id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    pub(crate) fn set_faults(&self, faults: Faults) {
        self.lock().faults = faults;
    }

    /// A foreground write at `node` (forwarded to a target that dual-writes
    /// or already caught up on a push covering the key).
    pub(crate) fn write(&self, node: NodeId, key: &[u8], value: &[u8]) {
        let mut st = self.lock();
        let (key, value) = (Bytes::copy_from_slice(key), Bytes::copy_from_slice(value));
        let n = st.nodes.get_mut(&node).unwrap();
        n.seq += 1;
        n.data.insert(key.clone(), value.clone());
        let forward: Vec<NodeId> = n
            .pushes
            .values()
            .filter(|p| p.range.contains(&key) && (p.dual || p.pending.is_none()))
            .map(|p| p.target)
            .collect();
        for target in forward {
            let t = st.nodes.get_mut(&target).unwrap();
            t.seq += 1;
            t.data.insert(key.clone(), value.clone());
        }
    }

    /// The entries of `range` at `node`.
    pub(crate) fn entries(&self, node: NodeId, range: &KeyRange) -> Vec<(Bytes, Bytes)> {
        let st = self.lock();
        in_range(&st.nodes[&node].data, range)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Every key at `node`.
    pub(crate) fn len(&self, node: NodeId) -> usize {
        self.lock().nodes[&node].data.len()
    }

    /// Pushes `node` is running.
    pub(crate) fn pushes(&self, node: NodeId) -> usize {
        self.lock().nodes[&node].pushes.len()
    }

    pub(crate) fn log(&self) -> Vec<String> {
        self.lock().log.clone()
    }

    fn note(st: &mut State, node: &PeerAddr, what: String) {
        st.log.push(format!("n{} {what}", node.node.0));
    }

    /// Marks `node` down (every call fails as unreachable) or up again.
    pub(crate) fn set_down(&self, node: NodeId, down: bool) {
        let mut st = self.lock();
        if down {
            st.faults.down.insert(node);
        } else {
            st.faults.down.remove(&node);
        }
    }

    /// `Unavailable` if `node` is down.
    fn reachable(&self, node: &PeerAddr) -> Result<(), PeerError> {
        if self.lock().faults.down.contains(&node.node) {
            return Err(PeerError::Unavailable(format!(
                "node {} is down",
                node.node
            )));
        }
        Ok(())
    }

    /// `Unavailable` if `node` is down, also for the calls of a cleanup.
    fn reachable_for_cleanup(&self, node: &PeerAddr) -> Result<(), PeerError> {
        self.reachable(node)?;
        if self.lock().faults.down_for_cleanup.contains(&node.node) {
            return Err(PeerError::Unavailable(format!("node {} died", node.node)));
        }
        Ok(())
    }

    /// Marks `node` dead for the calls of a cleanup, or back.
    pub(crate) fn set_down_for_cleanup(&self, node: NodeId, down: bool) {
        let mut st = self.lock();
        if down {
            st.faults.down_for_cleanup.insert(node);
        } else {
            st.faults.down_for_cleanup.remove(&node);
        }
    }

    /// Keys (of any range) at `node`.
    pub(crate) fn keys_in(&self, node: NodeId, range: &KeyRange) -> usize {
        let st = self.lock();
        in_range(&st.nodes[&node].data, range).count()
    }

    /// Copies (part of) the snapshot of push `id` at `source`.
    fn advance_copy(st: &mut State, source: NodeId, id: u64) {
        let faults = st.faults.clone();
        let src = st.nodes.get_mut(&source).unwrap();
        let Some(push) = src.pushes.get_mut(&id) else {
            return;
        };
        let Some(pending) = push.pending.as_mut() else {
            return;
        };
        let take = match (faults.hold_copy, push.copied_bytes > 0) {
            (false, _) => pending.len(),
            // Half of the snapshot, then nothing more.
            (true, false) => pending.len().div_ceil(2),
            (true, true) => 0,
        };
        let keys: Vec<Bytes> = pending.drain(..take).collect();
        let done = pending.is_empty() && !faults.hold_copy;
        let mut copied = Vec::new();
        for k in keys {
            if let Some(v) = src.data.get(&k) {
                push.copied_bytes += size(&k, v);
                copied.push((k.clone(), v.clone()));
            }
        }
        if done {
            push.pending = None;
        }
        let target = push.target;
        let t = st.nodes.get_mut(&target).unwrap();
        for (k, v) in copied {
            if faults.lose_on_target.as_ref() != Some(&k) {
                t.seq += 1;
                t.data.insert(k, v);
            }
        }
    }

    fn status(node: &Node, id: u64) -> Result<PushStatus, PeerError> {
        let push = node
            .pushes
            .get(&id)
            .ok_or_else(|| PeerError::NotFound(format!("migration {id}")))?;
        Ok(PushStatus {
            copied_bytes: push.copied_bytes,
            copied_keys: 0,
            copy_done: push.pending.is_none(),
            acked_seq: node.seq,
            head_seq: node.seq,
            dual: push.dual,
            fenced: push.fenced,
            // The copy's cost as a node counts it (every chunk applied).
            copy_bytes_sent: push.copied_bytes,
            copy_bytes_written: push.copied_bytes,
            copy_duration_ms: if push.copied_bytes > 0 { 7 } else { 0 },
            ..PushStatus::default()
        })
    }

    /// The source's push `id`, or `NotFound` (also when it "lost" it).
    fn push_of<'a>(st: &'a mut State, node: &PeerAddr, id: u64) -> Result<&'a mut Push, PeerError> {
        let lost = st.faults.lose_migration;
        st.nodes
            .get_mut(&node.node)
            .unwrap()
            .pushes
            .get_mut(&id)
            .filter(|_| !lost)
            .ok_or_else(|| PeerError::NotFound(format!("migration {id}")))
    }
}

#[async_trait::async_trait]
impl MigrationPeers for FakeCluster {
    async fn last_seq(&self, node: &PeerAddr) -> Result<Seq, PeerError> {
        self.reachable(node)?;
        Ok(self.lock().nodes[&node.node].seq)
    }

    async fn range_stats(
        &self,
        node: &PeerAddr,
        range: &KeyRange,
    ) -> Result<(u64, u64), PeerError> {
        self.reachable(node)?;
        let st = self.lock();
        let entries: Vec<_> = in_range(&st.nodes[&node.node].data, range).collect();
        let bytes = entries.iter().map(|(k, v)| size(k, v)).sum();
        Ok((entries.len() as u64, bytes))
    }

    async fn drop_range_chunk(
        &self,
        node: &PeerAddr,
        migration: &MigrationRef,
        range: &KeyRange,
        limit: usize,
    ) -> Result<u64, PeerError> {
        self.reachable_for_cleanup(node)?;
        let mut st = self.lock();
        Self::note(&mut st, node, "drop".into());
        if st.faults.refuse_drops == Some(node.node) {
            return Err(PeerError::Refused {
                reason: RefusalReason::Owned,
                detail: format!("{migration}: this node owns the range"),
            });
        }
        let n = st.nodes.get_mut(&node.node).unwrap();
        let doomed: Vec<Bytes> = in_range(&n.data, range)
            .map(|(k, _)| k.clone())
            .take(limit)
            .collect();
        for k in &doomed {
            n.data.remove(k);
        }
        Ok(doomed.len() as u64)
    }

    async fn migrate_start(
        &self,
        node: &PeerAddr,
        spec: &PushSpec,
    ) -> Result<PushStatus, PeerError> {
        self.reachable(node)?;
        let mut st = self.lock();
        Self::note(
            &mut st,
            node,
            format!("start {} copy={}", spec.id, spec.copy),
        );
        let target = *st
            .addrs
            .get(&spec.target)
            .ok_or_else(|| PeerError::InvalidArgument(format!("no node at {}", spec.target)))?;
        let n = st.nodes.get_mut(&node.node).unwrap();
        if !n.pushes.contains_key(&spec.id) {
            let pending = spec.copy.then(|| {
                in_range(&n.data, &spec.range)
                    .map(|(k, _)| k.clone())
                    .collect()
            });
            let push = Push {
                range: spec.range.clone(),
                target,
                pending,
                copied_bytes: 0,
                dual: false,
                fenced: false,
            };
            n.pushes.insert(spec.id, push);
        }
        Self::status(n, spec.id)
    }

    async fn migrate_status(&self, node: &PeerAddr, id: u64) -> Result<PushStatus, PeerError> {
        self.reachable(node)?;
        let mut st = self.lock();
        Self::push_of(&mut st, node, id)?;
        Self::advance_copy(&mut st, node.node, id);
        Self::status(&st.nodes[&node.node], id)
    }

    async fn migrate_dual(&self, node: &PeerAddr, id: u64, on: bool) -> Result<Seq, PeerError> {
        self.reachable(node)?;
        let mut st = self.lock();
        Self::note(
            &mut st,
            node,
            format!("dual {id} {}", if on { "on" } else { "off" }),
        );
        Self::push_of(&mut st, node, id)?.dual = on;
        Ok(st.nodes[&node.node].seq)
    }

    async fn migrate_fence(&self, node: &PeerAddr, id: u64, on: bool) -> Result<Seq, PeerError> {
        self.reachable(node)?;
        let mut st = self.lock();
        Self::note(
            &mut st,
            node,
            format!("fence {id} {}", if on { "on" } else { "off" }),
        );
        Self::push_of(&mut st, node, id)?.fenced = on;
        Ok(st.nodes[&node.node].seq)
    }

    /// The fence, then the digests, as the node does them in one call.
    async fn migrate_fence_digests(
        &self,
        node: &PeerAddr,
        id: u64,
    ) -> Result<(Seq, Option<FenceDigests>), PeerError> {
        let seq = self.migrate_fence(node, id, true).await?;
        Ok((seq, Some(self.migrate_digest(node, id).await?)))
    }

    async fn migrate_stop(&self, node: &PeerAddr, id: u64) -> Result<(), PeerError> {
        self.reachable_for_cleanup(node)?;
        let mut st = self.lock();
        Self::note(&mut st, node, format!("stop {id}"));
        st.nodes.get_mut(&node.node).unwrap().pushes.remove(&id);
        Ok(())
    }

    async fn migrate_digest(&self, node: &PeerAddr, id: u64) -> Result<FenceDigests, PeerError> {
        self.reachable(node)?;
        let mut st = self.lock();
        Self::note(&mut st, node, "digest".into());
        let push = Self::push_of(&mut st, node, id)?;
        let (range, target) = (push.range.clone(), push.target);
        Ok(FenceDigests {
            source: digest_of(&st.nodes[&node.node].data, &range),
            target: digest_of(&st.nodes[&target].data, &range),
            incremental: false,
            delta_keys: 0,
        })
    }

    async fn migrate_checkpoint(&self, node: &PeerAddr, id: u64) -> Result<(Seq, bool), PeerError> {
        self.reachable(node)?;
        let mut st = self.lock();
        Self::note(&mut st, node, format!("checkpoint {id}"));
        Self::push_of(&mut st, node, id)?;
        Ok((st.nodes[&node.node].seq, true))
    }

    /// Answers at once whatever `min_epoch` and `wait` say (the driver
    /// waits again until the view is what it wants).
    async fn partition_view(
        &self,
        node: &PeerAddr,
        partition: PartitionId,
        _min_epoch: Epoch,
        _wait: Duration,
    ) -> Result<Option<PartitionView>, PeerError> {
        self.reachable_for_cleanup(node)?;
        let map = self
            .meta
            .get_map()
            .await
            .map_err(|e| PeerError::Unavailable(e.to_string()))?;
        Ok(map.partitions.get(&partition).map(|p| PartitionView {
            owner: p.owner,
            epoch: p.epoch,
            map_version: map.version,
        }))
    }
}
