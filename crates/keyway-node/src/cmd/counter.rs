//! Counter commands: INCR DECR INCRBY DECRBY INCRBYFLOAT.
//!
//! As in Redis 7.0 (`incrDecrCommand`, `incrbyfloatCommand`): the stored
//! string must parse as a strict 64-bit integer (`string2ll`) or a
//! `long double` (`strtold`); a missing key counts as 0; the result replaces
//! the value and keeps its TTL. Integer overflow is `ERR increment or
//! decrement would overflow` (`DECRBY i64::MIN` is `ERR decrement would
//! overflow`); a NaN or infinite float result is `ERR increment would produce
//! NaN or Infinity`. INCRBYFLOAT computes in emulated x87 `long double` and
//! prints `%.17Lf` without trailing zeros, so its replies match Redis on
//! x86-64 byte for byte (see `long_double.rs`).

use bytes::Bytes;
use keyway_resp::Frame;

use super::long_double::{self, LongDouble};
use super::{CmdResult, errors, get_string, int_arg, parse_i64, reply_err};
use crate::db::Db;

/// A parsed counter command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CounterCmd {
    /// INCR / DECR / INCRBY / DECRBY: add `by` to the integer at `key`.
    IncrBy {
        name: &'static str,
        key: Bytes,
        by: i64,
    },
    /// INCRBYFLOAT: the increment is validated after the stored value, as in Redis.
    IncrByFloat { key: Bytes, by: Bytes },
}

impl CounterCmd {
    /// Parses `args` (`args[0]` is the name, arity already checked).
    pub(super) fn parse(name: &'static str, args: &[Bytes]) -> Result<Self, Frame> {
        let key = args.get(1).cloned().unwrap_or_default();
        let amount = || args.get(2).cloned().unwrap_or_default();
        let by = match name {
            "incr" => 1,
            "decr" => -1,
            "incrby" => int_arg(&amount())?,
            "decrby" => {
                let by = int_arg(&amount())?;
                by.checked_neg()
                    .ok_or_else(|| Frame::Error(errors::DECR_OVERFLOW.into()))?
            }
            "incrbyfloat" => return Ok(CounterCmd::IncrByFloat { key, by: amount() }),
            other => return Err(Frame::Error(format!("ERR unknown command '{other}'"))),
        };
        Ok(CounterCmd::IncrBy { name, key, by })
    }

    /// The lowercase command name.
    pub fn name(&self) -> &'static str {
        match self {
            CounterCmd::IncrBy { name, .. } => name,
            CounterCmd::IncrByFloat { .. } => "incrbyfloat",
        }
    }

    /// The user keys.
    pub fn keys(&self) -> Vec<&[u8]> {
        match self {
            CounterCmd::IncrBy { key, .. } | CounterCmd::IncrByFloat { key, .. } => vec![key],
        }
    }

    /// Runs the command.
    pub(super) fn execute(&self, db: &mut Db<'_>) -> CmdResult {
        match self {
            CounterCmd::IncrBy { key, by, .. } => {
                let old = get_string(db, key)?;
                let (current, expire) = match &old {
                    None => (0, None),
                    Some(v) => (
                        parse_i64(&v.data).ok_or_else(|| reply_err(errors::NOT_INTEGER))?,
                        v.expire_at_ms,
                    ),
                };
                let new = current
                    .checked_add(*by)
                    .ok_or_else(|| reply_err(errors::OVERFLOW))?;
                db.set(key, Bytes::from(new.to_string()), expire);
                Ok(Frame::Integer(new))
            }
            CounterCmd::IncrByFloat { key, by } => {
                let old = get_string(db, key)?;
                let (current, expire) = match &old {
                    None => (LongDouble::ZERO, None),
                    Some(v) => (
                        long_double::parse(&v.data).ok_or_else(|| reply_err(errors::NOT_FLOAT))?,
                        v.expire_at_ms,
                    ),
                };
                let by = long_double::parse(by).ok_or_else(|| reply_err(errors::NOT_FLOAT))?;
                let new = current.add(by);
                if !new.is_finite() {
                    return Err(reply_err(errors::NAN_OR_INF));
                }
                let text = Bytes::from(long_double::format_human(new));
                db.set(key, text.clone(), expire);
                Ok(Frame::Bulk(text))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use keyway_resp::Frame;

    #[test]
    fn incr_decr_family() {
        let mut t = TestDb::new();
        assert_eq!(t.run(&["incr", "n"]), int(1));
        assert_eq!(t.run(&["incrby", "n", "41"]), int(42));
        assert_eq!(t.run(&["decr", "n"]), int(41));
        assert_eq!(t.run(&["decrby", "n", "-9"]), int(50));
        assert_eq!(t.run(&["get", "n"]), bulk("50"));
        assert_eq!(t.run(&["decrby", "m", "5"]), int(-5));
    }

    #[test]
    fn integer_errors() {
        let mut t = TestDb::new();
        t.run(&["set", "s", "abc"]);
        assert_eq!(
            t.run(&["incr", "s"]),
            err("ERR value is not an integer or out of range")
        );
        t.run(&["set", "s", " 1"]);
        assert_eq!(
            t.run(&["incr", "s"]),
            err("ERR value is not an integer or out of range")
        );
        t.run(&["set", "s", "01"]);
        assert_eq!(
            t.run(&["incr", "s"]),
            err("ERR value is not an integer or out of range")
        );
        assert_eq!(
            t.run(&["incrby", "n", "1.5"]),
            err("ERR value is not an integer or out of range")
        );
        assert_eq!(
            t.run(&["incrby", "n", "+1"]),
            err("ERR value is not an integer or out of range")
        );
        assert_eq!(
            t.run(&["decrby", "n", "-9223372036854775808"]),
            err("ERR decrement would overflow")
        );
        t.run(&["set", "max", "9223372036854775807"]);
        assert_eq!(
            t.run(&["incr", "max"]),
            err("ERR increment or decrement would overflow")
        );
        t.run(&["set", "min", "-9223372036854775808"]);
        assert_eq!(
            t.run(&["decr", "min"]),
            err("ERR increment or decrement would overflow")
        );
        assert_eq!(t.run(&["incrby", "min", "9223372036854775807"]), int(-1));
        assert_eq!(
            t.run(&["incr"]),
            err("ERR wrong number of arguments for 'incr' command")
        );
        assert_eq!(t.run(&["get", "n"]), Frame::Null);
    }

    #[test]
    fn incr_keeps_the_ttl() {
        let mut t = TestDb::new();
        t.run(&["set", "n", "1", "px", "5000"]);
        assert_eq!(t.run(&["incr", "n"]), int(2));
        assert_eq!(t.run(&["pttl", "n"]), int(5000));
        assert_eq!(t.run(&["incrbyfloat", "n", "0.5"]), bulk("2.5"));
        assert_eq!(t.run(&["pttl", "n"]), int(5000));
    }

    #[test]
    fn incrbyfloat_formats_like_redis() {
        let mut t = TestDb::new();
        t.run(&["set", "f", "10.50"]);
        assert_eq!(t.run(&["incrbyfloat", "f", "0.1"]), bulk("10.6"));
        assert_eq!(t.run(&["incrbyfloat", "f", "-5"]), bulk("5.6"));
        t.run(&["set", "f", "5.0e3"]);
        assert_eq!(t.run(&["incrbyfloat", "f", "2.0e2"]), bulk("5200"));
        assert_eq!(t.run(&["incrbyfloat", "new", "5.0e-5"]), bulk("0.00005"));
        assert_eq!(t.run(&["incrbyfloat", "three", "3.0e3"]), bulk("3000"));
        assert_eq!(t.run(&["get", "three"]), bulk("3000"));
        t.run(&["set", "big", "10000000000"]);
        assert_eq!(
            t.run(&["incrbyfloat", "big", "0.1"]),
            bulk("10000000000.09999999962747097")
        );
    }

    #[test]
    fn incrbyfloat_errors() {
        let mut t = TestDb::new();
        t.run(&["set", "s", "abc"]);
        assert_eq!(
            t.run(&["incrbyfloat", "s", "1"]),
            err("ERR value is not a valid float")
        );
        assert_eq!(
            t.run(&["incrbyfloat", "n", "x"]),
            err("ERR value is not a valid float")
        );
        assert_eq!(
            t.run(&["incrbyfloat", "n", "nan"]),
            err("ERR value is not a valid float")
        );
        assert_eq!(
            t.run(&["incrbyfloat", "n", "inf"]),
            err("ERR increment would produce NaN or Infinity")
        );
        t.run(&["set", "huge", "1.1e4932"]);
        assert_eq!(
            t.run(&["incrbyfloat", "huge", "1.1e4932"]),
            err("ERR increment would produce NaN or Infinity")
        );
        assert_eq!(t.run(&["get", "n"]), Frame::Null);
    }
}
