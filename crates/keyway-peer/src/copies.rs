//! The copies a node reports (`/status` `copies`, the `PartitionStats` RPC's
//! `copies`, which the manager polls): what a copy is for, how it ended, and
//! its cost. The node's accounting of them is `keyway_node::copies`.

use keyway_map::{NodeId, PartitionId};
use serde::{Deserialize, Serialize};

/// What a copy is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CopyKind {
    /// A single-owner migration's push.
    Migration,
    /// A replica catch-up.
    Replica,
}

impl CopyKind {
    pub fn label(self) -> &'static str {
        match self {
            CopyKind::Migration => "migration",
            CopyKind::Replica => "replica",
        }
    }

    pub fn from_label(s: &str) -> Option<CopyKind> {
        match s {
            "migration" => Some(CopyKind::Migration),
            "replica" => Some(CopyKind::Replica),
            _ => None,
        }
    }
}

/// How a copy ended (or that it did not yet).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CopyOutcome {
    Running,
    Done,
    Failed,
}

impl CopyOutcome {
    pub fn label(self) -> &'static str {
        match self {
            CopyOutcome::Running => "running",
            CopyOutcome::Done => "done",
            CopyOutcome::Failed => "failed",
        }
    }

    pub fn from_label(s: &str) -> Option<CopyOutcome> {
        match s {
            "running" => Some(CopyOutcome::Running),
            "done" => Some(CopyOutcome::Done),
            "failed" => Some(CopyOutcome::Failed),
            _ => None,
        }
    }
}

/// One copy as `/status` and the `PartitionStats` RPC report it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopyReport {
    pub partition: PartitionId,
    /// The receiving node (the migration's target, or the replica).
    pub peer: NodeId,
    pub kind: CopyKind,
    /// The migration's id (kind `migration`), 0 for a replica catch-up.
    pub migration: u64,
    pub bytes_sent: u64,
    pub bytes_written: u64,
    /// The partition's payload bytes by this node's last size scan (see the
    /// module docs); `None`: not sized yet.
    pub bytes_total_estimate: Option<u64>,
    /// Wall clock (unix ms) when the copy started.
    pub started_at_ms: u64,
    /// Wall clock when it ended; `None` while running.
    pub finished_at_ms: Option<u64>,
    /// Running: so far; finished: start to end.
    pub duration_ms: u64,
    pub outcome: CopyOutcome,
    /// Why a failed copy failed.
    pub error: Option<String>,
}
