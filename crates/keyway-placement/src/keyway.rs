//! Keyway's own placement (seed 004, section 2): the two questions apart.
//!
//! Key → slot is Redis Cluster's CRC16 ([`keyway_map::key_hash_slot`]) and
//! never changes. Slot → partition is fixed at creation: `P` contiguous
//! slot ranges, cut as `PartitionMap::bootstrap` cuts them (partition `i`
//! starts at slot `i × 16384 / P`). Partition → node is a small table:
//! bootstrap gives each node a contiguous run, as `PartitionMap::bootstrap`
//! does; a join edits the table with [`join_balanced`], which moves whole
//! partitions from the most-loaded nodes to the new node until every node
//! holds ⌊P/N⌋ or ⌈P/N⌉: the fewest moves that balance, all to the new node.
//! So a join moves about 1/(N+1) of the keys and balance is within one
//! partition's worth.

use keyway_map::SLOT_COUNT;

use crate::{Key, NodeIdx, Scheme};

/// Keyway's placement for one node set.
#[derive(Clone, Debug)]
pub struct Keyway {
    /// Slot → partition index (fixed for the life of the keyspace).
    slot_partition: Vec<u32>,
    /// Partition → node (the partition map's owner column).
    owners: Vec<NodeIdx>,
    nodes: usize,
}

impl Keyway {
    /// `partitions` partitions (capped at one per slot, as bootstrap caps
    /// them) over `nodes` nodes, each node owning a contiguous run.
    pub fn bootstrap(nodes: usize, partitions: u32) -> Self {
        assert!(nodes > 0, "keyway needs at least one node");
        assert!(partitions > 0, "keyway needs at least one partition");
        let count = partitions.min(u32::from(SLOT_COUNT));
        let slots = u32::from(SLOT_COUNT);
        let mut slot_partition = Vec::with_capacity(slots as usize);
        for i in 0..count {
            let first = i * slots / count;
            let next = (i + 1) * slots / count;
            slot_partition.extend((first..next).map(|_| i));
        }
        let owners = (0..count as usize)
            .map(|i| (i * nodes / count as usize) as NodeIdx)
            .collect();
        Self {
            slot_partition,
            owners,
            nodes,
        }
    }

    /// The placement after `add` nodes join one at a time, each taking its
    /// fair share of partitions by [`join_balanced`].
    pub fn join(&self, add: usize) -> Self {
        let mut next = self.clone();
        for _ in 0..add {
            join_balanced(&mut next.owners, next.nodes);
            next.nodes += 1;
        }
        next
    }

    /// The number of partitions.
    pub fn partitions(&self) -> usize {
        self.owners.len()
    }

    /// The partition holding `slot`.
    pub fn partition_of_slot(&self, slot: u16) -> u32 {
        self.slot_partition[slot as usize]
    }

    /// Each partition's owner.
    pub fn owners(&self) -> &[NodeIdx] {
        &self.owners
    }
}

impl Scheme for Keyway {
    fn nodes(&self) -> usize {
        self.nodes
    }

    fn owner(&self, key: &Key) -> NodeIdx {
        self.owners[self.partition_of_slot(key.slot) as usize]
    }
}

/// A new node (index `nodes`) joins: partitions move from the most-loaded
/// old node (lowest index on ties; its highest-numbered partition) to the
/// new node while that node holds more than one partition above the new
/// node. If the old nodes were balanced (⌊P/N⌋ or ⌈P/N⌉ each), the result
/// is balanced for N+1 and no balanced assignment moves fewer partitions.
/// Returns the moved partitions' indices, in the order moved.
pub fn join_balanced(owners: &mut [NodeIdx], nodes: usize) -> Vec<usize> {
    let new = nodes as NodeIdx;
    let mut held: Vec<Vec<usize>> = vec![Vec::new(); nodes];
    for (p, &o) in owners.iter().enumerate() {
        assert!(
            (o as usize) < nodes,
            "partition {p} owned by unknown node {o}"
        );
        held[o as usize].push(p);
    }
    let mut moved = Vec::new();
    loop {
        let (donor, most) = held
            .iter()
            .enumerate()
            .map(|(n, ps)| (n, ps.len()))
            .fold((0, 0), |best, cur| if cur.1 > best.1 { cur } else { best });
        if most <= moved.len() + 1 {
            return moved;
        }
        let p = held[donor].pop().expect("the donor holds partitions");
        owners[p] = new;
        moved.push(p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{keys, max_over_mean, moved};
    use keyway_map::{NodeId, NodeInfo, NodeState, PartitionMap};
    use proptest::prelude::*;

    fn counts(owners: &[NodeIdx], nodes: usize) -> Vec<usize> {
        let mut c = vec![0; nodes];
        for &o in owners {
            c[o as usize] += 1;
        }
        c
    }

    #[test]
    fn bootstrap_matches_the_partition_map() {
        for nodes in 1..=5usize {
            for per_node in [1u16, 3, 16, 64] {
                let infos: Vec<NodeInfo> = (0..nodes as u64)
                    .map(|i| NodeInfo {
                        id: NodeId(i + 1),
                        resp_addr: format!("127.0.0.1:{}", 7000 + i),
                        admin_addr: format!("127.0.0.1:{}", 8000 + i),
                        state: NodeState::Up,
                        weight: keyway_map::DEFAULT_NODE_WEIGHT,
                        draining: false,
                        zone: None,
                        replica_addr: None,
                    })
                    .collect();
                let map = PartitionMap::bootstrap(&infos, per_node).unwrap();
                let ours = Keyway::bootstrap(nodes, nodes as u32 * u32::from(per_node));
                let ks = keyway_map::DEFAULT_KEYSPACE;
                for slot in 0..SLOT_COUNT {
                    let rec = map.locate_slot(ks, slot).unwrap();
                    let p = ours.partition_of_slot(slot) as u64;
                    assert_eq!(rec.id.0, p + 1, "slot {slot}");
                    let owner = ours.owner(&Key { hash: 0, slot });
                    assert_eq!(rec.owner.0, u64::from(owner) + 1, "slot {slot}");
                }
            }
        }
    }

    #[test]
    fn a_join_moves_the_fair_share_and_balances() {
        let keys = keys(100_000, 11);
        let a = Keyway::bootstrap(10, 1024);
        let b = a.join(1);
        let m = moved(&a, &b, &keys);
        assert!((m - 1.0 / 11.0).abs() < 0.1 / 11.0, "moved {m}");
        let c = counts(b.owners(), 11);
        assert_eq!(c[10], 1024 / 11);
        assert!(c.iter().all(|&n| n == 93 || n == 94), "{c:?}");
        let r = max_over_mean(&b, &keys);
        assert!(r < 1.04, "max/mean {r}");
        // A partition is the unit: its keys stay together.
        for k in &keys {
            let p = a.partition_of_slot(k.slot) as usize;
            assert_eq!(b.owner(k), b.owners()[p]);
        }
    }

    #[test]
    fn few_partitions_are_coarse() {
        // Ten partitions on ten nodes: the eleventh node gets nothing to
        // take without unbalancing, so nothing moves.
        let a = Keyway::bootstrap(10, 10);
        assert!(a.join(1).owners() == a.owners());
        // Twelve on three, a fourth joins: three partitions move.
        let mut owners = Keyway::bootstrap(3, 12).owners().to_vec();
        assert_eq!(join_balanced(&mut owners, 3).len(), 3);
        assert_eq!(counts(&owners, 4), vec![3, 3, 3, 3]);
    }

    proptest! {
        #[test]
        fn joins_are_minimal_and_balanced(nodes in 1usize..40, partitions in 1u32..3000, add in 1usize..4) {
            let a = Keyway::bootstrap(nodes, partitions);
            let b = a.join(add);
            let p = partitions as usize;
            let total = nodes + add;
            let c = counts(b.owners(), total);
            let (lo, hi) = (p / total, p.div_ceil(total));
            prop_assert!(c.iter().all(|&n| n == lo || n == hi), "{:?}", c);
            // Every moved partition went to a new node.
            for (x, y) in a.owners().iter().zip(b.owners()) {
                prop_assert!(x == y || *y as usize >= nodes);
            }
            // Minimal: each join moves exactly the ⌊P/(N+1)⌋ partitions the
            // new node must hold, and no more.
            let mut owners = a.owners().to_vec();
            for n in nodes..total {
                let moved = join_balanced(&mut owners, n);
                prop_assert_eq!(moved.len(), p / (n + 1));
                prop_assert!(moved.iter().all(|&m| owners[m] as usize == n));
            }
            prop_assert_eq!(&owners[..], b.owners());
        }
    }
}
