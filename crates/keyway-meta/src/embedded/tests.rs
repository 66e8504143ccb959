//! Unit tests of [`EmbeddedMeta`] (reopen, lagging watchers, failed writes).

use super::*;
use keyway_map::{Epoch, MapChange};
use std::time::Duration;

fn open(dir: &Path, opts: EmbeddedOptions) -> EmbeddedMeta {
    EmbeddedMeta::open(dir, opts).unwrap()
}

/// The newest state the store made durable (read only, the store open).
fn stored(dir: &Path) -> serde_json::Value {
    let parse = |b: &[u8]| serde_json::from_slice::<serde_json::Value>(b).unwrap();
    let checkpoint = std::fs::read(dir.join(STATE_FILE)).ok().map(|b| parse(&b));
    let bytes = std::fs::read(dir.join(JOURNAL_FILE)).unwrap();
    let last = journal::last_frame(&bytes).0.map(|r| parse(&bytes[r]));
    let seq = |v: &serde_json::Value| v["write_seq"].as_u64().unwrap_or(0);
    match (checkpoint, last) {
        (Some(c), Some(j)) if seq(&j) > seq(&c) => j,
        (Some(c), _) => c,
        (None, Some(j)) => j,
        (None, None) => panic!("nothing stored yet"),
    }
}

/// What the store keeps on disk: the checkpoint and the journal.
fn on_disk(dir: &Path) -> (Option<Vec<u8>>, Vec<u8>) {
    (
        std::fs::read(dir.join(STATE_FILE)).ok(),
        std::fs::read(dir.join(JOURNAL_FILE)).unwrap(),
    )
}

async fn bootstrapped(store: &EmbeddedMeta) -> PartitionMap {
    for i in 0..2 {
        store
            .register_node(None, format!("127.0.0.1:{}", 7000 + i), String::new())
            .await
            .unwrap();
    }
    assert!(store.bootstrap_if_empty(2, 2).await.unwrap());
    store.get_map().await.unwrap()
}

/// Moves partition 1 to the other node, conditional on its current owner.
fn flip(map: &PartitionMap) -> MapTxn {
    let mut p = map.partitions.values().next().unwrap().clone();
    let cond = keyway_map::OwnershipCondition {
        partition: p.id,
        expected: Some((p.owner, p.epoch)),
    };
    p.owner = if p.owner == NodeId(1) {
        NodeId(2)
    } else {
        NodeId(1)
    };
    p.epoch = Epoch(p.epoch.0 + 1);
    MapTxn {
        conditions: vec![cond],
        changes: vec![MapChange::UpsertPartition(p)],
    }
}

#[tokio::test]
async fn a_directory_is_opened_by_one_store_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), EmbeddedOptions::default());
    let err = EmbeddedMeta::open(dir.path(), EmbeddedOptions::default())
        .expect_err("second open must fail");
    assert!(matches!(err, MetaError::Unavailable(_)), "{err:?}");
    drop(store);
    open(dir.path(), EmbeddedOptions::default());
}

#[tokio::test]
async fn lagging_watcher_gets_the_full_map_and_then_continues_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let opts = EmbeddedOptions {
        watch_capacity: 4,
        ..EmbeddedOptions::default()
    };
    let store = open(dir.path(), opts);
    let mut map = bootstrapped(&store).await;
    let mut watch = store.watch(map.version).await.unwrap();
    for _ in 0..20 {
        let cur = store.get_map().await.unwrap();
        store.commit(flip(&cur)).await.unwrap();
    }
    let first = watch.next().await.unwrap().unwrap();
    assert!(
        matches!(first, MapUpdate::Full(_)),
        "lagged watcher must get Full, got {first:?}"
    );
    first.apply_to(&mut map).unwrap();
    let target = store.get_map().await.unwrap();
    assert_eq!(map.version, target.version, "Full is the newest map");
    // And it keeps following from there, one version at a time.
    let v = store.commit(flip(&target)).await.unwrap();
    let next = watch.next().await.unwrap().unwrap();
    assert_eq!(next.version(), Some(v));
    assert!(
        matches!(&next, MapUpdate::Delta(d) if d.len() == 1),
        "{next:?}"
    );
    next.apply_to(&mut map).unwrap();
    assert_eq!(map, store.get_map().await.unwrap());
}

#[tokio::test]
async fn dropping_the_store_ends_watchers_with_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), EmbeddedOptions::default());
    let mut watch = store.watch(MapVersion(0)).await.unwrap();
    drop(store);
    let item = watch.next().await.expect("an error item, not a silent end");
    assert!(matches!(item, Err(MetaError::Unavailable(_))), "{item:?}");
    assert!(watch.next().await.is_none());
}

#[tokio::test(start_paused = true)]
async fn expired_lease_is_reaped_from_the_state_file() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), EmbeddedOptions::default());
    bootstrapped(&store).await;
    let short = store.grant_lease(NodeId(1), 1_000).await.unwrap();
    let long = store.grant_lease(NodeId(2), 60_000).await.unwrap();
    tokio::time::advance(Duration::from_millis(999)).await;
    assert_eq!(store.keep_alive(short).await, Ok(1_000));
    tokio::time::advance(Duration::from_millis(1_000)).await;
    assert_eq!(
        store.keep_alive(short).await,
        Err(MetaError::LeaseNotFound(short))
    );
    let live: Vec<_> = store
        .leases()
        .await
        .unwrap()
        .iter()
        .map(|l| l.lease)
        .collect();
    assert_eq!(live, vec![long]);
    // The reaper removed it from disk too: after a reopen it stays gone.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let v = stored(dir.path());
        if v["leases"].as_array().unwrap().len() == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "reaper never persisted the expiry"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(store);
    let store = open(dir.path(), EmbeddedOptions::default());
    let live: Vec<_> = store
        .leases()
        .await
        .unwrap()
        .iter()
        .map(|l| l.lease)
        .collect();
    assert_eq!(live, vec![long]);
    assert_eq!(
        store.leases().await.unwrap()[0].remaining_ms,
        60_000,
        "full TTL again after reopen"
    );
}

#[tokio::test]
async fn elections_survive_a_reopen_with_their_leases() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), EmbeddedOptions::default());
    let la = store.grant_session_lease(60_000).await.unwrap();
    let lb = store.grant_session_lease(60_000).await.unwrap();
    let a = store.campaign("e", "a", la).await.unwrap();
    let waiting = {
        let b = store.campaign("e", "b", lb);
        tokio::time::timeout(Duration::from_millis(50), b).await
    };
    assert!(waiting.is_err(), "b waits behind a");
    drop(store);
    let store = open(dir.path(), EmbeddedOptions::default());
    assert_eq!(
        store.leader("e").await.unwrap(),
        Some(a.clone()),
        "a's lease survived, so a still leads"
    );
    assert_eq!(
        store.campaign("e", "a", la).await.unwrap(),
        a,
        "the same candidacy after a reopen"
    );
    let store = Arc::new(store);
    let b = tokio::spawn({
        let store = store.clone();
        async move { store.campaign("e", "b", lb).await }
    });
    store.revoke_lease(la).await.unwrap();
    let b = tokio::time::timeout(Duration::from_secs(10), b)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(store.leader("e").await.unwrap(), Some(b.clone()));
    assert!(b.token > a.token, "candidacy ids are never reused");
}

#[tokio::test]
async fn refused_commit_changes_nothing_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), EmbeddedOptions::default());
    let map = bootstrapped(&store).await;
    let before = on_disk(dir.path());
    let first = *map.partitions.keys().next().unwrap();
    let err = store
        .commit(MapTxn::unconditional(vec![MapChange::RemovePartition {
            id: first,
        }]))
        .await
        .unwrap_err();
    assert!(matches!(err, MetaError::InvalidMap(_)), "{err:?}");
    assert_eq!(on_disk(dir.path()), before);
    assert_eq!(store.get_map().await.unwrap(), map);
}

#[tokio::test]
async fn failed_write_stops_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), EmbeddedOptions::default());
    store
        .register_node(None, "a:1".into(), String::new())
        .await
        .unwrap();
    // A directory where the journal must be makes the write fail.
    let journal = dir.path().join(JOURNAL_FILE);
    let aside = dir.path().join("journal.aside");
    std::fs::rename(&journal, &aside).unwrap();
    std::fs::create_dir(&journal).unwrap();
    let err = store
        .register_node(None, "b:1".into(), String::new())
        .await
        .unwrap_err();
    assert!(matches!(err, MetaError::Internal(_)), "{err:?}");
    assert!(matches!(store.get_map().await, Err(MetaError::Internal(_))));
    std::fs::remove_dir(&journal).unwrap();
    std::fs::rename(&aside, &journal).unwrap();
    drop(store);
    // Reopen: the refused registration never happened, its id is free.
    let store = open(dir.path(), EmbeddedOptions::default());
    assert_eq!(store.get_map().await.unwrap().nodes.len(), 1);
    let id = store
        .register_node(None, "b:1".into(), String::new())
        .await
        .unwrap();
    assert_eq!(id, NodeId(2));
}

#[tokio::test]
async fn migration_records_and_ids_survive_a_reopen_and_refused_writes_do_not_touch_disk() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), EmbeddedOptions::default());
    let a = store.allocate_migration_id().await.unwrap();
    let b = store.allocate_migration_id().await.unwrap();
    assert_eq!((a, b), (1, 2));
    store
        .put_migration(a, None, 2, b"rec".to_vec())
        .await
        .unwrap();
    let before = on_disk(dir.path());
    assert_eq!(
        store.put_migration(a, Some(1), 3, vec![]).await,
        Err(MetaError::MigrationConflict {
            id: a,
            current: Some(2)
        })
    );
    assert_eq!(on_disk(dir.path()), before);
    drop(store);
    let store = open(dir.path(), EmbeddedOptions::default());
    assert_eq!(
        store.get_migration(a).await.unwrap(),
        Some(crate::StoredMigration {
            id: a,
            generation: 2,
            record: b"rec".to_vec()
        })
    );
    assert_eq!(store.allocate_migration_id().await.unwrap(), 3);
    // `b` was allocated before the reopen: it may still be created.
    store.put_migration(b, None, 1, vec![]).await.unwrap();
}

#[test]
fn open_works_outside_a_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), EmbeddedOptions::default());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let id = store
            .register_node(None, "a:1".into(), String::new())
            .await
            .unwrap();
        store.grant_lease(id, 1_000).await.unwrap();
        assert_eq!(store.leases().await.unwrap().len(), 1);
    });
}

#[tokio::test]
async fn bootstrap_with_replication_factor_2_places_copies_on_distinct_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), EmbeddedOptions::default());
    for i in 0..3 {
        store
            .register_node(None, format!("127.0.0.1:{}", 7000 + i), String::new())
            .await
            .unwrap();
    }
    let bad = crate::Replication {
        factor: 2,
        min_in_sync: 3,
    };
    assert!(matches!(
        store.bootstrap_if_empty_with(3, 2, bad).await,
        Err(MetaError::InvalidArgument(_))
    ));
    let rf2 = crate::Replication {
        factor: 2,
        min_in_sync: 2,
    };
    assert!(store.bootstrap_if_empty_with(3, 2, rf2).await.unwrap());
    let map = store.get_map().await.unwrap();
    let ks = &map.keyspaces[&keyway_map::DEFAULT_KEYSPACE];
    assert_eq!((ks.replication_factor, ks.min_in_sync), (2, 2));
    assert_eq!(map.partitions.len(), 6);
    let mut replicas_per_node = std::collections::BTreeMap::new();
    for p in map.partitions.values() {
        assert_eq!(p.replicas.len(), 1, "{p:?}");
        assert_ne!(p.replicas[0], p.owner, "two copies on one node: {p:?}");
        assert_eq!(p.in_sync, p.replicas, "bootstrap copies start in sync");
        *replicas_per_node.entry(p.replicas[0]).or_insert(0) += 1;
    }
    assert_eq!(
        replicas_per_node.values().copied().collect::<Vec<_>>(),
        [2, 2, 2],
        "replicas spread like primaries"
    );
    // Reopened, the settings are still there.
    drop(store);
    let store = open(dir.path(), EmbeddedOptions::default());
    let again = store.get_map().await.unwrap();
    assert_eq!(
        again.keyspaces[&keyway_map::DEFAULT_KEYSPACE].min_in_sync,
        2
    );
    assert_eq!(again.partitions, map.partitions);
}

#[tokio::test]
async fn zones_carried_by_registration_spread_the_bootstrap_copies() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), EmbeddedOptions::default());
    for (i, zone) in ["a", "a", "b", "b"].into_iter().enumerate() {
        store
            .register_node_in_zone(
                None,
                format!("127.0.0.1:{}", 7000 + i),
                String::new(),
                Some(zone.into()),
            )
            .await
            .unwrap();
    }
    let rf2 = crate::Replication {
        factor: 2,
        min_in_sync: 1,
    };
    assert!(store.bootstrap_if_empty_with(4, 2, rf2).await.unwrap());
    let map = store.get_map().await.unwrap();
    for p in map.partitions.values() {
        let zone = |n: &NodeId| map.nodes[n].zone.clone();
        assert_ne!(zone(&p.owner), zone(&p.replicas[0]), "{p:?}");
    }
}
