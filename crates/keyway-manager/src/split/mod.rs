//! Splits: one partition becomes two, in one metadata compare-and-set, with
//! no data moving (invariant 8: storage keys never change; the owner keeps
//! serving both halves from the same engine).
//!
//! # The process
//!
//! 1. *Decide* (`decide.rs`, pure): from one load snapshot at a time the
//!    [`SplitPolicy`] picks partitions to split and says why: `size` (more
//!    than `split_max_bytes`, split at the owner's `size_split_key`) or
//!    `load` (above `split_max_requests_per_sec` in every snapshot for
//!    `split_load_window_ms`, split at the owner's `load_split_key` so both
//!    halves carry similar sampled load). It also says why it holds back:
//!    `single_key` (one key carries more than `split_single_key_share` of
//!    the sampled requests: no split point can divide it), `migrating`,
//!    `cooldown` (born by a split or merge less than `split_cooldown_ms`
//!    ago), `warming` (hot, window not over), `single_slot`, `no_split_key`.
//! 2. *Plan* (`plan.rs`, pure): resolve the split point ([`SplitAt`]) to a
//!    keyspace-local routing-key bound strictly inside `[start, end)` —
//!    slot-aligned in a hash keyspace (`be16(slot)`; a single-slot
//!    partition never splits) — and build the `MapTxn`: conditions
//!    `(owner, epoch)` on the parent and *absent* on both new ids; changes
//!    `RemovePartition{parent}`, two `UpsertPartition` children with ids
//!    `next_partition_id` and the one after (reserved past), the parent's
//!    owner and replicas, epoch = parent epoch + 1, ranges `[start, at)` and
//!    `[at, end)`.
//! 3. *Apply* (`apply.rs`): refuse a partition any non-terminal migration
//!    record covers part of (checked after reading the map, the commit
//!    conditional on the row as read: atomic with respect to every flip),
//!    commit, and tell a lost CAS on the parent ([`SplitError::Lost`],
//!    nothing changed) from a lost race for the new ids (re-planned).
//!
//! After the commit every node installs the children at epoch e+1: a
//! request still naming the parent at e is rejected with the child's record
//! (`KWMOVED`, `Rejection::StaleEpoch`), and Redis clients see nothing (same
//! owner, so no `-MOVED`). A migration of the parent requested concurrently
//! can never flip: its flip is conditional on the parent's `(source, e)`,
//! which no longer exists, so it aborts.
//!
//! `splitter.rs` runs the policy each round; `merge/` is the inverse.

mod apply;
mod decide;
mod history;
mod plan;
#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;

pub(crate) use apply::abort_raced;
pub use apply::{SplitRequest, live_migrations, migration_over, split_checked, split_partition};
pub(crate) use decide::usable;
pub use decide::{SplitAction, SplitPolicy, SplitVerdict};
pub use history::{Birth, History};
pub(crate) use plan::range_text;
pub use plan::{SplitPlan, hash_split_slot, plan_split, resolve_split_point};

use keyway_map::{Epoch, NodeId, PartitionId};
use keyway_meta::MetaError;
use keyway_migration::{MigrationId, MigrationState};

/// Where to split a partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SplitAt {
    /// A user key. Range keyspace: the key itself starts the right child.
    /// Hash keyspace: the key's slot (hash tags honoured) starts it.
    Key(bytes::Bytes),
    /// Hash keyspaces: the right child starts at this slot.
    Slot(u16),
    /// An exact keyspace-local routing-key bound. Hash keyspaces accept only
    /// a slot boundary (`be16(slot)`); anything else is refused as unaligned.
    Bound(bytes::Bytes),
    /// The middle: the median slot of a hash partition; for a range
    /// partition the owner's `size_split_key` when the caller has one
    /// (refused otherwise: bytes order says nothing about the middle).
    Auto,
}

impl std::fmt::Display for SplitAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SplitAt::Key(k) => write!(f, "key {}", crate::stats::key_text(k)),
            SplitAt::Slot(s) => write!(f, "slot {s}"),
            SplitAt::Bound(b) => write!(f, "bound 0x{}", keyway_map::to_hex(b)),
            SplitAt::Auto => write!(f, "auto"),
        }
    }
}

/// Why a split was refused. Nothing changed in any case.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum SplitError {
    #[error(transparent)]
    Meta(#[from] MetaError),
    #[error("partition {0} is not in the map")]
    UnknownPartition(PartitionId),
    #[error(
        "partition {partition} has migration {migration} in {state}: it splits once the migration ended"
    )]
    Migrating {
        partition: PartitionId,
        migration: MigrationId,
        state: MigrationState,
    },
    #[error("partition {partition} covers a single slot ({slot}): a single slot never splits")]
    SingleSlot { partition: PartitionId, slot: u16 },
    #[error("split point {at} is not strictly inside partition {partition} ({range})")]
    NotInside {
        partition: PartitionId,
        at: String,
        range: String,
    },
    #[error(
        "split point {at} of partition {partition} is not a slot boundary (hash keyspaces split between slots)"
    )]
    Unaligned { partition: PartitionId, at: String },
    #[error("partition {partition} is in a range keyspace: split it at a key, not a slot")]
    NotHash { partition: PartitionId },
    #[error("partition {partition}: no split point: {why}")]
    NoSplitPoint {
        partition: PartitionId,
        why: &'static str,
    },
    #[error("partition {partition} changed under the split (now {}): nothing changed", fmt_current(.current))]
    Lost {
        partition: PartitionId,
        current: Option<(NodeId, Epoch)>,
    },
    #[error("partition {partition}: gave up after {attempts} races for new partition ids")]
    Contended {
        partition: PartitionId,
        attempts: u32,
    },
}

impl SplitError {
    /// The short machine-readable reason the decision log and the metrics
    /// carry for a refused split.
    pub fn reason(&self) -> &'static str {
        match self {
            SplitError::Meta(_) => "store_error",
            SplitError::UnknownPartition(_) => "gone",
            SplitError::Migrating { .. } => "migrating",
            SplitError::SingleSlot { .. } => "single_slot",
            SplitError::NotInside { .. } | SplitError::Unaligned { .. } => "bad_point",
            SplitError::NotHash { .. } => "bad_point",
            SplitError::NoSplitPoint { .. } => "no_split_key",
            SplitError::Lost { .. } | SplitError::Contended { .. } => "conflict",
        }
    }
}

pub(crate) fn fmt_current(current: &Option<(NodeId, Epoch)>) -> String {
    match current {
        Some((node, epoch)) => format!("owner {node} at epoch {epoch}"),
        None => "absent".to_string(),
    }
}

/// Settings of automatic splits (the `--split-*` flags).
#[derive(Clone, Debug, PartialEq)]
pub struct SplitConfig {
    /// Split automatically at all (`--no-auto-split` turns it off; manual
    /// `keyway ctl split` always works).
    pub enabled: bool,
    /// A partition holding more payload bytes than this splits at its
    /// `size_split_key`.
    pub split_max_bytes: u64,
    /// A partition above this many requests/s (reads + writes) in every
    /// snapshot for `split_load_window_ms` splits at its `load_split_key`.
    pub split_max_requests_per_sec: f64,
    /// How long a partition must stay above `split_max_requests_per_sec`.
    pub split_load_window_ms: u64,
    /// Above this share (0..=1) of the sampled requests on one key, a hot
    /// partition is not split (reason `single_key`).
    pub split_single_key_share: f64,
    /// A partition born by a split (or merge) is not split again for this long.
    pub split_cooldown_ms: u64,
}

impl Default for SplitConfig {
    fn default() -> Self {
        SplitConfig {
            enabled: true,
            split_max_bytes: 512 * 1024 * 1024,
            split_max_requests_per_sec: 5_000.0,
            split_load_window_ms: 30_000,
            split_single_key_share: 0.5,
            split_cooldown_ms: 60_000,
        }
    }
}

impl SplitConfig {
    /// Checks every field; the error names the bad one.
    pub fn validate(&self) -> Result<(), String> {
        if self.split_max_bytes == 0 {
            return Err("split_max_bytes must be positive".into());
        }
        let rps = self.split_max_requests_per_sec;
        if !(rps.is_finite() && rps > 0.0) {
            return Err("split_max_requests_per_sec must be a positive number".into());
        }
        if self.split_load_window_ms == 0 {
            return Err("split_load_window_ms must be positive".into());
        }
        let share = self.split_single_key_share;
        if !(share > 0.0 && share <= 1.0) {
            return Err("split_single_key_share must be in (0, 1]".into());
        }
        Ok(())
    }
}

/// The live migrations a decision must stay away from, by partition.
pub type Busy = std::collections::HashMap<PartitionId, (MigrationId, MigrationState)>;
