//! The `RangeScan` peer call (`proto/peer.proto`): the answering side (one
//! [`scan_owned`] step for the asked partition at the asked epoch) and the
//! asking side's reading of the answer.
//!
//! Contract: `RangeScan(keyspace, partition, epoch, from, to, limit)` is
//! answered with entries only if the answering node owns `partition` at
//! exactly `epoch` and serves it now (lease, no fence, no incoming hold);
//! otherwise `refused` carries the reason and, for `STALE`, the partition
//! covering `from` as the answering node's map has it (id, epoch, range,
//! owner and the owner's addresses), so the asker can go there at once.

use super::owned::{StepError, SubmitRead, scan_owned_released};
use crate::peer::pb;
use crate::routing::{Rejection, Routing};
use bytes::Bytes;
use keyway_map::{Epoch, KeyspaceId, NodeId, PartitionId, PartitionRecord, PartitionState};
use std::sync::Arc;
use tonic::Status;

pub use keyway_command::kw::MAX_RANGE_SCAN_ENTRIES;

/// Answers one `RangeScan` request from this node's engine and routing view:
/// one step queued by `reads` on a storage thread (under the routing read
/// guard, its answer sent only after group commit, like a local read).
pub async fn serve_range_scan(
    routing: Arc<Routing>,
    reads: SubmitRead,
    req: pb::RangeScanRequest,
) -> Result<pb::RangeScanResponse, Status> {
    if req.limit == 0 {
        return Err(Status::invalid_argument("limit must be at least 1"));
    }
    let limit = req.limit.min(MAX_RANGE_SCAN_ENTRIES) as usize;
    let expected = Some((PartitionId(req.partition), Epoch(req.epoch)));
    let step = scan_owned_released(
        |task| reads(task),
        routing.clone(),
        KeyspaceId(req.keyspace),
        req.from,
        req.to,
        limit,
        expected,
    )
    .await
    .map_err(|frame| Status::unavailable(format!("range scan step: {frame:?}")))?;
    match step {
        Ok(page) => Ok(pb::RangeScanResponse {
            entries: page
                .entries
                .into_iter()
                .map(|(key, value)| pb::RangeScanEntry { key, value })
                .collect(),
            next: page.next,
            refused: None,
        }),
        Err(StepError::Refused(r)) => Ok(pb::RangeScanResponse {
            entries: Vec::new(),
            next: None,
            refused: Some(refusal_to_pb(&routing, &r)),
        }),
        Err(StepError::Storage(e)) => Err(crate::peer::server::status_from_storage(e)),
    }
}

fn refusal_to_pb(routing: &Routing, r: &Rejection) -> pb::RangeScanRefusal {
    use pb::range_scan_refusal::Reason;
    let map = routing.map();
    let mut out = pb::RangeScanRefusal {
        map_version: map.version.0,
        ..Default::default()
    };
    let reason = match r {
        Rejection::StaleEpoch {
            partition: p,
            owner_addr,
        } => {
            out.partition = p.id.0;
            out.epoch = p.epoch.0;
            out.start = p.start.clone();
            out.end = p.end.clone();
            out.owner = p.owner.0;
            out.owner_resp_addr = owner_addr.clone();
            out.owner_admin_addr = map
                .nodes
                .get(&p.owner)
                .map(|n| n.admin_addr.clone())
                .unwrap_or_default();
            Reason::Stale
        }
        Rejection::Fenced { .. } => Reason::Fenced,
        Rejection::LeaseLapsed => Reason::LeaseLapsed,
        Rejection::Unserved | Rejection::Moved { .. } => Reason::Unserved,
    };
    out.set_reason(reason);
    out
}

/// A partition and where its owner serves `Peer`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    pub record: PartitionRecord,
    /// The owner's admin address (its `Peer` service).
    pub admin_addr: String,
}

/// How the asking side reads a `RangeScan` answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScanReply {
    /// Entries (strictly increasing keys) and the inclusive resume key.
    Page {
        entries: Vec<(Bytes, Bytes)>,
        next: Option<Bytes>,
    },
    /// The owner in the answering node's map is elsewhere, or at another epoch.
    Stale(Route),
    /// Refused for now (fence, lease, unserved): retry later.
    NotNow(&'static str),
}

/// Reads a `RangeScan` answer about keyspace `ks`.
pub fn read_reply(ks: KeyspaceId, resp: pb::RangeScanResponse) -> ScanReply {
    use pb::range_scan_refusal::Reason;
    let Some(r) = resp.refused else {
        return ScanReply::Page {
            entries: resp.entries.into_iter().map(|e| (e.key, e.value)).collect(),
            next: resp.next,
        };
    };
    match r.reason() {
        Reason::Stale => ScanReply::Stale(Route {
            record: PartitionRecord {
                id: PartitionId(r.partition),
                keyspace: ks,
                start: r.start,
                end: r.end,
                owner: NodeId(r.owner),
                replicas: Vec::new(),
                in_sync: Vec::new(),
                reads_from: None,
                epoch: Epoch(r.epoch),
                state: PartitionState::Active,
            },
            admin_addr: r.owner_admin_addr,
        }),
        Reason::Fenced => ScanReply::NotNow("the partition is in a migration cutover"),
        Reason::LeaseLapsed => ScanReply::NotNow("the owner's lease lapsed"),
        Reason::Unserved | Reason::Unspecified => {
            ScanReply::NotNow("the owner does not serve the keyspace")
        }
    }
}

/// The request for one step of `route`'s partition.
pub fn request(
    route: &Route,
    from: Bytes,
    to: Option<Bytes>,
    limit: usize,
) -> pb::RangeScanRequest {
    pb::RangeScanRequest {
        keyspace: route.record.keyspace.0,
        partition: route.record.id.0,
        epoch: route.record.epoch.0,
        from,
        to,
        limit: u32::try_from(limit)
            .unwrap_or(MAX_RANGE_SCAN_ENTRIES)
            .min(MAX_RANGE_SCAN_ENTRIES),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_refusal_reads_back_as_a_route() {
        let resp = pb::RangeScanResponse {
            entries: vec![],
            next: None,
            refused: Some(pb::RangeScanRefusal {
                reason: pb::range_scan_refusal::Reason::Stale as i32,
                partition: 7,
                epoch: 3,
                start: Bytes::from_static(b"m"),
                end: None,
                owner: 2,
                owner_admin_addr: "127.0.0.1:8002".into(),
                owner_resp_addr: "127.0.0.1:7002".into(),
                map_version: 9,
            }),
        };
        match read_reply(KeyspaceId(1), resp) {
            ScanReply::Stale(route) => {
                assert_eq!(route.record.id, PartitionId(7));
                assert_eq!(route.record.epoch, Epoch(3));
                assert_eq!(route.record.owner, NodeId(2));
                assert_eq!(&route.record.start[..], b"m");
                assert_eq!(route.admin_addr, "127.0.0.1:8002");
            }
            other => panic!("{other:?}"),
        }
        let fenced = pb::RangeScanResponse {
            refused: Some(pb::RangeScanRefusal {
                reason: pb::range_scan_refusal::Reason::Fenced as i32,
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(matches!(
            read_reply(KeyspaceId(1), fenced),
            ScanReply::NotNow(_)
        ));
    }
}
