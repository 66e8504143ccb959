//! A shard thread: its loop, its group commit, and the requests its own
//! connections run inline.
//!
//! Overview (the executor's module doc, 2-8, says why):
//! 1. [`shard_loop`] takes a batch of jobs from the thread's queue, runs
//!    each ([`run`]: now, or aside for a script), files its reply into the
//!    batch's [`Group`] or parks it, and ends the batch with
//!    [`finish_group`]: the replies go to the syncer (a group that wrote,
//!    `group` durability), or are released here.
//! 2. A read-only group is released here as soon as the fsync of this
//!    thread's last group that wrote completed: a single-slot read only
//!    observes writes of its own slot, and those run on this thread only.
//!    Node-wide reads count as writes and never take this path.
//! 3. *Inline runs* ([`try_inline`]). A connection placed on this thread
//!    (the executor's module doc, 6) runs a request for a slot this thread
//!    owns right away, in its own task, instead of queueing it and waking
//!    the loop, when the loop is idle (not inside a batch or an aside
//!    task) and nothing is parked. The request runs through the same
//!    [`run_now`] and [`file`] as a queued one, so admission, fences,
//!    replication and blocked clients are handled alike; only where its
//!    reply goes differs:
//!    - a read-only reply with no inline reply waiting is finished at once
//!      (1-2: usually released before the connection awaits it);
//!    - anything else joins the thread's *open group*, which the loop
//!      merges into its next batch's group (the first reply into it queues
//!      a [`Job::Wake`] so that batch comes): a pipeline's writes share
//!      one trip to the syncer;
//!    - a request a fence held is handed to the loop's parked list (and
//!      counted there at once, so no later request runs inline past it).
//!
//! Order. Inline runs keep every order the queue keeps: the loop is idle,
//! so no batch is half-run; nothing is parked, so no held request of the
//! slot is overtaken; and a connection runs a request inline only while
//! no earlier request of its current pipeline batch was queued
//! ([`crate::session::Session::may_inline`]), so its own requests keep
//! their order. A request of another connection still in the queue is
//! concurrent with it (sent before this one was answered): either order is
//! linearizable.

use super::{
    DurableSeq, Follow, Job, LatencyGauge, OrderKey, RUN_NEXT, Task, TaskOutput, fsync_failed,
    held_too_long, release, shutting_down, storage_failed, sync_now,
};
use crate::config::Durability;
use crate::metrics::Metrics;
use crate::storage_health::StorageHealth;
use keyway_resp::Frame;
use keyway_storage::Engine;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, watch};

/// A task and where its reply goes.
pub(super) struct Parked {
    pub task: Task,
    pub ticket: Ticket,
}

impl Parked {
    /// A task of `slot` arriving now, run on its thread (not aside).
    pub fn of_slot(slot: u16, task: Task, reply: oneshot::Sender<Frame>) -> Self {
        Parked {
            task,
            ticket: Ticket {
                reply,
                since: Instant::now(),
                slot: Some(slot),
                aside: false,
            },
        }
    }
}

/// Where a task's reply goes, and what orders it.
pub(super) struct Ticket {
    pub reply: oneshot::Sender<Frame>,
    pub since: Instant,
    pub slot: OrderKey,
    /// Runs aside (see the executor's module doc, 7).
    pub aside: bool,
}

pub(super) struct Released {
    pub reply: oneshot::Sender<Frame>,
    pub frame: Frame,
    pub since: Instant,
    pub defer: Option<super::Deferral>,
}

#[derive(Default)]
pub(super) struct Group {
    pub replies: Vec<Released>,
    pub needs_sync: bool,
}

impl Group {
    fn append(&mut self, other: Group) {
        self.replies.extend(other.replies);
        self.needs_sync |= other.needs_sync;
    }
}

/// What a shard thread needs besides its queue.
pub(super) struct ShardContext {
    pub durability: Durability,
    pub max_group: usize,
    pub max_hold: Duration,
    pub latency: Arc<LatencyGauge>,
    pub health: Arc<StorageHealth>,
    pub durable: Arc<DurableSeq>,
}

/// A shard thread's state, shared by its loop and the connection tasks on
/// its runtime (only ever touched on that thread).
pub(super) struct Local {
    /// The executor this thread belongs to (several nodes may share a
    /// process): [`super::Executor::identity`].
    pub owner: usize,
    pub index: usize,
    pub engine: Arc<dyn Engine>,
    pub ctx: ShardContext,
    pub metrics: Arc<Metrics>,
    pub group_tx: std_mpsc::Sender<Group>,
    /// This thread's own queue, to wake the loop (weak: the loop ends when
    /// the executor's senders are gone).
    pub queue: mpsc::WeakSender<Job>,
    /// The loop is inside a batch (possibly awaiting an aside task).
    pub busy: Cell<bool>,
    /// Parked requests: the loop's, plus those in `handoff`.
    pub parked: Cell<usize>,
    /// The engine's last seq after this thread's last group that wrote
    /// (`group` durability): a read-only group waits for an fsync of it.
    pub unsynced_through: Cell<keyway_storage::Seq>,
    /// Replies of inline runs waiting for the loop's next group.
    pub open: RefCell<Group>,
    /// Requests an inline run parked, for the loop's parked list.
    pub handoff: RefCell<Vec<Parked>>,
}

thread_local! {
    static LOCAL: RefCell<Option<Rc<Local>>> = const { RefCell::new(None) };
}

/// Runs the shard thread's loop on `runtime` until [`Job::Stop`], with
/// `local` reachable by the connection tasks on it.
pub(super) fn serve(
    runtime: &tokio::runtime::Runtime,
    local: Local,
    changes: watch::Receiver<u64>,
    rx: mpsc::Receiver<Job>,
) {
    let local = Rc::new(local);
    LOCAL.with(|l| *l.borrow_mut() = Some(local.clone()));
    runtime.block_on(shard_loop(&local, changes, rx));
    LOCAL.with(|l| *l.borrow_mut() = None);
}

/// Runs `task` (of `slot`) now if this is shard thread `index` of executor
/// `owner` and its loop is idle with nothing parked (see the overview, 3);
/// gives it back otherwise.
pub(super) fn try_inline(
    owner: usize,
    index: usize,
    slot: u16,
    task: Task,
) -> Result<oneshot::Receiver<Frame>, Task> {
    let local = LOCAL.with(|l| {
        l.borrow()
            .as_ref()
            .filter(|l| {
                l.owner == owner && l.index == index && !l.busy.get() && l.parked.get() == 0
            })
            .cloned()
    });
    match local {
        // Not from inside a task (a task that queues work of its own
        // queues it with `run_next`).
        Some(local) if RUN_NEXT.with(|n| n.borrow().is_none()) => Ok(local.run_inline(slot, task)),
        _ => Err(task),
    }
}

impl Local {
    fn run_inline(&self, slot: u16, task: Task) -> oneshot::Receiver<Frame> {
        let (reply, rx) = oneshot::channel();
        let job = Parked::of_slot(slot, task, reply);
        let mut group = Group::default();
        let mut parked = Vec::new();
        self.busy.set(true);
        RUN_NEXT.with(|n| *n.borrow_mut() = Some(Vec::new()));
        run_now(
            &self.engine,
            &self.ctx,
            job,
            &mut group,
            &mut parked,
            &self.metrics,
        );
        run_queued_next(
            &self.engine,
            &self.ctx,
            &mut group,
            &mut parked,
            &self.metrics,
        );
        RUN_NEXT.with(|n| *n.borrow_mut() = None);
        self.busy.set(false);
        self.metrics.inline_runs.inc();
        if !parked.is_empty() {
            self.parked.set(self.parked.get() + parked.len());
            self.handoff.borrow_mut().append(&mut parked);
            self.wake_loop();
        }
        if group.replies.is_empty() {
            return rx;
        }
        let mut open = self.open.borrow_mut();
        if open.replies.is_empty() && !group.needs_sync {
            drop(open);
            // A gone syncer drops the replies: their receivers say so.
            finish_group(self, group, true);
        } else {
            let first = open.replies.is_empty();
            open.append(group);
            drop(open);
            if first {
                self.wake_loop();
            }
        }
        rx
    }

    /// Queues a [`Job::Wake`]: the loop runs a batch (re-running parked
    /// requests, merging the open group). A full queue is skipped: the
    /// loop is about to run a batch anyway.
    fn wake_loop(&self) {
        if let Some(queue) = self.queue.upgrade() {
            let _ = queue.try_send(Job::Wake);
        }
    }
}

async fn shard_loop(local: &Local, mut changes: watch::Receiver<u64>, mut rx: mpsc::Receiver<Job>) {
    let (engine, ctx, metrics) = (&local.engine, &local.ctx, &*local.metrics);
    let mut parked: Vec<Parked> = Vec::new();
    let mut stopping = false;
    while !stopping {
        local.parked.set(parked.len());
        local.busy.set(false);
        let Some(first) = rx.recv().await else {
            break;
        };
        local.busy.set(true);
        // Held by inline runs: older than every job queued after them.
        parked.append(&mut local.handoff.borrow_mut());
        // Only while this batch runs (and not while a task runs aside):
        // a connection task on this thread is not a storage task.
        RUN_NEXT.with(|next| *next.borrow_mut() = Some(Vec::new()));
        let mut group = Group {
            replies: Vec::with_capacity(16),
            needs_sync: false,
        };
        let mut next = Some(first);
        while let Some(job) = next {
            if matches!(job, Job::Stop) {
                stopping = true;
                break;
            }
            let wake = matches!(job, Job::Wake);
            // A changed view first re-runs what is parked, in order, so a
            // held request never falls behind a later one for its slot.
            if !parked.is_empty() && (wake || changes.has_changed().unwrap_or(false)) {
                changes.mark_unchanged();
                rerun_parked(engine, ctx, &mut group, &mut parked, metrics).await;
            }
            if let Job::Run { task, ticket } = job {
                let slot = ticket.slot;
                if slot.is_some() && parked.iter().any(|p| p.ticket.slot == slot) {
                    // Behind a parked task of its slot: wait without running,
                    // even if the hold looks lifted (the change counter may
                    // not be bumped yet).
                    metrics.held.inc();
                    metrics.held_in_order.inc();
                    parked.push(Parked { task, ticket });
                } else {
                    if parked.is_empty() {
                        changes.mark_unchanged();
                    }
                    run(
                        engine,
                        ctx,
                        Parked { task, ticket },
                        &mut group,
                        &mut parked,
                        metrics,
                    )
                    .await;
                }
            }
            run_queued_next(engine, ctx, &mut group, &mut parked, metrics);
            next = if group.replies.len() < ctx.max_group {
                rx.try_recv().ok()
            } else {
                None
            };
        }
        RUN_NEXT.with(|next| *next.borrow_mut() = None);
        group.append(std::mem::take(&mut *local.open.borrow_mut()));
        if !finish_group(local, group, false) {
            return;
        }
    }
}

/// Ends a group by the durability rule (the executor's module doc, 3, and
/// the overview, 2); false once the syncer is gone. `inline`: an inline
/// run's group, whose replies ran just now (not observed in the latency
/// gauge).
pub(super) fn finish_group(local: &Local, mut group: Group, inline: bool) -> bool {
    let latency = (!inline).then_some(&*local.ctx.latency);
    let (engine, ctx) = (&*local.engine, &local.ctx);
    match ctx.durability {
        Durability::Group if group.needs_sync => {
            local.unsynced_through.set(engine.last_seq());
            local.group_tx.send(group).is_ok()
        }
        Durability::Group if group.replies.is_empty() => true,
        Durability::Group => {
            if ctx.durable.get(engine) < local.unsynced_through.get() {
                // Behind this thread's groups in the syncer's queue.
                return local.group_tx.send(group).is_ok();
            }
            if let Some(why) = ctx.health.failure() {
                group
                    .replies
                    .iter_mut()
                    .for_each(|r| r.frame = storage_failed(why));
            }
            local.metrics.read_groups_released_at_once.inc();
            release(group.replies, latency);
            true
        }
        _ => {
            // `periodic` and `none`: this thread's applies are handed to the
            // OS once for the group, before any reply leaves (a read's too:
            // it may show another thread's deferred apply).
            hand_to_os(engine, ctx, &mut group, &local.metrics);
            // `always` fsynced each write (and published); `periodic` and
            // `none` follow the last seq: wake the replication streams.
            ctx.durable.publish(engine.last_seq());
            release(group.replies, latency);
            true
        }
    }
}

/// Runs what [`super::run_next`] queued, and what those queued in turn, in
/// order (behind its slot's parked tasks if it has any). Such tasks never
/// run aside.
fn run_queued_next(
    engine: &Arc<dyn Engine>,
    ctx: &ShardContext,
    group: &mut Group,
    parked: &mut Vec<Parked>,
    metrics: &Metrics,
) {
    loop {
        let queued = RUN_NEXT
            .with(|next| std::mem::take(next.borrow_mut().as_mut().expect("on a shard thread")));
        if queued.is_empty() {
            return;
        }
        for job in queued {
            let slot = job.ticket.slot;
            if slot.is_some() && parked.iter().any(|p| p.ticket.slot == slot) {
                metrics.held.inc();
                metrics.held_in_order.inc();
                parked.push(job);
            } else {
                run_now(engine, ctx, job, group, parked, metrics);
            }
        }
    }
}

/// Re-runs the parked tasks in arrival order. Once a task of slot `s`
/// parks again, every later one of slot `s` stays parked without running.
async fn rerun_parked(
    engine: &Arc<dyn Engine>,
    ctx: &ShardContext,
    group: &mut Group,
    parked: &mut Vec<Parked>,
    metrics: &Metrics,
) {
    let mut still_held: Vec<u16> = Vec::new();
    for p in std::mem::take(parked) {
        if p.ticket.since.elapsed() > ctx.max_hold {
            metrics.held_expired.inc();
            group.replies.push(Released {
                reply: p.ticket.reply,
                frame: held_too_long(ctx.max_hold),
                since: p.ticket.since,
                defer: None,
            });
            continue;
        }
        if p.ticket.slot.is_some_and(|s| still_held.contains(&s)) {
            metrics.held_in_order.inc();
            parked.push(p);
            continue;
        }
        let slot = p.ticket.slot;
        let before = parked.len();
        run(engine, ctx, p, group, parked, metrics).await;
        if let Some(s) = slot
            && parked.len() > before
        {
            still_held.push(s);
        }
    }
}

/// Runs one task (aside if it is to) and files its reply (or parks it).
async fn run(
    engine: &Arc<dyn Engine>,
    ctx: &ShardContext,
    job: Parked,
    group: &mut Group,
    parked: &mut Vec<Parked>,
    metrics: &Metrics,
) {
    if job.ticket.aside {
        let out = run_aside(engine, job.task).await;
        file(engine, ctx, job.ticket, out, group, parked, metrics);
    } else {
        run_now(engine, ctx, job, group, parked, metrics);
    }
}

/// [`run`] for a task that does not run aside: on this thread, now.
fn run_now(
    engine: &Arc<dyn Engine>,
    ctx: &ShardContext,
    job: Parked,
    group: &mut Group,
    parked: &mut Vec<Parked>,
    metrics: &Metrics,
) {
    debug_assert!(!job.ticket.aside, "an aside task is awaited, not run now");
    let out = (job.task)(&**engine);
    file(engine, ctx, job.ticket, out, group, parked, metrics);
}

/// Files what a task produced: its reply into `group` (after its fsync
/// with `always`), or, for a request held by a fence, the task to re-run
/// into `parked`.
fn file(
    engine: &Arc<dyn Engine>,
    ctx: &ShardContext,
    ticket: Ticket,
    mut out: TaskOutput,
    group: &mut Group,
    parked: &mut Vec<Parked>,
    metrics: &Metrics,
) {
    metrics.commands.inc();
    let defer = match out.follow {
        Follow::Release => None,
        Follow::Defer(f) => Some(f),
        Follow::Park(task) => {
            metrics.held.inc();
            parked.push(Parked { task, ticket });
            return;
        }
    };
    if ctx.durability == Durability::Always {
        let covered = engine.last_seq();
        if out.wrote && !sync_now(&**engine, metrics, &ctx.health) {
            out.reply = fsync_failed();
        } else if let Some(why) = ctx.health.failure() {
            // Storage failed meanwhile (another thread's fsync): this reply
            // may show a write that is only in the page cache.
            out.reply = storage_failed(why);
        } else if out.wrote {
            ctx.durable.publish(covered);
        }
    }
    group.needs_sync |= out.wrote;
    group.replies.push(Released {
        reply: ticket.reply,
        frame: out.reply,
        since: ticket.since,
        defer,
    });
}

/// Runs `task` on the runtime's blocking pool while this shard thread
/// awaits it (see the executor's module doc, 7). What it queues with
/// [`super::run_next`] is queued here, to run next as if it had run inline.
async fn run_aside(engine: &Arc<dyn Engine>, task: Task) -> TaskOutput {
    // While it runs, this thread's connection tasks run: they must find no
    // batch to queue into.
    let batch = RUN_NEXT.with(|next| next.borrow_mut().take());
    debug_assert!(batch.is_some(), "a task runs aside only inside a batch");
    let engine = engine.clone();
    let ran = tokio::task::spawn_blocking(move || {
        RUN_NEXT.with(|next| *next.borrow_mut() = Some(Vec::new()));
        let out = task(&*engine);
        let queued = RUN_NEXT.with(|next| next.borrow_mut().take());
        (out, queued.unwrap_or_default())
    })
    .await;
    let (out, queued) = match ran {
        Ok(ran) => ran,
        Err(err) => match err.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            // Cancelled before it started: only when the runtime shuts down.
            Err(_) => (TaskOutput::reply(shutting_down(), false), Vec::new()),
        },
    };
    RUN_NEXT.with(|next| {
        let mut batch = batch.unwrap_or_default();
        batch.extend(queued);
        *next.borrow_mut() = Some(batch);
    });
    out
}

/// Hands the group's deferred applies to the OS ([`Engine::flush_deferred`]).
/// A failed write latches `health` as a failed fsync does (the batches may
/// be lost with the process; counted in `fsync_errors`, the journal write
/// being the first half of an fsync), and no reply of the group says
/// otherwise.
fn hand_to_os(engine: &dyn Engine, ctx: &ShardContext, group: &mut Group, metrics: &Metrics) {
    if ctx.health.failure().is_none()
        && let Err(err) = engine.flush_deferred()
    {
        metrics.fsync_errors.inc();
        ctx.health.fail(format!("journal write error: {err}"));
    }
    if let Some(why) = ctx.health.failure() {
        for r in &mut group.replies {
            r.frame = storage_failed(why);
        }
    }
}
