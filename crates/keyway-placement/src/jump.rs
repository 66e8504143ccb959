//! Jump consistent hash (Lamping and Veach, 2014; seed 004, section 4.1):
//! no memory, the ideal 1/(N+1) moves on a join, all to the new bucket, and
//! near-perfect balance. Buckets are numbers, so nodes join and leave only
//! at the end.

use crate::{Key, NodeIdx, Scheme};

/// The bucket in `0..buckets` of a 64-bit key (the paper's algorithm).
pub fn jump_hash(mut key: u64, buckets: u32) -> u32 {
    assert!(buckets > 0, "jump hash needs at least one bucket");
    let mut b: i64 = -1;
    let mut j: i64 = 0;
    while j < i64::from(buckets) {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / ((key >> 33) + 1) as f64)) as i64;
    }
    b as u32
}

/// Jump consistent hash over `nodes` buckets.
#[derive(Clone, Debug)]
pub struct Jump {
    buckets: u32,
}

impl Jump {
    /// The scheme over `nodes` nodes (at least one).
    pub fn new(nodes: usize) -> Self {
        assert!(nodes > 0, "jump hash needs at least one node");
        Self {
            buckets: u32::try_from(nodes).expect("node count fits u32"),
        }
    }
}

impl Scheme for Jump {
    fn nodes(&self) -> usize {
        self.buckets as usize
    }

    fn owner(&self, key: &Key) -> NodeIdx {
        jump_hash(key.hash, self.buckets)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{keys, max_over_mean, moved, moves_only_to_new};
    use proptest::prelude::*;

    #[test]
    fn paper_values() {
        // The test vectors other implementations of the paper's code share.
        assert_eq!(jump_hash(1, 1), 0);
        assert_eq!(jump_hash(42, 57), 43);
        assert_eq!(jump_hash(0xDEAD_10CC, 1), 0);
        assert_eq!(jump_hash(0xDEAD_10CC, 666), 361);
        assert_eq!(jump_hash(256, 1024), 520);
        assert_eq!(jump_hash(1, 128), 55);
        assert_eq!(jump_hash(129, 128), 120);
        assert_eq!(jump_hash(u64::MAX, 128), 92);
    }

    #[test]
    fn moves_the_ideal_share_to_the_new_bucket() {
        let keys = keys(100_000, 3);
        for n in [1usize, 5, 10, 40] {
            let (a, b) = (Jump::new(n), Jump::new(n + 1));
            let m = moved(&a, &b, &keys);
            let ideal = 1.0 / (n + 1) as f64;
            assert!(
                (m - ideal).abs() < 0.2 * ideal,
                "{n}: moved {m}, ideal {ideal}"
            );
            assert!(moves_only_to_new(&a, &b, &keys));
        }
    }

    #[test]
    fn balances_within_a_few_percent() {
        let keys = keys(200_000, 4);
        let r = max_over_mean(&Jump::new(11), &keys);
        assert!(r < 1.03, "max/mean {r}");
    }

    proptest! {
        #[test]
        fn monotone_in_buckets(key: u64, n in 1u32..2000) {
            let a = jump_hash(key, n);
            let b = jump_hash(key, n + 1);
            prop_assert!(a < n);
            prop_assert!(b == a || b == n);
        }
    }
}
