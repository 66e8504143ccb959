//! The leader's replication loop: every `interval_ms`, while the seat
//! leads, read the map and the leases, plan failovers ([`Failover`]) and
//! commit each promotion (one CAS per partition); take the next step of
//! every replica move ([`super::moves::step`]); re-read the map and plan
//! the membership changes ([`super::membership::plan_with`]) and commit each.
//! Every decision (and every decision not to act, once per change of
//! reason per partition) goes to the decision log.

use super::failover::{Failover, Promotion};
use super::membership::{self, MembershipChange, Recovery};
use super::moves::{self, ReplicaMove, Step};
use super::pmoves::PrimaryMove;
use super::{
    DUTY, GraceWait, RecoveryCopy, ReplicaMoveView, ReplicationConfig, ReplicationMetrics,
    ReplicationStatus, StateLabel,
};
use crate::decisions::{Decision, DecisionLog};
use crate::fencing::{FencingGate, Verdict};
use crate::metrics::{OutcomeLabel, ReasonLabel};
use crate::seat::SeatView;
use keyway_map::{MapChange, NodeId, OwnershipCondition, PartitionId, PartitionMap};
use keyway_meta::{Leadership, MapTxn, MetaError, MetaStore};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

pub(super) struct Loop {
    pub(super) meta: Arc<dyn MetaStore>,
    pub(super) seat: SeatView,
    pub(super) config: ReplicationConfig,
    pub(super) decisions: DecisionLog,
    pub(super) metrics: ReplicationMetrics,
    pub(super) status: ReplicationStatus,
    /// Primary moves whose switchover call has not answered yet.
    pub(super) switching: Arc<std::sync::Mutex<BTreeSet<u64>>>,
    failover: Failover,
    /// The down grace's clock per node (started when this leader first saw
    /// the lease gone, so a new leader waits a whole grace again).
    grace: FencingGate,
    /// The leadership the in-memory state belongs to.
    term: Option<Leadership>,
    /// The copies the nodes report, with progress (`copy_progress`).
    copies: crate::copies::CopyTracker,
}

/// What committing one CAS came to.
pub(super) enum Outcome {
    Committed,
    /// The row changed under the plan (condition failed): re-planned next round.
    Stale(String),
    /// This manager stopped leading before the CAS.
    NotLeading,
}

impl Loop {
    pub(super) fn new(
        meta: Arc<dyn MetaStore>,
        seat: SeatView,
        config: ReplicationConfig,
        decisions: DecisionLog,
        metrics: ReplicationMetrics,
        status: ReplicationStatus,
        copies: crate::copies::CopyTracker,
    ) -> Self {
        Loop {
            copies,
            failover: Failover::new(Duration::from_millis(config.failover_margin_ms)),
            grace: FencingGate::new(Duration::from_millis(config.down_grace_ms)),
            meta,
            seat,
            config,
            decisions,
            metrics,
            status,
            switching: Arc::default(),
            term: None,
        }
    }

    pub(super) async fn run(mut self, mut stop: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(Duration::from_millis(self.config.interval_ms));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                changed = stop.changed() => if changed.is_err() || *stop.borrow() { return },
            }
            if let Err(err) = self.round().await {
                tracing::debug!(%err, "replication: round failed; retrying next round");
            }
        }
    }

    async fn round(&mut self) -> Result<(), MetaError> {
        let leading = self.seat.leading();
        if leading != self.term {
            // A new leadership waits a whole margin again (never less).
            self.failover = Failover::new(Duration::from_millis(self.config.failover_margin_ms));
            self.grace = FencingGate::new(Duration::from_millis(self.config.down_grace_ms));
            self.term = leading.clone();
        }
        let Some(term) = leading else { return Ok(()) };
        let mut map = self.meta.get_map().await?;
        let live: BTreeSet<NodeId> = self.meta.leases().await?.iter().map(|l| l.node).collect();
        let now = Instant::now();
        let recovery = self.recovery(&map, &live, now);
        let plan = self.failover.plan(&map, &live, now);
        let mut offline = Vec::new();
        for w in &plan.waiting {
            if w.reason != "within_margin" {
                offline.push(w.partition.0);
            }
            self.decisions.record_once(
                format!("partition {}", w.partition),
                Decision::now(
                    DUTY,
                    "no_failover",
                    w.reason,
                    Some(w.partition),
                    false,
                    w.detail.clone(),
                ),
            );
        }
        self.metrics.offline.set(offline.len() as i64);
        if self.config.failover && !plan.promotions.is_empty() {
            for p in &plan.promotions {
                self.promote(&term, p).await?;
            }
            map = self.meta.get_map().await?;
        }
        // Read after the map: a replica move's record exists before its
        // target is added, so a row with the extra copy is never planned
        // without its move in view. Migration records are decoded only
        // when something may change (a replica move lives, or the
        // reconciler would act).
        let stored = self.meta.migrations().await?;
        let replica_moves: Vec<ReplicaMove> = stored.iter().filter_map(ReplicaMove::load).collect();
        let primary_moves: Vec<PrimaryMove> = stored.iter().filter_map(PrimaryMove::load).collect();
        // Both kinds hold one copy more than the factor on purpose.
        let replica_moving: BTreeSet<PartitionId> = replica_moves
            .iter()
            .map(|m| m.partition)
            .chain(primary_moves.iter().map(|m| m.partition))
            .collect();
        let first_plan = self.config.reconcile.then(|| {
            membership::plan_recovering(&map, &live, &BTreeSet::new(), &replica_moving, &recovery)
        });
        let decode = !replica_moves.is_empty()
            || !primary_moves.is_empty()
            || first_plan.as_ref().is_some_and(|p| !p.changes.is_empty());
        let migrating: BTreeSet<PartitionId> = if decode {
            live_migrations(&stored)
        } else {
            BTreeSet::new()
        };
        if !replica_moves.is_empty() {
            self.drive_moves(&term, &map, &replica_moves, &migrating)
                .await?;
            map = self.meta.get_map().await?;
        } else {
            self.status.update(|v| v.replica_moves.clear());
        }
        self.drive_primary_moves(&term, &map, &primary_moves, &migrating)
            .await?;
        if !primary_moves.is_empty() {
            map = self.meta.get_map().await?;
        }
        if let Some(mut plan) = first_plan {
            if decode {
                plan = membership::plan_recovering(
                    &map,
                    &live,
                    &migrating,
                    &replica_moving,
                    &recovery,
                );
            }
            let throttled: Vec<u64> = plan
                .skipped
                .iter()
                .filter(|s| s.reason == "recovery_throttled")
                .map(|s| s.partition.0)
                .collect();
            self.metrics
                .recovery_copies
                .get_or_create(&StateLabel { state: "throttled" })
                .set(throttled.len() as i64);
            self.status
                .update(|v| v.recovery.throttled_partitions = throttled);
            for s in &plan.skipped {
                self.decisions.record_once(
                    format!("partition {}", s.partition),
                    Decision::now(
                        DUTY,
                        "no_replica_change",
                        s.reason,
                        Some(s.partition),
                        false,
                        s.detail.clone(),
                    ),
                );
            }
            if !plan.changes.is_empty() {
                for c in &plan.changes {
                    self.change_membership(&term, c).await?;
                }
                map = self.meta.get_map().await?;
            }
        }
        self.recovery_view(&map, &live, &recovery, now);
        if self.config.auto_decommission_after_ms > 0 {
            self.auto_decommission(&map, &live, now).await?;
        }
        let under = under_replicated(&map);
        self.metrics.under_replicated.set(under as i64);
        self.status.update(|v| {
            v.under_replicated_partitions = under;
            v.offline_partitions = offline;
        });
        Ok(())
    }

    /// The re-replication inputs of this round: the nodes whose lease has
    /// been gone past the down grace (invariant 12: never sooner).
    fn recovery(&mut self, map: &PartitionMap, live: &BTreeSet<NodeId>, now: Instant) -> Recovery {
        Recovery {
            dead: membership::dead_nodes(&mut self.grace, map, live, now),
            max_copies_per_node: self.config.recovery_max_copies_per_node,
            max_copies: self.config.recovery_max_copies,
        }
    }

    /// Removes the nodes [`membership::auto_decommissions`] names, each as
    /// `keyway ctl decommission --force` would (it re-checks the lease,
    /// ownership and migrations against a fresh map).
    async fn auto_decommission(
        &self,
        map: &PartitionMap,
        live: &BTreeSet<NodeId>,
        now: Instant,
    ) -> Result<(), MetaError> {
        let after = Duration::from_millis(self.config.auto_decommission_after_ms);
        for n in membership::auto_decommissions(&self.grace, map, live, after, now) {
            if self.seat.leading().is_none() {
                return Ok(());
            }
            let key = format!("node {n}");
            match crate::rebalance::decommission(&*self.meta, n, true).await {
                Ok(_) => {
                    self.metrics.auto_decommissions.inc();
                    self.status
                        .update(|v| v.recovery.auto_decommissioned.push(n.0));
                    self.decisions.record(Decision::now(
                        DUTY,
                        "decommission",
                        "down_past_auto_decommission_after_ms",
                        None,
                        true,
                        format!(
                            "node {n}: no lease for over {} ms, owns nothing and holds no replica",
                            after.as_millis()
                        ),
                    ));
                }
                Err(crate::rebalance::NodeOpError::Meta(e)) => return Err(e),
                Err(e) => self.decisions.record_once(
                    key,
                    Decision::now(
                        DUTY,
                        "no_decommission",
                        "refused",
                        None,
                        false,
                        format!("node {n}: {e}"),
                    ),
                ),
            }
        }
        Ok(())
    }

    /// The recovery metrics and `/status` view from the map after this round.
    fn recovery_view(
        &mut self,
        map: &PartitionMap,
        live: &BTreeSet<NodeId>,
        recovery: &Recovery,
        now: Instant,
    ) {
        let live_v: Vec<NodeId> = live.iter().copied().collect();
        let mut waiting = Vec::new();
        for n in map.nodes.keys().filter(|n| !live.contains(n)) {
            if let Verdict::Wait(left) = self.grace.check(*n, &live_v, now) {
                let partitions = map.partitions.values().filter(|p| p.has_copy(*n)).count();
                self.decisions.record_once(
                    format!("node {n} recovery"),
                    Decision::now(
                        DUTY,
                        "no_re_replication",
                        "within_down_grace",
                        None,
                        false,
                        format!(
                            "node {n} holds no lease; its {partitions} copies are replaced only after \
                             the down grace ({} ms; {} ms left): no move on suspicion",
                            self.config.down_grace_ms,
                            left.as_millis()
                        ),
                    ),
                );
                waiting.push(GraceWait {
                    node: n.0,
                    left_ms: left.as_millis() as u64,
                    partitions,
                });
            }
        }
        let copies: Vec<RecoveryCopy> = map
            .partitions
            .values()
            .filter(|p| p.replicas.iter().any(|r| recovery.dead.contains(r)))
            .flat_map(|p| {
                p.replicas
                    .iter()
                    .filter(|r| !recovery.dead.contains(r) && !p.in_sync.contains(r))
                    .map(|r| RecoveryCopy {
                        partition: p.id.0,
                        target: r.0,
                        progress: self.copies.copy_progress(p.id, *r),
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        for n in &recovery.dead {
            let partitions = map.partitions.values().filter(|p| p.has_copy(*n)).count();
            if partitions > 0 {
                self.decisions.record_once(
                    format!("node {n} recovery"),
                    Decision::now(
                        DUTY,
                        "re_replicate",
                        "down_past_grace",
                        None,
                        true,
                        format!(
                            "node {n} held no lease for the down grace ({} ms): replacing its {partitions} \
                             copies on the survivors",
                            self.config.down_grace_ms
                        ),
                    ),
                );
            }
        }
        let waiting_partitions: usize = waiting.iter().map(|w| w.partitions).sum();
        let g = |state| {
            self.metrics
                .recovery_copies
                .get_or_create(&StateLabel { state })
        };
        g("in_flight").set(copies.len() as i64);
        g("waiting_for_grace").set(waiting_partitions as i64);
        let running: Vec<_> = self
            .copies
            .list()
            .into_iter()
            .filter(|c| c.running())
            .collect();
        let totals = crate::copies::totals(&running);
        self.metrics
            .copy_bytes_remaining
            .set(totals.bytes_remaining as i64);
        self.metrics
            .copy_rate_bytes_per_sec
            .set(totals.rate_bytes_per_sec as i64);
        self.status.update(|v| {
            v.recovery.dead_nodes = recovery.dead.iter().map(|n| n.0).collect();
            v.recovery.waiting_for_grace = waiting;
            v.recovery.copies_in_flight = copies;
            v.recovery.copies_running = running;
            v.recovery.copy_totals = totals;
        });
    }

    /// One step of every replica move (the oldest live one per partition
    /// acts; a later one is a duplicate), and the moves' `/status` view.
    async fn drive_moves(
        &self,
        term: &Leadership,
        map: &PartitionMap,
        list: &[ReplicaMove],
        migrating: &BTreeSet<PartitionId>,
    ) -> Result<(), MetaError> {
        let now = crate::driver::now_ms();
        let mut seen = BTreeSet::new();
        let mut views = Vec::new();
        for mv in list {
            let first = seen.insert(mv.partition);
            let step = moves::step(
                mv,
                map,
                first,
                migrating.contains(&mv.partition),
                now,
                self.config.replica_move_timeout_ms,
            );
            let what = format!(
                "replica move {}: partition {} node {} -> node {}",
                mv.id, mv.partition, mv.from, mv.to
            );
            match step {
                Step::Wait { why } => {
                    views.push(ReplicaMoveView {
                        intent: mv.clone(),
                        phase: moves::phase(mv, map),
                    });
                    self.decisions.record_once(
                        format!("replica move {}", mv.id),
                        Decision::now(
                            DUTY,
                            "replica_move_wait",
                            why,
                            Some(mv.partition),
                            false,
                            what,
                        ),
                    );
                }
                Step::Cas {
                    expected,
                    row,
                    action,
                    reason,
                } => {
                    views.push(ReplicaMoveView {
                        intent: mv.clone(),
                        phase: moves::phase(mv, map),
                    });
                    match self.commit(term, mv.partition, expected, &row).await? {
                        Outcome::Committed => {
                            let list = |v: &[NodeId]| v.iter().map(|n| n.0).collect::<Vec<_>>();
                            self.decisions.record(Decision::now(
                                DUTY,
                                action,
                                reason,
                                Some(mv.partition),
                                true,
                                format!(
                                    "{what}: epoch {}: replicas now {:?}, in sync {:?}",
                                    row.epoch,
                                    list(&row.replicas),
                                    list(&row.in_sync)
                                ),
                            ));
                        }
                        Outcome::Stale(why) => {
                            tracing::debug!(%why, "{what}: row changed; re-planned next round")
                        }
                        Outcome::NotLeading => return Ok(()),
                    }
                }
                Step::Finish { outcome, reason } => {
                    if self.seat.leading().as_ref() != Some(term) {
                        return Ok(());
                    }
                    match self.meta.delete_migration(mv.id, mv.generation).await {
                        Ok(()) => {}
                        Err(MetaError::MigrationConflict { .. }) => continue,
                        Err(e) => return Err(e),
                    }
                    self.metrics
                        .replica_moves
                        .get_or_create(&OutcomeLabel {
                            outcome: outcome.name(),
                        })
                        .inc();
                    self.status.update(|v| match outcome {
                        moves::MoveOutcome::Done => v.replica_moves_done += 1,
                        moves::MoveOutcome::Abandoned => v.replica_moves_abandoned += 1,
                    });
                    let took = now.saturating_sub(mv.started_at_ms);
                    self.decisions.record(Decision::now(
                        DUTY,
                        if outcome == moves::MoveOutcome::Done {
                            "replica_move_done"
                        } else {
                            "replica_move_abandoned"
                        },
                        reason,
                        Some(mv.partition),
                        true,
                        format!("{what}: {} after {took} ms", outcome.name()),
                    ));
                }
            }
        }
        self.status.update(|v| v.replica_moves = views);
        Ok(())
    }

    /// One CAS conditional on `(owner, epoch)`, only while still leading `term`.
    pub(super) async fn commit(
        &self,
        term: &Leadership,
        partition: PartitionId,
        expected: (NodeId, keyway_map::Epoch),
        row: &keyway_map::PartitionRecord,
    ) -> Result<Outcome, MetaError> {
        if self.seat.leading().as_ref() != Some(term) {
            return Ok(Outcome::NotLeading);
        }
        let txn = MapTxn {
            conditions: vec![OwnershipCondition {
                partition,
                expected: Some(expected),
            }],
            changes: vec![MapChange::UpsertPartition(row.clone())],
        };
        match self.meta.commit(txn).await {
            Ok(_) => Ok(Outcome::Committed),
            Err(e @ (MetaError::Conflict { .. } | MetaError::InvalidMap(_))) => {
                Ok(Outcome::Stale(e.to_string()))
            }
            Err(e) => Err(e),
        }
    }

    async fn promote(&self, term: &Leadership, p: &Promotion) -> Result<(), MetaError> {
        match self.commit(term, p.partition, p.expected, &p.row).await? {
            Outcome::Committed => {
                let took = p.lease_gone_since.elapsed();
                self.metrics
                    .failovers
                    .get_or_create(&ReasonLabel {
                        reason: "lease_expired",
                    })
                    .inc();
                self.metrics
                    .failover_duration_ms
                    .observe(took.as_secs_f64() * 1000.0);
                self.status.update(|v| v.failovers += 1);
                self.decisions.record(Decision::now(
                        DUTY,
                        "failover",
                        "lease_expired",
                        Some(p.partition),
                        true,
                        format!(
                            "node {} -> in-sync replica node {} at epoch {} ({} ms after its lease was first seen gone)",
                            p.from(),
                            p.to(),
                            p.row.epoch,
                            took.as_millis()
                        ),
                ));
            }
            Outcome::Stale(why) => self.decisions.record(Decision::now(
                DUTY,
                "no_failover",
                "row_changed",
                Some(p.partition),
                false,
                format!("re-planned next round: {why}"),
            )),
            Outcome::NotLeading => {}
        }
        Ok(())
    }

    async fn change_membership(
        &self,
        term: &Leadership,
        c: &MembershipChange,
    ) -> Result<(), MetaError> {
        match self.commit(term, c.partition, c.expected, &c.row).await? {
            Outcome::Committed => {
                self.metrics.replicas_added.inc_by(c.added.len() as u64);
                self.metrics.replicas_removed.inc_by(c.removed.len() as u64);
                if c.reason == "dead_replica_replaced" {
                    self.metrics.recovered.inc_by(c.removed.len() as u64);
                    self.status
                        .update(|v| v.recovery.recovered_replicas += c.removed.len() as u64);
                }
                self.status.update(|v| {
                    v.replicas_added += c.added.len() as u64;
                    v.replicas_removed += c.removed.len() as u64;
                });
                let list = |v: &[NodeId]| v.iter().map(|n| n.0).collect::<Vec<_>>();
                // A recovery's removal says what the replacement's copy cost.
                let cost = match c.reason {
                    "dead_replica_replaced" => self.copy_costs(c.partition, &c.row.in_sync),
                    _ => String::new(),
                };
                self.decisions.record(Decision::now(
                    DUTY,
                    if c.added.is_empty() {
                        "remove_replica"
                    } else {
                        "add_replica"
                    },
                    c.reason,
                    Some(c.partition),
                    true,
                    format!(
                        "epoch {}: added {:?}, removed {:?}; replicas now {:?}{cost}",
                        c.row.epoch,
                        list(&c.added),
                        list(&c.removed),
                        list(&c.row.replicas)
                    ),
                ));
            }
            Outcome::Stale(why) => self.decisions.record(Decision::now(
                DUTY,
                "no_replica_change",
                "row_changed",
                Some(c.partition),
                false,
                format!("re-planned next round: {why}"),
            )),
            Outcome::NotLeading => {}
        }
        Ok(())
    }
}

impl Loop {
    /// "; copy to node N: S bytes sent, W written in D ms (R B/s)" for each
    /// of `to` whose finished catch-up of `partition` a node reported.
    fn copy_costs(&self, partition: PartitionId, to: &[NodeId]) -> String {
        let mut out = String::new();
        for n in to {
            if let Some(p) = self.copies.copy_progress(partition, *n)
                && p.outcome == keyway_peer::copies::CopyOutcome::Done
            {
                out.push_str(&format!(
                    "; copy to node {}: {} bytes sent, {} written in {} ms ({:.0} B/s)",
                    n.0,
                    p.bytes_sent,
                    p.bytes_written,
                    p.duration_ms,
                    p.rate_bytes_per_sec.unwrap_or(0.0)
                ));
            }
        }
        out
    }
}

/// The partitions with a non-terminal migration among `stored` (replica
/// moves and unreadable records skipped).
fn live_migrations(stored: &[keyway_meta::StoredMigration]) -> BTreeSet<PartitionId> {
    stored
        .iter()
        .filter(|s| !moves::is_replica_move(s))
        .filter_map(|s| crate::driver::load(s).ok())
        .filter(|r| !r.state.is_terminal())
        .map(|r| r.partition_id())
        .collect()
}

/// Partitions with fewer in-sync copies than their wanted copy count.
pub fn under_replicated(map: &PartitionMap) -> usize {
    map.partitions
        .values()
        .filter(|p| p.in_sync_copies() < membership::wanted_copies(map, p))
        .count()
}
