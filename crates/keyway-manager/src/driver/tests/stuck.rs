//! Issue 11, stuck migrations: a dead target during an abort, a dead old
//! source in `CLEANUP`, and a leader that died between persisting `ABORTED`
//! and finishing the revert. Each record must end (the range free for a
//! later move or split), and the copy left behind must be dropped when its
//! node is back.

use super::*;
use crate::split::{SplitAt, split_partition};

/// The record of `id` once `pred` holds for it.
async fn record_until(
    env: &Env,
    id: MigrationId,
    what: &str,
    pred: impl Fn(&MigrationRecord) -> bool,
) -> MigrationRecord {
    let pred = &pred;
    eventually(what, || async move {
        let rec = env.record(id).await;
        pred(&rec).then_some(rec)
    })
    .await
}

fn decisions(env: &Env, action: &str) -> Vec<crate::Decision> {
    env.decisions
        .recent()
        .into_iter()
        .filter(|d| d.duty == "migration" && d.action == action)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abort_with_a_dead_target_ends_and_its_copy_goes_when_it_is_back() {
    let (env, id) = Env::mid_copy().await;
    let partial = env.fake.entries(env.target, &env.range).len();
    assert!(partial > 0);
    env.fake.set_down(env.target, true);
    request_abort(&*env.meta, id).await.unwrap();
    // The record ends although the target cannot drop its copy.
    let rec = env.finished(id).await;
    assert_eq!(
        (rec.state, rec.stray),
        (MigrationState::Aborted, Some(env.target))
    );
    assert_eq!(env.owner().await, (env.source, env.partition.epoch));
    assert_eq!(env.fake.entries(env.target, &env.range).len(), partial);
    let view = env.driver.as_ref().unwrap().view();
    let listed = view.migrations().await.unwrap();
    assert_eq!(listed[0].stray, Some(env.target), "shown in /migrations");
    let gave_up = decisions(&env, "leave_copy");
    assert_eq!(gave_up.len(), 1, "{gave_up:?}");
    assert!(gave_up[0].detail.contains(&format!("node {}", env.target)));
    let text = env.metrics.encode();
    assert!(
        text.contains("keyway_manager_migration_cleanup_give_ups_total 1"),
        "{text}"
    );
    let e = &env;
    eventually("the stray gauge", || async move {
        e.metrics
            .encode()
            .contains("keyway_manager_migration_stray_copies 1")
            .then_some(())
    })
    .await;
    // The range is free: a split is not refused for the ended migration.
    let (left, right) = split_partition(&*env.meta, env.partition.id, SplitAt::Auto)
        .await
        .unwrap();
    assert_eq!((left.owner, right.owner), (env.source, env.source));
    // The target comes back: its copy is dropped, the record forgets it.
    env.fake.set_down(env.target, false);
    let rec = record_until(&env, id, "the stray copy to be dropped", |r| {
        r.stray.is_none()
    })
    .await;
    assert_eq!(rec.state, MigrationState::Aborted);
    assert_eq!(env.fake.entries(env.target, &env.range), vec![]);
    assert_eq!(env.fake.entries(env.source, &env.range), env.seeded());
    let e = &env;
    eventually("the gauge to drop", || async move {
        e.metrics
            .encode()
            .contains("keyway_manager_migration_stray_copies 0")
            .then_some(())
    })
    .await;
    assert_eq!(decisions(&env, "drop_copy").len(), 1);
    // And a later move of (a child of) the range to that target works.
    env.fake.set_faults(Faults::default());
    let child = request_move(&*env.meta, left.id, env.target).await.unwrap();
    assert_eq!(env.finished(child.id).await.state, MigrationState::Done);
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_old_source_in_cleanup_ends_done_and_its_copy_goes_when_it_is_back() {
    let env = Env::without_driver(Faults::default()).await;
    // The source answers until the flip, then is dead for the cleanup.
    env.fake.set_down_for_cleanup(env.source, true);
    let env = env.start_driver();
    let id = env.request().await.id;
    let rec = env.finished(id).await;
    assert_eq!(
        (rec.state, rec.stray),
        (MigrationState::Done, Some(env.source))
    );
    let flipped = (env.target, Epoch(env.partition.epoch.0 + 1));
    assert_eq!(env.owner().await, flipped);
    assert_eq!(env.fake.entries(env.target, &env.range), env.seeded());
    assert_eq!(
        env.fake.entries(env.source, &env.range),
        env.seeded(),
        "the stale copy stays while the source is dead"
    );
    assert_eq!(decisions(&env, "leave_copy").len(), 1);
    // The range is free: a move back is accepted (and waits for nothing).
    let back = request_move(&*env.meta, env.partition.id, env.source).await;
    assert!(back.is_ok(), "{back:?}");
    request_abort(&*env.meta, back.unwrap().id).await.unwrap();
    // Back: the stale copy is dropped, everything else kept.
    env.fake.set_down_for_cleanup(env.source, false);
    let rec = record_until(&env, id, "the stale copy to be dropped", |r| {
        r.stray.is_none()
    })
    .await;
    assert_eq!(rec.state, MigrationState::Done);
    let e = &env;
    eventually("the source's copy gone", || async move {
        (e.fake.keys_in(e.source, &e.range) == 0).then_some(())
    })
    .await;
    assert_eq!(
        env.fake.len(env.source),
        OTHER_KEYS,
        "only the range is dropped"
    );
    assert_eq!(env.fake.entries(env.target, &env.range), env.seeded());
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_finishes_an_aborted_records_revert() {
    let (mut env, id) = Env::mid_copy().await;
    // The leader dies right after persisting ABORTED, before reverting
    // (here: the driver is stopped, then the ABORTED record is written).
    env.driver.take().unwrap().shutdown().await;
    let aborted = request_abort(&*env.meta, id).await.unwrap();
    assert_eq!(aborted.stray, Some(env.target));
    assert!(!env.fake.entries(env.target, &env.range).is_empty());
    assert_eq!(env.fake.pushes(env.source), 1, "the push still runs");
    // The next leader's driver finishes the revert.
    let env = env.start_driver();
    let rec = record_until(&env, id, "the revert to finish", |r| r.stray.is_none()).await;
    assert_eq!(rec.state, MigrationState::Aborted);
    env.assert_reverted().await;
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stray_copy_of_a_decommissioned_node_is_forgotten() {
    let env = Env::new(Faults {
        hold_copy: true,
        ..Faults::default()
    })
    .await;
    // A third node, owning nothing: the move's target.
    let n3 = env
        .meta
        .register_node(None, "r3:6379".into(), "node-3:7000".into())
        .await
        .unwrap();
    env.fake.add_node(n3, "node-3:7000");
    let id = request_move(&*env.meta, env.partition.id, n3)
        .await
        .unwrap()
        .id;
    let e = &env;
    eventually("a partial copy at the third node", || async move {
        (e.fake.keys_in(n3, &e.range) > 0).then_some(())
    })
    .await;
    env.fake.set_down(n3, true);
    request_abort(&*env.meta, id).await.unwrap();
    let rec = env.finished(id).await;
    assert_eq!(rec.stray, Some(n3));
    crate::rebalance::decommission(&*env.meta, n3, true)
        .await
        .unwrap();
    let rec = record_until(&env, id, "the obligation to be dropped", |r| {
        r.stray.is_none()
    })
    .await;
    assert_eq!(rec.state, MigrationState::Aborted);
    assert_eq!(env.owner().await, (env.source, env.partition.epoch));
    env.shutdown().await;
}
