//! The change log's keyspace in [`FjallEngine`]: where the last seq comes
//! from at open, reading records back, truncation's physical part, and
//! switching records off and on ([`Engine::keep_log`]).
//!
//! Overview:
//! - Records are keyed by seq (`u64` BE) in the `log` keyspace, written in
//!   the same batch as the data they describe (`commit`).
//! - The last seq at open is the top record at or after `log_start`, or
//!   what `meta` says when records were truncated whole or not kept
//!   ([`seq_bounds`]).
//! - Truncation commits `meta/log_start` first, then fsyncs it and drops
//!   whole tables below it (`purge_log`, `drop_log_tables`): no tombstones.
//! - While records are not kept, `commit` writes none and keeps
//!   `log_start` at the last seq + 1; `meta/seq_reserved` keeps a reopen
//!   above every seq handed out ([`FjallEngine::switch_records`]).

use super::*;

/// `(log_start, last_seq, top)` as `snap` reflects them. The last seq is
/// the top log record at or after `log_start` (`top`; records below it are
/// truncated: some stay on disk until their table is dropped, see
/// `purge_log`), else `log_start - 1` (the log was truncated whole), or an
/// older directory's `meta/last_seq`, or `meta/seq_reserved` (written while
/// records were not kept), if that is higher. Records `(top, last_seq]`
/// were never kept when `top < last_seq`.
pub(super) fn seq_bounds(
    snap: &Snapshot,
    meta: &Keyspace,
    log: &Keyspace,
) -> Result<(Seq, Seq, Seq), StorageError> {
    let read = |key: &[u8], what: &'static str, default: u64| -> Result<u64, StorageError> {
        snap.get(meta, key)?
            .map_or(Ok(default), |raw| decode_u64(what, &raw))
    };
    let log_start = read(META_LOG_START, "meta/log_start", 1)?;
    if log_start == 0 {
        return Err(corrupt("meta/log_start", "0 (seqs start at 1)".into()));
    }
    let stored = read(META_LAST_SEQ, "meta/last_seq", 0)?;
    let reserved = read(META_SEQ_RESERVED, "meta/seq_reserved", 0)?;
    let top = match snap.range(log, log_start.to_be_bytes()..).next_back() {
        Some(g) => decode_u64("log key", &g.key()?)?,
        None => 0,
    };
    Ok((
        log_start,
        top.max(log_start - 1).max(stored).max(reserved),
        top,
    ))
}

impl FjallEngine {
    /// Reads the log records after `after` in `snap`, in order, checking
    /// there is no gap: `each` takes the next record, or returns `false` to
    /// leave it and stop. Returns the seq of the first record not taken.
    pub(super) fn read_log(
        &self,
        snap: &Snapshot,
        after: Seq,
        mut each: impl FnMut(ChangeRecord) -> bool,
    ) -> Result<Seq, StorageError> {
        let mut expect = after + 1;
        for g in snap.range(&self.log, (after + 1).to_be_bytes()..) {
            let (k, v) = g.into_inner()?;
            let seq = decode_u64("log key", &k)?;
            if seq != expect {
                // A truncation that committed after the snapshot may have
                // dropped the tables this read needed (`purge_log` drops
                // tables, which no snapshot keeps): that is a truncated log,
                // not a corrupt one.
                let now_start = self.log_start();
                if after.saturating_add(1) < now_start {
                    return Err(StorageError::LogTruncated {
                        after,
                        log_start: now_start,
                    });
                }
                return Err(corrupt(
                    "log",
                    format!("gap: expected record {expect}, found {seq}"),
                ));
            }
            let (mutation, batch_continues) = Mutation::decode_log_value(&to_bytes(&v))?;
            let record = ChangeRecord {
                seq,
                mutation,
                batch_continues,
            };
            if !each(record) {
                return Ok(expect);
            }
            expect += 1;
        }
        Ok(expect)
    }

    /// `(seq, key + value bytes)` of each log record in `seqs` (an empty
    /// range reads nothing): what [`LogMarks`] counts, at open and for the
    /// remainder of a purge.
    pub(super) fn log_record_sizes(
        &self,
        seqs: std::ops::RangeInclusive<Seq>,
    ) -> impl Iterator<Item = Result<(Seq, u64), StorageError>> + '_ {
        let (from, to) = seqs.into_inner();
        let range = (from <= to).then(|| self.log.range(from.to_be_bytes()..=to.to_be_bytes()));
        range.into_iter().flatten().map(|g| {
            let (k, v) = g.into_inner()?;
            Ok((decode_u64("log key", &k)?, (k.len() + v.len()) as u64))
        })
    }

    /// Gives back the space of log records `<= upto` (all below
    /// `meta/log_start`, which the caller committed). Caller holds
    /// `truncate_lock`.
    ///
    /// Records are not deleted one by one (a tombstone per record: as many
    /// memtable inserts as the writes themselves, flushed and compacted
    /// again): the log's tables that lie wholly at or below `upto` are
    /// dropped (`drop_range`, no tombstones). Log keys are seqs, appended in
    /// order, so every table eventually lies below a later truncation; until
    /// then the records of the memtable and of the one table that straddles
    /// `upto` stay on disk, below `log_start`, where no read looks
    /// ([`seq_bounds`] and `changes_since` start at `log_start`).
    ///
    /// Before dropping, `log_start` is fsynced: a crash must never bring
    /// back a `log_start` below records that are gone (a reader would find a
    /// gap instead of [`StorageError::LogTruncated`]). A failure of that
    /// fsync is [`StorageError::SyncFailed`], which the node treats as a
    /// failed `sync` (fail-stop).
    pub(super) fn purge_log(&self, upto: Seq) -> Result<(), StorageError> {
        // The dropped records' sizes, for `log_bytes`: the marks, plus the
        // records after the last mark at or below `upto` (a short read; the
        // whole range read back would fill the block cache with blocks of
        // tables about to be dropped, `log_marks.rs`).
        let (mark, mark_bytes) = lock(&self.log_marks).at_or_below(upto);
        let mut after_mark = 0u64;
        for record in self.log_record_sizes(mark + 1..=upto) {
            after_mark += record?.1;
        }
        lock(&self.log_marks).truncated(upto, mark_bytes + after_mark);
        self.drop_log_tables(upto)
    }

    /// The physical part of [`Self::purge_log`]: fsync `log_start`, drop the
    /// log's tables wholly at or below `upto`, record `meta/log_purged`.
    pub(super) fn drop_log_tables(&self, upto: Seq) -> Result<(), StorageError> {
        let purged = self
            .meta
            .get(META_LOG_PURGED)?
            .map_or(Ok(0), |raw| decode_u64("meta/log_purged", &raw))?;
        if purged >= upto {
            return Ok(());
        }
        self.db
            .persist(PersistMode::SyncData)
            .map_err(|e| StorageError::SyncFailed(e.to_string()))?;
        self.log
            .tree
            .drop_range(..=upto.to_be_bytes())
            .map_err(fjall::Error::from)?;
        let mut b = self.db.batch();
        b.insert(&self.meta, META_LOG_PURGED, upto.to_be_bytes());
        b.commit()?;
        Ok(())
    }

    /// [`Engine::keep_log`].
    pub(super) fn switch_records(&self, keep: bool) -> Result<Seq, StorageError> {
        let _t = lock(&self.truncate_lock);
        let last = {
            let _w = lock(&self.write_lock);
            let last = self.last_seq();
            if keep != self.log_off.load(Ordering::Acquire) {
                return Ok(last);
            }
            let mut b = self.db.batch();
            b.insert(&self.meta, META_LOG_START, (last + 1).to_be_bytes());
            if keep {
                // Records are kept from here: a reopen reads the last seq
                // from the log again (no seq above `last` was handed out).
                b.insert(&self.meta, META_SEQ_RESERVED, last.to_be_bytes());
            }
            b.commit()?;
            self.log_start.store(last + 1, Ordering::Release);
            if keep {
                self.seq_reserved.store(last, Ordering::Release);
                *lock(&self.log_marks) = LogMarks::new(last);
            }
            self.log_off.store(!keep, Ordering::Release);
            last
        };
        if !keep {
            // Everything kept so far goes, as a truncation through `last`.
            self.purge_log(last)?;
        }
        Ok(last)
    }
}
