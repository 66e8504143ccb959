//! HSCAN / SSCAN / ZSCAN cursors.
//!
//! A Redis cursor is a 64-bit number; Keyway's collections are sorted by
//! field, so a cursor names *where to resume*. Two kinds:
//! - **self-contained** (top bit clear): the next field itself when it is at
//!   most 6 bytes (its bytes and its length in the low byte). Any node holding
//!   the key resumes it, after a move or a failover too.
//! - **parked** (top bit set): the node keeps the next field in its SCAN
//!   cursor table (`max_scan_cursors`, oldest forgotten first) under a random
//!   id. A cursor this node does not know (forgotten, or opened on the node
//!   the key moved from) restarts the iteration: every element is still
//!   returned at least once, only some twice, and it ends once the key stays
//!   put. Without a table (in-process tests, MULTI) the cursor is a 6-byte
//!   prefix of the next field and a call goes on past COUNT until the next
//!   field's prefix differs from where it started, so it always progresses.
//!
//! Guarantees, as Redis's: every element present for the whole iteration is
//! returned at least once; a full iteration ends (cursor `0`).

use bytes::Bytes;
use keyway_resp::Frame;

use super::{CmdError, errors, reply_err};
use crate::coll::Meta;
use crate::db::Db;

/// Redis's default COUNT.
pub const DEFAULT_SCAN_COUNT: usize = 10;

/// SCAN-style arguments after the cursor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScanOpts {
    pub cursor: u64,
    pub pattern: Option<Bytes>,
    pub count: usize,
}

impl ScanOpts {
    /// Parses the cursor (Redis's `parseScanCursorOrReply`, checked before the key is read).
    /// `strtoul` rules: no leading space, an optional sign (a negative
    /// number wraps, as C's does), digits; the empty string is 0.
    pub fn parse_cursor(arg: &[u8]) -> Result<u64, CmdError> {
        let invalid = || reply_err("ERR invalid cursor");
        if arg.is_empty() {
            return Ok(0);
        }
        let (negative, digits) = match arg[0] {
            b'-' => (true, &arg[1..]),
            b'+' => (false, &arg[1..]),
            _ => (false, arg),
        };
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return Err(invalid());
        }
        let n = std::str::from_utf8(digits)
            .ok()
            .and_then(|d| d.parse::<u64>().ok())
            .ok_or_else(invalid)?;
        Ok(if negative { n.wrapping_neg() } else { n })
    }

    /// Parses `[MATCH pattern] [COUNT count]` after the cursor as Redis's
    /// `scanGenericCommand` (checked only once the key exists).
    pub fn parse_options(cursor: u64, args: &[Bytes]) -> Result<ScanOpts, CmdError> {
        let mut out = ScanOpts {
            cursor,
            pattern: None,
            count: DEFAULT_SCAN_COUNT,
        };
        let mut i = 0;
        while i < args.len() {
            let more = i + 1 < args.len();
            if args[i].eq_ignore_ascii_case(b"count") && more {
                let n =
                    super::parse_i64(&args[i + 1]).ok_or_else(|| reply_err(errors::NOT_INTEGER))?;
                if n < 1 {
                    return Err(reply_err(errors::SYNTAX));
                }
                out.count = n as usize;
            } else if args[i].eq_ignore_ascii_case(b"match") && more {
                let p = args[i + 1].clone();
                // Redis skips matching for the pattern "*".
                out.pattern = (&p[..] != b"*").then_some(p);
            } else {
                return Err(reply_err(errors::SYNTAX));
            }
            i += 2;
        }
        Ok(out)
    }
}

/// Longest field a self-contained cursor carries exactly.
const CARRIED_BYTES: usize = 6;
/// Top bit: the cursor names an entry of the node's cursor table.
const PARKED_BIT: u64 = 1 << 63;

/// The resume point a self-contained cursor names (`None` for cursor 0).
fn resume_point(cursor: u64) -> Option<Vec<u8>> {
    if cursor == 0 {
        return None;
    }
    let len = ((cursor & 0xff) as usize).min(CARRIED_BYTES);
    Some(cursor.to_be_bytes()[1..1 + len].to_vec())
}

/// A self-contained cursor resuming at `field`, or just before it (at its
/// first 6 bytes) when it is longer; `exact` says which.
fn cursor_for(field: &[u8]) -> (u64, bool) {
    let mut bytes = [0u8; 8];
    let n = field.len().min(CARRIED_BYTES);
    bytes[1..1 + n].copy_from_slice(&field[..n]);
    bytes[7] = n as u8;
    (u64::from_be_bytes(bytes), field.len() <= CARRIED_BYTES)
}

/// Where a cursor resumes: the field (or field prefix) to start at, inclusive.
fn resolve(db: &Db<'_>, cursor: u64) -> Vec<u8> {
    if cursor & PARKED_BIT == 0 {
        return resume_point(cursor).unwrap_or_default();
    }
    let parked = db.cursors().and_then(|t| {
        t.lock()
            .unwrap_or_else(|e| e.into_inner())
            .take(cursor & !PARKED_BIT)
    });
    // Unknown here: start over (see the module docs).
    parked.map(|f| f.to_vec()).unwrap_or_default()
}

/// One scan step over the sub-entries of `meta` whose suffix starts with
/// `tag` (empty for hashes and sets; `0x01` for a zset's member entries):
/// `(next cursor, [(field without tag, data)])`, MATCH applied.
pub(crate) fn scan_step(
    db: &mut Db<'_>,
    key: &[u8],
    meta: &Meta,
    tag: &[u8],
    opts: &ScanOpts,
) -> Result<(u64, Vec<(Bytes, Bytes)>), CmdError> {
    let start_point = resolve(db, opts.cursor);
    let mut from: Vec<u8> = tag
        .iter()
        .copied()
        .chain(start_point.iter().copied())
        .collect();
    let end: Option<Vec<u8>> = match tag {
        [] => None,
        [t] => Some(vec![t + 1]),
        _ => unreachable!("one-byte tags"),
    };
    let mut out = Vec::new();
    loop {
        let chunk = db.sub_range(key, meta, Some(&from), end.as_deref(), opts.count.max(16))?;
        if chunk.is_empty() {
            return Ok((0, filter(out, opts)));
        }
        for (suffix, data) in chunk {
            let field = suffix.slice(tag.len()..);
            if out.len() >= opts.count {
                let (c, exact) = cursor_for(&field);
                if exact {
                    return Ok((c, filter(out, opts)));
                }
                if let Some(table) = db.cursors() {
                    let id = table
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .open(field.clone());
                    return Ok((id | PARKED_BIT, filter(out, opts)));
                }
                if resume_point(c).unwrap_or_default() > start_point {
                    return Ok((c, filter(out, opts)));
                }
            }
            // Resume strictly after this entry.
            from = suffix.to_vec();
            from.push(0);
            out.push((field, data));
        }
    }
}

fn filter(entries: Vec<(Bytes, Bytes)>, opts: &ScanOpts) -> Vec<(Bytes, Bytes)> {
    match &opts.pattern {
        None => entries,
        Some(p) => entries
            .into_iter()
            .filter(|(f, _)| super::table::glob_match(p, f))
            .collect(),
    }
}

/// The reply `[cursor, [items...]]`.
pub(crate) fn scan_reply(cursor: u64, items: Vec<Frame>) -> Frame {
    Frame::Array(vec![Frame::bulk(cursor.to_string()), Frame::Array(items)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_contained_cursors_resume_at_or_before_their_field() {
        for f in [&b"a"[..], b"abcdef", b"abcdefg", b"abcdefghijk", b"\0\0x"] {
            let (c, exact) = cursor_for(f);
            assert_ne!(c, 0);
            assert_eq!(c & PARKED_BIT, 0);
            let p = resume_point(c).unwrap();
            assert!(p.as_slice() <= f, "{f:?}");
            assert_eq!(exact, f.len() <= CARRIED_BYTES);
            if exact {
                assert_eq!(p, f);
            }
        }
    }
}
