//! Set commands: SADD SREM SCARD SISMEMBER SMISMEMBER SMEMBERS SRANDMEMBER
//! SPOP SMOVE SINTER SINTERCARD SUNION SDIFF SINTERSTORE SUNIONSTORE
//! SDIFFSTORE SSCAN.
//!
//! Semantics follow Redis 7.0's `t_set.c`, in its order of checks: the
//! arguments Redis parses before the key lookup, then the type checks (a
//! wrong type among several keys is `WRONGTYPE` even when another key is
//! missing), then the rest. A set is a meta plus one sub-entry per member
//! (`member -> ∅`, see [`crate::coll`]); members come back in byte order.

use std::collections::BTreeSet;

use bytes::Bytes;
use keyway_resp::Frame;
use keyway_storage::ValueKind;
use rand::Rng;

use super::coll_scan::{ScanOpts, scan_reply, scan_step};
use super::{CmdError, CmdResult, errors, parse_i64, reply_err};
use crate::coll::Meta;
use crate::db::Db;

const KIND: ValueKind = ValueKind::Set;

/// SINTER / SUNION / SDIFF.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algebra {
    Inter,
    Union,
    Diff,
}

/// A parsed set command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SetCmd {
    Add {
        key: Bytes,
        members: Vec<Bytes>,
    },
    Rem {
        key: Bytes,
        members: Vec<Bytes>,
    },
    Card {
        key: Bytes,
    },
    IsMember {
        key: Bytes,
        member: Bytes,
    },
    MIsMember {
        key: Bytes,
        members: Vec<Bytes>,
    },
    Members {
        key: Bytes,
    },
    RandMember {
        key: Bytes,
        count: Option<Bytes>,
    },
    Pop {
        key: Bytes,
        count: Option<Bytes>,
    },
    Move {
        src: Bytes,
        dst: Bytes,
        member: Bytes,
    },
    /// SINTER SUNION SDIFF, and their STORE forms (`dst`).
    Algebra {
        name: &'static str,
        op: Algebra,
        dst: Option<Bytes>,
        keys: Vec<Bytes>,
    },
    InterCard {
        keys: Vec<Bytes>,
        limit: u64,
    },
    Scan {
        key: Bytes,
        args: Vec<Bytes>,
    },
}

impl SetCmd {
    /// Parses `args` (`args[0]` is the name, arity already checked).
    pub(super) fn parse(name: &'static str, args: &[Bytes]) -> Result<Self, Frame> {
        let key = args[1].clone();
        let rest = || args[2..].to_vec();
        let syntax = || Frame::Error(errors::SYNTAX.into());
        Ok(match name {
            "sadd" => SetCmd::Add {
                key,
                members: rest(),
            },
            "srem" => SetCmd::Rem {
                key,
                members: rest(),
            },
            "scard" => SetCmd::Card { key },
            "sismember" => SetCmd::IsMember {
                key,
                member: args[2].clone(),
            },
            "smismember" => SetCmd::MIsMember {
                key,
                members: rest(),
            },
            "smembers" => SetCmd::Members { key },
            "srandmember" | "spop" => {
                if args.len() > 3 {
                    return Err(syntax());
                }
                let count = args.get(2).cloned();
                match name {
                    "spop" => SetCmd::Pop { key, count },
                    _ => SetCmd::RandMember { key, count },
                }
            }
            "smove" => SetCmd::Move {
                src: key,
                dst: args[2].clone(),
                member: args[3].clone(),
            },
            "sinter" | "sunion" | "sdiff" | "sinterstore" | "sunionstore" | "sdiffstore" => {
                let op = match &name[..2] {
                    "si" => Algebra::Inter,
                    "su" => Algebra::Union,
                    _ => Algebra::Diff,
                };
                let store = name.ends_with("store");
                SetCmd::Algebra {
                    name,
                    op,
                    dst: store.then(|| key.clone()),
                    keys: args[1 + usize::from(store)..].to_vec(),
                }
            }
            "sintercard" => {
                let (keys, limit) = parse_numkeys_limit(&args[1..])?;
                SetCmd::InterCard { keys, limit }
            }
            "sscan" => SetCmd::Scan { key, args: rest() },
            other => return Err(Frame::Error(format!("ERR unknown command '{other}'"))),
        })
    }

    /// The lowercase command name.
    pub fn name(&self) -> &'static str {
        match self {
            SetCmd::Add { .. } => "sadd",
            SetCmd::Rem { .. } => "srem",
            SetCmd::Card { .. } => "scard",
            SetCmd::IsMember { .. } => "sismember",
            SetCmd::MIsMember { .. } => "smismember",
            SetCmd::Members { .. } => "smembers",
            SetCmd::RandMember { .. } => "srandmember",
            SetCmd::Pop { .. } => "spop",
            SetCmd::Move { .. } => "smove",
            SetCmd::Algebra { name, .. } => name,
            SetCmd::InterCard { .. } => "sintercard",
            SetCmd::Scan { .. } => "sscan",
        }
    }

    /// The user keys, in argument order.
    pub fn keys(&self) -> Vec<&[u8]> {
        match self {
            SetCmd::Add { key, .. }
            | SetCmd::Rem { key, .. }
            | SetCmd::Card { key }
            | SetCmd::IsMember { key, .. }
            | SetCmd::MIsMember { key, .. }
            | SetCmd::Members { key }
            | SetCmd::RandMember { key, .. }
            | SetCmd::Pop { key, .. }
            | SetCmd::Scan { key, .. } => vec![key],
            SetCmd::Move { src, dst, .. } => vec![src, dst],
            SetCmd::Algebra { dst, keys, .. } => dst.iter().chain(keys).map(|k| &k[..]).collect(),
            SetCmd::InterCard { keys, .. } => keys.iter().map(|k| &k[..]).collect(),
        }
    }

    /// Whether the command may create a key.
    pub(super) fn creates_keys(&self) -> bool {
        matches!(
            self,
            SetCmd::Add { .. } | SetCmd::Move { .. } | SetCmd::Algebra { dst: Some(_), .. }
        )
    }

    /// Runs the command.
    pub(super) fn execute(&self, db: &mut Db<'_>) -> CmdResult {
        match self {
            SetCmd::Add { key, members } => {
                let mut meta = db.meta(key, KIND)?.unwrap_or_else(|| db.new_meta(KIND));
                let mut added = 0;
                for m in members {
                    added += i64::from(add(db, key, &mut meta, m)?);
                }
                // Nothing added, nothing written (a WATCH on the key holds).
                if added > 0 {
                    db.put_meta(key, &meta)?;
                }
                Ok(Frame::Integer(added))
            }
            SetCmd::Rem { key, members } => {
                let Some(mut meta) = db.meta(key, KIND)? else {
                    return Ok(Frame::Integer(0));
                };
                let mut removed = 0;
                for m in members {
                    removed += i64::from(remove(db, key, &mut meta, m)?);
                }
                if removed > 0 {
                    db.put_meta(key, &meta)?;
                }
                Ok(Frame::Integer(removed))
            }
            SetCmd::Card { key } => Ok(Frame::Integer(
                db.meta(key, KIND)?.map_or(0, |m| m.size as i64),
            )),
            SetCmd::IsMember { key, member } => {
                Ok(Frame::Integer(i64::from(is_member(db, key, member)?)))
            }
            SetCmd::MIsMember { key, members } => {
                let meta = db.meta(key, KIND)?;
                let mut out = Vec::with_capacity(members.len());
                for m in members {
                    let present = match &meta {
                        Some(meta) => db.sub_get(key, meta, m)?.is_some(),
                        None => false,
                    };
                    out.push(Frame::Integer(i64::from(present)));
                }
                Ok(Frame::Array(out))
            }
            SetCmd::Members { key } => Ok(Frame::Set(
                members_of(db, key)?.into_iter().map(Frame::Bulk).collect(),
            )),
            SetCmd::RandMember { key, count } => rand_member(db, key, count.as_ref()),
            SetCmd::Pop { key, count } => pop(db, key, count.as_ref()),
            SetCmd::Move { src, dst, member } => {
                let src_meta = db.meta(src, KIND);
                let dst_meta = db.meta(dst, KIND);
                let Some(mut src_meta) = src_meta? else {
                    return Ok(Frame::Integer(0));
                };
                let dst_meta = dst_meta?;
                if src == dst {
                    return Ok(Frame::Integer(i64::from(
                        db.sub_get(src, &src_meta, member)?.is_some(),
                    )));
                }
                if !remove(db, src, &mut src_meta, member)? {
                    return Ok(Frame::Integer(0));
                }
                db.put_meta(src, &src_meta)?;
                let mut dst_meta = dst_meta.unwrap_or_else(|| db.new_meta(KIND));
                // A member the destination already has leaves it untouched
                // (no write: a WATCH on it holds, as in Redis).
                if add(db, dst, &mut dst_meta, member)? {
                    db.put_meta(dst, &dst_meta)?;
                }
                Ok(Frame::Integer(1))
            }
            SetCmd::Algebra { op, dst, keys, .. } => {
                let result = algebra(db, *op, keys)?;
                match dst {
                    None => Ok(Frame::Set(result.into_iter().map(Frame::Bulk).collect())),
                    Some(dst) => {
                        let n = result.len() as i64;
                        store(db, dst, result)?;
                        Ok(Frame::Integer(n))
                    }
                }
            }
            SetCmd::InterCard { keys, limit } => {
                let result = algebra(db, Algebra::Inter, keys)?;
                let n = result.len() as u64;
                Ok(Frame::Integer(match *limit {
                    0 => n,
                    l => n.min(l),
                } as i64))
            }
            SetCmd::Scan { key, args } => {
                let cursor = ScanOpts::parse_cursor(&args[0])?;
                let Some(meta) = db.meta(key, KIND)? else {
                    return Ok(scan_reply(0, vec![]));
                };
                let opts = ScanOpts::parse_options(cursor, &args[1..])?;
                let (next, entries) = scan_step(db, key, &meta, &[], &opts)?;
                Ok(scan_reply(
                    next,
                    entries.into_iter().map(|(m, _)| Frame::Bulk(m)).collect(),
                ))
            }
        }
    }
}

/// `numkeys key... [LIMIT limit]` (SINTERCARD; also ZINTERCARD's shape).
pub(crate) fn parse_numkeys_limit(args: &[Bytes]) -> Result<(Vec<Bytes>, u64), Frame> {
    let numkeys = parse_i64(&args[0])
        .filter(|n| *n > 0)
        .ok_or_else(|| Frame::Error("ERR numkeys should be greater than 0".into()))?
        as usize;
    if numkeys > args.len() - 1 {
        return Err(Frame::Error(
            "ERR Number of keys can't be greater than number of args".into(),
        ));
    }
    let keys = args[1..1 + numkeys].to_vec();
    let mut limit = 0u64;
    let mut i = 1 + numkeys;
    while i < args.len() {
        if args[i].eq_ignore_ascii_case(b"limit") && i + 1 < args.len() {
            limit = parse_i64(&args[i + 1])
                .and_then(|l| u64::try_from(l).ok())
                .ok_or_else(|| Frame::Error("ERR LIMIT can't be negative".into()))?;
            i += 2;
        } else {
            return Err(Frame::Error(errors::SYNTAX.into()));
        }
    }
    Ok((keys, limit))
}

/// Adds `member`; `true` if it was new.
fn add(db: &mut Db<'_>, key: &[u8], meta: &mut Meta, member: &[u8]) -> Result<bool, CmdError> {
    if db.sub_get(key, meta, member)?.is_some() {
        return Ok(false);
    }
    db.sub_put(key, meta, member, Bytes::new())?;
    meta.size += 1;
    Ok(true)
}

/// Removes `member`; `true` if it was there.
fn remove(db: &mut Db<'_>, key: &[u8], meta: &mut Meta, member: &[u8]) -> Result<bool, CmdError> {
    if db.sub_get(key, meta, member)?.is_none() {
        return Ok(false);
    }
    db.sub_delete(key, meta, member)?;
    meta.size -= 1;
    Ok(true)
}

fn is_member(db: &mut Db<'_>, key: &[u8], member: &[u8]) -> Result<bool, CmdError> {
    Ok(match db.meta(key, KIND)? {
        Some(meta) => db.sub_get(key, &meta, member)?.is_some(),
        None => false,
    })
}

/// Every member of `key` (empty if absent), in byte order.
fn members_of(db: &mut Db<'_>, key: &[u8]) -> Result<Vec<Bytes>, CmdError> {
    Ok(match db.meta(key, KIND)? {
        Some(meta) => db
            .sub_all(key, &meta)?
            .into_iter()
            .map(|(m, _)| m)
            .collect(),
        None => Vec::new(),
    })
}

/// SINTER / SUNION / SDIFF of `keys`: every existing key is type-checked
/// first (as Redis does), then missing keys count as empty sets.
fn algebra(db: &mut Db<'_>, op: Algebra, keys: &[Bytes]) -> Result<BTreeSet<Bytes>, CmdError> {
    let mut metas = Vec::with_capacity(keys.len());
    for k in keys {
        metas.push(db.meta(k, KIND)?);
    }
    if op == Algebra::Inter && metas.iter().any(Option::is_none) {
        return Ok(BTreeSet::new());
    }
    let mut result: Option<BTreeSet<Bytes>> = None;
    for (k, meta) in keys.iter().zip(&metas) {
        let members: BTreeSet<Bytes> = match meta {
            Some(m) => db.sub_all(k, m)?.into_iter().map(|(m, _)| m).collect(),
            None => BTreeSet::new(),
        };
        result = Some(match (result, op) {
            (None, _) => members,
            (Some(acc), Algebra::Inter) => acc.intersection(&members).cloned().collect(),
            (Some(mut acc), Algebra::Union) => {
                acc.extend(members);
                acc
            }
            (Some(acc), Algebra::Diff) => acc.difference(&members).cloned().collect(),
        });
        if op != Algebra::Union && result.as_ref().is_some_and(BTreeSet::is_empty) {
            break;
        }
    }
    Ok(result.unwrap_or_default())
}

/// Replaces `dst` (whatever it held) by a set of `members`; none deletes it.
fn store(db: &mut Db<'_>, dst: &[u8], members: BTreeSet<Bytes>) -> Result<(), CmdError> {
    db.delete(dst)?;
    let mut meta = db.new_meta(KIND);
    for m in &members {
        db.sub_put(dst, &meta, m, Bytes::new())?;
    }
    meta.size = members.len() as u64;
    db.put_meta(dst, &meta)?;
    Ok(())
}

fn out_of_range(min: &str) -> CmdError {
    reply_err(format!(
        "ERR value is out of range, value must between {min} and 9223372036854775807"
    ))
}

/// `SRANDMEMBER key [count]` as `srandmemberWithCountCommand`.
fn rand_member(db: &mut Db<'_>, key: &[u8], count: Option<&Bytes>) -> CmdResult {
    let Some(count) = count else {
        let members = members_of(db, key)?;
        if members.is_empty() {
            return Ok(Frame::Null);
        }
        let i = rand::rng().random_range(0..members.len());
        return Ok(Frame::Bulk(members[i].clone()));
    };
    let l = parse_i64(count).ok_or_else(|| reply_err(errors::NOT_INTEGER))?;
    if l == i64::MIN {
        return Err(out_of_range("-9223372036854775807"));
    }
    let members = members_of(db, key)?;
    if l == 0 || members.is_empty() {
        return Ok(Frame::Array(vec![]));
    }
    let mut rng = rand::rng();
    let picked: Vec<Frame> = if l < 0 {
        (0..l.unsigned_abs())
            .map(|_| Frame::Bulk(members[rng.random_range(0..members.len())].clone()))
            .collect()
    } else {
        let n = (l as u64).min(members.len() as u64) as usize;
        rand::seq::index::sample(&mut rng, members.len(), n)
            .into_iter()
            .map(|i| Frame::Bulk(members[i].clone()))
            .collect()
    };
    Ok(Frame::Array(picked))
}

/// `SPOP key [count]` as `spopCommand` / `spopWithCountCommand`.
fn pop(db: &mut Db<'_>, key: &[u8], count: Option<&Bytes>) -> CmdResult {
    let n = match count {
        None => None,
        Some(c) => {
            // getPositiveLongFromObjectOrReply: one message for both.
            let l = parse_i64(c)
                .filter(|l| *l >= 0)
                .ok_or_else(|| reply_err("ERR value is out of range, must be positive"))?;
            Some(l as u64)
        }
    };
    let Some(mut meta) = db.meta(key, KIND)? else {
        return Ok(match n {
            None => Frame::Null,
            Some(_) => Frame::Set(vec![]),
        });
    };
    if n == Some(0) {
        return Ok(Frame::Set(vec![]));
    }
    let members = db.sub_all(key, &meta)?;
    let take = n.unwrap_or(1).min(members.len() as u64) as usize;
    let mut rng = rand::rng();
    let picked: Vec<Bytes> = rand::seq::index::sample(&mut rng, members.len(), take)
        .into_iter()
        .map(|i| members[i].0.clone())
        .collect();
    for m in &picked {
        remove(db, key, &mut meta, m)?;
    }
    db.put_meta(key, &meta)?;
    Ok(match n {
        None => Frame::Bulk(picked[0].clone()),
        Some(_) => Frame::Set(picked.into_iter().map(Frame::Bulk).collect()),
    })
}

#[cfg(test)]
#[path = "set_tests.rs"]
mod tests;
