//! Hash commands: HSET HSETNX HGET HMGET HMSET HDEL HLEN HSTRLEN HEXISTS
//! HKEYS HVALS HGETALL HINCRBY HINCRBYFLOAT HRANDFIELD HSCAN.
//!
//! Semantics follow Redis 7.0's `t_hash.c`, checked in the same order
//! (argument parsing that Redis does before the key lookup, then the type
//! check, then the rest). A hash is a meta plus one sub-entry per field
//! (`field -> seq value`, see [`crate::coll`]; read and written through
//! `Db::hash_get`/`hash_put`/`hash_all`): point reads and writes are O(1)
//! engine operations; whole-hash reads walk the field range and answer in
//! insertion order up to `HASH_INSERTION_ORDER_MAX_FIELDS` fields (as
//! Redis's listpack does), in field order beyond (Redis: its hash table's;
//! clients must not rely on either).

use bytes::Bytes;
use keyway_resp::Frame;
use keyway_storage::ValueKind;
use rand::Rng;

use super::coll_scan::{ScanOpts, scan_reply, scan_step};
use super::long_double::{self, LongDouble};
use super::{CmdError, CmdResult, errors, parse_i64, reply_err};
use crate::coll::layout;
use crate::db::Db;

const KIND: ValueKind = ValueKind::Hash;

/// A parsed hash command (arguments kept raw where Redis validates them
/// only when it runs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HashCmd {
    /// `HSET key field value [field value ...]` / `HMSET` (replies OK).
    Set {
        name: &'static str,
        key: Bytes,
        pairs: Vec<(Bytes, Bytes)>,
    },
    SetNx {
        key: Bytes,
        field: Bytes,
        value: Bytes,
    },
    Get {
        key: Bytes,
        field: Bytes,
    },
    MGet {
        key: Bytes,
        fields: Vec<Bytes>,
    },
    Del {
        key: Bytes,
        fields: Vec<Bytes>,
    },
    Len {
        key: Bytes,
    },
    StrLen {
        key: Bytes,
        field: Bytes,
    },
    Exists {
        key: Bytes,
        field: Bytes,
    },
    /// HKEYS / HVALS / HGETALL.
    All {
        name: &'static str,
        key: Bytes,
    },
    IncrBy {
        key: Bytes,
        field: Bytes,
        by: Bytes,
    },
    IncrByFloat {
        key: Bytes,
        field: Bytes,
        by: Bytes,
    },
    RandField {
        key: Bytes,
        count: Option<Bytes>,
        with_values: bool,
        /// Extra arguments (a syntax error once the count parses).
        extra: bool,
    },
    Scan {
        key: Bytes,
        args: Vec<Bytes>,
    },
}

impl HashCmd {
    /// Parses `args` (`args[0]` is the name, arity already checked).
    pub(super) fn parse(name: &'static str, args: &[Bytes]) -> Result<Self, Frame> {
        let key = args[1].clone();
        let arg = |i: usize| args[i].clone();
        Ok(match name {
            "hset" | "hmset" => {
                if !args.len().is_multiple_of(2) {
                    return Err(super::table::arity_error(name));
                }
                HashCmd::Set {
                    name,
                    key,
                    pairs: args[2..]
                        .chunks(2)
                        .map(|p| (p[0].clone(), p[1].clone()))
                        .collect(),
                }
            }
            "hsetnx" => HashCmd::SetNx {
                key,
                field: arg(2),
                value: arg(3),
            },
            "hget" => HashCmd::Get { key, field: arg(2) },
            "hmget" => HashCmd::MGet {
                key,
                fields: args[2..].to_vec(),
            },
            "hdel" => HashCmd::Del {
                key,
                fields: args[2..].to_vec(),
            },
            "hlen" => HashCmd::Len { key },
            "hstrlen" => HashCmd::StrLen { key, field: arg(2) },
            "hexists" => HashCmd::Exists { key, field: arg(2) },
            "hkeys" | "hvals" | "hgetall" => HashCmd::All { name, key },
            "hincrby" => HashCmd::IncrBy {
                key,
                field: arg(2),
                by: arg(3),
            },
            "hincrbyfloat" => HashCmd::IncrByFloat {
                key,
                field: arg(2),
                by: arg(3),
            },
            "hrandfield" => {
                let with_values = args.len() >= 4 && args[3].eq_ignore_ascii_case(b"withvalues");
                HashCmd::RandField {
                    key,
                    count: args.get(2).cloned(),
                    with_values,
                    extra: args.len() > 4 || (args.len() == 4 && !with_values),
                }
            }
            "hscan" => HashCmd::Scan {
                key,
                args: args[2..].to_vec(),
            },
            other => return Err(Frame::Error(format!("ERR unknown command '{other}'"))),
        })
    }

    /// The lowercase command name.
    pub fn name(&self) -> &'static str {
        match self {
            HashCmd::Set { name, .. } | HashCmd::All { name, .. } => name,
            HashCmd::SetNx { .. } => "hsetnx",
            HashCmd::Get { .. } => "hget",
            HashCmd::MGet { .. } => "hmget",
            HashCmd::Del { .. } => "hdel",
            HashCmd::Len { .. } => "hlen",
            HashCmd::StrLen { .. } => "hstrlen",
            HashCmd::Exists { .. } => "hexists",
            HashCmd::IncrBy { .. } => "hincrby",
            HashCmd::IncrByFloat { .. } => "hincrbyfloat",
            HashCmd::RandField { .. } => "hrandfield",
            HashCmd::Scan { .. } => "hscan",
        }
    }

    /// The user key (every hash command has exactly one).
    pub fn keys(&self) -> Vec<&[u8]> {
        let key = match self {
            HashCmd::Set { key, .. }
            | HashCmd::SetNx { key, .. }
            | HashCmd::Get { key, .. }
            | HashCmd::MGet { key, .. }
            | HashCmd::Del { key, .. }
            | HashCmd::Len { key }
            | HashCmd::StrLen { key, .. }
            | HashCmd::Exists { key, .. }
            | HashCmd::All { key, .. }
            | HashCmd::IncrBy { key, .. }
            | HashCmd::IncrByFloat { key, .. }
            | HashCmd::RandField { key, .. }
            | HashCmd::Scan { key, .. } => key,
        };
        vec![&key[..]]
    }

    /// Runs the command.
    pub(super) fn execute(&self, db: &mut Db<'_>) -> CmdResult {
        match self {
            HashCmd::Set { name, key, pairs } => {
                let mut meta = db.meta(key, KIND)?.unwrap_or_else(|| db.new_meta(KIND));
                let mut added = 0;
                for (field, value) in pairs {
                    added += i64::from(db.hash_put(key, &mut meta, field, value)?);
                }
                db.put_meta(key, &meta)?;
                Ok(match *name {
                    "hmset" => Frame::ok(),
                    _ => Frame::Integer(added),
                })
            }
            HashCmd::SetNx { key, field, value } => {
                let mut meta = db.meta(key, KIND)?.unwrap_or_else(|| db.new_meta(KIND));
                if db.sub_get(key, &meta, field)?.is_some() {
                    return Ok(Frame::Integer(0));
                }
                db.hash_put(key, &mut meta, field, value)?;
                db.put_meta(key, &meta)?;
                Ok(Frame::Integer(1))
            }
            HashCmd::Get { key, field } => Ok(match get_field(db, key, field)? {
                Some(v) => Frame::Bulk(v),
                None => Frame::Null,
            }),
            HashCmd::MGet { key, fields } => {
                let meta = db.meta(key, KIND)?;
                let mut out = Vec::with_capacity(fields.len());
                for f in fields {
                    out.push(match &meta {
                        Some(m) => db.hash_get(key, m, f)?.map_or(Frame::Null, Frame::Bulk),
                        None => Frame::Null,
                    });
                }
                Ok(Frame::Array(out))
            }
            HashCmd::Del { key, fields } => {
                let Some(mut meta) = db.meta(key, KIND)? else {
                    return Ok(Frame::Integer(0));
                };
                let mut deleted = 0;
                for f in fields {
                    if db.sub_get(key, &meta, f)?.is_some() {
                        db.sub_delete(key, &meta, f)?;
                        meta.size -= 1;
                        deleted += 1;
                    }
                }
                if deleted > 0 {
                    db.put_meta(key, &meta)?;
                }
                Ok(Frame::Integer(deleted))
            }
            HashCmd::Len { key } => Ok(Frame::Integer(
                db.meta(key, KIND)?.map_or(0, |m| m.size as i64),
            )),
            HashCmd::StrLen { key, field } => Ok(Frame::Integer(
                get_field(db, key, field)?.map_or(0, |v| v.len() as i64),
            )),
            HashCmd::Exists { key, field } => Ok(Frame::Integer(i64::from(
                get_field(db, key, field)?.is_some(),
            ))),
            HashCmd::All { name, key } => {
                let Some(meta) = db.meta(key, KIND)? else {
                    return Ok(match *name {
                        "hgetall" => Frame::Map(vec![]),
                        _ => Frame::Array(vec![]),
                    });
                };
                let all = db.hash_all(key, &meta)?;
                Ok(match *name {
                    "hkeys" => Frame::Array(all.into_iter().map(|(f, _)| Frame::Bulk(f)).collect()),
                    "hvals" => Frame::Array(all.into_iter().map(|(_, v)| Frame::Bulk(v)).collect()),
                    _ => Frame::Map(
                        all.into_iter()
                            .map(|(f, v)| (Frame::Bulk(f), Frame::Bulk(v)))
                            .collect(),
                    ),
                })
            }
            HashCmd::IncrBy { key, field, by } => {
                let by = parse_i64(by).ok_or_else(|| reply_err(errors::NOT_INTEGER))?;
                let mut meta = db.meta(key, KIND)?.unwrap_or_else(|| db.new_meta(KIND));
                let current = match db.hash_get(key, &meta, field)? {
                    Some(v) => parse_i64(&v)
                        .ok_or_else(|| reply_err("ERR hash value is not an integer"))?,
                    None => 0,
                };
                let new = current
                    .checked_add(by)
                    .ok_or_else(|| reply_err(errors::OVERFLOW))?;
                db.hash_put(key, &mut meta, field, new.to_string().as_bytes())?;
                db.put_meta(key, &meta)?;
                Ok(Frame::Integer(new))
            }
            HashCmd::IncrByFloat { key, field, by } => {
                let by = long_double::parse(by).ok_or_else(|| reply_err(errors::NOT_FLOAT))?;
                if !by.is_finite() {
                    return Err(reply_err("ERR value is NaN or Infinity"));
                }
                let mut meta = db.meta(key, KIND)?.unwrap_or_else(|| db.new_meta(KIND));
                let current = match db.hash_get(key, &meta, field)? {
                    Some(v) => long_double::parse(&v)
                        .ok_or_else(|| reply_err("ERR hash value is not a float"))?,
                    None => LongDouble::ZERO,
                };
                let new = current.add(by);
                if !new.is_finite() {
                    return Err(reply_err(errors::NAN_OR_INF));
                }
                let text = Bytes::from(long_double::format_human(new));
                db.hash_put(key, &mut meta, field, &text)?;
                db.put_meta(key, &meta)?;
                Ok(Frame::Bulk(text))
            }
            HashCmd::RandField {
                key,
                count,
                with_values,
                extra,
            } => rand_field(db, key, count.as_ref(), *with_values, *extra),
            HashCmd::Scan { key, args } => {
                let cursor = ScanOpts::parse_cursor(&args[0])?;
                let Some(meta) = db.meta(key, KIND)? else {
                    return Ok(scan_reply(0, vec![]));
                };
                let opts = ScanOpts::parse_options(cursor, &args[1..])?;
                let (next, entries) = scan_step(db, key, &meta, &[], &opts)?;
                let mut items = Vec::with_capacity(entries.len() * 2);
                for (f, data) in entries {
                    let value = layout::hash_value_parts(&data)
                        .ok_or_else(|| reply_err("ERR corrupt hash field"))?
                        .1;
                    items.extend([Frame::Bulk(f), Frame::Bulk(value)]);
                }
                Ok(scan_reply(next, items))
            }
        }
    }
}

/// The value of one field (`None`: no such key or field).
fn get_field(db: &mut Db<'_>, key: &[u8], field: &[u8]) -> Result<Option<Bytes>, CmdError> {
    match db.meta(key, KIND)? {
        Some(meta) => db.hash_get(key, &meta, field),
        None => Ok(None),
    }
}

/// `HRANDFIELD key [count [WITHVALUES]]` as `hrandfieldWithCountCommand`.
fn rand_field(
    db: &mut Db<'_>,
    key: &[u8],
    count: Option<&Bytes>,
    with_values: bool,
    extra: bool,
) -> CmdResult {
    let Some(count) = count else {
        let Some(meta) = db.meta(key, KIND)? else {
            return Ok(Frame::Null);
        };
        let all = db.hash_all(key, &meta)?;
        let pick = rand::rng().random_range(0..all.len());
        return Ok(Frame::Bulk(all[pick].0.clone()));
    };
    let l = parse_i64(count).ok_or_else(|| reply_err(errors::NOT_INTEGER))?;
    if l == i64::MIN {
        return Err(reply_err(
            "ERR value is out of range, value must between -9223372036854775807 and 9223372036854775807",
        ));
    }
    if extra {
        return Err(reply_err(errors::SYNTAX));
    }
    if with_values && !(-(i64::MAX / 2)..=i64::MAX / 2).contains(&l) {
        return Err(reply_err("ERR value is out of range"));
    }
    let Some(meta) = db.meta(key, KIND)? else {
        return Ok(Frame::Array(vec![]));
    };
    if l == 0 {
        return Ok(Frame::Array(vec![]));
    }
    let all = db.hash_all(key, &meta)?;
    let mut rng = rand::rng();
    let picked: Vec<&(Bytes, Bytes)> = if l < 0 {
        (0..l.unsigned_abs())
            .map(|_| &all[rng.random_range(0..all.len())])
            .collect()
    } else {
        let n = (l as u64).min(all.len() as u64) as usize;
        rand::seq::index::sample(&mut rng, all.len(), n)
            .into_iter()
            .map(|i| &all[i])
            .collect()
    };
    if with_values {
        return Ok(Frame::Pairs(
            picked
                .into_iter()
                .map(|(f, v)| (Frame::Bulk(f.clone()), Frame::Bulk(v.clone())))
                .collect(),
        ));
    }
    Ok(Frame::Array(
        picked
            .into_iter()
            .map(|(f, _)| Frame::Bulk(f.clone()))
            .collect(),
    ))
}

#[cfg(test)]
#[path = "hash_tests.rs"]
mod tests;
