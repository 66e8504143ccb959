//! Map commits: version stamping, compare-and-set races, conflict
//! reporting, and refusal of commits that would make the map invalid.

use std::sync::Arc;

use keyway_map::{
    Epoch, MapChange, MapError, MapVersion, NodeId, OwnershipCondition, PartitionId, slot_bound,
};

use super::{Fixture, bootstrapped, first_partition, flip, other_node};
use crate::{MapTxn, MapUpdate, MetaError};

/// A commit stamps its changes with version current+1 and they show in the map.
pub async fn commit_applies_changes_as_the_next_version(f: &Fixture) {
    let store = &*f.store;
    let map = bootstrapped(store, 2, 2).await;
    let p = first_partition(&map);
    let to = other_node(&map, p.owner);
    let v = store.commit(flip(&p, to)).await.unwrap();
    assert_eq!(v, MapVersion(map.version.0 + 1));
    let after = store.get_map().await.unwrap();
    assert_eq!(after.version, v);
    assert_eq!(after.partitions[&p.id].owner, to);
    assert_eq!(after.partitions[&p.id].epoch, Epoch(p.epoch.0 + 1));
    // An empty transaction is allowed and still stamps a version.
    assert_eq!(
        store.commit(MapTxn::default()).await.unwrap(),
        MapVersion(v.0 + 1)
    );
}

/// Many concurrent flips conditional on the same (owner, epoch): exactly
/// one wins; every other gets `Conflict` carrying the winner's values.
pub async fn cas_race_has_exactly_one_winner(f: &Fixture) {
    const RACERS: u64 = 16;
    let store = f.store.clone();
    let map = bootstrapped(&*store, 3, 2).await;
    let p = first_partition(&map);
    let others: Vec<NodeId> = map
        .nodes
        .keys()
        .copied()
        .filter(|n| *n != p.owner)
        .collect();
    let barrier = Arc::new(tokio::sync::Barrier::new(RACERS as usize));
    let tasks: Vec<_> = (0..RACERS)
        .map(|i| {
            // Each racer writes a distinct epoch so the winner is identifiable.
            let mut txn = flip(&p, others[i as usize % others.len()]);
            if let MapChange::UpsertPartition(next) = &mut txn.changes[0] {
                next.epoch = Epoch(p.epoch.0 + 1 + i);
            }
            let store = store.clone();
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                (txn.clone(), store.commit(txn).await)
            })
        })
        .collect();
    let mut winners = Vec::new();
    let mut conflicts = Vec::new();
    for t in tasks {
        let (txn, result) = t.await.unwrap();
        match result {
            Ok(v) => winners.push((txn, v)),
            Err(MetaError::Conflict { partition, current }) => conflicts.push((partition, current)),
            Err(e) => panic!("racer failed with {e:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one compare-and-set must win");
    let (txn, v) = &winners[0];
    assert_eq!(*v, MapVersion(map.version.0 + 1));
    let MapChange::UpsertPartition(won) = &txn.changes[0] else {
        unreachable!()
    };
    for (partition, current) in conflicts {
        assert_eq!(partition, p.id);
        assert_eq!(
            current,
            Some((won.owner, won.epoch)),
            "conflict must carry the winner's values"
        );
    }
    let after = store.get_map().await.unwrap();
    assert_eq!(after.version, *v);
    assert_eq!(&after.partitions[&p.id], won);
}

/// A failed condition reports the partition and what it holds now (or that
/// it is absent); conditions are checked before the changes are applied;
/// and a split shaped as (shrink p conditional on p, create q conditional on
/// q absent) commits.
pub async fn conflict_carries_what_is_there_now(f: &Fixture) {
    let store = &*f.store;
    let map = bootstrapped(store, 2, 2).await;
    let p = first_partition(&map);
    let now = Some((p.owner, p.epoch));
    let absent = PartitionId(999);

    let expect_absent = MapTxn {
        conditions: vec![OwnershipCondition {
            partition: p.id,
            expected: None,
        }],
        changes: vec![],
    };
    assert_eq!(
        store.commit(expect_absent).await,
        Err(MetaError::Conflict {
            partition: p.id,
            current: now
        })
    );
    let stale = MapTxn {
        conditions: vec![OwnershipCondition {
            partition: p.id,
            expected: Some((p.owner, Epoch(p.epoch.0 + 7))),
        }],
        changes: vec![],
    };
    assert_eq!(
        store.commit(stale).await,
        Err(MetaError::Conflict {
            partition: p.id,
            current: now
        })
    );
    // Conditions come first: an invalid change behind a failing condition is a Conflict.
    let missing = MapTxn {
        conditions: vec![OwnershipCondition {
            partition: absent,
            expected: Some((p.owner, p.epoch)),
        }],
        changes: vec![MapChange::RemovePartition { id: p.id }],
    };
    assert_eq!(
        store.commit(missing).await,
        Err(MetaError::Conflict {
            partition: absent,
            current: None
        })
    );
    assert_eq!(
        store.get_map().await.unwrap(),
        map,
        "failed commits change nothing"
    );

    // A split: p keeps [start, mid) at epoch+1, q = [mid, end) is new.
    let (first_slot, _) = p.slot_span();
    let mid = keyway_map::PartitionId(map.next_partition_id.0);
    let mut left = p.clone();
    left.end = Some(bytes_of(slot_bound(first_slot + 100)));
    left.epoch = Epoch(p.epoch.0 + 1);
    let mut right = p.clone();
    right.id = mid;
    right.start = left.end.clone().unwrap();
    right.epoch = Epoch(p.epoch.0 + 1);
    let split = MapTxn {
        conditions: vec![
            OwnershipCondition {
                partition: p.id,
                expected: now,
            },
            OwnershipCondition {
                partition: mid,
                expected: None,
            },
        ],
        changes: vec![
            MapChange::UpsertPartition(left.clone()),
            MapChange::UpsertPartition(right.clone()),
        ],
    };
    let v = store.commit(split.clone()).await.unwrap();
    let after = store.get_map().await.unwrap();
    assert_eq!(after.version, v);
    assert_eq!(after.partitions[&p.id], left);
    assert_eq!(after.partitions[&mid], right);
    assert!(after.next_partition_id > mid);
    // Replaying the same split now conflicts on p (its epoch moved on).
    assert_eq!(
        store.commit(split).await,
        Err(MetaError::Conflict {
            partition: p.id,
            current: Some((left.owner, left.epoch))
        })
    );
}

fn bytes_of(b: [u8; 2]) -> bytes::Bytes {
    bytes::Bytes::copy_from_slice(&b)
}

/// A commit whose resulting map fails validation (or whose changes do not
/// apply) is refused with the exact `InvalidMap` reason, and nothing changes.
pub async fn commit_is_refused_when_the_resulting_map_is_invalid(f: &Fixture) {
    let store = &*f.store;
    let map = bootstrapped(store, 2, 2).await;
    let p = first_partition(&map);
    let second = map
        .keyspace_partitions(keyway_map::DEFAULT_KEYSPACE)
        .nth(1)
        .unwrap()
        .id;
    let holds = vec![OwnershipCondition {
        partition: p.id,
        expected: Some((p.owner, p.epoch)),
    }];

    let mut unknown_owner = p.clone();
    unknown_owner.owner = NodeId(77);
    unknown_owner.epoch = Epoch(p.epoch.0 + 1);
    let mut lower_epoch = p.clone();
    lower_epoch.epoch = Epoch(0);
    let mut empty = p.clone();
    empty.end = Some(p.start.clone());
    empty.epoch = Epoch(p.epoch.0 + 1);

    let cases = [
        (
            vec![MapChange::RemovePartition { id: p.id }],
            MapError::CoverageBroken {
                keyspace: p.keyspace,
                partition: second,
            },
        ),
        (
            vec![MapChange::UpsertPartition(unknown_owner)],
            MapError::UnknownOwner {
                partition: p.id,
                node: NodeId(77),
            },
        ),
        (
            vec![MapChange::UpsertPartition(lower_epoch)],
            MapError::EpochNotIncreasing {
                partition: p.id,
                have: p.epoch.0,
                got: 0,
            },
        ),
        (
            vec![MapChange::RemovePartition {
                id: PartitionId(999),
            }],
            MapError::NoSuchPartition(PartitionId(999)),
        ),
        (
            vec![MapChange::UpsertPartition(empty)],
            MapError::EmptyRange {
                keyspace: p.keyspace,
                partition: p.id,
            },
        ),
        (
            vec![MapChange::RemoveNode { id: p.owner }],
            MapError::UnknownOwner {
                partition: map.owned_by(p.owner).next().unwrap().id,
                node: p.owner,
            },
        ),
    ];
    for (changes, want) in cases {
        let txn = MapTxn {
            conditions: holds.clone(),
            changes: changes.clone(),
        };
        assert_eq!(
            store.commit(txn).await,
            Err(MetaError::InvalidMap(want)),
            "changes {changes:?}"
        );
        assert_eq!(
            store.get_map().await.unwrap(),
            map,
            "a refused commit changes nothing"
        );
    }
    assert_eq!(
        store.changes_since(map.version).await.unwrap(),
        MapUpdate::Delta(vec![])
    );
}
