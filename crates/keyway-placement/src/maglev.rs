//! Maglev hashing (Eisenbud et al., 2016; seed 004, section 4.2): each node
//! walks its own permutation of a prime-sized table and the nodes take
//! turns claiming their next free entry until the table is full. A lookup
//! is one table read; every node holds ⌊M/N⌋ or ⌈M/N⌉ entries; a join moves
//! a little more than the ideal share (entries shift between old nodes too).

use crate::{Key, NodeIdx, Scheme, hash64, node_hash};

/// The default table size: a prime well above 100 × the node counts the
/// chapter uses (Maglev wants M ≫ N).
pub const DEFAULT_TABLE_SIZE: usize = 65_537;

/// The smallest prime `>= n` (trial division; table sizes are small).
pub fn next_prime(n: usize) -> usize {
    let is_prime = |p: usize| {
        p >= 2
            && (2..)
                .take_while(|d| d * d <= p)
                .all(|d| !p.is_multiple_of(d))
    };
    (n.max(2)..)
        .find(|&p| is_prime(p))
        .expect("primes are unbounded")
}

/// A Maglev lookup table.
#[derive(Clone, Debug)]
pub struct Maglev {
    table: Vec<NodeIdx>,
    nodes: usize,
}

impl Maglev {
    /// The table of size `size` (a prime, at least `nodes`) for `nodes`
    /// nodes named under `seed` (the layout).
    pub fn new(nodes: usize, size: usize, seed: u64) -> Self {
        assert!(nodes > 0, "maglev needs at least one node");
        assert!(
            size >= nodes && next_prime(size) == size,
            "table size must be a prime >= nodes"
        );
        let m = size as u64;
        let perms: Vec<(u64, u64)> = (0..nodes as NodeIdx)
            .map(|n| {
                let name = node_hash(seed, n).to_le_bytes();
                let offset = hash64(0x6f66_6673_6574, &name) % m;
                let skip = hash64(0x736b_6970, &name) % (m - 1).max(1) + 1;
                (offset, skip)
            })
            .collect();
        let mut next = vec![0u64; nodes];
        let mut table = vec![NodeIdx::MAX; size];
        let mut filled = 0;
        'fill: loop {
            for (n, &(offset, skip)) in perms.iter().enumerate() {
                let mut slot = ((offset + next[n] * skip) % m) as usize;
                while table[slot] != NodeIdx::MAX {
                    next[n] += 1;
                    slot = ((offset + next[n] * skip) % m) as usize;
                }
                table[slot] = n as NodeIdx;
                next[n] += 1;
                filled += 1;
                if filled == size {
                    break 'fill;
                }
            }
        }
        Self { table, nodes }
    }

    /// The number of table entries each node holds.
    pub fn entries(&self) -> Vec<usize> {
        let mut counts = vec![0; self.nodes];
        for &n in &self.table {
            counts[n as usize] += 1;
        }
        counts
    }
}

impl Scheme for Maglev {
    fn nodes(&self) -> usize {
        self.nodes
    }

    fn owner(&self, key: &Key) -> NodeIdx {
        self.table[(key.hash % self.table.len() as u64) as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{keys, max_over_mean, moved};
    use proptest::prelude::*;

    #[test]
    fn primes() {
        assert_eq!(next_prime(0), 2);
        assert_eq!(next_prime(13), 13);
        assert_eq!(next_prime(14), 17);
        assert_eq!(next_prime(65_536), DEFAULT_TABLE_SIZE);
    }

    #[test]
    fn balances_and_moves_near_the_ideal() {
        let keys = keys(100_000, 8);
        let (a, b) = (
            Maglev::new(10, DEFAULT_TABLE_SIZE, 4),
            Maglev::new(11, DEFAULT_TABLE_SIZE, 4),
        );
        let r = max_over_mean(&b, &keys);
        assert!(r < 1.04, "max/mean {r}");
        // More than the ideal 1/11 (some entries shift between old nodes),
        // far less than hash % N's 10/11.
        let m = moved(&a, &b, &keys);
        assert!(m > 0.9 / 11.0 && m < 0.2, "moved {m}");
    }

    proptest! {
        #[test]
        fn every_node_holds_floor_or_ceil_of_the_table(nodes in 1usize..20, seed: u64) {
            let size = next_prime(nodes * 7 + 1);
            let entries = Maglev::new(nodes, size, seed).entries();
            let (lo, hi) = (size / nodes, size.div_ceil(nodes));
            prop_assert!(entries.iter().all(|&e| e == lo || e == hi), "{:?}", entries);
            prop_assert_eq!(entries.iter().sum::<usize>(), size);
        }
    }
}
