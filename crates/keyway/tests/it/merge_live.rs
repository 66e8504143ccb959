//! Issue 5's merge "Done when", end to end: the manager merges cold
//! neighbours of a range keyspace by itself (down to the keyspace's floor),
//! and never touches a hot partition or one in a migration.
//!
//! A range keyspace is split by hand into 16 partitions on one node. Two
//! adjacent ones are kept hot by paced writes; a third is being moved by a
//! migration throttled to a crawl. The floor is set low (1 partition per
//! node), so only the hot and migrating partitions stop the merger: the
//! cold runs between them must each merge into one partition (one CAS per
//! merge), and no further; the hot pair and the migrating partition keep
//! their ids and epochs, and every key stays readable in order.

use bytes::Bytes;
use keyway_client::{Client, ClientConfig};
use keyway_cluster::{ClusterSpec, LocalCluster, ManagerSpec};
use keyway_manager::{SplitAt, create_keyspace, request_abort, request_move, split_partition};
use keyway_map::{KeyspaceId, PartitionRecord, Routing};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const KEYS: usize = 800;
const VALUE: [u8; 1000] = [b'v'; 1000];
const PARTS: usize = 16;
/// What must remain: the cold runs [, k100), [k200, k400) and [k450, )
/// merged, and partitions 2, 3 (hot) and 8 (migrating) as they were.
const LEFT: usize = 6;

fn key(i: usize) -> String {
    format!("k{i:03}")
}

fn partitions(map: &keyway_map::PartitionMap, ks: KeyspaceId) -> Vec<PartitionRecord> {
    map.keyspace_partitions(ks).cloned().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cold_neighbours_merge_and_hot_or_migrating_partitions_never_do() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = ClusterSpec::ephemeral(3, dir.path().to_path_buf());
    spec.node.lease_ttl_ms = 60_000;
    spec.node.stats_window_ms = 1_000;
    spec.node.stats_sample_every = 1;
    spec.node.stats_scan_interval_ms = 200;
    let mut m = ManagerSpec::default();
    m.config.monitor.stats_interval_ms = 200;
    m.config.monitor.stats_timeout_ms = 200;
    m.config.merge.merge_cold_window_ms = 1_000;
    m.config.merge.merge_after_split_cooldown_ms = 1_000;
    m.config.merge.merge_max_requests_per_sec = 10.0;
    m.config.merge.merge_min_partitions_per_node = 1;
    m.config.rebalance.enabled = false;
    // The one migration crawls: 1 KiB chunks at 512 bytes/s.
    m.config.driver.throttle.max_bytes_per_sec = 512;
    m.config.driver.throttle.chunk_bytes = 1024;
    spec.manager = Some(m);
    let c = LocalCluster::start(spec).await.unwrap();
    let ks = create_keyspace(&**c.meta(), "logs", Routing::Range, None)
        .await
        .unwrap();
    let seeds: Vec<String> = c.resp_addrs().into_iter().flatten().collect();
    let seed_refs: Vec<&str> = seeds.iter().map(|s| s.as_str()).collect();
    let client = Arc::new(
        Client::connect(&seed_refs, ClientConfig::default())
            .await
            .unwrap(),
    );
    for i in 0..KEYS {
        client
            .kw_set("logs", key(i).as_bytes(), &VALUE)
            .await
            .unwrap();
    }
    // 16 partitions of 50 keys: [, k050), [k050, k100), ...
    for n in 1..PARTS {
        let map = c.map().await.unwrap();
        let last = partitions(&map, ks.id).last().unwrap().clone();
        split_partition(&**c.meta(), last.id, SplitAt::Key(Bytes::from(key(n * 50))))
            .await
            .unwrap();
    }
    let map = c.map().await.unwrap();
    let parts = partitions(&map, ks.id);
    assert_eq!(parts.len(), PARTS);
    let (hot_a, hot_b, moving) = (parts[2].clone(), parts[3].clone(), parts[8].clone());

    // Two hot neighbours: paced writes on k100..k199.
    let stop = Arc::new(AtomicBool::new(false));
    let hot: Vec<_> = (0..2)
        .map(|w| {
            let (client, stop) = (client.clone(), stop.clone());
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(5));
                let mut i = w;
                let mut errors = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    tick.tick().await;
                    let k = key(100 + (i * 37) % 100);
                    i += 2;
                    if let Err(e) = client.kw_set("logs", k.as_bytes(), &VALUE).await {
                        errors.push(e.to_string());
                    }
                }
                errors
            })
        })
        .collect();
    // One crawling migration.
    let target = *map.nodes.keys().find(|n| **n != moving.owner).unwrap();
    let migration = request_move(&**c.meta(), moving.id, target).await.unwrap();

    // The merger merges every cold run, and nothing else.
    let began = Instant::now();
    let deadline = began + Duration::from_secs(60);
    loop {
        let map = c.map().await.unwrap();
        let now = partitions(&map, ks.id);
        for p in [&hot_a, &hot_b, &moving] {
            assert_eq!(
                map.partitions.get(&p.id),
                Some(p),
                "partition {} (hot or migrating) was merged or changed",
                p.id
            );
        }
        if now.len() == LEFT {
            println!("merged down to {LEFT} partitions in {:?}", began.elapsed());
            let bounds: Vec<(Bytes, Option<Bytes>)> = now
                .iter()
                .map(|p| (p.start.clone(), p.end.clone()))
                .collect();
            let b = |i: usize| Some(Bytes::from(key(i)));
            assert_eq!(
                bounds,
                vec![
                    (Bytes::new(), b(100)),
                    (b(100).unwrap(), b(150)),
                    (b(150).unwrap(), b(200)),
                    (b(200).unwrap(), b(400)),
                    (b(400).unwrap(), b(450)),
                    (b(450).unwrap(), None),
                ]
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {} of {} merges after 60 s: {now:#?}",
            PARTS - now.len(),
            PARTS - LEFT
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Held there for a while, the three untouched.
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        let map = c.map().await.unwrap();
        assert_eq!(
            partitions(&map, ks.id).len(),
            LEFT,
            "merged a hot or migrating partition"
        );
        for p in [&hot_a, &hot_b, &moving] {
            assert_eq!(map.partitions.get(&p.id), Some(p));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let driver = c.manager().unwrap().driver();
    let state = |list: &[keyway_manager::MigrationSummary]| {
        list.iter()
            .find(|s| s.id == migration.id)
            .map(|s| s.state.clone())
    };
    let list = driver.migrations().await.unwrap();
    assert!(
        !matches!(state(&list).as_deref(), Some("DONE" | "ABORTED")),
        "the migration ended too early for the test to mean anything: {list:?}"
    );

    request_abort(&**c.meta(), migration.id).await.unwrap();
    stop.store(true, Ordering::SeqCst);
    for h in hot {
        let errors = h.await.unwrap();
        assert!(errors.is_empty(), "the hot writers saw errors: {errors:?}");
    }
    let all = client.kw_scan_all("logs", b"", None, 100).await.unwrap();
    let keys: Vec<String> = all
        .iter()
        .map(|(k, _)| String::from_utf8(k.to_vec()).unwrap())
        .collect();
    assert_eq!(keys, (0..KEYS).map(key).collect::<Vec<_>>());
    c.shutdown().await;
}
