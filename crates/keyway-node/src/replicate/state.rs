//! The vocabulary of the in-sync rules (`rules.rs`): the events' and
//! commands' types, and a replica's state on its primary.

use keyway_map::{Epoch, NodeId, PartitionId};
use keyway_storage::Seq;
use std::time::Instant;

/// Identifies one waiting reply.
pub type WaiterId = u64;

/// Why the in-sync set changed (the metric label and the log's reason).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reason {
    LagTimeout,
    CaughtUp,
    PrimaryRestarted,
    /// The replica's stream lost its place in the change log (retention).
    StreamLost,
}

impl Reason {
    pub fn label(self) -> &'static str {
        match self {
            Reason::LagTimeout => "lag_timeout",
            Reason::CaughtUp => "caught_up",
            Reason::PrimaryRestarted => "primary_restarted",
            Reason::StreamLost => "stream_lost",
        }
    }
}

/// What a CAS changes in the partition's in-sync set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CasChange {
    Remove {
        replicas: Vec<NodeId>,
        reason: Reason,
    },
    Add {
        replica: NodeId,
    },
}

impl CasChange {
    pub fn reason(&self) -> Reason {
        match self {
            CasChange::Remove { reason, .. } => *reason,
            CasChange::Add { .. } => Reason::CaughtUp,
        }
    }
}

/// What the shell must do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Send the reply (`ok`), or answer "replication not confirmed".
    Release { waiter: WaiterId, ok: bool },
    /// Commit the partition's row with `change` applied at `epoch + 1`,
    /// conditional on (this node, `epoch`); report with
    /// `Rules::cas_result`.
    Cas {
        partition: PartitionId,
        epoch: Epoch,
        change: CasChange,
    },
    /// Clean and copy the partition to the replica; report with
    /// `Rules::copy_shipping`, `Rules::copy_done` or `Rules::copy_failed`.
    StartCopy {
        partition: PartitionId,
        replica: NodeId,
    },
}

/// A replica's state for one partition, on its primary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplicaState {
    /// Not shipped, not waited for; a copy starts at `retry_at`.
    Idle {
        retry_at: Instant,
    },
    /// The copy runs; the stream ships the partition once `shipped`
    /// (after the clean, before the first chunk is read).
    Copying {
        shipped: bool,
    },
    /// Copied; every new reply waits for it; in sync once acked ≥ `s0`.
    Joining {
        s0: Seq,
    },
    /// The CAS adding it is in flight (waited for, as joining).
    Adding,
    InSync,
    /// To be CASed out (`in_flight`: the CAS runs); still waited for.
    Removing {
        reason: Reason,
        in_flight: bool,
    },
    /// CASed out; still waited for until `until` (its read lease).
    Removed {
        until: Instant,
    },
}

impl ReplicaState {
    pub(crate) fn waited(&self, now: Instant) -> bool {
        match self {
            ReplicaState::Idle { .. } | ReplicaState::Copying { .. } => false,
            ReplicaState::Removed { until } => now < *until,
            _ => true,
        }
    }

    /// Whether the stream carries the partition's records to the replica.
    pub fn shipped(&self) -> bool {
        !matches!(
            self,
            ReplicaState::Idle { .. } | ReplicaState::Copying { shipped: false }
        )
    }

    /// The short name `/status` shows.
    pub fn label(&self) -> &'static str {
        match self {
            ReplicaState::Idle { .. } => "idle",
            ReplicaState::Copying { shipped: false } => "cleaning",
            ReplicaState::Copying { shipped: true } => "copying",
            ReplicaState::Joining { .. } => "joining",
            ReplicaState::Adding => "adding",
            ReplicaState::InSync => "in_sync",
            ReplicaState::Removing { .. } => "removing",
            ReplicaState::Removed { .. } => "removed",
        }
    }
}
