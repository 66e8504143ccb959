//! [`FjallEngine`]: the durable engine on fjall 3 (an LSM tree with a write-ahead journal).
//!
//! # On-disk layout
//!
//! One fjall database per node directory, four keyspaces:
//!
//! | keyspace     | key                  | value                                   |
//! |--------------|----------------------|-----------------------------------------|
//! | `data`       | routing key          | stored value ([`crate::value`])         |
//! | `tombstones` | routing key          | version marker ([`crate::versioning`])  |
//! | `log`        | seq `u64` BE         | mutation ([`crate::value`])             |
//! | `meta`       | `format`, `log_start`, `log_purged` (`last_seq` in older directories) | `u32`/`u64` BE |
//!
//! Every `apply`/`apply_foreign` is **one** fjall write batch covering the data,
//! markers and log records, so a crash never separates data from its log
//! record. The last seq is not stored: it is the top record of the log at or
//! after `meta/log_start`, or `log_start - 1` when the log is truncated
//! whole (truncation sets `log_start` past the last seq at most, and a seq
//! is assigned only with a log record), so a truncated log never resets the
//! seq counter either. Directories written before this kept a
//! `meta/last_seq` in every batch; it is still read (the highest of the
//! three wins) and no longer written: one memtable insert per batch fewer,
//! about a third of the engine's skiplist inserts under a SET load.
//!
//! # fjall behaviours this relies on (fjall 3.1)
//!
//! * By default the database is opened with `manual_journal_persist(true)`:
//!   a committed batch is encoded into the journal writer's **user-space**
//!   buffer (a `BufWriter` of 8 KiB, fjall's `JOURNAL_BUFFER_BYTES`), which
//!   reaches the OS only when it fills or at [`Engine::sync`]
//!   (`persist(SyncData)`: flush, then fdatasync). So without a sync even a
//!   **process** crash (kill -9, panic=abort, OOM kill) loses the batches
//!   still in that buffer (measured: `tests/process_crash.rs`), and a
//!   machine crash loses every batch not synced; never partially, batches are
//!   atomic in the journal. With [`FjallOptions::flush_journal_each_batch`]
//!   every `apply`/`apply_foreign` batch is committed with
//!   `durability(Some(PersistMode::Buffer))`: fjall flushes it to the OS (one
//!   `write(2)`, no fsync) before `apply` returns, so a process crash loses nothing applied and only a
//!   machine crash loses what was not synced (the node sets it for
//!   `periodic` and `none` durability, whose acknowledgements do not wait for
//!   a sync). On a thread that called
//!   [`crate::defer_os_flush_on_this_thread`] the hand-over waits for the
//!   next [`Engine::flush_deferred`] instead (one `write(2)` per group).
//! * A batch becomes visible to *snapshots* atomically only because every
//!   snapshot is opened under `write_lock` ([`FjallEngine::snapshot`]):
//!   fjall publishes a batch's seqno after inserting all its items, but
//!   lsm-tree 3.1's flushes and compactions publish fresh seqnos without
//!   waiting for a batch in flight. So the last seq published under that
//!   lock when the snapshot opens tells exactly which of our seqs it
//!   reflects (it is not read from the log: records may not be kept, see
//!   `fjall_log.rs`). Plain keyspace
//!   reads (`Keyspace::get/range`) read at `SeqNo::MAX`, i.e. may see a batch
//!   that is being inserted; they are used only for single-key `get` (a key is
//!   written once per batch, so a point read is still atomic) and under the
//!   writer lock, where no batch is in flight.
//! * fjall has no range delete: [`Engine::delete_range_chunk`] deletes key by
//!   key, resuming after the last deleted key to avoid rescanning its own
//!   tombstones, with one final full pass before reporting the range empty.
//! * A long-open snapshot pins old versions: scans page with a fresh snapshot
//!   per chunk; `digest`/`range_stats` hold one snapshot for one range pass.
//! * Disk space after truncation: truncating the log drops the log's tables
//!   that lie wholly below the new `log_start` (lsm-tree's `drop_range`,
//!   reached through fjall's `Keyspace::tree`; no tombstones, so the log
//!   costs one memtable insert per record, not two; the log keyspace uses
//!   FIFO compaction with no limit, so its ordered, never-overlapping tables
//!   are never rewritten either, see `open`). The records of the
//!   memtable and of the one table straddling the cut stay, below
//!   `log_start`, where no read looks, until a later truncation drops their
//!   table. Space also comes back when (a) overwritten data versions are
//!   flushed (versions no snapshot pins are dropped at flush and
//!   compaction; `max_memtable_bytes` keeps that frequent), and (b) a sealed
//!   journal is deleted, which needs every keyspace with data in it flushed
//!   ([`Engine::reclaim_space`] rotates the memtables while sealed journals
//!   exist; fjall itself does so only once the journals exceed
//!   `max_journaling_size_bytes`). The active journal is sealed only once it is past
//!   `journal_rotation_bytes` (upstream fjall 3.1 fixes that at 64 MB;
//!   Keyway's patch in `vendor/fjall` makes it a setting), so each node
//!   keeps up to about that much journal however little it holds.
//! * Writes are serialised by an engine mutex (seq assignment, read-modify-write
//!   of `SetExpiry` and foreign records). `persist` holds fjall's journal
//!   lock only to flush the journal's buffer; the fsync runs outside it
//!   (Keyway's patch in `vendor/fjall`; upstream holds the lock through the
//!   fsync), so applies go on while a `sync` waits for the disk, and a sync
//!   covers every batch committed before it began.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use bytes::Bytes;
use fjall::{
    AbstractTree, Database, Keyspace, KeyspaceCreateOptions, PersistMode, Readable, Snapshot,
};

use crate::change_tail::ChangeTail;
use crate::digest::{Digester, RangeDigest};
use crate::engine::{Engine, EngineMemory, ScanChunk};
use crate::error::StorageError;
pub use crate::fjall_options::FjallOptions;
use crate::log_marks::LogMarks;
use crate::range::{Bounds, KeyRange};
use crate::value::{
    ChangeRecord, MAX_KEY_LEN, Mutation, Seq, StoredValue, Value, check_mutation, corrupt,
};
use crate::version_bounds::VersionBounds;
use crate::versioning::{Marker, Plan, Planner, StateSource, Write};

/// On-disk format number stored in `meta/format`.
pub const FORMAT_VERSION: u32 = 1;

const META_FORMAT: &[u8] = b"format";
/// Written by every batch of directories made before the last seq was
/// derived from the log; read, never written now.
const META_LAST_SEQ: &[u8] = b"last_seq";
const META_LOG_START: &[u8] = b"log_start";
const META_LOG_PURGED: &[u8] = b"log_purged";
/// While records are not kept ([`Engine::keep_log`]), the last seq is not
/// in the log: a batch that passes this seq also writes a new one, that
/// much higher, so a reopen starts above every seq ever handed out.
const META_SEQ_RESERVED: &[u8] = b"seq_reserved";
/// How far ahead of the last seq a reservation reaches: one meta insert per
/// this many writes while records are not kept; a reopen after such a
/// period skips up to this many seqs (seqs need not be dense, only
/// increasing; the log then starts after the skipped ones).
const SEQ_RESERVE: u64 = 1 << 20;

/// fjall's own journal rotation size, used when `journal_rotation_bytes` is unset.
const FJALL_JOURNAL_ROTATION_BYTES: u64 = 64_000_000;

/// Durable [`Engine`] on fjall. See the module docs for layout and guarantees.
pub struct FjallEngine {
    path: PathBuf,
    db: Database,
    data: Keyspace,
    tombstones: Keyspace,
    log: Keyspace,
    meta: Keyspace,
    /// Serialises writers to `data`/`tombstones`/`log` appends/`meta.last_seq`.
    write_lock: Mutex<()>,
    /// Whether `tombstones` may hold a version marker: false while it was
    /// empty at open and no marker has been written since. Set, under
    /// `write_lock`, before the first batch with a marker commits, and never
    /// cleared until the next open; planners read markers only under
    /// `write_lock`, so one that sees it false knows no key has a marker,
    /// and a local write skips the read (a point lookup per write).
    markers_may_exist: AtomicBool,
    /// Serialises truncation (`meta.log_start`, `meta.log_purged`, log table drops).
    truncate_lock: Mutex<()>,
    last_seq: AtomicU64,
    log_start: AtomicU64,
    /// Cumulative log sizes: [`Engine::log_bytes`] is what they retain, and
    /// a purge subtracts what it drops without reading it back
    /// (`log_marks.rs`). Appended under `write_lock`, truncated under
    /// `truncate_lock`.
    log_marks: Mutex<LogMarks>,
    /// Where the previous `delete_range_chunk` of a range stopped.
    delete_cursor: Mutex<Option<(KeyRange, Bytes)>>,
    /// [`FjallOptions::flush_journal_each_batch`].
    flush_each_batch: bool,
    /// A batch was committed without its OS hand-over, deferred to
    /// [`Engine::flush_deferred`]. Set after the batch is in the journal's
    /// buffer, so a flush that clears it covers the batch.
    unflushed: AtomicBool,
    /// The active journal's rotation size (fjall's default when unset).
    journal_rotation_bytes: u64,
    /// The newest change records, appended under `write_lock` before
    /// `last_seq` moves ([`Engine::recent_changes`]).
    tail: ChangeTail,
    /// [`Engine::keep_log`]`(false)` is in force: batches carry no log
    /// records and `log_start` follows `last_seq`. Changed under
    /// `truncate_lock` then `write_lock`; read by commits under `write_lock`.
    log_off: AtomicBool,
    /// The highest `meta/seq_reserved` written (under `write_lock`).
    seq_reserved: AtomicU64,
    /// Ranges with a known upper bound of their versions
    /// (`version_bounds.rs`): tracked by `delete_range_chunk`, raised by
    /// `commit`, read by foreign `Put`s; all under `write_lock`.
    bounds: Mutex<VersionBounds>,
    /// Foreign `Put`s applied without reading their key (`foreign_reads_skipped`).
    foreign_reads_skipped: AtomicU64,
}

/// A snapshot with the seqs it reflects, all taken under `write_lock`.
struct View {
    snap: Snapshot,
    /// The last seq whose batch `snap` shows.
    last_seq: Seq,
    /// The published log start then (it can be ahead of `snap`'s
    /// `meta/log_start` while records are not kept).
    log_start: Seq,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing guarded is left half-updated by a panic (fjall batches are atomic).
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn to_bytes(s: &[u8]) -> Bytes {
    Bytes::copy_from_slice(s)
}

fn decode_u64(what: &'static str, raw: &[u8]) -> Result<u64, StorageError> {
    let arr: [u8; 8] = raw
        .try_into()
        .map_err(|_| corrupt(what, format!("expected 8 bytes, got {}", raw.len())))?;
    Ok(u64::from_be_bytes(arr))
}

impl FjallEngine {
    /// Opens (creating if needed) the engine in `dir`, recovering data,
    /// `last_seq` and `log_start`, and finishing an interrupted log truncation.
    pub fn open(dir: &Path, opts: FjallOptions) -> Result<Self, StorageError> {
        opts.validate()?;
        std::fs::create_dir_all(dir)?;
        let mut builder = Database::builder(dir)
            .manual_journal_persist(true)
            .cache_size(opts.cache_size_bytes)
            .temporary(opts.temporary);
        if let Some(n) = opts.worker_threads {
            builder = builder.worker_threads(n);
        }
        if let Some(j) = opts.max_journaling_size_bytes {
            builder = builder.max_journaling_size(j);
        }
        if let Some(r) = opts.journal_rotation_bytes {
            builder = builder.journal_rotation_size(r);
        }
        let db = builder.open()?;
        let ks_opts = || {
            let o = KeyspaceCreateOptions::default();
            match opts.max_memtable_bytes {
                Some(m) => o.max_memtable_size(m),
                None => o,
            }
        };
        let data = db.keyspace("data", ks_opts)?;
        let tombstones = db.keyspace("tombstones", ks_opts)?;
        // The log is written in seq order and dropped whole tables at a time
        // by truncation (`drop_range`): its tables never overlap, so nothing
        // a compaction could merge or collect. FIFO with no size limit and
        // no age never compacts and never drops (a leveled log may rewrite a
        // record into L1 and below before truncation drops it; no throughput
        // change was measurable, stop 32). Fixed when the keyspace is
        // created: a directory made before keeps its leveled log.
        let log = db.keyspace("log", || {
            ks_opts().compaction_strategy(std::sync::Arc::new(fjall::compaction::Fifo::new(
                u64::MAX,
                None,
            )))
        })?;
        let meta = db.keyspace("meta", ks_opts)?;

        match meta.get(META_FORMAT)? {
            Some(raw) => {
                let found = u32::from_be_bytes(
                    raw.as_ref()
                        .try_into()
                        .map_err(|_| corrupt("meta/format", format!("{} bytes", raw.len())))?,
                );
                if found != FORMAT_VERSION {
                    return Err(StorageError::UnsupportedFormat {
                        found,
                        expected: FORMAT_VERSION,
                    });
                }
            }
            None => {
                if !data.is_empty()? || !log.is_empty()? {
                    return Err(corrupt(
                        "meta/format",
                        "missing in a non-empty database".into(),
                    ));
                }
                let mut b = db.batch();
                b.insert(&meta, META_FORMAT, FORMAT_VERSION.to_be_bytes());
                b.insert(&meta, META_LOG_START, 1u64.to_be_bytes());
                b.commit()?;
                db.persist(PersistMode::SyncData)?;
            }
        }
        let (mut log_start, last_seq, top) = seq_bounds(&db.snapshot(), &meta, &log)?;
        if last_seq >= log_start && top < last_seq {
            // Seqs were handed out without records (`keep_log(false)`), or
            // the newest records are gone: the log holds nothing readable
            // up to the last seq, so it starts after it. Made durable by
            // `drop_log_tables` below, before any table is dropped.
            log_start = last_seq + 1;
            let mut b = db.batch();
            b.insert(&meta, META_LOG_START, log_start.to_be_bytes());
            b.commit()?;
        }
        let seq_reserved = meta
            .get(META_SEQ_RESERVED)?
            .map_or(Ok(0), |raw| decode_u64("meta/seq_reserved", &raw))?;
        let markers_may_exist = AtomicBool::new(!tombstones.is_empty()?);
        let engine = FjallEngine {
            path: dir.to_path_buf(),
            db,
            data,
            tombstones,
            log,
            meta,
            write_lock: Mutex::new(()),
            markers_may_exist,
            truncate_lock: Mutex::new(()),
            last_seq: AtomicU64::new(last_seq),
            log_start: AtomicU64::new(log_start),
            log_marks: Mutex::new(LogMarks::new(log_start - 1)),
            delete_cursor: Mutex::new(None),
            flush_each_batch: opts.flush_journal_each_batch,
            unflushed: AtomicBool::new(false),
            journal_rotation_bytes: opts
                .journal_rotation_bytes
                .unwrap_or(FJALL_JOURNAL_ROTATION_BYTES),
            tail: ChangeTail::new(opts.change_tail_bytes),
            log_off: AtomicBool::new(false),
            seq_reserved: AtomicU64::new(seq_reserved),
            bounds: Mutex::new(VersionBounds::default()),
            foreign_reads_skipped: AtomicU64::new(0),
        };
        {
            let _t = lock(&engine.truncate_lock);
            engine.drop_log_tables(log_start - 1)?;
        }
        // The retained records' sizes, read once at open (the marks).
        {
            let mut marks = lock(&engine.log_marks);
            for record in engine.log_record_sizes(log_start..=last_seq) {
                let (seq, size) = record?;
                marks.appended(seq, size);
            }
            marks.appended(last_seq, 0);
        }
        tracing::debug!(path = %dir.display(), last_seq, log_start, "opened fjall storage engine");
        Ok(engine)
    }

    /// Opens a fresh engine in a new temporary directory that is deleted on drop
    /// (for tests of crates built on the engine).
    pub fn open_temporary(mut opts: FjallOptions) -> Result<Self, StorageError> {
        opts.temporary = true;
        let dir = tempfile::Builder::new()
            .prefix("keyway-storage-")
            .tempdir()?
            .keep();
        Self::open(&dir, opts)
    }

    /// The directory this engine lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Compacts the data keyspace whole, now (blocking). For tests: the
    /// tables it replaced stay until the tree's old versions are collected
    /// (`reclaim_space`), as after any compaction.
    #[doc(hidden)]
    pub fn compact_data_now(&self) -> Result<(), StorageError> {
        Ok(self.data.major_compact()?)
    }

    /// Flushes every keyspace's memtable to a table and waits for it
    /// (tests: what a flush keeps).
    #[doc(hidden)]
    pub fn flush_now(&self) -> Result<(), StorageError> {
        for ks in [&self.data, &self.tombstones, &self.log, &self.meta] {
            ks.rotate_memtable_and_wait()?;
        }
        Ok(())
    }

    /// The `data` keyspace's tables on disk, in bytes (tests).
    #[doc(hidden)]
    pub fn data_table_bytes(&self) -> u64 {
        self.data.disk_space()
    }

    /// The `log` keyspace's tables on disk, in bytes (tests).
    #[doc(hidden)]
    pub fn log_table_bytes(&self) -> u64 {
        self.log.disk_space()
    }

    /// The name of the `log` keyspace's compaction strategy (tests).
    #[doc(hidden)]
    pub fn log_compaction_strategy(&self) -> &'static str {
        self.log.config.compaction_strategy.get_name()
    }

    /// Disk space used by the database (all keyspaces and journals), in bytes.
    pub fn disk_space(&self) -> Result<u64, StorageError> {
        Ok(self.db.disk_space()?)
    }

    /// A snapshot that shows each of this engine's batches whole or not at
    /// all. fjall's `Database::snapshot` alone does not: lsm-tree 3.1 moves
    /// the visible seqno forward whenever a flush or compaction installs a
    /// new version (`upgrade_version`: `visible_seqno.fetch_max(seqno + 1)`
    /// with a fresh seqno), without waiting for the write batch being
    /// inserted meanwhile, so a snapshot opened just then sees that batch's
    /// first items (our data) but not its last (our log record). Found by
    /// `tests/snapshot_seq.rs`: a scan's seq one below a version it showed,
    /// which made a migration's checkpoint digests differ (a copy versioned
    /// at such a seq would even lose the write). Every batch of ours is
    /// committed under `write_lock`, so a snapshot opened under it sees no
    /// batch in flight; the lock is held only for the open.
    /// The last seq and log start are read under the same lock: every
    /// commit publishes both under it, so they are exactly the snapshot's.
    fn snapshot(&self) -> View {
        let _w = lock(&self.write_lock);
        View {
            snap: self.db.snapshot(),
            last_seq: self.last_seq.load(Ordering::Acquire),
            log_start: self.log_start.load(Ordering::Acquire),
        }
    }

    /// The log start `view` must honour: its published one, or its
    /// snapshot's `meta/log_start` if a truncation committed that first.
    fn view_log_start(&self, view: &View) -> Result<Seq, StorageError> {
        let stored = view
            .snap
            .get(&self.meta, META_LOG_START)?
            .map_or(Ok(1), |raw| decode_u64("meta/log_start", &raw))?;
        Ok(stored.max(view.log_start))
    }

    fn commit(&self, plan: Plan) -> Result<Seq, StorageError> {
        if plan.writes.is_empty() && plan.log.is_empty() {
            return Ok(plan.last_seq);
        }
        let off = self.log_off.load(Ordering::Acquire);
        let reserve = off && plan.last_seq > self.seq_reserved.load(Ordering::Acquire);
        if off && plan.writes.is_empty() && !reserve {
            // Only no-op records, not kept: nothing to write.
            self.log_start.store(plan.last_seq + 1, Ordering::Release);
            self.last_seq.store(plan.last_seq, Ordering::Release);
            return Ok(plan.last_seq);
        }
        let mut b = fjall::OwnedWriteBatch::with_capacity(
            self.db.clone(),
            plan.writes.len() + if off { 1 } else { plan.log.len() },
        );
        {
            // The producer side of the bounds' assertion pair: every value or
            // marker written raises its range's bound (`version_bounds.rs`).
            let mut bounds = lock(&self.bounds);
            if !bounds.is_empty() {
                for w in &plan.writes {
                    match w {
                        Write::PutValue(k, v) => {
                            bounds.raise(k, v.value.version.max(v.base_version))
                        }
                        Write::PutMarker(k, m) => bounds.raise(
                            k,
                            m.deleted_at.max(m.pending_expiry.map_or(0, |(seq, _)| seq)),
                        ),
                        Write::DeleteValue(_) | Write::DeleteMarker(_) => {}
                    }
                }
            }
        }
        if plan.reads_skipped > 0 {
            self.foreign_reads_skipped
                .fetch_add(plan.reads_skipped, Ordering::Relaxed);
        }
        if plan
            .writes
            .iter()
            .any(|w| matches!(w, Write::PutMarker(..)))
        {
            // Before the batch commits, under `write_lock` (the field's docs).
            self.markers_may_exist.store(true, Ordering::Release);
        }
        for w in plan.writes {
            match w {
                Write::PutValue(k, v) => b.insert(&self.data, &k[..], v.encode()),
                Write::DeleteValue(k) => b.remove(&self.data, &k[..]),
                Write::PutMarker(k, m) => b.insert(&self.tombstones, &k[..], m.encode()),
                Write::DeleteMarker(k) => b.remove(&self.tombstones, &k[..]),
            }
        }
        let mut appended = 0u64;
        if reserve {
            b.insert(
                &self.meta,
                META_SEQ_RESERVED,
                (plan.last_seq + SEQ_RESERVE).to_be_bytes(),
            );
        }
        if !off {
            for r in &plan.log {
                appended += crate::value::log_record_bytes(&r.mutation);
                b.insert(
                    &self.log,
                    r.seq.to_be_bytes(),
                    r.mutation.encode_log_value(r.batch_continues),
                );
            }
        }
        // Handed to the OS now, or (on a thread that defers) by the next
        // `flush_deferred`, which the flag below tells to flush.
        let deferred = self.flush_each_batch && crate::engine::os_flush_deferred_here();
        if self.flush_each_batch && !deferred {
            b = b.durability(Some(PersistMode::Buffer));
        }
        b.commit()?;
        if deferred {
            self.unflushed.store(true, Ordering::Release);
        }
        if off {
            if reserve {
                self.seq_reserved
                    .store(plan.last_seq + SEQ_RESERVE, Ordering::Release);
            }
            // Not kept: the log stays truncated whole.
            self.log_start.store(plan.last_seq + 1, Ordering::Release);
        } else if !plan.log.is_empty() {
            // Before the last seq is published: a truncation never passes it,
            // and a reader of the tail finds every record up to it.
            lock(&self.log_marks).appended(plan.last_seq, appended);
            self.tail.append(&plan.log);
        }
        self.last_seq.store(plan.last_seq, Ordering::Release);
        Ok(plan.last_seq)
    }

    fn run(
        &self,
        f: impl FnOnce(&mut Planner<'_, Self>) -> Result<(), StorageError>,
    ) -> Result<Seq, StorageError> {
        let _w = lock(&self.write_lock);
        let plan = {
            let mut planner = Planner::new(self, self.last_seq.load(Ordering::Acquire));
            f(&mut planner)?;
            planner.finish()
        };
        self.commit(plan)
    }

    /// Up to `limit` keys of `ks` within `bounds`.
    fn keys_in(
        ks: &Keyspace,
        bounds: Bounds<'_>,
        limit: usize,
    ) -> Result<Vec<Bytes>, StorageError> {
        ks.range::<&[u8], _>(bounds)
            .take(limit)
            .map(|g| Ok(to_bytes(&g.key()?)))
            .collect()
    }

    fn for_each_live(
        &self,
        snap: &Snapshot,
        range: &KeyRange,
        mut f: impl FnMut(&[u8], &Value),
    ) -> Result<(), StorageError> {
        let Some(bounds) = range.bounds_after(None) else {
            return Ok(());
        };
        for g in snap.range::<&[u8], _>(&self.data, bounds) {
            let (k, v) = g.into_inner()?;
            let sv = StoredValue::decode(&to_bytes(&v))?;
            f(&k, &sv.value);
        }
        Ok(())
    }
}

impl StateSource for FjallEngine {
    fn load_value(&self, key: &[u8]) -> Result<Option<StoredValue>, StorageError> {
        self.data
            .get(key)?
            .map(|raw| StoredValue::decode(&to_bytes(&raw)))
            .transpose()
    }

    fn load_marker(&self, key: &[u8]) -> Result<Option<Marker>, StorageError> {
        if !self.markers_may_exist.load(Ordering::Acquire) {
            // The pair of the flag's store in `commit`: debug builds read
            // anyway and check that no marker was skipped.
            debug_assert!(
                self.tombstones.get(key)?.is_none(),
                "a version marker exists though markers_may_exist is false"
            );
            return Ok(None);
        }
        self.tombstones
            .get(key)?
            .map(|raw| Marker::decode(&to_bytes(&raw)))
            .transpose()
    }

    fn version_bound(&self, key: &[u8]) -> Option<Seq> {
        lock(&self.bounds).bound(key)
    }
}

impl Engine for FjallEngine {
    fn get(&self, key: &[u8]) -> Result<Option<Value>, StorageError> {
        if key.is_empty() || key.len() > MAX_KEY_LEN {
            return Ok(None);
        }
        Ok(self.load_value(key)?.map(|sv| sv.value))
    }

    fn apply(&self, mutations: &[Mutation]) -> Result<Seq, StorageError> {
        for m in mutations {
            check_mutation(m)?;
        }
        self.run(|p| mutations.iter().try_for_each(|m| p.local(m)))
    }

    fn sync(&self) -> Result<(), StorageError> {
        Ok(self.db.persist(PersistMode::SyncData)?)
    }

    fn flush_deferred(&self) -> Result<(), StorageError> {
        if self.unflushed.swap(false, Ordering::AcqRel) {
            self.db
                .persist(PersistMode::Buffer)
                .map_err(|e| StorageError::SyncFailed(format!("journal write: {e}")))?;
        }
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
        let View {
            snap,
            last_seq: seq,
            ..
        } = self.snapshot();
        let Some(bounds) = range.bounds_after(after) else {
            return Ok(ScanChunk {
                entries: Vec::new(),
                next: None,
                seq,
            });
        };
        let mut it = snap.range::<&[u8], _>(&self.data, bounds);
        let mut entries = Vec::with_capacity(limit.min(1024));
        for g in it.by_ref().take(limit) {
            let (k, v) = g.into_inner()?;
            entries.push((to_bytes(&k), StoredValue::decode(&to_bytes(&v))?.value));
        }
        let more = match it.next() {
            Some(g) => {
                g.key()?;
                true
            }
            None => false,
        };
        let next = if more {
            entries.last().map(|(k, _)| k.clone())
        } else {
            None
        };
        Ok(ScanChunk { entries, next, seq })
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
        let View {
            snap,
            last_seq: seq,
            ..
        } = self.snapshot();
        let Some(bounds) = range.bounds_before(before) else {
            return Ok(ScanChunk {
                entries: Vec::new(),
                next: None,
                seq,
            });
        };
        let mut it = snap.range::<&[u8], _>(&self.data, bounds).rev();
        let mut entries = Vec::with_capacity(limit.min(1024));
        for g in it.by_ref().take(limit) {
            let (k, v) = g.into_inner()?;
            entries.push((to_bytes(&k), StoredValue::decode(&to_bytes(&v))?.value));
        }
        let more = match it.next() {
            Some(g) => {
                g.key()?;
                true
            }
            None => false,
        };
        let next = if more {
            entries.last().map(|(k, _)| k.clone())
        } else {
            None
        };
        Ok(ScanChunk { entries, next, seq })
    }

    fn changes_since(&self, after: Seq, limit: usize) -> Result<Vec<ChangeRecord>, StorageError> {
        if let Some(answer) = self.recent_changes(after, limit) {
            return answer;
        }
        // Snapshot first, then read log_start from it: a truncation commits
        // `meta/log_start` before deleting records, so this never misses records
        // silently.
        let view = self.snapshot();
        let log_start = self.view_log_start(&view)?;
        if after.saturating_add(1) < log_start {
            return Err(StorageError::LogTruncated { after, log_start });
        }
        let (snap, last) = (view.snap, view.last_seq);
        if after >= last || limit == 0 {
            return Ok(Vec::new());
        }
        let mut out: Vec<ChangeRecord> =
            Vec::with_capacity(limit.min((last - after) as usize).min(4096));
        // Up to `limit` records, then on to the end of the last one's batch
        // (never half of a batch: see `ChangeRecord::batch_continues`).
        let expect = self.read_log(&snap, after, |r| {
            if out.len() >= limit && out.last().is_none_or(|r| !r.batch_continues) {
                return false;
            }
            out.push(r);
            true
        })?;
        if out.last().is_some_and(|r| r.batch_continues) {
            return Err(corrupt(
                "log",
                format!("the batch of record {} has no end", expect - 1),
            ));
        }
        if out.len() < limit && expect <= last {
            return Err(corrupt("log", format!("missing records {expect}..={last}")));
        }
        Ok(out)
    }

    fn recent_changes(
        &self,
        after: Seq,
        limit: usize,
    ) -> Option<Result<Vec<ChangeRecord>, StorageError>> {
        // The published log start: a truncation committing now may still
        // let this read serve records it drops, which are intact (the tail
        // holds copies); the log's own read behaves the same with a
        // snapshot taken a moment earlier.
        let log_start = self.log_start();
        if after.saturating_add(1) < log_start {
            return Some(Err(StorageError::LogTruncated { after, log_start }));
        }
        self.tail.read(after, limit, self.last_seq()).map(Ok)
    }

    fn log_start(&self) -> Seq {
        self.log_start.load(Ordering::Acquire)
    }

    fn keep_log(&self, keep: bool) -> Result<Seq, StorageError> {
        self.switch_records(keep)
    }

    fn log_kept(&self) -> bool {
        !self.log_off.load(Ordering::Acquire)
    }

    fn truncate_log(&self, upto: Seq) -> Result<(), StorageError> {
        let _t = lock(&self.truncate_lock);
        let upto = upto.min(self.last_seq());
        if upto < self.log_start() {
            return Ok(());
        }
        let mut b = self.db.batch();
        b.insert(&self.meta, META_LOG_START, (upto + 1).to_be_bytes());
        b.commit()?;
        self.log_start.store(upto + 1, Ordering::Release);
        self.purge_log(upto)
    }

    fn log_bytes(&self) -> u64 {
        lock(&self.log_marks).retained_bytes()
    }

    fn foreign_reads_skipped(&self) -> u64 {
        self.foreign_reads_skipped.load(Ordering::Relaxed)
    }

    fn memory(&self) -> EngineMemory {
        EngineMemory {
            cache_bytes: self.db.cache_size(),
            cache_capacity_bytes: self.db.cache_capacity(),
            write_buffer_bytes: self.db.write_buffer_size(),
            change_tail_bytes: self.tail.bytes() as u64,
        }
    }

    fn reclaim_space(&self) -> Result<(), StorageError> {
        // A sealed journal is deleted only once every keyspace with data in
        // it has flushed past it; with few writes fjall would wait for the
        // memtables to fill (or the journals to pass their cap) first.
        // `rotate_memtable` is a no-op for an empty memtable.
        // fjall seals the active journal only when a flush finds it past the
        // rotation size. A journal that grew past it after the last flush
        // (writes stopped, or the flush ran while it was still small) would
        // stay until the memtables fill again: rotating them makes the flush
        // that seals it.
        let active_too_big = self.db.journal_count() == 1
            && self.db.journal_disk_space()? > self.journal_rotation_bytes;
        if self.db.journal_count() > 1 || active_too_big {
            for ks in [&self.data, &self.tombstones, &self.log, &self.meta] {
                ks.rotate_memtable()?;
            }
        }
        // The tables a compaction replaced are deleted only when fjall
        // collects the tree's old versions, which upstream does at the
        // tree's next flush or compaction: a node that stopped writing (or
        // writes no change records, `keep_log(false)`) kept them, about as
        // much disk as its data. `free_old_versions` (our fjall patch)
        // collects them now, without a write or a flush.
        for ks in [&self.data, &self.tombstones, &self.log, &self.meta] {
            ks.free_old_versions()?;
        }
        Ok(())
    }

    fn delete_range_chunk(&self, range: &KeyRange, limit: usize) -> Result<usize, StorageError> {
        if limit == 0 {
            return Err(StorageError::InvalidArgument("delete limit must be > 0"));
        }
        let Some(bounds) = range.bounds_after(None) else {
            return Ok(0);
        };
        let _w = lock(&self.write_lock);
        let mut cursor = lock(&self.delete_cursor);
        let resume = match &*cursor {
            Some((r, k)) if r == range => Some(k.clone()),
            _ => None,
        };
        let mut keys = match resume.as_deref().and_then(|k| range.bounds_after(Some(k))) {
            Some(b) => Self::keys_in(&self.data, b, limit)?,
            None => Vec::new(),
        };
        if keys.is_empty() {
            // Full pass from the start: catches keys written behind the cursor.
            keys = Self::keys_in(&self.data, bounds, limit)?;
        }
        let markers = if keys.len() < limit {
            Self::keys_in(&self.tombstones, bounds, limit - keys.len())?
        } else {
            Vec::new()
        };
        if keys.is_empty() && markers.is_empty() {
            *cursor = None;
            // Found empty under the write lock: nothing stored in the range,
            // so 0 bounds its versions until a commit raises it.
            lock(&self.bounds).track_empty(range);
            return Ok(0);
        }
        let mut b =
            fjall::OwnedWriteBatch::with_capacity(self.db.clone(), keys.len() + markers.len());
        for k in &keys {
            b.remove(&self.data, &k[..]);
        }
        for k in &markers {
            b.remove(&self.tombstones, &k[..]);
        }
        b.commit()?;
        *cursor = keys.last().map(|k| (range.clone(), k.clone()));
        Ok(keys.len() + markers.len())
    }

    fn written_digests(
        &self,
        range: &KeyRange,
        after: Seq,
        part_keys: usize,
    ) -> Result<crate::engine::WrittenDigests, StorageError> {
        let view = self.snapshot();
        let log_start = self.view_log_start(&view)?;
        let (snap, seq) = (view.snap, view.last_seq);
        if after.saturating_add(1) < log_start {
            return Err(StorageError::LogTruncated { after, log_start });
        }
        let mut keys = std::collections::BTreeSet::new();
        let expect = self.read_log(&snap, after, |r| {
            if range.contains(r.mutation.key()) {
                keys.insert(r.mutation.key().clone());
            }
            true
        })?;
        // Every record up to `expect - 1` is visible in this snapshot.
        let seq = seq.max(expect - 1);
        crate::engine::WrittenDigests::build(seq, keys.into_iter().collect(), part_keys, |k| {
            snap.get(&self.data, k)?
                .map(|raw| StoredValue::decode(&to_bytes(&raw)).map(|sv| sv.value))
                .transpose()
        })
    }

    fn digest(&self, range: &KeyRange) -> Result<(RangeDigest, Seq), StorageError> {
        let View {
            snap,
            last_seq: seq,
            ..
        } = self.snapshot();
        let mut d = Digester::new();
        self.for_each_live(&snap, range, |k, v| d.add(k, v))?;
        Ok((d.finish(), seq))
    }

    fn range_stats(&self, range: &KeyRange) -> Result<(u64, u64), StorageError> {
        let snap = self.snapshot().snap;
        let (mut n, mut bytes) = (0u64, 0u64);
        self.for_each_live(&snap, range, |k, v| {
            n += u64::from(v.kind.is_user_key());
            bytes += (k.len() + v.data.len()) as u64;
        })?;
        Ok((n, bytes))
    }

    fn apply_foreign(&self, records: &[ChangeRecord]) -> Result<Seq, StorageError> {
        for r in records {
            check_mutation(&r.mutation)?;
        }
        self.run(|p| records.iter().try_for_each(|r| p.foreign(r)))
    }
}

#[path = "fjall_log.rs"]
mod log;
use log::seq_bounds;

#[cfg(test)]
#[path = "fjall_engine_tests.rs"]
mod tests;
