//! `MULTI`/`EXEC`/`DISCARD`/`WATCH`/`UNWATCH` through the proxy, for keys
//! of one slot.
//!
//! The proxy's node connections are shared by every client, so a client's
//! transaction cannot be sent as `MULTI ... EXEC` on one of them. Instead
//! the proxy keeps the queue itself and sends the whole transaction as
//! **one** request to the owner of its slot, which runs it as one storage
//! task with one apply batch (`keyway_node::multi::at`):
//!
//! 1. `MULTI` opens the queue; each later command is checked as a node
//!    checks it at queue time (unknown command, wrong arity, keys of more
//!    than one slot: answered at once, the transaction is flagged and its
//!    `EXEC` is `-EXECABORT`); data commands are answered `+QUEUED`, `PING`
//!    and `ECHO` too (answered in their place in `EXEC`'s array); anything
//!    else is `ERR Command not allowed inside a transaction` (and flags).
//! 2. `WATCH` (outside `MULTI`) reads the keys' versions from the owner
//!    (`KW.AT <p> <e> WATCH keys`) and remembers them with the partition
//!    epoch they were read at.
//! 3. `EXEC` sends `KW.AT <p> <e> EXEC <watched versions> <commands>`. With
//!    watched keys it goes at exactly their epoch, once: a rejection (the
//!    partition moved since the `WATCH`) answers nil, as a watched key that
//!    changed (redis-py says "Slot rebalancing occurred while watching
//!    keys" in that case too). Without, it follows rejections like any
//!    request (a rejected transaction did not run). A lost reply is an
//!    unknown outcome, never retried.

use crate::command::{Barrier, Forwarded, Op, Plan};
use crate::forward::{self, Target};
use crate::server::Core;
use bytes::Bytes;
use keyway_command::reply::EXECABORT;
use keyway_command::reply::unknown_command;
use keyway_command::table::{self, arity_error};
use keyway_map::{Epoch, PartitionId, key_hash_slot};
use keyway_resp::Frame;
use std::sync::{Arc, Mutex};
use tokio::time::Instant;

const CROSSSLOT: &str = "CROSSSLOT Keys in request don't hash to the same slot";

/// A client connection's transaction state.
#[derive(Default)]
pub struct ProxyTx {
    queue: Option<Queue>,
    watch: Option<Arc<Watched>>,
}

#[derive(Default)]
struct Queue {
    items: Vec<Item>,
    dirty: bool,
}

/// One queued command: a data command for the node, or a reply the proxy
/// gives itself (`PING`, `ECHO`).
#[derive(Clone)]
pub enum Item {
    Data { args: Vec<Bytes>, slot: u16 },
    Local(Frame),
}

/// The keys `WATCH`ed, and what each `WATCH` read.
pub struct Watched {
    slot: u16,
    keys: Mutex<Vec<Bytes>>,
    /// One entry per `WATCH` request, filled when it completes:
    /// `(partition, epoch, [(key, version, seq)])`, `None` if it failed.
    reads: Mutex<Vec<Option<WatchRead>>>,
}

type WatchRead = (PartitionId, Epoch, Vec<(Bytes, u64, u64)>);

/// A forwarded transaction request.
pub enum TxOp {
    Watch {
        slot: u16,
        keys: Vec<Bytes>,
        watched: Arc<Watched>,
    },
    Exec {
        slot: u16,
        items: Vec<Item>,
        watched: Option<Arc<Watched>>,
    },
}

fn reply(frame: Frame) -> Option<Plan> {
    Some(Plan::Reply(frame))
}

fn err(msg: &str) -> Option<Plan> {
    reply(Frame::Error(msg.into()))
}

fn forward(op: TxOp, args: Vec<Bytes>, keys: Vec<Bytes>, deadline: Instant) -> Option<Plan> {
    Some(Plan::Forward(Forwarded {
        op: Op::Tx(Box::new(op)),
        args,
        barrier: Barrier::Keys(keys),
        deadline,
    }))
}

impl ProxyTx {
    /// Whether the connection is between `MULTI` and `EXEC`/`DISCARD`.
    pub fn in_multi(&self) -> bool {
        self.queue.is_some()
    }

    /// Flags an open transaction (a command refused before it was queued):
    /// its `EXEC` is `-EXECABORT`.
    pub fn flag_dirty(&mut self) {
        if let Some(q) = self.queue.as_mut() {
            q.dirty = true;
        }
    }
}

/// The transaction commands, and every command inside `MULTI`; `None` for
/// anything else (planned as usual).
pub fn intercept(tx: &mut ProxyTx, name: &str, args: &[Bytes], deadline: Instant) -> Option<Plan> {
    let in_multi = tx.queue.is_some();
    let flag_arity = |tx: &mut ProxyTx, n: &str| {
        if let Some(q) = tx.queue.as_mut() {
            q.dirty = true;
        }
        reply(arity_error(n))
    };
    match name {
        "MULTI" if args.len() != 1 => flag_arity(tx, "multi"),
        "MULTI" if in_multi => err("ERR MULTI calls can not be nested"),
        "MULTI" => {
            tx.queue = Some(Queue::default());
            reply(Frame::ok())
        }
        "DISCARD" if args.len() != 1 => flag_arity(tx, "discard"),
        "DISCARD" if !in_multi => err("ERR DISCARD without MULTI"),
        "DISCARD" => {
            *tx = ProxyTx::default();
            reply(Frame::ok())
        }
        "EXEC" if args.len() != 1 => {
            *tx = ProxyTx::default();
            err(
                "EXECABORT Transaction discarded because of: wrong number of arguments for 'exec' command",
            )
        }
        "EXEC" if !in_multi => err("ERR EXEC without MULTI"),
        "EXEC" => exec(tx, deadline),
        "WATCH" if args.len() < 2 => flag_arity(tx, "watch"),
        "WATCH" if in_multi => err("ERR WATCH inside MULTI is not allowed"),
        "WATCH" => {
            let keys = args[1..].to_vec();
            let slot = key_hash_slot(&keys[0]);
            if keys.iter().any(|k| key_hash_slot(k) != slot)
                || tx.watch.as_ref().is_some_and(|w| w.slot != slot)
            {
                return err(CROSSSLOT);
            }
            let watched = tx
                .watch
                .get_or_insert_with(|| {
                    Arc::new(Watched {
                        slot,
                        keys: Mutex::new(Vec::new()),
                        reads: Mutex::new(Vec::new()),
                    })
                })
                .clone();
            watched
                .keys
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend(keys.iter().cloned());
            let op = TxOp::Watch {
                slot,
                keys: keys.clone(),
                watched,
            };
            forward(op, args.to_vec(), keys, deadline)
        }
        "UNWATCH" if args.len() != 1 => flag_arity(tx, "unwatch"),
        "UNWATCH" if !in_multi => {
            tx.watch = None;
            reply(Frame::ok())
        }
        "QUIT" => None,
        _ if in_multi => Some(queue(tx, name, args)),
        _ => None,
    }
}

fn queue(tx: &mut ProxyTx, name: &str, args: &[Bytes]) -> Plan {
    let q = tx.queue.as_mut().expect("queue() only inside MULTI");
    let mut refuse = |frame: Frame| {
        q.dirty = true;
        Plan::Reply(frame)
    };
    let Some(spec) = table::lookup(&args[0]) else {
        return refuse(unknown_command(args));
    };
    if !spec.arity_ok(args.len()) {
        return refuse(arity_error(spec.name));
    }
    let local = match name {
        "PING" if args.len() == 1 => Some(Frame::Simple("PONG".into())),
        "PING" | "ECHO" => Some(Frame::Bulk(args[1].clone())),
        "UNWATCH" => Some(Frame::ok()),
        _ => None,
    };
    if let Some(frame) = local {
        q.items.push(Item::Local(frame));
        return Plan::Reply(Frame::Simple("QUEUED".into()));
    }
    if spec.family.is_none() {
        return refuse(Frame::Error(
            "ERR Command not allowed inside a transaction".into(),
        ));
    }
    let keys: Vec<&Bytes> = spec
        .key_positions_in(args)
        .into_iter()
        .filter_map(|i| args.get(i))
        .collect();
    let Some(first) = keys.first() else {
        // A keyless argument error: its error is its reply inside EXEC.
        let Some(error) = crate::command::keyless_error(args) else {
            return refuse(unknown_command(args));
        };
        q.items.push(Item::Local(error));
        return Plan::Reply(Frame::Simple("QUEUED".into()));
    };
    let slot = key_hash_slot(first);
    if keys.iter().any(|k| key_hash_slot(k) != slot) {
        return refuse(Frame::Error(CROSSSLOT.into()));
    }
    q.items.push(Item::Data {
        args: args.to_vec(),
        slot,
    });
    Plan::Reply(Frame::Simple("QUEUED".into()))
}

fn exec(tx: &mut ProxyTx, deadline: Instant) -> Option<Plan> {
    let queue = tx.queue.take().expect("exec() only inside MULTI");
    let watched = tx.watch.take();
    let mut slot = watched.as_ref().map(|w| w.slot);
    let mut keys: Vec<Bytes> = watched
        .as_ref()
        .map(|w| w.keys.lock().unwrap_or_else(|e| e.into_inner()).clone())
        .unwrap_or_default();
    for item in &queue.items {
        if let Item::Data { args, slot: s } = item {
            if slot.is_some_and(|x| x != *s) {
                return err(CROSSSLOT);
            }
            slot = Some(*s);
            if let Some(spec) = table::lookup(&args[0]) {
                keys.extend(
                    spec.key_positions_in(args)
                        .into_iter()
                        .filter_map(|i| args.get(i).cloned()),
                );
            }
        }
    }
    if queue.dirty {
        return err(EXECABORT);
    }
    let Some(slot) = slot else {
        // Only PING/ECHO: nothing for a node to run.
        return reply(Frame::Array(
            queue
                .items
                .into_iter()
                .filter_map(|i| match i {
                    Item::Local(f) => Some(f),
                    Item::Data { .. } => None,
                })
                .collect(),
        ));
    };
    let op = TxOp::Exec {
        slot,
        items: queue.items,
        watched,
    };
    forward(op, vec![Bytes::from_static(b"EXEC")], keys, deadline)
}

/// Runs a forwarded transaction request.
pub async fn run(core: &Core, op: TxOp, deadline: Instant) -> Frame {
    match op {
        TxOp::Watch {
            slot,
            keys,
            watched,
        } => {
            let mut args = vec![Bytes::from_static(b"WATCH")];
            args.extend(keys.iter().cloned());
            let (read, frame) = match send_tracking_epoch(core, slot, &args, deadline).await {
                Ok((pid, epoch, Frame::Array(pairs))) if pairs.len() == keys.len() => {
                    let entries: Option<Vec<(Bytes, u64, u64)>> = keys
                        .iter()
                        .zip(&pairs)
                        .map(|(k, p)| match p {
                            Frame::Array(vs) if vs.len() == 2 => {
                                Some((k.clone(), number(&vs[0])?, number(&vs[1])?))
                            }
                            _ => None,
                        })
                        .collect();
                    match entries {
                        Some(e) => (Some((pid, epoch, e)), Frame::ok()),
                        None => (
                            None,
                            Frame::Error("ERR keyway proxy: bad WATCH reply".into()),
                        ),
                    }
                }
                Ok((_, _, Frame::Error(e))) | Err(Frame::Error(e)) => (None, Frame::Error(e)),
                Ok((_, _, other)) | Err(other) => (
                    None,
                    Frame::Error(format!("ERR keyway proxy: bad WATCH reply {other:?}")),
                ),
            };
            watched
                .reads
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(read);
            frame
        }
        TxOp::Exec {
            slot,
            items,
            watched,
        } => exec_remote(core, slot, items, watched, deadline).await,
    }
}

fn number(f: &Frame) -> Option<u64> {
    match f {
        Frame::Bulk(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Frame::Integer(n) => u64::try_from(*n).ok(),
        _ => None,
    }
}

async fn exec_remote(
    core: &Core,
    slot: u16,
    items: Vec<Item>,
    watched: Option<Arc<Watched>>,
    deadline: Instant,
) -> Frame {
    let mut args = vec![Bytes::from_static(b"EXEC")];
    let mut pinned: Option<(PartitionId, Epoch)> = None;
    match &watched {
        None => args.push(Bytes::from_static(b"0")),
        Some(w) => {
            let reads = w.reads.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let mut entries = Vec::new();
            for read in reads {
                // A failed WATCH, or WATCHes at different epochs: the
                // versions cannot be compared; as a changed key.
                let Some((pid, epoch, e)) = read else {
                    return Frame::NullArray;
                };
                if pinned.is_some_and(|p| p != (pid, epoch)) {
                    return Frame::NullArray;
                }
                pinned = Some((pid, epoch));
                entries.extend(e);
            }
            args.push(Bytes::from(entries.len().to_string()));
            for (k, v, s) in entries {
                args.push(k);
                args.push(Bytes::from(v.to_string()));
                args.push(Bytes::from(s.to_string()));
            }
        }
    }
    let mut locals = Vec::new();
    for (i, item) in items.iter().enumerate() {
        match item {
            Item::Data { args: a, .. } => {
                args.push(Bytes::from(a.len().to_string()));
                args.extend(a.iter().cloned());
            }
            Item::Local(f) => locals.push((i, f.clone())),
        }
    }
    let reply = match pinned {
        // Watched: exactly at the WATCH's epoch, once.
        Some((pid, epoch)) => {
            let Some(route) = core.router.locate_slot(slot) else {
                return Frame::NullArray;
            };
            let mut request = vec![
                Bytes::from_static(b"KW.AT"),
                Bytes::from(pid.0.to_string()),
                Bytes::from(epoch.0.to_string()),
            ];
            request.extend(args);
            let call = core.upstreams.call(&route.addr, request);
            match tokio::time::timeout_at(deadline, call).await {
                Ok(Ok(Frame::Error(e))) if is_rejection(&e) => Frame::NullArray,
                Ok(Ok(frame)) => frame,
                Ok(Err(crate::upstream::UpstreamError::NotSent(_))) => Frame::NullArray,
                Ok(Err(e)) => Frame::Error(format!(
                    "ERR keyway proxy: {e}; EXEC may or may not have been applied, and is not retried because running it twice is not safe"
                )),
                Err(_) => Frame::Error(
                    "ERR keyway proxy: no reply in time; EXEC may or may not have been applied, and is not retried because running it twice is not safe".into(),
                ),
            }
        }
        None => forward::send(core, &Target::Slot(slot), &args, false, deadline).await,
    };
    let data_args: Vec<&Vec<Bytes>> = items
        .iter()
        .filter_map(|i| match i {
            Item::Data { args, .. } => Some(args),
            Item::Local(_) => None,
        })
        .collect();
    match reply {
        Frame::Array(replies) => {
            let mut replies: Vec<Frame> = if replies.len() == data_args.len() {
                replies
                    .into_iter()
                    .zip(&data_args)
                    .map(|(r, a)| crate::command::restore_pairs(a, r))
                    .collect()
            } else {
                replies
            };
            for (i, f) in locals {
                replies.insert(i.min(replies.len()), f);
            }
            Frame::Array(replies)
        }
        // RESP3's one null (`_`, as the node connection speaks) is EXEC's
        // null array (a watched key changed): `*-1` to a RESP2 client.
        Frame::Null => Frame::NullArray,
        other => other,
    }
}

/// An error that says the request did not run (a redirect or a refusal
/// before admission).
fn is_rejection(e: &str) -> bool {
    let code = e.split(' ').next().unwrap_or("");
    matches!(
        code,
        "KWMOVED" | "KWREADS" | "MOVED" | "ASK" | "CLUSTERDOWN" | "TRYAGAIN"
    )
}

/// Sends `args` as `KW.AT <p> <e> args` to the slot's owner, following
/// rejections as [`forward::send`] does, and says at which epoch it ran.
async fn send_tracking_epoch(
    core: &Core,
    slot: u16,
    args: &[Bytes],
    deadline: Instant,
) -> Result<(PartitionId, Epoch, Frame), Frame> {
    let mut changes = core.router.subscribe();
    let mut backoff = forward::FIRST_BACKOFF;
    let mut last = Frame::Error("ERR keyway proxy: no route for the slot".into());
    loop {
        changes.borrow_and_update();
        if let Some(route) = core.router.locate_slot(slot) {
            let mut request = vec![
                Bytes::from_static(b"KW.AT"),
                Bytes::from(route.partition.0.to_string()),
                Bytes::from(route.epoch.0.to_string()),
            ];
            request.extend(args.iter().cloned());
            let call = core.upstreams.call(&route.addr, request);
            match tokio::time::timeout_at(deadline, call).await {
                Err(_) => return Err(Frame::Error("ERR keyway proxy: no reply in time".into())),
                Ok(Ok(Frame::Error(e))) => {
                    match forward::rejection(core, &Target::Slot(slot), &e) {
                        Some(true) => {
                            last = Frame::Error(e);
                            continue;
                        }
                        Some(false) => last = Frame::Error(e),
                        None => return Err(Frame::Error(e)),
                    }
                }
                Ok(Ok(frame)) => return Ok((route.partition, route.epoch, frame)),
                // WATCH only reads: retrying it is safe.
                Ok(Err(e)) => last = Frame::Error(format!("ERR keyway proxy: {e}")),
            }
        }
        if !forward::wait(&mut changes, &mut backoff, deadline).await {
            return Err(last);
        }
    }
}
