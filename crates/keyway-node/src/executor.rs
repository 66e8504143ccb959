//! Storage executor threads and group commit.
//!
//! Process overview:
//! 1. A connection turns a data command into a [`Task`] and sends it to the
//!    executor thread that owns the command's slot (`slot % threads`), so
//!    every command on one key runs on one thread, in arrival order.
//! 2. The executor thread drains up to `max_group_commands` tasks and runs
//!    each: ownership check and engine write happen inside the task, under
//!    the routing read guard (invariant 2). fjall is only ever called here,
//!    never on an async worker.
//! 3. Replies are released according to the durability mode. With `group`,
//!    the thread hands its replies to the one syncer thread, which fsyncs
//!    once for every group that arrived meanwhile and only then releases
//!    them: a reply, even to a read, is never sent before every write it
//!    could have observed is durable. With `always` the thread fsyncs after
//!    each write; `periodic` and `none` release at once.

use crate::config::Durability;
use crate::metrics::Metrics;
use keyway_resp::Frame;
use keyway_storage::Engine;
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

/// What a task produced: the reply, and whether it changed the engine.
pub struct TaskOutput {
    pub reply: Frame,
    pub wrote: bool,
}

/// Work run on an executor thread with the engine at hand.
pub type Task = Box<dyn FnOnce(&dyn Engine) -> TaskOutput + Send>;

struct Job {
    task: Task,
    reply: oneshot::Sender<Frame>,
}

struct Group {
    replies: Vec<(oneshot::Sender<Frame>, Frame)>,
    needs_sync: bool,
}

/// Handle to the executor threads.
pub struct Executor {
    /// Emptied at shutdown: that closes the queues and ends the threads.
    shards: RwLock<Vec<mpsc::Sender<Job>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// How many tasks may wait for one executor before senders are held back.
const SHARD_QUEUE_DEPTH: usize = 4096;

impl Executor {
    /// Starts `threads` executor threads plus, for `group` and `periodic`
    /// durability, the syncer thread.
    pub fn start(
        engine: Arc<dyn Engine>,
        threads: usize,
        durability: Durability,
        periodic_sync_ms: u64,
        max_group_commands: usize,
        metrics: Arc<Metrics>,
    ) -> Self {
        assert!(threads > 0 && max_group_commands > 0);
        let mut handles = Vec::new();
        let (group_tx, group_rx) = std_mpsc::channel::<Group>();
        let syncer = {
            let engine = engine.clone();
            let metrics = metrics.clone();
            let period = Duration::from_millis(periodic_sync_ms.max(1));
            std::thread::Builder::new()
                .name("kw-syncer".into())
                .spawn(move || syncer_loop(&*engine, durability, period, group_rx, &metrics))
                .expect("spawn syncer thread")
        };
        handles.push(syncer);
        let mut shards = Vec::with_capacity(threads);
        for i in 0..threads {
            let (tx, rx) = mpsc::channel::<Job>(SHARD_QUEUE_DEPTH);
            let engine = engine.clone();
            let group_tx = group_tx.clone();
            let metrics = metrics.clone();
            let handle = std::thread::Builder::new()
                .name(format!("kw-exec-{i}"))
                .spawn(move || {
                    shard_loop(
                        &*engine,
                        durability,
                        max_group_commands,
                        rx,
                        group_tx,
                        &metrics,
                    )
                })
                .expect("spawn executor thread");
            shards.push(tx);
            handles.push(handle);
        }
        Executor {
            shards: RwLock::new(shards),
            threads: Mutex::new(handles),
        }
    }

    /// Runs `task` on the thread owning `slot` and waits for its released reply.
    pub async fn run(&self, slot: u16, task: Task) -> Frame {
        match self.submit(slot, task).await {
            Ok(rx) => rx.await.unwrap_or_else(|_| shutting_down()),
            Err(frame) => frame,
        }
    }

    /// Queues `task` and returns the receiver of its reply, so a connection
    /// can queue a whole pipeline before waiting.
    pub async fn submit(&self, slot: u16, task: Task) -> Result<oneshot::Receiver<Frame>, Frame> {
        let (tx, rx) = oneshot::channel();
        let shard = {
            let shards = self.shards.read().unwrap_or_else(|e| e.into_inner());
            if shards.is_empty() {
                return Err(shutting_down());
            }
            shards[slot as usize % shards.len()].clone()
        };
        shard
            .send(Job { task, reply: tx })
            .await
            .map_err(|_| shutting_down())?;
        Ok(rx)
    }

    /// Stops accepting work, finishes what is queued, syncs, and joins the threads.
    /// Blocks: call it from a blocking context.
    pub fn shutdown(&self) {
        self.shards
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        let handles = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for handle in handles {
            let _ = handle.join();
        }
    }
}

fn shutting_down() -> Frame {
    Frame::Error("ERR server is shutting down".into())
}

fn shard_loop(
    engine: &dyn Engine,
    durability: Durability,
    max_group: usize,
    mut rx: mpsc::Receiver<Job>,
    group_tx: std_mpsc::Sender<Group>,
    metrics: &Metrics,
) {
    while let Some(first) = rx.blocking_recv() {
        let mut group = Group {
            replies: Vec::with_capacity(16),
            needs_sync: false,
        };
        let mut next = Some(first);
        while let Some(job) = next {
            let mut out = (job.task)(engine);
            metrics.commands.inc();
            if out.wrote && durability == Durability::Always && !sync_now(engine, metrics) {
                out.reply = fsync_failed();
            }
            group.needs_sync |= out.wrote;
            group.replies.push((job.reply, out.reply));
            next = if group.replies.len() < max_group {
                rx.try_recv().ok()
            } else {
                None
            };
        }
        match durability {
            Durability::Group => {
                if group_tx.send(group).is_err() {
                    return;
                }
            }
            _ => release(group.replies),
        }
    }
}

fn syncer_loop(
    engine: &dyn Engine,
    durability: Durability,
    period: Duration,
    rx: std_mpsc::Receiver<Group>,
    metrics: &Metrics,
) {
    let mut last_sync = Instant::now();
    loop {
        let first = match durability {
            Durability::Periodic => match rx.recv_timeout(period) {
                Ok(group) => group,
                Err(std_mpsc::RecvTimeoutError::Timeout) => {
                    sync_now(engine, metrics);
                    last_sync = Instant::now();
                    continue;
                }
                Err(std_mpsc::RecvTimeoutError::Disconnected) => break,
            },
            _ => match rx.recv() {
                Ok(group) => group,
                Err(_) => break,
            },
        };
        let mut groups = vec![first];
        groups.extend(rx.try_iter());
        if groups.iter().any(|g| g.needs_sync) && !sync_now(engine, metrics) {
            // Nothing in these groups may be acknowledged: a reply could
            // report a write, or a read of a write, that is not durable.
            for group in &mut groups {
                group
                    .replies
                    .iter_mut()
                    .for_each(|(_, frame)| *frame = fsync_failed());
            }
        }
        metrics
            .group_commit_size
            .observe(groups.iter().map(|g| g.replies.len()).sum::<usize>() as f64);
        groups.into_iter().for_each(|g| release(g.replies));
        if durability == Durability::Periodic && last_sync.elapsed() >= period {
            sync_now(engine, metrics);
            last_sync = Instant::now();
        }
    }
    // Every sender is gone: make everything applied durable before exit.
    sync_now(engine, metrics);
}

/// fsyncs the engine; false if the fsync failed.
fn sync_now(engine: &dyn Engine, metrics: &Metrics) -> bool {
    let started = Instant::now();
    let result = engine.sync();
    metrics
        .fsync_seconds
        .observe(started.elapsed().as_secs_f64());
    if let Err(err) = &result {
        tracing::error!(%err, "fsync failed");
        metrics.fsync_errors.inc();
    }
    result.is_ok()
}

fn fsync_failed() -> Frame {
    Frame::Error("ERR storage fsync failed; the write may not be durable".into())
}

fn release(replies: Vec<(oneshot::Sender<Frame>, Frame)>) {
    for (tx, frame) in replies {
        let _ = tx.send(frame);
    }
}
