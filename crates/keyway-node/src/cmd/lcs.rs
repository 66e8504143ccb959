//! LCS: the longest common subsequence of two strings (Redis 7.0
//! `lcsCommand`, `t_string.c`).
//!
//! Redis reads both keys before it parses the options, so a non-string key
//! (`ERR The specified keys must contain string values`) wins over a syntax
//! error; a missing key is the empty string. The table is Redis's dynamic
//! program over `u32` cells, refused when it would exceed
//! `proto-max-bulk-len` bytes (`ERR Insufficient memory, transient memory
//! for LCS exceeds proto-max-bulk-len`). `IDX` replies the matching ranges
//! from the end of the strings backwards, as Redis walks them.

use bytes::Bytes;
use keyway_resp::Frame;

use super::{CmdResult, errors, is_string, parse_i64, reply_err};
use crate::db::Db;

/// `LCS a b [options]`; the options are parsed when it runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LcsCmd {
    a: Bytes,
    b: Bytes,
    options: Vec<Bytes>,
}

#[derive(Default)]
struct Options {
    len: bool,
    idx: bool,
    with_match_len: bool,
    min_match_len: u64,
}

fn parse_options(opts: &[Bytes]) -> Result<Options, Frame> {
    let mut o = Options::default();
    let mut j = 0;
    while let Some(opt) = opts.get(j) {
        let more = j + 1 < opts.len();
        if opt.eq_ignore_ascii_case(b"idx") {
            o.idx = true;
        } else if opt.eq_ignore_ascii_case(b"len") {
            o.len = true;
        } else if opt.eq_ignore_ascii_case(b"withmatchlen") {
            o.with_match_len = true;
        } else if opt.eq_ignore_ascii_case(b"minmatchlen") && more {
            let n = parse_i64(&opts[j + 1]).ok_or_else(|| Frame::error(errors::NOT_INTEGER))?;
            o.min_match_len = n.max(0) as u64;
            j += 1;
        } else {
            return Err(Frame::error(errors::SYNTAX));
        }
        j += 1;
    }
    if o.len && o.idx {
        return Err(Frame::error(
            "ERR If you want both the length and indexes, please just use IDX.",
        ));
    }
    Ok(o)
}

impl LcsCmd {
    pub(super) fn parse(args: &[Bytes]) -> Self {
        LcsCmd {
            a: args.get(1).cloned().unwrap_or_default(),
            b: args.get(2).cloned().unwrap_or_default(),
            options: args.get(3..).unwrap_or_default().to_vec(),
        }
    }

    pub(super) fn keys(&self) -> Vec<&[u8]> {
        vec![&self.a, &self.b]
    }

    pub(super) fn execute(&self, db: &mut Db<'_>) -> CmdResult {
        let a = db.get(&self.a)?;
        let b = db.get(&self.b)?;
        if a.as_ref().is_some_and(|v| !is_string(v)) || b.as_ref().is_some_and(|v| !is_string(v)) {
            return Err(reply_err(
                "ERR The specified keys must contain string values",
            ));
        }
        let a = a.map(|v| v.data).unwrap_or_default();
        let b = b.map(|v| v.data).unwrap_or_default();
        let o = parse_options(&self.options).map_err(super::CmdError::Reply)?;
        if a.len() >= u32::MAX as usize - 1 || b.len() >= u32::MAX as usize - 1 {
            return Err(reply_err("ERR String too long for LCS"));
        }
        let cells = (a.len() as u128 + 1) * (b.len() as u128 + 1);
        if cells * 4 > db.limits().max_value_bytes as u128 {
            return Err(reply_err(
                "ERR Insufficient memory, transient memory for LCS exceeds proto-max-bulk-len",
            ));
        }
        Ok(lcs(&a, &b, &o))
    }
}

/// Redis's algorithm and reply shapes.
fn lcs(a: &[u8], b: &[u8], o: &Options) -> Frame {
    let (alen, blen) = (a.len(), b.len());
    let w = blen + 1;
    let mut t = vec![0u32; (alen + 1) * w];
    for i in 1..=alen {
        for j in 1..=blen {
            t[i * w + j] = if a[i - 1] == b[j - 1] {
                t[(i - 1) * w + j - 1] + 1
            } else {
                t[(i - 1) * w + j].max(t[i * w + j - 1])
            };
        }
    }
    let total = t[alen * w + blen];
    if o.len && !o.idx {
        return Frame::Integer(i64::from(total));
    }
    let mut result = vec![0u8; total as usize];
    let mut idx = total as usize;
    let mut matches = Vec::new();
    // `arange_start == alen` means "no range open", as in Redis.
    let (mut a_start, mut a_end, mut b_start, mut b_end) = (alen, 0, 0, 0);
    let (mut i, mut j) = (alen, blen);
    while i > 0 && j > 0 {
        let mut emit = false;
        if a[i - 1] == b[j - 1] {
            result[idx - 1] = a[i - 1];
            if a_start == alen {
                (a_start, a_end, b_start, b_end) = (i - 1, i - 1, j - 1, j - 1);
            } else if a_start == i && b_start == j {
                a_start -= 1;
                b_start -= 1;
            } else {
                emit = true;
            }
            if a_start == 0 || b_start == 0 {
                emit = true;
            }
            idx -= 1;
            i -= 1;
            j -= 1;
        } else {
            if t[(i - 1) * w + j] > t[i * w + j - 1] {
                i -= 1;
            } else {
                j -= 1;
            }
            if a_start != alen {
                emit = true;
            }
        }
        if emit {
            let match_len = (a_end - a_start + 1) as u64;
            if o.idx && (o.min_match_len == 0 || match_len >= o.min_match_len) {
                let mut m = vec![pair(a_start, a_end), pair(b_start, b_end)];
                if o.with_match_len {
                    m.push(Frame::Integer(match_len as i64));
                }
                matches.push(Frame::Array(m));
            }
            a_start = alen;
        }
    }
    if o.idx {
        Frame::Map(vec![
            (Frame::bulk("matches"), Frame::Array(matches)),
            (Frame::bulk("len"), Frame::Integer(i64::from(total))),
        ])
    } else {
        Frame::Bulk(Bytes::from(result))
    }
}

fn pair(start: usize, end: usize) -> Frame {
    Frame::Array(vec![
        Frame::Integer(start as i64),
        Frame::Integer(end as i64),
    ])
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use keyway_resp::Frame;

    fn range(a: (i64, i64), b: (i64, i64), len: Option<i64>) -> Frame {
        let mut v = vec![
            Frame::Array(vec![int(a.0), int(a.1)]),
            Frame::Array(vec![int(b.0), int(b.1)]),
        ];
        v.extend(len.map(int));
        Frame::Array(v)
    }

    #[test]
    fn lcs_string_len_and_idx() {
        // Redis's own example (string.tcl, "LCS indexes").
        let mut t = TestDb::new();
        t.run(&["mset", "a", "ohmytext", "b", "mynewtext"]);
        assert_eq!(t.run(&["lcs", "a", "b"]), bulk("mytext"));
        assert_eq!(t.run(&["lcs", "a", "b", "len"]), int(6));
        let idx = |ranges: Vec<Frame>| {
            Frame::Map(vec![
                (bulk("matches"), Frame::Array(ranges)),
                (bulk("len"), int(6)),
            ])
        };
        assert_eq!(
            t.run(&["lcs", "a", "b", "idx"]),
            idx(vec![
                range((4, 7), (5, 8), None),
                range((2, 3), (0, 1), None)
            ])
        );
        assert_eq!(
            t.run(&["lcs", "a", "b", "idx", "withmatchlen", "minmatchlen", "3"]),
            idx(vec![range((4, 7), (5, 8), Some(4))])
        );
        assert_eq!(t.run(&["lcs", "a", "nope"]), bulk(""));
        assert_eq!(t.run(&["lcs", "nope", "nope2", "len"]), int(0));
    }

    #[test]
    fn lcs_errors_in_redis_order() {
        let mut t = TestDb::new();
        t.run(&["set", "a", "x"]);
        assert_eq!(t.run(&["lcs", "a", "b", "foo"]), err("ERR syntax error"));
        assert_eq!(
            t.run(&["lcs", "a", "b", "minmatchlen"]),
            err("ERR syntax error")
        );
        assert_eq!(
            t.run(&["lcs", "a", "b", "minmatchlen", "x"]),
            err("ERR value is not an integer or out of range")
        );
        assert_eq!(
            t.run(&["lcs", "a", "b", "len", "idx"]),
            err("ERR If you want both the length and indexes, please just use IDX.")
        );
        t.limits.max_value_bytes = 15;
        t.run(&["set", "b", "x"]);
        assert_eq!(
            t.run(&["lcs", "a", "b"]),
            err("ERR Insufficient memory, transient memory for LCS exceeds proto-max-bulk-len")
        );
        t.limits.max_value_bytes = 16;
        assert_eq!(t.run(&["lcs", "a", "b"]), bulk("x"));
    }
}
