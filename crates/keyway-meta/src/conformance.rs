//! The conformance suite: generic async tests every [`MetaStore`] backend
//! must pass (embedded, remote over a real port, and later etcd).
//!
//! A backend's integration test provides an async fixture returning a
//! [`Fixture`] (a fresh, empty store plus whatever keeps it alive) and
//! instantiates every test with [`crate::meta_conformance_tests!`]. Restart
//! behaviour is backend-specific to set up; [`survives_restart`] takes a
//! function that (re)opens the same store.
//!
//! No test sleeps in place of a condition: waits are polls with a deadline
//! ([`eventually`]) or stream reads with a deadline ([`next_update`]).

use crate::{LeaseId, MapTxn, MapUpdate, MapWatch, MetaError, MetaStore};
use futures::StreamExt;
use keyway_map::{
    Epoch, MapChange, MapError, MapVersion, NodeId, NodeState, OwnershipCondition, PartitionId,
    PartitionMap, PartitionRecord, slot_bound,
};
use std::any::Any;
use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// How long any single wait in the suite may take before the test fails.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// A fresh, empty store for one test.
pub struct Fixture {
    pub store: Arc<dyn MetaStore>,
    /// How many versions of history the store was configured to retain.
    pub history_versions: usize,
    /// Whatever must live as long as the store (temp dir, server task...).
    pub keep: Box<dyn Any + Send>,
}

/// Instantiates every conformance test as a `#[tokio::test]` in a module
/// `meta_conformance`, each with a fixture from `$fixture` (an expression
/// evaluating to a `Future<Output = Fixture>`, evaluated once per test).
#[macro_export]
macro_rules! meta_conformance_tests {
    ($fixture:expr) => {
        mod meta_conformance {
            #[allow(unused_imports)]
            use super::*;

            macro_rules! one {
                ($name:ident) => {
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $name() {
                        let fixture = $fixture.await;
                        $crate::conformance::$name(&fixture).await;
                    }
                };
            }

            one!(starts_empty);
            one!(register_node_allocates_distinct_ids_and_reregistration_keeps_them);
            one!(commit_applies_changes_as_the_next_version);
            one!(cas_race_has_exactly_one_winner);
            one!(conflict_carries_what_is_there_now);
            one!(commit_is_refused_when_the_resulting_map_is_invalid);
            one!(watch_delivers_every_version_in_order);
            one!(watch_resumes_from_a_version);
            one!(changes_since_returns_full_when_history_is_too_short);
            one!(lease_lifecycle);
            one!(lease_expires_without_keep_alive);
            one!(bootstrap_if_empty_is_idempotent_and_has_one_winner);
        }
    };
}

/// Polls `probe` until it returns `Some`, failing the test after `within`.
pub async fn eventually<T, F, Fut>(what: &str, within: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {within:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The next item of a watch, failing the test if none comes within [`DEADLINE`].
pub async fn next_update(watch: &mut MapWatch) -> Result<MapUpdate, MetaError> {
    tokio::time::timeout(DEADLINE, watch.next())
        .await
        .expect("no watch update within the deadline")
        .expect("watch stream ended without an error item")
}

/// Registers `n` nodes, returning their ids in registration order.
pub async fn register(store: &dyn MetaStore, n: usize) -> Vec<NodeId> {
    let mut ids = Vec::new();
    for i in 0..n {
        let id = store
            .register_node(
                None,
                format!("127.0.0.1:{}", 7000 + i),
                format!("127.0.0.1:{}", 9000 + i),
            )
            .await
            .expect("register_node");
        ids.push(id);
    }
    ids
}

/// Registers `nodes` nodes and bootstraps `per_node` partitions each.
pub async fn bootstrapped(store: &dyn MetaStore, nodes: usize, per_node: u16) -> PartitionMap {
    register(store, nodes).await;
    assert!(
        store
            .bootstrap_if_empty(nodes, per_node)
            .await
            .expect("bootstrap"),
        "a fresh store must bootstrap"
    );
    store.get_map().await.expect("get_map")
}

/// Moves `p` to `to` at epoch+1, conditional on its current (owner, epoch):
/// the shape of a migration's flip.
pub fn flip(p: &PartitionRecord, to: NodeId) -> MapTxn {
    let mut next = p.clone();
    next.owner = to;
    next.epoch = Epoch(p.epoch.0 + 1);
    MapTxn {
        conditions: vec![OwnershipCondition {
            partition: p.id,
            expected: Some((p.owner, p.epoch)),
        }],
        changes: vec![MapChange::UpsertPartition(next)],
    }
}

/// Another node than `owner` among `map`'s nodes.
fn other_node(map: &PartitionMap, owner: NodeId) -> NodeId {
    *map.nodes
        .keys()
        .find(|n| **n != owner)
        .expect("a second node")
}

fn first_partition(map: &PartitionMap) -> PartitionRecord {
    map.keyspace_partitions(keyway_map::DEFAULT_KEYSPACE)
        .next()
        .expect("a partition")
        .clone()
}

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
/// the id, updates addresses, marks the node Up and bumps the version; ids
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

    // Mark node 3 down, then re-register it with new addresses.
    let mut down = map.nodes[&NodeId(3)].clone();
    down.state = NodeState::Down;
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
