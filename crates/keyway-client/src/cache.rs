//! The client's cached map, and patching it from a `-KWMOVED` rejection.
//!
//! A rejection names one partition as the node knows it: id, epoch, range,
//! owner and the owner's address. Patching replaces every cached partition
//! of that keyspace whose range overlaps it with a lower epoch (a split or
//! merge changes ranges), and records the owner's address. The cache may
//! have gaps afterwards; a lookup that finds none reloads the whole map.

use bytes::Bytes;
use keyway_map::{
    Epoch, KeyspaceId, NodeId, NodeInfo, NodeState, PartitionId, PartitionMap, PartitionRecord,
    PartitionState, from_hex,
};
use std::sync::{Arc, RwLock};

/// A parsed `-KWMOVED <partition> <epoch> <keyspace> <start> <end|-> <owner> <addr>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KwMoved {
    pub partition: PartitionRecord,
    pub owner_addr: String,
}

/// Parses the text of a `KWMOVED` error (without the leading `-`).
pub fn parse_kwmoved(msg: &str) -> Option<KwMoved> {
    let mut it = msg.split(' ');
    if it.next()? != "KWMOVED" {
        return None;
    }
    let id = PartitionId(it.next()?.parse().ok()?);
    let epoch = Epoch(it.next()?.parse().ok()?);
    let keyspace = KeyspaceId(it.next()?.parse().ok()?);
    let start: Bytes = from_hex(it.next()?)?;
    let end = match it.next()? {
        "-" => None,
        hex => Some(from_hex(hex)?),
    };
    let owner = NodeId::parse(it.next()?)?;
    let owner_addr = it.next()?.to_string();
    let partition = PartitionRecord {
        id,
        keyspace,
        start,
        end,
        owner,
        replicas: Vec::new(),
        epoch,
        state: PartitionState::Active,
    };
    Some(KwMoved {
        partition,
        owner_addr,
    })
}

fn overlaps(a: &PartitionRecord, b: &PartitionRecord) -> bool {
    let a_before_b_end = b.end.as_ref().is_none_or(|end| a.start < *end);
    let b_before_a_end = a.end.as_ref().is_none_or(|end| b.start < *end);
    a.keyspace == b.keyspace && a_before_b_end && b_before_a_end
}

/// Applies a rejection to the cached map.
pub fn patch(cache: &RwLock<Arc<PartitionMap>>, moved: KwMoved) {
    let mut guard = cache.write().unwrap_or_else(|e| e.into_inner());
    let mut map = (**guard).clone();
    let fresh = moved.partition;
    let stale: Vec<PartitionId> = map
        .partitions
        .values()
        .filter(|p| overlaps(p, &fresh) && (p.epoch < fresh.epoch || p.id == fresh.id))
        .map(|p| p.id)
        .collect();
    if stale.is_empty() && map.partitions.values().any(|p| overlaps(p, &fresh)) {
        return; // the cache already knows something newer
    }
    for id in stale {
        map.partitions.remove(&id);
    }
    map.nodes.entry(fresh.owner).or_insert_with(|| NodeInfo {
        id: fresh.owner,
        resp_addr: moved.owner_addr.clone(),
        admin_addr: String::new(),
        state: NodeState::Up,
        weight: keyway_map::DEFAULT_NODE_WEIGHT,
        draining: false,
    });
    if let Some(node) = map.nodes.get_mut(&fresh.owner) {
        node.resp_addr = moved.owner_addr;
    }
    map.partitions.insert(fresh.id, fresh);
    map.reindex();
    *guard = Arc::new(map);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_the_node_sends() {
        let msg = "KWMOVED 7 3 0 1000 2000 0000000000000000000000000000000000000002 127.0.0.1:7002";
        let m = parse_kwmoved(msg).unwrap();
        assert_eq!(m.partition.id, PartitionId(7));
        assert_eq!(m.partition.epoch, Epoch(3));
        assert_eq!(&m.partition.start[..], &[0x10, 0x00]);
        assert_eq!(m.partition.end.as_deref(), Some(&[0x20, 0x00][..]));
        assert_eq!(m.partition.owner, NodeId(2));
        assert_eq!(m.owner_addr, "127.0.0.1:7002");
        assert!(parse_kwmoved("KWMOVED x").is_none());
        assert!(parse_kwmoved("MOVED 1 a:1").is_none());
    }
}
