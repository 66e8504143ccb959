//! Request counting and sampling on the request path.
//!
//! Every admitted data command is counted (read or write) for its partition;
//! about one in `sample_every` (chosen at random, so a periodic workload
//! cannot alias with it) also offers its routing key to the partition's
//! space-saving sketch and reservoir. The state lives in [`Shards`]: each
//! recording thread sticks to one shard (a thread-local index), so the
//! executor threads never contend; a shard's mutex is only ever contended by
//! a reader merging the shards (a scrape, an RPC).
//!
//! Time is cut into windows of `window` on the node's [`Clock`]. Each
//! partition keeps its current and previous window; the rate is the
//! sliding-window estimate `(current + previous * (1 - f)) / window`, `f`
//! being the fraction of the current window elapsed. Sketches and
//! reservoirs start afresh each window (so a key that cooled down leaves
//! the top-k within two windows).

use super::topk::SpaceSaving;
use crate::clock::Clock;
use bytes::Bytes;
use keyway_map::PartitionId;
use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Shards of the recording state (recording threads map onto them in turn).
pub const SHARDS: usize = 8;
/// Space-saving counters kept per `hot_keys_k` reported (more counters, a
/// smaller over-estimate).
pub const SKETCH_COUNTERS_PER_HOT_KEY: usize = 4;
/// Sampled routing keys kept per partition, shard and window for the load
/// split key (uniform reservoir).
pub const RESERVOIR_KEYS: usize = 256;
/// Longest routing key kept in a reservoir: longer ones are cut (a prefix
/// of a key sorts at or below it, so it is still a valid boundary).
pub const RESERVOIR_KEY_BYTES: usize = 128;

/// What the sampler is configured with.
#[derive(Clone, Copy, Debug)]
pub struct SamplerConfig {
    pub window: Duration,
    /// About one request in this many is sampled (1 = all).
    pub sample_every: u32,
    /// Keys reported per partition.
    pub hot_keys_k: usize,
}

/// One window's counts of one partition (on one shard).
#[derive(Clone, Debug)]
pub struct Window {
    pub reads: u64,
    pub writes: u64,
    pub sketch: SpaceSaving,
    pub reservoir: Reservoir,
}

impl Window {
    fn new(config: &SamplerConfig) -> Self {
        Window {
            reads: 0,
            writes: 0,
            sketch: SpaceSaving::new(config.hot_keys_k * SKETCH_COUNTERS_PER_HOT_KEY),
            reservoir: Reservoir::default(),
        }
    }
}

/// A uniform sample (Algorithm R) of the routing keys offered in a window.
#[derive(Clone, Debug, Default)]
pub struct Reservoir {
    pub keys: Vec<Bytes>,
    /// Keys offered (each kept key stands for `seen / keys.len()` of them).
    pub seen: u64,
}

impl Reservoir {
    fn offer(&mut self, key: &[u8]) {
        self.seen += 1;
        let cut = || Bytes::copy_from_slice(&key[..key.len().min(RESERVOIR_KEY_BYTES)]);
        if self.keys.len() < RESERVOIR_KEYS {
            self.keys.push(cut());
        } else {
            let slot = (next_random() % self.seen) as usize;
            if slot < RESERVOIR_KEYS {
                self.keys[slot] = cut();
            }
        }
    }

    /// How many offered keys each kept key stands for.
    pub fn weight(&self) -> f64 {
        if self.keys.is_empty() {
            0.0
        } else {
            self.seen as f64 / self.keys.len() as f64
        }
    }
}

/// One partition's two windows on one shard.
#[derive(Clone, Debug)]
struct PartitionWindows {
    index: u64,
    current: Window,
    previous: Option<Window>,
}

impl PartitionWindows {
    /// Moves to window `index` (the current becomes the previous only when
    /// they are adjacent).
    fn roll(&mut self, index: u64, config: &SamplerConfig) {
        if index == self.index {
            return;
        }
        let old = std::mem::replace(&mut self.current, Window::new(config));
        self.previous = (index == self.index + 1).then_some(old);
        self.index = index;
    }
}

/// The windows of one partition as read at one instant, across shards:
/// each with the weight it counts for in the sliding estimate.
pub struct Merged {
    pub windows: Vec<(Window, f64)>,
    /// Length of one window.
    pub window: Duration,
}

impl Merged {
    fn rate(&self, f: impl Fn(&Window) -> u64) -> f64 {
        let sum: f64 = self.windows.iter().map(|(w, k)| f(w) as f64 * k).sum();
        sum / self.window.as_secs_f64()
    }

    pub fn reads_per_sec(&self) -> f64 {
        self.rate(|w| w.reads)
    }

    pub fn writes_per_sec(&self) -> f64 {
        self.rate(|w| w.writes)
    }
}

/// FNV: partition ids are the node's own, a few per node, looked up on
/// every request (std's SipHash showed in `bench/profile.sh` under
/// `GET -P 16`).
type Shard = HashMap<PartitionId, PartitionWindows, keyway_command::name::Fnv1aBuild>;

/// The recording state; see the module docs.
pub struct Shards {
    config: SamplerConfig,
    clock: Arc<dyn Clock>,
    base: Instant,
    shards: Vec<Mutex<Shard>>,
}

static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static MY_SHARD: usize = NEXT_SHARD.fetch_add(1, Ordering::Relaxed) % SHARDS;
    static RNG: Cell<u64> = Cell::new(rand::random::<u64>() | 1);
}

/// xorshift64*: cheap per-thread randomness for the sampling decision.
fn next_random() -> u64 {
    RNG.with(|r| {
        let mut x = r.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        r.set(x);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    })
}

impl Shards {
    pub fn new(config: SamplerConfig, clock: Arc<dyn Clock>) -> Self {
        let base = clock.now();
        Shards {
            config,
            clock,
            base,
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
        }
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.config
    }

    /// The current window's index and the fraction of it elapsed.
    fn position(&self) -> (u64, f64) {
        self.position_at(self.clock.now())
    }

    fn position_at(&self, now: Instant) -> (u64, f64) {
        let window_ms = self.config.window.as_millis().max(1) as u64;
        let ms = now.saturating_duration_since(self.base).as_millis() as u64;
        (ms / window_ms, (ms % window_ms) as f64 / window_ms as f64)
    }

    /// Counts one request made at `now` (the node clock's; the caller's
    /// read, so a request reads the clock once); `key` builds its routing
    /// key, called only when the request is sampled.
    pub fn record(
        &self,
        partition: PartitionId,
        write: bool,
        now: Instant,
        key: impl FnOnce() -> Bytes,
    ) {
        let sampled = self.config.sample_every <= 1
            || next_random().is_multiple_of(u64::from(self.config.sample_every));
        let key = sampled.then(key);
        let (index, _) = self.position_at(now);
        let shard = MY_SHARD.with(|s| *s);
        let mut shard = self.shards[shard].lock().unwrap_or_else(|e| e.into_inner());
        let windows = shard.entry(partition).or_insert_with(|| PartitionWindows {
            index,
            current: Window::new(&self.config),
            previous: None,
        });
        windows.roll(index, &self.config);
        let w = &mut windows.current;
        if write {
            w.writes += 1;
        } else {
            w.reads += 1;
        }
        if let Some(key) = key {
            w.sketch.offer(&key, 1);
            w.reservoir.offer(&key);
        }
    }

    /// The windows of `partition` that count now, with their weights.
    pub fn merged(&self, partition: PartitionId) -> Merged {
        let (index, f) = self.position();
        let mut windows = Vec::new();
        for shard in &self.shards {
            let shard = shard.lock().unwrap_or_else(|e| e.into_inner());
            let Some(p) = shard.get(&partition) else {
                continue;
            };
            if p.index == index {
                windows.push((p.current.clone(), 1.0));
                if let Some(prev) = &p.previous {
                    windows.push((prev.clone(), 1.0 - f));
                }
            } else if p.index + 1 == index {
                windows.push((p.current.clone(), 1.0 - f));
            }
        }
        Merged {
            windows,
            window: self.config.window,
        }
    }

    /// Forgets partitions not in `keep` and those idle for two windows.
    pub fn retain(&self, keep: &HashSet<PartitionId>) {
        let (index, _) = self.position();
        for shard in &self.shards {
            let mut shard = shard.lock().unwrap_or_else(|e| e.into_inner());
            shard.retain(|id, p| keep.contains(id) && p.index + 1 >= index);
        }
    }
}
