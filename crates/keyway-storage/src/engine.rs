//! The [`Engine`] trait: everything the node asks of its local storage.
//!
//! All calls are synchronous and may block on disk I/O: call them only from
//! dedicated storage threads (or `spawn_blocking`), never from async workers.

use bytes::Bytes;

use crate::digest::RangeDigest;
use crate::error::StorageError;
use crate::range::KeyRange;
use crate::value::{ChangeRecord, Mutation, Seq, Value};

/// One page of a [`Engine::scan`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScanChunk {
    /// Live entries in ascending key order (expired ones included).
    pub entries: Vec<(Bytes, Value)>,
    /// Resume cursor with **exclusive-after** semantics: the last key returned,
    /// to be passed as `after` to the next `scan` call. `None` = the range holds
    /// no further key (as of this chunk's snapshot).
    pub next: Option<Bytes>,
    /// The change-log seq this chunk's snapshot reflects: every record with
    /// `seq <= self.seq` is visible in `entries`, none after it.
    pub seq: Seq,
}

/// A node's storage engine: routing key → [`Value`], plus a per-node change log.
///
/// Keys are opaque *routing keys*; the engine never interprets them and never
/// checks ownership. Every local write goes to the data **and** to the change
/// log (consecutive seqs, no gaps) in one atomic batch. Version semantics of
/// local vs. foreign writes are specified in [`crate::versioning`].
///
/// Implementations must pass [`crate::conformance`].
pub trait Engine: Send + Sync + 'static {
    /// The stored value of `key`, expired or not. Empty or oversized keys are simply absent.
    fn get(&self, key: &[u8]) -> Result<Option<Value>, StorageError>;

    /// Applies all mutations atomically, data + change log in one batch,
    /// assigning consecutive seqs (mutation `i` gets `returned - len + 1 + i`);
    /// returns the last seq assigned, or the current last seq if `mutations`
    /// is empty. Later mutations see earlier ones of the same call. Every
    /// mutation is logged as given, even a no-op (`Delete`/`SetExpiry` of an
    /// absent key). Fails without any effect if a key is empty or longer than
    /// [`crate::MAX_KEY_LEN`]. Visible to readers on return, but **not durable
    /// until [`Engine::sync`]**.
    fn apply(&self, mutations: &[Mutation]) -> Result<Seq, StorageError>;

    /// Makes every mutation applied so far durable (fsync of the journal).
    /// Group commit: many `apply` calls, one `sync`. Costs ~1–6 ms on this hardware.
    fn sync(&self) -> Result<(), StorageError>;

    /// Hands to the OS (one `write(2)`, no fsync) what applies on threads
    /// that called [`defer_os_flush_on_this_thread`] left in user-space
    /// buffers; a no-op when nothing waits, and for engines that hand every
    /// batch over at once or keep nothing in user space. Whoever lets an
    /// acknowledgement or a read of such an apply leave the process calls
    /// it first. No default: a wrapping engine that did not pass it on
    /// would lose acknowledged writes to a process crash
    /// (`tests/it/crash.rs` caught one).
    fn flush_deferred(&self) -> Result<(), StorageError>;

    /// The last seq assigned (0 = nothing written yet).
    fn last_seq(&self) -> Seq;

    /// Up to `limit` live entries of `range` with key `> after` (or from
    /// `range.start` if `after` is `None`), in key order, from one consistent
    /// snapshot. Page through a range by passing the previous chunk's `next`;
    /// each chunk may come from a different (newer) snapshot, so a concurrent
    /// write may or may not be seen by a later chunk: catch up with
    /// [`Engine::changes_since`] from the *first* chunk's `seq`.
    /// `limit == 0` is an [`StorageError::InvalidArgument`].
    fn scan(
        &self,
        range: &KeyRange,
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<ScanChunk, StorageError>;

    /// [`Engine::scan`] backwards: up to `limit` live entries of `range`
    /// with key `< before` (or below `range.end` if `before` is `None`), in
    /// **descending** key order, from one consistent snapshot; `next` is the
    /// last (smallest) key returned, to pass as `before`. Sorted-set reads
    /// from the top (ZPOPMAX, ZREVRANGE) use it. The provided implementation
    /// pages forward through the whole range (O(range)); engines override it.
    fn scan_rev(
        &self,
        range: &KeyRange,
        before: Option<&[u8]>,
        limit: usize,
    ) -> Result<ScanChunk, StorageError> {
        if limit == 0 {
            return Err(StorageError::InvalidArgument("scan limit must be > 0"));
        }
        let end = match (before, &range.end) {
            (Some(b), Some(e)) if b < &e[..] => Some(Bytes::copy_from_slice(b)),
            (Some(b), None) => Some(Bytes::copy_from_slice(b)),
            (_, e) => e.clone(),
        };
        let bounded = KeyRange {
            start: range.start.clone(),
            end,
        };
        let mut tail: std::collections::VecDeque<(Bytes, Value)> =
            std::collections::VecDeque::new();
        let mut more = false;
        let mut after: Option<Bytes> = None;
        let mut seq = None;
        loop {
            let chunk = self.scan(&bounded, after.as_deref(), limit)?;
            seq.get_or_insert(chunk.seq);
            for entry in chunk.entries {
                tail.push_back(entry);
                if tail.len() > limit {
                    tail.pop_front();
                    more = true;
                }
            }
            match chunk.next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        let entries: Vec<(Bytes, Value)> = tail.into_iter().rev().collect();
        let next = if more {
            entries.last().map(|(k, _)| k.clone())
        } else {
            None
        };
        Ok(ScanChunk {
            entries,
            next,
            seq: seq.unwrap_or_else(|| self.last_seq()),
        })
    }

    /// Change records with `seq > after`, in order: `limit` of them, then on
    /// to the end of the last one's batch (see
    /// [`ChangeRecord::batch_continues`]; fewer if the log ends first; empty
    /// if `after >= last_seq` or `limit == 0`). Fails with [`StorageError::LogTruncated`]
    /// if records after `after` were already truncated (`after + 1 < log_start`).
    fn changes_since(&self, after: Seq, limit: usize) -> Result<Vec<ChangeRecord>, StorageError>;

    /// [`Engine::changes_since`] answered from memory only, so it does not
    /// block and may be called on an async worker: `None` when the answer
    /// needs a read of the log (the records were not kept in memory, or were
    /// evicted), and the caller reads it the blocking way. Same answer
    /// otherwise, `LogTruncated` included. A wrapping engine that checks
    /// anything before a read checks it here too.
    fn recent_changes(
        &self,
        after: Seq,
        limit: usize,
    ) -> Option<Result<Vec<ChangeRecord>, StorageError>>;

    /// Oldest seq still retained in the change log: records `<= log_start - 1`
    /// were truncated. `1` while nothing was truncated (even when the log is empty).
    fn log_start(&self) -> Seq;

    /// Drops change records with `seq <= upto` (clamped to `last_seq`; a lower
    /// `upto` than a previous truncation is a no-op). Afterwards
    /// `log_start() == upto + 1`.
    fn truncate_log(&self, upto: Seq) -> Result<(), StorageError>;

    /// Whether the change records of later writes are kept at all.
    ///
    /// `keep == false`: from now on writes keep assigning seqs (strictly
    /// increasing, across restarts too) but their records are not kept;
    /// the log is truncated whole now and after every later write
    /// (`log_start() == last_seq() + 1`), so a read after an older seq is
    /// [`StorageError::LogTruncated`]. What a node with no reader of its
    /// log saves: a second LSM insert per write (keyway-node `log_gc.rs`
    /// decides when).
    ///
    /// `keep == true`: records of every write after the returned seq are
    /// kept (the last seq at the switch, or now if they were kept already);
    /// a reader that reads the last seq after this call finds every record
    /// after it. Idempotent both ways; engines start with records kept.
    fn keep_log(&self, keep: bool) -> Result<Seq, StorageError>;

    /// Whether change records are kept ([`Engine::keep_log`]).
    fn log_kept(&self) -> bool;

    /// Bytes of the change records still retained (`log_start..=last_seq`):
    /// for each, 8 (its seq) plus its encoded mutation. Kept as a counter,
    /// so O(1); the node's log retention limit is checked against it.
    fn log_bytes(&self) -> u64;

    /// Gives disk space back after truncations and overwrites, where the
    /// engine needs a nudge for that (fjall: flush the memtables that pin
    /// a sealed journal, compact the log's tombstones away). Blocking,
    /// bounded work; called now and then from a background thread, never
    /// from the write path. Engines with nothing to reclaim do nothing.
    fn reclaim_space(&self) -> Result<(), StorageError> {
        Ok(())
    }

    /// What the engine holds in memory now, against its budget. Engines
    /// without a cache or memtables report zeros.
    fn memory(&self) -> EngineMemory {
        EngineMemory::default()
    }

    /// Foreign `Put`s applied without reading their key's current version
    /// since the engine opened (`version_bounds.rs`; a replica's apply):
    /// `keyway_storage_foreign_reads_skipped` on a node's `/metrics`.
    /// Engines that never skip report 0.
    fn foreign_reads_skipped(&self) -> u64 {
        0
    }

    /// Deletes up to `limit` entries of `range` **without** writing change
    /// records or consuming seqs (local cleanup of a range this node no longer
    /// owns; a replica of this node must run the same cleanup). Removes values
    /// and version markers (foreign tombstones) alike; returns how many
    /// entries were removed, `0` = the range is empty. Call until it returns 0.
    /// `limit == 0` is an [`StorageError::InvalidArgument`].
    fn delete_range_chunk(&self, range: &KeyRange, limit: usize) -> Result<usize, StorageError>;

    /// [`RangeDigest`] of the live entries of `range` from one consistent
    /// snapshot, and the seq that snapshot reflects. Cost: a full read of the range.
    fn digest(&self, range: &KeyRange) -> Result<(RangeDigest, Seq), StorageError>;

    /// The keys of `range` that change records in `(after, seq]` wrote, in
    /// key order and each once, with their digests in parts of `part_keys`
    /// keys (a present key as in a [`RangeDigest`], an absent one as
    /// [`crate::Digester::add_absent`]), all read at **one** snapshot whose
    /// seq is `seq`: what a migration's rolling checkpoint compares with the
    /// target while the source keeps serving (keyway-node
    /// `migrate/digest.rs`). [`StorageError::LogTruncated`] if records after
    /// `after` are gone; `part_keys == 0` is an
    /// [`StorageError::InvalidArgument`]. Cost: the log after `after` and
    /// one point read per written key.
    fn written_digests(
        &self,
        range: &KeyRange,
        after: Seq,
        part_keys: usize,
    ) -> Result<WrittenDigests, StorageError>;

    /// `(keys, bytes)` of `range`: the number of live *user* keys (entries
    /// of every kind but [`crate::ValueKind::Sub`], the collections'
    /// sub-entries) and the sum of `key.len() + data.len()` over all entries
    /// (for strings only, the same as [`RangeDigest`]'s `keys`/`bytes`).
    /// Exact; cost: a full read of the range (no approximation is available).
    fn range_stats(&self, range: &KeyRange) -> Result<(u64, u64), StorageError>;

    /// Applies change records received from another node's log (migration
    /// catch-up, dual writes, replication) in the given order, each only if it
    /// is newer than what this engine holds for the key: the record's `seq`
    /// (the *source's* seq) becomes the value's `version`, and a foreign
    /// `Delete` leaves a version marker so an older `Put` replayed later cannot
    /// resurrect the key. The final state does not depend on the order in which
    /// a set of records arrives. Every record that changes visible state is
    /// appended to this node's own log as its effect, with a fresh local seq.
    /// Atomic like [`Engine::apply`]; returns this node's last seq afterwards.
    /// Full rules: [`crate::versioning`].
    fn apply_foreign(&self, records: &[ChangeRecord]) -> Result<Seq, StorageError>;
}

/// [`Engine::written_digests`]: the keys written in `(after, seq]` and
/// their digests, as of the snapshot at `seq`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WrittenDigests {
    /// The snapshot's seq.
    pub seq: Seq,
    /// The written keys of the range, ascending, each once.
    pub keys: Vec<Bytes>,
    /// One digest per `part_keys` keys, in order.
    pub parts: Vec<RangeDigest>,
}

impl WrittenDigests {
    /// Digests `keys` (sorted, deduplicated) in parts of `part_keys` with
    /// `read` as the snapshot's point read.
    pub fn build(
        seq: Seq,
        keys: Vec<Bytes>,
        part_keys: usize,
        mut read: impl FnMut(&[u8]) -> Result<Option<Value>, StorageError>,
    ) -> Result<WrittenDigests, StorageError> {
        if part_keys == 0 {
            return Err(StorageError::InvalidArgument("part_keys must be > 0"));
        }
        debug_assert!(keys.windows(2).all(|w| w[0] < w[1]), "sorted, once each");
        let mut parts = Vec::with_capacity(keys.len().div_ceil(part_keys));
        for chunk in keys.chunks(part_keys) {
            let mut d = crate::digest::Digester::new();
            for key in chunk {
                match read(key)? {
                    Some(v) => d.add(key, &v),
                    None => d.add_absent(key),
                }
            }
            parts.push(d.finish());
        }
        Ok(WrittenDigests { seq, keys, parts })
    }
}

/// [`Engine::memory`]: the engine's own memory, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineMemory {
    /// Blocks held by the block cache now.
    pub cache_bytes: u64,
    /// The block cache's capacity (its budget).
    pub cache_capacity_bytes: u64,
    /// Memtables, active and sealed, not yet flushed to tables.
    pub write_buffer_bytes: u64,
    /// The newest change records kept in memory for readers that keep up
    /// (`change_tail.rs`).
    pub change_tail_bytes: u64,
}

thread_local! {
    static DEFER_OS_FLUSH: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// From now on, an engine that hands each batch to the OS as it is applied
/// (fjall's `flush_journal_each_batch`) leaves the batches applied on this
/// thread in its user-space buffer until [`Engine::flush_deferred`]: one
/// `write(2)` per group of applies instead of one per apply (the node's
/// storage threads, which release a group's replies only after it, as
/// Redis writes its AOF buffer once per event-loop turn, before replies).
pub fn defer_os_flush_on_this_thread() {
    DEFER_OS_FLUSH.with(|d| d.set(true));
}

/// Whether this thread defers its OS hand-over (see
/// [`defer_os_flush_on_this_thread`]).
pub fn os_flush_deferred_here() -> bool {
    DEFER_OS_FLUSH.with(|d| d.get())
}
