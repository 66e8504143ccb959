//! Watches and `changes_since`: every version delivered once and in order,
//! resuming from a version, and falling back to the full map.

use keyway_map::{MapChange, MapVersion, NodeId, PartitionRecord};

use super::{Fixture, bootstrapped, first_partition, flip, next_update, other_node, register};
use crate::MapUpdate;

/// Commits from concurrent writers reach every watcher as consecutive
/// versions, none skipped or repeated, and replaying them rebuilds the map.
pub async fn watch_delivers_every_version_in_order(f: &Fixture) {
    const PER_WRITER: usize = 20;
    let store = f.store.clone();
    let start = bootstrapped(&*store, 2, 4).await;
    let mut watches = vec![
        store.watch(start.version).await.unwrap(),
        store.watch(start.version).await.unwrap(),
    ];
    // Two writers on disjoint partitions, so their commits interleave.
    let parts: Vec<PartitionRecord> = start.partitions.values().cloned().collect();
    let writers: Vec<_> = [0usize, 1]
        .into_iter()
        .map(|w| {
            let store = store.clone();
            let nodes: Vec<NodeId> = start.nodes.keys().copied().collect();
            let mut mine: Vec<PartitionRecord> = parts.iter().skip(w).step_by(2).cloned().collect();
            tokio::spawn(async move {
                for i in 0..PER_WRITER {
                    let k = i % mine.len();
                    let to = nodes[(i + w) % nodes.len()];
                    let txn = flip(&mine[k], to);
                    store.commit(txn.clone()).await.unwrap();
                    if let MapChange::UpsertPartition(next) = &txn.changes[0] {
                        mine[k] = next.clone();
                    }
                }
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    let last = MapVersion(start.version.0 + 2 * PER_WRITER as u64);
    let target = store.get_map().await.unwrap();
    assert_eq!(target.version, last);
    for watch in &mut watches {
        let mut map = start.clone();
        let mut seen = Vec::new();
        while map.version < last {
            match next_update(watch).await.unwrap() {
                MapUpdate::Delta(entries) => {
                    assert!(!entries.is_empty(), "a watch never sends an empty delta");
                    for (v, changes) in entries {
                        seen.push(v);
                        map.apply(v, &changes).unwrap();
                    }
                }
                MapUpdate::Full(_) => panic!("a watcher that keeps up must get deltas only"),
            }
        }
        let want: Vec<MapVersion> = (start.version.0 + 1..=last.0).map(MapVersion).collect();
        assert_eq!(seen, want, "every version once, in order");
        map.validate().unwrap();
        assert_eq!(map, target);
    }
}

/// A watch from an older version first delivers what is already newer,
/// then continues live; a watch from the current version waits for the
/// next commit.
pub async fn watch_resumes_from_a_version(f: &Fixture) {
    let store = &*f.store;
    let start = bootstrapped(store, 2, 2).await;
    let p = first_partition(&start);
    let mut cur = p.clone();
    let mut snapshot = None;
    for i in 0..10 {
        let to = other_node(&start, cur.owner);
        let txn = flip(&cur, to);
        store.commit(txn.clone()).await.unwrap();
        if let MapChange::UpsertPartition(next) = &txn.changes[0] {
            cur = next.clone();
        }
        if i == 4 {
            snapshot = Some(store.get_map().await.unwrap());
        }
    }
    let mut map = snapshot.unwrap();
    let now = store.get_map().await.unwrap();
    assert_eq!(now.version.0, map.version.0 + 5);

    let mut watch = store.watch(map.version).await.unwrap();
    let mut seen = Vec::new();
    while map.version < now.version {
        let update = next_update(&mut watch).await.unwrap();
        if let MapUpdate::Delta(entries) = &update {
            seen.extend(entries.iter().map(|(v, _)| *v));
        }
        update.apply_to(&mut map).unwrap();
    }
    assert_eq!(map, now);
    if !seen.is_empty() {
        let want: Vec<_> = (now.version.0 - 4..=now.version.0)
            .map(MapVersion)
            .collect();
        assert_eq!(seen, want, "backlog delivered in order, nothing skipped");
    }

    let mut fresh = store.watch(now.version).await.unwrap();
    let to = other_node(&start, cur.owner);
    let v = store.commit(flip(&cur, to)).await.unwrap();
    for w in [&mut watch, &mut fresh] {
        let update = next_update(w).await.unwrap();
        let MapUpdate::Delta(entries) = &update else {
            panic!("expected a delta, got {update:?}");
        };
        assert_eq!(entries.len(), 1);
        assert_eq!(
            entries[0].0, v,
            "a watch from the current version starts at the next one"
        );
    }
}

/// `changes_since` gives deltas while the history reaches back far enough,
/// the whole map once it does not (or for a version from the future).
pub async fn changes_since_returns_full_when_history_is_too_short(f: &Fixture) {
    let store = &*f.store;
    let id = register(store, 1).await[0];
    let rounds = f.history_versions + 3;
    for i in 0..rounds {
        store
            .register_node(Some(id), format!("h:{i}"), "a:1".into())
            .await
            .unwrap();
    }
    let map = store.get_map().await.unwrap();
    assert_eq!(map.version.0, 1 + rounds as u64);
    assert_eq!(
        store.changes_since(MapVersion(0)).await.unwrap(),
        MapUpdate::Full(map.clone())
    );
    let recent = store
        .changes_since(MapVersion(map.version.0 - 2))
        .await
        .unwrap();
    let MapUpdate::Delta(entries) = &recent else {
        panic!("recent versions must come as a delta, got {recent:?}");
    };
    let versions: Vec<_> = entries.iter().map(|(v, _)| v.0).collect();
    assert_eq!(versions, vec![map.version.0 - 1, map.version.0]);
    let mut rebuilt = store.changes_since(MapVersion(0)).await.unwrap();
    if let MapUpdate::Full(m) = &mut rebuilt {
        assert_eq!(*m, map);
    }
    assert_eq!(
        store.changes_since(map.version).await.unwrap(),
        MapUpdate::Delta(vec![])
    );
    assert_eq!(
        store
            .changes_since(MapVersion(map.version.0 + 5))
            .await
            .unwrap(),
        MapUpdate::Full(map)
    );
}
