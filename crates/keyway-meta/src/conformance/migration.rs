//! Migration records (invariant 7): opaque bytes at a generation, every
//! write a compare-and-set on (id, generation), ids never reused. (Restart
//! durability is part of [`super::survives_restart`].)

use super::DEADLINE;
use crate::{MetaError, MetaStore, StoredMigration};
use std::sync::Arc;

fn stored(id: u64, generation: u64, record: &[u8]) -> StoredMigration {
    StoredMigration {
        id,
        generation,
        record: record.to_vec(),
    }
}

fn conflict(id: u64, current: Option<u64>) -> MetaError {
    MetaError::MigrationConflict { id, current }
}

/// Create, read back, update, list: the store returns exactly the bytes
/// and generation written; `migrations()` lists every record by id.
pub async fn migration_records_are_created_read_back_and_listed(f: &super::Fixture) {
    let store = &*f.store;
    assert_eq!(store.migrations().await.unwrap(), vec![]);
    let a = store.allocate_migration_id().await.unwrap();
    let b = store.allocate_migration_id().await.unwrap();
    let c = store.allocate_migration_id().await.unwrap();
    assert!(a >= 1 && a < b && b < c, "ids {a}, {b}, {c}");
    assert_eq!(store.get_migration(a).await.unwrap(), None);

    let bytes: Vec<u8> = (0..=255).collect();
    store
        .put_migration(c, None, 1, bytes.clone())
        .await
        .unwrap();
    store
        .put_migration(a, None, 1, b"a1".to_vec())
        .await
        .unwrap();
    store.put_migration(b, None, 7, Vec::new()).await.unwrap();
    assert_eq!(
        store.get_migration(c).await.unwrap(),
        Some(stored(c, 1, &bytes)),
        "every byte value survives"
    );
    store
        .put_migration(a, Some(1), 2, b"a2".to_vec())
        .await
        .unwrap();
    store
        .put_migration(a, Some(2), 10, b"a10".to_vec())
        .await
        .unwrap();
    assert_eq!(
        store.get_migration(a).await.unwrap(),
        Some(stored(a, 10, b"a10"))
    );
    assert_eq!(
        store.migrations().await.unwrap(),
        vec![
            stored(a, 10, b"a10"),
            stored(b, 7, b""),
            stored(c, 1, &bytes)
        ],
        "all records, by id"
    );
}

/// 16 concurrent writes expecting the same generation: exactly one wins,
/// every other gets `MigrationConflict` carrying the winner's generation.
/// Likewise for 16 concurrent creations of one id.
pub async fn migration_cas_race_has_exactly_one_winner(f: &super::Fixture) {
    let id = f.store.allocate_migration_id().await.unwrap();
    for expected in [None, Some(1)] {
        let base = expected.map_or(1, |g| g + 1);
        let tasks: Vec<_> = (0..16u64)
            .map(|i| {
                let store: Arc<dyn MetaStore> = f.store.clone();
                tokio::spawn(async move {
                    let generation = base + i;
                    let record = format!("writer {i}").into_bytes();
                    let result = tokio::time::timeout(
                        DEADLINE,
                        store.put_migration(id, expected, generation, record),
                    )
                    .await
                    .expect("put_migration within the deadline");
                    (generation, result)
                })
            })
            .collect();
        let mut winners = Vec::new();
        let mut losers = Vec::new();
        for task in tasks {
            let (generation, result) = task.await.unwrap();
            match result {
                Ok(()) => winners.push(generation),
                Err(MetaError::MigrationConflict { id: got, current }) => {
                    assert_eq!(got, id);
                    losers.push(current);
                }
                Err(e) => panic!("expected Ok or MigrationConflict, got {e:?}"),
            }
        }
        assert_eq!(winners.len(), 1, "exactly one winner: {winners:?}");
        let winner = winners[0];
        assert_eq!(losers.len(), 15);
        assert!(
            losers.iter().all(|c| *c == Some(winner)),
            "losers see the winner's generation {winner}: {losers:?}"
        );
        let now = f.store.get_migration(id).await.unwrap().unwrap();
        assert_eq!(now.generation, winner);
        assert_eq!(
            now.record,
            format!("writer {}", winner - base).into_bytes(),
            "the winner's record, whole"
        );
        if expected.is_none() {
            // Reset to generation 1 for the update race.
            f.store.delete_migration(id, winner).await.unwrap();
            f.store
                .put_migration(id, None, 1, b"base".to_vec())
                .await
                .unwrap();
        }
    }
}

/// A write expecting a generation that is no longer stored (or a record
/// that is not there, or none when there is one) is refused with what is
/// stored now, and changes nothing.
pub async fn migration_stale_expected_is_a_conflict(f: &super::Fixture) {
    let store = &*f.store;
    let id = store.allocate_migration_id().await.unwrap();
    let absent = store.allocate_migration_id().await.unwrap();
    store
        .put_migration(id, None, 1, b"v1".to_vec())
        .await
        .unwrap();
    store
        .put_migration(id, Some(1), 2, b"v2".to_vec())
        .await
        .unwrap();
    assert_eq!(
        store.put_migration(id, Some(1), 3, b"stale".to_vec()).await,
        Err(conflict(id, Some(2)))
    );
    assert_eq!(
        store.put_migration(id, None, 3, b"again".to_vec()).await,
        Err(conflict(id, Some(2))),
        "creating over an existing record"
    );
    assert_eq!(
        store.put_migration(id, Some(5), 6, b"ahead".to_vec()).await,
        Err(conflict(id, Some(2))),
        "expecting a generation never written"
    );
    assert_eq!(
        store.put_migration(absent, Some(1), 2, b"x".to_vec()).await,
        Err(conflict(absent, None)),
        "updating a record that does not exist"
    );
    assert_eq!(
        store.migrations().await.unwrap(),
        vec![stored(id, 2, b"v2")],
        "refused writes change nothing"
    );
}

/// Malformed writes are `InvalidArgument`, checked before the stored
/// generation: a generation that does not exceed the expected one (0 when
/// creating), id 0, and creating under an id the store never allocated.
pub async fn migration_generation_must_increase(f: &super::Fixture) {
    let store = &*f.store;
    let id = store.allocate_migration_id().await.unwrap();
    let invalid = |r: Result<(), MetaError>| matches!(r, Err(MetaError::InvalidArgument(_)));
    let r = store.put_migration(id, None, 0, b"x".to_vec()).await;
    assert!(invalid(r.clone()), "generation 0 when creating: {r:?}");
    store
        .put_migration(id, None, 1, b"v1".to_vec())
        .await
        .unwrap();
    for (expected, generation) in [(1, 1), (1, 0), (2, 1), (5, 4)] {
        let r = store
            .put_migration(id, Some(expected), generation, b"x".to_vec())
            .await;
        assert!(invalid(r.clone()), "{expected} -> {generation}: {r:?}");
    }
    let r = store.put_migration(0, None, 1, b"x".to_vec()).await;
    assert!(invalid(r.clone()), "id 0: {r:?}");
    let never = id + 1_000;
    let r = store.put_migration(never, None, 1, b"x".to_vec()).await;
    assert!(invalid(r.clone()), "never-allocated id: {r:?}");
    assert_eq!(store.get_migration(never).await.unwrap(), None);
    assert_eq!(
        store.migrations().await.unwrap(),
        vec![stored(id, 1, b"v1")],
        "refused writes change nothing"
    );
}

/// Deleting needs the stored generation; a deleted record is gone from
/// reads and the listing, and its id is not handed out again.
pub async fn migration_delete_checks_the_generation(f: &super::Fixture) {
    let store = &*f.store;
    let id = store.allocate_migration_id().await.unwrap();
    let other = store.allocate_migration_id().await.unwrap();
    store
        .put_migration(id, None, 1, b"v1".to_vec())
        .await
        .unwrap();
    store
        .put_migration(id, Some(1), 4, b"done".to_vec())
        .await
        .unwrap();
    store
        .put_migration(other, None, 1, b"o".to_vec())
        .await
        .unwrap();
    assert_eq!(
        store.delete_migration(id, 1).await,
        Err(conflict(id, Some(4)))
    );
    assert_eq!(
        store.delete_migration(id, 5).await,
        Err(conflict(id, Some(4)))
    );
    assert_eq!(
        store.get_migration(id).await.unwrap(),
        Some(stored(id, 4, b"done"))
    );
    store.delete_migration(id, 4).await.unwrap();
    assert_eq!(store.get_migration(id).await.unwrap(), None);
    assert_eq!(
        store.delete_migration(id, 4).await,
        Err(conflict(id, None)),
        "deleting again"
    );
    assert_eq!(
        store.migrations().await.unwrap(),
        vec![stored(other, 1, b"o")]
    );
    let next = store.allocate_migration_id().await.unwrap();
    assert!(next > other, "ids are never reused: {next} after {other}");
}

/// Concurrent allocations get distinct ids.
pub async fn migration_ids_are_distinct_under_concurrency(f: &super::Fixture) {
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let store = f.store.clone();
            tokio::spawn(async move { store.allocate_migration_id().await })
        })
        .collect();
    let mut ids = Vec::new();
    for task in tasks {
        ids.push(task.await.unwrap().unwrap());
    }
    ids.sort_unstable();
    let len = ids.len();
    ids.dedup();
    assert_eq!(ids.len(), len, "distinct ids: {ids:?}");
    assert!(ids[0] >= 1);
    let after = f.store.allocate_migration_id().await.unwrap();
    assert!(after > ids[len - 1], "{after} after {ids:?}");
}
