//! The foreground load: an open-loop SET stream at a fixed rate over random
//! keys in all slots. Every SET is its own request on a pooled connection,
//! routed by a slot table; a `-MOVED` is followed (and triggers a throttled
//! `CLUSTER SLOTS` refresh, as cluster clients do), `TRYAGAIN` / `LOADING` /
//! `CLUSTERDOWN` and I/O errors are retried. Each write's latency is
//! recorded with its start time and slot, so it can be set against the moves.

use super::MigrateArgs;
use super::Rng;
use super::resp::{Pool, parse_moved};
use keyway_map::{DEFAULT_KEYSPACE, PartitionMap, key_hash_slot};
use keyway_resp::Frame;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// Redirects and retries a foreground write may take before it counts as failed.
const MAX_ATTEMPTS: usize = 32;

/// One foreground write.
pub(super) struct Sample {
    /// Start, µs since the load's base instant.
    pub(super) start_us: u64,
    pub(super) lat_us: u32,
    pub(super) slot: u16,
    pub(super) ok: bool,
}

/// What the writers share: routes, connections, and what they recorded.
pub(super) struct LoadShared {
    base: Instant,
    routes: RwLock<Vec<Arc<str>>>,
    pool: Pool,
    pub(super) samples: Mutex<Vec<Sample>>,
    pub(super) redirects: AtomicU64,
    pub(super) retried_errors: Mutex<BTreeMap<String, u64>>,
    pub(super) final_errors: Mutex<BTreeMap<String, u64>>,
    in_flight: AtomicU64,
    last_refresh_us: AtomicU64,
    keys: Vec<(Vec<u8>, u16)>,
    values: Arc<Vec<u8>>,
    vsize: usize,
}

/// A running load.
pub(super) struct Load {
    shared: Arc<LoadShared>,
    stop: Arc<AtomicBool>,
    scheduler: tokio::task::JoinHandle<()>,
}

impl Load {
    /// Starts writing at `args.rate` per second, routing by `map`; sample
    /// times count from `base`.
    pub(super) fn start(
        map: &PartitionMap,
        args: &MigrateArgs,
        values: Arc<Vec<u8>>,
        base: Instant,
    ) -> anyhow::Result<Load> {
        let mut routes: Vec<Arc<str>> = vec![Arc::from(""); keyway_map::SLOT_COUNT as usize];
        for p in map.keyspace_partitions(DEFAULT_KEYSPACE) {
            let addr: Arc<str> = Arc::from(map.nodes[&p.owner].resp_addr.as_str());
            let (a, b) = p.slot_span();
            for r in &mut routes[a as usize..=b as usize] {
                *r = addr.clone();
            }
        }
        let keys = (0..args.load_keys)
            .map(|n| {
                let k = format!("kwload:{n}").into_bytes();
                let slot = key_hash_slot(&k);
                (k, slot)
            })
            .collect();
        let shared = Arc::new(LoadShared {
            base,
            routes: RwLock::new(routes),
            pool: Pool::default(),
            samples: Mutex::new(Vec::new()),
            redirects: AtomicU64::new(0),
            retried_errors: Mutex::new(BTreeMap::new()),
            final_errors: Mutex::new(BTreeMap::new()),
            in_flight: AtomicU64::new(0),
            last_refresh_us: AtomicU64::new(0),
            keys,
            values,
            vsize: args.value_size as usize,
        });
        let stop = Arc::new(AtomicBool::new(false));
        let scheduler = tokio::spawn(schedule(shared.clone(), args.rate, stop.clone()));
        Ok(Load {
            shared,
            stop,
            scheduler,
        })
    }

    /// Stops issuing writes and waits (up to 30 s) for those in flight.
    pub(super) async fn stop(self) -> Arc<LoadShared> {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.scheduler.await;
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.shared.in_flight.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.shared
    }
}

/// Open loop: every millisecond, issue the writes that are due at `rate`.
async fn schedule(shared: Arc<LoadShared>, rate: u64, stop: Arc<AtomicBool>) {
    let start = Instant::now();
    let mut sent = 0u64;
    let mut rng = Rng(0x5eed);
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    while !stop.load(Ordering::SeqCst) {
        tick.tick().await;
        let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
        while sent < due {
            let key = (rng.next() % shared.keys.len() as u64) as usize;
            let off = (rng.next() % (shared.values.len() - shared.vsize) as u64) as usize;
            shared.in_flight.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(one_write(shared.clone(), key, off));
            sent += 1;
        }
    }
}

async fn one_write(shared: Arc<LoadShared>, key: usize, off: usize) {
    let started = Instant::now();
    let start_us = started.duration_since(shared.base).as_micros() as u64;
    let (k, slot) = &shared.keys[key];
    let value = &shared.values[off..off + shared.vsize];
    let mut addr = shared.routes.read().expect("routes")[*slot as usize].clone();
    let mut ok = false;
    let mut last_error = String::new();
    for attempt in 0..MAX_ATTEMPTS {
        match shared
            .pool
            .exec(&addr, &[b"SET".as_slice(), k, value])
            .await
        {
            Ok(Frame::Simple(s)) if s == "OK" => {
                ok = true;
                break;
            }
            Ok(Frame::Error(e)) => {
                if let Some(new) = parse_moved(&e) {
                    shared.redirects.fetch_add(1, Ordering::Relaxed);
                    addr = Arc::from(new);
                    shared.routes.write().expect("routes")[*slot as usize] = addr.clone();
                    maybe_refresh(&shared, &addr);
                    if attempt >= 3 {
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                    continue;
                }
                let kind = e.split_whitespace().next().unwrap_or("ERR").to_string();
                last_error = kind.clone();
                if matches!(kind.as_str(), "TRYAGAIN" | "LOADING" | "CLUSTERDOWN") {
                    *shared
                        .retried_errors
                        .lock()
                        .expect("errors")
                        .entry(kind)
                        .or_default() += 1;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
                last_error = e;
                break;
            }
            Ok(other) => {
                last_error = format!("unexpected reply {other:?}");
                break;
            }
            Err(e) => {
                let kind = format!("io: {}", e.kind());
                *shared
                    .retried_errors
                    .lock()
                    .expect("errors")
                    .entry(kind.clone())
                    .or_default() += 1;
                last_error = kind;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
    if !ok {
        let what = if last_error.is_empty() {
            "too many redirects".to_string()
        } else {
            last_error
        };
        *shared
            .final_errors
            .lock()
            .expect("errors")
            .entry(what)
            .or_default() += 1;
    }
    let lat_us = started.elapsed().as_micros().min(u32::MAX as u128) as u32;
    shared.samples.lock().expect("samples").push(Sample {
        start_us,
        lat_us,
        slot: *slot,
        ok,
    });
    shared.in_flight.fetch_sub(1, Ordering::SeqCst);
}

/// After a redirect, reload the whole slot table from the new owner's
/// `CLUSTER SLOTS` (at most every 200 ms), as cluster clients do.
fn maybe_refresh(shared: &Arc<LoadShared>, addr: &Arc<str>) {
    let now = shared.base.elapsed().as_micros() as u64;
    let last = shared.last_refresh_us.load(Ordering::SeqCst);
    if now.saturating_sub(last) < 200_000
        || shared
            .last_refresh_us
            .compare_exchange(last, now, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
    {
        return;
    }
    let (shared, addr) = (shared.clone(), addr.clone());
    tokio::spawn(async move {
        let Ok(Frame::Array(rows)) = shared
            .pool
            .exec(&addr, &[b"CLUSTER".as_slice(), b"SLOTS"])
            .await
        else {
            return;
        };
        let mut updates = Vec::new();
        for row in rows {
            let Frame::Array(f) = row else { continue };
            let (Some(Frame::Integer(a)), Some(Frame::Integer(b)), Some(Frame::Array(node))) =
                (f.first(), f.get(1), f.get(2))
            else {
                continue;
            };
            let (Some(Frame::Bulk(host)), Some(Frame::Integer(port))) = (node.first(), node.get(1))
            else {
                continue;
            };
            let to: Arc<str> = Arc::from(format!("{}:{port}", String::from_utf8_lossy(host)));
            updates.push((*a as usize, *b as usize, to));
        }
        let mut routes = shared.routes.write().expect("routes");
        for (a, b, to) in updates {
            if a <= b && b < routes.len() {
                for r in &mut routes[a..=b] {
                    *r = to.clone();
                }
            }
        }
    });
}
