//! A partition split (or merged) under a migration that was requested in
//! the gap between the split's migration check and its commit: the move
//! must abort, never flip, and never delete what the target owns.

use super::*;
use crate::split::{SplitAt, SplitError, plan_split, split_partition};
use crate::{MergeError, merge_partitions};

/// Commits a split of the moved partition straight to the store, as the
/// race would (no migration check, no abort request). Returns the children.
async fn split_under(env: &Env) -> (PartitionRecord, PartitionRecord) {
    let map = env.meta.get_map().await.unwrap();
    let plan = plan_split(&map, env.partition.id, &SplitAt::Auto, None).unwrap();
    env.meta.commit(plan.txn).await.unwrap();
    (plan.left, plan.right)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_of_a_partition_split_under_it_aborts_and_never_flips() {
    let (env, id) = Env::mid_copy().await;
    let (left, right) = split_under(&env).await;
    env.fake.set_faults(Faults::default());
    let rec = env.finished(id).await;
    assert_eq!(rec.state, MigrationState::Aborted, "{rec:?}");
    assert!(!rec.flipped());
    assert!(
        matches!(
            rec.abort_reason,
            Some(AbortReason::FlipConflict { current: None })
        ),
        "{:?}",
        rec.abort_reason
    );
    let map = env.meta.get_map().await.unwrap();
    for child in [&left, &right] {
        let now = &map.partitions[&child.id];
        assert_eq!((now.owner, now.epoch), (env.source, child.epoch));
    }
    assert_eq!(env.fake.entries(env.source, &env.range), env.seeded());
    assert_eq!(
        env.fake.entries(env.target, &env.range),
        vec![],
        "the target owns nothing of the range: its copy is dropped"
    );
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aborted_move_never_drops_a_range_the_target_owns_part_of() {
    let (env, id) = Env::mid_copy().await;
    let (left, _right) = split_under(&env).await;
    // The seeded keys are all in the left child; it goes to the target
    // (metadata only: this test is about what the abort deletes).
    let moved = PartitionRecord {
        owner: env.target,
        epoch: Epoch(left.epoch.0 + 1),
        ..left.clone()
    };
    env.meta
        .commit(keyway_meta::MapTxn {
            conditions: vec![keyway_map::OwnershipCondition {
                partition: left.id,
                expected: Some((left.owner, left.epoch)),
            }],
            changes: vec![keyway_map::MapChange::UpsertPartition(moved)],
        })
        .await
        .unwrap();
    env.fake.set_faults(Faults::default());
    let rec = env.finished(id).await;
    assert_eq!(rec.state, MigrationState::Aborted, "{rec:?}");
    assert_eq!(
        env.fake.entries(env.target, &env.range),
        env.seeded(),
        "the target's keys in the range it owns are kept"
    );
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_of_a_child_waits_until_the_parents_move_ended() {
    let (env, parent_move) = Env::mid_copy().await;
    let (left, _right) = split_under(&env).await;
    // The seeded keys are all in the left child.
    let child_move = request_move(&*env.meta, left.id, env.target)
        .await
        .unwrap()
        .id;
    env.fake.set_faults(Faults::default());
    assert_eq!(
        env.finished(parent_move).await.state,
        MigrationState::Aborted
    );
    assert_eq!(env.finished(child_move).await.state, MigrationState::Done);
    let log = env.fake.log();
    let started = |id: MigrationId| {
        let line = format!("n{} start {id} copy=true", env.source.0);
        log.iter().position(|l| *l == line).unwrap()
    };
    let parent_stopped = log
        .iter()
        .rposition(|l| *l == format!("n{} stop {parent_move}", env.source.0))
        .unwrap();
    let target_drops = format!("n{} drop", env.target.0);
    let last_drop = log.iter().rposition(|l| *l == target_drops).unwrap();
    assert!(
        started(parent_move) < parent_stopped && last_drop < started(child_move),
        "the child's move starts after the parent's move dropped its copy: {log:?}"
    );
    assert_eq!(env.fake.entries(env.target, &env.range), env.seeded());
    let map = env.meta.get_map().await.unwrap();
    assert_eq!(map.partitions[&left.id].owner, env.target);
    env.shutdown().await;
}

/// Splits and merges are checked against live migrations by range, not by
/// id: after a racing split, the children of a partition in a migration
/// carry new ids, and neither may split or merge until it ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_or_merge_of_a_range_under_a_live_migration_is_refused() {
    let (env, id) = Env::mid_copy().await;
    let (left, right) = split_under(&env).await;
    let err = split_partition(&*env.meta, left.id, SplitAt::Auto)
        .await
        .unwrap_err();
    assert!(
        matches!(err, SplitError::Migrating { migration, .. } if migration == id),
        "{err}"
    );
    let err = merge_partitions(&*env.meta, left.id, right.id)
        .await
        .unwrap_err();
    assert!(
        matches!(err, MergeError::Migrating { migration, .. } if migration == id),
        "{err}"
    );
    env.fake.set_faults(Faults::default());
    assert_eq!(env.finished(id).await.state, MigrationState::Aborted);
    // Over: both work now.
    merge_partitions(&*env.meta, left.id, right.id)
        .await
        .unwrap();
    env.shutdown().await;
}
