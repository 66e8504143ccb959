//! Consistent hashing with bounded loads (Mirrokni, Thorup and
//! Zadimoghaddam, 2016; seed 004, section 6.2; HAProxy's
//! `hash-balance-factor`).
//!
//! Keys are placed one at a time, in order, on a ring: each goes to the
//! first node clockwise from its hash that still has room, where a node's
//! capacity is `ceil(factor × keys / nodes)`. No node ever holds more than
//! `factor` times the mean, at the price of moving more keys on a join (a
//! full node's overflow cascades clockwise).
//!
//! The placement depends on the load, so the scheme is built for a key set:
//! [`BoundedLoads::place`] records each key's node and [`Scheme::owner`]
//! looks it up (a key outside the set gets its plain ring owner).

use crate::{Key, NodeIdx, Ring, Scheme};

/// A bounded-load placement of a key set on a ring.
#[derive(Clone, Debug)]
pub struct BoundedLoads {
    ring: Ring,
    /// `(key hash, node)`, an open-addressing table indexed by the hash
    /// (already uniform), linear probing; [`EMPTY`] marks a free entry.
    placed: Vec<(u64, NodeIdx)>,
    capacity: usize,
    loads: Vec<usize>,
}

impl BoundedLoads {
    /// Places `keys` in order on `ring`, no node above
    /// `ceil(factor × keys / nodes)` (`factor >= 1`).
    pub fn place(ring: Ring, factor: f64, keys: &[Key]) -> Self {
        assert!(factor >= 1.0, "the balance factor is at least 1");
        let nodes = ring.nodes();
        let capacity = ((factor * keys.len() as f64 / nodes as f64).ceil() as usize).max(1);
        let mut loads = vec![0usize; nodes];
        let mut placed = vec![(0, EMPTY); (2 * keys.len()).next_power_of_two()];
        for key in keys {
            // capacity × nodes >= keys, so some node always has room.
            let mut i = ring.successor(key.hash);
            let node = loop {
                let n = ring.token_owner(i);
                if loads[n as usize] < capacity {
                    break n;
                }
                i += 1;
            };
            loads[node as usize] += 1;
            let e = slot(&placed, key.hash);
            placed[e] = (key.hash, node);
        }
        Self {
            ring,
            placed,
            capacity,
            loads,
        }
    }

    /// The most keys any node may hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Keys placed on each node.
    pub fn loads(&self) -> &[usize] {
        &self.loads
    }
}

impl Scheme for BoundedLoads {
    fn nodes(&self) -> usize {
        self.ring.nodes()
    }

    fn owner(&self, key: &Key) -> NodeIdx {
        match self.placed[slot(&self.placed, key.hash)] {
            (_, EMPTY) => self.ring.owner(key),
            (_, node) => node,
        }
    }
}

/// Marks a free entry of the placement table.
const EMPTY: NodeIdx = NodeIdx::MAX;

/// The entry holding `hash`, or the free entry where it would go. The
/// table is at most half full, so the probe ends.
fn slot(table: &[(u64, NodeIdx)], hash: u64) -> usize {
    let mask = table.len() - 1;
    let mut i = (hash as usize) & mask;
    while table[i].1 != EMPTY && table[i].0 != hash {
        i = (i + 1) & mask;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{keys, max_over_mean, moved};
    use proptest::prelude::*;

    #[test]
    fn caps_a_one_token_ring() {
        let keys = keys(50_000, 9);
        for seed in 0..5 {
            let ring = Ring::new(10, 1, seed);
            let plain = max_over_mean(&ring, &keys);
            let b = BoundedLoads::place(ring, 1.25, &keys);
            let r = max_over_mean(&b, &keys);
            assert!(r <= 1.25 + 1e-9, "bounded max/mean {r}");
            assert!(b.loads().iter().all(|&l| l <= b.capacity()));
            assert_eq!(b.loads().iter().sum::<usize>(), keys.len());
            assert!(plain > r || plain <= 1.25, "plain {plain} vs bounded {r}");
        }
    }

    #[test]
    fn a_join_moves_more_than_the_ideal_but_not_everything() {
        let keys = keys(50_000, 10);
        let a = BoundedLoads::place(Ring::new(10, 100, 1), 1.25, &keys);
        let b = BoundedLoads::place(Ring::new(11, 100, 1), 1.25, &keys);
        let m = moved(&a, &b, &keys);
        assert!(m > 0.8 / 11.0 && m < 0.5, "moved {m}");
        // Unknown keys fall back to the ring.
        let stranger = Key {
            hash: 12345,
            slot: 0,
        };
        assert_eq!(a.owner(&stranger), a.ring.owner(&stranger));
    }

    proptest! {
        #[test]
        fn never_above_capacity(
            nodes in 1usize..8, tokens in 1usize..8, seed: u64,
            factor in 1.0f64..2.0, hashes in proptest::collection::vec(any::<u64>(), 1..300)
        ) {
            let keys: Vec<Key> = hashes.iter().map(|&h| Key { hash: h, slot: 0 }).collect();
            let b = BoundedLoads::place(Ring::new(nodes, tokens, seed), factor, &keys);
            prop_assert!(b.loads().iter().all(|&l| l <= b.capacity()));
            prop_assert_eq!(b.loads().iter().sum::<usize>(), keys.len());
            prop_assert!(b.capacity() as f64 <= (factor * keys.len() as f64 / nodes as f64).ceil().max(1.0));
            for k in &keys {
                prop_assert!((b.owner(k) as usize) < nodes);
            }
        }
    }
}
