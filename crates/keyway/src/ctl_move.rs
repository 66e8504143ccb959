//! `keyway ctl move | migrations | abort`: live partition migrations.
//!
//! A partition of a replicated keyspace (replication factor >= 2) moves its
//! primary by replica addition (`ctl_move_primary.rs`, also `--back`);
//! `--replica` moves a replica (`ctl_move_replica.rs`). Otherwise `move`
//! writes a `PENDING` migration record per partition (the leader
//! manager's driver carries it out) and, with `--wait` (the default), follows
//! each with a progress bar fed by the record and by the source's push
//! status (state, bytes copied of the snapshot, rate, ETA, catch-up lag).
//! `--detach` returns once the records exist.

use crate::ctl::print_json;
use indicatif::{ProgressBar, ProgressStyle};
use keyway_manager::{request_abort, request_move};
use keyway_map::{DEFAULT_KEYSPACE, NodeId, PartitionId, PartitionMap};
use keyway_meta::MetaStore;
use keyway_migration::{MigrationId, MigrationRecord, MigrationState};
use keyway_peer::PeerClient;
use serde::Serialize;
use std::time::{Duration, Instant};

/// How often `move --wait` refreshes.
const POLL: Duration = Duration::from_millis(200);

#[derive(clap::Args)]
pub struct MoveArgs {
    /// A partition id, or an inclusive slot range such as `0-1000` that must
    /// start and end on partition boundaries (every partition in it moves).
    what: String,
    /// The target: a node id as `CLUSTER MYID` prints it, or its `host:port`.
    /// The primary of a replicated partition (replication factor >= 2)
    /// moves by adding the target as a replica, waiting until it is in sync
    /// and switching primaryship to it (the old primary stays an in-sync
    /// replica for `--fail-back-window-ms`); with replication factor 1 the
    /// partition moves by a live migration.
    #[arg(long, required_unless_present = "back")]
    to: Option<String>,
    /// Move the replica on this node instead of the primary (a node id or
    /// `host:port`): the target is added as a replica, the primary copies
    /// it, and once it is in sync this node's copy is removed. Writes never
    /// pause; a target not in sync within the manager's
    /// `--replica-move-timeout-ms` is removed again.
    #[arg(long, conflicts_with = "back")]
    replica: Option<String>,
    /// Primary move: switch the partition's reads to the target (smart
    /// client and proxy reads, on `READONLY`) once it is in sync, and its
    /// writes only `--reads-first-hold-ms` later.
    #[arg(long, conflicts_with_all = ["replica", "back"])]
    reads_first: bool,
    /// Primary move with `--reads-first`: how long the target serves the
    /// reads before the write switch, ms (1..=600000).
    #[arg(long, default_value_t = keyway_manager::replication::pmoves::DEFAULT_READS_FIRST_HOLD_MS)]
    reads_first_hold_ms: u64,
    /// Primary move: how long the old primary stays an in-sync replica after
    /// the switch (the reverse stream), ms (0..=86400000); inside it
    /// `ctl move --back` switches back without a copy.
    #[arg(long, default_value_t = keyway_manager::replication::pmoves::DEFAULT_FAIL_BACK_WINDOW_MS)]
    fail_back_window_ms: u64,
    /// Switch a primary move back to the old primary (inside its fail-back
    /// window, while the old primary is in sync): a switchover, no copy.
    #[arg(long)]
    back: bool,
    /// Primary move: follow it until the old primary's copy is removed
    /// (after the window), not only until the switch.
    #[arg(long, conflicts_with = "detach")]
    until_removed: bool,
    /// Follow each move until it ends (the default).
    #[arg(long, conflicts_with = "detach")]
    wait: bool,
    /// Return once the moves are requested.
    #[arg(long)]
    detach: bool,
    /// Give up waiting after this many seconds (the moves continue).
    #[arg(long, default_value_t = 3600)]
    timeout_secs: u64,
}

#[derive(clap::Args)]
pub struct AbortArgs {
    /// The migration id (`keyway ctl migrations` lists them).
    id: u64,
}

pub async fn move_cmd(meta: &dyn MetaStore, args: MoveArgs, json: bool) -> anyhow::Result<()> {
    let map = meta.get_map().await?;
    let partitions = resolve_partitions(&map, &args.what)?;
    let deadline = Instant::now() + Duration::from_secs(args.timeout_secs);
    if args.back {
        return crate::ctl_move_primary::move_back(meta, &partitions, args.detach, deadline, json)
            .await;
    }
    let target = resolve_node(&map, args.to.as_deref().unwrap_or_default())?;
    if let Some(from) = &args.replica {
        let from = resolve_node(&map, from)?;
        let wait = !args.detach;
        return crate::ctl_move_replica::move_replicas(
            meta,
            &partitions,
            from,
            target,
            wait,
            deadline,
            json,
        )
        .await;
    }
    keyway_manager::replication::pmove_ops::check_settings(
        args.reads_first_hold_ms,
        args.fail_back_window_ms,
    )?;
    let (replicated, single): (Vec<PartitionId>, Vec<PartitionId>) = partitions
        .iter()
        .filter(|p| {
            let here = map.partitions[p].owner == target;
            if here {
                eprintln!("partition {p} is already on {target}; skipped");
            }
            !here
        })
        .partition(|p| crate::ctl_move_primary::replicated(&map, **p));
    user_ensure!(
        !args.reads_first || single.is_empty(),
        "--reads-first needs a replicated partition (replication factor >= 2); {} of the partitions have factor 1",
        single.len()
    );
    if !replicated.is_empty() {
        use crate::ctl_move_primary::Until;
        let until = if args.detach {
            Until::Requested
        } else if args.until_removed {
            Until::Ended
        } else {
            Until::Switched
        };
        crate::ctl_move_primary::move_primaries(
            meta,
            &replicated,
            target,
            args.reads_first,
            args.reads_first_hold_ms,
            args.fail_back_window_ms,
            until,
            deadline,
            json && single.is_empty(),
        )
        .await?;
        if single.is_empty() {
            return Ok(());
        }
    }
    let partitions = single;
    let mut ids = Vec::new();
    for pid in &partitions {
        let rec = request_move(meta, *pid, target).await?;
        eprintln!(
            "migration {} requested: partition {pid} {} -> {target}",
            rec.id,
            rec.source()
        );
        ids.push(rec.id);
    }
    if args.detach || ids.is_empty() {
        if json {
            print_json(&ids.iter().map(|i| i.0).collect::<Vec<_>>())?;
        }
        return Ok(());
    }
    let mut rows = Vec::new();
    let mut failed = 0;
    for id in ids {
        let rec = follow(meta, id, deadline).await?;
        failed += usize::from(rec.state != MigrationState::Done);
        rows.push(Row::new(&rec));
    }
    if json {
        print_json(&rows)?;
    }
    anyhow::ensure!(failed == 0, "{failed} move(s) did not complete");
    Ok(())
}

/// Follows one migration with a progress bar until it ends (or the deadline).
async fn follow(
    meta: &dyn MetaStore,
    id: MigrationId,
    deadline: Instant,
) -> anyhow::Result<MigrationRecord> {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta} {msg}",
        )?
        .progress_chars("=> "),
    );
    bar.set_prefix(format!("migration {id}"));
    let mut source: Option<PeerClient> = None;
    loop {
        let rec = load(meta, id).await?;
        if source.is_none() {
            let map = meta.get_map().await?;
            source = map
                .nodes
                .get(&rec.source())
                .and_then(|n| PeerClient::connect(&n.admin_addr).ok());
        }
        let push = match &source {
            Some(s) if !rec.state.is_terminal() => s.migrate_status(rec.id.0).await.ok(),
            _ => None,
        };
        bar.set_length(rec.total_bytes.max(1));
        let copied = push
            .as_ref()
            .map(|p| p.copied_bytes)
            .unwrap_or(rec.copied_bytes);
        bar.set_position(copied.min(rec.total_bytes));
        let lag = push
            .as_ref()
            .map(|p| p.head_seq.saturating_sub(p.acked_seq));
        bar.set_message(format!(
            "{}{}",
            rec.state,
            lag.map(|l| format!(" lag {l}")).unwrap_or_default()
        ));
        if rec.state.is_terminal() {
            bar.finish_and_clear();
            println!("{}", outcome_line(&rec));
            return Ok(rec);
        }
        if Instant::now() >= deadline {
            bar.abandon();
            anyhow::bail!("migration {id} still in {} at the timeout", rec.state);
        }
        tokio::time::sleep(POLL).await;
    }
}

fn outcome_line(rec: &MigrationRecord) -> String {
    let line = outcome(rec);
    match rec.stray {
        Some(node) => format!("{line}; a copy is left on node {node} (dropped when it is back)"),
        None => line,
    }
}

/// ` (fence 1.2, digest 0.3, flip 0.9, serve 0.4 ms)`: where the pause went.
fn steps_text(s: keyway_migration::CutoverSteps) -> String {
    let ms = |us: u64| format!("{:.1}", us as f64 / 1000.0);
    format!(
        " (fence {}, digest {}, flip {}, serve {} ms)",
        ms(s.fence_us),
        ms(s.digest_us),
        ms(s.flip_us),
        ms(s.serve_us)
    )
}

fn outcome(rec: &MigrationRecord) -> String {
    let took = rec.state_entered_at_ms.saturating_sub(rec.started_at_ms);
    match rec.state {
        MigrationState::Done => format!(
            "migration {} DONE: partition {} moved {} -> {} at epoch {} in {took} ms, {} bytes, cutover pause {} ms{}",
            rec.id,
            rec.partition_id(),
            rec.source(),
            rec.target,
            rec.flipped_epoch(),
            rec.total_bytes,
            rec.pause_ms.map(|p| p.to_string()).unwrap_or("?".into()),
            rec.cutover_steps.map(steps_text).unwrap_or_default()
        ),
        _ => format!(
            "migration {} {}: partition {} stays on {} ({})",
            rec.id,
            rec.state,
            rec.partition_id(),
            rec.source(),
            rec.abort_reason
                .as_ref()
                .map(|r| format!("{r:?}"))
                .unwrap_or_default()
        ),
    }
}

async fn load(meta: &dyn MetaStore, id: MigrationId) -> anyhow::Result<MigrationRecord> {
    let stored = meta
        .get_migration(id.0)
        .await?
        .ok_or_else(|| anyhow::anyhow!("migration {id} not found"))?;
    Ok(MigrationRecord::decode(&stored.record)?)
}

/// `abc...` (40 hex digits, as CLUSTER MYID prints it) or `host:port` (RESP or admin).
pub(crate) fn resolve_node(map: &PartitionMap, text: &str) -> anyhow::Result<NodeId> {
    let found = if text.contains(':') {
        map.nodes
            .values()
            .find(|n| n.resp_addr == text || n.admin_addr == text)
            .map(|n| n.id)
    } else {
        NodeId::parse(text).filter(|id| map.nodes.contains_key(id))
    };
    let found = found.ok_or_else(|| {
        crate::cli_error::UserError(format!(
            "no node '{text}' in the map (give a node id as CLUSTER MYID prints it, or host:port; `keyway ctl nodes` lists them)"
        ))
    })?;
    Ok(found)
}

/// A partition id, or an inclusive slot range aligned to partition boundaries.
fn resolve_partitions(map: &PartitionMap, text: &str) -> anyhow::Result<Vec<PartitionId>> {
    let Some((a, b)) = text.split_once('-') else {
        let id: u64 = text.parse().map_err(|_| {
            crate::cli_error::UserError(format!(
                "'{text}' is neither a partition id nor a slot range"
            ))
        })?;
        crate::cli_error::require_partition(map, PartitionId(id))?;
        return Ok(vec![PartitionId(id)]);
    };
    let slot = |s: &str| {
        s.trim().parse::<u16>().map_err(|_| {
            crate::cli_error::UserError(format!(
                "'{text}' is neither a partition id nor a slot range FIRST-LAST"
            ))
        })
    };
    let (first, last) = (slot(a)?, slot(b)?);
    user_ensure!(
        first <= last && last < keyway_map::SLOT_COUNT,
        "slot range {first}-{last} must satisfy first <= last < 16384"
    );
    let mut out = Vec::new();
    for p in map.keyspace_partitions(DEFAULT_KEYSPACE) {
        let (pf, pl) = p.slot_span();
        if pl < first || pf > last {
            continue;
        }
        user_ensure!(
            pf >= first && pl <= last,
            "slot range {first}-{last} cuts partition {} (slots {pf}-{pl}); moves are whole partitions",
            p.id
        );
        out.push(p.id);
    }
    Ok(out)
}

pub async fn abort_cmd(meta: &dyn MetaStore, args: AbortArgs, json: bool) -> anyhow::Result<()> {
    let rec = request_abort(meta, MigrationId(args.id)).await?;
    if json {
        return print_json(&Row::new(&rec));
    }
    println!(
        "migration {} aborted from {}: partition {} stays on {} (the manager reverts the source and drops the target's copy)",
        rec.id,
        rec.aborted_from.map(|s| s.name()).unwrap_or("?"),
        rec.partition_id(),
        rec.source()
    );
    Ok(())
}

/// One migration as `keyway ctl migrations` prints it.
#[derive(Serialize)]
struct Row {
    id: u64,
    state: &'static str,
    partition: u64,
    source: String,
    target: String,
    copied_bytes: u64,
    total_bytes: u64,
    /// The copy's cost: payload bytes the source shipped, bytes the target
    /// reported written, the copy phase's duration (0 before it ended, or
    /// for a record written before the cost was kept).
    bytes_sent: u64,
    bytes_written: u64,
    copy_duration_ms: u64,
    duration_ms: Option<u64>,
    pause_ms: Option<u64>,
    /// Where the pause went, step by step (see `keyway_migration::CutoverSteps`).
    cutover_steps: Option<keyway_migration::CutoverSteps>,
    abort_reason: Option<String>,
    /// A node still holding a copy this migration left behind.
    stray: Option<String>,
}

impl Row {
    fn new(r: &MigrationRecord) -> Row {
        Row {
            id: r.id.0,
            state: r.state.name(),
            partition: r.partition_id().0,
            source: r.source().to_string(),
            target: r.target.to_string(),
            copied_bytes: r.copied_bytes,
            total_bytes: r.total_bytes,
            bytes_sent: r.bytes_sent,
            bytes_written: r.bytes_written,
            copy_duration_ms: r.copy_duration_ms,
            duration_ms: r
                .state
                .is_terminal()
                .then(|| r.state_entered_at_ms.saturating_sub(r.started_at_ms)),
            pause_ms: r.pause_ms,
            cutover_steps: r.cutover_steps,
            abort_reason: r.abort_reason.as_ref().map(|a| format!("{a:?}")),
            stray: r.stray.map(|n| n.to_string()),
        }
    }
}

pub async fn migrations_cmd(meta: &dyn MetaStore, json: bool) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    for stored in meta.migrations().await? {
        if keyway_manager::replication::moves::is_replica_move(&stored) {
            continue;
        }
        match MigrationRecord::decode(&stored.record) {
            Ok(rec) => rows.push(Row::new(&rec)),
            Err(e) => eprintln!("migration {}: unreadable record: {e}", stored.id),
        }
    }
    if json {
        return print_json(&rows);
    }
    println!(
        "{:>5}  {:<8}  {:>9}  {:<12}  {:<12}  {:>21}  {:>21}  {:>9}  {:>9}  {:>8}  REASON",
        "ID",
        "STATE",
        "PARTITION",
        "SOURCE",
        "TARGET",
        "COPIED/TOTAL",
        "SENT/WRITTEN",
        "COPY",
        "DURATION",
        "PAUSE"
    );
    let short = |s: &str| s.chars().take(12).collect::<String>();
    let ms = |v: Option<u64>| v.map(|v| format!("{v}ms")).unwrap_or_else(|| "-".into());
    for r in rows {
        println!(
            "{:>5}  {:<8}  {:>9}  {:<12}  {:<12}  {:>21}  {:>21}  {:>9}  {:>9}  {:>8}  {}",
            r.id,
            r.state,
            r.partition,
            short(&r.source),
            short(&r.target),
            format!("{}/{}", r.copied_bytes, r.total_bytes),
            format!("{}/{}", r.bytes_sent, r.bytes_written),
            ms((r.copy_duration_ms > 0).then_some(r.copy_duration_ms)),
            ms(r.duration_ms),
            ms(r.pause_ms),
            match &r.stray {
                Some(node) => format!(
                    "{} (copy left on node {})",
                    r.abort_reason.clone().unwrap_or_default(),
                    short(node)
                ),
                None => r.abort_reason.clone().unwrap_or_default(),
            }
        );
    }
    Ok(())
}
