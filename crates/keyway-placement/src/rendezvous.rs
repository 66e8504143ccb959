//! Rendezvous hashing, highest random weight (Thaler and Ravishankar, 1998;
//! seed 004, section 4.1): score every node with `hash(key, node)` and pick
//! the highest. Removing a node moves only its keys; adding one moves to it
//! exactly the keys it now wins. A lookup costs one hash per node.
//!
//! Weighted (Schindelhauer and Schomaker's logarithmic method): node `i`
//! scores `w_i / -ln(u)`, with `u` uniform in (0, 1) from the hash, so node
//! `i` wins a fraction `w_i / sum(w)` of the keys.

use crate::{Key, NodeIdx, Scheme, mix64, node_hash};

/// Rendezvous hashing over nodes identified by their name hashes.
#[derive(Clone, Debug)]
pub struct Rendezvous {
    ids: Vec<u64>,
    weights: Vec<f64>,
    uniform: bool,
}

impl Rendezvous {
    /// `nodes` equally weighted nodes, named under `seed` (the layout).
    pub fn new(nodes: usize, seed: u64) -> Self {
        Self::weighted(&vec![1.0; nodes], seed)
    }

    /// One node per weight (positive, finite), named under `seed`.
    pub fn weighted(weights: &[f64], seed: u64) -> Self {
        assert!(!weights.is_empty(), "rendezvous needs at least one node");
        assert!(
            weights.iter().all(|w| w.is_finite() && *w > 0.0),
            "weights must be positive and finite"
        );
        let ids = (0..weights.len() as NodeIdx)
            .map(|n| node_hash(seed, n))
            .collect();
        Self {
            ids,
            weights: weights.to_vec(),
            uniform: weights.iter().all(|&w| w == weights[0]),
        }
    }

    fn raw(&self, key: &Key, node: usize) -> u64 {
        mix64(key.hash ^ self.ids[node])
    }
}

impl Scheme for Rendezvous {
    fn nodes(&self) -> usize {
        self.ids.len()
    }

    fn owner(&self, key: &Key) -> NodeIdx {
        let mut best = 0;
        if self.uniform {
            // Equal weights: the order of w / -ln(u) is the order of u.
            let mut top = self.raw(key, 0);
            for n in 1..self.ids.len() {
                let s = self.raw(key, n);
                if s > top {
                    (best, top) = (n, s);
                }
            }
        } else {
            let score = |n: usize| {
                // 53 random bits, shifted into (0, 1).
                let u = ((self.raw(key, n) >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
                self.weights[n] / -u.ln()
            };
            let mut top = score(0);
            for n in 1..self.ids.len() {
                let s = score(n);
                if s > top {
                    (best, top) = (n, s);
                }
            }
        }
        best as NodeIdx
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{keys, max_over_mean, moved, moves_only_to_new};
    use proptest::prelude::*;

    #[test]
    fn moves_the_ideal_share_and_balances() {
        let keys = keys(100_000, 6);
        let (a, b) = (Rendezvous::new(10, 1), Rendezvous::new(11, 1));
        let m = moved(&a, &b, &keys);
        assert!((m - 1.0 / 11.0).abs() < 0.2 / 11.0, "moved {m}");
        assert!(moves_only_to_new(&a, &b, &keys));
        let r = max_over_mean(&b, &keys);
        assert!(r < 1.04, "max/mean {r}");
    }

    #[test]
    fn weights_set_the_shares() {
        let keys = keys(60_000, 7);
        let s = Rendezvous::weighted(&[1.0, 2.0, 3.0], 2);
        let mut counts = [0f64; 3];
        for k in &keys {
            counts[s.owner(k) as usize] += 1.0;
        }
        for (n, want) in [1.0 / 6.0, 2.0 / 6.0, 3.0 / 6.0].into_iter().enumerate() {
            let got = counts[n] / keys.len() as f64;
            assert!((got - want).abs() < 0.01, "node {n}: {got} vs {want}");
        }
        // The weighted path with (almost) equal weights picks the same
        // owners as the equal-weight fast path.
        let u = Rendezvous::new(4, 3);
        let w = Rendezvous::weighted(&[1.0, 1.0, 1.0, 1.0 + 1e-12], 3);
        let same = keys.iter().filter(|k| u.owner(k) == w.owner(k)).count();
        assert!(same as f64 > 0.999 * keys.len() as f64, "{same}");
    }

    proptest! {
        #[test]
        fn removing_the_last_node_moves_only_its_keys(
            nodes in 2usize..10, seed: u64, hashes in proptest::collection::vec(any::<u64>(), 1..200)
        ) {
            let (big, small) = (Rendezvous::new(nodes, seed), Rendezvous::new(nodes - 1, seed));
            for h in hashes {
                let k = Key { hash: h, slot: 0 };
                let (x, y) = (big.owner(&k), small.owner(&k));
                prop_assert!(x == y || x as usize == nodes - 1);
            }
        }
    }
}
