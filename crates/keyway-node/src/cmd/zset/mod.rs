//! Sorted-set commands: ZADD ZINCRBY ZREM ZCARD ZCOUNT ZLEXCOUNT ZSCORE
//! ZMSCORE ZRANK ZREVRANK, the ZRANGE family and ZRANGESTORE, ZREMRANGEBY*,
//! ZPOPMIN ZPOPMAX ZMPOP ZRANDMEMBER, ZUNION ZINTER ZDIFF (+STORE) ZINTERCARD,
//! ZSCAN, with Redis 7.0's replies, errors and check order (`t_zset.c`).
//!
//! Storage: the member entries and the score index of the collection layout
//! ([`access`]); score-ordered reads are chunked walks of the index in
//! either direction, so ranges cost O(range) and ranks O(distance to the
//! nearer end). Replies use RESP2's shapes (flat `member score` arrays,
//! scores as bulk strings printed `%.17g` like Redis 7.0, see [`score`]).
//!
//! One file per concern: `score.rs` (float parsing and printing, score and
//! lex ranges), `access.rs` (entries, walks, ranks), `range.rs` (ZRANGE and
//! friends), `store.rs` (set algebra), `pop.rs` (ZPOP*, ZMPOP,
//! ZRANDMEMBER), `scan.rs` (ZSCAN).

mod access;
mod pop;
mod range;
mod scan;
mod score;
mod store;
#[cfg(test)]
mod tests;

use bytes::Bytes;
use keyway_resp::Frame;

use crate::cmd::{CmdResult, errors, parse_i64};
use crate::db::Db;
pub use range::RangeCmd;
use range::Selector;
use score::{LexRange, ScoreRange, parse_score, score_frame};
pub use store::AlgebraCmd;

/// ZADD's option flags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AddFlags {
    nx: bool,
    xx: bool,
    gt: bool,
    lt: bool,
    ch: bool,
    incr: bool,
}

/// A parsed sorted-set command.
#[derive(Clone, Debug, PartialEq)]
pub enum ZSetCmd {
    /// `ZADD key [NX|XX] [GT|LT] [CH] [INCR] score member...` / `ZINCRBY key incr member`.
    Add {
        name: &'static str,
        key: Bytes,
        flags: AddFlags,
        pairs: Vec<(f64, Bytes)>,
    },
    /// `ZREM key member...`.
    Rem { key: Bytes, members: Vec<Bytes> },
    /// `ZCARD key`.
    Card { key: Bytes },
    /// `ZCOUNT key min max`.
    Count { key: Bytes, range: ScoreRange },
    /// `ZLEXCOUNT key min max`.
    LexCount { key: Bytes, range: LexRange },
    /// `ZSCORE key member`.
    Score { key: Bytes, member: Bytes },
    /// `ZMSCORE key member...`.
    MScore { key: Bytes, members: Vec<Bytes> },
    /// `ZRANK` / `ZREVRANK key member`.
    Rank {
        key: Bytes,
        member: Bytes,
        reverse: bool,
    },
    /// The ZRANGE family and ZRANGESTORE.
    Range(RangeCmd),
    /// `ZREMRANGEBYRANK` / `BYSCORE` / `BYLEX key a b`.
    RemRange {
        name: &'static str,
        key: Bytes,
        selector: Selector,
    },
    /// ZPOPMIN ZPOPMAX ZMPOP ZRANDMEMBER, and BZPOPMIN BZPOPMAX BZMPOP (the
    /// caller blocks them on [`crate::blocking`] when their non-blocking
    /// form replies nil).
    Pop(pop::PopCmd),
    /// ZUNION ZINTER ZDIFF ZUNIONSTORE ZINTERSTORE ZDIFFSTORE ZINTERCARD.
    Algebra(AlgebraCmd),
    /// `ZSCAN key cursor [MATCH p] [COUNT n]`.
    Scan(scan::ScanCmd),
}

fn err(msg: &str) -> Frame {
    Frame::Error(msg.to_owned())
}

fn arg(args: &[Bytes], i: usize) -> Bytes {
    args.get(i).cloned().unwrap_or_default()
}

/// `zaddGenericCommand`'s parsing (ZINCRBY runs it too, with INCR set, so
/// `ZINCRBY k nx m` is an option and then a syntax error, as in Redis).
fn parse_add(name: &'static str, args: &[Bytes]) -> Result<ZSetCmd, Frame> {
    let mut flags = AddFlags {
        incr: name == "zincrby",
        ..AddFlags::default()
    };
    let mut i = 2;
    while let Some(opt) = args.get(i) {
        let is = |o: &[u8]| opt.eq_ignore_ascii_case(o);
        if is(b"nx") {
            flags.nx = true;
        } else if is(b"xx") {
            flags.xx = true;
        } else if is(b"ch") {
            flags.ch = true;
        } else if is(b"incr") {
            flags.incr = true;
        } else if is(b"gt") {
            flags.gt = true;
        } else if is(b"lt") {
            flags.lt = true;
        } else {
            break;
        }
        i += 1;
    }
    let rest = &args[i.min(args.len())..];
    if rest.is_empty() || rest.len() % 2 == 1 {
        return Err(err(errors::SYNTAX));
    }
    if flags.nx && flags.xx {
        return Err(err(
            "ERR XX and NX options at the same time are not compatible",
        ));
    }
    if ((flags.gt || flags.lt) && flags.nx) || (flags.gt && flags.lt) {
        return Err(err(
            "ERR GT, LT, and/or NX options at the same time are not compatible",
        ));
    }
    if flags.incr && rest.len() > 2 {
        return Err(err(
            "ERR INCR option supports a single increment-element pair",
        ));
    }
    let mut pairs = Vec::with_capacity(rest.len() / 2);
    for pair in rest.chunks(2) {
        let score = parse_score(&pair[0]).ok_or_else(|| err(errors::NOT_FLOAT))?;
        pairs.push((score, pair[1].clone()));
    }
    Ok(ZSetCmd::Add {
        name,
        key: arg(args, 1),
        flags,
        pairs,
    })
}

impl ZSetCmd {
    /// Parses `args` (`args[0]` is the name, arity already checked).
    pub(super) fn parse(name: &'static str, args: &[Bytes]) -> Result<Self, Frame> {
        let key = arg(args, 1);
        let rest = || args.get(2..).unwrap_or_default().to_vec();
        Ok(match name {
            "zadd" | "zincrby" => return parse_add(name, args),
            "zrem" => ZSetCmd::Rem {
                key,
                members: rest(),
            },
            "zcard" => ZSetCmd::Card { key },
            "zcount" => ZSetCmd::Count {
                key,
                range: ScoreRange::parse(&arg(args, 2), &arg(args, 3))
                    .ok_or_else(|| err("ERR min or max is not a float"))?,
            },
            "zlexcount" => ZSetCmd::LexCount {
                key,
                range: LexRange::parse(&arg(args, 2), &arg(args, 3))
                    .ok_or_else(|| err("ERR min or max not valid string range item"))?,
            },
            "zscore" => ZSetCmd::Score {
                key,
                member: arg(args, 2),
            },
            "zmscore" => ZSetCmd::MScore {
                key,
                members: rest(),
            },
            "zrank" | "zrevrank" => ZSetCmd::Rank {
                key,
                member: arg(args, 2),
                reverse: name == "zrevrank",
            },
            "zrange" | "zrangestore" | "zrevrange" | "zrangebyscore" | "zrevrangebyscore"
            | "zrangebylex" | "zrevrangebylex" => ZSetCmd::Range(range::parse(name, args)?),
            "zremrangebyrank" => {
                let int = |i| parse_i64(&arg(args, i)).ok_or_else(|| err(errors::NOT_INTEGER));
                ZSetCmd::RemRange {
                    name,
                    key,
                    selector: Selector::Rank {
                        start: int(2)?,
                        end: int(3)?,
                    },
                }
            }
            "zremrangebyscore" => ZSetCmd::RemRange {
                name,
                key,
                selector: Selector::Score(
                    ScoreRange::parse(&arg(args, 2), &arg(args, 3))
                        .ok_or_else(|| err("ERR min or max is not a float"))?,
                ),
            },
            "zremrangebylex" => ZSetCmd::RemRange {
                name,
                key,
                selector: Selector::Lex(
                    LexRange::parse(&arg(args, 2), &arg(args, 3))
                        .ok_or_else(|| err("ERR min or max not valid string range item"))?,
                ),
            },
            "zpopmin" | "zpopmax" | "zmpop" | "zrandmember" | "bzpopmin" | "bzpopmax"
            | "bzmpop" => ZSetCmd::Pop(pop::PopCmd::parse(name, args)?),
            "zscan" => ZSetCmd::Scan(scan::ScanCmd::parse(args)?),
            _ => ZSetCmd::Algebra(AlgebraCmd::parse(name, args)?),
        })
    }

    /// The lowercase command name.
    pub fn name(&self) -> &'static str {
        match self {
            ZSetCmd::Add { name, .. } | ZSetCmd::RemRange { name, .. } => name,
            ZSetCmd::Rem { .. } => "zrem",
            ZSetCmd::Card { .. } => "zcard",
            ZSetCmd::Count { .. } => "zcount",
            ZSetCmd::LexCount { .. } => "zlexcount",
            ZSetCmd::Score { .. } => "zscore",
            ZSetCmd::MScore { .. } => "zmscore",
            ZSetCmd::Rank { reverse: false, .. } => "zrank",
            ZSetCmd::Rank { reverse: true, .. } => "zrevrank",
            ZSetCmd::Range(c) => c.name,
            ZSetCmd::Pop(c) => c.name(),
            ZSetCmd::Algebra(c) => c.name(),
            ZSetCmd::Scan(_) => "zscan",
        }
    }

    /// The user keys (a destination first, then the inputs).
    pub fn keys(&self) -> Vec<&[u8]> {
        match self {
            ZSetCmd::Add { key, .. }
            | ZSetCmd::Rem { key, .. }
            | ZSetCmd::Card { key }
            | ZSetCmd::Count { key, .. }
            | ZSetCmd::LexCount { key, .. }
            | ZSetCmd::Score { key, .. }
            | ZSetCmd::MScore { key, .. }
            | ZSetCmd::Rank { key, .. }
            | ZSetCmd::RemRange { key, .. } => vec![key],
            ZSetCmd::Range(c) => match &c.dest {
                Some(dest) => vec![dest, &c.key],
                None => vec![&c.key],
            },
            ZSetCmd::Pop(c) => c.keys(),
            ZSetCmd::Algebra(c) => c.keys(),
            ZSetCmd::Scan(c) => vec![&c.key],
        }
    }

    /// Whether the command may create a key.
    pub fn creates_keys(&self) -> bool {
        match self {
            ZSetCmd::Add { .. } => true,
            ZSetCmd::Range(c) => c.dest.is_some(),
            ZSetCmd::Algebra(c) => c.stores(),
            _ => false,
        }
    }

    /// A blocking command's timeout (BZPOPMIN BZPOPMAX BZMPOP; ms, 0 = forever).
    pub fn blocking_timeout_ms(&self) -> Option<u64> {
        match self {
            ZSetCmd::Pop(c) => c.blocking_timeout_ms(),
            _ => None,
        }
    }

    /// Runs the command.
    pub(super) fn execute(&self, db: &mut Db<'_>) -> CmdResult {
        match self {
            ZSetCmd::Add {
                key, flags, pairs, ..
            } => add(db, key, *flags, pairs),
            ZSetCmd::Rem { key, members } => {
                let Some(mut meta) = access::open(db, key)? else {
                    return Ok(Frame::Integer(0));
                };
                let mut deleted = 0;
                for m in members {
                    if let Some(score) = access::score(db, key, &meta, m)? {
                        access::remove(db, key, &mut meta, m, score)?;
                        deleted += 1;
                        if meta.size == 0 {
                            break;
                        }
                    }
                }
                // Nothing removed: the key is not touched (a WATCH of it holds).
                if deleted > 0 {
                    db.put_meta(key, &meta)?;
                }
                Ok(Frame::Integer(deleted))
            }
            ZSetCmd::Card { key } => Ok(Frame::Integer(
                access::open(db, key)?.map_or(0, |m| m.size as i64),
            )),
            ZSetCmd::Count { key, range } => range::count(db, key, range),
            ZSetCmd::LexCount { key, range } => range::lex_count(db, key, range),
            ZSetCmd::Score { key, member } => {
                let Some(meta) = access::open(db, key)? else {
                    return Ok(Frame::Null);
                };
                Ok(access::score(db, key, &meta, member)?.map_or(Frame::Null, score_frame))
            }
            ZSetCmd::MScore { key, members } => {
                let meta = access::open(db, key)?;
                let mut out = Vec::with_capacity(members.len());
                for m in members {
                    let score = match &meta {
                        Some(meta) => access::score(db, key, meta, m)?,
                        None => None,
                    };
                    out.push(score.map_or(Frame::Null, score_frame));
                }
                Ok(Frame::Array(out))
            }
            ZSetCmd::Rank {
                key,
                member,
                reverse,
            } => {
                let Some(meta) = access::open(db, key)? else {
                    return Ok(Frame::Null);
                };
                let Some(score) = access::score(db, key, &meta, member)? else {
                    return Ok(Frame::Null);
                };
                let rank = access::rank(db, key, &meta, score, member)?;
                let rank = if *reverse { meta.size - 1 - rank } else { rank };
                Ok(Frame::Integer(rank as i64))
            }
            ZSetCmd::Range(c) => c.execute(db),
            ZSetCmd::RemRange { key, selector, .. } => range::rem_range(db, key, selector),
            ZSetCmd::Pop(c) => c.execute(db),
            ZSetCmd::Algebra(c) => c.execute(db),
            ZSetCmd::Scan(c) => c.execute(db),
        }
    }
}

/// ZADD / ZINCRBY (`zaddGenericCommand` with `zsetAdd`).
fn add(db: &mut Db<'_>, key: &[u8], flags: AddFlags, pairs: &[(f64, Bytes)]) -> CmdResult {
    let meta = access::open(db, key)?;
    let mut meta = match meta {
        Some(m) => m,
        None if flags.xx => {
            return Ok(if flags.incr {
                Frame::Null
            } else {
                Frame::Integer(0)
            });
        }
        None => db.new_meta(keyway_storage::ValueKind::ZSet),
    };
    let (mut added, mut updated, mut processed) = (0i64, 0i64, 0i64);
    let mut last = 0.0;
    for (score, member) in pairs {
        let mut score = *score;
        match access::score(db, key, &meta, member)? {
            Some(cur) => {
                if flags.nx {
                    continue;
                }
                if flags.incr {
                    score += cur;
                    if score.is_nan() {
                        return Ok(err("ERR resulting score is not a number (NaN)"));
                    }
                }
                if (flags.lt && score >= cur) || (flags.gt && score <= cur) {
                    continue;
                }
                last = score;
                if score != cur {
                    access::put(db, key, &mut meta, member, Some(cur), score)?;
                    updated += 1;
                }
                processed += 1;
            }
            None if !flags.xx => {
                access::put(db, key, &mut meta, member, None, score)?;
                last = score;
                added += 1;
                processed += 1;
            }
            None => {}
        }
    }
    // Neither added nor changed: the key is not touched, as Redis signals
    // a modification only then (a WATCH of it holds).
    if added > 0 || updated > 0 {
        db.put_meta(key, &meta)?;
    }
    Ok(if flags.incr {
        if processed > 0 {
            score_frame(last)
        } else {
            Frame::Null
        }
    } else if flags.ch {
        Frame::Integer(added + updated)
    } else {
        Frame::Integer(added)
    })
}
