//! The etcd backend against real etcd processes (from `keyway-testkit`):
//! the whole conformance suite on one shared single-member etcd (every test
//! under its own key prefix), restart durability, watch compaction, large
//! transactions, prefix isolation, lease TTL rounding, and a three-member
//! cluster losing and regaining members.
//!
//! Needs `etcd` on PATH: these tests FAIL (not skip) without it, saying to
//! run scripts/setup.sh.

use futures::StreamExt;
use keyway_map::{MapChange, MapVersion, NodeId, PartitionRecord};
use keyway_meta::conformance::{self, DEADLINE, Fixture, eventually, next_update};
use keyway_meta::{
    EtcdMeta, EtcdOptions, LeaseId, MapTxn, MapUpdate, MetaError, MetaStore, connect,
};
use keyway_testkit::EtcdCluster;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::time::Instant;

/// History kept small so the "history too short" case is cheap to reach.
const HISTORY: usize = 16;

fn options() -> EtcdOptions {
    EtcdOptions {
        history_versions: HISTORY,
        ..EtcdOptions::default()
    }
}

fn start_etcd(members: usize) -> EtcdCluster {
    EtcdCluster::start(members)
        .unwrap_or_else(|e| panic!("cannot start a real etcd for the etcd backend tests: {e}"))
}

/// One single-member etcd for every test of this binary that does not
/// disturb it (no compaction, no restarts). Its tether removes it when the
/// binary exits.
fn shared_etcd() -> &'static EtcdCluster {
    static ETCD: OnceLock<EtcdCluster> = OnceLock::new();
    ETCD.get_or_init(|| start_etcd(1))
}

/// A key prefix no other test of this run uses.
fn unique_prefix(what: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!(
        "/keyway-test/{}-{}/{what}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

async fn store_on(etcd: &EtcdCluster, what: &str, opts: EtcdOptions) -> EtcdMeta {
    EtcdMeta::connect_with(&etcd.url(&unique_prefix(what)), opts)
        .await
        .unwrap()
}

async fn fixture() -> Fixture {
    let store = store_on(shared_etcd(), "conformance", options()).await;
    Fixture {
        store: Arc::new(store),
        history_versions: HISTORY,
        keep: Box::new(()),
    }
}

keyway_meta::meta_conformance_tests!(crate::fixture());

/// A raw etcd client, for what Keyway never does itself (compaction, moving
/// the leader).
async fn raw_client(endpoint: &str) -> etcd_client::Client {
    etcd_client::Client::connect([endpoint], None)
        .await
        .unwrap()
}

/// Moves `p` to another node, conditional on its current owner and epoch.
fn flip_away(map: &keyway_map::PartitionMap, p: &PartitionRecord) -> (MapTxn, PartitionRecord) {
    let to = *map.nodes.keys().find(|n| **n != p.owner).unwrap();
    let txn = conformance::flip(p, to);
    let MapChange::UpsertPartition(next) = &txn.changes[0] else {
        unreachable!()
    };
    let next = next.clone();
    (txn, next)
}

/// Drop the store and restart etcd itself between opens: map, history,
/// counters and leases survive (restored leases get their TTL again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survives_restart_of_etcd() {
    let etcd = Arc::new(Mutex::new(start_etcd(1)));
    let url = etcd.lock().unwrap().url(&unique_prefix("restart"));
    let opens = Arc::new(AtomicUsize::new(0));
    conformance::survives_restart(|| {
        let (etcd, url, opens) = (etcd.clone(), url.clone(), opens.clone());
        async move {
            if opens.fetch_add(1, Ordering::SeqCst) > 0 {
                tokio::task::spawn_blocking(move || {
                    let mut etcd = etcd.lock().unwrap();
                    etcd.restart_member(0).unwrap();
                    etcd.wait_healthy().unwrap();
                })
                .await
                .unwrap();
            }
            let store: Arc<dyn MetaStore> =
                Arc::new(EtcdMeta::connect_with(&url, options()).await.unwrap());
            store
        }
    })
    .await;
}

/// A watch whose resume revision etcd has compacted gets the whole map
/// (nothing lost), then deltas again; a watch that keeps up is not
/// disturbed by the compaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compacted_watch_falls_back_to_the_full_map_then_continues() {
    // Its own etcd: compaction would disturb other tests' watches.
    let etcd = start_etcd(1);
    let store = store_on(&etcd, "compaction", options()).await;
    let start = conformance::bootstrapped(&store, 2, 2).await;
    let mut p = start.partitions.values().next().unwrap().clone();

    // `lagging` is created now but opens its etcd watch only when first
    // polled, after the compaction; `live` is polled (so watching) first.
    let mut lagging = store.watch(start.version).await.unwrap();
    let mut live = store.watch(start.version).await.unwrap();
    let mut live_map = start.clone();
    for _ in 0..5 {
        let (txn, next) = flip_away(&start, &p);
        store.commit(txn).await.unwrap();
        p = next;
        let update = next_update(&mut live).await.unwrap();
        assert!(matches!(update, MapUpdate::Delta(_)), "{update:?}");
        update.apply_to(&mut live_map).unwrap();
    }
    let mut raw = raw_client(&etcd.endpoints()[0]).await;
    let rev = raw
        .get("/", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    raw.compact(
        rev,
        Some(etcd_client::CompactionOptions::new().with_physical()),
    )
    .await
    .unwrap();

    let now = store.get_map().await.unwrap();
    let first = next_update(&mut lagging).await.unwrap();
    let MapUpdate::Full(full) = &first else {
        panic!("a watch resuming before the compaction must get the whole map, got {first:?}");
    };
    assert_eq!(*full, now, "the whole map, as of now: no change lost");
    let mut lagging_map = start.clone();
    first.apply_to(&mut lagging_map).unwrap();

    // Both continue with deltas, version by version.
    for _ in 0..3 {
        let (txn, next) = flip_away(&start, &p);
        let v = store.commit(txn).await.unwrap();
        p = next;
        for (w, map) in [(&mut lagging, &mut lagging_map), (&mut live, &mut live_map)] {
            let update = next_update(w).await.unwrap();
            assert_eq!(update.version(), Some(v));
            assert!(
                matches!(&update, MapUpdate::Delta(d) if d.len() == 1),
                "{update:?}"
            );
            update.apply_to(map).unwrap();
        }
    }
    let end = store.get_map().await.unwrap();
    assert_eq!(lagging_map, end);
    assert_eq!(live_map, end);
    // A fresh watch from a version before the compaction: the history keys
    // themselves are still there, so it is served deltas.
    let mut fresh = store.watch(start.version).await.unwrap();
    let update = next_update(&mut fresh).await.unwrap();
    let mut map = start.clone();
    update.apply_to(&mut map).unwrap();
    assert_eq!(map, end);
}

/// A bootstrap of 150 partitions has more conditions and writes than etcd's
/// --max-txn-ops (128): still one transaction, one version, one delta; and
/// a tiny `max_txn_ops` nests writes several levels deep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_beyond_max_txn_ops_are_still_one_transaction() {
    let store = store_on(shared_etcd(), "big", options()).await;
    conformance::register(&store, 3).await;
    let mut watch = store.watch(MapVersion(3)).await.unwrap();
    assert!(store.bootstrap_if_empty(3, 50).await.unwrap());
    let map = store.get_map().await.unwrap();
    assert_eq!((map.version, map.partitions.len()), (MapVersion(4), 150));
    let update = next_update(&mut watch).await.unwrap();
    let MapUpdate::Delta(entries) = &update else {
        panic!("{update:?}")
    };
    assert_eq!(entries.len(), 1);
    assert_eq!(
        entries[0].1.len(),
        152,
        "keyspace, 150 partitions, id reservation"
    );

    // 150 conditional flips in one commit: the range compare path.
    let mut txn = MapTxn::default();
    for p in map.partitions.values() {
        let (one, _) = flip_away(&map, p);
        txn.conditions.extend(one.conditions);
        txn.changes.extend(one.changes);
    }
    let v = store.commit(txn.clone()).await.unwrap();
    assert_eq!(v, MapVersion(5));
    let after = store.get_map().await.unwrap();
    assert!(after.partitions.values().all(|p| p.epoch.0 == 2));
    assert!(matches!(
        store.commit(txn).await,
        Err(MetaError::Conflict { .. })
    ));

    let tiny = store_on(
        shared_etcd(),
        "tiny-txn",
        EtcdOptions {
            max_txn_ops: 8,
            ..options()
        },
    )
    .await;
    // 18 writes in levels of at most 8: two levels of nesting.
    let boot = conformance::bootstrapped(&tiny, 3, 5).await;
    assert_eq!(boot.partitions.len(), 15);
    let p = boot.partitions.values().next().unwrap().clone();
    let (txn, _) = flip_away(&boot, &p);
    tiny.commit(txn).await.unwrap();
}

/// Stores under different prefixes of one etcd share nothing, not even
/// leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefixes_isolate_stores() {
    let a = store_on(shared_etcd(), "iso-a", options()).await;
    let b = store_on(shared_etcd(), "iso-b", options()).await;
    assert_ne!(a.prefix(), b.prefix());
    let ids = conformance::register(&a, 2).await;
    let lease = a.grant_lease(ids[0], 30_000).await.unwrap();
    let empty = b.get_map().await.unwrap();
    assert_eq!(empty.version, MapVersion(0));
    assert!(empty.nodes.is_empty());
    assert_eq!(b.leases().await.unwrap(), vec![]);
    assert_eq!(
        b.keep_alive(lease).await,
        Err(MetaError::LeaseNotFound(lease))
    );
    assert_eq!(
        b.revoke_lease(lease).await,
        Err(MetaError::LeaseNotFound(lease))
    );
    assert_eq!(a.keep_alive(lease).await, Ok(30_000));
    assert_eq!(
        b.register_node(None, "x:1".into(), "x:2".into()).await,
        Ok(NodeId(1))
    );
    // The same prefix through `connect` is the same store.
    let again = connect(&shared_etcd().url(a.prefix())).await.unwrap();
    assert_eq!(again.get_map().await.unwrap(), a.get_map().await.unwrap());
}

/// TTLs are rounded up to whole seconds (etcd's unit); keep_alive returns
/// what etcd granted; `leases` reports an upper bound of what remains.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_ttls_round_up_to_whole_seconds() {
    let store = store_on(shared_etcd(), "ttl", options()).await;
    let node = conformance::register(&store, 1).await[0];
    // The test members' election timeout is 500 ms, so etcd's minimum TTL
    // is ceil(1.5 * 0.5 s) = 1 s.
    for (asked, granted) in [(1, 1_000), (1_000, 1_000), (1_001, 2_000), (2_500, 3_000)] {
        let lease = store.grant_lease(node, asked).await.unwrap();
        assert_eq!(
            store.keep_alive(lease).await,
            Ok(granted),
            "asked {asked} ms"
        );
        let info = store.leases().await.unwrap();
        let info = info.iter().find(|l| l.lease == lease).unwrap();
        assert!(
            info.remaining_ms > 0 && info.remaining_ms <= granted,
            "{info:?}"
        );
        store.revoke_lease(lease).await.unwrap();
    }
    let err = store
        .grant_lease(node, keyway_meta::MAX_LEASE_TTL_MS + 1)
        .await
        .unwrap_err();
    assert!(matches!(err, MetaError::InvalidArgument(_)), "{err:?}");
}

/// Nothing listening: every call fails with Unavailable within the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_to_no_etcd_are_unavailable_within_the_timeout() {
    let ports = keyway_testkit::free_ports(2);
    let url = format!(
        "etcd://127.0.0.1:{},127.0.0.1:{}/keyway/none",
        ports[0], ports[1]
    );
    let timeout = Duration::from_millis(400);
    let store = EtcdMeta::connect_with(
        &url,
        EtcdOptions {
            rpc_timeout: timeout,
            ..options()
        },
    )
    .await
    .unwrap();
    let started = Instant::now();
    let err = store.get_map().await.unwrap_err();
    assert!(matches!(err, MetaError::Unavailable(_)), "{err:?}");
    let err = store.commit(MapTxn::default()).await.unwrap_err();
    assert!(matches!(err, MetaError::Unavailable(_)), "{err:?}");
    let err = store.keep_alive(LeaseId(1)).await.unwrap_err();
    assert!(matches!(err, MetaError::Unavailable(_)), "{err:?}");
    let err = store.watch(MapVersion(0)).await.err().unwrap();
    assert!(matches!(err, MetaError::Unavailable(_)), "{err:?}");
    assert!(
        started.elapsed() < 4 * timeout + Duration::from_millis(500),
        "each call is bounded by the timeout: {:?}",
        started.elapsed()
    );
    for bad in ["etcd://127.0.0.1:1", "etcd://h/x", "etcd://h:1,/x"] {
        let err = EtcdMeta::connect(bad).await.unwrap_err();
        assert!(
            matches!(err, MetaError::InvalidArgument(_)),
            "{bad}: {err:?}"
        );
    }
}

/// Which member leads, and each member's id, from each live member's status.
async fn leader_of(etcd: &EtcdCluster, alive: &[usize]) -> Option<(usize, Vec<u64>)> {
    let mut ids = vec![0; etcd.len()];
    let mut leader = None;
    for &i in alive {
        let mut c = raw_client(&etcd.endpoints()[i]).await;
        let s = c.status().await.ok()?;
        ids[i] = s.header()?.member_id();
        leader = Some(s.leader());
    }
    let leader = leader?;
    let idx = alive.iter().copied().find(|&i| ids[i] == leader)?;
    Some((idx, ids))
}

/// Flips `p` until told to stop, re-reading after an unknown outcome; every
/// answer must be Ok or Unavailable: a Conflict would mean a commit was
/// applied twice or reported failed although it landed.
fn flipper(
    store: EtcdMeta,
    mut p: PartitionRecord,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<(usize, usize)> {
    tokio::spawn(async move {
        let (mut ok, mut unknown) = (0, 0);
        while !stop.load(Ordering::Relaxed) {
            let map = match store.get_map().await {
                Ok(map) => map,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            };
            assert_eq!(map.partitions[&p.id], p, "only this task moves it");
            let (txn, next) = flip_away(&map, &p);
            match store.commit(txn).await {
                Ok(_) => {
                    ok += 1;
                    p = next;
                }
                Err(MetaError::Unavailable(_)) => {
                    unknown += 1;
                    // Outcome unknown: learn it from the map.
                    let map = eventually("the map to be readable", DEADLINE, || async {
                        store.get_map().await.ok()
                    })
                    .await;
                    p = map.partitions[&p.id].clone();
                }
                Err(e) => panic!("a sole writer's flip failed with {e:?}"),
            }
        }
        (ok, unknown)
    })
}

/// Three members: the leader (which the watch and the store's calls also
/// use) is killed under a concurrent writer, and everything keeps working;
/// a second is killed, and calls fail with Unavailable within the timeout;
/// both come back, and everything resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_lose_one_then_quorum_then_recover() {
    let mut etcd = start_etcd(3);
    let timeout = Duration::from_secs(2);
    let store = EtcdMeta::connect_with(
        &etcd.url(&unique_prefix("cluster")),
        EtcdOptions {
            rpc_timeout: timeout,
            ..options()
        },
    )
    .await
    .unwrap();
    let start = conformance::bootstrapped(&store, 2, 2).await;
    let node = *start.nodes.keys().next().unwrap();
    let lease = store.grant_lease(node, 30_000).await.unwrap();
    let mut watch = store.watch(start.version).await.unwrap();
    let mut seen = start.clone();

    // Make member 0 (the store's first endpoint: its calls and watch go
    // there) the leader, so one kill takes out leader and watch together.
    let (leader, ids) = leader_of(&etcd, &[0, 1, 2]).await.unwrap();
    if leader != 0 {
        let mut c = raw_client(&etcd.endpoints()[leader]).await;
        c.move_leader(ids[0]).await.unwrap();
    }
    eventually("member 0 to lead", DEADLINE, || async {
        leader_of(&etcd, &[0, 1, 2]).await.filter(|(l, _)| *l == 0)
    })
    .await;
    let v = store.commit(MapTxn::default()).await.unwrap();
    let update = next_update(&mut watch).await.unwrap();
    assert_eq!(update.version(), Some(v));
    update.apply_to(&mut seen).unwrap();

    // A writer keeps flipping one partition while the leader dies.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let parts: Vec<PartitionRecord> = start.partitions.values().cloned().collect();
    let writer = flipper(store.clone(), parts[1].clone(), stop.clone());
    tokio::time::sleep(Duration::from_millis(200)).await;
    etcd.kill_member(0);
    let mut p = parts[0].clone();
    for _ in 0..5 {
        let map = store.get_map().await.unwrap();
        let (txn, next) = flip_away(&map, &p);
        store.commit(txn).await.unwrap();
        p = next;
    }
    assert_eq!(store.keep_alive(lease).await, Ok(30_000));
    assert!(
        store
            .leases()
            .await
            .unwrap()
            .iter()
            .any(|l| l.lease == lease)
    );
    let session = store.grant_session_lease(30_000).await.unwrap();
    let seat = store.campaign("manager", "m1", session).await.unwrap();
    assert_eq!(store.leader("manager").await, Ok(Some(seat.clone())));
    store.resign(&seat).await.unwrap();
    stop.store(true, Ordering::Relaxed);
    let (ok, unknown) = writer.await.unwrap();
    eprintln!("writer across the leader's death: {ok} flips, {unknown} unknown outcomes");
    assert!(
        ok > 0,
        "the writer made progress ({unknown} unknown outcomes)"
    );

    // The watch moved to a live member: every version, in order, once.
    let now = store.get_map().await.unwrap();
    let mut versions = Vec::new();
    while seen.version < now.version {
        let update = next_update(&mut watch).await.unwrap();
        match &update {
            MapUpdate::Delta(entries) => versions.extend(entries.iter().map(|(v, _)| v.0)),
            MapUpdate::Full(_) => panic!("a watch that kept up must not need the whole map"),
        }
        update.apply_to(&mut seen).unwrap();
    }
    assert_eq!(seen, now);
    let want: Vec<u64> = (v.0 + 1..=now.version.0).collect();
    assert_eq!(versions, want);

    // A second member down: no quorum. Calls fail within the timeout.
    etcd.kill_member(1);
    for call in ["get_map", "commit", "keep_alive"] {
        let started = Instant::now();
        let err = match call {
            "get_map" => store.get_map().await.map(|_| ()),
            "commit" => store.commit(MapTxn::default()).await.map(|_| ()),
            _ => store.keep_alive(lease).await.map(|_| ()),
        }
        .unwrap_err();
        assert!(matches!(err, MetaError::Unavailable(_)), "{call}: {err:?}");
        let elapsed = started.elapsed();
        // A commit may spend one timeout on its read and one on its txn.
        assert!(
            elapsed < 2 * timeout + Duration::from_millis(500),
            "{call}: {elapsed:?}"
        );
    }
    // The watch ends with an error item (the caller watches again).
    let item = tokio::time::timeout(DEADLINE, watch.next())
        .await
        .expect("the watch must notice the lost quorum")
        .expect("an error item, not a silent end");
    assert!(matches!(item, Err(MetaError::Unavailable(_))), "{item:?}");
    assert!(watch.next().await.is_none());

    // Both back: everything resumes, with the same store handle.
    let _etcd = tokio::task::spawn_blocking(move || {
        etcd.restart_member(0).unwrap();
        etcd.restart_member(1).unwrap();
        etcd.wait_healthy().unwrap();
        etcd
    })
    .await
    .unwrap();
    let back = eventually("the map to be readable again", DEADLINE, || async {
        store.get_map().await.ok()
    })
    .await;
    assert_eq!(back, now, "nothing was lost or half-applied");
    let mut watch = store.watch(seen.version).await.unwrap();
    let (txn, _) = flip_away(&back, &back.partitions[&p.id]);
    let v = store.commit(txn).await.unwrap();
    let update = next_update(&mut watch).await.unwrap();
    assert_eq!(update.version(), Some(v));
    update.apply_to(&mut seen).unwrap();
    assert_eq!(seen, store.get_map().await.unwrap());
    assert_eq!(
        store.keep_alive(lease).await,
        Ok(30_000),
        "the lease survived"
    );
    store.revoke_lease(lease).await.unwrap();
}
