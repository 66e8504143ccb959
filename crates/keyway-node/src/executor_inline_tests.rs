//! Inline runs (`executor_shard.rs`): a request run by a connection on its
//! own shard thread is answered as a queued one would be, never before its
//! group's fsync covers what it could observe, and never past a parked
//! request.

use super::*;
use keyway_storage::{MemEngine, Mutation, ValueKind};
use std::sync::atomic::AtomicBool;

type Log = Arc<Mutex<Vec<&'static str>>>;

fn executor(durability: Durability, threads: usize, engine: Arc<MemEngine>) -> Arc<Executor> {
    let (_changes, rx) = watch::channel(0);
    Arc::new(Executor::start(
        engine,
        ExecutorConfig {
            threads,
            durability,
            periodic_sync_ms: 1_000,
            max_group_commands: 64,
            max_hold: Duration::from_secs(30),
            health: crate::storage_health::StorageHealth::new(),
        },
        rx,
        Arc::new(Metrics::new()),
    ))
}

fn read() -> Task {
    Box::new(|_| TaskOutput::reply(Frame::ok(), false))
}

fn write(log: &Log, name: &'static str) -> Task {
    let log = log.clone();
    Box::new(move |engine| {
        engine
            .apply(&[Mutation::Put {
                key: bytes::Bytes::from_static(b"k"),
                kind: ValueKind::String,
                expire_at_ms: None,
                data: bytes::Bytes::from_static(name.as_bytes()),
            }])
            .unwrap();
        log.lock().unwrap().push(name);
        TaskOutput::reply(Frame::bulk(name), true)
    })
}

/// [`write`], parked (not run) while `held` is set.
fn held_write(log: &Log, name: &'static str, held: &Arc<AtomicBool>) -> Task {
    let (log2, held2) = (log.clone(), held.clone());
    Box::new(move |engine| {
        if held2.load(Ordering::SeqCst) {
            return TaskOutput {
                reply: Frame::Null,
                wrote: false,
                follow: Follow::Park(held_write(&log2, name, &held2)),
            };
        }
        write(&log2, name)(engine)
    })
}

/// Runs `f` on shard thread `i`'s runtime (where its connections run).
async fn on_shard<F, T>(executor: &Executor, i: usize, f: F) -> T
where
    F: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    executor.runtimes[i].spawn(f).await.unwrap()
}

#[tokio::test]
async fn only_a_connection_on_the_slots_own_shard_thread_runs_it_inline() {
    let engine = Arc::new(MemEngine::new());
    let ex = executor(Durability::Group, 2, engine);
    // Off the shard threads: queued.
    let (rx, ran) = ex.submit_inline(0, read()).await.unwrap();
    assert!(!ran);
    assert_eq!(rx.await.unwrap(), Frame::ok());
    let e = ex.clone();
    on_shard(&ex, 0, async move {
        // Slot 0 is thread 0's: run now, and a read with nothing
        // unsynced is released before it is awaited.
        let (mut rx, ran) = e.submit_inline(0, read()).await.unwrap();
        assert!(ran);
        assert_eq!(rx.try_recv().unwrap(), Frame::ok());
        // Slot 1 is thread 1's: queued there.
        let (rx, ran) = e.submit_inline(1, read()).await.unwrap();
        assert!(!ran);
        assert_eq!(rx.await.unwrap(), Frame::ok());
    })
    .await;
}

#[tokio::test]
async fn an_inline_write_and_a_read_after_it_are_answered_only_after_the_fsync_covering_the_write()
{
    let engine = Arc::new(MemEngine::new());
    let ex = executor(Durability::Group, 1, engine.clone());
    let log = Log::default();
    let e = ex.clone();
    on_shard(&ex, 0, async move {
        let (mut w, ran) = e.submit_inline(3, write(&log, "w")).await.unwrap();
        assert!(ran);
        let written = engine.last_seq();
        assert!(written > 0);
        let (mut r, ran) = e.submit_inline(3, read()).await.unwrap();
        assert!(ran);
        // Nothing yielded yet: the loop has not even seen the group.
        assert!(w.try_recv().is_err());
        assert!(
            r.try_recv().is_err(),
            "a read of an undurable write answered"
        );
        assert_eq!((&mut r).await.unwrap(), Frame::ok());
        assert!(
            e.durable().get(&*engine) >= written,
            "answered before the fsync"
        );
        assert_eq!(w.await.unwrap(), Frame::bulk("w"));
        // Durable now: the next read goes at once again.
        let (mut r, _) = e.submit_inline(3, read()).await.unwrap();
        assert_eq!(r.try_recv().unwrap(), Frame::ok());
    })
    .await;
}

#[tokio::test]
async fn nothing_runs_inline_past_a_parked_request_and_the_parked_one_runs_first() {
    let engine = Arc::new(MemEngine::new());
    let ex = executor(Durability::None, 1, engine);
    let log = Log::default();
    let held = Arc::new(AtomicBool::new(true));
    let (e, l, h) = (ex.clone(), log.clone(), held.clone());
    let (a, b, other) = on_shard(&ex, 0, async move {
        // Runs inline, parks: handed to the loop.
        let (a, ran) = e.submit_inline(7, held_write(&l, "a", &h)).await.unwrap();
        assert!(ran);
        // Now nothing runs inline: queued, and parked behind `a`.
        let (b, ran) = e.submit_inline(7, write(&l, "b")).await.unwrap();
        assert!(!ran, "ran inline while a request was parked");
        let (other, ran) = e.submit_inline(8, read()).await.unwrap();
        assert!(!ran, "ran inline while a request was parked");
        (a, b, other)
    })
    .await;
    assert_eq!(other.await.unwrap(), Frame::ok());
    assert!(log.lock().unwrap().is_empty(), "a held write ran");
    held.store(false, Ordering::SeqCst);
    ex.wake();
    assert_eq!(a.await.unwrap(), Frame::bulk("a"));
    assert_eq!(b.await.unwrap(), Frame::bulk("b"));
    assert_eq!(*log.lock().unwrap(), ["a", "b"]);
    // Nothing parked any more: inline again.
    let e = ex.clone();
    on_shard(&ex, 0, async move {
        let (_, ran) = e.submit_inline(7, read()).await.unwrap();
        assert!(ran);
    })
    .await;
}

/// A one-reply group (`wrote`: it changed the engine).
fn one_reply(wrote: bool) -> (shard::Group, oneshot::Receiver<Frame>) {
    let (reply, rx) = oneshot::channel();
    let group = shard::Group {
        replies: vec![Released {
            reply,
            frame: Frame::ok(),
            since: Instant::now(),
            defer: None,
        }],
        needs_sync: wrote,
    };
    (group, rx)
}

#[test]
fn a_read_only_group_waits_behind_its_threads_unsynced_writes_and_goes_at_once_after() {
    let engine = Arc::new(MemEngine::new());
    // This test plays the syncer: it holds the groups' channel.
    let (group_tx, syncer) = std_mpsc::channel();
    let (queue, _queue_rx) = mpsc::channel(1);
    let metrics = Arc::new(Metrics::new());
    let durable = Arc::new(DurableSeq::new(
        Durability::Group,
        engine.last_seq(),
        metrics.clone(),
    ));
    let local = Local {
        owner: 0,
        index: 0,
        engine: engine.clone(),
        ctx: ShardContext {
            durability: Durability::Group,
            max_group: 64,
            max_hold: Duration::from_secs(30),
            latency: Arc::default(),
            health: crate::storage_health::StorageHealth::new(),
            durable: durable.clone(),
        },
        metrics,
        group_tx,
        queue: queue.downgrade(),
        busy: Default::default(),
        parked: Default::default(),
        unsynced_through: Default::default(),
        open: Default::default(),
        handoff: Default::default(),
    };
    write(&Log::default(), "w")(&*engine);
    let (writes, _) = one_reply(true);
    assert!(shard::finish_group(&local, writes, false));
    // The write's group is with the syncer, not durable: a read goes
    // behind it, through the syncer.
    let (read, mut rx) = one_reply(false);
    assert!(shard::finish_group(&local, read, false));
    assert!(
        rx.try_recv().is_err(),
        "a read released before the write it may show is durable"
    );
    assert_eq!(syncer.try_iter().count(), 2);
    // Once an fsync covered the write, a read goes at once.
    durable.sync_through(&*engine, engine.last_seq()).unwrap();
    let (read, mut rx) = one_reply(false);
    assert!(shard::finish_group(&local, read, false));
    assert_eq!(rx.try_recv().unwrap(), Frame::ok());
    assert_eq!(syncer.try_iter().count(), 0);
    assert_eq!(local.metrics.read_groups_released_at_once.get(), 1);
}

#[test]
fn a_publication_wakes_the_streams_only_when_the_durable_seq_moves() {
    let engine = MemEngine::new();
    let durable = DurableSeq::new(
        Durability::Periodic,
        engine.last_seq(),
        Arc::new(Metrics::new()),
    );
    let polled = |n: &mut std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>| {
        let waker = std::task::Waker::noop();
        n.as_mut()
            .poll(&mut std::task::Context::from_waker(waker))
            .is_ready()
    };
    write(&Log::default(), "w")(&engine);
    let moved = engine.last_seq();
    let first = durable.changed();
    tokio::pin!(first);
    first.as_mut().enable();
    durable.publish(moved);
    assert!(polled(&mut first), "a publication that moves the seq wakes");
    // A read-only group publishes the same last seq again: nothing new.
    let again = durable.changed();
    tokio::pin!(again);
    again.as_mut().enable();
    durable.publish(moved);
    assert!(
        !polled(&mut again),
        "a publication that moves nothing woke a stream"
    );
    write(&Log::default(), "w2")(&engine);
    durable.publish(engine.last_seq());
    assert!(polled(&mut again));
}
