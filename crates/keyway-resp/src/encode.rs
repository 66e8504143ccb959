//! The encoder: [`Frame`] to RESP2 or RESP3 bytes.
//!
//! Encoding cannot fail. Values RESP cannot carry are made carriable rather
//! than rejected: CR and LF inside a simple string, error or big number become
//! spaces (as Redis does for error replies). RESP3-only types are downgraded
//! on a RESP2 connection the way Redis does it.

use std::fmt::{self, Write as _};

use bytes::{BufMut, BytesMut};

use crate::frame::{Frame, Protocol};

const CRLF: &[u8] = b"\r\n";

/// Appends `frame` to `out` as `proto` bytes.
///
/// RESP2 downgrades: `Map` and `Pairs` become a flat array `k1 v1 k2 v2 ...`; `Set` and
/// `Push` become arrays; `Double` becomes a bulk string (see
/// [`format_double`]); `Boolean` becomes `:1`/`:0`; `Verbatim` becomes a bulk
/// string of its text; `BigNumber` becomes a bulk string. `Null` is `$-1` and
/// `NullArray` is `*-1` in RESP2; both are `_` in RESP3.
pub fn encode(frame: &Frame, proto: Protocol, out: &mut BytesMut) {
    match frame {
        Frame::Simple(s) => put_line(b'+', s.as_bytes(), out),
        Frame::Error(s) => put_line(b'-', s.as_bytes(), out),
        Frame::Integer(n) => put_i64_line(b':', *n, out),
        Frame::Bulk(b) => put_bulk(b, out),
        Frame::Array(items) => put_aggregate(b'*', items, proto, out),
        Frame::Null => match proto {
            Protocol::Resp2 => out.put_slice(b"$-1\r\n"),
            Protocol::Resp3 => out.put_slice(b"_\r\n"),
        },
        Frame::NullArray => match proto {
            Protocol::Resp2 => out.put_slice(b"*-1\r\n"),
            Protocol::Resp3 => out.put_slice(b"_\r\n"),
        },
        Frame::Map(pairs) => {
            match proto {
                // A Vec of pairs holds at most isize::MAX / 2 elements, so
                // doubling cannot overflow.
                Protocol::Resp2 => put_len_line(b'*', pairs.len() * 2, out),
                Protocol::Resp3 => put_len_line(b'%', pairs.len(), out),
            }
            for (key, value) in pairs {
                encode(key, proto, out);
                encode(value, proto, out);
            }
        }
        Frame::Pairs(pairs) => {
            match proto {
                Protocol::Resp2 => put_len_line(b'*', pairs.len() * 2, out),
                Protocol::Resp3 => put_len_line(b'*', pairs.len(), out),
            }
            for (a, b) in pairs {
                if proto == Protocol::Resp3 {
                    put_len_line(b'*', 2, out);
                }
                encode(a, proto, out);
                encode(b, proto, out);
            }
        }
        Frame::Set(items) => {
            let prefix = match proto {
                Protocol::Resp2 => b'*',
                Protocol::Resp3 => b'~',
            };
            put_aggregate(prefix, items, proto, out);
        }
        Frame::Push(items) => {
            let prefix = match proto {
                Protocol::Resp2 => b'*',
                Protocol::Resp3 => b'>',
            };
            put_aggregate(prefix, items, proto, out);
        }
        Frame::Double(d) => {
            let text = format_double_g17(*d);
            match proto {
                Protocol::Resp2 => put_bulk(text.as_bytes(), out),
                Protocol::Resp3 => put_line(b',', text.as_bytes(), out),
            }
        }
        Frame::Boolean(b) => out.put_slice(match (proto, b) {
            (Protocol::Resp2, true) => b":1\r\n",
            (Protocol::Resp2, false) => b":0\r\n",
            (Protocol::Resp3, true) => b"#t\r\n",
            (Protocol::Resp3, false) => b"#f\r\n",
        }),
        Frame::Verbatim { format, text } => match proto {
            Protocol::Resp2 => put_bulk(text, out),
            Protocol::Resp3 => {
                put_len_line(b'=', text.len() + 4, out);
                out.reserve(text.len() + 6);
                out.put_slice(format);
                out.put_u8(b':');
                out.put_slice(text);
                out.put_slice(CRLF);
            }
        },
        Frame::BigNumber(s) => match proto {
            Protocol::Resp2 => put_bulk(s.as_bytes(), out),
            Protocol::Resp3 => put_line(b'(', s.as_bytes(), out),
        },
    }
}

/// Appends a command as a multibulk request: `*N` then one `$len` bulk per
/// argument. This is how clients send commands.
pub fn encode_command<A: AsRef<[u8]>>(args: &[A], out: &mut BytesMut) {
    put_len_line(b'*', args.len(), out);
    for arg in args {
        put_bulk(arg.as_ref(), out);
    }
}

fn put_aggregate(prefix: u8, items: &[Frame], proto: Protocol, out: &mut BytesMut) {
    put_len_line(prefix, items.len(), out);
    for item in items {
        encode(item, proto, out);
    }
}

fn put_bulk(data: &[u8], out: &mut BytesMut) {
    put_len_line(b'$', data.len(), out);
    out.reserve(data.len() + CRLF.len());
    out.put_slice(data);
    out.put_slice(CRLF);
}

/// `prefix`, `text` with CR/LF mapped to spaces, CRLF.
fn put_line(prefix: u8, text: &[u8], out: &mut BytesMut) {
    out.reserve(1 + text.len() + CRLF.len());
    out.put_u8(prefix);
    if memchr::memchr2(b'\r', b'\n', text).is_none() {
        out.put_slice(text);
    } else {
        out.extend(text.iter().map(|&b| match b {
            b'\r' | b'\n' => b' ',
            b => b,
        }));
    }
    out.put_slice(CRLF);
}

fn put_len_line(prefix: u8, len: usize, out: &mut BytesMut) {
    out.put_u8(prefix);
    put_u64(len as u64, out);
    out.put_slice(CRLF);
}

fn put_i64_line(prefix: u8, n: i64, out: &mut BytesMut) {
    out.put_u8(prefix);
    if n < 0 {
        out.put_u8(b'-');
    }
    put_u64(n.unsigned_abs(), out);
    out.put_slice(CRLF);
}

fn put_u64(mut n: u64, out: &mut BytesMut) {
    let mut digits = [0u8; 20]; // u64::MAX has 20 decimal digits.
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.put_slice(&digits[start..]);
}

/// A double formatted like Redis's `d2string`, on the stack.
#[derive(Clone, Copy)]
pub struct DoubleText {
    buf: [u8; DOUBLE_TEXT_MAX_LEN_BYTES],
    len: usize,
}

/// Longest text [`format_double`] produces ("-" + 17 digits + "e-308" and
/// the like need 25; "-0.000000" + 17 digits needs 26).
const DOUBLE_TEXT_MAX_LEN_BYTES: usize = 32;

impl DoubleText {
    /// The formatted double.
    pub fn as_str(&self) -> &str {
        assert!(self.len <= DOUBLE_TEXT_MAX_LEN_BYTES);
        // Only ASCII is ever written; fall back rather than panic.
        std::str::from_utf8(&self.buf[..self.len]).unwrap_or("nan")
    }
}

impl fmt::Display for DoubleText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for DoubleText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Write for DoubleText {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len.checked_add(s.len()).ok_or(fmt::Error)?;
        let dst = self.buf.get_mut(self.len..end).ok_or(fmt::Error)?;
        dst.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// Formats `d` like Redis 7.2+'s `d2string` (used for RESP3 doubles and the
/// RESP2 bulk downgrade): `nan`, `inf`, `-inf`, `0`, `-0`; integral values
/// with `|d| <= 2^62` as integers (`3`, `-100`); everything else as the
/// shortest round-trip digits laid out like Redis's `fpconv_dtoa` (`1.5`,
/// `0.1`, `1e+20`, `1.5e-7`).
///
/// Redis's Grisu2 picks the shortest digits in all but rare cases; this uses
/// Rust's always-shortest digits, so the text may differ in those cases while
/// still parsing back to the same value.
pub fn format_double(d: f64) -> DoubleText {
    // Redis's double2ll range: +-(LLONG_MAX / 2) rounded to a double, 2^62.
    const INTEGRAL_LIMIT: f64 = 4_611_686_018_427_387_904.0;
    let mut text = DoubleText {
        buf: [0; DOUBLE_TEXT_MAX_LEN_BYTES],
        len: 0,
    };
    // Writes into `text` cannot fail: every layout fits the buffer.
    let _ = if d.is_nan() {
        text.write_str("nan")
    } else if d.is_infinite() {
        text.write_str(if d > 0.0 { "inf" } else { "-inf" })
    } else if d == 0.0 {
        text.write_str(if d.is_sign_negative() { "-0" } else { "0" })
    } else if (-INTEGRAL_LIMIT..=INTEGRAL_LIMIT).contains(&d) && d.trunc() == d {
        write!(text, "{}", d as i64)
    } else {
        write_fpconv(d, &mut text)
    };
    text
}

/// Redis 7.0's `addReplyDouble` text (RESP2 and RESP3 alike): `%.17g`,
/// with `inf`/`-inf`: what [`Frame::Double`] is encoded as.
pub fn format_double_g17(d: f64) -> String {
    if d.is_infinite() {
        return if d > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if d.is_nan() {
        return "nan".into();
    }
    // 17 significant digits, correctly rounded (ties to even on the exact value).
    let sci = format!("{:.16e}", d);
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (neg, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => (true, m),
        None => (false, mantissa),
    };
    let digits: Vec<u8> = mantissa.bytes().filter(u8::is_ascii_digit).collect();
    debug_assert_eq!(digits.len(), 17);
    let mut out = String::with_capacity(24);
    if neg {
        out.push('-');
    }
    let trim = |s: &[u8]| -> usize { s.iter().rposition(|&b| b != b'0').map_or(0, |p| p + 1) };
    if (-4..17).contains(&exp) {
        if exp >= 0 {
            let int_len = exp as usize + 1;
            out.push_str(std::str::from_utf8(&digits[..int_len]).unwrap_or(""));
            let frac = &digits[int_len..];
            let n = trim(frac);
            if n > 0 {
                out.push('.');
                out.push_str(std::str::from_utf8(&frac[..n]).unwrap_or(""));
            }
        } else {
            out.push_str("0.");
            for _ in 0..(-exp - 1) {
                out.push('0');
            }
            let n = trim(&digits);
            out.push_str(std::str::from_utf8(&digits[..n]).unwrap_or(""));
        }
    } else {
        out.push(digits[0] as char);
        let n = trim(&digits[1..]);
        if n > 0 {
            out.push('.');
            out.push_str(std::str::from_utf8(&digits[1..1 + n]).unwrap_or(""));
        }
        out.push('e');
        out.push(if exp < 0 { '-' } else { '+' });
        let e = exp.unsigned_abs();
        if e < 10 {
            out.push('0');
        }
        out.push_str(&e.to_string());
    }
    out
}

/// Lays out the shortest digits of finite, non-zero `d` like `fpconv_dtoa`'s
/// `emit_digits`.
fn write_fpconv(d: f64, text: &mut DoubleText) -> fmt::Result {
    // Rust's `{:e}` gives the shortest round-trip digits as `D.DDDDe<exp>`.
    let mut scientific = DoubleText {
        buf: [0; DOUBLE_TEXT_MAX_LEN_BYTES],
        len: 0,
    };
    write!(scientific, "{:e}", d.abs())?;
    let scientific = scientific.as_str();
    let (mantissa, exponent) = scientific.split_once('e').ok_or(fmt::Error)?;
    let exponent: i32 = exponent.parse().map_err(|_| fmt::Error)?;
    let mut digits_buf = [0u8; DOUBLE_TEXT_MAX_LEN_BYTES];
    let mut digits_len = 0;
    for &b in mantissa.as_bytes().iter().filter(|b| b.is_ascii_digit()) {
        *digits_buf.get_mut(digits_len).ok_or(fmt::Error)? = b;
        digits_len += 1;
    }
    let digits = std::str::from_utf8(&digits_buf[..digits_len]).map_err(|_| fmt::Error)?;
    let ndigits = digits_len as i32;
    // value = digits * 10^k
    let k = exponent - (ndigits - 1);
    let exp = (k + ndigits - 1).abs();

    if d.is_sign_negative() {
        text.write_char('-')?;
    }
    if k >= 0 && exp < ndigits + 7 {
        // Plain integer.
        text.write_str(digits)?;
        for _ in 0..k {
            text.write_char('0')?;
        }
        return Ok(());
    }
    if k < 0 && (k > -7 || exp < 4) {
        // Decimal without exponent.
        let offset = ndigits + k;
        if offset <= 0 {
            text.write_str("0.")?;
            for _ in 0..-offset {
                text.write_char('0')?;
            }
            text.write_str(digits)?;
        } else {
            let (int_part, frac_part) = digits.split_at(offset as usize);
            text.write_str(int_part)?;
            text.write_char('.')?;
            text.write_str(frac_part)?;
        }
        return Ok(());
    }
    // Scientific: D[.DDD]e(+|-)X with no exponent padding.
    let (first, rest) = digits.split_at(1);
    text.write_str(first)?;
    if !rest.is_empty() {
        text.write_char('.')?;
        text.write_str(rest)?;
    }
    let sign = if k + ndigits - 1 < 0 { '-' } else { '+' };
    write!(text, "e{sign}{exp}")
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn enc(frame: &Frame, proto: Protocol) -> Vec<u8> {
        let mut out = BytesMut::new();
        encode(frame, proto, &mut out);
        out.to_vec()
    }

    fn both(frame: &Frame) -> (Vec<u8>, Vec<u8>) {
        (enc(frame, Protocol::Resp2), enc(frame, Protocol::Resp3))
    }

    #[test]
    fn scalars() {
        assert_eq!(enc(&Frame::ok(), Protocol::Resp2), b"+OK\r\n");
        assert_eq!(
            enc(&Frame::error("ERR bad"), Protocol::Resp3),
            b"-ERR bad\r\n"
        );
        assert_eq!(enc(&Frame::Integer(0), Protocol::Resp2), b":0\r\n");
        assert_eq!(enc(&Frame::Integer(-42), Protocol::Resp2), b":-42\r\n");
        assert_eq!(
            enc(&Frame::Integer(i64::MIN), Protocol::Resp2),
            b":-9223372036854775808\r\n"
        );
        assert_eq!(
            enc(&Frame::Integer(i64::MAX), Protocol::Resp2),
            b":9223372036854775807\r\n"
        );
        assert_eq!(enc(&Frame::bulk("foo"), Protocol::Resp2), b"$3\r\nfoo\r\n");
        assert_eq!(enc(&Frame::bulk(""), Protocol::Resp3), b"$0\r\n\r\n");
    }

    #[test]
    fn nulls_per_protocol() {
        assert_eq!(both(&Frame::Null), (b"$-1\r\n".to_vec(), b"_\r\n".to_vec()));
        assert_eq!(
            both(&Frame::NullArray),
            (b"*-1\r\n".to_vec(), b"_\r\n".to_vec())
        );
    }

    #[test]
    fn aggregates_and_downgrades() {
        let map = Frame::Map(vec![(Frame::bulk("k"), Frame::Integer(1))]);
        assert_eq!(
            both(&map),
            (
                b"*2\r\n$1\r\nk\r\n:1\r\n".to_vec(),
                b"%1\r\n$1\r\nk\r\n:1\r\n".to_vec()
            )
        );
        let set = Frame::Set(vec![Frame::Boolean(true)]);
        assert_eq!(
            both(&set),
            (b"*1\r\n:1\r\n".to_vec(), b"~1\r\n#t\r\n".to_vec())
        );
        let pairs = Frame::Pairs(vec![(Frame::bulk("a"), Frame::Integer(1))]);
        let mut two = BytesMut::new();
        encode(&pairs, Protocol::Resp2, &mut two);
        assert_eq!(&two[..], b"*2\r\n$1\r\na\r\n:1\r\n");
        let mut three = BytesMut::new();
        encode(&pairs, Protocol::Resp3, &mut three);
        assert_eq!(&three[..], b"*1\r\n*2\r\n$1\r\na\r\n:1\r\n");
        let push = Frame::Push(vec![Frame::Boolean(false)]);
        assert_eq!(
            both(&push),
            (b"*1\r\n:0\r\n".to_vec(), b">1\r\n#f\r\n".to_vec())
        );
        assert_eq!(
            enc(&Frame::Array(vec![]), Protocol::Resp3),
            b"*0\r\n".to_vec()
        );
    }

    #[test]
    fn resp3_only_scalars() {
        assert_eq!(
            both(&Frame::Double(1.5)),
            (b"$3\r\n1.5\r\n".to_vec(), b",1.5\r\n".to_vec())
        );
        assert_eq!(
            both(&Frame::Double(f64::NEG_INFINITY)),
            (b"$4\r\n-inf\r\n".to_vec(), b",-inf\r\n".to_vec())
        );
        let verbatim = Frame::Verbatim {
            format: *b"txt",
            text: Bytes::from_static(b"Some string"),
        };
        assert_eq!(
            both(&verbatim),
            (
                b"$11\r\nSome string\r\n".to_vec(),
                b"=15\r\ntxt:Some string\r\n".to_vec()
            )
        );
        let big = Frame::BigNumber("3492890328409238509324850943850943825024385".into());
        assert_eq!(
            both(&big),
            (
                b"$43\r\n3492890328409238509324850943850943825024385\r\n".to_vec(),
                b"(3492890328409238509324850943850943825024385\r\n".to_vec()
            )
        );
    }

    #[test]
    fn line_breaks_in_simple_lines_become_spaces() {
        assert_eq!(
            enc(&Frame::error("ERR a\r\nb\nc"), Protocol::Resp2),
            b"-ERR a  b c\r\n"
        );
        assert_eq!(enc(&Frame::simple("x\ry"), Protocol::Resp3), b"+x y\r\n");
    }

    #[test]
    fn encode_command_is_multibulk() {
        let mut out = BytesMut::new();
        encode_command(&["SET", "k", ""], &mut out);
        assert_eq!(&out[..], b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n");
    }

    #[test]
    fn doubles_format_like_redis_d2string() {
        let cases: &[(f64, &str)] = &[
            (1.5, "1.5"),
            (0.1, "0.1"),
            (-0.1, "-0.1"),
            (3.0, "3"),
            (-100.0, "-100"),
            (0.0, "0"),
            (-0.0, "-0"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
            (f64::NAN, "nan"),
            (1e18, "1000000000000000000"),
            (4_611_686_018_427_387_904.0, "4611686018427387904"),
            (1e20, "1e+20"),
            (-1e20, "-1e+20"),
            (1.2345e25, "1.2345e+25"),
            (1.2345678901234567e19, "12345678901234567000"),
            (1e-7, "1e-7"),
            (1.5e-7, "1.5e-7"),
            (0.000_001, "0.000001"),
            (1.234e-5, "1.234e-5"),
            (1.234e-4, "1.234e-4"),
            (0.00123, "0.00123"),
            (1234.5678, "1234.5678"),
            (0.30000000000000004, "0.30000000000000004"),
            (5e-324, "5e-324"),
            (f64::MAX, "1.7976931348623157e+308"),
            (f64::MIN, "-1.7976931348623157e+308"),
            (1e100, "1e+100"),
        ];
        for &(d, text) in cases {
            assert_eq!(format_double(d).as_str(), text, "{d:e}");
        }
    }

    #[test]
    fn formatted_doubles_parse_back() {
        for d in [
            0.1,
            1.0 / 3.0,
            -2.5e-300,
            6.02214076e23,
            123_456.789,
            f64::MIN_POSITIVE,
            f64::EPSILON,
        ] {
            let text = format_double(d);
            assert_eq!(text.as_str().parse::<f64>().unwrap().to_bits(), d.to_bits());
        }
    }
}
