//! Property tests: maps built by bootstrap, splits, merges and moves always
//! cover each keyspace exactly once; lookup agrees with a linear scan; the
//! encoding round-trips and never panics on garbage.

use bytes::Bytes;
use keyway_map::*;
use proptest::prelude::*;

fn nodes(n: u64) -> Vec<NodeInfo> {
    (1..=n)
        .map(|i| NodeInfo {
            id: NodeId(i),
            resp_addr: format!("127.0.0.1:{}", 7000 + i),
            admin_addr: format!("127.0.0.1:{}", 8000 + i),
            state: NodeState::Up,
            weight: keyway_map::DEFAULT_NODE_WEIGHT,
            draining: false,
            zone: None,
            replica_addr: None,
        })
        .collect()
}

/// Splits the partition containing `slot` at `slot` (a metadata-only split).
fn split_at_slot(map: &mut PartitionMap, slot: u16) {
    let p = map.locate_slot(DEFAULT_KEYSPACE, slot).unwrap().clone();
    let at = Bytes::copy_from_slice(&slot_bound(slot));
    if p.start == at {
        return;
    }
    let next = map.next_partition_id;
    let left = PartitionRecord {
        end: Some(at.clone()),
        epoch: Epoch(p.epoch.0 + 1),
        ..p.clone()
    };
    let right = PartitionRecord {
        id: next,
        start: at,
        epoch: Epoch(p.epoch.0 + 1),
        ..p
    };
    let v = MapVersion(map.version.0 + 1);
    map.apply(
        v,
        &[
            MapChange::UpsertPartition(left),
            MapChange::UpsertPartition(right),
        ],
    )
    .unwrap();
}

fn linear_locate(map: &PartitionMap, slot: u16) -> Option<PartitionId> {
    let key = slot_bound(slot);
    map.partitions
        .values()
        .find(|p| p.contains(&key))
        .map(|p| p.id)
}

proptest! {
    #[test]
    fn bootstrap_covers_every_slot_exactly_once(n in 1u64..12, per_node in 1u16..64) {
        let map = PartitionMap::bootstrap(&nodes(n), per_node).unwrap();
        map.validate().unwrap();
        let mut counts = vec![0u32; SLOT_COUNT as usize];
        for p in map.partitions.values() {
            let (first, last) = p.slot_span();
            for s in first..=last { counts[s as usize] += 1; }
        }
        prop_assert!(counts.iter().all(|&c| c == 1));
        prop_assert_eq!(map.partitions.len() as u64, n * per_node as u64);
        for node in 1..=n {
            prop_assert_eq!(map.owned_by(NodeId(node)).count(), per_node as usize);
        }
    }

    #[test]
    fn splits_keep_coverage_and_lookup_agrees(splits in proptest::collection::vec(1u16..SLOT_COUNT, 0..40), probes in proptest::collection::vec(0u16..SLOT_COUNT, 50)) {
        let mut map = PartitionMap::bootstrap(&nodes(3), 2).unwrap();
        for s in splits { split_at_slot(&mut map, s); }
        map.validate().unwrap();
        for s in probes {
            prop_assert_eq!(map.locate_slot(DEFAULT_KEYSPACE, s).map(|p| p.id), linear_locate(&map, s));
        }
        let decoded = decode_map(&encode_map(&map)).unwrap();
        prop_assert_eq!(&decoded, &map);
    }

    #[test]
    fn decoding_garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode_map(&bytes);
        let _ = decode_changes(&bytes);
    }

    #[test]
    fn changes_round_trip(n in 1u64..5) {
        let map = PartitionMap::bootstrap(&nodes(n), 3).unwrap();
        let changes: Vec<MapChange> = map.partitions.values().cloned().map(MapChange::UpsertPartition)
            .chain(map.nodes.values().cloned().map(MapChange::UpsertNode))
            .chain([MapChange::RemovePartition { id: PartitionId(3) }, MapChange::RemoveNode { id: NodeId(9) }, MapChange::ReservePartitionIds { next: PartitionId(99) }])
            .collect();
        prop_assert_eq!(decode_changes(&encode_changes(&changes)).unwrap(), changes);
    }
}

#[test]
fn validation_catches_gaps_overlaps_and_unknown_owners() {
    let good = PartitionMap::bootstrap(&nodes(3), 2).unwrap();
    let mut gap = good.clone();
    let id = *gap.partitions.keys().nth(2).unwrap();
    gap.partitions.get_mut(&id).unwrap().start = Bytes::copy_from_slice(&slot_bound(9000));
    gap.reindex();
    assert!(matches!(
        gap.validate(),
        Err(MapError::CoverageBroken { .. })
    ));

    let mut overlap = good.clone();
    let first = *overlap.partitions.keys().next().unwrap();
    overlap.partitions.get_mut(&first).unwrap().end =
        Some(Bytes::copy_from_slice(&slot_bound(9000)));
    assert!(overlap.validate().is_err());

    let mut orphan = good.clone();
    orphan.partitions.get_mut(&first).unwrap().owner = NodeId(77);
    assert!(matches!(
        orphan.validate(),
        Err(MapError::UnknownOwner { .. })
    ));

    let mut unaligned = good.clone();
    unaligned.partitions.get_mut(&first).unwrap().end =
        Some(Bytes::from_static(&[0x01, 0x00, 0x05]));
    assert!(unaligned.validate().is_err());
}

#[test]
fn apply_refuses_lower_epochs_and_stale_versions() {
    let mut map = PartitionMap::bootstrap(&nodes(2), 1).unwrap();
    let mut p = map.partitions.values().next().unwrap().clone();
    p.epoch = Epoch(0);
    assert!(matches!(
        map.apply(MapVersion(2), &[MapChange::UpsertPartition(p.clone())]),
        Err(MapError::EpochNotIncreasing { .. })
    ));
    p.epoch = Epoch(2);
    assert!(matches!(
        map.apply(MapVersion(1), &[MapChange::UpsertPartition(p.clone())]),
        Err(MapError::VersionNotIncreasing { .. })
    ));
    map.apply(MapVersion(2), &[MapChange::UpsertPartition(p)])
        .unwrap();
    let cond = OwnershipCondition {
        partition: PartitionId(1),
        expected: Some((NodeId(1), Epoch(2))),
    };
    assert!(cond.holds(&map));
    let stale = OwnershipCondition {
        partition: PartitionId(1),
        expected: Some((NodeId(1), Epoch(1))),
    };
    assert!(!stale.holds(&map));
}

#[test]
fn range_keyspace_lookup_is_byte_ordered() {
    let ks = Keyspace {
        id: KeyspaceId(1),
        name: "r".into(),
        routing: Routing::Range,
        replication_factor: 1,
        min_in_sync: 1,
    };
    let n = nodes(2);
    let parts = [
        PartitionRecord {
            id: PartitionId(1),
            keyspace: ks.id,
            start: Bytes::new(),
            end: Some(Bytes::from_static(b"m")),
            owner: NodeId(1),
            replicas: vec![],
            in_sync: Vec::new(),
            reads_from: None,
            epoch: Epoch(1),
            state: PartitionState::Active,
        },
        PartitionRecord {
            id: PartitionId(2),
            keyspace: ks.id,
            start: Bytes::from_static(b"m"),
            end: None,
            owner: NodeId(2),
            replicas: vec![],
            in_sync: Vec::new(),
            reads_from: None,
            epoch: Epoch(1),
            state: PartitionState::Active,
        },
    ];
    let map = PartitionMap::from_parts(MapVersion(1), PartitionId(3), [ks.clone()], n, parts);
    map.validate().unwrap();
    assert_eq!(map.locate(ks.id, b"apple").unwrap().id, PartitionId(1));
    assert_eq!(map.locate(ks.id, b"m").unwrap().id, PartitionId(2));
    assert_eq!(map.locate(ks.id, b"zz").unwrap().id, PartitionId(2));
    assert_eq!(map.locate(ks.id, b"").unwrap().id, PartitionId(1));
}
