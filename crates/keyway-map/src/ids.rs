//! Identifier newtypes. Each is a plain integer so comparisons are one
//! instruction, and each prints the way operators see it.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $inner:ty) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub $inner);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)
            }
        }
    };
}

id_type!(
    /// A keyspace's id; keyspace `0` is the default Redis-compatible hash keyspace.
    KeyspaceId,
    u32
);
id_type!(
    /// A partition's id, never reused within a cluster.
    PartitionId,
    u64
);
id_type!(
    /// Per-partition generation: grows on every ownership change, split and
    /// merge, never reused. A node rejects any request below the epoch it holds.
    Epoch,
    u64
);
id_type!(
    /// Version of the whole map: grows on every change to any record.
    MapVersion,
    u64
);

/// A node's id. Allocated by the metadata store at first registration and
/// kept in the node's data directory. Shown as 40 hex digits, the width Redis
/// Cluster clients expect from `CLUSTER MYID` and `CLUSTER NODES`.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct NodeId(pub u64);

impl NodeId {
    /// Parses the 40-hex-digit form (or any shorter hex form, or a decimal id).
    pub fn parse(text: &str) -> Option<NodeId> {
        let text = text.trim();
        if text.is_empty() {
            return None;
        }
        if text.len() == 40 || text.chars().any(|c| c.is_ascii_alphabetic()) {
            return u64::from_str_radix(text.trim_start_matches('0'), 16)
                .ok()
                .or_else(|| text.chars().all(|c| c == '0').then_some(0))
                .map(NodeId);
        }
        text.parse().ok().map(NodeId)
    }
}

/// The first 24 of the 40 hex digits of a replica role id
/// ([`NodeId::replica_role_id`]); a node id's own are all `0`.
const REPLICA_ROLE_PREFIX: &str = "000000000000000000000001";

impl NodeId {
    /// The Redis node id of this node's replica endpoint (its replica role
    /// in `CLUSTER SLOTS`/`SHARDS`/`NODES`, and `CLUSTER MYID` on the
    /// replica port): 40 hex digits, `000000000000000000000001` then the
    /// node id's 16 (the node's own id has 24 zeros there), so it never
    /// equals any node id and [`NodeId::parse`] does not take it for one.
    pub fn replica_role_id(self) -> String {
        format!("{REPLICA_ROLE_PREFIX}{:016x}", self.0)
    }

    /// The node whose replica role id `text` is, if it is one.
    pub fn parse_replica_role_id(text: &str) -> Option<NodeId> {
        let digits = text.trim().strip_prefix(REPLICA_ROLE_PREFIX)?;
        (digits.len() == 16)
            .then(|| u64::from_str_radix(digits, 16).ok().map(NodeId))
            .flatten()
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:040x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replica_role_ids_are_distinct_from_node_ids_and_round_trip() {
        for raw in [0u64, 1, 42, u64::MAX] {
            let id = NodeId(raw);
            let role = id.replica_role_id();
            assert_eq!(role.len(), 40);
            assert!(role.chars().all(|c| c.is_ascii_hexdigit()));
            assert_ne!(role, id.to_string());
            assert_eq!(NodeId::parse_replica_role_id(&role), Some(id));
            assert_eq!(NodeId::parse(&role), None, "{role}");
            assert_eq!(NodeId::parse_replica_role_id(&id.to_string()), None);
        }
    }

    #[test]
    fn node_id_round_trips_through_its_display_form() {
        for raw in [0u64, 1, 42, u64::MAX] {
            let id = NodeId(raw);
            assert_eq!(id.to_string().len(), 40);
            assert_eq!(NodeId::parse(&id.to_string()), Some(id));
        }
        assert_eq!(NodeId::parse("7"), Some(NodeId(7)));
        assert_eq!(NodeId::parse("zz"), None);
        assert_eq!(NodeId::parse(""), None);
    }
}
