//! The era of an old primary kept in sync by a switchover: when the rules
//! (`rules.rs`) treat a first sight as a switchover, and how the stream
//! ships to the old primary then (`stream.rs`).
//!
//! **Switchover** (the one exception to the restart rule of `rules.rs`): a partition
//! first seen owned at epoch e + 1 that the previously installed map had
//! at epoch e, owned by P with this node in its in-sync set, and whose
//! in-sync set now contains P, was switched over to this node by P
//! (`switchover.rs`; nobody else writes that shape: a failover and a
//! migration's flip empty the in-sync set). P stays `InSync`
//! with no CAS and no copy, in an [`Era`]. Why P holds every
//! acknowledged write then: P fenced the partition, so every write it
//! admitted has a seq ≤ its last seq h at the fence, and it CASed only
//! once this node's stream had acknowledged ≥ h, i.e. this node applied
//! every record of the partition P ever shipped; this node's copy came
//! only from P (a catch-up cleans first), so P and this node hold the
//! same data, and every acknowledged write. Any other replica that was in
//! sync may lack writes only this node acknowledged (its stream lagged
//! P's), so the CAS drops it and it is copied again — unless P saw its
//! stream acknowledge P's last seq at the fence: then it holds exactly
//! what P and this node hold, and it stays in sync in the same era. What P lacks are
//! only this node's own writes at e + 1, all with seqs > the era's
//! `floor` (the last seq here after the last call from P that listed the
//! partition was applied, under the routing guard of a map where this
//! node did not own it yet); the records at or below the floor are P's
//! own writes' effects and are never shipped back. A write queued before
//! these rules saw the map waits for P (the admission map's in-sync set)
//! until the era's `covered` reaches its seq: the stream rewinds to
//! `covered` until a batch that listed the partition and started at or
//! below it was acknowledged, since a batch read before the era existed
//! filtered the partition out. P's versions of the partition's keys are
//! P's seqs (or an older primary's), not comparable with this node's, so
//! the era's records travel *stamped*: `(e + 1) << ERA_SEQ_BITS | seq`,
//! above every plain seq and every earlier era's stamp, ordered by seq
//! within the era. A split child inherits its parent's era; a merge of
//! parents with different eras is not inherited (restart rule). The era
//! ends when P is copied again (the copy cleans, so plain seqs are right
//! again) or removed.
//!
//! With in-sync sets that survive an owner change, the rules must not
//! carry state across an ownership they did not see end: if the driver
//! saw this node own the partition, then (skipping the maps in between) own
//! it again after another node owned it and streamed it here, the stream
//! positions and eras it knows are void. `Row::replica_applied` (this
//! node's `ReplicaSide::applied_seq`, which moves only while another node
//! streams the partition here) tells: when it changed, the partition is
//! forgotten and first sight applies (the restart rule).

use super::rules::Row;
use keyway_map::{Epoch, NodeId};
use keyway_storage::Seq;

/// Bits of a stamped version below the era's epoch (see [`Era`]).
pub const ERA_SEQ_BITS: u32 = 44;
/// Seqs from here on cannot be stamped: a switchover at such a seq falls
/// back to the restart rule, and a stream that would stamp one is lost.
pub const ERA_SEQ_LIMIT: Seq = 1 << ERA_SEQ_BITS;
/// Epochs from here on cannot be stamped (the stamp stays below 2^63).
pub const ERA_EPOCH_LIMIT: u64 = 1 << (63 - ERA_SEQ_BITS);

/// An old primary kept in sync by a switchover (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Era {
    /// The epoch at which this node became owner: the stamp's high bits.
    pub epoch: Epoch,
    /// Records of the partition at or below it are the old primary's own
    /// writes' effects: never shipped.
    pub floor: Seq,
    /// The replica holds the partition's records up to here.
    pub covered: Seq,
}

impl Era {
    /// The version a record at `seq` travels with, if it can be stamped.
    pub fn stamp(&self, seq: Seq) -> Option<Seq> {
        (seq < ERA_SEQ_LIMIT && self.epoch.0 > 0 && self.epoch.0 < ERA_EPOCH_LIMIT)
            .then_some((self.epoch.0 << ERA_SEQ_BITS) | seq)
    }
}

/// A partition as the previously installed map had it, while another node
/// owned it (the shell fills it in; the rules decide what it means).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prior {
    pub owner: NodeId,
    pub epoch: Epoch,
    /// This node was in its in-sync set.
    pub in_sync_here: bool,
    /// This node's last seq after the last call from the owner listing the
    /// partition was applied (`ReplicaSide::applied_seq`), if any.
    pub floor: Option<Seq>,
}

impl Row {
    /// The era of a switchover to this node, if this row is one (see the
    /// module docs): first sight, owner at prior epoch + 1, in sync here
    /// before, the old owner in the in-sync set now, stampable. Every
    /// member of the in-sync set is kept in it (the old owner checked that
    /// each holds every record up to its last seq at the fence).
    pub(super) fn switchover_era(&self) -> Option<(NodeId, Era)> {
        let pr = self.prior?;
        let era = Era {
            epoch: self.epoch,
            floor: pr.floor?,
            covered: pr.floor?,
        };
        (pr.in_sync_here
            && self.epoch.0 == pr.epoch.0 + 1
            && self.in_sync.contains(&pr.owner)
            && self.replicas.contains(&pr.owner)
            && era.stamp(era.floor).is_some())
        .then_some((pr.owner, era))
    }
}
