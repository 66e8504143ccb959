//! The change log stays bounded (in-process clusters on fjall):
//! - the background truncator advances `log_start` past old records while
//!   no migration runs, and stops at a registered log hold;
//! - a migration that falls behind past `log_retention_bytes` aborts with
//!   "log retention exceeded" (in `ctl migrations`), and the log is cut;
//! - active expiry removes expired keys nobody reads, as logged deletes;
//! - many overwrites of three keys leave the data directories small, during
//!   the run and once background work settles: under 64 MB settled and
//!   128 MB during for 1,000,000 (`KEYWAY_TEST_OVERWRITES=1000000`, release
//!   build), the same bounds scaled down for the default 300,000.

use crate::common;

use bytes::{Bytes, BytesMut};
use common::Resp;
use keyway_client::{Client, ClientConfig};
use keyway_cluster::{ClusterSpec, LocalCluster};
use keyway_map::{DEFAULT_KEYSPACE, key_hash_slot};
use keyway_resp::{Frame, Protocol, encode};
use keyway_storage::{KeyRange, Mutation};
use serde_json::Value;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(60);

async fn eventually<T, F: Future<Output = Option<T>>>(what: &str, probe: impl FnMut() -> F) -> T {
    keyway_testkit::eventually(what, DEADLINE, probe).await
}

fn spec(dir: &Path, nodes: usize) -> ClusterSpec {
    let mut spec = ClusterSpec::ephemeral(nodes, dir.to_path_buf());
    spec.node.lease_ttl_ms = 60_000;
    spec.node.log_truncate_interval_ms = 50;
    if let Some(m) = spec.manager.as_mut() {
        m.config.rebalance.enabled = false;
    }
    spec
}

async fn client(c: &LocalCluster) -> Client {
    let seeds: Vec<String> = c.resp_addrs().into_iter().flatten().collect();
    let seeds: Vec<&str> = seeds.iter().map(|s| s.as_str()).collect();
    Client::connect(&seeds, ClientConfig::default())
        .await
        .unwrap()
}

fn passes(c: &LocalCluster, i: usize) -> u64 {
    c.node(i).unwrap().shared().log_gc.passes.get()
}

/// Waits for two more truncation passes of node `i` (so one started after now).
async fn two_passes(c: &LocalCluster, i: usize) {
    let seen = passes(c, i);
    eventually("two truncation passes", || async {
        (passes(c, i) >= seen + 2).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncation_advances_log_start_without_migrations_and_stops_at_a_hold() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(dir.path(), 1);
    spec.manager = None;
    let c = LocalCluster::start(spec).await.unwrap();
    c.wait_serving(DEADLINE).await.unwrap();
    let kv = client(&c).await;
    let engine = c.node(0).unwrap().shared().engine.clone();
    for i in 0..300 {
        kv.set(format!("k{}", i % 3).as_bytes(), &[b'v'; 100])
            .await
            .unwrap();
    }
    let head = engine.last_seq();
    assert!(head >= 300);
    eventually("log_start past every old record", || async {
        (engine.log_start() > head).then_some(())
    })
    .await;
    assert!(engine.changes_since(1, 10).is_err(), "old records are gone");

    // A hold keeps what it needs, and only that.
    let holds = c.node(0).unwrap().shared().migrations.holds().clone();
    let from = engine.last_seq() + 1;
    let hold = holds.hold("test", from, Box::new(|_| {})).unwrap();
    for i in 0..300 {
        kv.set(format!("k{}", i % 3).as_bytes(), b"w")
            .await
            .unwrap();
    }
    two_passes(&c, 0).await;
    assert_eq!(engine.log_start(), from, "the hold's records stay");
    assert_eq!(engine.changes_since(from - 1, 1000).unwrap().len(), 300);
    let status: Value =
        serde_json::from_str(&common::http_get(admin_port(&c, 0), "/status").expect("/status"))
            .unwrap();
    assert_eq!(status["change_log"]["first_seq"], from);
    assert_eq!(status["change_log"]["holds"][0]["name"], "test");
    assert!(status["change_log"]["bytes"].as_u64().unwrap() >= 300 * 8);
    let (ok, out) = ctl(&c.meta_url(), &["changelog"]).await;
    assert!(ok && out.contains(&format!("test@{from}")), "{out}");

    hold.advance(from + 100);
    eventually("log_start at the advanced hold", || async {
        (engine.log_start() == from + 100).then_some(())
    })
    .await;
    drop(hold);
    let head = engine.last_seq();
    eventually("everything truncated once released", || async {
        (engine.log_start() == head + 1 && engine.log_bytes() == 0).then_some(())
    })
    .await;
    let metrics = c.node(0).unwrap().shared().metrics.encode();
    assert!(metrics.contains("keyway_change_log_first_seq"), "{metrics}");
    assert!(metrics.contains("keyway_change_log_truncated_records_total"));
    c.shutdown().await;
}

fn admin_port(c: &LocalCluster, i: usize) -> u16 {
    c.node(i)
        .unwrap()
        .admin_addr()
        .rsplit_once(':')
        .unwrap()
        .1
        .parse()
        .unwrap()
}

/// `keyway ctl --meta URL args...`: (success, stdout).
async fn ctl(meta: &str, args: &[&str]) -> (bool, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_keyway"));
    cmd.args(["ctl", "--meta", meta]).args(args);
    cmd.env("KEYWAY_LOG", "warn");
    let out = tokio::task::spawn_blocking(move || cmd.output().expect("run keyway ctl"))
        .await
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_that_falls_behind_aborts_with_log_retention_exceeded() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(dir.path(), 2);
    spec.node.log_retention_bytes = 64 * 1024;
    let m = spec.manager.as_mut().unwrap();
    // A slow copy: the partition holds ~300 KB, copied at 20 KB/s.
    m.config.driver.throttle.max_bytes_per_sec = 20_000;
    m.config.driver.throttle.chunk_bytes = 4_096;
    let c = LocalCluster::start(spec).await.unwrap();
    c.wait_serving(DEADLINE).await.unwrap();
    let kv = client(&c).await;
    let map = c.map().await.unwrap();
    let p = map
        .locate_slot(DEFAULT_KEYSPACE, key_hash_slot(b"k0"))
        .unwrap()
        .clone();
    let keys: Vec<String> = (0..100_000)
        .map(|i| format!("k{i}"))
        .filter(|k| {
            let (first, last) = p.slot_span();
            (first..=last).contains(&key_hash_slot(k.as_bytes()))
        })
        .take(300)
        .collect();
    for k in &keys {
        kv.set(k.as_bytes(), &[b'x'; 1000]).await.unwrap();
    }
    let source = (0..c.len())
        .find(|i| c.node(*i).unwrap().id() == p.owner)
        .unwrap();
    let target = map.nodes.values().find(|n| n.id != p.owner).unwrap();
    let meta = c.meta_url();
    let pid = p.id.to_string();
    let mv = {
        let meta = meta.clone();
        let to = target.resp_addr.clone();
        tokio::spawn(async move {
            ctl(
                &meta,
                &["move", &pid, "--to", &to, "--wait", "--timeout-secs", "60"],
            )
            .await
        })
    };
    // The push holds the log; writes continue past the retention limit.
    let holds = c.node(source).unwrap().shared().migrations.holds().clone();
    eventually("the migration's push holds the log", || async {
        holds
            .list()
            .iter()
            .any(|h| h.name.starts_with("migration"))
            .then_some(())
    })
    .await;
    // Writes go on until the move ends (a failed write is retried on the
    // next round: under load a write may time out, and stopping at the
    // first one would leave the log within its limit and let the move finish).
    let writer = {
        let kv = client(&c).await;
        let keys = keys.clone();
        tokio::spawn(async move {
            for round in 0u32.. {
                for k in keys.iter().take(20) {
                    let _ = kv.set(k.as_bytes(), &round.to_be_bytes()).await;
                }
            }
        })
    };
    let (_, out) = mv.await.unwrap();
    writer.abort();
    let (ok, migrations) = ctl(&meta, &["--json", "migrations"]).await;
    assert!(ok, "{migrations}");
    assert!(
        migrations.contains("log retention exceeded") && migrations.contains("ABORTED"),
        "move output: {out}\nmigrations: {migrations}"
    );
    assert!(
        holds
            .list()
            .iter()
            .all(|h| !h.name.starts_with("migration")),
        "the hold was released"
    );
    let engine = c.node(source).unwrap().shared().engine.clone();
    eventually("the log cut back under the retention limit", || async {
        (engine.log_bytes() <= 64 * 1024).then_some(())
    })
    .await;
    assert!(
        c.node(source)
            .unwrap()
            .shared()
            .log_gc
            .retention_failures
            .get()
            >= 1
    );
    // Nothing was lost at the source, which still owns the partition.
    assert_eq!(
        c.map().await.unwrap().partitions[&p.id].owner,
        p.owner,
        "the partition stayed"
    );
    assert!(kv.get(keys[100].as_bytes()).await.unwrap().is_some());
    c.shutdown().await;
}

/// Every stored entry of the default keyspace, expired or not.
async fn stored(engine: &Arc<dyn keyway_storage::Engine>) -> u64 {
    let engine = engine.clone();
    tokio::task::spawn_blocking(move || {
        let all = KeyRange::new(
            Bytes::from_static(&[0, 0, 0, 0]),
            Some(Bytes::from_static(&[0, 0, 0, 1])),
        );
        let mut n = 0;
        let mut after: Option<Bytes> = None;
        loop {
            let chunk = engine.scan(&all, after.as_deref(), 1000).unwrap();
            n += chunk.entries.len() as u64;
            match chunk.next {
                Some(k) => after = Some(k),
                None => return n,
            }
        }
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_expiry_removes_keys_nobody_reads_as_logged_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(dir.path(), 1);
    spec.manager = None;
    spec.node.active_expire_interval_ms = 20;
    spec.node.active_expire_cycle_budget_ms = 10;
    let c = LocalCluster::start(spec).await.unwrap();
    c.wait_serving(DEADLINE).await.unwrap();
    let kv = client(&c).await;
    let shared = c.node(0).unwrap().shared().clone();
    let engine = shared.engine.clone();
    // Keep the log from here on, to read the deletes back.
    let hold = shared
        .migrations
        .holds()
        .hold("test", engine.last_seq() + 1, Box::new(|_| {}))
        .unwrap();
    kv.set(b"persistent", b"stays").await.unwrap();
    // A cache workload: SET with a short TTL, never read, round after round.
    // What is stored stays bounded by about one round.
    const ROUND: u64 = 500;
    for round in 0..4u64 {
        for i in 0..ROUND {
            let key = format!("cache:{round}:{i}");
            let reply = kv
                .command(&[b"SET", key.as_bytes(), b"v", b"PX", b"100"])
                .await
                .unwrap();
            assert_eq!(reply, Frame::Simple("OK".into()));
        }
        let n = stored(&engine).await;
        assert!(n <= 2 * ROUND + 1, "round {round}: {n} keys stored");
    }
    eventually("every expired key removed", || async {
        (stored(&engine).await == 1).then_some(())
    })
    .await;
    assert_eq!(
        kv.get(b"persistent").await.unwrap(),
        Some(Bytes::from_static(b"stays"))
    );
    assert!(shared.active_expiry.removed.get() >= 4 * ROUND);
    let deletes = engine
        .changes_since(hold.needed() - 1, 100_000)
        .unwrap()
        .into_iter()
        .filter(|r| matches!(&r.mutation, Mutation::Delete { key } if key.windows(6).any(|w| w == b"cache:")))
        .count() as u64;
    assert_eq!(deletes, 4 * ROUND, "each removal is a logged delete");
    drop(hold);
    c.shutdown().await;
}

/// Allocated bytes under `dir`, like `du` (fjall preallocates its journal
/// as a sparse file: its length overstates it).
fn du(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(md) = e.metadata() else {
                continue;
            };
            if md.is_dir() {
                stack.push(e.path());
            } else {
                total += md.blocks() * 512;
            }
        }
    }
    total
}

fn overwrites() -> u64 {
    std::env::var("KEYWAY_TEST_OVERWRITES")
        .ok()
        .map(|v| v.parse().expect("KEYWAY_TEST_OVERWRITES must be a number"))
        .unwrap_or(300_000)
}

/// The bounds for 1,000,000 overwrites (64 MB once settled, twice
/// that during the run), scaled down linearly for a smaller count so a
/// shorter run is held to the same standard.
fn bounds(n: u64) -> (u64, u64) {
    let scale = (n as f64 / 1_000_000.0).min(1.0);
    let after = (64.0 * MB as f64 * scale) as u64;
    (after, 2 * after)
}

const MB: u64 = 1024 * 1024;

/// Pipelines `n` SETs of 100-byte values onto `key` at `port`, `depth` at a
/// time; returns each batch's round trip.
fn overwrite(port: u16, key: &str, n: u64, seed: u64, done: &AtomicU64) -> Vec<Duration> {
    let mut rtts = Vec::new();
    let mut conn = Resp::connect(port);
    let mut rng = seed | 1;
    let depth = 256;
    let mut sent = 0;
    while sent < n {
        let batch = depth.min(n - sent);
        let mut out = BytesMut::new();
        for _ in 0..batch {
            let value: Vec<u8> = (0..100)
                .map(|_| {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    b'a' + (rng % 26) as u8
                })
                .collect();
            let frame = Frame::Array(vec![
                Frame::Bulk(Bytes::from_static(b"SET")),
                Frame::Bulk(Bytes::copy_from_slice(key.as_bytes())),
                Frame::Bulk(Bytes::from(value)),
            ]);
            encode(&frame, Protocol::Resp2, &mut out);
        }
        let sent_at = Instant::now();
        conn.stream.write_all(&out).unwrap();
        for _ in 0..batch {
            assert_eq!(conn.read_reply().unwrap(), Frame::Simple("OK".into()));
        }
        rtts.push(sent_at.elapsed());
        sent += batch;
        done.fetch_add(batch, Ordering::Relaxed);
    }
    rtts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overwrites_of_three_keys_leave_the_data_directories_small() {
    let n = overwrites();
    let (bound_after, bound_during) = bounds(n);
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(dir.path(), 3);
    // For comparing the foreground effect: KEYWAY_TEST_TRUNCATE_MS=3600000
    // keeps the truncator idle during the run (the size bounds then fail).
    if let Ok(ms) = std::env::var("KEYWAY_TEST_TRUNCATE_MS") {
        spec.node.log_truncate_interval_ms = ms.parse().expect("KEYWAY_TEST_TRUNCATE_MS");
    }
    let c = LocalCluster::start(spec).await.unwrap();
    c.wait_serving(DEADLINE).await.unwrap();
    let map = c.map().await.unwrap();
    let keys = ["alpha", "bravo", "charlie"];
    let ports: Vec<u16> = keys
        .iter()
        .map(|k| {
            let p = map
                .locate_slot(DEFAULT_KEYSPACE, key_hash_slot(k.as_bytes()))
                .unwrap();
            map.nodes[&p.owner]
                .resp_addr
                .rsplit_once(':')
                .unwrap()
                .1
                .parse()
                .unwrap()
        })
        .collect();
    let data = dir.path().to_path_buf();
    let before = du(&data);
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (stop, data) = (stop.clone(), data.clone());
        std::thread::spawn(move || {
            let mut max = 0;
            while !stop.load(Ordering::Acquire) {
                max = max.max(du(&data));
                std::thread::sleep(Duration::from_millis(100));
            }
            max.max(du(&data))
        })
    };
    let started = Instant::now();
    let done = Arc::new(AtomicU64::new(0));
    let writers: Vec<_> = keys
        .iter()
        .zip(&ports)
        .enumerate()
        .map(|(i, (key, port))| {
            let (key, port, done) = (key.to_string(), *port, done.clone());
            let share = n / 3 + u64::from((i as u64) < n % 3);
            std::thread::spawn(move || overwrite(port, &key, share, i as u64 + 7, &done))
        })
        .collect();
    let writers = tokio::task::spawn_blocking(move || {
        let mut all: Vec<Duration> = writers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect();
        all.sort();
        all
    });
    let rtts = writers.await.unwrap();
    let p99 = rtts[(rtts.len() * 99 / 100).min(rtts.len() - 1)];
    let took = started.elapsed();
    assert_eq!(done.load(Ordering::Relaxed), n);
    stop.store(true, Ordering::Release);
    let during = tokio::task::spawn_blocking(move || sampler.join().unwrap())
        .await
        .unwrap();
    println!(
        "{n} overwrites in {took:?} ({:.0}/s, p99 of a 256-SET pipeline {p99:?}): data directories {} KiB before, {} KiB max during",
        n as f64 / took.as_secs_f64(),
        before / 1024,
        during / 1024,
    );
    // Settled: every node's log truncated to its head and the directories
    // under the bound.
    let heads: Vec<u64> = (0..3)
        .map(|i| c.node(i).unwrap().shared().engine.last_seq())
        .collect();
    let settle = Instant::now();
    let after = eventually("the data directories to shrink", || {
        let data = data.clone();
        let c = &c;
        let heads = heads.clone();
        async move {
            let truncated =
                (0..3).all(|i| c.node(i).unwrap().shared().engine.log_start() > heads[i]);
            let size = du(&data);
            (truncated && size < bound_after).then_some(size)
        }
    })
    .await;
    println!(
        "data directories {} KiB after settling ({:?})",
        after / 1024,
        settle.elapsed()
    );
    assert!(
        during < bound_during,
        "{} KiB during the run (bound {} KiB)",
        during / 1024,
        bound_during / 1024
    );
    c.shutdown().await;
}

/// The cutover's incremental digest reads the change log from the copy's
/// checkpoint seq to the fence (`migrate/digest.rs`), so the push's hold
/// must keep those records until the push stops, not advance past them
/// with `acked_seq`. A migration whose checkpoint-to-fence window outlives
/// the manager's snapshot lease (`log_snapshot_hold_ms`, 60 s by default:
/// a 1,000,000-member key's move, `big_keys_move.rs`) failed at the fence
/// with "change log truncated" and aborted. Here the lease is 300 ms, the
/// copy slow, and writes go on in the partition throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_migration_under_writes_keeps_the_log_its_cutover_digest_reads() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(dir.path(), 2);
    spec.node.log_snapshot_hold_ms = 300;
    spec.node.log_truncate_interval_ms = 10;
    let m = spec.manager.as_mut().unwrap();
    // ~300 KB copied at 150 KB/s: the copy ends well after the lease.
    m.config.driver.throttle.max_bytes_per_sec = 150_000;
    m.config.driver.throttle.chunk_bytes = 4_096;
    m.config.driver.migration.cleanup_grace_ms = 200;
    let c = LocalCluster::start(spec).await.unwrap();
    c.wait_serving(DEADLINE).await.unwrap();
    let kv = client(&c).await;
    let map = c.map().await.unwrap();
    let p = map
        .locate_slot(DEFAULT_KEYSPACE, key_hash_slot(b"k0"))
        .unwrap()
        .clone();
    let keys: Vec<String> = (0..100_000)
        .map(|i| format!("k{i}"))
        .filter(|k| {
            let (first, last) = p.slot_span();
            (first..=last).contains(&key_hash_slot(k.as_bytes()))
        })
        .take(300)
        .collect();
    for k in &keys {
        kv.set(k.as_bytes(), &[b'x'; 1000]).await.unwrap();
    }
    let target = map.nodes.values().find(|n| n.id != p.owner).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let kv = client(&c).await;
        let (keys, stop) = (keys.clone(), stop.clone());
        tokio::spawn(async move {
            let mut round = 0u32;
            while !stop.load(Ordering::Relaxed) {
                round += 1;
                for k in keys.iter().take(20) {
                    // Redirects and the fence's pauses are the client's
                    // business; this only keeps the log moving.
                    let _ = kv.set(k.as_bytes(), &round.to_be_bytes()).await;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let (ok, out) = ctl(
        &c.meta_url(),
        &[
            "move",
            &p.id.to_string(),
            "--to",
            &target.resp_addr,
            "--wait",
            "--timeout-secs",
            "60",
        ],
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();
    let (_, migrations) = ctl(&c.meta_url(), &["--json", "migrations"]).await;
    assert!(
        ok && out.contains(" DONE"),
        "the move did not complete: {out}\nmigrations: {migrations}"
    );
    assert_eq!(
        c.map().await.unwrap().partitions[&p.id].owner,
        target.id,
        "the partition moved"
    );
    c.shutdown().await;
}
