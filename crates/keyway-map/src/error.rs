//! Errors of the partition-map API family.

use crate::{KeyspaceId, NodeId, PartitionId};

/// Why a map is invalid, a change cannot apply, or bytes do not decode.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum MapError {
    #[error("keyspace {0} has no partitions")]
    KeyspaceUncovered(KeyspaceId),
    #[error("keyspace {keyspace}: gap or overlap before partition {partition}")]
    CoverageBroken {
        keyspace: KeyspaceId,
        partition: PartitionId,
    },
    #[error("keyspace {keyspace}: partition {partition} has an empty or inverted range")]
    EmptyRange {
        keyspace: KeyspaceId,
        partition: PartitionId,
    },
    #[error("keyspace {keyspace}: partition {partition} boundary is not slot-aligned")]
    UnalignedBoundary {
        keyspace: KeyspaceId,
        partition: PartitionId,
    },
    #[error("partition {0} names unknown keyspace")]
    UnknownKeyspace(PartitionId),
    #[error("partition {partition} is owned by unknown node {node}")]
    UnknownOwner {
        partition: PartitionId,
        node: NodeId,
    },
    #[error("partition {partition}: {why}")]
    BadReplicas {
        partition: PartitionId,
        why: &'static str,
    },
    #[error("keyspace {keyspace}: {why}")]
    BadReplication { keyspace: KeyspaceId, why: String },
    #[error("partition {0} not found")]
    NoSuchPartition(PartitionId),
    #[error("map version must grow: have {have}, got {got}")]
    VersionNotIncreasing { have: u64, got: u64 },
    #[error("epoch of partition {partition} must grow: have {have}, got {got}")]
    EpochNotIncreasing {
        partition: PartitionId,
        have: u64,
        got: u64,
    },
    #[error("cannot decode map bytes: {0}")]
    Decode(&'static str),
}
