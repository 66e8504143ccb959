//! Issue 6: how a smart client converges after partitions move (seed 000).
//!
//! - A hybrid client idle while 50 of 60 partitions move converges with at
//!   most one map refresh and one rejection; a redirect client needs about
//!   one rejection per moved partition it touches; a lookup client resolves
//!   before sending and needs none.
//! - Concurrent rejections share one refresh (single flight); a rejection
//!   inside `min_refresh_interval_ms` patches only.
//! - `KW.MAP SINCE`: a delta within the node's history (applied to the old
//!   map it gives the new one), the whole map beyond it.
//! - A client restarted with its cache file catches up by delta; a corrupt
//!   file is ignored.
//! - Salted counters: writes spread over salted keys, reads summed, also
//!   across a move.

use bytes::{Bytes, BytesMut};
use keyway_client::{Client, ClientConfig, ClientStats, Strategy};
use keyway_cluster::{ClusterSpec, LocalCluster};
use keyway_manager::request_move;
use keyway_map::{
    DEFAULT_KEYSPACE, Epoch, MapChange, MapSince, NodeId, OwnershipCondition, PartitionId,
    PartitionMap, PartitionRecord, key_hash_slot,
};
use keyway_meta::MapTxn;
use keyway_resp::{Frame, Limits, Protocol, ResponseParser, encode};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const WAIT: Duration = Duration::from_secs(120);

/// 3 nodes with `per_node` partitions each and a manager that only runs
/// the moves the test asks for.
async fn cluster(dir: &std::path::Path, per_node: u16) -> LocalCluster {
    let mut spec = ClusterSpec::ephemeral(3, dir.to_path_buf());
    spec.partitions_per_node = per_node;
    spec.node.lease_ttl_ms = 60_000;
    spec.manager = Some(crate::common::manager_without_policies(true));
    let c = LocalCluster::start(spec).await.expect("cluster starts");
    c.wait_serving(WAIT).await.unwrap();
    c
}

fn seeds(c: &LocalCluster) -> Vec<String> {
    c.resp_addrs().into_iter().flatten().collect()
}

async fn connect(c: &LocalCluster, config: ClientConfig) -> Client {
    let seeds = seeds(c);
    let seeds: Vec<&str> = seeds.iter().map(|s| s.as_str()).collect();
    Client::connect(&seeds, config)
        .await
        .expect("client connects")
}

fn with(strategy: Strategy) -> ClientConfig {
    ClientConfig {
        strategy,
        ..ClientConfig::default()
    }
}

/// `per` keys in every partition of the default keyspace, by partition.
fn keys_by_partition(map: &PartitionMap, per: usize) -> BTreeMap<PartitionId, Vec<String>> {
    let mut out: BTreeMap<PartitionId, Vec<String>> = map
        .keyspace_partitions(DEFAULT_KEYSPACE)
        .map(|p| (p.id, Vec::new()))
        .collect();
    for i in 0.. {
        if out.values().all(|keys| keys.len() >= per) {
            break;
        }
        let key = format!("key:{i}");
        let p = map
            .locate_slot(DEFAULT_KEYSPACE, key_hash_slot(key.as_bytes()))
            .unwrap();
        let keys = out.get_mut(&p.id).unwrap();
        if keys.len() < per {
            keys.push(key);
        }
    }
    out
}

/// The node after `owner` in id order.
fn next_node(map: &PartitionMap, owner: NodeId) -> NodeId {
    let ids: Vec<NodeId> = map.nodes.keys().copied().collect();
    let i = ids.iter().position(|n| *n == owner).unwrap();
    ids[(i + 1) % ids.len()]
}

/// Moves every partition in `ids` to the next node, all at once, and waits
/// until every move is DONE and every node routes by the final map.
async fn move_all(c: &LocalCluster, ids: &[PartitionId]) {
    let map = c.map().await.unwrap();
    let mut requested = BTreeMap::new();
    for id in ids {
        let target = next_node(&map, map.partitions[id].owner);
        let rec = request_move(&**c.meta(), *id, target)
            .await
            .unwrap_or_else(|e| panic!("move {id} to {target}: {e}"));
        requested.insert(rec.id, (*id, target));
    }
    let driver = c.manager().expect("a manager").driver();
    let deadline = Instant::now() + WAIT;
    loop {
        let list = driver.migrations().await.unwrap();
        let mut pending = 0;
        for m in list.iter().filter(|m| requested.contains_key(&m.id)) {
            match m.state.as_str() {
                "DONE" => {}
                "ABORTED" => panic!("migration {} aborted: {m:?}", m.id),
                _ => pending += 1,
            }
        }
        if pending == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{pending} moves did not finish");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let now = c.map().await.unwrap();
    for (id, target) in requested.values() {
        assert_eq!(now.partitions[id].owner, *target, "DONE but not moved");
    }
    c.wait_serving(WAIT).await.unwrap();
}

fn value(key: &str) -> String {
    format!("value of {key}")
}

/// Reads every key once, in order, checking its value; the stats it cost.
async fn burst(client: &Client, keys: &[String]) -> ClientStats {
    let before = client.stats();
    for key in keys {
        let got = client.get(key.as_bytes()).await.unwrap();
        assert_eq!(
            got.as_deref(),
            Some(value(key).as_bytes()),
            "{} client, key {key}",
            client.strategy()
        );
    }
    client.stats().since(&before)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idle_client_converges_after_50_moves_in_one_refresh() {
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(dir.path(), 20).await;
    let map = c.map().await.unwrap();
    assert_eq!(map.partitions.len(), 60);
    let by_partition = keys_by_partition(&map, 3);
    let keys: Vec<String> = by_partition.values().flatten().cloned().collect();

    let hybrid = connect(&c, with(Strategy::Hybrid)).await;
    let redirect = connect(&c, with(Strategy::Redirect)).await;
    let lookup = connect(
        &c,
        ClientConfig {
            lookup_ttl_ms: 150,
            ..with(Strategy::Lookup)
        },
    )
    .await;
    for key in &keys {
        hybrid
            .set(key.as_bytes(), value(key).as_bytes())
            .await
            .unwrap();
    }
    for client in [&redirect, &lookup] {
        let warm = burst(client, &keys).await;
        assert_eq!(
            warm.rejections,
            0,
            "{}: nothing moved yet",
            client.strategy()
        );
    }

    // Every client idles while 50 partitions move.
    let moved: Vec<PartitionId> = by_partition.keys().copied().take(50).collect();
    let began = Instant::now();
    move_all(&c, &moved).await;
    let after = c.map().await.unwrap();
    println!(
        "50 moves in {:?}; map version {} -> {}",
        began.elapsed(),
        map.version,
        after.version
    );

    let h = burst(&hybrid, &keys).await;
    let r = burst(&redirect, &keys).await;
    let l = burst(&lookup, &keys).await;
    for (name, d) in [("hybrid", &h), ("redirect", &r), ("lookup", &l)] {
        println!(
            "{name:>8}: {} requests, {} rejections, {} refreshes ({} full, {} delta), \
             {} extra round trips, {} map versions caught up",
            d.requests,
            d.rejections,
            d.refreshes,
            d.refreshes_full,
            d.refreshes_delta,
            d.extra_round_trips,
            d.version_lag_total
        );
    }
    // Hybrid: one rejection, one delta refresh carrying every move.
    assert!(h.rejections <= 1, "hybrid: {h:?}");
    assert!(h.refreshes <= 1, "hybrid: {h:?}");
    assert_eq!((h.refreshes_full, h.requests), (0, keys.len() as u64));
    assert!(
        h.version_lag_last >= 50,
        "one refresh closed every move: {h:?}"
    );
    assert_eq!(hybrid.map().partitions, after.partitions);
    // Redirect: about one rejection per moved partition touched (all 50).
    assert!(
        r.rejections as f64 >= 0.8 * moved.len() as f64,
        "redirect: {} rejections for {} moved partitions",
        r.rejections,
        moved.len()
    );
    assert_eq!(r.refreshes, 0, "redirect patches, never refreshes");
    assert_eq!(r.patches, r.rejections);
    assert_eq!(redirect.map().partitions, after.partitions);
    // Lookup: the cache is older than its TTL (the moves took longer than
    // the cleanup grace), so it resolves before the first send.
    assert_eq!(l.rejections, 0, "lookup: {l:?}");
    assert!(
        l.refreshes_delta >= 1 && l.refreshes_full == 0,
        "lookup: {l:?}"
    );
    assert_eq!(lookup.map().partitions, after.partitions);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_rejections_share_one_refresh_and_the_interval_limits_them() {
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(dir.path(), 4).await;
    let map = c.map().await.unwrap();
    let by_partition = keys_by_partition(&map, 8);
    // No rate limit: only the single flight keeps concurrent refreshes to one.
    let shared = Arc::new(
        connect(
            &c,
            ClientConfig {
                min_refresh_interval_ms: 0,
                ..with(Strategy::Hybrid)
            },
        )
        .await,
    );
    let limited = connect(
        &c,
        ClientConfig {
            min_refresh_interval_ms: 600_000,
            ..with(Strategy::Hybrid)
        },
    )
    .await;
    for key in by_partition.values().flatten() {
        shared
            .set(key.as_bytes(), value(key).as_bytes())
            .await
            .unwrap();
    }
    let moved: Vec<PartitionId> = by_partition.keys().copied().take(4).collect();
    move_all(&c, &moved).await;
    let moved_keys: Vec<String> = moved
        .iter()
        .flat_map(|id| by_partition[id].clone())
        .collect();

    // Inside the interval: each rejection is patched, no refresh.
    let d = burst(&limited, &moved_keys).await;
    println!("limited: {d:?}");
    assert_eq!(d.refreshes, 0, "{d:?}");
    assert_eq!(d.rejections, moved.len() as u64, "one per moved partition");
    assert_eq!(d.refreshes_suppressed, d.rejections);

    // 32 tasks, all routed by the stale map, rejected at about once. On a
    // loaded machine the first one may finish its refresh before the
    // others are even sent (one rejection: nothing concurrent to share):
    // then the partitions move on and the burst is tried again.
    const ATTEMPTS: usize = 5;
    for attempt in 1..=ATTEMPTS {
        let before = shared.stats();
        let start = Arc::new(tokio::sync::Barrier::new(moved_keys.len()));
        let tasks: Vec<_> = moved_keys
            .iter()
            .cloned()
            .map(|key| {
                let (client, start) = (shared.clone(), start.clone());
                tokio::spawn(async move {
                    start.wait().await;
                    let got = client.get(key.as_bytes()).await.unwrap();
                    assert_eq!(got.as_deref(), Some(value(&key).as_bytes()));
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        let d = shared.stats().since(&before);
        println!("concurrent, attempt {attempt}: {d:?}");
        assert!(d.rejections >= 1, "the map was stale: {d:?}");
        if d.rejections > 1 {
            assert_eq!(d.refreshes, 1, "one refresh for all of them: {d:?}");
            assert!(d.refreshes_coalesced >= 1, "{d:?}");
            c.shutdown().await;
            return;
        }
        move_all(&c, &moved).await;
    }
    panic!("in {ATTEMPTS} bursts no two tasks were rejected concurrently");
}

/// A raw RESP connection (for `KW.MAP SINCE` on the wire).
struct Raw {
    stream: TcpStream,
    buf: BytesMut,
    parser: ResponseParser,
}

impl Raw {
    async fn connect(addr: &str) -> Raw {
        Raw {
            stream: TcpStream::connect(addr).await.unwrap(),
            buf: BytesMut::new(),
            parser: ResponseParser::new(Limits::default()),
        }
    }

    async fn cmd(&mut self, args: &[&str]) -> Frame {
        let frame = Frame::Array(
            args.iter()
                .map(|a| Frame::Bulk(Bytes::copy_from_slice(a.as_bytes())))
                .collect(),
        );
        let mut out = BytesMut::new();
        encode(&frame, Protocol::Resp2, &mut out);
        self.stream.write_all(&out).await.unwrap();
        loop {
            if let Some(f) = self.parser.parse(&mut self.buf).unwrap() {
                return f;
            }
            assert!(self.stream.read_buf(&mut self.buf).await.unwrap() > 0);
        }
    }

    async fn since(&mut self, version: u64) -> MapSince {
        match self.cmd(&["KW.MAP", "SINCE", &version.to_string()]).await {
            Frame::Bulk(b) => keyway_map::decode_since(&b).unwrap(),
            other => panic!("KW.MAP SINCE answered {other:?}"),
        }
    }
}

/// Hands partition `id` to the next node (metadata only) `times` times.
async fn flip(c: &LocalCluster, id: PartitionId, times: usize) {
    for _ in 0..times {
        let map = c.map().await.unwrap();
        let p: PartitionRecord = map.partitions[&id].clone();
        let next = PartitionRecord {
            owner: next_node(&map, p.owner),
            epoch: Epoch(p.epoch.0 + 1),
            ..p.clone()
        };
        c.meta()
            .commit(MapTxn {
                conditions: vec![OwnershipCondition {
                    partition: id,
                    expected: Some((p.owner, p.epoch)),
                }],
                changes: vec![MapChange::UpsertPartition(next)],
            })
            .await
            .unwrap();
    }
    c.wait_serving(WAIT).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kw_map_since_answers_a_delta_within_the_history_and_the_map_beyond() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = ClusterSpec::ephemeral(3, dir.path().to_path_buf());
    spec.node.lease_ttl_ms = 60_000;
    spec.node.map_history_versions = 4;
    spec.manager = None;
    let c = LocalCluster::start(spec).await.unwrap();
    c.wait_serving(WAIT).await.unwrap();
    let old = c.map().await.unwrap();
    let id = *old.partitions.keys().next().unwrap();
    let mut raw = Raw::connect(&seeds(&c)[0]).await;

    flip(&c, id, 3).await;
    let now = c.map().await.unwrap();
    match raw.since(old.version.0).await {
        MapSince::Delta(entries) => {
            assert_eq!(entries.len(), 3);
            let mut caught_up = old.clone();
            for (v, changes) in &entries {
                caught_up.apply(*v, changes).unwrap();
            }
            caught_up.validate().unwrap();
            assert_eq!(
                caught_up, now,
                "the delta brings the old map to the new one"
            );
        }
        MapSince::Full(_) => panic!("3 versions behind is within a history of 4"),
    }
    assert_eq!(raw.since(now.version.0).await, MapSince::Delta(vec![]));
    // Newer than the node's map (a replaced store): the whole map.
    assert_eq!(
        raw.since(now.version.0 + 100).await,
        MapSince::Full(now.clone())
    );

    flip(&c, id, 3).await;
    let later = c.map().await.unwrap();
    assert_eq!(
        raw.since(old.version.0).await,
        MapSince::Full(later.clone()),
        "6 versions behind is beyond the history"
    );
    assert!(matches!(raw.since(now.version.0).await, MapSince::Delta(d) if d.len() == 3));
    // The plain form and bad arguments.
    match raw.cmd(&["KW.MAP"]).await {
        Frame::Bulk(b) => assert_eq!(keyway_map::decode_map(&b).unwrap(), later),
        other => panic!("KW.MAP answered {other:?}"),
    }
    for bad in [
        &["KW.MAP", "SINCE", "x"][..],
        &["KW.MAP", "AFTER", "1"],
        &["KW.MAP", "SINCE"],
    ] {
        assert!(matches!(raw.cmd(bad).await, Frame::Error(_)), "{bad:?}");
    }
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restarted_client_catches_up_from_its_cache_file_by_delta() {
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(dir.path(), 4).await;
    let file = dir.path().join("client-map.cache");
    let warm = || ClientConfig {
        cache_file: Some(file.clone()),
        ..ClientConfig::default()
    };
    let first = connect(&c, warm()).await;
    let s = first.stats();
    assert_eq!((s.refreshes_full, s.refreshes_delta), (1, 0), "no file yet");
    assert!(file.exists(), "connect saved the map");
    let key = "warm-key";
    first.set(key.as_bytes(), b"v").await.unwrap();
    drop(first);

    let map = c.map().await.unwrap();
    let p = map
        .locate_slot(DEFAULT_KEYSPACE, key_hash_slot(key.as_bytes()))
        .unwrap()
        .id;
    move_all(&c, &[p]).await;

    let second = connect(&c, warm()).await;
    let s = second.stats();
    assert_eq!(
        (s.refreshes_full, s.refreshes_delta),
        (0, 1),
        "caught up by delta: {s:?}"
    );
    assert!(s.version_lag_last >= 1, "{s:?}");
    assert_eq!(second.map().partitions, c.map().await.unwrap().partitions);
    let before = second.stats();
    assert_eq!(
        second.get(key.as_bytes()).await.unwrap().as_deref(),
        Some(&b"v"[..])
    );
    assert_eq!(second.stats().since(&before).rejections, 0);
    drop(second);

    // A corrupt file is ignored (a full refresh), then replaced.
    std::fs::write(&file, b"KWCACHE1 not really").unwrap();
    let third = connect(&c, warm()).await;
    assert_eq!(third.stats().refreshes_full, 1);
    drop(third);
    let fourth = connect(&c, warm()).await;
    assert_eq!(fourth.stats().refreshes_delta, 1, "the file was rewritten");
    // A file that cannot be written is not fatal either.
    let nowhere = ClientConfig {
        cache_file: Some(dir.path().join("no/such/dir/map.cache")),
        ..ClientConfig::default()
    };
    assert_eq!(connect(&c, nowhere).await.stats().refreshes_full, 1);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn salted_counters_spread_writes_and_sum_them_across_a_move() {
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(dir.path(), 4).await;
    let client = connect(&c, ClientConfig::default()).await;
    let salted = client.salted(16);
    let mut total = 0i64;
    for i in 1..=200i64 {
        salted.incr_by(b"hits", i).await.unwrap();
        total += i;
    }
    assert_eq!(salted.get_sum(b"hits").await.unwrap(), total);
    assert_eq!(salted.get_sum(b"nobody").await.unwrap(), 0);

    // The writes spread: many salted keys hold a share, over several partitions.
    let map = client.map();
    let mut written = 0;
    let mut partitions = BTreeSet::new();
    let mut sum = 0;
    for k in salted.keys(b"hits") {
        if let Some(v) = client.get(&k).await.unwrap() {
            written += 1;
            sum += std::str::from_utf8(&v).unwrap().parse::<i64>().unwrap();
            partitions.insert(
                map.locate_slot(DEFAULT_KEYSPACE, key_hash_slot(&k))
                    .unwrap()
                    .id,
            );
        }
    }
    println!(
        "200 writes over {written} salted keys in {} partitions",
        partitions.len()
    );
    assert_eq!(sum, total);
    assert!(written >= 8, "random salts cover most of 16 keys");
    assert!(partitions.len() >= 3, "{partitions:?}");

    // A salt's partition moves: the pipelined read is rejected for it and
    // retried through the routed path; the sum is still exact.
    let moved = *partitions.iter().next().unwrap();
    move_all(&c, &[moved]).await;
    let before = client.stats();
    assert_eq!(salted.get_sum(b"hits").await.unwrap(), total);
    let d = client.stats().since(&before);
    println!("salted read across a move: {d:?}");
    assert!(d.rejections >= 1, "{d:?}");
    salted.incr_by(b"hits", 1).await.unwrap();
    assert_eq!(salted.get_sum(b"hits").await.unwrap(), total + 1);
    c.shutdown().await;
}
