//! The write load and its bookkeeping: the preload of the moving partition,
//! the load threads that write through the `-MOVED`-following router, and
//! what each key must read as at the end per the acknowledged writes.

use super::client::{Conn, Router};
use super::{LOAD_PAUSE, LOAD_THREADS_ANY, LOAD_THREADS_HOT, PRELOAD_KEYS, PRELOAD_VALUE_LEN};
use keyway_map::{PartitionId, PartitionMap, key_hash_slot};
use keyway_resp::Frame;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// The running load threads: `LOAD_THREADS_ANY` writing anywhere, then
/// `LOAD_THREADS_HOT` writing only into the hot slot span.
pub struct Load {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<LoadStats>>,
}

impl Load {
    /// Starts the load threads; thread `i` draws from `seed + 1 + i`.
    pub fn start(map: &PartitionMap, hot_span: (u16, u16), seed: u64) -> Load {
        let counter = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..LOAD_THREADS_ANY + LOAD_THREADS_HOT)
            .map(|i| {
                let (map, counter, stop) = (map.clone(), counter.clone(), stop.clone());
                let hot = (i >= LOAD_THREADS_ANY).then_some(hot_span);
                let seed = seed.wrapping_add(1 + i as u64);
                std::thread::spawn(move || load_thread(map, counter, stop, hot, seed))
            })
            .collect();
        Load { stop, threads }
    }

    /// Stops the load threads; what they saw, added up.
    pub fn stop(self) -> LoadStats {
        self.stop.store(true, Ordering::Relaxed);
        let mut total = LoadStats::default();
        for t in self.threads {
            total.add(t.join().expect("load thread"));
        }
        total
    }
}

pub fn load_value(n: u64, version: u32) -> String {
    format!("value-of-load-{n}-v{version}-{}", "v".repeat(40))
}

/// What a key must read as at the end, per the acknowledged writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    Value(u32),
    Absent,
}

#[derive(Default)]
pub struct LoadStats {
    /// Keys whose last write was acknowledged (an unknown outcome removes a key).
    pub want: HashMap<u64, Want>,
    pub acked_sets: u64,
    pub acked_overwrites: u64,
    pub acked_dels: u64,
    pub unknown: u64,
    pub errors: BTreeMap<String, u64>,
    /// Live evidence of a lost write: a DEL of a key known to exist said 0.
    pub anomalies: Vec<String>,
    /// The router's redirect chains of two hops or more.
    pub redirect_chains: Vec<String>,
}

impl LoadStats {
    /// Adds another thread's stats (the threads write disjoint keys).
    fn add(&mut self, s: LoadStats) {
        self.want.extend(s.want);
        self.acked_sets += s.acked_sets;
        self.acked_overwrites += s.acked_overwrites;
        self.acked_dels += s.acked_dels;
        self.unknown += s.unknown;
        self.anomalies.extend(s.anomalies);
        self.redirect_chains.extend(s.redirect_chains);
        for (k, v) in s.errors {
            *self.errors.entry(k).or_default() += v;
        }
    }
}

/// An error text with its numbers blanked, to count errors by kind.
fn error_kind(e: &str) -> String {
    e.chars()
        .map(|c| if c.is_ascii_digit() { '#' } else { c })
        .collect()
}

/// Writes until `stop`: mostly new keys `load:N` (N from the shared
/// counter), sometimes an overwrite or a DEL of a key this thread wrote
/// before. With `hot`, only keys whose slot is in `hot` (other N are skipped,
/// not written). A write counts only on its success reply; any other outcome
/// (error, dead connection) leaves the key uncertain and it is not checked.
fn load_thread(
    map: PartitionMap,
    counter: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    hot: Option<(u16, u16)>,
    seed: u64,
) -> LoadStats {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut router = Router::new(&map);
    let mut stats = LoadStats::default();
    // Keys this thread may overwrite or delete (their last write acknowledged, present).
    let mut present: Vec<u64> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let roll = rng.random_range(0..100);
        let (n, new_want, key) = if roll < 15 && !present.is_empty() {
            let i = rng.random_range(0..present.len());
            let n = present.swap_remove(i);
            let want = match stats.want[&n] {
                Want::Value(v) if roll < 10 => Want::Value(v + 1),
                _ => Want::Absent,
            };
            (n, want, format!("load:{n}"))
        } else {
            let n = counter.fetch_add(1, Ordering::Relaxed);
            let key = format!("load:{n}");
            if let Some((first, last)) = hot {
                let slot = key_hash_slot(key.as_bytes());
                if slot < first || slot > last {
                    continue;
                }
            }
            (n, Want::Value(0), key)
        };
        let reply = match new_want {
            Want::Value(v) => {
                let value = load_value(n, v);
                router.request(&key, &[b"SET", key.as_bytes(), value.as_bytes()])
            }
            Want::Absent => router.request(&key, &[b"DEL", key.as_bytes()]),
        };
        match reply {
            Ok(Frame::Simple(s)) if s == "OK" && new_want != Want::Absent => {
                if new_want == Want::Value(0) {
                    stats.acked_sets += 1;
                } else {
                    stats.acked_overwrites += 1;
                }
                stats.want.insert(n, new_want);
                present.push(n);
            }
            Ok(Frame::Integer(deleted)) if new_want == Want::Absent => {
                stats.acked_dels += 1;
                if deleted != 1 {
                    stats.anomalies.push(format!(
                        "DEL {key} answered {deleted}, but its last acknowledged write was {:?}",
                        stats.want[&n]
                    ));
                }
                stats.want.insert(n, Want::Absent);
            }
            Ok(Frame::Error(e)) => {
                stats.unknown += 1;
                stats.want.remove(&n);
                *stats.errors.entry(error_kind(&e)).or_default() += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(other) => panic!("{new_want:?} on {key}: unexpected reply {other:?}"),
            Err(e) => {
                stats.unknown += 1;
                stats.want.remove(&n);
                *stats
                    .errors
                    .entry(format!("io: {:?}", e.kind()))
                    .or_default() += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        std::thread::sleep(LOAD_PAUSE);
    }
    stats.redirect_chains = router.redirect_chains;
    stats
}

/// Writes `PRELOAD_KEYS` keys of `PRELOAD_VALUE_LEN` bytes into `partition`
/// (pipelined at its owner); returns their names.
pub fn preload(map: &PartitionMap, partition: PartitionId) -> Vec<String> {
    let p = &map.partitions[&partition];
    let port = map.nodes[&p.owner].resp_host_port().1;
    let (first, last) = p.slot_span();
    let keys: Vec<String> = (0u64..)
        .map(|i| format!("pre:{i}"))
        .filter(|k| {
            let s = key_hash_slot(k.as_bytes());
            s >= first && s <= last
        })
        .take(PRELOAD_KEYS)
        .collect();
    let value = vec![b'p'; PRELOAD_VALUE_LEN];
    let mut c = Conn::connect(port).unwrap();
    for batch in keys.chunks(500) {
        let reqs: Vec<Vec<Vec<u8>>> = batch
            .iter()
            .map(|k| vec![b"SET".to_vec(), k.as_bytes().to_vec(), value.clone()])
            .collect();
        for (k, r) in batch.iter().zip(c.pipeline(&reqs).unwrap()) {
            assert_eq!(r, Frame::Simple("OK".into()), "preload SET {k}");
        }
    }
    keys
}
