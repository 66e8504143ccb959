//! The rebalancer (issue 5): spreads the load over the Up, non-draining
//! nodes in proportion to their weights, empties draining nodes, and keeps
//! the nodes' Up/Down state in the map, moving data only through migrations
//! ([`crate::request_move`]; the driver carries them out).
//!
//! In the manner of a reconciler: per node, the *policy* is its weight and
//! drain flag (in the map, set by operators), the *intent* is its fair share
//! of the objective, the *observed* state is the map, the live migrations
//! and the latest [`crate::LoadSnapshot`]; each round of the leader closes the gap
//! by at most the caps' worth of moves. The decision itself is the pure
//! [`plan()`] (inputs in, planned moves and the reason it stopped out).
//!
//! # A round (every `interval_ms`, while the seat leads)
//!
//! 1. Liveness (`nodes.rs`): nodes whose lease is gone are marked `Down`,
//!    nodes whose lease is back `Up`; each change is a decision of duty
//!    `node` (`lease_gone`, `lease_back`), and a node down past
//!    `down_grace_ms` that still owns partitions is recorded once as
//!    `down_past_grace` (they cannot move: the only copy is on it).
//! 2. Inputs: the map, every migration record (non-terminal ones are live;
//!    flipped and ended ones give each partition's last move time, so a
//!    restarted manager keeps the cooldown), and the latest load.
//! 3. [`plan()`] within the caps; each move is requested (a replicated
//!    partition's as a primary move by replica addition,
//!    `replication/pmoves.rs`; others as a migration), recorded
//!    (`rebalance`/`move`/`drain|balance`) and counted; why it stopped is
//!    recorded once per change of reason (`balanced`, `cap_reached`,
//!    `migrations_in_flight`, `cooldown`, `waiting_for_grace`, ...).
//! 4. Replicas apart ([`replicas::plan_replicas`]): replica counts by
//!    weight; each planned replica move is requested
//!    ([`crate::request_replica_move`]; the replication loop carries it
//!    out) and recorded (`rebalance`/`move_replica`/`balance_replicas`).
//!
//! # Layout
//! - `config.rs`: [`RebalanceConfig`], [`Objective`].
//! - `plan.rs`: the planner: [`plan()`], [`PlanInput`], [`Plan`].
//! - `replicas.rs`: the replica balancer ([`replicas::plan_replicas`], pure):
//!   replica counts by weight, apart from the primaries' objective.
//! - `nodes.rs`: [`Liveness`], and the operator's calls [`set_draining`],
//!   [`set_weight`], [`decommission`].
//! - `mod.rs`: [`Rebalancer`] (the loop), [`read_migrations`].
//! - `tests.rs`: the planner's tests; `loop_tests.rs`: the loop against an
//!   embedded store.

mod config;
#[cfg(test)]
mod loop_tests;
mod nodes;
mod plan;
pub mod replicas;
#[cfg(test)]
mod replicas_tests;
#[cfg(test)]
mod tests;

pub use config::{Objective, RebalanceConfig};
pub use nodes::{
    Liveness, LivenessChange, MARK_DOWN_AFTER, MAX_WEIGHT, MAX_ZONE_LEN, NodeOpError, Observation,
    apply_liveness, check_zone, decommission, set_draining, set_weight, set_zone,
};
pub use plan::{
    DownPhase, LiveMove, MoveReason, NodePlan, Plan, PlanInput, PlannedMove, Role, Stop, Stuck,
    plan,
};

use crate::decisions::{Decision, DecisionLog};
use crate::metrics::Metrics;
use crate::monitor::LoadReceiver;
use crate::seat::SeatView;
use keyway_map::{NodeId, NodeState, PartitionId};
use keyway_meta::{Leadership, MetaError, MetaStore};
use keyway_migration::MigrationState;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Labels of the move counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MoveLabel {
    /// `drain` or `balance`.
    pub reason: &'static str,
}

/// The rebalancer's metrics (registered under `keyway_manager_rebalance_*`).
#[derive(Clone, Default)]
pub struct RebalanceMetrics {
    pub moves_planned: Family<MoveLabel, Counter>,
    pub moves_started: Family<MoveLabel, Counter>,
    pub nodes_down: Gauge,
    pub nodes_draining: Gauge,
    /// Partitions of nodes down past the grace (they cannot move).
    pub stuck_partitions: Gauge,
    /// Bytes the whole plan to balance would still move (caps lifted).
    pub planned_bytes: Gauge,
    /// The busiest balanced node's load over its fair share, once the live
    /// migrations are done (1.0 is perfect).
    pub busiest_over_share: Gauge<f64, AtomicU64>,
}

impl RebalanceMetrics {
    pub fn register(metrics: &Metrics) -> Self {
        let m = RebalanceMetrics::default();
        metrics.register(
            "rebalance_moves_planned",
            "Moves the rebalancer planned, by reason (drain, balance)",
            m.moves_planned.clone(),
        );
        metrics.register(
            "rebalance_moves_started",
            "Moves the rebalancer requested as migrations, by reason (drain, balance)",
            m.moves_started.clone(),
        );
        metrics.register(
            "rebalance_nodes_down",
            "Nodes the map shows Down (no lease)",
            m.nodes_down.clone(),
        );
        metrics.register(
            "rebalance_nodes_draining",
            "Nodes marked draining",
            m.nodes_draining.clone(),
        );
        metrics.register(
            "rebalance_stuck_partitions",
            "Partitions owned by nodes down past rebalance_down_grace_ms (they cannot be moved)",
            m.stuck_partitions.clone(),
        );
        metrics.register(
            "rebalance_planned_bytes",
            "Payload bytes the whole plan to balance would still move",
            m.planned_bytes.clone(),
        );
        metrics.register(
            "rebalance_busiest_over_share",
            "The busiest balanced node's load over its fair share (1.0 is perfect)",
            m.busiest_over_share.clone(),
        );
        m
    }
}

/// Live migrations and each partition's last move time, from the stored
/// records (unreadable ones are skipped with a warning).
pub async fn read_migrations(
    meta: &dyn MetaStore,
) -> Result<(Vec<LiveMove>, BTreeMap<PartitionId, u64>), MetaError> {
    let mut live = Vec::new();
    let mut moved_at: BTreeMap<PartitionId, u64> = BTreeMap::new();
    for stored in meta.migrations().await? {
        if let Some(mv) = crate::replication::PrimaryMove::load(&stored) {
            // A primary move by replica addition is a live move of its
            // partition from the old primary to the target.
            let e = moved_at.entry(mv.partition).or_insert(mv.requested_at_ms);
            *e = (*e).max(mv.requested_at_ms);
            live.push(LiveMove {
                partition: mv.partition,
                source: mv.from,
                target: mv.to,
            });
            continue;
        }
        if crate::replication::moves::is_replica_move(&stored) {
            continue;
        }
        let rec = match crate::driver::load(&stored) {
            Ok(rec) => rec,
            Err(err) => {
                tracing::warn!(%err, "rebalancer: skipping an unreadable migration record");
                continue;
            }
        };
        let p = rec.partition_id();
        let at = match rec.state {
            MigrationState::Cleanup | MigrationState::Done => {
                rec.flip_done_ms.unwrap_or(rec.state_entered_at_ms)
            }
            MigrationState::Aborted => rec.state_entered_at_ms,
            _ => rec.started_at_ms,
        };
        let e = moved_at.entry(p).or_insert(at);
        *e = (*e).max(at);
        if !rec.state.is_terminal() {
            live.push(LiveMove {
                partition: p,
                source: rec.source(),
                target: rec.target,
            });
        }
    }
    Ok((live, moved_at))
}

/// The running rebalancer; see the module docs.
pub struct Rebalancer {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Rebalancer {
    /// Starts the loop: it acts whenever `seat` leads. `config` must pass
    /// [`RebalanceConfig::validate`] (panics otherwise).
    pub fn start(
        meta: Arc<dyn MetaStore>,
        seat: SeatView,
        config: RebalanceConfig,
        load: LoadReceiver,
        decisions: DecisionLog,
        metrics: &Metrics,
    ) -> Rebalancer {
        if let Err(e) = config.validate() {
            panic!("Rebalancer::start: {e}");
        }
        let (stop, stop_rx) = watch::channel(false);
        let state = Loop {
            liveness: Liveness::new(Duration::from_millis(config.down_grace_ms)),
            meta,
            seat,
            config,
            load,
            decisions,
            metrics: RebalanceMetrics::register(metrics),
            term: None,
            moved_at: BTreeMap::new(),
        };
        let task = tokio::spawn(state.run(stop_rx));
        Rebalancer { stop, task }
    }

    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

struct Loop {
    meta: Arc<dyn MetaStore>,
    seat: SeatView,
    config: RebalanceConfig,
    load: LoadReceiver,
    decisions: DecisionLog,
    metrics: RebalanceMetrics,
    liveness: Liveness,
    /// The leadership the in-memory state belongs to.
    term: Option<Leadership>,
    /// Moves this manager requested, unix ms.
    moved_at: BTreeMap<PartitionId, u64>,
}

const DUTY: &str = "rebalance";

impl Loop {
    async fn run(mut self, mut stop: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(Duration::from_millis(self.config.interval_ms));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                changed = stop.changed() => if changed.is_err() || *stop.borrow() { return },
            }
            if let Err(err) = self.round().await {
                tracing::debug!(%err, "rebalancer: round failed; retrying next round");
            }
        }
    }

    async fn round(&mut self) -> Result<(), MetaError> {
        let leading = self.seat.leading();
        if leading != self.term {
            // A new leadership starts over: a down node waits a whole grace.
            self.liveness = Liveness::new(Duration::from_millis(self.config.down_grace_ms));
            self.term = leading.clone();
        }
        let Some(term) = leading else { return Ok(()) };
        let mut map = self.meta.get_map().await?;
        let live_nodes: Vec<NodeId> = self.meta.leases().await?.iter().map(|l| l.node).collect();
        let obs = self.liveness.observe(&map, &live_nodes, Instant::now());
        if !obs.changes.is_empty() && self.still_leads(&term) {
            for c in apply_liveness(&*self.meta, &obs.changes).await? {
                let (action, reason) = match c.to {
                    NodeState::Down => ("mark_down", "lease_gone"),
                    NodeState::Up => ("mark_up", "lease_back"),
                };
                let detail = match c.to {
                    NodeState::Down => {
                        format!("node {} has had no lease for {:?}", c.node, c.gone_for)
                    }
                    NodeState::Up => format!("node {} holds a lease again", c.node),
                };
                self.decisions.record_once(
                    format!("node {}", c.node),
                    Decision::now("node", action, reason, None, true, detail),
                );
            }
            map = self.meta.get_map().await?;
        }
        let down = map
            .nodes
            .values()
            .filter(|n| n.state == NodeState::Down)
            .count();
        let draining = map.nodes.values().filter(|n| n.draining).count();
        self.metrics.nodes_down.set(down as i64);
        self.metrics.nodes_draining.set(draining as i64);

        let (live, mut moved_at) = read_migrations(&*self.meta).await?;
        for (p, at) in &self.moved_at {
            let e = moved_at.entry(*p).or_insert(*at);
            *e = (*e).max(*at);
        }
        let snapshot = self.load.borrow().clone();
        let now_ms = crate::driver::now_ms();
        let input = PlanInput {
            map: &map,
            load: snapshot.as_ref().map(|s| &s.load),
            live: &live,
            moved_at: &moved_at,
            down: &obs.down,
            now_ms,
            config: &self.config,
            uncapped: true,
        };
        let whole = plan(&input);
        self.observe_plan(&whole);
        if !self.config.enabled {
            self.decisions.record_once(
                "cluster",
                Decision::now(DUTY, "no_move", "disabled", None, false, "--no-rebalance"),
            );
            return Ok(());
        }
        let round = plan(&PlanInput {
            uncapped: false,
            ..input
        });
        for m in &round.moves {
            self.metrics
                .moves_planned
                .get_or_create(&MoveLabel {
                    reason: m.reason.name(),
                })
                .inc();
        }
        for m in &round.moves {
            if !self.still_leads(&term) {
                return Ok(());
            }
            self.start_move(&map, m).await;
        }
        if !self.still_leads(&term) {
            return Ok(());
        }
        self.balance_replicas(&map, &live, &round, &obs.down)
            .await?;
        let stop = &round.stop;
        let detail = match round.peak_after() {
            Some(peak) => format!(
                "{}; busiest node at {:.3}x its share after the plan",
                stop.detail, peak
            ),
            None => stop.detail.clone(),
        };
        self.decisions.record_once(
            "cluster",
            Decision::now(DUTY, "no_move", stop.reason, None, false, detail),
        );
        self.moved_at
            .retain(|_, at| now_ms < at.saturating_add(self.config.move_cooldown_ms));
        Ok(())
    }

    /// Plans and requests this round's replica moves (see `replicas.rs`).
    async fn balance_replicas(
        &mut self,
        map: &keyway_map::PartitionMap,
        live: &[LiveMove],
        round: &Plan,
        down: &BTreeMap<NodeId, DownPhase>,
    ) -> Result<(), MetaError> {
        let moving = crate::replication::read_replica_moves(&*self.meta).await?;
        let live_replica: Vec<replicas::LiveReplicaMove> = moving
            .iter()
            .map(|m| replicas::LiveReplicaMove {
                partition: m.partition,
                from: m.from,
                to: m.to,
            })
            .collect();
        let migrating: std::collections::BTreeSet<PartitionId> = live
            .iter()
            .map(|m| m.partition)
            .chain(round.moves.iter().map(|m| m.partition))
            .collect();
        let plan = replicas::plan_replicas(&replicas::ReplicaInput {
            map,
            migrating: &migrating,
            live: &live_replica,
            down,
            config: &self.config,
            uncapped: false,
        });
        let label = MoveLabel {
            reason: "balance_replicas",
        };
        for m in &plan.moves {
            self.metrics.moves_planned.get_or_create(&label).inc();
            match crate::request_replica_move(&*self.meta, m.partition, m.from, m.to).await {
                Ok(mv) => {
                    self.metrics.moves_started.get_or_create(&label).inc();
                    self.decisions.record(Decision::now(
                        DUTY,
                        "move_replica",
                        "balance_replicas",
                        Some(m.partition),
                        true,
                        format!(
                            "replica move {}: replica node {} -> node {}",
                            mv.id, m.from, m.to
                        ),
                    ));
                }
                Err(err) => self.decisions.record(Decision::now(
                    DUTY,
                    "no_move_replica",
                    "move_refused",
                    Some(m.partition),
                    false,
                    format!("replica node {} -> node {}: {err}", m.from, m.to),
                )),
            }
        }
        self.decisions.record_once(
            "replicas",
            Decision::now(
                DUTY,
                "no_move_replica",
                plan.stop.reason,
                None,
                false,
                plan.stop.detail.clone(),
            ),
        );
        Ok(())
    }

    fn still_leads(&self, term: &Leadership) -> bool {
        self.seat.leading().as_ref() == Some(term)
    }

    /// Metrics and the per-node `down_past_grace` decisions of a whole plan.
    fn observe_plan(&self, whole: &Plan) {
        self.metrics
            .planned_bytes
            .set(i64::try_from(whole.moved_bytes()).unwrap_or(i64::MAX));
        let busiest = whole
            .nodes
            .iter()
            .filter(|n| n.role == Role::Balanced && n.share > 0.0)
            .map(|n| n.load / n.share)
            .fold(0.0, f64::max);
        self.metrics.busiest_over_share.set(busiest);
        let stuck: usize = whole.stuck.iter().map(|s| s.partitions.len()).sum();
        self.metrics.stuck_partitions.set(stuck as i64);
        for s in &whole.stuck {
            let some: Vec<String> = s.partitions.iter().take(8).map(|p| p.to_string()).collect();
            let detail = format!(
                "node {} is down past rebalance_down_grace_ms and owns {} partition(s) ({}) that \
                 cannot be moved: it holds the only copy. Restart it, or once it owns nothing \
                 remove it with keyway ctl decommission --force",
                s.node,
                s.partitions.len(),
                some.join(", ")
            );
            self.decisions.record_once(
                format!("node {}", s.node),
                Decision::now("node", "no_move", "down_past_grace", None, false, detail),
            );
        }
    }

    async fn start_move(&mut self, map: &keyway_map::PartitionMap, m: &PlannedMove) {
        let reason = m.reason.name();
        if crate::replication::is_replicated(map, m.partition) {
            return self.start_primary_move(m).await;
        }
        match crate::driver::request_move(&*self.meta, m.partition, m.to).await {
            Ok(rec) => {
                self.moved_at.insert(m.partition, crate::driver::now_ms());
                self.metrics
                    .moves_started
                    .get_or_create(&MoveLabel { reason })
                    .inc();
                let detail = format!(
                    "migration {}: node {} -> node {}, {} bytes ({} {:.0})",
                    rec.id, m.from, m.to, m.bytes, self.config.objective, m.load
                );
                self.decisions.record(Decision::now(
                    DUTY,
                    "move",
                    reason,
                    Some(m.partition),
                    true,
                    detail,
                ));
            }
            Err(err) => {
                let detail = format!("node {} -> node {}: {err}", m.from, m.to);
                self.decisions.record(Decision::now(
                    DUTY,
                    "no_move",
                    "move_refused",
                    Some(m.partition),
                    false,
                    detail,
                ));
            }
        }
    }
}

impl Loop {
    /// A replicated partition's primary moves by replica addition (the
    /// target added as a replica, caught up, switched to; no single-owner
    /// copy), like `keyway ctl move` of such a partition.
    async fn start_primary_move(&mut self, m: &PlannedMove) {
        let reason = m.reason.name();
        match crate::replication::request_primary_move(
            &*self.meta,
            m.partition,
            m.to,
            false,
            crate::replication::pmoves::DEFAULT_READS_FIRST_HOLD_MS,
            self.config.fail_back_window_ms,
        )
        .await
        {
            Ok(mv) => {
                self.moved_at.insert(m.partition, crate::driver::now_ms());
                self.metrics
                    .moves_started
                    .get_or_create(&MoveLabel { reason })
                    .inc();
                self.decisions.record(Decision::now(
                    DUTY,
                    "move_primary",
                    reason,
                    Some(m.partition),
                    true,
                    format!(
                        "primary move {}: node {} -> node {} by replica addition, {} bytes ({} {:.0})",
                        mv.id, m.from, m.to, m.bytes, self.config.objective, m.load
                    ),
                ));
            }
            Err(err) => self.decisions.record(Decision::now(
                DUTY,
                "no_move",
                "move_refused",
                Some(m.partition),
                false,
                format!("primary move node {} -> node {}: {err}", m.from, m.to),
            )),
        }
    }
}
