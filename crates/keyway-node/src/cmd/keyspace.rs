//! Keyspace commands: RENAME RENAMENX COPY TOUCH OBJECT (ENCODING FREQ
//! IDLETIME REFCOUNT HELP), SORT SORT_RO (in `sort.rs`), and the string
//! readers LCS (in `lcs.rs`) and SUBSTR.
//!
//! As in Redis 7.0 in cluster mode (`db.c`, `object.c`, `sort.c`,
//! `t_string.c`):
//! - RENAME / RENAMENX of a missing key is `ERR no such key` (also when
//!   source and destination are the same); the same existing key is `OK` /
//!   `0` without effect; the value keeps its TTL, the destination's TTL is
//!   not inherited.
//! - COPY parses `REPLACE` and `DB n` first (`DB` other than 0 is
//!   `ERR Copying to another database is not allowed in cluster mode`,
//!   outside `0..16` `ERR DB index is out of range`), then refuses the same
//!   key (`ERR source and destination objects are the same`), then replies 0
//!   for a missing source or an existing destination without REPLACE.
//! - OBJECT ENCODING reports what Redis would choose for the value as it is
//!   now (Redis's default size limits; a collection that grew and shrank
//!   again may say `listpack` where Redis still says `hashtable`); OBJECT
//!   REFCOUNT is Redis's shared-integer count (`2147483647` for the
//!   integers 0..9999) and 1 otherwise; Keyway keeps no access clock, so
//!   IDLETIME is 0; FREQ is Redis's error without an LFU policy (Keyway has
//!   no eviction policy). OBJECT without a key (HELP, an unknown subcommand,
//!   a wrong argument count) is answered by the node without routing
//!   ([`object_without_key`]).
//!
//! Every multi-key command here (RENAME, COPY, LCS, TOUCH, SORT ... STORE)
//! needs its keys in one slot; the caller replies CROSSSLOT otherwise.

use bytes::Bytes;
use keyway_resp::Frame;

use super::lcs::LcsCmd;
use super::sort::SortCmd;
use super::{CmdResult, errors, get_string, int_arg, parse_i64, reply_err};
use crate::coll::{Contents, Whole};
use crate::db::Db;

/// OBJECT's subcommands that take a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObjectSub {
    Encoding,
    Freq,
    IdleTime,
    RefCount,
}

/// A parsed keyspace command.
#[derive(Clone, Debug, PartialEq)]
pub enum KeyspaceCmd {
    /// `RENAME src dst` (`nx: false`) / `RENAMENX src dst`.
    Rename { src: Bytes, dst: Bytes, nx: bool },
    /// `COPY src dst [DB 0] [REPLACE]`.
    Copy {
        src: Bytes,
        dst: Bytes,
        replace: bool,
    },
    /// `TOUCH key...`.
    Touch { keys: Vec<Bytes> },
    /// `OBJECT ENCODING|FREQ|IDLETIME|REFCOUNT key`.
    Object { sub: ObjectSub, key: Bytes },
    /// `SUBSTR key start end` (GETRANGE's old name).
    Substr { key: Bytes, start: i64, end: i64 },
    /// `LCS a b [LEN] [IDX] [MINMATCHLEN n] [WITHMATCHLEN]`.
    Lcs(LcsCmd),
    /// `SORT` / `SORT_RO`.
    Sort(SortCmd),
}

/// Redis's `OBJECT HELP` text.
const OBJECT_HELP: &[&str] = &[
    "OBJECT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "ENCODING <key>",
    "    Return the kind of internal representation used in order to store the value",
    "    associated with a <key>.",
    "FREQ <key>",
    "    Return the access frequency index of the <key>. The returned integer is",
    "    proportional to the logarithm of the recent access frequency of the key.",
    "IDLETIME <key>",
    "    Return the idle time of the <key>, that is the approximated number of",
    "    seconds elapsed since the last access to the key.",
    "REFCOUNT <key>",
    "    Return the number of references of the value associated with the specified",
    "    <key>.",
    "HELP",
    "    Prints this help.",
];

/// Redis's `OBJ_SHARED_REFCOUNT`: what OBJECT REFCOUNT says of a shared integer.
const SHARED_REFCOUNT: i64 = i32::MAX as i64;
/// Redis shares the integers `0..OBJ_SHARED_INTEGERS`.
const SHARED_INTEGERS: i64 = 10_000;

fn object_sub(name: &[u8]) -> Option<ObjectSub> {
    [
        (&b"encoding"[..], ObjectSub::Encoding),
        (b"freq", ObjectSub::Freq),
        (b"idletime", ObjectSub::IdleTime),
        (b"refcount", ObjectSub::RefCount),
    ]
    .into_iter()
    .find(|(n, _)| name.eq_ignore_ascii_case(n))
    .map(|(_, s)| s)
}

/// The reply to an `OBJECT` request that names no key (`OBJECT HELP`, an
/// unknown subcommand, a wrong argument count), answered without routing;
/// `None` for `OBJECT <sub> key`, a data command ([`super::parse`]).
pub fn object_without_key(args: &[Bytes]) -> Option<Frame> {
    let Some(sub) = args.get(1) else {
        return Some(super::table::arity_error("object"));
    };
    if sub.eq_ignore_ascii_case(b"help") {
        if args.len() != 2 {
            return Some(super::table::arity_error("object|help"));
        }
        return Some(Frame::Array(
            OBJECT_HELP
                .iter()
                .map(|l| Frame::Simple((*l).into()))
                .collect(),
        ));
    }
    if object_sub(sub).is_some() {
        return match args.len() {
            3 => None,
            _ => Some(Frame::Error(format!(
                "ERR wrong number of arguments for 'object|{}' command",
                String::from_utf8_lossy(sub).to_ascii_lowercase()
            ))),
        };
    }
    Some(Frame::Error(format!(
        "ERR unknown subcommand '{}'. Try OBJECT HELP.",
        String::from_utf8_lossy(sub)
    )))
}

/// COPY's options, as `copyCommand` parses them (before reading any key).
fn copy_options(opts: &[Bytes]) -> Result<bool, Frame> {
    let mut replace = false;
    let mut j = 0;
    while let Some(opt) = opts.get(j) {
        if opt.eq_ignore_ascii_case(b"replace") {
            replace = true;
        } else if opt.eq_ignore_ascii_case(b"db") && j + 1 < opts.len() {
            let db = parse_i64(&opts[j + 1]).ok_or_else(|| Frame::error(errors::NOT_INTEGER))?;
            if i32::try_from(db).is_err() {
                return Err(Frame::error(
                    "ERR value is out of range, value must between -2147483648 and 2147483647",
                ));
            }
            // Redis's default `databases 16`; only db 0 exists in cluster mode.
            if !(0..16).contains(&db) {
                return Err(Frame::error("ERR DB index is out of range"));
            }
            if db != 0 {
                return Err(Frame::error(
                    "ERR Copying to another database is not allowed in cluster mode",
                ));
            }
            j += 1;
        } else {
            return Err(Frame::error(errors::SYNTAX));
        }
        j += 1;
    }
    Ok(replace)
}

impl KeyspaceCmd {
    /// Parses `args` (`args[0]` is the name, arity already checked).
    pub(super) fn parse(name: &'static str, args: &[Bytes]) -> Result<Self, Frame> {
        let arg = |i: usize| args.get(i).cloned().unwrap_or_default();
        Ok(match name {
            "rename" | "renamenx" => KeyspaceCmd::Rename {
                src: arg(1),
                dst: arg(2),
                nx: name == "renamenx",
            },
            "copy" => {
                let replace = copy_options(args.get(3..).unwrap_or_default())?;
                if args[1] == args[2] {
                    return Err(Frame::error(
                        "ERR source and destination objects are the same",
                    ));
                }
                KeyspaceCmd::Copy {
                    src: arg(1),
                    dst: arg(2),
                    replace,
                }
            }
            "touch" => KeyspaceCmd::Touch {
                keys: args.get(1..).unwrap_or_default().to_vec(),
            },
            "object" => match (args.get(1).and_then(|s| object_sub(s)), args.len()) {
                (Some(sub), 3) => KeyspaceCmd::Object { sub, key: arg(2) },
                _ => {
                    return Err(
                        object_without_key(args).unwrap_or_else(|| Frame::error(errors::SYNTAX))
                    );
                }
            },
            "substr" => KeyspaceCmd::Substr {
                key: arg(1),
                start: int_arg(&arg(2))?,
                end: int_arg(&arg(3))?,
            },
            "lcs" => KeyspaceCmd::Lcs(LcsCmd::parse(args)),
            "sort" | "sort_ro" => KeyspaceCmd::Sort(SortCmd::parse(name, args)?),
            other => return Err(Frame::Error(format!("ERR unknown command '{other}'"))),
        })
    }

    /// The lowercase command name.
    pub fn name(&self) -> &'static str {
        match self {
            KeyspaceCmd::Rename { nx: false, .. } => "rename",
            KeyspaceCmd::Rename { nx: true, .. } => "renamenx",
            KeyspaceCmd::Copy { .. } => "copy",
            KeyspaceCmd::Touch { .. } => "touch",
            KeyspaceCmd::Object { .. } => "object",
            KeyspaceCmd::Substr { .. } => "substr",
            KeyspaceCmd::Lcs(_) => "lcs",
            KeyspaceCmd::Sort(c) => c.name(),
        }
    }

    /// The user keys, in argument order.
    pub fn keys(&self) -> Vec<&[u8]> {
        match self {
            KeyspaceCmd::Rename { src, dst, .. } | KeyspaceCmd::Copy { src, dst, .. } => {
                vec![src, dst]
            }
            KeyspaceCmd::Touch { keys } => keys.iter().map(|k| &k[..]).collect(),
            KeyspaceCmd::Object { key, .. } | KeyspaceCmd::Substr { key, .. } => vec![key],
            KeyspaceCmd::Lcs(c) => c.keys(),
            KeyspaceCmd::Sort(c) => c.keys(),
        }
    }

    /// Whether the command may create a key.
    pub(super) fn creates_keys(&self) -> bool {
        match self {
            KeyspaceCmd::Rename { .. } | KeyspaceCmd::Copy { .. } => true,
            KeyspaceCmd::Sort(c) => c.stores(),
            _ => false,
        }
    }

    /// Runs the command.
    pub(super) fn execute(&self, db: &mut Db<'_>) -> CmdResult {
        match self {
            KeyspaceCmd::Rename { src, dst, nx } => rename(db, src, dst, *nx),
            KeyspaceCmd::Copy { src, dst, replace } => {
                let Some(whole) = db.read_whole(src)? else {
                    return Ok(Frame::Integer(0));
                };
                if db.exists(dst)? && !replace {
                    return Ok(Frame::Integer(0));
                }
                db.write_whole(dst, whole)?;
                Ok(Frame::Integer(1))
            }
            KeyspaceCmd::Touch { keys } => {
                let mut n = 0;
                for key in keys {
                    if db.exists(key)? {
                        n += 1;
                    }
                }
                Ok(Frame::Integer(n))
            }
            KeyspaceCmd::Object { sub, key } => object(db, *sub, key),
            KeyspaceCmd::Substr { key, start, end } => {
                let data = get_string(db, key)?.map(|v| v.data).unwrap_or_default();
                Ok(Frame::Bulk(super::string::get_range(&data, *start, *end)))
            }
            KeyspaceCmd::Lcs(c) => c.execute(db),
            KeyspaceCmd::Sort(c) => c.execute(db),
        }
    }
}

fn rename(db: &mut Db<'_>, src: &[u8], dst: &[u8], nx: bool) -> CmdResult {
    let Some(whole) = db.read_whole(src)? else {
        return Err(reply_err("ERR no such key"));
    };
    if src == dst {
        return Ok(if nx { Frame::Integer(0) } else { Frame::ok() });
    }
    if nx && db.exists(dst)? {
        return Ok(Frame::Integer(0));
    }
    db.write_whole(dst, whole)?;
    db.delete(src)?;
    Ok(if nx { Frame::Integer(1) } else { Frame::ok() })
}

fn object(db: &mut Db<'_>, sub: ObjectSub, key: &[u8]) -> CmdResult {
    if sub == ObjectSub::Freq {
        // Redis checks the key first, then the policy.
        if !db.exists(key)? {
            return Ok(Frame::Null);
        }
        return Err(reply_err(
            "ERR An LFU maxmemory policy is not selected, access frequency not tracked. Please note that when switching between policies at runtime LRU and LFU data will take some time to adjust.",
        ));
    }
    let Some(whole) = db.read_whole(key)? else {
        return Ok(Frame::Null);
    };
    Ok(match sub {
        ObjectSub::Encoding => Frame::bulk(encoding(&whole)),
        ObjectSub::RefCount => Frame::Integer(match &whole.contents {
            Contents::String(s)
                if parse_i64(s).is_some_and(|n| (0..SHARED_INTEGERS).contains(&n)) =>
            {
                SHARED_REFCOUNT
            }
            _ => 1,
        }),
        ObjectSub::IdleTime => Frame::Integer(0),
        ObjectSub::Freq => unreachable!("handled above"),
    })
}

/// Redis 7.0's defaults: `hash-max-listpack-entries 128`,
/// `hash-max-listpack-value 64`, `set-max-intset-entries 512`,
/// `zset-max-listpack-entries 128`, `zset-max-listpack-value 64`; strings up
/// to 44 bytes are `embstr` (`OBJ_ENCODING_EMBSTR_SIZE_LIMIT`).
pub(crate) mod encoding_limits {
    pub const HASH_LISTPACK_ENTRIES: usize = 128;
    pub const HASH_LISTPACK_VALUE: usize = 64;
    pub const SET_INTSET_ENTRIES: usize = 512;
    pub const ZSET_LISTPACK_ENTRIES: usize = 128;
    pub const ZSET_LISTPACK_VALUE: usize = 64;
    pub const EMBSTR_SIZE_LIMIT: usize = 44;
}

/// The encoding Redis would give `whole` (see the module docs).
pub(crate) fn encoding(whole: &Whole) -> &'static str {
    use encoding_limits::*;
    match &whole.contents {
        Contents::String(s) if s.len() <= 20 && parse_i64(s).is_some() => "int",
        Contents::String(s) if s.len() <= EMBSTR_SIZE_LIMIT => "embstr",
        Contents::String(_) => "raw",
        Contents::List(_) => "quicklist",
        Contents::Stream(..) => "stream",
        Contents::Set(members) => {
            if members.len() <= SET_INTSET_ENTRIES && members.iter().all(|m| parse_i64(m).is_some())
            {
                "intset"
            } else {
                "hashtable"
            }
        }
        Contents::Hash(pairs) => {
            if pairs.len() <= HASH_LISTPACK_ENTRIES
                && pairs
                    .iter()
                    .all(|(f, v)| f.len() <= HASH_LISTPACK_VALUE && v.len() <= HASH_LISTPACK_VALUE)
            {
                "listpack"
            } else {
                "hashtable"
            }
        }
        Contents::ZSet(members) => {
            if members.len() <= ZSET_LISTPACK_ENTRIES
                && members.iter().all(|(m, _)| m.len() <= ZSET_LISTPACK_VALUE)
            {
                "listpack"
            } else {
                "skiplist"
            }
        }
    }
}

#[cfg(test)]
#[path = "keyspace_tests.rs"]
mod tests;
