//! `keyway bench migrate`: what a live partition move costs, measured.
//!
//! Starts an in-process cluster ([`LocalCluster`]: embedded metadata store,
//! N nodes, the manager and its migration driver) in a temporary directory,
//! loads one partition per requested size with `--value-size` values (keys
//! chosen so that their hash slot falls into that partition; pipelined SETs
//! straight to the owner), starts a steady open-loop write load over all
//! slots (every SET is its own request on a pooled connection, `-MOVED` is
//! followed, each latency is recorded with its start time), lets it run for
//! a baseline, then moves each test partition `--moves` times round the
//! nodes (owner → next node → ...), waiting for `DONE` each time.
//!
//! Per size it reports the cutover write pause twice: as the migration
//! records measure it (`pause_ms`: fence confirmed → target serving) and as
//! the load saw it (the slowest write to that partition in flight during the
//! cutover, redirect included); the snapshot copy throughput (`total_bytes`
//! over the time the record spent in `COPYING`) against the throttle; and the
//! foreground p99 before the moves against the p99 during them. Every ratio
//! compares figures measured in the same run. After the moves every loaded
//! key is read back and compared.
//!
//! The load generator, the cluster and the manager share one process and one
//! runtime, so the figures include that contention; the RESP client here is
//! deliberately minimal (the smart client is a dev-dependency only).

use keyway_cluster::{ClusterSpec, LocalCluster, ManagerSpec};
use keyway_manager::{DriverConfig, request_move};
use keyway_map::{DEFAULT_KEYSPACE, NodeId, PartitionId, PartitionMap, key_hash_slot};
use keyway_meta::MetaStore;
use keyway_migration::{MigrationId, MigrationRecord, MigrationState};
use keyway_node::{Durability, NodeConfig};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufStream};
use tokio::net::TcpStream;

/// How often a move's migration record is polled.
const POLL: Duration = Duration::from_millis(5);
/// SETs per pipelined batch while loading.
const LOAD_BATCH: usize = 256;
/// Connections per partition while loading.
const LOAD_CONNS: usize = 4;
/// Redirects and retries a foreground write may take before it counts as failed.
const MAX_ATTEMPTS: usize = 32;
/// Slack after the target starts serving during which a client may still be
/// finding it (the redirect and the connection to the new owner).
const CUTOVER_TAIL_US: u64 = 200_000;

#[derive(clap::Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(clap::Subcommand)]
enum BenchCommand {
    /// Live partition moves under a steady write load: cutover pause, copy
    /// throughput against the throttle, foreground p99 before vs during.
    Migrate(MigrateArgs),
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.command {
        BenchCommand::Migrate(args) => migrate(args).await,
    }
}

#[derive(clap::Args, Debug)]
pub struct MigrateArgs {
    /// Partition sizes to load and move, comma-separated; one partition per
    /// size (suffixes KB/MB/GB are powers of 1000, KiB/MiB/GiB of 1024).
    #[arg(long, value_delimiter = ',', value_parser = parse_bytes, default_value = "4MiB,40MiB")]
    sizes: Vec<u64>,
    /// Moves per size, round the nodes (owner -> next node -> ...).
    #[arg(long, default_value_t = 5)]
    moves: usize,
    /// Snapshot copy throttle in bytes per second (0 = unlimited).
    #[arg(long, value_parser = parse_bytes, default_value = "16MiB")]
    throttle: u64,
    /// Foreground load: SETs per second over all slots, open loop (0 = none).
    #[arg(long, default_value_t = 2000)]
    rate: u64,
    /// Value size of the loaded data and of the foreground SETs.
    #[arg(long, value_parser = parse_bytes, default_value = "1KiB")]
    value_size: u64,
    /// Distinct keys the foreground load writes (random, over all slots).
    #[arg(long, default_value_t = 10_000)]
    load_keys: u64,
    /// Seconds of load before the first move: the "before" reference.
    #[arg(long, default_value_t = 5)]
    baseline_secs: u64,
    /// Seconds of load after the last move: the "after" reference.
    #[arg(long, default_value_t = 5)]
    after_secs: u64,
    /// How long a source keeps a moved range before dropping it (`DONE` follows).
    #[arg(long, default_value_t = 500)]
    cleanup_grace_ms: u64,
    /// Nodes in the cluster.
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Partitions per node at bootstrap.
    #[arg(long, default_value_t = 4)]
    partitions_per_node: u16,
    /// Node durability: always, group, periodic, none.
    #[arg(long, default_value = "group")]
    durability: Durability,
    /// Data directory (default: a fresh temporary directory, removed afterwards).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Give up on a move that has not ended after this many seconds.
    #[arg(long, default_value_t = 120)]
    move_timeout_secs: u64,
    /// Print the results as JSON on stdout (progress goes to stderr).
    #[arg(long)]
    json: bool,
}

/// `123`, `4MiB`, `40MB`, `1.5GiB`.
fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num: f64 = num
        .parse()
        .map_err(|_| format!("'{text}' is not a size such as 4MiB"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        other => return Err(format!("unknown size unit '{other}' in '{text}'")),
    };
    Ok((num * mult).round() as u64)
}

fn mib(bytes: f64) -> f64 {
    bytes / (1024.0 * 1024.0)
}

fn fmt_size(bytes: u64) -> String {
    if bytes >= 1024 * 1024 {
        format!("{:.1} MiB", mib(bytes as f64))
    } else if bytes >= 1024 {
        format!("{:.1} KiB", bytes as f64 / 1024.0)
    } else {
        format!("{bytes} B")
    }
}

/// The 1-minute load average (Linux).
fn loadavg() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// Progress lines: stdout normally, stderr under `--json`.
fn say(json: bool, line: impl AsRef<str>) {
    if json {
        eprintln!("{}", line.as_ref());
    } else {
        println!("{}", line.as_ref());
    }
}

/// Removes a temporary data directory when dropped.
struct TempDir(Option<PathBuf>);

impl Drop for TempDir {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

async fn migrate(args: MigrateArgs) -> anyhow::Result<()> {
    anyhow::ensure!(!args.sizes.is_empty(), "--sizes needs at least one size");
    anyhow::ensure!(args.moves > 0, "--moves must be at least 1");
    anyhow::ensure!(
        args.nodes >= 2,
        "--nodes must be at least 2 to move anything"
    );
    anyhow::ensure!(
        (1..=1024 * 1024).contains(&args.value_size),
        "--value-size must be between 1 B and 1 MiB"
    );
    anyhow::ensure!(
        args.sizes.len() <= args.nodes * args.partitions_per_node as usize,
        "more sizes than partitions"
    );
    for &s in &args.sizes {
        anyhow::ensure!(
            s >= args.value_size,
            "size {s} is smaller than one value ({} B)",
            args.value_size
        );
    }
    anyhow::ensure!(
        args.rate == 0 || args.load_keys > 0,
        "--load-keys must be positive"
    );

    let (dir, _temp) = match &args.data {
        Some(d) => (d.clone(), TempDir(None)),
        None => {
            let d = std::env::temp_dir().join(format!(
                "keyway-bench-migrate-{}-{}",
                std::process::id(),
                unix_us()
            ));
            (d.clone(), TempDir(Some(d)))
        }
    };
    let mut driver = DriverConfig::default();
    driver.throttle.max_bytes_per_sec = args.throttle;
    driver.migration.cleanup_grace_ms = args.cleanup_grace_ms;
    driver.validate()?;
    let node = NodeConfig {
        durability: args.durability,
        ..NodeConfig::default()
    };
    let spec = ClusterSpec {
        partitions_per_node: args.partitions_per_node,
        node,
        manager: Some(ManagerSpec {
            driver,
            ..ManagerSpec::default()
        }),
        ..ClusterSpec::ephemeral(args.nodes, dir.clone())
    };
    let cluster = LocalCluster::start(spec).await?;
    let outcome = tokio::select! {
        r = bench(&cluster, &args) => r,
        _ = crate::shutdown_signal() => Err(anyhow::anyhow!("interrupted")),
    };
    cluster.shutdown().await;
    let report = outcome?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report);
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// The run

#[derive(Serialize)]
struct Report {
    config: ConfigOut,
    loaded: Vec<Loaded>,
    sizes: Vec<SizeSummary>,
    moves: Vec<MoveResult>,
    foreground: Option<Foreground>,
    verify: Verify,
    problems: Vec<String>,
}

#[derive(Serialize)]
struct ConfigOut {
    cpus: usize,
    /// 1-minute load average at the start and at the end (other work on the
    /// machine shows up in every latency here).
    loadavg_start: Option<f64>,
    loadavg_end: Option<f64>,
    nodes: usize,
    partitions: usize,
    durability: String,
    throttle_bytes_per_sec: u64,
    cleanup_grace_ms: u64,
    load_rate_per_sec: u64,
    load_keys: u64,
    value_size: u64,
    moves_per_size: usize,
}

#[derive(Serialize, Clone)]
struct Loaded {
    partition: u64,
    first_slot: u16,
    last_slot: u16,
    requested_bytes: u64,
    keys: usize,
    value_bytes: u64,
    load_secs: f64,
    #[serde(skip)]
    key_list: Vec<Vec<u8>>,
}

#[derive(Serialize, Clone)]
struct MoveResult {
    migration: u64,
    partition: u64,
    size_bytes: u64,
    from: String,
    to: String,
    state: &'static str,
    abort_reason: Option<String>,
    total_bytes: u64,
    copy_ms: Option<u64>,
    copy_bytes_per_sec: Option<f64>,
    pause_ms: Option<u64>,
    /// Slowest write to the partition in flight during the cutover (client view).
    client_stall_ms: Option<f64>,
    /// Writes to the partition in flight during the cutover.
    client_writes_in_cutover: usize,
    /// Slowest write to the partition over the whole move.
    client_worst_move_ms: Option<f64>,
    /// Request → target serving.
    to_flip_ms: Option<u64>,
    /// Request → DONE (includes the cleanup grace and the source's drop).
    to_done_ms: u64,
    /// Times a source paused its copy because its foreground latency was
    /// above the backoff threshold (node metric `migration_backoffs`).
    copy_backoffs: u64,
    #[serde(skip)]
    cutover_us: Option<(u64, u64)>,
    #[serde(skip)]
    copy_us: Option<(u64, u64)>,
    #[serde(skip)]
    move_us: (u64, u64),
}

#[derive(Serialize)]
struct SizeSummary {
    size_bytes: u64,
    partition: u64,
    moves: usize,
    done: usize,
    pause_ms: Option<Pcts>,
    client_stall_ms: Option<Pcts>,
    copy_bytes_per_sec_p50: Option<f64>,
    copy_vs_throttle: Option<f64>,
    to_flip_ms_p50: Option<f64>,
    to_done_ms_p50: Option<f64>,
}

#[derive(Serialize, Clone, Copy)]
struct Pcts {
    p50: f64,
    p99: f64,
    max: f64,
}

#[derive(Serialize)]
struct Foreground {
    rate_per_sec: u64,
    before: Window,
    during: Window,
    /// The part of `during` in which a snapshot was being copied.
    during_copy: Window,
    after: Window,
    p99_during_over_before: Option<f64>,
    p99_during_over_after: Option<f64>,
    redirects_followed: u64,
    retried_errors: BTreeMap<String, u64>,
    final_errors: BTreeMap<String, u64>,
}

#[derive(Serialize, Default)]
struct Window {
    secs: f64,
    writes: usize,
    failed: usize,
    p50_ms: f64,
    p99_ms: f64,
    p999_ms: f64,
    max_ms: f64,
}

#[derive(Serialize, Default)]
struct Verify {
    keys: usize,
    missing: usize,
    wrong: usize,
}

/// Nearest-rank percentile of sorted values.
fn pct(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn pcts(mut v: Vec<f64>) -> Option<Pcts> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    Some(Pcts {
        p50: pct(&v, 0.5),
        p99: pct(&v, 0.99),
        max: *v.last().expect("non-empty"),
    })
}

fn median(v: Vec<f64>) -> Option<f64> {
    pcts(v).map(|p| p.p50)
}

async fn bench(cluster: &LocalCluster, args: &MigrateArgs) -> anyhow::Result<Report> {
    let meta = cluster.meta().clone();
    let map = meta.get_map().await?;
    let names: HashMap<NodeId, String> = map
        .nodes
        .keys()
        .enumerate()
        .map(|(i, id)| (*id, format!("n{}", i + 1)))
        .collect();
    let parts: Vec<PartitionId> = map
        .keyspace_partitions(DEFAULT_KEYSPACE)
        .map(|p| p.id)
        .collect();
    let json = args.json;
    let loadavg_start = loadavg();
    say(
        json,
        format!(
            "keyway bench migrate: {} nodes, {} partitions, durability {}, throttle {}/s, \
             cleanup grace {} ms, load {} SET/s over {} keys, {} B values",
            map.nodes.len(),
            parts.len(),
            format!("{:?}", args.durability).to_lowercase(),
            if args.throttle == 0 {
                "unlimited".to_string()
            } else {
                fmt_size(args.throttle)
            },
            args.cleanup_grace_ms,
            args.rate,
            args.load_keys,
            args.value_size
        ),
    );

    // Values: slices of one random buffer, at an offset derived from the key.
    let mut rng = Rng(0x6b65_7977_6179);
    let buf_len = 1024 * 1024 + args.value_size as usize;
    let values: Arc<Vec<u8>> = Arc::new((0..buf_len).map(|_| rng.next() as u8).collect());
    let vsize = args.value_size as usize;

    // Load one partition per size, spread over the partition list.
    let mut loaded = Vec::new();
    for (i, &size) in args.sizes.iter().enumerate() {
        let pid = parts[i * parts.len() / args.sizes.len()];
        let l = load_partition(&map, pid, size, &values, vsize).await?;
        say(
            json,
            format!(
                "loaded partition {} (slots {}-{}, on {}): {} keys, {} of values in {:.1} s",
                l.partition,
                l.first_slot,
                l.last_slot,
                names[&map.partitions[&pid].owner],
                l.keys,
                fmt_size(l.value_bytes),
                l.load_secs
            ),
        );
        loaded.push(l);
    }

    // The foreground load.
    let base_us = unix_us();
    let base = Instant::now();
    let load = if args.rate > 0 {
        Some(Load::start(&map, args, values.clone(), base)?)
    } else {
        None
    };
    let warm_us = if args.baseline_secs > 1 { 1_000_000 } else { 0 };
    say(
        json,
        format!(
            "foreground load running; baseline for {} s",
            args.baseline_secs
        ),
    );
    tokio::time::sleep(Duration::from_secs(args.baseline_secs)).await;

    // The moves.
    let moves_start_us = base.elapsed().as_micros() as u64;
    let mut moves = Vec::new();
    let mut problems = Vec::new();
    let node_ids: Vec<NodeId> = map.nodes.keys().copied().collect();
    'sizes: for l in &loaded {
        for m in 0..args.moves {
            let now_map = meta.get_map().await?;
            let owner = now_map.partitions[&PartitionId(l.partition)].owner;
            let at = node_ids.iter().position(|n| *n == owner).unwrap_or(0);
            let target = node_ids[(at + 1) % node_ids.len()];
            let backoffs_before = copy_backoffs(cluster);
            let r = run_move(
                &*meta,
                PartitionId(l.partition),
                target,
                l.requested_bytes,
                &names,
                Duration::from_secs(args.move_timeout_secs),
                base_us,
                base,
            )
            .await;
            let mut r = match r {
                Ok(r) => r,
                Err(e) => {
                    problems.push(format!("partition {}: move {}: {e:#}", l.partition, m + 1));
                    say(json, format!("move failed: {e:#}"));
                    break 'sizes;
                }
            };
            r.copy_backoffs = copy_backoffs(cluster) - backoffs_before;
            say(
                json,
                format!(
                    "  move {}/{} partition {} {} -> {}: {} in {} ms (flip after {}), {} copied in {} ({} backoffs), pause {} ms",
                    m + 1,
                    args.moves,
                    r.partition,
                    r.from,
                    r.to,
                    r.state,
                    r.to_done_ms,
                    r.to_flip_ms
                        .map(|v| format!("{v} ms"))
                        .unwrap_or_else(|| "-".into()),
                    fmt_size(r.total_bytes),
                    r.copy_ms
                        .map(|v| format!("{v} ms"))
                        .unwrap_or_else(|| "?".into()),
                    r.copy_backoffs,
                    r.pause_ms
                        .map(|v| v.to_string())
                        .unwrap_or_else(|| "-".into()),
                ),
            );
            if r.state != "DONE" {
                problems.push(format!(
                    "migration {} of partition {} ended {} ({})",
                    r.migration,
                    r.partition,
                    r.state,
                    r.abort_reason.clone().unwrap_or_default()
                ));
            }
            moves.push(r);
        }
    }
    let moves_end_us = base.elapsed().as_micros() as u64;
    if load.is_some() && args.after_secs > 0 {
        say(
            json,
            format!("load continues for {} s after the moves", args.after_secs),
        );
        tokio::time::sleep(Duration::from_secs(args.after_secs)).await;
    }
    let after_end_us = base.elapsed().as_micros() as u64;

    // Stop the load and let the in-flight writes finish.
    let mut foreground = None;
    if let Some(load) = load {
        let shared = load.stop().await;
        let samples = std::mem::take(&mut *shared.samples.lock().expect("samples"));
        for r in &mut moves {
            let l = loaded
                .iter()
                .find(|l| l.partition == r.partition)
                .expect("a loaded partition");
            let in_part = |s: &&Sample| s.slot >= l.first_slot && s.slot <= l.last_slot;
            let overlapping = |(a, b): (u64, u64)| {
                samples
                    .iter()
                    .filter(in_part)
                    .filter(move |s| s.start_us <= b && s.start_us + s.lat_us as u64 >= a)
            };
            if let Some(w) = r.cutover_us {
                let lats: Vec<f64> = overlapping(w).map(|s| s.lat_us as f64 / 1000.0).collect();
                r.client_writes_in_cutover = lats.len();
                r.client_stall_ms = lats.into_iter().reduce(f64::max);
            }
            r.client_worst_move_ms = overlapping(r.move_us)
                .map(|s| s.lat_us as f64 / 1000.0)
                .reduce(f64::max);
        }
        let before = window(&samples, warm_us, moves_start_us);
        let during = window(&samples, moves_start_us, moves_end_us);
        let copies: Vec<(u64, u64)> = moves.iter().filter_map(|m| m.copy_us).collect();
        let during_copy = window_where(
            &samples,
            copies.iter().map(|(a, b)| b - a).sum::<u64>(),
            |t| copies.iter().any(|&(a, b)| t >= a && t < b),
        );
        let after = window(&samples, moves_end_us, after_end_us);
        let ratio =
            |w: &Window| (w.p99_ms > 0.0 && during.writes > 0).then(|| during.p99_ms / w.p99_ms);
        let (over_before, over_after) = (ratio(&before), ratio(&after));
        if during.failed > 0 {
            problems.push(format!(
                "{} foreground writes failed during the moves: {:?}",
                during.failed,
                shared.final_errors.lock().expect("errors")
            ));
        }
        foreground = Some(Foreground {
            rate_per_sec: args.rate,
            before,
            during,
            during_copy,
            after,
            p99_during_over_before: over_before,
            p99_during_over_after: over_after,
            redirects_followed: shared.redirects.load(Ordering::Relaxed),
            retried_errors: shared.retried_errors.lock().expect("errors").clone(),
            final_errors: shared.final_errors.lock().expect("errors").clone(),
        });
    }

    // Every loaded key, read back from its current owner.
    let map = meta.get_map().await?;
    let mut verify = Verify::default();
    for l in &loaded {
        let owner = &map.nodes[&map.partitions[&PartitionId(l.partition)].owner];
        let (missing, wrong) = verify_keys(&owner.resp_addr, &l.key_list, &values, vsize).await?;
        verify.keys += l.keys;
        verify.missing += missing;
        verify.wrong += wrong;
    }
    if verify.missing + verify.wrong > 0 {
        problems.push(format!(
            "{} loaded keys missing and {} with a wrong value after the moves",
            verify.missing, verify.wrong
        ));
    }

    let sizes = loaded
        .iter()
        .map(|l| summarize(l, &moves, args.throttle))
        .collect::<Vec<_>>();
    for (s, l) in sizes.iter().zip(&loaded) {
        if let Some(p) = s.pause_ms
            && p.max > 100.0
        {
            problems.push(format!(
                "partition {} ({}): cutover pause up to {} ms (record), above 100 ms",
                l.partition,
                fmt_size(l.requested_bytes),
                p.max
            ));
        }
        if let Some(p) = s.client_stall_ms
            && p.max > 100.0
        {
            problems.push(format!(
                "partition {} ({}): a write waited {:.1} ms during a cutover (client view), above 100 ms",
                l.partition,
                fmt_size(l.requested_bytes),
                p.max
            ));
        }
    }
    for (s, l) in sizes.iter().zip(&loaded) {
        let backoffs: u64 = moves
            .iter()
            .filter(|m| m.partition == l.partition)
            .map(|m| m.copy_backoffs)
            .sum();
        if let Some(c) = s.copy_bytes_per_sec_p50
            && args.throttle > 0
            && c < 0.5 * args.throttle as f64
        {
            problems.push(format!(
                "partition {} ({}): the copy ran at {:.1} MiB/s, {:.2}x the {} MiB/s throttle ({backoffs} latency backoffs)",
                l.partition,
                fmt_size(l.requested_bytes),
                mib(c),
                c / args.throttle as f64,
                mib(args.throttle as f64)
            ));
        }
    }
    if let Some(f) = &foreground
        && f.p99_during_over_before.is_some_and(|r| r > 3.0)
    {
        problems.push(format!(
            "foreground p99 {:.1} ms during the moves vs {:.1} ms before ({:.1}x) and {:.1} ms after",
            f.during.p99_ms,
            f.before.p99_ms,
            f.p99_during_over_before.unwrap_or(0.0),
            f.after.p99_ms
        ));
    }
    Ok(Report {
        config: ConfigOut {
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            loadavg_start,
            loadavg_end: loadavg(),
            nodes: map.nodes.len(),
            partitions: parts.len(),
            durability: format!("{:?}", args.durability).to_lowercase(),
            throttle_bytes_per_sec: args.throttle,
            cleanup_grace_ms: args.cleanup_grace_ms,
            load_rate_per_sec: args.rate,
            load_keys: args.load_keys,
            value_size: args.value_size,
            moves_per_size: args.moves,
        },
        loaded,
        sizes,
        moves,
        foreground,
        verify,
        problems,
    })
}

/// Copy backoffs so far, summed over the running nodes.
fn copy_backoffs(cluster: &LocalCluster) -> u64 {
    (0..cluster.len())
        .filter_map(|i| cluster.node(i))
        .map(|n| n.shared().metrics.migration_backoffs.get())
        .sum()
}

fn summarize(l: &Loaded, moves: &[MoveResult], throttle: u64) -> SizeSummary {
    let mine: Vec<&MoveResult> = moves
        .iter()
        .filter(|m| m.partition == l.partition)
        .collect();
    let done: Vec<&&MoveResult> = mine.iter().filter(|m| m.state == "DONE").collect();
    let copy = median(done.iter().filter_map(|m| m.copy_bytes_per_sec).collect());
    SizeSummary {
        size_bytes: l.requested_bytes,
        partition: l.partition,
        moves: mine.len(),
        done: done.len(),
        pause_ms: pcts(
            done.iter()
                .filter_map(|m| m.pause_ms.map(|p| p as f64))
                .collect(),
        ),
        client_stall_ms: pcts(done.iter().filter_map(|m| m.client_stall_ms).collect()),
        copy_bytes_per_sec_p50: copy,
        copy_vs_throttle: copy.filter(|_| throttle > 0).map(|c| c / throttle as f64),
        to_flip_ms_p50: median(
            done.iter()
                .filter_map(|m| m.to_flip_ms.map(|v| v as f64))
                .collect(),
        ),
        to_done_ms_p50: median(done.iter().map(|m| m.to_done_ms as f64).collect()),
    }
}

fn window(samples: &[Sample], from_us: u64, to_us: u64) -> Window {
    window_where(samples, to_us.saturating_sub(from_us), |t| {
        t >= from_us && t < to_us
    })
}

/// The writes that started at a time `inside` accepts (µs since the base).
fn window_where(samples: &[Sample], span_us: u64, inside: impl Fn(u64) -> bool) -> Window {
    let inside: Vec<&Sample> = samples.iter().filter(|s| inside(s.start_us)).collect();
    let mut lats: Vec<f64> = inside
        .iter()
        .filter(|s| s.ok)
        .map(|s| s.lat_us as f64 / 1000.0)
        .collect();
    lats.sort_by(|a, b| a.total_cmp(b));
    Window {
        secs: span_us as f64 / 1e6,
        writes: inside.len(),
        failed: inside.iter().filter(|s| !s.ok).count(),
        p50_ms: pct(&lats, 0.5),
        p99_ms: pct(&lats, 0.99),
        p999_ms: pct(&lats, 0.999),
        max_ms: lats.last().copied().unwrap_or(0.0),
    }
}

// ---------------------------------------------------------------------------
// One move

#[allow(clippy::too_many_arguments)]
async fn run_move(
    meta: &dyn MetaStore,
    pid: PartitionId,
    target: NodeId,
    size: u64,
    names: &HashMap<NodeId, String>,
    timeout: Duration,
    base_us: u64,
    base: Instant,
) -> anyhow::Result<MoveResult> {
    let requested_us = base.elapsed().as_micros() as u64;
    let deadline = Instant::now() + timeout;
    let rec = request_move(meta, pid, target).await?;
    let id = rec.id;
    let mut copy_start: Option<u64> = None;
    let mut copy_end: Option<u64> = None;
    let mut cutover_start: Option<u64> = None;
    let rec = loop {
        let rec = load_record(meta, id).await?;
        match rec.state {
            MigrationState::Copying => {
                copy_start.get_or_insert(rec.state_entered_at_ms);
            }
            MigrationState::Aborted | MigrationState::Pending => {}
            later => {
                // The first state seen after COPYING: when it was entered is
                // when the copy ended (exact if it is CATCHUP, else an upper bound).
                if copy_start.is_some() && copy_end.is_none() {
                    copy_end = Some(rec.state_entered_at_ms);
                }
                if later == MigrationState::Cutover {
                    cutover_start.get_or_insert(rec.state_entered_at_ms);
                }
            }
        }
        if rec.state.is_terminal() {
            break rec;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "migration {id} still in {} after {timeout:?}",
            rec.state
        );
        tokio::time::sleep(POLL).await;
    };
    let done_us = base.elapsed().as_micros() as u64;
    let copy_ms = match (copy_start, copy_end) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a)),
        _ => None,
    };
    let serving_ms = match (rec.fence_started_ms, rec.pause_ms) {
        (Some(f), Some(p)) => Some(f + p),
        _ => None,
    };
    // Manager timestamps are wall-clock ms; samples are µs since `base`.
    let rel = |ms: u64| (ms * 1000).saturating_sub(base_us);
    let cutover_us = match (cutover_start.or(rec.fence_started_ms), serving_ms) {
        (Some(a), Some(b)) => Some((rel(a), rel(b) + CUTOVER_TAIL_US)),
        _ => None,
    };
    Ok(MoveResult {
        migration: id.0,
        partition: pid.0,
        size_bytes: size,
        from: names
            .get(&rec.source())
            .cloned()
            .unwrap_or_else(|| rec.source().to_string()),
        to: names
            .get(&target)
            .cloned()
            .unwrap_or_else(|| target.to_string()),
        state: rec.state.name(),
        abort_reason: rec.abort_reason.as_ref().map(|a| format!("{a:?}")),
        total_bytes: rec.total_bytes,
        copy_ms,
        copy_bytes_per_sec: copy_ms
            .filter(|&ms| ms > 0)
            .map(|ms| rec.total_bytes as f64 * 1000.0 / ms as f64),
        pause_ms: rec.pause_ms,
        client_stall_ms: None,
        client_writes_in_cutover: 0,
        client_worst_move_ms: None,
        to_flip_ms: serving_ms.map(|s| s.saturating_sub(rec.started_at_ms)),
        to_done_ms: rec.state_entered_at_ms.saturating_sub(rec.started_at_ms),
        copy_backoffs: 0,
        cutover_us,
        copy_us: match (copy_start, copy_end) {
            (Some(a), Some(b)) => Some((rel(a), rel(b))),
            _ => None,
        },
        move_us: (requested_us, done_us),
    })
}

async fn load_record(meta: &dyn MetaStore, id: MigrationId) -> anyhow::Result<MigrationRecord> {
    let stored = meta
        .get_migration(id.0)
        .await?
        .ok_or_else(|| anyhow::anyhow!("migration {id} not found"))?;
    Ok(MigrationRecord::decode(&stored.record)?)
}

// ---------------------------------------------------------------------------
// Loading and verifying

/// FNV-1a, to derive each loaded key's value offset.
fn fnv(key: &[u8]) -> u64 {
    key.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

fn value_of<'a>(values: &'a [u8], key: &[u8], vsize: usize) -> &'a [u8] {
    let off = (fnv(key) % (values.len() - vsize) as u64) as usize;
    &values[off..off + vsize]
}

async fn load_partition(
    map: &PartitionMap,
    pid: PartitionId,
    size: u64,
    values: &Arc<Vec<u8>>,
    vsize: usize,
) -> anyhow::Result<Loaded> {
    let p = &map.partitions[&pid];
    let (first, last) = p.slot_span();
    let addr = map.nodes[&p.owner].resp_addr.clone();
    let count = size.div_ceil(vsize as u64) as usize;
    let mut keys = Vec::with_capacity(count);
    let mut i = 0u64;
    while keys.len() < count {
        let k = format!("kwbench:p{}:{i}", pid.0).into_bytes();
        let slot = key_hash_slot(&k);
        if slot >= first && slot <= last {
            keys.push(k);
        }
        i += 1;
    }
    let started = Instant::now();
    let keys = Arc::new(keys);
    let mut tasks = Vec::new();
    for c in 0..LOAD_CONNS {
        let (keys, values, addr) = (keys.clone(), values.clone(), addr.clone());
        tasks.push(tokio::spawn(async move {
            let mut conn = connect(&addr).await?;
            let mine: Vec<&Vec<u8>> = keys.iter().skip(c).step_by(LOAD_CONNS).collect();
            let mut out = Vec::new();
            for batch in mine.chunks(LOAD_BATCH) {
                out.clear();
                for k in batch {
                    encode(
                        &[b"SET".as_slice(), k, value_of(&values, k, vsize)],
                        &mut out,
                    );
                }
                conn.write_all(&out).await?;
                conn.flush().await?;
                for _ in batch {
                    match read_reply(&mut conn).await? {
                        Reply::Simple(s) if s == "OK" => {}
                        other => anyhow::bail!("loading SET to {addr}: {other:?}"),
                    }
                }
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let keys = Arc::try_unwrap(keys).unwrap_or_else(|k| (*k).clone());
    Ok(Loaded {
        partition: pid.0,
        first_slot: first,
        last_slot: last,
        requested_bytes: size,
        keys: keys.len(),
        value_bytes: (keys.len() * vsize) as u64,
        load_secs: started.elapsed().as_secs_f64(),
        key_list: keys,
    })
}

/// Pipelined GETs of `keys` at `addr`: (missing, wrong value).
async fn verify_keys(
    addr: &str,
    keys: &[Vec<u8>],
    values: &[u8],
    vsize: usize,
) -> anyhow::Result<(usize, usize)> {
    let mut conn = connect(addr).await?;
    let (mut missing, mut wrong) = (0, 0);
    let mut out = Vec::new();
    for batch in keys.chunks(LOAD_BATCH) {
        out.clear();
        for k in batch {
            encode(&[b"GET".as_slice(), k], &mut out);
        }
        conn.write_all(&out).await?;
        conn.flush().await?;
        for k in batch {
            match read_reply(&mut conn).await? {
                Reply::Bulk(v) if v == value_of(values, k, vsize) => {}
                Reply::Bulk(_) => wrong += 1,
                Reply::Nil => missing += 1,
                other => anyhow::bail!(
                    "verifying GET {} at {addr}: {other:?}",
                    String::from_utf8_lossy(k)
                ),
            }
        }
    }
    Ok((missing, wrong))
}

// ---------------------------------------------------------------------------
// The foreground load

struct Sample {
    /// Start, µs since the load's base instant.
    start_us: u64,
    lat_us: u32,
    slot: u16,
    ok: bool,
}

struct LoadShared {
    base: Instant,
    routes: RwLock<Vec<Arc<str>>>,
    pool: Mutex<HashMap<Arc<str>, Vec<Conn>>>,
    samples: Mutex<Vec<Sample>>,
    redirects: AtomicU64,
    retried_errors: Mutex<BTreeMap<String, u64>>,
    final_errors: Mutex<BTreeMap<String, u64>>,
    in_flight: AtomicU64,
    last_refresh_us: AtomicU64,
    keys: Vec<(Vec<u8>, u16)>,
    values: Arc<Vec<u8>>,
    vsize: usize,
}

struct Load {
    shared: Arc<LoadShared>,
    stop: Arc<AtomicBool>,
    scheduler: tokio::task::JoinHandle<()>,
}

impl Load {
    fn start(
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
            pool: Mutex::new(HashMap::new()),
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
    async fn stop(self) -> Arc<LoadShared> {
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
        match exec(&shared, &addr, &[b"SET".as_slice(), k, value]).await {
            Ok(Reply::Simple(s)) if s == "OK" => {
                ok = true;
                break;
            }
            Ok(Reply::Error(e)) => {
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

/// `MOVED <slot> <host:port>` → the address.
fn parse_moved(error: &str) -> Option<&str> {
    let mut w = error.split_whitespace();
    (w.next()? == "MOVED").then_some(())?;
    w.next()?;
    w.next()
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
        let Ok(Reply::Array(rows)) = exec(&shared, &addr, &[b"CLUSTER".as_slice(), b"SLOTS"]).await
        else {
            return;
        };
        let mut updates = Vec::new();
        for row in rows {
            let Reply::Array(f) = row else { continue };
            let (Some(Reply::Int(a)), Some(Reply::Int(b)), Some(Reply::Array(node))) =
                (f.first(), f.get(1), f.get(2))
            else {
                continue;
            };
            let (Some(Reply::Bulk(host)), Some(Reply::Int(port))) = (node.first(), node.get(1))
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

/// One command on a pooled connection to `addr`.
async fn exec(shared: &LoadShared, addr: &Arc<str>, args: &[&[u8]]) -> std::io::Result<Reply> {
    let pooled = shared
        .pool
        .lock()
        .expect("pool")
        .get_mut(addr)
        .and_then(|v| v.pop());
    let mut conn = match pooled {
        Some(c) => c,
        None => connect(addr).await?,
    };
    let mut out = Vec::new();
    encode(args, &mut out);
    conn.write_all(&out).await?;
    conn.flush().await?;
    let reply = tokio::time::timeout(Duration::from_secs(30), read_reply(&mut conn))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no reply in 30 s"))??;
    shared
        .pool
        .lock()
        .expect("pool")
        .entry(addr.clone())
        .or_default()
        .push(conn);
    Ok(reply)
}

// ---------------------------------------------------------------------------
// A minimal RESP2 client

type Conn = BufStream<TcpStream>;

#[derive(Debug)]
enum Reply {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    Nil,
    Array(Vec<Reply>),
}

async fn connect(addr: &str) -> std::io::Result<Conn> {
    let stream = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))??;
    stream.set_nodelay(true)?;
    Ok(BufStream::new(stream))
}

fn encode(args: &[&[u8]], out: &mut Vec<u8>) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

fn bad_reply(what: &str) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("bad reply: {what}"),
    )
}

fn read_reply(
    conn: &mut Conn,
) -> Pin<Box<dyn Future<Output = std::io::Result<Reply>> + Send + '_>> {
    Box::pin(async move {
        let mut line = Vec::new();
        if conn.read_until(b'\n', &mut line).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        if !line.ends_with(b"\r\n") {
            return Err(bad_reply("unterminated line"));
        }
        line.truncate(line.len() - 2);
        let (&kind, rest) = line.split_first().ok_or_else(|| bad_reply("empty line"))?;
        let text = String::from_utf8_lossy(rest).into_owned();
        let int = || text.parse::<i64>().map_err(|_| bad_reply("bad integer"));
        match kind {
            b'+' => Ok(Reply::Simple(text)),
            b'-' => Ok(Reply::Error(text)),
            b':' => Ok(Reply::Int(int()?)),
            b'$' => {
                let n = int()?;
                if n < 0 {
                    return Ok(Reply::Nil);
                }
                let mut data = vec![0; n as usize + 2];
                conn.read_exact(&mut data).await?;
                data.truncate(n as usize);
                Ok(Reply::Bulk(data))
            }
            b'*' => {
                let n = int()?;
                if n < 0 {
                    return Ok(Reply::Nil);
                }
                let mut items = Vec::with_capacity((n as usize).min(1024));
                for _ in 0..n {
                    items.push(read_reply(conn).await?);
                }
                Ok(Reply::Array(items))
            }
            _ => Err(bad_reply("unknown type byte")),
        }
    })
}

/// splitmix64: values and key choice need no more.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

// ---------------------------------------------------------------------------
// Output

fn print_report(r: &Report) {
    let ms = |v: Option<f64>| v.map(|v| format!("{v:.1}")).unwrap_or_else(|| "-".into());
    let trip = |p: Option<Pcts>| {
        p.map(|p| format!("{:.1}/{:.1}/{:.1}", p.p50, p.p99, p.max))
            .unwrap_or_else(|| "-".into())
    };
    println!();
    println!(
        "Machine: {} CPUs, load average {} at the start, {} at the end",
        r.config.cpus,
        r.config
            .loadavg_start
            .map_or("?".into(), |v| format!("{v:.2}")),
        r.config
            .loadavg_end
            .map_or("?".into(), |v| format!("{v:.2}"))
    );
    println!(
        "Moves under load ({} per size, throttle {}/s; pause = fence confirmed -> target serving, \
         as the record measures it; stall = slowest write to the partition in flight during the cutover)",
        r.config.moves_per_size,
        if r.config.throttle_bytes_per_sec == 0 {
            "unlimited".to_string()
        } else {
            fmt_size(r.config.throttle_bytes_per_sec)
        }
    );
    println!(
        "{:<10} {:>5} {:>10} {:>22} {:>22} {:>12} {:>10} {:>9} {:>9}",
        "size",
        "part",
        "done/moves",
        "pause ms p50/p99/max",
        "stall ms p50/p99/max",
        "copy MiB/s",
        "/throttle",
        "flip s",
        "done s"
    );
    for s in &r.sizes {
        println!(
            "{:<10} {:>5} {:>10} {:>22} {:>22} {:>12} {:>10} {:>9} {:>9}",
            fmt_size(s.size_bytes),
            s.partition,
            format!("{}/{}", s.done, s.moves),
            trip(s.pause_ms),
            trip(s.client_stall_ms),
            ms(s.copy_bytes_per_sec_p50.map(mib)),
            s.copy_vs_throttle
                .map(|v| format!("{v:.2}x"))
                .unwrap_or_else(|| "-".into()),
            s.to_flip_ms_p50
                .map(|v| format!("{:.2}", v / 1000.0))
                .unwrap_or_else(|| "-".into()),
            s.to_done_ms_p50
                .map(|v| format!("{:.2}", v / 1000.0))
                .unwrap_or_else(|| "-".into()),
        );
    }
    println!("(copy MiB/s and flip/done seconds are medians; flip = request -> target serving)");
    if let Some(f) = &r.foreground {
        println!();
        println!(
            "Foreground SET load, {} /s open loop over {} keys ({} B values), latency incl. redirects",
            f.rate_per_sec, r.config.load_keys, r.config.value_size
        );
        println!(
            "{:<14} {:>7} {:>8} {:>7} {:>8} {:>8} {:>9} {:>9}",
            "window", "secs", "writes", "failed", "p50 ms", "p99 ms", "p99.9 ms", "max ms"
        );
        for (name, w) in [
            ("before moves", &f.before),
            ("during moves", &f.during),
            (" (copying)", &f.during_copy),
            ("after moves", &f.after),
        ] {
            println!(
                "{:<14} {:>7.1} {:>8} {:>7} {:>8.2} {:>8.2} {:>9.2} {:>9.2}",
                name, w.secs, w.writes, w.failed, w.p50_ms, w.p99_ms, w.p999_ms, w.max_ms
            );
        }
        let x = |v: Option<f64>| v.map(|v| format!("{v:.2}x")).unwrap_or_else(|| "-".into());
        println!(
            "p99 during / before: {}   p99 during / after: {}",
            x(f.p99_during_over_before),
            x(f.p99_during_over_after)
        );
        println!(
            "redirects followed: {}; errors retried: {:?}; writes failed: {:?}",
            f.redirects_followed, f.retried_errors, f.final_errors
        );
    }
    println!();
    println!(
        "Loaded keys read back after the moves: {} of {} intact ({} missing, {} wrong)",
        r.verify.keys - r.verify.missing - r.verify.wrong,
        r.verify.keys,
        r.verify.missing,
        r.verify.wrong
    );
    if r.problems.is_empty() {
        println!("No problems seen.");
    } else {
        println!("PROBLEMS:");
        for p in &r.problems {
            println!("  - {p}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_bytes("123"), Ok(123));
        assert_eq!(parse_bytes("4MiB"), Ok(4 * 1024 * 1024));
        assert_eq!(parse_bytes("40MB"), Ok(40_000_000));
        assert_eq!(parse_bytes("1.5KiB"), Ok(1536));
        assert!(parse_bytes("4 parsecs").is_err());
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(pct(&v, 0.5), 50.0);
        assert_eq!(pct(&v, 0.99), 99.0);
        assert_eq!(pct(&[7.0], 0.99), 7.0);
    }

    #[test]
    fn moved_errors_name_the_owner() {
        assert_eq!(
            parse_moved("MOVED 7629 127.0.0.1:7002"),
            Some("127.0.0.1:7002")
        );
        assert_eq!(parse_moved("ERR nope"), None);
    }
}
