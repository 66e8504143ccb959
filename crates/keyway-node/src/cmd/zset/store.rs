//! ZUNION ZINTER ZDIFF ZUNIONSTORE ZINTERSTORE ZDIFFSTORE ZINTERCARD:
//! `zunionInterDiffGenericCommand`. Inputs may be sets (score 1) or sorted
//! sets; missing keys are empty.
//!
//! Check order as Redis: the key count (`ERR at least 1 input key is needed
//! for '<cmd>' command`, syntax error if it exceeds the arguments) before
//! routing; then the inputs' types (WRONGTYPE), then the options (WEIGHTS,
//! AGGREGATE, WITHSCORES, LIMIT). Union and intersection combine the inputs
//! in ascending cardinality (a stable sort, as glibc's `qsort`), which fixes
//! the floating-point order of SUM; `inf + -inf` sums to 0 and `0 * inf`
//! weighs 0, as in Redis.

use std::collections::HashMap;

use bytes::Bytes;
use keyway_resp::Frame;

use super::access::{self, Entry, Source};
use super::score::parse_score;
use crate::cmd::{CmdResult, errors, parse_i64};
use crate::db::Db;

/// Which operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Union,
    Inter,
    Diff,
}

/// How scores of one member combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Aggregate {
    Sum,
    Min,
    Max,
}

/// The options after the keys.
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    weights: Vec<f64>,
    aggregate: Aggregate,
    withscores: bool,
    /// ZINTERCARD's LIMIT (0 = none).
    limit: u64,
}

/// A parsed set-algebra command.
#[derive(Clone, Debug, PartialEq)]
pub struct AlgebraCmd {
    name: &'static str,
    op: Op,
    dest: Option<Bytes>,
    keys: Vec<Bytes>,
    /// Reported only after the inputs' types are checked, as Redis does.
    options: Result<Options, Frame>,
    card_only: bool,
}

fn err(msg: &str) -> Frame {
    Frame::Error(msg.to_owned())
}

impl AlgebraCmd {
    pub(super) fn parse(name: &'static str, args: &[Bytes]) -> Result<AlgebraCmd, Frame> {
        let (op, store, card_only) = match name {
            "zunion" => (Op::Union, false, false),
            "zinter" => (Op::Inter, false, false),
            "zdiff" => (Op::Diff, false, false),
            "zintercard" => (Op::Inter, false, true),
            "zunionstore" => (Op::Union, true, false),
            "zinterstore" => (Op::Inter, true, false),
            _ => (Op::Diff, true, false),
        };
        let numkeys_at = if store { 2 } else { 1 };
        let setnum = parse_i64(args.get(numkeys_at).map_or(&[][..], |a| &a[..]))
            .ok_or_else(|| err(errors::NOT_INTEGER))?;
        if setnum < 1 {
            return Err(Frame::Error(format!(
                "ERR at least 1 input key is needed for '{name}' command"
            )));
        }
        let first = numkeys_at + 1;
        if setnum > (args.len() - first) as i64 {
            return Err(err(errors::SYNTAX));
        }
        let n = setnum as usize;
        let keys = args[first..first + n].to_vec();
        let options = parse_options(&args[first + n..], op, n, store, card_only);
        Ok(AlgebraCmd {
            name,
            op,
            dest: store.then(|| args[1].clone()),
            keys,
            options,
            card_only,
        })
    }

    pub(super) fn name(&self) -> &'static str {
        self.name
    }

    pub(super) fn stores(&self) -> bool {
        self.dest.is_some()
    }

    pub(super) fn keys(&self) -> Vec<&[u8]> {
        let mut keys: Vec<&[u8]> = Vec::with_capacity(self.keys.len() + 1);
        if let Some(d) = &self.dest {
            keys.push(d);
        }
        keys.extend(self.keys.iter().map(|k| &k[..]));
        keys
    }

    pub(super) fn execute(&self, db: &mut Db<'_>) -> CmdResult {
        let mut sources = Vec::with_capacity(self.keys.len());
        for key in &self.keys {
            sources.push(Source::open(db, key)?);
        }
        let opts = match &self.options {
            Ok(o) => o,
            Err(e) => return Ok(e.clone()),
        };
        // (input index, key, source, weight), in combining order.
        let mut inputs: Vec<(usize, &Bytes, Source, f64)> = sources
            .into_iter()
            .enumerate()
            .map(|(i, s)| {
                (
                    i,
                    &self.keys[i],
                    s,
                    opts.weights.get(i).copied().unwrap_or(1.0),
                )
            })
            .collect();
        if self.op != Op::Diff {
            inputs.sort_by_key(|(_, _, s, _)| s.len());
        }
        let result = match self.op {
            Op::Union => union(db, &inputs, opts.aggregate)?,
            Op::Inter => {
                if self.card_only {
                    return Ok(Frame::Integer(inter_card(db, &inputs, opts.limit)? as i64));
                }
                inter(db, &inputs, opts.aggregate)?
            }
            Op::Diff => diff(db, &inputs)?,
        };
        let mut result = result;
        result.sort_by(|a, b| {
            a.score
                .partial_cmp(&b.score)
                .unwrap_or(std::cmp::Ordering::Equal)
                .then_with(|| a.member.cmp(&b.member))
        });
        match &self.dest {
            Some(dest) => {
                access::store(db, dest, &result)?;
                Ok(Frame::Integer(result.len() as i64))
            }
            None => Ok(super::range::entries_reply(result, opts.withscores)),
        }
    }
}

fn parse_options(
    rest: &[Bytes],
    op: Op,
    setnum: usize,
    store: bool,
    card_only: bool,
) -> Result<Options, Frame> {
    let mut o = Options {
        weights: Vec::new(),
        aggregate: Aggregate::Sum,
        withscores: false,
        limit: 0,
    };
    let mut j = 0;
    while j < rest.len() {
        let remaining = rest.len() - j;
        let a = &rest[j];
        if op != Op::Diff && !card_only && remaining > setnum && a.eq_ignore_ascii_case(b"weights")
        {
            j += 1;
            o.weights.clear();
            for w in &rest[j..j + setnum] {
                o.weights
                    .push(parse_score(w).ok_or_else(|| err("ERR weight value is not a float"))?);
            }
            j += setnum;
        } else if op != Op::Diff
            && !card_only
            && remaining >= 2
            && a.eq_ignore_ascii_case(b"aggregate")
        {
            let v = &rest[j + 1];
            o.aggregate = if v.eq_ignore_ascii_case(b"sum") {
                Aggregate::Sum
            } else if v.eq_ignore_ascii_case(b"min") {
                Aggregate::Min
            } else if v.eq_ignore_ascii_case(b"max") {
                Aggregate::Max
            } else {
                return Err(err(errors::SYNTAX));
            };
            j += 2;
        } else if !store && !card_only && a.eq_ignore_ascii_case(b"withscores") {
            o.withscores = true;
            j += 1;
        } else if card_only && remaining >= 2 && a.eq_ignore_ascii_case(b"limit") {
            let v = parse_i64(&rest[j + 1]).ok_or_else(|| err("ERR LIMIT can't be negative"))?;
            if v < 0 {
                return Err(err("ERR LIMIT can't be negative"));
            }
            o.limit = v as u64;
            j += 2;
        } else {
            return Err(err(errors::SYNTAX));
        }
    }
    Ok(o)
}

/// `zunionInterAggregate`.
fn aggregate(target: &mut f64, val: f64, how: Aggregate) {
    match how {
        Aggregate::Sum => {
            *target += val;
            if target.is_nan() {
                *target = 0.0;
            }
        }
        Aggregate::Min => {
            if val < *target {
                *target = val;
            }
        }
        Aggregate::Max => {
            if val > *target {
                *target = val;
            }
        }
    }
}

/// `weight * score`, with NaN (`0 * inf`) as 0.
fn weighted(weight: f64, score: f64) -> f64 {
    let s = weight * score;
    if s.is_nan() { 0.0 } else { s }
}

type Input<'k> = (usize, &'k Bytes, Source, f64);

fn union(
    db: &mut Db<'_>,
    inputs: &[Input<'_>],
    how: Aggregate,
) -> Result<Vec<Entry>, crate::cmd::CmdError> {
    let mut acc: HashMap<Bytes, f64> = HashMap::new();
    let mut order: Vec<Bytes> = Vec::new();
    for (_, key, src, weight) in inputs {
        for e in src.entries(db, key)? {
            let score = weighted(*weight, e.score);
            match acc.get_mut(&e.member) {
                Some(t) => aggregate(t, score, how),
                None => {
                    order.push(e.member.clone());
                    acc.insert(e.member, score);
                }
            }
        }
    }
    Ok(order
        .into_iter()
        .map(|m| {
            let score = acc[&m];
            Entry { member: m, score }
        })
        .collect())
}

fn inter(
    db: &mut Db<'_>,
    inputs: &[Input<'_>],
    how: Aggregate,
) -> Result<Vec<Entry>, crate::cmd::CmdError> {
    let mut out = Vec::new();
    let Some(((_, key0, src0, w0), rest)) = inputs.split_first() else {
        return Ok(out);
    };
    if src0.len() == 0 {
        return Ok(out);
    }
    'members: for e in src0.entries(db, key0)? {
        let mut score = weighted(*w0, e.score);
        for (_, key, src, weight) in rest {
            let value = if *key == *key0 {
                e.score * weight
            } else {
                match src.find(db, key, &e.member)? {
                    Some(s) => s * weight,
                    None => continue 'members,
                }
            };
            aggregate(&mut score, value, how);
        }
        out.push(Entry {
            member: e.member,
            score,
        });
    }
    Ok(out)
}

fn inter_card(
    db: &mut Db<'_>,
    inputs: &[Input<'_>],
    limit: u64,
) -> Result<u64, crate::cmd::CmdError> {
    let mut n = 0;
    let Some(((_, key0, src0, _), rest)) = inputs.split_first() else {
        return Ok(0);
    };
    if src0.len() == 0 {
        return Ok(0);
    }
    'members: for e in src0.entries(db, key0)? {
        for (_, key, src, _) in rest {
            if *key != *key0 && src.find(db, key, &e.member)?.is_none() {
                continue 'members;
            }
        }
        n += 1;
        if limit > 0 && n >= limit {
            break;
        }
    }
    Ok(n)
}

fn diff(db: &mut Db<'_>, inputs: &[Input<'_>]) -> Result<Vec<Entry>, crate::cmd::CmdError> {
    let mut out = Vec::new();
    let Some(((_, key0, src0, _), rest)) = inputs.split_first() else {
        return Ok(out);
    };
    if rest.iter().any(|(_, k, _, _)| *k == *key0) {
        return Ok(out);
    }
    'members: for e in src0.entries(db, key0)? {
        for (_, key, src, _) in rest {
            if src.find(db, key, &e.member)?.is_some() {
                continue 'members;
            }
        }
        out.push(e);
    }
    Ok(out)
}
