//! ZRANGE in all its forms (by rank, BYSCORE, BYLEX, REV, LIMIT,
//! WITHSCORES), the deprecated ZRANGEBYSCORE ZREVRANGEBYSCORE ZRANGEBYLEX
//! ZREVRANGEBYLEX ZREVRANGE, ZRANGESTORE, ZCOUNT, ZLEXCOUNT and
//! ZREMRANGEBYRANK / BYSCORE / BYLEX: Redis 7.0's `zrangeGenericCommand`
//! argument rules and the selection semantics of its listpack walk.
//!
//! Score ranges seek the score index; rank ranges walk it from the nearer
//! end. Lex ranges assume, as Redis documents, that all members have one
//! score: then they seek inside that score's run; with mixed scores they
//! walk the index in order like Redis's listpack code (first member `>=
//! min`, then while `<= max`).

use bytes::Bytes;
use keyway_resp::Frame;

use super::access::{self, Entry, Walk};
use super::score::{LexBound, LexRange, ScoreRange, score_frame};
use crate::cmd::{CmdError, CmdResult, errors, parse_i64};
use crate::coll::layout::{self, Meta};
use crate::db::Db;

/// What selects the members.
#[derive(Clone, Debug, PartialEq)]
pub enum Selector {
    /// `start stop` ranks (negative from the end).
    Rank { start: i64, end: i64 },
    /// A score interval.
    Score(ScoreRange),
    /// A lex interval.
    Lex(LexRange),
}

/// A parsed ZRANGE-family read (or ZRANGESTORE).
#[derive(Clone, Debug, PartialEq)]
pub struct RangeCmd {
    pub(super) name: &'static str,
    pub(super) key: Bytes,
    /// ZRANGESTORE's destination.
    pub(super) dest: Option<Bytes>,
    pub(super) selector: Selector,
    pub(super) reverse: bool,
    pub(super) withscores: bool,
    /// `LIMIT offset count` (count < 0 = all).
    pub(super) limit: Option<(i64, i64)>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Auto,
    Rank,
    Score,
    Lex,
}

fn err(msg: &str) -> Frame {
    Frame::Error(msg.to_owned())
}

fn long(s: &[u8]) -> Result<i64, Frame> {
    parse_i64(s).ok_or_else(|| err(errors::NOT_INTEGER))
}

/// `zrangeGenericCommand`'s parsing for `name` (`args[0]` is the name).
pub(super) fn parse(name: &'static str, args: &[Bytes]) -> Result<RangeCmd, Frame> {
    let (store, start_at, mut kind, mut reverse, fixed_dir) = match name {
        "zrange" => (false, 1, Kind::Auto, false, false),
        "zrangestore" => (true, 2, Kind::Auto, false, false),
        "zrevrange" => (false, 1, Kind::Rank, true, true),
        "zrangebyscore" => (false, 1, Kind::Score, false, true),
        "zrevrangebyscore" => (false, 1, Kind::Score, true, true),
        "zrangebylex" => (false, 1, Kind::Lex, false, true),
        _ => (false, 1, Kind::Lex, true, true),
    };
    let arg = |i: usize| args.get(i).cloned().unwrap_or_default();
    let key = arg(start_at);
    let mut withscores = false;
    let mut limit = None;
    let mut j = start_at + 3;
    while j < args.len() {
        let a = &args[j];
        let left = args.len() - j - 1;
        if !store && a.eq_ignore_ascii_case(b"withscores") {
            withscores = true;
        } else if a.eq_ignore_ascii_case(b"limit") && left >= 2 {
            let offset = long(&args[j + 1])?;
            let count = long(&args[j + 2])?;
            limit = Some((offset, count));
            j += 2;
        } else if !fixed_dir && a.eq_ignore_ascii_case(b"rev") {
            reverse = true;
        } else if kind == Kind::Auto && a.eq_ignore_ascii_case(b"bylex") {
            kind = Kind::Lex;
        } else if kind == Kind::Auto && a.eq_ignore_ascii_case(b"byscore") {
            kind = Kind::Score;
        } else {
            return Err(err(errors::SYNTAX));
        }
        j += 1;
    }
    if kind == Kind::Auto {
        kind = Kind::Rank;
    }
    // Redis tests `opt_limit != -1`: `LIMIT x -1` passes with a rank range (and is ignored).
    if kind == Kind::Rank && limit.is_some_and(|(_, count)| count != -1) {
        return Err(err(
            "ERR syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX",
        ));
    }
    if withscores && kind == Kind::Lex {
        return Err(err(
            "ERR syntax error, WITHSCORES not supported in combination with BYLEX",
        ));
    }
    let (mut lo, mut hi) = (arg(start_at + 1), arg(start_at + 2));
    if reverse && kind != Kind::Rank {
        std::mem::swap(&mut lo, &mut hi);
    }
    let selector = match kind {
        Kind::Score => Selector::Score(
            ScoreRange::parse(&lo, &hi).ok_or_else(|| err("ERR min or max is not a float"))?,
        ),
        Kind::Lex => Selector::Lex(
            LexRange::parse(&lo, &hi)
                .ok_or_else(|| err("ERR min or max not valid string range item"))?,
        ),
        _ => Selector::Rank {
            start: long(&lo)?,
            end: long(&hi)?,
        },
    };
    Ok(RangeCmd {
        name,
        key,
        dest: store.then(|| arg(1)),
        selector,
        reverse,
        withscores,
        limit,
    })
}

/// Redis's rank sanitising: `Some((start, end))` inclusive and in bounds,
/// `None` if the range is empty.
pub(super) fn clamp_ranks(start: i64, end: i64, len: u64) -> Option<(u64, u64)> {
    let len = len as i64;
    let mut start = if start < 0 { len + start } else { start };
    let mut end = if end < 0 { len + end } else { end };
    if start < 0 {
        start = 0;
    }
    if start > end || start >= len {
        return None;
    }
    if end >= len {
        end = len - 1;
    }
    Some((start as u64, end as u64))
}

/// Members at forward ranks `start..=end`, in forward order, walking from
/// the nearer end.
fn by_rank(
    db: &mut Db<'_>,
    key: &[u8],
    meta: &Meta,
    start: u64,
    end: u64,
) -> Result<Vec<Entry>, CmdError> {
    let want = end - start + 1;
    let mut out = Vec::with_capacity(want.min(1 << 16) as usize);
    if start <= meta.size - 1 - end {
        let mut walk = Walk::all(false);
        walk.skip(db, key, meta, start)?;
        while (out.len() as u64) < want {
            match walk.next(db, key, meta)? {
                Some(e) => out.push(e),
                None => break,
            }
        }
    } else {
        let mut walk = Walk::all(true);
        walk.skip(db, key, meta, meta.size - 1 - end)?;
        while (out.len() as u64) < want {
            match walk.next(db, key, meta)? {
                Some(e) => out.push(e),
                None => break,
            }
        }
        out.reverse();
    }
    Ok(out)
}

/// The index bounds `[from, to)` of a score range.
fn score_bounds(r: &ScoreRange) -> (Vec<u8>, Vec<u8>) {
    let lo = layout::score_to_sortable(r.min);
    let hi = layout::score_to_sortable(r.max);
    let from = if r.minex {
        match lo.checked_add(1) {
            Some(b) => access::score_prefix(b),
            None => access::index_end(),
        }
    } else {
        access::score_prefix(lo)
    };
    let to = if r.maxex {
        access::score_prefix(hi)
    } else {
        match hi.checked_add(1) {
            Some(b) => access::score_prefix(b),
            None => access::index_end(),
        }
    };
    (from, to)
}

/// A walk over exactly the entries of a score range.
fn score_walk(r: &ScoreRange, reverse: bool) -> Walk {
    let (from, to) = score_bounds(r);
    Walk::between(from, to, reverse)
}

/// How a lex range is walked.
enum LexPlan {
    /// Nothing can match.
    Empty,
    /// All members share one score: exactly the entries in `[from, to)`.
    Seek(Walk),
    /// Mixed scores: Redis's linear scan semantics over the whole index.
    Scan(Walk),
}

fn lex_plan(
    db: &mut Db<'_>,
    key: &[u8],
    meta: &Meta,
    r: &LexRange,
    reverse: bool,
) -> Result<LexPlan, CmdError> {
    if r.is_empty() {
        return Ok(LexPlan::Empty);
    }
    let (Some(first), Some(last)) = (
        access::end_entry(db, key, meta, false)?,
        access::end_entry(db, key, meta, true)?,
    ) else {
        return Ok(LexPlan::Empty);
    };
    // zslIsInLexRange: the last member must be >= min, the first <= max.
    if !r.gte_min(&last.member) || !r.lte_max(&first.member) {
        return Ok(LexPlan::Empty);
    }
    let bits = layout::score_to_sortable(first.score);
    if bits != layout::score_to_sortable(last.score) {
        return Ok(LexPlan::Scan(Walk::all(reverse)));
    }
    let base = access::score_prefix(bits);
    let with = |m: &[u8]| {
        let mut v = base.clone();
        v.extend_from_slice(m);
        v
    };
    let from = match &r.min {
        LexBound::Min => base.clone(),
        LexBound::Max => return Ok(LexPlan::Empty),
        LexBound::Value {
            value,
            exclusive: false,
        } => with(value),
        LexBound::Value {
            value,
            exclusive: true,
        } => access::successor(&with(value)),
    };
    let to = match &r.max {
        LexBound::Max => match bits.checked_add(1) {
            Some(b) => access::score_prefix(b),
            None => access::index_end(),
        },
        LexBound::Min => return Ok(LexPlan::Empty),
        LexBound::Value {
            value,
            exclusive: false,
        } => access::successor(&with(value)),
        LexBound::Value {
            value,
            exclusive: true,
        } => with(value),
    };
    Ok(LexPlan::Seek(Walk::between(from, to, reverse)))
}

/// The members a lex range selects, in walk order, after skipping `offset`
/// and taking at most `count` (`None` = all).
fn lex_select(
    db: &mut Db<'_>,
    key: &[u8],
    meta: &Meta,
    r: &LexRange,
    reverse: bool,
    offset: u64,
    count: Option<u64>,
) -> Result<Vec<Entry>, CmdError> {
    let mut out = Vec::new();
    let (mut walk, scan) = match lex_plan(db, key, meta, r, reverse)? {
        LexPlan::Empty => return Ok(out),
        LexPlan::Seek(w) => (w, false),
        LexPlan::Scan(w) => (w, true),
    };
    // In the mixed case, find the starting member like zzlFirstInLexRange /
    // zzlLastInLexRange: the first one on the near side of the range, which
    // must also be within the far side.
    let in_near = |e: &Entry| {
        if reverse {
            r.lte_max(&e.member)
        } else {
            r.gte_min(&e.member)
        }
    };
    let in_far = |e: &Entry| {
        if reverse {
            r.gte_min(&e.member)
        } else {
            r.lte_max(&e.member)
        }
    };
    let mut pending: Option<Entry> = None;
    if scan {
        loop {
            match walk.next(db, key, meta)? {
                None => return Ok(out),
                Some(e) if in_near(&e) => {
                    if !in_far(&e) {
                        return Ok(out);
                    }
                    pending = Some(e);
                    break;
                }
                Some(_) => {}
            }
        }
    }
    let mut skipped = 0;
    loop {
        if count.is_some_and(|c| out.len() as u64 >= c) {
            break;
        }
        let e = match pending.take() {
            Some(e) => e,
            None => match walk.next(db, key, meta)? {
                Some(e) => e,
                None => break,
            },
        };
        if skipped < offset {
            // The offset is skipped without checking the range.
            skipped += 1;
            continue;
        }
        if scan && !in_far(&e) {
            break;
        }
        out.push(e);
    }
    Ok(out)
}

/// The members a score range selects, in walk order.
fn score_select(
    db: &mut Db<'_>,
    key: &[u8],
    meta: &Meta,
    r: &ScoreRange,
    reverse: bool,
    offset: u64,
    count: Option<u64>,
) -> Result<Vec<Entry>, CmdError> {
    let mut out = Vec::new();
    if r.is_empty() {
        return Ok(out);
    }
    let mut walk = score_walk(r, reverse);
    walk.skip(db, key, meta, offset)?;
    while count.is_none_or(|c| (out.len() as u64) < c) {
        match walk.next(db, key, meta)? {
            Some(e) => out.push(e),
            None => break,
        }
    }
    Ok(out)
}

/// Redis's LIMIT semantics: a negative offset selects nothing (its walk
/// runs off the end), a negative count means all.
fn limit_of(limit: Option<(i64, i64)>) -> (u64, Option<u64>, bool) {
    match limit {
        None => (0, None, false),
        Some((offset, _)) if offset < 0 => (0, Some(0), true),
        Some((offset, count)) => (offset as u64, (count >= 0).then_some(count as u64), false),
    }
}

/// The entries a range command selects, in reply order.
fn select(db: &mut Db<'_>, cmd: &RangeCmd, meta: &Meta) -> Result<Vec<Entry>, CmdError> {
    let key = &cmd.key;
    let (offset, count, none) = limit_of(cmd.limit);
    if none && !matches!(cmd.selector, Selector::Rank { .. }) {
        return Ok(Vec::new());
    }
    match &cmd.selector {
        Selector::Rank { start, end } => {
            let Some((s, e)) = clamp_ranks(*start, *end, meta.size) else {
                return Ok(Vec::new());
            };
            if cmd.reverse {
                // Reverse ranks s..=e are forward ranks (n-1-e)..=(n-1-s).
                let n = meta.size;
                let mut v = by_rank(db, key, meta, n - 1 - e, n - 1 - s)?;
                v.reverse();
                Ok(v)
            } else {
                by_rank(db, key, meta, s, e)
            }
        }
        Selector::Score(r) => {
            // genericZrangebyscoreCommand: an offset past the end selects nothing.
            if offset > 0 && offset >= meta.size {
                return Ok(Vec::new());
            }
            score_select(db, key, meta, r, cmd.reverse, offset, count)
        }
        Selector::Lex(r) => lex_select(db, key, meta, r, cmd.reverse, offset, count),
    }
}

/// Members, or with `withscores` `(member, score)` pairs: a flat array in
/// RESP2, an array of pairs in RESP3 (as Redis's WITHSCORES replies).
pub(super) fn entries_reply(entries: Vec<Entry>, withscores: bool) -> Frame {
    if withscores {
        return Frame::Pairs(
            entries
                .into_iter()
                .map(|e| (Frame::Bulk(e.member), score_frame(e.score)))
                .collect(),
        );
    }
    Frame::Array(entries.into_iter().map(|e| Frame::Bulk(e.member)).collect())
}

/// `member score member score ...`, flat in every protocol (ZPOPMIN
/// without a count, BZPOPMIN).
pub(super) fn flat_reply(entries: Vec<Entry>) -> Vec<Frame> {
    let mut out = Vec::with_capacity(entries.len() * 2);
    for e in entries {
        out.push(Frame::Bulk(e.member));
        out.push(score_frame(e.score));
    }
    out
}

impl RangeCmd {
    pub(super) fn execute(&self, db: &mut Db<'_>) -> CmdResult {
        let meta = access::open(db, &self.key)?;
        let entries = match &meta {
            Some(meta) => select(db, self, meta)?,
            None => Vec::new(),
        };
        match &self.dest {
            Some(dest) => {
                let n = entries.len();
                access::store(db, dest, &entries)?;
                Ok(Frame::Integer(n as i64))
            }
            None => Ok(entries_reply(entries, self.withscores)),
        }
    }
}

/// ZCOUNT: members in a score range, counted along the index.
pub(super) fn count(db: &mut Db<'_>, key: &[u8], r: &ScoreRange) -> CmdResult {
    let Some(meta) = access::open(db, key)? else {
        return Ok(Frame::Integer(0));
    };
    if r.is_empty() {
        return Ok(Frame::Integer(0));
    }
    let mut walk = score_walk(r, false);
    let n = walk.skip(db, key, &meta, u64::MAX)?;
    Ok(Frame::Integer(n as i64))
}

/// ZLEXCOUNT.
pub(super) fn lex_count(db: &mut Db<'_>, key: &[u8], r: &LexRange) -> CmdResult {
    let Some(meta) = access::open(db, key)? else {
        return Ok(Frame::Integer(0));
    };
    let n = lex_select(db, key, &meta, r, false, 0, None)?.len();
    Ok(Frame::Integer(n as i64))
}

/// ZREMRANGEBYRANK / BYSCORE / BYLEX.
pub(super) fn rem_range(db: &mut Db<'_>, key: &[u8], selector: &Selector) -> CmdResult {
    let Some(mut meta) = access::open(db, key)? else {
        return Ok(Frame::Integer(0));
    };
    let doomed = match selector {
        Selector::Rank { start, end } => match clamp_ranks(*start, *end, meta.size) {
            Some((s, e)) => by_rank(db, key, &meta, s, e)?,
            None => return Ok(Frame::Integer(0)),
        },
        Selector::Score(r) => score_select(db, key, &meta, r, false, 0, None)?,
        Selector::Lex(r) => lex_select(db, key, &meta, r, false, 0, None)?,
    };
    for e in &doomed {
        access::remove(db, key, &mut meta, &e.member, e.score)?;
    }
    db.put_meta(key, &meta)?;
    Ok(Frame::Integer(doomed.len() as i64))
}
