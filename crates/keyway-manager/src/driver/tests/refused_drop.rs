//! A node that refuses a migration's `DropRangeChunk` (it owns the range,
//! or receives it under another migration) ends that step: the driver never
//! drops the data and never retries forever.

use super::*;

fn drops_at(env: &Env, node: NodeId) -> usize {
    let drop = format!("n{} drop", node.0);
    env.fake.log().iter().filter(|l| **l == drop).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cleanup_the_source_refuses_ends_done_and_drops_nothing() {
    let env = Env::without_driver(Faults::default()).await;
    env.fake.set_faults(Faults {
        refuse_drops: Some(env.source),
        ..Faults::default()
    });
    let env = env.start_driver();
    let id = env.request().await.id;
    let rec = env.finished(id).await;
    assert_eq!(rec.state, MigrationState::Done, "{rec:?}");
    assert_eq!(
        env.owner().await,
        (env.target, Epoch(env.partition.epoch.0 + 1))
    );
    assert_eq!(
        env.fake.entries(env.source, &env.range),
        env.seeded(),
        "a refused drop deletes nothing"
    );
    assert_eq!(drops_at(&env, env.source), 1, "refused once, not retried");
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abort_whose_target_refuses_the_drop_ends_reverted() {
    let env = Env::without_driver(Faults::default()).await;
    env.fake.set_faults(Faults {
        hold_copy: true,
        refuse_drops: Some(env.target),
        ..Faults::default()
    });
    let env = env.start_driver();
    let id = env.request().await.id;
    let e = &env;
    eventually("a partial copy at the target", || async move {
        let copied = e.fake.entries(e.target, &e.range).len();
        (copied > 0).then_some(copied)
    })
    .await;
    request_abort(&*env.meta, id).await.unwrap();
    let rec = env.finished(id).await;
    assert_eq!(rec.state, MigrationState::Aborted, "{rec:?}");
    assert_eq!(env.owner().await, (env.source, env.partition.epoch));
    assert!(
        !env.fake.entries(env.target, &env.range).is_empty(),
        "the target's data is not dropped against its refusal"
    );
    assert_eq!(drops_at(&env, env.target), 1, "refused once, not retried");
    assert_eq!(env.fake.pushes(env.source), 0, "the push is stopped");
    env.shutdown().await;
}
