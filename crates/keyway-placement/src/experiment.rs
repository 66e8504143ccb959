//! The chapter's experiments (seed 004, sections 3.3, 4.2 and 6): place a
//! workload on N nodes, add nodes, and measure per scheme the fraction of
//! keys that moved and the busiest node's load over the mean, over several
//! layouts (a layout is a seed: the node names and the key hashes).
//!
//! The workload is `user:0 .. user:{K-1}`; with a Zipf exponent `s > 0`,
//! key `user:i` is the (i+1)-th most popular and gets request weight
//! proportional to `1/(i+1)^s`. Salting (section 6.2) splits each of the
//! top keys into `ways` keys `user:i#0 .. user:i#{ways-1}`, each taking an
//! equal part of the key's requests.
//!
//! Balance is measured on the node set after the join (the cluster you end
//! up with), by key count and by request weight.

use std::thread;

use crate::{
    BoundedLoads, DEFAULT_TABLE_SIZE, Jump, Key, Keyway, Maglev, Modulo, Rendezvous, Ring, Scheme,
    hash64, next_prime,
};

/// One row of the experiment: a scheme and its parameters.
#[derive(Clone, Debug, PartialEq)]
pub enum SchemeSpec {
    /// `hash % N`.
    Modulo,
    /// A ring with this many tokens per node.
    Ring { tokens: usize },
    /// Jump consistent hash.
    Jump,
    /// Rendezvous (equal weights).
    Rendezvous,
    /// Maglev; `None` sizes the table at the first prime
    /// `>= max(65537, 100 × nodes)`.
    Maglev { size: Option<usize> },
    /// Bounded loads on a ring with `tokens` per node, capacity `factor` × mean.
    Bounded { tokens: usize, factor: f64 },
    /// Keyway: key → slot → one of `partitions` partitions → node.
    Keyway { partitions: u32 },
}

impl SchemeSpec {
    /// The row's short name (`scheme` in JSON).
    pub fn name(&self) -> String {
        match self {
            Self::Modulo => "modulo".into(),
            Self::Ring { tokens } => format!("ring-{tokens}"),
            Self::Jump => "jump".into(),
            Self::Rendezvous => "rendezvous".into(),
            Self::Maglev { .. } => "maglev".into(),
            Self::Bounded { factor, .. } => format!("bounded-{factor}"),
            Self::Keyway { .. } => "keyway".into(),
        }
    }

    /// What the row is, for people.
    pub fn describe(&self, nodes_after: usize) -> String {
        match self {
            Self::Modulo => "hash(key) % N".into(),
            Self::Ring { tokens: 1 } => "ring, 1 token per node".into(),
            Self::Ring { tokens } => format!("ring, {tokens} tokens per node"),
            Self::Jump => "jump consistent hash".into(),
            Self::Rendezvous => "rendezvous (highest random weight)".into(),
            Self::Maglev { size } => {
                format!("Maglev, table of {}", maglev_size(*size, nodes_after))
            }
            Self::Bounded { tokens, factor } => {
                format!("bounded loads, cap {factor} x mean, {tokens} tokens per node")
            }
            Self::Keyway { partitions } => {
                format!("Keyway: CRC16 slot -> {partitions} partitions -> node")
            }
        }
    }

    /// The scheme for `before` nodes and for `after` nodes (a join), for
    /// layout `seed`; `keys` is the key set (bounded loads places it).
    pub fn build(
        &self,
        before: usize,
        after: usize,
        seed: u64,
        keys: &[Key],
    ) -> (Box<dyn Scheme>, Box<dyn Scheme>) {
        match self {
            Self::Modulo => (Box::new(Modulo::new(before)), Box::new(Modulo::new(after))),
            Self::Ring { tokens } => (
                Box::new(Ring::new(before, *tokens, seed)),
                Box::new(Ring::new(after, *tokens, seed)),
            ),
            Self::Jump => (Box::new(Jump::new(before)), Box::new(Jump::new(after))),
            Self::Rendezvous => (
                Box::new(Rendezvous::new(before, seed)),
                Box::new(Rendezvous::new(after, seed)),
            ),
            Self::Maglev { size } => {
                let m = maglev_size(*size, after);
                (
                    Box::new(Maglev::new(before, m, seed)),
                    Box::new(Maglev::new(after, m, seed)),
                )
            }
            Self::Bounded { tokens, factor } => (
                Box::new(BoundedLoads::place(
                    Ring::new(before, *tokens, seed),
                    *factor,
                    keys,
                )),
                Box::new(BoundedLoads::place(
                    Ring::new(after, *tokens, seed),
                    *factor,
                    keys,
                )),
            ),
            Self::Keyway { partitions } => {
                let a = Keyway::bootstrap(before, *partitions);
                let b = a.join(after - before);
                (Box::new(a), Box::new(b))
            }
        }
    }
}

fn maglev_size(size: Option<usize>, nodes: usize) -> usize {
    size.unwrap_or_else(|| next_prime(DEFAULT_TABLE_SIZE.max(100 * nodes)))
}

/// Keys with their request weights.
#[derive(Clone, Debug)]
pub struct Workload {
    bytes: Vec<u8>,
    ends: Vec<usize>,
    slots: Vec<u16>,
    weights: Vec<f64>,
}

impl Workload {
    /// `keys` keys, Zipf exponent `zipf` (0: every key equally popular),
    /// the `salt_top` most popular each split into `salt_ways` keys.
    pub fn new(keys: usize, zipf: f64, salt_top: usize, salt_ways: usize) -> Self {
        assert!(keys > 0, "a workload needs keys");
        assert!(zipf >= 0.0 && zipf.is_finite(), "the Zipf exponent is >= 0");
        let ways = salt_ways.max(1);
        let mut w = Workload {
            bytes: Vec::new(),
            ends: Vec::new(),
            slots: Vec::new(),
            weights: Vec::new(),
        };
        let mut push = |name: String, weight: f64| {
            w.slots.push(keyway_map::key_hash_slot(name.as_bytes()));
            w.bytes.extend_from_slice(name.as_bytes());
            w.ends.push(w.bytes.len());
            w.weights.push(weight);
        };
        for i in 0..keys {
            let weight = 1.0 / ((i + 1) as f64).powf(zipf);
            if i < salt_top && ways > 1 {
                for p in 0..ways {
                    push(format!("user:{i}#{p}"), weight / ways as f64);
                }
            } else {
                push(format!("user:{i}"), weight);
            }
        }
        let total: f64 = w.weights.iter().sum();
        w.weights.iter_mut().for_each(|x| *x /= total);
        w
    }

    /// The number of keys (salted pieces count one each).
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Always false: a workload has keys.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Key `i`'s bytes.
    pub fn name(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.bytes[start..self.ends[i]]
    }

    /// Each key's share of the requests (they sum to 1).
    pub fn weights(&self) -> &[f64] {
        &self.weights
    }

    /// The hottest key's share of the requests.
    pub fn hottest_share(&self) -> f64 {
        self.weights.iter().copied().fold(0.0, f64::max)
    }

    /// The keys hashed under layout `seed`.
    pub fn keys(&self, seed: u64) -> Vec<Key> {
        (0..self.len())
            .map(|i| Key {
                hash: hash64(seed, self.name(i)),
                slot: self.slots[i],
            })
            .collect()
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct Setup {
    pub keys: usize,
    pub nodes: usize,
    /// Nodes that join (nodes after = `nodes + add`).
    pub add: usize,
    /// Layouts (seeds) to run each scheme on.
    pub layouts: u32,
    /// The first layout's seed; layout `l` hashes under `hash64(seed, l)`.
    pub seed: u64,
    /// Zipf exponent; 0 for uniform requests.
    pub zipf: f64,
    pub salt_top: usize,
    pub salt_ways: usize,
    pub schemes: Vec<SchemeSpec>,
}

impl Setup {
    /// Section 4.2's set-up: 200,000 keys, 10 nodes growing to 11, nine
    /// layouts, uniform requests, every scheme (rings with 1, 16 and 256
    /// tokens; bounded loads at 1.25 on 16 tokens; Keyway with `partitions`
    /// partitions).
    pub fn chapter(partitions: u32) -> Self {
        Self {
            keys: 200_000,
            nodes: 10,
            add: 1,
            layouts: 9,
            seed: 0,
            zipf: 0.0,
            salt_top: 0,
            salt_ways: 1,
            schemes: Self::schemes(&[1, 16, 256], 16, 1.25, partitions),
        }
    }

    /// Every scheme: `hash % N`, one ring per token count, jump, rendezvous,
    /// Maglev, bounded loads (a ring of `bounded_tokens` per node, capacity
    /// `bounded_factor` × mean) and Keyway with `partitions` partitions.
    pub fn schemes(
        tokens: &[usize],
        bounded_tokens: usize,
        bounded_factor: f64,
        partitions: u32,
    ) -> Vec<SchemeSpec> {
        let mut s = vec![SchemeSpec::Modulo];
        s.extend(tokens.iter().map(|&tokens| SchemeSpec::Ring { tokens }));
        s.extend([
            SchemeSpec::Jump,
            SchemeSpec::Rendezvous,
            SchemeSpec::Maglev { size: None },
            SchemeSpec::Bounded {
                tokens: bounded_tokens,
                factor: bounded_factor,
            },
            SchemeSpec::Keyway { partitions },
        ]);
        s
    }

    /// The fair share the joining nodes should take: `add / (nodes + add)`.
    pub fn ideal_fraction(&self) -> f64 {
        self.add as f64 / (self.nodes + self.add) as f64
    }
}

/// One scheme's results over all layouts.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub scheme: String,
    pub description: String,
    /// Median over layouts of the fraction of keys whose owner changed.
    pub moved_fraction: f64,
    /// The largest moved fraction of any layout.
    pub moved_fraction_worst: f64,
    pub ideal_fraction: f64,
    /// Busiest node's key count over the mean: median and worst layout.
    pub max_over_mean_median: f64,
    pub max_over_mean_worst: f64,
    /// The same by request weight (equal to the key columns when uniform).
    pub request_max_over_mean_median: f64,
    pub request_max_over_mean_worst: f64,
}

/// All rows of one run.
#[derive(Clone, Debug)]
pub struct Report {
    pub keys: usize,
    pub nodes_before: usize,
    pub nodes_after: usize,
    pub layouts: u32,
    pub hottest_key_share: f64,
    pub rows: Vec<Row>,
}

impl Report {
    /// The row named `scheme`.
    pub fn row(&self, scheme: &str) -> Option<&Row> {
        self.rows.iter().find(|r| r.scheme == scheme)
    }

    /// Among rows other than `except`: the one moving closest to the ideal,
    /// and the one with the lowest median max/mean.
    pub fn best_except(&self, except: &str) -> Option<(&Row, &Row)> {
        let others = || self.rows.iter().filter(|r| r.scheme != except);
        let moved = others().min_by(|a, b| {
            let da = (a.moved_fraction - a.ideal_fraction).abs();
            let db = (b.moved_fraction - b.ideal_fraction).abs();
            da.total_cmp(&db)
        })?;
        let balance =
            others().min_by(|a, b| a.max_over_mean_median.total_cmp(&b.max_over_mean_median))?;
        Some((moved, balance))
    }
}

/// Per layout and scheme: moved fraction, key max/mean, request max/mean.
type Measure = (f64, f64, f64);

/// Runs `setup`: every scheme on every layout (layouts in parallel).
pub fn run(setup: &Setup) -> Report {
    assert!(setup.nodes > 0 && setup.layouts > 0);
    let workload = Workload::new(setup.keys, setup.zipf, setup.salt_top, setup.salt_ways);
    let threads = thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(setup.layouts as usize);
    let mut per_layout: Vec<(u32, Vec<Measure>)> = thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let workload = &workload;
                s.spawn(move || {
                    (0..setup.layouts)
                        .filter(|l| *l as usize % threads == t)
                        .map(|l| (l, measure_layout(setup, workload, l)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("layout thread panicked"))
            .collect()
    });
    per_layout.sort_by_key(|(l, _)| *l);
    let after = setup.nodes + setup.add;
    let rows = setup
        .schemes
        .iter()
        .enumerate()
        .map(|(i, spec)| {
            let col = |f: fn(&Measure) -> f64| -> Vec<f64> {
                per_layout.iter().map(|(_, m)| f(&m[i])).collect()
            };
            let (moved, keys, reqs) = (col(|m| m.0), col(|m| m.1), col(|m| m.2));
            Row {
                scheme: spec.name(),
                description: spec.describe(after),
                moved_fraction: median(&moved),
                moved_fraction_worst: max(&moved),
                ideal_fraction: setup.ideal_fraction(),
                max_over_mean_median: median(&keys),
                max_over_mean_worst: max(&keys),
                request_max_over_mean_median: median(&reqs),
                request_max_over_mean_worst: max(&reqs),
            }
        })
        .collect();
    Report {
        keys: workload.len(),
        nodes_before: setup.nodes,
        nodes_after: after,
        layouts: setup.layouts,
        hottest_key_share: workload.hottest_share(),
        rows,
    }
}

/// The seed of layout `l`.
pub fn layout_seed(seed: u64, l: u32) -> u64 {
    hash64(seed, &l.to_le_bytes())
}

fn measure_layout(setup: &Setup, workload: &Workload, l: u32) -> Vec<Measure> {
    let seed = layout_seed(setup.seed, l);
    let keys = workload.keys(seed);
    let after = setup.nodes + setup.add;
    let weights = workload.weights();
    setup
        .schemes
        .iter()
        .map(|spec| {
            let (a, b) = spec.build(setup.nodes, after, seed, &keys);
            let mut counts = vec![0u64; after];
            let mut load = vec![0f64; after];
            let mut moved = 0u64;
            for (k, w) in keys.iter().zip(weights) {
                let o = b.owner(k);
                moved += u64::from(a.owner(k) != o);
                counts[o as usize] += 1;
                load[o as usize] += w;
            }
            let n = keys.len() as f64;
            let max_count = counts.iter().copied().max().unwrap_or(0) as f64;
            (
                moved as f64 / n,
                max_count * after as f64 / n,
                max(&load) * after as f64,
            )
        })
        .collect()
}

fn max(xs: &[f64]) -> f64 {
    xs.iter().copied().fold(f64::NEG_INFINITY, f64::max)
}

/// The median (mean of the middle two for an even count).
fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_and_salting() {
        // Section 6.1: one key of a million takes about 6.9% (1/H_n).
        let w = Workload::new(1_000_000, 1.0, 0, 1);
        assert!(
            (w.hottest_share() - 0.0695).abs() < 0.0005,
            "{}",
            w.hottest_share()
        );
        let salted = Workload::new(1000, 1.0, 100, 8);
        assert_eq!(salted.len(), 1000 + 100 * 7);
        assert_eq!(salted.name(0), b"user:0#0");
        assert_eq!(salted.name(7), b"user:0#7");
        assert_eq!(salted.name(800), b"user:100");
        let sum: f64 = salted.weights().iter().sum();
        assert!((sum - 1.0).abs() < 1e-9);
        let plain = Workload::new(1000, 1.0, 0, 1);
        assert!((salted.hottest_share() - plain.hottest_share() / 8.0).abs() < 1e-12);
        let uniform = Workload::new(10, 0.0, 0, 1);
        assert!(uniform.weights().iter().all(|&w| (w - 0.1).abs() < 1e-12));
    }

    #[test]
    fn median_and_max() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(max(&[1.0, 5.0, 2.0]), 5.0);
    }

    #[test]
    fn small_run_shows_the_pattern() {
        let setup = Setup {
            keys: 30_000,
            layouts: 5,
            ..Setup::chapter(1024)
        };
        let r = run(&setup);
        assert_eq!(r.rows.len(), setup.schemes.len());
        let ideal = 1.0 / 11.0;
        let modulo = r.row("modulo").unwrap();
        assert!((modulo.moved_fraction - 10.0 / 11.0).abs() < 0.02);
        for name in ["jump", "rendezvous", "keyway", "ring-256"] {
            let row = r.row(name).unwrap();
            assert!((row.moved_fraction - ideal).abs() < 0.25 * ideal, "{row:?}");
        }
        let (one, many) = (r.row("ring-1").unwrap(), r.row("ring-256").unwrap());
        assert!(one.max_over_mean_worst > many.max_over_mean_worst + 0.5);
        // Bounded loads caps the 16-token ring's imbalance at 1.25.
        let bounded = r.row("bounded-1.25").unwrap();
        // (capacity is ceil(1.25 × keys / nodes): at most one key over)
        assert!(bounded.max_over_mean_worst <= 1.25 + 11.0 / 30_000.0);
        assert!(r.row("ring-16").unwrap().max_over_mean_worst > 1.25);
        // Uniform: request balance is key balance.
        for row in &r.rows {
            assert!((row.max_over_mean_median - row.request_max_over_mean_median).abs() < 1e-9);
        }
        // Deterministic.
        assert_eq!(run(&setup).rows, r.rows);
    }

    #[test]
    fn a_hot_key_outweighs_balance_and_salting_cures_it() {
        let setup = Setup {
            keys: 100_000,
            add: 0,
            layouts: 3,
            zipf: 1.0,
            schemes: vec![SchemeSpec::Modulo, SchemeSpec::Jump],
            ..Setup::chapter(1024)
        };
        let hot = run(&setup);
        let salted = run(&Setup {
            salt_top: 100,
            salt_ways: 8,
            ..setup.clone()
        });
        for name in ["modulo", "jump"] {
            let (h, s) = (hot.row(name).unwrap(), salted.row(name).unwrap());
            // The hottest key alone is ~8% of requests: node load >= 1.7x.
            assert!(h.request_max_over_mean_median > 1.6, "{h:?}");
            assert!(s.request_max_over_mean_median < h.request_max_over_mean_median - 0.3);
            assert!(h.max_over_mean_worst < 1.05);
            assert_eq!(h.moved_fraction, 0.0);
        }
    }
}
