//! `keyway ctl move P --to T` of a replicated partition (issue 13, item 3):
//! a primary move by replica addition. Writes the intent (a primary-move
//! record; the leader manager's replication loop carries it out) and,
//! unless `--detach`, follows it with a progress spinner through its phases
//! (`add_replica`, `wait_in_sync`, `reads_first`, `reads_hold`, `switch`)
//! until T is primary and the fail-back window is open; `--until-removed`
//! follows on until the old primary's copy is removed and the record ends.
//! `ctl move --back P` asks for the switch back inside the window and
//! follows it to its end (`moved_back`).

use crate::ctl::print_json;
use indicatif::{ProgressBar, ProgressStyle};
use keyway_manager::replication::{Phase, PrimaryMove, pmove_ops};
use keyway_map::{NodeId, PartitionId};
use keyway_meta::MetaStore;
use serde::Serialize;
use std::time::{Duration, Instant};

/// How often the follower refreshes.
const POLL: Duration = Duration::from_millis(200);

/// One move's result, as `--json` prints it.
#[derive(Serialize)]
pub struct Row {
    id: u64,
    partition: u64,
    from: String,
    to: String,
    /// `requested` (with `--detach`), `switched` (T is primary, the
    /// fail-back window open), `done`, `moved_back` or `abandoned`.
    outcome: &'static str,
    /// The phase when the follower stopped (`null` once the record ended).
    phase: Option<&'static str>,
    duration_ms: u64,
    /// Ms left for `ctl move --back` when it stopped in the window.
    fail_back_left_ms: Option<u64>,
}

/// What to follow a move until.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// Return once the record exists.
    Requested,
    /// Until T is primary (the fail-back window open) or the move ended.
    Switched,
    /// Until the record ends.
    Ended,
}

#[allow(clippy::too_many_arguments)]
pub async fn move_primaries(
    meta: &dyn MetaStore,
    partitions: &[PartitionId],
    to: NodeId,
    reads_first: bool,
    reads_first_hold_ms: u64,
    fail_back_window_ms: u64,
    until: Until,
    deadline: Instant,
    json: bool,
) -> anyhow::Result<()> {
    let mut requested = Vec::new();
    for pid in partitions {
        let mv = keyway_manager::request_primary_move(
            meta,
            *pid,
            to,
            reads_first,
            reads_first_hold_ms,
            fail_back_window_ms,
        )
        .await?;
        eprintln!(
            "primary move {} requested: partition {pid} {} -> {to} (a replica added, then a switchover{}; \
             the old primary kept in sync for {fail_back_window_ms} ms)",
            mv.id,
            mv.from,
            if reads_first { ", reads first" } else { "" }
        );
        requested.push(mv);
    }
    finish(meta, requested, until, deadline, json, false).await
}

/// `ctl move --back P`: switch the partition back to its old primary.
pub async fn move_back(
    meta: &dyn MetaStore,
    partitions: &[PartitionId],
    detach: bool,
    deadline: Instant,
    json: bool,
) -> anyhow::Result<()> {
    let mut requested = Vec::new();
    for pid in partitions {
        let mv = keyway_manager::request_move_back(meta, *pid).await?;
        eprintln!(
            "primary move {}: move back requested: partition {pid} {} -> {} (a switchover, no copy)",
            mv.id, mv.to, mv.from
        );
        requested.push(mv);
    }
    // `--detach`: back once requested (`ctl migrations` shows the move).
    let until = if detach {
        Until::Requested
    } else {
        Until::Ended
    };
    finish(meta, requested, until, deadline, json, true).await
}

async fn finish(
    meta: &dyn MetaStore,
    requested: Vec<PrimaryMove>,
    until: Until,
    deadline: Instant,
    json: bool,
    back: bool,
) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    let mut failed = 0;
    for mv in requested {
        let row = if until == Until::Requested {
            row(&mv, "requested", Some(mv.phase), Duration::ZERO, None)
        } else {
            follow(meta, &mv, until, deadline, back, json).await?
        };
        let moved_back = row.outcome == "moved_back" || until == Until::Requested;
        failed += usize::from(row.outcome == "abandoned" || (back && !moved_back));
        rows.push(row);
    }
    if json {
        print_json(&rows)?;
    }
    anyhow::ensure!(
        failed == 0,
        "{failed} primary move(s) did not complete as asked (the reason is in the manager's /decisions)"
    );
    Ok(())
}

fn row(
    mv: &PrimaryMove,
    outcome: &'static str,
    phase: Option<Phase>,
    took: Duration,
    left: Option<u64>,
) -> Row {
    Row {
        id: mv.id,
        partition: mv.partition.0,
        from: mv.from.to_string(),
        to: mv.to.to_string(),
        outcome,
        phase: phase.map(|p| p.name()),
        duration_ms: took.as_millis() as u64,
        fail_back_left_ms: left,
    }
}

/// Follows `mv` with a spinner until `until`; the outcome line goes to
/// stderr with `--json` (stdout is the JSON).
async fn follow(
    meta: &dyn MetaStore,
    mv: &PrimaryMove,
    until: Until,
    deadline: Instant,
    back: bool,
    json: bool,
) -> anyhow::Result<Row> {
    let began = Instant::now();
    let bar = ProgressBar::new_spinner();
    bar.set_style(ProgressStyle::with_template(
        "{prefix} {spinner} {elapsed} {msg}",
    )?);
    bar.set_prefix(format!("primary move {}", mv.id));
    bar.enable_steady_tick(Duration::from_millis(120));
    let say = |line: String| {
        if json {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    };
    // The last record seen: its Ending phase names the outcome's reason.
    let mut last: Option<PrimaryMove> = None;
    loop {
        let stored = meta.get_migration(mv.id).await?;
        let map = meta.get_map().await?;
        let live = stored.as_ref().and_then(PrimaryMove::load);
        let row_now = map.partitions.get(&mv.partition);
        let Some(live) = live else {
            bar.finish_and_clear();
            // The record ended: the map tells where the primary is.
            let owner = row_now.map(|r| r.owner);
            let outcome = if owner == Some(mv.to) {
                "done"
            } else if owner == Some(mv.from) && back {
                "moved_back"
            } else {
                "abandoned"
            };
            let reason = last
                .as_ref()
                .filter(|m| !m.reason.is_empty())
                .map(|m| format!(" ({})", m.reason))
                .unwrap_or_default();
            say(format!(
                "primary move {} {}{reason}: partition {} primary {} in {} ms",
                mv.id,
                outcome.to_uppercase(),
                mv.partition,
                owner.map_or("gone".to_string(), |o| o.to_string()),
                began.elapsed().as_millis()
            ));
            return Ok(row(mv, outcome, None, began.elapsed(), None));
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let left = (live.phase == Phase::FailBackWindow)
            .then(|| live.window_ends_at_ms().map(|e| e.saturating_sub(now)))
            .flatten();
        let copies = row_now.map(|r| {
            format!(
                "primary {}, replicas {}, reads from {}",
                r.owner,
                crate::ctl::replicas_text(r),
                r.reads_from
                    .map_or("primary".into(), |n| format!("{:x}", n.0))
            )
        });
        bar.set_message(format!(
            "{}{} ({})",
            live.phase.name(),
            left.map(|l| format!(" {l} ms left to move back"))
                .unwrap_or_default(),
            copies.unwrap_or_default()
        ));
        if until == Until::Switched && live.phase == Phase::FailBackWindow && !back {
            bar.finish_and_clear();
            say(format!(
                "primary move {} SWITCHED: partition {} primary {} -> {} in {} ms; the old primary stays \
                 an in-sync replica for {} ms more (`keyway ctl move --back {}` switches back, no copy)",
                mv.id,
                mv.partition,
                mv.from,
                mv.to,
                began.elapsed().as_millis(),
                left.unwrap_or(0),
                mv.partition
            ));
            return Ok(row(mv, "switched", Some(live.phase), began.elapsed(), left));
        }
        if Instant::now() >= deadline {
            bar.abandon();
            anyhow::bail!(
                "primary move {} still in {} at the timeout (it continues)",
                mv.id,
                live.phase.name()
            );
        }
        last = Some(live);
        tokio::time::sleep(POLL).await;
    }
}

/// Whether `ctl move` of `partition` takes this path (replication factor ≥ 2).
pub fn replicated(map: &keyway_map::PartitionMap, partition: PartitionId) -> bool {
    pmove_ops::is_replicated(map, partition)
}
