//! The driver against a real embedded metadata store, a real seat, and two
//! in-memory nodes ([`fake::FakeCluster`]).

mod fake;
mod outage;
mod refused_drop;
mod split_race;
mod stuck;

use super::*;
use crate::seat::{Seat, SeatConfig};
use bytes::Bytes;
use fake::{FakeCluster, Faults};
use keyway_map::{Epoch, PartitionRecord};
use keyway_meta::{EmbeddedMeta, EmbeddedOptions};
use keyway_migration::Actor;
use tokio::time::Instant;

const DEADLINE: Duration = Duration::from_secs(15);
/// Keys seeded in the moved partition (and outside it) on the source.
const KEYS: usize = 20;
const OTHER_KEYS: usize = 5;

fn config() -> DriverConfig {
    DriverConfig {
        migration: MigrationConfig {
            catchup_lag_threshold: 10,
            stuck_timeout_ms: 5_000,
            fence_timeout_ms: 2_000,
            cleanup_grace_ms: 100,
            retry_interval_ms: 200,
            cleanup_attempts: 3,
        },
        throttle: Throttle::default(),
        poll_interval_ms: 10,
        discover_interval_ms: 20,
        drop_chunk_entries: 3,
        drop_pause_ms: 1,
        stray_retry_interval_ms: 200,
    }
}

/// Polls `probe` until it returns `Some`, failing after DEADLINE.
async fn eventually<T, F: Future<Output = Option<T>>>(what: &str, probe: impl FnMut() -> F) -> T {
    keyway_testkit::eventually(what, DEADLINE, probe).await
}

struct Env {
    meta: Arc<EmbeddedMeta>,
    _dir: tempfile::TempDir,
    seat: Option<Seat>,
    driver: Option<Driver>,
    fake: Arc<FakeCluster>,
    metrics: Arc<Metrics>,
    decisions: crate::DecisionLog,
    /// The moved partition as the map held it at the start.
    partition: PartitionRecord,
    range: KeyRange,
    source: NodeId,
    target: NodeId,
}

impl Env {
    /// Two nodes, a bootstrapped map, the source's data seeded, a leading
    /// seat and a running driver.
    async fn new(faults: Faults) -> Env {
        let env = Self::without_driver(faults).await;
        env.start_driver()
    }

    async fn without_driver(faults: Faults) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let meta = Arc::new(EmbeddedMeta::open(dir.path(), EmbeddedOptions::default()).unwrap());
        let n1 = meta
            .register_node(None, "r1:6379".into(), "node-1:7000".into())
            .await
            .unwrap();
        let n2 = meta
            .register_node(None, "r2:6379".into(), "node-2:7000".into())
            .await
            .unwrap();
        assert!(meta.bootstrap_if_empty(2, 2).await.unwrap());
        let map = meta.get_map().await.unwrap();
        let partition = map
            .partitions
            .values()
            .find(|p| p.owner == n1)
            .unwrap()
            .clone();
        let (start, end) = partition.storage_bounds();
        let range = KeyRange::new(start.clone(), end.clone());
        let fake = FakeCluster::new(meta.clone(), &[(n1, "node-1:7000"), (n2, "node-2:7000")]);
        for i in 0..KEYS {
            let key = [&start[..], &[0, 0, i as u8]].concat();
            assert!(range.contains(&key));
            fake.write(n1, &key, format!("value-{i}").as_bytes());
        }
        let outside = end.expect("the first partition has an end");
        for i in 0..OTHER_KEYS {
            let key = [&outside[..], &[0, 0, i as u8]].concat();
            assert!(!range.contains(&key));
            fake.write(n1, &key, b"elsewhere");
        }
        fake.set_faults(faults);
        let metrics = Arc::new(Metrics::new());
        let decisions = crate::DecisionLog::new(&metrics);
        let seat = Seat::start(
            meta.clone(),
            SeatConfig::new("m", Duration::from_millis(1_000)),
            metrics.clone(),
        );
        eventually("the seat to lead", || {
            let l = seat.leading();
            async move { l }
        })
        .await;
        Env {
            meta,
            _dir: dir,
            seat: Some(seat),
            driver: None,
            fake,
            metrics,
            decisions,
            partition,
            range,
            source: n1,
            target: n2,
        }
    }

    fn start_driver(self) -> Env {
        let meta = self.meta.clone();
        self.start_driver_on(meta)
    }

    /// Starts the driver on `meta` (the seat keeps the embedded store).
    fn start_driver_on(mut self, meta: Arc<dyn MetaStore>) -> Env {
        let seat = self.seat.as_ref().unwrap().view();
        self.driver = Some(Driver::start_with_peers(
            meta,
            seat,
            self.fake.clone(),
            config(),
            self.metrics.clone(),
            self.decisions.clone(),
        ));
        self
    }

    /// A move stuck in `COPYING` with part of the snapshot at the target.
    async fn mid_copy() -> (Env, MigrationId) {
        let env = Env::new(Faults {
            hold_copy: true,
            ..Faults::default()
        })
        .await;
        let id = env.request().await.id;
        let e = &env;
        eventually("a partial copy at the target", || async move {
            let rec = e.record(id).await;
            let copied = e.fake.entries(e.target, &e.range).len();
            (rec.state == MigrationState::Copying && copied > 0 && copied < KEYS).then_some(())
        })
        .await;
        (env, id)
    }

    async fn request(&self) -> MigrationRecord {
        request_move(&*self.meta, self.partition.id, self.target)
            .await
            .unwrap()
    }

    async fn record(&self, id: MigrationId) -> MigrationRecord {
        load(&self.meta.get_migration(id.0).await.unwrap().unwrap()).unwrap()
    }

    /// Waits until the record is `DONE`/`ABORTED` and no task drives it.
    async fn finished(&self, id: MigrationId) -> MigrationRecord {
        let view = self.driver.as_ref().unwrap().view();
        eventually("the migration to finish", || {
            let view = view.clone();
            async move {
                let list = view.migrations().await.unwrap();
                let m = list.iter().find(|m| m.id == id)?;
                (!m.driven && (m.state == "DONE" || m.state == "ABORTED")).then_some(())
            }
        })
        .await;
        self.record(id).await
    }

    async fn owner(&self) -> (NodeId, Epoch) {
        let map = self.meta.get_map().await.unwrap();
        let p = &map.partitions[&self.partition.id];
        (p.owner, p.epoch)
    }

    fn seeded(&self) -> Vec<(Bytes, Bytes)> {
        (0..KEYS)
            .map(|i| {
                (
                    Bytes::from([&self.range.start[..], &[0, 0, i as u8]].concat()),
                    Bytes::from(format!("value-{i}")),
                )
            })
            .collect()
    }

    /// After an abort: the source still owns everything, the target's copy
    /// is gone, the push is stopped.
    async fn assert_reverted(&self) {
        assert_eq!(
            self.owner().await,
            (self.source, self.partition.epoch),
            "the source still owns the partition at e"
        );
        assert_eq!(self.fake.entries(self.source, &self.range), self.seeded());
        assert_eq!(self.fake.len(self.source), KEYS + OTHER_KEYS);
        assert_eq!(
            self.fake.entries(self.target, &self.range),
            vec![],
            "the target's copy is dropped"
        );
        assert_eq!(self.fake.pushes(self.source), 0, "the push is stopped");
    }

    async fn shutdown(mut self) {
        if let Some(driver) = self.driver.take() {
            driver.shutdown().await;
        }
        if let Some(seat) = self.seat.take() {
            seat.shutdown().await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_runs_to_done_and_the_target_owns_the_partition_at_e_plus_1() {
    let env = Env::new(Faults::default()).await;
    let requested = env.request().await;
    assert_eq!(
        (requested.state, requested.generation),
        (MigrationState::Pending, 1)
    );
    let done = env.finished(requested.id).await;
    assert_eq!(done.state, MigrationState::Done, "{done:?}");
    assert!(done.pause_ms.is_some() && done.flipped());
    // The source's copy cost, carried into the record when COPYING ended.
    assert!(done.total_bytes > 0);
    assert_eq!(
        (done.bytes_sent, done.bytes_written, done.copy_duration_ms),
        (done.total_bytes, done.total_bytes, 7),
        "{done:?}"
    );
    assert_eq!(
        env.owner().await,
        (env.target, Epoch(env.partition.epoch.0 + 1))
    );
    assert_eq!(env.fake.entries(env.target, &env.range), env.seeded());
    assert_eq!(
        env.fake.entries(env.source, &env.range),
        vec![],
        "the source dropped the range"
    );
    assert_eq!(
        env.fake.len(env.source),
        OTHER_KEYS,
        "only the range is dropped"
    );
    let log = env.fake.log();
    let fence = log.iter().position(|l| l.ends_with("fence 1 on")).unwrap();
    let digest = log.iter().position(|l| l.ends_with("digest")).unwrap();
    assert!(fence < digest, "digests at the fence point: {log:?}");
    // They come with the fence's answer: no digest call of their own.
    assert_eq!(
        log.iter().filter(|l| l.ends_with("digest")).count(),
        1,
        "one digest, taken with the fence: {log:?}"
    );
    assert_eq!(digest, fence + 1, "{log:?}");
    // The checkpoint moves to the present right before the fence, outside
    // the pause (the rolling checkpoint).
    let checkpoint = log
        .iter()
        .position(|l| l.ends_with("checkpoint 1"))
        .unwrap();
    assert_eq!(
        checkpoint + 1,
        fence,
        "the checkpoint just before the fence: {log:?}"
    );
    // Each step of the cutover is timed and kept with the pause.
    let steps = done
        .cutover_steps
        .expect("the record keeps the cutover steps");
    assert!(steps.fence_us > 0 && steps.flip_us > 0, "{steps:?}");
    let text = env.metrics.encode();
    for line in [
        "keyway_manager_migrations_started_total 1",
        "keyway_manager_migrations_finished_total{outcome=\"done\"} 1",
        "keyway_manager_migration_cutover_pause_ms_count 1",
        "keyway_manager_migration_cutover_step_ms_count{step=\"flip\"} 1",
        "keyway_manager_migrations_active 0",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    // A second move of the same partition back is allowed now.
    let back = request_move(&*env.meta, env.partition.id, env.source)
        .await
        .unwrap();
    assert_eq!(back.source(), env.target);
    assert_eq!(back.epoch(), Epoch(env.partition.epoch.0 + 1));
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_digest_mismatch_aborts_unfences_and_leaves_the_source_owner() {
    let mut faults = Faults::default();
    let env = Env::without_driver(Faults::default()).await;
    faults.lose_on_target = Some(env.seeded()[3].0.clone());
    env.fake.set_faults(faults);
    let env = env.start_driver();
    let id = env.request().await.id;
    let rec = env.finished(id).await;
    assert_eq!(rec.state, MigrationState::Aborted);
    assert_eq!(rec.aborted_from, Some(MigrationState::Cutover));
    let Some(AbortReason::DigestMismatch { source, target }) = &rec.abort_reason else {
        panic!("abort reason {:?}", rec.abort_reason);
    };
    assert_eq!((source.keys, target.keys), (KEYS as u64, KEYS as u64 - 1));
    assert!(!rec.flip_requested());
    env.assert_reverted().await;
    let log = env.fake.log();
    assert!(
        log.iter().any(|l| l.ends_with(&format!("fence {id} off"))),
        "the source is unfenced: {log:?}"
    );
    let text = env.metrics.encode();
    assert!(text.contains("keyway_manager_migrations_finished_total{outcome=\"aborted\"} 1"));
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_abort_during_copying_drops_the_target_copy() {
    let (env, id) = Env::mid_copy().await;
    let asked = Instant::now();
    let aborted = request_abort(&*env.meta, id).await.unwrap();
    assert_eq!(aborted.state, MigrationState::Aborted);
    assert_eq!(aborted.aborted_from, Some(MigrationState::Copying));
    assert_eq!(
        aborted.abort_reason,
        Some(AbortReason::Requested {
            reason: "operator".into()
        })
    );
    let rec = env.finished(id).await;
    assert!(
        asked.elapsed() < Duration::from_secs(3),
        "the driver noticed the new generation, not its stuck timeout (5 s): {:?}",
        asked.elapsed()
    );
    assert_eq!(
        rec.generation,
        aborted.generation + 1,
        "the driver reverts, then forgets the dropped copy"
    );
    assert_eq!((aborted.stray, rec.stray), (Some(env.target), None));
    assert_eq!(
        MigrationRecord {
            generation: aborted.generation,
            stray: aborted.stray,
            ..rec.clone()
        },
        aborted,
        "nothing else changed"
    );
    env.assert_reverted().await;
    // Over: a second abort is refused clearly.
    let again = request_abort(&*env.meta, id).await.unwrap_err();
    assert!(
        matches!(
            again,
            DriverError::CannotAbort {
                state: MigrationState::Aborted,
                ..
            }
        ),
        "{again}"
    );
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_that_lost_the_migration_aborts_it() {
    let (env, id) = Env::mid_copy().await;
    env.fake.set_faults(Faults {
        hold_copy: true,
        lose_migration: true,
        ..Faults::default()
    });
    let rec = env.finished(id).await;
    assert_eq!(rec.state, MigrationState::Aborted);
    assert!(
        matches!(
            &rec.abort_reason,
            Some(AbortReason::ActorFailed { who: Actor::Source, detail }) if detail.contains("lost")
        ),
        "{:?}",
        rec.abort_reason
    );
    env.assert_reverted().await;
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_driver_resumes_a_migration_from_its_record() {
    let mut env = Env::new(Faults {
        hold_copy: true,
        ..Faults::default()
    })
    .await;
    let id = env.request().await.id;
    let e = &env;
    eventually("the snapshot to be taken", || async move {
        e.record(id).await.snapshot_seq.map(|_| ())
    })
    .await;
    // The manager "crashes" mid-copy; another driver takes over.
    env.driver.take().unwrap().shutdown().await;
    let generation = env.record(id).await.generation;
    env.fake.set_faults(Faults::default());
    let env = env.start_driver();
    let rec = env.finished(id).await;
    assert_eq!(rec.state, MigrationState::Done, "{rec:?}");
    assert!(rec.generation > generation);
    assert_eq!(
        env.owner().await,
        (env.target, Epoch(env.partition.epoch.0 + 1))
    );
    assert_eq!(env.fake.entries(env.target, &env.range), env.seeded());
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_seat_stops_the_tasks_and_the_next_term_recovers_them() {
    let (env, id) = Env::mid_copy().await;
    let seat = env.seat.as_ref().unwrap();
    let first = seat.leading().unwrap();
    env.meta.revoke_lease(first.lease).await.unwrap();
    let second = eventually("the seat to lead again", || {
        let l = seat.leading().filter(|l| l.lease != first.lease);
        async move { l }
    })
    .await;
    assert_ne!(second, first);
    env.fake.set_faults(Faults::default());
    let rec = env.finished(id).await;
    assert_eq!(rec.state, MigrationState::Done, "{rec:?}");
    let starts = env
        .fake
        .log()
        .iter()
        .filter(|l| l.ends_with(&format!("start {id} copy=true")))
        .count();
    assert!(starts >= 2, "the next term re-issued the copy (Recovered)");
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_whose_seat_does_not_lead_does_nothing() {
    let mut env = Env::without_driver(Faults::default()).await;
    let seat = env.seat.take().unwrap();
    let view = seat.view();
    seat.shutdown().await;
    assert!(view.leading().is_none());
    let driver = Driver::start_with_peers(
        env.meta.clone(),
        view,
        env.fake.clone(),
        config(),
        env.metrics.clone(),
        env.decisions.clone(),
    );
    let id = env.request().await.id;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rec = env.record(id).await;
    assert_eq!((rec.state, rec.generation), (MigrationState::Pending, 1));
    assert!(env.fake.log().is_empty(), "{:?}", env.fake.log());
    driver.shutdown().await;
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_move_refuses_what_cannot_move() {
    let env = Env::without_driver(Faults::default()).await;
    let meta = &*env.meta;
    assert_eq!(
        request_move(meta, PartitionId(999), env.target).await,
        Err(DriverError::UnknownPartition(PartitionId(999)))
    );
    assert_eq!(
        request_move(meta, env.partition.id, NodeId(77)).await,
        Err(DriverError::UnknownNode(NodeId(77)))
    );
    assert!(matches!(
        request_move(meta, env.partition.id, env.source).await,
        Err(DriverError::AlreadyOwner { .. })
    ));
    let first = env.request().await;
    assert_eq!(first.id, MigrationId(1));
    assert_eq!(
        request_move(meta, env.partition.id, env.target).await,
        Err(DriverError::Busy {
            partition: env.partition.id,
            migration: first.id,
            state: MigrationState::Pending
        })
    );
    assert_eq!(
        request_abort(meta, MigrationId(42)).await,
        Err(DriverError::NotFound(MigrationId(42)))
    );
    let aborted = request_abort(meta, first.id).await.unwrap();
    assert_eq!(
        (aborted.state, aborted.generation),
        (MigrationState::Aborted, 2)
    );
    assert_eq!(env.record(first.id).await, aborted);
    env.shutdown().await;
}

/// `GET path` on a local HTTP server; the body.
async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    conn.write_all(req.as_bytes()).await.unwrap();
    let mut resp = String::new();
    conn.read_to_string(&mut resp).await.unwrap();
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    resp.split_once("\r\n\r\n").unwrap().1.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_port_lists_migrations_and_exports_their_metrics() {
    let env = Env::new(Faults::default()).await;
    let id = env.request().await.id;
    env.finished(id).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stop_rx) = watch::channel(false);
    let (ui, ui_task) = crate::ui::Ui::start(
        &crate::ui::UiConfig::default(),
        env.meta.clone(),
        env.seat.as_ref().unwrap().view(),
        env.driver.as_ref().unwrap().view(),
        env.decisions.clone(),
        watch::channel(None).1,
        crate::replication::ReplicationStatus::default(),
        crate::copies::CopyTracker::default(),
        &env.metrics,
    );
    let admin = tokio::spawn(crate::admin::serve(
        env.seat.as_ref().unwrap().view(),
        env.metrics.clone(),
        env.driver.as_ref().unwrap().view(),
        env.decisions.clone(),
        watch::channel(None).1,
        crate::replication::ReplicationStatus::default(),
        ui,
        listener,
        keyway_auth::AdminSecurity::default(),
        stop_rx,
    ));
    let body = http_get(addr, "/migrations").await;
    let list: serde_json::Value = serde_json::from_str(&body).unwrap();
    let m = &list.as_array().unwrap()[0];
    assert_eq!(m["id"], 1);
    assert_eq!(m["state"], "DONE");
    assert_eq!(m["partition"], env.partition.id.0);
    assert_eq!(m["source"], env.source.0);
    assert_eq!(m["target"], env.target.0);
    assert!(m["pause_ms"].is_u64() && m["ended_at_ms"].is_u64(), "{m}");
    assert_eq!(m["copied_bytes"], m["total_bytes"]);
    assert!(m["stray"].is_null(), "nothing left behind: {m}");
    let status: serde_json::Value = serde_json::from_str(&http_get(addr, "/status").await).unwrap();
    assert_eq!(status["migration_stray_copies"], 0, "{status}");
    let text = http_get(addr, "/metrics").await;
    assert!(text.contains("keyway_manager_migration_cutover_pause_ms_bucket"));
    // The dashboard: the page, and its state with the map and the move.
    assert!(http_get(addr, "/ui").await.contains("fetch(STATE_URL"));
    let state: serde_json::Value =
        serde_json::from_str(&http_get(addr, "/ui/state").await).unwrap();
    let parts = state["partitions"].as_array().unwrap();
    assert!(
        parts.iter().any(|p| p["id"] == env.partition.id.0),
        "{state}"
    );
    let m = &state["migrations"].as_array().unwrap()[0];
    assert_eq!(
        (m["id"].as_u64(), m["state"].as_str()),
        (Some(1), Some("DONE"))
    );
    assert_eq!(m["progress"], 1.0, "{m}");
    assert_eq!(m["target"], env.target.to_string(), "node ids as text: {m}");
    let text = http_get(addr, "/metrics").await;
    assert!(
        text.contains("keyway_manager_ui_state_served_total 1"),
        "{text}"
    );
    ui_task.abort();
    let _ = stop.send(true);
    admin.await.unwrap();
    env.shutdown().await;
}

#[test]
fn config_validation_names_each_rule() {
    DriverConfig::default().validate().unwrap();
    config().validate().unwrap();
    let bad = |f: fn(&mut DriverConfig)| {
        let mut c = config();
        f(&mut c);
        match c.validate() {
            Err(DriverError::Config(what)) => what,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(
        bad(|c| c.poll_interval_ms = 0),
        "poll_interval_ms must be positive"
    );
    assert_eq!(
        bad(|c| c.discover_interval_ms = 0),
        "discover_interval_ms must be positive"
    );
    assert_eq!(
        bad(|c| c.drop_chunk_entries = 0),
        "drop_chunk_entries must be positive"
    );
    assert_eq!(
        bad(|c| c.migration.retry_interval_ms = 0),
        "retry_interval_ms must be positive"
    );
    assert_eq!(
        bad(|c| c.stray_retry_interval_ms = 0),
        "stray_retry_interval_ms must be positive"
    );
    assert_eq!(
        bad(|c| c.migration.cleanup_attempts = 0),
        "cleanup_attempts must be between 1 and 16"
    );
}
