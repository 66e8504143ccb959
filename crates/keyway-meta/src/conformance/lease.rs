//! Leases: grant, keep-alive, list, revoke, argument checks, and expiry
//! without keep-alive.

use keyway_map::NodeId;

use super::{DEADLINE, Fixture, eventually, register};
use crate::{LeaseId, MetaError};

/// Grant, keep alive, list, revoke; argument checks.
pub async fn lease_lifecycle(f: &Fixture) {
    let store = &*f.store;
    let ids = register(store, 2).await;
    let a = store.grant_lease(ids[0], 30_000).await.unwrap();
    let b = store.grant_lease(ids[1], 20_000).await.unwrap();
    assert_ne!(a, b);
    assert_eq!(store.keep_alive(a).await, Ok(30_000));
    let leases = store.leases().await.unwrap();
    assert_eq!(leases.len(), 2);
    assert_eq!((leases[0].lease, leases[0].node), (a, ids[0]));
    assert_eq!((leases[1].lease, leases[1].node), (b, ids[1]));
    assert!(leases[0].remaining_ms > 0 && leases[0].remaining_ms <= 30_000);
    assert!(leases[1].remaining_ms > 0 && leases[1].remaining_ms <= 20_000);

    store.revoke_lease(a).await.unwrap();
    assert_eq!(store.keep_alive(a).await, Err(MetaError::LeaseNotFound(a)));
    assert_eq!(
        store.revoke_lease(a).await,
        Err(MetaError::LeaseNotFound(a))
    );
    let leases = store.leases().await.unwrap();
    assert_eq!(leases.iter().map(|l| l.lease).collect::<Vec<_>>(), vec![b]);
    let never = LeaseId(12_345);
    assert_eq!(
        store.keep_alive(never).await,
        Err(MetaError::LeaseNotFound(never))
    );

    let c = store.grant_lease(ids[0], 1_000).await.unwrap();
    assert!(c != a && c != b, "lease ids are never reused");
    for (node, ttl) in [(NodeId(99), 1_000), (ids[0], 0)] {
        let err = store.grant_lease(node, ttl).await.unwrap_err();
        assert!(
            matches!(err, MetaError::InvalidArgument(_)),
            "{node:?}/{ttl}: {err:?}"
        );
    }
}

/// A lease not kept alive expires: it drops out of `leases()` and
/// `keep_alive` then returns `LeaseNotFound`; another lease is unaffected.
pub async fn lease_expires_without_keep_alive(f: &Fixture) {
    let store = &*f.store;
    let ids = register(store, 1).await;
    let long = store.grant_lease(ids[0], 60_000).await.unwrap();
    let short = store.grant_lease(ids[0], 300).await.unwrap();
    eventually("the short lease to expire", DEADLINE, || async {
        let leases = store.leases().await.unwrap();
        (!leases.iter().any(|l| l.lease == short)).then_some(())
    })
    .await;
    assert_eq!(
        store.keep_alive(short).await,
        Err(MetaError::LeaseNotFound(short))
    );
    let leases = store.leases().await.unwrap();
    assert_eq!(
        leases.iter().map(|l| l.lease).collect::<Vec<_>>(),
        vec![long]
    );
    assert_eq!(store.keep_alive(long).await, Ok(60_000));
}
