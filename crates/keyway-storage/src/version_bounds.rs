//! [`VersionBounds`]: key ranges in which the engine knows an upper bound
//! of every version it stores, so that a foreign `Put` newer than the bound
//! is applied without reading the key's current version first.
//!
//! Overview:
//! - Why: the last-writer-wins rule of `apply_foreign`
//!   ([`crate::versioning`]) reads each key's value and marker before it
//!   writes. A replica applies its primary's records in seq order, each
//!   newer than anything it stores for the key once its copy is done, so
//!   the rule always ends in a plain replace; the read was 12 % of a
//!   factor-2 `SET` load's samples (stop 32, `bench/profile.sh`).
//! - Where a bound comes from: a range the engine has just found empty
//!   (`delete_range_chunk` answering 0, as a replica's catch-up does before
//!   its copy) is tracked from then on with bound 0.
//! - How it stays true: every commit (local or foreign, under the engine's
//!   write lock) raises the bound of the range each written value or
//!   marker falls in to that value's `version` and `base_version`, or that
//!   marker's `deleted_at` and pending-expiry seq. Removals only remove
//!   versions. So a tracked range's bound is never below a version stored
//!   in it. The pair: the bound is produced in
//!   [`crate::FjallEngine`]'s commit and consumed by
//!   [`crate::versioning::Planner`]'s foreign `Put`, which in debug builds
//!   reads the key anyway and asserts the bound held.
//! - What is not tracked costs nothing and is never wrong: a range never
//!   found empty, every range after a restart (the bounds live in memory),
//!   and everything once more than [`MAX_TRACKED_RANGES`] were tracked (the
//!   set is emptied) take the full rule.
//!
//! Tracked ranges never overlap: tracking a new one trims the ones it
//! overlaps (their bounds stay valid for what is left of them).

use std::collections::BTreeMap;
use std::ops::Bound::{Excluded, Included, Unbounded};

use bytes::Bytes;

use crate::range::KeyRange;
use crate::value::Seq;

/// Most ranges tracked at once; past it the set is emptied (each range
/// is tracked again at its next clean).
pub(crate) const MAX_TRACKED_RANGES: usize = 4_096;

/// Non-overlapping key ranges with an upper bound of their stored versions.
#[derive(Debug, Default)]
pub(crate) struct VersionBounds {
    /// Range start → (range end, bound).
    by_start: BTreeMap<Bytes, (Option<Bytes>, Seq)>,
}

fn ends_after(end: &Option<Bytes>, key: &[u8]) -> bool {
    end.as_ref().is_none_or(|e| key < &e[..])
}

impl VersionBounds {
    pub(crate) fn is_empty(&self) -> bool {
        self.by_start.is_empty()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.by_start.len()
    }

    /// Every version stored for `key` is at most this, if known.
    pub(crate) fn bound(&self, key: &[u8]) -> Option<Seq> {
        let (_, (end, bound)) = self
            .by_start
            .range::<[u8], _>((Unbounded, Included(key)))
            .next_back()?;
        ends_after(end, key).then_some(*bound)
    }

    /// A value or marker with `version` was written for `key`.
    pub(crate) fn raise(&mut self, key: &[u8], version: Seq) {
        if let Some((_, (end, bound))) = self
            .by_start
            .range_mut::<[u8], _>((Unbounded, Included(key)))
            .next_back()
            && ends_after(end, key)
        {
            *bound = (*bound).max(version);
        }
    }

    /// `range` holds nothing now: track it with bound 0.
    pub(crate) fn track_empty(&mut self, range: &KeyRange) {
        if range.is_empty() {
            return;
        }
        // Entries overlapping `range`: the one starting before it (if it
        // reaches into it) and every one starting inside it.
        let mut overlapping: Vec<Bytes> = Vec::new();
        if let Some((start, (end, _))) = self
            .by_start
            .range::<[u8], _>((Unbounded, Excluded(&range.start[..])))
            .next_back()
            && ends_after(end, &range.start)
        {
            overlapping.push(start.clone());
        }
        overlapping.extend(
            self.by_start
                .range::<[u8], _>((Included(&range.start[..]), Unbounded))
                .take_while(|(start, _)| ends_after(&range.end, start))
                .map(|(start, _)| start.clone()),
        );
        for start in overlapping {
            let (end, bound) = self.by_start.remove(&start).expect("listed above");
            // What lies before `range` and after it keeps its bound.
            if start < range.start {
                self.by_start
                    .insert(start, (Some(range.start.clone()), bound));
            }
            if let Some(range_end) = &range.end
                && ends_after(&end, range_end)
            {
                self.by_start.insert(range_end.clone(), (end, bound));
            }
        }
        if self.by_start.len() >= MAX_TRACKED_RANGES {
            self.by_start.clear();
        }
        self.by_start
            .insert(range.start.clone(), (range.end.clone(), 0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(start: &str, end: Option<&str>) -> KeyRange {
        KeyRange::new(
            Bytes::copy_from_slice(start.as_bytes()),
            end.map(|e| Bytes::copy_from_slice(e.as_bytes())),
        )
    }

    #[test]
    fn only_a_tracked_range_has_a_bound_and_writes_raise_it() {
        let mut b = VersionBounds::default();
        assert_eq!(b.bound(b"k"), None);
        b.raise(b"k", 7);
        assert_eq!(b.bound(b"k"), None, "an untracked key stays unknown");
        b.track_empty(&r("b", Some("m")));
        assert_eq!(b.bound(b"k"), Some(0));
        assert_eq!(b.bound(b"b"), Some(0));
        assert_eq!(b.bound(b"m"), None, "the end is exclusive");
        assert_eq!(b.bound(b"a"), None);
        b.raise(b"k", 7);
        b.raise(b"c", 3);
        assert_eq!(b.bound(b"d"), Some(7), "one bound per range");
    }

    #[test]
    fn tracking_a_range_trims_the_ones_it_overlaps_and_keeps_their_bounds() {
        let mut b = VersionBounds::default();
        b.track_empty(&r("c", Some("p")));
        b.raise(b"d", 9);
        b.track_empty(&r("t", None));
        b.raise(b"x", 4);
        // Cuts [c, p) into [c, f) and [k, p), and [t, ∞) into [u, ∞).
        b.track_empty(&r("f", Some("k")));
        b.track_empty(&r("p", Some("u")));
        assert_eq!(b.bound(b"c"), Some(9));
        assert_eq!(b.bound(b"f"), Some(0));
        assert_eq!(b.bound(b"j"), Some(0));
        assert_eq!(b.bound(b"k"), Some(9));
        assert_eq!(b.bound(b"p"), Some(0));
        assert_eq!(b.bound(b"t"), Some(0));
        assert_eq!(b.bound(b"u"), Some(4));
        assert_eq!(b.bound(b"zz"), Some(4));
        assert_eq!(b.len(), 5);
        // A range covering them all replaces them.
        b.track_empty(&r("", None));
        assert_eq!(b.len(), 1);
        assert_eq!(b.bound(b"u"), Some(0));
    }

    #[test]
    fn past_the_limit_the_set_starts_again() {
        let mut b = VersionBounds::default();
        for i in 0..MAX_TRACKED_RANGES {
            b.track_empty(&r(&format!("{i:08}"), Some(&format!("{i:08}~"))));
        }
        assert_eq!(b.len(), MAX_TRACKED_RANGES);
        assert_eq!(b.bound(b"00000000"), Some(0));
        let i = MAX_TRACKED_RANGES;
        b.track_empty(&r(&format!("{i:08}"), Some(&format!("{i:08}~"))));
        assert_eq!(b.len(), 1, "emptied, then the newest tracked");
        assert_eq!(b.bound(format!("{i:08}").as_bytes()), Some(0));
        assert_eq!(b.bound(b"00000000"), None);
    }
}
