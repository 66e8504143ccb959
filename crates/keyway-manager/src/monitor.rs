//! The load monitor: while this manager leads, every `stats_interval_ms` it
//! reads the map from the metadata store, asks every node for its partitions'
//! load ([`StatsSource`], the `PartitionStats` RPC in production) and
//! publishes the round as a [`LoadSnapshot`] on a `watch` channel
//! ([`LoadMonitor::subscribe`]). The splitter, the merger and the rebalancer
//! decide from the latest snapshot; none of them asks a node itself.
//!
//! When the seat stops leading the channel is cleared (`None`), so nothing
//! decides from a round taken under an earlier leadership. Each round also
//! sets the skew gauges (busiest node / mean over `Up` nodes, see
//! [`skew_ratio`]) and the cluster totals, and is served as JSON on the admin
//! port's `/load` ([`LoadView`]).

use crate::metrics::Metrics;
use crate::seat::SeatView;
use crate::stats::{ClusterLoad, LoadSnapshot, StatsSource};
use keyway_map::{NodeId, NodeState, PartitionMap};
use keyway_meta::MetaStore;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Settings of the [`LoadMonitor`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MonitorConfig {
    /// How often the leader gathers the nodes' load statistics.
    pub stats_interval_ms: u64,
    /// Deadline of one node's `PartitionStats` answer (at most the interval).
    pub stats_timeout_ms: u64,
}

impl Default for MonitorConfig {
    fn default() -> Self {
        MonitorConfig {
            stats_interval_ms: 5_000,
            stats_timeout_ms: 2_000,
        }
    }
}

impl MonitorConfig {
    /// Checks every field; the error names the setting.
    pub fn validate(&self) -> Result<(), String> {
        if self.stats_interval_ms == 0 {
            return Err("stats_interval_ms must be greater than 0".into());
        }
        if self.stats_timeout_ms == 0 {
            return Err("stats_timeout_ms must be greater than 0".into());
        }
        if self.stats_timeout_ms > self.stats_interval_ms {
            return Err(format!(
                "stats_timeout_ms ({}) must be at most stats_interval_ms ({})",
                self.stats_timeout_ms, self.stats_interval_ms
            ));
        }
        Ok(())
    }
}

/// The latest round, as every consumer receives it.
pub type LoadReceiver = watch::Receiver<Option<Arc<LoadSnapshot>>>;

/// Busiest over mean: `max / mean` of `loads` (one per `Up` node, idle nodes
/// included as 0). 1.0 is perfectly even; `n` (the node count) is all load
/// on one node. An empty list or no load at all counts as even (1.0).
pub fn skew_ratio(loads: &[f64]) -> f64 {
    if loads.is_empty() {
        return 1.0;
    }
    let mean = loads.iter().sum::<f64>() / loads.len() as f64;
    if mean <= 0.0 {
        return 1.0;
    }
    loads.iter().copied().fold(0.0, f64::max) / mean
}

/// One node's share of a round.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct NodeLoad {
    pub node: NodeId,
    pub partitions: usize,
    pub keys: u64,
    pub bytes: u64,
    pub requests_per_sec: f64,
}

/// Per `Up` node of `map`, the sum of the partitions it reported in `load`.
pub fn node_loads(map: &PartitionMap, load: &ClusterLoad) -> Vec<NodeLoad> {
    let mut by_node: BTreeMap<NodeId, NodeLoad> = map
        .nodes
        .values()
        .filter(|n| n.state == NodeState::Up)
        .map(|n| {
            let row = NodeLoad {
                node: n.id,
                ..NodeLoad::default()
            };
            (n.id, row)
        })
        .collect();
    for p in load.partitions.values() {
        if let Some(n) = by_node.get_mut(&p.node) {
            n.partitions += 1;
            n.keys += p.keys;
            n.bytes += p.bytes;
            n.requests_per_sec += p.requests_per_sec();
        }
    }
    by_node.into_values().collect()
}

/// Busiest node over the mean, in bytes and in requests.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Skew {
    pub bytes_ratio: f64,
    pub requests_ratio: f64,
}

impl Skew {
    pub fn of(nodes: &[NodeLoad]) -> Skew {
        let bytes: Vec<f64> = nodes.iter().map(|n| n.bytes as f64).collect();
        let requests: Vec<f64> = nodes.iter().map(|n| n.requests_per_sec).collect();
        Skew {
            bytes_ratio: skew_ratio(&bytes),
            requests_ratio: skew_ratio(&requests),
        }
    }
}

/// `/load`: the latest round.
#[derive(Debug, Serialize)]
pub struct LoadView<'a> {
    pub map_version: u64,
    /// Milliseconds since the round was taken.
    pub age_ms: u64,
    pub skew: Skew,
    pub nodes: Vec<NodeLoad>,
    pub load: &'a ClusterLoad,
}

impl<'a> LoadView<'a> {
    pub fn of(snapshot: &'a LoadSnapshot) -> Self {
        let nodes = node_loads(&snapshot.map, &snapshot.load);
        LoadView {
            map_version: snapshot.map.version.0,
            age_ms: snapshot.taken_at.elapsed().as_millis() as u64,
            skew: Skew::of(&nodes),
            nodes,
            load: &snapshot.load,
        }
    }
}

/// The monitor's gauges.
struct MonitorMetrics {
    skew_bytes: Gauge<f64, AtomicU64>,
    skew_requests: Gauge<f64, AtomicU64>,
    bytes: Gauge,
    requests: Gauge<f64, AtomicU64>,
    unreachable: Gauge,
    rounds: Counter,
}

impl MonitorMetrics {
    fn register(metrics: &Metrics) -> Self {
        let m = MonitorMetrics {
            skew_bytes: Gauge::default(),
            skew_requests: Gauge::default(),
            bytes: Gauge::default(),
            requests: Gauge::default(),
            unreachable: Gauge::default(),
            rounds: Counter::default(),
        };
        metrics.register(
            "skew_bytes_ratio",
            "Bytes of the fullest Up node over the mean of the Up nodes (1 = even)",
            m.skew_bytes.clone(),
        );
        metrics.register(
            "skew_requests_ratio",
            "Requests/s of the busiest Up node over the mean of the Up nodes (1 = even)",
            m.skew_requests.clone(),
        );
        metrics.register(
            "load_bytes",
            "Payload bytes of every partition reported in the last load round",
            m.bytes.clone(),
        );
        metrics.register(
            "load_requests_per_sec",
            "Requests per second over every partition reported in the last load round",
            m.requests.clone(),
        );
        metrics.register(
            "load_unreachable_nodes",
            "Up nodes that did not answer the last load round",
            m.unreachable.clone(),
        );
        metrics.register(
            "load_rounds",
            "Load rounds gathered while leading",
            m.rounds.clone(),
        );
        m
    }

    fn observe(&self, snapshot: &LoadSnapshot) {
        let nodes = node_loads(&snapshot.map, &snapshot.load);
        let skew = Skew::of(&nodes);
        self.skew_bytes.set(skew.bytes_ratio);
        self.skew_requests.set(skew.requests_ratio);
        let bytes: u64 = nodes.iter().map(|n| n.bytes).sum();
        self.bytes.set(i64::try_from(bytes).unwrap_or(i64::MAX));
        self.requests
            .set(nodes.iter().map(|n| n.requests_per_sec).sum());
        self.unreachable.set(snapshot.load.unreachable.len() as i64);
        self.rounds.inc();
    }
}

/// The running monitor; see the module docs.
pub struct LoadMonitor {
    rx: LoadReceiver,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl LoadMonitor {
    /// Starts gathering (whenever `seat` leads). `config` must pass
    /// [`MonitorConfig::validate`] (panics otherwise).
    pub fn start(
        meta: Arc<dyn MetaStore>,
        seat: SeatView,
        source: Arc<dyn StatsSource>,
        config: MonitorConfig,
        metrics: &Metrics,
    ) -> LoadMonitor {
        if let Err(e) = config.validate() {
            panic!("LoadMonitor::start: {e}");
        }
        let (tx, rx) = watch::channel(None);
        let (stop, stop_rx) = watch::channel(false);
        let metrics = MonitorMetrics::register(metrics);
        let task = tokio::spawn(run(meta, seat, source, config, metrics, tx, stop_rx));
        LoadMonitor { rx, stop, task }
    }

    /// The latest round (`None` while not leading, or before the first).
    pub fn subscribe(&self) -> LoadReceiver {
        self.rx.clone()
    }

    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

async fn run(
    meta: Arc<dyn MetaStore>,
    seat: SeatView,
    source: Arc<dyn StatsSource>,
    config: MonitorConfig,
    metrics: MonitorMetrics,
    tx: watch::Sender<Option<Arc<LoadSnapshot>>>,
    mut stop: watch::Receiver<bool>,
) {
    let interval = Duration::from_millis(config.stats_interval_ms);
    let timeout = Duration::from_millis(config.stats_timeout_ms);
    let mut seat_rx = seat.subscribe();
    let mut seat_alive = true;
    let mut term = None;
    let mut next_round = Instant::now();
    while !*stop.borrow_and_update() {
        let leading = seat.leading();
        if leading != term {
            // A new term starts with a fresh round; none carries over.
            tx.send_replace(None);
            term = leading.clone();
            next_round = Instant::now();
        }
        if leading.is_some() && Instant::now() >= next_round {
            next_round = Instant::now() + interval;
            match meta.get_map().await {
                Ok(map) => {
                    let map = Arc::new(map);
                    let load = source.collect(&map, timeout).await;
                    // Publish only under the term the round was taken in.
                    if seat.leading() == term {
                        let snapshot = LoadSnapshot {
                            map,
                            load,
                            taken_at: Instant::now(),
                        };
                        metrics.observe(&snapshot);
                        tx.send_replace(Some(Arc::new(snapshot)));
                    }
                }
                Err(err) => tracing::debug!(%err, "load monitor: cannot read the map"),
            }
            continue;
        }
        let wait = next_round.saturating_duration_since(Instant::now());
        tokio::select! {
            changed = stop.changed() => if changed.is_err() { break },
            changed = seat_rx.changed(), if seat_alive => seat_alive = changed.is_ok(),
            () = tokio::time::sleep(if term.is_some() { wait } else { interval }) => {}
        }
    }
    tx.send_replace(None);
}

/// `/load` as an HTTP response: the latest round, or 503 while there is none.
pub(crate) fn load_response(rx: &LoadReceiver) -> axum::response::Response {
    use axum::response::IntoResponse;
    let snapshot = rx.borrow().clone();
    match snapshot {
        Some(s) => axum::Json(LoadView::of(&s)).into_response(),
        None => (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(serde_json::json!({
                "error": "no load round yet (this manager is not leading, or its first round has not finished)"
            })),
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::PartitionLoad;
    use crate::{Seat, SeatConfig};
    use keyway_map::{Epoch, NodeInfo, PartitionId};
    use keyway_meta::{EmbeddedMeta, EmbeddedOptions};
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn skew_is_the_busiest_over_the_mean() {
        assert_eq!(skew_ratio(&[]), 1.0);
        assert_eq!(skew_ratio(&[0.0, 0.0]), 1.0);
        assert_eq!(skew_ratio(&[5.0, 5.0, 5.0]), 1.0);
        assert_eq!(skew_ratio(&[9.0, 0.0, 0.0]), 3.0);
        assert!((skew_ratio(&[1.0, 2.0, 3.0]) - 1.5).abs() < 1e-12);
    }

    fn nodes(n: u64) -> Vec<NodeInfo> {
        (1..=n)
            .map(|i| NodeInfo {
                id: NodeId(i),
                resp_addr: format!("127.0.0.1:{i}"),
                admin_addr: format!("127.0.0.1:{}", 100 + i),
                state: NodeState::Up,
                weight: keyway_map::DEFAULT_NODE_WEIGHT,
                draining: false,
                zone: None,
                replica_addr: None,
            })
            .collect()
    }

    fn part(id: u64, node: u64, bytes: u64, rps: f64) -> PartitionLoad {
        PartitionLoad {
            partition: PartitionId(id),
            epoch: Epoch(1),
            node: NodeId(node),
            keys: bytes / 10,
            bytes,
            reads_per_sec: rps,
            writes_per_sec: 0.0,
            load_split_key: None,
            size_split_key: None,
            hot_keys: vec![],
            top_key_share: 0.0,
        }
    }

    #[test]
    fn node_loads_count_idle_up_nodes_and_skip_down_ones() {
        let mut map = PartitionMap::bootstrap(&nodes(3), 1).unwrap();
        map.nodes.get_mut(&NodeId(3)).unwrap().state = NodeState::Down;
        map.nodes.insert(NodeId(4), nodes(4).pop().unwrap());
        let mut load = ClusterLoad::default();
        for p in [
            part(1, 1, 300, 10.0),
            part(2, 1, 100, 20.0),
            part(3, 2, 200, 0.0),
        ] {
            load.partitions.insert(p.partition, p);
        }
        let rows = node_loads(&map, &load);
        let ids: Vec<u64> = rows.iter().map(|r| r.node.0).collect();
        assert_eq!(ids, [1, 2, 4]);
        assert_eq!((rows[0].bytes, rows[0].requests_per_sec), (400, 30.0));
        let skew = Skew::of(&rows);
        assert!((skew.bytes_ratio - 2.0).abs() < 1e-12, "400 / (600 / 3)");
        assert!((skew.requests_ratio - 3.0).abs() < 1e-12);
    }

    /// Reports one partition per node, counting calls.
    struct Fake {
        calls: AtomicUsize,
    }

    #[async_trait::async_trait]
    impl StatsSource for Fake {
        async fn collect(&self, map: &PartitionMap, _timeout: Duration) -> ClusterLoad {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let mut load = ClusterLoad::default();
            for p in map.partitions.values() {
                load.partitions
                    .insert(p.id, part(p.id.0, p.owner.0, 100, 1.0));
            }
            load
        }
    }

    #[tokio::test]
    async fn publishes_rounds_only_while_leading_and_clears_on_shutdown() {
        let dir = tempfile::tempdir().unwrap();
        let meta: Arc<dyn MetaStore> =
            Arc::new(EmbeddedMeta::open(dir.path(), EmbeddedOptions::default()).unwrap());
        for n in nodes(2) {
            meta.register_node(None, n.resp_addr, n.admin_addr)
                .await
                .unwrap();
        }
        meta.bootstrap_if_empty(2, 2).await.unwrap();
        let metrics = Metrics::new();
        let seat = Seat::start(
            meta.clone(),
            SeatConfig::new("monitor-test", Duration::from_millis(2_000)),
            Arc::new(Metrics::new()),
        );
        let fake = Arc::new(Fake {
            calls: AtomicUsize::new(0),
        });
        let config = MonitorConfig {
            stats_interval_ms: 50,
            stats_timeout_ms: 50,
        };
        let monitor = LoadMonitor::start(meta.clone(), seat.view(), fake.clone(), config, &metrics);
        let mut rx = monitor.subscribe();
        let snapshot = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if let Some(s) = rx.borrow_and_update().clone() {
                    return s;
                }
                rx.changed().await.unwrap();
            }
        })
        .await
        .expect("a round while leading");
        assert_eq!(snapshot.load.partitions.len(), 4);
        let text = metrics.encode();
        assert!(
            text.contains("keyway_manager_skew_bytes_ratio 1.0"),
            "{text}"
        );
        assert!(text.contains("keyway_manager_load_bytes 400"), "{text}");
        // Rounds keep coming at the interval.
        let before = fake.calls.load(Ordering::SeqCst);
        tokio::time::timeout(Duration::from_secs(10), async {
            while fake.calls.load(Ordering::SeqCst) < before + 2 {
                rx.changed().await.unwrap();
            }
        })
        .await
        .expect("more rounds");
        seat.shutdown().await;
        tokio::time::timeout(Duration::from_secs(10), async {
            while rx.borrow_and_update().is_some() {
                rx.changed().await.unwrap();
            }
        })
        .await
        .expect("cleared once not leading");
        monitor.shutdown().await;
    }
}
