//! Scores and ranges as Redis 7.0 reads and prints them.
//!
//! - [`strtod`]: glibc `strtod` on a byte prefix (white space, sign,
//!   decimal and hexadecimal forms, `inf`/`infinity`/`nan`), correctly
//!   rounded, reporting `ERANGE` like glibc (overflow, underflow to zero);
//! - [`parse_score`]: Redis's `string2d` (ZADD scores, ZINCRBY increments,
//!   WEIGHTS): the whole argument, no leading space, no NaN, no `ERANGE` to
//!   infinity or zero;
//! - [`ScoreRange::parse`]: `zslParseRange` (`(` for exclusive, plain
//!   `strtod` otherwise, so `""` is 0 and `1e999` is inf);
//! - [`LexRange::parse`]: `zslParseLexRange` (`[`, `(`, `-`, `+`);
//! - [`keyway_resp::format_double_g17`]: `addReplyDouble` in 7.0, i.e. `%.17g` (`inf`, `-inf`,
//!   `-0`, `1.1000000000000001`, `1e+20`).

use std::cmp::Ordering;

use bytes::Bytes;

/// C's `isspace` in the C locale.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// What `strtod` made of a prefix.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Strtod {
    pub value: f64,
    /// Bytes consumed (0 = no conversion: `eptr == s`).
    pub consumed: usize,
    /// `errno == ERANGE` (overflow to ±inf or underflow).
    pub erange: bool,
}

/// glibc `strtod(s, &eptr)` over `s` (which C would see up to its first NUL).
pub(crate) fn strtod(s: &[u8]) -> Strtod {
    let none = Strtod {
        value: 0.0,
        consumed: 0,
        erange: false,
    };
    let mut i = 0;
    while i < s.len() && is_c_space(s[i]) {
        i += 1;
    }
    let neg = match s.get(i) {
        Some(b'-') => {
            i += 1;
            true
        }
        Some(b'+') => {
            i += 1;
            false
        }
        _ => false,
    };
    let sign = |v: f64| if neg { -v } else { v };
    let rest = &s[i..];
    let starts =
        |word: &[u8]| rest.len() >= word.len() && rest[..word.len()].eq_ignore_ascii_case(word);
    if starts(b"infinity") {
        return Strtod {
            value: sign(f64::INFINITY),
            consumed: i + 8,
            erange: false,
        };
    }
    if starts(b"inf") {
        return Strtod {
            value: sign(f64::INFINITY),
            consumed: i + 3,
            erange: false,
        };
    }
    if starts(b"nan") {
        let mut end = i + 3;
        if s.get(end) == Some(&b'(') {
            let mut j = end + 1;
            while j < s.len() && (s[j].is_ascii_alphanumeric() || s[j] == b'_') {
                j += 1;
            }
            if s.get(j) == Some(&b')') {
                end = j + 1;
            }
        }
        return Strtod {
            value: f64::NAN,
            consumed: end,
            erange: false,
        };
    }
    if rest.len() >= 2 && rest[0] == b'0' && (rest[1] | 0x20) == b'x' {
        if let Some((value, n, erange)) = hex(neg, &rest[2..]) {
            return Strtod {
                value,
                consumed: i + 2 + n,
                erange,
            };
        }
        // "0x" without hex digits: just the "0".
        return Strtod {
            value: sign(0.0),
            consumed: i + 1,
            erange: false,
        };
    }
    match decimal(neg, rest) {
        Some((value, n, erange)) => Strtod {
            value,
            consumed: i + n,
            erange,
        },
        None => none,
    }
}

/// Scans `digits [. digits]` with `is_digit`, then an exponent introduced by
/// `exp_char` (taken only if digits follow). Returns (mantissa digits, digits
/// after the point, exponent, bytes consumed); `None` without any digit.
fn scan_number(
    s: &[u8],
    is_digit: fn(u8) -> bool,
    exp_char: u8,
) -> Option<(Vec<u8>, i64, i64, usize)> {
    let mut i = 0;
    let mut digits = Vec::new();
    let mut frac = 0i64;
    while i < s.len() && is_digit(s[i]) {
        digits.push(s[i]);
        i += 1;
    }
    if i < s.len() && s[i] == b'.' {
        let mut j = i + 1;
        let mut any = false;
        while j < s.len() && is_digit(s[j]) {
            digits.push(s[j]);
            frac += 1;
            j += 1;
            any = true;
        }
        if any || !digits.is_empty() {
            i = j;
        }
    }
    if digits.is_empty() {
        return None;
    }
    let mut exp = 0i64;
    if i < s.len() && (s[i] | 0x20) == exp_char {
        let mut j = i + 1;
        let mut eneg = false;
        if j < s.len() && (s[j] == b'+' || s[j] == b'-') {
            eneg = s[j] == b'-';
            j += 1;
        }
        let start = j;
        while j < s.len() && s[j].is_ascii_digit() {
            exp = (exp * 10 + i64::from(s[j] - b'0')).min(1 << 40);
            j += 1;
        }
        if j > start {
            i = j;
            if eneg {
                exp = -exp;
            }
        } else {
            exp = 0;
        }
    }
    Some((digits, frac, exp, i))
}

fn decimal(neg: bool, s: &[u8]) -> Option<(f64, usize, bool)> {
    let (digits, frac, exp, n) = scan_number(s, |c| c.is_ascii_digit(), b'e')?;
    let nonzero = digits.iter().any(|&d| d != b'0');
    // Rust's parser is correctly rounded like glibc's; hand it a canonical text.
    let mut text = String::with_capacity(digits.len() + 24);
    if neg {
        text.push('-');
    }
    let int_len = digits.len() - frac as usize;
    text.push_str(std::str::from_utf8(&digits[..int_len]).unwrap_or("0"));
    if int_len == 0 {
        text.push('0');
    }
    text.push('.');
    text.push_str(std::str::from_utf8(&digits[int_len..]).unwrap_or(""));
    text.push('0');
    text.push_str(&format!("e{exp}"));
    let value: f64 = text.parse().ok()?;
    let erange = value.is_infinite() || (nonzero && value == 0.0);
    Some((value, n, erange))
}

fn hex(neg: bool, s: &[u8]) -> Option<(f64, usize, bool)> {
    let (digits, frac, exp, n) = scan_number(s, |c| c.is_ascii_hexdigit(), b'p')?;
    // value = m * 2^e2, keeping at most 120 significant bits plus a sticky bit.
    let mut m: u128 = 0;
    let mut e2: i64 = exp.saturating_sub(4 * frac);
    let mut sticky = false;
    for &d in &digits {
        let v = (d as char).to_digit(16).unwrap_or(0) as u128;
        if m >> 116 == 0 {
            m = (m << 4) | v;
        } else {
            sticky |= v != 0;
            e2 += 4;
        }
    }
    if m == 0 {
        return Some((if neg { -0.0 } else { 0.0 }, n, false));
    }
    let v = round_to_f64(m, sticky, e2);
    let erange = v.is_infinite() || v == 0.0;
    Some((if neg { -v } else { v }, n, erange))
}

/// `m * 2^e2` (plus a sticky bit below `m`) rounded to nearest, ties to even.
fn round_to_f64(m: u128, sticky: bool, e2: i64) -> f64 {
    debug_assert!(m != 0);
    let bits = 128 - i64::from(m.leading_zeros());
    // The value's leading bit is 2^(bits - 1 + e2).
    let top = bits - 1 + e2;
    if top > 1023 {
        return f64::INFINITY;
    }
    // The exponent of the result's last mantissa bit.
    let q = (top - 52).max(-1074);
    let shift = q - e2;
    let (mut mant, mut q) = if shift <= 0 {
        ((m << (-shift) as u32) as u64, q)
    } else if shift >= 128 {
        // Below half the smallest subnormal.
        return 0.0;
    } else {
        let kept = m >> shift as u32;
        let rem = m & ((1u128 << shift as u32) - 1);
        let half = 1u128 << (shift as u32 - 1);
        let mut kept = kept as u64;
        if rem > half || (rem == half && (sticky || kept & 1 == 1)) {
            kept += 1;
        }
        (kept, q)
    };
    if mant == 1 << 53 {
        mant >>= 1;
        q += 1;
    }
    if q + 52 > 1023 {
        return f64::INFINITY;
    }
    f64::from_bits((((q + 1074) as u64) << 52) + mant)
}

/// Redis's `string2d`: the whole of `s` is a float, or `None`.
pub(crate) fn parse_score(s: &[u8]) -> Option<f64> {
    if s.is_empty() || is_c_space(s[0]) {
        return None;
    }
    let r = strtod(s);
    if r.consumed != s.len()
        || (r.erange && (r.value.is_infinite() || r.value == 0.0))
        || r.value.is_nan()
    {
        return None;
    }
    Some(r.value)
}

/// A score as a reply element: a RESP3 double, a bulk string in RESP2,
/// both `%.17g` as Redis 7.0's `addReplyDouble`.
pub(crate) fn score_frame(d: f64) -> keyway_resp::Frame {
    keyway_resp::Frame::Double(d)
}

/// `zrangespec`: a score interval with optionally exclusive ends.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScoreRange {
    pub min: f64,
    pub max: f64,
    pub minex: bool,
    pub maxex: bool,
}

impl ScoreRange {
    /// `zslParseRange`; `None` = `ERR min or max is not a float`.
    pub(crate) fn parse(min: &[u8], max: &[u8]) -> Option<ScoreRange> {
        let item = |s: &[u8]| -> Option<(f64, bool)> {
            let (ex, body) = match s.split_first() {
                Some((b'(', rest)) => (true, rest),
                _ => (false, s),
            };
            let r = strtod(body);
            // `eptr[0] != '\0'`: the rest must be empty or start with a NUL.
            if !(r.consumed == body.len() || body[r.consumed] == 0) || r.value.is_nan() {
                return None;
            }
            Some((r.value, ex))
        };
        let (min, minex) = item(min)?;
        let (max, maxex) = item(max)?;
        Some(ScoreRange {
            min,
            max,
            minex,
            maxex,
        })
    }

    /// Whether no score can be in the range (`zslIsInRange`'s first test).
    pub(crate) fn is_empty(&self) -> bool {
        self.min > self.max || (self.min == self.max && (self.minex || self.maxex))
    }

    /// `zslValueGteMin && zslValueLteMax`.
    #[cfg(test)]
    pub(crate) fn contains(&self, v: f64) -> bool {
        (if self.minex {
            v > self.min
        } else {
            v >= self.min
        }) && (if self.maxex {
            v < self.max
        } else {
            v <= self.max
        })
    }
}

/// One end of a lex range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LexBound {
    /// `-`: below every string.
    Min,
    /// `+`: above every string.
    Max,
    /// `[x` (`exclusive: false`) or `(x`.
    Value { value: Bytes, exclusive: bool },
}

/// `zlexrangespec`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LexRange {
    pub min: LexBound,
    pub max: LexBound,
}

impl LexBound {
    fn parse(s: &[u8]) -> Option<LexBound> {
        // C sees the argument up to its NUL: `+\0...` is `+`.
        let alone = s.len() == 1 || s.get(1) == Some(&0);
        match s.first()? {
            b'+' if alone => Some(LexBound::Max),
            b'-' if alone => Some(LexBound::Min),
            b'(' => Some(LexBound::Value {
                value: Bytes::copy_from_slice(&s[1..]),
                exclusive: true,
            }),
            b'[' => Some(LexBound::Value {
                value: Bytes::copy_from_slice(&s[1..]),
                exclusive: false,
            }),
            _ => None,
        }
    }

    /// `sdscmplex(value, bound)`.
    fn cmp_value(&self, v: &[u8]) -> Ordering {
        match self {
            LexBound::Min => Ordering::Greater,
            LexBound::Max => Ordering::Less,
            LexBound::Value { value, .. } => v.cmp(value),
        }
    }

    fn exclusive(&self) -> bool {
        match self {
            LexBound::Min | LexBound::Max => true,
            LexBound::Value { exclusive, .. } => *exclusive,
        }
    }
}

impl LexRange {
    /// `zslParseLexRange`; `None` = `ERR min or max not valid string range item`.
    pub(crate) fn parse(min: &[u8], max: &[u8]) -> Option<LexRange> {
        Some(LexRange {
            min: LexBound::parse(min)?,
            max: LexBound::parse(max)?,
        })
    }

    /// `zslLexValueGteMin`.
    pub(crate) fn gte_min(&self, v: &[u8]) -> bool {
        match self.min.cmp_value(v) {
            Ordering::Greater => true,
            Ordering::Equal => !self.min.exclusive(),
            Ordering::Less => false,
        }
    }

    /// `zslLexValueLteMax`.
    pub(crate) fn lte_max(&self, v: &[u8]) -> bool {
        match self.max.cmp_value(v) {
            Ordering::Less => true,
            Ordering::Equal => !self.max.exclusive(),
            Ordering::Greater => false,
        }
    }

    /// Whether no string can be in the range (`zslIsInLexRange`'s first test).
    pub(crate) fn is_empty(&self) -> bool {
        match (&self.min, &self.max) {
            (LexBound::Max, _) | (_, LexBound::Min) => true,
            (LexBound::Min, _) | (_, LexBound::Max) => false,
            (
                LexBound::Value {
                    value: a,
                    exclusive: ax,
                },
                LexBound::Value {
                    value: b,
                    exclusive: bx,
                },
            ) => match a.cmp(b) {
                Ordering::Greater => true,
                Ordering::Equal => *ax || *bx,
                Ordering::Less => false,
            },
        }
    }

    #[cfg(test)]
    pub(crate) fn contains(&self, v: &[u8]) -> bool {
        self.gte_min(v) && self.lte_max(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_17g() {
        for (v, want) in [
            (1.1, "1.1000000000000001"),
            (0.1, "0.10000000000000001"),
            (1e20, "1e+20"),
            (1e-5, "1.0000000000000001e-05"),
            (123456789012345678.0, "1.2345678901234568e+17"),
            (1e16, "10000000000000000"),
            (1e17, "1e+17"),
            (-0.0, "-0"),
            (0.0, "0"),
            (5e-324, "4.9406564584124654e-324"),
            (1.0 + 2f64.powi(-17), "1.0000076293945312"),
            (1.25, "1.25"),
            (-3.0, "-3"),
            (0.0001, "0.0001"),
            (0.00001, "1.0000000000000001e-05"),
            (1.5e300, "1.5000000000000001e+300"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
            (4.5e15 + 0.5, "4500000000000000.5"),
        ] {
            assert_eq!(keyway_resp::format_double_g17(v), want, "{v:e}");
        }
    }

    #[test]
    fn string2d_rules() {
        for (s, want) in [
            ("1", Some(1.0)),
            ("-1.5", Some(-1.5)),
            ("+2", Some(2.0)),
            (".5", Some(0.5)),
            ("5.", Some(5.0)),
            ("1e3", Some(1000.0)),
            ("1E-2", Some(0.01)),
            ("inf", Some(f64::INFINITY)),
            ("-Infinity", Some(f64::NEG_INFINITY)),
            ("+inf", Some(f64::INFINITY)),
            ("0x10", Some(16.0)),
            ("0x1p-2", Some(0.25)),
            ("0X.8", Some(0.5)),
            ("-0", Some(-0.0)),
            ("4e-320", Some(4e-320)),
            ("1e400", None),
            ("1e-400", None),
            ("nan", None),
            ("", None),
            (" 1", None),
            ("1 ", None),
            ("1e", None),
            (".", None),
            ("abc", None),
            ("0x", None),
            ("1\0", None),
            ("infinit", None),
        ] {
            let got = parse_score(s.as_bytes());
            match (got, want) {
                (Some(g), Some(w)) => assert!(
                    g == w && g.is_sign_negative() == w.is_sign_negative(),
                    "{s:?}: {g}"
                ),
                (g, w) => assert_eq!(g, w, "{s:?}"),
            }
        }
    }

    #[test]
    fn hex_rounding_matches_decimal() {
        assert_eq!(parse_score(b"0x1.fffffffffffff8p0"), Some(2.0));
        assert_eq!(
            parse_score(b"0x1.fffffffffffff7p0"),
            Some(f64::from_bits(0x3fff_ffff_ffff_ffff))
        );
        assert_eq!(parse_score(b"0x1p-1074"), Some(5e-324));
        assert_eq!(parse_score(b"0x1p-1075"), None, "rounds to zero: ERANGE");
        assert_eq!(parse_score(b"0x1.8p-1074"), Some(1e-323));
        assert_eq!(parse_score(b"0x1p1024"), None);
        assert_eq!(parse_score(b"0x1.fffffffffffffp1023"), Some(f64::MAX));
    }

    #[test]
    fn score_ranges() {
        let r = ScoreRange::parse(b"(1", b"2").unwrap();
        assert!(!r.contains(1.0) && r.contains(1.5) && r.contains(2.0));
        let r = ScoreRange::parse(b"", b"(").unwrap();
        assert_eq!((r.min, r.max, r.minex, r.maxex), (0.0, 0.0, false, true));
        assert!(r.is_empty());
        let r = ScoreRange::parse(b"-inf", b"1e999").unwrap();
        assert_eq!(r.max, f64::INFINITY);
        assert!(
            ScoreRange::parse(b" 1", b"2").is_some(),
            "strtod skips leading space"
        );
        assert!(
            ScoreRange::parse(b"1\0x", b"2").is_some(),
            "C stops at the NUL"
        );
        assert!(ScoreRange::parse(b"1 ", b"2").is_none());
        assert!(ScoreRange::parse(b"nan", b"2").is_none());
        assert!(ScoreRange::parse(b"a", b"2").is_none());
        assert!(ScoreRange::parse(b"( 1", b"2").is_some());
    }

    #[test]
    fn lex_ranges() {
        let r = LexRange::parse(b"[b", b"(d").unwrap();
        assert!(!r.contains(b"a") && r.contains(b"b") && r.contains(b"c") && !r.contains(b"d"));
        let r = LexRange::parse(b"-", b"+").unwrap();
        assert!(r.contains(b"") && !r.is_empty());
        assert!(LexRange::parse(b"+", b"-").unwrap().is_empty());
        assert!(LexRange::parse(b"(a", b"[a").unwrap().is_empty());
        assert!(!LexRange::parse(b"[a", b"[a").unwrap().is_empty());
        assert!(LexRange::parse(b"a", b"+").is_none());
        assert!(LexRange::parse(b"", b"+").is_none());
        assert!(LexRange::parse(b"+x", b"+").is_none());
        assert_eq!(LexRange::parse(b"+\0x", b"+").unwrap().min, LexBound::Max);
    }
}
