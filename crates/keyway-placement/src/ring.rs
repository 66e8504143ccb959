//! Consistent hashing on a ring (Karger et al. 1997; seed 004, section 3).
//!
//! Every node puts `tokens` points on a 64-bit circle by hashing
//! `node{i}#{t}`; a key belongs to the first token at or clockwise after its
//! hash. A join moves keys only to the new node; with one token per node the
//! arcs are very uneven, with many tokens a node's share is a sum of many
//! small arcs and evens out.

use crate::{Key, NodeIdx, Scheme, token_hash};

/// A ring: tokens sorted by position, each with its node.
#[derive(Clone, Debug)]
pub struct Ring {
    points: Vec<u64>,
    owners: Vec<NodeIdx>,
    nodes: usize,
}

impl Ring {
    /// `nodes` nodes with `tokens` tokens each, placed by hashing their
    /// names under `seed` (the layout).
    pub fn new(nodes: usize, tokens: usize, seed: u64) -> Self {
        assert!(nodes > 0 && tokens > 0, "a ring needs nodes and tokens");
        let tokens = (0..nodes as NodeIdx)
            .flat_map(|n| (0..tokens).map(move |t| (token_hash(seed, n, t), n)))
            .collect();
        Self::from_tokens(nodes, tokens)
    }

    /// A ring from explicit `(position, node)` tokens (every node in
    /// `0..nodes` should have at least one, or it owns nothing).
    pub fn from_tokens(nodes: usize, mut tokens: Vec<(u64, NodeIdx)>) -> Self {
        assert!(!tokens.is_empty(), "a ring needs at least one token");
        assert!(tokens.iter().all(|&(_, n)| (n as usize) < nodes));
        // Equal positions (a 64-bit collision) are ordered by node, so the
        // result does not depend on the input order.
        tokens.sort_unstable();
        let (points, owners) = tokens.into_iter().unzip();
        Self {
            points,
            owners,
            nodes,
        }
    }

    /// The number of tokens on the ring.
    pub fn len(&self) -> usize {
        self.points.len()
    }

    /// Always false: a ring has at least one token.
    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    /// Index of the first token at or clockwise after `hash` (wrapping).
    pub fn successor(&self, hash: u64) -> usize {
        let i = self.points.partition_point(|&p| p < hash);
        if i == self.points.len() { 0 } else { i }
    }

    /// The node of the token at `index` (taken modulo the ring's length).
    pub fn token_owner(&self, index: usize) -> NodeIdx {
        self.owners[index % self.owners.len()]
    }
}

impl Scheme for Ring {
    fn nodes(&self) -> usize {
        self.nodes
    }

    fn owner(&self, key: &Key) -> NodeIdx {
        self.owners[self.successor(key.hash)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{keys, max_over_mean, moved, moves_only_to_new};
    use proptest::prelude::*;

    #[test]
    fn chapter_example() {
        // Section 3.1: twelve positions, tokens at 2, 6 and 10 for A, B, C.
        let ring = Ring::from_tokens(3, vec![(2, 0), (6, 1), (10, 2)]);
        let owner = |h: u64| ring.owner(&Key { hash: h, slot: 0 });
        assert_eq!(owner(7), 2);
        assert_eq!(owner(11), 0); // wraps around
        assert_eq!(owner(2), 0); // a token's own position is its arc
        assert_eq!(owner(3), 1);
        // D joins at 8 and cuts C's arc: only 7 and 8 move, both to D.
        let ring4 = Ring::from_tokens(4, vec![(2, 0), (6, 1), (10, 2), (8, 3)]);
        let moved: Vec<u64> = (0..12)
            .filter(|&h| {
                ring.owner(&Key { hash: h, slot: 0 }) != ring4.owner(&Key { hash: h, slot: 0 })
            })
            .collect();
        assert_eq!(moved, vec![7, 8]);
    }

    #[test]
    fn section_3_3_moves_about_one_sixth() {
        // 100,000 keys, 5 nodes with 100 tokens each, a sixth joins.
        let keys = keys(100_000, 0);
        let (a, b) = (Ring::new(5, 100, 0), Ring::new(6, 100, 0));
        let m = moved(&a, &b, &keys);
        assert!((m - 1.0 / 6.0).abs() < 0.2 / 6.0, "moved {m}");
        assert!(moves_only_to_new(&a, &b, &keys));
    }

    #[test]
    fn one_token_is_unbalanced_many_tokens_are_not() {
        let keys = keys(50_000, 5);
        let worst = |tokens| {
            (0..9u64)
                .map(|seed| max_over_mean(&Ring::new(10, tokens, seed), &keys))
                .fold(0.0f64, f64::max)
        };
        let (one, many) = (worst(1), worst(256));
        assert!(one > 1.8, "1 token, worst of 9: {one}");
        assert!(many < 1.3, "256 tokens, worst of 9: {many}");
    }

    #[test]
    fn token_order_does_not_matter() {
        let a = Ring::from_tokens(2, vec![(5, 1), (5, 0), (9, 1)]);
        let b = Ring::from_tokens(2, vec![(9, 1), (5, 0), (5, 1)]);
        for h in 0..12 {
            let k = Key { hash: h, slot: 0 };
            assert_eq!(a.owner(&k), b.owner(&k));
        }
    }

    proptest! {
        #[test]
        fn a_join_moves_keys_only_to_the_new_node(
            nodes in 1usize..8, tokens in 1usize..20, seed: u64, hashes in proptest::collection::vec(any::<u64>(), 1..200)
        ) {
            let (a, b) = (Ring::new(nodes, tokens, seed), Ring::new(nodes + 1, tokens, seed));
            for h in hashes {
                let k = Key { hash: h, slot: 0 };
                let (x, y) = (a.owner(&k), b.owner(&k));
                prop_assert!((x as usize) < nodes);
                prop_assert!(x == y || y as usize == nodes);
            }
        }
    }
}
