//! `hash % N` (seed 004, section 1.2): perfect balance, no lookup, and a
//! fraction N/(N+1) of the keys moves when a node joins, because the owner
//! depends on the node count.

use crate::{Key, NodeIdx, Scheme};

/// `owner = hash(key) % N`.
#[derive(Clone, Debug)]
pub struct Modulo {
    nodes: u64,
}

impl Modulo {
    /// The scheme over `nodes` nodes (at least one).
    pub fn new(nodes: usize) -> Self {
        assert!(nodes > 0, "hash % N needs at least one node");
        Self {
            nodes: nodes as u64,
        }
    }
}

impl Scheme for Modulo {
    fn nodes(&self) -> usize {
        self.nodes as usize
    }

    fn owner(&self, key: &Key) -> NodeIdx {
        (key.hash % self.nodes) as NodeIdx
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{keys, max_over_mean, moved};

    #[test]
    fn moves_n_over_n_plus_one() {
        // Section 3.3's set-up: 100,000 keys, 5 nodes, a sixth joins.
        let keys = keys(100_000, 0);
        let m = moved(&Modulo::new(5), &Modulo::new(6), &keys);
        assert!((m - 5.0 / 6.0).abs() < 0.01, "moved {m}");
    }

    #[test]
    fn balances() {
        let keys = keys(100_000, 1);
        let r = max_over_mean(&Modulo::new(10), &keys);
        assert!(r < 1.03, "max/mean {r}");
    }

    #[test]
    fn deterministic_and_in_range() {
        let s = Modulo::new(7);
        for k in keys(1000, 2) {
            assert_eq!(s.owner(&k), s.owner(&k));
            assert!(s.owner(&k) < 7);
        }
    }
}
