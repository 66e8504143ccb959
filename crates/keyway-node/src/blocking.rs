//! Blocking commands (BLPOP BRPOP BLMOVE BRPOPLPUSH BLMPOP, and any other
//! command whose [`crate::cmd::Command::blocking_timeout_ms`] is set): key waiters woken
//! by a push.
//!
//! # How a client blocks
//! A blocking command runs as an **attempt**: an ordinary storage task
//! (admission, execute, apply, on the slot's executor thread) of the
//! command's non-blocking form, with a [`Gate`] between execute and apply:
//! - a nil reply (nothing to pop) means *block*: still on the executor
//!   thread, the gate registers the client as a **waiter** on the storage
//!   keys of its command (idempotent), the overlay is dropped, and the
//!   attempt tells its client to wait;
//! - a reply that serves from a key on which an *earlier* waiter waits
//!   *yields* (dropped as well, the client waits): first blocked, first
//!   served, per key;
//! - anything else (served, an error, a redirect) is the command's reply:
//!   the waiter is removed.
//!
//! Checking and registering happen in one task on the slot's thread, and
//! every write of that slot runs on that thread too, so a push can never
//! fall between an attempt that found nothing and its registration. After
//! every applied batch that puts a List, ZSet or Stream top-level entry,
//! [`crate::node_cmd::apply_and_reply`] calls [`Blocking::notify`], which
//! wakes every waiter of those keys. A waiting client keeps its next attempt
//! **armed** in its waiter entry (the task and where its reply goes), so the
//! push that wakes it runs that attempt on the same executor thread right
//! after itself ([`crate::executor::run_next`]), before any command queued
//! meanwhile: as Redis serves blocked clients before its next command, a
//! client that pushes and then reads sees the blocked clients served (a
//! chain of BLMOVEs included). A waiter that is not armed at that moment
//! (between two attempts) is marked woken and its client attempts again at
//! once. When a waiter leaves (served, timed out, disconnected,
//! redirected), the waiters that yielded to it on its keys are woken again.
//!
//! A waiting client holds nothing on the executor: it is a [`Notify`] and
//! an entry in [`Blocking`]'s table. So it never keeps a partition from
//! migrating, and since every attempt goes through admission, a client whose
//! slot moved away meanwhile gets `-MOVED` (a waiter also re-attempts on
//! every routing change, so it learns of the move without a push).
//!
//! The timeout is Redis's (float seconds, `0` = forever, nil on expiry:
//! the RESP2 null array). Inside MULTI a blocking command is run by
//! [`crate::cmd::Command::execute`] alone: its non-blocking form.
//!
//! Difference from Redis: a client waiting on several keys pops from the
//! first non-empty key in argument order (Redis 7.2's rule; 7.0 pops from
//! the key that was pushed to).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use keyway_resp::Frame;
use keyway_storage::{Mutation, ValueKind};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{Notify, oneshot};

use crate::metrics::Metrics;

/// What a [`Gate`] decided for an attempt's reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Apply the command's writes and send its reply.
    Reply,
    /// Drop the command's writes: the client waits (it is registered).
    Wait,
}

/// The waiters of one node, by storage key.
pub struct Blocking {
    state: Mutex<State>,
    /// Waiters registered (the cheap check [`Blocking::notify`] starts with).
    registered: AtomicUsize,
    next_id: AtomicU64,
    metrics: BlockingMetrics,
    /// CLIENT UNBLOCK's way in: the blocked client's id -> its unblocker.
    unblockers: Mutex<HashMap<u64, oneshot::Sender<Unblock>>>,
}

/// How CLIENT UNBLOCK ends a blocked command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unblock {
    /// As if its timeout expired (the default).
    Timeout,
    /// With `-UNBLOCKED client unblocked via CLIENT UNBLOCK`.
    Error,
}

#[derive(Default)]
struct State {
    /// Waiter ids per storage key, first blocked first.
    queues: HashMap<Bytes, VecDeque<u64>>,
    waiters: HashMap<u64, Waiter>,
    /// Blocked clients whose [`block`] task runs: only these may register,
    /// so an attempt that runs after its client left (it was queued when
    /// the client disconnected) cannot leave a ghost waiter at the front of
    /// a key's queue, which every later waiter would yield to.
    live: std::collections::HashSet<u64>,
    /// Blocked clients woken by any write of their keys, whatever its type
    /// (XREADGROUP: its stream replaced by another type ends its wait).
    any_write: std::collections::HashSet<u64>,
}

struct Waiter {
    keys: Vec<Bytes>,
    wake: Arc<Notify>,
    /// Its last attempt yielded to an earlier waiter.
    yielded: bool,
    /// Its next attempt, ready for a push to run ([`Blocking::arm`]).
    armed: Option<Armed>,
    /// Woken while not armed: its client attempts again instead of arming.
    woken: bool,
}

/// A waiter's next attempt: the storage task of its slot, and where its
/// reply goes (the client's [`block`] loop).
pub struct Armed {
    slot: u16,
    task: crate::executor::Task,
    reply: oneshot::Sender<Frame>,
}

impl Waiter {
    /// Wakes it: runs its armed attempt next on this executor thread, or
    /// (not armed, or not on an executor thread) has its client attempt again.
    fn wake(&mut self) {
        if let Some(Armed { slot, task, reply }) = self.armed.take() {
            match crate::executor::run_next(slot, task, reply) {
                Ok(()) => return,
                Err((task, reply)) => self.armed = Some(Armed { slot, task, reply }),
            }
        }
        self.woken = true;
        self.wake.notify_one();
    }
}

/// The blocking metrics (registered with the node's [`Metrics`]).
#[derive(Clone, Default)]
pub struct BlockingMetrics {
    /// Clients blocked now.
    pub blocked_clients: Gauge,
    /// Attempts that found nothing and made their client wait.
    pub blocks: Counter,
    /// Waiters woken by a push (each waiter counted once per push).
    pub wakeups: Counter,
    /// Attempts that yielded to an earlier waiter of their key.
    pub yields: Counter,
    /// Blocked clients answered nil at their timeout.
    pub timeouts: Counter,
}

impl BlockingMetrics {
    fn register(metrics: &Metrics) -> Self {
        let m = BlockingMetrics::default();
        metrics.register(
            "blocked_clients",
            "Clients blocked by BLPOP, BLMOVE, ... now",
            m.blocked_clients.clone(),
        );
        metrics.register(
            "blocking_blocks",
            "Blocking-command attempts that found nothing and made their client wait",
            m.blocks.clone(),
        );
        metrics.register(
            "blocking_wakeups",
            "Blocked clients woken by a write to a key they wait on",
            m.wakeups.clone(),
        );
        metrics.register(
            "blocking_yields",
            "Blocking-command attempts that yielded to an earlier waiter of their key",
            m.yields.clone(),
        );
        metrics.register(
            "blocking_timeouts",
            "Blocked clients answered nil at their timeout",
            m.timeouts.clone(),
        );
        m
    }
}

/// The JSON `/status` view.
#[derive(Clone, Debug, serde::Serialize)]
pub struct BlockingStatus {
    pub blocked_clients: usize,
    pub keys_waited_on: usize,
    pub timeouts: u64,
}

impl Blocking {
    /// An empty table whose metrics are registered with `metrics`.
    pub fn new(metrics: &Metrics) -> Self {
        Blocking {
            state: Mutex::new(State::default()),
            registered: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
            metrics: BlockingMetrics::register(metrics),
            unblockers: Mutex::new(HashMap::new()),
        }
    }

    /// CLIENT UNBLOCK: ends client `client`'s blocked command `how`;
    /// `false` if that client is not blocked.
    pub fn unblock(&self, client: u64, how: Unblock) -> bool {
        let sender = self
            .unblockers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&client);
        sender.is_some_and(|s| s.send(how).is_ok())
    }

    /// The metrics.
    pub fn metrics(&self) -> &BlockingMetrics {
        &self.metrics
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// For `/status`.
    pub fn status(&self) -> BlockingStatus {
        let state = self.lock();
        BlockingStatus {
            blocked_clients: state.waiters.len(),
            keys_waited_on: state.queues.len(),
            timeouts: self.metrics.timeouts.get(),
        }
    }

    /// Wakes the waiters of every List, ZSet or Stream top-level entry
    /// `mutations` put, and the `any_write` waiters of every key they put
    /// or delete (call after they were applied).
    pub fn notify(&self, mutations: &[Mutation]) {
        if self.registered.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut state = self.lock();
        let state = &mut *state;
        for m in mutations {
            // A delete or a put of another type wakes the `any_write`
            // waiters only: a blocked XREADGROUP answers that its stream is
            // gone.
            let (key, typed) = match m {
                Mutation::Put {
                    key,
                    kind: ValueKind::List | ValueKind::ZSet | ValueKind::Stream,
                    ..
                } => (key, true),
                Mutation::Put { key, .. } | Mutation::Delete { key } => (key, false),
                _ => continue,
            };
            if let Some(queue) = state.queues.get(key) {
                for id in queue {
                    if !typed && !state.any_write.contains(id) {
                        continue;
                    }
                    if let Some(w) = state.waiters.get_mut(id) {
                        self.metrics.wakeups.inc();
                        w.wake();
                    }
                }
            }
        }
    }

    /// Registers waiter `id` on `keys` (no-op if it is registered).
    fn register(&self, id: u64, keys: &[Bytes], wake: &Arc<Notify>) {
        let mut state = self.lock();
        if state.waiters.contains_key(&id) || !state.live.contains(&id) {
            return;
        }
        let mut distinct: Vec<Bytes> = Vec::with_capacity(keys.len());
        for k in keys {
            if !distinct.contains(k) {
                distinct.push(k.clone());
            }
        }
        for k in &distinct {
            state.queues.entry(k.clone()).or_default().push_back(id);
        }
        state.waiters.insert(
            id,
            Waiter {
                keys: distinct,
                wake: wake.clone(),
                yielded: false,
                armed: None,
                woken: false,
            },
        );
        self.registered.fetch_add(1, Ordering::AcqRel);
        self.metrics.blocked_clients.inc();
    }

    /// Removes waiter `id` (no-op if absent) and wakes the waiters that
    /// yielded to it.
    fn remove(&self, id: u64) {
        let mut state = self.lock();
        self.remove_locked(&mut state, id);
    }

    /// A blocked client's task starts: it may register as a waiter.
    fn start(&self, id: u64, any_write: bool) {
        let mut state = self.lock();
        state.live.insert(id);
        if any_write {
            state.any_write.insert(id);
        }
    }

    /// A blocked client's task ended: it is removed and may not register again.
    fn end(&self, id: u64) {
        let mut state = self.lock();
        state.live.remove(&id);
        state.any_write.remove(&id);
        self.remove_locked(&mut state, id);
    }

    fn remove_locked(&self, state: &mut State, id: u64) {
        let Some(w) = state.waiters.remove(&id) else {
            return;
        };
        self.registered.fetch_sub(1, Ordering::AcqRel);
        self.metrics.blocked_clients.dec();
        for k in &w.keys {
            let Some(queue) = state.queues.get_mut(k) else {
                continue;
            };
            queue.retain(|&other| other != id);
            if queue.is_empty() {
                state.queues.remove(k);
                continue;
            }
            let queue = state.queues.get(k).cloned().unwrap_or_default();
            for other in queue {
                if let Some(o) = state.waiters.get_mut(&other)
                    && o.yielded
                {
                    o.yielded = false;
                    o.wake();
                }
            }
        }
    }

    /// Whether waiter `id` (registered or not) must yield `key` to an
    /// earlier waiter; if so it is registered and marked yielded.
    fn must_yield(&self, id: u64, keys: &[Bytes], key: &Bytes, wake: &Arc<Notify>) -> bool {
        {
            let mut state = self.lock();
            let earlier = match state.queues.get(key) {
                None => false,
                Some(q) => q.front().is_some_and(|&first| first != id),
            };
            if !earlier {
                return false;
            }
            if let Some(w) = state.waiters.get_mut(&id) {
                w.yielded = true;
                self.metrics.yields.inc();
                return true;
            }
        }
        self.register(id, keys, wake);
        if let Some(w) = self.lock().waiters.get_mut(&id) {
            w.yielded = true;
        }
        self.metrics.yields.inc();
        true
    }

    /// Arms waiter `id`'s next attempt; gives it back if the waiter was
    /// woken since its last attempt (or is gone): then attempt at once.
    fn arm(&self, id: u64, armed: Armed) -> Result<(), Armed> {
        let mut state = self.lock();
        match state.waiters.get_mut(&id) {
            Some(w) if !w.woken => {
                w.armed = Some(armed);
                Ok(())
            }
            Some(w) => {
                w.woken = false;
                Err(armed)
            }
            None => Err(armed),
        }
    }

    /// Takes waiter `id`'s armed attempt back; `None` if a push took it
    /// (it runs or ran: its reply is on its way).
    fn disarm(&self, id: u64) -> Option<Armed> {
        let mut state = self.lock();
        let w = state.waiters.get_mut(&id)?;
        w.woken = false;
        w.armed.take()
    }

    fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }
}

/// One attempt's link to its waiter: decides, on the executor thread,
/// whether the command's reply is sent or its client waits.
pub struct Gate {
    blocking: Arc<Blocking>,
    id: u64,
    /// The command's storage keys, in argument order.
    keys: Vec<Bytes>,
    /// The same keys as the client sent them.
    user_keys: Vec<Bytes>,
    wake: Arc<Notify>,
    waiting: AtomicBool,
    /// The slot, and the builder of the next attempt (armed on a wait).
    slot: u16,
    attempt: Arc<AttemptFn>,
    /// The routing change counter as this attempt ran (read under its
    /// routing guard): a later change may redirect the waiter.
    routing: tokio::sync::watch::Receiver<u64>,
    routing_seen: AtomicU64,
    /// The attempt armed when this one made its client wait.
    next: Mutex<Option<Next>>,
}

/// The armed next attempt, as its client's [`block`] loop awaits it.
struct Next {
    gate: Arc<Gate>,
    reply: oneshot::Receiver<Frame>,
}

impl Gate {
    /// The gate of the next attempt of the same waiter.
    fn successor(&self) -> Arc<Gate> {
        Arc::new(Gate {
            blocking: self.blocking.clone(),
            id: self.id,
            keys: self.keys.clone(),
            user_keys: self.user_keys.clone(),
            wake: self.wake.clone(),
            waiting: AtomicBool::new(false),
            slot: self.slot,
            attempt: self.attempt.clone(),
            routing: self.routing.clone(),
            routing_seen: AtomicU64::new(0),
            next: Mutex::new(None),
        })
    }

    /// Decides for `reply`, the command's reply in its non-blocking form.
    pub fn decide(&self, reply: &Frame) -> Decision {
        self.routing_seen
            .store(*self.routing.borrow(), Ordering::Release);
        let served_from = match reply {
            Frame::Null | Frame::NullArray => {
                self.blocking.register(self.id, &self.keys, &self.wake);
                if let Some(w) = self.blocking.lock().waiters.get_mut(&self.id) {
                    w.yielded = false;
                }
                self.blocking.metrics.blocks.inc();
                return self.wait();
            }
            Frame::Error(_) => None,
            // `[key, ...]` (BLPOP, BLMPOP, BZPOPMIN, ...): served from `key`.
            Frame::Array(items) => match items.first() {
                Some(Frame::Bulk(k)) => self
                    .user_keys
                    .iter()
                    .position(|u| u == k)
                    .map(|i| self.keys[i].clone()),
                _ => None,
            },
            // BLMOVE and the like: served from the first key.
            _ => self.keys.first().cloned(),
        };
        if let Some(key) = served_from
            && self
                .blocking
                .must_yield(self.id, &self.keys, &key, &self.wake)
        {
            return self.wait();
        }
        self.waiting.store(false, Ordering::Release);
        self.blocking.remove(self.id);
        Decision::Reply
    }

    /// The client waits (it is registered): arms its next attempt here, on
    /// the executor thread, so no push can fall between this attempt and
    /// the arming (unless it was woken meanwhile: then it attempts again).
    fn wait(&self) -> Decision {
        self.waiting.store(true, Ordering::Release);
        let gate = self.successor();
        let (tx, rx) = oneshot::channel();
        let armed = Armed {
            slot: self.slot,
            task: (self.attempt)(gate.clone()),
            reply: tx,
        };
        if self.blocking.arm(self.id, armed).is_ok() {
            *self.next.lock().unwrap_or_else(|e| e.into_inner()) = Some(Next { gate, reply: rx });
        }
        Decision::Wait
    }
}

/// A blocking command's attempt as a storage task's work: the command in its
/// non-blocking form, with its [`Gate`] deciding whether the reply is kept.
pub struct Attempt {
    command: crate::cmd::Command,
    gate: Arc<Gate>,
}

impl Attempt {
    pub fn new(command: crate::cmd::Command, gate: Arc<Gate>) -> Self {
        Attempt { command, gate }
    }
}

impl crate::node_cmd::SlotWork for Attempt {
    fn is_write(&self) -> bool {
        self.command.is_write()
    }
    fn first_key(&self) -> Option<&[u8]> {
        self.command.keys().first().copied()
    }
    fn execute(&self, db: &mut crate::db::Db<'_>) -> Result<Frame, keyway_storage::StorageError> {
        self.command.execute(db)
    }
    fn keep(&self, reply: &Frame) -> bool {
        self.gate.decide(reply) == Decision::Reply
    }
}

/// Removes its waiter when the blocked client is done or gone.
struct Registration {
    blocking: Arc<Blocking>,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.blocking.end(self.id);
    }
}

/// A blocked client's entry in [`Blocking`]'s CLIENT UNBLOCK table, removed
/// when its command ends.
struct Unblocker {
    blocking: Arc<Blocking>,
    client: u64,
}

impl Unblocker {
    fn register(blocking: &Arc<Blocking>, client: u64, tx: oneshot::Sender<Unblock>) -> Self {
        blocking
            .unblockers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(client, tx);
        Unblocker {
            blocking: blocking.clone(),
            client,
        }
    }
}

impl Drop for Unblocker {
    fn drop(&mut self) {
        self.blocking
            .unblockers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.client);
    }
}

/// Builds one attempt: the storage task of the command, with `gate`
/// deciding between its execute and its apply.
pub type AttemptFn = dyn Fn(Arc<Gate>) -> crate::executor::Task + Send + Sync;

/// Runs a blocking command for one client: attempts until one replies,
/// waiting in between for a push to one of `storage_keys`, a routing change
/// or the timeout (`timeout_ms`, 0 = forever). The returned receiver gets
/// the reply; dropping it (the client disconnected) removes the waiter.
pub fn block(
    shared: Arc<crate::server::Shared>,
    slot: u16,
    user_keys: Vec<Bytes>,
    timeout_ms: u64,
    client: u64,
    any_write: bool,
    attempt: Box<AttemptFn>,
) -> oneshot::Receiver<Frame> {
    let (tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        let blocking = shared.blocking.clone();
        let id = blocking.next_id();
        blocking.start(id, any_write);
        let _registration = Registration {
            blocking: blocking.clone(),
            id,
        };
        let (unblock_tx, mut unblocked) = oneshot::channel();
        let _unblocker = Unblocker::register(&blocking, client, unblock_tx);
        let wake = Arc::new(Notify::new());
        // Beyond what the clock can count: forever.
        let deadline = (timeout_ms > 0)
            .then(|| tokio::time::Instant::now().checked_add(Duration::from_millis(timeout_ms)))
            .flatten();
        let storage_keys: Vec<Bytes> = user_keys
            .iter()
            .map(|k| shared.keyspace.storage_key(k))
            .collect();
        let mut routing = shared.routing.subscribe();
        let mut tx = tx;
        let attempt: Arc<AttemptFn> = Arc::from(attempt);
        let first = Arc::new(Gate {
            blocking: blocking.clone(),
            id,
            keys: storage_keys,
            user_keys,
            wake: wake.clone(),
            waiting: AtomicBool::new(false),
            slot,
            attempt: attempt.clone(),
            routing: routing.clone(),
            routing_seen: AtomicU64::new(0),
            next: Mutex::new(None),
        });
        // Each turn: the last attempt's gate and reply.
        let mut gate = first.successor();
        let mut reply = tokio::select! {
            r = shared.executor.run(slot, attempt(gate.clone())) => r,
            _ = tx.closed() => return,
        };
        loop {
            if !gate.waiting.load(Ordering::Acquire) {
                let _ = tx.send(reply);
                return;
            }
            routing.mark_unchanged();
            let armed = gate.next.lock().unwrap_or_else(|e| e.into_inner()).take();
            let routing_moved = *routing.borrow() != gate.routing_seen.load(Ordering::Acquire);
            let Some(Next {
                gate: next_gate,
                reply: mut armed_rx,
            }) = armed
            else {
                // Woken since the attempt: attempt again now.
                gate = first.successor();
                reply = tokio::select! {
                    r = shared.executor.run(slot, attempt(gate.clone())) => r,
                    _ = tx.closed() => return,
                };
                continue;
            };
            gate = next_gate;
            let timed_out = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            let event = tokio::select! {
                // The routing changed since the attempt ran: it may redirect.
                _ = std::future::ready(()), if routing_moved => Ended::No,
                r = &mut armed_rx => {
                    // A push ran the armed attempt.
                    reply = r.unwrap_or_else(|_| shutting_down());
                    continue;
                }
                _ = wake.notified() => Ended::No,
                r = routing.changed() => match r {
                    Ok(()) => Ended::No,
                    Err(_) => return,
                },
                _ = timed_out => Ended::TimedOut,
                how = &mut unblocked => Ended::Unblocked(match how {
                    Ok(Unblock::Error) => {
                        Frame::Error("UNBLOCKED client unblocked via CLIENT UNBLOCK".into())
                    }
                    _ => Frame::NullArray,
                }),
                _ = tx.closed() => return,
            };
            let Some(next) = blocking.disarm(id) else {
                // A push took the armed attempt: its reply decides.
                reply = tokio::select! {
                    r = armed_rx => r.unwrap_or_else(|_| shutting_down()),
                    _ = tx.closed() => return,
                };
                continue;
            };
            match event {
                Ended::TimedOut => {
                    blocking.metrics.timeouts.inc();
                    blocking.remove(id);
                    let _ = tx.send(Frame::NullArray);
                    return;
                }
                Ended::Unblocked(frame) => {
                    blocking.remove(id);
                    let _ = tx.send(frame);
                    return;
                }
                // Woken (or the routing changed, which may redirect it):
                // run the disarmed attempt now.
                Ended::No => {
                    reply = tokio::select! {
                        r = shared.executor.run(slot, next.task) => r,
                        _ = tx.closed() => return,
                    };
                }
            }
        }
    });
    rx
}

/// What ended a wait that no push answered.
enum Ended {
    /// Nothing: attempt again (woken, or the routing changed).
    No,
    /// The command, at its timeout (nil).
    TimedOut,
    /// The command, by CLIENT UNBLOCK, with this reply.
    Unblocked(Frame),
}

fn shutting_down() -> Frame {
    Frame::Error("ERR server is shutting down".into())
}

/// Redis's `getTimeoutFromObjectOrReply` in seconds: the timeout in
/// milliseconds, rounded up (`ceill`), 0 = forever (a float; negative is
/// refused, and so is anything whose milliseconds overflow a signed 64-bit
/// integer, as Redis's cast makes it negative).
pub fn parse_timeout(arg: &[u8]) -> Result<u64, Frame> {
    use crate::cmd::long_double::{self, LongDouble};
    let err = |m: &str| Frame::Error(format!("ERR {m}"));
    let Some(v) = long_double::parse(arg) else {
        return Err(err("timeout is not a float or out of range"));
    };
    // `(long long) ceill(ftval * 1000.0)`: the x87 product (rounded to a
    // 64-bit mantissa), rounded up (towards zero when negative: a tiny
    // negative timeout is 0, forever); out of range is LLONG_MIN on x86-64.
    let tval: i64 = match v {
        LongDouble::Finite { neg, m, e } => {
            let product = round_to_64_bits(u128::from(m) * 1000);
            let magnitude = if e >= 0 {
                (e < 64)
                    .then(|| product.checked_shl(e as u32))
                    .flatten()
                    .filter(|p| p >> e == product)
            } else {
                let shift = (-e) as u32;
                let whole = product.checked_shr(shift).unwrap_or(0);
                let exact = shift < 128 && whole << shift == product;
                Some(whole + u128::from(!neg && !exact && product != 0))
            };
            match magnitude.and_then(|m| i64::try_from(m).ok()) {
                Some(m) if neg => -m,
                Some(m) => m,
                None => i64::MIN,
            }
        }
        LongDouble::Inf { .. } | LongDouble::Nan => i64::MIN,
    };
    if tval < 0 {
        return Err(err("timeout is negative"));
    }
    // Redis 7.0 has no upper bound (7.2 added `timeout is out of range`).
    Ok(tval as u64)
}

/// `x` rounded (half to even) to its 64 most significant bits, as an x87
/// extended-precision result is.
fn round_to_64_bits(x: u128) -> u128 {
    let bits = 128 - x.leading_zeros();
    if bits <= 64 {
        return x;
    }
    let drop = bits - 64;
    let rest = x & ((1u128 << drop) - 1);
    let half = 1u128 << (drop - 1);
    let mut kept = x >> drop;
    if rest > half || (rest == half && kept & 1 == 1) {
        kept += 1;
    }
    kept << drop
}

pub use keyway_command::table::is_blocking;

#[cfg(test)]
#[path = "blocking_tests.rs"]
mod tests;
