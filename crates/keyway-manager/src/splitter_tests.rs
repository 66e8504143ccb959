//! The splitter loop against a real embedded store and a real seat, fed
//! hand-built load snapshots through its `watch` channel.

use super::*;
use crate::seat::{Seat, SeatConfig};
use crate::split::testing::*;
use crate::stats::ClusterLoad;
use keyway_map::{NodeId, PartitionId};
use keyway_meta::EmbeddedMeta;
use std::future::Future;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(15);

/// Polls `probe` until it returns `Some`, failing after DEADLINE.
async fn eventually<T, F: Future<Output = Option<T>>>(what: &str, probe: impl FnMut() -> F) -> T {
    keyway_testkit::eventually(what, DEADLINE, probe).await
}

struct Env {
    meta: Arc<EmbeddedMeta>,
    _dir: tempfile::TempDir,
    seat: Seat,
    metrics: Arc<Metrics>,
    decisions: DecisionLog,
    feed: watch::Sender<Option<Arc<LoadSnapshot>>>,
    splitter: Splitter,
    t0: Instant,
}

impl Env {
    async fn new(nodes: usize, per_node: u16, split: SplitConfig, merge: MergeConfig) -> Env {
        let (meta, dir) = store(nodes, per_node).await;
        let metrics = Arc::new(Metrics::new());
        let seat = Seat::start(
            meta.clone(),
            SeatConfig::new("m", Duration::from_millis(1_000)),
            metrics.clone(),
        );
        let view = seat.view();
        eventually("the seat to lead", || {
            let l = view.leading();
            async move { l }
        })
        .await;
        let decisions = DecisionLog::new(&metrics);
        let (feed, rx) = watch::channel(None);
        let splitter = Splitter::start(
            meta.clone(),
            seat.view(),
            rx,
            split,
            merge,
            decisions.clone(),
            &metrics,
        );
        Env {
            meta,
            _dir: dir,
            seat,
            metrics,
            decisions,
            feed,
            splitter,
            t0: Instant::now(),
        }
    }

    async fn map(&self) -> PartitionMap {
        self.meta.get_map().await.unwrap()
    }

    /// Publishes a snapshot taken `secs` after the start.
    async fn publish(&self, load: ClusterLoad, secs: u64) {
        let snapshot = LoadSnapshot {
            map: Arc::new(self.map().await),
            load,
            taken_at: self.t0 + Duration::from_secs(secs),
        };
        self.feed.send_replace(Some(Arc::new(snapshot)));
    }

    /// Waits for a decision of `duty` with `reason`, returning it.
    async fn decision(&self, duty: &str, reason: &str) -> Decision {
        let log = self.decisions.clone();
        eventually(&format!("a {duty} decision {reason}"), || {
            let found = log
                .recent()
                .into_iter()
                .find(|d| d.duty == duty && d.reason == reason);
            async move { found }
        })
        .await
    }

    async fn shutdown(self) {
        self.splitter.shutdown().await;
        self.seat.shutdown().await;
    }
}

fn split_cfg() -> SplitConfig {
    SplitConfig {
        split_max_requests_per_sec: 1_000.0,
        split_load_window_ms: 30_000,
        ..SplitConfig::default()
    }
}

fn no_merge() -> MergeConfig {
    MergeConfig {
        enabled: false,
        ..MergeConfig::default()
    }
}

/// p1 hot; `share` of its requests on one key; an even split key in slot 1000.
fn hot_p1(map: &PartitionMap, share: f64) -> ClusterLoad {
    let mut load = uniform_load(map, 1_000, 1.0);
    let mut hot = load_of(&map.partitions[&PartitionId(1)], 1_000, 8_000.0);
    hot.load_split_key = Some(routing_key(1000, "k"));
    hot.top_key_share = share;
    load.partitions.insert(hot.partition, hot);
    load
}

#[tokio::test]
async fn a_hot_partition_splits_after_its_window_and_the_rounds_before_say_why_not() {
    let env = Env::new(2, 2, split_cfg(), no_merge()).await;
    let before = env.map().await;
    env.publish(hot_p1(&before, 0.1), 0).await;
    let warming = env.decision("split", "warming").await;
    assert_eq!(
        (warming.partition, warming.action, warming.acted),
        (Some(PartitionId(1)), "no_split", false)
    );
    assert_eq!(
        env.map().await.partitions,
        before.partitions,
        "no split yet"
    );
    env.publish(hot_p1(&before, 0.1), 31).await;
    let split = env.decision("split", "load").await;
    assert!(split.acted && split.action == "split", "{split:?}");
    let after = env.map().await;
    assert!(!after.partitions.contains_key(&PartitionId(1)));
    let left = after
        .locate_slot(keyway_map::DEFAULT_KEYSPACE, 999)
        .unwrap();
    let right = after
        .locate_slot(keyway_map::DEFAULT_KEYSPACE, 1000)
        .unwrap();
    assert_ne!(left.id, right.id);
    assert_eq!((left.epoch.0, right.epoch.0), (2, 2));
    assert_eq!(left.owner, before.partitions[&PartitionId(1)].owner);
    let text = env.metrics.encode();
    assert!(
        text.contains(r#"keyway_manager_splits_total{reason="load"} 1"#),
        "{text}"
    );
    env.shutdown().await;
}

#[tokio::test]
async fn one_dominant_key_is_recorded_and_counted_never_split() {
    let env = Env::new(2, 2, split_cfg(), no_merge()).await;
    let before = env.map().await;
    env.publish(hot_p1(&before, 0.9), 0).await;
    env.decision("split", "warming").await;
    env.publish(hot_p1(&before, 0.9), 40).await;
    let d = env.decision("split", "single_key").await;
    assert!(!d.acted && d.detail.contains("90%"), "{d:?}");
    let text = env.metrics.encode();
    assert!(
        text.contains(r#"keyway_manager_splits_skipped_total{reason="single_key"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(
            r#"keyway_manager_decisions_total{duty="split",action="no_split",reason="single_key"} 1"#
        ),
        "{text}"
    );
    assert_eq!(env.map().await.partitions, before.partitions);
    // Back under the threshold: one `within_limits` decision.
    env.publish(uniform_load(&before, 1_000, 1.0), 41).await;
    env.decision("split", "within_limits").await;
    env.shutdown().await;
}

fn merge_cfg() -> MergeConfig {
    MergeConfig {
        merge_cold_window_ms: 0,
        merge_min_partitions_per_node: 1,
        ..MergeConfig::default()
    }
}

#[tokio::test]
async fn cold_neighbours_merge_down_to_the_floor() {
    let env = Env::new(2, 2, split_cfg(), merge_cfg()).await;
    let before = env.map().await;
    env.publish(uniform_load(&before, 1_000, 1.0), 0).await;
    let log = env.decisions.clone();
    let merges = eventually("two merge decisions", || {
        let merged: Vec<Decision> = log
            .recent()
            .into_iter()
            .filter(|d| d.duty == "merge" && d.reason == "cold")
            .collect();
        async move { (merged.len() == 2).then_some(merged) }
    })
    .await;
    assert!(merges.iter().all(|d| d.acted && d.action == "merge"));
    let after = env.map().await;
    assert_eq!(after.partitions.len(), 2);
    for p in after.partitions.values() {
        assert_eq!(p.epoch.0, 2);
        assert!(p.id.0 > 4, "fresh ids");
    }
    let text = env.metrics.encode();
    assert!(text.contains("keyway_manager_merges_total 2"), "{text}");
    // At the floor (1 per node × 2 nodes) now.
    env.publish(uniform_load(&after, 1_000, 1.0), 1).await;
    env.decision("merge", "at_floor").await;
    env.shutdown().await;
}

#[tokio::test]
async fn a_split_made_by_hand_is_not_merged_back_at_once() {
    let env = Env::new(1, 2, split_cfg(), merge_cfg()).await;
    let map = env.map().await;
    env.publish(uniform_load(&map, 1_000, 1.0), 0).await;
    env.decision("merge", "cold").await;
    let merged = env.map().await;
    assert_eq!(merged.partitions.len(), 1);
    let whole = *merged.partitions.keys().next().unwrap();
    // An operator splits it again (`keyway ctl split`): the next round sees
    // two new ids inside removed ranges, born by a split.
    let (l, r) = crate::split_partition(&*env.meta, whole, crate::SplitAt::Auto)
        .await
        .unwrap();
    let split = env.map().await;
    env.publish(uniform_load(&split, 1_000, 1.0), 1).await;
    let held = env.decision("merge", "cooldown").await;
    assert_eq!(held.partition, Some(l.id));
    assert!(!held.acted);
    let now = env.map().await;
    assert!(now.partitions.contains_key(&l.id) && now.partitions.contains_key(&r.id));
    env.shutdown().await;
}

#[tokio::test]
async fn neighbours_on_two_nodes_get_a_colocation_move() {
    let env = Env::new(2, 2, split_cfg(), merge_cfg()).await;
    let map = env.map().await;
    // p1 and p4 warm: only p2 (node 1) + p3 (node 2) qualify.
    let mut load = uniform_load(&map, 1_000, 1.0);
    for warm in [1, 4] {
        let p = &map.partitions[&PartitionId(warm)];
        load.partitions.insert(p.id, load_of(p, 1_000, 500.0));
    }
    load.partitions.get_mut(&PartitionId(2)).unwrap().bytes = 10;
    env.publish(load.clone(), 0).await;
    let moved = env.decision("merge", "colocate").await;
    assert_eq!(
        (moved.action, moved.partition),
        ("move", Some(PartitionId(2)))
    );
    let busy = live_migrations(&*env.meta).await.unwrap();
    assert!(busy.contains_key(&PartitionId(2)), "{busy:?}");
    let stored = env.meta.migrations().await.unwrap();
    let rec = crate::driver::load(&stored[0]).unwrap();
    assert_eq!(rec.target, NodeId(2));
    // Next round: the pair waits for the migration.
    env.publish(load, 1).await;
    env.decision("merge", "migrating").await;
    assert_eq!(env.map().await.partitions.len(), 4);
    env.shutdown().await;
}
