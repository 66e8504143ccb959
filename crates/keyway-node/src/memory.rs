//! `MEMORY USAGE key [SAMPLES count]` and the other `MEMORY` subcommands.
//!
//! `USAGE` is a storage task on the key's slot (a read, admitted like
//! `GET`). It reports the bytes the key occupies as stored: its top-level
//! entry (storage key and encoded value: kind, flags, expiry, version,
//! data) plus, for a collection, every sub-entry of its current version
//! (storage key, encoding, data). With `SAMPLES n` (default 5, as Redis) a
//! collection of more than `n` entries is estimated from its first `n`
//! sub-entries' mean size times its size; `SAMPLES 0` reads them all.

use crate::cmd::{errors, parse_i64};
use crate::coll::layout::{self, Meta};
use crate::db::Db;
use crate::node_cmd::{Reply, SlotWork};
use crate::server::Shared;
use crate::session::Session;
use bytes::Bytes;
use keyway_map::key_hash_slot;
use keyway_resp::Frame;
use keyway_storage::{KeyRange, StorageError};
use std::sync::Arc;

/// Redis's default `SAMPLES`.
const DEFAULT_SAMPLES: usize = 5;
/// Bytes a stored value adds to its data: kind, flags, version.
const VALUE_OVERHEAD_BYTES: usize = 1 + 1 + 8;
/// Bytes an expiry adds.
const EXPIRY_BYTES: usize = 8;
/// Sub-entries read per scan step when counting them all.
const SCAN_CHUNK_ENTRIES: usize = 1024;

/// `MEMORY <sub> ...`.
pub async fn memory(shared: &Arc<Shared>, session: &Session, args: &[Bytes]) -> Reply {
    let sub = String::from_utf8_lossy(&args[1]).to_ascii_uppercase();
    match (sub.as_str(), args.len()) {
        ("USAGE", n) if n >= 3 => {
            let samples = match &args[3..] {
                [] => DEFAULT_SAMPLES,
                [opt, count] if opt.eq_ignore_ascii_case(b"samples") => match parse_i64(count) {
                    None => return Frame::Error(errors::NOT_INTEGER.into()).into(),
                    Some(n) if n < 0 => return Frame::Error(errors::SYNTAX.into()).into(),
                    Some(0) => usize::MAX,
                    Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
                },
                _ => return Frame::Error(errors::SYNTAX.into()).into(),
            };
            let key = args[2].clone();
            let slot = key_hash_slot(&key);
            crate::node_cmd::submit_work(shared, Usage { key, samples }, slot, None, session).await
        }
        ("DOCTOR", 2) => Frame::Verbatim {
            format: *b"txt",
            text: Bytes::from_static(
                b"Keyway keeps its data in its storage engine, not in allocator memory: see INFO memory (the process's resident set) and the node's /metrics.\n",
            ),
        }
        .into(),
        ("MALLOC-STATS", 2) => Frame::Verbatim {
            format: *b"txt",
            text: Bytes::from_static(b"Stats not supported for the current allocator\n"),
        }
        .into(),
        ("PURGE", 2) => Frame::ok().into(),
        ("HELP", 2) => Frame::Array(
            [
                "MEMORY <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "DOCTOR",
                "    Return memory problems reports.",
                "MALLOC-STATS",
                "    Return internal statistics report from the memory allocator.",
                "PURGE",
                "    Attempt to purge dirty pages for reclamation by the allocator.",
                "USAGE <key> [SAMPLES <count>]",
                "    Return memory in bytes used by <key> and its value. Nested values are",
                "    sampled up to <count> times (default: 5, 0 means sample all).",
                "HELP",
                "    Prints this help.",
            ]
            .iter()
            .map(|l| Frame::Simple((*l).into()))
            .collect(),
        )
        .into(),
        ("USAGE" | "DOCTOR" | "MALLOC-STATS" | "PURGE" | "HELP", _) => Frame::Error(format!(
            "ERR wrong number of arguments for 'memory|{}' command",
            sub.to_ascii_lowercase()
        ))
        .into(),
        _ => Frame::Error(format!(
            "ERR unknown subcommand '{}'. Try MEMORY HELP.",
            String::from_utf8_lossy(&args[1])
        ))
        .into(),
    }
}

/// The `MEMORY USAGE` storage task's work.
struct Usage {
    key: Bytes,
    samples: usize,
}

/// The smallest key greater than every key starting with `prefix`.
fn prefix_end(prefix: &[u8]) -> Option<Bytes> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xFF {
            end.push(last + 1);
            return Some(Bytes::from(end));
        }
    }
    None
}

impl SlotWork for Usage {
    fn is_write(&self) -> bool {
        false
    }

    fn first_key(&self) -> Option<&[u8]> {
        Some(&self.key)
    }

    fn execute(&self, db: &mut Db<'_>) -> Result<Frame, StorageError> {
        let Some(value) = db.get(&self.key)? else {
            return Ok(Frame::Null);
        };
        let top = db.keyspace().storage_key(&self.key).len()
            + VALUE_OVERHEAD_BYTES
            + value.expire_at_ms.map_or(0, |_| EXPIRY_BYTES)
            + value.data.len();
        let Some(meta) = value
            .kind
            .is_collection()
            .then(|| Meta::decode(value.kind, &value.data))
            .flatten()
        else {
            return Ok(Frame::Integer(top as i64));
        };
        let prefix = layout::sub_prefix(db.keyspace(), &self.key, meta.version);
        let range = KeyRange {
            start: prefix.clone(),
            end: prefix_end(&prefix),
        };
        let engine = db.engine();
        let (mut seen, mut bytes) = (0u64, 0u64);
        let mut after: Option<Bytes> = None;
        while (seen as usize) < self.samples {
            let want = SCAN_CHUNK_ENTRIES.min(self.samples - seen as usize);
            let chunk = engine.scan(&range, after.as_deref(), want)?;
            for (k, v) in &chunk.entries {
                seen += 1;
                bytes += (k.len() + VALUE_OVERHEAD_BYTES + v.data.len()) as u64;
            }
            match chunk.next {
                Some(next) if chunk.entries.len() == want => after = Some(next),
                _ => break,
            }
        }
        // A sorted set stores two sub-entries per member (member, score index).
        let entries = match meta.kind {
            keyway_storage::ValueKind::ZSet => meta.size.saturating_mul(2),
            _ => meta.size,
        };
        let subs = match seen {
            0 => 0,
            n if n >= entries => bytes,
            n => (bytes as f64 / n as f64 * entries as f64) as u64,
        };
        Ok(Frame::Integer((top as u64 + subs) as i64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_is_the_next_prefix() {
        assert_eq!(prefix_end(b"ab").as_deref(), Some(&b"ac"[..]));
        assert_eq!(prefix_end(b"a\xff").as_deref(), Some(&b"b"[..]));
        assert_eq!(prefix_end(b"\xff\xff"), None);
    }
}
