//! `FLUSHALL` and `FLUSHDB` (`[ASYNC|SYNC]`): the node empties the slots it
//! owns, as a Redis Cluster primary empties its own (a cluster client sends
//! the command to every primary).
//!
//! Process:
//! 1. A blocking pass (`spawn_blocking`) finds the owned slots that hold
//!    any entry (one seek per slot). It starts after every earlier reply
//!    of the connection was released (`FLUSHALL` is node-wide for the
//!    connection's ordering, [`crate::node_cmd::is_node_wide`]), so every
//!    write acknowledged before the request is in the engine and is found.
//! 2. Each such slot is emptied by storage tasks on its executor thread,
//!    each deleting at most `flush_chunk_keys` entries in **one** batch
//!    through the data commands' path: admission (owner; fence => parked;
//!    moved away => skipped, its new owner flushes it), `-NOREPLICAS`, the
//!    apply, then replication and a migration's dual write
//!    ([`crate::node_cmd::apply_and_reply`]). So moves, splits and replicas
//!    follow the deletes like any write. Every entry of the slot is
//!    deleted, collection sub-entries included (nothing is left for the
//!    background reclamation).
//! 3. The reply (`+OK`) comes once every slot is empty, with `ASYNC` too:
//!    a key written after the reply must survive, which a flush still
//!    running behind the reply could not promise. The slots are flushed
//!    concurrently; other commands of a slot run between its chunks.
//!
//! `FLUSHALL` and `FLUSHDB` are the same (one database). On the replica
//! endpoint both are refused like any write.

use crate::executor::{Follow, Task, TaskOutput};
use crate::node_cmd::{Reply, apply_and_reply, norepl, storage_failure};
use crate::routing::Rejection;
use crate::server::Shared;
use bytes::Bytes;
use keyway_map::SLOT_COUNT;
use keyway_resp::Frame;
use keyway_storage::{KeyRange, Mutation};
use prometheus_client::metrics::counter::Counter;
use std::sync::Arc;

/// Flush counters (`keyway_flush_*`), also in `/status`.
#[derive(Clone, Default)]
pub struct FlushMetrics {
    /// FLUSHALL/FLUSHDB requests completed.
    pub flushes: Counter,
    /// Entries they deleted.
    pub deleted: Counter,
}

impl FlushMetrics {
    pub fn register(metrics: &crate::metrics::Metrics) -> Self {
        let m = FlushMetrics::default();
        metrics.register(
            "flushes",
            "FLUSHALL/FLUSHDB requests completed",
            m.flushes.clone(),
        );
        metrics.register(
            "flush_deleted_entries",
            "Entries (keys and collection sub-entries) deleted by FLUSHALL/FLUSHDB",
            m.deleted.clone(),
        );
        m
    }
}

/// `FLUSHALL|FLUSHDB [ASYNC|SYNC]`.
pub async fn flush(shared: &Arc<Shared>, args: &[Bytes], replica_endpoint: bool) -> Reply {
    match args.len() {
        1 => {}
        2 if args[1].eq_ignore_ascii_case(b"async") || args[1].eq_ignore_ascii_case(b"sync") => {}
        _ => return Frame::Error("ERR syntax error".into()).into(),
    }
    if replica_endpoint {
        return Frame::Error("READONLY You can't write against a read only replica.".into()).into();
    }
    let slots = match non_empty_owned_slots(shared).await {
        Ok(slots) => slots,
        Err(frame) => return frame.into(),
    };
    let mut jobs = tokio::task::JoinSet::new();
    for slot in slots {
        let shared = shared.clone();
        jobs.spawn(async move { flush_slot(&shared, slot).await });
    }
    let mut first_error = None;
    while let Some(done) = jobs.join_next().await {
        match done {
            Ok(Ok(deleted)) => {
                shared.flush_metrics.deleted.inc_by(deleted);
            }
            Ok(Err(frame)) => {
                first_error.get_or_insert(frame);
            }
            Err(e) => {
                first_error.get_or_insert(Frame::Error(format!("ERR flush task failed: {e}")));
            }
        }
    }
    shared.flush_metrics.flushes.inc();
    first_error.unwrap_or_else(Frame::ok).into()
}

/// The storage range of one slot of the default keyspace.
fn slot_range(shared: &Shared, slot: u16) -> KeyRange {
    let ks = shared.keyspace.id.0;
    let key = |ks: u32, slot: Option<u16>| {
        let mut k = ks.to_be_bytes().to_vec();
        if let Some(s) = slot {
            k.extend_from_slice(&s.to_be_bytes());
        }
        Bytes::from(k)
    };
    let end = match slot
        .checked_add(1)
        .filter(|s| usize::from(*s) < SLOT_COUNT as usize)
    {
        Some(next) => key(ks, Some(next)),
        None => key(ks + 1, None),
    };
    KeyRange {
        start: key(ks, Some(slot)),
        end: Some(end),
    }
}

/// The slots the map gives this node that hold at least one entry.
async fn non_empty_owned_slots(shared: &Arc<Shared>) -> Result<Vec<u16>, Frame> {
    if !shared.routing.lease_valid() {
        return Err(Rejection::LeaseLapsed.to_frame());
    }
    let map = shared.routing.map();
    let owned: Vec<u16> = (0..SLOT_COUNT as u32)
        .map(|s| s as u16)
        .filter(|&s| {
            map.locate_slot(shared.keyspace.id, s)
                .is_some_and(|p| p.owner == shared.me)
        })
        .collect();
    let shared = shared.clone();
    tokio::task::spawn_blocking(move || {
        let mut out = Vec::new();
        for slot in owned {
            let chunk = shared
                .engine
                .scan(&slot_range(&shared, slot), None, 1)
                .map_err(|e| Frame::Error(format!("ERR storage error: {e}")))?;
            if !chunk.entries.is_empty() {
                out.push(slot);
            }
        }
        Ok(out)
    })
    .await
    .map_err(|e| Frame::Error(format!("ERR flush scan failed: {e}")))?
}

/// Empties one slot, chunk by chunk; the number of entries deleted.
async fn flush_slot(shared: &Arc<Shared>, slot: u16) -> Result<u64, Frame> {
    let chunk = shared.config.flush_chunk_keys;
    let mut after: Option<Bytes> = None;
    let mut total = 0;
    loop {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let task = chunk_task(shared.clone(), slot, after.clone(), chunk, tx);
        let reply = match shared.executor.submit(slot, task).await {
            Ok(reply) => reply,
            Err(frame) => return Err(frame),
        };
        let frame = reply
            .await
            .unwrap_or_else(|_| Frame::Error("ERR server is shutting down".into()));
        match frame {
            Frame::Integer(n) => {
                total += n as u64;
                let last = rx.await.ok().flatten();
                if (n as usize) < chunk || last.is_none() {
                    return Ok(total);
                }
                after = last;
            }
            Frame::Error(e) => return Err(Frame::Error(e)),
            other => {
                return Err(Frame::Error(format!(
                    "ERR unexpected flush reply {other:?}"
                )));
            }
        }
    }
}

/// One chunk of a slot's flush on its executor thread (see the module
/// doc); sends the last key it deleted on `last`.
fn chunk_task(
    shared: Arc<Shared>,
    slot: u16,
    after: Option<Bytes>,
    chunk: usize,
    last: tokio::sync::oneshot::Sender<Option<Bytes>>,
) -> Task {
    Box::new(move |engine| {
        let guard = shared.routing.read();
        let p = match guard.admit_slot(shared.keyspace.id, slot, None) {
            Ok(p) => p,
            Err(Rejection::Fenced { .. }) => {
                drop(guard);
                return TaskOutput {
                    reply: Frame::Null,
                    wrote: false,
                    follow: Follow::Park(chunk_task(shared, slot, after, chunk, last)),
                };
            }
            Err(Rejection::LeaseLapsed) => {
                return TaskOutput::reply(Rejection::LeaseLapsed.to_frame(), false);
            }
            // Moved away (or never ours): its owner flushes it.
            Err(_) => {
                let _ = last.send(None);
                return TaskOutput::reply(Frame::Integer(0), false);
            }
        };
        if let Some(refused) = norepl(&shared, guard.map(), p) {
            return refused;
        }
        let partition = p.id;
        let found = match engine.scan(&slot_range(&shared, slot), after.as_deref(), chunk) {
            Ok(found) => found,
            Err(e) => return storage_failure(e),
        };
        let n = found.entries.len();
        let _ = last.send(found.entries.last().map(|(k, _)| k.clone()));
        let mutations: Vec<Mutation> = found
            .entries
            .into_iter()
            .map(|(key, _)| Mutation::Delete { key })
            .collect();
        apply_and_reply(
            &shared,
            engine,
            &guard,
            partition,
            mutations,
            Frame::Integer(n as i64),
        )
    })
}
