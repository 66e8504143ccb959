//! The node's view of the partition map, its lease, and the ownership check.
//!
//! [`RoutingGuard::admit`] is the one place a request is checked against
//! ownership, epoch and lease. Executors call it while holding the read side
//! of the view's lock and keep holding it until the command's effect is in
//! the engine (invariant 2: check and effect together); installing a new map
//! takes the write side, so no request can pass the check against the old map
//! and apply after the new one is in place.
//!
//! Rejections carry where to go next (invariant 3): `-MOVED slot host:port`
//! for Redis clients, and for epoch-carrying requests the partition, its
//! range, owner and epoch as this node knows them.

use crate::clock::Clock;
use crate::map_history::{HistoryAnswer, HistoryEntry, MapHistory};
use crate::migrate::receive::{self, Incoming};
use crate::migrate::{MigrationRef, Push, Receiving, Refusal};
use keyway_map::{
    Epoch, KeyspaceId, KwMoved, MapError, MapVersion, NodeId, PartitionId, PartitionMap,
    PartitionRecord,
};
use keyway_resp::Frame;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Why a request was not admitted. Each variant becomes one error reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rejection {
    /// Another node owns the slot: `-MOVED slot host:port`.
    Moved { slot: u16, addr: String },
    /// An epoch-carrying request did not match this node's record of the
    /// partition; carries the record so the client can patch its cache.
    StaleEpoch {
        partition: Box<PartitionRecord>,
        owner_addr: String,
    },
    /// No partition covers the slot (map not loaded yet).
    Unserved,
    /// This node's lease has lapsed (or it has not re-read the map since):
    /// it serves nothing until it has renewed and refreshed (invariant 4).
    LeaseLapsed,
    /// The partition is fenced for a migration's cutover. Single-slot
    /// commands are *held* (parked until the fence lifts or the map moves the
    /// partition away) and never see this; other paths answer it.
    Fenced { partition: PartitionId },
}

impl Rejection {
    /// The error reply, byte-compatible with Redis where Redis has one.
    pub fn to_frame(&self) -> Frame {
        match self {
            Rejection::Moved { slot, addr } => Frame::Error(format!("MOVED {slot} {addr}")),
            Rejection::StaleEpoch {
                partition: p,
                owner_addr,
            } => Frame::Error(KwMoved::text(p, owner_addr)),
            Rejection::Unserved => Frame::Error("CLUSTERDOWN Hash slot not served".into()),
            Rejection::LeaseLapsed => {
                Frame::Error("CLUSTERDOWN The cluster is down (node lease lapsed)".into())
            }
            Rejection::Fenced { partition } => Frame::Error(format!(
                "CLUSTERDOWN partition {partition} is in its migration cutover; retry"
            )),
        }
    }
}

/// The map this node routes by, plus its lease.
pub struct Routing {
    me: NodeId,
    clock: Arc<dyn Clock>,
    /// Instant all lease deadlines are measured from.
    base: Instant,
    /// Lease deadline as nanoseconds after `base`; 0 = no valid lease.
    lease_deadline_ns: AtomicU64,
    view: RwLock<View>,
    /// Bumped after every change that may let a held request proceed (a new
    /// map, a lifted fence).
    changes: watch::Sender<u64>,
    /// Replica read leases: for each partition this node is an in-sync
    /// replica of, the epoch the primary's stream last named and until when
    /// (monotonic ns after `base`) the primary counts on this replica serving
    /// reads. Granted by the replica side of the stream on every apply or
    /// heartbeat (`crate::replicate`); read by
    /// [`RoutingGuard::admit_replica_read`] (invariant 11).
    replica_reads: std::sync::Mutex<BTreeMap<PartitionId, (Epoch, u64)>>,
    /// Replica applies (exclusive) against the replica reads they could tear
    /// (shared): a READONLY command reads in several engine calls (a
    /// collection's meta, then its entries chunk by chunk), so it must not
    /// interleave with an apply of the primary's batches. Taken after the
    /// view's read guard on both sides.
    replica_apply: RwLock<()>,
}

/// What the ownership check reads, all under one lock: the map and this
/// node's migration roles for partitions it owns.
struct View {
    map: Arc<PartitionMap>,
    /// Partitions in their cutover: requests are held.
    fenced: BTreeSet<PartitionId>,
    /// Partitions being dual-written: each write's reply waits for the target.
    dual: BTreeMap<PartitionId, Arc<Push>>,
    /// Partitions this node is about to receive (it is the target of their
    /// fenced migration): while the map still shows them at this epoch under
    /// another owner, requests are held, not redirected back to the source.
    /// Each lapses at its deadline (monotonic ns after `base`).
    incoming: BTreeMap<PartitionId, (Epoch, u64)>,
    /// The migrations this node is the target of, by partition: the only
    /// ones it accepts foreign records for (`crate::migrate::receive`).
    receiving: Incoming,
    /// The changes of the last versions installed one by one, ending at
    /// `map`'s version (`KW.MAP SINCE`).
    history: MapHistory,
}

/// A read guard over the map: hold it from the check to the effect.
pub struct RoutingGuard<'a> {
    routing: &'a Routing,
    map: RwLockReadGuard<'a, View>,
}

impl Routing {
    pub fn new(me: NodeId, clock: Arc<dyn Clock>) -> Self {
        let base = clock.now();
        Routing {
            me,
            clock,
            base,
            lease_deadline_ns: AtomicU64::new(0),
            replica_apply: RwLock::new(()),
            view: RwLock::new(View {
                map: Arc::new(PartitionMap::new()),
                fenced: BTreeSet::new(),
                dual: BTreeMap::new(),
                incoming: BTreeMap::new(),
                receiving: Incoming::new(),
                history: MapHistory::new(crate::map_history::DEFAULT_MAP_HISTORY_VERSIONS),
            }),
            changes: watch::channel(0).0,
            replica_reads: std::sync::Mutex::new(BTreeMap::new()),
        }
    }

    /// The primary's stream vouched, at `epoch`, that this replica may serve
    /// `partition`'s reads until `until` (a monotonic instant computed by the
    /// caller from when the stream message *arrived*, see `crate::replicate`).
    /// A later grant replaces an earlier one; an older epoch never replaces a newer.
    pub fn grant_replica_read(&self, partition: PartitionId, epoch: Epoch, until: Instant) {
        let ns = self.ns_since_base(until);
        let mut reads = self.replica_reads.lock().unwrap_or_else(|e| e.into_inner());
        let entry = reads.entry(partition).or_insert((epoch, ns));
        if epoch >= entry.0 {
            *entry = (epoch, ns);
        }
    }

    /// Held while the replica side applies one whole-batch run of the
    /// primary's records (take it after [`Routing::read`]).
    pub fn replica_apply_exclusive(&self) -> std::sync::RwLockWriteGuard<'_, ()> {
        self.replica_apply
            .write()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Held while a replica read executes (after [`Routing::read`]): it sees
    /// each of the primary's batches wholly or not at all.
    pub fn replica_read_shared(&self) -> RwLockReadGuard<'_, ()> {
        self.replica_apply.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Withdraws every replica read lease of `partition` (it stopped being a
    /// replica here, or its copy is being rebuilt).
    pub fn revoke_replica_read(&self, partition: PartitionId) {
        self.replica_reads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&partition);
    }

    /// Whether a replica read lease for `partition` at `epoch` is valid now.
    pub fn replica_read_valid(&self, partition: PartitionId, epoch: Epoch) -> bool {
        let now = self.now_ns();
        self.replica_reads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&partition)
            .is_some_and(|(e, deadline)| *e == epoch && now < *deadline)
    }

    /// Fires after every change that may let a held request proceed.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, View> {
        self.view.write().unwrap_or_else(|e| e.into_inner())
    }

    fn bump(&self) {
        self.changes.send_modify(|n| *n += 1);
    }

    /// Fences `partition` (true) or lifts its fence (false). Taking the write
    /// side waits for every in-flight command holding the read side, so on
    /// return no request admitted before the fence is still running: its
    /// effect is in the engine (the drain of invariant 2).
    pub fn set_fenced(&self, partition: PartitionId, fenced: bool) {
        let mut view = self.write();
        if fenced {
            view.fenced.insert(partition);
        } else {
            view.fenced.remove(&partition);
        }
        drop(view);
        if !fenced {
            self.bump();
        }
    }

    /// Holds requests for `partition` while the map shows it at `epoch`
    /// under another owner, for at most `hold` from now (`None` lifts it).
    pub fn set_incoming(&self, partition: PartitionId, hold: Option<(Epoch, Duration)>) {
        let mut view = self.write();
        match hold {
            Some((epoch, hold)) => {
                let ns = self.ns_since_base(self.clock.now() + hold);
                view.incoming.insert(partition, (epoch, ns));
            }
            None => {
                view.incoming.remove(&partition);
            }
        }
        drop(view);
        self.bump();
    }

    /// Registers (`on`) or ends incoming migration `m`: see
    /// [`receive::register`]. Under the write side, so no peer write checked
    /// against the registrations before runs after.
    pub fn set_receiving(&self, m: MigrationRef, on: bool) -> Result<(), Refusal> {
        let mut view = self.write();
        let view = &mut *view;
        if on {
            receive::register(&view.map, self.me, &mut view.receiving, m)
        } else {
            receive::unregister(&mut view.receiving, m);
            Ok(())
        }
    }

    /// The incoming migrations (`/status`).
    pub fn receiving(&self) -> Vec<(PartitionId, Receiving)> {
        let view = self.read();
        view.map
            .receiving
            .iter()
            .map(|(pid, r)| (*pid, r.clone()))
            .collect()
    }

    fn ns_since_base(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.base).as_nanos().max(1) as u64
    }

    fn now_ns(&self) -> u64 {
        self.ns_since_base(self.clock.now())
    }

    /// Whether `partition` is fenced.
    pub fn is_fenced(&self, partition: PartitionId) -> bool {
        self.read().map.fenced.contains(&partition)
    }

    /// Starts (`Some`) or stops (`None`) dual-writing `partition` through
    /// `push`. Runs `at` under the write side, so every write admitted after
    /// it returns is dual-written: pass a closure reading the engine's last
    /// seq to learn the seq after which that holds.
    pub fn set_dual<T>(
        &self,
        partition: PartitionId,
        push: Option<Arc<Push>>,
        at: impl FnOnce() -> T,
    ) -> T {
        let mut view = self.write();
        match push {
            Some(push) => view.dual.insert(partition, push),
            None => view.dual.remove(&partition),
        };
        at()
    }

    pub fn node_id(&self) -> NodeId {
        self.me
    }

    /// The node's wall clock in unix milliseconds (what key expiry is judged by).
    pub fn unix_ms(&self) -> u64 {
        self.clock.unix_ms()
    }

    /// Takes the read side: checks made through the guard stay valid until it drops.
    pub fn read(&self) -> RoutingGuard<'_> {
        RoutingGuard {
            routing: self,
            map: self.view.read().unwrap_or_else(|e| e.into_inner()),
        }
    }

    /// The installed map once `ok` holds for it, or when `wait` ends
    /// (whichever comes first): a wait for an install without polling.
    pub async fn wait_for(
        &self,
        wait: Duration,
        ok: impl Fn(&PartitionMap) -> bool,
    ) -> Arc<PartitionMap> {
        let mut changes = self.subscribe();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // Marked seen before the check: an install after it wakes the wait.
            changes.borrow_and_update();
            let map = self.map();
            if ok(&map) {
                return map;
            }
            if tokio::time::timeout_at(deadline, changes.changed())
                .await
                .is_err()
            {
                return self.map();
            }
        }
    }

    /// The current map (a cheap clone of an `Arc`).
    pub fn map(&self) -> Arc<PartitionMap> {
        self.read().map.map.clone()
    }

    /// Sets how many map versions' changes are kept for `KW.MAP SINCE`.
    pub fn set_map_history_versions(&self, versions: usize) {
        self.write().history.set_limit(versions);
    }

    /// The answer to `KW.MAP SINCE since`: the changes after `since` from
    /// the history when it reaches back that far, else the whole map.
    pub fn map_since(&self, since: MapVersion) -> HistoryAnswer {
        let view = self.read();
        view.map.history.since(&view.map.map, since)
    }

    /// Installs a newer map after validating it (the applying half of the
    /// map invariant check). Waits for in-flight commands holding the read side.
    /// A newer map installed whole empties the map history (its changes
    /// are not known here); see [`Self::install_delta`].
    pub fn install(&self, map: PartitionMap) -> Result<(), MapError> {
        self.install_with(map, None)
    }

    /// Installs `map`, reached from the installed map by `changes` (each
    /// version's changes, oldest first), and records them in the map
    /// history. Changes that do not continue from the installed map's
    /// version reset the history instead.
    pub fn install_delta(
        &self,
        map: PartitionMap,
        changes: Vec<HistoryEntry>,
    ) -> Result<(), MapError> {
        self.install_with(map, Some(changes))
    }

    fn install_with(
        &self,
        map: PartitionMap,
        changes: Option<Vec<HistoryEntry>>,
    ) -> Result<(), MapError> {
        map.validate()?;
        let mut view = self.write();
        if map.version < view.map.version {
            return Err(MapError::VersionNotIncreasing {
                have: view.map.version.0,
                got: map.version.0,
            });
        }
        assert_epochs_never_fall(&view.map, &map);
        // An incoming hold ends once the map moved past its epoch.
        view.incoming
            .retain(|pid, (epoch, _)| map.partitions.get(pid).is_some_and(|p| p.epoch == *epoch));
        // So does an incoming migration (after the flip this node owns the
        // partition: a late record for the old epoch is refused).
        receive::retain(&mut view.receiving, &map);
        let from = view.map.version;
        match changes {
            Some(changes) => view.history.record(from, changes),
            None if map.version != from => view.history.reset(),
            None => {}
        }
        if view.history.first_version().is_some() && !view.history.ends_at(map.version) {
            view.history.reset();
        }
        view.map = Arc::new(map);
        drop(view);
        self.bump();
        Ok(())
    }

    /// Sets the lease deadline (a monotonic instant).
    pub fn set_lease_deadline(&self, deadline: Instant) {
        self.lease_deadline_ns
            .store(self.ns_since_base(deadline), Ordering::SeqCst);
    }

    /// Drops the lease: the node stops serving at once.
    pub fn revoke_lease(&self) {
        self.lease_deadline_ns.store(0, Ordering::SeqCst);
    }

    /// Whether the lease is valid now.
    pub fn lease_valid(&self) -> bool {
        let deadline = self.lease_deadline_ns.load(Ordering::SeqCst);
        deadline != 0 && self.now_ns() < deadline
    }

    /// Milliseconds of lease left (0 when lapsed).
    pub fn lease_remaining_ms(&self) -> u64 {
        let deadline = self.lease_deadline_ns.load(Ordering::SeqCst);
        deadline.saturating_sub(self.now_ns()) / 1_000_000
    }
}

fn assert_epochs_never_fall(old: &PartitionMap, new: &PartitionMap) {
    for (id, p) in &new.partitions {
        if let Some(prev) = old.partitions.get(id) {
            assert!(
                p.epoch >= prev.epoch,
                "partition {id}: epoch fell from {} to {}",
                prev.epoch,
                p.epoch
            );
        }
    }
}

impl RoutingGuard<'_> {
    pub fn map(&self) -> &PartitionMap {
        &self.map.map
    }

    /// Does this node keep a copy of `p` (owner, listed replica, or
    /// receiving it under an incoming migration, registered or held)?
    /// What it holds of any other partition is stray (`crate::stray_sweep`).
    pub fn keeps_copy(&self, p: &PartitionRecord) -> bool {
        let me = self.routing.me;
        p.owner == me
            || p.replicas.contains(&me)
            || self.map.receiving.contains_key(&p.id)
            || self.map.incoming.contains_key(&p.id)
    }

    /// May foreign records with `keys` be applied for `m` now? Hold the
    /// guard until they are in the engine.
    pub fn check_apply<'k>(
        &self,
        m: MigrationRef,
        keys: impl Iterator<Item = &'k [u8]>,
    ) -> Result<(), Refusal> {
        receive::check_apply(&self.map.map, self.routing.me, &self.map.receiving, m, keys)
    }

    /// May `range` be dropped now on behalf of `m`? Hold the guard until
    /// the deletes are in the engine.
    pub fn check_drop(
        &self,
        m: MigrationRef,
        range: &keyway_storage::KeyRange,
    ) -> Result<(), Refusal> {
        receive::check_drop(
            &self.map.map,
            self.routing.me,
            &self.map.receiving,
            m,
            range,
        )
    }

    /// The push dual-writing `partition`, if it is being dual-written.
    pub fn dual(&self, partition: PartitionId) -> Option<&Arc<Push>> {
        self.map.dual.get(&partition)
    }

    /// Admits a request for hash `slot` of keyspace `ks` (or, with `expected`,
    /// for that partition at that epoch), or says why not. Lease first: a node
    /// without a valid lease answers nothing, not even redirects from its
    /// possibly stale map.
    pub fn admit_slot(
        &self,
        ks: KeyspaceId,
        slot: u16,
        expected: Option<(PartitionId, Epoch)>,
    ) -> Result<&PartitionRecord, Rejection> {
        self.admit(ks, &slot.to_be_bytes(), slot, expected)
    }

    /// Admits a request for the keyspace-local routing key `local_key` of
    /// keyspace `ks` (the `KW.*` commands): the rules of [`Self::admit_slot`]
    /// (lease, fence, incoming hold, epoch), except that a node that does not
    /// own the key's partition always answers with the partition's record
    /// ([`Rejection::StaleEpoch`], `-KWMOVED`), since a range key has no slot.
    pub fn admit_key(
        &self,
        ks: KeyspaceId,
        local_key: &[u8],
        expected: Option<(PartitionId, Epoch)>,
    ) -> Result<&PartitionRecord, Rejection> {
        match self.admit(ks, local_key, 0, expected) {
            Err(Rejection::Moved { .. }) => match self.map.map.locate(ks, local_key) {
                Some(p) => Err(self.stale(p)),
                None => Err(Rejection::Unserved),
            },
            other => other,
        }
    }

    /// Admits a request for the keyspace-local routing key `local_key`.
    pub fn admit(
        &self,
        ks: KeyspaceId,
        local_key: &[u8],
        slot: u16,
        expected: Option<(PartitionId, Epoch)>,
    ) -> Result<&PartitionRecord, Rejection> {
        if !self.routing.lease_valid() {
            return Err(Rejection::LeaseLapsed);
        }
        let p = self
            .map
            .map
            .locate(ks, local_key)
            .ok_or(Rejection::Unserved)?;
        if p.owner != self.routing.me && self.incoming(p) {
            return Err(Rejection::Fenced { partition: p.id });
        }
        if let Some((pid, epoch)) = expected
            && (pid != p.id || epoch != p.epoch)
        {
            return Err(self.stale(p));
        }
        if p.owner != self.routing.me {
            return Err(match expected {
                Some(_) => self.stale(p),
                None => Rejection::Moved {
                    slot,
                    addr: self.addr_of(p.owner),
                },
            });
        }
        if self.map.fenced.contains(&p.id) {
            return Err(Rejection::Fenced { partition: p.id });
        }
        Ok(p)
    }

    /// Admits a read of hash `slot` sent on a `READONLY` connection: the
    /// owner admits it as any request ([`Self::admit_slot`]); a replica
    /// admits it only while it is in the partition's in-sync set at the epoch
    /// its map holds, its own lease is valid, and the primary's replica read
    /// lease for that epoch has not run out (invariant 11). Anything else is
    /// `-MOVED` to the owner.
    pub fn admit_replica_read(
        &self,
        ks: KeyspaceId,
        slot: u16,
    ) -> Result<&PartitionRecord, Rejection> {
        if !self.routing.lease_valid() {
            return Err(Rejection::LeaseLapsed);
        }
        let p = self
            .map
            .map
            .locate(ks, &slot.to_be_bytes())
            .ok_or(Rejection::Unserved)?;
        if p.owner == self.routing.me {
            return self.admit_slot(ks, slot, None);
        }
        if p.is_in_sync_replica(self.routing.me) && self.routing.replica_read_valid(p.id, p.epoch) {
            return Ok(p);
        }
        Err(Rejection::Moved {
            slot,
            addr: self.addr_of(p.owner),
        })
    }

    /// A write sent to the replica endpoint: never run there, `-MOVED` to
    /// the slot's primary's main address (even when that is this node).
    pub fn redirect_to_owner(&self, ks: KeyspaceId, slot: u16) -> Rejection {
        match self.map.map.locate(ks, &slot.to_be_bytes()) {
            Some(p) => Rejection::Moved {
                slot,
                addr: self.addr_of(p.owner),
            },
            None => Rejection::Unserved,
        }
    }

    /// This node is about to receive `p` (its map still shows the old row).
    fn incoming(&self, p: &PartitionRecord) -> bool {
        self.map
            .incoming
            .get(&p.id)
            .is_some_and(|(epoch, deadline)| *epoch == p.epoch && self.routing.now_ns() < *deadline)
    }

    fn stale(&self, p: &PartitionRecord) -> Rejection {
        Rejection::StaleEpoch {
            partition: Box::new(p.clone()),
            owner_addr: self.addr_of(p.owner),
        }
    }

    fn addr_of(&self, node: NodeId) -> String {
        self.map
            .map
            .nodes
            .get(&node)
            .map(|n| n.resp_addr.clone())
            .unwrap_or_else(|| "0.0.0.0:0".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SystemClock;
    use keyway_map::{DEFAULT_KEYSPACE, MapVersion, NodeInfo, key_hash_slot};
    use std::time::Duration;

    fn nodes() -> Vec<NodeInfo> {
        (1..=3)
            .map(|i| NodeInfo::up(NodeId(i), format!("127.0.0.1:{}", 7000 + i)))
            .collect()
    }

    fn routing() -> Routing {
        let r = Routing::new(NodeId(1), Arc::new(SystemClock));
        r.install(PartitionMap::bootstrap(&nodes(), 2).unwrap())
            .unwrap();
        r.set_lease_deadline(Instant::now() + Duration::from_secs(60));
        r
    }

    /// `wait_for` answers as soon as an install satisfies it (no polling
    /// interval: the cutover's serve step waits on it), and with the
    /// installed map when the wait ends.
    #[tokio::test]
    async fn wait_for_wakes_on_the_install_and_ends_at_its_deadline() {
        let r = Arc::new(routing());
        let mut map = (*r.map()).clone();
        let pid = *map.partitions.keys().next().unwrap();
        let epoch = map.partitions[&pid].epoch;
        let next = Epoch(epoch.0 + 1);
        let waiting = {
            let r = r.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let map = r
                    .wait_for(Duration::from_secs(30), |m| {
                        m.partitions[&pid].epoch >= next
                    })
                    .await;
                (map.partitions[&pid].epoch, started.elapsed())
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        map.partitions.get_mut(&pid).unwrap().epoch = next;
        map.version = MapVersion(map.version.0 + 1);
        r.install(map).unwrap();
        let (seen, took) = waiting.await.unwrap();
        assert_eq!(seen, next);
        assert!(
            took < Duration::from_secs(10),
            "woken by the install, not the deadline"
        );
        let started = Instant::now();
        let map = r
            .wait_for(Duration::from_millis(30), |m| {
                m.partitions[&pid].epoch > next
            })
            .await;
        assert_eq!(map.partitions[&pid].epoch, next);
        assert!(started.elapsed() >= Duration::from_millis(30));
    }

    #[test]
    fn owned_slot_is_admitted_and_foreign_slot_is_moved() {
        let r = routing();
        let g = r.read();
        assert_eq!(
            g.admit_slot(DEFAULT_KEYSPACE, 0, None).unwrap().owner,
            NodeId(1)
        );
        let slot = key_hash_slot(b"foo"); // 12182, owned by node 3
        let rej = g.admit_slot(DEFAULT_KEYSPACE, slot, None).unwrap_err();
        assert_eq!(
            rej.to_frame(),
            Frame::Error("MOVED 12182 127.0.0.1:7003".into())
        );
    }

    #[test]
    fn lapsed_lease_rejects_everything() {
        let r = routing();
        r.revoke_lease();
        let g = r.read();
        assert_eq!(
            g.admit_slot(DEFAULT_KEYSPACE, 0, None).unwrap_err(),
            Rejection::LeaseLapsed
        );
        drop(g);
        r.set_lease_deadline(Instant::now() - Duration::from_millis(1));
        assert!(!r.lease_valid());
    }

    #[test]
    fn wrong_epoch_is_rejected_with_the_current_record() {
        let r = routing();
        let g = r.read();
        let p = g.admit_slot(DEFAULT_KEYSPACE, 0, None).unwrap().clone();
        assert!(
            g.admit_slot(DEFAULT_KEYSPACE, 0, Some((p.id, p.epoch)))
                .is_ok()
        );
        match g.admit_slot(DEFAULT_KEYSPACE, 0, Some((p.id, Epoch(p.epoch.0 + 1)))) {
            Err(Rejection::StaleEpoch {
                partition,
                owner_addr,
            }) => {
                assert_eq!(*partition, p);
                assert_eq!(owner_addr, "127.0.0.1:7001");
            }
            other => panic!("expected a stale-epoch rejection, got {other:?}"),
        }
    }

    #[test]
    fn a_replica_reads_only_in_sync_at_its_epoch_with_a_read_lease() {
        let r = Routing::new(NodeId(2), Arc::new(SystemClock));
        let mut map = PartitionMap::bootstrap_replicated(&nodes(), 2, 2).unwrap();
        let p = map.locate_slot(DEFAULT_KEYSPACE, 0).unwrap().clone();
        assert_eq!((p.owner, p.in_sync.clone()), (NodeId(1), vec![NodeId(2)]));
        r.install(map.clone()).unwrap();
        r.set_lease_deadline(Instant::now() + Duration::from_secs(60));
        let moved = Rejection::Moved {
            slot: 0,
            addr: "127.0.0.1:7001".into(),
        };
        // No read lease from the primary yet.
        assert_eq!(
            r.read()
                .admit_replica_read(DEFAULT_KEYSPACE, 0)
                .unwrap_err(),
            moved
        );
        let soon = Instant::now() + Duration::from_secs(5);
        r.grant_replica_read(p.id, p.epoch, soon);
        assert_eq!(
            r.read().admit_replica_read(DEFAULT_KEYSPACE, 0).unwrap().id,
            p.id
        );
        // An ordinary read is still redirected to the owner.
        assert_eq!(
            r.read().admit_slot(DEFAULT_KEYSPACE, 0, None).unwrap_err(),
            moved
        );
        // Dropped from the in-sync set at a new epoch: the old grant is void.
        let row = map.partitions.get_mut(&p.id).unwrap();
        row.in_sync.clear();
        row.epoch = Epoch(p.epoch.0 + 1);
        map.version = MapVersion(map.version.0 + 1);
        r.install(map.clone()).unwrap();
        assert_eq!(
            r.read()
                .admit_replica_read(DEFAULT_KEYSPACE, 0)
                .unwrap_err(),
            moved
        );
        // Back in sync at a newer epoch, but the grant names the old one.
        let row = map.partitions.get_mut(&p.id).unwrap();
        row.in_sync = vec![NodeId(2)];
        row.epoch = Epoch(p.epoch.0 + 2);
        map.version = MapVersion(map.version.0 + 1);
        r.install(map).unwrap();
        assert!(r.read().admit_replica_read(DEFAULT_KEYSPACE, 0).is_err());
        r.grant_replica_read(p.id, Epoch(p.epoch.0 + 2), soon);
        assert!(r.read().admit_replica_read(DEFAULT_KEYSPACE, 0).is_ok());
        // An expired read lease, or an expired node lease, ends it.
        r.grant_replica_read(p.id, Epoch(p.epoch.0 + 2), Instant::now());
        assert!(r.read().admit_replica_read(DEFAULT_KEYSPACE, 0).is_err());
        r.grant_replica_read(p.id, Epoch(p.epoch.0 + 2), soon);
        r.revoke_lease();
        assert_eq!(
            r.read()
                .admit_replica_read(DEFAULT_KEYSPACE, 0)
                .unwrap_err(),
            Rejection::LeaseLapsed
        );
    }

    #[test]
    fn older_map_is_refused() {
        let r = routing();
        let mut old = PartitionMap::bootstrap(&nodes(), 2).unwrap();
        old.version = MapVersion(0);
        assert!(r.install(old).is_err());
    }
}
