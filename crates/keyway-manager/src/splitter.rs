//! The splitter: the manager's duty that splits partitions that grew too
//! big or too busy and merges neighbours that went cold (issue 5).
//!
//! # How it runs
//! - [`Splitter::start`] spawns one loop fed by the load monitor's `watch`
//!   channel of [`LoadSnapshot`]s. Each new snapshot is one round; a round
//!   does nothing unless the seat leads ([`SeatView::leading`], checked
//!   again before every store write). A change of leadership forgets every
//!   window and the birth history: a new leader starts from scratch.
//! - A round reads the map and the live migrations fresh from the store,
//!   notes new partition ids in the [`History`], and asks the pure policies:
//!   [`SplitPolicy::decide`] (`split/decide.rs`), then
//!   [`MergePolicy::decide`] (`merge/decide.rs`). It carries out each
//!   verdict: a split or merge is one compare-and-set conditional on the
//!   `(owner, epoch)`s decided on ([`split_checked`], [`merge_checked`]); a
//!   co-location before a merge is a [`request_move`] the migration driver
//!   then runs.
//! - Every verdict goes to the [`DecisionLog`]: actions with
//!   [`DecisionLog::record`], holds with [`DecisionLog::record_once`] per
//!   partition (or pair, or keyspace), and when a subject that was held
//!   back no longer needs anything, one `within_limits` decision.
//! - Metrics (registered here): `keyway_manager_splits_total{reason}`,
//!   `keyway_manager_splits_skipped_total{reason}` (every round a partition
//!   needing a split is held back, e.g. `single_key`),
//!   `keyway_manager_merges_total`, `keyway_manager_merge_moves_total`,
//!   `keyway_manager_merges_skipped_total{reason}`,
//!   `keyway_manager_hot_partitions`.

use crate::decisions::{Decision, DecisionLog};
use crate::merge::{MergeAction, MergeConfig, MergePolicy, MergeVerdict, merge_checked};
use crate::metrics::{Metrics, ReasonLabel};
use crate::monitor::LoadReceiver;
use crate::seat::SeatView;
use crate::split::{
    Birth, History, SplitAction, SplitConfig, SplitPolicy, SplitRequest, SplitVerdict,
    live_migrations, split_checked,
};
use crate::{LoadSnapshot, request_move};
use keyway_map::{PartitionId, PartitionMap};
use keyway_meta::{Leadership, MetaStore};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The splitter's metrics.
#[derive(Clone, Default)]
pub struct SplitterMetrics {
    pub splits: Family<ReasonLabel, Counter>,
    pub splits_skipped: Family<ReasonLabel, Counter>,
    pub merges: Counter,
    pub merge_moves: Counter,
    pub merges_skipped: Family<ReasonLabel, Counter>,
    pub hot_partitions: Gauge,
}

impl SplitterMetrics {
    /// Creates them and registers them in `metrics`.
    pub fn register(metrics: &Metrics) -> Self {
        let m = SplitterMetrics::default();
        metrics.register(
            "splits",
            "Partitions the manager split, by reason (size, load)",
            m.splits.clone(),
        );
        metrics.register(
            "splits_skipped",
            "Rounds a partition needing a split was left alone, by reason (single_key, migrating, cooldown, warming, conflict, ...)",
            m.splits_skipped.clone(),
        );
        metrics.register(
            "merges",
            "Pairs of cold neighbours the manager merged",
            m.merges.clone(),
        );
        metrics.register(
            "merge_moves",
            "Moves requested to co-locate two cold neighbours before merging them",
            m.merge_moves.clone(),
        );
        metrics.register(
            "merges_skipped",
            "Rounds a mergeable pair (or keyspace) was left alone, by reason (at_floor, migrating, hot, cooldown, ...)",
            m.merges_skipped.clone(),
        );
        metrics.register(
            "hot_partitions",
            "Partitions above split_max_requests_per_sec in the last round",
            m.hot_partitions.clone(),
        );
        m
    }
}

/// The running splitter; see the module docs.
pub struct Splitter {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

struct Shared {
    meta: Arc<dyn MetaStore>,
    seat: SeatView,
    split: SplitConfig,
    merge: MergeConfig,
    decisions: DecisionLog,
    metrics: SplitterMetrics,
}

/// What the loop remembers between rounds (all of it reset on a change of
/// leadership).
#[derive(Default)]
struct State {
    term: Option<Leadership>,
    split: SplitPolicy,
    merge: MergePolicy,
    history: History,
    /// Partitions held back last time (for the `within_limits` decision).
    split_held: HashSet<PartitionId>,
    /// Merge subjects held back last time, with their pair's left id.
    merge_held: HashMap<String, Option<PartitionId>>,
}

impl Splitter {
    /// Starts the loop over `loads` (the load monitor's channel). `split` and
    /// `merge` must pass their `validate` (panics otherwise); each duty acts
    /// only if `enabled`.
    pub fn start(
        meta: Arc<dyn MetaStore>,
        seat: SeatView,
        loads: LoadReceiver,
        split: SplitConfig,
        merge: MergeConfig,
        decisions: DecisionLog,
        metrics: &Metrics,
    ) -> Splitter {
        if let Err(e) = split.validate().and_then(|()| merge.validate()) {
            panic!("Splitter::start: {e}");
        }
        let shared = Arc::new(Shared {
            meta,
            seat,
            split,
            merge,
            decisions,
            metrics: SplitterMetrics::register(metrics),
        });
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(run(shared, loads, stop_rx));
        Splitter { stop, task }
    }

    /// Stops the loop (a round in progress is dropped at its next await).
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

async fn run(shared: Arc<Shared>, mut loads: LoadReceiver, mut stop: watch::Receiver<bool>) {
    let mut state = State::default();
    let mut feed_alive = true;
    while !*stop.borrow_and_update() {
        let snapshot = loads.borrow_and_update().clone();
        if let Some(snapshot) = snapshot {
            tokio::select! {
                () = round(&shared, &mut state, &snapshot) => {}
                _ = stop.changed() => break,
            }
        }
        tokio::select! {
            changed = stop.changed() => if changed.is_err() { break },
            changed = loads.changed(), if feed_alive => feed_alive = changed.is_ok(),
        }
    }
}

/// One round over one snapshot (see the module docs).
async fn round(shared: &Shared, state: &mut State, snapshot: &LoadSnapshot) {
    let leading = shared.seat.leading();
    if leading != state.term {
        *state = State {
            term: leading.clone(),
            ..State::default()
        };
    }
    if leading.is_none() {
        return;
    }
    let meta = &*shared.meta;
    let (map, busy) = match (meta.get_map().await, live_migrations(meta).await) {
        (Ok(map), Ok(busy)) => (map, busy),
        (Err(err), _) | (_, Err(err)) => {
            tracing::debug!(%err, "splitter: cannot read the map or the migrations; skipping a round");
            return;
        }
    };
    let now = snapshot.taken_at;
    state.history.observe(&map, Instant::now());
    let verdicts = state.split.decide(
        &shared.split,
        &map,
        &snapshot.load,
        &busy,
        &state.history,
        now,
    );
    let hot = state.split.hot();
    shared.metrics.hot_partitions.set(hot.len() as i64);
    if shared.split.enabled {
        apply_splits(shared, state, &map, verdicts).await;
    }
    let verdicts = state.merge.decide(
        &shared.merge,
        &map,
        &snapshot.load,
        &busy,
        &hot,
        &state.history,
        now,
    );
    if shared.merge.enabled {
        apply_merges(shared, state, verdicts).await;
    }
}

fn still_leading(shared: &Shared, state: &State) -> bool {
    shared.seat.leading().is_some() && shared.seat.leading() == state.term
}

fn reason_label(reason: &'static str) -> ReasonLabel {
    ReasonLabel { reason }
}

async fn apply_splits(
    shared: &Shared,
    state: &mut State,
    map: &PartitionMap,
    verdicts: Vec<SplitVerdict>,
) {
    let log = &shared.decisions;
    let m = &shared.metrics;
    let mut held = HashSet::new();
    for v in verdicts {
        let pid = v.partition;
        let subject = format!("partition {pid}");
        let at = match v.action {
            SplitAction::Hold => {
                m.splits_skipped
                    .get_or_create(&reason_label(v.reason))
                    .inc();
                let d = Decision::now("split", "no_split", v.reason, Some(pid), false, v.detail);
                log.record_once(subject, d);
                held.insert(pid);
                continue;
            }
            SplitAction::Split(at) => at,
        };
        if !still_leading(shared, state) {
            return;
        }
        let request = SplitRequest {
            partition: pid,
            at,
            expected: Some(v.expected),
            size_hint: None,
        };
        match split_checked(&*shared.meta, &request).await {
            Ok(plan) => {
                m.splits.get_or_create(&reason_label(v.reason)).inc();
                let born = Instant::now();
                state.history.born(plan.left.id, Birth::Split, born);
                state.history.born(plan.right.id, Birth::Split, born);
                let detail = format!(
                    "{}; children {} {} and {} {} at epoch {}",
                    v.detail,
                    plan.left.id,
                    crate::split::range_text(&plan.left),
                    plan.right.id,
                    crate::split::range_text(&plan.right),
                    plan.left.epoch
                );
                log.record(Decision::now(
                    "split",
                    "split",
                    v.reason,
                    Some(pid),
                    true,
                    detail,
                ));
            }
            Err(e) => {
                let reason = e.reason();
                m.splits_skipped.get_or_create(&reason_label(reason)).inc();
                let detail = format!("{}; refused: {e}", v.detail);
                log.record(Decision::now(
                    "split",
                    "no_split",
                    reason,
                    Some(pid),
                    false,
                    detail,
                ));
            }
        }
    }
    for pid in std::mem::take(&mut state.split_held) {
        if !held.contains(&pid) && map.partitions.contains_key(&pid) {
            let d = Decision::now("split", "no_split", "within_limits", Some(pid), false, "");
            log.record_once(format!("partition {pid}"), d);
        }
    }
    state.split_held = held;
}

async fn apply_merges(shared: &Shared, state: &mut State, verdicts: Vec<MergeVerdict>) {
    let log = &shared.decisions;
    let m = &shared.metrics;
    let mut held = HashMap::new();
    for v in verdicts {
        let left = v.pair.map(|(l, _)| l);
        let decision = |action, reason, acted, detail: String| {
            Decision::now("merge", action, reason, left, acted, detail)
        };
        match v.action {
            MergeAction::Hold => {
                m.merges_skipped
                    .get_or_create(&reason_label(v.reason))
                    .inc();
                log.record_once(
                    v.subject.clone(),
                    decision("no_merge", v.reason, false, v.detail),
                );
                held.insert(v.subject, left);
            }
            MergeAction::Merge {
                left: l,
                right: r,
                expected,
            } => {
                if !still_leading(shared, state) {
                    return;
                }
                match merge_checked(&*shared.meta, l, r, Some(expected)).await {
                    Ok(plan) => {
                        m.merges.inc();
                        let merged = &plan.merged;
                        state.history.born(merged.id, Birth::Merge, Instant::now());
                        let detail = format!(
                            "{}; merged into {} {} at epoch {}",
                            v.detail,
                            merged.id,
                            crate::split::range_text(merged),
                            merged.epoch
                        );
                        log.record(decision("merge", v.reason, true, detail));
                    }
                    Err(e) => {
                        m.merges_skipped
                            .get_or_create(&reason_label(e.reason()))
                            .inc();
                        let detail = format!("{}; refused: {e}", v.detail);
                        log.record(decision("no_merge", e.reason(), false, detail));
                    }
                }
            }
            MergeAction::Move { partition, to } => {
                if !still_leading(shared, state) {
                    return;
                }
                match request_move(&*shared.meta, partition, to).await {
                    Ok(rec) => {
                        m.merge_moves.inc();
                        let detail = format!("{}; migration {}", v.detail, rec.id);
                        log.record(decision("move", v.reason, true, detail));
                    }
                    Err(e) => {
                        m.merges_skipped
                            .get_or_create(&reason_label("move_refused"))
                            .inc();
                        let detail = format!("{}; move refused: {e}", v.detail);
                        log.record(decision("no_merge", "move_refused", false, detail));
                    }
                }
            }
        }
    }
    for (subject, left) in std::mem::take(&mut state.merge_held) {
        if !held.contains_key(&subject) {
            let d = Decision::now("merge", "no_merge", "no_candidate", left, false, "");
            log.record_once(subject, d);
        }
    }
    state.merge_held = held;
}

#[cfg(test)]
#[path = "splitter_tests.rs"]
mod tests;
