//! Transactions: `MULTI`, `EXEC`, `DISCARD`, `WATCH`, `UNWATCH`, with Redis
//! 7.0's replies, for keys of one slot.
//!
//! Process:
//! 1. `MULTI` opens the connection's queue. Every later command (but `EXEC`,
//!    `DISCARD`, `MULTI`, `WATCH`, `QUIT`) is checked as Redis Cluster checks
//!    it at queue time: unknown command, wrong arity, keys of more than one
//!    slot (`-CROSSSLOT`), a slot the map gives to another node (`-MOVED`)
//!    are answered at once and *flag* the transaction, so its `EXEC` is
//!    `-EXECABORT Transaction discarded because of previous errors.`;
//!    anything else is answered `+QUEUED`. Argument errors that Redis only
//!    finds when it runs the command (`ERR syntax error`, ...) are replies
//!    inside `EXEC`'s array, as in Redis.
//! 2. `EXEC` checks that every queued data command (and the watched keys)
//!    are in one slot (`-CROSSSLOT` otherwise, as Redis Cluster checks the
//!    whole transaction at `EXEC`), then runs it as **one storage task** on
//!    the slot's executor thread ([`crate::node_cmd::submit_work`]):
//!    admission once (ownership, fence => parked, `-MOVED`), the watched
//!    keys' versions compared (a changed one => nil, nothing runs), every
//!    queued command executed against **one** [`Db`] (later commands see
//!    earlier ones' writes), and **one** [`Engine::apply`] batch. A
//!    migration's cutover is ordered with that task like with any command
//!    of the slot, so it sees the transaction wholly or redirects it; a
//!    replica receives the batch as one change-log record range.
//! 3. `WATCH` records each key's `Value.version` (the engine's seq of the
//!    write that produced the value; absent or expired = 0) in a task on the
//!    slot's thread, into a cell shared with the session; the `EXEC` task,
//!    queued later on the same thread, compares. A watch whose task did not
//!    run (rejected, held too long) counts as changed. A key absent at
//!    both ends counts as changed when the change log since the `WATCH`
//!    holds a `Put` of it (created and deleted again, as Redis counts it),
//!    as far as the log still reaches back (`watch_log_scan_records`). A
//!    `WATCH` that saw an absent key leases the log after its seq for
//!    `log_watch_hold_ms` ([`WatchLog`]), so the records are kept even on a
//!    node whose log nobody else reads (`log_gc`).
//!
//! Connection commands inside `MULTI` (`PING`, `ECHO`, `TIME`, `CLIENT`,
//! `CONFIG`, ...: [`LOCAL_IN_MULTI`]) are queued and answered in their place
//! in `EXEC`'s array (they touch no key, so running them as `EXEC` starts is
//! indistinguishable). Node-wide commands (`FLUSHALL`, `SCAN`, `DBSIZE`,
//! `INFO`, `CLUSTER`, `SHUTDOWN`, `KW.*`) cannot be part of one slot's
//! task: inside `MULTI` they are refused with
//! `ERR Command not allowed inside a transaction` and flag it.
//!
//! Decision beyond Redis: watched keys must share the transaction's slot (a
//! `WATCH` of a key in another slot than earlier watched keys is
//! `-CROSSSLOT`), since their versions are compared on that slot's thread.
//! `KW.AT <partition> <epoch> <command>` inside `MULTI` (the proxy's form)
//! queues the command with that epoch: the `EXEC` is then admitted only at
//! exactly that partition epoch.

use crate::cmd::table::{self, arity_error};
use crate::cmd::{self, Command};
use crate::db::Db;
use crate::metrics::OutcomeLabel;
use crate::node_cmd::{self, Reply, SlotWork};
use crate::server::Shared;
use crate::session::Session;
use bytes::Bytes;
use keyway_map::{Epoch, PartitionId, key_hash_slot};
use keyway_resp::Frame;
use keyway_storage::StorageError;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use std::sync::{Arc, Mutex};

/// Commands answered from the session and configuration: queued inside
/// `MULTI`, answered in their place in `EXEC`'s reply.
pub const LOCAL_IN_MULTI: &[&str] = &[
    "ping",
    "echo",
    "time",
    "command",
    "client",
    "config",
    "role",
    "select",
    "readonly",
    "readwrite",
    "asking",
    "slowlog",
    "latency",
    "unwatch",
    "lastsave",
];

pub use keyway_command::reply::EXECABORT;
const CROSSSLOT: &str = "CROSSSLOT Keys in request don't hash to the same slot";
const NOT_IN_TX: &str = "ERR Command not allowed inside a transaction";

/// A connection's transaction state (in [`Session`]).
#[derive(Debug, Default)]
pub struct TxState {
    /// `Some` between `MULTI` and `EXEC`/`DISCARD`.
    queue: Option<Queue>,
    /// The keys `WATCH`ed since the last `EXEC`/`DISCARD`/`UNWATCH`.
    watch: Option<Arc<Watch>>,
}

impl TxState {
    /// Whether the connection is between `MULTI` and `EXEC`/`DISCARD`.
    pub fn in_multi(&self) -> bool {
        self.queue.is_some()
    }

    /// Commands queued since `MULTI` (`None` outside it).
    pub fn queued(&self) -> Option<usize> {
        self.queue.as_ref().map(|q| q.items.len())
    }
}

#[derive(Debug, Default)]
struct Queue {
    items: Vec<Queued>,
    /// A queue-time error was answered: `EXEC` aborts.
    dirty: bool,
}

#[derive(Debug)]
enum Queued {
    Data {
        command: Command,
        expected: Option<(PartitionId, Epoch)>,
    },
    Local(Vec<Bytes>),
}

/// Watched keys of one slot and the versions their `WATCH` tasks recorded.
#[derive(Debug)]
pub struct Watch {
    slot: u16,
    /// `(key, recorded)`: `None` until the key's `WATCH` task ran.
    keys: Mutex<Vec<(Bytes, Option<Recorded>)>>,
}

/// What a `WATCH` task saw of one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Recorded {
    /// `Value.version`, 0 = absent or expired.
    version: u64,
    /// The engine's last seq then: a key absent then and at `EXEC` changed
    /// meanwhile iff the change log after it holds a `Put` of the key.
    seq: u64,
}

/// Transaction counters (`keyway_transactions_total{outcome}`), also in `/status`.
#[derive(Clone, Default)]
pub struct TxMetrics {
    pub outcomes: Family<OutcomeLabel, Counter>,
}

impl TxMetrics {
    pub fn register(metrics: &crate::metrics::Metrics) -> Self {
        let m = TxMetrics::default();
        metrics.register(
            "transactions",
            "MULTI/EXEC transactions by outcome: executed, watch_aborted (a watched key changed: nil), execabort (a queue-time error), crossslot, discarded",
            m.outcomes.clone(),
        );
        m
    }

    pub fn count(&self, outcome: &'static str) {
        self.outcomes.get_or_create(&OutcomeLabel { outcome }).inc();
    }

    /// `(outcome, count)` for `/status`.
    pub fn snapshot(&self) -> Vec<(String, u64)> {
        [
            "executed",
            "watch_aborted",
            "execabort",
            "crossslot",
            "discarded",
        ]
        .iter()
        .map(|o| {
            (
                (*o).to_string(),
                self.outcomes
                    .get_or_create(&OutcomeLabel { outcome: o })
                    .get(),
            )
        })
        .collect()
    }
}

/// Flags an open transaction (a command refused before it was queued, as
/// Redis's `flagTransaction`): its EXEC is `-EXECABORT`.
pub fn flag_dirty(session: &mut Session) {
    if let Some(q) = session.tx.queue.as_mut() {
        q.dirty = true;
    }
}

fn err(msg: impl Into<String>) -> Reply {
    Reply::Frame(Frame::Error(msg.into()))
}

/// The transaction commands, and every command while in `MULTI`; `None`
/// for anything else (dispatched as usual).
pub async fn intercept(
    shared: &Arc<Shared>,
    session: &mut Session,
    name: &str,
    args: &[Bytes],
) -> Option<Reply> {
    let in_multi = session.tx.in_multi();
    let arity = |n: &str, ok: bool, session: &mut Session| -> Option<Reply> {
        if ok {
            return None;
        }
        if let Some(q) = session.tx.queue.as_mut() {
            q.dirty = true;
        }
        Some(arity_error(n).into())
    };
    match name {
        "MULTI" => Some(arity("multi", args.len() == 1, session).unwrap_or_else(|| {
            if in_multi {
                return err("ERR MULTI calls can not be nested");
            }
            session.tx.queue = Some(Queue::default());
            Frame::ok().into()
        })),
        "DISCARD" => Some(
            arity("discard", args.len() == 1, session).unwrap_or_else(|| {
                if !in_multi {
                    return err("ERR DISCARD without MULTI");
                }
                session.tx = TxState::default();
                shared.tx_metrics.count("discarded");
                Frame::ok().into()
            }),
        ),
        "EXEC" => {
            if args.len() != 1 {
                // Redis rejects EXEC itself by aborting the transaction.
                session.tx = TxState::default();
                shared.tx_metrics.count("execabort");
                return Some(err(
                    "EXECABORT Transaction discarded because of: wrong number of arguments for 'exec' command",
                ));
            }
            if !in_multi {
                return Some(err("ERR EXEC without MULTI"));
            }
            Some(exec(shared, session).await)
        }
        "WATCH" => {
            if let Some(reply) = arity("watch", args.len() >= 2, session) {
                return Some(reply);
            }
            if in_multi {
                return Some(err("ERR WATCH inside MULTI is not allowed"));
            }
            Some(watch(shared, session, &args[1..]).await)
        }
        "UNWATCH" if !in_multi => Some(arity("unwatch", args.len() == 1, session).unwrap_or_else(
            || {
                session.tx.watch = None;
                Frame::ok().into()
            },
        )),
        "QUIT" => None,
        _ if in_multi => Some(queue(shared, session, name, args)),
        _ => None,
    }
}

/// Queue-time checks of one command inside `MULTI` (see the module doc).
fn queue(shared: &Shared, session: &mut Session, name: &str, args: &[Bytes]) -> Reply {
    let readonly = session.readonly;
    let q = session
        .tx
        .queue
        .as_mut()
        .expect("queue() only inside MULTI");
    let (inner, expected) = match name {
        "KW.AT" => match parse_kw_at(args) {
            Ok((inner, expected)) => (inner, Some(expected)),
            Err(frame) => {
                q.dirty = true;
                return frame.into();
            }
        },
        _ => (args, None),
    };
    match cmd::parse(inner) {
        Some(Ok(command)) => {
            let keys = command.keys();
            let Some(first) = keys.first() else {
                // A keyless argument error (SINTERCARD 0 ...): its error is
                // its reply inside EXEC, as in Redis.
                q.items.push(Queued::Data { command, expected });
                return Frame::Simple("QUEUED".into()).into();
            };
            let slot = key_hash_slot(first);
            if keys.iter().any(|k| key_hash_slot(k) != slot) {
                q.dirty = true;
                shared.metrics.rejected("crossslot");
                return err(CROSSSLOT);
            }
            // Redis Cluster redirects a queued command of a slot it does not
            // serve (and flags the transaction); the EXEC task checks again.
            if expected.is_none()
                && !readonly
                && let Some(moved) = queue_time_moved(shared, slot)
            {
                q.dirty = true;
                return moved.into();
            }
            q.items.push(Queued::Data { command, expected });
            Frame::Simple("QUEUED".into()).into()
        }
        Some(Err(frame)) => {
            q.dirty = true;
            frame.into()
        }
        None => {
            let lower = String::from_utf8_lossy(&inner[0]).to_ascii_lowercase();
            match table::lookup(&inner[0]) {
                Some(spec) if !spec.arity_ok(inner.len()) => {
                    q.dirty = true;
                    arity_error(spec.name).into()
                }
                Some(spec) if LOCAL_IN_MULTI.contains(&spec.name) => {
                    q.items.push(Queued::Local(inner.to_vec()));
                    Frame::Simple("QUEUED".into()).into()
                }
                Some(_) => {
                    q.dirty = true;
                    err(NOT_IN_TX)
                }
                None if crate::kw::is_kw_command(&lower.to_ascii_uppercase()) => {
                    q.dirty = true;
                    err(NOT_IN_TX)
                }
                None => {
                    q.dirty = true;
                    node_cmd::unknown_command(inner).into()
                }
            }
        }
    }
}

fn parse_kw_at(args: &[Bytes]) -> Result<(&[Bytes], (PartitionId, Epoch)), Frame> {
    if args.len() < 4 {
        return Err(arity_error("kw.at"));
    }
    let parse = |b: &Bytes| {
        std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
    };
    match (parse(&args[1]), parse(&args[2])) {
        (Some(p), Some(e)) => Ok((&args[3..], (PartitionId(p), Epoch(e)))),
        _ => Err(Frame::Error(
            "ERR partition and epoch must be unsigned integers".into(),
        )),
    }
}

/// `-MOVED` when the node's map gives `slot` to another node.
fn queue_time_moved(shared: &Shared, slot: u16) -> Option<Frame> {
    let map = shared.routing.map();
    let p = map.locate_slot(shared.keyspace.id, slot)?;
    (p.owner != shared.me).then(|| {
        shared.metrics.rejected("moved");
        shared
            .routing
            .read()
            .redirect_to_owner(shared.keyspace.id, slot)
            .to_frame()
    })
}

/// `WATCH key [key ...]`: the versions are recorded by a task on the slot's
/// thread; its `+OK` comes from that task (or its rejection).
async fn watch(shared: &Arc<Shared>, session: &mut Session, keys: &[Bytes]) -> Reply {
    let slot = key_hash_slot(&keys[0]);
    if keys.iter().any(|k| key_hash_slot(k) != slot)
        || session.tx.watch.as_ref().is_some_and(|w| w.slot != slot)
    {
        shared.metrics.rejected("crossslot");
        return err(CROSSSLOT);
    }
    let watch = session
        .tx
        .watch
        .get_or_insert_with(|| {
            Arc::new(Watch {
                slot,
                keys: Mutex::new(Vec::new()),
            })
        })
        .clone();
    let fresh: Vec<usize> = {
        let mut watched = watch.keys.lock().unwrap_or_else(|e| e.into_inner());
        let mut fresh = Vec::new();
        for key in keys {
            // Watching a watched key again keeps its first version, as in Redis.
            if !watched.iter().any(|(k, _)| k == key) {
                fresh.push(watched.len());
                watched.push((key.clone(), None));
            }
        }
        fresh
    };
    if fresh.is_empty() {
        return Frame::ok().into();
    }
    let work = WatchWork {
        watch,
        indices: fresh,
        log: WatchLog::of(shared),
    };
    node_cmd::submit_work(shared, work, slot, None, session).await
}

/// `EXEC`: see the module doc.
async fn exec(shared: &Arc<Shared>, session: &mut Session) -> Reply {
    let queue = session.tx.queue.take().expect("exec() only inside MULTI");
    let watch = session.tx.watch.take();
    // As Redis Cluster, the slot check of the whole transaction comes first.
    let mut slot = watch.as_ref().map(|w| w.slot);
    let mut expected = None;
    let mut crossslot = false;
    for queued in &queue.items {
        if let Queued::Data {
            command,
            expected: e,
        } = queued
        {
            if let Some(first) = command.keys().first() {
                let s = key_hash_slot(first);
                crossslot |= slot.is_some_and(|x| x != s);
                slot = Some(s);
            }
            if e.is_some() {
                crossslot |= expected.is_some_and(|x| Some(x) != *e);
                expected = *e;
            }
        }
    }
    if crossslot {
        shared.tx_metrics.count("crossslot");
        shared.metrics.rejected("crossslot");
        return err(CROSSSLOT);
    }
    if queue.dirty {
        shared.tx_metrics.count("execabort");
        return err(EXECABORT);
    }
    let mut items = Vec::with_capacity(queue.items.len());
    for queued in queue.items {
        items.push(match queued {
            Queued::Local(args) => Item::Ready(
                match Box::pin(node_cmd::dispatch(shared, session, args)).await {
                    Reply::Frame(frame) => frame,
                    Reply::Waiting(rx) => rx
                        .await
                        .unwrap_or_else(|_| Frame::Error("ERR server is shutting down".into())),
                },
            ),
            Queued::Data { command, .. } => Item::Data(command),
        });
    }
    let work = TxWork {
        items,
        watch,
        metrics: shared.tx_metrics.clone(),
        max_log_records: shared.config.watch_log_scan_records,
    };
    match slot {
        Some(slot) => node_cmd::submit_work(shared, work, slot, expected, session).await,
        None => keyless(shared, work).await,
    }
}

/// A transaction without a key (connection commands, keyless argument
/// errors): nothing to admit; run on a storage thread all the same (a
/// command's `execute` may read the engine), its overlay dropped (a command
/// without keys writes none).
async fn keyless(shared: &Arc<Shared>, work: TxWork) -> Reply {
    if work.items.iter().all(|i| matches!(i, Item::Ready(_))) {
        shared.tx_metrics.count("executed");
        return Frame::Array(
            work.items
                .into_iter()
                .filter_map(|i| match i {
                    Item::Ready(f) => Some(f),
                    Item::Data(_) => None,
                })
                .collect(),
        )
        .into();
    }
    let shared2 = shared.clone();
    let task: crate::executor::Task = Box::new(move |engine| {
        let limits = crate::db::DbLimits {
            max_value_bytes: shared2.config.max_value_bytes,
            stream_node_max_entries: shared2.server.stream_node_max_entries(),
        };
        let mut db = Db::new(engine, &shared2.keyspace, shared2.clock.unix_ms(), &limits);
        match work.execute(&mut db) {
            Ok(frame) => {
                debug_assert!(db.into_mutations().is_empty(), "a keyless command wrote");
                crate::executor::TaskOutput::reply(frame, false)
            }
            Err(e) => node_cmd::storage_failure(e),
        }
    });
    match shared.executor.submit_node_wide(task).await {
        Ok(rx) => Reply::Waiting(rx),
        Err(frame) => frame.into(),
    }
}

enum Item {
    Ready(Frame),
    Data(Command),
}

/// The `EXEC` storage task's work: the watch check, then every command on
/// one overlay.
struct TxWork {
    items: Vec<Item>,
    watch: Option<Arc<Watch>>,
    metrics: TxMetrics,
    /// `watch_log_scan_records`.
    max_log_records: usize,
}

/// Whether the change log after `seq` holds a `Put` of `key` (a key absent
/// at `WATCH` and at `EXEC` that was created meanwhile, and deleted again:
/// Redis counts that as a change). Deletes alone are not: a key that was
/// expired at `WATCH` and then removed did not change. A log already
/// truncated past `seq`, or longer than `max_records`, cannot tell: the key
/// counts as unchanged, which still leaves the transaction serializable (it
/// sees exactly the state `WATCH` saw).
fn created_since(db: &Db<'_>, key: &[u8], seq: u64, max_records: usize) -> bool {
    let storage_key = db.keyspace().storage_key(key);
    let engine = db.engine();
    if engine.last_seq().saturating_sub(seq) > max_records as u64 {
        return false;
    }
    let mut after = seq;
    let mut read = 0;
    while read <= max_records {
        let records = match engine.changes_since(after, 1024) {
            Ok(r) => r,
            Err(_) => return false,
        };
        let Some(last) = records.last() else {
            return false;
        };
        after = last.seq;
        read += records.len();
        if records.iter().any(|r| {
            matches!(&r.mutation, keyway_storage::Mutation::Put { key: k, .. } if *k == storage_key)
        }) {
            return true;
        }
    }
    false
}

impl SlotWork for TxWork {
    fn is_write(&self) -> bool {
        self.items
            .iter()
            .any(|i| matches!(i, Item::Data(c) if c.is_write()))
    }

    fn owner_only(&self) -> bool {
        true
    }

    fn first_key(&self) -> Option<&[u8]> {
        self.items.iter().find_map(|i| match i {
            Item::Data(c) => c.keys().first().copied(),
            Item::Ready(_) => None,
        })
    }

    fn execute(&self, db: &mut Db<'_>) -> Result<Frame, StorageError> {
        if let Some(watch) = &self.watch {
            let watched = watch.keys.lock().unwrap_or_else(|e| e.into_inner());
            for (key, recorded) in watched.iter() {
                let now = db.get(key)?.map_or(0, |v| v.version);
                let changed = match recorded {
                    None => true,
                    Some(r) if r.version != now => true,
                    Some(r) if now == 0 => created_since(db, key, r.seq, self.max_log_records),
                    Some(_) => false,
                };
                if changed {
                    self.metrics.count("watch_aborted");
                    return Ok(Frame::NullArray);
                }
            }
        }
        let mut replies = Vec::with_capacity(self.items.len());
        for item in &self.items {
            replies.push(match item {
                Item::Ready(frame) => frame.clone(),
                Item::Data(command) => command.execute(db)?,
            });
        }
        self.metrics.count("executed");
        Ok(Frame::Array(replies))
    }

    /// Redis prefixes a refusal of `EXEC` by the server's state with
    /// `EXECABORT`; redirects stay plain.
    fn refused(&self, frame: Frame) -> Frame {
        match frame {
            Frame::Error(e) if e.starts_with("NOREPLICAS") => {
                Frame::Error(format!("EXECABORT Transaction discarded because of: {e}"))
            }
            other => other,
        }
    }
}

/// A `WATCH` storage task's work: record the versions of `indices`.
struct WatchWork {
    watch: Arc<Watch>,
    indices: Vec<usize>,
    log: WatchLog,
}

/// What a `WATCH` task does with the change log: arm it before it reads
/// the seq, lease the records after it if a key was absent.
#[derive(Clone)]
struct WatchLog {
    holds: Arc<crate::log_gc::LogHolds>,
    ttl: std::time::Duration,
}

impl WatchLog {
    fn of(shared: &Shared) -> Self {
        WatchLog {
            holds: shared.migrations.holds().clone(),
            ttl: std::time::Duration::from_millis(shared.config.log_watch_hold_ms),
        }
    }

    /// The seq to record: every record after it is kept (for a while).
    fn arm(&self, db: &Db<'_>) -> u64 {
        self.holds.arm();
        db.engine().last_seq()
    }

    /// Keeps the records after `seq` when a key was absent.
    fn lease_if(&self, any_absent: bool, seq: u64) {
        if any_absent {
            self.holds.lease("watch", seq + 1, self.ttl);
        }
    }
}

impl SlotWork for WatchWork {
    fn is_write(&self) -> bool {
        false
    }

    fn owner_only(&self) -> bool {
        true
    }

    fn first_key(&self) -> Option<&[u8]> {
        None
    }

    fn execute(&self, db: &mut Db<'_>) -> Result<Frame, StorageError> {
        let seq = self.log.arm(db);
        let mut watched = self.watch.keys.lock().unwrap_or_else(|e| e.into_inner());
        let mut any_absent = false;
        for &i in &self.indices {
            let (key, recorded) = &mut watched[i];
            let version = db.get(key)?.map_or(0, |v| v.version);
            any_absent |= version == 0;
            *recorded = Some(Recorded { version, seq });
        }
        self.log.lease_if(any_absent, seq);
        Ok(Frame::ok())
    }
}

/// The proxy's stateless forms (`keyway proxy` keeps the client's queue and
/// watched versions itself and sends each as one request, see
/// `keyway_proxy::transaction`), both admitted only at exactly partition
/// epoch `expected`:
/// - `KW.AT <p> <e> WATCH key [key ...]`: each key's `[version, seq]` as
///   a `WATCH` task records them (bulk strings);
/// - `KW.AT <p> <e> EXEC <n> [key version seq]*n [<argc> arg*argc]*`: the
///   commands run as one transaction (one storage task, one batch), nil if
///   a watched key changed since its versions were read; `-EXECABORT` if a
///   command does not parse (the proxy checks them at queue time).
pub async fn at(shared: &Arc<Shared>, args: &[Bytes], expected: (PartitionId, Epoch)) -> Reply {
    let plain = Session::new(0, false, String::new());
    let is_watch = args[0].eq_ignore_ascii_case(b"WATCH");
    if is_watch {
        let keys = &args[1..];
        let Some(first) = keys.first() else {
            return arity_error("watch").into();
        };
        let slot = key_hash_slot(first);
        if keys.iter().any(|k| key_hash_slot(k) != slot) {
            return err(CROSSSLOT);
        }
        let work = VersionsWork {
            keys: keys.to_vec(),
            log: WatchLog::of(shared),
        };
        return node_cmd::submit_work(shared, work, slot, Some(expected), &plain).await;
    }
    let (watched, commands) = match parse_exec_at(&args[1..]) {
        Ok(parsed) => parsed,
        Err(frame) => return frame.into(),
    };
    let mut slot = watched.first().map(|(k, _)| key_hash_slot(k));
    let mut items = Vec::with_capacity(commands.len());
    for command in commands {
        match cmd::parse(&command) {
            Some(Ok(c)) => {
                for k in c.keys() {
                    let s = key_hash_slot(k);
                    if slot.is_some_and(|x| x != s) {
                        return err(CROSSSLOT);
                    }
                    slot = Some(s);
                }
                items.push(Item::Data(c));
            }
            _ => {
                shared.tx_metrics.count("execabort");
                return err(EXECABORT);
            }
        }
    }
    let Some(slot) = slot else {
        shared.tx_metrics.count("executed");
        return Frame::Array(Vec::new()).into();
    };
    let watch = (!watched.is_empty()).then(|| {
        Arc::new(Watch {
            slot,
            keys: Mutex::new(watched.into_iter().map(|(k, r)| (k, Some(r))).collect()),
        })
    });
    let work = TxWork {
        items,
        watch,
        metrics: shared.tx_metrics.clone(),
        max_log_records: shared.config.watch_log_scan_records,
    };
    node_cmd::submit_work(shared, work, slot, Some(expected), &plain).await
}

type ParsedExec = (Vec<(Bytes, Recorded)>, Vec<Vec<Bytes>>);

fn parse_exec_at(args: &[Bytes]) -> Result<ParsedExec, Frame> {
    let bad = || Frame::Error("ERR syntax error in KW.AT ... EXEC".into());
    let num = |b: &Bytes| {
        std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or_else(bad)
    };
    let n = num(args.first().ok_or_else(bad)?)? as usize;
    let mut rest = &args[1..];
    if rest.len() < n.saturating_mul(3) {
        return Err(bad());
    }
    let mut watched = Vec::with_capacity(n);
    for w in rest[..3 * n].chunks(3) {
        watched.push((
            w[0].clone(),
            Recorded {
                version: num(&w[1])?,
                seq: num(&w[2])?,
            },
        ));
    }
    rest = &rest[3 * n..];
    let mut commands = Vec::new();
    while let Some(argc) = rest.first() {
        let argc = num(argc)? as usize;
        if argc == 0 || rest.len() < 1 + argc {
            return Err(bad());
        }
        commands.push(rest[1..1 + argc].to_vec());
        rest = &rest[1 + argc..];
    }
    Ok((watched, commands))
}

/// `KW.AT <p> <e> WATCH ...`'s work: the keys' versions, read on the slot's thread.
struct VersionsWork {
    keys: Vec<Bytes>,
    log: WatchLog,
}

impl SlotWork for VersionsWork {
    fn is_write(&self) -> bool {
        false
    }

    fn owner_only(&self) -> bool {
        true
    }

    fn first_key(&self) -> Option<&[u8]> {
        None
    }

    fn execute(&self, db: &mut Db<'_>) -> Result<Frame, StorageError> {
        let seq = self.log.arm(db);
        let mut out = Vec::with_capacity(self.keys.len());
        let mut any_absent = false;
        for key in &self.keys {
            let version = db.get(key)?.map_or(0, |v| v.version);
            any_absent |= version == 0;
            out.push(Frame::Array(vec![
                Frame::bulk(version.to_string()),
                Frame::bulk(seq.to_string()),
            ]));
        }
        self.log.lease_if(any_absent, seq);
        Ok(Frame::Array(out))
    }
}
