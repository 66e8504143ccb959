//! Per-partition load statistics: what the manager's splitter, merger and
//! rebalancer decide from (served by the `PartitionStats` Peer RPC, the
//! admin port's `/hotkeys` and `/metrics`).
//!
//! For every partition this node owns:
//! - **rates**: reads and writes per second over a sliding window of
//!   `stats_window_ms` on the node's clock (`sampler.rs`); every admitted
//!   data command is counted once, by its first key;
//! - **hot keys**: about one request in `stats_sample_every` is sampled; its
//!   routing key feeds a space-saving sketch (`topk.rs`) of which the
//!   `hot_keys_k` heaviest are reported, with their share of the samples;
//! - **load split key**: from a uniform reservoir of the sampled routing
//!   keys, the boundary that halves the sampled load (`split.rs`); none with
//!   fewer than `stats_split_min_samples` samples in the window or when the
//!   busiest key's share exceeds `stats_dominant_key_share` (a split cannot
//!   divide one key's load);
//! - **size**: live keys, payload bytes (storage key + data, as
//!   `Engine::range_stats` counts them) and the size split key, from a
//!   chunked background scan (`size.rs`) every `stats_scan_interval_ms`.
//!
//! Split keys are keyspace-local routing keys at which the partition may be
//! cut: slot bounds (`be16(slot)`) in a hash keyspace, keys in a range
//! keyspace. Hot keys are reported as user keys.
//!
//! Recording ([`Stats::record`], [`Stats::record_key`]) costs one
//! uncontended mutex of the calling thread's shard and, when sampled, one
//! key copy: no global lock on the request path.

pub mod sampler;
pub mod size;
pub mod split;
pub mod topk;

use crate::clock::Clock;
use crate::config::NodeConfig;
use crate::metrics::Metrics;
use crate::routing::Routing;
use bytes::Bytes;
use keyway_map::{Keyspace, NodeId, PartitionId, PartitionMap, PartitionRecord};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use sampler::{SamplerConfig, Shards};
use serde::Serialize;
use size::{PartitionSize, ScanError, Sizes};
use std::collections::HashSet;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Pause after a failed size scan before the next attempt.
const SCAN_RETRY: Duration = Duration::from_secs(1);

/// The statistics settings (from [`NodeConfig`]'s `stats_*` and `hot_keys_k`).
#[derive(Clone, Copy, Debug)]
pub struct StatsConfig {
    pub window: Duration,
    pub sample_every: u32,
    pub hot_keys_k: usize,
    /// Fewest sampled requests (weighted, in the window) for a load split key.
    pub split_min_samples: u64,
    /// A busiest key with a larger share of the samples means no load split key.
    pub dominant_key_share: f64,
    pub scan_interval: Duration,
    pub scan_chunk_keys: usize,
}

impl StatsConfig {
    pub fn from_node(c: &NodeConfig) -> Self {
        StatsConfig {
            window: Duration::from_millis(c.stats_window_ms),
            sample_every: c.stats_sample_every,
            hot_keys_k: c.hot_keys_k,
            split_min_samples: c.stats_split_min_samples,
            dominant_key_share: c.stats_dominant_key_share,
            scan_interval: Duration::from_millis(c.stats_scan_interval_ms),
            scan_chunk_keys: c.stats_scan_chunk_keys,
        }
    }
}

pub use keyway_peer::stats::{HotKeyReport, NodeReport, PartitionReport};

/// Label of the per-partition gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PartitionLabel {
    pub partition: u64,
}

type FloatGauges = Family<PartitionLabel, Gauge<f64, AtomicU64>>;

/// The statistics' own metrics (registered in the node's registry).
struct StatsMetrics {
    requests: FloatGauges,
    top_share: FloatGauges,
    top_rate: FloatGauges,
    keys: Family<PartitionLabel, Gauge>,
    bytes: Family<PartitionLabel, Gauge>,
    scans: Counter,
    /// Partitions with published labels (removed once no longer owned).
    labelled: Mutex<HashSet<PartitionId>>,
}

impl StatsMetrics {
    fn register(metrics: &Metrics) -> Self {
        let m = StatsMetrics {
            requests: FloatGauges::default(),
            top_share: FloatGauges::default(),
            top_rate: FloatGauges::default(),
            keys: Family::default(),
            bytes: Family::default(),
            scans: Counter::default(),
            labelled: Mutex::default(),
        };
        metrics.register(
            "partition_requests_per_sec",
            "Requests per second to an owned partition over the stats window",
            m.requests.clone(),
        );
        metrics.register(
            "partition_top_key_share",
            "Share of an owned partition's sampled requests that went to its busiest key",
            m.top_share.clone(),
        );
        metrics.register(
            "partition_top_key_requests_per_sec",
            "Estimated requests per second to an owned partition's busiest key",
            m.top_rate.clone(),
        );
        metrics.register(
            "partition_keys",
            "Live keys of an owned partition as of its last size scan",
            m.keys.clone(),
        );
        metrics.register(
            "partition_bytes",
            "Payload bytes (key + data) of an owned partition as of its last size scan",
            m.bytes.clone(),
        );
        metrics.register(
            "stats_size_scans",
            "Partition size scans completed",
            m.scans.clone(),
        );
        m
    }
}

/// The node's statistics; see the module docs.
pub struct Stats {
    me: NodeId,
    routing: Arc<Routing>,
    engine: Arc<dyn keyway_storage::Engine>,
    clock: Arc<dyn Clock>,
    config: StatsConfig,
    shards: Shards,
    sizes: Sizes,
    metrics: StatsMetrics,
}

impl Stats {
    pub fn new(
        me: NodeId,
        routing: Arc<Routing>,
        engine: Arc<dyn keyway_storage::Engine>,
        clock: Arc<dyn Clock>,
        config: StatsConfig,
        metrics: &Metrics,
    ) -> Self {
        let shards = Shards::new(
            SamplerConfig {
                window: config.window,
                sample_every: config.sample_every,
                hot_keys_k: config.hot_keys_k,
            },
            clock.clone(),
        );
        Stats {
            me,
            routing,
            engine,
            clock,
            config,
            shards,
            sizes: Sizes::default(),
            metrics: StatsMetrics::register(metrics),
        }
    }

    pub fn config(&self) -> &StatsConfig {
        &self.config
    }

    /// Counts one request to `partition` (a write if `write`), whose
    /// keyspace-local routing key is `routing_key`.
    pub fn record(&self, partition: PartitionId, routing_key: &[u8], write: bool) {
        let now = self.clock.now();
        self.shards.record(partition, write, now, || {
            Bytes::copy_from_slice(routing_key)
        });
    }

    /// [`Stats::record`] by user key, for a request made at `now` (the
    /// node clock's): the routing key is built only when the request is
    /// sampled.
    pub fn record_key(
        &self,
        partition: PartitionId,
        keyspace: &Keyspace,
        key: &[u8],
        write: bool,
        now: Instant,
    ) {
        self.shards
            .record(partition, write, now, || keyspace.local_routing_key(key));
    }

    /// The statistics of one owned partition of `map`.
    pub fn partition_report(&self, map: &PartitionMap, p: &PartitionRecord) -> PartitionReport {
        let routing = map
            .keyspaces
            .get(&p.keyspace)
            .map_or(keyway_map::Routing::Hash, |k| k.routing);
        let merged = self.shards.merged(p.id);
        let reads_per_sec = merged.reads_per_sec();
        let writes_per_sec = merged.writes_per_sec();
        let rate = reads_per_sec + writes_per_sec;
        let (top, samples) = topk::merge_ranked(
            merged
                .windows
                .iter()
                .map(|(w, weight)| (&w.sketch, *weight)),
            self.config.hot_keys_k,
        );
        let share = |count: f64| {
            if samples > 0.0 {
                (count / samples).min(1.0)
            } else {
                0.0
            }
        };
        let top_key_share = top.first().map_or(0.0, |(_, c)| share(*c));
        let hot_keys = top
            .iter()
            .map(|(k, c)| HotKeyReport {
                key: user_key(routing, k),
                per_sec: share(*c) * rate,
            })
            .collect();
        let enough = samples >= self.config.split_min_samples as f64;
        let load_split_key = (enough && top_key_share <= self.config.dominant_key_share)
            .then(|| {
                let cuts = merged.windows.iter().flat_map(|(w, weight)| {
                    let each = w.reservoir.weight() * weight;
                    w.reservoir
                        .keys
                        .iter()
                        .map(move |k| (Bytes::copy_from_slice(split::boundary(routing, k)), each))
                });
                split::load_split_key(cuts.filter(|(b, _)| p.contains(b)).collect())
            })
            .flatten();
        let size = self.sizes.get(p);
        PartitionReport {
            partition: p.id,
            epoch: p.epoch,
            size_known: size.is_some(),
            keys: size.as_ref().map_or(0, |s| s.keys),
            bytes: size.as_ref().map_or(0, |s| s.bytes),
            reads_per_sec,
            writes_per_sec,
            load_split_key,
            size_split_key: size.and_then(|s| s.split_key),
            hot_keys,
            top_key_share,
            samples,
        }
    }

    /// Every partition this node owns in its installed map.
    pub fn report(&self) -> NodeReport {
        let map = self.routing.map();
        NodeReport {
            node: self.me,
            map_version: map.version.0,
            window_ms: self.config.window.as_millis() as u64,
            partitions: map
                .owned_by(self.me)
                .map(|p| self.partition_report(&map, p))
                .collect(),
            copies: Vec::new(),
        }
    }

    /// The size of `p` as of its last scan over its current range.
    pub fn size(&self, p: &PartitionRecord) -> Option<PartitionSize> {
        self.sizes.get(p)
    }

    /// Refreshes the per-partition gauges (called on each `/metrics` scrape);
    /// labels of partitions no longer owned are removed.
    pub fn publish_gauges(&self) {
        let report = self.report();
        let m = &self.metrics;
        let mut labelled = m.labelled.lock().unwrap_or_else(|e| e.into_inner());
        let now: HashSet<PartitionId> = report.partitions.iter().map(|p| p.partition).collect();
        for gone in labelled.difference(&now) {
            let l = PartitionLabel { partition: gone.0 };
            m.requests.remove(&l);
            m.top_share.remove(&l);
            m.top_rate.remove(&l);
            m.keys.remove(&l);
            m.bytes.remove(&l);
        }
        for p in &report.partitions {
            let l = PartitionLabel {
                partition: p.partition.0,
            };
            let gauge = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
            m.requests.get_or_create(&l).set(p.requests_per_sec());
            m.top_share.get_or_create(&l).set(p.top_key_share);
            let top_rate = p.hot_keys.first().map_or(0.0, |h| h.per_sec);
            m.top_rate.get_or_create(&l).set(top_rate);
            m.keys.get_or_create(&l).set(gauge(p.keys));
            m.bytes.get_or_create(&l).set(gauge(p.bytes));
        }
        *labelled = now;
    }

    /// `/hotkeys`: every owned partition's hot keys, as JSON.
    pub fn hot_keys_view(&self) -> HotKeysView {
        let r = self.report();
        HotKeysView {
            node: r.node.to_string(),
            map_version: r.map_version,
            window_ms: r.window_ms,
            partitions: r
                .partitions
                .into_iter()
                .map(|p| PartitionHotKeys {
                    partition: p.partition.0,
                    epoch: p.epoch.0,
                    requests_per_sec: p.requests_per_sec(),
                    top_key_share: p.top_key_share,
                    samples: p.samples,
                    hot_keys: p
                        .hot_keys
                        .iter()
                        .map(|h| HotKeyView {
                            key: key_text(&h.key),
                            per_sec: h.per_sec,
                        })
                        .collect(),
                })
                .collect(),
        }
    }

    /// The background size scanner and housekeeping, until `shutdown`: scans
    /// the next due partition (see [`Sizes::next_due`]), else waits for it,
    /// a map change or shutdown. Forgets partitions this node no longer owns.
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let mut changes = self.routing.subscribe();
        loop {
            if *shutdown.borrow() {
                return;
            }
            changes.mark_unchanged();
            let map = self.routing.map();
            let owned: Vec<PartitionRecord> = map.owned_by(self.me).cloned().collect();
            let keep: HashSet<PartitionId> = owned.iter().map(|p| p.id).collect();
            self.sizes.retain(&keep);
            self.shards.retain(&keep);
            let now = self.clock.now();
            let wait = match self.sizes.next_due(&owned, self.config.scan_interval) {
                Some((p, due)) if due.is_none_or(|at| at <= now) => {
                    match self.scan(&map, &p, &mut shutdown).await {
                        Ok(()) => continue,
                        Err(ScanError::Stopped) => return,
                        Err(ScanError::Failed(err)) => {
                            tracing::warn!(partition = %p.id, %err, "partition size scan failed");
                            SCAN_RETRY
                        }
                    }
                }
                Some((_, Some(at))) => at.saturating_duration_since(now),
                _ => self.config.scan_interval,
            };
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                r = changes.changed() => if r.is_err() { return },
                _ = shutdown.changed() => return,
            }
        }
    }

    async fn scan(
        &self,
        map: &PartitionMap,
        p: &PartitionRecord,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<(), ScanError> {
        let routing = map
            .keyspaces
            .get(&p.keyspace)
            .map_or(keyway_map::Routing::Hash, |k| k.routing);
        let (keys, bytes, split_key) = size::scan_partition(
            &self.engine,
            p,
            routing,
            self.config.scan_chunk_keys,
            self.clock.unix_ms(),
            stop,
        )
        .await?;
        self.metrics.scans.inc();
        self.sizes.put(
            p.id,
            PartitionSize {
                start: p.start.clone(),
                end: p.end.clone(),
                keys,
                bytes,
                split_key,
                scanned_at: self.clock.now(),
            },
        );
        Ok(())
    }
}

/// The user key of a keyspace-local routing key.
fn user_key(routing: keyway_map::Routing, local: &Bytes) -> Bytes {
    match routing {
        keyway_map::Routing::Hash => local.slice(local.len().min(2)..),
        keyway_map::Routing::Range => local.clone(),
    }
}

/// Bytes as text for JSON: UTF-8 when it is, else `0x`-prefixed hex.
pub fn key_text(b: &[u8]) -> String {
    match std::str::from_utf8(b) {
        Ok(s) if !s.starts_with("0x") => s.to_string(),
        _ => format!("0x{}", keyway_map::to_hex(b)),
    }
}

/// `/hotkeys`.
#[derive(Debug, Serialize)]
pub struct HotKeysView {
    pub node: String,
    pub map_version: u64,
    pub window_ms: u64,
    pub partitions: Vec<PartitionHotKeys>,
}

/// One partition of `/hotkeys`.
#[derive(Debug, Serialize)]
pub struct PartitionHotKeys {
    pub partition: u64,
    pub epoch: u64,
    pub requests_per_sec: f64,
    pub top_key_share: f64,
    pub samples: f64,
    pub hot_keys: Vec<HotKeyView>,
}

/// One key of `/hotkeys`.
#[derive(Debug, Serialize)]
pub struct HotKeyView {
    pub key: String,
    pub per_sec: f64,
}

#[cfg(test)]
mod tests;
