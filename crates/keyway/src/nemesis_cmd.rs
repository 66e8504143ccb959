//! `keyway nemesis`: runs the fault-injecting harness (`keyway-nemesis`)
//! N times against real `keyway` processes (this binary), one summary line
//! per run and a total line; non-zero exit if any run failed.

use indicatif::{ProgressBar, ProgressStyle};
use keyway_nemesis::{FaultKind, MetaKind, Network, Progress, RunConfig, Totals, run_one};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

#[derive(clap::Args)]
pub struct NemesisArgs {
    /// Runs; run i uses seed + i.
    #[arg(long, default_value_t = 10)]
    runs: u64,
    /// Length of each run's fault phase, seconds (start, healing and final reads come on top).
    #[arg(long, default_value_t = 30)]
    time_limit: u64,
    /// The first run's seed (default: random, printed); replays that run's schedule.
    #[arg(long)]
    seed: Option<u64>,
    /// Nodes (`keyway server` processes).
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Concurrent workload clients (half smart, half plain Redis Cluster).
    #[arg(long, default_value_t = 6)]
    clients: usize,
    /// Faults to inject: kill,pause,manager,meta,move,split,merge,disk,
    /// partition,primary-kill,replica-pause,partition-store,partition-peers,
    /// permanent-loss. `primary-kill` kills the node that is primary of the
    /// most partitions (half of the time kept down past the failover, so it
    /// rejoins as a replica); `permanent-loss` kills a node, deletes its
    /// data, waits until every partition is back at the replication factor
    /// on the survivors (past --down-grace-ms), decommissions it and starts
    /// a new empty node in its place (replicated runs with more nodes than
    /// copies only; left out otherwise);
    /// `replica-pause` SIGSTOPs the busiest in-sync replica past
    /// --replica-lag-timeout-ms; `partition-store` / `partition-peers` cut a
    /// node from the metadata store only / from the other nodes only.
    /// `default` is all but the partition family (which needs root and
    /// iproute2: each node then runs in its own network namespace); `all`
    /// is every kind.
    #[arg(long, default_value = "default")]
    faults: String,
    /// Metadata store: embedded (`keyway meta`) or etcd (3 members; needs etcd installed).
    #[arg(long, default_value = "embedded")]
    meta: MetaKind,
    /// Where failing runs' histories (run-SEED.jsonl) and directories (run-SEED/) go.
    #[arg(long, default_value = "nemesis-out")]
    out: PathBuf,
    /// Keep passing runs' directories (logs, data) and histories too.
    #[arg(long)]
    keep: bool,
    /// Per-operation timeout, milliseconds; past it the outcome is unknown.
    #[arg(long, default_value_t = 2_000)]
    op_timeout_ms: u64,
    /// Pause between two operations of one client, milliseconds.
    #[arg(long, default_value_t = 5)]
    think_ms: u64,
    /// Hash tags the keys are spread over (each its own slot).
    #[arg(long, default_value_t = 4)]
    hash_tags: usize,
    /// Register keys (SET, GET, APPEND, DEL, MSET/MGET).
    #[arg(long, default_value_t = 8)]
    register_keys: usize,
    /// Counter keys (INCR and GET only).
    #[arg(long, default_value_t = 4)]
    counter_keys: usize,
    /// Partitions per node in the initial map.
    #[arg(long, default_value_t = 4)]
    partitions_per_node: u16,
    /// The nodes' lease TTL, milliseconds (a pause is held past it).
    #[arg(long, default_value_t = 2_000)]
    node_lease_ttl_ms: u64,
    /// The managers' seat lease TTL, milliseconds.
    #[arg(long, default_value_t = 2_000)]
    manager_lease_ttl_ms: u64,
    /// Topology changes (moves, splits, merges) in flight at once.
    #[arg(long, default_value_t = 2)]
    churn_workers: usize,
    /// A run with fewer successful operations failed (the workload did not run).
    #[arg(long, default_value_t = 200)]
    min_ok_ops: u64,
    /// How long the cluster may take to start, and to serve again after healing, milliseconds.
    #[arg(long, default_value_t = 60_000)]
    settle_timeout_ms: u64,
    /// Copies of each partition of keyspace 0 (`keyway meta
    /// --replication-factor`), as `keyway dev` runs by default; 1 tests the
    /// single-copy path and passes no replication flag (1..=5, at most --nodes).
    #[arg(long, default_value_t = 2)]
    replication_factor: u8,
    /// Copies (the primary included) that must be in sync for a write to
    /// be accepted (`-NOREPLICAS` below it); 1..=--replication-factor.
    #[arg(long, default_value_t = 1)]
    min_in_sync: u8,
    /// The nodes' --replica-lag-timeout-ms (with replication); a
    /// `replica-pause` is held past it.
    #[arg(long, default_value_t = 2_000)]
    replica_lag_timeout_ms: u64,
    /// The nodes' --replica-read-lease-ms (with replication); below the lag timeout.
    #[arg(long, default_value_t = 1_000)]
    replica_read_lease_ms: u64,
    /// The nodes' --replica-stream-window-calls (with replication): calls
    /// each stream keeps in flight, 1..=64. The harness's default, 4, runs
    /// the pipelined stream (the nodes' own default is 1).
    #[arg(long, default_value_t = 4)]
    replica_stream_window_calls: u64,
    /// Percent of the plain clients' reads sent to a replica on a READONLY
    /// connection (counted as replica_reads; judged like every read).
    #[arg(long, default_value_t = 30)]
    replica_read_pct: u32,
    /// The managers' --rebalance-down-grace-ms when permanent-loss is
    /// injected: a node down this long has its copies re-replicated.
    /// Short so a run stays short, but above every other fault's outage
    /// (1000..=600000).
    #[arg(long, default_value_t = 5_000)]
    down_grace_ms: u64,
    /// A permanent-loss whose partitions are not all back at the
    /// replication factor (in sync, none on the lost node) this long after
    /// the kill fails the run; more than --down-grace-ms + the lease TTL.
    #[arg(long, default_value_t = 60_000)]
    recovery_timeout_ms: u64,
}

pub async fn run(args: NemesisArgs) -> anyhow::Result<()> {
    user_ensure!(args.runs > 0, "--runs must be greater than 0");
    let config = RunConfig {
        bin: std::env::current_exe()?,
        out: args.out.clone(),
        meta: args.meta,
        nodes: args.nodes,
        managers: 2,
        partitions_per_node: args.partitions_per_node,
        clients: args.clients,
        faults: FaultKind::parse_list(&args.faults).map_err(anyhow::Error::msg)?,
        time_limit_ms: args.time_limit.saturating_mul(1000),
        op_timeout_ms: args.op_timeout_ms,
        think_ms: args.think_ms,
        hash_tags: args.hash_tags,
        register_keys: args.register_keys,
        counter_keys: args.counter_keys,
        node_lease_ttl_ms: args.node_lease_ttl_ms,
        manager_lease_ttl_ms: args.manager_lease_ttl_ms,
        churn_workers: args.churn_workers,
        min_ok_ops: args.min_ok_ops,
        settle_timeout_ms: args.settle_timeout_ms,
        keep: args.keep,
        replication_factor: args.replication_factor,
        min_in_sync: args.min_in_sync,
        replica_lag_timeout_ms: args.replica_lag_timeout_ms,
        replica_read_lease_ms: args.replica_read_lease_ms,
        replica_stream_window_calls: args.replica_stream_window_calls,
        replica_read_pct: args.replica_read_pct,
        down_grace_ms: args.down_grace_ms,
        recovery_timeout_ms: args.recovery_timeout_ms,
    };
    config.validate().map_err(anyhow::Error::msg)?;
    if config.needs_network() {
        // Not silently skipped: a machine that cannot make namespaces says so.
        Network::probe()?;
    }
    std::fs::create_dir_all(&args.out)?;
    let first = args
        .seed
        .unwrap_or_else(|| u64::from(rand::random::<u32>()));
    let scheduled = config.scheduled_faults();
    let faults: Vec<&str> = scheduled.iter().map(|k| k.name()).collect();
    let dropped: Vec<&str> = config.dropped_faults().iter().map(|k| k.name()).collect();
    if !dropped.is_empty() {
        println!(
            "not injected (needs replication factor >= 2 and more nodes than copies): {}",
            dropped.join(",")
        );
    }
    println!(
        "keyway nemesis: {} runs from seed {first} (--seed {first} replays), {} s each, {} nodes, replication factor {} (min in sync {}), {} clients, faults {}",
        args.runs,
        args.time_limit,
        args.nodes,
        args.replication_factor,
        args.min_in_sync,
        args.clients,
        faults.join(",")
    );
    let mut totals = Totals::default();
    for i in 0..args.runs {
        let seed = first.wrapping_add(i);
        let progress = Arc::new(Progress::default());
        let bar = progress_bar(seed, args.time_limit, &progress)?;
        // SIGINT/SIGTERM ends the batch: dropping the run stops its
        // processes and removes its namespaces and bridge (their `Drop`s).
        let result = tokio::select! {
            r = run_one(&config, seed, progress.clone()) => r,
            _ = crate::shutdown_signal() => {
                bar.finish_and_clear();
                println!("seed {seed} interrupted: cluster stopped, runs not carried out from here");
                totals.add_error();
                break;
            }
        };
        bar.finish_and_clear();
        match result {
            Ok(report) => {
                println!("{report}");
                totals.add(&report);
            }
            Err(e) => {
                println!("seed {seed} ERROR (run not carried out): {e}");
                totals.add_error();
            }
        }
    }
    println!("{totals}");
    anyhow::ensure!(
        totals.all_passed(),
        "{} of {} runs failed",
        totals.runs - totals.passed,
        totals.runs
    );
    Ok(())
}

/// A bar over the fault phase, fed from the run's live counters.
fn progress_bar(seed: u64, secs: u64, progress: &Arc<Progress>) -> anyhow::Result<ProgressBar> {
    let bar = ProgressBar::new(secs);
    bar.set_style(
        ProgressStyle::with_template("seed {prefix} [{bar:30}] {pos}/{len}s {msg}")?
            .progress_chars("=> "),
    );
    bar.set_prefix(seed.to_string());
    let (b, p) = (bar.clone(), progress.clone());
    tokio::spawn(async move {
        while !b.is_finished() {
            b.set_position(p.elapsed_ms.load(Relaxed) / 1000);
            b.set_message(format!(
                "ok {} failed {} unknown {} faults {} final reads {}",
                p.ok.load(Relaxed),
                p.failed.load(Relaxed),
                p.unknown.load(Relaxed),
                p.faults.load(Relaxed),
                p.final_reads.load(Relaxed)
            ));
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    });
    Ok(bar)
}
