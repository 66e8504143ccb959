// Copyright (c) 2024-present, fjall-rs
// This source code is licensed under both the Apache 2.0 and MIT License
// (found in the LICENSE-* files in the repository)

use crate::{
    compaction::worker::run as run_compaction, flush::worker::run as run_flush, poison::PoisonDart,
    stats::Stats, supervisor::Supervisor, Keyspace,
};
use lsm_tree::MemtableId;
use std::{
    borrow::Cow,
    sync::{
        atomic::{AtomicUsize, Ordering::Relaxed},
        Arc, Mutex,
    },
    thread::JoinHandle,
};

pub enum WorkerMessage {
    Flush,
    Compact(Keyspace),
    Close,
    RotateMemtable(Keyspace, MemtableId),
}

impl std::fmt::Debug for WorkerMessage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}",
            match self {
                Self::Flush => Cow::Borrowed("WorkerMessage:Flush"),
                Self::Compact(k) => Cow::Owned(format!("WorkerMessage:Compact({:?})", k.name)),
                Self::Close => Cow::Borrowed("WorkerMessage:Close"),
                Self::RotateMemtable(k, memtable_id) =>
                    Cow::Owned(format!("WorkerMessage:Rotate({:?}, {memtable_id})", k.name)),
            }
        )
    }
}

type WorkerHandle = JoinHandle<Result<(), crate::Error>>;

pub struct WorkerPool {
    thread_handles: Mutex<Vec<WorkerHandle>>,
    pub(crate) rx: flume::Receiver<WorkerMessage>,
    pub(crate) sender: flume::Sender<WorkerMessage>,
}

impl WorkerPool {
    pub fn prepare() -> Self {
        let (sender, rx) = flume::bounded(1_000);

        Self {
            thread_handles: Mutex::default(),
            rx,
            sender,
        }
    }

    pub fn start(
        &self,
        pool_size: usize,
        supervisor: &Supervisor,
        stats: &Arc<Stats>,
        poison_dart: &PoisonDart,
        thread_counter: &Arc<AtomicUsize>,
    ) -> crate::Result<()> {
        log::debug!("Starting worker pool with {pool_size} threads");

        let thread_handles = claim_and_spawn(pool_size, thread_counter, |i| {
            std::thread::Builder::new()
                .name("fjall:worker".to_string())
                .spawn({
                    log::trace!("Starting fjall worker thread #{i}");

                    let worker_state = WorkerState {
                        pool_size,
                        worker_id: i,
                        rx: self.rx.clone(),
                        supervisor: supervisor.clone(),
                        stats: stats.clone(),
                        sender: self.sender.clone(),
                    };

                    let thread_counter = thread_counter.clone();
                    let poison_dart = poison_dart.clone();

                    move || {
                        // The counter must drop on *every* way out of this
                        // thread, not just the graceful one: `Database::drop`
                        // spins on it (`while counter > 0`), so a worker that
                        // returns an error or unwinds would keep the database
                        // closing forever.
                        let _counter_guard = ActiveThreadGuard(thread_counter);

                        loop {
                            match worker_tick(&worker_state) {
                                Ok(should_abort) => {
                                    if should_abort {
                                        log::debug!("Worker #{i} closes because DB is dropping");
                                        return Ok(());
                                    }
                                }
                                Err(e) => {
                                    log::error!("Worker #{i} crashed: {e:?}");
                                    poison_dart.poison();
                                    return Err(e);
                                }
                            }
                        }
                    }
                })
        })?;

        *self.thread_handles.lock().expect("lock is poisoned") = thread_handles;

        Ok(())
    }
}

/// Claims one slot in the active thread counter per worker, immediately before
/// that worker is spawned, and hands the slot straight back if the spawn fails.
///
/// Claiming the whole pool up front would leak the slots of the workers that failed
/// spawn never reaches: nothing ever decrements them, because those threads do
/// not exist, and `DatabaseInner::drop` waits for the counter to reach zero.
///
/// The spawn is a parameter so the failure path can be tested without having to
/// exhaust the operating system's thread limit.
fn claim_and_spawn<H, S: FnMut(usize) -> std::io::Result<H>>(
    pool_size: usize,
    thread_counter: &Arc<AtomicUsize>,
    mut spawn: S,
) -> std::io::Result<Vec<H>> {
    (0..pool_size)
        .map(|i| {
            thread_counter.fetch_add(1, Relaxed);

            spawn(i).inspect_err(|_| {
                thread_counter.fetch_sub(1, Relaxed);
            })
        })
        .collect()
}

/// Decrements the pool's active thread counter when a worker thread leaves,
/// whatever the reason: graceful close, error return or unwinding panic.
///
/// `DatabaseInner::drop` waits for this counter to reach zero, so a leaked
/// increment makes closing the database hang forever.
struct ActiveThreadGuard(Arc<AtomicUsize>);

impl Drop for ActiveThreadGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

struct WorkerState {
    pool_size: usize,
    worker_id: usize,
    supervisor: Supervisor,
    rx: flume::Receiver<WorkerMessage>,
    sender: flume::Sender<WorkerMessage>,
    stats: Arc<Stats>,
}

fn worker_tick(ctx: &WorkerState) -> crate::Result<bool> {
    let Ok(item) = ctx.rx.recv() else {
        return Ok(true);
    };

    log::trace!("Worker #{} got message: {item:?}", ctx.worker_id);

    match item {
        WorkerMessage::Close => {
            return Ok(true);
        }
        WorkerMessage::RotateMemtable(keyspace, memtable_id) => {
            log::trace!("acquiring journal lock");
            let journal_writer = keyspace.supervisor.journal.get_writer()?;
            keyspace.inner_rotate_memtable(journal_writer, memtable_id)?;
        }
        WorkerMessage::Flush => {
            while flush_one(ctx)? {}
            return Ok(false);
        }
        WorkerMessage::Compact(keyspace) => {
            // NOTE: Let one worker prioritize flushing if there are pending flushes
            //
            // Keyway patch: only while a flush is pending. Upstream re-sends
            // every Compact it receives on worker 0, so while worker 1 is busy
            // compacting, worker 0 receives its own message again at once and
            // spins (about 9% of a node's samples under `redis-benchmark -t set
            // -P 16`, `bench/profile.sh`). With no flush queued, worker 0
            // compacts like any other worker.
            if ctx.pool_size > 1 && ctx.worker_id == 0 && ctx.supervisor.flush_manager.len() > 0 {
                ctx.sender.try_send(WorkerMessage::Compact(keyspace)).ok();
            } else {
                run_compaction(&keyspace, &ctx.supervisor.snapshot_tracker, &ctx.stats)?;
            }
        }
    }

    // Keyway patch: a flush queued without its message (the queue was full,
    // see `Keyspace::inner_rotate_memtable`) is run by the next tick.
    while ctx.supervisor.flush_manager.len() > 0 && flush_one(ctx)? {}

    Ok(false)
}

/// Runs one queued flush task; false when the queue was empty.
fn flush_one(ctx: &WorkerState) -> crate::Result<bool> {
    let Some(task) = ctx.supervisor.flush_manager.dequeue() else {
        return Ok(false);
    };

    {
        log::trace!("acquiring journal lock to maybe rotate journal");
        let mut journal_writer = ctx.supervisor.journal.get_writer()?;

        if journal_writer.pos()?
            > ctx.supervisor.db_config.journal_rotation_size_in_bytes
        {
            #[expect(clippy::expect_used)]
            let mut journal_manager = ctx
                .supervisor
                .journal_manager
                .write()
                .expect("lock is poisoned");

            let seqno_map = {
                #[expect(clippy::expect_used)]
                let keyspaces = ctx.supervisor.keyspaces.write().expect("lock is poisoned");

                ctx.supervisor.build_seqno_map(&keyspaces)
            };

            journal_manager.rotate_journal(&mut journal_writer, seqno_map)?;

            if journal_manager.disk_space_used()
                >= ctx.supervisor.db_config.max_journaling_size_in_bytes
            {
                let stragglers =
                    journal_manager.get_keyspaces_to_flush_for_oldest_journal_eviction();

                for keyspace in stragglers {
                    log::info!(
                        "Rotating {:?} to try to reduce journal size",
                        keyspace.name,
                    );
                    keyspace.request_rotation();
                }
            }
        } else {
            // https://github.com/fjall-rs/fjall/issues/329
            journal_writer.persist(crate::PersistMode::SyncAll)?;
        }
    }

    run_flush(
        &task,
        &ctx.supervisor.write_buffer_size,
        &ctx.supervisor.snapshot_tracker,
        &ctx.stats,
    )?;

    for _ in 0..ctx.pool_size {
        ctx.sender
            .try_send(WorkerMessage::Compact(task.keyspace.clone()))
            .ok();
    }

    ctx.supervisor
        .journal_manager
        .write()
        .expect("lock is poisoned")
        .maintenance()?;

    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AbstractTree, Database, KeyspaceCreateOptions};
    use test_log::test;

    // https://github.com/fjall-rs/fjall/pull/303
    #[test]
    fn keyspace_compact_after_startup() -> crate::Result<()> {
        let folder = tempfile::tempdir()?;

        {
            let db = Database::builder(&folder).open()?;

            let ks = db.keyspace("default", KeyspaceCreateOptions::default)?;

            ks.insert("a", "a")?;
            ks.rotate_memtable_and_wait()?;

            ks.insert("a", "a")?;
            ks.rotate_memtable_and_wait()?;

            ks.insert("a", "a")?;
            ks.rotate_memtable_and_wait()?;

            assert!(ks.tree.l0_run_count() > 0);
        }

        {
            let db = Database::builder(&folder)
                .worker_threads_unchecked(0)
                .open()?;

            assert_eq!(
                1,
                db.worker_pool.rx.len(),
                "worker message should be enqueued on startup",
            );
            let item = db.worker_pool.rx.try_recv().expect("should get message");
            assert!(
                matches!(item, WorkerMessage::Compact(_)),
                "worker message should be compaction request",
            );
        }

        Ok(())
    }

    /// Keyway patch: a worker that rotates a memtable while its own queue is
    /// full must not block sending the `Flush` message (upstream: `send`, so
    /// the only consumer of the queue waited for itself forever), and the
    /// flush must still run.
    #[test]
    fn rotation_on_a_worker_with_a_full_queue_flushes_and_returns() -> crate::Result<()> {
        let folder = tempfile::tempdir()?;
        // No workers: the test thread plays the pool's only worker.
        let db = Database::builder(&folder)
            .worker_threads_unchecked(0)
            .open()?;
        let ks = db.keyspace("default", KeyspaceCreateOptions::default)?;
        ks.insert("a", "a")?;
        assert_eq!(0, ks.tree.table_count());

        let sender = db.worker_pool.sender.clone();
        let capacity = sender.capacity().expect("the queue is bounded");
        let active = ks.tree.active_memtable().id();
        // The journal lock stops the worker right after it took the first
        // message, so the test can fill the slot that message freed, as
        // writers do in production (`request_rotation`, once per write past
        // the memtable size).
        let journal = db.supervisor.journal.get_writer()?;
        sender
            .try_send(WorkerMessage::RotateMemtable(ks.clone(), active))
            .expect("the queue has room");
        let stale = || WorkerMessage::RotateMemtable(ks.clone(), active + 1_000);
        while sender.try_send(stale()).is_ok() {}

        let ctx = WorkerState {
            pool_size: 1,
            worker_id: 0,
            supervisor: db.supervisor.clone(),
            rx: db.worker_pool.rx.clone(),
            sender: sender.clone(),
            stats: Arc::new(Stats::default()),
        };
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let result = worker_tick(&ctx);
            done_tx.send(result.map_err(|e| format!("{e:?}"))).ok();
        });
        let waited = std::time::Instant::now();
        while sender.len() == capacity {
            assert!(waited.elapsed().as_secs() < 60, "the worker took no message");
            std::thread::yield_now();
        }
        sender.try_send(stale()).expect("the slot the worker freed");
        assert!(sender.is_full());
        drop(journal);

        // A deadlock never answers; a correct tick answers in milliseconds.
        let result = done_rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("the worker blocked sending into its own full queue");
        assert_eq!(Ok(false), result);

        assert_eq!(0, db.supervisor.flush_manager.len(), "the flush ran");
        assert_eq!(1, ks.tree.table_count(), "the sealed memtable became a table");
        assert_eq!(Some("a".as_bytes().into()), ks.get("a")?);
        Ok(())
    }

    /// Every worker that is actually spawned holds exactly one slot.
    #[test]
    fn claim_and_spawn_claims_one_slot_per_worker() {
        let counter = Arc::new(AtomicUsize::new(0));

        let handles = claim_and_spawn(3, &counter, |i| Ok::<_, std::io::Error>(i))
            .expect("all spawns succeed");

        assert_eq!(handles, vec![0, 1, 2]);
        assert_eq!(counter.load(Relaxed), 3);
    }

    /// A failed spawn releases its own slot and never claims one for the workers
    /// it did not get to. `DatabaseInner::drop` spins until the counter reaches
    /// zero, so a slot held by a thread that does not exist hangs the close
    /// forever.
    #[test]
    fn claim_and_spawn_counts_live_workers_only() {
        let counter = Arc::new(AtomicUsize::new(0));

        let result = claim_and_spawn(4, &counter, |i| {
            if i == 2 {
                Err(std::io::Error::other("cannot spawn thread"))
            } else {
                Ok(i)
            }
        });

        assert!(result.is_err());
        assert_eq!(
            counter.load(Relaxed),
            2,
            "only the two workers that started should hold a slot",
        );
    }

    /// A worker leaving normally releases its slot in the counter.
    #[test]
    fn active_thread_guard_decrements_on_scope_exit() {
        let counter = Arc::new(AtomicUsize::new(1));
        {
            let _guard = ActiveThreadGuard(counter.clone());
            assert_eq!(counter.load(Relaxed), 1);
        }
        assert_eq!(counter.load(Relaxed), 0);
    }

    /// A worker that returns an error releases its slot too: `Database::drop`
    /// spins until the counter reaches zero, so a leaked slot would hang the
    /// close forever.
    #[test]
    fn active_thread_guard_decrements_on_early_return() {
        let counter = Arc::new(AtomicUsize::new(1));

        fn failing_worker(counter: Arc<AtomicUsize>) -> Result<(), ()> {
            let _guard = ActiveThreadGuard(counter);
            Err(())
        }

        assert!(failing_worker(counter.clone()).is_err());
        assert_eq!(counter.load(Relaxed), 0);
    }

    /// A panicking worker releases its slot as well.
    #[test]
    fn active_thread_guard_decrements_on_panic() {
        let counter = Arc::new(AtomicUsize::new(1));
        let counter_in_thread = counter.clone();

        let outcome = std::thread::spawn(move || {
            let _guard = ActiveThreadGuard(counter_in_thread);
            panic!("worker crashed");
        })
        .join();

        assert!(outcome.is_err());
        assert_eq!(counter.load(Relaxed), 0);
    }
}
