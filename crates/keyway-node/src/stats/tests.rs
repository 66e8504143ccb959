//! The statistics against a fake clock, an in-memory engine and a
//! one-node map.

use super::*;
use keyway_map::{DEFAULT_KEYSPACE, NodeInfo, NodeState, key_hash_slot};
use keyway_storage::{Engine as _, MemEngine, Mutation, ValueKind};
use std::sync::atomic::Ordering;
use std::time::Instant;

/// A clock that moves only when told to.
struct FakeClock {
    base: Instant,
    offset_ms: AtomicU64,
}

impl FakeClock {
    fn new() -> Arc<Self> {
        Arc::new(FakeClock {
            base: Instant::now(),
            offset_ms: AtomicU64::new(0),
        })
    }

    fn advance(&self, ms: u64) {
        self.offset_ms.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for FakeClock {
    fn unix_ms(&self) -> u64 {
        1_700_000_000_000 + self.offset_ms.load(Ordering::SeqCst)
    }
    fn now(&self) -> Instant {
        self.base + Duration::from_millis(self.offset_ms.load(Ordering::SeqCst))
    }
}

struct World {
    clock: Arc<FakeClock>,
    stats: Arc<Stats>,
    engine: Arc<MemEngine>,
    map: Arc<PartitionMap>,
    metrics: Metrics,
}

fn config() -> StatsConfig {
    StatsConfig {
        window: Duration::from_millis(10_000),
        sample_every: 1,
        hot_keys_k: 4,
        split_min_samples: 50,
        dominant_key_share: 0.5,
        scan_interval: Duration::from_millis(30_000),
        scan_chunk_keys: 7,
    }
}

/// One node owning every partition of a 4-partition hash keyspace.
fn world(config: StatsConfig) -> World {
    let clock = FakeClock::new();
    let me = NodeId(1);
    let routing = Arc::new(Routing::new(me, clock.clone()));
    let node = NodeInfo {
        id: me,
        resp_addr: "127.0.0.1:1".into(),
        admin_addr: "127.0.0.1:2".into(),
        state: NodeState::Up,
        weight: keyway_map::DEFAULT_NODE_WEIGHT,
        draining: false,
        zone: None,
        replica_addr: None,
    };
    routing
        .install(PartitionMap::bootstrap(&[node], 4).unwrap())
        .unwrap();
    let engine = Arc::new(MemEngine::new());
    let metrics = Metrics::new();
    let stats = Arc::new(Stats::new(
        me,
        routing.clone(),
        engine.clone(),
        clock.clone(),
        config,
        &metrics,
    ));
    World {
        clock,
        stats,
        engine,
        map: routing.map(),
        metrics,
    }
}

fn ks() -> Keyspace {
    Keyspace {
        id: DEFAULT_KEYSPACE,
        name: "default".into(),
        routing: keyway_map::Routing::Hash,
        replication_factor: 1,
        min_in_sync: 1,
    }
}

impl World {
    fn partition_of(&self, key: &[u8]) -> PartitionRecord {
        self.map
            .locate_slot(DEFAULT_KEYSPACE, key_hash_slot(key))
            .unwrap()
            .clone()
    }

    fn hit(&self, key: &str, times: usize, write: bool) {
        let p = self.partition_of(key.as_bytes());
        for _ in 0..times {
            let now = self.clock.now();
            self.stats
                .record_key(p.id, &ks(), key.as_bytes(), write, now);
        }
    }

    fn report(&self, key: &str) -> PartitionReport {
        let p = self.partition_of(key.as_bytes());
        self.stats.partition_report(&self.map, &p)
    }
}

#[test]
fn rates_follow_a_sliding_window_on_the_node_clock() {
    let w = world(config());
    w.hit("a", 400, false);
    w.hit("a", 100, true);
    // Still in the first window: 500 requests over a 10 s window.
    let r = w.report("a");
    assert_eq!((r.reads_per_sec, r.writes_per_sec), (40.0, 10.0));
    // Next window, a quarter in: the previous window counts for 3/4.
    w.clock.advance(12_500);
    w.hit("a", 100, false);
    let r = w.report("a");
    assert!(
        (r.reads_per_sec - (100.0 + 400.0 * 0.75) / 10.0).abs() < 1e-9,
        "{r:?}"
    );
    assert!(
        (r.writes_per_sec - 100.0 * 0.75 / 10.0).abs() < 1e-9,
        "{r:?}"
    );
    // Two idle windows later nothing counts.
    w.clock.advance(20_000);
    let r = w.report("a");
    assert_eq!((r.reads_per_sec, r.writes_per_sec), (0.0, 0.0));
    assert!(r.hot_keys.is_empty());
    assert_eq!(r.top_key_share, 0.0);
}

/// Keys of the first partition (slots 0..4096), with distinct slots.
fn keys_of_first_partition(w: &World, n: usize) -> Vec<String> {
    let first = w.map.partitions.values().next().unwrap().id;
    let mut slots = HashSet::new();
    (0..)
        .map(|i| format!("user:{i}"))
        .filter(|k| w.partition_of(k.as_bytes()).id == first)
        .filter(|k| slots.insert(key_hash_slot(k.as_bytes())))
        .take(n)
        .collect()
}

#[test]
fn a_hot_key_comes_first_dominates_and_leaves_no_load_split_key() {
    let w = world(config());
    let keys = keys_of_first_partition(&w, 20);
    w.hit(&keys[3], 900, true);
    for k in &keys {
        w.hit(k, 10, false);
    }
    let r = w.report(&keys[3]);
    assert_eq!(r.hot_keys[0].key, Bytes::from(keys[3].clone()));
    assert!(r.hot_keys.len() <= 4);
    let expected_share = 910.0 / 1100.0;
    assert!((r.top_key_share - expected_share).abs() < 1e-9, "{r:?}");
    assert!((r.hot_keys[0].per_sec - 91.0).abs() < 1e-6, "{r:?}");
    assert_eq!(r.load_split_key, None, "one key dominates");
}

/// Hits per key (key i of the first partition gets `(n - i) * scale`), fed
/// to `w`; returns the load below `split` and the total.
fn skewed_load(w: &World, n: usize, scale: usize) -> (Vec<(String, usize)>, usize) {
    let weights: Vec<(String, usize)> = keys_of_first_partition(w, n)
        .into_iter()
        .enumerate()
        .map(|(i, k)| (k, (n - i) * scale))
        .collect();
    for (k, hits) in &weights {
        w.hit(k, *hits, false);
    }
    let total = weights.iter().map(|(_, h)| h).sum();
    (weights, total)
}

fn below(weights: &[(String, usize)], split: &[u8]) -> usize {
    weights
        .iter()
        .filter(|(k, _)| key_hash_slot(k.as_bytes()).to_be_bytes() < [split[0], split[1]])
        .map(|(_, n)| n)
        .sum()
}

#[test]
fn the_load_split_key_halves_a_skewed_load_and_needs_enough_samples() {
    // Fewer samples than the reservoir holds: the split is exact, off half
    // by at most the one key straddling it (20 of 210).
    let w = world(config());
    let (weights, total) = skewed_load(&w, 20, 1);
    assert!(total <= sampler::RESERVOIR_KEYS);
    let r = w.report(&weights[0].0);
    assert!(r.top_key_share <= 0.5);
    let split = r.load_split_key.clone().expect("a load split key");
    assert_eq!(split.len(), 2, "slot-aligned in a hash keyspace");
    let p = w.partition_of(weights[0].0.as_bytes());
    assert!(split > p.start && p.contains(&split));
    let b = below(&weights, &split);
    assert!(
        b.abs_diff(total - b) <= 20,
        "below {b} of {total} at {split:?}"
    );

    // Many more: the reservoir's uniform sample still halves it (the
    // difference's standard deviation is about total / 16; allow 4 of them).
    let w = world(config());
    let (weights, total) = skewed_load(&w, 30, 20);
    let split = w
        .report(&weights[0].0)
        .load_split_key
        .expect("a load split key");
    let b = below(&weights, &split);
    assert!(
        b.abs_diff(total - b) <= total / 4,
        "below {b} of {total} at {split:?}"
    );

    // Too few samples: no split key, though the load is spread.
    let w = world(config());
    let keys = keys_of_first_partition(&w, 5);
    for k in &keys {
        w.hit(k, 5, false);
    }
    let r = w.report(&keys[0]);
    assert!(r.samples < 50.0);
    assert_eq!(r.load_split_key, None);
}

#[test]
fn sampling_one_in_n_estimates_the_hot_key() {
    let mut c = config();
    c.sample_every = 8;
    c.split_min_samples = 1;
    let w = world(c);
    let keys = keys_of_first_partition(&w, 10);
    w.hit(&keys[0], 8_000, false);
    for k in &keys[1..] {
        w.hit(k, 500, false);
    }
    let r = w.report(&keys[0]);
    assert_eq!(r.reads_per_sec, 1_250.0, "every request is counted");
    assert!((1_000.0..1_700.0).contains(&r.samples), "{}", r.samples);
    assert_eq!(r.hot_keys[0].key, Bytes::from(keys[0].clone()));
    assert!((r.top_key_share - 8.0 / 12.5).abs() < 0.06, "{r:?}");
}

fn put(engine: &MemEngine, key: &str, data_len: usize, expire_at_ms: Option<u64>) {
    let storage_key = ks().storage_key(key.as_bytes());
    engine
        .apply(&[Mutation::Put {
            key: storage_key,
            kind: ValueKind::String,
            expire_at_ms,
            data: Bytes::from(vec![b'x'; data_len]),
        }])
        .unwrap();
}

#[tokio::test]
async fn the_size_scan_measures_live_keys_and_bytes_in_chunks() {
    let w = world(config());
    let keys = keys_of_first_partition(&w, 40);
    let mut bytes = 0;
    for k in &keys {
        put(&w.engine, k, 100, None);
        bytes += 6 + k.len() as u64 + 100;
    }
    put(
        &w.engine,
        &keys_of_first_partition(&w, 41)[40],
        100,
        Some(1),
    );
    let p = w.partition_of(keys[0].as_bytes());
    assert!(!w.report(&keys[0]).size_known);
    let (_stop_tx, mut stop) = watch::channel(false);
    w.stats.scan(&w.map, &p, &mut stop).await.unwrap();
    let r = w.report(&keys[0]);
    assert!(r.size_known);
    assert_eq!(
        (r.keys, r.bytes),
        (40, bytes),
        "the expired key is not counted"
    );
    let split = r.size_split_key.unwrap();
    let below = keys
        .iter()
        .filter(|k| key_hash_slot(k.as_bytes()).to_be_bytes() < [split[0], split[1]])
        .count();
    assert!(
        (15..=25).contains(&below),
        "{below} of 40 keys below {split:?}"
    );
    // Other partitions are not measured yet.
    let other = w.map.partitions.values().nth(1).unwrap();
    assert!(w.stats.size(other).is_none());
}

#[tokio::test]
async fn the_background_scan_measures_every_owned_partition() {
    let w = world(config());
    for k in keys_of_first_partition(&w, 10) {
        put(&w.engine, &k, 10, None);
    }
    let (stop_tx, stop) = watch::channel(false);
    let task = tokio::spawn(w.stats.clone().run(stop));
    let deadline = Instant::now() + Duration::from_secs(10);
    while w.map.partitions.values().any(|p| w.stats.size(p).is_none()) {
        assert!(Instant::now() < deadline, "every partition scanned");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let keys: u64 = w
        .map
        .partitions
        .values()
        .map(|p| w.stats.size(p).unwrap().keys)
        .sum();
    assert_eq!(keys, 10);
    stop_tx.send(true).unwrap();
    task.await.unwrap();
}

#[test]
fn gauges_are_labelled_by_partition_only() {
    let w = world(config());
    w.hit("hot", 100, false);
    w.stats.publish_gauges();
    let text = w.metrics.encode();
    let p = w.partition_of(b"hot").id;
    assert!(
        text.contains(&format!(
            "keyway_partition_requests_per_sec{{partition=\"{p}\"}} 10.0"
        )),
        "{text}"
    );
    assert!(text.contains(&format!(
        "keyway_partition_top_key_share{{partition=\"{p}\"}} 1.0"
    )));
    assert!(!text.contains("hot\""), "no key labels");
}
