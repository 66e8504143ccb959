//! Where the etcd backend keeps what, under the store's key prefix `<p>`,
//! and how each value is encoded (see `docs/etcd.md`).
//!
//! ```text
//! <p>/map/meta                {"version":V,"next_partition_id":N}   rewritten by every commit
//! <p>/map/next_node_id        decimal u64                           node-id allocator
//! <p>/map/keyspace/<id>       encode_changes([UpsertKeyspace(k)])
//! <p>/map/node/<id>           encode_changes([UpsertNode(n)])
//! <p>/map/partition/<id>      encode_changes([UpsertPartition(p)])
//! <p>/history/<version>       'H' ++ 16-byte commit token ++ encode_changes(changes)
//! <p>/leases/<lease id>       {"node":N|null,"ttl_s":T}             attached to the lease
//! <p>/elections/<name>/...    etcd's election keys (v3election API)
//! <p>/migrations/next_id      20-digit decimal u64                  migration-id allocator
//! <p>/migrations/<id>         'M' ++ 8-byte BE generation ++ 16-byte write token ++ record
//! ```
//!
//! Ids and versions are 20-digit zero-padded decimal, so a range read
//! returns them in numeric order. Records reuse `keyway_map`'s compact
//! codec (a one-change list), so there is one binary format for map data.

use keyway_map::{
    Keyspace, KeyspaceId, MapChange, NodeId, NodeInfo, PartitionId, PartitionRecord,
    decode_changes, encode_changes,
};
use serde::{Deserialize, Serialize};

/// The commit token stored with each history entry: lets a commit whose
/// outcome was unknown (the connection broke) find out whether it landed.
pub(super) type Token = [u8; 16];

const HISTORY_MAGIC: u8 = b'H';
const MIGRATION_MAGIC: u8 = b'M';

/// The keys of one store, under its prefix.
#[derive(Clone, Debug)]
pub(super) struct Layout {
    /// `/a/b`: starts with `/`, no trailing `/`.
    prefix: String,
}

/// What a key under `<p>/map/` is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum MapKey {
    Meta,
    NextNodeId,
    Keyspace(KeyspaceId),
    Node(NodeId),
    Partition(PartitionId),
}

impl Layout {
    /// `prefix` is already normalised (`/a/b`).
    pub fn new(prefix: String) -> Self {
        Layout { prefix }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn map_prefix(&self) -> String {
        format!("{}/map/", self.prefix)
    }

    pub fn meta_key(&self) -> String {
        format!("{}/map/meta", self.prefix)
    }

    pub fn next_node_key(&self) -> String {
        format!("{}/map/next_node_id", self.prefix)
    }

    pub fn keyspace_key(&self, id: KeyspaceId) -> String {
        format!("{}/map/keyspace/{:020}", self.prefix, id.0)
    }

    pub fn node_key(&self, id: NodeId) -> String {
        format!("{}/map/node/{:020}", self.prefix, id.0)
    }

    pub fn partition_prefix(&self) -> String {
        format!("{}/map/partition/", self.prefix)
    }

    pub fn partition_key(&self, id: PartitionId) -> String {
        format!("{}/map/partition/{:020}", self.prefix, id.0)
    }

    pub fn history_prefix(&self) -> String {
        format!("{}/history/", self.prefix)
    }

    pub fn history_key(&self, version: u64) -> String {
        format!("{}/history/{version:020}", self.prefix)
    }

    pub fn lease_prefix(&self) -> String {
        format!("{}/leases/", self.prefix)
    }

    pub fn lease_key(&self, lease: u64) -> String {
        format!("{}/leases/{lease:020}", self.prefix)
    }

    /// `<p>/migrations/`: the records and the allocator.
    pub fn migration_prefix(&self) -> String {
        format!("{}/migrations/", self.prefix)
    }

    pub fn migration_key(&self, id: u64) -> String {
        format!("{}/migrations/{id:020}", self.prefix)
    }

    pub fn migration_next_key(&self) -> String {
        format!("{}/migrations/next_id", self.prefix)
    }

    /// The id of a `<p>/migrations/<id>` key (`None` for `next_id`).
    pub fn parse_migration_key(&self, key: &[u8]) -> Option<u64> {
        let rest = std::str::from_utf8(key)
            .ok()?
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix("/migrations/")?;
        parse_id(rest)
    }

    /// The etcd election name of election `name` (`/` and `%` escaped, so
    /// that no election's keys fall under another's).
    pub fn election(&self, name: &str) -> String {
        let escaped = name.replace('%', "%25").replace('/', "%2F");
        format!("{}/elections/{escaped}", self.prefix)
    }

    /// The key etcd's election API gives the candidacy of `lease` in the
    /// election named `etcd_name` (see [`Self::election`]).
    pub fn candidacy_key(&self, etcd_name: &str, lease: u64) -> String {
        format!("{etcd_name}/{lease:x}")
    }

    /// What a key returned by a range read of [`Self::map_prefix`] is.
    pub fn parse_map_key(&self, key: &[u8]) -> Option<MapKey> {
        let rest = std::str::from_utf8(key)
            .ok()?
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix("/map/")?;
        match rest {
            "meta" => return Some(MapKey::Meta),
            "next_node_id" => return Some(MapKey::NextNodeId),
            _ => {}
        }
        let (kind, id) = rest.split_once('/')?;
        let id: u64 = parse_id(id)?;
        match kind {
            "keyspace" => u32::try_from(id)
                .ok()
                .map(|id| MapKey::Keyspace(KeyspaceId(id))),
            "node" => Some(MapKey::Node(NodeId(id))),
            "partition" => Some(MapKey::Partition(PartitionId(id))),
            _ => None,
        }
    }

    /// The version of a `<p>/history/<version>` key.
    pub fn parse_history_key(&self, key: &[u8]) -> Option<u64> {
        let rest = std::str::from_utf8(key)
            .ok()?
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix("/history/")?;
        parse_id(rest)
    }

    /// The lease id of a `<p>/leases/<id>` key.
    pub fn parse_lease_key(&self, key: &[u8]) -> Option<u64> {
        let rest = std::str::from_utf8(key)
            .ok()?
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix("/leases/")?;
        parse_id(rest)
    }
}

fn parse_id(text: &str) -> Option<u64> {
    (text.len() == 20 && text.bytes().all(|b| b.is_ascii_digit()))
        .then(|| text.parse().ok())
        .flatten()
}

/// `<p>/map/meta`: the map version and the partition-id allocator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Meta {
    pub version: u64,
    pub next_partition_id: u64,
}

pub(super) fn encode_meta(meta: &Meta) -> Vec<u8> {
    serde_json::to_vec(meta).expect("two integers always encode")
}

pub(super) fn decode_meta(bytes: &[u8]) -> Result<Meta, String> {
    serde_json::from_slice(bytes).map_err(|e| format!("map meta: {e}"))
}

pub(super) fn encode_counter(n: u64) -> Vec<u8> {
    n.to_string().into_bytes()
}

pub(super) fn decode_counter(bytes: &[u8]) -> Result<u64, String> {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            format!(
                "counter {:?} is not a decimal u64",
                String::from_utf8_lossy(bytes)
            )
        })
}

pub(super) fn encode_keyspace(k: &Keyspace) -> Vec<u8> {
    encode_changes(&[MapChange::UpsertKeyspace(k.clone())])
}

pub(super) fn encode_node(n: &NodeInfo) -> Vec<u8> {
    encode_changes(&[MapChange::UpsertNode(n.clone())])
}

pub(super) fn encode_partition(p: &PartitionRecord) -> Vec<u8> {
    encode_changes(&[MapChange::UpsertPartition(p.clone())])
}

/// Decodes one record written by the `encode_*` functions above.
pub(super) fn decode_record(bytes: &[u8]) -> Result<MapChange, String> {
    let mut changes = decode_changes(bytes).map_err(|e| e.to_string())?;
    match (changes.pop(), changes.is_empty()) {
        (Some(change), true) => Ok(change),
        _ => Err("a record holds exactly one change".into()),
    }
}

/// One history entry: the changes of one version and the token of the
/// commit that wrote it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct HistoryEntry {
    pub token: Token,
    pub changes: Vec<MapChange>,
}

pub(super) fn encode_history(token: &Token, changes: &[MapChange]) -> Vec<u8> {
    let body = encode_changes(changes);
    let mut out = Vec::with_capacity(1 + token.len() + body.len());
    out.push(HISTORY_MAGIC);
    out.extend_from_slice(token);
    out.extend_from_slice(&body);
    out
}

pub(super) fn decode_history(bytes: &[u8]) -> Result<HistoryEntry, String> {
    let (&magic, rest) = bytes.split_first().ok_or("empty history entry")?;
    if magic != HISTORY_MAGIC || rest.len() < 16 {
        return Err("not a history entry".into());
    }
    let (token, body) = rest.split_at(16);
    Ok(HistoryEntry {
        token: token.try_into().expect("16 bytes"),
        changes: decode_changes(body).map_err(|e| e.to_string())?,
    })
}

/// `<p>/migrations/next_id`: 20 digits, so that etcd's (bytewise) value
/// compare orders it numerically against [`encode_migration_id`].
pub(super) fn encode_migration_id(id: u64) -> Vec<u8> {
    format!("{id:020}").into_bytes()
}

/// A stored migration record: its generation, the random token of the
/// write that stored it (lets a write whose answer was lost find out
/// whether it landed), and the opaque record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct MigrationValue {
    pub generation: u64,
    pub token: Token,
    pub record: Vec<u8>,
}

pub(super) fn encode_migration(generation: u64, token: &Token, record: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + 8 + token.len() + record.len());
    out.push(MIGRATION_MAGIC);
    out.extend_from_slice(&generation.to_be_bytes());
    out.extend_from_slice(token);
    out.extend_from_slice(record);
    out
}

pub(super) fn decode_migration(bytes: &[u8]) -> Result<MigrationValue, String> {
    match bytes.split_first() {
        Some((&MIGRATION_MAGIC, rest)) if rest.len() >= 8 + 16 => {
            let (generation, rest) = rest.split_at(8);
            let (token, record) = rest.split_at(16);
            Ok(MigrationValue {
                generation: u64::from_be_bytes(generation.try_into().expect("8 bytes")),
                token: token.try_into().expect("16 bytes"),
                record: record.to_vec(),
            })
        }
        _ => Err("not a migration record".into()),
    }
}

/// `<p>/leases/<id>`: who holds the lease (a node, or nobody for an
/// election session) and the TTL etcd granted, in seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct LeaseRecord {
    pub node: Option<u64>,
    pub ttl_s: u64,
}

pub(super) fn encode_lease(r: &LeaseRecord) -> Vec<u8> {
    serde_json::to_vec(r).expect("a small record always encodes")
}

pub(super) fn decode_lease(bytes: &[u8]) -> Result<LeaseRecord, String> {
    serde_json::from_slice(bytes).map_err(|e| format!("lease record: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyway_map::{Epoch, NodeState, PartitionState};

    #[test]
    fn keys_parse_back_and_sort_numerically() {
        let l = Layout::new("/keyway/c1".into());
        assert_eq!(l.meta_key(), "/keyway/c1/map/meta");
        assert_eq!(l.parse_map_key(l.meta_key().as_bytes()), Some(MapKey::Meta));
        assert_eq!(
            l.parse_map_key(l.next_node_key().as_bytes()),
            Some(MapKey::NextNodeId)
        );
        assert_eq!(
            l.parse_map_key(l.keyspace_key(KeyspaceId(7)).as_bytes()),
            Some(MapKey::Keyspace(KeyspaceId(7)))
        );
        assert_eq!(
            l.parse_map_key(l.node_key(NodeId(u64::MAX)).as_bytes()),
            Some(MapKey::Node(NodeId(u64::MAX)))
        );
        assert_eq!(
            l.parse_map_key(l.partition_key(PartitionId(12)).as_bytes()),
            Some(MapKey::Partition(PartitionId(12)))
        );
        assert!(l.partition_key(PartitionId(9)) < l.partition_key(PartitionId(10)));
        assert!(l.history_key(99) < l.history_key(100));
        assert_eq!(l.parse_history_key(l.history_key(42).as_bytes()), Some(42));
        assert_eq!(l.parse_lease_key(l.lease_key(5).as_bytes()), Some(5));
        for bad in [
            "/keyway/c1/map/partition/12",
            "/keyway/c1/map/what/00000000000000000001",
            "/keyway/c2/map/meta",
            "/keyway/c1/map/keyspace/99999999999999999999",
        ] {
            assert_eq!(l.parse_map_key(bad.as_bytes()), None, "{bad}");
        }
        assert!(l.history_key(1).starts_with(&l.history_prefix()));
        assert_eq!(l.election("a/b%"), "/keyway/c1/elections/a%2Fb%25");
        assert!(
            !l.election("a/b")
                .starts_with(&format!("{}/", l.election("a")))
        );
        assert_eq!(
            l.candidacy_key(&l.election("m"), 255),
            "/keyway/c1/elections/m/ff"
        );
        assert!(l.partition_key(PartitionId(1)).starts_with(&l.map_prefix()));
        assert_eq!(
            l.migration_key(3),
            "/keyway/c1/migrations/00000000000000000003"
        );
        assert_eq!(
            l.parse_migration_key(l.migration_key(3).as_bytes()),
            Some(3)
        );
        assert_eq!(
            l.parse_migration_key(l.migration_next_key().as_bytes()),
            None
        );
        assert!(l.migration_key(9) < l.migration_key(10));
        assert!(l.migration_next_key().starts_with(&l.migration_prefix()));
        assert!(encode_migration_id(10) > encode_migration_id(9));
    }

    #[test]
    fn values_round_trip() {
        let meta = Meta {
            version: 9,
            next_partition_id: 4,
        };
        assert_eq!(decode_meta(&encode_meta(&meta)), Ok(meta));
        assert_eq!(decode_counter(&encode_counter(17)), Ok(17));
        assert!(decode_counter(b"x").is_err());
        let node = NodeInfo {
            id: NodeId(3),
            resp_addr: "h:1".into(),
            admin_addr: "h:2".into(),
            state: NodeState::Up,
            weight: keyway_map::DEFAULT_NODE_WEIGHT,
            draining: false,
            zone: None,
            replica_addr: None,
        };
        let part = PartitionRecord {
            id: PartitionId(5),
            keyspace: KeyspaceId(0),
            start: bytes::Bytes::from_static(&[0, 0]),
            end: None,
            owner: NodeId(3),
            replicas: vec![],
            in_sync: Vec::new(),
            reads_from: None,
            epoch: Epoch(2),
            state: PartitionState::Active,
        };
        assert_eq!(
            decode_record(&encode_node(&node)),
            Ok(MapChange::UpsertNode(node.clone()))
        );
        assert_eq!(
            decode_record(&encode_partition(&part)),
            Ok(MapChange::UpsertPartition(part.clone()))
        );
        assert!(decode_record(&encode_changes(&[])).is_err());
        let token = [7u8; 16];
        let changes = vec![
            MapChange::UpsertNode(node),
            MapChange::UpsertPartition(part),
        ];
        let entry = decode_history(&encode_history(&token, &changes)).unwrap();
        assert_eq!(entry, HistoryEntry { token, changes });
        assert!(decode_history(b"H").is_err());
        let lease = LeaseRecord {
            node: Some(2),
            ttl_s: 30,
        };
        assert_eq!(decode_lease(&encode_lease(&lease)), Ok(lease));
        let m = MigrationValue {
            generation: u64::MAX - 1,
            token: [3; 16],
            record: b"rec".to_vec(),
        };
        assert_eq!(
            decode_migration(&encode_migration(m.generation, &m.token, &m.record)),
            Ok(m)
        );
        let empty = encode_migration(1, &[0; 16], &[]);
        assert_eq!(empty.len(), 25);
        assert_eq!(decode_migration(&empty).unwrap().record, Vec::<u8>::new());
        assert!(decode_migration(&empty[..24]).is_err());
        assert!(decode_migration(b"H12345678123456781234567812345678").is_err());
        assert_eq!(decode_counter(&encode_migration_id(42)), Ok(42));
    }
}
