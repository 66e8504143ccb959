//! A node's per-partition load statistics as the `PartitionStats` Peer RPC
//! carries them ([`NodeReport`]), and their conversion to and from its
//! messages. The node computes them (`keyway_node::stats`); the manager
//! polls them.

use crate::copies::{CopyKind, CopyOutcome, CopyReport};
use crate::pb;
use bytes::Bytes;
use keyway_map::{Epoch, NodeId, PartitionId};

/// One sampled key and its estimated rate.
#[derive(Clone, Debug, PartialEq)]
pub struct HotKeyReport {
    /// The user key.
    pub key: Bytes,
    /// Estimated requests per second: its share of the samples times the
    /// partition's request rate.
    pub per_sec: f64,
}

/// One owned partition's statistics (the fields of the manager's
/// `PartitionLoad`, plus whether the size is known yet).
#[derive(Clone, Debug, PartialEq)]
pub struct PartitionReport {
    pub partition: PartitionId,
    pub epoch: Epoch,
    /// False until the first size scan of the partition's current range
    /// (`keys`, `bytes` and `size_split_key` are then 0, 0, `None`).
    pub size_known: bool,
    pub keys: u64,
    pub bytes: u64,
    pub reads_per_sec: f64,
    pub writes_per_sec: f64,
    pub load_split_key: Option<Bytes>,
    pub size_split_key: Option<Bytes>,
    /// Busiest first, at most `hot_keys_k`.
    pub hot_keys: Vec<HotKeyReport>,
    /// Share (0..=1) of the sampled requests that went to the busiest key.
    pub top_key_share: f64,
    /// Sampled requests behind these figures (weighted over the window).
    pub samples: f64,
}

impl PartitionReport {
    pub fn requests_per_sec(&self) -> f64 {
        self.reads_per_sec + self.writes_per_sec
    }
}

/// Every partition this node owns in its installed map.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeReport {
    pub node: NodeId,
    pub map_version: u64,
    pub window_ms: u64,
    pub partitions: Vec<PartitionReport>,
    /// The copies this node sends (running, then the last finished), as
    /// the node's `Copies::list` has them (filled in by the RPC).
    pub copies: Vec<CopyReport>,
}

pub fn to_pb(r: &NodeReport) -> pb::PartitionStatsResponse {
    pb::PartitionStatsResponse {
        node: r.node.0,
        map_version: r.map_version,
        window_ms: r.window_ms,
        partitions: r
            .partitions
            .iter()
            .map(|p| pb::PartitionStatsEntry {
                partition: p.partition.0,
                epoch: p.epoch.0,
                size_known: p.size_known,
                keys: p.keys,
                bytes: p.bytes,
                reads_per_sec: p.reads_per_sec,
                writes_per_sec: p.writes_per_sec,
                load_split_key: p.load_split_key.clone(),
                size_split_key: p.size_split_key.clone(),
                hot_keys: p
                    .hot_keys
                    .iter()
                    .map(|h| pb::PartitionStatsHotKey {
                        key: h.key.clone(),
                        per_sec: h.per_sec,
                    })
                    .collect(),
                top_key_share: p.top_key_share,
                samples: p.samples,
            })
            .collect(),
        copies: r.copies.iter().map(copy_to_pb).collect(),
    }
}

fn copy_to_pb(c: &CopyReport) -> pb::CopyEntry {
    pb::CopyEntry {
        partition: c.partition.0,
        peer: c.peer.0,
        kind: c.kind.label().to_string(),
        migration: c.migration,
        bytes_sent: c.bytes_sent,
        bytes_written: c.bytes_written,
        bytes_total_estimate: c.bytes_total_estimate,
        started_at_ms: c.started_at_ms,
        finished_at_ms: c.finished_at_ms,
        duration_ms: c.duration_ms,
        outcome: c.outcome.label().to_string(),
        error: c.error.clone(),
    }
}

/// An entry of an unknown kind or outcome (a newer node) is left out.
fn copy_from_pb(c: pb::CopyEntry) -> Option<CopyReport> {
    Some(CopyReport {
        partition: PartitionId(c.partition),
        peer: NodeId(c.peer),
        kind: CopyKind::from_label(&c.kind)?,
        migration: c.migration,
        bytes_sent: c.bytes_sent,
        bytes_written: c.bytes_written,
        bytes_total_estimate: c.bytes_total_estimate,
        started_at_ms: c.started_at_ms,
        finished_at_ms: c.finished_at_ms,
        duration_ms: c.duration_ms,
        outcome: CopyOutcome::from_label(&c.outcome)?,
        error: c.error,
    })
}

pub fn from_pb(r: pb::PartitionStatsResponse) -> NodeReport {
    NodeReport {
        node: NodeId(r.node),
        map_version: r.map_version,
        window_ms: r.window_ms,
        partitions: r
            .partitions
            .into_iter()
            .map(|p| PartitionReport {
                partition: PartitionId(p.partition),
                epoch: Epoch(p.epoch),
                size_known: p.size_known,
                keys: p.keys,
                bytes: p.bytes,
                reads_per_sec: p.reads_per_sec,
                writes_per_sec: p.writes_per_sec,
                load_split_key: p.load_split_key,
                size_split_key: p.size_split_key,
                hot_keys: p
                    .hot_keys
                    .into_iter()
                    .map(|h| HotKeyReport {
                        key: h.key,
                        per_sec: h.per_sec,
                    })
                    .collect(),
                top_key_share: p.top_key_share,
                samples: p.samples,
            })
            .collect(),
        copies: r.copies.into_iter().filter_map(copy_from_pb).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_survives_the_wire() {
        let r = NodeReport {
            node: NodeId(3),
            map_version: 9,
            window_ms: 10_000,
            partitions: vec![PartitionReport {
                partition: PartitionId(4),
                epoch: Epoch(2),
                size_known: true,
                keys: 10,
                bytes: 1_000,
                reads_per_sec: 1.5,
                writes_per_sec: 2.5,
                load_split_key: Some(Bytes::from_static(&[0, 7])),
                size_split_key: None,
                hot_keys: vec![HotKeyReport {
                    key: Bytes::from_static(b"k"),
                    per_sec: 3.0,
                }],
                top_key_share: 0.75,
                samples: 40.0,
            }],
            copies: vec![
                CopyReport {
                    partition: PartitionId(4),
                    peer: NodeId(2),
                    kind: CopyKind::Replica,
                    migration: 0,
                    bytes_sent: 500,
                    bytes_written: 480,
                    bytes_total_estimate: Some(1_000),
                    started_at_ms: 1_700_000_000_000,
                    finished_at_ms: None,
                    duration_ms: 40,
                    outcome: CopyOutcome::Running,
                    error: None,
                },
                CopyReport {
                    partition: PartitionId(5),
                    peer: NodeId(1),
                    kind: CopyKind::Migration,
                    migration: 12,
                    bytes_sent: 9,
                    bytes_written: 9,
                    bytes_total_estimate: None,
                    started_at_ms: 1,
                    finished_at_ms: Some(5),
                    duration_ms: 4,
                    outcome: CopyOutcome::Failed,
                    error: Some("stopped".into()),
                },
            ],
        };
        assert_eq!(from_pb(to_pb(&r)), r);
    }
}
