//! Compact binary encoding of maps and changes.
//!
//! Format (all integers LEB128 varints, byte strings length-prefixed):
//! a map is `MAGIC, version, next_partition_id, keyspaces, nodes, partitions`;
//! a change list is `MAGIC_CHANGES, count, change*`; a delta (the answer to
//! `KW.MAP SINCE v`, see [`MapSince`]) is `MAGIC_DELTA, count, (version,
//! count, change*)*`. A node is `id,
//! resp_addr, admin_addr, tag[, weight]` (see `NODE_WEIGHTED`). Roughly 20
//! bytes per hash partition. Decoding checks every length against the input, so
//! corrupt bytes give [`MapError::Decode`], never a panic.

use crate::wire::{Reader, WireError, Writer};
use crate::{
    DEFAULT_NODE_WEIGHT, Epoch, Keyspace, KeyspaceId, MapChange, MapError, MapVersion, NodeId,
    NodeInfo, NodeState, PartitionId, PartitionMap, PartitionRecord, PartitionState, Routing,
};
use bytes::Bytes;

const MAGIC_MAP: u8 = 0x4b; // 'K'
const MAGIC_CHANGES: u8 = 0x43; // 'C'
const MAGIC_DELTA: u8 = 0x44; // 'D'

// A node record ends with one tag byte: the state in the low bits, then
// flags. A node at the default weight and not draining encodes exactly as
// before these fields existed (tag 0 or 1), so records written earlier
// decode to weight 100, not draining; the weight follows the tag only when
// `NODE_WEIGHTED` is set.
const NODE_STATE_MASK: u8 = 0x0f;
const NODE_DRAINING: u8 = 0x10;
const NODE_WEIGHTED: u8 = 0x20;
/// The node record carries a zone string after the tag (and weight).
const NODE_ZONED: u8 = 0x40;
/// The node record carries its replica endpoint address after the zone.
/// (The last free flag bit: a later node field needs a state value of
/// the low bits as an escape.)
const NODE_REPLICA_ENDPOINT: u8 = 0x80;
// A keyspace's routing byte and a partition's state byte take the same
// trick: a flag says extra fields follow, so records without replication
// encode exactly as before.
const ROUTING_MASK: u8 = 0x0f;
/// The keyspace carries `replication_factor, min_in_sync` after the routing byte.
const KEYSPACE_REPLICATED: u8 = 0x10;
const PARTITION_STATE_MASK: u8 = 0x0f;
/// The partition carries its in-sync list after the state byte.
const PARTITION_IN_SYNC: u8 = 0x10;
/// The partition carries its reads-from node after the in-sync list.
const PARTITION_READS_FROM: u8 = 0x20;

/// Encodes a whole map.
pub fn encode_map(map: &PartitionMap) -> Vec<u8> {
    let mut w = Writer::with_capacity(64 + map.partitions.len() * 24);
    w.u8(MAGIC_MAP);
    w.var(map.version.0);
    w.var(map.next_partition_id.0);
    w.var(map.keyspaces.len() as u64);
    map.keyspaces.values().for_each(|k| w.keyspace(k));
    w.var(map.nodes.len() as u64);
    map.nodes.values().for_each(|n| w.node(n));
    w.var(map.partitions.len() as u64);
    map.partitions.values().for_each(|p| w.partition(p));
    w.into_inner()
}

/// Decodes a map encoded by [`encode_map`]; the result is indexed but not validated.
pub fn decode_map(bytes: &[u8]) -> Result<PartitionMap, MapError> {
    let mut r = Reader::new(bytes);
    r.expect(MAGIC_MAP)?;
    let version = MapVersion(r.var()?);
    let next = PartitionId(r.var()?);
    let keyspaces = r.list(Reader::keyspace)?;
    let nodes = r.list(Reader::node)?;
    let partitions = r.list(Reader::partition)?;
    r.finish()?;
    Ok(PartitionMap::from_parts(
        version, next, keyspaces, nodes, partitions,
    ))
}

/// Encodes a list of changes.
pub fn encode_changes(changes: &[MapChange]) -> Vec<u8> {
    let mut w = Writer::default();
    w.u8(MAGIC_CHANGES);
    w.changes(changes);
    w.into_inner()
}

/// What a reader at map version `v` needs to catch up: the answer to
/// `KW.MAP SINCE v`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MapSince {
    /// The changes of every version after `v`, oldest first and consecutive
    /// (empty when `v` is current). Apply each with [`PartitionMap::apply`].
    Delta(Vec<(MapVersion, Vec<MapChange>)>),
    /// The whole map: `v` is older than the history the sender keeps, or
    /// newer than its map.
    Full(PartitionMap),
}

/// Encodes a delta (`MAGIC_DELTA`) or a whole map (exactly [`encode_map`]'s
/// bytes); [`decode_since`] tells them apart by the first byte.
pub fn encode_since(since: &MapSince) -> Vec<u8> {
    match since {
        MapSince::Full(map) => encode_map(map),
        MapSince::Delta(entries) => encode_delta(entries.iter().map(|(v, c)| (*v, c.as_slice()))),
    }
}

/// Encodes the entries of a delta, oldest first.
pub fn encode_delta<'a>(
    entries: impl ExactSizeIterator<Item = (MapVersion, &'a [MapChange])>,
) -> Vec<u8> {
    let mut w = Writer::default();
    w.u8(MAGIC_DELTA);
    w.var(entries.len() as u64);
    for (version, changes) in entries {
        w.var(version.0);
        w.changes(changes);
    }
    w.into_inner()
}

/// Decodes what [`encode_since`] (or [`encode_map`]) wrote. A map comes back
/// indexed but not validated; a delta comes back as sent (the reader checks
/// that it continues from its version).
pub fn decode_since(bytes: &[u8]) -> Result<MapSince, MapError> {
    match bytes.first() {
        Some(&MAGIC_MAP) => decode_map(bytes).map(MapSince::Full),
        Some(&MAGIC_DELTA) => {
            let mut r = Reader::new(&bytes[1..]);
            let entries = r.list(|r| Ok((MapVersion(r.var()?), r.changes()?)))?;
            r.finish()?;
            Ok(MapSince::Delta(entries))
        }
        _ => Err(MapError::Decode("bad magic")),
    }
}

impl Writer {
    fn changes(&mut self, changes: &[MapChange]) {
        let w = self;
        w.var(changes.len() as u64);
        for c in changes {
            match c {
                MapChange::UpsertPartition(p) => {
                    w.u8(1);
                    w.partition(p)
                }
                MapChange::RemovePartition { id } => {
                    w.u8(2);
                    w.var(id.0)
                }
                MapChange::UpsertNode(n) => {
                    w.u8(3);
                    w.node(n)
                }
                MapChange::RemoveNode { id } => {
                    w.u8(4);
                    w.var(id.0)
                }
                MapChange::UpsertKeyspace(k) => {
                    w.u8(5);
                    w.keyspace(k)
                }
                MapChange::RemoveKeyspace { id } => {
                    w.u8(6);
                    w.var(id.0 as u64)
                }
                MapChange::ReservePartitionIds { next } => {
                    w.u8(7);
                    w.var(next.0)
                }
            }
        }
    }
}

/// Decodes a list of changes encoded by [`encode_changes`].
pub fn decode_changes(bytes: &[u8]) -> Result<Vec<MapChange>, MapError> {
    let mut r = Reader::new(bytes);
    r.expect(MAGIC_CHANGES)?;
    let changes = r.changes()?;
    r.finish()?;
    Ok(changes)
}

impl Reader<'_> {
    fn changes(&mut self) -> Result<Vec<MapChange>, MapError> {
        self.list(|r| {
            Ok(match r.u8()? {
                1 => MapChange::UpsertPartition(r.partition()?),
                2 => MapChange::RemovePartition {
                    id: PartitionId(r.var()?),
                },
                3 => MapChange::UpsertNode(r.node()?),
                4 => MapChange::RemoveNode {
                    id: NodeId(r.var()?),
                },
                5 => MapChange::UpsertKeyspace(r.keyspace()?),
                6 => MapChange::RemoveKeyspace {
                    id: KeyspaceId(r.u32()?),
                },
                7 => MapChange::ReservePartitionIds {
                    next: PartitionId(r.var()?),
                },
                _ => return Err(MapError::Decode("unknown change tag")),
            })
        })
    }
}

impl From<WireError> for MapError {
    fn from(e: WireError) -> Self {
        MapError::Decode(e.0)
    }
}

/// The map's record encodings on top of the shared wire primitives.
trait MapWrite {
    fn keyspace(&mut self, k: &Keyspace);
    fn node(&mut self, n: &NodeInfo);
    fn partition(&mut self, p: &PartitionRecord);
}

impl MapWrite for Writer {
    fn keyspace(&mut self, k: &Keyspace) {
        self.var(k.id.0 as u64);
        self.bytes(k.name.as_bytes());
        let routing = match k.routing {
            Routing::Hash => 0,
            Routing::Range => 1,
        };
        let replicated = k.replication_factor != 1 || k.min_in_sync != 1;
        self.u8(routing | if replicated { KEYSPACE_REPLICATED } else { 0 });
        if replicated {
            self.u8(k.replication_factor);
            self.u8(k.min_in_sync);
        }
    }
    fn node(&mut self, n: &NodeInfo) {
        self.var(n.id.0);
        self.bytes(n.resp_addr.as_bytes());
        self.bytes(n.admin_addr.as_bytes());
        let state = match n.state {
            NodeState::Up => 0,
            NodeState::Down => 1,
        };
        let weighted = n.weight != DEFAULT_NODE_WEIGHT;
        let draining = if n.draining { NODE_DRAINING } else { 0 };
        let zoned = if n.zone.is_some() { NODE_ZONED } else { 0 };
        let replica = if n.replica_addr.is_some() {
            NODE_REPLICA_ENDPOINT
        } else {
            0
        };
        self.u8(state | draining | zoned | replica | if weighted { NODE_WEIGHTED } else { 0 });
        if weighted {
            self.var(u64::from(n.weight));
        }
        if let Some(zone) = &n.zone {
            self.bytes(zone.as_bytes());
        }
        if let Some(addr) = &n.replica_addr {
            self.bytes(addr.as_bytes());
        }
    }
    fn partition(&mut self, p: &PartitionRecord) {
        self.var(p.id.0);
        self.var(p.keyspace.0 as u64);
        self.bytes(&p.start);
        match &p.end {
            Some(end) => {
                self.u8(1);
                self.bytes(end)
            }
            None => self.u8(0),
        }
        self.var(p.owner.0);
        self.var(p.replicas.len() as u64);
        p.replicas.iter().for_each(|r| self.var(r.0));
        self.var(p.epoch.0);
        let state = match p.state {
            PartitionState::Active => 0,
        };
        let mut tag = state;
        if !p.in_sync.is_empty() {
            tag |= PARTITION_IN_SYNC;
        }
        if p.reads_from.is_some() {
            tag |= PARTITION_READS_FROM;
        }
        self.u8(tag);
        if !p.in_sync.is_empty() {
            self.var(p.in_sync.len() as u64);
            p.in_sync.iter().for_each(|r| self.var(r.0));
        }
        if let Some(r) = p.reads_from {
            self.var(r.0);
        }
    }
}

trait MapRead {
    fn expect(&mut self, magic: u8) -> Result<(), MapError>;
    fn list<T>(
        &mut self,
        item: impl FnMut(&mut Self) -> Result<T, MapError>,
    ) -> Result<Vec<T>, MapError>;
    fn keyspace(&mut self) -> Result<Keyspace, MapError>;
    fn node(&mut self) -> Result<NodeInfo, MapError>;
    fn partition(&mut self) -> Result<PartitionRecord, MapError>;
}

impl MapRead for Reader<'_> {
    fn expect(&mut self, magic: u8) -> Result<(), MapError> {
        (self.u8()? == magic)
            .then_some(())
            .ok_or(MapError::Decode("bad magic"))
    }
    fn list<T>(
        &mut self,
        mut item: impl FnMut(&mut Self) -> Result<T, MapError>,
    ) -> Result<Vec<T>, MapError> {
        let n = self.var()?;
        // Every item takes at least one byte: refuse counts the input cannot hold.
        if n > self.remaining() as u64 {
            return Err(MapError::Decode("count exceeds input"));
        }
        (0..n).map(|_| item(self)).collect()
    }
    fn keyspace(&mut self) -> Result<Keyspace, MapError> {
        let id = KeyspaceId(self.u32()?);
        let name = self.string()?;
        let tag = self.u8()?;
        if tag & !(ROUTING_MASK | KEYSPACE_REPLICATED) != 0 {
            return Err(MapError::Decode("routing tag"));
        }
        let routing = match tag & ROUTING_MASK {
            0 => Routing::Hash,
            1 => Routing::Range,
            _ => return Err(MapError::Decode("routing tag")),
        };
        let (replication_factor, min_in_sync) = if tag & KEYSPACE_REPLICATED != 0 {
            (self.u8()?, self.u8()?)
        } else {
            (1, 1)
        };
        Ok(Keyspace {
            id,
            name,
            routing,
            replication_factor,
            min_in_sync,
        })
    }
    fn node(&mut self) -> Result<NodeInfo, MapError> {
        let id = NodeId(self.var()?);
        let resp_addr = self.string()?;
        let admin_addr = self.string()?;
        let tag = self.u8()?;
        let flags = NODE_STATE_MASK | NODE_DRAINING | NODE_WEIGHTED | NODE_ZONED;
        if tag & !(flags | NODE_REPLICA_ENDPOINT) != 0 {
            return Err(MapError::Decode("node state tag"));
        }
        let state = match tag & NODE_STATE_MASK {
            0 => NodeState::Up,
            1 => NodeState::Down,
            _ => return Err(MapError::Decode("node state tag")),
        };
        let weight = if tag & NODE_WEIGHTED != 0 {
            u32::try_from(self.var()?).map_err(|_| MapError::Decode("node weight"))?
        } else {
            DEFAULT_NODE_WEIGHT
        };
        let zone = if tag & NODE_ZONED != 0 {
            Some(self.string()?)
        } else {
            None
        };
        let replica_addr = if tag & NODE_REPLICA_ENDPOINT != 0 {
            Some(self.string()?)
        } else {
            None
        };
        Ok(NodeInfo {
            id,
            resp_addr,
            admin_addr,
            state,
            weight,
            draining: tag & NODE_DRAINING != 0,
            zone,
            replica_addr,
        })
    }
    fn partition(&mut self) -> Result<PartitionRecord, MapError> {
        let id = PartitionId(self.var()?);
        let keyspace = KeyspaceId(self.u32()?);
        let start = Bytes::copy_from_slice(self.bytes()?);
        let end = match self.u8()? {
            0 => None,
            1 => Some(Bytes::copy_from_slice(self.bytes()?)),
            _ => return Err(MapError::Decode("end tag")),
        };
        let owner = NodeId(self.var()?);
        let replicas = self.list(|r| Ok(NodeId(r.var()?)))?;
        let epoch = Epoch(self.var()?);
        let tag = self.u8()?;
        if tag & !(PARTITION_STATE_MASK | PARTITION_IN_SYNC | PARTITION_READS_FROM) != 0 {
            return Err(MapError::Decode("partition state tag"));
        }
        let state = match tag & PARTITION_STATE_MASK {
            0 => PartitionState::Active,
            _ => return Err(MapError::Decode("partition state tag")),
        };
        let in_sync = if tag & PARTITION_IN_SYNC != 0 {
            self.list(|r| Ok(NodeId(r.var()?)))?
        } else {
            Vec::new()
        };
        let reads_from = if tag & PARTITION_READS_FROM != 0 {
            Some(NodeId(self.var()?))
        } else {
            None
        };
        Ok(PartitionRecord {
            id,
            keyspace,
            start,
            end,
            owner,
            replicas,
            in_sync,
            reads_from,
            epoch,
            state,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(state: NodeState, weight: u32, draining: bool) -> NodeInfo {
        NodeInfo {
            id: NodeId(7),
            resp_addr: "10.0.0.7:6379".into(),
            admin_addr: "10.0.0.7:8080".into(),
            state,
            weight,
            draining,
            zone: None,
            replica_addr: None,
        }
    }

    /// A one-node change list as encoders before `weight` and `draining`
    /// existed wrote it.
    fn old_format(state_tag: u8) -> Vec<u8> {
        let mut w = Writer::default();
        w.u8(MAGIC_CHANGES);
        w.var(1);
        w.u8(3);
        w.var(7);
        w.bytes(b"10.0.0.7:6379");
        w.bytes(b"10.0.0.7:8080");
        w.u8(state_tag);
        w.into_inner()
    }

    #[test]
    fn records_without_weight_or_draining_still_decode() {
        for (tag, state) in [(0, NodeState::Up), (1, NodeState::Down)] {
            let decoded = decode_changes(&old_format(tag)).unwrap();
            assert_eq!(
                decoded,
                vec![MapChange::UpsertNode(node(
                    state,
                    DEFAULT_NODE_WEIGHT,
                    false
                ))]
            );
        }
    }

    #[test]
    fn a_default_node_encodes_as_before() {
        let change = MapChange::UpsertNode(node(NodeState::Down, DEFAULT_NODE_WEIGHT, false));
        assert_eq!(encode_changes(&[change]), old_format(1));
    }

    #[test]
    fn weight_and_draining_round_trip() {
        for state in [NodeState::Up, NodeState::Down] {
            for weight in [1, 99, 100, 200, u32::MAX] {
                for draining in [false, true] {
                    let n = node(state, weight, draining);
                    let changes = vec![MapChange::UpsertNode(n.clone())];
                    assert_eq!(decode_changes(&encode_changes(&changes)).unwrap(), changes);
                    let map = PartitionMap::from_parts(
                        MapVersion(3),
                        PartitionId(1),
                        [],
                        [n.clone()],
                        [],
                    );
                    assert_eq!(decode_map(&encode_map(&map)).unwrap().nodes[&n.id], n);
                }
            }
        }
    }

    #[test]
    fn replica_endpoint_round_trips_and_nodes_without_one_encode_as_before() {
        let plain = node(NodeState::Up, DEFAULT_NODE_WEIGHT, false);
        let plain_bytes = encode_changes(&[MapChange::UpsertNode(plain.clone())]);
        assert_eq!(
            plain_bytes,
            old_format(0),
            "no replica endpoint: the old bytes"
        );
        for zone in [None, Some("zone-a".to_string())] {
            for weight in [DEFAULT_NODE_WEIGHT, 7] {
                let mut n = node(NodeState::Down, weight, true);
                n.zone = zone.clone();
                n.replica_addr = Some("10.0.0.7:16379".into());
                let changes = vec![MapChange::UpsertNode(n.clone())];
                let bytes = encode_changes(&changes);
                assert_eq!(decode_changes(&bytes).unwrap(), changes);
                // The flag sits in the tag; every byte of the address counts.
                for cut in 0..bytes.len() {
                    assert!(decode_changes(&bytes[..cut]).is_err(), "cut at {cut}");
                }
                let map =
                    PartitionMap::from_parts(MapVersion(3), PartitionId(1), [], [n.clone()], []);
                assert_eq!(decode_map(&encode_map(&map)).unwrap().nodes[&n.id], n);
            }
        }
    }

    #[test]
    fn replication_fields_round_trip_and_unreplicated_records_encode_as_before() {
        let mut n = node(NodeState::Up, DEFAULT_NODE_WEIGHT, false);
        let plain = PartitionMap::bootstrap(std::slice::from_ref(&n), 2).unwrap();
        let plain_bytes = encode_map(&plain);
        n.zone = Some("zone-a".into());
        let mut map = plain.clone();
        map.nodes.insert(n.id, n.clone());
        let ks = map.keyspaces.values_mut().next().unwrap();
        ks.replication_factor = 3;
        ks.min_in_sync = 2;
        let p = map.partitions.values_mut().next().unwrap();
        p.replicas = vec![NodeId(8), NodeId(9)];
        p.in_sync = vec![NodeId(9)];
        let bytes = encode_map(&map);
        assert_eq!(decode_map(&bytes).unwrap(), map);
        assert!(bytes.len() > plain_bytes.len());
        // Without replication the bytes are what older nodes wrote and read.
        assert_eq!(decode_map(&plain_bytes).unwrap(), plain);
        for cut in 0..bytes.len() {
            assert!(decode_map(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        // Reads switched to a replica: one more field, behind its own flag.
        let mut reads = map.clone();
        reads.partitions.values_mut().next().unwrap().reads_from = Some(NodeId(9));
        let reads_bytes = encode_map(&reads);
        assert_eq!(decode_map(&reads_bytes).unwrap(), reads);
        assert!(reads_bytes.len() > bytes.len());
        for cut in 0..reads_bytes.len() {
            assert!(decode_map(&reads_bytes[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn deltas_and_maps_round_trip_and_are_told_apart() {
        let n = node(NodeState::Up, 150, true);
        let map = PartitionMap::bootstrap(std::slice::from_ref(&n), 4).unwrap();
        let full = MapSince::Full(map.clone());
        assert_eq!(encode_since(&full), encode_map(&map));
        assert_eq!(decode_since(&encode_since(&full)).unwrap(), full);
        let mut moved = map.partitions.values().next().unwrap().clone();
        moved.epoch = Epoch(2);
        let delta = MapSince::Delta(vec![
            (MapVersion(2), vec![MapChange::UpsertNode(n.clone())]),
            (
                MapVersion(3),
                vec![
                    MapChange::UpsertPartition(moved),
                    MapChange::RemoveNode { id: NodeId(9) },
                ],
            ),
        ]);
        let bytes = encode_since(&delta);
        assert_eq!(bytes[0], MAGIC_DELTA);
        assert_eq!(decode_since(&bytes).unwrap(), delta);
        let empty = MapSince::Delta(Vec::new());
        assert_eq!(decode_since(&encode_since(&empty)).unwrap(), empty);
        // Truncation anywhere, garbage and a change list are refused, never a panic.
        for cut in 0..bytes.len() {
            assert!(decode_since(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        assert!(decode_since(&encode_changes(&[])).is_err());
        assert!(decode_since(&[MAGIC_DELTA, 0xff, 0xff, 0xff, 0x0f]).is_err());
    }

    #[test]
    fn unknown_node_flags_and_oversized_weights_are_refused() {
        // Every flag bit is taken; an unknown state is refused.
        let mut bad = old_format(0x02);
        assert_eq!(
            decode_changes(&bad),
            Err(MapError::Decode("node state tag"))
        );
        assert!(
            decode_changes(&old_format(NODE_REPLICA_ENDPOINT)).is_err(),
            "replica endpoint address missing"
        );
        bad = old_format(NODE_WEIGHTED);
        bad.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x7f]);
        assert_eq!(decode_changes(&bad), Err(MapError::Decode("node weight")));
        assert!(
            decode_changes(&old_format(NODE_WEIGHTED)).is_err(),
            "weight missing"
        );
    }
}
