//! Split keys: where to cut a partition so that its two halves carry about
//! the same load ([`load_split_key`], from sampled requests) or the same
//! bytes ([`SizeMarkers`], from a size scan).
//!
//! Both work on *boundaries*: the keyspace-local routing keys a partition may
//! be cut at. In a hash keyspace partition bounds are slot-aligned, so a
//! key's boundary is its slot's first routing key (`be16(slot)`); in a range
//! keyspace it is the key itself ([`boundary`]). A split key is always a
//! boundary strictly inside the partition with something on both sides.

use bytes::Bytes;
use keyway_map::Routing;

/// The boundary a keyspace-local routing key can be split at: its slot's
/// lower bound (`hash`), or the key itself (`range`).
pub fn boundary(routing: Routing, local_key: &[u8]) -> &[u8] {
    match routing {
        Routing::Hash => &local_key[..local_key.len().min(2)],
        Routing::Range => local_key,
    }
}

/// The boundary that splits the weighted `samples` (boundary, weight) into
/// two halves of the most equal weight: the first boundary of the upper
/// half. `None` with fewer than two distinct boundaries (nothing to cut
/// between). Samples need not be sorted.
pub fn load_split_key(mut samples: Vec<(Bytes, f64)>) -> Option<Bytes> {
    samples.sort_by(|a, b| a.0.cmp(&b.0));
    // Aggregate equal boundaries.
    let mut distinct: Vec<(Bytes, f64)> = Vec::new();
    for (k, w) in samples {
        match distinct.last_mut() {
            Some((last, sum)) if *last == k => *sum += w,
            _ => distinct.push((k, w)),
        }
    }
    if distinct.len() < 2 {
        return None;
    }
    let total: f64 = distinct.iter().map(|(_, w)| w).sum();
    let mut below = 0.0;
    let mut best: Option<(f64, usize)> = None;
    for (i, (_, w)) in distinct.iter().enumerate() {
        if i > 0 {
            let gap = (total - 2.0 * below).abs();
            if best.is_none_or(|(g, _)| gap < g) {
                best = Some((gap, i));
            }
        }
        below += w;
    }
    best.map(|(_, i)| distinct[i].0.clone())
}

/// Bounded bookkeeping of a size scan, to find the boundary at about half a
/// partition's bytes in one pass (the total is known only at the end).
///
/// While keys stream by in order, a marker `(boundary, bytes before it)` is
/// kept at each new boundary at least `gap` bytes past the previous marker;
/// when more than `capacity` markers pile up, every other one is dropped and
/// `gap` doubles. The chosen split is then within about `total / capacity`
/// bytes of the true half-way point (or of the nearest boundary to it).
#[derive(Clone, Debug)]
pub struct SizeMarkers {
    routing: Routing,
    capacity: usize,
    gap: u64,
    marks: Vec<(Bytes, u64)>,
    last_boundary: Option<Bytes>,
    bytes: u64,
    keys: u64,
}

impl SizeMarkers {
    /// At most `capacity` markers (at least 2).
    pub fn new(routing: Routing, capacity: usize) -> Self {
        SizeMarkers {
            routing,
            capacity: capacity.max(2),
            gap: 1,
            marks: Vec::new(),
            last_boundary: None,
            bytes: 0,
            keys: 0,
        }
    }

    /// One live key (in key order) of `size` payload bytes.
    pub fn observe(&mut self, local_key: &[u8], size: u64) {
        let b = boundary(self.routing, local_key);
        if self.last_boundary.as_deref() != Some(b) {
            let far_enough = self
                .marks
                .last()
                .is_none_or(|(_, at)| self.bytes - at >= self.gap);
            // Cutting before the first key would leave the lower half empty.
            if self.bytes > 0 && far_enough {
                self.marks.push((Bytes::copy_from_slice(b), self.bytes));
                if self.marks.len() > self.capacity {
                    let mut i = 0;
                    self.marks.retain(|_| {
                        i += 1;
                        i % 2 == 0
                    });
                    self.gap = self.gap.saturating_mul(2);
                }
            }
            self.last_boundary = Some(Bytes::copy_from_slice(b));
        }
        self.bytes += size;
        self.keys += 1;
    }

    pub fn keys(&self) -> u64 {
        self.keys
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The marker closest to half the bytes seen (`None`: fewer than two
    /// boundaries, e.g. fewer than two keys or one slot).
    pub fn split_key(&self) -> Option<Bytes> {
        let half = self.bytes / 2;
        self.marks
            .iter()
            .min_by_key(|(_, at)| at.abs_diff(half))
            .map(|(k, _)| k.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    /// Load below and at-or-above `split` in `dist`.
    fn halves(dist: &[(Bytes, f64)], split: &[u8]) -> (f64, f64) {
        let below = dist
            .iter()
            .filter(|(k, _)| &k[..] < split)
            .map(|(_, w)| w)
            .sum();
        let above = dist
            .iter()
            .filter(|(k, _)| &k[..] >= split)
            .map(|(_, w)| w)
            .sum();
        (below, above)
    }

    #[test]
    fn the_load_split_balances_a_skewed_distribution() {
        // 40 keys with Zipf-like weights: the busiest holds ~23%.
        let dist: Vec<(Bytes, f64)> = (0..40)
            .map(|i| (b(&format!("k{i:02}")), 1.0 / ((i % 13) as f64 + 1.0)))
            .collect();
        let total: f64 = dist.iter().map(|(_, w)| w).sum();
        let split = load_split_key(dist.clone()).unwrap();
        let (below, above) = halves(&dist, &split);
        assert!(below > 0.0 && above > 0.0);
        // The best cut is off half by at most the weight of the one key at
        // the cut; this distribution's largest is 1.0 of ~25.
        assert!(
            (below - above).abs() / total < 1.0 / total + 1e-9,
            "below {below} above {above} of {total} at {split:?}"
        );
    }

    #[test]
    fn no_load_split_without_two_distinct_boundaries() {
        assert_eq!(load_split_key(vec![]), None);
        assert_eq!(load_split_key(vec![(b("a"), 3.0), (b("a"), 1.0)]), None);
        // With two, the cut is at the upper one.
        assert_eq!(
            load_split_key(vec![(b("b"), 1.0), (b("a"), 1.0)]),
            Some(b("b"))
        );
    }

    #[test]
    fn size_markers_find_the_half_way_boundary_in_bounded_memory() {
        let mut m = SizeMarkers::new(Routing::Range, 16);
        for i in 0..10_000u32 {
            m.observe(format!("key{i:05}").as_bytes(), 100);
            assert!(m.marks.len() <= 16);
        }
        assert_eq!((m.keys(), m.bytes()), (10_000, 1_000_000));
        let split = m.split_key().unwrap();
        let before: u64 = (0..10_000u32)
            .filter(|i| format!("key{i:05}").as_bytes() < &split[..])
            .count() as u64
            * 100;
        let off = before.abs_diff(500_000);
        assert!(off <= 1_000_000 / 8, "split {split:?} at {before} bytes");
    }

    #[test]
    fn hash_size_markers_cut_at_slot_bounds_and_never_before_the_first_key() {
        let mut m = SizeMarkers::new(Routing::Hash, 8);
        let key = |slot: u16, k: &str| [&slot.to_be_bytes()[..], k.as_bytes()].concat();
        m.observe(&key(5, "a"), 10);
        m.observe(&key(5, "b"), 10);
        assert_eq!(m.split_key(), None, "one slot: nothing to cut");
        m.observe(&key(9, "c"), 20);
        assert_eq!(
            m.split_key(),
            Some(Bytes::copy_from_slice(&9u16.to_be_bytes()))
        );
    }
}
