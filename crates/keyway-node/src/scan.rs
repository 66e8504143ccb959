//! SCAN and DBSIZE over the keys this node owns.
//!
//! Redis cursors are integers, but Keyway's keys are ordered bytes; the node
//! keeps the last key each open cursor reached in a bounded table
//! (`max_scan_cursors`, oldest forgotten first) and hands the client a
//! random number for it. A forgotten cursor gets `ERR invalid cursor`, never
//! a silent restart. Every key present for the whole scan is returned.

use crate::server::Shared;
use bytes::Bytes;
use keyway_map::{DEFAULT_KEYSPACE, PartitionMap};
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
    only_strings: Option<bool>,
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
        only_strings: None,
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
            "TYPE" => out.only_strings = Some(value.eq_ignore_ascii_case(b"string")),
            _ => return Err(Frame::Error("ERR syntax error".into())),
        }
        i += 2;
    }
    out.count = out.count.min(MAX_SCAN_COUNT);
    Ok(out)
}

/// The storage range of the whole default keyspace.
fn default_keyspace_range() -> KeyRange {
    let ks = DEFAULT_KEYSPACE.0;
    KeyRange {
        start: Bytes::copy_from_slice(&ks.to_be_bytes()),
        end: Some(Bytes::copy_from_slice(&(ks + 1).to_be_bytes())),
    }
}

/// `SCAN cursor [MATCH pattern] [COUNT count] [TYPE type]` over the keys this node owns.
pub async fn scan(shared: &Arc<Shared>, args: &[Bytes]) -> Frame {
    let args = match parse_args(args) {
        Ok(a) => a,
        Err(frame) => return frame,
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
            None => return Frame::Error("ERR invalid cursor".into()),
        },
    };
    let engine = shared.engine.clone();
    let map = shared.routing.map();
    let me = shared.me;
    let now_ms = shared.clock.unix_ms();
    let result = tokio::task::spawn_blocking(move || {
        let chunk = engine.scan(&default_keyspace_range(), after.as_deref(), args.count)?;
        let exhausted = chunk.entries.len() < args.count || chunk.next.is_none();
        let last = chunk.entries.last().map(|(k, _)| k.clone());
        let keys: Vec<Frame> = chunk
            .entries
            .into_iter()
            .filter(|(k, v)| owned(&map, me, k) && live(v, now_ms))
            .filter(|_| args.only_strings != Some(false))
            .filter_map(|(k, _)| k.get(6..).map(Bytes::copy_from_slice))
            .filter(|user| {
                args.pattern
                    .as_ref()
                    .is_none_or(|p| crate::cmd::table::glob_match(p, user))
            })
            .map(Frame::Bulk)
            .collect();
        Ok::<_, keyway_storage::StorageError>((keys, if exhausted { None } else { last }))
    })
    .await;
    match result {
        Ok(Ok((keys, next))) => {
            let cursor = match next {
                Some(position) => shared
                    .scan_cursors
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .open(position),
                None => 0,
            };
            Frame::Array(vec![Frame::bulk(cursor.to_string()), Frame::Array(keys)])
        }
        Ok(Err(e)) => Frame::Error(format!("ERR storage error: {e}")),
        Err(e) => Frame::Error(format!("ERR {e}")),
    }
}

fn owned(map: &PartitionMap, me: keyway_map::NodeId, storage_key: &[u8]) -> bool {
    storage_key
        .get(4..6)
        .map(|s| u16::from_be_bytes([s[0], s[1]]))
        .and_then(|slot| map.locate_slot(DEFAULT_KEYSPACE, slot))
        .is_some_and(|p| p.owner == me)
}

fn live(v: &Value, now_ms: u64) -> bool {
    v.expire_at_ms.is_none_or(|at| at > now_ms)
}

/// Keys stored in the default keyspace's partitions this node owns (expired
/// keys not yet removed included, as Redis counts them). Other keyspaces
/// (the `KW.*` commands') are not Redis's and are not counted.
pub async fn count_owned_keys(shared: &Arc<Shared>) -> Result<u64, String> {
    let map = shared.routing.map();
    let ranges: Vec<KeyRange> = map
        .owned_by(shared.me)
        .filter(|p| p.keyspace == DEFAULT_KEYSPACE)
        .map(|p| {
            let (start, end) = p.storage_bounds();
            KeyRange { start, end }
        })
        .collect();
    let engine = shared.engine.clone();
    tokio::task::spawn_blocking(move || {
        ranges.iter().try_fold(0u64, |sum, r| {
            engine.range_stats(r).map(|(keys, _)| sum + keys)
        })
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| e.to_string())
}

/// `DBSIZE`.
pub async fn dbsize(shared: &Arc<Shared>) -> Frame {
    match count_owned_keys(shared).await {
        Ok(n) => Frame::Integer(n as i64),
        Err(e) => Frame::Error(format!("ERR storage error: {e}")),
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
