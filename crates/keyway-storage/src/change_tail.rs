//! [`ChangeTail`]: the newest change records, kept in memory as they are
//! committed, so a reader that keeps up with the log (a replication
//! stream, a migration's push) gets them without reading them back from
//! the log keyspace: no snapshot, no merge of memtables and tables, no
//! decoding, and no trip to a blocking thread
//! ([`crate::Engine::recent_changes`]).
//!
//! Overview:
//! - The engine appends each committed batch's records under its write
//!   lock, *before* it publishes the batch's last seq, so every record at
//!   or below a published last seq is in the tail unless it was evicted.
//! - The tail holds consecutive seqs only: a batch that does not follow
//!   the newest record (not expected: commits are serialised) empties it
//!   first, and readers fall back to the log until it refills.
//! - Past its byte budget (named by the node's `storage_change_tail_bytes`)
//!   the oldest records go; a reader further behind than the tail reaches
//!   reads the log as before. Budget 0: no tail.
//! - Kept only while someone reads: a budget's worth of appends with no
//!   read in between disarms the tail (a node with no replica and no
//!   migration pays nothing for it); the next read re-arms it, and its
//!   reader goes to the log until the tail has refilled past it.
//! - Records are copied in, one buffer per batch: a mutation's key and
//!   data are often slices of a connection's read buffer, and holding them
//!   would keep whole buffers alive and make every connection allocate new
//!   ones (measured: 15-20 % of `SET -P 16` throughput at factor 1). A
//!   batch bigger than the whole budget is not copied; it empties the tail.
//! - A read answers exactly what the log would (see
//!   [`crate::Engine::changes_since`]): `limit` records, then on to the end
//!   of the last one's batch, never past the last seq the caller read.
//!   Truncation is the caller's check (`log_start`), as for the log.

use crate::value::{ChangeRecord, Mutation, Seq};
use bytes::{Bytes, BytesMut};
use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// The newest committed change records (see the module docs).
#[derive(Debug)]
pub struct ChangeTail {
    budget_bytes: usize,
    /// Whether appends are kept (a hint read without the lock; `Inner`
    /// decides under it).
    armed: AtomicBool,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Consecutive seqs, oldest first.
    records: VecDeque<ChangeRecord>,
    bytes: usize,
    /// Bytes appended since the last read.
    unread_bytes: usize,
}

/// What a record costs the budget: its encoded size plus the seq.
fn cost(r: &ChangeRecord) -> usize {
    crate::value::log_record_bytes(&r.mutation) as usize
}

impl ChangeTail {
    /// A tail of at most `budget_bytes` of records (0: keeps none).
    pub fn new(budget_bytes: usize) -> Self {
        ChangeTail {
            budget_bytes,
            armed: AtomicBool::new(false),
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends a committed batch (its records in seq order, consecutive).
    pub fn append(&self, batch: &[ChangeRecord]) {
        if self.budget_bytes == 0 || batch.is_empty() || !self.armed.load(Ordering::Acquire) {
            return;
        }
        debug_assert!(
            batch.windows(2).all(|w| w[0].seq + 1 == w[1].seq),
            "a batch's records have consecutive seqs"
        );
        let size = batch.iter().map(cost).sum::<usize>();
        let owned = (size <= self.budget_bytes).then(|| owned(batch));
        let mut inner = self.lock();
        inner.unread_bytes += size;
        if inner.unread_bytes > self.budget_bytes {
            // Nobody read while a whole budget went by: stop keeping it.
            self.armed.store(false, Ordering::Release);
            inner.records.clear();
            inner.bytes = 0;
            return;
        }
        let follows = inner
            .records
            .back()
            .is_none_or(|last| last.seq + 1 == batch[0].seq);
        if !follows || owned.is_none() {
            inner.records.clear();
            inner.bytes = 0;
        }
        for r in owned.into_iter().flatten() {
            inner.bytes += cost(&r);
            inner.records.push_back(r);
        }
        while inner.bytes > self.budget_bytes {
            let Some(old) = inner.records.pop_front() else {
                break;
            };
            inner.bytes -= cost(&old);
        }
    }

    /// The records with `after < seq <= last`, `limit` of them then on to
    /// the end of the last one's batch; `None` when the tail does not hold
    /// record `after + 1` (evicted, or not kept): read the log.
    pub fn read(&self, after: Seq, limit: usize, last: Seq) -> Option<Vec<ChangeRecord>> {
        if self.budget_bytes == 0 {
            return None;
        }
        let mut inner = self.lock();
        inner.unread_bytes = 0;
        self.armed.store(true, Ordering::Release);
        if after >= last || limit == 0 {
            return Some(Vec::new());
        }
        let first = inner.records.front()?.seq;
        if after + 1 < first {
            return None;
        }
        let start = usize::try_from(after + 1 - first).ok()?;
        if start >= inner.records.len() {
            return None;
        }
        let mut out: Vec<ChangeRecord> = Vec::with_capacity(
            limit
                .min((last - after) as usize)
                .min(inner.records.len() - start),
        );
        for r in inner.records.range(start..) {
            if r.seq > last || (out.len() >= limit && out.last().is_none_or(|p| !p.batch_continues))
            {
                break;
            }
            out.push(r.clone());
        }
        drop(inner);
        // The engine publishes a last seq only at a batch's end, after the
        // whole batch is here: an answer ending inside a batch, or short of
        // `last` with room left, would mean a broken tail. The log answers.
        let whole = out.last().is_some_and(|r| !r.batch_continues);
        let complete = out.len() >= limit || out.last().is_some_and(|r| r.seq == last);
        (whole && complete).then_some(out)
    }

    /// Bytes of records held (for the node's memory accounting).
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }
}

/// `batch` with every key and data copied into one new buffer.
fn owned(batch: &[ChangeRecord]) -> Vec<ChangeRecord> {
    let data = |m: &Mutation| match m {
        Mutation::Put { data, .. } => data.len(),
        Mutation::Delete { .. } | Mutation::SetExpiry { .. } => 0,
    };
    let size = batch
        .iter()
        .map(|r| r.mutation.key().len() + data(&r.mutation))
        .sum();
    let mut buf = BytesMut::with_capacity(size);
    for r in batch {
        buf.extend_from_slice(r.mutation.key());
        if let Mutation::Put { data, .. } = &r.mutation {
            buf.extend_from_slice(data);
        }
    }
    let buf: Bytes = buf.freeze();
    let mut at = 0usize;
    let mut take = |len: usize| {
        let part = buf.slice(at..at + len);
        at += len;
        part
    };
    batch
        .iter()
        .map(|r| ChangeRecord {
            seq: r.seq,
            batch_continues: r.batch_continues,
            mutation: match &r.mutation {
                Mutation::Put {
                    key,
                    kind,
                    expire_at_ms,
                    data,
                } => Mutation::Put {
                    key: take(key.len()),
                    kind: *kind,
                    expire_at_ms: *expire_at_ms,
                    data: take(data.len()),
                },
                Mutation::Delete { key } => Mutation::Delete {
                    key: take(key.len()),
                },
                Mutation::SetExpiry { key, expire_at_ms } => Mutation::SetExpiry {
                    key: take(key.len()),
                    expire_at_ms: *expire_at_ms,
                },
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::Mutation;
    use bytes::Bytes;

    fn rec(seq: Seq, continues: bool) -> ChangeRecord {
        ChangeRecord {
            seq,
            mutation: Mutation::Delete {
                key: Bytes::from(format!("k{seq}")),
            },
            batch_continues: continues,
        }
    }

    fn seqs(v: &[ChangeRecord]) -> Vec<Seq> {
        v.iter().map(|r| r.seq).collect()
    }

    #[test]
    fn records_are_copied_out_of_the_callers_buffers() {
        let shared = Bytes::from(vec![7u8; 4096]);
        let put = |seq, key: std::ops::Range<usize>, data: std::ops::Range<usize>| ChangeRecord {
            seq,
            mutation: Mutation::Put {
                key: shared.slice(key),
                kind: crate::value::ValueKind::String,
                expire_at_ms: Some(5),
                data: shared.slice(data),
            },
            batch_continues: seq == 1,
        };
        let batch = [put(1, 0..3, 3..10), put(2, 10..12, 12..20)];
        let tail = ChangeTail::new(1 << 20);
        assert_eq!(tail.read(0, 1, 1), None, "arms the tail");
        tail.append(&batch);
        let read = tail.read(0, 10, 2).unwrap();
        assert_eq!(read, batch.to_vec(), "the same records");
        // Only the caller's own slices hold its buffer now.
        drop(batch);
        assert!(
            shared.is_unique(),
            "the tail keeps no slice of the caller's buffer"
        );
    }

    #[test]
    fn reads_whole_batches_up_to_the_last_seq() {
        let tail = ChangeTail::new(1 << 20);
        assert_eq!(tail.read(0, 1, 1), None, "arms the tail");
        tail.append(&[rec(1, false)]);
        tail.append(&[rec(2, true), rec(3, true), rec(4, false)]);
        tail.append(&[rec(5, false)]);
        assert_eq!(seqs(&tail.read(0, 10, 5).unwrap()), vec![1, 2, 3, 4, 5]);
        // The limit ends inside a batch: on to its end.
        assert_eq!(seqs(&tail.read(0, 2, 5).unwrap()), vec![1, 2, 3, 4]);
        // Never past the last seq the caller read.
        assert_eq!(seqs(&tail.read(1, 10, 4).unwrap()), vec![2, 3, 4]);
        assert_eq!(tail.read(5, 10, 5), Some(vec![]));
        // A last seq the tail does not reach: the log answers.
        assert_eq!(tail.read(4, 10, 6), None);
    }

    #[test]
    fn an_evicted_or_missing_record_sends_the_reader_to_the_log() {
        let one = cost(&rec(1, false));
        let tail = ChangeTail::new(3 * one);
        assert_eq!(tail.read(0, 1, 1), None, "arms the tail");
        for s in 1..=3 {
            tail.append(&[rec(s, false)]);
        }
        assert_eq!(tail.read(2, 1, 3).map(|r| seqs(&r)), Some(vec![3]));
        for s in 4..=5 {
            tail.append(&[rec(s, false)]);
        }
        assert_eq!(tail.bytes(), 3 * one);
        assert_eq!(tail.read(1, 10, 5), None, "record 2 was evicted");
        assert_eq!(seqs(&tail.read(2, 10, 5).unwrap()), vec![3, 4, 5]);
        // A gap empties the tail: nothing older than the gap is served.
        tail.append(&[rec(9, false)]);
        assert_eq!(tail.read(3, 10, 9), None);
        assert_eq!(seqs(&tail.read(8, 10, 9).unwrap()), vec![9]);
        // A batch bigger than the budget is not kept, and empties the tail.
        tail.append(&[rec(10, true), rec(11, true), rec(12, true), rec(13, false)]);
        assert_eq!(tail.read(9, 10, 13), None);
        assert_eq!(tail.bytes(), 0);
        // Unread for more than a budget's worth of appends: disarmed.
        assert_eq!(tail.read(0, 1, 1), None, "arms the tail");
        for s in 20..=23 {
            tail.append(&[rec(s, false)]);
        }
        assert_eq!(tail.bytes(), 0, "disarmed after {} unread bytes", 4 * one);
        assert_eq!(tail.read(22, 1, 23), None, "the read re-arms it");
        tail.append(&[rec(24, false)]);
        assert_eq!(tail.read(23, 1, 24).map(|r| seqs(&r)), Some(vec![24]));
        // No budget: nothing kept.
        let none = ChangeTail::new(0);
        assert_eq!(none.read(0, 10, 0), None);
        none.append(&[rec(1, false)]);
        assert_eq!(none.read(0, 10, 1), None);
    }
}
