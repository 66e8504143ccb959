//! The server-side request decoder.
//!
//! A request is either a multibulk array of bulk strings
//! (`*2\r\n$3\r\nGET\r\n$1\r\nk\r\n`) or an inline command (`GET k\r\n`), told
//! apart by the first byte (`*` or not), exactly like Redis's
//! `processInputBuffer`. The accepted language and the error for each
//! malformation follow Redis's `processMultibulkBuffer` and
//! `processInlineBuffer`:
//!
//! - `*<n>` with `n <= 0` is an empty request and is skipped; so is an inline
//!   line with no arguments (`\r\n`, `   \n`).
//! - Like Redis, the byte after a header's `\r` and the two bytes after a bulk
//!   payload are skipped without checking that they are CRLF.
//! - Inline lines end at `\n`, with one optional `\r` before it; arguments are
//!   split like Redis's `sdssplitargs`, which stops at a NUL byte. (Redis
//!   itself never gets that far: its `strchr` stops at the NUL too, so it
//!   waits for a newline until the line is too big. Here the arguments just
//!   end at the NUL. Likewise a NUL in a `*`/`$` header is an ordinary
//!   malformed header here, not a stall.)
//!
//! Where Redis's outcome depends on how the bytes were split across reads,
//! this decoder is deterministic instead: a header or inline line longer than
//! `max_inline_len_bytes` is always an error, whether or not its terminator
//! has arrived. So the sequence of results never depends on where the input
//! was split.
//!
//! Parsed headers and finished arguments are consumed from the buffer as
//! they complete and kept in the parser, so a 512 MiB bulk arriving in pieces
//! costs O(1) per call, and no call re-scans bytes an earlier call scanned.

use bytes::{Buf, Bytes, BytesMut};

use crate::error::ProtocolError;
use crate::limits::Limits;

/// Upper bound on argument slots reserved up front for a multibulk request,
/// whatever count it declares (Redis reserves `min(count, 1024)` too).
const ARGS_PREALLOC_MAX: usize = 1024;

/// Decodes client requests from a connection's read buffer.
///
/// Contract: pass the same buffer on every call and only ever append to it
/// between calls. After an error the parser stays failed and returns the same
/// error on every call; the connection must be closed.
#[derive(Debug)]
pub struct RequestParser {
    limits: Limits,
    state: State,
    line: LineScanner,
    failed: Option<ProtocolError>,
}

#[derive(Debug)]
enum State {
    /// Between requests: the buffer starts a new request.
    Idle,
    /// Inside a multibulk request whose `*<n>` header is consumed.
    Multibulk {
        args: Vec<Bytes>,
        args_remaining: usize,
        /// Length of the argument whose `$<n>` header is consumed but whose
        /// payload is not complete yet.
        bulk_len_bytes: Option<usize>,
    },
}

impl RequestParser {
    /// A parser enforcing `limits`.
    ///
    /// # Panics
    ///
    /// If `limits.validate()` fails: limits are configuration, not input.
    pub fn new(limits: Limits) -> Self {
        if let Err(reason) = limits.validate() {
            panic!("invalid RESP limits: {reason}");
        }
        RequestParser {
            limits,
            state: State::Idle,
            line: LineScanner::default(),
            failed: None,
        }
    }

    /// The limits this parser enforces.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Whether a request has been started but not finished (its consumed
    /// part is held by the parser).
    pub fn in_request(&self) -> bool {
        matches!(self.state, State::Multibulk { .. })
    }

    /// Decodes the next request from the front of `buf`.
    ///
    /// `Ok(Some(args))`: a whole request was decoded and consumed from `buf`
    /// (never empty: empty requests are skipped). `Ok(None)`: more bytes are
    /// needed; whatever was consumed is held by the parser and used on the
    /// next call. `Err`: the stream is malformed and cannot be resynchronised.
    pub fn parse(&mut self, buf: &mut BytesMut) -> Result<Option<Vec<Bytes>>, ProtocolError> {
        if let Some(error) = &self.failed {
            return Err(error.clone());
        }
        let result = self.parse_request(buf);
        if let Err(error) = &result {
            self.failed = Some(error.clone());
            self.state = State::Idle;
        }
        result
    }

    fn parse_request(&mut self, buf: &mut BytesMut) -> Result<Option<Vec<Bytes>>, ProtocolError> {
        loop {
            if let State::Idle = self.state {
                let Some(&first) = buf.first() else {
                    return Ok(None);
                };
                if first != b'*' {
                    match self.parse_inline(buf)? {
                        None => return Ok(None),
                        Some(args) if args.is_empty() => continue,
                        Some(args) => return Ok(Some(args)),
                    }
                }
                let Some(count) = self.parse_multibulk_header(buf)? else {
                    return Ok(None);
                };
                if count == 0 {
                    continue;
                }
                self.state = State::Multibulk {
                    args: Vec::with_capacity(count.min(ARGS_PREALLOC_MAX)),
                    args_remaining: count,
                    bulk_len_bytes: None,
                };
            }
            return self.parse_multibulk_args(buf);
        }
    }

    /// Consumes a `*<n>` header; returns `n`, or 0 for `n <= 0`.
    fn parse_multibulk_header(
        &mut self,
        buf: &mut BytesMut,
    ) -> Result<Option<usize>, ProtocolError> {
        let max_multibulk_len = self.limits.max_multibulk_len;
        let Some(cr) = self.line.find_header(
            buf,
            self.limits.max_inline_len_bytes,
            ProtocolError::TooBigMbulkCount,
        )?
        else {
            return Ok(None);
        };
        debug_assert_eq!(buf[0], b'*');
        let count = match string2ll(&buf[1..cr]) {
            Some(n) if n <= 0 => 0,
            Some(n) if n as u64 <= max_multibulk_len as u64 => n as usize,
            _ => return Err(ProtocolError::InvalidMultibulkLength),
        };
        assert!(count <= max_multibulk_len);
        self.line.consume(buf, cr + 2);
        Ok(Some(count))
    }

    fn parse_multibulk_args(
        &mut self,
        buf: &mut BytesMut,
    ) -> Result<Option<Vec<Bytes>>, ProtocolError> {
        let max_bulk_len_bytes = self.limits.max_bulk_len_bytes;
        let max_inline_len_bytes = self.limits.max_inline_len_bytes;
        let State::Multibulk {
            args,
            args_remaining,
            bulk_len_bytes,
        } = &mut self.state
        else {
            unreachable!("parse_multibulk_args outside a multibulk request");
        };
        while *args_remaining > 0 {
            let len = match *bulk_len_bytes {
                Some(len) => len,
                None => {
                    let Some(cr) = self.line.find_header(
                        buf,
                        max_inline_len_bytes,
                        ProtocolError::TooBigBulkCount,
                    )?
                    else {
                        return Ok(None);
                    };
                    if buf[0] != b'$' {
                        return Err(ProtocolError::ExpectedDollar(buf[0]));
                    }
                    let len = match string2ll(&buf[1..cr]) {
                        Some(n) if n >= 0 && n as u64 <= max_bulk_len_bytes as u64 => n as usize,
                        _ => return Err(ProtocolError::InvalidBulkLength),
                    };
                    self.line.consume(buf, cr + 2);
                    *bulk_len_bytes = Some(len);
                    len
                }
            };
            assert!(len <= max_bulk_len_bytes);
            // The payload and its CRLF. Nothing is reserved for it: a
            // declared length costs no memory until its bytes arrive.
            if buf.len() < len + 2 {
                return Ok(None);
            }
            args.push(buf.split_to(len).freeze());
            buf.advance(2);
            *bulk_len_bytes = None;
            *args_remaining -= 1;
        }
        let State::Multibulk { args, .. } = std::mem::replace(&mut self.state, State::Idle) else {
            unreachable!("state checked above");
        };
        assert!(!args.is_empty());
        Ok(Some(args))
    }

    /// Consumes one inline line; returns its arguments (maybe none).
    fn parse_inline(&mut self, buf: &mut BytesMut) -> Result<Option<Vec<Bytes>>, ProtocolError> {
        let max_inline_len_bytes = self.limits.max_inline_len_bytes;
        let Some(lf) = self.line.find(buf, b'\n') else {
            // A trailing '\r' may turn out to be the terminator's.
            let line_len_min_bytes = buf.len() - usize::from(buf.last() == Some(&b'\r'));
            if line_len_min_bytes > max_inline_len_bytes {
                return Err(ProtocolError::TooBigInlineRequest);
            }
            return Ok(None);
        };
        let line_len_bytes = if lf > 0 && buf[lf - 1] == b'\r' {
            lf - 1
        } else {
            lf
        };
        if line_len_bytes > max_inline_len_bytes {
            return Err(ProtocolError::TooBigInlineRequest);
        }
        let line = buf.split_to(lf + 1).freeze();
        self.line.reset();
        split_args(&line.slice(..line_len_bytes)).map(Some)
    }
}

/// Remembers how much of the line at the front of the buffer was already
/// searched for its terminator.
#[derive(Debug, Default)]
pub(crate) struct LineScanner {
    scanned_bytes: usize,
}

impl LineScanner {
    /// Index of the first `needle` in `buf`, searching only bytes not
    /// searched before.
    pub(crate) fn find(&mut self, buf: &[u8], needle: u8) -> Option<usize> {
        // A shorter buffer breaks the append-only contract; rescan it.
        let from = if self.scanned_bytes <= buf.len() {
            self.scanned_bytes
        } else {
            0
        };
        match memchr::memchr(needle, &buf[from..]) {
            Some(i) => {
                self.scanned_bytes = from + i;
                Some(from + i)
            }
            None => {
                self.scanned_bytes = buf.len();
                None
            }
        }
    }

    /// Finds a complete `<prefix><text>\r?` header line like Redis does (the
    /// first `\r`, followed by any byte) and returns the index of its `\r`.
    /// A header longer than `max_len_bytes` fails with `too_big`, whether or
    /// not its `\r` has arrived.
    fn find_header(
        &mut self,
        buf: &[u8],
        max_len_bytes: usize,
        too_big: ProtocolError,
    ) -> Result<Option<usize>, ProtocolError> {
        match self.find(buf, b'\r') {
            None if buf.len() > max_len_bytes => Err(too_big),
            None => Ok(None),
            Some(cr) if cr > max_len_bytes => Err(too_big),
            Some(cr) if cr + 1 >= buf.len() => Ok(None),
            Some(cr) => Ok(Some(cr)),
        }
    }

    pub(crate) fn consume(&mut self, buf: &mut BytesMut, len: usize) {
        buf.advance(len);
        self.reset();
    }

    fn reset(&mut self) {
        self.scanned_bytes = 0;
    }
}

/// Redis's `string2ll`: an optional `-`, then `0` alone or a digit 1-9
/// followed by digits; no `+`, spaces or leading zeros; at most 20 bytes;
/// must fit an `i64`.
pub(crate) fn string2ll(s: &[u8]) -> Option<i64> {
    /// Redis's `LONG_STR_SIZE`: longer strings are rejected outright.
    const LONG_STR_SIZE: usize = 21;
    if s.is_empty() || s.len() >= LONG_STR_SIZE {
        return None;
    }
    if s == b"0" {
        return Some(0);
    }
    let (negative, digits) = match s.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, s),
    };
    match digits.first() {
        Some(b'1'..=b'9') => {}
        _ => return None,
    }
    let mut value: u64 = 0;
    for &b in digits {
        if !b.is_ascii_digit() {
            return None;
        }
        value = value.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    if negative {
        0i64.checked_sub_unsigned(value)
    } else {
        i64::try_from(value).ok()
    }
}

/// C's `isspace` in the C locale.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// Splits an inline line like Redis's `sdssplitargs`: blanks separate
/// arguments; `"..."` understands `\n \r \t \b \a \xHH` and `\<any>`;
/// `'...'` understands `\'`; a closing quote must be followed by a blank or
/// the end. Like the C original, the line ends at its first NUL byte.
/// Unquoted arguments are zero-copy slices of `line`.
fn split_args(line: &Bytes) -> Result<Vec<Bytes>, ProtocolError> {
    let end = memchr::memchr(0, line).unwrap_or(line.len());
    let s = &line[..end];
    let mut args = Vec::new();
    let mut i = 0;
    loop {
        while i < s.len() && is_c_space(s[i]) {
            i += 1;
        }
        if i == s.len() {
            return Ok(args);
        }
        let start = i;
        while i < s.len() && !matches!(s[i], b' ' | b'\n' | b'\r' | b'\t' | b'"' | b'\'') {
            i += 1;
        }
        if i == s.len() || !matches!(s[i], b'"' | b'\'') {
            args.push(line.slice(start..i));
            continue;
        }
        let mut arg = s[start..i].to_vec();
        i = split_quoted(s, i, &mut arg)?;
        args.push(Bytes::from(arg));
    }
}

/// Continues an argument at `s[i]`, which may open a quote, following
/// `sdssplitargs` byte for byte. Returns the index after the argument.
fn split_quoted(s: &[u8], mut i: usize, arg: &mut Vec<u8>) -> Result<usize, ProtocolError> {
    // C reads the NUL terminator past the end.
    let at = |j: usize| s.get(j).copied().unwrap_or(0);
    let mut in_double = false;
    let mut in_single = false;
    loop {
        let c = at(i);
        let mut done = false;
        if in_double {
            if c == b'\\'
                && at(i + 1) == b'x'
                && at(i + 2).is_ascii_hexdigit()
                && at(i + 3).is_ascii_hexdigit()
            {
                arg.push(hex_value(at(i + 2)) * 16 + hex_value(at(i + 3)));
                i += 3;
            } else if c == b'\\' && at(i + 1) != 0 {
                i += 1;
                arg.push(match at(i) {
                    b'n' => b'\n',
                    b'r' => b'\r',
                    b't' => b'\t',
                    b'b' => 0x08,
                    b'a' => 0x07,
                    other => other,
                });
            } else if c == b'"' {
                if at(i + 1) != 0 && !is_c_space(at(i + 1)) {
                    return Err(ProtocolError::UnbalancedQuotes);
                }
                done = true;
            } else if c == 0 {
                return Err(ProtocolError::UnbalancedQuotes);
            } else {
                arg.push(c);
            }
        } else if in_single {
            if c == b'\\' && at(i + 1) == b'\'' {
                i += 1;
                arg.push(b'\'');
            } else if c == b'\'' {
                if at(i + 1) != 0 && !is_c_space(at(i + 1)) {
                    return Err(ProtocolError::UnbalancedQuotes);
                }
                done = true;
            } else if c == 0 {
                return Err(ProtocolError::UnbalancedQuotes);
            } else {
                arg.push(c);
            }
        } else {
            match c {
                b' ' | b'\n' | b'\r' | b'\t' | 0 => done = true,
                b'"' => in_double = true,
                b'\'' => in_single = true,
                other => arg.push(other),
            }
        }
        if at(i) != 0 {
            i += 1;
        }
        if done {
            return Ok(i);
        }
    }
}

fn hex_value(b: u8) -> u8 {
    match b {
        b'0'..=b'9' => b - b'0',
        b'a'..=b'f' => b - b'a' + 10,
        b'A'..=b'F' => b - b'A' + 10,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parser() -> RequestParser {
        RequestParser::new(Limits::default())
    }

    /// Parses all of `input` at once; returns the requests and the final
    /// error, if any.
    fn parse_all(input: &[u8]) -> (Vec<Vec<Vec<u8>>>, Option<ProtocolError>) {
        let mut parser = parser();
        let mut buf = BytesMut::from(input);
        let mut requests = Vec::new();
        loop {
            match parser.parse(&mut buf) {
                Ok(Some(args)) => requests.push(args.iter().map(|a| a.to_vec()).collect()),
                Ok(None) => return (requests, None),
                Err(e) => return (requests, Some(e)),
            }
        }
    }

    fn args(list: &[&str]) -> Vec<Vec<u8>> {
        list.iter().map(|a| a.as_bytes().to_vec()).collect()
    }

    fn inline(line: &str) -> Result<Vec<Vec<u8>>, ProtocolError> {
        split_args(&Bytes::copy_from_slice(line.as_bytes()))
            .map(|args| args.iter().map(|a| a.to_vec()).collect())
    }

    #[test]
    fn multibulk_request() {
        let (requests, error) = parse_all(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n");
        assert_eq!(requests, vec![args(&["SET", "k", ""])]);
        assert_eq!(error, None);
    }

    #[test]
    fn pipelined_requests_come_out_in_order() {
        let (requests, error) =
            parse_all(b"*1\r\n$4\r\nPING\r\nECHO hi\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n");
        assert_eq!(
            requests,
            vec![args(&["PING"]), args(&["ECHO", "hi"]), args(&["GET", "k"])]
        );
        assert_eq!(error, None);
    }

    #[test]
    fn empty_requests_are_skipped() {
        let (requests, error) = parse_all(b"\r\n\n   \r\n*0\r\n*-1\r\n*-7\r\nPING\r\n");
        assert_eq!(requests, vec![args(&["PING"])]);
        assert_eq!(error, None);
    }

    #[test]
    fn incomplete_input_needs_more_and_keeps_progress() {
        let mut parser = parser();
        let mut buf = BytesMut::from(&b"*2\r\n$3\r\nGET\r\n$1"[..]);
        assert_eq!(parser.parse(&mut buf), Ok(None));
        assert!(parser.in_request());
        // The header and the finished argument were consumed and kept.
        assert_eq!(&buf[..], b"$1");
        buf.extend_from_slice(b"\r\nk\r");
        assert_eq!(parser.parse(&mut buf), Ok(None));
        buf.extend_from_slice(b"\n");
        let request = parser.parse(&mut buf).unwrap().unwrap();
        assert_eq!(request, vec![Bytes::from("GET"), Bytes::from("k")]);
        assert!(buf.is_empty());
        assert!(!parser.in_request());
    }

    #[test]
    fn header_waits_for_byte_after_cr() {
        let mut parser = parser();
        let mut buf = BytesMut::from(&b"*1\r"[..]);
        assert_eq!(parser.parse(&mut buf), Ok(None));
        assert_eq!(&buf[..], b"*1\r");
        buf.extend_from_slice(b"\n$1\r\nx\r\n");
        assert_eq!(parser.parse(&mut buf), Ok(Some(vec![Bytes::from("x")])));
    }

    #[test]
    fn malformed_multibulk_errors_like_redis() {
        let cases: &[(&[u8], ProtocolError)] = &[
            (b"*3000000000\r\n", ProtocolError::InvalidMultibulkLength),
            (b"*1048577\r\n", ProtocolError::InvalidMultibulkLength),
            (b"*abc\r\n", ProtocolError::InvalidMultibulkLength),
            (b"*\r\n", ProtocolError::InvalidMultibulkLength),
            (b"*+1\r\n", ProtocolError::InvalidMultibulkLength),
            (b"*01\r\n", ProtocolError::InvalidMultibulkLength),
            (b"*1\r\n$-10\r\n", ProtocolError::InvalidBulkLength),
            (b"*1\r\n$2000000000\r\n", ProtocolError::InvalidBulkLength),
            (b"*1\r\n$blabla\r\n", ProtocolError::InvalidBulkLength),
            (b"*1\r\n$-1\r\n", ProtocolError::InvalidBulkLength),
            (b"*1\r\nfoo\r\n", ProtocolError::ExpectedDollar(b'f')),
            (b"*1\r\n\r\n", ProtocolError::ExpectedDollar(b'\r')),
            (
                b"*3\r\n$3\r\nSET\r\n$1\r\nx\r\nfooz\r\n",
                ProtocolError::ExpectedDollar(b'f'),
            ),
        ];
        for (input, expected) in cases {
            let (_, error) = parse_all(input);
            assert_eq!(
                error.as_ref(),
                Some(expected),
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn errors_are_sticky() {
        let mut parser = parser();
        let mut buf = BytesMut::from(&b"*x\r\n"[..]);
        assert_eq!(
            parser.parse(&mut buf),
            Err(ProtocolError::InvalidMultibulkLength)
        );
        buf.clear();
        buf.extend_from_slice(b"PING\r\n");
        assert_eq!(
            parser.parse(&mut buf),
            Err(ProtocolError::InvalidMultibulkLength)
        );
    }

    #[test]
    fn bulk_trailer_is_not_checked_like_redis() {
        let (requests, error) = parse_all(b"*1\r\n$1\r\nxAB*1\r\n$1\r\ny\r\n");
        assert_eq!(requests, vec![args(&["x"]), args(&["y"])]);
        assert_eq!(error, None);
    }

    #[test]
    fn inline_lines() {
        let (requests, error) = parse_all(b"SET a b\r\nGET a\nPING\r\r\n");
        assert_eq!(
            requests,
            vec![
                args(&["SET", "a", "b"]),
                args(&["GET", "a"]),
                args(&["PING"])
            ]
        );
        assert_eq!(error, None);
    }

    #[test]
    fn unbalanced_quotes() {
        let (requests, error) = parse_all(b"set \"\"\"test-key\"\"\" test-value\r\nping\r\n");
        assert!(requests.is_empty());
        assert_eq!(error, Some(ProtocolError::UnbalancedQuotes));
    }

    #[test]
    fn split_args_like_sdssplitargs() {
        assert_eq!(inline("  a   b\tc  "), Ok(args(&["a", "b", "c"])));
        assert_eq!(inline(""), Ok(vec![]));
        assert_eq!(inline("\"a b\" 'c d'"), Ok(args(&["a b", "c d"])));
        assert_eq!(inline("\"\""), Ok(args(&[""])));
        assert_eq!(
            inline(r#""\n\r\t\b\a\\\"\q""#),
            Ok(vec![b"\n\r\t\x08\x07\\\"q".to_vec()])
        );
        assert_eq!(inline(r#""\x41\x4a\x4G""#), Ok(vec![b"AJx4G".to_vec()]));
        assert_eq!(inline(r#"'it\'s' '\n'"#), Ok(args(&["it's", "\\n"])));
        assert_eq!(inline("foo\"bar baz\" x"), Ok(args(&["foobar baz", "x"])));
        assert_eq!(inline("a\x0bb"), Ok(vec![b"a\x0bb".to_vec()]));
        assert_eq!(inline("\x0b a"), Ok(args(&["a"])));
        assert_eq!(inline("a\0b c"), Ok(args(&["a"])));
        assert_eq!(inline("\"a\"b"), Err(ProtocolError::UnbalancedQuotes));
        assert_eq!(inline("'a'b"), Err(ProtocolError::UnbalancedQuotes));
        assert_eq!(inline("\"abc"), Err(ProtocolError::UnbalancedQuotes));
        assert_eq!(inline("'abc"), Err(ProtocolError::UnbalancedQuotes));
        assert_eq!(inline("\"abc\\"), Err(ProtocolError::UnbalancedQuotes));
        assert_eq!(inline("\"a\0\""), Err(ProtocolError::UnbalancedQuotes));
    }

    #[test]
    fn unquoted_args_share_the_line() {
        let line = Bytes::from_static(b"GET key");
        let args = split_args(&line).unwrap();
        assert_eq!(args[1].as_ptr(), line[4..].as_ptr());
    }

    #[test]
    fn string2ll_matches_redis() {
        assert_eq!(string2ll(b"0"), Some(0));
        assert_eq!(string2ll(b"-1"), Some(-1));
        assert_eq!(string2ll(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(string2ll(b"-9223372036854775808"), Some(i64::MIN));
        for bad in [
            &b""[..],
            b"-",
            b"-0",
            b"00",
            b"01",
            b"+1",
            b" 1",
            b"1 ",
            b"1a",
            b"9223372036854775808",
            b"-9223372036854775809",
            b"000000000000000000001",
            b"99999999999999999999",
        ] {
            assert_eq!(string2ll(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    #[should_panic(expected = "invalid RESP limits")]
    fn invalid_limits_panic() {
        let _ = RequestParser::new(Limits {
            max_inline_len_bytes: 0,
            ..Limits::default()
        });
    }
}
