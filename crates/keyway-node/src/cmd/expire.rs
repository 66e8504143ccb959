//! Expiry commands: EXPIRE PEXPIRE EXPIREAT PEXPIREAT (with Redis 7's
//! NX | XX | GT | LT), TTL PTTL EXPIRETIME PEXPIRETIME, PERSIST.
//!
//! As in Redis 7.0 (`expireGenericCommand`, `ttlGenericCommand`): the time
//! may be negative; unit conversion or base-time overflow is `ERR invalid
//! expire time in '<cmd>' command`; a time at or before now deletes the key
//! and replies 1; GT treats "no expiry" as infinite, LT as never-less. TTL and
//! EXPIRETIME round to the nearest second (`(ms + 500) / 1000`); they reply
//! -2 for a missing key and -1 for a key without expiry.

use bytes::Bytes;
use keyway_resp::Frame;

use super::{CmdResult, int_arg, invalid_expire, now_i64};
use crate::db::Db;

/// EXPIRE's NX / XX / GT / LT options.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExpireFlags {
    nx: bool,
    xx: bool,
    gt: bool,
    lt: bool,
}

/// A parsed expiry command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExpireCmd {
    /// EXPIRE / PEXPIRE / EXPIREAT / PEXPIREAT.
    Expire {
        name: &'static str,
        key: Bytes,
        when: i64,
        seconds: bool,
        absolute: bool,
        flags: ExpireFlags,
    },
    /// TTL / PTTL / EXPIRETIME / PEXPIRETIME.
    Ttl {
        name: &'static str,
        key: Bytes,
        millis: bool,
        absolute: bool,
    },
    /// PERSIST.
    Persist { key: Bytes },
}

/// Redis's `parseExtendedExpireArgumentsOrReply`.
fn parse_flags(opts: &[Bytes]) -> Result<ExpireFlags, Frame> {
    let mut f = ExpireFlags::default();
    for opt in opts {
        if opt.eq_ignore_ascii_case(b"nx") {
            f.nx = true;
        } else if opt.eq_ignore_ascii_case(b"xx") {
            f.xx = true;
        } else if opt.eq_ignore_ascii_case(b"gt") {
            f.gt = true;
        } else if opt.eq_ignore_ascii_case(b"lt") {
            f.lt = true;
        } else {
            return Err(Frame::Error(format!(
                "ERR Unsupported option {}",
                String::from_utf8_lossy(opt)
            )));
        }
    }
    if f.nx && (f.xx || f.gt || f.lt) {
        return Err(Frame::error(
            "ERR NX and XX, GT or LT options at the same time are not compatible",
        ));
    }
    if f.gt && f.lt {
        return Err(Frame::error(
            "ERR GT and LT options at the same time are not compatible",
        ));
    }
    Ok(f)
}

impl ExpireCmd {
    /// Parses `args` (`args[0]` is the name, arity already checked).
    pub(super) fn parse(name: &'static str, args: &[Bytes]) -> Result<Self, Frame> {
        let key = args.get(1).cloned().unwrap_or_default();
        Ok(match name {
            "expire" | "pexpire" | "expireat" | "pexpireat" => {
                let flags = parse_flags(args.get(3..).unwrap_or_default())?;
                let when = int_arg(args.get(2).map_or(&[][..], |a| &a[..]))?;
                ExpireCmd::Expire {
                    name,
                    key,
                    when,
                    seconds: !name.starts_with('p'),
                    absolute: name.ends_with("at"),
                    flags,
                }
            }
            "ttl" | "pttl" | "expiretime" | "pexpiretime" => ExpireCmd::Ttl {
                name,
                key,
                millis: name.starts_with('p'),
                absolute: name.ends_with("time"),
            },
            "persist" => ExpireCmd::Persist { key },
            other => return Err(Frame::Error(format!("ERR unknown command '{other}'"))),
        })
    }

    /// The lowercase command name.
    pub fn name(&self) -> &'static str {
        match self {
            ExpireCmd::Expire { name, .. } | ExpireCmd::Ttl { name, .. } => name,
            ExpireCmd::Persist { .. } => "persist",
        }
    }

    /// The user keys.
    pub fn keys(&self) -> Vec<&[u8]> {
        match self {
            ExpireCmd::Expire { key, .. }
            | ExpireCmd::Ttl { key, .. }
            | ExpireCmd::Persist { key } => vec![key],
        }
    }

    /// Runs the command.
    pub(super) fn execute(&self, db: &mut Db<'_>) -> CmdResult {
        match self {
            ExpireCmd::Expire {
                name,
                key,
                when,
                seconds,
                absolute,
                flags,
            } => expire(db, name, key, *when, *seconds, *absolute, *flags),
            ExpireCmd::Ttl {
                key,
                millis,
                absolute,
                ..
            } => {
                let Some(value) = db.get(key)? else {
                    return Ok(Frame::Integer(-2));
                };
                let Some(at) = value.expire_at_ms else {
                    return Ok(Frame::Integer(-1));
                };
                let at = i64::try_from(at).unwrap_or(i64::MAX);
                let ttl = if *absolute {
                    at
                } else {
                    at.saturating_sub(now_i64(db)).max(0)
                };
                Ok(Frame::Integer(if *millis {
                    ttl
                } else {
                    ttl.saturating_add(500) / 1000
                }))
            }
            ExpireCmd::Persist { key } => {
                let has_ttl = db.get(key)?.is_some_and(|v| v.expire_at_ms.is_some());
                if has_ttl {
                    db.set_expiry(key, None)?;
                }
                Ok(Frame::Integer(i64::from(has_ttl)))
            }
        }
    }
}

/// Redis 7.0's `expireGenericCommand`.
fn expire(
    db: &mut Db<'_>,
    name: &str,
    key: &[u8],
    when: i64,
    seconds: bool,
    absolute: bool,
    f: ExpireFlags,
) -> CmdResult {
    let now = now_i64(db);
    let mut when = when;
    if seconds {
        if !(i64::MIN / 1000..=i64::MAX / 1000).contains(&when) {
            return Err(invalid_expire(name));
        }
        when *= 1000;
    }
    let base = if absolute { 0 } else { now };
    if when > i64::MAX - base {
        return Err(invalid_expire(name));
    }
    when += base;

    let Some(value) = db.get(key)? else {
        return Ok(Frame::Integer(0));
    };
    // -1 = no expiry, as Redis's getExpire.
    let current = value
        .expire_at_ms
        .map_or(-1, |at| i64::try_from(at).unwrap_or(i64::MAX));
    let refused = (f.nx && current != -1)
        || (f.xx && current == -1)
        || (f.gt && (when <= current || current == -1))
        || (f.lt && current != -1 && when >= current);
    if refused {
        return Ok(Frame::Integer(0));
    }
    if when <= now {
        db.delete(key)?;
    } else {
        db.set_expiry(key, Some(when as u64))?;
    }
    Ok(Frame::Integer(1))
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;

    #[test]
    fn expire_ttl_persist() {
        let mut t = TestDb::new();
        assert_eq!(t.run(&["ttl", "k"]), int(-2));
        assert_eq!(t.run(&["expire", "k", "10"]), int(0));
        t.run(&["set", "k", "v"]);
        assert_eq!(t.run(&["ttl", "k"]), int(-1));
        assert_eq!(t.run(&["pttl", "k"]), int(-1));
        assert_eq!(t.run(&["expiretime", "k"]), int(-1));
        assert_eq!(t.run(&["persist", "k"]), int(0));
        assert_eq!(t.run(&["expire", "k", "10"]), int(1));
        assert_eq!(t.run(&["pttl", "k"]), int(10_000));
        t.advance(1_499);
        assert_eq!(t.run(&["ttl", "k"]), int(9)); // 8501 ms rounds to 9
        t.advance(2);
        assert_eq!(t.run(&["ttl", "k"]), int(8)); // 8499 ms rounds to 8
        assert_eq!(t.run(&["pexpiretime", "k"]), int((T0 + 10_000) as i64));
        assert_eq!(
            t.run(&["expiretime", "k"]),
            int(((T0 + 10_000) / 1000) as i64)
        );
        assert_eq!(t.run(&["persist", "k"]), int(1));
        assert_eq!(t.run(&["ttl", "k"]), int(-1));
        assert_eq!(t.stored("k").unwrap().expire_at_ms, None);
    }

    #[test]
    fn absolute_and_millisecond_forms() {
        let mut t = TestDb::new();
        t.run(&["set", "k", "v"]);
        let at = (T0 / 1000 + 100).to_string();
        assert_eq!(t.run(&["expireat", "k", &at]), int(1));
        assert_eq!(
            t.stored("k").unwrap().expire_at_ms,
            Some((T0 / 1000 + 100) * 1000)
        );
        let pat = (T0 + 1234).to_string();
        assert_eq!(t.run(&["pexpireat", "k", &pat]), int(1));
        assert_eq!(t.run(&["pttl", "k"]), int(1234));
        assert_eq!(t.run(&["pexpire", "k", "50"]), int(1));
        t.advance(50);
        assert_eq!(t.run(&["get", "k"]), bulk_null());
        assert_eq!(t.run(&["ttl", "k"]), int(-2));
    }

    fn bulk_null() -> keyway_resp::Frame {
        keyway_resp::Frame::Null
    }

    #[test]
    fn a_time_in_the_past_deletes_the_key() {
        let mut t = TestDb::new();
        t.run(&["set", "k", "v"]);
        assert_eq!(t.run(&["expire", "k", "-1"]), int(1));
        assert!(t.stored("k").is_none());
        t.run(&["set", "k", "v"]);
        assert_eq!(t.run(&["pexpire", "k", "0"]), int(1));
        assert_eq!(t.run(&["exists", "k"]), int(0));
        t.run(&["set", "k", "v"]);
        assert_eq!(t.run(&["expireat", "k", "1"]), int(1));
        assert!(t.stored("k").is_none());
    }

    #[test]
    fn nx_xx_gt_lt() {
        let mut t = TestDb::new();
        t.run(&["set", "k", "v"]);
        assert_eq!(t.run(&["expire", "k", "100", "xx"]), int(0));
        assert_eq!(t.run(&["expire", "k", "100", "gt"]), int(0));
        assert_eq!(t.run(&["expire", "k", "100", "lt"]), int(1));
        assert_eq!(t.run(&["expire", "k", "200", "nx"]), int(0));
        assert_eq!(t.run(&["expire", "k", "50", "gt"]), int(0));
        assert_eq!(t.run(&["expire", "k", "200", "GT"]), int(1));
        assert_eq!(t.run(&["expire", "k", "300", "lt"]), int(0));
        assert_eq!(t.run(&["expire", "k", "30", "xx", "lt"]), int(1));
        assert_eq!(t.run(&["ttl", "k"]), int(30));
        t.run(&["set", "n", "v"]);
        assert_eq!(t.run(&["expire", "n", "10", "nx"]), int(1));
    }

    #[test]
    fn option_and_value_errors() {
        let mut t = TestDb::new();
        t.run(&["set", "k", "v"]);
        assert_eq!(
            t.run(&["expire", "k", "10", "foo"]),
            err("ERR Unsupported option foo")
        );
        assert_eq!(
            t.run(&["expire", "k", "10", "nx", "xx"]),
            err("ERR NX and XX, GT or LT options at the same time are not compatible")
        );
        assert_eq!(
            t.run(&["expire", "k", "10", "gt", "lt"]),
            err("ERR GT and LT options at the same time are not compatible")
        );
        assert_eq!(
            t.run(&["expire", "k", "ten"]),
            err("ERR value is not an integer or out of range")
        );
        assert_eq!(
            t.run(&["expire", "k", "ten", "foo"]),
            err("ERR Unsupported option foo")
        );
        assert_eq!(
            t.run(&["expire", "k", "9223372036854775807"]),
            err("ERR invalid expire time in 'expire' command")
        );
        assert_eq!(
            t.run(&["pexpire", "k", "9223372036854775807"]),
            err("ERR invalid expire time in 'pexpire' command")
        );
        assert_eq!(t.run(&["pexpireat", "k", "9223372036854775807"]), int(1));
        assert_eq!(
            t.run(&["expire", "k"]),
            err("ERR wrong number of arguments for 'expire' command")
        );
        assert_eq!(
            t.run(&["ttl"]),
            err("ERR wrong number of arguments for 'ttl' command")
        );
    }

    #[test]
    fn lazy_expiry_at_exactly_the_deadline() {
        let mut t = TestDb::new();
        t.run(&["set", "k", "v", "px", "10"]);
        t.advance(9);
        assert_eq!(t.run(&["pttl", "k"]), int(1));
        t.advance(1);
        assert_eq!(t.run(&["pttl", "k"]), int(-2));
        assert!(t.stored("k").is_none());
    }
}
