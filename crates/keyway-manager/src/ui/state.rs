//! `/ui/state`: everything the dashboard draws, in one JSON document built
//! from what the manager already knows: the map (partitions, nodes) and the
//! leases from the metadata store, the migrations as `/migrations` shows
//! them, the copies the nodes report (recoveries and replica catch-ups, as
//! in `/status`), the decision log, the latest load round and the skew
//! history.
//!
//! Node ids are sent as text (40 hex digits, and the short form `ctl`
//! prints): they are u64s, and JavaScript numbers lose precision above
//! 2^53. ETAs are computed only from observed progress: a rate measured
//! by the driver over its last poll, or the copy's average since it began;
//! without either the ETA is `null` and the page says "unknown".

use crate::copies::CopyProgress;
use crate::decisions::Decision;
use crate::driver::MigrationSummary;
use crate::stats::{LoadSnapshot, key_text};
use crate::ui::skew::SkewSample;
use keyway_map::{NodeId, PartitionMap, PartitionRecord, Routing, to_hex};
use keyway_meta::LeaseInfo;
use serde::Serialize;
use std::collections::BTreeMap;

/// Decisions the page shows (the latest ones).
pub const UI_DECISIONS: usize = 50;
/// Finished migrations the page shows beside the running ones (latest first).
pub const UI_FINISHED_MIGRATIONS: usize = 10;
/// A copy must have run this long before its average rate is trusted for an ETA.
pub const MIN_RATE_WINDOW_MS: u64 = 1_000;

/// The whole document.
#[derive(Debug, Serialize)]
pub struct UiState {
    pub now_unix_ms: u64,
    pub manager: ManagerRow,
    pub map_version: u64,
    pub nodes: Vec<NodeRow>,
    pub partitions: Vec<PartitionRow>,
    /// Age of the load round the partitions' figures come from (`None`: no
    /// round yet, or this manager does not lead).
    pub load_age_ms: Option<u64>,
    pub skew: Option<crate::monitor::Skew>,
    pub migrations: Vec<MigrationRow>,
    /// Moves of replicated partitions (primary moves, replica moves): no
    /// migration record of their own; their copy is a replica catch-up.
    pub moves: Vec<MoveRow>,
    pub copies: Vec<CopyRow>,
    pub recovery: RecoveryRow,
    pub decisions: Vec<Decision>,
    pub skew_history: SkewHistoryRow,
    /// Parts that could not be read this time (the rest is still shown).
    pub errors: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct ManagerRow {
    pub name: String,
    pub leading: bool,
    pub leader: Option<String>,
    pub lease_remaining_ms: u64,
}

#[derive(Debug, Serialize)]
pub struct NodeRow {
    pub id: String,
    pub short_id: String,
    pub resp_addr: String,
    pub admin_addr: String,
    pub state: keyway_map::NodeState,
    pub weight: u32,
    pub draining: bool,
    pub zone: Option<String>,
    /// Lease time left by the store's clock (`None`: no live lease).
    pub lease_remaining_ms: Option<u64>,
    pub partitions: usize,
    pub replicas: usize,
    pub requests_per_sec: f64,
    pub bytes: u64,
}

#[derive(Debug, Serialize)]
pub struct PartitionRow {
    pub id: u64,
    pub keyspace: String,
    pub range: String,
    pub owner: String,
    pub replicas: Vec<String>,
    pub in_sync: Vec<String>,
    pub epoch: u64,
    /// From the latest load round (`None`: its owner did not report it).
    pub requests_per_sec: Option<f64>,
    pub bytes: Option<u64>,
    pub keys: Option<u64>,
    pub hot_keys: Vec<HotKeyRow>,
}

#[derive(Debug, Serialize)]
pub struct HotKeyRow {
    pub key: String,
    pub per_sec: f64,
}

#[derive(Debug, PartialEq, Serialize)]
pub struct MigrationRow {
    pub id: u64,
    pub state: String,
    pub running: bool,
    pub partition: u64,
    pub source: String,
    pub target: String,
    pub copied_bytes: u64,
    pub total_bytes: u64,
    /// Share of the snapshot copied, 0..=1 (`None`: size not known yet).
    pub progress: Option<f64>,
    pub rate_bytes_per_sec: Option<f64>,
    /// `last_poll` (the driver's rate over its last poll), `since_copy_start`
    /// (the average since COPYING began) or `unknown`.
    pub rate_basis: &'static str,
    /// Time left in the copy at that rate (`None`: unknown, or not copying).
    pub eta_ms: Option<u64>,
    pub lag: Option<u64>,
    pub pause_ms: Option<u64>,
    pub started_at_ms: u64,
    pub ended_at_ms: Option<u64>,
    pub error: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct MoveRow {
    /// `primary` or `replica`.
    pub kind: &'static str,
    /// In the migration id space (never equal to a migration's id).
    pub id: u64,
    pub partition: u64,
    pub from: String,
    pub to: String,
    /// What the move waits for or does this round (`catching_up`,
    /// `switching`, `fail_back_window`, `adding_target`, ...).
    pub phase: &'static str,
    /// The target's copy, as its sender reports it (`None`: no copy
    /// reported this round, or no size yet).
    pub progress: Option<f64>,
    pub rate_bytes_per_sec: Option<f64>,
    pub eta_ms: Option<u64>,
    /// Primary moves: ms left in the fail-back window.
    pub fail_back_left_ms: Option<u64>,
}

#[derive(Debug, Serialize)]
pub struct CopyRow {
    pub kind: &'static str,
    pub partition: u64,
    pub from: String,
    pub to: String,
    pub migration: u64,
    pub outcome: &'static str,
    pub bytes_sent: u64,
    pub bytes_total_estimate: Option<u64>,
    pub progress: Option<f64>,
    pub rate_bytes_per_sec: Option<f64>,
    pub eta_ms: Option<u64>,
}

#[derive(Debug, Serialize)]
pub struct RecoveryRow {
    pub under_replicated_partitions: usize,
    pub offline_partitions: Vec<u64>,
    pub dead_nodes: Vec<String>,
    pub waiting_for_grace: Vec<(String, u64)>,
}

#[derive(Debug, Serialize)]
pub struct SkewHistoryRow {
    /// `ui_skew_history_samples`: the most samples kept.
    pub limit: usize,
    pub samples: Vec<SkewSample>,
}

/// The inputs, read by the caller (so building is pure and tested).
pub struct Inputs<'a> {
    pub now_unix_ms: u64,
    pub manager: ManagerRow,
    pub map: &'a PartitionMap,
    pub leases: Option<&'a [LeaseInfo]>,
    pub load: Option<&'a LoadSnapshot>,
    pub migrations: Option<&'a [MigrationSummary]>,
    pub copies: &'a [CopyProgress],
    pub replication: &'a crate::replication::ReplicationView,
    pub decisions: Vec<Decision>,
    pub skew_limit: usize,
    pub skew_samples: Vec<SkewSample>,
    pub errors: Vec<String>,
}

pub fn node_text(n: NodeId) -> String {
    n.to_string()
}

fn short(n: NodeId) -> String {
    format!("{:x}", n.0)
}

/// `slots 0-4095` for a hash keyspace, `[hex, hex)` for a range keyspace.
fn range_text(map: &PartitionMap, p: &PartitionRecord) -> String {
    let hash = map
        .keyspaces
        .get(&p.keyspace)
        .is_some_and(|k| k.routing == Routing::Hash);
    if hash {
        let (first, last) = p.slot_span();
        format!("slots {first}-{last}")
    } else {
        let end = p.end.as_ref().map_or_else(|| "end".into(), |e| to_hex(e));
        format!("[{}, {end})", to_hex(&p.start))
    }
}

/// Builds the document.
pub fn build(inp: Inputs<'_>) -> UiState {
    let map = inp.map;
    let leases: BTreeMap<NodeId, u64> = inp
        .leases
        .unwrap_or_default()
        .iter()
        .map(|l| (l.node, l.remaining_ms))
        .collect();
    // Load figures count only for a round taken under this map's owners.
    let loads = inp.load.map(|s| &s.load.partitions);
    let partitions: Vec<PartitionRow> = map
        .partitions
        .values()
        .map(|p| {
            let load = loads
                .and_then(|l| l.get(&p.id))
                .filter(|l| l.node == p.owner);
            PartitionRow {
                id: p.id.0,
                keyspace: map
                    .keyspaces
                    .get(&p.keyspace)
                    .map_or_else(|| p.keyspace.0.to_string(), |k| k.name.clone()),
                range: range_text(map, p),
                owner: node_text(p.owner),
                replicas: p.replicas.iter().map(|r| node_text(*r)).collect(),
                in_sync: p.in_sync.iter().map(|r| node_text(*r)).collect(),
                epoch: p.epoch.0,
                requests_per_sec: load.map(|l| l.requests_per_sec()),
                bytes: load.map(|l| l.bytes),
                keys: load.map(|l| l.keys),
                hot_keys: load
                    .map(|l| {
                        l.hot_keys
                            .iter()
                            .map(|h| HotKeyRow {
                                key: key_text(&h.key),
                                per_sec: h.per_sec,
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
            }
        })
        .collect();
    let nodes = map
        .nodes
        .values()
        .map(|n| {
            let owned = || partitions.iter().filter(|p| p.owner == node_text(n.id));
            NodeRow {
                id: node_text(n.id),
                short_id: short(n.id),
                resp_addr: n.resp_addr.clone(),
                admin_addr: n.admin_addr.clone(),
                state: n.state,
                weight: n.weight,
                draining: n.draining,
                zone: n.zone.clone(),
                lease_remaining_ms: leases.get(&n.id).copied(),
                partitions: owned().count(),
                replicas: map
                    .partitions
                    .values()
                    .filter(|p| p.replicas.contains(&n.id))
                    .count(),
                requests_per_sec: owned().filter_map(|p| p.requests_per_sec).sum(),
                bytes: owned().filter_map(|p| p.bytes).sum(),
            }
        })
        .collect();
    let migrations = inp
        .migrations
        .map(|list| migration_rows(list, inp.now_unix_ms))
        .unwrap_or_default();
    let copies: Vec<CopyRow> = inp.copies.iter().map(copy_row).collect();
    let moves = move_rows(inp.replication, &copies);
    let rec = &inp.replication.recovery;
    let recovery = RecoveryRow {
        under_replicated_partitions: inp.replication.under_replicated_partitions,
        offline_partitions: inp.replication.offline_partitions.clone(),
        dead_nodes: rec
            .dead_nodes
            .iter()
            .map(|n| node_text(NodeId(*n)))
            .collect(),
        waiting_for_grace: rec
            .waiting_for_grace
            .iter()
            .map(|w| (node_text(NodeId(w.node)), w.left_ms))
            .collect(),
    };
    let mut decisions = inp.decisions;
    let skip = decisions.len().saturating_sub(UI_DECISIONS);
    decisions.drain(..skip);
    decisions.reverse();
    UiState {
        now_unix_ms: inp.now_unix_ms,
        manager: inp.manager,
        map_version: map.version.0,
        nodes,
        partitions,
        load_age_ms: inp.load.map(|s| s.taken_at.elapsed().as_millis() as u64),
        skew: inp
            .load
            .map(|s| crate::monitor::Skew::of(&crate::monitor::node_loads(&s.map, &s.load))),
        migrations,
        moves,
        copies,
        recovery,
        decisions,
        skew_history: SkewHistoryRow {
            limit: inp.skew_limit,
            samples: inp.skew_samples,
        },
        errors: inp.errors,
    }
}

/// The running migrations (by id), then the latest finished ones.
fn migration_rows(list: &[MigrationSummary], now_ms: u64) -> Vec<MigrationRow> {
    let rows: Vec<MigrationRow> = list.iter().map(|m| migration_row(m, now_ms)).collect();
    let (mut out, mut done): (Vec<_>, Vec<_>) = rows.into_iter().partition(|r| r.running);
    done.sort_by_key(|r| std::cmp::Reverse((r.ended_at_ms, r.id)));
    done.truncate(UI_FINISHED_MIGRATIONS);
    out.extend(done);
    out
}

/// One migration with its progress and an ETA from observed progress only.
pub fn migration_row(m: &MigrationSummary, now_ms: u64) -> MigrationRow {
    let state = m.state.as_str();
    let running = !matches!(state, "DONE" | "ABORTED" | "UNREADABLE");
    let copy_share =
        (m.total_bytes > 0).then(|| (m.copied_bytes as f64 / m.total_bytes as f64).clamp(0.0, 1.0));
    let progress = match state {
        "PENDING" => Some(0.0),
        "COPYING" | "ABORTED" | "UNREADABLE" => copy_share,
        // The snapshot is at the target; what is left is the change log.
        _ => Some(1.0),
    };
    let (rate, basis) = if state != "COPYING" {
        (None, "unknown")
    } else if let Some(r) = m.copy_rate_bytes_per_sec.filter(|r| *r > 0) {
        (Some(r as f64), "last_poll")
    } else {
        let elapsed = now_ms.saturating_sub(m.state_entered_at_ms);
        if m.copied_bytes > 0 && elapsed >= MIN_RATE_WINDOW_MS {
            (
                Some(m.copied_bytes as f64 * 1000.0 / elapsed as f64),
                "since_copy_start",
            )
        } else {
            (None, "unknown")
        }
    };
    let eta_ms = match (rate, m.total_bytes > 0) {
        (Some(r), true) if r > 0.0 => {
            let left = m.total_bytes.saturating_sub(m.copied_bytes) as f64;
            Some((left / r * 1000.0).round() as u64)
        }
        _ => None,
    };
    MigrationRow {
        id: m.id.0,
        state: m.state.clone(),
        running,
        partition: m.partition.0,
        source: node_text(m.source),
        target: node_text(m.target),
        copied_bytes: m.copied_bytes,
        total_bytes: m.total_bytes,
        progress,
        rate_bytes_per_sec: rate,
        rate_basis: basis,
        eta_ms,
        lag: m.lag,
        pause_ms: m.pause_ms,
        started_at_ms: m.started_at_ms,
        ended_at_ms: m.ended_at_ms,
        error: m.error.clone(),
    }
}

/// The live primary and replica moves, each with its target's copy.
fn move_rows(view: &crate::replication::ReplicationView, copies: &[CopyRow]) -> Vec<MoveRow> {
    let copy_to = |partition: u64, to: &str| {
        copies
            .iter()
            .filter(|c| c.kind == "replica" && c.partition == partition && c.to == to)
            .max_by_key(|c| c.outcome == "running")
    };
    let mut out = Vec::new();
    let mut push = |kind, id, partition: u64, from, to: NodeId, phase, left| {
        let to = node_text(to);
        let copy = copy_to(partition, &to);
        out.push(MoveRow {
            kind,
            id,
            partition,
            from: node_text(from),
            progress: copy.and_then(|c| c.progress),
            rate_bytes_per_sec: copy.and_then(|c| c.rate_bytes_per_sec),
            eta_ms: copy.and_then(|c| c.eta_ms),
            to,
            phase,
            fail_back_left_ms: left,
        });
    };
    for m in &view.primary_moves {
        let r = &m.record;
        push(
            "primary",
            r.id,
            r.partition.0,
            r.from,
            r.to,
            m.doing,
            m.fail_back_left_ms,
        );
    }
    for m in &view.replica_moves {
        let r = &m.intent;
        push("replica", r.id, r.partition.0, r.from, r.to, m.phase, None);
    }
    out
}

/// One copy; its ETA only with a size estimate and a rate above zero
/// (a running copy without either is "unknown", never "0 s").
fn copy_row(c: &CopyProgress) -> CopyRow {
    let progress = c
        .bytes_total_estimate
        .filter(|t| *t > 0)
        .map(|t| (c.bytes_sent as f64 / t as f64).clamp(0.0, 1.0));
    let measured = progress.is_some() && c.rate_bytes_per_sec.is_some_and(|r| r > 0.0);
    let eta_ms = if c.running() {
        c.eta_ms.filter(|_| measured)
    } else {
        c.eta_ms
    };
    CopyRow {
        kind: c.kind.label(),
        partition: c.partition.0,
        from: node_text(c.from),
        to: node_text(c.to),
        migration: c.migration,
        outcome: c.outcome.label(),
        bytes_sent: c.bytes_sent,
        bytes_total_estimate: c.bytes_total_estimate,
        progress,
        rate_bytes_per_sec: c.rate_bytes_per_sec,
        eta_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyway_map::PartitionId;
    use keyway_migration::MigrationId;

    fn summary(state: &str, copied: u64, total: u64, rate: Option<u64>) -> MigrationSummary {
        MigrationSummary {
            id: MigrationId(7),
            state: state.into(),
            partition: PartitionId(3),
            source: NodeId(1),
            target: NodeId(2),
            epoch: 1,
            generation: 1,
            copied_bytes: copied,
            total_bytes: total,
            bytes_sent: copied,
            bytes_written: copied,
            copy_duration_ms: 0,
            lag: None,
            copy_rate_bytes_per_sec: rate,
            pause_ms: None,
            abort_reason: None,
            stray: None,
            started_at_ms: 10_000,
            state_entered_at_ms: 10_000,
            ended_at_ms: None,
            driven: true,
            error: None,
        }
    }

    #[test]
    fn the_eta_comes_from_the_measured_rate_or_is_unknown() {
        // The driver measured 1,000 B/s: 3,000 bytes left take 3 s.
        let r = migration_row(&summary("COPYING", 1_000, 4_000, Some(1_000)), 10_500);
        assert_eq!(r.progress, Some(0.25));
        assert_eq!((r.rate_basis, r.eta_ms), ("last_poll", Some(3_000)));
        // No poll rate: the average since COPYING began (2,000 B over 2 s).
        let r = migration_row(&summary("COPYING", 2_000, 4_000, None), 12_000);
        assert_eq!((r.rate_basis, r.eta_ms), ("since_copy_start", Some(2_000)));
        // Too early to tell, or nothing copied yet: unknown, never a guess.
        let r = migration_row(&summary("COPYING", 2_000, 4_000, None), 10_400);
        assert_eq!((r.rate_basis, r.eta_ms), ("unknown", None));
        let r = migration_row(&summary("COPYING", 0, 4_000, None), 60_000);
        assert_eq!((r.rate_basis, r.eta_ms), ("unknown", None));
        // Size not known yet: no progress share, no ETA.
        let r = migration_row(&summary("COPYING", 0, 0, Some(5)), 60_000);
        assert_eq!((r.progress, r.eta_ms), (None, None));
        // Past the copy: the snapshot is complete, no copy ETA.
        let r = migration_row(&summary("CATCHUP", 4_000, 4_000, Some(9)), 60_000);
        assert_eq!((r.progress, r.eta_ms, r.running), (Some(1.0), None, true));
        let r = migration_row(&summary("DONE", 4_000, 4_000, None), 60_000);
        assert!(!r.running);
    }

    #[test]
    fn a_copy_without_a_size_or_a_rate_has_an_unknown_eta() {
        use keyway_peer::copies::{CopyKind, CopyOutcome};
        let copy = |estimate: Option<u64>, rate: Option<f64>, eta: Option<u64>| CopyProgress {
            partition: PartitionId(1),
            from: NodeId(1),
            to: NodeId(2),
            kind: CopyKind::Migration,
            migration: 1,
            outcome: CopyOutcome::Running,
            bytes_sent: 500,
            bytes_written: 500,
            bytes_total_estimate: estimate,
            bytes_remaining: estimate.map(|e| e.saturating_sub(500)),
            rate_bytes_per_sec: rate,
            rate_basis: crate::copies::RateBasis::SinceStart,
            eta_ms: eta,
            started_at_ms: 0,
            finished_at_ms: None,
            duration_ms: 1_000,
            error: None,
        };
        assert_eq!(copy_row(&copy(None, Some(0.0), Some(0))).eta_ms, None);
        assert_eq!(
            copy_row(&copy(Some(1_000), Some(0.0), Some(0))).eta_ms,
            None
        );
        let r = copy_row(&copy(Some(1_000), Some(500.0), Some(1_000)));
        assert_eq!((r.progress, r.eta_ms), (Some(0.5), Some(1_000)));
    }

    #[test]
    fn a_replica_move_is_listed_with_its_targets_copy() {
        use crate::replication::moves::ReplicaMove;
        let mut view = crate::replication::ReplicationView::default();
        view.replica_moves
            .push(crate::replication::ReplicaMoveView {
                intent: ReplicaMove {
                    id: 9,
                    generation: 1,
                    partition: PartitionId(4),
                    from: NodeId(1),
                    to: NodeId(3),
                    started_at_ms: 0,
                },
                phase: "catching_up",
            });
        let copy = |to: u64, kind: &'static str| CopyRow {
            kind,
            partition: 4,
            from: node_text(NodeId(2)),
            to: node_text(NodeId(to)),
            migration: 0,
            outcome: "running",
            bytes_sent: 10,
            bytes_total_estimate: Some(40),
            progress: Some(0.25),
            rate_bytes_per_sec: Some(10.0),
            eta_ms: Some(3_000),
        };
        let rows = move_rows(&view, &[copy(2, "replica"), copy(3, "replica")]);
        assert_eq!(rows.len(), 1);
        let r = &rows[0];
        assert_eq!(
            (r.kind, r.id, r.partition, r.phase),
            ("replica", 9, 4, "catching_up")
        );
        assert_eq!((r.progress, r.eta_ms), (Some(0.25), Some(3_000)));
        // No copy to the target reported: no progress, no ETA.
        let rows = move_rows(&view, &[copy(2, "replica"), copy(3, "migration")]);
        assert_eq!((rows[0].progress, rows[0].eta_ms), (None, None));
    }
}
