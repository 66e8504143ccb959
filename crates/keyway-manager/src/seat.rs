//! The manager's seat: exactly one `keyway manager` acts at a time.
//!
//! A [`Seat`] runs the election loop against the metadata store:
//!
//! 1. grant a session lease (`lease_ttl`) and keep it alive every ttl/3 on
//!    its own task; each renewal that succeeds sets the lease deadline to
//!    *send time* + granted TTL − `lease_margin` (as nodes do,
//!    `keyway-node/src/lease.rs`): whatever the renewal's delay, the store
//!    cannot expire the lease, and so hand the seat to someone else, before
//!    this process stops acting;
//! 2. campaign under that lease (standby while it waits);
//! 3. lead while the deadline holds: [`SeatView::leading`] checks it on
//!    every call, so a leader whose renewals stop stops acting at the
//!    deadline without being told, even if this task is late. The seat also
//!    observes the election and steps down if the store names anyone else;
//! 4. on a passed deadline or an unseating, step down and campaign again
//!    under the same lease (if it is still alive, the store gives the same
//!    candidacy back); on a lost lease (`LeaseNotFound`), start over with a
//!    new lease;
//! 5. on shutdown: step down, resign (the next candidate leads at once),
//!    revoke the lease.
//!
//! The state is published on a `tokio::sync::watch` of [`SeatState`].

use crate::metrics::Metrics;
use futures::StreamExt;
use keyway_meta::{Leadership, LeaseId, MetaError, MetaStore};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The election every manager campaigns in.
pub const MANAGER_ELECTION: &str = "keyway/manager";

/// How long shutdown waits for each of resign and revoke.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(2);

/// Settings of a [`Seat`].
#[derive(Clone, Debug)]
pub struct SeatConfig {
    pub election: String,
    /// This candidate's name (what `/status` and the store report).
    pub name: String,
    /// Session-lease TTL: a dead leader's seat passes within about this long.
    pub lease_ttl: Duration,
    /// Subtracted from every lease deadline (clock-rate slack).
    pub lease_margin: Duration,
}

impl SeatConfig {
    /// The manager election, with a margin of a tenth of the TTL.
    pub fn new(name: impl Into<String>, lease_ttl: Duration) -> Self {
        SeatConfig {
            election: MANAGER_ELECTION.to_string(),
            name: name.into(),
            lease_ttl,
            lease_margin: lease_ttl / 10,
        }
    }

    fn ttl_ms(&self) -> u64 {
        u64::try_from(self.lease_ttl.as_millis()).unwrap_or(u64::MAX)
    }

    fn renew_every(&self) -> Duration {
        self.lease_ttl / 3
    }

    fn retry_every(&self) -> Duration {
        (self.lease_ttl / 10).clamp(Duration::from_millis(20), Duration::from_secs(1))
    }
}

/// Where this manager stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SeatState {
    /// Not acting: campaigning, or waiting for the store.
    Standby,
    /// Holding the seat under this leadership (acting only while
    /// [`SeatView::leading`] says so: the lease deadline also counts).
    Leading(Leadership),
    /// Shut down.
    Stopped,
}

/// The lease the seat currently holds and its deadline by this process's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LeaseDeadline {
    lease: LeaseId,
    deadline: Instant,
}

struct Shared {
    meta: Arc<dyn MetaStore>,
    config: SeatConfig,
    metrics: Arc<Metrics>,
    state: watch::Sender<SeatState>,
    lease: watch::Sender<Option<LeaseDeadline>>,
    /// The store's leader as last observed (`None`: nobody, or unknown).
    leader: watch::Sender<Option<String>>,
}

impl Shared {
    /// Stops acting (if leading), counting why.
    fn stand_by(&self, reason: &'static str) {
        let mut was_leading = false;
        self.state.send_if_modified(|s| {
            was_leading = matches!(s, SeatState::Leading(_));
            if was_leading {
                *s = SeatState::Standby;
            }
            was_leading
        });
        if was_leading {
            self.metrics.leading.set(0);
            self.metrics.stepped_down(reason);
            if matches!(reason, "shutdown" | "dropped") {
                tracing::info!(name = %self.config.name, reason, "manager stepped down");
            } else {
                tracing::warn!(name = %self.config.name, reason, "manager stepped down");
            }
        }
    }

    fn lead(&self, leadership: &Leadership) {
        self.state
            .send_replace(SeatState::Leading(leadership.clone()));
        self.metrics.leading.set(1);
        self.metrics.elections_won.inc();
        tracing::info!(name = %self.config.name, lease = %leadership.lease, "manager leading");
    }
}

/// A cheap, cloneable read handle on a [`Seat`].
#[derive(Clone)]
pub struct SeatView(Arc<Shared>);

impl SeatView {
    pub fn name(&self) -> &str {
        &self.0.config.name
    }

    pub fn config(&self) -> &SeatConfig {
        &self.0.config
    }

    /// The published state.
    pub fn state(&self) -> SeatState {
        self.0.state.borrow().clone()
    }

    /// Every state change.
    pub fn subscribe(&self) -> watch::Receiver<SeatState> {
        self.0.state.subscribe()
    }

    /// The leadership to act under, if this manager leads *now*: the seat is
    /// held and the lease deadline (by this process's clock) has not passed.
    /// Work checks this before every step it takes as leader.
    pub fn leading(&self) -> Option<Leadership> {
        let state = self.0.state.borrow();
        let SeatState::Leading(leadership) = &*state else {
            return None;
        };
        let valid = self
            .0
            .lease
            .borrow()
            .is_some_and(|l| l.lease == leadership.lease && Instant::now() < l.deadline);
        valid.then(|| leadership.clone())
    }

    /// Who leads, as far as this manager knows: itself if it leads, else the
    /// store's leader as last observed (`None`: nobody, or unknown).
    pub fn leader(&self) -> Option<String> {
        match self.leading() {
            Some(l) => Some(l.candidate),
            None => self.0.leader.borrow().clone(),
        }
    }

    /// Time left before this process's own lease deadline.
    pub fn lease_remaining(&self) -> Duration {
        self.0
            .lease
            .borrow()
            .map(|l| l.deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_default()
    }
}

/// The running election loop; see the module docs.
pub struct Seat {
    view: SeatView,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Seat {
    /// Starts campaigning (needs a tokio runtime).
    pub fn start(meta: Arc<dyn MetaStore>, config: SeatConfig, metrics: Arc<Metrics>) -> Seat {
        let shared = Arc::new(Shared {
            meta,
            config,
            metrics,
            state: watch::channel(SeatState::Standby).0,
            lease: watch::channel(None).0,
            leader: watch::channel(None).0,
        });
        let (stop, stop_rx) = watch::channel(false);
        let tasks = vec![
            tokio::spawn(run(shared.clone(), stop_rx.clone())),
            tokio::spawn(follow_leader(shared.clone(), stop_rx)),
        ];
        Seat {
            view: SeatView(shared),
            stop,
            tasks,
        }
    }

    pub fn view(&self) -> SeatView {
        self.view.clone()
    }

    pub fn state(&self) -> SeatState {
        self.view.state()
    }

    pub fn subscribe(&self) -> watch::Receiver<SeatState> {
        self.view.subscribe()
    }

    /// See [`SeatView::leading`].
    pub fn leading(&self) -> Option<Leadership> {
        self.view.leading()
    }

    /// Steps down, resigns if leading (the next candidate leads at once),
    /// revokes the lease, and waits for the loop to end (state `Stopped`).
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        for task in self.tasks.drain(..) {
            let _ = task.await;
        }
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        // Dropped without shutdown: stop acting at once; the lease expires.
        let _ = self.stop.send(true);
        for task in &self.tasks {
            task.abort();
        }
        self.view.0.stand_by("dropped");
    }
}

/// Aborts the task when dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Resolves once shutdown is asked for (or the seat is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    loop {
        if *stop.borrow_and_update() || stop.changed().await.is_err() {
            return;
        }
    }
}

/// Sleeps `d`, or returns false at once if shutdown is asked for.
async fn pause(stop: &mut watch::Receiver<bool>, d: Duration) -> bool {
    tokio::select! {
        _ = stopped(stop) => false,
        _ = tokio::time::sleep(d) => true,
    }
}

async fn run(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    while let Some(lease) = grant(&shared, &mut stop).await {
        match with_lease(&shared, lease, &mut stop).await {
            LeaseEnd::Lost => {
                shared.stand_by("lease_lost");
                shared.lease.send_replace(None);
            }
            LeaseEnd::Stop(leadership) => {
                release(&shared, lease, leadership).await;
                break;
            }
        }
    }
    shared.stand_by("shutdown");
    shared.lease.send_replace(None);
    shared.state.send_replace(SeatState::Stopped);
}

/// A new session lease, retried until granted; `None` on shutdown.
async fn grant(shared: &Shared, stop: &mut watch::Receiver<bool>) -> Option<LeaseId> {
    let cfg = &shared.config;
    loop {
        let sent = Instant::now();
        let granted = tokio::select! {
            biased;
            _ = stopped(stop) => return None,
            r = tokio::time::timeout(cfg.lease_ttl, shared.meta.grant_session_lease(cfg.ttl_ms())) => r,
        };
        match granted {
            Ok(Ok(lease)) => {
                let deadline = sent + cfg.lease_ttl.saturating_sub(cfg.lease_margin);
                shared
                    .lease
                    .send_replace(Some(LeaseDeadline { lease, deadline }));
                tracing::debug!(name = %cfg.name, %lease, "session lease granted");
                return Some(lease);
            }
            Ok(Err(err)) => tracing::warn!(name = %cfg.name, %err, "cannot get a session lease"),
            Err(_) => tracing::warn!(name = %cfg.name, "session lease grant timed out"),
        }
        if !pause(stop, cfg.retry_every()).await {
            return None;
        }
    }
}

enum LeaseEnd {
    /// The store no longer has the lease: start over with a new one.
    Lost,
    /// Shutdown; the leadership held then, if any.
    Stop(Option<Leadership>),
}

enum Led {
    Stop,
    LeaseLost,
    DeadlinePassed,
    Unseated,
}

/// Campaigns and leads under `lease` until it is lost or shutdown.
async fn with_lease(
    shared: &Arc<Shared>,
    lease: LeaseId,
    stop: &mut watch::Receiver<bool>,
) -> LeaseEnd {
    let cfg = &shared.config;
    let mut keeper = AbortOnDrop(tokio::spawn(keep_alive(shared.clone(), lease)));
    loop {
        let won = tokio::select! {
            biased;
            _ = stopped(stop) => return LeaseEnd::Stop(None),
            _ = &mut keeper.0 => return LeaseEnd::Lost,
            won = shared.meta.campaign(&cfg.election, &cfg.name, lease) => won,
        };
        let leadership = match won {
            Ok(leadership) => leadership,
            Err(MetaError::LeaseNotFound(_)) => return LeaseEnd::Lost,
            Err(err) => {
                tracing::warn!(name = %cfg.name, %err, "campaign failed; retrying");
                shared.metrics.campaign_errors.inc();
                tokio::select! {
                    biased;
                    _ = stopped(stop) => return LeaseEnd::Stop(None),
                    _ = &mut keeper.0 => return LeaseEnd::Lost,
                    _ = tokio::time::sleep(cfg.retry_every()) => continue,
                }
            }
        };
        match lead(shared, &leadership, &mut keeper, stop).await {
            Led::Stop => return LeaseEnd::Stop(Some(leadership)),
            Led::LeaseLost => return LeaseEnd::Lost,
            Led::DeadlinePassed => shared.stand_by("deadline"),
            Led::Unseated => shared.stand_by("unseated"),
        }
    }
}

/// Leads under `leadership` while the lease deadline holds.
async fn lead(
    shared: &Arc<Shared>,
    leadership: &Leadership,
    keeper: &mut AbortOnDrop,
    stop: &mut watch::Receiver<bool>,
) -> Led {
    let mut lease_rx = shared.lease.subscribe();
    let valid_until = |l: Option<LeaseDeadline>| {
        l.filter(|l| l.lease == leadership.lease && Instant::now() < l.deadline)
            .map(|l| l.deadline)
    };
    // Won, but renewals are failing: hold the seat without acting until one
    // succeeds (or the lease is found dead).
    while valid_until(*lease_rx.borrow_and_update()).is_none() {
        tokio::select! {
            biased;
            _ = stopped(stop) => return Led::Stop,
            _ = &mut keeper.0 => return Led::LeaseLost,
            r = lease_rx.changed() => if r.is_err() { return Led::LeaseLost },
        }
    }
    shared.lead(leadership);
    // Opened after the win: its first item is already current.
    let unseated = unseated(shared.clone(), leadership.clone());
    tokio::pin!(unseated);
    loop {
        let Some(deadline) = valid_until(*lease_rx.borrow_and_update()) else {
            return Led::DeadlinePassed;
        };
        tokio::select! {
            biased;
            _ = stopped(stop) => return Led::Stop,
            _ = &mut keeper.0 => return Led::LeaseLost,
            _ = tokio::time::sleep_until(deadline) => {}
            r = lease_rx.changed() => if r.is_err() { return Led::LeaseLost },
            _ = &mut unseated => return Led::Unseated,
        }
    }
}

/// Resolves if the store names anyone but `leadership` as leader.
async fn unseated(shared: Arc<Shared>, leadership: Leadership) {
    let cfg = &shared.config;
    loop {
        match shared.meta.observe(&cfg.election).await {
            Ok(mut leaders) => loop {
                match leaders.next().await {
                    Some(Ok(Some(l)))
                        if l.token == leadership.token && l.lease == leadership.lease => {}
                    Some(Ok(other)) => {
                        tracing::warn!(name = %cfg.name, leader = ?other.map(|l| l.candidate), "the store names another leader");
                        return;
                    }
                    Some(Err(err)) => {
                        tracing::debug!(%err, "election observation ended");
                        break;
                    }
                    None => break,
                }
            },
            Err(err) => tracing::debug!(%err, "cannot observe the election"),
        }
        tokio::time::sleep(cfg.retry_every()).await;
    }
}

/// Renews `lease` every ttl/3 and moves its deadline; returns once the
/// store says the lease is gone.
async fn keep_alive(shared: Arc<Shared>, lease: LeaseId) {
    let cfg = &shared.config;
    let mut wait = cfg.renew_every();
    loop {
        tokio::time::sleep(wait).await;
        let sent = Instant::now();
        // A renewal slower than the renewal period is a failed one.
        match tokio::time::timeout(cfg.renew_every(), shared.meta.keep_alive(lease)).await {
            Ok(Ok(granted_ms)) => {
                let granted = Duration::from_millis(granted_ms);
                let deadline = sent + granted.saturating_sub(cfg.lease_margin);
                shared.lease.send_if_modified(|l| match l {
                    Some(l) if l.lease == lease => {
                        l.deadline = l.deadline.max(deadline);
                        true
                    }
                    _ => false,
                });
                wait = cfg.renew_every();
            }
            Ok(Err(MetaError::LeaseNotFound(_))) => {
                tracing::warn!(name = %cfg.name, %lease, "session lease expired in the metadata store");
                shared.metrics.lease_renewal_failures.inc();
                return;
            }
            Ok(Err(err)) => {
                tracing::warn!(name = %cfg.name, %err, "session lease renewal failed");
                shared.metrics.lease_renewal_failures.inc();
                wait = cfg.retry_every();
            }
            Err(_) => {
                tracing::warn!(name = %cfg.name, "session lease renewal timed out");
                shared.metrics.lease_renewal_failures.inc();
                wait = cfg.retry_every();
            }
        }
    }
}

/// Shutdown: stop acting, resign, revoke the lease.
async fn release(shared: &Shared, lease: LeaseId, leadership: Option<Leadership>) {
    shared.stand_by("shutdown");
    let meta = &shared.meta;
    if let Some(leadership) = leadership {
        match tokio::time::timeout(RELEASE_TIMEOUT, meta.resign(&leadership)).await {
            Ok(Ok(())) => tracing::info!(name = %shared.config.name, "manager resigned"),
            Ok(Err(err)) => {
                tracing::warn!(%err, "resign failed; the seat passes when the lease ends")
            }
            Err(_) => tracing::warn!("resign timed out; the seat passes when the lease ends"),
        }
    }
    match tokio::time::timeout(RELEASE_TIMEOUT, meta.revoke_lease(lease)).await {
        Ok(Ok(())) | Ok(Err(MetaError::LeaseNotFound(_))) => {}
        Ok(Err(err)) => tracing::warn!(%err, "revoking the session lease failed"),
        Err(_) => tracing::warn!("revoking the session lease timed out"),
    }
}

/// Keeps `shared.leader` at the store's leader, as observed.
async fn follow_leader(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let cfg = &shared.config;
    loop {
        let opened = tokio::select! {
            biased;
            _ = stopped(&mut stop) => return,
            r = shared.meta.observe(&cfg.election) => r,
        };
        match opened {
            Ok(mut leaders) => loop {
                let item = tokio::select! {
                    biased;
                    _ = stopped(&mut stop) => return,
                    item = leaders.next() => item,
                };
                match item {
                    Some(Ok(leader)) => {
                        shared.leader.send_replace(leader.map(|l| l.candidate));
                    }
                    Some(Err(err)) => {
                        tracing::debug!(%err, "election observation ended");
                        break;
                    }
                    None => break,
                }
            },
            Err(err) => tracing::debug!(%err, "cannot observe the election"),
        }
        shared.leader.send_replace(None);
        if !pause(&mut stop, cfg.retry_every()).await {
            return;
        }
    }
}
