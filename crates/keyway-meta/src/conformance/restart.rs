//! Durability: map, history, counters, leases and migration records
//! survive reopening the store.

use std::future::Future;
use std::sync::Arc;

use keyway_map::{MapVersion, NodeId};

use super::{bootstrapped, first_partition, flip, other_node};
use crate::{MapTxn, MapUpdate, MetaError, MetaStore};

/// Drop the store and open it again on the same location: map, version,
/// history, node and lease counters, leases (a restored lease has its full
/// TTL again), migration records and the migration-id counter (an id is
/// never handed out again, even for a record already deleted) survive. `open` must return the same store each time;
/// the previous handle is dropped before it is called again.
pub async fn survives_restart<F, Fut>(mut open: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Arc<dyn MetaStore>>,
{
    let store = open().await;
    let map = bootstrapped(&*store, 3, 2).await;
    let p = first_partition(&map);
    store
        .commit(flip(&p, other_node(&map, p.owner)))
        .await
        .unwrap();
    let lease = store.grant_lease(NodeId(1), 60_000).await.unwrap();
    let before = store.get_map().await.unwrap();
    let recent = MapVersion(before.version.0 - 2);
    let delta_before = store.changes_since(recent).await.unwrap();
    let kept = store.allocate_migration_id().await.unwrap();
    let deleted = store.allocate_migration_id().await.unwrap();
    store
        .put_migration(kept, None, 3, b"kept".to_vec())
        .await
        .unwrap();
    store
        .put_migration(deleted, None, 1, b"gone".to_vec())
        .await
        .unwrap();
    store.delete_migration(deleted, 1).await.unwrap();
    let migrations_before = store.migrations().await.unwrap();
    drop(store);

    let store = open().await;
    assert_eq!(
        store.get_map().await.unwrap(),
        before,
        "map and version survive"
    );
    let delta = store.changes_since(recent).await.unwrap();
    assert!(
        matches!(&delta, MapUpdate::Delta(d) if d.len() == 2),
        "history survives: {delta:?}"
    );
    assert_eq!(delta, delta_before, "history entries survive exactly");
    let leases = store.leases().await.unwrap();
    assert_eq!(leases.len(), 1);
    assert_eq!((leases[0].lease, leases[0].node), (lease, NodeId(1)));
    assert!(
        leases[0].remaining_ms > 50_000,
        "restored lease has its TTL again"
    );
    assert_eq!(store.keep_alive(lease).await, Ok(60_000));
    assert_eq!(
        store.register_node(None, "n:1".into(), "n:2".into()).await,
        Ok(NodeId(4)),
        "node counter survives"
    );
    let next = store.grant_lease(NodeId(4), 1_000).await.unwrap();
    assert!(next > lease, "lease counter survives");
    assert_eq!(
        store.migrations().await.unwrap(),
        migrations_before,
        "migration records survive"
    );
    assert_eq!(migrations_before.len(), 1);
    assert_eq!(
        store.put_migration(kept, Some(2), 4, b"x".to_vec()).await,
        Err(MetaError::MigrationConflict {
            id: kept,
            current: Some(3)
        }),
        "the generation survives"
    );
    let next = store.allocate_migration_id().await.unwrap();
    assert!(
        next > deleted,
        "migration ids are never reused: {next} after {deleted}"
    );
    let v = store.commit(MapTxn::default()).await.unwrap();
    assert_eq!(v, MapVersion(before.version.0 + 2));
}
