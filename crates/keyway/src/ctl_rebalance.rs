//! `keyway ctl drain | decommission | node weight | rebalance --plan`: the
//! operator's side of the rebalancer.
//!
//! `drain`, `node weight` and `decommission` write the node's record in the
//! map (every manager sees it; re-registration keeps it); the leader
//! manager's rebalancer acts on it. `rebalance --plan` computes the plan
//! itself, with the same planner and flags as the manager: the map and the
//! migration records from the store, the load from the nodes (their
//! `PartitionStats` RPC, as the manager's load monitor asks them). It moves
//! nothing.

use crate::ctl::print_json;
use crate::ctl_move::resolve_node;
use crate::rebalance_flags::RebalanceFlags;
use keyway_manager::rebalance::replicas::{
    LiveReplicaMove, ReplicaInput, ReplicaPlan, plan_replicas,
};
use keyway_manager::rebalance::{
    DownPhase, NodePlan, Plan, PlanInput, Role, Stop, Stuck, decommission, plan, read_migrations,
    set_draining, set_weight,
};
use keyway_manager::{RpcStats, StatsSource};
use keyway_map::{NodeId, NodeState, PartitionId};
use keyway_meta::MetaStore;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

#[derive(clap::Args)]
pub struct DrainArgs {
    /// The node: its id as `CLUSTER MYID` prints it, or its `host:port`.
    node: String,
    /// Stop draining it (it becomes a target again).
    #[arg(long)]
    cancel: bool,
    /// Bound on each switchover's fence, ms (1-60000): before anything
    /// moves, each partition it is primary of that has an in-sync replica
    /// switches to it (a failed switchover leaves that partition to a move).
    #[arg(long, default_value_t = keyway_manager::switchover::DEFAULT_SWITCHOVER_TIMEOUT_MS)]
    switchover_timeout_ms: u64,
    /// Return once the node is marked draining, without following the
    /// moves (`keyway ctl nodes` and `migrations` show them).
    #[arg(long)]
    detach: bool,
    /// Give up following after this many seconds (the drain continues).
    #[arg(long, default_value_t = 3600)]
    timeout_secs: u64,
}

#[derive(clap::Args)]
pub struct DecommissionArgs {
    /// The node: its id as `CLUSTER MYID` prints it, or its `host:port`.
    node: String,
    /// Remove a node that is down and owns nothing, drained or not.
    #[arg(long)]
    force: bool,
}

#[derive(clap::Args)]
pub struct NodeArgs {
    #[command(subcommand)]
    what: NodeCommand,
}

#[derive(clap::Subcommand)]
enum NodeCommand {
    /// Set a node's weight: its fair share is total × weight / Σ weights
    /// (default 100; 200 takes twice the load of a 100).
    Weight {
        /// The node: its id as `CLUSTER MYID` prints it, or its `host:port`.
        node: String,
        /// 1 to 10000.
        weight: u32,
    },
}

#[derive(clap::Args)]
pub struct RebalanceArgs {
    /// Print the moves the rebalancer would make to balance the cluster,
    /// without making them (required: the leader manager rebalances on its own).
    #[arg(long, required = true)]
    plan: bool,
    /// Deadline of each node's load answer, milliseconds.
    #[arg(long, default_value_t = 5_000)]
    timeout_ms: u64,
    #[command(flatten)]
    flags: RebalanceFlags,
}

pub async fn drain_cmd(meta: &dyn MetaStore, args: DrainArgs, json: bool) -> anyhow::Result<()> {
    let map = meta.get_map().await?;
    let node = resolve_node(&map, &args.node)?;
    user_ensure!(
        (1..=keyway_manager::switchover::MAX_SWITCHOVER_TIMEOUT_MS)
            .contains(&args.switchover_timeout_ms),
        "--switchover-timeout-ms must be 1..={}, got {}",
        keyway_manager::switchover::MAX_SWITCHOVER_TIMEOUT_MS,
        args.switchover_timeout_ms
    );
    user_ensure!(
        args.timeout_secs >= 1,
        "--timeout-secs must be at least 1, got 0"
    );
    if !args.cancel {
        // Primaries first: a switchover pauses a partition for the last
        // writes only, where a move copies it.
        let switched =
            keyway_manager::switch_primaries_away(meta, node, args.switchover_timeout_ms).await?;
        if !switched.is_empty() && !json {
            crate::ctl_failover::report(switched, json)?;
        }
    }
    let info = set_draining(meta, node, !args.cancel).await?;
    if !args.cancel && !args.detach {
        // Follow it until the node owns nothing (a progress bar on a terminal).
        let deadline = std::time::Instant::now() + Duration::from_secs(args.timeout_secs);
        let moved =
            crate::ctl_drain_follow::follow(meta, node, deadline, args.timeout_secs).await?;
        if json {
            return print_json(&info);
        }
        println!(
            "node {node} is draining and owns no partition ({moved} moved away); \
             to remove it: keyway ctl decommission {node}"
        );
        return Ok(());
    }
    if json {
        return print_json(&info);
    }
    let owned = meta.get_map().await?.owned_by(node).count();
    if args.cancel {
        println!("node {node} is no longer draining; it may receive partitions again");
    } else {
        println!(
            "node {node} is draining: the leader manager moves its {owned} partition(s) away \
             (at most rebalance_max_moves_per_node at a time) and moves none to it; \
             `keyway ctl migrations` shows the moves, `keyway ctl nodes` what it still owns \
             (`keyway ctl drain {node}` without --detach follows it). \
             Once it owns none: keyway ctl decommission {node}"
        );
    }
    Ok(())
}

pub async fn decommission_cmd(
    meta: &dyn MetaStore,
    args: DecommissionArgs,
    json: bool,
) -> anyhow::Result<()> {
    let map = meta.get_map().await?;
    let node = resolve_node(&map, &args.node)?;
    let removed = decommission(meta, node, args.force).await?;
    if json {
        return print_json(&removed);
    }
    let running = meta.leases().await?.iter().any(|l| l.node == node);
    println!("node {node} ({}) removed from the map", removed.resp_addr);
    if running {
        println!(
            "it still holds a lease: stop its `keyway server` (started again, it would \
             register again as a new, empty node)"
        );
    }
    Ok(())
}

pub async fn node_cmd(meta: &dyn MetaStore, args: NodeArgs, json: bool) -> anyhow::Result<()> {
    match args.what {
        NodeCommand::Weight { node, weight } => {
            let map = meta.get_map().await?;
            let node = resolve_node(&map, &node)?;
            let info = set_weight(meta, node, weight).await?;
            if json {
                return print_json(&info);
            }
            println!("node {node} weight {}", info.weight);
            Ok(())
        }
    }
}

/// One planned move as `--plan` prints it.
#[derive(Debug, Serialize)]
pub struct MoveRow {
    pub partition: PartitionId,
    pub from: NodeId,
    pub to: NodeId,
    pub bytes: u64,
    /// The partition's load under the objective.
    pub load: f64,
    /// `drain` or `balance`.
    pub reason: &'static str,
    /// Whether the caps let the manager start it now (else: after others end).
    pub now: bool,
}

/// What `keyway ctl rebalance --plan --json` prints.
#[derive(Debug, Serialize)]
pub struct PlanReport {
    pub objective: String,
    pub tolerance: f64,
    pub moves: Vec<MoveRow>,
    pub moved_bytes: u64,
    pub total_bytes: u64,
    /// The largest load/share over the balanced nodes, now and after the plan.
    pub busiest_over_share: Option<f64>,
    pub busiest_over_share_after: Option<f64>,
    pub nodes: Vec<NodePlan>,
    /// Why the plan ends where it does.
    pub stop: Stop,
    /// Nodes down that own partitions (they cannot move).
    pub stuck: Vec<Stuck>,
    /// Replica counts balanced apart (the whole plan, caps lifted).
    pub replicas: ReplicaPlan,
    pub notes: Vec<String>,
}

pub async fn rebalance_cmd(
    meta: &dyn MetaStore,
    args: RebalanceArgs,
    json: bool,
) -> anyhow::Result<()> {
    let config = args.flags.to_config()?;
    let map = meta.get_map().await?;
    let (live, moved_at) = read_migrations(meta).await?;
    let mut notes = Vec::new();
    let load = if config.objective.needs_load() {
        let load = RpcStats::new()
            .collect(&map, Duration::from_millis(args.timeout_ms))
            .await;
        for n in &load.unreachable {
            notes.push(format!("node {n} did not answer for its load"));
        }
        Some(load)
    } else {
        None
    };
    // This process has no memory of when a node went down: plan as if the
    // grace had passed, and say what the manager does meanwhile.
    let down: BTreeMap<NodeId, DownPhase> = map
        .nodes
        .values()
        .filter(|n| n.state == NodeState::Down)
        .map(|n| (n.id, DownPhase::PastGrace))
        .collect();
    for n in down.keys() {
        notes.push(format!(
            "node {n} is down: the manager plans nothing until it is back or has been down for \
             rebalance_down_grace_ms; this plan assumes the grace has passed"
        ));
    }
    if !live.is_empty() {
        notes.push(format!(
            "{} migration(s) in flight are counted as done",
            live.len()
        ));
    }
    let input = PlanInput {
        map: &map,
        load: load.as_ref(),
        live: &live,
        moved_at: &moved_at,
        down: &down,
        now_ms: now_ms(),
        config: &config,
        uncapped: true,
    };
    let whole = plan(&input);
    let now: BTreeSet<PartitionId> = plan(&PlanInput {
        uncapped: false,
        ..input
    })
    .moves
    .iter()
    .map(|m| m.partition)
    .collect();
    if !config.enabled {
        notes.push("--no-rebalance: the manager would move nothing".into());
    }
    let live_replica: Vec<LiveReplicaMove> = keyway_manager::replication::read_replica_moves(meta)
        .await?
        .iter()
        .map(|m| LiveReplicaMove {
            partition: m.partition,
            from: m.from,
            to: m.to,
        })
        .collect();
    let migrating: BTreeSet<PartitionId> = live
        .iter()
        .map(|m| m.partition)
        .chain(whole.moves.iter().map(|m| m.partition))
        .collect();
    let replicas = plan_replicas(&ReplicaInput {
        map: &map,
        migrating: &migrating,
        live: &live_replica,
        down: &down,
        config: &config,
        uncapped: true,
    });
    let report = report(&whole, &now, config.tolerance, replicas, notes);
    if json {
        return print_json(&report);
    }
    print_report(&report);
    Ok(())
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn busiest(nodes: &[NodePlan], after: bool) -> Option<f64> {
    nodes
        .iter()
        .filter(|n| n.role == Role::Balanced && n.share > 0.0)
        .map(|n| if after { n.load_after } else { n.load } / n.share)
        .max_by(f64::total_cmp)
}

fn report(
    whole: &Plan,
    now: &BTreeSet<PartitionId>,
    tolerance: f64,
    replicas: ReplicaPlan,
    notes: Vec<String>,
) -> PlanReport {
    PlanReport {
        objective: whole.objective.to_string(),
        tolerance,
        moves: whole
            .moves
            .iter()
            .map(|m| MoveRow {
                partition: m.partition,
                from: m.from,
                to: m.to,
                bytes: m.bytes,
                load: m.load,
                reason: m.reason.name(),
                now: now.contains(&m.partition),
            })
            .collect(),
        moved_bytes: whole.moved_bytes(),
        total_bytes: whole.total_bytes,
        busiest_over_share: busiest(&whole.nodes, false),
        busiest_over_share_after: busiest(&whole.nodes, true),
        nodes: whole.nodes.clone(),
        stop: whole.stop.clone(),
        stuck: whole.stuck.clone(),
        replicas,
        notes,
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

fn print_report(r: &PlanReport) {
    let pct = |x: u64| {
        if r.total_bytes == 0 {
            0.0
        } else {
            100.0 * x as f64 / r.total_bytes as f64
        }
    };
    println!(
        "objective {}, tolerance {:.1}%: {} move(s), {} of {} ({:.1}%)",
        r.objective,
        r.tolerance * 100.0,
        r.moves.len(),
        mib(r.moved_bytes),
        mib(r.total_bytes),
        pct(r.moved_bytes)
    );
    if !r.moves.is_empty() {
        println!(
            "{:>9}  {:<40}  {:<40}  {:>12}  {:<7}  {:<5}",
            "PARTITION", "FROM", "TO", "BYTES", "REASON", "WHEN"
        );
        for m in &r.moves {
            println!(
                "{:>9}  {:<40}  {:<40}  {:>12}  {:<7}  {:<5}",
                m.partition,
                m.from,
                m.to,
                m.bytes,
                m.reason,
                if m.now { "now" } else { "later" }
            );
        }
    }
    println!(
        "{:<40}  {:<8}  {:>6}  {:>11}  {:>8}  {:>12}  {:>12}  {:>7}  {:>7}",
        "NODE", "ROLE", "WEIGHT", "PRIMARIES", "REPLICAS", "BYTES", "BYTES AFTER", "LOAD", "AFTER"
    );
    for n in &r.nodes {
        let ratio = |x: f64| {
            if n.share > 0.0 {
                format!("{:.3}", x / n.share)
            } else {
                "-".into()
            }
        };
        let role = match n.role {
            Role::Balanced => "up",
            Role::Draining => "draining",
            Role::Down => "down",
        };
        println!(
            "{:<40}  {:<8}  {:>6}  {:>11}  {:>8}  {:>12}  {:>12}  {:>7}  {:>7}",
            n.node,
            role,
            n.weight,
            format!("{} -> {}", n.partitions, n.partitions_after),
            format!("{}/{}", n.in_sync_replicas, n.replicas),
            n.bytes,
            n.bytes_after,
            ratio(n.load),
            ratio(n.load_after)
        );
    }
    println!("(LOAD and AFTER: the node's load over its fair share; 1.000 is balanced)");
    println!("stops: {} ({})", r.stop.reason, r.stop.detail);
    for s in &r.stuck {
        println!(
            "node {} is down and owns {} partition(s) that cannot move (it holds the only copy): \
             restart it",
            s.node,
            s.partitions.len()
        );
    }
    let rp = &r.replicas;
    println!(
        "replicas (balanced by count apart from primaries): {} replica move(s); stops: {} ({})",
        rp.moves.len(),
        rp.stop.reason,
        rp.stop.detail
    );
    for m in &rp.moves {
        println!(
            "  partition {:>6}  replica {} -> {}",
            m.partition, m.from, m.to
        );
    }
    for n in &rp.nodes {
        println!(
            "  node {}: {} -> {} replica(s), share {:.1}",
            n.node, n.replicas, n.replicas_after, n.share
        );
    }
    for n in &r.notes {
        println!("note: {n}");
    }
}
