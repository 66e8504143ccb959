//! The keyspace commands: `KW.GET`, `KW.SET`, `KW.DEL` and `KW.SCAN`, which
//! address any keyspace (by name, or by numeric id) where the Redis
//! commands address keyspace 0 only.
//!
//! ```text
//! KW.GET  ks key               -> bulk value | nil
//! KW.SET  ks key value         -> +OK
//! KW.DEL  ks key [key ...]     -> :deleted (every key in one partition, else -CROSSSLOT)
//! KW.SCAN ks start end [LIMIT n]
//!                              -> [cursor | nil, [key1, value1, key2, value2, ...]]
//! ```
//!
//! Routing follows the Redis commands' path: a command becomes a task on
//! the storage thread of its (first) key, which admits it with
//! [`RoutingGuard::admit_key`](crate::routing::RoutingGuard::admit_key) and
//! applies its effect under the same routing read guard (lease, fence =>
//! parked, incoming hold, dual writes). The storage thread is chosen by the
//! CRC16 of the first key (as a Redis command's slot picks it), so commands
//! on one key run in arrival order; a pipelined multi-key `KW.DEL` is
//! ordered only with earlier commands on its first key (keys of one range
//! partition need not share a thread). A node that does not own the key's
//! partition answers `-KWMOVED <partition> <epoch> <keyspace> <start-hex>
//! <end-hex|-> <owner> <addr>`; values are the engine's string values, so
//! migrations move them like any other.
//!
//! `KW.SCAN` (range keyspaces only) is served by any node: it walks the
//! partitions from `start` in key order, reading the ones it owns locally
//! and asking the owners of the others with the `RangeScan` peer call,
//! re-locating its cursor when a partition moved or split under it
//! (`scan.rs`).
//!
//! # Layout
//! - `mod.rs`: dispatch, keyspace resolution, the single-partition commands.
//! - `parse.rs`: arity, `LIMIT`, key length.
//! - `owned.rs`: one scan step over a partition this node owns, under the guard.
//! - `rpc.rs`: the `RangeScan` peer call, both sides.
//! - `scan.rs`: the `KW.SCAN` walk across partitions and nodes.

pub mod owned;
/// The `KW.*` grammar is keyway-command's (shared with the proxy).
pub use keyway_command::kw as parse;
pub mod rpc;
mod scan;

pub use parse::{KwCommand, ScanLimits, is_kw_command, resolve_keyspace};
pub use rpc::MAX_RANGE_SCAN_ENTRIES;

use crate::db::{Db, DbLimits};
use crate::executor::{Follow, Task, TaskOutput};
use crate::node_cmd::{Reply, apply_and_reply, norepl, rejection_kind, storage_failure};
use crate::peer::{PeerClient, PeerOptions};
use crate::routing::Rejection;
use crate::server::Shared;
use bytes::Bytes;
use keyway_map::{Epoch, Keyspace, PartitionId, key_hash_slot};
use keyway_resp::Frame;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Answers one `KW.GET` / `KW.SET` / `KW.DEL` / `KW.SCAN` request.
pub async fn dispatch(shared: &Arc<Shared>, args: &[Bytes]) -> Reply {
    dispatch_at(shared, args, None).await
}

/// [`dispatch`] for a request that carries `expected` = (partition, epoch)
/// (`KW.AT <partition> <epoch> KW.GET ...`): GET/SET/DEL run only if this
/// node owns that partition at that epoch, else `-KWMOVED` with its record.
/// `KW.SCAN` walks partitions itself and takes no epoch.
pub async fn dispatch_at(
    shared: &Arc<Shared>,
    args: &[Bytes],
    expected: Option<(PartitionId, Epoch)>,
) -> Reply {
    let limits = ScanLimits {
        default_limit: shared.config.kw_scan_default_limit,
        max_limit: shared.config.kw_scan_max_limit,
    };
    let command = match parse::parse(args, limits) {
        Ok(c) => c,
        Err(frame) => return frame.into(),
    };
    let ks_arg = match &command {
        KwCommand::Get { ks, .. }
        | KwCommand::Set { ks, .. }
        | KwCommand::Del { ks, .. }
        | KwCommand::Scan { ks, .. } => ks.clone(),
    };
    let keyspace = match resolve_keyspace(&shared.routing.map(), &ks_arg) {
        Ok(k) => k,
        Err(frame) => return frame.into(),
    };
    match command {
        KwCommand::Scan { .. } if expected.is_some() => {
            Frame::Error("ERR KW.SCAN takes no epoch (send it without KW.AT)".into()).into()
        }
        KwCommand::Scan {
            start, end, limit, ..
        } => scan::kw_scan(shared, keyspace, start, end, limit)
            .await
            .into(),
        KwCommand::Get { key, .. } => submit(shared, keyspace, Op::Get(key), expected).await,
        KwCommand::Set { key, value, .. } => {
            submit(shared, keyspace, Op::Set(key, value), expected).await
        }
        KwCommand::Del { keys, .. } => submit(shared, keyspace, Op::Del(keys), expected).await,
    }
}

/// A single-partition keyspace command.
#[derive(Clone, Debug)]
enum Op {
    Get(Bytes),
    Set(Bytes, Bytes),
    Del(Vec<Bytes>),
}

impl Op {
    fn first_key(&self) -> &Bytes {
        match self {
            Op::Get(k) | Op::Set(k, _) => k,
            Op::Del(keys) => &keys[0],
        }
    }

    fn keys(&self) -> &[Bytes] {
        match self {
            Op::Get(k) | Op::Set(k, _) => std::slice::from_ref(k),
            Op::Del(keys) => keys,
        }
    }
}

/// Queues `op` on the storage thread of its first key (every command on one
/// key runs on one thread, in arrival order, as for the Redis commands).
async fn submit(
    shared: &Arc<Shared>,
    keyspace: Keyspace,
    op: Op,
    expected: Option<(PartitionId, Epoch)>,
) -> Reply {
    let shard = key_hash_slot(op.first_key());
    let task = op_task(shared.clone(), Arc::new(keyspace), op, expected);
    match shared.executor.submit(shard, task).await {
        Ok(rx) => Reply::Waiting(rx),
        Err(frame) => frame.into(),
    }
}

/// The storage-thread task: admit by keyspace and routing key, check every
/// key is in the admitted partition, execute, apply — all under the guard.
/// A fenced partition parks the task; a dual-written one defers the reply.
fn op_task(
    shared: Arc<Shared>,
    keyspace: Arc<Keyspace>,
    op: Op,
    expected: Option<(PartitionId, Epoch)>,
) -> Task {
    Box::new(move |engine| {
        let guard = shared.routing.read();
        let first = keyspace.local_routing_key(op.first_key());
        let partition = match guard.admit_key(keyspace.id, &first, expected) {
            Ok(p) => p,
            Err(Rejection::Fenced { .. }) => {
                drop(guard);
                return TaskOutput {
                    reply: Frame::Null,
                    wrote: false,
                    follow: Follow::Park(op_task(shared, keyspace, op, expected)),
                };
            }
            Err(rejection) => {
                shared.metrics.rejected(rejection_kind(&rejection));
                return TaskOutput::reply(rejection.to_frame(), false);
            }
        };
        let in_partition = |k: &Bytes| partition.contains(&keyspace.local_routing_key(k));
        if !op.keys().iter().all(in_partition) {
            shared.metrics.rejected("crossslot");
            return TaskOutput::reply(
                Frame::Error("CROSSSLOT Keys in request don't belong to the same partition".into()),
                false,
            );
        }
        let write = !matches!(op, Op::Get(_));
        if write && let Some(refused) = norepl(&shared, guard.map(), partition) {
            return refused;
        }
        // Load statistics (what the splitter cuts range partitions by): one
        // request, by its first key.
        shared.stats.record_key(
            partition.id,
            &keyspace,
            op.first_key(),
            write,
            shared.clock.now(),
        );
        let limits = DbLimits {
            max_value_bytes: shared.config.max_value_bytes,
            stream_node_max_entries: shared.server.stream_node_max_entries(),
        };
        let mut db = Db::new(engine, &keyspace, shared.clock.unix_ms(), &limits);
        let reply = match execute(&op, &mut db) {
            Ok(reply) => reply,
            Err(e) => return storage_failure(e),
        };
        apply_and_reply(
            &shared,
            engine,
            &guard,
            partition.id,
            db.into_mutations(),
            reply,
        )
    })
}

fn execute(op: &Op, db: &mut Db<'_>) -> Result<Frame, keyway_storage::StorageError> {
    Ok(match op {
        Op::Get(key) => match db.get(key)? {
            Some(v) if crate::cmd::is_string(&v) => Frame::Bulk(v.data),
            Some(_) => Frame::Error(crate::cmd::errors::WRONGTYPE.into()),
            None => Frame::Null,
        },
        Op::Set(_, value) if value.len() > db.limits().max_value_bytes => {
            Frame::Error(crate::cmd::errors::TOO_BIG.into())
        }
        Op::Set(key, value) => {
            db.set(key, value.clone(), None);
            Frame::ok()
        }
        Op::Del(keys) => {
            let mut deleted = 0;
            for key in keys {
                deleted += i64::from(db.delete(key)?);
            }
            Frame::Integer(deleted)
        }
    })
}

/// `PeerClient`s by admin address, for `RangeScan` calls (each a lazy,
/// reconnecting channel, kept for the node's life).
pub struct PeerCache {
    clients: Mutex<HashMap<String, PeerClient>>,
    opts: PeerOptions,
}

impl PeerCache {
    /// Clients whose calls time out after `rpc_timeout`.
    pub fn new(rpc_timeout: Duration) -> Self {
        PeerCache {
            clients: Mutex::new(HashMap::new()),
            opts: PeerOptions {
                rpc_timeout,
                ..PeerOptions::default()
            },
        }
    }

    /// The client of the node whose admin port is `addr`.
    pub fn get(&self, addr: &str) -> Result<PeerClient, crate::peer::PeerError> {
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = clients.get(addr) {
            return Ok(c.clone());
        }
        let client = PeerClient::connect_with(addr, self.opts.clone())?;
        clients.insert(addr.to_string(), client.clone());
        Ok(client)
    }
}
