//! [`MetaStore::commit_with_migration`]: a migration record's
//! compare-and-set and a map commit as one transaction (the driver's flip
//! request and flip CAS, one durable write inside the write pause). Both
//! apply or neither does; each side's condition failing leaves the other
//! side untouched; under a race exactly one writer wins both.

use super::{DEADLINE, bootstrapped, first_partition, flip, other_node};
use crate::{MetaError, MetaStore, MigrationPut, StoredMigration};
use std::sync::Arc;

fn put(id: u64, expected: u64, generation: u64, record: &[u8]) -> MigrationPut {
    MigrationPut {
        id,
        expected: Some(expected),
        generation,
        record: record.to_vec(),
    }
}

/// Both sides apply together; a failed record condition leaves the map
/// alone, a failed map condition leaves the record alone, and a record is
/// never created this way.
pub async fn a_commit_with_a_migration_record_applies_both_or_neither(f: &super::Fixture) {
    let store = &*f.store;
    let map = bootstrapped(store, 3, 2).await;
    let p = first_partition(&map);
    let to = other_node(&map, p.owner);
    let id = store.allocate_migration_id().await.unwrap();
    store
        .put_migration(id, None, 1, b"g1".to_vec())
        .await
        .unwrap();

    // The record's condition fails: nothing changes.
    let err = store
        .commit_with_migration(flip(&p, to), put(id, 5, 6, b"g6"))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        MetaError::MigrationConflict {
            id,
            current: Some(1)
        }
    );
    assert_eq!(store.get_map().await.unwrap().version, map.version);

    // Creating a record with a commit is refused, before anything is read.
    let err = store
        .commit_with_migration(
            flip(&p, to),
            MigrationPut {
                expected: None,
                ..put(id, 0, 1, b"new")
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(err, MetaError::InvalidArgument(_)), "{err:?}");
    assert_eq!(store.get_map().await.unwrap().version, map.version);

    // Both hold: both apply, as one new map version.
    let version = store
        .commit_with_migration(flip(&p, to), put(id, 1, 2, b"g2"))
        .await
        .unwrap();
    assert_eq!(version.0, map.version.0 + 1);
    let after = store.get_map().await.unwrap();
    assert_eq!(after.version, version);
    assert_eq!(after.partitions[&p.id].owner, to);
    let g2 = StoredMigration {
        id,
        generation: 2,
        record: b"g2".to_vec(),
    };
    assert_eq!(store.get_migration(id).await.unwrap(), Some(g2.clone()));

    // The map's condition fails (the same flip again): the record stays.
    let err = store
        .commit_with_migration(flip(&p, to), put(id, 2, 3, b"g3"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, MetaError::Conflict { partition, current }
            if partition == p.id && current == Some((to, after.partitions[&p.id].epoch))),
        "{err:?}"
    );
    assert_eq!(store.get_migration(id).await.unwrap(), Some(g2));
    assert_eq!(store.get_map().await.unwrap().version, version);
}

/// Writers racing on the same record generation, each flipping the same
/// partition to its own node: exactly one wins, and the record holds the
/// winner's bytes while the map holds the winner's owner.
pub async fn commits_with_a_migration_record_race_to_one_winner(f: &super::Fixture) {
    let map = bootstrapped(&*f.store, 3, 2).await;
    let p = first_partition(&map);
    let id = f.store.allocate_migration_id().await.unwrap();
    f.store
        .put_migration(id, None, 1, b"g1".to_vec())
        .await
        .unwrap();
    let others: Vec<_> = map
        .nodes
        .keys()
        .copied()
        .filter(|n| *n != p.owner)
        .collect();
    let tasks: Vec<_> = (0..8usize)
        .map(|i| {
            let store: Arc<dyn MetaStore> = f.store.clone();
            let to = others[i % others.len()];
            let txn = flip(&p, to);
            tokio::spawn(async move {
                let record = format!("writer {i} to {to}").into_bytes();
                let result = tokio::time::timeout(
                    DEADLINE,
                    store.commit_with_migration(txn, put(id, 1, 2, &record)),
                )
                .await
                .expect("commit_with_migration within the deadline");
                (to, record, result)
            })
        })
        .collect();
    let mut winners = Vec::new();
    for task in tasks {
        let (to, record, result) = task.await.unwrap();
        match result {
            Ok(_) => winners.push((to, record)),
            Err(MetaError::MigrationConflict { .. } | MetaError::Conflict { .. }) => {}
            Err(e) => panic!("expected Ok or a conflict, got {e:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one winner");
    let (to, record) = winners.pop().unwrap();
    let now = f.store.get_map().await.unwrap();
    assert_eq!(now.version.0, map.version.0 + 1, "one new version");
    assert_eq!(now.partitions[&p.id].owner, to);
    let stored = f.store.get_migration(id).await.unwrap().unwrap();
    assert_eq!((stored.generation, stored.record), (2, record));
}
