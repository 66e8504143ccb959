//! Splits: the planned transaction, the split points, the policy (pure),
//! and splits and merges against a real embedded metadata store.

use super::testing::*;
use super::*;
use crate::merge::merge_partitions;
use crate::stats::HotKey;
use bytes::Bytes;
use keyway_map::{
    Epoch, MapChange, MapVersion, NodeId, OwnershipCondition, PartitionId, PartitionMap, slot_bound,
};
use keyway_meta::MetaStore;
use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

fn pid(n: u64) -> PartitionId {
    PartitionId(n)
}

fn bound(slot: u16) -> Bytes {
    Bytes::copy_from_slice(&slot_bound(slot))
}

/// The map after committing `plan` (as the store would).
fn applied(map: &PartitionMap, plan: &SplitPlan) -> PartitionMap {
    let mut next = map.clone();
    next.apply(MapVersion(map.version.0 + 1), &plan.txn.changes)
        .unwrap();
    next.validate().unwrap();
    next
}

// ---- Plan (pure). ----

#[test]
fn split_txn_removes_the_parent_and_adds_two_fresh_children_one_epoch_up() {
    let map = hash_map(2, 2);
    let parent = map.partitions[&pid(1)].clone();
    assert_eq!(parent.slot_span(), (0, 4095));
    let plan = plan_split(&map, pid(1), &SplitAt::Slot(1000), None).unwrap();
    let (l, r) = (&plan.left, &plan.right);
    assert_eq!((l.id, r.id), (pid(5), pid(6)), "ids from next_partition_id");
    assert_eq!((l.epoch, r.epoch), (Epoch(2), Epoch(2)));
    assert_eq!((l.owner, r.owner), (parent.owner, parent.owner));
    assert_eq!((&l.start, &l.end), (&parent.start, &Some(bound(1000))));
    assert_eq!((&r.start, &r.end), (&bound(1000), &parent.end));
    assert_eq!(
        plan.txn.conditions,
        vec![
            OwnershipCondition {
                partition: pid(1),
                expected: Some((parent.owner, Epoch(1))),
            },
            OwnershipCondition {
                partition: pid(5),
                expected: None,
            },
            OwnershipCondition {
                partition: pid(6),
                expected: None,
            },
        ]
    );
    assert_eq!(
        plan.txn.changes,
        vec![
            MapChange::RemovePartition { id: pid(1) },
            MapChange::UpsertPartition(l.clone()),
            MapChange::UpsertPartition(r.clone()),
            MapChange::ReservePartitionIds { next: pid(7) },
        ]
    );
    let next = applied(&map, &plan);
    assert_eq!(next.next_partition_id, pid(7));
    assert_eq!(next.locate_slot(DEFAULT, 999).unwrap().id, pid(5));
    assert_eq!(next.locate_slot(DEFAULT, 1000).unwrap().id, pid(6));
    assert!(!next.partitions.contains_key(&pid(1)));
}

const DEFAULT: keyway_map::KeyspaceId = keyway_map::DEFAULT_KEYSPACE;

#[test]
fn split_children_inherit_the_owner_replicas_and_in_sync_set() {
    let nodes: Vec<_> = (1..=3).map(node).collect();
    let mut map = PartitionMap::bootstrap_replicated(&nodes, 1, 3).unwrap();
    map.partitions.get_mut(&pid(1)).unwrap().in_sync = vec![NodeId(3)];
    let parent = map.partitions[&pid(1)].clone();
    let plan = plan_split(&map, pid(1), &SplitAt::Auto, None).unwrap();
    for child in [&plan.left, &plan.right] {
        assert_eq!(child.owner, parent.owner);
        assert_eq!(child.replicas, parent.replicas);
        assert_eq!(child.in_sync, [NodeId(3)]);
    }
    applied(&map, &plan);
}

#[test]
fn hash_split_points_are_slot_boundaries_strictly_inside() {
    let map = hash_map(2, 2);
    let ks = &map.keyspaces[&DEFAULT];
    let p3 = &map.partitions[&pid(3)]; // slots 8192-12287
    let at = |a: SplitAt| resolve_split_point(ks, p3, &a, None);
    // A key resolves to its slot ("foo" is slot 12182).
    assert_eq!(
        at(SplitAt::Key(Bytes::from_static(b"foo"))),
        Ok(bound(12182))
    );
    assert_eq!(
        at(SplitAt::Key(Bytes::from_static(b"{foo}.x"))),
        Ok(bound(12182))
    );
    assert_eq!(at(SplitAt::Slot(8193)), Ok(bound(8193)));
    assert_eq!(at(SplitAt::Slot(12287)), Ok(bound(12287)));
    assert_eq!(at(SplitAt::Auto), Ok(bound(10240)), "the median slot");
    assert_eq!(at(SplitAt::Bound(bound(9000))), Ok(bound(9000)));
    // The first slot would leave an empty left child; outside is outside.
    for slot in [8192, 12288, 100, 16383, 20000] {
        assert!(
            matches!(at(SplitAt::Slot(slot)), Err(SplitError::NotInside { .. })),
            "slot {slot}"
        );
    }
    // A routing key that is not a slot boundary is refused, never rounded.
    for b in [routing_key(9000, "k"), Bytes::from_static(&[0x23])] {
        assert!(matches!(
            at(SplitAt::Bound(b)),
            Err(SplitError::Unaligned { .. })
        ));
    }
    // Rounding a node's reported key: its slot, or the next when that is first.
    assert_eq!(hash_split_slot(p3, &routing_key(9000, "k")), Some(9000));
    assert_eq!(hash_split_slot(p3, &routing_key(8192, "k")), Some(8193));
    assert_eq!(hash_split_slot(p3, &routing_key(100, "k")), None);
}

#[test]
fn a_single_slot_partition_never_splits() {
    let map = hash_map(2, 2);
    let plan = plan_split(&map, pid(1), &SplitAt::Slot(1), None).unwrap();
    let map = applied(&map, &plan);
    let one = &map.partitions[&plan.left.id];
    assert_eq!(one.slot_span(), (0, 0));
    for at in [
        SplitAt::Auto,
        SplitAt::Slot(0),
        SplitAt::Slot(1),
        SplitAt::Key(Bytes::from_static(b"x")),
    ] {
        assert_eq!(
            plan_split(&map, one.id, &at, None),
            Err(SplitError::SingleSlot {
                partition: one.id,
                slot: 0
            })
        );
    }
    assert_eq!(hash_split_slot(one, &routing_key(0, "k")), None);
}

#[test]
fn range_split_points_are_keys_strictly_inside() {
    let base = hash_map(1, 1);
    let map = with_range_keyspace(&base, &["m"], NodeId(1));
    let first = map.keyspace_partitions(RANGE_KS).next().unwrap().clone();
    assert_eq!(first.end.as_deref(), Some(&b"m"[..]));
    let plan = |at: SplitAt, hint: Option<&[u8]>| plan_split(&map, first.id, &at, hint);
    let p = plan(SplitAt::Key(Bytes::from_static(b"c")), None).unwrap();
    assert_eq!(p.left.end.as_deref(), Some(&b"c"[..]));
    assert_eq!(&p.right.start[..], b"c");
    assert_eq!(p.right.end.as_deref(), Some(&b"m"[..]));
    for bad in [&b""[..], b"m", b"z"] {
        assert!(matches!(
            plan(SplitAt::Key(Bytes::copy_from_slice(bad)), None),
            Err(SplitError::NotInside { .. })
        ));
    }
    assert!(matches!(
        plan(SplitAt::Auto, None),
        Err(SplitError::NoSplitPoint { .. })
    ));
    let p = plan(SplitAt::Auto, Some(b"f")).unwrap();
    assert_eq!(&p.right.start[..], b"f");
    assert!(matches!(
        plan(SplitAt::Slot(3), None),
        Err(SplitError::NotHash { .. })
    ));
    assert_eq!(
        plan_split(&map, pid(99), &SplitAt::Auto, None),
        Err(SplitError::UnknownPartition(pid(99)))
    );
}

// ---- Policy (pure). ----

fn cfg() -> SplitConfig {
    SplitConfig {
        split_max_bytes: 1_000_000,
        split_max_requests_per_sec: 1_000.0,
        split_load_window_ms: 30_000,
        split_single_key_share: 0.5,
        split_cooldown_ms: 60_000,
        ..SplitConfig::default()
    }
}

fn decide(
    policy: &mut SplitPolicy,
    map: &PartitionMap,
    load: &crate::ClusterLoad,
    now: Instant,
) -> Vec<SplitVerdict> {
    policy.decide(&cfg(), map, load, &Busy::new(), &History::default(), now)
}

fn only(verdicts: &[SplitVerdict]) -> (&SplitAction, &'static str) {
    assert_eq!(verdicts.len(), 1, "{verdicts:?}");
    (&verdicts[0].action, verdicts[0].reason)
}

#[test]
fn a_big_partition_splits_at_its_size_key_rounded_to_a_slot() {
    let map = hash_map(2, 2);
    let p1 = &map.partitions[&pid(1)];
    let mut load = uniform_load(&map, 1_000, 1.0);
    let mut big = load_of(p1, 2_000_000, 1.0);
    big.size_split_key = Some(routing_key(2000, "user:17"));
    load.partitions.insert(p1.id, big.clone());
    let mut policy = SplitPolicy::default();
    let v = decide(&mut policy, &map, &load, Instant::now());
    assert_eq!(only(&v), (&SplitAction::Split(SplitAt::Slot(2000)), "size"));
    assert_eq!(v[0].expected, (p1.owner, p1.epoch));
    // At the threshold, not above: nothing.
    big.bytes = 1_000_000;
    load.partitions.insert(p1.id, big.clone());
    assert!(decide(&mut policy, &map, &load, Instant::now()).is_empty());
    // Big without a size key: held, with the reason.
    big.bytes = 2_000_000;
    big.size_split_key = None;
    load.partitions.insert(p1.id, big);
    let v = decide(&mut policy, &map, &load, Instant::now());
    assert_eq!(only(&v), (&SplitAction::Hold, "no_split_key"));
}

/// p1 hot at `rps` with an even split key in slot 3000.
fn hot_load(map: &PartitionMap, rps: f64) -> crate::ClusterLoad {
    let mut load = uniform_load(map, 1_000, 1.0);
    let p1 = &map.partitions[&pid(1)];
    let mut hot = load_of(p1, 1_000, rps);
    hot.load_split_key = Some(routing_key(3000, "k"));
    load.partitions.insert(p1.id, hot);
    load
}

#[test]
fn a_hot_partition_splits_only_after_the_whole_window() {
    let map = hash_map(2, 2);
    let t0 = Instant::now();
    let at = |s: u64| t0 + Duration::from_secs(s);
    let mut policy = SplitPolicy::default();
    for s in [0, 10, 29] {
        let v = decide(&mut policy, &map, &hot_load(&map, 5_000.0), at(s));
        assert_eq!(only(&v), (&SplitAction::Hold, "warming"), "at {s}s");
    }
    let v = decide(&mut policy, &map, &hot_load(&map, 5_000.0), at(30));
    assert_eq!(only(&v), (&SplitAction::Split(SplitAt::Slot(3000)), "load"));

    // A snapshot below the threshold restarts the window; so does a
    // missing report.
    let mut policy = SplitPolicy::default();
    decide(&mut policy, &map, &hot_load(&map, 5_000.0), at(0));
    assert!(decide(&mut policy, &map, &hot_load(&map, 900.0), at(10)).is_empty());
    decide(&mut policy, &map, &hot_load(&map, 5_000.0), at(20));
    let v = decide(&mut policy, &map, &hot_load(&map, 5_000.0), at(45));
    assert_eq!(only(&v), (&SplitAction::Hold, "warming"));
    decide(&mut policy, &map, &uniform_load(&map, 1, 1.0), at(50));
    let mut gone = hot_load(&map, 5_000.0);
    gone.partitions.remove(&pid(1));
    decide(&mut policy, &map, &gone, at(51));
    let v = decide(&mut policy, &map, &hot_load(&map, 5_000.0), at(60));
    assert_eq!(only(&v), (&SplitAction::Hold, "warming"));
    let v = decide(&mut policy, &map, &hot_load(&map, 5_000.0), at(90));
    assert_eq!(only(&v).1, "load");
    assert!(policy.hot().contains(&pid(1)));
}

#[test]
fn one_dominant_key_is_never_split_and_says_so() {
    let map = hash_map(2, 2);
    let t0 = Instant::now();
    let mut load = hot_load(&map, 5_000.0);
    let hot = load.partitions.get_mut(&pid(1)).unwrap();
    hot.top_key_share = 0.8;
    hot.hot_keys = vec![HotKey {
        key: Bytes::from_static(b"celebrity"),
        per_sec: 4_000.0,
    }];
    let mut policy = SplitPolicy::default();
    decide(&mut policy, &map, &load, t0);
    let v = decide(&mut policy, &map, &load, t0 + Duration::from_secs(31));
    assert_eq!(only(&v), (&SplitAction::Hold, "single_key"));
    assert!(v[0].detail.contains("celebrity"), "{}", v[0].detail);
    // Not dominant but no key reported (too few samples): no split either.
    let hot = load.partitions.get_mut(&pid(1)).unwrap();
    hot.top_key_share = 0.3;
    hot.load_split_key = None;
    let v = decide(&mut policy, &map, &load, t0 + Duration::from_secs(32));
    assert_eq!(only(&v), (&SplitAction::Hold, "no_split_key"));
}

#[test]
fn migrating_cooling_and_stale_partitions_are_left_alone() {
    let map = hash_map(2, 2);
    let now = Instant::now();
    let mut load = uniform_load(&map, 2_000_000, 1.0);
    for l in load.partitions.values_mut() {
        l.size_split_key = Some(routing_key((l.partition.0 as u16 - 1) * 4096 + 7, "k"));
    }
    let busy: Busy = HashMap::from([(
        pid(1),
        (
            keyway_migration::MigrationId(4),
            keyway_migration::MigrationState::Copying,
        ),
    )]);
    let mut history = History::default();
    history.observe(&map, now);
    history.born(pid(2), Birth::Split, now - Duration::from_secs(59));
    history.born(pid(3), Birth::Merge, now - Duration::from_secs(61));
    load.partitions.get_mut(&pid(4)).unwrap().epoch = Epoch(7);
    let v = SplitPolicy::default().decide(&cfg(), &map, &load, &busy, &history, now);
    let reasons: Vec<_> = v.iter().map(|v| (v.partition.0, v.reason)).collect();
    assert_eq!(
        reasons,
        [(1, "migrating"), (2, "cooldown"), (3, "size")],
        "p4's report is at another epoch: ignored"
    );
}

#[test]
fn history_tells_splits_from_merges() {
    let map = hash_map(2, 2);
    let t0 = Instant::now();
    let mut h = History::default();
    h.observe(&map, t0);
    let split = plan_split(&map, pid(1), &SplitAt::Auto, None).unwrap();
    let map2 = applied(&map, &split);
    h.observe(&map2, t0);
    let win = Duration::from_secs(10);
    assert_eq!(h.born_within(pid(5), win, t0), Some(Birth::Split));
    assert_eq!(h.born_within(pid(6), win, t0), Some(Birth::Split));
    assert_eq!(h.born_within(pid(2), win, t0), None);
    assert_eq!(h.born_within(pid(5), win, t0 + win), None, "window over");
    let merge = crate::merge::plan_merge(&map2, pid(6), pid(2)).unwrap();
    let mut map3 = map2.clone();
    map3.apply(MapVersion(map2.version.0 + 1), &merge.txn.changes)
        .unwrap();
    h.observe(&map3, t0);
    assert_eq!(h.born_within(pid(7), win, t0), Some(Birth::Merge));
}

#[test]
fn config_validation_names_the_bad_setting() {
    assert_eq!(SplitConfig::default().validate(), Ok(()));
    let bad = |f: fn(&mut SplitConfig)| {
        let mut c = SplitConfig::default();
        f(&mut c);
        c.validate().unwrap_err()
    };
    assert!(bad(|c| c.split_max_bytes = 0).contains("split_max_bytes"));
    assert!(bad(|c| c.split_max_requests_per_sec = f64::NAN).contains("requests"));
    assert!(bad(|c| c.split_load_window_ms = 0).contains("window"));
    assert!(bad(|c| c.split_single_key_share = 1.5).contains("share"));
}

// ---- Against a real embedded store. ----

#[tokio::test]
async fn split_then_merge_round_trip_keeps_the_map_valid_and_never_reuses() {
    let (meta, _dir) = store(2, 2).await;
    let before = meta.get_map().await.unwrap();
    let p1 = before.partitions[&pid(1)].clone();
    let mut seen: BTreeSet<PartitionId> = before.partitions.keys().copied().collect();
    let mut version = before.version;
    let mut check = |map: &PartitionMap, new: &[PartitionId], min_epoch: Epoch| {
        map.validate().unwrap();
        assert!(map.version > version);
        version = map.version;
        for id in new {
            assert!(seen.insert(*id), "partition id {id} reused");
            assert!(*id > *seen.iter().filter(|s| !new.contains(s)).max().unwrap());
            let epoch = map.partitions[id].epoch;
            assert!(epoch >= min_epoch);
        }
    };
    let (a, b) = split_partition(&*meta, pid(1), SplitAt::Auto)
        .await
        .unwrap();
    check(&meta.get_map().await.unwrap(), &[a.id, b.id], Epoch(2));
    let (c, d) = split_partition(&*meta, b.id, SplitAt::Slot(3000))
        .await
        .unwrap();
    assert_eq!(c.epoch, Epoch(3));
    check(&meta.get_map().await.unwrap(), &[c.id, d.id], Epoch(3));
    let cd = merge_partitions(&*meta, d.id, c.id).await.unwrap();
    assert_eq!(cd.epoch, Epoch(4));
    assert_eq!((&cd.start, &cd.end), (&b.start, &b.end));
    check(&meta.get_map().await.unwrap(), &[cd.id], Epoch(4));
    let whole = merge_partitions(&*meta, a.id, cd.id).await.unwrap();
    assert_eq!(whole.epoch, Epoch(5), "max of both epochs + 1");
    assert_eq!(
        (&whole.start, &whole.end, whole.owner),
        (&p1.start, &p1.end, p1.owner)
    );
    let after = meta.get_map().await.unwrap();
    check(&after, &[whole.id], Epoch(5));
    assert_eq!(after.partitions.len(), before.partitions.len());
    assert!(after.next_partition_id > whole.id);
}

#[tokio::test]
async fn a_concurrent_change_makes_the_split_lose_cleanly() {
    let (meta, _dir) = store(2, 2).await;
    let map = meta.get_map().await.unwrap();
    let stale = plan_split(&map, pid(2), &SplitAt::Auto, None).unwrap();
    // Someone else splits p2 first (another manager, an operator).
    split_partition(&*meta, pid(2), SplitAt::Slot(5000))
        .await
        .unwrap();
    let after = meta.get_map().await.unwrap();
    assert!(matches!(
        meta.commit(stale.txn).await,
        Err(keyway_meta::MetaError::Conflict { partition, current: None }) if partition == pid(2)
    ));
    assert_eq!(meta.get_map().await.unwrap(), after, "nothing changed");
    // Decided on an epoch that is gone: Lost, nothing changed.
    let p3 = &map.partitions[&pid(3)];
    let moved = keyway_map::PartitionRecord {
        epoch: Epoch(2),
        ..p3.clone()
    };
    meta.commit(keyway_meta::MapTxn::unconditional(vec![
        MapChange::UpsertPartition(moved),
    ]))
    .await
    .unwrap();
    let request = SplitRequest {
        partition: pid(3),
        at: SplitAt::Auto,
        expected: Some((p3.owner, p3.epoch)),
        size_hint: None,
    };
    assert_eq!(
        split_checked(&*meta, &request).await,
        Err(SplitError::Lost {
            partition: pid(3),
            current: Some((p3.owner, Epoch(2)))
        })
    );
    // Two splits racing for the same fresh ids: both land, on distinct ids.
    let (x, y) = tokio::join!(
        split_partition(&*meta, pid(1), SplitAt::Auto),
        split_partition(&*meta, pid(4), SplitAt::Auto),
    );
    let (x, y) = (x.unwrap(), y.unwrap());
    let ids: BTreeSet<_> = [x.0.id, x.1.id, y.0.id, y.1.id].into();
    assert_eq!(ids.len(), 4);
    meta.get_map().await.unwrap().validate().unwrap();
}

#[tokio::test]
async fn a_partition_in_a_migration_is_neither_split_nor_merged() {
    let (meta, _dir) = store(2, 2).await;
    let rec = crate::request_move(&*meta, pid(1), NodeId(2))
        .await
        .unwrap();
    let err = split_partition(&*meta, pid(1), SplitAt::Auto)
        .await
        .unwrap_err();
    assert!(
        matches!(err, SplitError::Migrating { partition, migration, .. } if partition == pid(1) && migration == rec.id),
        "{err}"
    );
    assert_eq!(err.reason(), "migrating");
    let err = merge_partitions(&*meta, pid(1), pid(2)).await.unwrap_err();
    assert!(matches!(err, crate::MergeError::Migrating { .. }), "{err}");
    // Its neighbour splits fine.
    split_partition(&*meta, pid(2), SplitAt::Auto)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_split_asks_a_migration_requested_under_it_to_abort() {
    let (meta, _dir) = store(2, 2).await;
    let map = meta.get_map().await.unwrap();
    // The race: the move is requested after the split checked for one.
    let plan = plan_split(&map, pid(1), &SplitAt::Auto, None).unwrap();
    let rec = crate::request_move(&*meta, pid(1), NodeId(2))
        .await
        .unwrap();
    meta.commit(plan.txn).await.unwrap();
    abort_raced(&*meta, &[pid(1)]).await;
    let stored = meta.get_migration(rec.id.0).await.unwrap().unwrap();
    let rec = crate::driver::load(&stored).unwrap();
    assert_eq!(rec.state, keyway_migration::MigrationState::Aborted);
    assert!(live_migrations(&*meta).await.unwrap().is_empty());
}
