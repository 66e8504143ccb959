//! Partition records and node records: the rows of the partition map.

use crate::{Epoch, KeyspaceId, NodeId, PartitionId};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// Lifecycle state of a partition record. Migrations, splits and merges add
/// states as they arrive; a node serves a partition only in `Active`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PartitionState {
    /// The owner serves reads and writes.
    Active,
}

/// One partition: a contiguous range `[start, end)` of keyspace-local routing
/// keys, its owner and its epoch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionRecord {
    pub id: PartitionId,
    pub keyspace: KeyspaceId,
    /// Inclusive lower bound (keyspace-local routing key).
    #[serde(with = "hex_bytes")]
    pub start: Bytes,
    /// Exclusive upper bound; `None` means the end of the keyspace.
    #[serde(with = "hex_opt_bytes")]
    pub end: Option<Bytes>,
    pub owner: NodeId,
    /// Every other node holding a copy (never the owner, no duplicates):
    /// in sync or catching up. The manager decides who is listed here.
    pub replicas: Vec<NodeId>,
    /// The replicas that hold every acknowledged write (a subset of
    /// `replicas`; the owner is always implicitly in sync). Changed only by
    /// compare-and-set at a new epoch: shrunk by the primary after
    /// `replica_lag_timeout_ms`, grown by the primary once a replica caught
    /// up, emptied by a failover. Only these may be promoted (invariant 10)
    /// or serve `READONLY` reads (invariant 11).
    #[serde(default)]
    pub in_sync: Vec<NodeId>,
    /// Reads switched ahead of writes (a move with `--reads-first`): an
    /// in-sync replica that serves this partition's reads routed by the
    /// smart client and the proxy while the owner keeps the writes. Set and
    /// cleared by the leading manager by CAS; cleared by every change of
    /// the owner and whenever the node leaves `in_sync`. Always a member of
    /// `in_sync` (checked by `validate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reads_from: Option<NodeId>,
    pub epoch: Epoch,
    pub state: PartitionState,
}

impl PartitionRecord {
    /// Whether the keyspace-local routing key falls in `[start, end)`.
    pub fn contains(&self, local_key: &[u8]) -> bool {
        local_key >= &self.start[..] && self.end.as_ref().is_none_or(|end| local_key < &end[..])
    }

    /// The partition's bounds as storage keys (`be32(keyspace) ++ bound`):
    /// `[start, end)`, with `end = None` only for the last keyspace id.
    pub fn storage_bounds(&self) -> (Bytes, Option<Bytes>) {
        let prefix = self.keyspace.0.to_be_bytes();
        let start = [&prefix[..], &self.start[..]].concat();
        let end = match &self.end {
            Some(end) => Some([&prefix[..], &end[..]].concat()),
            None => self
                .keyspace
                .0
                .checked_add(1)
                .map(|next| next.to_be_bytes().to_vec()),
        };
        (Bytes::from(start), end.map(Bytes::from))
    }

    /// Whether `node` holds a copy (owner or replica).
    pub fn has_copy(&self, node: NodeId) -> bool {
        self.owner == node || self.replicas.contains(&node)
    }

    /// Takes replica `node` off the row: out of `replicas` and `in_sync`,
    /// and no longer the `reads_from` node (which must be in sync).
    pub fn remove_replica(&mut self, node: NodeId) {
        self.replicas.retain(|r| *r != node);
        self.in_sync.retain(|r| *r != node);
        if self.reads_from == Some(node) {
            self.reads_from = None;
        }
    }

    /// Whether `node` is a replica in the in-sync set.
    pub fn is_in_sync_replica(&self, node: NodeId) -> bool {
        self.in_sync.contains(&node)
    }

    /// Copies that hold every acknowledged write: the owner plus the in-sync
    /// replicas (what `min_in_sync` is compared with).
    pub fn in_sync_copies(&self) -> usize {
        1 + self.in_sync.len()
    }

    /// Every node with a copy, the owner first.
    pub fn copies(&self) -> impl Iterator<Item = NodeId> + '_ {
        std::iter::once(self.owner).chain(self.replicas.iter().copied())
    }

    /// For a hash keyspace: the slots `[first, last]` this partition covers.
    pub fn slot_span(&self) -> (u16, u16) {
        let first = slot_of_bound(&self.start).unwrap_or(0);
        let end = self
            .end
            .as_ref()
            .and_then(|e| slot_of_bound(e))
            .unwrap_or(crate::SLOT_COUNT);
        (first, end - 1)
    }
}

fn slot_of_bound(bound: &[u8]) -> Option<u16> {
    bound.first_chunk::<2>().map(|b| u16::from_be_bytes(*b))
}

/// Whether a node is taking part in the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeState {
    Up,
    Down,
}

/// The weight of a node nobody set one for (see [`NodeInfo::weight`]).
pub const DEFAULT_NODE_WEIGHT: u32 = 100;

/// A registered node and where to reach it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub id: NodeId,
    /// `host:port` of the RESP listener, as clients should dial it.
    pub resp_addr: String,
    /// `host:port` of the admin HTTP listener.
    pub admin_addr: String,
    /// Up or Down: whether the node holds a lease (the manager's leader
    /// marks it; registration marks it Up).
    pub state: NodeState,
    /// The node's share of the load relative to the others' (fair share of
    /// node i = total × weight_i / Σ weight); set by operators, kept by
    /// re-registration. Default [`DEFAULT_NODE_WEIGHT`].
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// Set by operators (`keyway ctl drain`): the rebalancer moves every
    /// partition away and never moves one to it. Kept by re-registration.
    #[serde(default)]
    pub draining: bool,
    /// Failure-domain label (`--zone`): placement puts a partition's copies
    /// in distinct zones when it can. `None`: no zone given.
    #[serde(default)]
    pub zone: Option<String>,
    /// `host:port` of the node's replica endpoint (`--replica-listen`): a
    /// second RESP listener whose connections start `READONLY` and serve
    /// only replica reads. `CLUSTER SLOTS`/`SHARDS`/`NODES` list the node's
    /// replica copies at this address, under [`NodeId::replica_role_id`],
    /// so to a Redis client the node is one master plus one replica
    /// process. `None`: no replica endpoint (its copies are not advertised
    /// as read targets).
    #[serde(default)]
    pub replica_addr: Option<String>,
}

/// `host:port` (or `[v6]:port`) split for the Redis replies; port 0 when absent.
fn split_host_port(addr: &str) -> (&str, u16) {
    match addr.rsplit_once(':') {
        Some((host, port)) => (host.trim_matches(['[', ']']), port.parse().unwrap_or(0)),
        None => (addr, 0),
    }
}

fn default_weight() -> u32 {
    DEFAULT_NODE_WEIGHT
}

impl NodeInfo {
    /// A node that is up, at the default weight, not draining, with no
    /// admin address: what registration makes of a fresh node.
    pub fn up(id: NodeId, resp_addr: String) -> Self {
        NodeInfo {
            id,
            resp_addr,
            admin_addr: String::new(),
            state: NodeState::Up,
            weight: DEFAULT_NODE_WEIGHT,
            draining: false,
            zone: None,
            replica_addr: None,
        }
    }

    /// Host and port of the RESP address, split for `CLUSTER SLOTS` and `-MOVED`.
    pub fn resp_host_port(&self) -> (&str, u16) {
        split_host_port(&self.resp_addr)
    }

    /// Host and port of the replica endpoint, if the node has one.
    pub fn replica_host_port(&self) -> Option<(&str, u16)> {
        self.replica_addr.as_deref().map(split_host_port)
    }
}

mod hex_bytes {
    use bytes::Bytes;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(b: &Bytes, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::to_hex(b))
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
        let text = String::deserialize(d)?;
        super::from_hex(&text).ok_or_else(|| serde::de::Error::custom("bad hex"))
    }
}

mod hex_opt_bytes {
    use bytes::Bytes;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(b: &Option<Bytes>, s: S) -> Result<S::Ok, S::Error> {
        match b {
            Some(b) => s.serialize_some(&super::to_hex(b)),
            None => s.serialize_none(),
        }
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Bytes>, D::Error> {
        match Option::<String>::deserialize(d)? {
            Some(text) => super::from_hex(&text)
                .map(Some)
                .ok_or_else(|| serde::de::Error::custom("bad hex")),
            None => Ok(None),
        }
    }
}

/// Lower-case hex of `bytes`.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parses lower- or upper-case hex.
pub fn from_hex(text: &str) -> Option<Bytes> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()
        .map(Bytes::from)
}
