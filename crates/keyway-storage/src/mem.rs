//! [`MemEngine`]: the in-memory engine (tests, simulations, ephemeral nodes).
//!
//! Three `BTreeMap`s and the log behind one `Mutex`; every call is trivially
//! consistent. `sync` is a no-op and nothing survives a drop.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use bytes::Bytes;

use crate::digest::{Digester, RangeDigest};
use crate::engine::{Engine, ScanChunk};
use crate::error::StorageError;
use crate::range::KeyRange;
use crate::value::{ChangeRecord, Mutation, Seq, StoredValue, Value, check_mutation};
use crate::versioning::{Marker, Plan, Planner, StateSource, Write};

#[derive(Clone, Default)]
struct State {
    data: BTreeMap<Bytes, StoredValue>,
    markers: BTreeMap<Bytes, Marker>,
    /// Seq -> (mutation, its batch continues).
    log: BTreeMap<Seq, (Mutation, bool)>,
    last_seq: Seq,
    log_start: Seq,
    log_bytes: u64,
    /// [`Engine::keep_log`]`(false)` is in force: records are not kept.
    log_off: bool,
}

impl StateSource for State {
    fn load_value(&self, key: &[u8]) -> Result<Option<StoredValue>, StorageError> {
        Ok(self.data.get(key).cloned())
    }

    fn load_marker(&self, key: &[u8]) -> Result<Option<Marker>, StorageError> {
        Ok(self.markers.get(key).cloned())
    }
}

impl State {
    fn commit(&mut self, plan: Plan) {
        for w in plan.writes {
            match w {
                Write::PutValue(k, v) => {
                    self.data.insert(k, v);
                }
                Write::DeleteValue(k) => {
                    self.data.remove(&k);
                }
                Write::PutMarker(k, m) => {
                    self.markers.insert(k, m);
                }
                Write::DeleteMarker(k) => {
                    self.markers.remove(&k);
                }
            }
        }
        if self.log_off {
            // Not kept: the log stays truncated whole.
            self.log_start = plan.last_seq + 1;
        } else {
            for r in plan.log {
                self.log_bytes += crate::value::log_record_bytes(&r.mutation);
                self.log.insert(r.seq, (r.mutation, r.batch_continues));
            }
        }
        self.last_seq = plan.last_seq;
    }

    fn live<'a>(
        &'a self,
        range: &'a KeyRange,
        after: Option<&'a [u8]>,
    ) -> impl Iterator<Item = (&'a Bytes, &'a Value)> + 'a {
        range
            .bounds_after(after)
            .into_iter()
            .flat_map(move |b| self.data.range::<[u8], _>(b))
            .map(|(k, sv)| (k, &sv.value))
    }
}

/// In-memory [`Engine`]. `Default` = empty.
pub struct MemEngine {
    state: Mutex<State>,
    last_seq: AtomicU64,
}

impl Default for MemEngine {
    fn default() -> Self {
        Self::new()
    }
}

impl MemEngine {
    /// An empty engine (`last_seq() == 0`, `log_start() == 1`).
    pub fn new() -> Self {
        MemEngine {
            state: Mutex::new(State {
                log_start: 1,
                ..State::default()
            }),
            last_seq: AtomicU64::new(0),
        }
    }

    /// An independent copy of this engine's whole state (data, version
    /// markers, change log, seqs): what [`crate::FaultyEngine`] restarts from.
    pub fn snapshot(&self) -> MemEngine {
        let st = self.lock().clone();
        let last_seq = AtomicU64::new(st.last_seq);
        MemEngine {
            state: Mutex::new(st),
            last_seq,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Commits are infallible in-memory updates computed beforehand, so a
        // panic elsewhere cannot leave a half-applied batch: ignore poisoning.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Drops the records `<= upto` (clamped to the last seq).
    fn truncate(st: &mut State, upto: Seq) {
        let upto = upto.min(st.last_seq);
        if upto < st.log_start {
            return;
        }
        let kept = st.log.split_off(&(upto + 1));
        let dropped: u64 = st
            .log
            .values()
            .map(|(m, _)| crate::value::log_record_bytes(m))
            .sum();
        st.log = kept;
        st.log_bytes -= dropped;
        st.log_start = upto + 1;
    }

    fn run(
        &self,
        f: impl FnOnce(&mut Planner<'_, State>) -> Result<(), StorageError>,
    ) -> Result<Seq, StorageError> {
        let mut st = self.lock();
        let plan = {
            let mut planner = Planner::new(&*st, st.last_seq);
            f(&mut planner)?;
            planner.finish()
        };
        st.commit(plan);
        self.last_seq.store(st.last_seq, Ordering::Release);
        Ok(st.last_seq)
    }
}

impl Engine for MemEngine {
    fn get(&self, key: &[u8]) -> Result<Option<Value>, StorageError> {
        Ok(self.lock().data.get(key).map(|sv| sv.value.clone()))
    }

    fn apply(&self, mutations: &[Mutation]) -> Result<Seq, StorageError> {
        for m in mutations {
            check_mutation(m)?;
        }
        self.run(|p| mutations.iter().try_for_each(|m| p.local(m)))
    }

    fn sync(&self) -> Result<(), StorageError> {
        Ok(())
    }

    fn flush_deferred(&self) -> Result<(), StorageError> {
        // Nothing is buffered on the way to the OS: there is no OS copy.
        Ok(())
    }

    fn last_seq(&self) -> Seq {
        self.last_seq.load(Ordering::Acquire)
    }

    fn scan(
        &self,
        range: &KeyRange,
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<ScanChunk, StorageError> {
        if limit == 0 {
            return Err(StorageError::InvalidArgument("scan limit must be > 0"));
        }
        let st = self.lock();
        let mut it = st.live(range, after);
        let entries: Vec<(Bytes, Value)> = it
            .by_ref()
            .take(limit)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let next = if entries.len() == limit && it.next().is_some() {
            entries.last().map(|(k, _)| k.clone())
        } else {
            None
        };
        Ok(ScanChunk {
            entries,
            next,
            seq: st.last_seq,
        })
    }

    fn scan_rev(
        &self,
        range: &KeyRange,
        before: Option<&[u8]>,
        limit: usize,
    ) -> Result<ScanChunk, StorageError> {
        if limit == 0 {
            return Err(StorageError::InvalidArgument("scan limit must be > 0"));
        }
        let st = self.lock();
        let mut it = range
            .bounds_before(before)
            .into_iter()
            .flat_map(|b| st.data.range::<[u8], _>(b).rev());
        let entries: Vec<(Bytes, Value)> = it
            .by_ref()
            .take(limit)
            .map(|(k, sv)| (k.clone(), sv.value.clone()))
            .collect();
        let next = if entries.len() == limit && it.next().is_some() {
            entries.last().map(|(k, _)| k.clone())
        } else {
            None
        };
        Ok(ScanChunk {
            entries,
            next,
            seq: st.last_seq,
        })
    }

    /// Everything is in memory here.
    fn recent_changes(
        &self,
        after: Seq,
        limit: usize,
    ) -> Option<Result<Vec<ChangeRecord>, StorageError>> {
        Some(self.changes_since(after, limit))
    }

    fn changes_since(&self, after: Seq, limit: usize) -> Result<Vec<ChangeRecord>, StorageError> {
        let st = self.lock();
        if after.saturating_add(1) < st.log_start {
            return Err(StorageError::LogTruncated {
                after,
                log_start: st.log_start,
            });
        }
        if after >= st.last_seq {
            return Ok(Vec::new());
        }
        // Up to `limit` records, then on to the end of the last one's batch.
        let mut out: Vec<ChangeRecord> = Vec::new();
        for (&seq, (m, continues)) in st.log.range(after + 1..) {
            if out.len() >= limit && out.last().is_none_or(|r| !r.batch_continues) {
                break;
            }
            out.push(ChangeRecord {
                seq,
                mutation: m.clone(),
                batch_continues: *continues,
            });
        }
        Ok(out)
    }

    fn log_start(&self) -> Seq {
        self.lock().log_start
    }

    fn written_digests(
        &self,
        range: &KeyRange,
        after: Seq,
        part_keys: usize,
    ) -> Result<crate::engine::WrittenDigests, StorageError> {
        let st = self.lock();
        if after.saturating_add(1) < st.log_start {
            return Err(StorageError::LogTruncated {
                after,
                log_start: st.log_start,
            });
        }
        let keys: std::collections::BTreeSet<Bytes> = st
            .log
            .range(after + 1..)
            .map(|(_, (m, _))| m.key())
            .filter(|k| range.contains(k))
            .cloned()
            .collect();
        crate::engine::WrittenDigests::build(
            st.last_seq,
            keys.into_iter().collect(),
            part_keys,
            |k| Ok(st.data.get(k).map(|sv| sv.value.clone())),
        )
    }

    fn keep_log(&self, keep: bool) -> Result<Seq, StorageError> {
        let mut st = self.lock();
        if keep && st.log_off {
            st.log_off = false;
            st.log_start = st.last_seq + 1;
        } else if !keep && !st.log_off {
            st.log_off = true;
            let last = st.last_seq;
            Self::truncate(&mut st, last);
        }
        Ok(st.last_seq)
    }

    fn log_kept(&self) -> bool {
        !self.lock().log_off
    }

    fn truncate_log(&self, upto: Seq) -> Result<(), StorageError> {
        Self::truncate(&mut self.lock(), upto);
        Ok(())
    }

    fn log_bytes(&self) -> u64 {
        self.lock().log_bytes
    }

    fn delete_range_chunk(&self, range: &KeyRange, limit: usize) -> Result<usize, StorageError> {
        if limit == 0 {
            return Err(StorageError::InvalidArgument("delete limit must be > 0"));
        }
        let mut st = self.lock();
        let Some(bounds) = range.bounds_after(None) else {
            return Ok(0);
        };
        let keys: Vec<Bytes> = st
            .data
            .range::<[u8], _>(bounds)
            .map(|(k, _)| k.clone())
            .take(limit)
            .collect();
        let markers: Vec<Bytes> = st
            .markers
            .range::<[u8], _>(bounds)
            .map(|(k, _)| k.clone())
            .take(limit - keys.len())
            .collect();
        for k in &keys {
            st.data.remove(k);
        }
        for k in &markers {
            st.markers.remove(k);
        }
        Ok(keys.len() + markers.len())
    }

    fn digest(&self, range: &KeyRange) -> Result<(RangeDigest, Seq), StorageError> {
        let st = self.lock();
        let mut d = Digester::new();
        for (k, v) in st.live(range, None) {
            d.add(k, v);
        }
        Ok((d.finish(), st.last_seq))
    }

    fn range_stats(&self, range: &KeyRange) -> Result<(u64, u64), StorageError> {
        let st = self.lock();
        Ok(st.live(range, None).fold((0, 0), |(n, b), (k, v)| {
            (
                n + u64::from(v.kind.is_user_key()),
                b + (k.len() + v.data.len()) as u64,
            )
        }))
    }

    fn apply_foreign(&self, records: &[ChangeRecord]) -> Result<Seq, StorageError> {
        for r in records {
            check_mutation(&r.mutation)?;
        }
        self.run(|p| records.iter().try_for_each(|r| p.foreign(r)))
    }
}
