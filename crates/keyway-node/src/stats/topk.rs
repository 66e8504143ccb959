//! The space-saving algorithm (Metwally, Agrawal, El Abbadi, 2005): the
//! heaviest keys of a stream in bounded memory.
//!
//! The sketch keeps at most `capacity` counters. A key already counted gains
//! its weight; a new key takes a free counter, or else *replaces the smallest
//! counter*, inheriting its count (the count is then an over-estimate by at
//! most that inherited `error`). Every key whose true count exceeds
//! `total / capacity` is guaranteed to be in the sketch, and every count is
//! over-estimated by at most `total / capacity`.

use bytes::Bytes;
use keyway_command::name::Fnv1aBuild;
use std::collections::HashMap;

/// One counted key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counter {
    /// Estimated count (an upper bound of the true count).
    count: u64,
    /// What the count inherited when the key replaced another (`count -
    /// error` is a lower bound of the true count).
    error: u64,
}

/// A space-saving sketch over byte keys.
///
/// The counters are a binary min-heap on their count, with an index from
/// key to heap position, so the smallest counter (the one a new key
/// replaces) is found in O(1) and every offer costs O(log capacity). A
/// scan of every counter for the smallest, as this sketch first did, cost
/// most of the request path's statistics under a uniform load (where
/// nearly every sampled key is new). Counts only grow, so a counter only
/// ever moves down the heap.
#[derive(Clone, Debug)]
pub struct SpaceSaving {
    capacity: usize,
    /// Min-heap on `Counter::count`.
    heap: Vec<(Bytes, Counter)>,
    /// Key to its position in `heap` (FNV: at most `capacity` entries, so a
    /// chosen collision costs a scan of that many).
    index: HashMap<Bytes, usize, Fnv1aBuild>,
    total: u64,
}

impl SpaceSaving {
    /// A sketch of at most `capacity` counters (at least 1).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        SpaceSaving {
            capacity,
            heap: Vec::with_capacity(capacity),
            index: HashMap::with_capacity_and_hasher(capacity, Fnv1aBuild::default()),
            total: 0,
        }
    }

    /// Counts `weight` occurrences of `key`; `key` is copied only when it is
    /// not counted yet.
    pub fn offer(&mut self, key: &[u8], weight: u64) {
        self.total += weight;
        if let Some(&at) = self.index.get(key) {
            self.heap[at].1.count += weight;
            self.sift_down(at);
            return;
        }
        let key = Bytes::copy_from_slice(key);
        if self.heap.len() < self.capacity {
            let at = self.heap.len();
            self.heap.push((
                key.clone(),
                Counter {
                    count: weight,
                    error: 0,
                },
            ));
            self.index.insert(key, at);
            self.sift_up(at);
            return;
        }
        // Replace the smallest counter: the heap's root.
        let min = self.heap[0].1;
        let (victim, _) = std::mem::replace(
            &mut self.heap[0],
            (
                key.clone(),
                Counter {
                    count: min.count + weight,
                    error: min.count,
                },
            ),
        );
        self.index.remove(&victim);
        self.index.insert(key, 0);
        self.sift_down(0);
    }

    /// Moves the counter at `at` up while it is smaller than its parent.
    fn sift_up(&mut self, mut at: usize) {
        while at > 0 {
            let parent = (at - 1) / 2;
            if self.heap[parent].1.count <= self.heap[at].1.count {
                break;
            }
            self.swap(at, parent);
            at = parent;
        }
    }

    /// Moves the counter at `at` down while a child is smaller.
    fn sift_down(&mut self, mut at: usize) {
        loop {
            let (left, right) = (2 * at + 1, 2 * at + 2);
            let mut smallest = at;
            if left < self.heap.len() && self.heap[left].1.count < self.heap[smallest].1.count {
                smallest = left;
            }
            if right < self.heap.len() && self.heap[right].1.count < self.heap[smallest].1.count {
                smallest = right;
            }
            if smallest == at {
                return;
            }
            self.swap(at, smallest);
            at = smallest;
        }
    }

    /// Swaps two heap positions and their index entries.
    fn swap(&mut self, a: usize, b: usize) {
        self.heap.swap(a, b);
        for at in [a, b] {
            let slot = self
                .index
                .get_mut(&self.heap[at].0)
                .expect("every heap key is indexed");
            *slot = at;
        }
    }

    /// Everything offered so far (the stream's length).
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Counters in use (never more than the capacity).
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// Every counted key with its estimated count, in no order.
    fn counts(&self) -> impl Iterator<Item = (&Bytes, u64)> {
        self.heap.iter().map(|(k, c)| (k, c.count))
    }

    /// Every counted key with its estimated count, heaviest first (ties in
    /// key order, so the result is deterministic).
    pub fn ranked(&self) -> Vec<(Bytes, u64)> {
        let mut out: Vec<(Bytes, u64)> = self.counts().map(|(k, c)| (k.clone(), c)).collect();
        out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        out
    }

    /// The lower bound of `key`'s true count (`None`: not counted).
    pub fn guaranteed(&self, key: &[u8]) -> Option<u64> {
        self.index.get(key).map(|&at| {
            let c = self.heap[at].1;
            c.count - c.error
        })
    }

    /// The heap's shape and the index agree (tests; TIGER_STYLE's pair to
    /// every offer).
    #[cfg(test)]
    fn assert_invariants(&self) {
        assert!(self.heap.len() <= self.capacity);
        assert_eq!(self.index.len(), self.heap.len());
        for (at, (key, c)) in self.heap.iter().enumerate() {
            assert_eq!(self.index.get(key), Some(&at), "index of {key:?}");
            assert!(c.error <= c.count);
            if at > 0 {
                assert!(
                    self.heap[(at - 1) / 2].1.count <= c.count,
                    "heap order at {at}"
                );
            }
        }
    }
}

/// Weighted merge of several sketches' rankings (shards, windows): counts of
/// the same key add up, each sketch scaled by its weight; the heaviest
/// `keep` keys are returned, heaviest first, with the weighted total of the
/// streams.
pub fn merge_ranked<'a>(
    parts: impl IntoIterator<Item = (&'a SpaceSaving, f64)>,
    keep: usize,
) -> (Vec<(Bytes, f64)>, f64) {
    let mut sums: HashMap<Bytes, f64> = HashMap::new();
    let mut total = 0.0;
    for (sketch, weight) in parts {
        if weight <= 0.0 {
            continue;
        }
        total += sketch.total() as f64 * weight;
        for (k, c) in sketch.counts() {
            *sums.entry(k.clone()).or_default() += c as f64 * weight;
        }
    }
    let mut out: Vec<(Bytes, f64)> = sums.into_iter().collect();
    out.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    out.truncate(keep);
    (out, total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// A Zipf(s) sampler over ranks 1..=n by inverse CDF.
    fn zipf_cdf(n: usize, s: f64) -> Vec<f64> {
        let weights: Vec<f64> = (1..=n).map(|r| 1.0 / (r as f64).powf(s)).collect();
        let sum: f64 = weights.iter().sum();
        let mut acc = 0.0;
        weights
            .iter()
            .map(|w| {
                acc += w / sum;
                acc
            })
            .collect()
    }

    #[test]
    fn keeps_the_true_heavy_hitters_of_a_zipf_stream_in_bounded_memory() {
        let (distinct, capacity, len) = (20_000, 64, 200_000);
        let cdf = zipf_cdf(distinct, 1.1);
        let mut rng = StdRng::seed_from_u64(7);
        let mut sketch = SpaceSaving::new(capacity);
        let mut truth: HashMap<usize, u64> = HashMap::new();
        for _ in 0..len {
            let u: f64 = rng.random();
            let rank = cdf.partition_point(|c| *c < u).min(distinct - 1);
            *truth.entry(rank).or_default() += 1;
            sketch.offer(format!("key:{rank}").as_bytes(), 1);
            assert!(sketch.len() <= capacity, "memory stays bounded");
        }
        assert_eq!(sketch.total(), len as u64);
        let mut true_top: Vec<(usize, u64)> = truth.into_iter().collect();
        true_top.sort_by_key(|t| std::cmp::Reverse(t.1));
        let reported: Vec<Bytes> = sketch
            .ranked()
            .into_iter()
            .take(16)
            .map(|(k, _)| k)
            .collect();
        for (rank, count) in true_top.iter().take(10) {
            let key = Bytes::from(format!("key:{rank}"));
            assert!(
                reported.contains(&key),
                "true heavy hitter {rank} ({count} hits) missing from {reported:?}"
            );
            let lower = sketch.guaranteed(&key).unwrap();
            assert!(lower <= *count, "the lower bound holds");
            let over = sketch.ranked().iter().find(|(k, _)| *k == key).unwrap().1 - count;
            assert!(
                over <= len as u64 / capacity as u64,
                "over-estimate {over} above total/capacity"
            );
        }
        // The heaviest key comes first.
        assert_eq!(reported[0], Bytes::from(format!("key:{}", true_top[0].0)));
    }

    /// Every offer keeps the heap and index in agreement, a new key always
    /// replaces a smallest counter (its error is the minimum before the
    /// offer), the counts add up to the stream, and each count bounds the
    /// truth from above within `total / capacity`, with `count - error`
    /// below it.
    #[test]
    fn a_new_key_replaces_the_smallest_counter_and_the_bounds_hold() {
        let mut rng = StdRng::seed_from_u64(11);
        for capacity in [1, 2, 7, 64] {
            let mut sketch = SpaceSaving::new(capacity);
            let mut truth: HashMap<Bytes, u64> = HashMap::new();
            for _ in 0..5_000 {
                // A few heavy keys among many light ones, random weights.
                let key = match rng.random_range(0..4) {
                    0 => format!("hot:{}", rng.random_range(0..3)),
                    _ => format!("k:{}", rng.random_range(0..500)),
                };
                let weight = rng.random_range(1..4);
                let full_min = (sketch.len() == capacity
                    && sketch.guaranteed(key.as_bytes()).is_none())
                .then(|| sketch.counts().map(|(_, c)| c).min().unwrap());
                sketch.offer(key.as_bytes(), weight);
                *truth.entry(Bytes::from(key.clone())).or_default() += weight;
                sketch.assert_invariants();
                if let Some(min) = full_min {
                    let at = sketch.index[key.as_bytes()];
                    assert_eq!(
                        sketch.heap[at].1.error, min,
                        "{key} replaced a counter above the minimum"
                    );
                }
            }
            let counts: u64 = sketch.counts().map(|(_, c)| c).sum();
            assert_eq!(counts, sketch.total(), "the counts add up to the stream");
            for (key, count) in sketch.ranked() {
                let true_count = truth[&key];
                assert!(
                    count >= true_count,
                    "{key:?}: {count} below the truth {true_count}"
                );
                assert!(count - true_count <= sketch.total() / capacity as u64);
                assert!(sketch.guaranteed(&key).unwrap() <= true_count);
            }
        }
    }

    #[test]
    fn merging_adds_counts_and_scales_by_weight() {
        let mut a = SpaceSaving::new(4);
        let mut b = SpaceSaving::new(4);
        a.offer(b"x", 10);
        a.offer(b"y", 2);
        b.offer(b"x", 4);
        b.offer(b"z", 6);
        let (top, total) = merge_ranked([(&a, 1.0), (&b, 0.5)], 2);
        assert_eq!(total, 12.0 + 5.0);
        assert_eq!(top, vec![(Bytes::from("x"), 12.0), (Bytes::from("z"), 3.0)]);
    }
}
