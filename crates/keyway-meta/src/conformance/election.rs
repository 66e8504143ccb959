//! Leader election: campaign / leader / observe / resign on session leases.
//! At most one candidate leads an election at any time; the seat passes in
//! arrival order when the leader resigns or its lease ends; a candidacy
//! never outlives its lease or the campaign call that waits on it.

use super::{DEADLINE, Fixture, eventually};
use crate::{LeaderWatch, Leadership, LeaseId, MetaError, MetaStore};
use futures::StreamExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

const ELECTION: &str = "conformance/seat";

/// A TTL no test outlives: such a lease needs no keep-alive.
const LONG_TTL_MS: u64 = 60_000;

/// How long a candidate that must keep waiting is watched not to win.
const STILL_WAITING: Duration = Duration::from_millis(300);

async fn session_lease(store: &dyn MetaStore, ttl_ms: u64) -> LeaseId {
    store
        .grant_session_lease(ttl_ms)
        .await
        .expect("grant_session_lease")
}

/// Campaigns, failing the test if the seat is not won within [`DEADLINE`].
async fn win(store: &dyn MetaStore, candidate: &str, lease: LeaseId) -> Leadership {
    tokio::time::timeout(DEADLINE, store.campaign(ELECTION, candidate, lease))
        .await
        .unwrap_or_else(|_| panic!("{candidate} did not win an empty seat in time"))
        .expect("campaign")
}

/// A campaign running on its own task (so it can wait while the test acts).
fn campaign_in_background(
    store: &Arc<dyn MetaStore>,
    candidate: &str,
    lease: LeaseId,
) -> tokio::task::JoinHandle<Result<Leadership, MetaError>> {
    let store = store.clone();
    let candidate = candidate.to_string();
    tokio::spawn(async move { store.campaign(ELECTION, &candidate, lease).await })
}

/// Asserts the background campaign is still waiting after [`STILL_WAITING`].
async fn assert_waiting(
    handle: &mut tokio::task::JoinHandle<Result<Leadership, MetaError>>,
    who: &str,
) {
    let early = tokio::time::timeout(STILL_WAITING, &mut *handle).await;
    assert!(early.is_err(), "{who} must still be waiting: {early:?}");
}

/// The background campaign's result, within [`DEADLINE`].
async fn finished(
    handle: tokio::task::JoinHandle<Result<Leadership, MetaError>>,
    who: &str,
) -> Result<Leadership, MetaError> {
    tokio::time::timeout(DEADLINE, handle)
        .await
        .unwrap_or_else(|_| panic!("{who}'s campaign did not end in time"))
        .expect("campaign task")
}

async fn next_leader(watch: &mut LeaderWatch) -> Option<Leadership> {
    tokio::time::timeout(DEADLINE, watch.next())
        .await
        .expect("no observed leader change within the deadline")
        .expect("observe stream ended")
        .expect("observe item")
}

/// One candidate wins an empty seat at once; `leader()` reports exactly the
/// leadership `campaign` returned; resigning frees the seat and is
/// idempotent; a new win is a new candidacy (new token). Session leases are
/// not node leases. Argument and lease checks.
pub async fn single_candidate_wins_at_once(f: &Fixture) {
    let store = &*f.store;
    assert_eq!(store.leader(ELECTION).await, Ok(None));
    let lease = session_lease(store, LONG_TTL_MS).await;
    assert!(
        !store
            .leases()
            .await
            .unwrap()
            .iter()
            .any(|l| l.lease == lease),
        "session leases are not listed as node leases"
    );
    assert_eq!(store.keep_alive(lease).await, Ok(LONG_TTL_MS));

    let won = win(store, "a", lease).await;
    assert_eq!(
        (won.election.as_str(), won.candidate.as_str(), won.lease),
        (ELECTION, "a", lease)
    );
    assert_eq!(store.leader(ELECTION).await, Ok(Some(won.clone())));
    assert_eq!(
        store.leader("conformance/other").await,
        Ok(None),
        "elections are independent"
    );

    store.resign(&won).await.unwrap();
    assert_eq!(store.leader(ELECTION).await, Ok(None));
    store.resign(&won).await.expect("resigning twice is fine");

    let again = win(store, "a", lease).await;
    assert_ne!(again.token, won.token, "a new win is a new candidacy");
    store.resign(&won).await.unwrap();
    assert_eq!(
        store.leader(ELECTION).await,
        Ok(Some(again.clone())),
        "resigning a past leadership leaves the current one alone"
    );
    store.resign(&again).await.unwrap();

    let never = LeaseId(987_654);
    assert_eq!(
        store.campaign(ELECTION, "x", never).await,
        Err(MetaError::LeaseNotFound(never))
    );
    assert!(matches!(
        store.campaign("", "x", lease).await,
        Err(MetaError::InvalidArgument(_))
    ));
    assert!(matches!(
        store.grant_session_lease(0).await,
        Err(MetaError::InvalidArgument(_))
    ));
    store.revoke_lease(lease).await.unwrap();
    assert_eq!(
        store.campaign(ELECTION, "a", lease).await,
        Err(MetaError::LeaseNotFound(lease))
    );
}

/// A second candidate waits while the first leads and wins the moment the
/// first resigns; the old leader's late resignation does not unseat it.
pub async fn second_candidate_waits_until_the_first_resigns(f: &Fixture) {
    let store = &f.store;
    let la = session_lease(&**store, LONG_TTL_MS).await;
    let lb = session_lease(&**store, LONG_TTL_MS).await;
    let a = win(&**store, "a", la).await;
    let mut b = campaign_in_background(store, "b", lb);
    assert_waiting(&mut b, "b").await;
    assert_eq!(store.leader(ELECTION).await, Ok(Some(a.clone())));

    store.resign(&a).await.unwrap();
    let b = finished(b, "b").await.expect("b wins once a resigns");
    assert_eq!((b.candidate.as_str(), b.lease), ("b", lb));
    assert_eq!(store.leader(ELECTION).await, Ok(Some(b.clone())));
    store.resign(&a).await.unwrap();
    assert_eq!(store.leader(ELECTION).await, Ok(Some(b.clone())));
    store.resign(&b).await.unwrap();
}

/// Campaigning again under the leader's lease returns the same leadership at
/// once (and renames the candidate); the waiting queue is unaffected.
pub async fn campaigning_again_under_the_same_lease_rejoins(f: &Fixture) {
    let store = &f.store;
    let la = session_lease(&**store, LONG_TTL_MS).await;
    let a = win(&**store, "a", la).await;
    assert_eq!(win(&**store, "a", la).await, a);
    let renamed = win(&**store, "a2", la).await;
    assert_eq!(renamed.token, a.token, "the same candidacy");
    assert_eq!(renamed.candidate, "a2");
    assert_eq!(store.leader(ELECTION).await, Ok(Some(renamed.clone())));
    store.resign(&renamed).await.unwrap();
    assert_eq!(store.leader(ELECTION).await, Ok(None));
}

/// The seat passes when the leader's lease expires (never before: the old
/// lease is dead by the time the next candidate leads) and when it is
/// revoked.
pub async fn leadership_passes_when_the_leader_lease_ends(f: &Fixture) {
    let store = &f.store;
    let lb = session_lease(&**store, LONG_TTL_MS).await;
    let lc = session_lease(&**store, LONG_TTL_MS).await;
    let short = session_lease(&**store, 500).await;
    let a = win(&**store, "a", short).await;
    let b = campaign_in_background(store, "b", lb);
    let b = finished(b, "b")
        .await
        .expect("b wins once a's lease expires");
    assert_eq!(b.candidate, "b");
    assert_eq!(
        store.keep_alive(a.lease).await,
        Err(MetaError::LeaseNotFound(short)),
        "b may lead only once a's lease is gone"
    );
    assert_eq!(store.leader(ELECTION).await, Ok(Some(b.clone())));
    store
        .resign(&a)
        .await
        .expect("resigning an expired leadership is fine");
    assert_eq!(store.leader(ELECTION).await, Ok(Some(b.clone())));

    let mut c = campaign_in_background(store, "c", lc);
    assert_waiting(&mut c, "c").await;
    store.revoke_lease(lb).await.unwrap();
    let c = finished(c, "c")
        .await
        .expect("c wins once b's lease is revoked");
    assert_eq!(store.leader(ELECTION).await, Ok(Some(c.clone())));
    store.resign(&c).await.unwrap();
}

/// A waiting candidacy never outlives its lease (its campaign ends with
/// `LeaseNotFound`), nor a campaign call that was dropped: neither can win
/// later.
pub async fn a_waiting_candidacy_ends_with_its_lease_or_its_call(f: &Fixture) {
    let store = &f.store;
    let la = session_lease(&**store, LONG_TTL_MS).await;
    let short = session_lease(&**store, 500).await;
    let ld = session_lease(&**store, LONG_TTL_MS).await;
    let a = win(&**store, "a", la).await;

    // b's lease expires while it waits.
    let b = campaign_in_background(store, "b", short);
    assert_eq!(finished(b, "b").await, Err(MetaError::LeaseNotFound(short)));

    // d's call is dropped while it waits (its lease stays alive).
    let mut d = campaign_in_background(store, "d", ld);
    assert_waiting(&mut d, "d").await;
    d.abort();
    let _ = d.await;

    store.resign(&a).await.unwrap();
    eventually(
        "the seat to stay empty: no dropped or expired candidacy may take it",
        DEADLINE,
        || async {
            store
                .leader(ELECTION)
                .await
                .unwrap()
                .is_none()
                .then_some(())
        },
    )
    .await;
    assert_eq!(store.keep_alive(ld).await, Ok(LONG_TTL_MS));
    // And d, campaigning again, wins the empty seat.
    let d = win(&**store, "d", ld).await;
    store.resign(&d).await.unwrap();
}

/// `observe` reports the current leader first, then every change, in order.
pub async fn observe_reports_every_leader_change(f: &Fixture) {
    let store = &f.store;
    let mut watch = store.observe(ELECTION).await.unwrap();
    assert_eq!(next_leader(&mut watch).await, None);
    let la = session_lease(&**store, LONG_TTL_MS).await;
    let lb = session_lease(&**store, LONG_TTL_MS).await;
    let a = win(&**store, "a", la).await;
    assert_eq!(next_leader(&mut watch).await, Some(a.clone()));
    let mut b = campaign_in_background(store, "b", lb);
    assert_waiting(&mut b, "b").await;
    store.resign(&a).await.unwrap();
    let b = finished(b, "b").await.unwrap();
    assert_eq!(next_leader(&mut watch).await, Some(b.clone()));
    store.revoke_lease(lb).await.unwrap();
    assert_eq!(next_leader(&mut watch).await, None);

    // A second observer starts from the current state.
    let a = win(&**store, "a", la).await;
    let mut late = store.observe(ELECTION).await.unwrap();
    assert_eq!(next_leader(&mut late).await, Some(a.clone()));
    store.resign(&a).await.unwrap();
}

/// Many candidates campaign, hold the seat briefly and resign, over several
/// rounds: every candidacy wins exactly once, and never two at a time.
pub async fn concurrent_campaigns_have_at_most_one_leader(f: &Fixture) {
    const CANDIDATES: usize = 4;
    const ROUNDS: usize = 3;
    let leading = Arc::new(AtomicUsize::new(0));
    let wins = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..CANDIDATES {
        let store = f.store.clone();
        let (leading, wins) = (leading.clone(), wins.clone());
        tasks.push(tokio::spawn(async move {
            let lease = session_lease(&*store, LONG_TTL_MS).await;
            let name = format!("c{i}");
            for _ in 0..ROUNDS {
                let won = store.campaign(ELECTION, &name, lease).await.unwrap();
                let before = leading.fetch_add(1, Ordering::SeqCst);
                assert_eq!(before, 0, "{name} won while another candidate led");
                assert_eq!(store.leader(ELECTION).await, Ok(Some(won.clone())));
                // Hold the seat a moment so the others pile up behind it.
                tokio::time::sleep(Duration::from_millis(5)).await;
                leading.fetch_sub(1, Ordering::SeqCst);
                wins.fetch_add(1, Ordering::SeqCst);
                store.resign(&won).await.unwrap();
            }
        }));
    }
    for task in tasks {
        tokio::time::timeout(DEADLINE * 3, task)
            .await
            .expect("every candidate wins every round in time")
            .expect("candidate task");
    }
    assert_eq!(wins.load(Ordering::SeqCst), CANDIDATES * ROUNDS);
    assert_eq!(f.store.leader(ELECTION).await, Ok(None));
}
