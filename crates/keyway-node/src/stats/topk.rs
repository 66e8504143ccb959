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
#[derive(Clone, Debug)]
pub struct SpaceSaving {
    capacity: usize,
    counters: HashMap<Bytes, Counter>,
    total: u64,
}

impl SpaceSaving {
    /// A sketch of at most `capacity` counters (at least 1).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        SpaceSaving {
            capacity,
            counters: HashMap::with_capacity(capacity),
            total: 0,
        }
    }

    /// Counts `weight` occurrences of `key`; `key` is copied only when it is
    /// not counted yet.
    pub fn offer(&mut self, key: &[u8], weight: u64) {
        self.total += weight;
        if let Some(c) = self.counters.get_mut(key) {
            c.count += weight;
            return;
        }
        if self.counters.len() < self.capacity {
            self.counters.insert(
                Bytes::copy_from_slice(key),
                Counter {
                    count: weight,
                    error: 0,
                },
            );
            return;
        }
        // Replace the smallest counter (O(capacity); the sketch is small and
        // only sampled requests reach it).
        let smallest = self
            .counters
            .iter()
            .min_by_key(|(_, c)| c.count)
            .map(|(k, c)| (k.clone(), *c));
        if let Some((victim, min)) = smallest {
            self.counters.remove(&victim);
            self.counters.insert(
                Bytes::copy_from_slice(key),
                Counter {
                    count: min.count + weight,
                    error: min.count,
                },
            );
        }
    }

    /// Everything offered so far (the stream's length).
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Counters in use (never more than the capacity).
    pub fn len(&self) -> usize {
        self.counters.len()
    }

    pub fn is_empty(&self) -> bool {
        self.counters.is_empty()
    }

    /// Every counted key with its estimated count, heaviest first (ties in
    /// key order, so the result is deterministic).
    pub fn ranked(&self) -> Vec<(Bytes, u64)> {
        let mut out: Vec<(Bytes, u64)> = self
            .counters
            .iter()
            .map(|(k, c)| (k.clone(), c.count))
            .collect();
        out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        out
    }

    /// The lower bound of `key`'s true count (`None`: not counted).
    pub fn guaranteed(&self, key: &[u8]) -> Option<u64> {
        self.counters.get(key).map(|c| c.count - c.error)
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
        for (k, c) in &sketch.counters {
            *sums.entry(k.clone()).or_default() += c.count as f64 * weight;
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
