//! Fail-stop after an fsync failure ("fsyncgate").
//!
//! When an fsync fails, the kernel may already have dropped the dirty pages
//! it could not write (Linux marks them clean and reports the error once), so
//! the page cache can hold writes that are not, and never will be, on disk;
//! a later fsync that succeeds proves nothing about them. fjall poisons its
//! database on a journal write failure for the same reason. A node therefore
//! treats the first failed sync as the end of its storage:
//!
//! * [`StorageHealth`] latches the failure (once, with its reason), logs it
//!   at error level once, and exports it (`keyway_storage_failed` = 1 in
//!   `/metrics`, `"storage": "failed: ..."` in `/status`).
//! * [`FailStopEngine`] wraps the node's engine: from the failure on, every
//!   engine call that reads or writes data fails with
//!   [`StorageError::Failed`] carrying [`refusal`]'s text, and `sync` never
//!   reaches the inner engine again. So the node refuses client writes,
//!   **and reads** (a read could return a write that is only in the page
//!   cache: acknowledging it would report a non-durable write), peer calls
//!   (foreign apply, snapshot and change-log reads of a migration) and its
//!   own background work, without each call site knowing about fsync.
//! * The executor, which owns the group-commit rule, turns every reply of a
//!   group in flight at the failure into an error (see `executor.rs`), and
//!   after the failure releases no reply that read the engine.
//!
//! Not done here: the node keeps its lease and its partitions in the map.
//! Moving partitions off a node whose storage failed is the manager's work
//! (and needs a copy that is durable somewhere else: replicas); until then
//! its partitions are unavailable, which is the safe failure.

use keyway_storage::{ChangeRecord, Engine, KeyRange, Mutation, RangeDigest, ScanChunk, Seq};
use keyway_storage::{StorageError, Value};
use prometheus_client::metrics::gauge::Gauge;
use std::sync::{Arc, OnceLock};

/// The error every data command gets once storage has failed.
pub fn refusal(reason: &str) -> String {
    format!(
        "storage failed ({reason}); this node no longer serves reads or writes (restart it on healthy storage)"
    )
}

/// Whether this node's storage has failed, and why; latched for good.
#[derive(Default)]
pub struct StorageHealth {
    failed: OnceLock<String>,
    /// `keyway_storage_failed`: 0, or 1 after the failure.
    pub gauge: Gauge,
}

impl StorageHealth {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Latches the failure; only the first reason is kept and logged.
    pub fn fail(&self, reason: String) {
        let mut first = false;
        self.failed.get_or_init(|| {
            first = true;
            reason
        });
        if first {
            self.gauge.set(1);
            tracing::error!(
                reason = %self.failed.get().map(String::as_str).unwrap_or_default(),
                "storage failed: this node stops serving reads and writes for good"
            );
        }
    }

    /// The reason, once storage has failed.
    pub fn failure(&self) -> Option<&str> {
        self.failed.get().map(String::as_str)
    }

    /// `/status`'s `storage` field: `"ok"` or `"failed: <reason>"`.
    pub fn status(&self) -> String {
        match self.failure() {
            None => "ok".into(),
            Some(why) => format!("failed: {why}"),
        }
    }

    fn check(&self) -> Result<(), StorageError> {
        match self.failure() {
            None => Ok(()),
            Some(why) => Err(StorageError::Failed(refusal(why))),
        }
    }
}

/// The node's engine behind the fail-stop latch; see the module docs.
pub struct FailStopEngine {
    inner: Arc<dyn Engine>,
    health: Arc<StorageHealth>,
}

impl FailStopEngine {
    pub fn new(inner: Arc<dyn Engine>, health: Arc<StorageHealth>) -> Self {
        FailStopEngine { inner, health }
    }
}

impl Engine for FailStopEngine {
    fn get(&self, key: &[u8]) -> Result<Option<Value>, StorageError> {
        self.health.check()?;
        self.inner.get(key)
    }

    fn apply(&self, mutations: &[Mutation]) -> Result<Seq, StorageError> {
        self.health.check()?;
        self.inner.apply(mutations)
    }

    fn sync(&self) -> Result<(), StorageError> {
        self.health.check()?;
        self.inner.sync().inspect_err(|err| {
            self.health.fail(format!("fsync error: {err}"));
        })
    }

    fn flush_deferred(&self) -> Result<(), StorageError> {
        self.health.check()?;
        self.inner.flush_deferred().inspect_err(|err| {
            self.health.fail(format!("journal write error: {err}"));
        })
    }

    fn last_seq(&self) -> Seq {
        self.inner.last_seq()
    }

    fn scan(
        &self,
        range: &KeyRange,
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<ScanChunk, StorageError> {
        self.health.check()?;
        self.inner.scan(range, after, limit)
    }

    fn scan_rev(
        &self,
        range: &KeyRange,
        before: Option<&[u8]>,
        limit: usize,
    ) -> Result<ScanChunk, StorageError> {
        self.health.check()?;
        self.inner.scan_rev(range, before, limit)
    }

    fn changes_since(&self, after: Seq, limit: usize) -> Result<Vec<ChangeRecord>, StorageError> {
        self.health.check()?;
        self.inner.changes_since(after, limit)
    }

    fn recent_changes(
        &self,
        after: Seq,
        limit: usize,
    ) -> Option<Result<Vec<ChangeRecord>, StorageError>> {
        if let Err(e) = self.health.check() {
            return Some(Err(e));
        }
        self.inner.recent_changes(after, limit)
    }

    fn log_start(&self) -> Seq {
        self.inner.log_start()
    }

    fn log_bytes(&self) -> u64 {
        self.inner.log_bytes()
    }

    fn foreign_reads_skipped(&self) -> u64 {
        self.inner.foreign_reads_skipped()
    }

    fn memory(&self) -> keyway_storage::EngineMemory {
        self.inner.memory()
    }

    fn reclaim_space(&self) -> Result<(), StorageError> {
        self.health.check()?;
        self.inner.reclaim_space()
    }

    fn truncate_log(&self, upto: Seq) -> Result<(), StorageError> {
        self.health.check()?;
        // fjall fsyncs the truncation itself (see `FjallEngine::purge_log`).
        self.inner.truncate_log(upto).inspect_err(|err| {
            if matches!(err, StorageError::SyncFailed(_)) {
                self.health.fail(format!("fsync error: {err}"));
            }
        })
    }

    fn keep_log(&self, keep: bool) -> Result<Seq, StorageError> {
        self.health.check()?;
        // Turning records off truncates the log whole, with its own fsync.
        self.inner.keep_log(keep).inspect_err(|err| {
            if matches!(err, StorageError::SyncFailed(_)) {
                self.health.fail(format!("fsync error: {err}"));
            }
        })
    }

    fn log_kept(&self) -> bool {
        self.inner.log_kept()
    }

    fn delete_range_chunk(&self, range: &KeyRange, limit: usize) -> Result<usize, StorageError> {
        self.health.check()?;
        self.inner.delete_range_chunk(range, limit)
    }

    fn digest(&self, range: &KeyRange) -> Result<(RangeDigest, Seq), StorageError> {
        self.health.check()?;
        self.inner.digest(range)
    }

    fn written_digests(
        &self,
        range: &KeyRange,
        after: Seq,
        part_keys: usize,
    ) -> Result<keyway_storage::WrittenDigests, StorageError> {
        self.health.check()?;
        self.inner.written_digests(range, after, part_keys)
    }

    fn range_stats(&self, range: &KeyRange) -> Result<(u64, u64), StorageError> {
        self.health.check()?;
        self.inner.range_stats(range)
    }

    fn apply_foreign(&self, records: &[ChangeRecord]) -> Result<Seq, StorageError> {
        self.health.check()?;
        self.inner.apply_foreign(records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyway_storage::{FaultyEngine, MemEngine};

    #[test]
    fn the_first_failed_sync_stops_every_data_call_for_good() {
        let faulty = Arc::new(FaultyEngine::wrap(Arc::new(MemEngine::new())));
        let health = StorageHealth::new();
        let e = FailStopEngine::new(faulty.clone(), health.clone());
        let k = bytes::Bytes::from_static(b"k");
        e.apply(&[Mutation::Delete { key: k.clone() }]).unwrap();
        e.sync().unwrap();
        assert_eq!(health.status(), "ok");
        faulty.fail_next_syncs(1);
        assert!(e.sync().is_err());
        faulty.heal();
        // A later sync would succeed below, but proves nothing: still failed.
        let err = e.sync().unwrap_err().to_string();
        assert!(err.contains("storage failed (fsync error"), "{err}");
        assert!(e.get(&k).is_err());
        assert!(e.apply(&[Mutation::Delete { key: k }]).is_err());
        assert!(e.scan(&KeyRange::all(), None, 1).is_err());
        assert!(e.changes_since(0, 1).is_err());
        assert_eq!(faulty.state().sync_calls, 2, "never synced the inner again");
        assert_eq!(health.gauge.get(), 1);
        assert!(health.status().starts_with("failed: fsync error"));
    }

    #[test]
    fn a_failed_fsync_inside_a_log_truncation_stops_the_node_too() {
        let faulty = Arc::new(FaultyEngine::wrap(Arc::new(MemEngine::new())));
        let health = StorageHealth::new();
        let e = FailStopEngine::new(faulty.clone(), health.clone());
        let k = bytes::Bytes::from_static(b"k");
        e.apply(&[Mutation::Delete { key: k.clone() }]).unwrap();
        e.truncate_log(1).unwrap();
        assert_eq!(health.status(), "ok");
        e.apply(&[Mutation::Delete { key: k.clone() }]).unwrap();
        faulty.fail_truncation_syncs();
        assert!(e.truncate_log(2).is_err());
        let err = e.get(&k).unwrap_err().to_string();
        assert!(err.contains("storage failed (fsync error"), "{err}");
        assert_eq!(health.gauge.get(), 1);
    }
}
