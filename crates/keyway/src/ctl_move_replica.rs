//! `keyway ctl move P --replica X --to Y`: move a partition's replica (issue
//! 12, item 7). Writes the intent (a replica-move record; the leader
//! manager's replication loop carries it out) and, unless `--detach`,
//! follows it through its phases (`adding_target`, `catching_up`,
//! `removing_source`) read from the map, until the record is gone; the map
//! then tells the outcome (the reason of an abandoned move is in
//! `/decisions`).

use crate::ctl::print_json;
use indicatif::{ProgressBar, ProgressStyle};
use keyway_manager::replication::moves;
use keyway_manager::{ReplicaMove, request_replica_move};
use keyway_map::{NodeId, PartitionId};
use keyway_meta::MetaStore;
use serde::Serialize;
use std::time::{Duration, Instant};

/// How often the follower refreshes.
const POLL: Duration = Duration::from_millis(200);

/// One move's result, as `--json` prints it.
#[derive(Serialize)]
struct Row {
    id: u64,
    partition: u64,
    from: String,
    to: String,
    /// `requested` (with `--detach`), `done` or `abandoned`.
    outcome: &'static str,
    duration_ms: Option<u64>,
}

pub async fn move_replicas(
    meta: &dyn MetaStore,
    partitions: &[PartitionId],
    from: NodeId,
    to: NodeId,
    wait: bool,
    deadline: Instant,
    json: bool,
) -> anyhow::Result<()> {
    let mut requested = Vec::new();
    for pid in partitions {
        let mv = request_replica_move(meta, *pid, from, to).await?;
        eprintln!(
            "replica move {} requested: partition {pid} replica {from} -> {to}",
            mv.id
        );
        requested.push(mv);
    }
    let mut rows = Vec::new();
    let mut failed = 0;
    for mv in requested {
        let row = if wait {
            follow(meta, &mv, deadline, json).await?
        } else {
            row(&mv, "requested", None)
        };
        failed += usize::from(row.outcome == "abandoned");
        rows.push(row);
    }
    if json {
        print_json(&rows)?;
    }
    anyhow::ensure!(
        failed == 0,
        "{failed} replica move(s) were abandoned (the reason is in /decisions)"
    );
    Ok(())
}

fn row(mv: &ReplicaMove, outcome: &'static str, took: Option<Duration>) -> Row {
    Row {
        id: mv.id,
        partition: mv.partition.0,
        from: mv.from.to_string(),
        to: mv.to.to_string(),
        outcome,
        duration_ms: took.map(|t| t.as_millis() as u64),
    }
}

/// Prints each phase change until the record is gone, then the outcome.
/// The outcome line goes to stderr with `--json` (stdout is the JSON).
async fn follow(
    meta: &dyn MetaStore,
    mv: &ReplicaMove,
    deadline: Instant,
    json: bool,
) -> anyhow::Result<Row> {
    let began = Instant::now();
    let mut last = "";
    // A spinner with the phase on a terminal; phase lines otherwise.
    let bar = ProgressBar::new_spinner();
    bar.set_style(ProgressStyle::with_template(
        "{prefix} {spinner} {elapsed} {msg}",
    )?);
    bar.set_prefix(format!("replica move {}", mv.id));
    bar.enable_steady_tick(Duration::from_millis(120));
    loop {
        let live = meta.get_migration(mv.id).await?.is_some();
        let map = meta.get_map().await?;
        if !live {
            bar.finish_and_clear();
            let done = map
                .partitions
                .get(&mv.partition)
                .is_some_and(|r| r.has_copy(mv.to) && !r.has_copy(mv.from));
            let outcome = if done { "done" } else { "abandoned" };
            let line = format!(
                "replica move {} {}: partition {} {}",
                mv.id,
                outcome.to_uppercase(),
                mv.partition,
                if done {
                    format!(
                        "replica {} -> {} in {} ms",
                        mv.from,
                        mv.to,
                        began.elapsed().as_millis()
                    )
                } else {
                    format!("keeps its replica on {} (see /decisions for why)", mv.from)
                }
            );
            if json {
                eprintln!("{line}");
            } else {
                println!("{line}");
            }
            return Ok(row(mv, outcome, Some(began.elapsed())));
        }
        let phase = moves::phase(mv, &map);
        if phase != last {
            if bar.is_hidden() {
                eprintln!("replica move {}: {phase}", mv.id);
            }
            bar.set_message(phase);
            last = phase;
        }
        if Instant::now() >= deadline {
            bar.finish_and_clear();
            anyhow::bail!("replica move {} still {phase} at the timeout", mv.id);
        }
        tokio::time::sleep(POLL).await;
    }
}
