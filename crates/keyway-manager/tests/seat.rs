//! The seat against an in-process embedded store: one leader of many, a
//! prompt hand-over on shutdown, step-down on a lost lease or an unseating,
//! and a cut-off leader that stops acting by its own deadline before the
//! store hands the seat to a standby.

use futures::StreamExt;
use keyway_manager::{MANAGER_ELECTION, Metrics, Seat, SeatConfig, SeatState};
use keyway_map::{MapVersion, NodeId, PartitionMap};
use keyway_meta::{
    EmbeddedMeta, EmbeddedOptions, LeaderWatch, Leadership, LeaseId, LeaseInfo, MapTxn, MapUpdate,
    MapWatch, MetaError, MetaStore,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::time::Instant;

const TTL: Duration = Duration::from_millis(1000);
const DEADLINE: Duration = Duration::from_secs(10);

fn store() -> (Arc<EmbeddedMeta>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedMeta::open(dir.path(), EmbeddedOptions::default()).unwrap();
    (Arc::new(store), dir)
}

fn seat(meta: Arc<dyn MetaStore>, name: &str) -> (Seat, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::new());
    (
        Seat::start(meta, SeatConfig::new(name, TTL), metrics.clone()),
        metrics,
    )
}

/// Polls `probe` every 5 ms until it returns `Some`, failing after `within`.
async fn eventually<T>(what: &str, within: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn leads(seat: &Seat, what: &str) -> Leadership {
    eventually(what, DEADLINE, || seat.leading()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_of_two_seats_leads_and_shutdown_hands_over_at_once() {
    let (meta, _dir) = store();
    let (a, _) = seat(meta.clone(), "a");
    let (b, _) = seat(meta.clone(), "b");
    let (leader, standby) = eventually("one seat to lead", DEADLINE, || {
        match (a.leading(), b.leading()) {
            (Some(_), None) => Some((&a, &b)),
            (None, Some(_)) => Some((&b, &a)),
            (Some(_), Some(_)) => panic!("two seats lead at once"),
            (None, None) => None,
        }
    })
    .await;
    let won = leader.leading().unwrap();
    assert_eq!(
        meta.leader(MANAGER_ELECTION).await.unwrap(),
        Some(won.clone())
    );
    // For a while (several renewals), exactly one leads.
    let until = Instant::now() + TTL * 2;
    while Instant::now() < until {
        assert!(leader.leading().is_some() && standby.leading().is_none());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(standby.state(), SeatState::Standby);
    assert_eq!(
        standby.view().leader().as_deref(),
        Some(won.candidate.as_str())
    );

    let (leader, standby) = if std::ptr::eq(leader, &a) {
        (a, b)
    } else {
        (b, a)
    };
    let started = Instant::now();
    leader.shutdown().await;
    assert_eq!(
        meta.keep_alive(won.lease).await,
        Err(MetaError::LeaseNotFound(won.lease)),
        "shutdown revokes the lease"
    );
    leads(&standby, "the standby to take over").await;
    assert!(
        started.elapsed() < TTL / 2,
        "resigning hands over at once, not at lease expiry: {:?}",
        started.elapsed()
    );
    standby.shutdown().await;
    assert_eq!(meta.leader(MANAGER_ELECTION).await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_steps_down_and_campaigns_again_under_a_new_one() {
    let (meta, _dir) = store();
    let (a, metrics) = seat(meta.clone(), "a");
    let first = leads(&a, "a to lead").await;
    let mut states = a.subscribe();
    states.borrow_and_update();
    meta.revoke_lease(first.lease).await.unwrap();
    tokio::time::timeout(DEADLINE, states.wait_for(|s| *s == SeatState::Standby))
        .await
        .expect("a steps down")
        .unwrap();
    let second = leads(&a, "a to lead again").await;
    assert_ne!(second.lease, first.lease, "under a new lease");
    let text = metrics.encode();
    // Whichever noticed first: the keeper (lease gone) or the observer (seat
    // vacated by the revoke).
    assert!(
        text.contains("keyway_manager_step_downs_total{reason=\"lease_lost\"} 1")
            ^ text.contains("keyway_manager_step_downs_total{reason=\"unseated\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("keyway_manager_elections_won_total 2"),
        "{text}"
    );
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unseated_leader_steps_down_and_campaigns_again() {
    let (meta, _dir) = store();
    let (a, metrics) = seat(meta.clone(), "a");
    let first = leads(&a, "a to lead").await;
    let mut states = a.subscribe();
    states.borrow_and_update();
    // Someone else ends a's candidacy while a's lease lives on.
    meta.resign(&first).await.unwrap();
    tokio::time::timeout(DEADLINE, states.wait_for(|s| *s == SeatState::Standby))
        .await
        .expect("a steps down")
        .unwrap();
    let second = leads(&a, "a to lead again").await;
    assert_eq!(second.lease, first.lease, "the lease lives on");
    assert_ne!(second.token, first.token, "a new candidacy");
    assert!(
        metrics
            .encode()
            .contains("keyway_manager_step_downs_total{reason=\"unseated\"} 1")
    );
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_leader_stops_acting_before_a_standby_takes_over() {
    let (meta, _dir) = store();
    let cut = Arc::new(AtomicBool::new(false));
    let flaky: Arc<dyn MetaStore> = Arc::new(Flaky {
        inner: meta.clone(),
        cut: cut.clone(),
    });
    let (a, metrics) = seat(flaky, "a");
    leads(&a, "a to lead").await;
    let (b, _) = seat(meta.clone(), "b");
    eventually("b to queue behind a", DEADLINE, || {
        (b.view().leader().as_deref() == Some("a")).then_some(())
    })
    .await;

    cut.store(true, Ordering::SeqCst);
    let cut_at = Instant::now();
    let mut a_stopped = None;
    let b_took_over = loop {
        let (la, lb) = (a.leading().is_some(), b.leading().is_some());
        assert!(!(la && lb), "two leaders at once");
        if !la && a_stopped.is_none() {
            a_stopped = Some(cut_at.elapsed());
        }
        if lb {
            break cut_at.elapsed();
        }
        assert!(cut_at.elapsed() < DEADLINE, "b never took over");
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    let a_stopped = a_stopped.expect("a stopped first");
    assert!(
        a_stopped < TTL,
        "a stops by its own deadline: {a_stopped:?}"
    );
    assert!(
        b_took_over < TTL + Duration::from_millis(500),
        "b takes over once a's lease expires: {b_took_over:?}"
    );
    assert_eq!(a.state(), SeatState::Standby);
    assert!(
        metrics
            .encode()
            .contains("keyway_manager_step_downs_total{reason=\"deadline\"} 1")
    );

    // Healed, a finds its lease gone and queues behind b.
    cut.store(false, Ordering::SeqCst);
    let until = Instant::now() + TTL * 2;
    while Instant::now() < until {
        assert!(a.leading().is_none() && b.leading().is_some());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    b.shutdown().await;
    leads(&a, "a to take over from b").await;
    a.shutdown().await;
}

/// A store that fails every call (and ends open observations) while `cut`.
struct Flaky {
    inner: Arc<EmbeddedMeta>,
    cut: Arc<AtomicBool>,
}

impl Flaky {
    fn check(&self) -> Result<(), MetaError> {
        if self.cut.load(Ordering::SeqCst) {
            return Err(MetaError::Unavailable("cut off".into()));
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl MetaStore for Flaky {
    async fn get_map(&self) -> Result<PartitionMap, MetaError> {
        self.check()?;
        self.inner.get_map().await
    }
    async fn changes_since(&self, since: MapVersion) -> Result<MapUpdate, MetaError> {
        self.check()?;
        self.inner.changes_since(since).await
    }
    async fn watch(&self, since: MapVersion) -> Result<MapWatch, MetaError> {
        self.check()?;
        self.inner.watch(since).await
    }
    async fn commit(&self, txn: MapTxn) -> Result<MapVersion, MetaError> {
        self.check()?;
        self.inner.commit(txn).await
    }
    async fn commit_with_migration(
        &self,
        txn: MapTxn,
        put: keyway_meta::MigrationPut,
    ) -> Result<MapVersion, MetaError> {
        self.check()?;
        self.inner.commit_with_migration(txn, put).await
    }
    async fn register_node_in_zone(
        &self,
        id: Option<NodeId>,
        resp_addr: String,
        admin_addr: String,
        zone: Option<String>,
    ) -> Result<NodeId, MetaError> {
        self.check()?;
        self.inner
            .register_node_in_zone(id, resp_addr, admin_addr, zone)
            .await
    }
    async fn grant_lease(&self, node: NodeId, ttl_ms: u64) -> Result<LeaseId, MetaError> {
        self.check()?;
        self.inner.grant_lease(node, ttl_ms).await
    }
    async fn keep_alive(&self, lease: LeaseId) -> Result<u64, MetaError> {
        self.check()?;
        self.inner.keep_alive(lease).await
    }
    async fn revoke_lease(&self, lease: LeaseId) -> Result<(), MetaError> {
        self.check()?;
        self.inner.revoke_lease(lease).await
    }
    async fn leases(&self) -> Result<Vec<LeaseInfo>, MetaError> {
        self.check()?;
        self.inner.leases().await
    }
    async fn bootstrap_if_empty_with(
        &self,
        min: usize,
        per: u16,
        replication: keyway_meta::Replication,
    ) -> Result<bool, MetaError> {
        self.check()?;
        self.inner
            .bootstrap_if_empty_with(min, per, replication)
            .await
    }
    async fn grant_session_lease(&self, ttl_ms: u64) -> Result<LeaseId, MetaError> {
        self.check()?;
        self.inner.grant_session_lease(ttl_ms).await
    }
    async fn campaign(
        &self,
        election: &str,
        candidate: &str,
        lease: LeaseId,
    ) -> Result<Leadership, MetaError> {
        self.check()?;
        self.inner.campaign(election, candidate, lease).await
    }
    async fn leader(&self, election: &str) -> Result<Option<Leadership>, MetaError> {
        self.check()?;
        self.inner.leader(election).await
    }
    async fn observe(&self, election: &str) -> Result<LeaderWatch, MetaError> {
        self.check()?;
        let cut = self.cut.clone();
        let inner = self.inner.observe(election).await?;
        Ok(inner
            .map(move |item| {
                if cut.load(Ordering::SeqCst) {
                    Err(MetaError::Unavailable("cut off".into()))
                } else {
                    item
                }
            })
            .boxed())
    }
    async fn resign(&self, leadership: &Leadership) -> Result<(), MetaError> {
        self.check()?;
        self.inner.resign(leadership).await
    }
    async fn allocate_migration_id(&self) -> Result<u64, MetaError> {
        self.check()?;
        self.inner.allocate_migration_id().await
    }
    async fn put_migration(
        &self,
        id: u64,
        expected: Option<u64>,
        generation: u64,
        record: Vec<u8>,
    ) -> Result<(), MetaError> {
        self.check()?;
        self.inner
            .put_migration(id, expected, generation, record)
            .await
    }
    async fn get_migration(
        &self,
        id: u64,
    ) -> Result<Option<keyway_meta::StoredMigration>, MetaError> {
        self.check()?;
        self.inner.get_migration(id).await
    }
    async fn migrations(&self) -> Result<Vec<keyway_meta::StoredMigration>, MetaError> {
        self.check()?;
        self.inner.migrations().await
    }
    async fn delete_migration(&self, id: u64, expected: u64) -> Result<(), MetaError> {
        self.check()?;
        self.inner.delete_migration(id, expected).await
    }
}
