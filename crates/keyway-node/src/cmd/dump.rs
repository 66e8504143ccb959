//! DUMP and RESTORE with Redis's own payload (see `rdb.rs`), so keys move
//! between Keyway and Redis 7.0 (and tools that copy keys with DUMP /
//! RESTORE work) in both directions.
//!
//! RESTORE follows Redis 7.0's `restoreCommand`: the options (`REPLACE`,
//! `ABSTTL`, `IDLETIME s`, `FREQ f`; IDLETIME and FREQ exclude each other)
//! are checked first, then an existing key without REPLACE is `BUSYKEY
//! Target key name already exists.`, then the TTL (`ERR Invalid TTL value,
//! must be >= 0`), then the payload (`ERR DUMP payload version or checksum
//! are wrong`, `ERR Bad data format`). A TTL of 0 means none; a relative
//! TTL is added to the command's clock; a deadline already past restores
//! nothing (the key is deleted under REPLACE) and still replies OK.
//! Keyway keeps no access clock or frequency, so IDLETIME and FREQ are
//! validated and then have no effect.

use bytes::Bytes;
use keyway_resp::Frame;

use super::rdb::{self, PayloadError};
use super::{CmdResult, errors, now_i64, parse_i64, reply_err};
use crate::coll::Whole;
use crate::db::Db;

/// A parsed DUMP or RESTORE.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DumpCmd {
    /// `DUMP key`.
    Dump { key: Bytes },
    /// `RESTORE key ttl payload [REPLACE] [ABSTTL] [IDLETIME s] [FREQ f]`.
    Restore {
        key: Bytes,
        /// Checked after the key, as Redis does.
        ttl: Bytes,
        payload: Bytes,
        replace: bool,
        absttl: bool,
    },
}

/// DUMP's reply for a stream: Keyway does not write Redis's RDB stream
/// format (so never a payload Redis would misread).
pub(crate) const STREAM_DUMP_UNSUPPORTED: &str = "ERR DUMP of a stream is not supported by Keyway";

impl DumpCmd {
    /// Parses `args` (`args[0]` is the name, arity already checked).
    pub(super) fn parse(name: &'static str, args: &[Bytes]) -> Result<Self, Frame> {
        let key = args.get(1).cloned().unwrap_or_default();
        if name == "dump" {
            return Ok(DumpCmd::Dump { key });
        }
        let (mut replace, mut absttl) = (false, false);
        let (mut idle, mut freq) = (false, false);
        let mut j = 4;
        while let Some(opt) = args.get(j) {
            let more = j + 1 < args.len();
            let is = |s: &[u8]| opt.eq_ignore_ascii_case(s);
            if is(b"replace") {
                replace = true;
            } else if is(b"absttl") {
                absttl = true;
            } else if is(b"idletime") && more && !freq {
                let v = parse_i64(&args[j + 1]).ok_or_else(|| Frame::error(errors::NOT_INTEGER))?;
                if v < 0 {
                    return Err(Frame::error("ERR Invalid IDLETIME value, must be >= 0"));
                }
                idle = true;
                j += 1;
            } else if is(b"freq") && more && !idle {
                let v = parse_i64(&args[j + 1]).ok_or_else(|| Frame::error(errors::NOT_INTEGER))?;
                if !(0..=255).contains(&v) {
                    return Err(Frame::error(
                        "ERR Invalid FREQ value, must be >= 0 and <= 255",
                    ));
                }
                freq = true;
                j += 1;
            } else {
                return Err(Frame::error(errors::SYNTAX));
            }
            j += 1;
        }
        Ok(DumpCmd::Restore {
            key,
            ttl: args.get(2).cloned().unwrap_or_default(),
            payload: args.get(3).cloned().unwrap_or_default(),
            replace,
            absttl,
        })
    }

    /// The lowercase command name.
    pub fn name(&self) -> &'static str {
        match self {
            DumpCmd::Dump { .. } => "dump",
            DumpCmd::Restore { .. } => "restore",
        }
    }

    /// The user key.
    pub fn keys(&self) -> Vec<&[u8]> {
        match self {
            DumpCmd::Dump { key } | DumpCmd::Restore { key, .. } => vec![key],
        }
    }

    /// Runs the command.
    pub(super) fn execute(&self, db: &mut Db<'_>) -> CmdResult {
        match self {
            DumpCmd::Dump { key } => Ok(match db.read_whole(key)? {
                Some(whole) if whole.contents.kind() == keyway_storage::ValueKind::Stream => {
                    Frame::error(STREAM_DUMP_UNSUPPORTED)
                }
                Some(whole) => Frame::Bulk(Bytes::from(rdb::dump(&whole.contents))),
                None => Frame::Null,
            }),
            DumpCmd::Restore {
                key,
                ttl,
                payload,
                replace,
                absttl,
            } => {
                if !replace && db.exists(key)? {
                    return Err(reply_err("BUSYKEY Target key name already exists."));
                }
                let ttl = parse_i64(ttl).ok_or_else(|| reply_err(errors::NOT_INTEGER))?;
                if ttl < 0 {
                    return Err(reply_err("ERR Invalid TTL value, must be >= 0"));
                }
                let contents = rdb::restore(payload).map_err(|e| {
                    reply_err(match e {
                        PayloadError::VersionOrChecksum => {
                            "ERR DUMP payload version or checksum are wrong"
                        }
                        PayloadError::BadFormat => "ERR Bad data format",
                    })
                })?;
                let now = now_i64(db);
                let at = match ttl {
                    0 => None,
                    t if *absttl => Some(t),
                    t => Some(t.saturating_add(now)),
                };
                if at.is_some_and(|at| at <= now) {
                    db.delete(key)?;
                    return Ok(Frame::ok());
                }
                db.write_whole(
                    key,
                    Whole {
                        contents,
                        expire_at_ms: at.map(|at| at as u64),
                    },
                )?;
                Ok(Frame::ok())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use bytes::Bytes;
    use keyway_resp::Frame;

    fn dump(t: &mut TestDb, key: &str) -> Bytes {
        match t.run(&["dump", key]) {
            Frame::Bulk(b) => b,
            other => panic!("DUMP {key}: {other:?}"),
        }
    }

    fn restore(t: &mut TestDb, key: &str, ttl: &str, payload: &Bytes, opts: &[&str]) -> Frame {
        let mut a = vec![
            Bytes::from_static(b"restore"),
            Bytes::copy_from_slice(key.as_bytes()),
            Bytes::copy_from_slice(ttl.as_bytes()),
            payload.clone(),
        ];
        a.extend(opts.iter().map(|o| Bytes::copy_from_slice(o.as_bytes())));
        t.run_args(&a)
    }

    #[test]
    fn dump_and_restore_a_string() {
        let mut t = TestDb::new();
        assert_eq!(t.run(&["dump", "nope"]), Frame::Null);
        t.run(&["set", "a", "hello"]);
        let p = dump(&mut t, "a");
        assert_eq!(
            restore(&mut t, "a", "0", &p, &[]),
            err("BUSYKEY Target key name already exists.")
        );
        assert_eq!(restore(&mut t, "b", "0", &p, &[]), ok());
        assert_eq!(t.run(&["get", "b"]), bulk("hello"));
        assert_eq!(t.run(&["ttl", "b"]), int(-1));
        t.run(&["set", "a", "other"]);
        assert_eq!(restore(&mut t, "a", "5000", &p, &["REPLACE"]), ok());
        assert_eq!(t.run(&["get", "a"]), bulk("hello"));
        assert_eq!(t.run(&["pttl", "a"]), int(5000));
        let at = (T0 + 7000).to_string();
        assert_eq!(
            restore(&mut t, "c", &at, &p, &["absttl", "idletime", "10"]),
            ok()
        );
        assert_eq!(t.run(&["pttl", "c"]), int(7000));
    }

    #[test]
    fn restore_with_a_past_deadline_creates_nothing() {
        let mut t = TestDb::new();
        t.run(&["set", "a", "v"]);
        let p = dump(&mut t, "a");
        let past = (T0 - 1).to_string();
        assert_eq!(restore(&mut t, "b", &past, &p, &["absttl"]), ok());
        assert_eq!(t.run(&["exists", "b"]), int(0));
        assert_eq!(
            restore(&mut t, "a", &past, &p, &["absttl", "replace"]),
            ok()
        );
        assert_eq!(t.run(&["exists", "a"]), int(0));
        assert!(t.stored("a").is_none());
    }

    #[test]
    fn restore_errors_in_redis_order() {
        let mut t = TestDb::new();
        t.run(&["set", "a", "v"]);
        let p = dump(&mut t, "a");
        assert_eq!(
            restore(&mut t, "b", "0", &p, &["foo"]),
            err("ERR syntax error")
        );
        assert_eq!(
            restore(&mut t, "b", "0", &p, &["idletime", "-1"]),
            err("ERR Invalid IDLETIME value, must be >= 0")
        );
        assert_eq!(
            restore(&mut t, "b", "0", &p, &["freq", "256"]),
            err("ERR Invalid FREQ value, must be >= 0 and <= 255")
        );
        assert_eq!(
            restore(&mut t, "b", "0", &p, &["freq", "1", "idletime", "1"]),
            err("ERR syntax error")
        );
        assert_eq!(
            restore(&mut t, "b", "0", &p, &["idletime"]),
            err("ERR syntax error")
        );
        // BUSYKEY before the TTL and the payload are looked at.
        let junk = Bytes::from_static(b"junk");
        assert_eq!(
            restore(&mut t, "a", "x", &junk, &[]),
            err("BUSYKEY Target key name already exists.")
        );
        assert_eq!(
            restore(&mut t, "b", "x", &junk, &[]),
            err("ERR value is not an integer or out of range")
        );
        assert_eq!(
            restore(&mut t, "b", "-1", &junk, &[]),
            err("ERR Invalid TTL value, must be >= 0")
        );
        assert_eq!(
            restore(&mut t, "b", "0", &junk, &[]),
            err("ERR DUMP payload version or checksum are wrong")
        );
        let mut bad = p.to_vec();
        bad[1] = 0x40; // a 14-bit length running past the end
        let crc_start = bad.len() - 8;
        let crc = super::super::rdb::tests_support::crc(&bad[..crc_start]);
        bad[crc_start..].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(
            restore(&mut t, "b", "0", &Bytes::from(bad), &[]),
            err("ERR Bad data format")
        );
        assert_eq!(t.run(&["exists", "b"]), int(0));
    }
}
