//! SCAN, DBSIZE (and INFO's key count) over the keys this node owns.
//!
//! Redis cursors are integers, but Keyway's keys are ordered bytes; the node
//! keeps the last key each open cursor reached in a bounded table
//! (`max_scan_cursors`, oldest forgotten first) and hands the client a
//! random number for it. A forgotten cursor gets `ERR invalid cursor`, never
//! a silent restart. Every key present for the whole scan is returned.
//!
//! Admission is the data commands' (invariant 2): each step runs on a
//! storage thread under the routing read guard, is refused when the lease
//! lapsed (`-CLUSTERDOWN ... (node lease lapsed)`), covers only the
//! partitions this node owns at that moment, and parks like a data command
//! while a partition it would read is fenced. Both are node-wide reads: the
//! connection queues one only after every earlier reply of its pipeline was
//! released and waits for it before reading on, and its reply waits for an
//! fsync like a write's (it may read other threads' undurable writes).

use crate::executor::{Follow, Task, TaskOutput};
use crate::node_cmd::{Reply, storage_failure};
use crate::routing::{Rejection, RoutingGuard};
use crate::server::Shared;
use bytes::Bytes;
use keyway_map::{DEFAULT_KEYSPACE, NodeId, SLOT_COUNT};
use keyway_resp::Frame;
use keyway_storage::{KeyRange, Value};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// Default number of keys one SCAN call examines (Redis's COUNT default).
const DEFAULT_SCAN_COUNT: usize = 10;
/// Most keys one SCAN call may examine, whatever COUNT says.
const MAX_SCAN_COUNT: usize = 100_000;

/// Open SCAN cursors: cursor number -> last storage key returned.
pub struct ScanCursors {
    positions: HashMap<u64, Bytes>,
    order: VecDeque<u64>,
    capacity: usize,
}

impl ScanCursors {
    pub fn new(capacity: usize) -> Self {
        assert!(capacity > 0);
        ScanCursors {
            positions: HashMap::new(),
            order: VecDeque::new(),
            capacity,
        }
    }

    /// Remembers `position`, forgetting the oldest cursor when full.
    pub fn open(&mut self, position: Bytes) -> u64 {
        let mut id = 0;
        while id == 0 || self.positions.contains_key(&id) {
            id = rand::random::<u64>() & ((1 << 53) - 1);
        }
        if self.order.len() >= self.capacity
            && let Some(old) = self.order.pop_front()
        {
            self.positions.remove(&old);
        }
        self.positions.insert(id, position);
        self.order.push_back(id);
        id
    }

    /// Takes the position of `cursor` (each cursor is used once).
    pub fn take(&mut self, cursor: u64) -> Option<Bytes> {
        let position = self.positions.remove(&cursor)?;
        self.order.retain(|c| *c != cursor);
        Some(position)
    }
}

struct ScanArgs {
    cursor: u64,
    pattern: Option<Bytes>,
    count: usize,
    type_name: Option<String>,
}

fn parse_args(args: &[Bytes]) -> Result<ScanArgs, Frame> {
    if args.len() < 2 {
        return Err(crate::cmd::table::arity_error("scan"));
    }
    let cursor = std::str::from_utf8(&args[1])
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .ok_or_else(|| Frame::Error("ERR invalid cursor".into()))?;
    let mut out = ScanArgs {
        cursor,
        pattern: None,
        count: DEFAULT_SCAN_COUNT,
        type_name: None,
    };
    let mut i = 2;
    while i < args.len() {
        let opt = String::from_utf8_lossy(&args[i]).to_ascii_uppercase();
        let value = args
            .get(i + 1)
            .ok_or_else(|| Frame::Error("ERR syntax error".into()))?;
        match opt.as_str() {
            "MATCH" => out.pattern = Some(value.clone()),
            "COUNT" => {
                out.count = std::str::from_utf8(value)
                    .ok()
                    .and_then(|s| s.parse::<i64>().ok())
                    .ok_or_else(|| {
                        Frame::Error("ERR value is not an integer or out of range".into())
                    })?
                    .try_into()
                    .ok()
                    .filter(|c: &usize| *c >= 1)
                    .ok_or_else(|| Frame::Error("ERR syntax error".into()))?;
            }
            "TYPE" => out.type_name = Some(String::from_utf8_lossy(value).to_ascii_lowercase()),
            _ => return Err(Frame::Error("ERR syntax error".into())),
        }
        i += 2;
    }
    out.count = out.count.min(MAX_SCAN_COUNT);
    Ok(out)
}

/// The storage range of the whole default keyspace.
pub(crate) fn default_keyspace_range() -> KeyRange {
    let ks = DEFAULT_KEYSPACE.0;
    KeyRange {
        start: Bytes::copy_from_slice(&ks.to_be_bytes()),
        end: Some(Bytes::copy_from_slice(&(ks + 1).to_be_bytes())),
    }
}

/// `SCAN cursor [MATCH pattern] [COUNT count] [TYPE type]` over the keys this
/// node owns: a node-wide task on a storage thread (see [`node_wide`]).
pub async fn scan(shared: &Arc<Shared>, args: &[Bytes]) -> Reply {
    let args = match parse_args(args) {
        Ok(a) => a,
        Err(frame) => return frame.into(),
    };
    let after = match args.cursor {
        0 => None,
        c => match shared
            .scan_cursors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take(c)
        {
            Some(position) => Some(position),
            None => return Frame::Error("ERR invalid cursor".into()).into(),
        },
    };
    submit_node_wide(shared, scan_task(shared.clone(), Arc::new(args), after)).await
}

/// Queues a node-wide read; its reply comes after group commit.
pub(crate) async fn submit_node_wide(shared: &Arc<Shared>, task: Task) -> Reply {
    match shared.executor.submit_node_wide(task).await {
        Ok(rx) => Reply::Waiting(rx),
        Err(frame) => frame.into(),
    }
}

/// What a node-wide read does with one slot's keys, judged under the
/// routing read guard by the same admission as data commands.
pub(crate) enum SlotVerdict {
    /// Owned and served now: its keys are read.
    Serve,
    /// Not this node's (moved, unserved, or being received): skipped.
    Skip,
    /// Owned and fenced for a cutover: the read parks, like a data command.
    Hold,
}

/// A node-wide read's verdict on `slot`, or the rejection that refuses the
/// whole read (a lapsed lease).
pub(crate) fn verdict(
    guard: &RoutingGuard<'_>,
    me: NodeId,
    slot: u16,
) -> Result<SlotVerdict, Rejection> {
    match guard.admit_slot(DEFAULT_KEYSPACE, slot, None) {
        Ok(_) => Ok(SlotVerdict::Serve),
        Err(Rejection::LeaseLapsed) => Err(Rejection::LeaseLapsed),
        Err(Rejection::Fenced { .. })
            if guard
                .map()
                .locate_slot(DEFAULT_KEYSPACE, slot)
                .is_some_and(|p| p.owner == me) =>
        {
            Ok(SlotVerdict::Hold)
        }
        Err(_) => Ok(SlotVerdict::Skip),
    }
}

/// A node-wide read's reply: it waits for an fsync (it may have read other
/// threads' writes that are not durable yet).
pub(crate) fn node_wide(reply: Frame) -> TaskOutput {
    TaskOutput::reply(reply, true)
}

pub(crate) fn park(task: Task) -> TaskOutput {
    TaskOutput {
        reply: Frame::Null,
        wrote: false,
        follow: Follow::Park(task),
    }
}

/// One SCAN step under the routing read guard: refused without a lease;
/// keys of partitions this node does not own at that moment are left out;
/// a key of an owned, fenced partition parks the whole step.
fn scan_task(shared: Arc<Shared>, args: Arc<ScanArgs>, after: Option<Bytes>) -> Task {
    Box::new(move |engine| {
        let guard = shared.routing.read();
        if !shared.routing.lease_valid() {
            shared.metrics.rejected("lease_lapsed");
            return TaskOutput::reply(Rejection::LeaseLapsed.to_frame(), false);
        }
        let chunk = match engine.scan(&default_keyspace_range(), after.as_deref(), args.count) {
            Ok(chunk) => chunk,
            Err(e) => return storage_failure(e),
        };
        let now_ms = shared.clock.unix_ms();
        let exhausted = chunk.entries.len() < args.count || chunk.next.is_none();
        let last = chunk.entries.last().map(|(k, _)| k.clone());
        let mut keys = Vec::new();
        let mut judged: Option<(u16, SlotVerdict)> = None;
        for (k, v) in &chunk.entries {
            let Some(slot) = k.get(4..6).map(|s| u16::from_be_bytes([s[0], s[1]])) else {
                continue;
            };
            if judged.as_ref().is_none_or(|(s, _)| *s != slot) {
                match verdict(&guard, shared.me, slot) {
                    Ok(v) => judged = Some((slot, v)),
                    Err(rejection) => {
                        return TaskOutput::reply(rejection.to_frame(), false);
                    }
                }
            }
            match judged.as_ref().map(|(_, v)| v) {
                Some(SlotVerdict::Serve) => {}
                Some(SlotVerdict::Hold) => {
                    drop(guard);
                    return park(scan_task(shared.clone(), args.clone(), after.clone()));
                }
                _ => continue,
            }
            let user = &k[6..];
            let wanted = live(v, now_ms)
                && v.kind.is_user_key()
                && args
                    .type_name
                    .as_deref()
                    .is_none_or(|t| t == crate::cmd::type_name(v.kind))
                && args
                    .pattern
                    .as_ref()
                    .is_none_or(|p| crate::cmd::table::glob_match(p, user));
            if wanted {
                keys.push(Frame::Bulk(Bytes::copy_from_slice(user)));
            }
        }
        drop(guard);
        let cursor = match (exhausted, last) {
            (false, Some(position)) => shared
                .scan_cursors
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .open(position),
            _ => 0,
        };
        node_wide(Frame::Array(vec![
            Frame::bulk(cursor.to_string()),
            Frame::Array(keys),
        ]))
    })
}

fn live(v: &Value, now_ms: u64) -> bool {
    v.expire_at_ms.is_none_or(|at| at > now_ms)
}

/// Counts the keys stored in the default keyspace's partitions this node
/// owns (expired keys not yet removed included, as Redis counts them),
/// walking the partitions in slot order, each counted under its own routing
/// read guard (so the guard is held for one partition's count, not the
/// node's). Other keyspaces (the `KW.*` commands') are not Redis's and are
/// not counted. A lapsed lease refuses; an owned, fenced partition parks
/// the count (it restarts when re-run). The reply is an integer.
fn count_task(shared: Arc<Shared>) -> Task {
    Box::new(move |engine| {
        let mut total = 0u64;
        let mut slot: u32 = 0;
        while slot < SLOT_COUNT as u32 {
            let guard = shared.routing.read();
            let Some(p) = guard.map().locate_slot(DEFAULT_KEYSPACE, slot as u16) else {
                if !shared.routing.lease_valid() {
                    return TaskOutput::reply(Rejection::LeaseLapsed.to_frame(), false);
                }
                slot += 1;
                continue;
            };
            let (first, last) = p.slot_span();
            debug_assert!(first as u32 <= slot && slot <= last as u32);
            let (start, end) = p.storage_bounds();
            match verdict(&guard, shared.me, slot as u16) {
                Err(rejection) => {
                    shared.metrics.rejected("lease_lapsed");
                    return TaskOutput::reply(rejection.to_frame(), false);
                }
                Ok(SlotVerdict::Hold) => {
                    drop(guard);
                    return park(count_task(shared.clone()));
                }
                Ok(SlotVerdict::Skip) => {}
                Ok(SlotVerdict::Serve) => match engine.range_stats(&KeyRange { start, end }) {
                    Ok((keys, _)) => total += keys,
                    Err(e) => return storage_failure(e),
                },
            }
            slot = (last as u32).max(slot) + 1;
        }
        node_wide(Frame::Integer(total as i64))
    })
}

/// `DBSIZE`.
pub async fn dbsize(shared: &Arc<Shared>) -> Reply {
    submit_node_wide(shared, count_task(shared.clone())).await
}

/// The key count for `INFO`: the number, or the error that refused it (a
/// lapsed lease, a fence held too long, a storage error).
pub async fn count_owned_keys(shared: &Arc<Shared>) -> Result<u64, String> {
    let frame = match submit_node_wide(shared, count_task(shared.clone())).await {
        Reply::Frame(frame) => frame,
        Reply::Waiting(rx) => rx
            .await
            .unwrap_or_else(|_| Frame::Error("ERR server is shutting down".into())),
    };
    match frame {
        Frame::Integer(n) => Ok(n.max(0) as u64),
        Frame::Error(e) => Err(e),
        other => Err(format!("unexpected count reply {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_table_is_bounded_and_single_use() {
        let mut c = ScanCursors::new(2);
        let a = c.open(Bytes::from_static(b"a"));
        let b = c.open(Bytes::from_static(b"b"));
        let d = c.open(Bytes::from_static(b"d"));
        assert_eq!(c.take(a), None, "oldest cursor forgotten");
        assert_eq!(c.take(b).as_deref(), Some(&b"b"[..]));
        assert_eq!(c.take(b), None);
        assert_eq!(c.take(d).as_deref(), Some(&b"d"[..]));
    }
}
