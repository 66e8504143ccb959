//! A software x87 80-bit `long double`, for INCRBYFLOAT.
//!
//! Redis computes INCRBYFLOAT in `long double` (on x86-64: 64-bit mantissa,
//! 15-bit exponent), parses with `strtold` and replies with `%.17Lf` minus
//! trailing zeros. Doing the same in `f64` gives different bytes (`10.5 + 0.1`
//! is `10.6` in Redis but `10.59999999999999964` in `f64` printed that way),
//! so this module emulates exactly the three operations Redis uses:
//!
//! - [`parse`]: `string2ld` (glibc `strtold`, correctly rounded; decimal,
//!   hexadecimal and `inf`/`infinity`; `nan`, leading space, trailing garbage,
//!   overflow and underflow-to-zero rejected);
//! - [`LongDouble::add`]: one correctly rounded (round-half-even) addition;
//! - [`format_human`]: `ld2string(.., LD_STR_HUMAN)`, i.e. `%.17Lf` with the
//!   trailing zeros (and a trailing `.`) removed and `-0` printed as `0`.
//!
//! A finite value is `(-1)^neg * m * 2^e` with `m < 2^64`; normal values have
//! the top bit of `m` set, subnormals have `e == E_MIN`. Exact arithmetic on
//! arbitrarily large integers ([`Big`]) backs parsing and printing.

use std::cmp::Ordering;

/// Exponent of the smallest subnormal (`2^-16445`).
const E_MIN: i64 = -16445;
/// Largest exponent of a finite value (`(2^64 - 1) * 2^16320` is the max).
const E_MAX: i64 = 16320;
/// Redis's `MAX_LONG_DOUBLE_CHARS`: longer inputs are not valid floats.
const MAX_CHARS: usize = 5 * 1024;
/// Exponents beyond this (in either base) saturate: the value over- or underflows anyway.
const EXP_CAP: i64 = 1_000_000;

/// An x87 extended-precision value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LongDouble {
    /// `(-1)^neg * m * 2^e`.
    Finite { neg: bool, m: u64, e: i64 },
    /// Plus or minus infinity.
    Inf { neg: bool },
    /// Not a number (only produced by `inf + -inf`).
    Nan,
}

impl LongDouble {
    /// Positive zero.
    pub(crate) const ZERO: LongDouble = LongDouble::Finite {
        neg: false,
        m: 0,
        e: E_MIN,
    };

    /// Whether this is neither infinite nor NaN.
    pub(crate) fn is_finite(self) -> bool {
        matches!(self, LongDouble::Finite { .. })
    }

    /// `self + other`, correctly rounded to nearest, ties to even.
    pub(crate) fn add(self, other: LongDouble) -> LongDouble {
        use LongDouble::*;
        match (self, other) {
            (Nan, _) | (_, Nan) => Nan,
            (Inf { neg: a }, Inf { neg: b }) => {
                if a == b {
                    Inf { neg: a }
                } else {
                    Nan
                }
            }
            (Inf { neg }, Finite { .. }) | (Finite { .. }, Inf { neg }) => Inf { neg },
            (
                Finite {
                    neg: an,
                    m: am,
                    e: ae,
                },
                Finite {
                    neg: bn,
                    m: bm,
                    e: be,
                },
            ) => {
                if am == 0 && bm == 0 {
                    return Finite {
                        neg: an && bn,
                        m: 0,
                        e: E_MIN,
                    };
                }
                if am == 0 {
                    return other;
                }
                if bm == 0 {
                    return self;
                }
                // Order so that `a` has the larger exponent.
                let ((an, am, ae), (bn, bm, be)) = if ae >= be {
                    ((an, am, ae), (bn, bm, be))
                } else {
                    ((bn, bm, be), (an, am, ae))
                };
                let diff = ae - be;
                // Exact sum at `b`'s scale while the operands are at most 130
                // bits apart. Beyond that, |b| < 2^(ae-66) lies below half an
                // ulp of any possible result, so `b` only matters as a sticky
                // unit below every rounding position (`a` is then normal).
                let shift = diff.min(130);
                let a = Big::from_u128(am as u128).shl(shift as u64);
                let b = Big::from_u128(if diff <= 130 { bm as u128 } else { 1 });
                let unit = ae - shift;
                let (neg, sum) = if an == bn {
                    (an, a.add(&b))
                } else {
                    match a.cmp_big(&b) {
                        Ordering::Greater => (an, a.sub(&b)),
                        Ordering::Less => (bn, b.sub(&a)),
                        Ordering::Equal => return LongDouble::ZERO,
                    }
                };
                round(neg, &sum, unit)
            }
        }
    }
}

/// Rounds `(-1)^neg * n * 2^k` to the nearest long double (ties to even).
fn round(neg: bool, n: &Big, k: i64) -> LongDouble {
    let bits = n.bits() as i64;
    if bits == 0 {
        return LongDouble::Finite {
            neg,
            m: 0,
            e: E_MIN,
        };
    }
    let e = (bits - 64 + k).max(E_MIN);
    let shift = e - k;
    let (mut m, mut e) = if shift <= 0 {
        (n.low_u64_shl((-shift) as u64), e)
    } else {
        let shift = shift as u64;
        let mut m = n.bits_from(shift);
        let half = n.bit(shift - 1);
        let sticky = n.any_below(shift - 1);
        let mut e = e;
        if half && (sticky || m & 1 == 1) {
            match m.checked_add(1) {
                Some(v) => m = v,
                None => {
                    m = 1 << 63;
                    e += 1;
                }
            }
        }
        (m, e)
    };
    if e > E_MAX {
        return LongDouble::Inf { neg };
    }
    if m == 0 {
        e = E_MIN;
        m = 0;
    }
    LongDouble::Finite { neg, m, e }
}

/// Redis's `string2ld`: `None` when the text is not a valid float.
pub(crate) fn parse(s: &[u8]) -> Option<LongDouble> {
    if s.is_empty() || s.len() >= MAX_CHARS {
        return None;
    }
    // strtold would skip leading white space; Redis rejects it (`isspace(buf[0])`).
    if matches!(s[0], b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r') {
        return None;
    }
    let (neg, rest) = match s[0] {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    if rest.eq_ignore_ascii_case(b"inf") || rest.eq_ignore_ascii_case(b"infinity") {
        return Some(LongDouble::Inf { neg });
    }
    let value = if rest.len() > 2 && rest[0] == b'0' && (rest[1] | 0x20) == b'x' {
        parse_hex(neg, &rest[2..])?
    } else {
        parse_decimal(neg, rest)?
    };
    match value {
        LongDouble::Finite { .. } => Some(value),
        _ => None,
    }
}

/// Splits `digits[.digits][<exp_char>[+-]digits]` (the whole input) into the
/// mantissa digits (without the point), the count of fractional digits and the
/// exponent; `None` if anything else is present or there is no digit.
fn split_number(s: &[u8], is_digit: fn(u8) -> bool, exp_char: u8) -> Option<(Vec<u8>, i64, i64)> {
    let mut i = 0;
    let mut digits = Vec::new();
    let mut frac = 0i64;
    while i < s.len() && is_digit(s[i]) {
        digits.push(s[i]);
        i += 1;
    }
    if i < s.len() && s[i] == b'.' {
        i += 1;
        while i < s.len() && is_digit(s[i]) {
            digits.push(s[i]);
            frac += 1;
            i += 1;
        }
    }
    if digits.is_empty() {
        return None;
    }
    let mut exp = 0i64;
    if i < s.len() && (s[i] | 0x20) == exp_char {
        i += 1;
        let mut eneg = false;
        if i < s.len() && (s[i] == b'+' || s[i] == b'-') {
            eneg = s[i] == b'-';
            i += 1;
        }
        let start = i;
        while i < s.len() && s[i].is_ascii_digit() {
            exp = (exp * 10 + i64::from(s[i] - b'0')).min(EXP_CAP);
            i += 1;
        }
        if i == start {
            return None;
        }
        if eneg {
            exp = -exp;
        }
    }
    if i != s.len() {
        return None;
    }
    Some((digits, frac, exp))
}

fn parse_decimal(neg: bool, s: &[u8]) -> Option<LongDouble> {
    let (digits, frac, exp) = split_number(s, |c| c.is_ascii_digit(), b'e')?;
    let start = digits.iter().position(|&d| d != b'0');
    let Some(start) = start else {
        return Some(LongDouble::Finite {
            neg,
            m: 0,
            e: E_MIN,
        });
    };
    let mut digits = &digits[start..];
    let mut exp10 = exp - frac;
    while let Some((&b'0', head)) = digits.split_last() {
        digits = head;
        exp10 += 1;
    }
    let n = digits.len() as i64;
    // value in [10^(n-1+exp10), 10^(n+exp10)): the max is ~1.19e4932 and
    // half the smallest subnormal ~1.8e-4951.
    if n - 1 + exp10 >= 4933 || n + exp10 <= -4952 {
        return None;
    }
    let d = Big::from_decimal(digits);
    let v = if exp10 >= 0 {
        let mut n = d;
        n.mul_pow10(exp10 as u64);
        round(neg, &n, 0)
    } else {
        let p = Big::pow10((-exp10) as u64);
        // Scale so the quotient has 66..=68 bits, then keep a sticky bit.
        let shift = 66 - (d.bits() as i64 - p.bits() as i64);
        let (a, b) = if shift >= 0 {
            (d.shl(shift as u64), p)
        } else {
            (d, p.shl((-shift) as u64))
        };
        let (q, rem_nonzero) = a.div_small_quotient(&b);
        let n = Big::from_u128((q << 1) | u128::from(rem_nonzero));
        round(neg, &n, -shift - 1)
    };
    // Underflow to zero is ERANGE: not a valid float.
    match v {
        LongDouble::Finite { m: 0, .. } => None,
        v => Some(v),
    }
}

fn parse_hex(neg: bool, s: &[u8]) -> Option<LongDouble> {
    let (digits, frac, exp) = split_number(s, |c| c.is_ascii_hexdigit(), b'p')?;
    let mut n = Big::default();
    for d in &digits {
        let v = (*d as char).to_digit(16).unwrap_or(0);
        n.mul_add_small(16, v);
    }
    if n.bits() == 0 {
        return Some(LongDouble::Finite {
            neg,
            m: 0,
            e: E_MIN,
        });
    }
    let k = (exp - 4 * frac).clamp(-EXP_CAP, EXP_CAP);
    match round(neg, &n, k) {
        LongDouble::Finite { m: 0, .. } => None,
        v => Some(v),
    }
}

/// Redis's `ld2string(.., LD_STR_HUMAN)`: `%.17Lf`, trailing zeros removed.
/// Infinite and NaN values print as `inf`, `-inf` and `nan` (callers reject them first).
pub(crate) fn format_human(v: LongDouble) -> String {
    let (neg, m, e) = match v {
        LongDouble::Finite { neg, m, e } => (neg, m, e),
        LongDouble::Inf { neg: false } => return "inf".into(),
        LongDouble::Inf { neg: true } => return "-inf".into(),
        LongDouble::Nan => return "nan".into(),
    };
    let mut text = if e >= 0 {
        // An integer: the 17 fractional zeros are all trimmed.
        Big::from_u128(m as u128).shl(e as u64).to_decimal()
    } else {
        // m * 10^17 < 2^121: the scaled value fits in a u128.
        let n = (m as u128) * 10u128.pow(17);
        let sh = (-e) as u64;
        let x = if sh >= 128 {
            0
        } else {
            let q = n >> sh;
            let rem = n & ((1u128 << sh) - 1);
            let half = 1u128 << (sh - 1);
            if rem > half || (rem == half && q & 1 == 1) {
                q + 1
            } else {
                q
            }
        };
        let digits = format!("{x:018}");
        let (int, frac) = digits.split_at(digits.len() - 17);
        let frac = frac.trim_end_matches('0');
        if frac.is_empty() {
            int.to_string()
        } else {
            format!("{int}.{frac}")
        }
    };
    if neg && text != "0" {
        text.insert(0, '-');
    }
    text
}

/// A non-negative big integer, little-endian base-2^32 limbs, no trailing zero limb.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Big(Vec<u32>);

impl Big {
    fn from_u128(mut v: u128) -> Big {
        let mut limbs = Vec::with_capacity(4);
        while v != 0 {
            limbs.push(v as u32);
            v >>= 32;
        }
        Big(limbs)
    }

    fn from_decimal(digits: &[u8]) -> Big {
        let mut n = Big::default();
        for chunk in digits.chunks(9) {
            let mut v = 0u32;
            for d in chunk {
                v = v * 10 + u32::from(d.wrapping_sub(b'0') % 10);
            }
            n.mul_add_small(10u32.pow(chunk.len() as u32), v);
        }
        n
    }

    fn pow10(n: u64) -> Big {
        let mut b = Big::from_u128(1);
        b.mul_pow10(n);
        b
    }

    fn mul_pow10(&mut self, mut n: u64) {
        while n >= 9 {
            self.mul_add_small(1_000_000_000, 0);
            n -= 9;
        }
        self.mul_add_small(10u32.pow(n as u32), 0);
    }

    /// `self = self * m + a`.
    fn mul_add_small(&mut self, m: u32, a: u32) {
        let mut carry = u64::from(a);
        for limb in &mut self.0 {
            let v = u64::from(*limb) * u64::from(m) + carry;
            *limb = v as u32;
            carry = v >> 32;
        }
        if carry != 0 {
            self.0.push(carry as u32);
        }
        self.trim();
    }

    fn trim(&mut self) {
        while self.0.last() == Some(&0) {
            self.0.pop();
        }
    }

    fn bits(&self) -> u64 {
        match self.0.last() {
            None => 0,
            Some(top) => (self.0.len() as u64 - 1) * 32 + u64::from(32 - top.leading_zeros()),
        }
    }

    fn bit(&self, i: u64) -> bool {
        let limb = (i / 32) as usize;
        self.0.get(limb).is_some_and(|l| (l >> (i % 32)) & 1 == 1)
    }

    /// Whether any bit below position `i` is set.
    fn any_below(&self, i: u64) -> bool {
        let full = ((i / 32) as usize).min(self.0.len());
        if self.0[..full].iter().any(|&l| l != 0) {
            return true;
        }
        let rem = i % 32;
        rem != 0
            && self
                .0
                .get(full)
                .is_some_and(|l| l & ((1u32 << rem) - 1) != 0)
    }

    /// Bits `[i, i + 64)` as a u64.
    fn bits_from(&self, i: u64) -> u64 {
        let mut v = 0u64;
        for j in 0..64 {
            if self.bit(i + j) {
                v |= 1 << j;
            }
        }
        v
    }

    /// The low 64 bits of `self << s` (callers guarantee it fits).
    fn low_u64_shl(&self, s: u64) -> u64 {
        let mut v = 0u64;
        for (i, &l) in self.0.iter().take(2).enumerate() {
            v |= u64::from(l) << (32 * i);
        }
        if s >= 64 { 0 } else { v << s }
    }

    fn shl(&self, n: u64) -> Big {
        if self.0.is_empty() {
            return Big::default();
        }
        let limbs = (n / 32) as usize;
        let bits = (n % 32) as u32;
        let mut out = vec![0u32; limbs];
        out.reserve(self.0.len() + 1);
        let mut carry = 0u32;
        for &l in &self.0 {
            if bits == 0 {
                out.push(l);
            } else {
                out.push((l << bits) | carry);
                carry = l >> (32 - bits);
            }
        }
        if carry != 0 {
            out.push(carry);
        }
        let mut b = Big(out);
        b.trim();
        b
    }

    fn cmp_big(&self, o: &Big) -> Ordering {
        self.0
            .len()
            .cmp(&o.0.len())
            .then_with(|| self.0.iter().rev().cmp(o.0.iter().rev()))
    }

    fn add(&self, o: &Big) -> Big {
        let mut out = Vec::with_capacity(self.0.len().max(o.0.len()) + 1);
        let mut carry = 0u64;
        for i in 0..self.0.len().max(o.0.len()) {
            let v = u64::from(self.0.get(i).copied().unwrap_or(0))
                + u64::from(o.0.get(i).copied().unwrap_or(0))
                + carry;
            out.push(v as u32);
            carry = v >> 32;
        }
        if carry != 0 {
            out.push(carry as u32);
        }
        Big(out)
    }

    fn sub(mut self, o: &Big) -> Big {
        self.sub_assign(o);
        self
    }

    /// `self -= o`; requires `self >= o`.
    fn sub_assign(&mut self, o: &Big) {
        let mut borrow = 0i64;
        for i in 0..self.0.len() {
            let v = i64::from(self.0[i]) - i64::from(o.0.get(i).copied().unwrap_or(0)) - borrow;
            if v < 0 {
                self.0[i] = (v + (1i64 << 32)) as u32;
                borrow = 1;
            } else {
                self.0[i] = v as u32;
                borrow = 0;
            }
        }
        self.trim();
    }

    /// `(floor(self / d), self % d != 0)` for a quotient below 2^127.
    fn div_small_quotient(mut self, d: &Big) -> (u128, bool) {
        let top = (self.bits() as i64 - d.bits() as i64 + 1).clamp(0, 126) as u64;
        let mut q = 0u128;
        for i in (0..=top).rev() {
            let shifted = d.shl(i);
            if self.cmp_big(&shifted) != Ordering::Less {
                self.sub_assign(&shifted);
                q |= 1 << i;
            }
        }
        (q, !self.0.is_empty())
    }

    fn to_decimal(&self) -> String {
        let mut n = self.clone();
        let mut chunks = Vec::new();
        while !n.0.is_empty() {
            let mut rem = 0u64;
            for limb in n.0.iter_mut().rev() {
                let cur = (rem << 32) | u64::from(*limb);
                *limb = (cur / 1_000_000_000) as u32;
                rem = cur % 1_000_000_000;
            }
            n.trim();
            chunks.push(rem as u32);
        }
        let mut out = match chunks.pop() {
            None => return "0".into(),
            Some(top) => top.to_string(),
        };
        for c in chunks.iter().rev() {
            out.push_str(&format!("{c:09}"));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn incr(a: &str, b: &str) -> Option<String> {
        let x = parse(a.as_bytes())?.add(parse(b.as_bytes())?);
        x.is_finite().then(|| format_human(x))
    }

    #[test]
    fn matches_redis_on_x86_64() {
        // Every expected value below was produced by Redis 7.0 on x86-64.
        assert_eq!(incr("10.5", "0.1").as_deref(), Some("10.6"));
        assert_eq!(incr("10.6", "-5").as_deref(), Some("5.6"));
        assert_eq!(incr("5.0e3", "2.0e2").as_deref(), Some("5200"));
        assert_eq!(
            incr("10000000000", "0.1").as_deref(),
            Some("10000000000.09999999962747097")
        );
        assert_eq!(incr("1", "5.0e-5").as_deref(), Some("1.00005"));
        assert_eq!(incr("1.00005", "1e-30").as_deref(), Some("1.00005"));
        assert_eq!(incr("0x10", "1").as_deref(), Some("17"));
        assert_eq!(incr("1e-400", "1").as_deref(), Some("1"));
        assert_eq!(incr("3", "-1e-25").as_deref(), Some("3"));
        assert_eq!(incr("1", "1e-4940").as_deref(), Some("1"));
        assert_eq!(incr("-0.00000000000000000001", "0").as_deref(), Some("0"));
        assert_eq!(incr("1", "+1").as_deref(), Some("2"));
        assert_eq!(incr("1", ".5").as_deref(), Some("1.5"));
        assert_eq!(incr("1", "5.").as_deref(), Some("6"));
        assert_eq!(incr("1", "0x1p-2").as_deref(), Some("1.25"));
        assert_eq!(incr("1", "0X.8P1").as_deref(), Some("2"));
        assert_eq!(incr("1", "1e+2").as_deref(), Some("101"));
        assert_eq!(incr("1", "1E2").as_deref(), Some("101"));
        assert_eq!(incr("1", "0x1.8").as_deref(), Some("2.5"));
        assert_eq!(incr("1", "00012.5").as_deref(), Some("13.5"));
        assert_eq!(incr("1", "1e-4950").as_deref(), Some("1"));
        assert_eq!(incr("0.1", "0.2").as_deref(), Some("0.3"));
        // Operands 63 bits apart: the smaller one still moves the rounding.
        assert_eq!(
            incr("738.000001600000000020", "-6048167693157020699e3").as_deref(),
            Some("-6048167693157020698624")
        );
        assert_eq!(incr("0", "1e-20").as_deref(), Some("0"));
        assert_eq!(incr("0", "-1.5").as_deref(), Some("-1.5"));
        assert_eq!(incr("0", "0x1p-16445").as_deref(), Some("0"));
        assert_eq!(
            incr("1.5", "-1.4999999999999999999999").as_deref(),
            Some("0")
        );
        assert_eq!(
            incr("123456789.987654321", "0.000000000000000001").as_deref(),
            Some("123456789.98765432099753525")
        );
        assert_eq!(
            incr("1e400", "1").as_deref(),
            Some(concat!(
                "10000000000000000000281880683947586514586453433629052038625910693539685534008629",
                "86203936399484832416052209405392731761620029582277725925573402382897659334066101",
                "77974474345461739178624481166749717237789438243915933380474706750262466844013592",
                "37513603830343735485505244955964979021825038280091068414947402456898653040951017",
                "51265809261582758892018347251164331659136266413817630973480634373249743022194688",
                "0",
            ))
        );
    }

    #[test]
    fn rejects_like_strtold_in_redis() {
        for bad in [
            " 1", "1 ", "", "1e", "nan", "NaN", "0x", "1e-5000", "1e5000", "1_0", "abc", "--1",
            "+", ".", "e5", "0xp1", "1.5e+", "\t1",
        ] {
            assert_eq!(parse(bad.as_bytes()), None, "{bad:?}");
        }
        assert!(parse(&[b'1'; MAX_CHARS]).is_none());
        assert_eq!(parse(b"infinity"), Some(LongDouble::Inf { neg: false }));
        assert_eq!(parse(b"-INF"), Some(LongDouble::Inf { neg: true }));
        assert_eq!(incr("1", "inf"), None);
        assert_eq!(incr("inf", "-inf"), None);
        assert_eq!(parse(b"1e99999999999999999999999"), None);
        assert!(parse(b"0e99999999999999999999999").is_some());
    }

    #[test]
    fn overflow_to_infinity_on_add() {
        let max = parse(b"1.1e4932").unwrap();
        assert!(!max.add(max).is_finite());
    }

    #[test]
    fn exact_small_values_round_trip() {
        for s in [
            "0.5",
            "1",
            "2",
            "123456789",
            "-42.25",
            "0.125",
            "1000000000000000000000",
        ] {
            assert_eq!(format_human(parse(s.as_bytes()).unwrap()), s);
        }
        assert_eq!(format_human(parse(b"-0").unwrap()), "0");
        assert_eq!(format_human(parse(b"3.0e3").unwrap()), "3000");
    }

    #[test]
    fn subnormals_survive() {
        // 2^-16445 is the smallest positive long double.
        let v = parse(b"0x1p-16445").unwrap();
        assert_eq!(
            v,
            LongDouble::Finite {
                neg: false,
                m: 1,
                e: E_MIN
            }
        );
        assert!(parse(b"0x1p-16446").is_none()); // ties to even: rounds to 0 -> ERANGE
        assert_eq!(format_human(v), "0");
    }

    #[test]
    fn big_decimal_round_trip() {
        let b = Big::pow10(40);
        assert_eq!(b.to_decimal(), format!("1{}", "0".repeat(40)));
        let (q, r) = Big::pow10(20).div_small_quotient(&Big::from_u128(7));
        assert_eq!(q, 100_000_000_000_000_000_000u128 / 7);
        assert!(r);
    }
}
