//! Where the change log's bytes are, without reading the log: cumulative
//! byte marks for [`crate::Engine::log_bytes`].
//!
//! A truncation must subtract the sizes of the records it drops. Reading
//! them back (as `FjallEngine::purge_log` once did) reads every record the
//! log ever held a second time, through the block cache: under a steady
//! write load the cache then fills with blocks of log tables that are being
//! dropped (measured with `bench/bulk-load.sh`: about 140 MB of a 3-node
//! `keyway dev`'s resident memory after 1,000,000 SETs).
//!
//! Instead the engine keeps, in memory, the cumulative size of the log at
//! some seqs: a mark every [`MARK_EVERY_BYTES`] of appended records, and a
//! base (the last seq truncated, or the seq before the first retained one
//! at open). The size of the records in `(base, upto]` is then the mark at
//! or below `upto`, minus the base, plus the records between that mark and
//! `upto`: at most one mark's worth read from the log.
//!
//! Cumulative sizes are functions of the seq: the log is appended in seq
//! order under the engine's write lock, and a commit reports its records
//! here before it publishes its last seq, so a truncation (which never
//! passes the published last seq) only counts records already reported.

use crate::Seq;
use std::collections::VecDeque;

/// A mark is taken once this many bytes were appended since the last one:
/// the most a truncation reads back (≈ 64 KiB), for one mark of 16 bytes
/// per 64 KiB of retained log (16 KiB of marks for 64 MiB).
pub const MARK_EVERY_BYTES: u64 = 64 * 1024;

/// Cumulative log sizes at some seqs (see the module docs).
#[derive(Debug)]
pub struct LogMarks {
    /// `(seq, cumulative bytes of the records ≤ seq)`, seqs increasing; the
    /// first is the base.
    marks: VecDeque<(Seq, u64)>,
    /// Through `last_seq`.
    total: u64,
    last_seq: Seq,
}

impl LogMarks {
    /// Marks whose base is `base` (no record ≤ it counts).
    pub fn new(base: Seq) -> Self {
        LogMarks {
            marks: VecDeque::from([(base, 0)]),
            total: 0,
            last_seq: base,
        }
    }

    fn base(&self) -> (Seq, u64) {
        *self.marks.front().expect("the base is always kept")
    }

    /// Records through `last_seq` were appended, `bytes` in all.
    pub fn appended(&mut self, last_seq: Seq, bytes: u64) {
        assert!(
            last_seq >= self.last_seq,
            "the log is appended in seq order"
        );
        self.total += bytes;
        self.last_seq = last_seq;
        let (mark_seq, mark_bytes) = *self.marks.back().expect("base");
        if last_seq > mark_seq && self.total - mark_bytes >= MARK_EVERY_BYTES {
            self.marks.push_back((last_seq, self.total));
        }
    }

    /// The greatest mark at or below `seq`: where a count up to `seq`
    /// starts (the records after it, up to `seq`, are read).
    pub fn at_or_below(&self, seq: Seq) -> (Seq, u64) {
        let base = self.base();
        assert!(seq >= base.0, "counting below the base {} ({seq})", base.0);
        let i = self.marks.partition_point(|(s, _)| *s <= seq);
        self.marks[i - 1]
    }

    /// Records through `upto` are gone: `upto_bytes` is the cumulative size
    /// through it ([`Self::at_or_below`] plus what was read after it).
    /// Returns the size of the records dropped since the previous base.
    pub fn truncated(&mut self, upto: Seq, upto_bytes: u64) -> u64 {
        let (base_seq, base_bytes) = self.base();
        assert!(upto >= base_seq && upto_bytes >= base_bytes);
        assert!(
            upto <= self.last_seq && upto_bytes <= self.total,
            "truncating through {upto}, past the last reported seq {}",
            self.last_seq
        );
        while self.marks.front().is_some_and(|(s, _)| *s <= upto) {
            self.marks.pop_front();
        }
        self.marks.push_front((upto, upto_bytes));
        upto_bytes - base_bytes
    }

    /// The size of the records after the base: the retained log
    /// ([`crate::Engine::log_bytes`]).
    pub fn retained_bytes(&self) -> u64 {
        self.total - self.base().1
    }

    /// How many marks are kept, the base included.
    pub fn kept(&self) -> usize {
        self.marks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reference: the cumulative size through each seq.
    fn cumulative(sizes: &[(Seq, u64)], seq: Seq) -> u64 {
        sizes
            .iter()
            .filter(|(s, _)| *s <= seq)
            .map(|(_, b)| b)
            .sum()
    }

    #[test]
    fn truncations_subtract_exactly_what_they_drop() {
        // Records 1..=2000 of 100 bytes, appended in batches of 7.
        let sizes: Vec<(Seq, u64)> = (1..=2000).map(|s| (s, 100 + s % 13)).collect();
        let mut marks = LogMarks::new(0);
        for batch in sizes.chunks(7) {
            let bytes = batch.iter().map(|(_, b)| b).sum();
            marks.appended(batch.last().unwrap().0, bytes);
        }
        assert!(marks.kept() > 2, "marks were taken");
        let mut base = 0;
        for upto in [5, 6, 700, 701, 1500, 2000] {
            let (mark, mark_bytes) = marks.at_or_below(upto);
            assert!(mark <= upto);
            assert_eq!(mark_bytes, cumulative(&sizes, mark), "the mark is exact");
            // What a truncation reads back: the records after the mark.
            let read: u64 = sizes
                .iter()
                .filter(|(s, _)| *s > mark && *s <= upto)
                .map(|(_, b)| b)
                .sum();
            assert!(read < MARK_EVERY_BYTES + 7 * 113, "read back {read}");
            let freed = marks.truncated(upto, mark_bytes + read);
            assert_eq!(
                freed,
                cumulative(&sizes, upto) - cumulative(&sizes, base),
                "truncating ({base}, {upto}]"
            );
            assert_eq!(
                marks.retained_bytes(),
                cumulative(&sizes, 2000) - cumulative(&sizes, upto),
                "retained after truncating through {upto}"
            );
            base = upto;
        }
        assert_eq!(marks.kept(), 1, "only the base is left");
    }

    #[test]
    #[should_panic(expected = "past the last reported seq")]
    fn truncating_records_not_reported_yet_is_a_bug() {
        let mut marks = LogMarks::new(10);
        marks.appended(20, 1_000);
        marks.truncated(30, 1_500);
    }

    #[test]
    #[should_panic(expected = "counting below the base")]
    fn counting_below_the_base_is_a_bug() {
        let marks = LogMarks::new(10);
        marks.at_or_below(9);
    }
}
