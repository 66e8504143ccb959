//! The row's clients: smart clients of one strategy, or plain RESP
//! connections through the proxy; the preload, the active clients' paced
//! load and the idle clients' full reads.
//!
//! Every client is its own task with at most one request in flight. An
//! active client issues a GET or a SET (half each) on a random preloaded
//! key every `1 / (rate / active clients)` seconds (a tick missed while a
//! request is slow is skipped, not made up); each request's latency is
//! recorded with its start time. An idle client reads every preloaded key
//! once, in order, before the moves and once after them. A GET that finds
//! nothing for a preloaded key is counted: no key is ever deleted, so it
//! would be a node answering "not found" for a range it no longer serves.

use crate::bench_migrate::Rng;
use crate::bench_migrate::resp::Conn;
use bytes::Bytes;
use keyway_client::{Client, ClientConfig, ClientStats};
use keyway_map::{DEFAULT_KEYSPACE, PartitionMap, key_hash_slot};
use keyway_resp::Frame;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// SETs per pipelined batch while preloading.
const LOAD_BATCH: usize = 256;

/// One client: a smart client, or a plain RESP connection to the proxy.
#[derive(Clone)]
pub(super) enum Handle {
    Smart(Arc<Client>),
    Plain(Arc<tokio::sync::Mutex<Plain>>),
}

/// A plain RESP connection (GET / SET, no epochs), reopened after an I/O error.
pub(super) struct Plain {
    addr: String,
    conn: Option<Conn>,
}

impl Plain {
    async fn exec(&mut self, args: &[&[u8]]) -> Result<Frame, String> {
        let conn = match &mut self.conn {
            Some(c) => c,
            None => self.conn.insert(
                Conn::connect(&self.addr)
                    .await
                    .map_err(|e| format!("io: {}", e.kind()))?,
            ),
        };
        conn.push(args);
        let reply = match conn.flush().await {
            Ok(()) => conn.read_reply().await,
            Err(e) => Err(e),
        };
        reply.map_err(|e| {
            self.conn = None;
            format!("io: {}", e.kind())
        })
    }
}

impl Handle {
    /// Connects a smart client to the cluster.
    pub(super) async fn smart(seeds: &[String], config: ClientConfig) -> anyhow::Result<Handle> {
        let seeds: Vec<&str> = seeds.iter().map(String::as_str).collect();
        Ok(Handle::Smart(Arc::new(
            Client::connect(&seeds, config).await?,
        )))
    }

    /// Opens a plain connection to `addr` (the proxy).
    pub(super) async fn plain(addr: &str) -> anyhow::Result<Handle> {
        let conn = Conn::connect(addr).await?;
        Ok(Handle::Plain(Arc::new(tokio::sync::Mutex::new(Plain {
            addr: addr.to_string(),
            conn: Some(conn),
        }))))
    }

    /// The smart client's routing counters (None for a plain connection).
    pub(super) fn stats(&self) -> Option<ClientStats> {
        match self {
            Handle::Smart(c) => Some(c.stats()),
            Handle::Plain(_) => None,
        }
    }

    /// GET: whether the key was found.
    async fn get(&self, key: &[u8]) -> Result<bool, String> {
        match self {
            Handle::Smart(c) => c.get(key).await.map(|v| v.is_some()).map_err(kind),
            Handle::Plain(p) => match p.lock().await.exec(&[b"GET", key]).await? {
                Frame::Bulk(_) => Ok(true),
                Frame::Null | Frame::NullArray => Ok(false),
                Frame::Error(e) => Err(first_word(&e)),
                other => Err(format!("unexpected reply {other:?}")),
            },
        }
    }

    /// SET.
    async fn set(&self, key: &[u8], value: &[u8]) -> Result<(), String> {
        match self {
            Handle::Smart(c) => c.set(key, value).await.map_err(kind),
            Handle::Plain(p) => match p.lock().await.exec(&[b"SET", key, value]).await? {
                Frame::Simple(_) => Ok(()),
                Frame::Error(e) => Err(first_word(&e)),
                other => Err(format!("unexpected reply {other:?}")),
            },
        }
    }
}

/// A client error, by kind (the message up to the first colon).
fn kind(e: keyway_client::ClientError) -> String {
    let text = e.to_string();
    text.split(':').next().unwrap_or(&text).to_string()
}

fn first_word(error: &str) -> String {
    error.split_whitespace().next().unwrap_or("ERR").to_string()
}

/// The preloaded keys (`kwroute:<n>`); with a few thousand of them every
/// partition holds some.
pub(super) fn keys(count: usize) -> Arc<Vec<Bytes>> {
    Arc::new(
        (0..count)
            .map(|n| Bytes::from(format!("kwroute:{n}")))
            .collect(),
    )
}

/// The value written for `key`.
fn value(key: &[u8]) -> Vec<u8> {
    let mut v = b"value of ".to_vec();
    v.extend_from_slice(key);
    v
}

/// SETs every key straight to its owner in `map`, pipelined per node.
pub(super) async fn preload(map: &PartitionMap, keys: &[Bytes]) -> anyhow::Result<()> {
    let mut by_owner: BTreeMap<String, Vec<&Bytes>> = BTreeMap::new();
    for k in keys {
        let p = map
            .locate_slot(DEFAULT_KEYSPACE, key_hash_slot(k))
            .ok_or_else(|| anyhow::anyhow!("no partition holds the slot of a key"))?;
        by_owner
            .entry(map.nodes[&p.owner].resp_addr.clone())
            .or_default()
            .push(k);
    }
    for (addr, keys) in by_owner {
        let mut conn = Conn::connect(&addr).await?;
        for batch in keys.chunks(LOAD_BATCH) {
            for k in batch {
                conn.push(&[b"SET".as_slice(), k, &value(k)]);
            }
            conn.flush().await?;
            for _ in batch {
                match conn.read_reply().await? {
                    Frame::Simple(_) => {}
                    other => anyhow::bail!("preloading SET to {addr}: {other:?}"),
                }
            }
        }
    }
    Ok(())
}

/// One active request.
pub(super) struct Sample {
    /// Start, µs since the row's base instant.
    pub(super) start_us: u64,
    pub(super) lat_us: u32,
    pub(super) ok: bool,
}

/// What the active clients did.
#[derive(Default)]
pub(super) struct ActiveOut {
    pub(super) samples: Vec<Sample>,
    /// Failed requests by error kind.
    pub(super) errors: BTreeMap<String, u64>,
    /// GETs of a preloaded key that found nothing.
    pub(super) missing: u64,
}

/// The running active clients.
pub(super) struct Active {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<ActiveOut>>,
}

impl Active {
    /// Starts one paced task per handle, `rate` requests/s over them all.
    pub(super) fn start(
        handles: &[Handle],
        keys: Arc<Vec<Bytes>>,
        rate: u64,
        seed: u64,
        base: Instant,
    ) -> Active {
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = if rate == 0 {
            Vec::new()
        } else {
            let period = Duration::from_secs_f64(handles.len() as f64 / rate as f64);
            handles
                .iter()
                .enumerate()
                .map(|(i, h)| {
                    let rng = Rng(seed ^ (i as u64 + 1).wrapping_mul(0x9e37_79b9));
                    let job = paced(h.clone(), keys.clone(), period, rng, base, stop.clone());
                    tokio::spawn(job)
                })
                .collect()
        };
        Active { stop, tasks }
    }

    /// Stops issuing requests; waits for the ones in flight; what they did.
    pub(super) async fn stop(mut self) -> anyhow::Result<ActiveOut> {
        self.stop.store(true, Ordering::SeqCst);
        let mut all = ActiveOut::default();
        for t in std::mem::take(&mut self.tasks) {
            let out = t.await?;
            all.samples.extend(out.samples);
            for (k, n) in out.errors {
                *all.errors.entry(k).or_default() += n;
            }
            all.missing += out.missing;
        }
        Ok(all)
    }
}

impl Drop for Active {
    /// A row that ends early (an error, Ctrl-C) stops its load too.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

async fn paced(
    handle: Handle,
    keys: Arc<Vec<Bytes>>,
    period: Duration,
    mut rng: Rng,
    base: Instant,
    stop: Arc<AtomicBool>,
) -> ActiveOut {
    let mut out = ActiveOut::default();
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        if stop.load(Ordering::SeqCst) {
            return out;
        }
        let key = &keys[(rng.next() % keys.len() as u64) as usize];
        let write = rng.next() & 1 == 0;
        let started = Instant::now();
        let result = if write {
            handle.set(key, &value(key)).await.map(|()| true)
        } else {
            handle.get(key).await
        };
        let lat_us = started.elapsed().as_micros().min(u32::MAX as u128) as u32;
        let ok = match result {
            Ok(found) => {
                if !found {
                    out.missing += 1;
                }
                true
            }
            Err(e) => {
                *out.errors.entry(e).or_default() += 1;
                false
            }
        };
        out.samples.push(Sample {
            start_us: started.duration_since(base).as_micros() as u64,
            lat_us,
            ok,
        });
    }
}

/// One idle client's pass over every key.
#[derive(Clone, Debug, Default)]
pub(super) struct ReadAll {
    pub(super) reads: u64,
    pub(super) secs: f64,
    /// The slowest single GET.
    pub(super) max_ms: f64,
    pub(super) failed: u64,
    pub(super) missing: u64,
}

/// Every handle reads every key once, in order, all handles at once.
pub(super) async fn read_all(
    handles: &[Handle],
    keys: &Arc<Vec<Bytes>>,
) -> anyhow::Result<Vec<ReadAll>> {
    let tasks: Vec<_> = handles
        .iter()
        .map(|h| {
            let (h, keys) = (h.clone(), keys.clone());
            tokio::spawn(async move {
                let mut out = ReadAll::default();
                let started = Instant::now();
                for key in keys.iter() {
                    let t = Instant::now();
                    out.reads += 1;
                    match h.get(key).await {
                        Ok(true) => {}
                        Ok(false) => out.missing += 1,
                        Err(_) => out.failed += 1,
                    }
                    out.max_ms = out.max_ms.max(t.elapsed().as_secs_f64() * 1000.0);
                }
                out.secs = started.elapsed().as_secs_f64();
                out
            })
        })
        .collect();
    let mut outs = Vec::with_capacity(tasks.len());
    for t in tasks {
        outs.push(t.await?);
    }
    Ok(outs)
}
