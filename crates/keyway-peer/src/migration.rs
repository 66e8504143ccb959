//! The migration a data-changing peer call acts for ([`MigrationRef`]), why
//! a node refuses one ([`RefusalReason`]), and their messages. A node's
//! checks of these calls are `keyway_node::migrate::receive`.

use crate::pb;
use keyway_map::{Epoch, PartitionId};

/// The migration a data-changing peer call acts for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MigrationRef {
    /// The migration record's id.
    pub id: u64,
    pub partition: PartitionId,
    /// e: the partition's epoch when the migration was created (the
    /// record's; the flip moves it to e+1 at the target).
    pub epoch: Epoch,
}

impl std::fmt::Display for MigrationRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "migration {} (partition {} at epoch {})",
            self.id, self.partition, self.epoch
        )
    }
}

/// Why a data-changing peer call was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefusalReason {
    /// No incoming migration of that id, partition and epoch is registered.
    NotReceiving,
    /// This node owns (part of) the range: its data is not a copy.
    Owned,
    /// This node receives (part of) the range under another migration.
    ReceivingOther,
    /// The partition moved past the epoch, or a newer migration of it is
    /// registered: the call is late.
    Stale,
    /// This node's map does not show the partition at that epoch yet: retry.
    MapBehind,
    /// A record's key lies outside the partition's range.
    OutOfRange,
}

impl RefusalReason {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            RefusalReason::NotReceiving => "not_receiving",
            RefusalReason::Owned => "owned",
            RefusalReason::ReceivingOther => "receiving_other",
            RefusalReason::Stale => "stale",
            RefusalReason::MapBehind => "map_behind",
            RefusalReason::OutOfRange => "out_of_range",
        }
    }
}

pub fn ref_from_pb(m: pb::MigrationRef) -> MigrationRef {
    MigrationRef {
        id: m.id,
        partition: PartitionId(m.partition),
        epoch: Epoch(m.epoch),
    }
}

pub fn ref_to_pb(m: &MigrationRef) -> pb::MigrationRef {
    pb::MigrationRef {
        id: m.id,
        partition: m.partition.0,
        epoch: m.epoch.0,
    }
}

pub fn reason_to_pb(r: RefusalReason) -> pb::peer_refusal::Reason {
    use pb::peer_refusal::Reason;
    match r {
        RefusalReason::NotReceiving => Reason::NotReceiving,
        RefusalReason::Owned => Reason::Owned,
        RefusalReason::ReceivingOther => Reason::ReceivingOther,
        RefusalReason::Stale => Reason::Stale,
        RefusalReason::MapBehind => Reason::MapBehind,
        RefusalReason::OutOfRange => Reason::OutOfRange,
    }
}

pub fn reason_from_pb(r: i32) -> Option<RefusalReason> {
    use pb::peer_refusal::Reason;
    Some(match Reason::try_from(r).ok()? {
        Reason::Unspecified => return None,
        Reason::NotReceiving => RefusalReason::NotReceiving,
        Reason::Owned => RefusalReason::Owned,
        Reason::ReceivingOther => RefusalReason::ReceivingOther,
        Reason::Stale => RefusalReason::Stale,
        Reason::MapBehind => RefusalReason::MapBehind,
        Reason::OutOfRange => RefusalReason::OutOfRange,
    })
}
