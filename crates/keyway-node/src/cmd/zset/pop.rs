//! ZPOPMIN ZPOPMAX ZMPOP (`genericZpopCommand`) and ZRANDMEMBER.
//!
//! Pops walk the score index from the chosen end, O(popped). ZRANDMEMBER
//! reads the members it may return: without a count or with a negative one
//! it picks random ranks (O(n) to read the set once); with a positive count
//! it returns the whole set when the count covers it, otherwise distinct
//! random members in random order.

use bytes::Bytes;
use keyway_resp::Frame;
use rand::Rng;

use super::access::{self, Entry, Walk};
use super::score::score_frame;
use crate::cmd::{CmdResult, errors, parse_i64};
use crate::db::Db;

/// What one reply element costs at least (a frame in memory, its RESP
/// bytes): ZRANDMEMBER with a negative count may reply at most
/// `max_value_bytes / REPLY_ELEMENT_MIN_BYTES` elements.
const REPLY_ELEMENT_MIN_BYTES: u64 = 16;

/// A parsed pop or random-read command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PopCmd {
    /// `ZPOPMIN` / `ZPOPMAX key [count]` (`count: None` = the single-pop form).
    Pop {
        key: Bytes,
        max: bool,
        count: Option<i64>,
    },
    /// `ZMPOP numkeys key... MIN|MAX [COUNT n]` / `BZMPOP timeout numkeys ...`.
    MPop {
        keys: Vec<Bytes>,
        max: bool,
        count: i64,
        /// BZMPOP's timeout (ms, 0 = forever).
        timeout_ms: Option<u64>,
    },
    /// `BZPOPMIN` / `BZPOPMAX key... timeout`.
    BPop {
        keys: Vec<Bytes>,
        max: bool,
        timeout_ms: u64,
    },
    /// `ZRANDMEMBER key [count [WITHSCORES]]`.
    RandMember {
        key: Bytes,
        count: Option<i64>,
        withscores: bool,
    },
}

fn err(msg: &str) -> Frame {
    Frame::Error(msg.to_owned())
}

/// `getRangeLongFromObjectOrReply(min, max, msg)`.
fn ranged(s: &[u8], min: i64, max: i64, msg: Option<&str>) -> Result<i64, Frame> {
    let v = parse_i64(s).ok_or_else(|| err(msg.unwrap_or(errors::NOT_INTEGER)))?;
    if v < min || v > max {
        return Err(match msg {
            Some(m) => err(m),
            None => Frame::Error(format!(
                "ERR value is out of range, value must between {min} and {max}"
            )),
        });
    }
    Ok(v)
}

impl PopCmd {
    pub(super) fn parse(name: &'static str, args: &[Bytes]) -> Result<PopCmd, Frame> {
        let key = args.get(1).cloned().unwrap_or_default();
        match name {
            "zpopmin" | "zpopmax" => {
                if args.len() > 3 {
                    return Err(err(errors::SYNTAX));
                }
                let count = match args.get(2) {
                    Some(c) => Some(ranged(
                        c,
                        0,
                        i64::MAX,
                        Some("ERR value is out of range, must be positive"),
                    )?),
                    None => None,
                };
                Ok(PopCmd::Pop {
                    key,
                    max: name == "zpopmax",
                    count,
                })
            }
            "zmpop" => parse_mpop(args, 1),
            "bzmpop" => {
                // numkeys, MIN|MAX and COUNT are checked before the timeout.
                let mut cmd = parse_mpop(args, 2)?;
                let timeout =
                    crate::blocking::parse_timeout(args.get(1).map_or(&[][..], |a| &a[..]))?;
                if let PopCmd::MPop { timeout_ms, .. } = &mut cmd {
                    *timeout_ms = Some(timeout);
                }
                Ok(cmd)
            }
            "bzpopmin" | "bzpopmax" => Ok(PopCmd::BPop {
                keys: args[1..args.len() - 1].to_vec(),
                max: name == "bzpopmax",
                timeout_ms: crate::blocking::parse_timeout(&args[args.len() - 1])?,
            }),
            _ => {
                let mut count = None;
                let mut withscores = false;
                if let Some(c) = args.get(2) {
                    let l = ranged(c, -i64::MAX, i64::MAX, None)?;
                    if args.len() > 4
                        || (args.len() == 4 && !args[3].eq_ignore_ascii_case(b"withscores"))
                    {
                        return Err(err(errors::SYNTAX));
                    }
                    if args.len() == 4 {
                        withscores = true;
                        if !(-i64::MAX / 2..=i64::MAX / 2).contains(&l) {
                            return Err(err("ERR value is out of range"));
                        }
                    }
                    count = Some(l);
                }
                Ok(PopCmd::RandMember {
                    key,
                    count,
                    withscores,
                })
            }
        }
    }

    pub(super) fn name(&self) -> &'static str {
        match self {
            PopCmd::Pop { max: false, .. } => "zpopmin",
            PopCmd::Pop { max: true, .. } => "zpopmax",
            PopCmd::MPop {
                timeout_ms: None, ..
            } => "zmpop",
            PopCmd::MPop { .. } => "bzmpop",
            PopCmd::BPop { max: false, .. } => "bzpopmin",
            PopCmd::BPop { max: true, .. } => "bzpopmax",
            PopCmd::RandMember { .. } => "zrandmember",
        }
    }

    pub(super) fn keys(&self) -> Vec<&[u8]> {
        match self {
            PopCmd::Pop { key, .. } | PopCmd::RandMember { key, .. } => vec![key],
            PopCmd::MPop { keys, .. } | PopCmd::BPop { keys, .. } => {
                keys.iter().map(|k| &k[..]).collect()
            }
        }
    }

    pub(super) fn execute(&self, db: &mut Db<'_>) -> CmdResult {
        match self {
            PopCmd::Pop { key, max, count } => {
                if access::open(db, key)?.is_none() {
                    return Ok(Frame::Array(Vec::new()));
                }
                let popped = pop(db, key, *max, count.unwrap_or(1))?;
                // RESP3 nests the pairs only when a count is given.
                Ok(match count {
                    Some(_) => super::range::entries_reply(popped, true),
                    None => Frame::Array(super::range::flat_reply(popped)),
                })
            }
            PopCmd::MPop {
                keys, max, count, ..
            } => mpop(db, keys, *max, *count),
            PopCmd::BPop { keys, max, .. } => bpop(db, keys, *max),
            PopCmd::RandMember {
                key,
                count,
                withscores,
            } => rand_member(db, key, *count, *withscores),
        }
    }
}

/// `ZMPOP`/`BZMPOP` arguments from the key count at `numkeys_at`.
pub(super) fn parse_mpop(args: &[Bytes], numkeys_at: usize) -> Result<PopCmd, Frame> {
    let numkeys = ranged(
        args.get(numkeys_at).map_or(&[][..], |a| &a[..]),
        1,
        i64::MAX,
        Some("ERR numkeys should be greater than 0"),
    )?;
    let where_at = (numkeys_at as u64)
        .saturating_add(numkeys as u64)
        .saturating_add(1);
    if where_at >= args.len() as u64 {
        return Err(err(errors::SYNTAX));
    }
    let where_at = where_at as usize;
    let max = if args[where_at].eq_ignore_ascii_case(b"min") {
        false
    } else if args[where_at].eq_ignore_ascii_case(b"max") {
        true
    } else {
        return Err(err(errors::SYNTAX));
    };
    let mut count = -1;
    let mut j = where_at + 1;
    while j < args.len() {
        let more = args.len() - 1 - j;
        if count == -1 && args[j].eq_ignore_ascii_case(b"count") && more > 0 {
            j += 1;
            count = ranged(
                &args[j],
                1,
                i64::MAX,
                Some("ERR count should be greater than 0"),
            )?;
        } else {
            return Err(err(errors::SYNTAX));
        }
        j += 1;
    }
    Ok(PopCmd::MPop {
        keys: args[numkeys_at + 1..where_at].to_vec(),
        max,
        count: if count == -1 { 1 } else { count },
        timeout_ms: None,
    })
}

/// Removes and returns up to `count` members from the low or high end of
/// the sorted set at `key` (which must exist).
pub(super) fn pop(
    db: &mut Db<'_>,
    key: &[u8],
    max: bool,
    count: i64,
) -> Result<Vec<Entry>, crate::cmd::CmdError> {
    let Some(mut meta) = access::open(db, key)? else {
        return Ok(Vec::new());
    };
    let want = (count.max(0) as u64).min(meta.size);
    let mut walk = Walk::all(max);
    let mut out = Vec::with_capacity(want.min(1 << 16) as usize);
    while (out.len() as u64) < want {
        match walk.next(db, key, &meta)? {
            Some(e) => out.push(e),
            None => break,
        }
    }
    for e in &out {
        access::remove(db, key, &mut meta, &e.member, e.score)?;
    }
    if !out.is_empty() {
        db.put_meta(key, &meta)?;
    }
    Ok(out)
}

/// `ZMPOP`: pops from the first non-empty sorted set among `keys`
/// (WRONGTYPE on a non-zset met before it); `*-1` if there is none.
pub(super) fn mpop(db: &mut Db<'_>, keys: &[Bytes], max: bool, count: i64) -> CmdResult {
    for key in keys {
        if access::open(db, key)?.is_none() {
            continue;
        }
        let popped = pop(db, key, max, count)?;
        let pairs = popped
            .into_iter()
            .map(|e| Frame::Array(vec![Frame::Bulk(e.member), score_frame(e.score)]))
            .collect();
        return Ok(Frame::Array(vec![
            Frame::Bulk(key.clone()),
            Frame::Array(pairs),
        ]));
    }
    Ok(Frame::NullArray)
}

/// BZPOPMIN / BZPOPMAX in their non-blocking form: `[key, member, score]`
/// from the first non-empty sorted set (WRONGTYPE on a non-zset met before
/// it), `*-1` (block) if there is none.
fn bpop(db: &mut Db<'_>, keys: &[Bytes], max: bool) -> CmdResult {
    for key in keys {
        if access::open(db, key)?.is_none() {
            continue;
        }
        let mut out = vec![Frame::Bulk(key.clone())];
        out.extend(super::range::flat_reply(pop(db, key, max, 1)?));
        return Ok(Frame::Array(out));
    }
    Ok(Frame::NullArray)
}

impl PopCmd {
    /// A blocking command's timeout (milliseconds, 0 = forever).
    pub(super) fn blocking_timeout_ms(&self) -> Option<u64> {
        match self {
            PopCmd::MPop { timeout_ms, .. } => *timeout_ms,
            PopCmd::BPop { timeout_ms, .. } => Some(*timeout_ms),
            _ => None,
        }
    }
}

fn rand_member(db: &mut Db<'_>, key: &[u8], count: Option<i64>, withscores: bool) -> CmdResult {
    let Some(meta) = access::open(db, key)? else {
        return Ok(match count {
            None => Frame::Null,
            Some(_) => Frame::Array(Vec::new()),
        });
    };
    let Some(count) = count else {
        let all = read_all(db, key, &meta)?;
        let i = rand::rng().random_range(0..all.len());
        return Ok(Frame::Bulk(all[i].member.clone()));
    };
    if count == 0 {
        return Ok(Frame::Array(Vec::new()));
    }
    // A negative count repeats members without bound (Redis streams such a
    // reply until memory runs out): refuse one whose elements alone would
    // exceed the node's largest value.
    let elements = count
        .unsigned_abs()
        .saturating_mul(if withscores { 2 } else { 1 });
    if count < 0
        && elements.saturating_mul(REPLY_ELEMENT_MIN_BYTES) > db.limits().max_value_bytes as u64
    {
        return Ok(Frame::Error(format!(
            "ERR reply of {elements} elements exceeds the maximum allowed size ({} bytes)",
            db.limits().max_value_bytes
        )));
    }
    let all = read_all(db, key, &meta)?;
    let mut rng = rand::rng();
    let picked: Vec<Entry> = if count < 0 || count == 1 {
        let n = count.unsigned_abs();
        (0..n)
            .map(|_| all[rng.random_range(0..all.len())].clone())
            .collect()
    } else if count as u64 >= meta.size {
        all
    } else {
        rand::seq::index::sample(&mut rng, all.len(), count as usize)
            .into_iter()
            .map(|i| all[i].clone())
            .collect()
    };
    Ok(super::range::entries_reply(picked, withscores))
}

fn read_all(
    db: &mut Db<'_>,
    key: &[u8],
    meta: &crate::coll::Meta,
) -> Result<Vec<Entry>, crate::cmd::CmdError> {
    let mut walk = Walk::all(false);
    let mut out = Vec::with_capacity(meta.size.min(1 << 16) as usize);
    while let Some(e) = walk.next(db, key, meta)? {
        out.push(e);
    }
    Ok(out)
}
