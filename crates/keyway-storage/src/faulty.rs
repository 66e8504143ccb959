//! [`FaultyEngine`]: an [`Engine`] wrapper that injects storage faults, for
//! tests and for a node started with `--fault-injection`.
//!
//! Two faults (and a third, [`FaultyEngine::fail_truncation_syncs`]: a
//! truncation whose own fsync fails, as fjall's can):
//!
//! * **fsync failure**: [`FaultyEngine::fail_syncs`] makes every later
//!   `sync()` fail, [`FaultyEngine::fail_next_syncs`] the next `n`;
//!   [`FaultyEngine::heal`] clears it. Calls and failures are counted
//!   ([`FaultyEngine::state`]). A failed sync returns
//!   [`StorageError::Io`] without calling the inner engine's sync.
//! * **machine crash** (only for an engine built with
//!   [`FaultyEngine::crashable`] or [`FaultyEngine::recover`]):
//!   [`FaultyEngine::crash`] returns the state a restart would see, which
//!   holds **exactly** the writes covered by a successful `sync()`, and
//!   nothing after.
//!
//! # Crash model
//!
//! A crashable engine keeps two [`MemEngine`]s: the *live* one, which every
//! call reads and writes (the page cache, as the process sees it), and the
//! *durable* one (the disk). Every state-changing call (`apply`,
//! `apply_foreign`, `truncate_log`, `delete_range_chunk`) is applied to the
//! live engine and recorded in a *pending* list, under one mutex so the list
//! is in the live engine's order. A successful `sync()` replays the pending
//! list onto the durable engine and clears it; the replay must produce the
//! same seqs and counts as the live calls did (engines are deterministic:
//! the same calls on the same state give the same result), which is
//! asserted. `crash()` hands out the durable engine: what was pending is
//! lost, as a power cut loses every page not yet fsynced. This is the
//! harshest crash a real engine may suffer (fjall may keep some unsynced
//! batches, never a partial one), so a test passing against it cannot be
//! relying on luck.
//!
//! A **failed** sync freezes the durable state for good: what was pending
//! and everything written later never reaches the durable engine, even if a
//! later sync succeeds. This is what fsyncgate taught: after a failed fsync
//! the kernel may have dropped the dirty pages (marked clean, not written),
//! so a later successful fsync proves nothing about them, and a journal with
//! a hole is replayed only up to the hole.
//!
//! After `crash()` every call fails (a crashed machine answers nothing); a
//! restart is a new engine: [`FaultyEngine::recover`] of the returned state.
//!
//! With no fault set, a `FaultyEngine` is a correct [`Engine`] (it passes
//! [`crate::conformance`], crashable or wrapping another engine).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::digest::RangeDigest;
use crate::engine::{Engine, ScanChunk};
use crate::error::StorageError;
use crate::mem::MemEngine;
use crate::range::KeyRange;
use crate::value::{ChangeRecord, Mutation, Seq};

/// How `sync()` behaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncFault {
    /// Syncs reach the inner engine.
    None,
    /// The next `n` syncs fail, later ones reach the inner engine.
    Next(u64),
    /// Every sync fails from now on.
    Always,
}

/// What [`FaultyEngine::state`] reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultState {
    pub sync_fault: SyncFault,
    /// `sync()` calls so far.
    pub sync_calls: u64,
    /// `sync()` calls that failed (injected or from the inner engine).
    pub sync_failures: u64,
    /// Whether this engine models a machine crash ([`FaultyEngine::crashable`]).
    pub crashable: bool,
    /// Whether [`FaultyEngine::crash`] was called.
    pub crashed: bool,
    /// Whether a failed sync froze the durable state (crashable only).
    pub durable_frozen: bool,
}

/// A state-changing call, kept until a sync makes it durable.
enum Op {
    Apply(Vec<Mutation>, Seq),
    Foreign(Vec<ChangeRecord>, Seq),
    Truncate(Seq),
    KeepLog(bool, Seq),
    DeleteRange(KeyRange, usize, usize),
}

struct CrashModel {
    durable: MemEngine,
    pending: Vec<Op>,
    /// A sync failed: nothing more becomes durable.
    frozen: bool,
}

/// An [`Engine`] with injectable faults; see the module docs.
pub struct FaultyEngine {
    live: Arc<dyn Engine>,
    sync_fault: Mutex<SyncFault>,
    sync_calls: AtomicU64,
    sync_failures: AtomicU64,
    crashed: AtomicBool,
    /// [`FaultyEngine::fail_truncation_syncs`].
    truncation_sync_fails: AtomicBool,
    /// `Some` for a crashable engine.
    crash: Option<Mutex<CrashModel>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn injected(what: &str) -> StorageError {
    StorageError::Io(std::io::Error::other(format!(
        "{what} (injected by FaultyEngine)"
    )))
}

impl FaultyEngine {
    /// Wraps `inner`: fsync faults only (no crash model).
    pub fn wrap(inner: Arc<dyn Engine>) -> Self {
        Self::build(inner, None)
    }

    /// An empty crashable engine (live and durable state in memory).
    pub fn crashable() -> Self {
        Self::recover(MemEngine::new())
    }

    /// A crashable engine restarted on `durable` (what [`FaultyEngine::crash`]
    /// returned): the live state starts as a copy of it.
    pub fn recover(durable: MemEngine) -> Self {
        let live: Arc<dyn Engine> = Arc::new(durable.snapshot());
        Self::build(
            live,
            Some(Mutex::new(CrashModel {
                durable,
                pending: Vec::new(),
                frozen: false,
            })),
        )
    }

    fn build(live: Arc<dyn Engine>, crash: Option<Mutex<CrashModel>>) -> Self {
        FaultyEngine {
            live,
            sync_fault: Mutex::new(SyncFault::None),
            sync_calls: AtomicU64::new(0),
            sync_failures: AtomicU64::new(0),
            crashed: AtomicBool::new(false),
            truncation_sync_fails: AtomicBool::new(false),
            crash,
        }
    }

    /// Every later `sync()` fails.
    pub fn fail_syncs(&self) {
        *lock(&self.sync_fault) = SyncFault::Always;
    }

    /// The next `n` `sync()` calls fail (`0` = none).
    pub fn fail_next_syncs(&self, n: u64) {
        *lock(&self.sync_fault) = if n == 0 {
            SyncFault::None
        } else {
            SyncFault::Next(n)
        };
    }

    /// Every later `truncate_log` fails with [`StorageError::SyncFailed`]
    /// before it truncates anything, as a fjall engine's does when the fsync
    /// that makes the new log start durable fails.
    pub fn fail_truncation_syncs(&self) {
        self.truncation_sync_fails.store(true, Ordering::SeqCst);
    }

    /// Later syncs reach the inner engine again. (A crashable engine's
    /// durable state stays frozen if a sync already failed: see the module docs.)
    pub fn heal(&self) {
        *lock(&self.sync_fault) = SyncFault::None;
    }

    pub fn state(&self) -> FaultState {
        FaultState {
            sync_fault: *lock(&self.sync_fault),
            sync_calls: self.sync_calls.load(Ordering::SeqCst),
            sync_failures: self.sync_failures.load(Ordering::SeqCst),
            crashable: self.crash.is_some(),
            crashed: self.crashed.load(Ordering::SeqCst),
            durable_frozen: self.crash.as_ref().is_some_and(|c| lock(c).frozen),
        }
    }

    /// Models a machine crash: from now on every call fails, and the
    /// returned engine holds what a restart finds on disk (every write
    /// covered by a successful sync, nothing else). `None` if this engine is
    /// not crashable or already crashed.
    pub fn crash(&self) -> Option<MemEngine> {
        let model = self.crash.as_ref()?;
        let mut model = lock(model);
        if self.crashed.swap(true, Ordering::SeqCst) {
            return None;
        }
        model.pending.clear();
        Some(std::mem::take(&mut model.durable))
    }

    fn check_up(&self) -> Result<(), StorageError> {
        if self.crashed.load(Ordering::SeqCst) {
            Err(injected("engine crashed"))
        } else {
            Ok(())
        }
    }

    /// Runs a state-changing call on the live engine and records it.
    fn write<T: Copy>(
        &self,
        call: impl FnOnce(&dyn Engine) -> Result<T, StorageError>,
        record: impl FnOnce(T) -> Op,
    ) -> Result<T, StorageError> {
        self.check_up()?;
        let Some(model) = &self.crash else {
            return call(&*self.live);
        };
        let mut model = lock(model);
        // Checked again under the lock: a crash may have happened meanwhile.
        self.check_up()?;
        let out = call(&*self.live)?;
        if !model.frozen {
            model.pending.push(record(out));
        }
        Ok(out)
    }

    fn sync_fault_fires(&self) -> bool {
        let mut fault = lock(&self.sync_fault);
        match *fault {
            SyncFault::None => false,
            SyncFault::Always => true,
            SyncFault::Next(n) => {
                *fault = if n > 1 {
                    SyncFault::Next(n - 1)
                } else {
                    SyncFault::None
                };
                true
            }
        }
    }
}

/// Replays `op` on `durable`, asserting it has the effect it had on the live engine.
fn replay(durable: &MemEngine, op: Op) {
    const LIVE_OK: &str = "replaying a call that succeeded live";
    match op {
        Op::Apply(m, seq) => assert_eq!(durable.apply(&m).expect(LIVE_OK), seq, "replayed apply"),
        Op::Foreign(r, seq) => assert_eq!(
            durable.apply_foreign(&r).expect(LIVE_OK),
            seq,
            "replayed foreign apply"
        ),
        Op::Truncate(upto) => durable.truncate_log(upto).expect(LIVE_OK),
        Op::KeepLog(keep, seq) => assert_eq!(
            durable.keep_log(keep).expect(LIVE_OK),
            seq,
            "replayed keep_log"
        ),
        Op::DeleteRange(range, limit, n) => assert_eq!(
            durable.delete_range_chunk(&range, limit).expect(LIVE_OK),
            n,
            "replayed range delete"
        ),
    }
}

impl Engine for FaultyEngine {
    fn get(&self, key: &[u8]) -> Result<Option<crate::Value>, StorageError> {
        self.check_up()?;
        self.live.get(key)
    }

    fn apply(&self, mutations: &[Mutation]) -> Result<Seq, StorageError> {
        self.write(
            |e| e.apply(mutations),
            |seq| Op::Apply(mutations.to_vec(), seq),
        )
    }

    fn sync(&self) -> Result<(), StorageError> {
        self.sync_calls.fetch_add(1, Ordering::SeqCst);
        let result = self.sync_inner();
        if result.is_err() {
            self.sync_failures.fetch_add(1, Ordering::SeqCst);
        }
        result
    }

    fn flush_deferred(&self) -> Result<(), StorageError> {
        self.check_up()?;
        self.live.flush_deferred()
    }

    fn last_seq(&self) -> Seq {
        self.live.last_seq()
    }

    fn scan(
        &self,
        range: &KeyRange,
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<ScanChunk, StorageError> {
        self.check_up()?;
        self.live.scan(range, after, limit)
    }

    fn scan_rev(
        &self,
        range: &KeyRange,
        before: Option<&[u8]>,
        limit: usize,
    ) -> Result<ScanChunk, StorageError> {
        self.check_up()?;
        self.live.scan_rev(range, before, limit)
    }

    fn changes_since(&self, after: Seq, limit: usize) -> Result<Vec<ChangeRecord>, StorageError> {
        self.check_up()?;
        self.live.changes_since(after, limit)
    }

    fn recent_changes(
        &self,
        after: Seq,
        limit: usize,
    ) -> Option<Result<Vec<ChangeRecord>, StorageError>> {
        if let Err(e) = self.check_up() {
            return Some(Err(e));
        }
        self.live.recent_changes(after, limit)
    }

    fn log_start(&self) -> Seq {
        self.live.log_start()
    }

    fn log_bytes(&self) -> u64 {
        self.live.log_bytes()
    }

    fn foreign_reads_skipped(&self) -> u64 {
        self.live.foreign_reads_skipped()
    }

    fn memory(&self) -> crate::EngineMemory {
        self.live.memory()
    }

    fn reclaim_space(&self) -> Result<(), StorageError> {
        self.check_up()?;
        self.live.reclaim_space()
    }

    fn truncate_log(&self, upto: Seq) -> Result<(), StorageError> {
        if self.truncation_sync_fails.load(Ordering::SeqCst) {
            return Err(StorageError::SyncFailed(
                "truncation fsync (injected by FaultyEngine)".into(),
            ));
        }
        self.write(|e| e.truncate_log(upto), |()| Op::Truncate(upto))
    }

    fn keep_log(&self, keep: bool) -> Result<Seq, StorageError> {
        self.write(|e| e.keep_log(keep), |seq| Op::KeepLog(keep, seq))
    }

    fn log_kept(&self) -> bool {
        self.live.log_kept()
    }

    fn delete_range_chunk(&self, range: &KeyRange, limit: usize) -> Result<usize, StorageError> {
        self.write(
            |e| e.delete_range_chunk(range, limit),
            |n| Op::DeleteRange(range.clone(), limit, n),
        )
    }

    fn digest(&self, range: &KeyRange) -> Result<(RangeDigest, Seq), StorageError> {
        self.check_up()?;
        self.live.digest(range)
    }

    fn written_digests(
        &self,
        range: &KeyRange,
        after: Seq,
        part_keys: usize,
    ) -> Result<crate::WrittenDigests, StorageError> {
        self.check_up()?;
        self.live.written_digests(range, after, part_keys)
    }

    fn range_stats(&self, range: &KeyRange) -> Result<(u64, u64), StorageError> {
        self.check_up()?;
        self.live.range_stats(range)
    }

    fn apply_foreign(&self, records: &[ChangeRecord]) -> Result<Seq, StorageError> {
        self.write(
            |e| e.apply_foreign(records),
            |seq| Op::Foreign(records.to_vec(), seq),
        )
    }
}

impl FaultyEngine {
    fn sync_inner(&self) -> Result<(), StorageError> {
        self.check_up()?;
        let Some(model) = &self.crash else {
            if self.sync_fault_fires() {
                return Err(injected("fsync failed"));
            }
            return self.live.sync();
        };
        // Held throughout, so no write slips between the live sync and the replay.
        let mut model = lock(model);
        self.check_up()?;
        let result = if self.sync_fault_fires() {
            Err(injected("fsync failed"))
        } else {
            self.live.sync()
        };
        if result.is_err() {
            model.frozen = true;
            model.pending.clear();
            return result;
        }
        if !model.frozen {
            let pending = std::mem::take(&mut model.pending);
            for op in pending {
                replay(&model.durable, op);
            }
            assert_eq!(
                model.durable.last_seq(),
                self.live.last_seq(),
                "durable state caught up with live at a successful sync"
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn put(k: &str, v: &str) -> Mutation {
        Mutation::Put {
            key: Bytes::copy_from_slice(k.as_bytes()),
            kind: crate::ValueKind::String,
            expire_at_ms: None,
            data: Bytes::copy_from_slice(v.as_bytes()),
        }
    }

    fn data(e: &dyn Engine, k: &str) -> Option<Bytes> {
        e.get(k.as_bytes()).unwrap().map(|v| v.data)
    }

    #[test]
    fn a_crash_keeps_exactly_the_synced_writes() {
        let e = FaultyEngine::crashable();
        e.apply(&[put("a", "1")]).unwrap();
        e.apply(&[put("b", "1")]).unwrap();
        e.sync().unwrap();
        e.apply(&[put("a", "2")]).unwrap();
        e.apply(&[Mutation::Delete {
            key: Bytes::from_static(b"b"),
        }])
        .unwrap();
        e.apply(&[put("c", "1")]).unwrap();
        assert_eq!(data(&e, "a").as_deref(), Some(&b"2"[..]));
        let disk = e.crash().unwrap();
        assert!(e.get(b"a").is_err(), "a crashed engine answers nothing");
        assert!(e.apply(&[put("d", "1")]).is_err());
        assert_eq!(data(&disk, "a").as_deref(), Some(&b"1"[..]));
        assert_eq!(data(&disk, "b").as_deref(), Some(&b"1"[..]));
        assert_eq!(data(&disk, "c"), None);
        assert_eq!(disk.last_seq(), 2);

        // A restart continues from the durable state, seqs included.
        let again = FaultyEngine::recover(disk);
        assert_eq!(again.apply(&[put("c", "2")]).unwrap(), 3);
        again.sync().unwrap();
        let disk = again.crash().unwrap();
        assert_eq!(data(&disk, "c").as_deref(), Some(&b"2"[..]));
        assert_eq!(data(&disk, "a").as_deref(), Some(&b"1"[..]));
    }

    #[test]
    fn a_failed_sync_freezes_the_durable_state_for_good() {
        let e = FaultyEngine::crashable();
        e.apply(&[put("a", "1")]).unwrap();
        e.sync().unwrap();
        e.fail_next_syncs(1);
        e.apply(&[put("a", "2")]).unwrap();
        assert!(e.sync().is_err());
        assert!(e.state().durable_frozen);
        // The page cache still shows the write...
        assert_eq!(data(&e, "a").as_deref(), Some(&b"2"[..]));
        // ...and a later successful sync proves nothing about it.
        e.apply(&[put("b", "1")]).unwrap();
        e.sync().unwrap();
        let s = e.state();
        assert_eq!((s.sync_calls, s.sync_failures), (3, 1));
        let disk = e.crash().unwrap();
        assert_eq!(data(&disk, "a").as_deref(), Some(&b"1"[..]));
        assert_eq!(data(&disk, "b"), None);
    }

    #[test]
    fn sync_faults_count_and_heal_on_a_wrapped_engine() {
        let e = FaultyEngine::wrap(Arc::new(MemEngine::new()));
        assert!(e.crash().is_none(), "a wrapped engine models no crash");
        e.sync().unwrap();
        e.fail_next_syncs(2);
        assert!(e.sync().is_err());
        assert!(e.sync().is_err());
        e.sync().unwrap();
        e.fail_syncs();
        assert!(e.sync().is_err());
        assert_eq!(e.state().sync_fault, SyncFault::Always);
        e.heal();
        e.sync().unwrap();
        let s = e.state();
        assert_eq!((s.sync_calls, s.sync_failures), (6, 3));
        assert!(!s.crashable && !s.crashed);
        // Writes and reads pass through untouched.
        e.apply(&[put("k", "v")]).unwrap();
        assert_eq!(data(&e, "k").as_deref(), Some(&b"v"[..]));
    }

    #[test]
    fn truncation_and_range_drops_are_durable_only_after_a_sync() {
        let e = FaultyEngine::crashable();
        for i in 0..10 {
            e.apply(&[put(&format!("k{i}"), "v")]).unwrap();
        }
        e.sync().unwrap();
        e.truncate_log(5).unwrap();
        let all = KeyRange::new(Bytes::from_static(b"k"), Some(Bytes::from_static(b"l")));
        assert_eq!(e.delete_range_chunk(&all, 4).unwrap(), 4);
        let disk = e.crash().unwrap();
        assert_eq!(disk.log_start(), 1);
        assert_eq!(disk.range_stats(&all).unwrap().0, 10);

        let e = FaultyEngine::recover(disk);
        e.truncate_log(5).unwrap();
        assert_eq!(e.delete_range_chunk(&all, 4).unwrap(), 4);
        e.sync().unwrap();
        let disk = e.crash().unwrap();
        assert_eq!(disk.log_start(), 6);
        assert_eq!(disk.range_stats(&all).unwrap().0, 6);
    }
}
