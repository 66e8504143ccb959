//! `keyway bench routing`: what each place the map can live (seed 000)
//! costs through a rebalance, measured.
//!
//! One row per way of routing — the smart client's `redirect`, `lookup`
//! and `hybrid` strategies, and plain RESP clients through the `proxy` —
//! each on a fresh in-process cluster ([`LocalCluster`]: embedded metadata
//! store, `--nodes` nodes, a manager that runs only the benchmark's moves),
//! so every row sees the same rebalance from the same starting map:
//!
//! 1. `--keys` keys are preloaded (over every partition).
//! 2. `--clients` clients connect; `--idle-fraction` of them are idle: they
//!    read every key once now, then nothing until the moves are over.
//! 3. The active clients issue paced GETs and SETs (`--rate` in all) for
//!    `--baseline-secs`: the "before" latency window.
//! 4. `--moves` partitions of node n1 (spread over its range) move to the
//!    other nodes in turn, `--parallel` at a time, each followed to `DONE`;
//!    the active load runs on: the "during" window. The row waits until
//!    every node routes by the final map, then stops the active load.
//! 5. Every idle client reads every key again (the burst seed 000 singles
//!    out: a client idle through a multi-partition move).
//!
//! Counters are read at step 4's start, between 4 and 5, and after 5: the
//! clients' routing counters ([`keyway_client::ClientStats`]), each node's
//! rejections and `KW.MAP SINCE` replies (its Prometheus registry, in
//! process), and the proxy's `/metrics`. The figures are printed per row
//! with their ratio to the hybrid row of the same run.
//!
//! Here: the arguments, one row's cluster and order of events, the moves,
//! and the counters; [`clients`] is the load, [`report`] sums up and prints.

mod clients;
mod report;

use crate::bench_migrate::{TempDir, loadavg, say, unix_us};
use clients::{Active, Handle};
use keyway_client::{ClientConfig, ClientStats, Strategy};
use keyway_cluster::{ClusterSpec, LocalCluster, ManagerSpec};
use keyway_manager::{ManagerConfig, request_move};
use keyway_map::{DEFAULT_KEYSPACE, NodeId, PartitionId, PartitionMap};
use keyway_migration::MigrationId;
use keyway_node::{Durability, NodeConfig};
use keyway_proxy::{Proxy, ProxyConfig};
use report::{ConfigOut, Counts, NodeCounts, ProxyCounts, RowRaw};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How often the moves' records are polled.
const POLL: Duration = Duration::from_millis(10);
/// How long every node may take to route by the final map.
const SERVING_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(clap::Args, Debug)]
pub struct RoutingArgs {
    /// Clients per row (smart clients, or plain connections to the proxy).
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Fraction of the clients idle through the moves (rounded): they read
    /// every key before the moves and again after them.
    #[arg(long, default_value_t = 0.25)]
    idle_fraction: f64,
    /// Partitions moved per row: node n1's, spread over its range, to the
    /// other nodes in turn (at most --partitions-per-node).
    #[arg(long, default_value_t = 16)]
    moves: usize,
    /// Moves in flight at once.
    #[arg(long, default_value_t = 4)]
    parallel: usize,
    /// Requests per second over all active clients (GET and SET, half each;
    /// each client paced, one request in flight).
    #[arg(long, default_value_t = 2000)]
    rate: u64,
    /// Keys preloaded; active clients pick among them, idle ones read all.
    #[arg(long, default_value_t = 4096)]
    keys: usize,
    /// Nodes in the cluster.
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Partitions per node at bootstrap.
    #[arg(long, default_value_t = 32)]
    partitions_per_node: u16,
    /// Seconds of load before the first move: the "before" latency window
    /// (its first second is left out when it is longer than one).
    #[arg(long, default_value_t = 3)]
    baseline_secs: u64,
    /// Seed of the active clients' key and operation choices.
    #[arg(long, default_value_t = 6)]
    seed: u64,
    /// Smart clients: `lookup_ttl_ms` (the lookup strategy resolves again
    /// once its cache is this old).
    #[arg(long, default_value_t = ClientConfig::default().lookup_ttl_ms)]
    lookup_ttl_ms: u64,
    /// Smart clients: `min_refresh_interval_ms` (a rejection within it of
    /// the last refresh patches only).
    #[arg(long, default_value_t = ClientConfig::default().min_refresh_interval_ms)]
    min_refresh_interval_ms: u64,
    /// How long a source keeps a moved range before dropping it (`DONE` follows).
    #[arg(long, default_value_t = 500)]
    cleanup_grace_ms: u64,
    /// Node durability: always, group, periodic, none (none by default: the
    /// figures are about routing, not fsync).
    #[arg(long, default_value = "none")]
    durability: Durability,
    /// Give up on a move that has not ended after this many seconds.
    #[arg(long, default_value_t = 120)]
    move_timeout_secs: u64,
    /// Print the results as JSON on stdout (progress goes to stderr).
    #[arg(long)]
    json: bool,
}

/// One way of routing: a smart-client strategy, or the proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Way {
    Client(Strategy),
    Proxy,
}

impl Way {
    const ROWS: [Way; 4] = [
        Way::Client(Strategy::Redirect),
        Way::Client(Strategy::Lookup),
        Way::Client(Strategy::Hybrid),
        Way::Proxy,
    ];

    fn name(self) -> &'static str {
        match self {
            Way::Client(s) => s.name(),
            Way::Proxy => "proxy",
        }
    }
}

impl RoutingArgs {
    fn idle_clients(&self) -> usize {
        ((self.clients as f64 * self.idle_fraction).round() as usize).min(self.clients)
    }

    fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            (1..=1000).contains(&self.clients),
            "--clients must be between 1 and 1000"
        );
        anyhow::ensure!(
            (0.0..=1.0).contains(&self.idle_fraction),
            "--idle-fraction must be between 0 and 1"
        );
        anyhow::ensure!(
            self.nodes >= 2,
            "--nodes must be at least 2 to move anything"
        );
        anyhow::ensure!(
            self.partitions_per_node > 0,
            "--partitions-per-node must be positive"
        );
        anyhow::ensure!(
            (1..=self.partitions_per_node as usize).contains(&self.moves),
            "--moves must be between 1 and --partitions-per-node ({})",
            self.partitions_per_node
        );
        anyhow::ensure!(self.parallel >= 1, "--parallel must be at least 1");
        anyhow::ensure!(
            (1..=10_000_000).contains(&self.keys),
            "--keys must be between 1 and 10000000"
        );
        let active = self.clients - self.idle_clients();
        anyhow::ensure!(
            self.rate == 0 || active > 0,
            "--rate needs at least one active client (lower --idle-fraction)"
        );
        anyhow::ensure!(
            self.rate <= 1_000_000 * active.max(1) as u64,
            "--rate must be at most 1000000 per active client"
        );
        anyhow::ensure!(
            self.move_timeout_secs > 0,
            "--move-timeout-secs must be positive"
        );
        let config = self.client_config(Strategy::Hybrid);
        config
            .validate()
            .map_err(|e| anyhow::anyhow!("client settings: {e}"))?;
        Ok(())
    }

    fn client_config(&self, strategy: Strategy) -> ClientConfig {
        ClientConfig {
            strategy,
            lookup_ttl_ms: self.lookup_ttl_ms,
            min_refresh_interval_ms: self.min_refresh_interval_ms,
            ..ClientConfig::default()
        }
    }
}

pub async fn run(args: RoutingArgs) -> anyhow::Result<()> {
    args.validate()?;
    let idle = args.idle_clients();
    let loadavg_start = loadavg();
    say(
        args.json,
        format!(
            "keyway bench routing: {} nodes x {} partitions, {} clients ({} idle), {} req/s, \
             {} keys, {} moves ({} at a time) per row, durability {}",
            args.nodes,
            args.partitions_per_node,
            args.clients,
            idle,
            args.rate,
            args.keys,
            args.moves,
            args.parallel,
            format!("{:?}", args.durability).to_lowercase()
        ),
    );
    let mut rows = Vec::new();
    for (i, way) in Way::ROWS.into_iter().enumerate() {
        say(args.json, format!("row {}: {}", i + 1, way.name()));
        rows.push(run_row(&args, way, i).await?);
    }
    let report = report::build(
        ConfigOut {
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            loadavg_start,
            loadavg_end: loadavg(),
            nodes: args.nodes,
            partitions: args.nodes * args.partitions_per_node as usize,
            clients: args.clients,
            idle_clients: idle,
            rate_per_sec: args.rate,
            keys: args.keys,
            moves: args.moves,
            parallel: args.parallel,
            baseline_secs: args.baseline_secs,
            lookup_ttl_ms: args.lookup_ttl_ms,
            min_refresh_interval_ms: args.min_refresh_interval_ms,
            durability: format!("{:?}", args.durability).to_lowercase(),
            seed: args.seed,
        },
        rows,
    );
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        report::print_report(&report);
    }
    Ok(())
}

/// One row on its own fresh cluster, torn down afterwards.
async fn run_row(args: &RoutingArgs, way: Way, index: usize) -> anyhow::Result<RowRaw> {
    let dir = std::env::temp_dir().join(format!(
        "keyway-bench-routing-{}-{}-{index}",
        std::process::id(),
        unix_us()
    ));
    let _temp = TempDir(Some(dir.clone()));
    let mut manager = ManagerConfig::default();
    manager.driver.migration.cleanup_grace_ms = args.cleanup_grace_ms;
    manager.driver.poll_interval_ms = 20;
    manager.driver.discover_interval_ms = 50;
    // The benchmark's own moves only.
    manager.rebalance.enabled = false;
    manager.split.enabled = false;
    manager.merge.enabled = false;
    let spec = ClusterSpec {
        partitions_per_node: args.partitions_per_node,
        node: NodeConfig {
            durability: args.durability,
            ..NodeConfig::default()
        },
        manager: Some(ManagerSpec {
            config: manager,
            ..ManagerSpec::default()
        }),
        ..ClusterSpec::ephemeral(args.nodes, dir)
    };
    let cluster = LocalCluster::start(spec).await?;
    let outcome = tokio::select! {
        r = scenario(&cluster, args, way) => r,
        _ = crate::shutdown_signal() => Err(anyhow::anyhow!("interrupted")),
    };
    cluster.shutdown().await;
    outcome
}

/// The clients of one row, idle ones first.
struct Fleet {
    handles: Vec<Handle>,
    idle: usize,
}

impl Fleet {
    fn idle(&self) -> &[Handle] {
        &self.handles[..self.idle]
    }

    fn active(&self) -> &[Handle] {
        &self.handles[self.idle..]
    }
}

async fn scenario(cluster: &LocalCluster, args: &RoutingArgs, way: Way) -> anyhow::Result<RowRaw> {
    let json = args.json;
    let map = cluster.map().await?;
    let names: BTreeMap<NodeId, String> = map
        .nodes
        .keys()
        .enumerate()
        .map(|(i, id)| (*id, format!("n{}", i + 1)))
        .collect();
    let plan = plan_moves(&map, args.moves);
    let n1 = *map
        .nodes
        .keys()
        .next()
        .expect("a bootstrapped map has nodes");
    let losing_node = cluster
        .node_ids()
        .iter()
        .position(|id| *id == Some(n1))
        .ok_or_else(|| anyhow::anyhow!("node {n1} is not running"))?;
    let keys = clients::keys(args.keys);
    clients::preload(&map, &keys).await?;

    let proxy = match way {
        Way::Proxy => {
            let meta = keyway_meta::connect(&cluster.meta_url()).await?;
            let config = ProxyConfig {
                listen: "127.0.0.1:0".parse()?,
                admin_listen: "127.0.0.1:0".parse()?,
                ..ProxyConfig::default()
            };
            Some(Proxy::start(config, meta).await?)
        }
        Way::Client(_) => None,
    };
    let seeds: Vec<String> = cluster.resp_addrs().into_iter().flatten().collect();
    let mut handles = Vec::with_capacity(args.clients);
    for _ in 0..args.clients {
        handles.push(match (way, &proxy) {
            (Way::Client(s), _) => Handle::smart(&seeds, args.client_config(s)).await?,
            (Way::Proxy, Some(p)) => Handle::plain(p.resp_addr()).await?,
            (Way::Proxy, None) => unreachable!("the proxy row starts a proxy"),
        });
    }
    let fleet = Fleet {
        handles,
        idle: args.idle_clients(),
    };
    let warm = clients::read_all(fleet.idle(), &keys).await?;

    // The active load: before, then during the moves.
    let base = Instant::now();
    let active = Active::start(fleet.active(), keys.clone(), args.rate, args.seed, base);
    tokio::time::sleep(Duration::from_secs(args.baseline_secs)).await;
    let warm_us = if args.baseline_secs > 1 { 1_000_000 } else { 0 };
    let at_moves = counts(cluster, &fleet, proxy.as_ref()).await?;
    let moves_start_us = base.elapsed().as_micros() as u64;
    let moved = run_moves(cluster, &plan, args).await?;
    cluster.wait_serving(SERVING_TIMEOUT).await?;
    let moves_end_us = base.elapsed().as_micros() as u64;
    let load = active.stop().await?;
    say(
        json,
        format!(
            "  {} moves off n1 ({}) in {:.1} s; {} active requests",
            moved.done,
            plan.iter()
                .map(|(p, t)| format!("{p}->{}", names[t]))
                .collect::<Vec<_>>()
                .join(" "),
            moved.secs,
            load.samples.len()
        ),
    );

    // The idle clients' burst.
    let at_burst = counts(cluster, &fleet, proxy.as_ref()).await?;
    let burst = clients::read_all(fleet.idle(), &keys).await?;
    let at_end = counts(cluster, &fleet, proxy.as_ref()).await?;
    if let Some(p) = proxy {
        p.shutdown().await;
    }
    Ok(RowRaw {
        name: way.name(),
        idle: fleet.idle,
        losing_node,
        warm,
        burst,
        load,
        warm_us,
        moves_start_us,
        moves_end_us,
        moves_done: moved.done,
        moves_secs: moved.secs,
        problems: moved.problems,
        at_moves,
        at_burst,
        at_end,
    })
}

/// `k` partitions of the first node, spread evenly over its range, each to
/// the other nodes in turn.
fn plan_moves(map: &PartitionMap, k: usize) -> Vec<(PartitionId, NodeId)> {
    let ids: Vec<NodeId> = map.nodes.keys().copied().collect();
    let n1 = ids[0];
    let mine: Vec<PartitionId> = map
        .keyspace_partitions(DEFAULT_KEYSPACE)
        .filter(|p| p.owner == n1)
        .map(|p| p.id)
        .collect();
    (0..k.min(mine.len()))
        .map(|i| (mine[i * mine.len() / k], ids[1 + i % (ids.len() - 1)]))
        .collect()
}

struct Moved {
    done: usize,
    secs: f64,
    problems: Vec<String>,
}

/// Requests the moves, at most `--parallel` in flight, each followed to
/// its end through the manager's driver view.
async fn run_moves(
    cluster: &LocalCluster,
    plan: &[(PartitionId, NodeId)],
    args: &RoutingArgs,
) -> anyhow::Result<Moved> {
    let driver = cluster
        .manager()
        .ok_or_else(|| anyhow::anyhow!("the cluster runs no manager"))?
        .driver();
    let timeout = Duration::from_secs(args.move_timeout_secs);
    let started = Instant::now();
    let mut queue = plan.iter();
    let mut in_flight: BTreeMap<MigrationId, (PartitionId, Instant)> = BTreeMap::new();
    let mut moved = Moved {
        done: 0,
        secs: 0.0,
        problems: Vec::new(),
    };
    loop {
        while in_flight.len() < args.parallel {
            let Some(&(pid, target)) = queue.next() else {
                break;
            };
            let rec = request_move(&**cluster.meta(), pid, target).await?;
            in_flight.insert(rec.id, (pid, Instant::now()));
        }
        if in_flight.is_empty() {
            break;
        }
        tokio::time::sleep(POLL).await;
        for m in driver.migrations().await? {
            let Some(&(pid, since)) = in_flight.get(&m.id) else {
                continue;
            };
            match m.state.as_str() {
                "DONE" => {
                    moved.done += 1;
                    in_flight.remove(&m.id);
                }
                "ABORTED" => {
                    moved.problems.push(format!(
                        "the move of partition {pid} aborted: {:?}",
                        m.abort_reason
                    ));
                    in_flight.remove(&m.id);
                }
                state => anyhow::ensure!(
                    since.elapsed() < timeout,
                    "the move of partition {pid} still in {state} after {timeout:?}"
                ),
            }
        }
    }
    moved.secs = started.elapsed().as_secs_f64();
    Ok(moved)
}

/// Every counter the report needs, now.
async fn counts(
    cluster: &LocalCluster,
    fleet: &Fleet,
    proxy: Option<&Proxy>,
) -> anyhow::Result<Counts> {
    let clients: Vec<Option<ClientStats>> = fleet.handles.iter().map(Handle::stats).collect();
    let nodes = (0..cluster.len())
        .map(|i| {
            let text = cluster
                .node(i)
                .map(|n| n.shared().metrics.encode())
                .unwrap_or_default();
            NodeCounts {
                rejections: metric_sum(&text, "keyway_rejections_total"),
                map_since: metric_sum(&text, "keyway_map_since_replies_total"),
            }
        })
        .collect();
    let proxy = match proxy {
        Some(p) => {
            let text = http_get(p.admin_addr(), "/metrics").await?;
            Some(ProxyCounts {
                requests: metric_sum(&text, "keyway_proxy_requests_total"),
                rejections_followed: metric_sum(&text, "keyway_proxy_rejections_followed_total"),
                upstream_errors: metric_sum(&text, "keyway_proxy_upstream_errors_total"),
                map_reloads: metric_sum(&text, "keyway_proxy_map_reloads_total"),
                map_updates: metric_sum(&text, "keyway_proxy_map_updates_total"),
            })
        }
        None => None,
    };
    Ok(Counts {
        clients,
        nodes,
        proxy,
    })
}

/// The sum of every series of metric `name` in a Prometheus text exposition.
fn metric_sum(text: &str, name: &str) -> u64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let metric = series.split('{').next()?;
            (metric == name).then(|| value.parse::<f64>().ok())?
        })
        .sum::<f64>() as u64
}

/// The body of `GET <path>` at `addr` (HTTP/1.0: no chunking, closed at the end).
async fn http_get(addr: &str, path: &str) -> anyhow::Result<String> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut reply = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut reply)).await??;
    let reply = String::from_utf8_lossy(&reply);
    let (head, body) = reply
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow::anyhow!("{addr}{path}: no HTTP reply"))?;
    anyhow::ensure!(
        head.starts_with("HTTP/1.") && head.split_whitespace().nth(1) == Some("200"),
        "{addr}{path}: {}",
        head.lines().next().unwrap_or("")
    );
    Ok(body.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_sums_add_up_every_series() {
        let text = "# HELP keyway_rejections Requests rejected\n\
                    keyway_rejections_total{kind=\"moved\"} 3\n\
                    keyway_rejections_total{kind=\"stale_epoch\"} 4\n\
                    keyway_rejections_totally 100\n\
                    keyway_commands_total 12\n";
        assert_eq!(metric_sum(text, "keyway_rejections_total"), 7);
        assert_eq!(metric_sum(text, "keyway_commands_total"), 12);
        assert_eq!(metric_sum(text, "keyway_map_since_replies_total"), 0);
    }

    #[test]
    fn moves_come_off_the_first_node_spread_and_alternating() {
        let nodes: Vec<keyway_map::NodeInfo> = (1..=3)
            .map(|i| keyway_map::NodeInfo::up(NodeId(i), format!("h:{i}")))
            .collect();
        let map = PartitionMap::bootstrap(&nodes, 8).unwrap();
        let plan = plan_moves(&map, 4);
        assert_eq!(plan.len(), 4);
        for (p, _) in &plan {
            assert_eq!(map.partitions[p].owner, NodeId(1));
        }
        let targets: Vec<NodeId> = plan.iter().map(|(_, t)| *t).collect();
        assert_eq!(targets, [NodeId(2), NodeId(3), NodeId(2), NodeId(3)]);
        let distinct: std::collections::BTreeSet<_> = plan.iter().map(|(p, _)| *p).collect();
        assert_eq!(distinct.len(), 4);
    }
}
