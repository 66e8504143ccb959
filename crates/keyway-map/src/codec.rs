//! Compact binary encoding of maps and changes.
//!
//! Format (all integers LEB128 varints, byte strings length-prefixed):
//! a map is `MAGIC, version, next_partition_id, keyspaces, nodes, partitions`;
//! a change list is `MAGIC_CHANGES, count, change*`. Roughly 20 bytes per
//! hash partition. Decoding checks every length against the input, so
//! corrupt bytes give [`MapError::Decode`], never a panic.

use crate::{
    Epoch, Keyspace, KeyspaceId, MapChange, MapError, MapVersion, NodeId, NodeInfo, NodeState,
    PartitionId, PartitionMap, PartitionRecord, PartitionState, Routing,
};
use bytes::Bytes;

const MAGIC_MAP: u8 = 0x4b; // 'K'
const MAGIC_CHANGES: u8 = 0x43; // 'C'

/// Encodes a whole map.
pub fn encode_map(map: &PartitionMap) -> Vec<u8> {
    let mut w = Writer(Vec::with_capacity(64 + map.partitions.len() * 24));
    w.u8(MAGIC_MAP);
    w.var(map.version.0);
    w.var(map.next_partition_id.0);
    w.var(map.keyspaces.len() as u64);
    map.keyspaces.values().for_each(|k| w.keyspace(k));
    w.var(map.nodes.len() as u64);
    map.nodes.values().for_each(|n| w.node(n));
    w.var(map.partitions.len() as u64);
    map.partitions.values().for_each(|p| w.partition(p));
    w.0
}

/// Decodes a map encoded by [`encode_map`]; the result is indexed but not validated.
pub fn decode_map(bytes: &[u8]) -> Result<PartitionMap, MapError> {
    let mut r = Reader(bytes);
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
    let mut w = Writer(Vec::new());
    w.u8(MAGIC_CHANGES);
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
    w.0
}

/// Decodes a list of changes encoded by [`encode_changes`].
pub fn decode_changes(bytes: &[u8]) -> Result<Vec<MapChange>, MapError> {
    let mut r = Reader(bytes);
    r.expect(MAGIC_CHANGES)?;
    let changes = r.list(|r| {
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
    })?;
    r.finish()?;
    Ok(changes)
}

struct Writer(Vec<u8>);

impl Writer {
    fn u8(&mut self, b: u8) {
        self.0.push(b);
    }
    fn var(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }
    fn bytes(&mut self, b: &[u8]) {
        self.var(b.len() as u64);
        self.0.extend_from_slice(b);
    }
    fn keyspace(&mut self, k: &Keyspace) {
        self.var(k.id.0 as u64);
        self.bytes(k.name.as_bytes());
        self.u8(match k.routing {
            Routing::Hash => 0,
            Routing::Range => 1,
        });
    }
    fn node(&mut self, n: &NodeInfo) {
        self.var(n.id.0);
        self.bytes(n.resp_addr.as_bytes());
        self.bytes(n.admin_addr.as_bytes());
        self.u8(match n.state {
            NodeState::Up => 0,
            NodeState::Down => 1,
        });
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
        self.u8(match p.state {
            PartitionState::Active => 0,
        });
    }
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn u8(&mut self) -> Result<u8, MapError> {
        let (&b, rest) = self.0.split_first().ok_or(MapError::Decode("truncated"))?;
        self.0 = rest;
        Ok(b)
    }
    fn expect(&mut self, magic: u8) -> Result<(), MapError> {
        (self.u8()? == magic)
            .then_some(())
            .ok_or(MapError::Decode("bad magic"))
    }
    fn var(&mut self) -> Result<u64, MapError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            v |= ((b & 0x7f) as u64) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(MapError::Decode("varint too long"))
    }
    fn u32(&mut self) -> Result<u32, MapError> {
        u32::try_from(self.var()?).map_err(|_| MapError::Decode("u32 out of range"))
    }
    fn bytes(&mut self) -> Result<Bytes, MapError> {
        let len = usize::try_from(self.var()?).map_err(|_| MapError::Decode("length"))?;
        if len > self.0.len() {
            return Err(MapError::Decode("truncated bytes"));
        }
        let (b, rest) = self.0.split_at(len);
        self.0 = rest;
        Ok(Bytes::copy_from_slice(b))
    }
    fn string(&mut self) -> Result<String, MapError> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| MapError::Decode("utf-8"))
    }
    fn list<T>(
        &mut self,
        mut item: impl FnMut(&mut Self) -> Result<T, MapError>,
    ) -> Result<Vec<T>, MapError> {
        let n = self.var()?;
        // Every item takes at least one byte: refuse counts the input cannot hold.
        if n > self.0.len() as u64 {
            return Err(MapError::Decode("count exceeds input"));
        }
        (0..n).map(|_| item(self)).collect()
    }
    fn finish(&self) -> Result<(), MapError> {
        self.0
            .is_empty()
            .then_some(())
            .ok_or(MapError::Decode("trailing bytes"))
    }
    fn keyspace(&mut self) -> Result<Keyspace, MapError> {
        let id = KeyspaceId(self.u32()?);
        let name = self.string()?;
        let routing = match self.u8()? {
            0 => Routing::Hash,
            1 => Routing::Range,
            _ => return Err(MapError::Decode("routing tag")),
        };
        Ok(Keyspace { id, name, routing })
    }
    fn node(&mut self) -> Result<NodeInfo, MapError> {
        let id = NodeId(self.var()?);
        let resp_addr = self.string()?;
        let admin_addr = self.string()?;
        let state = match self.u8()? {
            0 => NodeState::Up,
            1 => NodeState::Down,
            _ => return Err(MapError::Decode("node state tag")),
        };
        Ok(NodeInfo {
            id,
            resp_addr,
            admin_addr,
            state,
        })
    }
    fn partition(&mut self) -> Result<PartitionRecord, MapError> {
        let id = PartitionId(self.var()?);
        let keyspace = KeyspaceId(self.u32()?);
        let start = self.bytes()?;
        let end = match self.u8()? {
            0 => None,
            1 => Some(self.bytes()?),
            _ => return Err(MapError::Decode("end tag")),
        };
        let owner = NodeId(self.var()?);
        let replicas = self.list(|r| r.var().map(NodeId))?;
        let epoch = Epoch(self.var()?);
        let state = match self.u8()? {
            0 => PartitionState::Active,
            _ => return Err(MapError::Decode("partition state tag")),
        };
        Ok(PartitionRecord {
            id,
            keyspace,
            start,
            end,
            owner,
            replicas,
            epoch,
            state,
        })
    }
}
