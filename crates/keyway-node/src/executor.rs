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
//! 4. Migration hooks ([`Follow`]). A task for a partition in its cutover
//!    fence (or an incoming hold) is *parked* on its thread, not answered:
//!    the thread re-runs its parked tasks, in arrival order, before any new
//!    task once the routing view changed (a lifted fence, a new map), so a
//!    held request either runs or gets its redirect, never an error. A task
//!    held past `max_hold` is answered with an error (and never runs).
//!    A dual-written write's released reply is handed to its push, which
//!    sends it once the target has the write.
//! 5. Tasks a task queues with [`run_next`] (the attempts of the clients
//!    blocked on a key it pushed to, see [`crate::blocking`]) run on the
//!    same thread right after it, before any job queued meanwhile, as Redis
//!    serves blocked clients before its next command.
//! 6. Each shard thread is an event loop (a current-thread tokio runtime):
//!    its queue is one task on it, and client connections are placed on
//!    the shard threads round robin ([`Executor::connection_runtime`]). A
//!    connection's command for a slot its own thread owns is queued and
//!    answered without waking another thread (two cross-thread wake-ups per
//!    request were most of a GET's cost: issue 15). Engine calls still run
//!    only in storage tasks, never on the shared runtime's workers; a slow
//!    engine call delays this thread's connections only, as Redis's event
//!    loop does. Control-plane work (leases, map installs, peers,
//!    migrations) stays on the shared runtime.
//! 7. A task that may run for long (a script: [`Executor::submit_aside`])
//!    runs *aside*, on the runtime's blocking pool, while its shard thread
//!    awaits it: the thread runs no other task meanwhile (the script stays
//!    atomic for its slots), but its connections are still served, so they
//!    get `-BUSY` once it runs past `busy-reply-threshold` and can send
//!    `SCRIPT KILL` (`tests/it/scripting.rs`). What the task queues with
//!    [`run_next`] comes back with it and runs next on the shard thread.
//! 8. A connection's request for a slot its own shard thread owns runs
//!    *inline*, in the connection's task, when that thread's loop is idle
//!    and holds nothing parked ([`Executor::submit_inline`]; the rules are
//!    in `executor_shard.rs`): no queue, no wake-up of the loop, and a
//!    read's reply is usually released before the connection awaits it.
//!    A read-only group is released by its own thread, without the syncer,
//!    once this thread's last write group is durable (issue 15).
//!
//! # Order per slot (nothing overtakes a parked request)
//! Every task is queued with its *order key*: the slot (or, for `KW.*`
//! commands, the CRC16 slot of its first key) whose commands it must stay in
//! order with. The routing side clears a hold *before* it bumps the change
//! counter, so a thread may see a newly arrived task pass the ownership
//! check while an older one of the same slot is still parked. Hence:
//! - a new task whose slot has a parked task is parked behind it **without
//!   running** (it keeps its arrival order);
//! - when parked tasks re-run, once a task of slot `s` parks again, every
//!   later parked task of slot `s` is kept parked without running, so a fence
//!   lifting in the middle of the pass cannot let a later one pass an earlier
//!   one;
//! - a task held past `max_hold` is answered with an error and never runs;
//!   later tasks of its slot then proceed: the expired one had no effect, so
//!   they overtake nothing.
//!
//! A connection's pipeline to *different* slots may run on different threads
//! in any order: its replies are still written in request order (the
//! connection awaits them in order), and linearizability is per key: two
//! commands on different keys commute, so the order in which they took
//! effect is not observable through any single-key history, and a pipelined
//! command is concurrent with the ones after it (the client sent them before
//! the first reply). Commands that read many slots at once (`SCAN`,
//! `DBSIZE`, `INFO`'s key count, `KW.SCAN`) are queued with no order key; the
//! connection orders them instead, by waiting for every earlier reply before
//! queueing one and for its reply before reading on (see
//! `node_cmd::is_node_wide`), and their reply waits for an fsync as a
//! write's does, since they may have read other threads' undurable writes.

use crate::config::Durability;
use crate::metrics::Metrics;
use crate::storage_health::StorageHealth;
use keyway_resp::Frame;
use keyway_storage::Engine;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, watch};

#[path = "executor_shard.rs"]
mod shard;
use shard::{Group, Local, Parked, Released, ShardContext, Ticket};

/// What a task produced: the reply, whether it changed the engine, and
/// what to do with the reply.
pub struct TaskOutput {
    pub reply: Frame,
    /// Whether the reply must wait for an fsync: the task changed the engine,
    /// or it read keys that other threads write (a node-wide read), which
    /// may not be durable yet.
    pub wrote: bool,
    pub follow: Follow,
}

impl TaskOutput {
    /// A reply released the usual way.
    pub fn reply(reply: Frame, wrote: bool) -> Self {
        TaskOutput {
            reply,
            wrote,
            follow: Follow::Release,
        }
    }
}

/// Takes over a released reply (and the channel to answer it on).
pub type Deferral = Box<dyn FnOnce(oneshot::Sender<Frame>, Frame) + Send>;

/// What happens to a task's reply.
pub enum Follow {
    /// Send it once durable (the group-commit rule).
    Release,
    /// Send nothing: run this task instead, on this thread, once the
    /// routing view changed (a request held by a migration fence).
    Park(Task),
    /// Once durable, hand it to this instead of sending it (a dual write
    /// waiting for the migration target).
    Defer(Deferral),
}

/// Work run on an executor thread with the engine at hand.
pub type Task = Box<dyn FnOnce(&dyn Engine) -> TaskOutput + Send>;

/// The slot a task stays in order with (`None`: a node-wide read, ordered
/// by its connection instead; see the module doc).
pub type OrderKey = Option<u16>;

enum Job {
    Run {
        task: Task,
        ticket: Ticket,
    },
    /// Re-check parked tasks (the routing view changed, or time passed).
    Wake,
    /// Run what came before, release it, and end the thread (shutdown).
    Stop,
}

thread_local! {
    /// On a shard thread: what [`run_next`] queued during the task now
    /// running (`None` on every other thread).
    static RUN_NEXT: std::cell::RefCell<Option<Vec<Parked>>> =
        const { std::cell::RefCell::new(None) };
}

/// Queues `task` (of `slot`, with its reply to `reply`) to run on this
/// shard thread right after the task now running, before the next queued
/// job. Only a task of a slot this thread owns may queue it (it then keeps
/// its slot's order: it is parked like any task if the slot has parked
/// ones). Off a shard thread it gives both back.
pub fn run_next(
    slot: u16,
    task: Task,
    reply: oneshot::Sender<Frame>,
) -> Result<(), (Task, oneshot::Sender<Frame>)> {
    RUN_NEXT.with(|next| match next.borrow_mut().as_mut() {
        Some(queue) => {
            queue.push(Parked::of_slot(slot, task, reply));
            Ok(())
        }
        None => Err((task, reply)),
    })
}

/// Recent foreground latency (enqueue to reply release): the slowest reply
/// of the current and the previous window of [`LatencyGauge::WINDOW_MS`].
/// Read by migration throttling, which must react to tail latency (an
/// average hides the spikes a copy causes).
pub struct LatencyGauge {
    base: Instant,
    window: AtomicU64,
    current_us: AtomicU64,
    previous_us: AtomicU64,
}

impl Default for LatencyGauge {
    fn default() -> Self {
        LatencyGauge {
            base: Instant::now(),
            window: AtomicU64::new(0),
            current_us: AtomicU64::new(0),
            previous_us: AtomicU64::new(0),
        }
    }
}

impl LatencyGauge {
    /// Length of one window.
    pub const WINDOW_MS: u64 = 100;

    fn window_now(&self) -> u64 {
        self.base.elapsed().as_millis() as u64 / Self::WINDOW_MS
    }

    pub fn observe(&self, sample: Duration) {
        let us = sample.as_micros().min(u64::MAX as u128) as u64;
        let now = self.window_now();
        let seen = self.window.load(Ordering::Relaxed);
        if seen != now && self.window.swap(now, Ordering::Relaxed) != now {
            let last = self.current_us.swap(0, Ordering::Relaxed);
            let previous = if seen + 1 == now { last } else { 0 };
            self.previous_us.store(previous, Ordering::Relaxed);
        }
        self.current_us.fetch_max(us, Ordering::Relaxed);
    }

    /// The slowest reply released in the last one or two windows (0 when
    /// nothing was released lately).
    pub fn recent_max_micros(&self) -> u64 {
        let now = self.window_now();
        let seen = self.window.load(Ordering::Relaxed);
        let current = self.current_us.load(Ordering::Relaxed);
        let previous = self.previous_us.load(Ordering::Relaxed);
        match now.saturating_sub(seen) {
            0 => current.max(previous),
            1 => current,
            _ => 0,
        }
    }
}

/// The last seq covered by a completed fsync (the *durable seq*), published
/// by whoever fsyncs (the syncer thread for `group`, the storage threads for
/// `always`). For `periodic` and `none` nothing waits for an fsync, so it is
/// the engine's last seq. A replication stream never ships records past it
/// (`crate::replicate`): a replica must not hold a write its primary could
/// still lose in a crash.
pub struct DurableSeq {
    seq: AtomicU64,
    follows_last: bool,
    changed: tokio::sync::Notify,
    /// Serialises [`Self::sync_through`]'s fsyncs, so callers waiting on
    /// one share it.
    sync_lock: Mutex<()>,
    /// Where the fsyncs made here are timed and their failures counted
    /// ([`timed_fsync`]; the engine's health latches a failure).
    metrics: Arc<Metrics>,
}

impl DurableSeq {
    fn new(durability: Durability, start: keyway_storage::Seq, metrics: Arc<Metrics>) -> Self {
        DurableSeq {
            seq: AtomicU64::new(start),
            follows_last: matches!(durability, Durability::Periodic | Durability::None),
            changed: tokio::sync::Notify::new(),
            sync_lock: Mutex::new(()),
            metrics,
        }
    }

    /// Whether acknowledgements here wait for an fsync (`always`, `group`);
    /// with `periodic`/`none` a batch handed to the OS is what an
    /// acknowledgement promises (see [`Durability`]).
    pub fn acks_wait_for_fsync(&self) -> bool {
        !self.follows_last
    }

    /// The durable seq now.
    pub fn get(&self, engine: &dyn Engine) -> keyway_storage::Seq {
        match self.follows_last {
            true => engine.last_seq(),
            false => self.seq.load(Ordering::Acquire),
        }
    }

    /// fsyncs the engine (timed) and publishes what it covered; only under
    /// [`Self::sync_lock`] (from [`Self::sync_through`]).
    fn sync_now(&self, engine: &dyn Engine) -> Result<(), keyway_storage::StorageError> {
        let covered = engine.last_seq();
        timed_fsync(engine, &self.metrics)?;
        self.publish(covered);
        Ok(())
    }

    /// Returns once an fsync that covers `seq` completed: at once when one
    /// did, else after the fsync in progress (if it covered `seq`) or its
    /// own. A group commit for callers that fsync themselves (a replica's
    /// calls): N callers at once cost about two fsyncs, not N.
    pub fn sync_through(
        &self,
        engine: &dyn Engine,
        seq: keyway_storage::Seq,
    ) -> Result<(), keyway_storage::StorageError> {
        if self.seq.load(Ordering::Acquire) >= seq {
            return Ok(());
        }
        let _one_at_a_time = self.sync_lock.lock().unwrap_or_else(|e| e.into_inner());
        if self.seq.load(Ordering::Acquire) >= seq {
            return Ok(());
        }
        self.sync_now(engine)
    }

    /// Every record up to `seq` is durable (never moves back). Wakes the
    /// waiters only when it moved: with `periodic`/`none` every group
    /// publishes (a read-only one too), and waking every replication
    /// stream for nothing was 5 % of a node's samples under a read-only
    /// `-P 16` load at factor 2. No wake is lost: a publication that moves
    /// nothing follows one that moved it as far and woke them, and a
    /// waiter reads [`Self::get`] after it registered.
    fn publish(&self, seq: keyway_storage::Seq) {
        if self.seq.fetch_max(seq, Ordering::AcqRel) < seq {
            self.changed.notify_waiters();
        }
    }

    /// Resolves at the next publication (create it before checking [`Self::get`]).
    pub fn changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.changed.notified()
    }
}

/// Handle to the executor threads.
pub struct Executor {
    /// Each thread's queue. No lock: a request borrows its sender (a lock
    /// and a sender clone per request were 2 % of a node's samples under
    /// `redis-benchmark -P 16`); shutdown is a [`Job::Stop`] in each.
    shards: Vec<mpsc::Sender<Job>>,
    /// Set at shutdown: no more work is queued.
    closed: AtomicBool,
    threads: Mutex<Vec<JoinHandle<()>>>,
    latency: Arc<LatencyGauge>,
    /// Each shard thread's event loop (connections are placed on them).
    runtimes: Vec<tokio::runtime::Handle>,
    /// Spreads node-wide reads over the threads.
    next_node_wide: AtomicU64,
    /// Spreads client connections over the shard threads.
    next_connection: AtomicU64,
    durable: Arc<DurableSeq>,
}

/// Settings of [`Executor::start`].
pub struct ExecutorConfig {
    pub threads: usize,
    pub durability: Durability,
    pub periodic_sync_ms: u64,
    pub max_group_commands: usize,
    /// The longest a task may stay parked behind a fence.
    pub max_hold: Duration,
    /// Latched by the first failed fsync: no reply that could report a
    /// non-durable write is released afterwards.
    pub health: Arc<StorageHealth>,
}

/// How many tasks may wait for one executor before senders are held back.
const SHARD_QUEUE_DEPTH: usize = 4096;

impl Executor {
    /// Starts `threads` executor threads plus, for `group` and `periodic`
    /// durability, the syncer thread.
    /// `changes` fires when the routing view changes (parked tasks re-run).
    pub fn start(
        engine: Arc<dyn Engine>,
        config: ExecutorConfig,
        changes: watch::Receiver<u64>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let ExecutorConfig {
            threads,
            durability,
            periodic_sync_ms,
            max_group_commands,
            max_hold,
            health,
        } = config;
        assert!(threads > 0 && max_group_commands > 0);
        let latency = Arc::new(LatencyGauge::default());
        let durable = Arc::new(DurableSeq::new(
            durability,
            engine.last_seq(),
            metrics.clone(),
        ));
        let mut handles = Vec::new();
        let (group_tx, group_rx) = std_mpsc::channel::<Group>();
        let syncer = {
            let engine = engine.clone();
            let metrics = metrics.clone();
            let latency = latency.clone();
            let health = health.clone();
            let durable = durable.clone();
            let period = Duration::from_millis(periodic_sync_ms.max(1));
            std::thread::Builder::new()
                .name("kw-syncer".into())
                .spawn(move || {
                    let ctx = SyncerContext {
                        durability,
                        period,
                        metrics: &metrics,
                        latency: &latency,
                        health: &health,
                        durable: &durable,
                    };
                    syncer_loop(&*engine, ctx, group_rx)
                })
                .expect("spawn syncer thread")
        };
        handles.push(syncer);
        let mut shards = Vec::with_capacity(threads);
        let mut runtimes = Vec::with_capacity(threads);
        for i in 0..threads {
            let (tx, rx) = mpsc::channel::<Job>(SHARD_QUEUE_DEPTH);
            let engine = engine.clone();
            let group_tx = group_tx.clone();
            let metrics = metrics.clone();
            let ctx = ShardContext {
                durability,
                max_group: max_group_commands,
                max_hold,
                latency: latency.clone(),
                health: health.clone(),
                durable: durable.clone(),
            };
            let changes = changes.clone();
            let queue = tx.downgrade();
            let owner = Arc::as_ptr(&durable) as usize;
            let (runtime_tx, runtime_rx) = std_mpsc::channel();
            let handle = std::thread::Builder::new()
                .name(format!("kw-exec-{i}"))
                .spawn(move || {
                    // Its applies reach the OS once per group (`hand_to_os`).
                    keyway_storage::defer_os_flush_on_this_thread();
                    // The shard thread's own event loop: its queue and the
                    // connections placed on it (see the module doc, 6).
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("build a shard thread's runtime");
                    let _ = runtime_tx.send(runtime.handle().clone());
                    let local = Local {
                        owner,
                        index: i,
                        engine,
                        ctx,
                        metrics,
                        group_tx,
                        queue,
                        busy: Default::default(),
                        parked: Default::default(),
                        unsynced_through: Default::default(),
                        open: Default::default(),
                        handoff: Default::default(),
                    };
                    shard::serve(&runtime, local, changes, rx);
                })
                .expect("spawn executor thread");
            runtimes.push(
                runtime_rx
                    .recv()
                    .expect("a shard thread hands over its runtime"),
            );
            shards.push(tx);
            handles.push(handle);
        }
        Executor {
            shards,
            closed: AtomicBool::new(false),
            runtimes,
            threads: Mutex::new(handles),
            latency,
            next_node_wide: AtomicU64::new(0),
            next_connection: AtomicU64::new(0),
            durable,
        }
    }

    /// The shard thread a new client connection is served on (round robin):
    /// its commands for the slots that thread owns then run without a
    /// hand-off between threads.
    pub fn connection_runtime(&self) -> &tokio::runtime::Handle {
        let n = self.next_connection.fetch_add(1, Ordering::Relaxed) as usize;
        &self.runtimes[n % self.runtimes.len()]
    }

    /// The durable seq (see [`DurableSeq`]).
    pub fn durable(&self) -> &Arc<DurableSeq> {
        &self.durable
    }

    /// Recent foreground latency (enqueue to reply release).
    pub fn latency(&self) -> &Arc<LatencyGauge> {
        &self.latency
    }

    /// Makes every thread re-check its parked tasks (after a routing change,
    /// and periodically so held tasks time out). A full queue is skipped: its
    /// thread wakes anyway.
    pub fn wake(&self) {
        for shard in &self.shards {
            let _ = shard.try_send(Job::Wake);
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
    /// can queue a whole pipeline before waiting. It runs after every task
    /// queued earlier for `slot` (parked ones included).
    pub async fn submit(&self, slot: u16, task: Task) -> Result<oneshot::Receiver<Frame>, Frame> {
        self.queue(slot as usize, Some(slot), task, false).await
    }

    /// [`Executor::submit`] from a connection that may run `task` inline
    /// (see the module doc, 8): it runs now when this is the shard thread
    /// of `slot` and that thread may. Also returns whether it ran inline
    /// (`false`: it was queued, and the connection's later requests must
    /// be queued too, to stay behind it).
    pub async fn submit_inline(
        &self,
        slot: u16,
        task: Task,
    ) -> Result<(oneshot::Receiver<Frame>, bool), Frame> {
        if self.closed.load(Ordering::Acquire) {
            return Err(shutting_down());
        }
        let index = slot as usize % self.shards.len();
        match shard::try_inline(self.identity(), index, slot, task) {
            Ok(rx) => Ok((rx, true)),
            Err(task) => self
                .queue(slot as usize, Some(slot), task, false)
                .await
                .map(|rx| (rx, false)),
        }
    }

    /// Tells this executor's shard threads from another's (several nodes
    /// may run in one process).
    fn identity(&self) -> usize {
        Arc::as_ptr(&self.durable) as usize
    }

    /// As [`Executor::submit`] (or, with no slot, [`Executor::submit_node_wide`])
    /// for a task that may run for long (a script): it runs aside, so its
    /// thread's connections are served meanwhile (see the module doc, 7).
    pub async fn submit_aside(
        &self,
        slot: Option<u16>,
        task: Task,
    ) -> Result<oneshot::Receiver<Frame>, Frame> {
        let pick = slot.map_or_else(|| self.node_wide_pick(), usize::from);
        self.queue(pick, slot, task, true).await
    }

    /// Queues a node-wide read (no order key: the caller orders it with its
    /// connection's other requests) on some thread.
    pub async fn submit_node_wide(&self, task: Task) -> Result<oneshot::Receiver<Frame>, Frame> {
        self.queue(self.node_wide_pick(), None, task, false).await
    }

    /// The thread for a task without a slot (round robin).
    fn node_wide_pick(&self) -> usize {
        self.next_node_wide.fetch_add(1, Ordering::Relaxed) as usize
    }

    async fn queue(
        &self,
        pick: usize,
        slot: OrderKey,
        task: Task,
        aside: bool,
    ) -> Result<oneshot::Receiver<Frame>, Frame> {
        if self.closed.load(Ordering::Acquire) {
            return Err(shutting_down());
        }
        let (tx, rx) = oneshot::channel();
        // Sent after the thread stopped: the send fails, or the job waits
        // behind `Stop` and is dropped with the queue (its reply: shutdown).
        self.shards[pick % self.shards.len()]
            .send(Job::Run {
                task,
                ticket: Ticket {
                    reply: tx,
                    since: Instant::now(),
                    slot,
                    aside,
                },
            })
            .await
            .map_err(|_| shutting_down())?;
        Ok(rx)
    }

    /// Stops accepting work, finishes what is queued, syncs, and joins the threads.
    /// Blocks: call it from a blocking context.
    pub fn shutdown(&self) {
        if !self.closed.swap(true, Ordering::AcqRel) {
            for shard in &self.shards {
                // Waits for room in a full queue (parking this thread,
                // whatever runtime it is on); fails only if the thread
                // already ended.
                let _ = futures::executor::block_on(shard.send(Job::Stop));
            }
        }
        let handles = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for handle in handles {
            let _ = handle.join();
        }
    }
}

fn shutting_down() -> Frame {
    Frame::Error("ERR server is shutting down".into())
}

fn held_too_long(max_hold: Duration) -> Frame {
    Frame::Error(format!(
        "CLUSTERDOWN request held {} ms behind a migration fence; retry",
        max_hold.as_millis()
    ))
}

/// What the syncer thread needs.
struct SyncerContext<'a> {
    durability: Durability,
    period: Duration,
    metrics: &'a Metrics,
    latency: &'a LatencyGauge,
    health: &'a StorageHealth,
    durable: &'a DurableSeq,
}

fn syncer_loop(engine: &dyn Engine, ctx: SyncerContext<'_>, rx: std_mpsc::Receiver<Group>) {
    let SyncerContext {
        durability,
        period,
        metrics,
        latency,
        health,
        durable,
    } = ctx;
    let mut last_sync = Instant::now();
    loop {
        let first = match durability {
            Durability::Periodic => match rx.recv_timeout(period) {
                Ok(group) => group,
                Err(std_mpsc::RecvTimeoutError::Timeout) => {
                    sync_now(engine, metrics, health);
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
        // Every write of these groups is in the engine: the fsync covers them.
        let covered = engine.last_seq();
        let needs_sync = groups.iter().any(|g| g.needs_sync);
        if needs_sync && !sync_now(engine, metrics, health) {
            // Nothing in these groups may be acknowledged: a reply could
            // report a write, or a read of a write, that is not durable.
            for group in &mut groups {
                group
                    .replies
                    .iter_mut()
                    .for_each(|r| r.frame = fsync_failed());
            }
        } else if let Some(why) = health.failure() {
            // Storage failed before these ran or while they ran: a read
            // among them may show a write that never reached the disk.
            for group in &mut groups {
                group
                    .replies
                    .iter_mut()
                    .for_each(|r| r.frame = storage_failed(why));
            }
        } else if needs_sync {
            durable.publish(covered);
        }
        metrics
            .group_commit_size
            .observe(groups.iter().map(|g| g.replies.len()).sum::<usize>() as f64);
        groups
            .into_iter()
            .for_each(|g| release(g.replies, Some(latency)));
        if durability == Durability::Periodic && last_sync.elapsed() >= period {
            sync_now(engine, metrics, health);
            last_sync = Instant::now();
        }
    }
    // Every sender is gone: make everything applied durable before exit.
    sync_now(engine, metrics, health);
}

/// fsyncs the engine; false if the fsync failed, now or before. The first
/// failure latches `health` for good (fsyncgate: a later fsync that succeeds
/// says nothing about the pages the failed one could not write), so no
/// later sync is attempted.
fn sync_now(engine: &dyn Engine, metrics: &Metrics, health: &StorageHealth) -> bool {
    if health.failure().is_some() {
        return false;
    }
    let result = timed_fsync(engine, metrics);
    if let Err(err) = &result {
        health.fail(format!("fsync error: {err}"));
    }
    result.is_ok()
}

/// One fsync of the engine, timed in `keyway_fsync_seconds` and counted in
/// `keyway_fsync_errors` when it fails: every fsync a node makes (group
/// commits, `always` writes, a replica's calls, a stream's wait).
fn timed_fsync(engine: &dyn Engine, metrics: &Metrics) -> Result<(), keyway_storage::StorageError> {
    let started = Instant::now();
    let result = engine.sync();
    metrics
        .fsync_seconds
        .observe(started.elapsed().as_secs_f64());
    if result.is_err() {
        metrics.fsync_errors.inc();
    }
    result
}

fn fsync_failed() -> Frame {
    Frame::Error(
        "ERR storage fsync failed; the write may not be durable; this node no longer serves reads or writes"
            .into(),
    )
}

fn storage_failed(why: &str) -> Frame {
    Frame::Error(format!("ERR {}", crate::storage_health::refusal(why)))
}

/// Sends the replies (or hands them to their deferrals), observing the
/// oldest in `latency` (`None`: a reply run inline just now, whose two
/// clock reads would cost more than the sample tells).
fn release(replies: Vec<Released>, latency: Option<&LatencyGauge>) {
    // The gauge keeps the slowest: one clock read and one observation per
    // group (the oldest reply is the slowest), not per reply.
    if let Some(latency) = latency
        && let Some(oldest) = replies.iter().map(|r| r.since).min()
    {
        latency.observe(oldest.elapsed());
    }
    for r in replies {
        match r.defer {
            Some(defer) => defer(r.reply, r.frame),
            None => {
                let _ = r.reply.send(r.frame);
            }
        }
    }
}

#[cfg(test)]
#[path = "executor_order_tests.rs"]
mod order_tests;

#[cfg(test)]
#[path = "executor_aside_tests.rs"]
mod aside_tests;

#[cfg(test)]
#[path = "executor_inline_tests.rs"]
mod inline_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latency_gauge_reports_the_slowest_recent_reply() {
        let g = LatencyGauge::default();
        assert_eq!(g.recent_max_micros(), 0);
        g.observe(Duration::from_millis(5));
        g.observe(Duration::from_micros(300));
        assert!(g.recent_max_micros() >= 5_000, "{}", g.recent_max_micros());
    }
}
