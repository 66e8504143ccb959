//! [`EmbeddedMeta`]: the single-node, durable, in-process metadata store.
//!
//! One `tokio::sync::Mutex` guards the whole state, so check-and-apply is
//! atomic: of many concurrent compare-and-set commits expecting the same
//! `(owner, epoch)`, exactly one wins. A mutation runs, under that lock, in a
//! spawned task (so a caller that gives up cannot cancel it half-way): it
//! prepares and validates the new state, writes it durably on a blocking
//! thread (`spawn_blocking`; never an fsync on an async worker), and only then
//! publishes it to readers and watchers. If a write fails the store stops
//! serving (memory may be ahead of disk) until it is reopened.
//!
//! Watchers share a `tokio::sync::broadcast` channel of committed entries; a
//! watcher that lags past its capacity is sent the `Full` map and continues
//! from that version, so it never misses a change silently.
//!
//! A directory is opened by at most one store at a time (`<dir>/meta.lock`,
//! an advisory file lock held while the store lives).
//!
//! Leader election (`embedded/election.rs`): per election a queue of
//! candidacies, persisted in the state file with the leases they hang on (a
//! leader whose lease survives a restart keeps leading). Every change to any
//! queue bumps one `tokio::sync::watch` counter; waiting campaign calls and
//! observers re-read their election when it moves. The lease reaper (and
//! `revoke_lease`) drops the candidacies of dead leases and wakes them, so
//! the seat passes to the next live candidate as soon as the leader's lease
//! expires. A campaign call dropped while it waits (a caller that gave up,
//! or an RPC whose client vanished) withdraws its candidacy; one whose
//! drop goes unnoticed still dies with its lease.
//!
//! Migration records (`embedded/migration.rs`) and their id counter live in
//! the state file too: a compare-and-set on (id, generation) is checked and
//! applied under the lock and persisted before it is answered.

mod election;
mod journal;
mod lease;
mod migration;
mod state;

pub use journal::JOURNAL_FILE;
pub use lease::MAX_LEASE_TTL_MS;
pub use state::STATE_FILE;

use crate::{
    LeaderWatch, Leadership, LeaseId, LeaseInfo, MapTxn, MapUpdate, MapWatch, MetaError, MetaStore,
    MigrationPut, StoredMigration, bootstrap_txn,
};
use election::Standing;
use futures::StreamExt;
use keyway_map::{MapChange, MapVersion, NodeId, NodeInfo, NodeState, PartitionMap};
use lease::LeaseTable;
use state::{Entry, State};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use tokio::sync::{Mutex, Notify, broadcast, watch};
use tokio::time::Instant;

/// The lock file's name inside the store directory.
pub const LOCK_FILE: &str = "meta.lock";

/// How long `open` waits for a lock held by a store that is shutting down.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// Tuning of an [`EmbeddedMeta`].
#[derive(Clone, Debug)]
pub struct EmbeddedOptions {
    /// How many recent versions' changes are kept (and persisted) for
    /// `changes_since` / `watch` deltas; older readers get the full map.
    pub history_versions: usize,
    /// How many committed versions a watcher may fall behind before it is
    /// sent the full map instead.
    pub watch_capacity: usize,
}

impl Default for EmbeddedOptions {
    fn default() -> Self {
        EmbeddedOptions {
            history_versions: 4096,
            watch_capacity: 1024,
        }
    }
}

/// The embedded metadata store. Dropping it closes the store: its watchers
/// end with [`MetaError::Unavailable`] and the directory can be reopened.
pub struct EmbeddedMeta {
    inner: Arc<Inner>,
}

struct Inner {
    dir: PathBuf,
    /// Where each mutation is made durable (`embedded/journal.rs`); used
    /// under `state`'s lock, on a blocking thread.
    journal: Arc<std::sync::Mutex<journal::Journal>>,
    state: Mutex<State>,
    events: broadcast::Sender<Arc<Entry>>,
    /// Bumped on every change to any election queue.
    elections_changed: watch::Sender<u64>,
    reaper_started: AtomicBool,
    reaper_wake: Arc<Notify>,
    /// Held (with its advisory lock) for the life of the store.
    _lock: File,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Lets the reaper notice the store is gone.
        self.reaper_wake.notify_one();
    }
}

impl std::fmt::Debug for EmbeddedMeta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedMeta")
            .field("dir", &self.inner.dir)
            .finish_non_exhaustive()
    }
}

impl EmbeddedMeta {
    /// Opens (creating if needed) the store in `dir`, restoring the map, its
    /// history, the node and lease counters and the leases (each with its
    /// full TTL from now). Blocking: reads the state file.
    pub fn open(dir: &Path, opts: EmbeddedOptions) -> Result<Self, MetaError> {
        let io = |what: &str, e: std::io::Error| {
            MetaError::Internal(format!("{what} {}: {e}", dir.display()))
        };
        std::fs::create_dir_all(dir).map_err(|e| io("create", e))?;
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(LOCK_FILE))
            .map_err(|e| io("open lock file in", e))?;
        // A store dropped a moment ago may still be finishing a spawned
        // mutation or reaper step that holds the lock: wait a bounded time.
        let give_up = std::time::Instant::now() + LOCK_WAIT;
        loop {
            match lock.try_lock() {
                Ok(()) => break,
                Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < give_up => {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(MetaError::Unavailable(format!(
                        "metadata store {} is already open (locked by another store)",
                        dir.display()
                    )));
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(io("lock", e)),
            }
        }
        let (state, journal) = State::load(dir, opts.history_versions, Instant::now())?;
        let (events, _) = broadcast::channel(opts.watch_capacity.max(1));
        let store = EmbeddedMeta {
            inner: Arc::new(Inner {
                dir: dir.to_path_buf(),
                journal: Arc::new(std::sync::Mutex::new(journal)),
                state: Mutex::new(state),
                events,
                elections_changed: watch::channel(0).0,
                reaper_started: AtomicBool::new(false),
                reaper_wake: Arc::new(Notify::new()),
                _lock: lock,
            }),
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            store.ensure_reaper();
        }
        Ok(store)
    }

    /// The directory the store lives in.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Starts the lease reaper once (it needs a runtime, `open` may not have one).
    fn ensure_reaper(&self) {
        if self.inner.reaper_started.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        let wake = self.inner.reaper_wake.clone();
        tokio::spawn(reap_leases(weak, wake));
    }

    /// Runs a mutation on its own task, so a caller dropping its future
    /// cannot interrupt it between the write and the publish.
    async fn run<T, F, Fut>(&self, f: F) -> Result<T, MetaError>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Inner>) -> Fut,
        Fut: Future<Output = Result<T, MetaError>> + Send + 'static,
    {
        self.ensure_reaper();
        tokio::spawn(f(self.inner.clone()))
            .await
            .map_err(|e| MetaError::Internal(format!("metadata store task failed: {e}")))?
    }
}

impl Inner {
    /// Writes the state durably (on a blocking thread). On failure the store
    /// is marked failed: the caller already changed memory.
    async fn persist(&self, state: &mut State) -> Result<(), MetaError> {
        state.write_seq += 1;
        let result = match state.encode(Instant::now()) {
            Ok(bytes) => {
                let journal = self.journal.clone();
                tokio::task::spawn_blocking(move || {
                    journal
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .write(&bytes)
                })
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r.map_err(|e| e.to_string()))
            }
            Err(e) => Err(e.to_string()),
        };
        result.map_err(|why| {
            tracing::error!(dir = %self.dir.display(), %why, "metadata store write failed; store stopped");
            state.failed = Some(why.clone());
            MetaError::Internal(format!("write state to {}: {why}", self.dir.display()))
        })
    }

    /// Checks `txn`'s conditions against `state`, applies its changes as the
    /// next version and validates the result; returns the new map and entry
    /// without touching `state`.
    fn prepare(state: &State, txn: MapTxn) -> Result<(PartitionMap, Arc<Entry>), MetaError> {
        for cond in &txn.conditions {
            if !cond.holds(&state.map) {
                return Err(MetaError::Conflict {
                    partition: cond.partition,
                    current: state
                        .map
                        .partitions
                        .get(&cond.partition)
                        .map(|p| (p.owner, p.epoch)),
                });
            }
        }
        let version = MapVersion(state.map.version.0 + 1);
        let mut map = state.map.clone();
        map.apply(version, &txn.changes)?;
        map.validate()?;
        Ok((
            map,
            Arc::new(Entry {
                version,
                changes: txn.changes,
            }),
        ))
    }

    /// Installs a prepared map, persists, then publishes it.
    async fn install(
        &self,
        state: &mut State,
        map: PartitionMap,
        entry: Arc<Entry>,
    ) -> Result<MapVersion, MetaError> {
        let version = entry.version;
        state.install(map, entry.clone());
        self.persist(state).await?;
        // No receivers is fine: nobody is watching.
        let _ = self.events.send(entry);
        Ok(version)
    }

    /// Removes expired leases and the candidacies held under them, and
    /// persists their removal.
    async fn reap(&self) -> Result<(), MetaError> {
        let mut state = self.state.lock().await;
        if state.failed.is_some() {
            return Ok(());
        }
        let now = Instant::now();
        let expired = state.leases.remove_expired(now) > 0;
        if state.drop_dead_candidacies(now) {
            self.persist_elections(&mut state).await?;
        } else if expired {
            self.persist(&mut state).await?;
        }
        Ok(())
    }

    /// Persists a change to the election queues, then wakes election
    /// waiters and observers (also when the write failed: they then see the
    /// store stopped).
    async fn persist_elections(&self, state: &mut State) -> Result<(), MetaError> {
        let result = self.persist(state).await;
        self.elections_changed
            .send_modify(|n| *n = n.wrapping_add(1));
        result
    }
}

/// The lease reaper: sleeps until the earliest lease deadline (or a wake-up
/// when a lease is granted), then removes expired leases. Holds the store
/// only weakly, and ends when the store is dropped.
async fn reap_leases(weak: Weak<Inner>, wake: Arc<Notify>) {
    loop {
        let deadline = {
            let Some(inner) = weak.upgrade() else { return };
            let state = inner.state.lock().await;
            state.leases.next_deadline()
        };
        match deadline {
            Some(deadline) => {
                tokio::select! {
                    _ = tokio::time::sleep_until(deadline) => {}
                    _ = wake.notified() => {}
                }
            }
            None => wake.notified().await,
        }
        let Some(inner) = weak.upgrade() else { return };
        if let Err(e) = inner.reap().await {
            tracing::warn!(error = %e, "lease reaper stopped");
            return;
        }
    }
}

/// Watch stream state: where the watcher is, and what it still has to send.
struct Watcher {
    rx: broadcast::Receiver<Arc<Entry>>,
    last: MapVersion,
    first: Option<MapUpdate>,
    inner: Weak<Inner>,
    done: bool,
}

impl Watcher {
    async fn next(&mut self) -> Option<Result<MapUpdate, MetaError>> {
        if self.done {
            return None;
        }
        if let Some(first) = self.first.take() {
            return Some(Ok(first));
        }
        loop {
            match self.rx.recv().await {
                Ok(entry) if entry.version <= self.last => continue,
                Ok(entry) if entry.version.0 == self.last.0 + 1 => {
                    self.last = entry.version;
                    let mut entries = vec![(entry.version, entry.changes.clone())];
                    // Batch whatever else is already committed.
                    while let Ok(more) = self.rx.try_recv() {
                        if more.version.0 != self.last.0 + 1 {
                            // Cannot happen (one sender, in version order);
                            // resync rather than skip.
                            return Some(self.resync().await);
                        }
                        self.last = more.version;
                        entries.push((more.version, more.changes.clone()));
                    }
                    return Some(Ok(MapUpdate::Delta(entries)));
                }
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {
                    return Some(self.resync().await);
                }
                Err(broadcast::error::RecvError::Closed) => {
                    self.done = true;
                    return Some(Err(closed()));
                }
            }
        }
    }

    /// The watcher missed entries: send the whole map, continue after it.
    async fn resync(&mut self) -> Result<MapUpdate, MetaError> {
        let Some(inner) = self.inner.upgrade() else {
            self.done = true;
            return Err(closed());
        };
        let state = inner.state.lock().await;
        if let Err(e) = state.check_healthy() {
            self.done = true;
            return Err(e);
        }
        // Commits publish under the lock we hold, so everything queued is at
        // most this version: drop it all, or the next send would find the
        // receiver still behind and lag it again.
        while let Ok(_) | Err(broadcast::error::TryRecvError::Lagged(_)) = self.rx.try_recv() {}
        self.last = state.map.version;
        Ok(MapUpdate::Full(state.map.clone()))
    }
}

fn closed() -> MetaError {
    MetaError::Unavailable("embedded metadata store closed".into())
}

fn check_election(election: &str) -> Result<(), MetaError> {
    if election.is_empty() {
        return Err(MetaError::InvalidArgument(
            "election name must not be empty".into(),
        ));
    }
    Ok(())
}

/// A waiting campaign call's hold on its candidacy: dropped while armed
/// (the call was dropped before it returned), it withdraws the candidacy
/// unless a later call under the same lease has attached to it since.
struct Withdraw {
    inner: Weak<Inner>,
    election: String,
    id: u64,
    attach: u64,
    armed: bool,
}

impl Drop for Withdraw {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (weak, election, id, attach) = (
            self.inner.clone(),
            std::mem::take(&mut self.election),
            self.id,
            self.attach,
        );
        // Holds the store only weakly: a store closed meanwhile keeps the
        // candidacy, which then ends with its lease (as after a restart).
        runtime.spawn(async move {
            let Some(inner) = weak.upgrade() else { return };
            let mut state = inner.state.lock().await;
            if state.check_healthy().is_ok() && state.elections.withdraw(&election, id, attach) {
                tracing::debug!(%election, id, "campaign call dropped; candidacy withdrawn");
                let _ = inner.persist_elections(&mut state).await;
            }
        });
    }
}

/// Observe stream state: the election, and the leader last sent.
struct Observer {
    election: String,
    changed: watch::Receiver<u64>,
    inner: Weak<Inner>,
    /// `None` until the first item is sent.
    last: Option<Option<Leadership>>,
    done: bool,
}

impl Observer {
    async fn next(&mut self) -> Option<Result<Option<Leadership>, MetaError>> {
        if self.done {
            return None;
        }
        loop {
            if self.last.is_some() && self.changed.changed().await.is_err() {
                self.done = true;
                return Some(Err(closed()));
            }
            let Some(inner) = self.inner.upgrade() else {
                self.done = true;
                return Some(Err(closed()));
            };
            let state = inner.state.lock().await;
            if let Err(e) = state.check_healthy() {
                self.done = true;
                return Some(Err(e));
            }
            let leader = state.leader(&self.election, Instant::now());
            drop(state);
            if self.last.as_ref() != Some(&leader) {
                self.last = Some(leader.clone());
                return Some(Ok(leader));
            }
        }
    }
}

#[async_trait::async_trait]
impl MetaStore for EmbeddedMeta {
    async fn get_map(&self) -> Result<PartitionMap, MetaError> {
        let state = self.inner.state.lock().await;
        state.check_healthy()?;
        Ok(state.map.clone())
    }

    async fn changes_since(&self, since: MapVersion) -> Result<MapUpdate, MetaError> {
        let state = self.inner.state.lock().await;
        state.check_healthy()?;
        Ok(state.changes_since(since))
    }

    async fn watch(&self, since: MapVersion) -> Result<MapWatch, MetaError> {
        let state = self.inner.state.lock().await;
        state.check_healthy()?;
        // Subscribing under the lock: every commit after the snapshot below
        // reaches `rx`, and none before it does twice (skipped by version).
        let rx = self.inner.events.subscribe();
        let first = match state.changes_since(since) {
            MapUpdate::Delta(d) if d.is_empty() => None,
            update => Some(update),
        };
        let watcher = Watcher {
            rx,
            last: state.map.version,
            first,
            inner: Arc::downgrade(&self.inner),
            done: false,
        };
        drop(state);
        Ok(futures::stream::unfold(watcher, |mut w| async move {
            w.next().await.map(|item| (item, w))
        })
        .boxed())
    }

    async fn commit(&self, txn: MapTxn) -> Result<MapVersion, MetaError> {
        self.run(move |inner| async move {
            let mut state = inner.state.lock().await;
            state.check_healthy()?;
            let (map, entry) = Inner::prepare(&state, txn)?;
            inner.install(&mut state, map, entry).await
        })
        .await
    }

    async fn commit_with_migration(
        &self,
        txn: MapTxn,
        put: MigrationPut,
    ) -> Result<MapVersion, MetaError> {
        self.run(move |inner| async move {
            let mut state = inner.state.lock().await;
            state.check_healthy()?;
            // Both checked before either changes `state`, the record's CAS
            // first; then one journal frame holds both.
            if put.expected.is_none() {
                return Err(crate::store::create_with_commit(put.id));
            }
            state
                .migrations
                .check_put(put.id, put.expected, put.generation)?;
            let (map, entry) = Inner::prepare(&state, txn)?;
            state
                .migrations
                .put(put.id, put.expected, put.generation, put.record)
                .expect("checked above, under the same lock");
            inner.install(&mut state, map, entry).await
        })
        .await
    }

    async fn register_node_in_zone(
        &self,
        id: Option<NodeId>,
        resp_addr: String,
        admin_addr: String,
        zone: Option<String>,
    ) -> Result<NodeId, MetaError> {
        self.run(move |inner| async move {
            let mut state = inner.state.lock().await;
            state.check_healthy()?;
            let id = match id {
                None => NodeId(state.next_node_id),
                Some(id) if id.0 == 0 || id.0 >= state.next_node_id => {
                    return Err(MetaError::InvalidArgument(format!(
                        "node id {} was never allocated by this metadata store",
                        id.0
                    )));
                }
                Some(id) => id,
            };
            // Re-registration keeps what operators set (weight, draining, zone).
            let kept = state.map.nodes.get(&id);
            let node = NodeInfo {
                id,
                resp_addr,
                admin_addr,
                state: NodeState::Up,
                weight: kept.map_or(keyway_map::DEFAULT_NODE_WEIGHT, |n| n.weight),
                draining: kept.is_some_and(|n| n.draining),
                zone: zone.or_else(|| kept.and_then(|n| n.zone.clone())),
                // The node re-advertises its replica endpoint after registering.
                replica_addr: kept.and_then(|n| n.replica_addr.clone()),
            };
            let txn = MapTxn::unconditional(vec![MapChange::UpsertNode(node)]);
            let (map, entry) = Inner::prepare(&state, txn)?;
            state.next_node_id = state.next_node_id.max(id.0 + 1);
            inner.install(&mut state, map, entry).await?;
            Ok(id)
        })
        .await
    }

    async fn grant_lease(&self, node: NodeId, ttl_ms: u64) -> Result<LeaseId, MetaError> {
        LeaseTable::check_ttl(ttl_ms)?;
        let id = self
            .run(move |inner| async move {
                let mut state = inner.state.lock().await;
                state.check_healthy()?;
                if !state.map.nodes.contains_key(&node) {
                    return Err(MetaError::InvalidArgument(format!(
                        "node {} is not registered",
                        node.0
                    )));
                }
                let id = state.leases.grant(Some(node), ttl_ms, Instant::now());
                inner.persist(&mut state).await?;
                Ok(id)
            })
            .await?;
        self.inner.reaper_wake.notify_one();
        Ok(id)
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<u64, MetaError> {
        self.ensure_reaper();
        let mut state = self.inner.state.lock().await;
        state.check_healthy()?;
        state.leases.keep_alive(lease, Instant::now())
    }

    async fn revoke_lease(&self, lease: LeaseId) -> Result<(), MetaError> {
        self.run(move |inner| async move {
            let mut state = inner.state.lock().await;
            state.check_healthy()?;
            let now = Instant::now();
            state.leases.revoke(lease, now)?;
            if state.drop_dead_candidacies(now) {
                inner.persist_elections(&mut state).await
            } else {
                inner.persist(&mut state).await
            }
        })
        .await
    }

    async fn leases(&self) -> Result<Vec<LeaseInfo>, MetaError> {
        self.ensure_reaper();
        let state = self.inner.state.lock().await;
        state.check_healthy()?;
        Ok(state.leases.live(Instant::now()))
    }

    async fn grant_session_lease(&self, ttl_ms: u64) -> Result<LeaseId, MetaError> {
        LeaseTable::check_ttl(ttl_ms)?;
        let id = self
            .run(move |inner| async move {
                let mut state = inner.state.lock().await;
                state.check_healthy()?;
                let id = state.leases.grant(None, ttl_ms, Instant::now());
                inner.persist(&mut state).await?;
                Ok(id)
            })
            .await?;
        self.inner.reaper_wake.notify_one();
        Ok(id)
    }

    async fn campaign(
        &self,
        election: &str,
        candidate: &str,
        lease: LeaseId,
    ) -> Result<Leadership, MetaError> {
        check_election(election)?;
        // Subscribed before the first look: no change after it is missed.
        let mut changed = self.inner.elections_changed.subscribe();
        let (e, c) = (election.to_string(), candidate.to_string());
        let mut hold = self
            .run(move |inner| async move {
                let mut state = inner.state.lock().await;
                state.check_healthy()?;
                let now = Instant::now();
                if !state.lease_live(lease, now) {
                    return Err(MetaError::LeaseNotFound(lease));
                }
                let dropped = state.drop_dead_candidacies(now);
                let joined = state.elections.join(&e, &c, lease);
                // Returned through the task: if the caller is gone by then,
                // the runtime drops it, which withdraws the candidacy.
                let hold = Withdraw {
                    inner: Arc::downgrade(&inner),
                    election: e,
                    id: joined.id,
                    attach: joined.attach,
                    armed: true,
                };
                if dropped || joined.changed {
                    inner.persist_elections(&mut state).await?;
                }
                Ok(hold)
            })
            .await?;
        loop {
            {
                let state = self.inner.state.lock().await;
                state.check_healthy()?;
                let now = Instant::now();
                match state.standing(election, hold.id, now) {
                    Standing::Leads(leadership) => {
                        hold.armed = false;
                        return Ok(leadership);
                    }
                    Standing::Waits => {}
                    Standing::Gone => {
                        hold.armed = false;
                        if state.lease_live(lease, now) {
                            return Err(MetaError::Unavailable(format!(
                                "candidacy in election {election:?} under lease {lease} was \
                                 withdrawn by a later campaign call; campaign again"
                            )));
                        }
                        return Err(MetaError::LeaseNotFound(lease));
                    }
                }
            }
            changed.changed().await.map_err(|_| closed())?;
        }
    }

    async fn leader(&self, election: &str) -> Result<Option<Leadership>, MetaError> {
        check_election(election)?;
        self.ensure_reaper();
        let state = self.inner.state.lock().await;
        state.check_healthy()?;
        Ok(state.leader(election, Instant::now()))
    }

    async fn observe(&self, election: &str) -> Result<LeaderWatch, MetaError> {
        check_election(election)?;
        self.ensure_reaper();
        self.inner.state.lock().await.check_healthy()?;
        let observer = Observer {
            election: election.to_string(),
            changed: self.inner.elections_changed.subscribe(),
            inner: Arc::downgrade(&self.inner),
            last: None,
            done: false,
        };
        Ok(futures::stream::unfold(observer, |mut o| async move {
            o.next().await.map(|item| (item, o))
        })
        .boxed())
    }

    async fn resign(&self, leadership: &Leadership) -> Result<(), MetaError> {
        check_election(&leadership.election)?;
        let leadership = leadership.clone();
        self.run(move |inner| async move {
            let mut state = inner.state.lock().await;
            state.check_healthy()?;
            if state.elections.resign(&leadership) {
                inner.persist_elections(&mut state).await?;
            }
            Ok(())
        })
        .await
    }

    async fn allocate_migration_id(&self) -> Result<u64, MetaError> {
        self.run(|inner| async move {
            let mut state = inner.state.lock().await;
            state.check_healthy()?;
            let id = state.migrations.allocate();
            inner.persist(&mut state).await?;
            Ok(id)
        })
        .await
    }

    async fn put_migration(
        &self,
        id: u64,
        expected: Option<u64>,
        generation: u64,
        record: Vec<u8>,
    ) -> Result<(), MetaError> {
        self.run(move |inner| async move {
            let mut state = inner.state.lock().await;
            state.check_healthy()?;
            state.migrations.put(id, expected, generation, record)?;
            inner.persist(&mut state).await
        })
        .await
    }

    async fn get_migration(&self, id: u64) -> Result<Option<StoredMigration>, MetaError> {
        let state = self.inner.state.lock().await;
        state.check_healthy()?;
        Ok(state.migrations.get(id))
    }

    async fn migrations(&self) -> Result<Vec<StoredMigration>, MetaError> {
        let state = self.inner.state.lock().await;
        state.check_healthy()?;
        Ok(state.migrations.list())
    }

    async fn delete_migration(&self, id: u64, expected: u64) -> Result<(), MetaError> {
        self.run(move |inner| async move {
            let mut state = inner.state.lock().await;
            state.check_healthy()?;
            state.migrations.delete(id, expected)?;
            inner.persist(&mut state).await
        })
        .await
    }

    async fn acl_users(&self) -> Result<Vec<crate::AclRecord>, MetaError> {
        let state = self.inner.state.lock().await;
        state.check_healthy()?;
        Ok(state
            .acl_users
            .iter()
            .map(|(name, rules)| crate::AclRecord {
                name: name.clone(),
                rules: rules.clone(),
            })
            .collect())
    }

    async fn put_acl_user(&self, record: crate::AclRecord) -> Result<(), MetaError> {
        self.run(move |inner| async move {
            let mut state = inner.state.lock().await;
            state.check_healthy()?;
            state.acl_users.insert(record.name, record.rules);
            inner.persist(&mut state).await
        })
        .await
    }

    async fn delete_acl_user(&self, name: &str) -> Result<bool, MetaError> {
        let name = name.to_string();
        self.run(move |inner| async move {
            let mut state = inner.state.lock().await;
            state.check_healthy()?;
            if state.acl_users.remove(&name).is_none() {
                return Ok(false);
            }
            inner.persist(&mut state).await?;
            Ok(true)
        })
        .await
    }

    async fn bootstrap_if_empty_with(
        &self,
        min_nodes: usize,
        partitions_per_node: u16,
        replication: crate::Replication,
    ) -> Result<bool, MetaError> {
        self.run(move |inner| async move {
            let mut state = inner.state.lock().await;
            state.check_healthy()?;
            let Some(txn) = bootstrap_txn(&state.map, min_nodes, partitions_per_node, replication)?
            else {
                return Ok(false);
            };
            let (map, entry) = Inner::prepare(&state, txn)?;
            inner.install(&mut state, map, entry).await?;
            Ok(true)
        })
        .await
    }
}

#[cfg(test)]
mod tests;
