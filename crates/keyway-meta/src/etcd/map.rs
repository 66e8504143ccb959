//! The map in etcd: reading it whole at one revision, `changes_since` from
//! the history keys, and the commit transaction.
//!
//! A commit reads the whole map (one range read), checks the transaction's
//! conditions and the resulting map's validity on it, and sends ONE etcd
//! transaction:
//!
//! ```text
//! IF   mod_revision(<p>/map/meta) == read                 (nothing committed since)
//!  AND mod_revision(<p>/map/partition/<c>) == read, for every condition c
//! THEN put/delete every record the changes touch,
//!      put <p>/map/meta {version+1, next_partition_id},
//!      put <p>/history/<version+1> (token, changes),
//!      delete <p>/history/ up to version+1-history_versions,
//!      [put <p>/map/next_node_id]
//! ```
//!
//! A failed compare means another commit landed first: re-read and decide
//! again (a condition that no longer holds is a `Conflict`). With more
//! conditions than etcd allows compares (`--max-txn-ops`), the per-partition
//! compares become one range compare over `<p>/map/partition/` (no record
//! modified after the read), which implies them. More writes than
//! `--max-txn-ops` are grouped into nested transactions (still one atomic
//! transaction).
//!
//! A transaction that got no answer may or may not have been applied; the
//! commit then re-reads and looks for its random token in the history entry
//! of the version it would have produced before deciding anything else, so
//! a commit is applied at most once and reports whether it was.

use super::Inner;
use super::conn::{CallError, MAX_DECODE_BYTES};
use super::layout::{self, MapKey, Meta, Token};
use crate::{MapTxn, MapUpdate, MetaError, MigrationPut};
use etcd_client::{Compare, CompareOp, DeleteOptions, GetOptions, GetResponse, Txn, TxnOp};
use keyway_map::{MapChange, MapVersion, PartitionId, PartitionMap};
use std::collections::{BTreeMap, HashMap};

/// How many times a commit re-reads after losing a race before giving up.
const MAX_RACES: usize = 1_000;
/// How many transactions of one commit may end with their outcome unknown.
const MAX_UNKNOWN: usize = 5;
/// How many times a read retries when etcd compacted the revision it reads at.
const MAX_COMPACTED: usize = 5;

/// The map as read at one etcd revision, with what a commit compares.
#[derive(Debug)]
pub(super) struct Snapshot {
    pub map: PartitionMap,
    /// The etcd revision the map was read at.
    pub revision: i64,
    /// Mod revision of `<p>/map/meta` (0: absent, the empty map).
    pub meta_mod: i64,
    /// The next node id to allocate.
    pub next_node_id: u64,
    /// Mod revision of every partition record.
    pub partition_mods: HashMap<PartitionId, i64>,
}

/// What a commit decides after looking at the current map.
pub(super) enum Step<T> {
    /// Nothing to commit; the call's answer.
    Done(T),
    /// Commit `txn` (and set the node-id allocator), answering `result`.
    Commit {
        txn: MapTxn,
        next_node_id: Option<u64>,
        result: T,
    },
}

/// An answer to `changes_since`, and where a watch continues from.
#[derive(Debug)]
pub(super) struct Changes {
    pub update: MapUpdate,
    /// The etcd revision the answer was read at: a watch continues after it.
    pub revision: i64,
    /// The map version a reader has after applying `update`.
    pub version: MapVersion,
}

/// A read at a fixed revision failed.
enum ReadError {
    /// etcd compacted the revision: read again at a newer one.
    Compacted,
    Failed(MetaError),
}

impl From<MetaError> for ReadError {
    fn from(e: MetaError) -> Self {
        ReadError::Failed(e)
    }
}

fn read_error(what: &str, e: CallError) -> ReadError {
    if e.is_compacted() {
        ReadError::Compacted
    } else {
        ReadError::Failed(e.into_meta(what))
    }
}

fn corrupt(key: &[u8], why: impl std::fmt::Display) -> MetaError {
    MetaError::Internal(format!(
        "corrupt metadata at etcd key {:?}: {why}",
        String::from_utf8_lossy(key)
    ))
}

fn header_revision(resp: &GetResponse) -> Result<i64, MetaError> {
    resp.header()
        .map(|h| h.revision())
        .ok_or_else(|| MetaError::Internal("etcd answered a read without a header".into()))
}

impl Inner {
    /// A repeatable range read (failing over between members).
    pub(super) async fn get(
        &self,
        what: &str,
        key: impl Into<Vec<u8>>,
        options: GetOptions,
    ) -> Result<GetResponse, CallError> {
        let key = key.into();
        self.conn
            .call(what, true, |c| {
                let key = key.clone();
                let options = options.clone();
                async move {
                    let mut kv = c.kv_client().max_decoding_message_size(MAX_DECODE_BYTES);
                    kv.get(key, Some(options)).await
                }
            })
            .await
    }

    /// The whole map with one range read of `<p>/map/` (at `revision`, or
    /// the current one), validated.
    pub(super) async fn read_snapshot(&self, revision: Option<i64>) -> Result<Snapshot, MetaError> {
        for _ in 0..MAX_COMPACTED {
            match self.try_read_snapshot(revision).await {
                Err(ReadError::Compacted) if revision.is_none() => continue,
                Err(ReadError::Compacted) => {
                    return Err(MetaError::Internal(
                        "etcd compacted the revision the map was to be read at".into(),
                    ));
                }
                Err(ReadError::Failed(e)) => return Err(e),
                Ok(snap) => return Ok(snap),
            }
        }
        Err(MetaError::Unavailable(
            "etcd kept compacting the map while it was read".into(),
        ))
    }

    async fn try_read_snapshot(&self, revision: Option<i64>) -> Result<Snapshot, ReadError> {
        const WHAT: &str = "read the partition map";
        let mut options = GetOptions::new().with_prefix();
        if let Some(rev) = revision {
            options = options.with_revision(rev);
        }
        let resp = self
            .get(WHAT, self.layout.map_prefix(), options)
            .await
            .map_err(|e| read_error(WHAT, e))?;
        // At an explicit revision the header carries the current one.
        let revision = match revision {
            Some(rev) => rev,
            None => header_revision(&resp)?,
        };
        let mut meta = None;
        let mut next_node_id = 1;
        let (mut keyspaces, mut nodes, mut partitions) = (Vec::new(), Vec::new(), Vec::new());
        let mut partition_mods = HashMap::new();
        for kv in resp.kvs() {
            let key = kv.key();
            let Some(what) = self.layout.parse_map_key(key) else {
                tracing::warn!(key = %String::from_utf8_lossy(key), "ignoring an unknown key under the map prefix");
                continue;
            };
            match what {
                MapKey::Meta => {
                    let m = layout::decode_meta(kv.value()).map_err(|e| corrupt(key, e))?;
                    meta = Some((m, kv.mod_revision()));
                }
                MapKey::NextNodeId => {
                    next_node_id =
                        layout::decode_counter(kv.value()).map_err(|e| corrupt(key, e))?;
                }
                MapKey::Keyspace(id) => match layout::decode_record(kv.value()) {
                    Ok(MapChange::UpsertKeyspace(k)) if k.id == id => keyspaces.push(k),
                    Ok(other) => return Err(corrupt(key, format!("holds {other:?}")).into()),
                    Err(e) => return Err(corrupt(key, e).into()),
                },
                MapKey::Node(id) => match layout::decode_record(kv.value()) {
                    Ok(MapChange::UpsertNode(n)) if n.id == id => nodes.push(n),
                    Ok(other) => return Err(corrupt(key, format!("holds {other:?}")).into()),
                    Err(e) => return Err(corrupt(key, e).into()),
                },
                MapKey::Partition(id) => match layout::decode_record(kv.value()) {
                    Ok(MapChange::UpsertPartition(p)) if p.id == id => {
                        partition_mods.insert(id, kv.mod_revision());
                        partitions.push(p);
                    }
                    Ok(other) => return Err(corrupt(key, format!("holds {other:?}")).into()),
                    Err(e) => return Err(corrupt(key, e).into()),
                },
            }
        }
        let (meta, meta_mod) = match meta {
            Some(found) => found,
            None if keyspaces.is_empty() && nodes.is_empty() && partitions.is_empty() => {
                (Meta::default(), 0)
            }
            None => {
                return Err(ReadError::Failed(MetaError::Internal(format!(
                    "etcd holds map records under {} but no {}",
                    self.layout.map_prefix(),
                    self.layout.meta_key()
                ))));
            }
        };
        let map = PartitionMap::from_parts(
            MapVersion(meta.version),
            PartitionId(meta.next_partition_id),
            keyspaces,
            nodes,
            partitions,
        );
        map.validate().map_err(|e| {
            MetaError::Internal(format!(
                "the map stored in etcd under {} is invalid: {e}",
                self.layout.prefix()
            ))
        })?;
        Ok(Snapshot {
            map,
            revision,
            meta_mod,
            next_node_id: next_node_id.max(1),
            partition_mods,
        })
    }

    /// See [`crate::MetaStore::changes_since`]: reads the current version,
    /// then the history after `since` at the same revision.
    pub(super) async fn changes_since(&self, since: MapVersion) -> Result<Changes, MetaError> {
        for _ in 0..MAX_COMPACTED {
            match self.try_changes_since(since).await {
                Err(ReadError::Compacted) => continue,
                Err(ReadError::Failed(e)) => return Err(e),
                Ok(changes) => return Ok(changes),
            }
        }
        Err(MetaError::Unavailable(
            "etcd kept compacting the history while it was read".into(),
        ))
    }

    async fn try_changes_since(&self, since: MapVersion) -> Result<Changes, ReadError> {
        const WHAT: &str = "read the map version";
        let resp = self
            .get(WHAT, self.layout.meta_key(), GetOptions::new())
            .await
            .map_err(|e| read_error(WHAT, e))?;
        let revision = header_revision(&resp)?;
        let current = match resp.kvs().first() {
            Some(kv) => {
                layout::decode_meta(kv.value())
                    .map_err(|e| corrupt(kv.key(), e))?
                    .version
            }
            None => 0,
        };
        let full = |snap: Snapshot| Changes {
            version: snap.map.version,
            revision: snap.revision,
            update: MapUpdate::Full(snap.map),
        };
        if since.0 == current {
            return Ok(Changes {
                update: MapUpdate::Delta(Vec::new()),
                revision,
                version: since,
            });
        }
        if since.0 > current || current - since.0 > self.opts.history_versions as u64 {
            return Ok(full(self.try_read_snapshot(Some(revision)).await?));
        }
        const HISTORY: &str = "read the map history";
        let resp = self
            .get(
                HISTORY,
                self.layout.history_key(since.0 + 1),
                GetOptions::new()
                    .with_range(self.layout.history_key(current + 1))
                    .with_revision(revision),
            )
            .await
            .map_err(|e| read_error(HISTORY, e))?;
        let mut entries = Vec::with_capacity(resp.kvs().len());
        for (kv, want) in resp.kvs().iter().zip(since.0 + 1..) {
            if self.layout.parse_history_key(kv.key()) != Some(want) {
                // A gap: that history was trimmed.
                return Ok(full(self.try_read_snapshot(Some(revision)).await?));
            }
            let entry = layout::decode_history(kv.value()).map_err(|e| corrupt(kv.key(), e))?;
            entries.push((MapVersion(want), entry.changes));
        }
        if entries.len() as u64 != current - since.0 {
            return Ok(full(self.try_read_snapshot(Some(revision)).await?));
        }
        Ok(Changes {
            update: MapUpdate::Delta(entries),
            revision,
            version: MapVersion(current),
        })
    }

    /// Runs one commit: reads the map, asks `decide` what to do with it,
    /// checks and sends the transaction, and repeats after a lost race or an
    /// unknown outcome. Returns the version committed (or current, for
    /// [`Step::Done`]) and `decide`'s result.
    pub(super) async fn commit_with<T>(
        &self,
        decide: impl FnMut(&Snapshot) -> Result<Step<T>, MetaError>,
    ) -> Result<(MapVersion, T), MetaError> {
        self.commit_with_record(None, decide).await
    }

    /// [`Self::commit_with`], with a migration record's compare-and-set in
    /// the same etcd transaction when `put` is given (checked before the
    /// map's conditions; the record carries the commit's token, so an
    /// attempt whose answer was lost is recognised by either).
    pub(super) async fn commit_with_record<T>(
        &self,
        put: Option<&MigrationPut>,
        mut decide: impl FnMut(&Snapshot) -> Result<Step<T>, MetaError>,
    ) -> Result<(MapVersion, T), MetaError> {
        let token: Token = rand::random();
        // Versions an attempt with an unknown outcome would have produced.
        let mut unknown: BTreeMap<u64, T> = BTreeMap::new();
        let mut unknown_attempts = 0;
        for _ in 0..MAX_RACES {
            let snap = self.read_snapshot(None).await?;
            if let Some(done) = self.find_own_commit(&snap, &token, &mut unknown).await? {
                return Ok(done);
            }
            let (txn, next_node_id, result) = match decide(&snap)? {
                Step::Done(result) => return Ok((snap.map.version, result)),
                Step::Commit {
                    txn,
                    next_node_id,
                    result,
                } => (txn, next_node_id, result),
            };
            let record = match put {
                None => None,
                Some(put) => match self.migration_guard(put, &token).await? {
                    // Our attempt landed after `snap` was read: read again.
                    None => continue,
                    Some(guard) => Some(guard),
                },
            };
            for cond in &txn.conditions {
                if !cond.holds(&snap.map) {
                    return Err(MetaError::Conflict {
                        partition: cond.partition,
                        current: snap
                            .map
                            .partitions
                            .get(&cond.partition)
                            .map(|p| (p.owner, p.epoch)),
                    });
                }
            }
            let version = MapVersion(snap.map.version.0 + 1);
            let mut next = snap.map.clone();
            next.apply(version, &txn.changes)?;
            next.validate()?;
            let etcd_txn = self.commit_txn(&snap, &txn, &next, &token, next_node_id, record)?;
            let sent = self
                .conn
                .call("commit a map change", false, |c| {
                    let t = etcd_txn.clone();
                    async move { c.kv_client().txn(t).await }
                })
                .await;
            #[cfg(test)]
            let sent = self.faults.lose_commit_answer(sent);
            match sent {
                Ok(resp) if resp.succeeded() => return Ok((version, result)),
                // Another commit landed after our read: look again.
                Ok(_) => continue,
                Err(CallError::Unavailable(why)) => {
                    unknown_attempts += 1;
                    if unknown_attempts >= MAX_UNKNOWN {
                        return Err(MetaError::Unavailable(format!(
                            "commit: outcome unknown after {unknown_attempts} attempts: {why}"
                        )));
                    }
                    unknown.insert(version.0, result);
                }
                Err(e) => return Err(e.into_meta("the map commit")),
            }
        }
        Err(MetaError::Unavailable(format!(
            "commit: lost the race to concurrent commits {MAX_RACES} times"
        )))
    }

    /// Settles attempts whose outcome was unknown, now that `snap` shows
    /// which versions exist: our token in a version's history entry means
    /// that attempt was applied.
    async fn find_own_commit<T>(
        &self,
        snap: &Snapshot,
        token: &Token,
        unknown: &mut BTreeMap<u64, T>,
    ) -> Result<Option<(MapVersion, T)>, MetaError> {
        let settled: Vec<u64> = unknown
            .keys()
            .copied()
            .filter(|v| *v <= snap.map.version.0)
            .collect();
        let (Some(&first), Some(&last)) = (settled.first(), settled.last()) else {
            return Ok(None);
        };
        const WHAT: &str = "look up an earlier commit attempt";
        // History entries never change once written (only trimming deletes
        // them), so the current revision is as good as the snapshot's.
        let resp = self
            .get(
                WHAT,
                self.layout.history_key(first),
                GetOptions::new().with_range(self.layout.history_key(last + 1)),
            )
            .await
            .map_err(|e| e.into_meta(WHAT))?;
        let mut found = HashMap::new();
        for kv in resp.kvs() {
            if let Some(v) = self.layout.parse_history_key(kv.key()) {
                let entry = layout::decode_history(kv.value()).map_err(|e| corrupt(kv.key(), e))?;
                found.insert(v, entry.token);
            }
        }
        for v in settled {
            let result = unknown.remove(&v).expect("a settled version is in the map");
            match found.get(&v) {
                Some(t) if t == token => return Ok(Some((MapVersion(v), result))),
                Some(_) => {}
                None => {
                    return Err(MetaError::Unavailable(format!(
                        "commit: outcome unknown (the history of version {v} is already trimmed)"
                    )));
                }
            }
        }
        Ok(None)
    }

    /// The etcd transaction committing `txn` (which turns `snap.map` into
    /// `next`).
    fn commit_txn(
        &self,
        snap: &Snapshot,
        txn: &MapTxn,
        next: &PartitionMap,
        token: &Token,
        next_node_id: Option<u64>,
        record: Option<(Compare, TxnOp)>,
    ) -> Result<Txn, MetaError> {
        let l = &self.layout;
        let max_ops = self.opts.max_txn_ops;
        let mut compares = vec![Compare::mod_revision(
            l.meta_key(),
            CompareOp::Equal,
            snap.meta_mod,
        )];
        let mut record_put = None;
        if let Some((compare, put)) = record {
            compares.push(compare);
            record_put = Some(put);
        }
        let mut conditioned: Vec<PartitionId> =
            txn.conditions.iter().map(|c| c.partition).collect();
        conditioned.sort_unstable();
        conditioned.dedup();
        // The compares so far plus one per condition must fit.
        if conditioned.len() + compares.len() <= max_ops {
            compares.extend(conditioned.iter().map(|id| {
                let read = snap.partition_mods.get(id).copied().unwrap_or(0);
                Compare::mod_revision(l.partition_key(*id), CompareOp::Equal, read)
            }));
        } else {
            // No partition record modified since the read: implies each
            // per-partition compare (absent ones stay absent: only commits,
            // which move the meta key, create records).
            compares.push(
                Compare::mod_revision(l.partition_prefix(), CompareOp::Less, snap.revision + 1)
                    .with_prefix(),
            );
        }

        // Every record the changes touch, with its value in `next` (None: delete).
        let mut records: BTreeMap<String, Option<Vec<u8>>> = BTreeMap::new();
        for change in &txn.changes {
            let (key, value) = match change {
                MapChange::UpsertPartition(p) => (
                    l.partition_key(p.id),
                    next.partitions.get(&p.id).map(layout::encode_partition),
                ),
                MapChange::RemovePartition { id } => (
                    l.partition_key(*id),
                    next.partitions.get(id).map(layout::encode_partition),
                ),
                MapChange::UpsertNode(n) => (
                    l.node_key(n.id),
                    next.nodes.get(&n.id).map(layout::encode_node),
                ),
                MapChange::RemoveNode { id } => {
                    (l.node_key(*id), next.nodes.get(id).map(layout::encode_node))
                }
                MapChange::UpsertKeyspace(k) => (
                    l.keyspace_key(k.id),
                    next.keyspaces.get(&k.id).map(layout::encode_keyspace),
                ),
                MapChange::RemoveKeyspace { id } => (
                    l.keyspace_key(*id),
                    next.keyspaces.get(id).map(layout::encode_keyspace),
                ),
                MapChange::ReservePartitionIds { .. } => continue,
            };
            records.insert(key, value);
        }
        let mut ops: Vec<TxnOp> = records
            .into_iter()
            .map(|(key, value)| match value {
                Some(v) => TxnOp::put(key, v, None),
                None => TxnOp::delete(key, None),
            })
            .collect();
        let version = next.version.0;
        let meta = Meta {
            version,
            next_partition_id: next.next_partition_id.0,
        };
        ops.push(TxnOp::put(l.meta_key(), layout::encode_meta(&meta), None));
        ops.extend(record_put);
        ops.push(TxnOp::put(
            l.history_key(version),
            layout::encode_history(token, &txn.changes),
            None,
        ));
        let keep = self.opts.history_versions as u64;
        if version > keep {
            // Trim: keep versions version-keep+1 ..= version.
            ops.push(TxnOp::delete(
                l.history_key(0),
                Some(DeleteOptions::new().with_range(l.history_key(version - keep + 1))),
            ));
        }
        if let Some(n) = next_node_id {
            ops.push(TxnOp::put(
                l.next_node_key(),
                layout::encode_counter(n),
                None,
            ));
        }
        let writes = ops.len();
        let group = |ops: Vec<TxnOp>| TxnOp::txn(Txn::new().and_then(ops));
        let ops = nest(ops, max_ops, compares.len(), &group).ok_or_else(|| {
            MetaError::InvalidArgument(format!(
                "the commit needs {writes} etcd writes, more than one transaction can hold \
                 under --max-txn-ops={max_ops}, even nested"
            ))
        })?;
        Ok(Txn::new().when(compares).and_then(ops))
    }
}

/// How deep [`nest`] may nest transactions.
const MAX_NESTING: usize = 3;

/// Fits `ops` into a transaction level that may hold `budget` operations
/// and already holds `compares` compares, grouping them (`group` wraps a
/// list in one compare-less, so always applied, nested transaction) as
/// shallowly as possible when they do not fit flat.
///
/// etcd 3.4 checks `--max-txn-ops` per level, and gives a nested transaction
/// the budget its parent has left: `budget - max(compares, ops at that
/// level)`. `None` if even nesting cannot hold them.
fn nest<T: Clone>(
    ops: Vec<T>,
    budget: usize,
    compares: usize,
    group: &impl Fn(Vec<T>) -> T,
) -> Option<Vec<T>> {
    (0..=MAX_NESTING).find_map(|depth| nest_at(&ops, budget, compares, depth, group))
}

fn nest_at<T: Clone>(
    ops: &[T],
    budget: usize,
    compares: usize,
    depth: usize,
    group: &impl Fn(Vec<T>) -> T,
) -> Option<Vec<T>> {
    if ops.len() <= budget && compares <= budget {
        return Some(ops.to_vec());
    }
    if depth == 0 {
        return None;
    }
    for k in 2..=budget {
        let inner = budget.saturating_sub(compares.max(k));
        if inner == 0 {
            break;
        }
        let per = ops.len().div_ceil(k);
        if per <= capacity(inner, depth - 1) {
            return ops
                .chunks(per)
                .map(|chunk| nest_at(chunk, inner, 0, depth - 1, group).map(group))
                .collect();
        }
    }
    None
}

/// How many operations a compare-less level with `budget` holds, nested at
/// most `depth` deep.
fn capacity(budget: usize, depth: usize) -> usize {
    match depth {
        0 => budget,
        1 => budget.max((budget / 2) * (budget - budget / 2)),
        _ => (2..budget)
            .map(|k| k.saturating_mul(capacity(budget - k, depth - 1)))
            .fold(budget, usize::max),
    }
}

#[cfg(test)]
impl super::Faults {
    fn lose_commit_answer<T>(&self, sent: Result<T, CallError>) -> Result<T, CallError> {
        use std::sync::atomic::Ordering;
        let lose = self
            .lose_commit_answers
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        match sent {
            Ok(_) if lose => Err(CallError::Unavailable("injected: answer lost".into())),
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance;
    use crate::{EtcdMeta, MetaStore};
    use keyway_map::NodeId;
    use std::sync::atomic::Ordering;

    /// etcd applied the transaction but the answer never came (the member
    /// died right after): the commit finds its token in the history and
    /// reports the version, applied once, instead of a Conflict (for a
    /// conditional flip) or a second application (for the rest).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_commit_whose_answer_is_lost_is_applied_once_and_reported() {
        let etcd = keyway_testkit::EtcdCluster::start(1)
            .unwrap_or_else(|e| panic!("cannot start etcd: {e}"));
        let store = EtcdMeta::connect(&etcd.url("/unit/lost-answer"))
            .await
            .unwrap();
        let lose_next = || {
            store
                .inner
                .faults
                .lose_commit_answers
                .store(1, Ordering::SeqCst)
        };
        let map = conformance::bootstrapped(&store, 2, 2).await;
        let p = map.partitions.values().next().unwrap().clone();
        let to = *map.nodes.keys().find(|n| **n != p.owner).unwrap();

        lose_next();
        let v = store.commit(conformance::flip(&p, to)).await.unwrap();
        assert_eq!(v, MapVersion(map.version.0 + 1));
        let after = store.get_map().await.unwrap();
        assert_eq!((after.version, after.partitions[&p.id].owner), (v, to));

        lose_next();
        let v2 = store.commit(MapTxn::default()).await.unwrap();
        assert_eq!(v2, MapVersion(v.0 + 1), "applied once");
        assert_eq!(store.get_map().await.unwrap().version, v2);

        lose_next();
        let id = store
            .register_node(None, "c:1".into(), "c:2".into())
            .await
            .unwrap();
        assert_eq!(id, NodeId(3));
        assert_eq!(
            store.register_node(None, "d:1".into(), "d:2".into()).await,
            Ok(NodeId(4)),
            "no id skipped or reused"
        );
        assert_eq!(store.get_map().await.unwrap().version.0, v2.0 + 2);
        assert_eq!(
            store
                .inner
                .faults
                .lose_commit_answers
                .load(Ordering::SeqCst),
            0
        );
    }

    /// A nested op list: a leaf operation or a nested transaction.
    #[derive(Clone, Debug, PartialEq)]
    enum Shape {
        Op,
        Txn(Vec<Shape>),
    }

    /// etcd 3.4's check: every level within the budget its parent left.
    fn fits(level: &[Shape], budget: usize, compares: usize) -> bool {
        let opc = compares.max(level.len());
        opc <= budget
            && level.iter().all(|s| match s {
                Shape::Op => true,
                Shape::Txn(inner) => fits(inner, budget - opc, 0),
            })
    }

    fn count(level: &[Shape]) -> usize {
        level
            .iter()
            .map(|s| match s {
                Shape::Op => 1,
                Shape::Txn(inner) => count(inner),
            })
            .sum()
    }

    #[test]
    fn nesting_keeps_every_level_within_the_budget_its_parent_left() {
        let ops = |n: usize| vec![Shape::Op; n];
        let group = |ops: Vec<Shape>| Shape::Txn(ops);
        for (n, budget, compares, levels) in [
            (4, 4, 2, 0),
            (153, 128, 2, 1),
            (4_000, 128, 2, 1),
            (20_000, 128, 2, 2),
            (11, 8, 2, 1),
            (15, 8, 2, 1),
            (17, 8, 2, 2),
        ] {
            let s = nest(ops(n), budget, compares, &group).unwrap();
            assert!(fits(&s, budget, compares), "{n} ops in {budget}");
            assert_eq!(count(&s), n);
            let depth = |s: &[Shape]| -> usize {
                fn d(s: &[Shape]) -> usize {
                    s.iter()
                        .map(|x| match x {
                            Shape::Op => 0,
                            Shape::Txn(i) => 1 + d(i),
                        })
                        .max()
                        .unwrap_or(0)
                }
                d(s)
            };
            assert_eq!(depth(&s), levels, "{n} ops in {budget}");
        }
        assert!(
            nest(ops(11), 4, 2, &group).is_none(),
            "too many even nested"
        );
    }
}
