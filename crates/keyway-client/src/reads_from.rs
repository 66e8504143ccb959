//! Reads switched ahead of writes: a read of a partition whose record
//! names `reads_from` goes to that in-sync replica (epoch-carrying, on a
//! `READONLY` connection), unless it refused this request already; writes
//! and everything else go to the owner.

use bytes::Bytes;
use keyway_map::{PartitionMap, PartitionRecord};

/// Where one send of a request goes ([`read_route`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ReadRoute {
    /// The epoch-carrying read to the reads-from replica's address, `READONLY`.
    ReadsFrom(String),
    /// The plain read to the owner (the replica refused it).
    OwnerPlain(Vec<Bytes>),
    /// The epoch-carrying request to the owner.
    Owner,
}

/// Routes one send: a read (`read`: the plain command) of a partition with
/// `reads_from` goes to that replica, unless it refused this request
/// already (`owner_only`); everything else to the owner.
pub(crate) fn read_route(
    map: &PartitionMap,
    p: &PartitionRecord,
    read: Option<&[&[u8]]>,
    owner_only: bool,
) -> ReadRoute {
    let (Some(args), Some(node)) = (read, p.reads_from) else {
        return ReadRoute::Owner;
    };
    let plain = || args.iter().map(|a| Bytes::copy_from_slice(a)).collect();
    match map.nodes.get(&node) {
        Some(n) if !owner_only && node != p.owner => ReadRoute::ReadsFrom(n.resp_addr.clone()),
        _ if owner_only => ReadRoute::OwnerPlain(plain()),
        _ => ReadRoute::Owner,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyway_map::{NodeId, NodeInfo};

    #[test]
    fn reads_of_a_partition_with_reads_from_go_to_that_replica_and_writes_to_the_owner() {
        let nodes: Vec<NodeInfo> = (1..=3)
            .map(|i| NodeInfo::up(NodeId(i), format!("127.0.0.1:{}", 7000 + i)))
            .collect();
        let mut map = PartitionMap::bootstrap_replicated(&nodes, 1, 2).unwrap();
        let mut p = map.partitions.values().next().unwrap().clone();
        p.in_sync = p.replicas.clone();
        let t = p.replicas[0];
        let get: &[&[u8]] = &[b"GET", b"k"];
        let plain = vec![Bytes::from_static(b"GET"), Bytes::from_static(b"k")];
        // No reads_from: everything to the owner, epoch-carrying.
        assert_eq!(read_route(&map, &p, Some(get), false), ReadRoute::Owner);
        p.reads_from = Some(t);
        let t_addr = format!("127.0.0.1:{}", 7000 + t.0);
        assert_eq!(
            read_route(&map, &p, Some(get), false),
            ReadRoute::ReadsFrom(t_addr)
        );
        // A write (no plain read) still goes to the owner.
        assert_eq!(read_route(&map, &p, None, false), ReadRoute::Owner);
        // The replica refused: the owner, plain (it would answer KWREADS to KW.AT).
        assert_eq!(
            read_route(&map, &p, Some(get), true),
            ReadRoute::OwnerPlain(plain)
        );
        // An unknown reads-from node: the owner.
        map.nodes.remove(&t);
        assert_eq!(read_route(&map, &p, Some(get), false), ReadRoute::Owner);
    }
}
