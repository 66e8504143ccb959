//! `keyway ctl`: read the cluster's control-plane state from the metadata store.
//!
//! Every subcommand prints a table for people, or JSON with `--json` for
//! scripts. `move` and `abort` (in `ctl_move.rs`) request migrations; the
//! leader manager carries them out.

use keyway_map::{NodeId, PartitionMap, to_hex};
use keyway_meta::MetaStore;
use serde::Serialize;
use std::collections::BTreeMap;

#[derive(clap::Args)]
pub struct CtlArgs {
    /// Metadata store URL: keyway://HOST:PORT or etcd://H:P[,H:P]/PREFIX.
    #[arg(long, env = "KEYWAY_META")]
    meta: String,
    /// Deadline of each call to the metadata store, in milliseconds
    /// (1..=600000). Longer than a node's 2 s: a command should not fail
    /// because the store is slow for a moment.
    #[arg(long, env = "KEYWAY_META_TIMEOUT_MS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(1..=600_000))]
    meta_timeout_ms: u64,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    /// The cluster's secret, sent on every metadata, peer and admin call.
    #[command(flatten)]
    secret: crate::secret_flags::SecretFlag,
    #[command(subcommand)]
    what: CtlCommand,
}

#[derive(clap::Subcommand)]
enum CtlCommand {
    /// Nodes: id, addresses, state, partitions owned, lease left.
    Nodes,
    /// Partitions: id, keyspace, range (slots for hash keyspaces), owner,
    /// epoch; with `--since V`, every change after map version V instead.
    Map(MapArgs),
    /// Live node leases as the store sees them.
    Leases,
    /// Who holds the manager seat.
    Manager,
    /// Move a partition (or the partitions of a slot range) to another node,
    /// live; shows progress until done unless `--detach`.
    Move(crate::ctl_move::MoveArgs),
    /// Running and recent migrations: state, bytes, duration, cutover pause.
    Migrations,
    /// Each node's change log, asked of the nodes: retained range, bytes, holds.
    Changelog,
    /// Abort a migration that has not reached its flip (the source stays owner).
    Abort(crate::ctl_move::AbortArgs),
    /// The busiest sampled keys per partition, asked of the nodes: partition, node, key, rate, share.
    Hotkeys(crate::ctl_hotkeys::HotkeysArgs),
    /// Keyspaces: `create NAME --routing range|hash [--partitions N]
    /// [--replication-factor N] [--min-in-sync M]`, `set NAME
    /// --replication-factor N [--min-in-sync M]`, `list`.
    Keyspace(crate::ctl_keyspace::KeyspaceArgs),
    #[command(flatten)]
    Split(crate::ctl_split::SplitCommand),
    /// Planned switchover: make an in-sync replica the primary of a
    /// partition (or of every partition a node is primary of), pausing its
    /// requests only while the replica catches the last writes.
    Failover(crate::ctl_failover::FailoverArgs),
    /// Mark a node draining: first its primaries switch to in-sync replicas,
    /// then the rebalancer moves the rest away and the manager replaces its
    /// replicas (`--cancel` undoes it).
    Drain(crate::ctl_rebalance::DrainArgs),
    /// Remove a node that owns nothing from the map (drain it first).
    Decommission(crate::ctl_rebalance::DecommissionArgs),
    /// Node settings: `weight NODE W`.
    Node(crate::ctl_rebalance::NodeArgs),
    /// `--plan`: the moves the rebalancer would make, without making them.
    Rebalance(crate::ctl_rebalance::RebalanceArgs),
    /// Re-replication: under-replicated partitions, nodes without a lease,
    /// copies in flight; `--manager ADDR` adds the grace wait.
    Recovery(crate::ctl_recovery::RecoveryArgs),
}

pub async fn run(args: CtlArgs) -> anyhow::Result<()> {
    args.secret.load()?;
    let meta = keyway_meta::connect_with(
        &args.meta,
        Some(std::time::Duration::from_millis(args.meta_timeout_ms)),
    )
    .await?;
    match args.what {
        CtlCommand::Nodes => nodes(&*meta, args.json).await,
        CtlCommand::Map(MapArgs { since: None }) => map(&*meta, args.json).await,
        CtlCommand::Map(MapArgs { since: Some(v) }) => map_history(&*meta, v, args.json).await,
        CtlCommand::Leases => leases(&*meta, args.json).await,
        CtlCommand::Manager => manager(&*meta, args.json).await,
        CtlCommand::Move(m) => crate::ctl_move::move_cmd(&*meta, m, args.json).await,
        CtlCommand::Migrations => crate::ctl_move::migrations_cmd(&*meta, args.json).await,
        CtlCommand::Changelog => crate::ctl_log::changelog_cmd(&*meta, args.json).await,
        CtlCommand::Abort(a) => crate::ctl_move::abort_cmd(&*meta, a, args.json).await,
        CtlCommand::Hotkeys(h) => crate::ctl_hotkeys::hotkeys_cmd(&*meta, h, args.json).await,
        CtlCommand::Keyspace(k) => crate::ctl_keyspace::keyspace_cmd(&*meta, k, args.json).await,
        CtlCommand::Split(c) => crate::ctl_split::run(&*meta, c, args.json).await,
        CtlCommand::Failover(f) => crate::ctl_failover::failover_cmd(&*meta, f, args.json).await,
        CtlCommand::Drain(d) => crate::ctl_rebalance::drain_cmd(&*meta, d, args.json).await,
        CtlCommand::Decommission(d) => {
            crate::ctl_rebalance::decommission_cmd(&*meta, d, args.json).await
        }
        CtlCommand::Node(n) => crate::ctl_rebalance::node_cmd(&*meta, n, args.json).await,
        CtlCommand::Rebalance(r) => crate::ctl_rebalance::rebalance_cmd(&*meta, r, args.json).await,
        CtlCommand::Recovery(r) => crate::ctl_recovery::recovery_cmd(&*meta, r, args.json).await,
    }
}

pub(crate) fn print_json(value: &impl Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

#[derive(Serialize)]
struct NodeRow {
    id: String,
    resp_addr: String,
    admin_addr: String,
    state: keyway_map::NodeState,
    weight: u32,
    draining: bool,
    zone: Option<String>,
    /// The replica endpoint (`--replica-listen`), if the node has one.
    replica_addr: Option<String>,
    /// Partitions it is primary (owner) of.
    partitions: usize,
    /// Partitions it holds a replica of, and how many of those in sync.
    replicas: usize,
    in_sync_replicas: usize,
    lease_remaining_ms: Option<u64>,
}

async fn nodes(meta: &dyn MetaStore, json: bool) -> anyhow::Result<()> {
    let map = meta.get_map().await?;
    let leases: BTreeMap<NodeId, u64> = meta
        .leases()
        .await?
        .into_iter()
        .map(|l| (l.node, l.remaining_ms))
        .collect();
    let rows: Vec<NodeRow> = map
        .nodes
        .values()
        .map(|n| NodeRow {
            id: n.id.to_string(),
            resp_addr: n.resp_addr.clone(),
            admin_addr: n.admin_addr.clone(),
            state: n.state,
            weight: n.weight,
            draining: n.draining,
            zone: n.zone.clone(),
            replica_addr: n.replica_addr.clone(),
            partitions: map.owned_by(n.id).count(),
            replicas: map
                .partitions
                .values()
                .filter(|p| p.replicas.contains(&n.id))
                .count(),
            in_sync_replicas: map
                .partitions
                .values()
                .filter(|p| p.is_in_sync_replica(n.id))
                .count(),
            lease_remaining_ms: leases.get(&n.id).copied(),
        })
        .collect();
    if json {
        return print_json(&rows);
    }
    println!(
        "{:<40}  {:<21}  {:<21}  {:<13}  {:>6}  {:>9}  {:>8}  {:>7}  {:>8}",
        "NODE", "RESP", "ADMIN", "STATE", "WEIGHT", "PRIMARIES", "REPLICAS", "IN_SYNC", "LEASE"
    );
    for r in rows {
        let lease = r
            .lease_remaining_ms
            .map(|ms| format!("{ms}ms"))
            .unwrap_or_else(|| "none".into());
        let mut state = format!("{:?}", r.state).to_lowercase();
        if r.draining {
            state.push_str(",draining");
        }
        if let Some(zone) = &r.zone {
            state.push_str(&format!(",zone={zone}"));
        }
        println!(
            "{:<40}  {:<21}  {:<21}  {:<13}  {:>6}  {:>9}  {:>8}  {:>7}  {:>8}",
            r.id,
            r.resp_addr,
            r.admin_addr,
            state,
            r.weight,
            r.partitions,
            r.replicas,
            r.in_sync_replicas,
            lease
        );
    }
    Ok(())
}

#[derive(clap::Args)]
struct MapArgs {
    /// Print the changes of every map version after this one (as far back
    /// as the store keeps history: `keyway meta --history-versions`), one
    /// line per change: how the map came to be, e.g. after a failover.
    #[arg(long, value_name = "VERSION")]
    since: Option<u64>,
}

#[derive(Serialize)]
struct VersionChanges {
    version: u64,
    changes: Vec<keyway_map::MapChange>,
}

async fn map_history(meta: &dyn MetaStore, since: u64, json: bool) -> anyhow::Result<()> {
    let now = meta.get_map().await?;
    let deltas = match meta.changes_since(keyway_map::MapVersion(since)).await? {
        keyway_meta::MapUpdate::Delta(d) => d,
        keyway_meta::MapUpdate::Full(m) if m.version.0 < since => anyhow::bail!(
            "version {since} is newer than the map's (version {})",
            m.version
        ),
        keyway_meta::MapUpdate::Full(m) => anyhow::bail!(
            "the metadata store no longer keeps the changes after version {since} \
             (the map is at version {}; `keyway meta --history-versions` sets how many it keeps)",
            m.version
        ),
    };
    if json {
        let rows: Vec<VersionChanges> = deltas
            .into_iter()
            .map(|(v, changes)| VersionChanges {
                version: v.0,
                changes,
            })
            .collect();
        return print_json(&rows);
    }
    println!(
        "map changes after version {since} ({} versions; the map is at version {})",
        deltas.len(),
        now.version
    );
    for (v, changes) in &deltas {
        for c in changes {
            println!("v{:<6} {}", v.0, change_text(&now, c));
        }
    }
    Ok(())
}

/// One change as a line (node ids short, as `replicas_text` writes them).
fn change_text(map: &PartitionMap, c: &keyway_map::MapChange) -> String {
    use keyway_map::MapChange as C;
    match c {
        C::UpsertPartition(p) => format!(
            "partition {} {} primary {:x} replicas {} epoch {} {:?}",
            p.id,
            range_text(map, p),
            p.owner.0,
            replicas_text(p),
            p.epoch,
            p.state
        ),
        C::RemovePartition { id } => format!("partition {id} removed"),
        C::UpsertNode(n) => format!(
            "node {:x} {} {:?}{}",
            n.id.0,
            n.resp_addr,
            n.state,
            if n.draining { " draining" } else { "" }
        ),
        C::RemoveNode { id } => format!("node {:x} removed", id.0),
        C::UpsertKeyspace(k) => format!(
            "keyspace {} {} {:?} replication factor {} min in sync {}",
            k.id, k.name, k.routing, k.replication_factor, k.min_in_sync
        ),
        C::RemoveKeyspace { id } => format!("keyspace {id} removed"),
        C::ReservePartitionIds { next } => format!("partition ids reserved below {next}"),
    }
}

async fn map(meta: &dyn MetaStore, json: bool) -> anyhow::Result<()> {
    let map = meta.get_map().await?;
    if json {
        return print_json(&map);
    }
    println!(
        "map version {}, {} partitions, {} nodes",
        map.version,
        map.partitions.len(),
        map.nodes.len()
    );
    println!(
        "(replicas: short node ids, `*` = in sync; READS: the replica reads are switched to (reads_from), `-` = the primary; `keyway ctl nodes` lists the ids)"
    );
    println!(
        "{:>6}  {:>8}  {:<24}  {:<40}  {:<16}  {:>4}  {:>6}  {:>5}",
        "ID", "KEYSPACE", "RANGE", "PRIMARY", "REPLICAS", "ISR", "EPOCH", "READS"
    );
    for ks in map.keyspaces.values() {
        for p in map.keyspace_partitions(ks.id) {
            println!(
                "{:>6}  {:>8}  {:<24}  {:<40}  {:<16}  {:>4}  {:>6}  {:>5}",
                p.id,
                ks.name,
                range_text(&map, p),
                p.owner,
                replicas_text(p),
                format!("{}/{}", p.in_sync_copies(), ks.replication_factor),
                p.epoch,
                p.reads_from
                    .map_or_else(|| "-".to_string(), |r| format!("{:x}", r.0))
            );
        }
    }
    Ok(())
}

/// `2*,3`: each replica's short id (hex, as `NodeId::parse` reads it), `*`
/// when in sync; `-` for none.
pub(crate) fn replicas_text(p: &keyway_map::PartitionRecord) -> String {
    if p.replicas.is_empty() {
        return "-".into();
    }
    p.replicas
        .iter()
        .map(|r| {
            let star = if p.is_in_sync_replica(*r) { "*" } else { "" };
            format!("{:x}{star}", r.0)
        })
        .collect::<Vec<_>>()
        .join(",")
}

fn range_text(map: &PartitionMap, p: &keyway_map::PartitionRecord) -> String {
    let hash = map
        .keyspaces
        .get(&p.keyspace)
        .is_some_and(|k| k.routing == keyway_map::Routing::Hash);
    if hash {
        let (first, last) = p.slot_span();
        format!("slots {first}-{last}")
    } else {
        let end = p
            .end
            .as_ref()
            .map(|e| to_hex(e))
            .unwrap_or_else(|| "end".into());
        format!("[{}, {end})", to_hex(&p.start))
    }
}

#[derive(Serialize)]
struct LeaseRow {
    lease: String,
    node: String,
    remaining_ms: u64,
}

async fn leases(meta: &dyn MetaStore, json: bool) -> anyhow::Result<()> {
    let rows: Vec<LeaseRow> = meta
        .leases()
        .await?
        .into_iter()
        .map(|l| LeaseRow {
            lease: l.lease.to_string(),
            node: l.node.to_string(),
            remaining_ms: l.remaining_ms,
        })
        .collect();
    if json {
        return print_json(&rows);
    }
    println!("{:<20}  {:<40}  {:>12}", "LEASE", "NODE", "REMAINING");
    for r in rows {
        println!("{:<20}  {:<40}  {:>10}ms", r.lease, r.node, r.remaining_ms);
    }
    Ok(())
}

#[derive(Serialize)]
struct SeatRow {
    election: &'static str,
    leader: Option<String>,
}

async fn manager(meta: &dyn MetaStore, json: bool) -> anyhow::Result<()> {
    let leader = meta.leader(keyway_manager::MANAGER_ELECTION).await?;
    let row = SeatRow {
        election: keyway_manager::MANAGER_ELECTION,
        leader: leader.map(|l| l.candidate),
    };
    if json {
        return print_json(&row);
    }
    match row.leader {
        Some(name) => println!("manager seat held by {name}"),
        None => println!("manager seat empty (no keyway manager running)"),
    }
    Ok(())
}
