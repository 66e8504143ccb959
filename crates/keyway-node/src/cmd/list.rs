//! List commands: LPUSH RPUSH LPUSHX RPUSHX LPOP RPOP LLEN LINDEX LSET LRANGE
//! LTRIM LREM LINSERT LPOS LMOVE RPOPLPUSH LMPOP, and the blocking BLPOP BRPOP
//! BLMOVE BRPOPLPUSH BLMPOP.
//!
//! Arguments Redis 7.0 checks before it looks the key up are checked by
//! `parse` (a failure becomes [`super::Command::Invalid`], replied after
//! routing); the ones it checks after the type check (LINDEX's and LSET's
//! index) are checked by `execute`, so `LINDEX missing x` is a nil as in Redis.
//!
//! `execute` of a blocking command is its non-blocking form (what Redis does
//! inside MULTI): it pops if it can, else replies nil. Blocking itself is
//! [`crate::blocking`]'s: it re-runs the command when a key it waits on is
//! pushed to. Storage is in `list_store.rs`.

use bytes::Bytes;
use keyway_resp::Frame;
use keyway_storage::ValueKind;

use super::list_store as store;
use super::{CmdError, CmdResult, errors, parse_i64, reply_err};
use crate::db::Db;

/// A parsed list command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListCmd {
    /// LPUSH RPUSH LPUSHX RPUSHX.
    Push {
        name: &'static str,
        key: Bytes,
        left: bool,
        /// The X forms: only push to an existing list.
        existing: bool,
        elements: Vec<Bytes>,
    },
    /// LPOP RPOP (`count` given: an array reply).
    Pop {
        name: &'static str,
        key: Bytes,
        left: bool,
        count: Option<u64>,
    },
    Len {
        key: Bytes,
    },
    /// The index is checked after the type, as Redis does.
    Index {
        key: Bytes,
        index: Bytes,
    },
    Set {
        key: Bytes,
        index: Bytes,
        element: Bytes,
    },
    Range {
        key: Bytes,
        start: i64,
        end: i64,
    },
    Trim {
        key: Bytes,
        start: i64,
        end: i64,
    },
    Rem {
        key: Bytes,
        count: i64,
        element: Bytes,
    },
    Insert {
        key: Bytes,
        after: bool,
        pivot: Bytes,
        element: Bytes,
    },
    Pos {
        key: Bytes,
        element: Bytes,
        rank: i64,
        /// `None`: no COUNT (a single reply); `Some(0)`: all matches.
        count: Option<u64>,
        /// 0 = the whole list.
        maxlen: u64,
    },
    /// LMOVE RPOPLPUSH BLMOVE BRPOPLPUSH.
    Move {
        name: &'static str,
        src: Bytes,
        dst: Bytes,
        from_left: bool,
        to_left: bool,
        /// Blocking forms: milliseconds to wait, 0 = forever.
        timeout_ms: Option<u64>,
    },
    /// BLPOP BRPOP (`count: None`, `[key, element]` reply) and LMPOP BLMPOP
    /// (`[key, [elements]]`).
    MPop {
        name: &'static str,
        keys: Vec<Bytes>,
        left: bool,
        count: Option<u64>,
        timeout_ms: Option<u64>,
    },
}

fn err(msg: &str) -> Frame {
    Frame::Error(msg.to_owned())
}

/// Redis's `getRangeLongFromObjectOrReply`: an integer in `[min, max]`;
/// `msg` (without `ERR `) replaces both the parse and the range error.
pub(super) fn range_long(arg: &[u8], min: i64, max: i64, msg: Option<&str>) -> Result<i64, Frame> {
    let with = |m: &str| Frame::Error(format!("ERR {m}"));
    // `getPositiveLongFromObjectOrReply` passes its default as the message.
    let msg = match msg {
        None if min == 0 && max == i64::MAX => Some("value is out of range, must be positive"),
        m => m,
    };
    let v = match parse_i64(arg) {
        Some(v) => v,
        None => return Err(msg.map_or_else(|| err(errors::NOT_INTEGER), with)),
    };
    if v < min || v > max {
        return Err(match msg {
            Some(m) => with(m),
            None => with(&format!(
                "value is out of range, must be between {min} and {max}"
            )),
        });
    }
    Ok(v)
}

/// `LEFT` / `RIGHT` (any case): `true` for left.
fn side(arg: &[u8]) -> Result<bool, Frame> {
    if arg.eq_ignore_ascii_case(b"left") {
        Ok(true)
    } else if arg.eq_ignore_ascii_case(b"right") {
        Ok(false)
    } else {
        Err(err(errors::SYNTAX))
    }
}

fn int(arg: &[u8]) -> Result<i64, Frame> {
    parse_i64(arg).ok_or_else(|| err(errors::NOT_INTEGER))
}

/// The keys of `LMPOP numkeys key...` style arguments starting at
/// `numkeys_at`, with the side and COUNT after them.
fn parse_mpop(args: &[Bytes], numkeys_at: usize) -> Result<(Vec<Bytes>, bool, u64), Frame> {
    let arg = |i: usize| args.get(i).map(|b| &b[..]).unwrap_or_default();
    let numkeys = range_long(
        arg(numkeys_at),
        1,
        i64::MAX,
        Some("numkeys should be greater than 0"),
    )? as u64;
    let where_at = (numkeys_at as u64)
        .saturating_add(numkeys)
        .saturating_add(1);
    if where_at >= args.len() as u64 {
        return Err(err(errors::SYNTAX));
    }
    let where_at = where_at as usize;
    let left = side(&args[where_at])?;
    let mut count = None;
    let mut j = where_at + 1;
    while j < args.len() {
        let more = args.len() - 1 - j;
        if count.is_none() && args[j].eq_ignore_ascii_case(b"count") && more > 0 {
            j += 1;
            count = Some(range_long(
                &args[j],
                1,
                i64::MAX,
                Some("count should be greater than 0"),
            )? as u64);
        } else {
            return Err(err(errors::SYNTAX));
        }
        j += 1;
    }
    let keys = args[numkeys_at + 1..where_at].to_vec();
    Ok((keys, left, count.unwrap_or(1)))
}

impl ListCmd {
    /// Parses `args` (`args[0]` is the name, arity already checked).
    pub(super) fn parse(name: &'static str, args: &[Bytes]) -> Result<Self, Frame> {
        let a = |i: usize| args.get(i).cloned().unwrap_or_default();
        let key = a(1);
        Ok(match name {
            "lpush" | "rpush" | "lpushx" | "rpushx" => ListCmd::Push {
                name,
                key,
                left: name.starts_with('l'),
                existing: name.ends_with('x'),
                elements: args[2..].to_vec(),
            },
            "lpop" | "rpop" => {
                if args.len() > 3 {
                    return Err(super::table::arity_error(name));
                }
                let count = match args.get(2) {
                    Some(c) => Some(range_long(c, 0, i64::MAX, None)? as u64),
                    None => None,
                };
                ListCmd::Pop {
                    name,
                    key,
                    left: name == "lpop",
                    count,
                }
            }
            "llen" => ListCmd::Len { key },
            "lindex" => ListCmd::Index { key, index: a(2) },
            "lset" => ListCmd::Set {
                key,
                index: a(2),
                element: a(3),
            },
            "lrange" | "ltrim" => {
                let (start, end) = (int(&a(2))?, int(&a(3))?);
                if name == "lrange" {
                    ListCmd::Range { key, start, end }
                } else {
                    ListCmd::Trim { key, start, end }
                }
            }
            "lrem" => ListCmd::Rem {
                key,
                count: int(&a(2))?,
                element: a(3),
            },
            "linsert" => {
                let after = if a(2).eq_ignore_ascii_case(b"after") {
                    true
                } else if a(2).eq_ignore_ascii_case(b"before") {
                    false
                } else {
                    return Err(err(errors::SYNTAX));
                };
                ListCmd::Insert {
                    key,
                    after,
                    pivot: a(3),
                    element: a(4),
                }
            }
            "lpos" => Self::parse_lpos(args)?,
            "lmove" | "blmove" => {
                let from_left = side(&a(3))?;
                let to_left = side(&a(4))?;
                let timeout_ms = match name {
                    "blmove" => Some(crate::blocking::parse_timeout(&a(5))?),
                    _ => None,
                };
                ListCmd::Move {
                    name,
                    src: key,
                    dst: a(2),
                    from_left,
                    to_left,
                    timeout_ms,
                }
            }
            "rpoplpush" | "brpoplpush" => ListCmd::Move {
                name,
                src: key,
                dst: a(2),
                from_left: false,
                to_left: true,
                timeout_ms: match name {
                    "brpoplpush" => Some(crate::blocking::parse_timeout(&a(3))?),
                    _ => None,
                },
            },
            "blpop" | "brpop" => {
                let timeout_ms = crate::blocking::parse_timeout(&args[args.len() - 1])?;
                ListCmd::MPop {
                    name,
                    keys: args[1..args.len() - 1].to_vec(),
                    left: name == "blpop",
                    count: None,
                    timeout_ms: Some(timeout_ms),
                }
            }
            "lmpop" => {
                let (keys, left, count) = parse_mpop(args, 1)?;
                ListCmd::MPop {
                    name,
                    keys,
                    left,
                    count: Some(count),
                    timeout_ms: None,
                }
            }
            "blmpop" => {
                let (keys, left, count) = parse_mpop(args, 2)?;
                let timeout_ms = crate::blocking::parse_timeout(&a(1))?;
                ListCmd::MPop {
                    name,
                    keys,
                    left,
                    count: Some(count),
                    timeout_ms: Some(timeout_ms),
                }
            }
            other => return Err(Frame::Error(format!("ERR unknown command '{other}'"))),
        })
    }

    fn parse_lpos(args: &[Bytes]) -> Result<Self, Frame> {
        let (mut rank, mut count, mut maxlen) = (1i64, None, 0u64);
        let mut j = 3;
        while j < args.len() {
            let more = args.len() - 1 - j;
            let opt = &args[j];
            if opt.eq_ignore_ascii_case(b"rank") && more > 0 {
                j += 1;
                rank = int(&args[j])?;
                // Redis 7.0 refuses only 0 (LONG_MIN wraps, see `lpos`).
                if rank == 0 {
                    return Err(err(
                        "ERR RANK can't be zero: use 1 to start from the first match, 2 from the second ... or use negative to start from the end of the list",
                    ));
                }
            } else if opt.eq_ignore_ascii_case(b"count") && more > 0 {
                j += 1;
                count = Some(
                    range_long(&args[j], 0, i64::MAX, Some("COUNT can't be negative"))? as u64,
                );
            } else if opt.eq_ignore_ascii_case(b"maxlen") && more > 0 {
                j += 1;
                maxlen =
                    range_long(&args[j], 0, i64::MAX, Some("MAXLEN can't be negative"))? as u64;
            } else {
                return Err(err(errors::SYNTAX));
            }
            j += 1;
        }
        Ok(ListCmd::Pos {
            key: args[1].clone(),
            element: args[2].clone(),
            rank,
            count,
            maxlen,
        })
    }

    /// The lowercase command name.
    pub fn name(&self) -> &'static str {
        match self {
            ListCmd::Push { name, .. }
            | ListCmd::Pop { name, .. }
            | ListCmd::Move { name, .. }
            | ListCmd::MPop { name, .. } => name,
            ListCmd::Len { .. } => "llen",
            ListCmd::Index { .. } => "lindex",
            ListCmd::Set { .. } => "lset",
            ListCmd::Range { .. } => "lrange",
            ListCmd::Trim { .. } => "ltrim",
            ListCmd::Rem { .. } => "lrem",
            ListCmd::Insert { .. } => "linsert",
            ListCmd::Pos { .. } => "lpos",
        }
    }

    /// The user keys, in argument order.
    pub fn keys(&self) -> Vec<&[u8]> {
        match self {
            ListCmd::Push { key, .. }
            | ListCmd::Pop { key, .. }
            | ListCmd::Len { key }
            | ListCmd::Index { key, .. }
            | ListCmd::Set { key, .. }
            | ListCmd::Range { key, .. }
            | ListCmd::Trim { key, .. }
            | ListCmd::Rem { key, .. }
            | ListCmd::Insert { key, .. }
            | ListCmd::Pos { key, .. } => vec![key],
            ListCmd::Move { src, dst, .. } => vec![src, dst],
            ListCmd::MPop { keys, .. } => keys.iter().map(|k| &k[..]).collect(),
        }
    }

    /// Whether the command may create a key.
    pub(super) fn creates_keys(&self) -> bool {
        matches!(
            self,
            ListCmd::Push {
                existing: false,
                ..
            } | ListCmd::Move { .. }
        )
    }

    /// A blocking command's timeout (milliseconds, 0 = forever).
    pub fn blocking_timeout_ms(&self) -> Option<u64> {
        match self {
            ListCmd::Move { timeout_ms, .. } | ListCmd::MPop { timeout_ms, .. } => *timeout_ms,
            _ => None,
        }
    }

    /// Runs the command (a blocking command in its non-blocking form).
    pub(super) fn execute(&self, db: &mut Db<'_>) -> CmdResult {
        match self {
            ListCmd::Push {
                key,
                left,
                existing,
                elements,
                ..
            } => {
                let mut meta = match store::load(db, key)? {
                    Some(m) => m,
                    None if *existing => return Ok(Frame::Integer(0)),
                    None => db.new_meta(ValueKind::List),
                };
                for e in elements {
                    store::push(db, key, &mut meta, *left, e.clone())?;
                }
                db.put_meta(key, &meta)?;
                Ok(Frame::Integer(meta.size as i64))
            }
            ListCmd::Pop {
                key, left, count, ..
            } => {
                let Some(mut meta) = store::load(db, key)? else {
                    return Ok(match count {
                        Some(_) => Frame::NullArray,
                        None => Frame::Null,
                    });
                };
                let reply = match count {
                    None => Frame::Bulk(store::pop(db, key, &mut meta, *left)?),
                    Some(n) => {
                        let n = (*n).min(meta.size);
                        let mut out = Vec::with_capacity(n as usize);
                        for _ in 0..n {
                            out.push(Frame::Bulk(store::pop(db, key, &mut meta, *left)?));
                        }
                        Frame::Array(out)
                    }
                };
                db.put_meta(key, &meta)?;
                Ok(reply)
            }
            ListCmd::Len { key } => Ok(Frame::Integer(
                store::load(db, key)?.map_or(0, |m| m.size as i64),
            )),
            ListCmd::Index { key, index } => {
                let Some(meta) = store::load(db, key)? else {
                    return Ok(Frame::Null);
                };
                let index = int(index).map_err(CmdError::Reply)?;
                match position(index, meta.size) {
                    Some(pos) => Ok(Frame::Bulk(store::get(db, key, &meta, pos)?)),
                    None => Ok(Frame::Null),
                }
            }
            ListCmd::Set {
                key,
                index,
                element,
            } => {
                let Some(meta) = store::load(db, key)? else {
                    return Err(reply_err("ERR no such key"));
                };
                let index = int(index).map_err(CmdError::Reply)?;
                let Some(pos) = position(index, meta.size) else {
                    return Err(reply_err("ERR index out of range"));
                };
                store::set(db, key, &meta, pos, element.clone())?;
                Ok(Frame::ok())
            }
            ListCmd::Range { key, start, end } => {
                let Some(meta) = store::load(db, key)? else {
                    return Ok(Frame::Array(Vec::new()));
                };
                let (from, to) = window(*start, *end, meta.size);
                let items = store::range(db, key, &meta, from, to)?;
                Ok(Frame::Array(items.into_iter().map(Frame::Bulk).collect()))
            }
            ListCmd::Trim { key, start, end } => {
                let Some(mut meta) = store::load(db, key)? else {
                    return Ok(Frame::ok());
                };
                let (from, to) = window(*start, *end, meta.size);
                let (front, back) = if from == to {
                    (meta.size, 0)
                } else {
                    (from, meta.size - to)
                };
                store::trim(db, key, &mut meta, front, back)?;
                db.put_meta(key, &meta)?;
                Ok(Frame::ok())
            }
            ListCmd::Rem {
                key,
                count,
                element,
            } => {
                let Some(mut meta) = store::load(db, key)? else {
                    return Ok(Frame::Integer(0));
                };
                let old = store::all(db, key, &meta)?;
                let limit = if *count == 0 {
                    u64::MAX
                } else {
                    count.unsigned_abs()
                };
                let mut keep = vec![true; old.len()];
                let mut removed = 0u64;
                let order: Box<dyn Iterator<Item = usize>> = if *count < 0 {
                    Box::new((0..old.len()).rev())
                } else {
                    Box::new(0..old.len())
                };
                for i in order {
                    if removed == limit {
                        break;
                    }
                    if old[i] == *element {
                        keep[i] = false;
                        removed += 1;
                    }
                }
                if removed > 0 {
                    let new = old
                        .iter()
                        .zip(&keep)
                        .filter(|(_, k)| **k)
                        .map(|(e, _)| e.clone())
                        .collect();
                    store::replace(db, key, &mut meta, &old, new)?;
                    db.put_meta(key, &meta)?;
                }
                Ok(Frame::Integer(removed as i64))
            }
            ListCmd::Insert {
                key,
                after,
                pivot,
                element,
            } => {
                let Some(mut meta) = store::load(db, key)? else {
                    return Ok(Frame::Integer(0));
                };
                let mut found = None;
                store::scan(db, key, &meta, true, |pos, e| {
                    if e == pivot {
                        found = Some(pos);
                    }
                    found.is_none()
                })?;
                let Some(pos) = found else {
                    return Ok(Frame::Integer(-1));
                };
                let at = if *after { pos + 1 } else { pos };
                if at == 0 || at == meta.size {
                    store::push(db, key, &mut meta, at == 0, element.clone())?;
                } else {
                    let old = store::all(db, key, &meta)?;
                    let mut new = old.clone();
                    new.insert(at as usize, element.clone());
                    store::replace(db, key, &mut meta, &old, new)?;
                }
                db.put_meta(key, &meta)?;
                Ok(Frame::Integer(meta.size as i64))
            }
            ListCmd::Pos {
                key,
                element,
                rank,
                count,
                maxlen,
            } => lpos(db, key, element, *rank, *count, *maxlen),
            ListCmd::Move {
                src,
                dst,
                from_left,
                to_left,
                ..
            } => lmove(db, src, dst, *from_left, *to_left),
            ListCmd::MPop {
                keys, left, count, ..
            } => {
                for key in keys {
                    let Some(mut meta) = store::load(db, key)? else {
                        continue;
                    };
                    let reply = match count {
                        None => Frame::Array(vec![
                            Frame::Bulk(key.clone()),
                            Frame::Bulk(store::pop(db, key, &mut meta, *left)?),
                        ]),
                        Some(n) => {
                            let n = (*n).min(meta.size);
                            let mut out = Vec::with_capacity(n as usize);
                            for _ in 0..n {
                                out.push(Frame::Bulk(store::pop(db, key, &mut meta, *left)?));
                            }
                            Frame::Array(vec![Frame::Bulk(key.clone()), Frame::Array(out)])
                        }
                    };
                    db.put_meta(key, &meta)?;
                    return Ok(reply);
                }
                Ok(Frame::NullArray)
            }
        }
    }
}

/// The position a possibly negative `index` names in a list of `len`.
fn position(index: i64, len: u64) -> Option<u64> {
    let len = i64::try_from(len).unwrap_or(i64::MAX);
    let i = if index < 0 {
        index.checked_add(len)?
    } else {
        index
    };
    (0..len).contains(&i).then_some(i as u64)
}

/// Redis's start/end normalisation (LRANGE, LTRIM): the positions
/// `from..to` (empty when `from == to`).
fn window(start: i64, end: i64, len: u64) -> (u64, u64) {
    let llen = i64::try_from(len).unwrap_or(i64::MAX);
    let mut start = if start < 0 {
        start.saturating_add(llen)
    } else {
        start
    };
    let mut end = if end < 0 {
        end.saturating_add(llen)
    } else {
        end
    };
    if start < 0 {
        start = 0;
    }
    if start > end || start >= llen {
        return (0, 0);
    }
    if end >= llen {
        end = llen - 1;
    }
    (start as u64, end as u64 + 1)
}

fn lpos(
    db: &mut Db<'_>,
    key: &[u8],
    element: &[u8],
    rank: i64,
    count: Option<u64>,
    maxlen: u64,
) -> CmdResult {
    let Some(meta) = store::load(db, key)? else {
        return Ok(match count {
            Some(_) => Frame::Array(Vec::new()),
            None => Frame::Null,
        });
    };
    // Redis's `long` arithmetic, wrapping: `-LONG_MIN` stays LONG_MIN, so
    // that rank matches from the first match on, and its COUNT never ends.
    let forward = rank > 0;
    let rank = if rank < 0 { rank.wrapping_neg() } else { rank };
    let count = count.map(|c| c as i64);
    let (mut seen, mut matches) = (0u64, 0i64);
    let mut out = Vec::new();
    store::scan(db, key, &meta, forward, |pos, e| {
        if maxlen != 0 && seen >= maxlen {
            return false;
        }
        seen += 1;
        if e == element {
            matches += 1;
            if matches >= rank {
                out.push(Frame::Integer(pos as i64));
                return match count {
                    None => false,
                    Some(0) => true,
                    Some(c) => matches.wrapping_sub(rank).wrapping_add(1) < c,
                };
            }
        }
        true
    })?;
    Ok(match count {
        Some(_) => Frame::Array(out),
        None => out.pop().unwrap_or(Frame::Null),
    })
}

fn lmove(db: &mut Db<'_>, src: &[u8], dst: &[u8], from_left: bool, to_left: bool) -> CmdResult {
    let Some(mut sm) = store::load(db, src)? else {
        return Ok(Frame::Null);
    };
    if src == dst {
        let v = store::pop(db, src, &mut sm, from_left)?;
        store::push(db, src, &mut sm, to_left, v.clone())?;
        db.put_meta(src, &sm)?;
        return Ok(Frame::Bulk(v));
    }
    let dm = store::load(db, dst)?;
    let v = store::pop(db, src, &mut sm, from_left)?;
    db.put_meta(src, &sm)?;
    let mut dm = dm.unwrap_or_else(|| db.new_meta(ValueKind::List));
    store::push(db, dst, &mut dm, to_left, v.clone())?;
    db.put_meta(dst, &dm)?;
    Ok(Frame::Bulk(v))
}

#[cfg(test)]
#[path = "list_tests.rs"]
mod tests;
