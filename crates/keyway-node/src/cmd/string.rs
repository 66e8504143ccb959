//! String commands: GET SET SETNX SETEX PSETEX GETSET GETDEL GETEX MGET MSET
//! MSETNX APPEND STRLEN GETRANGE SETRANGE.
//!
//! Semantics follow Redis 7.0's `t_string.c`: SET's option grammar and
//! conflict rules (`parseExtendedStringArgumentsOrReply`), expire validation
//! (`getExpireMillisecondsOrReply`: non-positive or overflowing times are
//! `ERR invalid expire time in '<cmd>' command`), GETRANGE's index clamping,
//! SETRANGE's zero padding, and the `proto-max-bulk-len` check on APPEND and
//! SETRANGE results. Plain writes (SET, GETSET, MSET, ...) drop the TTL;
//! in-place changes (APPEND, SETRANGE) keep it. An absolute expire time that
//! has already passed (SET/GETEX with EXAT/PXAT) deletes the key.

use bytes::{Bytes, BytesMut};
use keyway_resp::Frame;
use keyway_storage::Value;

use super::{CmdError, CmdResult, errors, get_string, int_arg, invalid_expire, now_i64, reply_err};
use crate::db::Db;

/// How an expire argument is interpreted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpireUnit {
    /// `EX seconds` (relative).
    Ex,
    /// `PX milliseconds` (relative).
    Px,
    /// `EXAT unix-seconds`.
    ExAt,
    /// `PXAT unix-milliseconds`.
    PxAt,
}

/// An unvalidated expire argument; validated when the command runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpireArg {
    unit: ExpireUnit,
    value: Bytes,
}

impl ExpireArg {
    /// Redis's `getExpireMillisecondsOrReply`: the absolute expire time in ms.
    fn resolve(&self, now: i64, cmd: &str) -> Result<i64, CmdError> {
        let mut ms = int_arg(&self.value).map_err(CmdError::Reply)?;
        let seconds = matches!(self.unit, ExpireUnit::Ex | ExpireUnit::ExAt);
        if ms <= 0 || (seconds && ms > i64::MAX / 1000) {
            return Err(invalid_expire(cmd));
        }
        if seconds {
            ms *= 1000;
        }
        if matches!(self.unit, ExpireUnit::Ex | ExpireUnit::Px) {
            ms = ms.checked_add(now).ok_or_else(|| invalid_expire(cmd))?;
        }
        Ok(ms)
    }

    fn is_absolute(&self) -> bool {
        matches!(self.unit, ExpireUnit::ExAt | ExpireUnit::PxAt)
    }
}

/// SET's NX / XX.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetCondition {
    /// Only if the key does not exist.
    Nx,
    /// Only if the key exists.
    Xx,
}

/// Parsed `SET key value [NX|XX] [GET] [EX|PX|EXAT|PXAT t|KEEPTTL]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetArgs {
    key: Bytes,
    value: Bytes,
    condition: Option<SetCondition>,
    get: bool,
    keep_ttl: bool,
    expire: Option<ExpireArg>,
}

/// What GETEX does to the TTL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GetExAction {
    /// Nothing (plain GET).
    Keep,
    /// PERSIST.
    Persist,
    /// EX / PX / EXAT / PXAT.
    Expire(ExpireArg),
}

/// A parsed string command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StringCmd {
    /// `GET key`.
    Get { key: Bytes },
    /// `SET key value [options]`.
    Set(SetArgs),
    /// `SETNX key value`.
    SetNx { key: Bytes, value: Bytes },
    /// `SETEX key seconds value` / `PSETEX key ms value`.
    SetEx {
        name: &'static str,
        key: Bytes,
        expire: ExpireArg,
        value: Bytes,
    },
    /// `GETSET key value`.
    GetSet { key: Bytes, value: Bytes },
    /// `GETDEL key`.
    GetDel { key: Bytes },
    /// `GETEX key [EX|PX|EXAT|PXAT t|PERSIST]`.
    GetEx { key: Bytes, action: GetExAction },
    /// `MGET key...`.
    MGet { keys: Vec<Bytes> },
    /// `MSET k v...` (`nx: false`) / `MSETNX k v...` (`nx: true`).
    MSet {
        pairs: Vec<(Bytes, Bytes)>,
        nx: bool,
    },
    /// `APPEND key value`.
    Append { key: Bytes, value: Bytes },
    /// `STRLEN key`.
    StrLen { key: Bytes },
    /// `GETRANGE key start end`.
    GetRange { key: Bytes, start: i64, end: i64 },
    /// `SETRANGE key offset value`.
    SetRange {
        key: Bytes,
        offset: i64,
        value: Bytes,
    },
}

/// The flags `parseExtendedStringArgumentsOrReply` collects.
#[derive(Default)]
struct ExtendedArgs {
    nx: bool,
    xx: bool,
    get: bool,
    keep_ttl: bool,
    persist: bool,
    expire: Option<ExpireArg>,
}

fn expire_unit(opt: &[u8]) -> Option<ExpireUnit> {
    [
        (b"ex" as &[u8], ExpireUnit::Ex),
        (b"px", ExpireUnit::Px),
        (b"exat", ExpireUnit::ExAt),
        (b"pxat", ExpireUnit::PxAt),
    ]
    .into_iter()
    .find(|(name, _)| opt.eq_ignore_ascii_case(name))
    .map(|(_, unit)| unit)
}

/// Redis's `parseExtendedStringArgumentsOrReply` for SET (`is_set`) and GETEX,
/// with its exact conflict rules (a repeated option is allowed, the last
/// expire value wins).
fn parse_extended(args: &[Bytes], start: usize, is_set: bool) -> Result<ExtendedArgs, Frame> {
    let mut f = ExtendedArgs::default();
    let mut j = start;
    while let Some(opt) = args.get(j) {
        let next = args.get(j + 1);
        let is = |name: &[u8]| opt.eq_ignore_ascii_case(name);
        let unit = expire_unit(opt);
        let other_expire = |u: ExpireUnit| f.expire.as_ref().is_some_and(|e| e.unit != u);
        if is(b"nx") && !f.xx && is_set {
            f.nx = true;
        } else if is(b"xx") && !f.nx && is_set {
            f.xx = true;
        } else if is(b"get") && is_set {
            f.get = true;
        } else if is(b"keepttl") && !f.persist && f.expire.is_none() && is_set {
            f.keep_ttl = true;
        } else if is(b"persist") && !is_set && f.expire.is_none() && !f.keep_ttl {
            f.persist = true;
        } else if let (Some(unit), Some(value)) = (unit, next)
            && !f.keep_ttl
            && !f.persist
            && !other_expire(unit)
        {
            f.expire = Some(ExpireArg {
                unit,
                value: value.clone(),
            });
            j += 1;
        } else {
            return Err(Frame::Error(errors::SYNTAX.into()));
        }
        j += 1;
    }
    Ok(f)
}

/// Argument `i` (the table's arity check guarantees presence; an empty
/// value stands in rather than panicking if it ever does not).
fn arg(args: &[Bytes], i: usize) -> Bytes {
    args.get(i).cloned().unwrap_or_default()
}

impl StringCmd {
    /// Parses `args` (`args[0]` is the name, arity already checked).
    pub(super) fn parse(name: &'static str, args: &[Bytes]) -> Result<Self, Frame> {
        let key = arg(args, 1);
        Ok(match name {
            "get" => StringCmd::Get { key },
            "set" => {
                let f = parse_extended(args, 3, true)?;
                let condition = if f.nx {
                    Some(SetCondition::Nx)
                } else if f.xx {
                    Some(SetCondition::Xx)
                } else {
                    None
                };
                StringCmd::Set(SetArgs {
                    key,
                    value: arg(args, 2),
                    condition,
                    get: f.get,
                    keep_ttl: f.keep_ttl,
                    expire: f.expire,
                })
            }
            "setnx" => StringCmd::SetNx {
                key,
                value: arg(args, 2),
            },
            "setex" | "psetex" => StringCmd::SetEx {
                name,
                key,
                expire: ExpireArg {
                    unit: if name == "setex" {
                        ExpireUnit::Ex
                    } else {
                        ExpireUnit::Px
                    },
                    value: arg(args, 2),
                },
                value: arg(args, 3),
            },
            "getset" => StringCmd::GetSet {
                key,
                value: arg(args, 2),
            },
            "getdel" => StringCmd::GetDel { key },
            "getex" => {
                let f = parse_extended(args, 2, false)?;
                let action = match f.expire {
                    Some(e) => GetExAction::Expire(e),
                    None if f.persist => GetExAction::Persist,
                    None => GetExAction::Keep,
                };
                StringCmd::GetEx { key, action }
            }
            "mget" => StringCmd::MGet {
                keys: args.get(1..).unwrap_or_default().to_vec(),
            },
            "mset" | "msetnx" => {
                if args.len().is_multiple_of(2) {
                    return Err(super::table::arity_error(name));
                }
                let pairs = args
                    .get(1..)
                    .unwrap_or_default()
                    .chunks_exact(2)
                    .map(|p| (p[0].clone(), p[1].clone()));
                StringCmd::MSet {
                    pairs: pairs.collect(),
                    nx: name == "msetnx",
                }
            }
            "append" => StringCmd::Append {
                key,
                value: arg(args, 2),
            },
            "strlen" => StringCmd::StrLen { key },
            "getrange" => StringCmd::GetRange {
                key,
                start: int_arg(&arg(args, 2))?,
                end: int_arg(&arg(args, 3))?,
            },
            "setrange" => {
                let offset = int_arg(&arg(args, 2))?;
                if offset < 0 {
                    return Err(Frame::Error(errors::OFFSET_RANGE.into()));
                }
                StringCmd::SetRange {
                    key,
                    offset,
                    value: arg(args, 3),
                }
            }
            other => return Err(Frame::Error(format!("ERR unknown command '{other}'"))),
        })
    }

    /// The lowercase command name.
    pub fn name(&self) -> &'static str {
        match self {
            StringCmd::Get { .. } => "get",
            StringCmd::Set(_) => "set",
            StringCmd::SetNx { .. } => "setnx",
            StringCmd::SetEx { name, .. } => name,
            StringCmd::GetSet { .. } => "getset",
            StringCmd::GetDel { .. } => "getdel",
            StringCmd::GetEx { .. } => "getex",
            StringCmd::MGet { .. } => "mget",
            StringCmd::MSet { nx: false, .. } => "mset",
            StringCmd::MSet { nx: true, .. } => "msetnx",
            StringCmd::Append { .. } => "append",
            StringCmd::StrLen { .. } => "strlen",
            StringCmd::GetRange { .. } => "getrange",
            StringCmd::SetRange { .. } => "setrange",
        }
    }

    /// The user keys, in argument order.
    pub fn keys(&self) -> Vec<&[u8]> {
        match self {
            StringCmd::Set(a) => vec![&a.key],
            StringCmd::MGet { keys } => keys.iter().map(|k| &k[..]).collect(),
            StringCmd::MSet { pairs, .. } => pairs.iter().map(|(k, _)| &k[..]).collect(),
            StringCmd::Get { key }
            | StringCmd::SetNx { key, .. }
            | StringCmd::SetEx { key, .. }
            | StringCmd::GetSet { key, .. }
            | StringCmd::GetDel { key }
            | StringCmd::GetEx { key, .. }
            | StringCmd::Append { key, .. }
            | StringCmd::StrLen { key }
            | StringCmd::GetRange { key, .. }
            | StringCmd::SetRange { key, .. } => vec![key],
        }
    }

    /// Runs the command.
    pub(super) fn execute(&self, db: &mut Db<'_>) -> CmdResult {
        match self {
            StringCmd::Get { key } => Ok(bulk_or_null(get_string(db, key)?.map(|v| v.data))),
            StringCmd::Set(a) => set(db, a),
            StringCmd::SetNx { key, value } => {
                if db.exists(key)? {
                    return Ok(Frame::Integer(0));
                }
                db.set(key, value.clone(), None);
                Ok(Frame::Integer(1))
            }
            StringCmd::SetEx {
                name,
                key,
                expire,
                value,
            } => {
                let at = expire.resolve(now_i64(db), name)?;
                db.set(key, value.clone(), Some(at as u64));
                Ok(Frame::ok())
            }
            StringCmd::GetSet { key, value } => {
                let old = get_string(db, key)?;
                db.set(key, value.clone(), None);
                Ok(bulk_or_null(old.map(|v| v.data)))
            }
            StringCmd::GetDel { key } => {
                let Some(old) = get_string(db, key)? else {
                    return Ok(Frame::Null);
                };
                db.delete(key)?;
                Ok(Frame::Bulk(old.data))
            }
            StringCmd::GetEx { key, action } => getex(db, key, action),
            StringCmd::MGet { keys } => {
                let mut out = Vec::with_capacity(keys.len());
                for key in keys {
                    let v = db.get(key)?.filter(super::is_string);
                    out.push(bulk_or_null(v.map(|v| v.data)));
                }
                Ok(Frame::Array(out))
            }
            StringCmd::MSet { pairs, nx } => {
                if *nx {
                    for (key, _) in pairs {
                        if db.exists(key)? {
                            return Ok(Frame::Integer(0));
                        }
                    }
                }
                for (key, value) in pairs {
                    db.set(key, value.clone(), None);
                }
                Ok(if *nx { Frame::Integer(1) } else { Frame::ok() })
            }
            StringCmd::Append { key, value } => {
                let Some(old) = get_string(db, key)? else {
                    db.set(key, value.clone(), None);
                    return Ok(Frame::Integer(value.len() as i64));
                };
                check_length(db, old.data.len() as i128, value.len() as i128)?;
                let mut data = BytesMut::with_capacity(old.data.len() + value.len());
                data.extend_from_slice(&old.data);
                data.extend_from_slice(value);
                let len = data.len();
                db.set(key, data.freeze(), old.expire_at_ms);
                Ok(Frame::Integer(len as i64))
            }
            StringCmd::StrLen { key } => Ok(Frame::Integer(
                get_string(db, key)?.map_or(0, |v| v.data.len() as i64),
            )),
            StringCmd::GetRange { key, start, end } => {
                let data = get_string(db, key)?.map(|v| v.data).unwrap_or_default();
                Ok(Frame::Bulk(get_range(&data, *start, *end)))
            }
            StringCmd::SetRange { key, offset, value } => setrange(db, key, *offset, value),
        }
    }
}

fn bulk_or_null(data: Option<Bytes>) -> Frame {
    data.map_or(Frame::Null, Frame::Bulk)
}

/// Redis's `checkStringLength`: `size + append` must not exceed the limit.
fn check_length(db: &Db<'_>, size: i128, append: i128) -> Result<(), CmdError> {
    if size + append > db.limits().max_value_bytes as i128 {
        return Err(reply_err(errors::TOO_BIG));
    }
    Ok(())
}

fn set(db: &mut Db<'_>, a: &SetArgs) -> CmdResult {
    let now = now_i64(db);
    let expire_at = match &a.expire {
        Some(e) => Some(e.resolve(now, "set")?),
        None => None,
    };
    let old = if a.get { get_string(db, &a.key)? } else { None };
    // A blind SET never reads the engine: only NX/XX and KEEPTTL need the current value.
    let current = if a.condition.is_some() || a.keep_ttl {
        db.get(&a.key)?
    } else {
        None
    };
    let found = current.is_some();
    let reply = |old: Option<Value>, default: Frame| {
        if a.get {
            bulk_or_null(old.map(|v| v.data))
        } else {
            default
        }
    };
    match a.condition {
        Some(SetCondition::Nx) if found => return Ok(reply(old, Frame::Null)),
        Some(SetCondition::Xx) if !found => return Ok(reply(old, Frame::Null)),
        _ => {}
    }
    match expire_at {
        Some(at) if at <= now => {
            db.delete(&a.key)?;
        }
        Some(at) => db.set(&a.key, a.value.clone(), Some(at as u64)),
        None => {
            let keep = if a.keep_ttl {
                current.and_then(|v| v.expire_at_ms)
            } else {
                None
            };
            db.set(&a.key, a.value.clone(), keep);
        }
    }
    Ok(reply(old, Frame::ok()))
}

fn getex(db: &mut Db<'_>, key: &[u8], action: &GetExAction) -> CmdResult {
    let Some(value) = get_string(db, key)? else {
        return Ok(Frame::Null);
    };
    match action {
        GetExAction::Keep => {}
        GetExAction::Persist => {
            if value.expire_at_ms.is_some() {
                db.set_expiry(key, None)?;
            }
        }
        GetExAction::Expire(e) => {
            let now = now_i64(db);
            let at = e.resolve(now, "getex")?;
            if e.is_absolute() && at <= now {
                db.delete(key)?;
            } else {
                db.set_expiry(key, Some(at as u64))?;
            }
        }
    }
    Ok(Frame::Bulk(value.data))
}

/// GETRANGE's index rules (Redis 7.0 `getrangeCommand`).
pub(super) fn get_range(data: &Bytes, start: i64, end: i64) -> Bytes {
    let len = data.len() as i128;
    let (mut start, mut end) = (i128::from(start), i128::from(end));
    if start < 0 && end < 0 && start > end {
        return Bytes::new();
    }
    if start < 0 {
        start += len;
    }
    if end < 0 {
        end += len;
    }
    start = start.max(0);
    end = end.max(0);
    if end >= len {
        end = len - 1;
    }
    if start > end || len == 0 {
        return Bytes::new();
    }
    data.slice(start as usize..=end as usize)
}

fn setrange(db: &mut Db<'_>, key: &[u8], offset: i64, value: &Bytes) -> CmdResult {
    let old = get_string(db, key)?;
    if value.is_empty() {
        return Ok(Frame::Integer(old.map_or(0, |v| v.data.len() as i64)));
    }
    check_length(db, i128::from(offset), value.len() as i128)?;
    // check_length bounded offset + len by max_value_bytes (a usize).
    let offset = offset as usize;
    let (mut data, expire) = match old {
        Some(v) => (BytesMut::from(&v.data[..]), v.expire_at_ms),
        None => (BytesMut::new(), None),
    };
    let end = offset + value.len();
    if data.len() < end {
        data.resize(end, 0);
    }
    data[offset..end].copy_from_slice(value);
    let len = data.len();
    db.set(key, data.freeze(), expire);
    Ok(Frame::Integer(len as i64))
}

#[cfg(test)]
#[path = "string_tests.rs"]
mod tests;
