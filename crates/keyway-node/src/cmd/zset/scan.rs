//! ZSCAN: `zscanCommand` + `scanGenericCommand`.
//!
//! A small sorted set (at most [`SMALL_ZSET_ENTRIES`] members, Redis's
//! `zset-max-listpack-entries` default) is returned whole in score order with
//! cursor 0 when the scan starts, as Redis does for its listpack encoding.
//! Larger ones are walked in member order, [`ScanOpts::count`] members a
//! call (O(COUNT) per call, never O(n)): the cursor is the first 8 bytes of
//! the next member, zero-padded, as a big-endian `u64`. A call never stops
//! between two members sharing those 8 bytes, so the next call starts at a
//! member nothing returned yet shares them with: every member present for
//! the whole scan is returned exactly once, and the cursor is 0 only at the
//! end (the members before it would share its zero prefix). A run of
//! members sharing 8 leading bytes is returned in one call.

use bytes::Bytes;
use keyway_resp::Frame;

use super::access;
use super::score::score_frame;
use crate::cmd::table::glob_match;
use crate::cmd::{CmdResult, errors, parse_i64};
use crate::coll::layout;
use crate::db::Db;

/// Members up to which a scan from cursor 0 returns the whole set.
const SMALL_ZSET_ENTRIES: u64 = 128;

/// Member entries one engine read fetches.
const SCAN_CHUNK_ENTRIES: usize = 128;

/// ZSCAN's options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScanOpts {
    count: u64,
    pattern: Option<Bytes>,
}

/// A parsed ZSCAN.
#[derive(Clone, Debug, PartialEq)]
pub struct ScanCmd {
    pub(super) key: Bytes,
    cursor: u64,
    /// Checked only if the key exists, as Redis does.
    opts: Result<ScanOpts, Frame>,
}

/// `parseScanCursorOrReply`: `strtoul(s, &end, 10)` with no leading space,
/// nothing after the digits (up to a NUL) and no overflow; `""` is 0 and
/// `-1` wraps around, as in C.
pub(crate) fn parse_cursor(s: &[u8]) -> Option<u64> {
    let cut = s.iter().position(|&b| b == 0).unwrap_or(s.len());
    let c = &s[..cut];
    if c.is_empty() {
        return Some(0);
    }
    if matches!(c[0], b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r') {
        return None;
    }
    let (neg, digits) = match c[0] {
        b'-' => (true, &c[1..]),
        b'+' => (false, &c[1..]),
        _ => (false, c),
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut v: u64 = 0;
    for &d in digits {
        v = v.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    Some(if neg { v.wrapping_neg() } else { v })
}

fn parse_opts(rest: &[Bytes]) -> Result<ScanOpts, Frame> {
    let mut o = ScanOpts {
        count: 10,
        pattern: None,
    };
    let mut i = 0;
    while i < rest.len() {
        let left = rest.len() - i;
        if rest[i].eq_ignore_ascii_case(b"count") && left >= 2 {
            let n =
                parse_i64(&rest[i + 1]).ok_or_else(|| Frame::Error(errors::NOT_INTEGER.into()))?;
            if n < 1 {
                return Err(Frame::Error(errors::SYNTAX.into()));
            }
            o.count = n as u64;
            i += 2;
        } else if rest[i].eq_ignore_ascii_case(b"match") && left >= 2 {
            let p = rest[i + 1].clone();
            o.pattern = (&p[..] != b"*").then_some(p);
            i += 2;
        } else {
            return Err(Frame::Error(errors::SYNTAX.into()));
        }
    }
    Ok(o)
}

/// The cursor naming the position of `member`: its first 8 bytes, zero-padded.
fn cursor_of(member: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = member.len().min(8);
    b[..n].copy_from_slice(&member[..n]);
    u64::from_be_bytes(b)
}

/// The member-entry suffix a cursor resumes at: `0x01` and the cursor's
/// bytes without trailing zeros (every member whose padded prefix is at
/// least the cursor sorts at or after it).
fn resume_suffix(cursor: u64) -> Vec<u8> {
    let bytes = cursor.to_be_bytes();
    let n = bytes.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
    let mut v = vec![layout::ZSET_MEMBER_TAG];
    v.extend_from_slice(&bytes[..n]);
    v
}

impl ScanCmd {
    pub(super) fn parse(args: &[Bytes]) -> Result<ScanCmd, Frame> {
        let cursor = parse_cursor(args.get(2).map_or(&[][..], |a| &a[..]))
            .ok_or_else(|| Frame::Error("ERR invalid cursor".into()))?;
        Ok(ScanCmd {
            key: args.get(1).cloned().unwrap_or_default(),
            cursor,
            opts: parse_opts(args.get(3..).unwrap_or_default()),
        })
    }

    pub(super) fn execute(&self, db: &mut Db<'_>) -> CmdResult {
        let key = &self.key;
        let Some(meta) = access::open(db, key)? else {
            return Ok(reply(0, Vec::new()));
        };
        let opts = match &self.opts {
            Ok(o) => o,
            Err(e) => return Ok(e.clone()),
        };
        let mut found: Vec<(Bytes, f64)> = Vec::new();
        let mut next = 0;
        if self.cursor == 0 && meta.size <= SMALL_ZSET_ENTRIES {
            let mut walk = access::Walk::all(false);
            while let Some(e) = walk.next(db, key, &meta)? {
                found.push((e.member, e.score));
            }
        } else {
            let mut from = resume_suffix(self.cursor);
            let to = vec![layout::ZSET_MEMBER_TAG + 1];
            'chunks: loop {
                let chunk = db.sub_range(key, &meta, Some(&from), Some(&to), SCAN_CHUNK_ENTRIES)?;
                let exhausted = chunk.len() < SCAN_CHUNK_ENTRIES;
                if let Some((last, _)) = chunk.last() {
                    from = access::successor(last);
                }
                for (suffix, data) in chunk {
                    let member = suffix.slice(1..);
                    if found.len() as u64 >= opts.count
                        && found
                            .last()
                            .is_some_and(|(m, _)| cursor_of(m) != cursor_of(&member))
                    {
                        next = cursor_of(&member);
                        break 'chunks;
                    }
                    found.push((member, access::decode_member_data(&data)));
                }
                if exhausted {
                    break;
                }
            }
        }
        if let Some(p) = &opts.pattern {
            found.retain(|(m, _)| glob_match(p, m));
        }
        Ok(reply(next, found))
    }
}

fn reply(cursor: u64, found: Vec<(Bytes, f64)>) -> Frame {
    let mut items = Vec::with_capacity(found.len() * 2);
    for (m, s) in found {
        items.push(Frame::Bulk(m));
        items.push(score_frame(s));
    }
    Frame::Array(vec![
        Frame::Bulk(Bytes::from(cursor.to_string())),
        Frame::Array(items),
    ])
}
