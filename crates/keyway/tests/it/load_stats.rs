//! Load statistics end to end, in process: keys written over RESP with one
//! key hammered show up in the owner's `PartitionStats` (the hot key first,
//! with a dominant share, and no load split key), in `keyway ctl hotkeys`,
//! with sizes matching what was written, and in the manager's `/load`.

use crate::common;

use keyway_client::{Client, ClientConfig};
use keyway_cluster::{ClusterSpec, LocalCluster};
use keyway_manager::MonitorConfig;
use keyway_map::{DEFAULT_KEYSPACE, PartitionId, key_hash_slot};
use keyway_peer::PeerClient;
use keyway_peer::stats::NodeReport;
use keyway_resp::Frame;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const KEYS: usize = 1_500;
const VALUE_BYTES: usize = 100;
const HOT: &str = "hot-key";
const HOT_HITS: usize = 3_000;

async fn cluster(dir: &std::path::Path) -> LocalCluster {
    let mut spec = ClusterSpec::ephemeral(3, dir.to_path_buf());
    spec.node.lease_ttl_ms = 60_000;
    spec.node.stats_scan_interval_ms = 200;
    spec.node.stats_sample_every = 2;
    spec.node.stats_window_ms = 60_000;
    if let Some(m) = spec.manager.as_mut() {
        m.config.monitor = MonitorConfig {
            stats_interval_ms: 200,
            stats_timeout_ms: 200,
        };
    }
    LocalCluster::start(spec).await.expect("cluster starts")
}

/// Every node's report, by partition.
async fn reports(c: &LocalCluster) -> Vec<NodeReport> {
    let mut out = Vec::new();
    for i in 0..c.len() {
        let node = c.node(i).expect("running");
        let client = PeerClient::connect(node.admin_addr()).unwrap();
        out.push(client.partition_stats().await.expect("PartitionStats"));
    }
    out
}

/// Payload bytes of one key as the node counts them (storage key + data).
fn key_bytes(key: &str) -> u64 {
    (4 + 2 + key.len() + VALUE_BYTES) as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hammered_key_is_reported_first_and_sizes_match_what_was_written() {
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(dir.path()).await;
    let seeds: Vec<String> = c.resp_addrs().into_iter().flatten().collect();
    let client = Client::connect(
        &seeds.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
        ClientConfig::default(),
    )
    .await
    .unwrap();
    let value = vec![b'v'; VALUE_BYTES];
    let mut expected_bytes = 0;
    for i in 0..KEYS {
        let key = format!("key:{i}");
        client.set(key.as_bytes(), &value).await.unwrap();
        expected_bytes += key_bytes(&key);
    }
    // Hammer one key with plain Redis commands on its owner.
    let map = c.map().await.unwrap();
    let hot_partition = map
        .locate_slot(DEFAULT_KEYSPACE, key_hash_slot(HOT.as_bytes()))
        .unwrap()
        .clone();
    let port: u16 = map.nodes[&hot_partition.owner]
        .resp_addr
        .rsplit_once(':')
        .unwrap()
        .1
        .parse()
        .unwrap();
    let hot_value = String::from_utf8(value.clone()).unwrap();
    tokio::task::spawn_blocking(move || {
        let mut resp = common::Resp::connect(port);
        for i in 0..HOT_HITS {
            let reply = if i % 2 == 0 {
                resp.cmd(&["SET", HOT, &hot_value])
            } else {
                resp.cmd(&["GET", HOT])
            };
            assert!(!matches!(reply, Frame::Error(_)), "{reply:?}");
        }
    })
    .await
    .unwrap();
    expected_bytes += key_bytes(HOT);

    // The owner reports the hot key first, dominant, and the sizes add up
    // once every partition was rescanned.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (hot, total_keys, total_bytes) = loop {
        let reports = reports(&c).await;
        let all: BTreeMap<PartitionId, _> = reports
            .iter()
            .flat_map(|r| r.partitions.iter().map(move |p| (p.partition, (r.node, p))))
            .collect();
        let keys: u64 = all.values().map(|(_, p)| p.keys).sum();
        let bytes: u64 = all.values().map(|(_, p)| p.bytes).sum();
        let done = all.len() == map.partitions.len()
            && all.values().all(|(_, p)| p.size_known)
            && keys == KEYS as u64 + 1;
        if done {
            let (node, hot) = all[&hot_partition.id];
            assert_eq!(node, hot_partition.owner, "reported by its owner");
            break (hot.clone(), keys, bytes);
        }
        assert!(
            Instant::now() < deadline,
            "sizes never added up: {keys} keys in {} partitions",
            all.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(total_keys, KEYS as u64 + 1);
    assert_eq!(total_bytes, expected_bytes);
    assert_eq!(&hot.hot_keys[0].key[..], HOT.as_bytes(), "{hot:?}");
    assert!(hot.top_key_share > 0.8, "{hot:?}");
    assert_eq!(hot.load_split_key, None, "one key dominates: {hot:?}");
    assert!(
        hot.writes_per_sec > 0.0 && hot.reads_per_sec > 0.0,
        "{hot:?}"
    );
    assert!(hot.size_split_key.is_some(), "{hot:?}");
    let hot_partition_keys = hot.keys;

    // `keyway ctl hotkeys --json` shows it first too.
    let meta = c.meta_url();
    let out = tokio::task::spawn_blocking(move || {
        common::run(
            std::process::Command::new(env!("CARGO_BIN_EXE_keyway"))
                .args(["ctl", "--meta", &meta, "hotkeys", "--top", "3", "--json"])
                .env("KEYWAY_LOG", "warn"),
        )
    })
    .await
    .unwrap();
    let rows: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(rows[0]["key"], HOT, "{out}");
    assert_eq!(rows[0]["partition"], hot_partition.id.0, "{out}");
    assert!(rows[0]["share"].as_f64().unwrap() > 0.8, "{out}");
    assert!(rows.len() <= 3 * map.partitions.len());

    // The manager's `/load` shows every partition and the skew.
    let admin_port = c.manager().unwrap().admin_addr().port();
    let deadline = Instant::now() + Duration::from_secs(30);
    let load = loop {
        let body = tokio::task::spawn_blocking(move || common::http_get(admin_port, "/load"))
            .await
            .unwrap();
        if let Some(body) = body {
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            if v["load"]["partitions"].as_object().map(|p| p.len()) == Some(map.partitions.len()) {
                break v;
            }
        }
        assert!(
            Instant::now() < deadline,
            "/load never showed every partition"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let p = &load["load"]["partitions"][hot_partition.id.0.to_string()];
    assert_eq!(p["keys"], hot_partition_keys, "{load}");
    assert_eq!(p["hot_keys"][0]["key"], HOT, "{load}");
    let nodes = load["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 3);
    let bytes: u64 = nodes.iter().map(|n| n["bytes"].as_u64().unwrap()).sum();
    assert_eq!(bytes, expected_bytes);
    let skew = load["skew"]["requests_ratio"].as_f64().unwrap();
    assert!(skew > 1.0 && skew <= 3.0, "{load}");
    c.shutdown().await;
}

/// The owner's report of the one partition of range keyspace `name`.
async fn range_report(c: &LocalCluster, name: &str) -> keyway_peer::stats::PartitionReport {
    let map = c.map().await.unwrap();
    let ks = map.keyspace_by_name(name).unwrap();
    let p = map.keyspace_partitions(ks.id).next().unwrap().clone();
    let client = PeerClient::connect(&map.nodes[&p.owner].admin_addr).unwrap();
    let report = client.partition_stats().await.unwrap();
    report
        .partitions
        .into_iter()
        .find(|r| r.partition == p.id)
        .expect("the owner reports the partition")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kw_commands_on_a_range_keyspace_are_counted_by_key() {
    let dir = tempfile::tempdir().unwrap();
    let c = cluster(dir.path()).await;
    keyway_manager::create_keyspace(&**c.meta(), "events", keyway_map::Routing::Range, Some(1))
        .await
        .unwrap();
    c.wait_serving(Duration::from_secs(10)).await.unwrap();
    let map = c.map().await.unwrap();
    let ks = map.keyspace_by_name("events").unwrap();
    let p = map.keyspace_partitions(ks.id).next().unwrap().clone();
    let port: u16 = map.nodes[&p.owner]
        .resp_addr
        .rsplit_once(':')
        .unwrap()
        .1
        .parse()
        .unwrap();
    // 20 keys with skewed weights, none above half: evt:00 gets 50 writes,
    // evt:i 20 - i.
    let weights: Vec<(String, usize)> = (0..20)
        .map(|i| (format!("evt:{i:02}"), if i == 0 { 50 } else { 20 - i }))
        .collect();
    let load = weights.clone();
    tokio::task::spawn_blocking(move || {
        let mut resp = common::Resp::connect(port);
        for (key, n) in &load {
            for _ in 0..*n {
                let reply = resp.cmd(&["KW.SET", "events", key, "0123456789"]);
                assert_eq!(reply, Frame::ok(), "{key}");
            }
        }
    })
    .await
    .unwrap();
    let total: usize = weights.iter().map(|(_, n)| n).sum();
    let deadline = Instant::now() + Duration::from_secs(30);
    let r = loop {
        let r = range_report(&c, "events").await;
        if r.size_known && r.keys == 20 {
            break r;
        }
        assert!(Instant::now() < deadline, "never sized: {r:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // Range keyspace: storage key = be32(keyspace) ++ key, no slot.
    assert_eq!(r.bytes, 20 * (4 + 6 + 10));
    assert!(
        (r.writes_per_sec * 60.0 - total as f64).abs() < 1e-6,
        "{r:?}"
    );
    assert_eq!(&r.hot_keys[0].key[..], b"evt:00", "{r:?}");
    let split = r.load_split_key.clone().expect("a load split key");
    let below: usize = weights
        .iter()
        .filter(|(k, _)| k.as_bytes() < &split[..])
        .map(|(_, n)| n)
        .sum();
    assert!(
        below.abs_diff(total - below) <= total / 3,
        "below {below} of {total} at {split:?}"
    );
    let size_split = r.size_split_key.clone().expect("a size split key");
    assert!(size_split[..] > b"evt:00"[..] && size_split[..] <= b"evt:19"[..]);
    c.shutdown().await;
}
