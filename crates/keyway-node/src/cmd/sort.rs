//! SORT and SORT_RO as Redis 7.0 runs them in cluster mode (`sort.c`).
//!
//! In cluster mode Redis refuses `GET` (`ERR GET option of SORT denied in
//! Cluster mode.`) and a `BY` pattern containing `*` (`ERR BY option of SORT
//! denied in Cluster mode.`): either would read keys of other slots. A `BY`
//! without `*` means "do not sort" (the list or sorted set keeps its order,
//! `DESC` and `LIMIT` still apply; a set is sorted `ALPHA` anyway when the
//! result is stored). So SORT reads only its key, and `STORE dest` writes a
//! list (or deletes `dest` when the result is empty) in the same slot.
//!
//! Numeric sorting parses each element with C's `strtod` rules (the whole
//! element must parse, no NaN, no overflow or underflow: `ERR One or more
//! scores can't be converted into double`); equal scores order by bytes.
//! `ALPHA` compares bytes (Redis's `strcoll` in the C locale). `LIMIT`'s
//! clamping is Redis's.

use bytes::Bytes;
use keyway_resp::Frame;

use super::{CmdError, CmdResult, errors, parse_i64, reply_err};
use crate::coll::{Contents, Whole};
use crate::db::Db;
use std::cmp::Ordering;

/// A parsed SORT / SORT_RO.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SortCmd {
    readonly: bool,
    key: Bytes,
    desc: bool,
    alpha: bool,
    /// `LIMIT offset count` (Redis's defaults: 0, -1).
    limit: (i64, i64),
    /// `BY` a pattern without `*`: keep the stored order.
    dont_sort: bool,
    store: Option<Bytes>,
}

impl SortCmd {
    /// Parses SORT's options in Redis's order; every error here comes
    /// before the key is read, as in `sortCommandGeneric`.
    pub(super) fn parse(name: &'static str, args: &[Bytes]) -> Result<Self, Frame> {
        let readonly = name == "sort_ro";
        let mut cmd = SortCmd {
            readonly,
            key: args.get(1).cloned().unwrap_or_default(),
            desc: false,
            alpha: false,
            limit: (0, -1),
            dont_sort: false,
            store: None,
        };
        let mut j = 2;
        while let Some(opt) = args.get(j) {
            let left = args.len() - j - 1;
            let is = |s: &[u8]| opt.eq_ignore_ascii_case(s);
            if is(b"asc") {
                cmd.desc = false;
            } else if is(b"desc") {
                cmd.desc = true;
            } else if is(b"alpha") {
                cmd.alpha = true;
            } else if is(b"limit") && left >= 2 {
                let int = |a: &Bytes| parse_i64(a).ok_or_else(|| Frame::error(errors::NOT_INTEGER));
                cmd.limit = (int(&args[j + 1])?, int(&args[j + 2])?);
                j += 2;
            } else if !readonly && is(b"store") && left >= 1 {
                cmd.store = Some(args[j + 1].clone());
                j += 1;
            } else if is(b"by") && left >= 1 {
                if args[j + 1].contains(&b'*') {
                    return Err(Frame::error(
                        "ERR BY option of SORT denied in Cluster mode.",
                    ));
                }
                cmd.dont_sort = true;
                j += 1;
            } else if is(b"get") && left >= 1 {
                return Err(Frame::error(
                    "ERR GET option of SORT denied in Cluster mode.",
                ));
            } else {
                return Err(Frame::error(errors::SYNTAX));
            }
            j += 1;
        }
        Ok(cmd)
    }

    pub(super) fn name(&self) -> &'static str {
        if self.readonly { "sort_ro" } else { "sort" }
    }

    pub(super) fn keys(&self) -> Vec<&[u8]> {
        let mut keys = vec![&self.key[..]];
        keys.extend(self.store.as_deref());
        keys
    }

    /// Whether the command writes (`STORE`).
    pub(super) fn stores(&self) -> bool {
        self.store.is_some()
    }

    pub(super) fn execute(&self, db: &mut Db<'_>) -> CmdResult {
        let (mut elements, ordered) = match db.read_whole(&self.key)? {
            None => (Vec::new(), true),
            Some(Whole { contents, .. }) => match contents {
                Contents::List(items) => (items, true),
                Contents::Set(members) => (members, false),
                Contents::ZSet(mut members) => {
                    members.sort_by(|a, b| a.1.total_cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
                    (members.into_iter().map(|(m, _)| m).collect(), true)
                }
                Contents::String(_) | Contents::Hash(_) | Contents::Stream(..) => {
                    return Err(reply_err(errors::WRONGTYPE));
                }
            },
        };
        let (mut dont_sort, mut alpha) = (self.dont_sort, self.alpha);
        if dont_sort && !ordered && self.store.is_some() {
            // A stored set result must not depend on the hash order.
            dont_sort = false;
            alpha = true;
        }
        let len = elements.len() as i64;
        let mut start = self.limit.0.max(0).min(len);
        let count = self.limit.1.max(-1).min(len);
        let mut end = if count < 0 {
            len - 1
        } else {
            start + count - 1
        };
        if start >= len {
            start = len - 1;
            end = len - 2;
        }
        if end >= len {
            end = len - 1;
        }
        if dont_sort && ordered {
            // The stored order, read from the head (ASC) or the tail (DESC).
            if self.desc {
                elements.reverse();
            }
            let picked = if end >= start {
                elements[start as usize..=end as usize].to_vec()
            } else {
                Vec::new()
            };
            end -= start;
            start = 0;
            elements = picked;
        } else if !dont_sort {
            elements = sorted(elements, alpha, self.desc)?;
        }
        let out: Vec<Bytes> = if end >= start {
            elements[start as usize..=end as usize].to_vec()
        } else {
            Vec::new()
        };
        let Some(dest) = &self.store else {
            return Ok(Frame::Array(out.into_iter().map(Frame::Bulk).collect()));
        };
        let n = out.len() as i64;
        if out.is_empty() {
            db.delete(dest)?;
        } else {
            db.write_whole(
                dest,
                Whole {
                    contents: Contents::List(out),
                    expire_at_ms: None,
                },
            )?;
        }
        Ok(Frame::Integer(n))
    }
}

/// Redis's `sortCompare` without BY: numeric (ties by bytes) or ALPHA.
fn sorted(elements: Vec<Bytes>, alpha: bool, desc: bool) -> Result<Vec<Bytes>, CmdError> {
    let dir = |o: Ordering| if desc { o.reverse() } else { o };
    if alpha {
        let mut v = elements;
        v.sort_by(|a, b| dir(a.cmp(b)));
        return Ok(v);
    }
    let mut scored = Vec::with_capacity(elements.len());
    for e in elements {
        let score = strtod_whole(&e)
            .ok_or_else(|| reply_err("ERR One or more scores can't be converted into double"))?;
        scored.push((score, e));
    }
    scored.sort_by(|a, b| {
        dir(a
            .0
            .partial_cmp(&b.0)
            .unwrap_or(Ordering::Equal)
            .then_with(|| a.1.cmp(&b.1)))
    });
    Ok(scored.into_iter().map(|(_, e)| e).collect())
}

/// C's `strtod` on a NUL-terminated copy of `s`, accepted as SORT accepts
/// it: the rest after the number must be empty (the first NUL byte ends the
/// string), no `ERANGE` (overflow, or underflow to a subnormal or zero),
/// no NaN. Leading white space is skipped; an empty string is 0.
pub(crate) fn strtod_whole(s: &[u8]) -> Option<f64> {
    let s = s.split(|&b| b == 0).next().unwrap_or_default();
    if s.is_empty() {
        return Some(0.0);
    }
    let t = {
        let skip = s
            .iter()
            .take_while(|b| matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r'))
            .count();
        &s[skip..]
    };
    let text = std::str::from_utf8(t).ok()?;
    let (sign, body) = match text.as_bytes().first() {
        Some(b'-') => (-1.0, &text[1..]),
        Some(b'+') => (1.0, &text[1..]),
        _ => (1.0, text),
    };
    let lower = body.to_ascii_lowercase();
    if lower == "inf" || lower == "infinity" {
        return Some(sign * f64::INFINITY);
    }
    let v = if let Some(hex) = lower.strip_prefix("0x") {
        parse_hex_float(hex)?
    } else {
        // Rust's grammar is strtod's decimal one, except that it also takes
        // "inf"/"nan" words (handled or refused here) and no leading sign twice.
        if body.is_empty()
            || body.starts_with(['+', '-'])
            || !body
                .bytes()
                .all(|b| b.is_ascii_digit() || b".eE+-".contains(&b))
        {
            return None;
        }
        body.parse::<f64>().ok()?
    };
    if v.is_nan() || v.is_infinite() || v.is_subnormal() {
        return None;
    }
    let nonzero_digits = body
        .bytes()
        .take_while(|b| !matches!(b, b'e' | b'E' | b'p' | b'P'))
        .any(|b| b.is_ascii_hexdigit() && b != b'0' && !(b == b'x' || b == b'X'));
    if v == 0.0 && nonzero_digits {
        return None;
    }
    Some(sign * v)
}

/// The part of a C hex float after `0x`: hex digits, an optional `.` and
/// fraction, an optional `p[+-]exponent`.
fn parse_hex_float(s: &str) -> Option<f64> {
    let (mantissa, exp) = match s.split_once('p') {
        Some((m, e)) => (m, e.parse::<i32>().ok()?),
        None => (s, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    let mut v = 0f64;
    for c in int.chars() {
        v = v * 16.0 + f64::from(c.to_digit(16)?);
    }
    let mut scale = 1.0 / 16.0;
    for c in frac.chars() {
        v += f64::from(c.to_digit(16)?) * scale;
        scale /= 16.0;
    }
    Some(v * 2f64.powi(exp))
}

#[cfg(test)]
mod tests {
    use super::strtod_whole;

    #[test]
    fn strtod_as_sort_accepts_it() {
        for (s, v) in [
            ("", 0.0),
            ("1", 1.0),
            (" 1.5", 1.5),
            ("-2e3", -2000.0),
            ("+.5", 0.5),
            ("5.", 5.0),
            ("inf", f64::INFINITY),
            ("-Infinity", f64::NEG_INFINITY),
            ("0x10", 16.0),
            ("0x1p3", 8.0),
            ("1\0junk", 1.0),
            ("0", 0.0),
            ("0e10", 0.0),
        ] {
            assert_eq!(strtod_whole(s.as_bytes()), Some(v), "{s:?}");
        }
        for s in [
            "a", "1a", " ", "1 ", "nan", "1e400", "1e-400", "--1", "1e", "0x",
        ] {
            assert_eq!(strtod_whole(s.as_bytes()), None, "{s:?}");
        }
    }
}
