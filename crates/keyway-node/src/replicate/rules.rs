//! The in-sync rules of the primary, as pure logic: events in, commands out
//! (no I/O, no clock: every event carries `now`).
//!
//! The primary of a partition p keeps, for each replica r of p, a
//! [`ReplicaState`], and for each reply that waits on replication a
//! [`Waiter`] (the write's seq, or for a read the last seq at the read, and
//! the replicas it still waits for). The shell (`mod.rs`) feeds events
//! (a reply queued, a stream acknowledged a seq, time passed, a copy
//! finished, a compare-and-set committed or failed, a map installed) and
//! executes the commands ([`Command`]: release a reply, run a CAS, start a
//! copy).
//!
//! The rules (invariant 9, and DESIGN12 "Who changes the configuration"):
//! - **Waited-for** replicas of p are those `InSync`, `Joining`, `Adding`,
//!   `Removing`, or `Removed` whose read lease may still run. A reply of p
//!   waits for each of them (and for every replica the map's in-sync set
//!   named at admission that these rules do not know yet) until its stream
//!   acknowledged the reply's seq.
//! - **Lag timeout**: a reply waiting `lag_timeout` on an `InSync` replica
//!   r makes the primary CAS r out (`Removing`); nothing waiting on r is
//!   released until that CAS committed *and* r's read lease (the last
//!   answered call's arrival + `read_lease`) has passed (`Removed{until}`).
//!   A *joining* replica is simply no longer waited for (no CAS: it was
//!   never in the map's in-sync set), and retried after a back-off.
//! - **Split and merge children** inherit the read leases of the partitions
//!   they replace: a replica that may still read one of them on a lease and
//!   that the child does not keep in sync is `Removed{until}` in the child.
//! - **Grow**: a copied replica joins at s0 (the last seq when joining
//!   began, read under the same lock new replies read the waited-for set
//!   under); once its stream acked ≥ s0 it holds every acknowledged write
//!   and is CASed in (`Adding`, then `InSync`).
//! - **Restart**: a partition first seen with in-sync replicas whose stream
//!   positions are unknown (this node restarted, or bootstrap) has them all
//!   removed in one CAS (reason `primary_restarted`); replies wait meanwhile.
//! - **Switchover** (the one exception to the restart rule): the old
//!   primary of a switchover to this node stays `InSync`, no CAS, no copy,
//!   in an [`Era`] (`era.rs` says when and why that is safe).
//! - A failed CAS never releases a reply as success: the replies that
//!   waited on its outcome are released with `ok: false` (the shell answers
//!   "replication not confirmed"), and so are the replies of a partition
//!   this node stopped owning, or every waiting reply once the node's lease
//!   lapsed.
//!
//! One CAS per partition is in flight at a time.

pub use super::era::{ERA_EPOCH_LIMIT, ERA_SEQ_BITS, ERA_SEQ_LIMIT, Era, Prior};
pub use super::state::{CasChange, Command, Reason, ReplicaState, WaiterId};
use keyway_map::{Epoch, NodeId, PartitionId};
use keyway_storage::{KeyRange, Seq};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// One owned partition as a map installed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub id: PartitionId,
    pub epoch: Epoch,
    /// The storage range.
    pub range: KeyRange,
    pub replicas: Vec<NodeId>,
    pub in_sync: Vec<NodeId>,
    /// The partition in the previously installed map, if another node owned it.
    pub prior: Option<Prior>,
    /// `ReplicaSide::applied_seq` of the partition at this install: it
    /// changes only while another node owns the partition and streams it
    /// here, so a change between two installs that both show this node as
    /// owner means it lost the partition in between (in a map the driver
    /// skipped): what these rules know of it is void.
    pub replica_applied: Option<Seq>,
}

/// One owned partition with replicas.
#[derive(Clone, Debug)]
pub struct Part {
    pub epoch: Epoch,
    pub range: KeyRange,
    /// Replicas by node; a replica no longer listed in the map stays here
    /// (as `Removed`) until its read lease passed.
    pub replicas: BTreeMap<NodeId, ReplicaState>,
    /// Still listed in the map's `replicas`.
    listed: BTreeSet<NodeId>,
    /// Replicas whose position in this node's log is unknown (in sync when
    /// this node started): their stream's acknowledgements say nothing
    /// about this partition until they were copied again.
    unknown: BTreeSet<NodeId>,
    /// Old primaries kept in sync by a switchover (shipped stamped).
    pub eras: BTreeMap<NodeId, Era>,
    /// [`Row::replica_applied`] when this part was installed.
    replica_applied: Option<Seq>,
    cas_pending: bool,
}

impl Part {
    /// Up to where `replica` holds this partition's records, given its
    /// stream's acknowledged seq.
    fn covered(&self, replica: NodeId, acked: Seq) -> Seq {
        self.eras.get(&replica).map_or(acked, |e| e.covered)
    }

    /// An era ends once its replica is not shipped any more (a copy cleans).
    fn drop_ended_eras(&mut self) {
        let replicas = &self.replicas;
        self.eras
            .retain(|r, _| replicas.get(r).is_some_and(|s| s.shipped()));
    }
}

/// One reply waiting on replication.
#[derive(Clone, Debug)]
pub struct Waiter {
    pub partition: PartitionId,
    pub seq: Seq,
    pub since: Instant,
    /// Replicas still to acknowledge `seq`.
    pub waits: BTreeSet<NodeId>,
}

/// The limits the rules apply.
#[derive(Clone, Copy, Debug)]
pub struct RulesConfig {
    pub lag_timeout: Duration,
    pub read_lease: Duration,
    /// Pause before a failed or dropped catch-up is tried again.
    pub retry_backoff: Duration,
}

/// The primary's replication state (see the module docs).
pub struct Rules {
    cfg: RulesConfig,
    /// Until then a replica may hold a read lease granted before this
    /// process started (its last grant is unknown).
    started_lease_until: Instant,
    parts: BTreeMap<PartitionId, Part>,
    acked: BTreeMap<NodeId, Seq>,
    /// Per replica, until when it may serve reads on leases it got from us.
    lease_until: BTreeMap<NodeId, Instant>,
    waiters: BTreeMap<WaiterId, Waiter>,
    next_waiter: WaiterId,
    /// Replicas whose stream lost its place: not acked any more.
    lost: BTreeSet<NodeId>,
    /// The partitions this node owned in the last map installed.
    seen: BTreeSet<PartitionId>,
    /// Old primaries kept in sync by a switchover, in all (a metric).
    kept_in_sync: u64,
    /// Partitions this node is migrating away (it runs their push): no
    /// replica is CASed *into* their in-sync set meanwhile, since every CAS
    /// moves the epoch and a migration's flip (and its target's
    /// registration) is conditional on the epoch it was created at. A
    /// lagging replica is still CASed out (writes must not wait forever);
    /// that migration then aborts and is retried. The flip empties the
    /// in-sync set anyway.
    migrating: BTreeSet<PartitionId>,
    /// Partitions in a switchover from this node: no read lease vouched
    /// (see `stop_switch_leases`). Left when the switchover fails or the
    /// partition is not owned here any more.
    switching: BTreeSet<PartitionId>,
}

impl Rules {
    pub fn new(cfg: RulesConfig, started: Instant) -> Self {
        assert!(cfg.read_lease < cfg.lag_timeout);
        Rules {
            cfg,
            started_lease_until: started + cfg.read_lease,
            parts: BTreeMap::new(),
            acked: BTreeMap::new(),
            lease_until: BTreeMap::new(),
            waiters: BTreeMap::new(),
            next_waiter: 1,
            lost: BTreeSet::new(),
            seen: BTreeSet::new(),
            kept_in_sync: 0,
            migrating: BTreeSet::new(),
            switching: BTreeSet::new(),
        }
    }

    pub fn parts(&self) -> &BTreeMap<PartitionId, Part> {
        &self.parts
    }

    pub fn waiters(&self) -> &BTreeMap<WaiterId, Waiter> {
        &self.waiters
    }

    /// The last seq the replica's stream acknowledged.
    pub fn acked(&self, replica: NodeId) -> Seq {
        self.acked.get(&replica).copied().unwrap_or(0)
    }

    /// Up to where `replica` holds `partition`'s records: its stream's
    /// acknowledged seq, or its era's `covered`.
    pub fn acked_for(&self, partition: PartitionId, replica: NodeId) -> Seq {
        let acked = self.acked(replica);
        self.parts
            .get(&partition)
            .map_or(acked, |p| p.covered(replica, acked))
    }

    /// How many old primaries switchovers kept in sync here so far.
    pub fn kept_in_sync(&self) -> u64 {
        self.kept_in_sync
    }

    /// The eras of the partitions shipped to `replica` (read with
    /// [`Self::shipped_to`], under the same lock).
    pub fn eras_to(&self, replica: NodeId) -> Vec<(PartitionId, Era)> {
        self.parts
            .iter()
            .filter_map(|(id, p)| p.eras.get(&replica).map(|e| (*id, *e)))
            .collect()
    }

    /// Where `replica`'s stream must read from at the latest: the lowest
    /// era `covered` below its acknowledged seq.
    pub fn rewind_to(&self, replica: NodeId) -> Option<Seq> {
        let acked = self.acked(replica);
        self.parts
            .values()
            .filter_map(|p| p.eras.get(&replica))
            .map(|e| e.covered)
            .filter(|c| *c < acked)
            .min()
    }

    fn lease_end(&self, replica: NodeId) -> Instant {
        self.lease_until
            .get(&replica)
            .copied()
            .unwrap_or(self.started_lease_until)
            .max(self.started_lease_until)
    }

    /// Whether a reply of `partition` must wait (some replica is waited for).
    pub fn has_waited(&self, partition: PartitionId, now: Instant) -> bool {
        self.parts
            .get(&partition)
            .is_some_and(|p| p.replicas.values().any(|s| s.waited(now)))
    }

    /// The partitions the replica's stream ships: (id, epoch, range, vouch).
    pub fn shipped_to(&self, replica: NodeId) -> Vec<(PartitionId, Epoch, KeyRange, bool)> {
        self.parts
            .iter()
            .filter_map(|(id, p)| {
                let s = p.replicas.get(&replica)?;
                s.shipped().then(|| {
                    // No read lease for a partition being migrated away:
                    // its flip empties the in-sync set without waiting for
                    // leases (see `stop_read_leases`).
                    let vouch = *s == ReplicaState::InSync
                        && !self.lost.contains(&replica)
                        && !self.migrating.contains(id)
                        && !self.switching.contains(id);
                    (*id, p.epoch, p.range.clone(), vouch)
                })
            })
            .collect()
    }

    /// Every node that is (or is still treated as) a replica of a partition here.
    pub fn replica_nodes(&self) -> BTreeSet<NodeId> {
        self.parts
            .values()
            .flat_map(|p| p.replicas.keys().copied())
            .collect()
    }

    /// A reply of `partition` at `seq` was released by this node's
    /// durability mode. It waits for every waited-for replica and every one
    /// of `in_sync_at_admission` these rules do not know as confirmed out.
    pub fn queue(
        &mut self,
        partition: PartitionId,
        seq: Seq,
        in_sync_at_admission: &[NodeId],
        now: Instant,
    ) -> (WaiterId, Vec<Command>) {
        let id = self.next_waiter;
        self.next_waiter += 1;
        let part = self.parts.get(&partition);
        // Only the replicas still short of `seq` go in (an empty set does not
        // allocate: every read, and a write whose replicas are ahead, pays
        // no allocation here).
        let pending = |r: &NodeId| !self.satisfied(partition, *r, seq);
        let mut waits = BTreeSet::new();
        if let Some(p) = part {
            waits.extend(
                p.replicas
                    .iter()
                    .filter(|(r, s)| s.waited(now) && pending(r))
                    .map(|(r, _)| *r),
            );
        }
        // The map at admission may be newer than the last one seen here (a
        // partition first seen at start, a split child): wait for its in-sync
        // replicas until these rules know the partition.
        if part.is_none() && !self.seen.contains(&partition) {
            waits.extend(in_sync_at_admission.iter().copied().filter(pending));
        }
        if waits.is_empty() {
            return (
                id,
                vec![Command::Release {
                    waiter: id,
                    ok: true,
                }],
            );
        }
        self.waiters.insert(
            id,
            Waiter {
                partition,
                seq,
                since: now,
                waits,
            },
        );
        (id, Vec::new())
    }

    /// Whether `replica`'s stream holds `partition`'s records up to `seq`.
    fn satisfied(&self, partition: PartitionId, replica: NodeId, seq: Seq) -> bool {
        let Some(p) = self.parts.get(&partition) else {
            return false;
        };
        !p.unknown.contains(&replica)
            && !self.lost.contains(&replica)
            && p.covered(replica, self.acked(replica)) >= seq
    }

    /// The replica's stream applied (durably) every record up to `seq`; the
    /// answer arrived at `reply_at`.
    pub fn stream_acked(&mut self, replica: NodeId, seq: Seq, reply_at: Instant) -> Vec<Command> {
        self.stream_batch_acked(replica, seq, seq, &[], reply_at)
    }

    /// The replica's stream applied (durably) a batch that examined the
    /// records after `from` up to `examined` and shipped the partitions of
    /// `eras` (by era epoch) stamped; the answer arrived at `reply_at`.
    pub fn stream_batch_acked(
        &mut self,
        replica: NodeId,
        from: Seq,
        examined: Seq,
        eras: &[(PartitionId, Epoch)],
        reply_at: Instant,
    ) -> Vec<Command> {
        let lease = reply_at + self.cfg.read_lease;
        let end = self.lease_until.entry(replica).or_insert(lease);
        *end = (*end).max(lease);
        if self.lost.contains(&replica) {
            return Vec::new();
        }
        let acked = self.acked.entry(replica).or_insert(0);
        *acked = (*acked).max(examined);
        let acked = *acked;
        // An era is covered on by a batch that listed it and started within it.
        for (pid, epoch) in eras {
            if let Some(e) = self
                .parts
                .get_mut(pid)
                .and_then(|p| p.eras.get_mut(&replica))
                && e.epoch == *epoch
                && from <= e.covered
            {
                e.covered = e.covered.max(examined);
            }
        }
        let parts = &self.parts;
        let mut out = release_in(&mut self.waiters, |w| {
            let covered = parts
                .get(&w.partition)
                .filter(|p| !p.unknown.contains(&replica))
                .map(|p| p.covered(replica, acked));
            if covered.is_some_and(|c| w.seq <= c) {
                w.waits.remove(&replica);
            }
        });
        out.extend(self.check_joins(replica));
        out
    }

    /// Stops vouching read leases for `partition` (it is about to be cut
    /// over: a migration's flip removes every replica from the in-sync set
    /// by a CAS this node does not make, so nothing waits for their leases
    /// there) and returns when the last lease granted for it ends, if it
    /// has replicas here. Each grant is anchored at the replica's answer
    /// the call echoes, which arrived here, and was taken into `lease_end`
    /// (`stream_batch_acked`), before the call left (with several calls in
    /// flight too: a call echoes only an answer already taken), so
    /// `lease_end` (the last answer's arrival + `read_lease`) already
    /// covers a vouching call still in flight.
    pub fn stop_read_leases(&mut self, partition: PartitionId) -> Option<Instant> {
        self.migrating.insert(partition);
        let p = self.parts.get(&partition)?;
        p.replicas.keys().map(|r| self.lease_end(*r)).max()
    }

    /// A switchover of `partition` to `target` is about to fence it: stop
    /// vouching its read leases and return when the last one granted to a
    /// replica other than `target` ends (see `stop_read_leases` for why
    /// `lease_end` covers a call in flight). The switchover's CAS takes
    /// every such replica out of the in-sync set (or keeps it only with
    /// the new owner's rules waiting for it), and the new owner does not
    /// know the leases granted here, so they must have ended before it can
    /// acknowledge anything.
    pub fn stop_switch_leases(
        &mut self,
        partition: PartitionId,
        target: NodeId,
    ) -> Option<Instant> {
        self.switching.insert(partition);
        let p = self.parts.get(&partition)?;
        p.replicas
            .keys()
            .filter(|r| **r != target)
            .map(|r| self.lease_end(*r))
            .max()
    }

    /// The switchover of `partition` failed: its read leases resume.
    pub fn resume_switch_leases(&mut self, partition: PartitionId) {
        self.switching.remove(&partition);
    }

    /// The partitions this node now runs a migration push for. A partition
    /// that stopped migrating gets its caught-up joiners CASed in.
    pub fn set_migrating(&mut self, migrating: BTreeSet<PartitionId>) -> Vec<Command> {
        if migrating == self.migrating {
            return Vec::new();
        }
        let ended = self.migrating.difference(&migrating).next().is_some();
        self.migrating = migrating;
        if !ended {
            return Vec::new();
        }
        let replicas: Vec<NodeId> = self.acked.keys().copied().collect();
        replicas
            .into_iter()
            .flat_map(|r| self.check_joins(r))
            .collect()
    }

    /// CASes in every joining copy on `replica` that its stream caught up
    /// with, except in partitions being migrated away.
    fn check_joins(&mut self, replica: NodeId) -> Vec<Command> {
        let acked = self.acked(replica);
        if self.lost.contains(&replica) {
            return Vec::new();
        }
        let mut out = Vec::new();
        for (pid, p) in &mut self.parts {
            if p.cas_pending || self.migrating.contains(pid) {
                continue;
            }
            if let Some(s) = p.replicas.get_mut(&replica)
                && let ReplicaState::Joining { s0 } = s
                && acked >= *s0
            {
                *s = ReplicaState::Adding;
                p.cas_pending = true;
                out.push(Command::Cas {
                    partition: *pid,
                    epoch: p.epoch,
                    change: CasChange::Add { replica },
                });
            }
        }
        out
    }

    /// Applies `f` to every waiter and releases (ok) those left waiting on nobody.
    fn release_where(&mut self, f: impl FnMut(&mut Waiter)) -> Vec<Command> {
        release_in(&mut self.waiters, f)
    }

    /// Stops `partition`'s waiters waiting for `replica` (it is confirmed out).
    fn excuse(&mut self, partition: PartitionId, replica: NodeId) -> Vec<Command> {
        self.release_where(|w| {
            if w.partition == partition {
                w.waits.remove(&replica);
            }
        })
    }

    /// Fails (ok: false) every waiter of `partition` for which `pick` holds.
    fn fail_where(&mut self, pick: impl Fn(&Waiter) -> bool) -> Vec<Command> {
        let mut out = Vec::new();
        self.waiters.retain(|id, w| {
            if pick(w) {
                out.push(Command::Release {
                    waiter: *id,
                    ok: false,
                });
                false
            } else {
                true
            }
        });
        out
    }

    /// Time passed; `lease_valid`: this node's own lease.
    pub fn tick(&mut self, now: Instant, lease_valid: bool) -> Vec<Command> {
        if !lease_valid {
            // Nobody can CAS a lagging replica out now, and a failover
            // may follow: every waiting reply's outcome is unknown.
            return self.fail_where(|_| true);
        }
        let mut out = Vec::new();
        // Lagging replicas: the oldest unsatisfied reply waited too long.
        let mut overdue: BTreeSet<(PartitionId, NodeId)> = BTreeSet::new();
        for w in self.waiters.values() {
            if now.saturating_duration_since(w.since) >= self.cfg.lag_timeout {
                overdue.extend(w.waits.iter().map(|r| (w.partition, *r)));
            }
        }
        let mut excused = Vec::new();
        for (pid, r) in overdue {
            let Some(p) = self.parts.get_mut(&pid) else {
                continue;
            };
            match p.replicas.get_mut(&r) {
                Some(s @ ReplicaState::InSync) => {
                    *s = ReplicaState::Removing {
                        reason: Reason::LagTimeout,
                        in_flight: false,
                    }
                }
                Some(s @ ReplicaState::Joining { .. }) => {
                    *s = ReplicaState::Idle {
                        retry_at: now + self.cfg.retry_backoff,
                    };
                    excused.push((pid, r));
                }
                _ => {}
            }
        }
        for (pid, r) in excused {
            out.extend(self.excuse(pid, r));
        }
        // Removed replicas whose lease passed; idle ones due for a copy.
        let mut expired = Vec::new();
        for (pid, p) in &mut self.parts {
            for (r, s) in p.replicas.iter_mut() {
                match s {
                    ReplicaState::Removed { until } if now >= *until => {
                        *s = ReplicaState::Idle { retry_at: now };
                        p.unknown.remove(r);
                        expired.push((*pid, *r));
                    }
                    ReplicaState::Idle { retry_at }
                        if now >= *retry_at && p.listed.contains(r) && !self.lost.contains(r) =>
                    {
                        *s = ReplicaState::Copying { shipped: false };
                        out.push(Command::StartCopy {
                            partition: *pid,
                            replica: *r,
                        });
                    }
                    _ => {}
                }
            }
            p.replicas
                .retain(|r, s| p.listed.contains(r) || s.waited(now));
            p.drop_ended_eras();
        }
        for (pid, r) in expired {
            out.extend(self.excuse(pid, r));
        }
        out.extend(self.issue_removals());
        out
    }

    /// One CAS per partition removing every `Removing` replica not yet in flight.
    fn issue_removals(&mut self) -> Vec<Command> {
        let mut out = Vec::new();
        for (pid, p) in &mut self.parts {
            if p.cas_pending {
                continue;
            }
            let mut replicas = Vec::new();
            let mut reason = None;
            for (r, s) in p.replicas.iter_mut() {
                if let ReplicaState::Removing {
                    reason: why,
                    in_flight,
                } = s
                    && !*in_flight
                {
                    *in_flight = true;
                    replicas.push(*r);
                    reason = Some(reason.map_or(*why, |old: Reason| old.min(*why)));
                }
            }
            if let Some(reason) = reason {
                p.cas_pending = true;
                out.push(Command::Cas {
                    partition: *pid,
                    epoch: p.epoch,
                    change: CasChange::Remove { replicas, reason },
                });
            }
        }
        out
    }

    /// A map was installed; `owned` = every partition this node owns in it
    /// (with or without replicas).
    pub fn map_installed(&mut self, owned: &[Row], now: Instant) -> Vec<Command> {
        let mut out = Vec::new();
        let keep: BTreeSet<PartitionId> = owned.iter().map(|r| r.id).collect();
        let gone: Vec<PartitionId> = self
            .parts
            .keys()
            .filter(|id| !keep.contains(id))
            .copied()
            .collect();
        let old: BTreeMap<PartitionId, Part> = gone
            .iter()
            .filter_map(|id| self.parts.remove(id).map(|p| (*id, p)))
            .collect();
        self.switching.retain(|id| keep.contains(id));
        if !old.is_empty() {
            // Not the owner any more: what waited on its replicas is unknown.
            out.extend(self.fail_where(|w| old.contains_key(&w.partition)));
        }
        // Owned now and before, but another node owned it in between (see
        // `Row::replica_applied`): forgotten, so first sight applies (and
        // not inherited from itself), and what waited is unknown.
        let relost: BTreeSet<PartitionId> = owned
            .iter()
            .filter(|r| {
                self.parts
                    .get(&r.id)
                    .is_some_and(|p| p.replica_applied != r.replica_applied)
            })
            .map(|r| r.id)
            .collect();
        if !relost.is_empty() {
            self.parts.retain(|id, _| !relost.contains(id));
            out.extend(self.fail_where(|w| relost.contains(&w.partition)));
        }
        // The parents as they were before this map (a split's parent row may
        // come first and narrow its range).
        let before = self.parts.clone();
        for row in owned {
            let lease = |r: &NodeId| self.lease_end(*r).max(now);
            let inherited = |r: &NodeId| -> Option<Option<Era>> {
                // A split or merge child of partitions r was in sync for, in
                // one era (or none) for all of them.
                let mut eras = before
                    .values()
                    .chain(old.values())
                    .filter(|p| {
                        overlaps(&p.range, &row.range)
                            && p.replicas.get(r) == Some(&ReplicaState::InSync)
                    })
                    .map(|p| p.eras.get(r).copied());
                let first = eras.next()?;
                eras.all(|e| e == first).then_some(first)
            };
            let known = self.parts.get(&row.id);
            if known.is_some_and(|p| p.epoch == row.epoch) {
                continue;
            }
            let switched = match known {
                None => row.switchover_era(),
                Some(_) => None,
            };
            let mut eras = known.map(|p| p.eras.clone()).unwrap_or_default();
            let mut kept = 0;
            let mut states: BTreeMap<NodeId, ReplicaState> =
                known.map(|p| p.replicas.clone()).unwrap_or_default();
            let mut next = BTreeMap::new();
            let mut unknown = known.map(|p| p.unknown.clone()).unwrap_or_default();
            for r in &row.replicas {
                let in_sync = row.in_sync.contains(r);
                let state = match (states.remove(r), in_sync) {
                    (Some(ReplicaState::InSync | ReplicaState::Adding), true) => {
                        ReplicaState::InSync
                    }
                    (Some(s @ ReplicaState::Removing { .. }), true) => s,
                    (Some(ReplicaState::Joining { .. }), true) => ReplicaState::InSync,
                    (None, true) if switched.is_some() => {
                        if let Some((_, era)) = switched {
                            eras.insert(*r, era);
                            kept += 1;
                        }
                        ReplicaState::InSync
                    }
                    (None, true) if inherited(r).is_some() => {
                        if let Some(Some(era)) = inherited(r) {
                            eras.insert(*r, era);
                        }
                        ReplicaState::InSync
                    }
                    (_, true) => {
                        unknown.insert(*r);
                        ReplicaState::Removing {
                            reason: Reason::PrimaryRestarted,
                            in_flight: false,
                        }
                    }
                    (Some(ReplicaState::InSync | ReplicaState::Removing { .. }), false) => {
                        ReplicaState::Removed { until: lease(r) }
                    }
                    (Some(ReplicaState::Adding), false) => ReplicaState::Idle {
                        retry_at: now + self.cfg.retry_backoff,
                    },
                    (Some(s), false) => s,
                    (None, false) => ReplicaState::Idle { retry_at: now },
                };
                next.insert(*r, state);
            }
            // A replica that may still answer reads on a lease this node
            // granted, in this partition as known (no longer listed) or in
            // one this row replaces (a split's parent, a merge's halves),
            // and that the row does not keep waited for: waited for until
            // that lease passed. Without the parents, a node that installed
            // a child and a later removal in one step (its map watch
            // reconnected) forgot the replica, and released writes it lacked
            // while it still answered reads of the parent (nemesis seeds
            // 37008, 40004).
            let parents = before
                .iter()
                .chain(old.iter())
                .filter(|(id, p)| **id != row.id && overlaps(&p.range, &row.range))
                .flat_map(|(_, p)| p.replicas.iter().map(|(r, s)| (*r, s.clone())));
            for (r, s) in states.into_iter().chain(parents) {
                let until = match s {
                    ReplicaState::InSync | ReplicaState::Removing { .. } => lease(&r),
                    ReplicaState::Removed { until } => until,
                    _ => continue,
                };
                if next.get(&r).is_none_or(|s| !s.waited(now)) {
                    next.insert(r, ReplicaState::Removed { until });
                }
            }
            let cas_pending = known.is_some_and(|p| p.cas_pending);
            let mut part = Part {
                epoch: row.epoch,
                range: row.range.clone(),
                replicas: next,
                listed: row.replicas.iter().copied().collect(),
                unknown,
                eras,
                replica_applied: row.replica_applied,
                cas_pending,
            };
            part.drop_ended_eras();
            self.parts.insert(row.id, part);
            self.kept_in_sync += kept;
        }
        self.parts.retain(|_, p| !p.replicas.is_empty());
        self.seen = keep.clone();
        // Waiters of a partition not owned any more: unknown outcome.
        out.extend(self.fail_where(|w| !keep.contains(&w.partition)));
        // Replicas no longer waited for release their waiters; so does a
        // partition without replicas.
        let parts = &self.parts;
        out.extend(release_in(&mut self.waiters, |w| {
            match parts.get(&w.partition) {
                None => w.waits.clear(),
                Some(p) => w
                    .waits
                    .retain(|r| p.replicas.get(r).is_some_and(|s| s.waited(now))),
            }
        }));
        out.extend(self.issue_removals());
        out
    }

    /// The CAS of `partition` expected at `epoch` committed (`ok`) or not.
    pub fn cas_result(
        &mut self,
        partition: PartitionId,
        epoch: Epoch,
        change: &CasChange,
        ok: bool,
        now: Instant,
    ) -> Vec<Command> {
        let lease_ends: BTreeMap<NodeId, Instant> = self
            .replica_nodes()
            .into_iter()
            .map(|r| (r, self.lease_end(r).max(now)))
            .collect();
        let Some(p) = self.parts.get_mut(&partition) else {
            return Vec::new();
        };
        p.cas_pending = false;
        let mut out = Vec::new();
        match (change, ok) {
            (CasChange::Remove { replicas, .. }, true) => {
                if p.epoch == epoch {
                    p.epoch = Epoch(epoch.0 + 1);
                }
                for r in replicas {
                    if let Some(s) = p.replicas.get_mut(r)
                        && matches!(s, ReplicaState::Removing { .. })
                    {
                        *s = ReplicaState::Removed {
                            until: lease_ends.get(r).copied().unwrap_or(now),
                        };
                    }
                }
            }
            (CasChange::Remove { replicas, .. }, false) => {
                // Still in the map's in-sync set: what waited on them is unknown.
                for r in replicas {
                    if let Some(ReplicaState::Removing { in_flight, .. }) = p.replicas.get_mut(r) {
                        *in_flight = false;
                    }
                }
                let rs: BTreeSet<NodeId> = replicas.iter().copied().collect();
                out.extend(self.fail_where(|w| {
                    w.partition == partition && w.waits.iter().any(|r| rs.contains(r))
                }));
            }
            (CasChange::Add { replica }, true) => {
                if p.epoch == epoch {
                    p.epoch = Epoch(epoch.0 + 1);
                }
                if let Some(s) = p.replicas.get_mut(replica)
                    && *s == ReplicaState::Adding
                {
                    *s = ReplicaState::InSync;
                }
            }
            (CasChange::Add { replica }, false) => {
                if let Some(s) = p.replicas.get_mut(replica)
                    && *s == ReplicaState::Adding
                {
                    *s = ReplicaState::Idle {
                        retry_at: now + self.cfg.retry_backoff,
                    };
                    out.extend(self.excuse(partition, *replica));
                }
            }
        }
        out.extend(self.issue_removals());
        out
    }

    /// The copy of `partition` to `replica` cleaned the range: ship from now.
    pub fn copy_shipping(&mut self, partition: PartitionId, replica: NodeId) -> bool {
        match self.state_mut(partition, replica) {
            Some(s @ ReplicaState::Copying { shipped: false }) => {
                *s = ReplicaState::Copying { shipped: true };
                true
            }
            _ => false,
        }
    }

    /// The copy finished: the replica joins at `s0` (the last seq now).
    pub fn copy_done(&mut self, partition: PartitionId, replica: NodeId, s0: Seq) -> Vec<Command> {
        match self.state_mut(partition, replica) {
            Some(s @ ReplicaState::Copying { shipped: true }) => {
                *s = ReplicaState::Joining { s0 };
            }
            _ => return Vec::new(),
        }
        // Already there: add at once (as an ack would).
        self.check_joins(replica)
    }

    /// The copy failed: try again after the back-off.
    pub fn copy_failed(&mut self, partition: PartitionId, replica: NodeId, now: Instant) {
        let backoff = self.cfg.retry_backoff;
        if let Some(s @ ReplicaState::Copying { .. }) = self.state_mut(partition, replica) {
            *s = ReplicaState::Idle {
                retry_at: now + backoff,
            };
        }
    }

    /// The replica's stream lost its place in the change log: it no longer
    /// acknowledges anything; in-sync partitions are CASed out, joining and
    /// copying ones stop.
    pub fn stream_lost(&mut self, replica: NodeId, now: Instant) -> Vec<Command> {
        self.lost.insert(replica);
        let mut excused = Vec::new();
        for (pid, p) in &mut self.parts {
            if let Some(s) = p.replicas.get_mut(&replica) {
                match s {
                    ReplicaState::InSync => {
                        *s = ReplicaState::Removing {
                            reason: Reason::StreamLost,
                            in_flight: false,
                        }
                    }
                    ReplicaState::Joining { .. }
                    | ReplicaState::Copying { .. }
                    | ReplicaState::Adding => {
                        *s = ReplicaState::Idle {
                            retry_at: now + self.cfg.retry_backoff,
                        };
                        excused.push(*pid);
                    }
                    _ => {}
                }
            }
        }
        for p in self.parts.values_mut() {
            p.drop_ended_eras();
        }
        let mut out = Vec::new();
        for pid in excused {
            out.extend(self.excuse(pid, replica));
        }
        out.extend(self.issue_removals());
        out
    }

    /// Whether a lost stream may start over (from the durable seq then):
    /// nothing waits on the replica any more.
    pub fn may_restart_stream(&self, replica: NodeId, now: Instant) -> bool {
        let waited = self.parts.values().any(|p| {
            p.replicas
                .get(&replica)
                .is_some_and(|s| s.waited(now) || matches!(s, ReplicaState::Adding))
        });
        !waited && !self.waiters.values().any(|w| w.waits.contains(&replica))
    }

    /// The stream of `replica` started over at `seq`.
    pub fn stream_restarted(&mut self, replica: NodeId, seq: Seq) {
        self.lost.remove(&replica);
        self.acked.insert(replica, seq);
    }

    fn state_mut(&mut self, partition: PartitionId, replica: NodeId) -> Option<&mut ReplicaState> {
        self.parts.get_mut(&partition)?.replicas.get_mut(&replica)
    }
}

/// Applies `f` to every waiter and releases (ok) those left waiting on nobody.
fn release_in(
    waiters: &mut BTreeMap<WaiterId, Waiter>,
    mut f: impl FnMut(&mut Waiter),
) -> Vec<Command> {
    let mut out = Vec::new();
    waiters.retain(|id, w| {
        f(w);
        if w.waits.is_empty() {
            out.push(Command::Release {
                waiter: *id,
                ok: true,
            });
            false
        } else {
            true
        }
    });
    out
}

fn overlaps(a: &KeyRange, b: &KeyRange) -> bool {
    crate::migrate::receive::ranges_overlap(a, b)
}

#[cfg(test)]
#[path = "rules_tests.rs"]
mod tests;
