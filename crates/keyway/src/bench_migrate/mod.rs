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
//! deliberately minimal, over `keyway-resp`'s codec (no smart client: the
//! figures are the nodes', not a client library's; `keyway bench routing`
//! measures the smart client).
//!
//! Here: the arguments, the cluster's setup and teardown, and the run's
//! order; [`moves`] loads the test partitions and drives their moves,
//! [`load`] is the foreground load and its latency record, [`resp`] the
//! pooled RESP client both use, [`report`] sums it all up and prints it.

mod load;
mod moves;
mod report;
pub(crate) mod resp;

use keyway_cluster::{ClusterSpec, LocalCluster, ManagerSpec};
use keyway_manager::{DriverConfig, ManagerConfig};
use keyway_map::{DEFAULT_KEYSPACE, NodeId, PartitionId};
use keyway_node::{Durability, NodeConfig};
use load::Load;
use report::{ConfigOut, Phases, Report};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

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
    /// Smart-client strategies and the proxy through a rebalance: extra round
    /// trips, rejections per client (idle ones too), map load, p99 added.
    Routing(crate::bench_routing::RoutingArgs),
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.command {
        BenchCommand::Migrate(args) => migrate(args).await,
        BenchCommand::Routing(args) => crate::bench_routing::run(args).await,
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
pub(crate) fn loadavg() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

pub(crate) fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// Progress lines: stdout normally, stderr under `--json`.
pub(crate) fn say(json: bool, line: impl AsRef<str>) {
    if json {
        eprintln!("{}", line.as_ref());
    } else {
        println!("{}", line.as_ref());
    }
}

/// Removes a temporary data directory when dropped.
pub(crate) struct TempDir(pub(crate) Option<PathBuf>);

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
            config: ManagerConfig {
                driver,
                // The benchmark's own moves only.
                rebalance: keyway_manager::RebalanceConfig {
                    enabled: false,
                    ..Default::default()
                },
                ..ManagerConfig::default()
            },
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
        report::print_report(&report);
    }
    Ok(())
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
        let l = moves::load_partition(&map, pid, size, &values, vsize).await?;
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
    let (mut moves, mut problems) =
        moves::move_all(cluster, &map, &loaded, args, &names, base_us, base).await?;
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
        let phases = Phases {
            warm_us,
            moves_start_us,
            moves_end_us,
            after_end_us,
        };
        foreground = Some(report::foreground(
            &shared,
            args.rate,
            &phases,
            &loaded,
            &mut moves,
            &mut problems,
        ));
    }

    // Every loaded key, read back from its current owner.
    let map = meta.get_map().await?;
    let verify = moves::verify(&map, &loaded, &values, vsize).await?;
    if verify.missing + verify.wrong > 0 {
        problems.push(format!(
            "{} loaded keys missing and {} with a wrong value after the moves",
            verify.missing, verify.wrong
        ));
    }

    let sizes = loaded
        .iter()
        .map(|l| report::summarize(l, &moves, args.throttle))
        .collect::<Vec<_>>();
    report::check_limits(
        &sizes,
        &loaded,
        &moves,
        args.throttle,
        foreground.as_ref(),
        &mut problems,
    );
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

/// splitmix64: values and key choice need no more.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
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
}
