//! Stream id arguments as Redis 7.0 parses them (`streamGenericParseIDOrReply`,
//! `streamParseIntervalIDOrReply`), and the integer arguments of the stream
//! commands.

use bytes::Bytes;

use super::super::{CmdError, errors, parse_i64, reply_err};
use crate::coll::stream::StreamId;

pub const INVALID_ID: &str = "ERR Invalid stream ID specified as stream command argument";

/// C's `isspace` in the "C" locale.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// Redis's `string2ull`: `string2ll` if it parses (negative rejected),
/// else C's `strtoull` over the whole string (leading spaces, a sign and
/// leading zeros accepted, a `-` negating modulo 2^64, overflow rejected).
pub fn string2ull(s: &[u8]) -> Option<u64> {
    if let Some(v) = parse_i64(s) {
        return u64::try_from(v).ok();
    }
    let mut i = 0;
    while i < s.len() && is_c_space(s[i]) {
        i += 1;
    }
    let neg = match s.get(i) {
        Some(b'-') => {
            i += 1;
            true
        }
        Some(b'+') => {
            i += 1;
            false
        }
        _ => false,
    };
    let digits = s.get(i..)?;
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut v: u64 = 0;
    for &d in digits {
        v = v.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    Some(if neg { v.wrapping_neg() } else { v })
}

/// A parsed id argument: the id, and whether its sequence was given
/// (`false` for `ms-*`, which only XADD accepts).
fn parse_generic(
    arg: &[u8],
    missing_seq: u64,
    strict: bool,
    allow_star_seq: bool,
) -> Option<(StreamId, bool)> {
    // Redis copies the argument into a C string: it stops at a NUL.
    let arg = arg.split(|&b| b == 0).next().unwrap_or_default();
    if arg.len() > 127 {
        return None;
    }
    if arg == b"-" || arg == b"+" {
        if strict {
            return None;
        }
        return Some((
            if arg == b"-" {
                StreamId::MIN
            } else {
                StreamId::MAX
            },
            true,
        ));
    }
    let (ms_part, seq_part) = match arg.iter().position(|&b| b == b'-') {
        Some(i) => (&arg[..i], Some(&arg[i + 1..])),
        None => (arg, None),
    };
    let ms = string2ull(ms_part)?;
    match seq_part {
        Some(b"*") if allow_star_seq => Some((StreamId::new(ms, 0), false)),
        Some(seq) => Some((StreamId::new(ms, string2ull(seq)?), true)),
        None => Some((StreamId::new(ms, missing_seq), true)),
    }
}

fn invalid() -> CmdError {
    reply_err(INVALID_ID)
}

/// A strict id (`-` and `+` rejected), missing sequence 0.
pub fn strict_id(arg: &[u8]) -> Result<StreamId, CmdError> {
    parse_generic(arg, 0, true, false)
        .map(|(id, _)| id)
        .ok_or_else(invalid)
}

/// `strict_id` without the error (XCLAIM's trailing options).
pub fn try_strict_id(arg: &[u8]) -> Option<StreamId> {
    parse_generic(arg, 0, true, false).map(|(id, _)| id)
}

/// XADD's id: strict, `ms-*` allowed (the `bool` says whether the sequence was given).
pub fn xadd_id(arg: &[u8]) -> Result<(StreamId, bool), CmdError> {
    parse_generic(arg, 0, true, true).ok_or_else(invalid)
}

/// A non-strict id (`-`, `+` allowed) with `missing_seq` for `ms` alone.
pub fn loose_id(arg: &[u8], missing_seq: u64) -> Result<StreamId, CmdError> {
    parse_generic(arg, missing_seq, false, false)
        .map(|(id, _)| id)
        .ok_or_else(invalid)
}

/// A range bound: `(id` is exclusive (then strict), else as [`loose_id`].
pub fn interval_id(arg: &[u8], missing_seq: u64) -> Result<(StreamId, bool), CmdError> {
    if arg.len() > 1 && arg[0] == b'(' {
        let id = parse_generic(&arg[1..], missing_seq, true, false).ok_or_else(invalid)?;
        return Ok((id.0, true));
    }
    Ok((loose_id(arg, missing_seq)?, false))
}

/// A range's inclusive start from its argument (`(` moves it up by one).
pub fn range_start(arg: &[u8]) -> Result<StreamId, CmdError> {
    let (id, ex) = interval_id(arg, 0)?;
    if ex {
        return id
            .incr()
            .ok_or_else(|| reply_err("ERR invalid start ID for the interval"));
    }
    Ok(id)
}

/// A range's inclusive end from its argument (`(` moves it down by one).
pub fn range_end(arg: &[u8]) -> Result<StreamId, CmdError> {
    let (id, ex) = interval_id(arg, u64::MAX)?;
    if ex {
        return id
            .decr()
            .ok_or_else(|| reply_err("ERR invalid end ID for the interval"));
    }
    Ok(id)
}

/// `getLongLongFromObjectOrReply` with the standard error.
pub fn int(arg: &[u8]) -> Result<i64, CmdError> {
    parse_i64(arg).ok_or_else(|| reply_err(errors::NOT_INTEGER))
}

/// `getLongLongFromObjectOrReply` with a custom error text.
pub fn int_or(arg: &[u8], msg: &str) -> Result<i64, CmdError> {
    parse_i64(arg).ok_or_else(|| reply_err(format!("ERR {msg}")))
}

/// Whether `arg` is `word`, any case.
pub fn is(arg: &Bytes, word: &str) -> bool {
    arg.eq_ignore_ascii_case(word.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_parse_like_redis() {
        assert_eq!(string2ull(b"01"), Some(1));
        assert_eq!(string2ull(b" +5"), Some(5));
        assert_eq!(string2ull(b"-1"), None);
        assert_eq!(string2ull(b"-0"), Some(0));
        assert_eq!(string2ull(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(string2ull(b"18446744073709551616"), None);
        assert_eq!(string2ull(b""), None);
        assert_eq!(string2ull(b"1x"), None);
        assert_eq!(strict_id(b"5").unwrap(), StreamId::new(5, 0));
        assert_eq!(strict_id(b"5-3").unwrap(), StreamId::new(5, 3));
        assert!(strict_id(b"-").is_err());
        assert!(strict_id(b"5-*").is_err());
        assert_eq!(xadd_id(b"5-*").unwrap(), (StreamId::new(5, 0), false));
        assert_eq!(loose_id(b"+", 0).unwrap(), StreamId::MAX);
        assert_eq!(
            loose_id(b"7", u64::MAX).unwrap(),
            StreamId::new(7, u64::MAX)
        );
        assert_eq!(range_start(b"(1-0").unwrap(), StreamId::new(1, 1));
        assert_eq!(range_end(b"(1-0").unwrap(), StreamId::new(0, u64::MAX));
        assert!(range_end(b"(0-0").is_err());
        assert!(range_start(b"(-").is_err());
        assert!(range_start(b"(").is_err());
    }
}
