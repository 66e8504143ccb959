//! The metadata store unreachable at the flip: the flip CAS is re-sent, the
//! source stays the owner until one applies, and a CAS that applied although
//! its answer was lost is recognised as ours (never applied twice, never
//! undone).

use super::*;
use keyway_map::{MapVersion, NodeId, PartitionMap};
use keyway_meta::{LeaseId, LeaseInfo, MapTxn, MapUpdate, MapWatch, MigrationPut, StoredMigration};
use std::sync::atomic::{AtomicU32, Ordering};

/// How a [`FlakyMeta`] answers the next flip commits.
#[derive(Clone, Copy)]
enum Outage {
    /// No fault: every commit applies.
    Never,
    /// Refuses without applying: the store is down.
    Down,
    /// Applies, then loses the answer: the outcome is in doubt.
    AnswerLost,
    /// Applies, loses the answer, and an operator splits the partition
    /// (now the target's) before the flip is re-sent (issue 11).
    AnswerLostThenSplit,
}

/// The embedded store, except that the next `failures` commits fail as
/// `Unavailable` (the way an unreachable store answers).
struct FlakyMeta {
    inner: Arc<EmbeddedMeta>,
    failures: AtomicU32,
    mode: Outage,
    /// Commits that failed, for the assertions.
    failed: AtomicU32,
    /// `commit_with_migration` calls (flips sent with their request).
    combined: AtomicU32,
    /// `put_migration` calls writing the flip request on its own.
    request_puts: AtomicU32,
    /// The owner each failed commit saw in the store right after it failed.
    owners_seen: std::sync::Mutex<Vec<NodeId>>,
    partition: PartitionId,
}

impl FlakyMeta {
    /// Runs `apply` (a map commit) through the injected faults: while
    /// `failures` last, it fails as `Unavailable`, after applying it in the
    /// answer-lost modes.
    async fn faulty<F, Fut>(&self, apply: F) -> Result<MapVersion, MetaError>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<MapVersion, MetaError>>,
    {
        let fail = self
            .failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if !fail {
            return apply().await;
        }
        if matches!(self.mode, Outage::AnswerLost | Outage::AnswerLostThenSplit) {
            apply().await?;
        }
        if matches!(self.mode, Outage::AnswerLostThenSplit) {
            let map = self.inner.get_map().await?;
            let at = crate::split::SplitAt::Auto;
            let plan = crate::split::plan_split(&map, self.partition, &at, None).unwrap();
            self.inner.commit(plan.txn).await?;
        }
        self.failed.fetch_add(1, Ordering::SeqCst);
        let map = self.inner.get_map().await?;
        self.owners_seen
            .lock()
            .unwrap()
            .extend(map.partitions.get(&self.partition).map(|p| p.owner));
        Err(MetaError::Unavailable("injected: store unreachable".into()))
    }
}

#[async_trait::async_trait]
impl MetaStore for FlakyMeta {
    async fn get_map(&self) -> Result<PartitionMap, MetaError> {
        self.inner.get_map().await
    }
    async fn changes_since(&self, since: MapVersion) -> Result<MapUpdate, MetaError> {
        self.inner.changes_since(since).await
    }
    async fn watch(&self, since: MapVersion) -> Result<MapWatch, MetaError> {
        self.inner.watch(since).await
    }
    async fn commit(&self, txn: MapTxn) -> Result<MapVersion, MetaError> {
        let inner = self.inner.clone();
        self.faulty(|| async move { inner.commit(txn).await }).await
    }
    async fn commit_with_migration(
        &self,
        txn: MapTxn,
        put: MigrationPut,
    ) -> Result<MapVersion, MetaError> {
        // The flip request and the flip CAS in one transaction: the same
        // faults as a flip CAS on its own.
        self.combined.fetch_add(1, Ordering::SeqCst);
        let inner = self.inner.clone();
        self.faulty(|| async move { inner.commit_with_migration(txn, put).await })
            .await
    }
    async fn register_node_in_zone(
        &self,
        id: Option<NodeId>,
        resp_addr: String,
        admin_addr: String,
        zone: Option<String>,
    ) -> Result<NodeId, MetaError> {
        self.inner
            .register_node_in_zone(id, resp_addr, admin_addr, zone)
            .await
    }
    async fn grant_lease(&self, node: NodeId, ttl_ms: u64) -> Result<LeaseId, MetaError> {
        self.inner.grant_lease(node, ttl_ms).await
    }
    async fn keep_alive(&self, lease: LeaseId) -> Result<u64, MetaError> {
        self.inner.keep_alive(lease).await
    }
    async fn revoke_lease(&self, lease: LeaseId) -> Result<(), MetaError> {
        self.inner.revoke_lease(lease).await
    }
    async fn leases(&self) -> Result<Vec<LeaseInfo>, MetaError> {
        self.inner.leases().await
    }
    async fn allocate_migration_id(&self) -> Result<u64, MetaError> {
        self.inner.allocate_migration_id().await
    }
    async fn put_migration(
        &self,
        id: u64,
        expected: Option<u64>,
        generation: u64,
        record: Vec<u8>,
    ) -> Result<(), MetaError> {
        if MigrationRecord::decode(&record)
            .is_ok_and(|r| crate::driver::actions::is_flip_request(&r))
        {
            self.request_puts.fetch_add(1, Ordering::SeqCst);
        }
        self.inner
            .put_migration(id, expected, generation, record)
            .await
    }
    async fn get_migration(&self, id: u64) -> Result<Option<StoredMigration>, MetaError> {
        self.inner.get_migration(id).await
    }
    async fn migrations(&self) -> Result<Vec<StoredMigration>, MetaError> {
        self.inner.migrations().await
    }
    async fn delete_migration(&self, id: u64, expected: u64) -> Result<(), MetaError> {
        self.inner.delete_migration(id, expected).await
    }
    async fn bootstrap_if_empty_with(
        &self,
        min_nodes: usize,
        partitions_per_node: u16,
        replication: keyway_meta::Replication,
    ) -> Result<bool, MetaError> {
        self.inner
            .bootstrap_if_empty_with(min_nodes, partitions_per_node, replication)
            .await
    }
}

async fn flip_through(mode: Outage) -> (Env, Arc<FlakyMeta>, MigrationRecord) {
    let env = Env::without_driver(Faults::default()).await;
    let failures = match mode {
        Outage::Never => 0,
        Outage::AnswerLostThenSplit => 1,
        _ => 3,
    };
    let flaky = Arc::new(FlakyMeta {
        inner: env.meta.clone(),
        failures: AtomicU32::new(failures),
        mode,
        failed: AtomicU32::new(0),
        combined: AtomicU32::new(0),
        request_puts: AtomicU32::new(0),
        owners_seen: std::sync::Mutex::new(Vec::new()),
        partition: env.partition.id,
    });
    let env = env.start_driver_on(flaky.clone());
    let rec = env.request().await;
    let done = env.finished(rec.id).await;
    (env, flaky, done)
}

/// The flip request and the flip CAS are one store transaction: the
/// migration record's generation before and after the flip request moved
/// by one write that also flipped the map.
#[tokio::test]
async fn the_flip_request_and_the_flip_are_one_store_write() {
    let (env, flaky, done) = flip_through(Outage::Never).await;
    assert_eq!(done.state, MigrationState::Done, "{:?}", done.abort_reason);
    assert_eq!(
        flaky.combined.load(Ordering::SeqCst),
        1,
        "one combined write"
    );
    assert_eq!(
        flaky.request_puts.load(Ordering::SeqCst),
        0,
        "no write of the flip request on its own"
    );
    assert_eq!(flaky.failed.load(Ordering::SeqCst), 0);
    assert_eq!(
        env.owner().await,
        (env.target, Epoch(env.partition.epoch.0 + 1))
    );
}

#[tokio::test]
async fn an_unreachable_store_at_the_flip_leaves_the_source_owner_until_the_flip_applies() {
    let (env, flaky, done) = flip_through(Outage::Down).await;
    assert_eq!(
        flaky.combined.load(Ordering::SeqCst),
        1,
        "the first flip went with its request; after its failure the two went in turn"
    );
    assert_eq!(flaky.request_puts.load(Ordering::SeqCst), 1);
    assert_eq!(
        flaky.failed.load(Ordering::SeqCst),
        3,
        "three flips refused"
    );
    assert_eq!(
        *flaky.owners_seen.lock().unwrap(),
        vec![env.source; 3],
        "while the store was down the source stayed the owner"
    );
    assert_eq!(done.state, MigrationState::Done);
    assert_eq!(
        env.owner().await,
        (env.target, Epoch(env.partition.epoch.0 + 1)),
        "the re-sent flip applied once"
    );
    assert_eq!(env.fake.entries(env.target, &env.range), env.seeded());
}

#[tokio::test]
async fn a_flip_whose_answer_was_lost_is_recognised_as_applied() {
    let (env, flaky, done) = flip_through(Outage::AnswerLost).await;
    assert_eq!(flaky.failed.load(Ordering::SeqCst), 1, "one answer lost");
    assert_eq!(
        *flaky.owners_seen.lock().unwrap(),
        vec![env.target],
        "the lost answer hid an applied flip"
    );
    assert_eq!(done.state, MigrationState::Done, "{:?}", done.abort_reason);
    assert_eq!(
        env.owner().await,
        (env.target, Epoch(env.partition.epoch.0 + 1)),
        "applied once, not undone"
    );
}

/// Issue 11: the flip applied, its answer was lost, then the partition
/// (the target's now) was split. The re-sent flip conflicts showing the
/// partition gone; the map's history shows the split removed the target's
/// row, so the flip applied: the move finishes, it is never aborted.
#[tokio::test]
async fn a_split_after_a_flip_whose_answer_was_lost_finishes_the_move() {
    let (env, flaky, done) = flip_through(Outage::AnswerLostThenSplit).await;
    assert_eq!(flaky.failed.load(Ordering::SeqCst), 1, "one answer lost");
    assert_eq!(done.state, MigrationState::Done, "{:?}", done.abort_reason);
    assert!(done.flipped() && done.stray.is_none());
    let map = env.meta.get_map().await.unwrap();
    assert!(!map.partitions.contains_key(&env.partition.id), "split");
    let children: Vec<_> = map
        .partitions
        .values()
        .filter(|p| {
            let (start, end) = p.storage_bounds();
            crate::driver::ranges_overlap(&KeyRange::new(start, end), &env.range)
        })
        .collect();
    assert_eq!(children.len(), 2);
    for child in children {
        assert_eq!(
            (child.owner, child.epoch),
            (env.target, Epoch(env.partition.epoch.0 + 2))
        );
    }
    assert_eq!(env.fake.entries(env.target, &env.range), env.seeded());
    assert_eq!(
        env.fake.entries(env.source, &env.range),
        vec![],
        "the old source dropped the range (it never served again)"
    );
    let log = env.fake.log();
    assert!(
        !log.iter()
            .any(|l| l.ends_with(&format!("fence {} off", done.id))),
        "the source was never unfenced: {log:?}"
    );
}
