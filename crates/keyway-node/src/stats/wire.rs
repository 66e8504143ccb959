//! [`NodeReport`] to and from the `PartitionStats` Peer RPC's messages.

use super::{HotKeyReport, NodeReport, PartitionReport};
use crate::peer::pb;
use keyway_map::{Epoch, NodeId, PartitionId};

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
    }
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

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
        };
        assert_eq!(from_pb(to_pb(&r)), r);
    }
}
