//! Durability: map, history, counters and leases survive reopening the
//! store.

use std::future::Future;
use std::sync::Arc;

use keyway_map::{MapVersion, NodeId};

use super::{bootstrapped, first_partition, flip, other_node};
use crate::{MapTxn, MapUpdate, MetaStore};

/// Drop the store and open it again on the same location: map, version,
/// history, node and lease counters and leases survive (a restored lease
/// has its full TTL again). `open` must return the same store each time;
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
    let v = store.commit(MapTxn::default()).await.unwrap();
    assert_eq!(v, MapVersion(before.version.0 + 2));
}
