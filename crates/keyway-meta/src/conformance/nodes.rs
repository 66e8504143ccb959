//! The empty store, node registration (id allocation, re-registration,
//! no id reuse) and one-shot bootstrap.

use std::collections::BTreeSet;

use keyway_map::{MapChange, MapVersion, NodeId, NodeState, PartitionMap};

use super::{Fixture, register};
use crate::{MapTxn, MapUpdate, MetaError};

/// A fresh store has the empty map at version 0, no leases, and nothing to
/// catch up on.
pub async fn starts_empty(f: &Fixture) {
    let store = &*f.store;
    let map = store.get_map().await.unwrap();
    assert_eq!(map.version, MapVersion(0));
    assert!(map.keyspaces.is_empty() && map.nodes.is_empty() && map.partitions.is_empty());
    map.validate().unwrap();
    assert_eq!(store.leases().await.unwrap(), vec![]);
    assert_eq!(
        store.changes_since(MapVersion(0)).await.unwrap(),
        MapUpdate::Delta(vec![])
    );
}

/// Concurrent registrations get distinct ids 1..=n; re-registration keeps
/// the id, updates addresses, marks the node Up (keeping its weight and
/// draining flag) and bumps the version; ids
/// are never reused, and ids never allocated are refused.
pub async fn register_node_allocates_distinct_ids_and_reregistration_keeps_them(f: &Fixture) {
    let store = f.store.clone();
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .register_node(None, format!("10.0.0.{i}:6379"), format!("10.0.0.{i}:8080"))
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut ids = BTreeSet::new();
    for t in tasks {
        assert!(ids.insert(t.await.unwrap()), "duplicate node id");
    }
    assert_eq!(ids, (1..=8).map(NodeId).collect::<BTreeSet<_>>());
    let map = store.get_map().await.unwrap();
    assert_eq!(
        map.version,
        MapVersion(8),
        "each registration bumps the version"
    );
    assert_eq!(map.nodes.len(), 8);
    assert!(map.nodes.values().all(|n| n.state == NodeState::Up));

    // Mark node 3 down (and weighted, draining), then re-register it with
    // new addresses.
    let mut down = map.nodes[&NodeId(3)].clone();
    down.state = NodeState::Down;
    down.weight = 250;
    down.draining = true;
    store
        .commit(MapTxn::unconditional(vec![MapChange::UpsertNode(down)]))
        .await
        .unwrap();
    let id = store
        .register_node(Some(NodeId(3)), "new:6379".into(), "new:8080".into())
        .await
        .unwrap();
    assert_eq!(id, NodeId(3));
    let map = store.get_map().await.unwrap();
    assert_eq!(map.version, MapVersion(10));
    assert_eq!(map.nodes.len(), 8);
    let n = &map.nodes[&NodeId(3)];
    assert_eq!(
        (n.resp_addr.as_str(), n.admin_addr.as_str()),
        ("new:6379", "new:8080")
    );
    assert_eq!(n.state, NodeState::Up);
    assert_eq!(
        (n.weight, n.draining),
        (250, true),
        "re-registration keeps what operators set"
    );

    // Removing a node does not free its id.
    store
        .commit(MapTxn::unconditional(vec![MapChange::RemoveNode {
            id: NodeId(8),
        }]))
        .await
        .unwrap();
    assert_eq!(
        store.register_node(None, "x:1".into(), "x:2".into()).await,
        Ok(NodeId(9))
    );
    for bogus in [NodeId(0), NodeId(99)] {
        let err = store
            .register_node(Some(bogus), "y:1".into(), "y:2".into())
            .await
            .unwrap_err();
        assert!(
            matches!(err, MetaError::InvalidArgument(_)),
            "{bogus:?}: {err:?}"
        );
    }
    assert_eq!(store.get_map().await.unwrap().version, MapVersion(12));
}

/// Bootstrap waits for `min_nodes`, happens once however many callers race,
/// and builds `PartitionMap::bootstrap` over the nodes sorted by id.
pub async fn bootstrap_if_empty_is_idempotent_and_has_one_winner(f: &Fixture) {
    let store = f.store.clone();
    assert!(
        !store.bootstrap_if_empty(1, 4).await.unwrap(),
        "no nodes: no bootstrap"
    );
    register(&*store, 3).await;
    assert!(
        !store.bootstrap_if_empty(4, 2).await.unwrap(),
        "too few nodes"
    );
    let before = store.get_map().await.unwrap();
    assert_eq!(before.version, MapVersion(3));

    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.bootstrap_if_empty(3, 2).await.unwrap() })
        })
        .collect();
    let mut wins = 0;
    for t in tasks {
        wins += usize::from(t.await.unwrap());
    }
    assert_eq!(wins, 1, "exactly one caller bootstraps");

    let map = store.get_map().await.unwrap();
    assert_eq!(map.version, MapVersion(4), "bootstrap is one commit");
    map.validate().unwrap();
    let nodes: Vec<_> = before.nodes.values().cloned().collect();
    let want = PartitionMap::bootstrap(&nodes, 2).unwrap();
    assert_eq!(map.keyspaces, want.keyspaces);
    assert_eq!(map.partitions, want.partitions);
    assert_eq!(map.next_partition_id, want.next_partition_id);
    assert_eq!(map.nodes, before.nodes);

    assert!(!store.bootstrap_if_empty(1, 2).await.unwrap());
    register(&*store, 1).await;
    assert!(!store.bootstrap_if_empty(1, 2).await.unwrap());
    let after = store.get_map().await.unwrap();
    assert_eq!(
        after.version,
        MapVersion(5),
        "only the registration changed the map"
    );
    assert_eq!(after.partitions, map.partitions);
}

/// Registration can carry a zone (kept by a later registration without
/// one), and a replicated bootstrap places each partition's copies on
/// distinct nodes in distinct zones, keyspace 0 with the asked settings.
pub async fn zones_and_a_replicated_bootstrap(f: &Fixture) {
    let store = f.store.clone();
    let mut ids = Vec::new();
    for (i, zone) in ["a", "b", "a", "b"].into_iter().enumerate() {
        let id = store
            .register_node_in_zone(None, format!("z:{i}"), format!("za:{i}"), Some(zone.into()))
            .await
            .unwrap();
        ids.push(id);
    }
    store
        .register_node(Some(ids[0]), "z:0".into(), "za:0".into())
        .await
        .unwrap();
    let bad = crate::Replication {
        factor: 3,
        min_in_sync: 4,
    };
    assert!(matches!(
        store.bootstrap_if_empty_with(4, 2, bad).await,
        Err(MetaError::InvalidArgument(_))
    ));
    let rf = crate::Replication {
        factor: 2,
        min_in_sync: 2,
    };
    assert!(store.bootstrap_if_empty_with(4, 2, rf).await.unwrap());
    let map = store.get_map().await.unwrap();
    assert_eq!(map.nodes[&ids[0]].zone.as_deref(), Some("a"), "kept");
    let ks = &map.keyspaces[&keyway_map::DEFAULT_KEYSPACE];
    assert_eq!((ks.replication_factor, ks.min_in_sync), (2, 2));
    assert_eq!(map.partitions.len(), 8);
    for p in map.partitions.values() {
        assert_eq!(p.replicas.len(), 1, "{p:?}");
        assert_ne!(p.replicas[0], p.owner);
        assert_ne!(map.nodes[&p.replicas[0]].zone, map.nodes[&p.owner].zone);
        assert_eq!(p.in_sync, p.replicas);
    }
}
