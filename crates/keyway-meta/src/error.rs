//! [`MetaError`]: everything a metadata-store call can fail with, the same
//! for every backend and on both sides of the RPC (the wire carries each
//! variant exactly, see `rpc/convert.rs`).

use crate::LeaseId;
use keyway_map::{Epoch, MapError, NodeId, PartitionId};

/// Why a metadata-store call failed.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum MetaError {
    /// The store is unreachable, shutting down, or the RPC transport failed
    /// (including a call that timed out). The outcome of a mutating call that
    /// failed this way is unknown: callers retry, re-reading what they need.
    #[error("metadata store unavailable: {0}")]
    Unavailable(String),
    /// A compare-and-set condition did not hold; carries what is there now
    /// (`None`: the partition does not exist).
    #[error("conflict on partition {partition}: current owner/epoch is {}", fmt_current(.current))]
    Conflict {
        partition: PartitionId,
        current: Option<(NodeId, Epoch)>,
    },
    /// The changes do not apply, or the map they would produce fails
    /// [`keyway_map::PartitionMap::validate`]; nothing changed.
    #[error("refused: the resulting map is invalid: {0}")]
    InvalidMap(MapError),
    /// The lease expired, was revoked, or never existed.
    #[error("lease {} not found (expired or revoked)", .0.0)]
    LeaseNotFound(LeaseId),
    /// A migration record's compare-and-set failed: the stored generation is
    /// not the one expected; carries the generation stored now (`None`: no
    /// record for that id).
    #[error("conflict on migration {id}: current generation is {}", fmt_generation(.current))]
    MigrationConflict { id: u64, current: Option<u64> },
    /// The request itself is malformed (unknown node, zero TTL, bad URL, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The store failed in a way retrying will not fix (corrupt state file,
    /// failed fsync, ...).
    #[error("metadata store internal error: {0}")]
    Internal(String),
    /// The metadata server refused this process's cluster secret (wrong or
    /// missing `--cluster-secret-file`); retrying will not fix it.
    #[error("{0}")]
    Unauthenticated(String),
}

fn fmt_current(current: &Option<(NodeId, Epoch)>) -> String {
    match current {
        Some((node, epoch)) => format!("({node}, {epoch})"),
        None => "absent".to_string(),
    }
}

fn fmt_generation(current: &Option<u64>) -> String {
    match current {
        Some(generation) => generation.to_string(),
        None => "absent".to_string(),
    }
}

impl From<MapError> for MetaError {
    fn from(e: MapError) -> Self {
        MetaError::InvalidMap(e)
    }
}
