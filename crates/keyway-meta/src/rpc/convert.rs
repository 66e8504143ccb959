//! Conversions between the crate's types and the protobuf messages, and the
//! exact mapping of [`MetaError`] to a gRPC status and back.
//!
//! A store error becomes a status with a fitting code, the error's display
//! text as message, and an encoded [`pb::ErrorDetail`] as details; the client
//! rebuilds the very same `MetaError` from the details. A status without
//! decodable details did not come from a store: it is a transport failure
//! and becomes [`MetaError::Unavailable`] (callers retry), except
//! `UNIMPLEMENTED` (a server that does not know the call), which is
//! [`MetaError::Internal`].

use super::pb;
use crate::{Leadership, LeaseId, LeaseInfo, MapTxn, MapUpdate, MetaError, StoredMigration};
use keyway_map::{
    Epoch, KeyspaceId, MapError, MapVersion, NodeId, OwnershipCondition, PartitionId,
    decode_changes, decode_map, encode_changes, encode_map,
};
use pb::error_detail::Kind;
use pb::map_error_detail::Kind as MapKind;
use prost::Message;
use tonic::{Code, Status};

/// The status a store error travels as.
pub(crate) fn status_from_error(err: &MetaError) -> Status {
    let (code, kind) = match err {
        MetaError::Unavailable(msg) => (Code::Unavailable, Kind::Unavailable(msg.clone())),
        MetaError::Conflict { partition, current } => (
            Code::FailedPrecondition,
            Kind::Conflict(pb::ConflictDetail {
                partition: partition.0,
                current: current.map(owner_to_pb),
            }),
        ),
        MetaError::InvalidMap(e) => (
            Code::FailedPrecondition,
            Kind::InvalidMap(map_error_to_pb(e)),
        ),
        MetaError::MigrationConflict { id, current } => (
            Code::FailedPrecondition,
            Kind::MigrationConflict(pb::MigrationConflictDetail {
                id: *id,
                current: *current,
            }),
        ),
        MetaError::LeaseNotFound(id) => (Code::NotFound, Kind::LeaseNotFound(id.0)),
        MetaError::InvalidArgument(msg) => {
            (Code::InvalidArgument, Kind::InvalidArgument(msg.clone()))
        }
        MetaError::Internal(msg) => (Code::Internal, Kind::Internal(msg.clone())),
        MetaError::Unauthenticated(msg) => (Code::Unauthenticated, Kind::Internal(msg.clone())),
    };
    let details = pb::ErrorDetail { kind: Some(kind) }.encode_to_vec();
    Status::with_details(code, err.to_string(), details.into())
}

/// The store error a status stands for.
pub(crate) fn error_from_status(status: &Status) -> MetaError {
    let detail = (!status.details().is_empty())
        .then(|| pb::ErrorDetail::decode(status.details()).ok())
        .flatten()
        .and_then(|d| d.kind);
    match detail {
        Some(Kind::Unavailable(msg)) => MetaError::Unavailable(msg),
        Some(Kind::Conflict(c)) => MetaError::Conflict {
            partition: PartitionId(c.partition),
            current: c.current.map(owner_from_pb),
        },
        Some(Kind::InvalidMap(e)) => match map_error_from_pb(e) {
            Some(e) => MetaError::InvalidMap(e),
            None => MetaError::Internal(format!("undecodable map error: {}", status.message())),
        },
        Some(Kind::MigrationConflict(c)) => MetaError::MigrationConflict {
            id: c.id,
            current: c.current,
        },
        Some(Kind::LeaseNotFound(id)) => MetaError::LeaseNotFound(LeaseId(id)),
        Some(Kind::InvalidArgument(msg)) => MetaError::InvalidArgument(msg),
        Some(Kind::Internal(msg)) => MetaError::Internal(msg),
        None if status.code() == Code::Unimplemented => MetaError::Internal(format!(
            "metadata server does not implement the call: {}",
            status.message()
        )),
        None => MetaError::Unavailable(format!("{:?}: {}", status.code(), status.message())),
    }
}

fn owner_to_pb((node, epoch): (NodeId, Epoch)) -> pb::Owner {
    pb::Owner {
        node: node.0,
        epoch: epoch.0,
    }
}

fn owner_from_pb(o: pb::Owner) -> (NodeId, Epoch) {
    (NodeId(o.node), Epoch(o.epoch))
}

fn map_error_to_pb(e: &MapError) -> pb::MapErrorDetail {
    let kp = |keyspace: &KeyspaceId, partition: &PartitionId| pb::KeyspacePartition {
        keyspace: keyspace.0,
        partition: partition.0,
    };
    let kind = match e {
        MapError::KeyspaceUncovered(k) => MapKind::KeyspaceUncovered(k.0),
        MapError::CoverageBroken {
            keyspace,
            partition,
        } => MapKind::CoverageBroken(kp(keyspace, partition)),
        MapError::EmptyRange {
            keyspace,
            partition,
        } => MapKind::EmptyRange(kp(keyspace, partition)),
        MapError::UnalignedBoundary {
            keyspace,
            partition,
        } => MapKind::UnalignedBoundary(kp(keyspace, partition)),
        MapError::UnknownKeyspace(p) => MapKind::UnknownKeyspace(p.0),
        MapError::UnknownOwner { partition, node } => MapKind::UnknownOwner(pb::PartitionNode {
            partition: partition.0,
            node: node.0,
        }),
        MapError::NoSuchPartition(p) => MapKind::NoSuchPartition(p.0),
        MapError::VersionNotIncreasing { have, got } => {
            MapKind::VersionNotIncreasing(pb::HaveGot {
                have: *have,
                got: *got,
            })
        }
        MapError::EpochNotIncreasing {
            partition,
            have,
            got,
        } => MapKind::EpochNotIncreasing(pb::PartitionHaveGot {
            partition: partition.0,
            have: *have,
            got: *got,
        }),
        MapError::Decode(what) => MapKind::Decode(what.to_string()),
        MapError::BadReplicas { partition, why } => MapKind::BadReplicas(pb::PartitionWhy {
            partition: partition.0,
            why: why.to_string(),
        }),
        MapError::BadReplication { keyspace, why } => MapKind::BadReplication(pb::KeyspaceWhy {
            keyspace: keyspace.0,
            why: why.clone(),
        }),
    };
    pb::MapErrorDetail { kind: Some(kind) }
}

fn map_error_from_pb(e: pb::MapErrorDetail) -> Option<MapError> {
    let kp = |k: pb::KeyspacePartition| (KeyspaceId(k.keyspace), PartitionId(k.partition));
    Some(match e.kind? {
        MapKind::KeyspaceUncovered(k) => MapError::KeyspaceUncovered(KeyspaceId(k)),
        MapKind::CoverageBroken(k) => {
            let (keyspace, partition) = kp(k);
            MapError::CoverageBroken {
                keyspace,
                partition,
            }
        }
        MapKind::EmptyRange(k) => {
            let (keyspace, partition) = kp(k);
            MapError::EmptyRange {
                keyspace,
                partition,
            }
        }
        MapKind::UnalignedBoundary(k) => {
            let (keyspace, partition) = kp(k);
            MapError::UnalignedBoundary {
                keyspace,
                partition,
            }
        }
        MapKind::UnknownKeyspace(p) => MapError::UnknownKeyspace(PartitionId(p)),
        MapKind::UnknownOwner(pn) => MapError::UnknownOwner {
            partition: PartitionId(pn.partition),
            node: NodeId(pn.node),
        },
        MapKind::NoSuchPartition(p) => MapError::NoSuchPartition(PartitionId(p)),
        MapKind::VersionNotIncreasing(hg) => MapError::VersionNotIncreasing {
            have: hg.have,
            got: hg.got,
        },
        MapKind::EpochNotIncreasing(phg) => MapError::EpochNotIncreasing {
            partition: PartitionId(phg.partition),
            have: phg.have,
            got: phg.got,
        },
        MapKind::Decode(what) => MapError::Decode(decode_reason(&what)),
        MapKind::BadReplicas(w) => MapError::BadReplicas {
            partition: PartitionId(w.partition),
            why: replicas_reason(&w.why),
        },
        MapKind::BadReplication(w) => MapError::BadReplication {
            keyspace: KeyspaceId(w.keyspace),
            why: w.why,
        },
    })
}

/// `MapError::BadReplicas` carries a `&'static str`, as `Decode` does.
fn replicas_reason(what: &str) -> &'static str {
    const KNOWN: &[&str] = &[
        "the owner is listed as its own replica",
        "a replica is listed twice",
        "an in-sync node is not a replica",
        "an in-sync node is listed twice",
    ];
    KNOWN
        .iter()
        .find(|k| **k == what)
        .copied()
        .unwrap_or("replicas invalid (reason not known to this client)")
}

/// `MapError::Decode` carries a `&'static str`: map the text back onto the
/// reasons `keyway-map`'s codec uses, so the round trip is exact for them.
fn decode_reason(what: &str) -> &'static str {
    const KNOWN: &[&str] = &[
        "truncated",
        "bad magic",
        "varint too long",
        "u32 out of range",
        "length",
        "truncated bytes",
        "utf-8",
        "count exceeds input",
        "trailing bytes",
        "routing tag",
        "node state tag",
        "end tag",
        "partition state tag",
        "unknown change tag",
    ];
    KNOWN
        .iter()
        .find(|k| **k == what)
        .copied()
        .unwrap_or("undecodable (reason not known to this client)")
}

/// A request field that does not decode is the caller's fault.
fn bad_request(field: &str, e: MapError) -> MetaError {
    MetaError::InvalidArgument(format!("{field}: {e}"))
}

pub(crate) fn update_to_pb(u: &MapUpdate) -> pb::MapUpdate {
    let update = match u {
        MapUpdate::Delta(entries) => pb::map_update::Update::Delta(pb::Delta {
            entries: entries
                .iter()
                .map(|(v, changes)| pb::VersionedChanges {
                    version: v.0,
                    changes: encode_changes(changes),
                })
                .collect(),
        }),
        MapUpdate::Full(map) => pb::map_update::Update::Full(encode_map(map)),
    };
    pb::MapUpdate {
        update: Some(update),
    }
}

/// Decodes an update a server sent; a map is validated on arrival.
pub(crate) fn update_from_pb(u: pb::MapUpdate) -> Result<MapUpdate, MetaError> {
    let corrupt =
        |e: MapError| MetaError::Internal(format!("server sent an undecodable update: {e}"));
    match u.update {
        Some(pb::map_update::Update::Delta(d)) => d
            .entries
            .into_iter()
            .map(|e| {
                Ok((
                    MapVersion(e.version),
                    decode_changes(&e.changes).map_err(corrupt)?,
                ))
            })
            .collect::<Result<_, _>>()
            .map(MapUpdate::Delta),
        Some(pb::map_update::Update::Full(bytes)) => map_from_bytes(&bytes).map(MapUpdate::Full),
        None => Err(MetaError::Internal("server sent an empty update".into())),
    }
}

/// Decodes and validates a map a server sent.
pub(crate) fn map_from_bytes(bytes: &[u8]) -> Result<keyway_map::PartitionMap, MetaError> {
    let map = decode_map(bytes)
        .map_err(|e| MetaError::Internal(format!("server sent an undecodable map: {e}")))?;
    map.validate()
        .map_err(|e| MetaError::Internal(format!("server sent an invalid map: {e}")))?;
    Ok(map)
}

pub(crate) fn txn_to_pb(txn: &MapTxn) -> pb::CommitRequest {
    pb::CommitRequest {
        conditions: txn
            .conditions
            .iter()
            .map(|c| pb::Condition {
                partition: c.partition.0,
                expected: c.expected.map(owner_to_pb),
            })
            .collect(),
        changes: encode_changes(&txn.changes),
    }
}

pub(crate) fn txn_from_pb(req: pb::CommitRequest) -> Result<MapTxn, MetaError> {
    Ok(MapTxn {
        conditions: req
            .conditions
            .into_iter()
            .map(|c| OwnershipCondition {
                partition: PartitionId(c.partition),
                expected: c.expected.map(owner_from_pb),
            })
            .collect(),
        changes: decode_changes(&req.changes).map_err(|e| bad_request("changes", e))?,
    })
}

pub(crate) fn leadership_to_pb(l: &Leadership) -> pb::Leadership {
    pb::Leadership {
        election: l.election.clone(),
        candidate: l.candidate.clone(),
        lease: l.lease.0,
        token: l.token.clone(),
    }
}

pub(crate) fn leadership_from_pb(l: pb::Leadership) -> Leadership {
    Leadership {
        election: l.election,
        candidate: l.candidate,
        lease: LeaseId(l.lease),
        token: l.token,
    }
}

pub(crate) fn lease_to_pb(l: &LeaseInfo) -> pb::LeaseInfo {
    pb::LeaseInfo {
        lease: l.lease.0,
        node: l.node.0,
        remaining_ms: l.remaining_ms,
    }
}

pub(crate) fn lease_from_pb(l: pb::LeaseInfo) -> LeaseInfo {
    LeaseInfo {
        lease: LeaseId(l.lease),
        node: NodeId(l.node),
        remaining_ms: l.remaining_ms,
    }
}

pub(crate) fn migration_to_pb(m: &StoredMigration) -> pb::StoredMigration {
    pb::StoredMigration {
        id: m.id,
        generation: m.generation,
        record: m.record.clone(),
    }
}

pub(crate) fn migration_from_pb(m: pb::StoredMigration) -> StoredMigration {
    StoredMigration {
        id: m.id,
        generation: m.generation,
        record: m.record,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyway_map::{MapChange, PartitionMap};

    fn round_trip(err: MetaError) {
        let status = status_from_error(&err);
        // Through the bytes a real transport would carry.
        let wire = Status::with_details(
            status.code(),
            status.message().to_string(),
            status.details().to_vec().into(),
        );
        assert_eq!(error_from_status(&wire), err, "status {status:?}");
    }

    #[test]
    fn every_meta_error_round_trips_exactly() {
        round_trip(MetaError::Unavailable("gone".into()));
        round_trip(MetaError::Conflict {
            partition: PartitionId(7),
            current: Some((NodeId(3), Epoch(9))),
        });
        round_trip(MetaError::Conflict {
            partition: PartitionId(8),
            current: None,
        });
        round_trip(MetaError::LeaseNotFound(LeaseId(42)));
        round_trip(MetaError::MigrationConflict {
            id: 3,
            current: Some(17),
        });
        round_trip(MetaError::MigrationConflict {
            id: 4,
            current: None,
        });
        round_trip(MetaError::MigrationConflict {
            id: 5,
            current: Some(0),
        });
        round_trip(MetaError::InvalidArgument("bad".into()));
        round_trip(MetaError::Internal("broken".into()));
        let ks = KeyspaceId(2);
        let p = PartitionId(5);
        for e in [
            MapError::KeyspaceUncovered(ks),
            MapError::CoverageBroken {
                keyspace: ks,
                partition: p,
            },
            MapError::EmptyRange {
                keyspace: ks,
                partition: p,
            },
            MapError::UnalignedBoundary {
                keyspace: ks,
                partition: p,
            },
            MapError::UnknownKeyspace(p),
            MapError::UnknownOwner {
                partition: p,
                node: NodeId(11),
            },
            MapError::NoSuchPartition(p),
            MapError::VersionNotIncreasing { have: 4, got: 3 },
            MapError::EpochNotIncreasing {
                partition: p,
                have: 6,
                got: 2,
            },
            MapError::Decode("trailing bytes"),
        ] {
            round_trip(MetaError::InvalidMap(e));
        }
    }

    #[test]
    fn codes_are_the_fitting_ones() {
        let code = |e: MetaError| status_from_error(&e).code();
        assert_eq!(
            code(MetaError::Unavailable(String::new())),
            Code::Unavailable
        );
        assert_eq!(code(MetaError::LeaseNotFound(LeaseId(1))), Code::NotFound);
        assert_eq!(
            code(MetaError::InvalidArgument(String::new())),
            Code::InvalidArgument
        );
        assert_eq!(
            code(MetaError::Conflict {
                partition: PartitionId(1),
                current: None
            }),
            Code::FailedPrecondition
        );
        assert_eq!(
            code(MetaError::MigrationConflict {
                id: 1,
                current: None
            }),
            Code::FailedPrecondition
        );
    }

    #[test]
    fn migrations_round_trip() {
        let m = StoredMigration {
            id: 9,
            generation: 4,
            record: vec![0, 1, 255],
        };
        assert_eq!(migration_from_pb(migration_to_pb(&m)), m);
    }

    #[test]
    fn statuses_without_details_are_transport_failures() {
        for code in [
            Code::Unavailable,
            Code::DeadlineExceeded,
            Code::Unknown,
            Code::Internal,
        ] {
            let e = error_from_status(&Status::new(code, "h2 protocol error"));
            assert!(matches!(e, MetaError::Unavailable(_)), "{code:?} -> {e:?}");
        }
        assert!(matches!(
            error_from_status(&Status::unimplemented("no such method")),
            MetaError::Internal(_)
        ));
    }

    #[test]
    fn updates_and_txns_round_trip() {
        let change = MapChange::ReservePartitionIds {
            next: PartitionId(10),
        };
        let delta = MapUpdate::Delta(vec![
            (MapVersion(3), vec![change.clone()]),
            (MapVersion(4), vec![]),
        ]);
        assert_eq!(update_from_pb(update_to_pb(&delta)).unwrap(), delta);
        let full = MapUpdate::Full(PartitionMap::new());
        assert_eq!(update_from_pb(update_to_pb(&full)).unwrap(), full);
        let txn = MapTxn {
            conditions: vec![
                OwnershipCondition {
                    partition: PartitionId(1),
                    expected: Some((NodeId(2), Epoch(3))),
                },
                OwnershipCondition {
                    partition: PartitionId(4),
                    expected: None,
                },
            ],
            changes: vec![change],
        };
        assert_eq!(txn_from_pb(txn_to_pb(&txn)).unwrap(), txn);
        let bad = pb::CommitRequest {
            conditions: vec![],
            changes: vec![1, 2, 3],
        };
        assert!(matches!(
            txn_from_pb(bad),
            Err(MetaError::InvalidArgument(_))
        ));
    }
}
