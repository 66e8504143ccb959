//! Placement schemes: which node owns a key, and what a join moves.
//!
//! Seed 004 (sections 1-4 and 6) compares the ways a key can be mapped to a
//! node by the two numbers that matter when the cluster grows: the fraction
//! of keys that move (the ideal is the new nodes' fair share, 1/(N+1) for
//! one join) and the busiest node's load divided by the mean. This crate
//! implements each scheme as a [`Scheme`] built for a node set, plus the
//! experiments (`keyway sim`) that measure them over several layouts, with
//! uniform or Zipf request weights and salting of the hottest keys.
//!
//! Keyway's own placement ([`Keyway`]) is one of the rows: a key's slot
//! (CRC16, [`keyway_map::key_hash_slot`]) picks a partition (a contiguous
//! slot range, laid out as `PartitionMap::bootstrap` does) and a small table
//! picks the partition's node; a join moves exactly the fair share of whole
//! partitions to the new node. The key-to-partition function never changes.
//!
//! Pure logic: no I/O, no clock; every result is a function of the inputs
//! and the seeds.
//!
//! # Layout
//!
//! - `lib.rs`: [`Key`] (a key's 64-bit hash and slot), [`NodeIdx`], the
//!   [`Scheme`] trait, the hash functions every scheme shares.
//! - `modulo.rs`: `hash % N` (section 1.2).
//! - `ring.rs`: consistent hashing on a ring, T tokens per node (section 3).
//! - `jump.rs`: jump consistent hash, Lamping and Veach (section 4.1).
//! - `rendezvous.rs`: highest random weight, optionally weighted (4.1).
//! - `maglev.rs`: Maglev's permutation-filled lookup table (4.2).
//! - `bounded.rs`: consistent hashing with bounded loads, Mirrokni, Thorup
//!   and Zadimoghaddam (6.2).
//! - `keyway.rs`: key → slot → partition → node, and the minimal balanced
//!   partition move on a join (section 2).
//! - `experiment.rs`: the workload (keys, Zipf weights, salting of the top
//!   keys) and the move/balance experiment over layouts.

mod bounded;
mod experiment;
mod jump;
mod keyway;
mod maglev;
mod modulo;
mod rendezvous;
mod ring;

pub use bounded::BoundedLoads;
pub use experiment::{Report, Row, SchemeSpec, Setup, Workload, run};
pub use jump::{Jump, jump_hash};
pub use keyway::{Keyway, join_balanced};
pub use maglev::{DEFAULT_TABLE_SIZE, Maglev, next_prime};
pub use modulo::Modulo;
pub use rendezvous::Rendezvous;
pub use ring::Ring;

/// A node's index in the node set a scheme was built for: `0..nodes`.
/// Nodes joining later get the next indices; existing nodes keep theirs.
pub type NodeIdx = u32;

/// A key as the schemes see it: its seeded 64-bit hash and its Keyway hash
/// slot (which has no seed: it is Redis Cluster's function).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Key {
    pub hash: u64,
    pub slot: u16,
}

impl Key {
    /// Hashes `bytes` with `seed` (for the hash-based schemes) and computes
    /// its slot (for Keyway's placement).
    pub fn new(bytes: &[u8], seed: u64) -> Self {
        Self {
            hash: hash64(seed, bytes),
            slot: keyway_map::key_hash_slot(bytes),
        }
    }
}

/// A placement scheme built for a fixed node set.
pub trait Scheme {
    /// The number of nodes it places onto.
    fn nodes(&self) -> usize;
    /// The node owning `key`. Deterministic; always `< nodes()`.
    fn owner(&self, key: &Key) -> NodeIdx;
}

/// The 64-bit finaliser of MurmurHash3: a bijection with full avalanche.
pub fn mix64(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// Seeded 64-bit hash of a byte string: FNV-1a over the bytes, started from
/// the mixed seed, then [`mix64`] so every output bit depends on every
/// input bit.
pub fn hash64(seed: u64, bytes: &[u8]) -> u64 {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = 0xcbf2_9ce4_8422_2325 ^ mix64(seed);
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(PRIME);
    }
    mix64(h ^ bytes.len() as u64)
}

/// The hash of node `node`'s name (`node{idx}`) under `seed`. A layout is a
/// seed: a different seed is a different set of node names.
pub fn node_hash(seed: u64, node: NodeIdx) -> u64 {
    hash64(seed, format!("node{node}").as_bytes())
}

/// The hash of one ring token of a node: `node{idx}#{token}` under `seed`.
pub fn token_hash(seed: u64, node: NodeIdx, token: usize) -> u64 {
    hash64(seed, format!("node{node}#{token}").as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_deterministic_and_seeded() {
        assert_eq!(hash64(1, b"user:1"), hash64(1, b"user:1"));
        assert_ne!(hash64(1, b"user:1"), hash64(2, b"user:1"));
        assert_ne!(hash64(1, b"user:1"), hash64(1, b"user:2"));
        assert_ne!(hash64(0, b""), hash64(0, b"\0"));
        let k = Key::new(b"foo", 7);
        assert_eq!(k.slot, 12182);
        assert_eq!(k, Key::new(b"foo", 7));
    }

    #[test]
    fn hash_bits_are_balanced() {
        // Every output bit is set for about half of sequential keys.
        let n = 20_000;
        let mut ones = [0u32; 64];
        for i in 0..n {
            let h = hash64(0, format!("user:{i}").as_bytes());
            for (b, count) in ones.iter_mut().enumerate() {
                *count += ((h >> b) & 1) as u32;
            }
        }
        for (b, &count) in ones.iter().enumerate() {
            let share = f64::from(count) / f64::from(n);
            assert!((share - 0.5).abs() < 0.02, "bit {b}: {share}");
        }
    }
}

/// Helpers the scheme tests share.
#[cfg(test)]
pub(crate) mod testutil {
    use super::{Key, NodeIdx, Scheme};

    /// `user:0 .. user:{n-1}`, hashed with `seed`.
    pub fn keys(n: usize, seed: u64) -> Vec<Key> {
        (0..n)
            .map(|i| Key::new(format!("user:{i}").as_bytes(), seed))
            .collect()
    }

    /// Fraction of `keys` whose owner differs between `a` and `b`.
    pub fn moved(a: &dyn Scheme, b: &dyn Scheme, keys: &[Key]) -> f64 {
        let moved = keys.iter().filter(|k| a.owner(k) != b.owner(k)).count();
        moved as f64 / keys.len() as f64
    }

    /// True if every key that changed owner went to a node `b` has and `a`
    /// has not (a join moves keys only to the new nodes).
    pub fn moves_only_to_new(a: &dyn Scheme, b: &dyn Scheme, keys: &[Key]) -> bool {
        keys.iter().all(|k| {
            let (x, y) = (a.owner(k), b.owner(k));
            x == y || y as usize >= a.nodes()
        })
    }

    /// The busiest node's key count over the mean.
    pub fn max_over_mean(s: &dyn Scheme, keys: &[Key]) -> f64 {
        let mut counts = vec![0usize; s.nodes()];
        for k in keys {
            let o: NodeIdx = s.owner(k);
            counts[o as usize] += 1;
        }
        let max = counts.iter().copied().max().unwrap_or(0);
        max as f64 * s.nodes() as f64 / keys.len() as f64
    }
}
