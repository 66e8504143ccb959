//! The client-side reply parser: every RESP2 and RESP3 type.
//!
//! Attributes (`|`) are parsed and dropped, wherever they appear. Streamed
//! strings and aggregates (`$?`, `*?`) are not supported. Blob errors (`!`)
//! become [`Frame::Error`]; `$-1` becomes [`Frame::Null`] and `*-1`
//! [`Frame::NullArray`]; RESP3's `_` becomes [`Frame::Null`].
//!
//! Like the request decoder, the parser consumes what it has parsed and keeps
//! partially built aggregates on an explicit stack, so a reply arriving in
//! pieces is never re-scanned, a huge blob costs O(1) per call until it is
//! complete, and nesting depth is bounded by `Limits::max_nesting_depth`
//! without recursion. Unlike the request decoder it checks every CRLF.

use bytes::{Buf, Bytes, BytesMut};

use crate::error::ProtocolError;
use crate::frame::Frame;
use crate::limits::Limits;
use crate::parse::{LineScanner, string2ll};

/// Upper bound on elements reserved up front for an aggregate, whatever
/// count it declares.
const ELEMENTS_PREALLOC_MAX: usize = 1024;

/// Decodes server replies from a connection's read buffer.
///
/// Contract: pass the same buffer on every call and only ever append to it
/// between calls. After an error the parser stays failed and returns the same
/// error on every call.
#[derive(Debug)]
pub struct ResponseParser {
    limits: Limits,
    /// Aggregates opened and not yet complete, outermost first.
    stack: Vec<Aggregate>,
    /// A blob whose header is consumed but whose payload is not complete.
    pending_blob: Option<(BlobKind, usize)>,
    line: LineScanner,
    failed: Option<ProtocolError>,
}

#[derive(Clone, Copy, Debug)]
enum BlobKind {
    Bulk,
    Verbatim,
    Error,
}

#[derive(Debug)]
struct Aggregate {
    /// Child frames still expected (two per map or attribute entry).
    children_remaining: usize,
    building: Building,
}

#[derive(Debug)]
enum Building {
    Array(Vec<Frame>),
    Set(Vec<Frame>),
    Push(Vec<Frame>),
    Map {
        pairs: Vec<(Frame, Frame)>,
        key: Option<Frame>,
    },
    /// Children are parsed and dropped.
    Attribute,
}

/// One step of parsing: a complete frame, or the header of an aggregate.
enum Item {
    Frame(Frame),
    Open(Aggregate),
}

impl ResponseParser {
    /// A parser enforcing `limits`.
    ///
    /// # Panics
    ///
    /// If `limits.validate()` fails: limits are configuration, not input.
    pub fn new(limits: Limits) -> Self {
        if let Err(reason) = limits.validate() {
            panic!("invalid RESP limits: {reason}");
        }
        ResponseParser {
            limits,
            stack: Vec::new(),
            pending_blob: None,
            line: LineScanner::default(),
            failed: None,
        }
    }

    /// The limits this parser enforces.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Whether a reply has been started but not finished.
    pub fn in_reply(&self) -> bool {
        !self.stack.is_empty() || self.pending_blob.is_some()
    }

    /// Decodes the next reply from the front of `buf`.
    ///
    /// `Ok(Some(frame))`: a whole reply was decoded and consumed from `buf`.
    /// `Ok(None)`: more bytes are needed; whatever was consumed is held by the
    /// parser. `Err`: the stream is malformed.
    pub fn parse(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, ProtocolError> {
        if let Some(error) = &self.failed {
            return Err(error.clone());
        }
        let result = self.parse_reply(buf);
        if let Err(error) = &result {
            self.failed = Some(error.clone());
            self.stack.clear();
            self.pending_blob = None;
        }
        result
    }

    fn parse_reply(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, ProtocolError> {
        loop {
            let Some(item) = self.next_item(buf)? else {
                return Ok(None);
            };
            let mut complete = match item {
                Item::Frame(frame) => Some(frame),
                Item::Open(aggregate) => {
                    if self.stack.len() >= self.limits.max_nesting_depth {
                        return Err(ProtocolError::TooDeep);
                    }
                    if aggregate.children_remaining == 0 {
                        aggregate.finish()
                    } else {
                        self.stack.push(aggregate);
                        None
                    }
                }
            };
            assert!(self.stack.len() <= self.limits.max_nesting_depth);
            // Hand the complete frame to its parent, closing every parent it
            // completes; a frame with no parent is the reply.
            while let Some(frame) = complete.take() {
                let Some(top) = self.stack.last_mut() else {
                    return Ok(Some(frame));
                };
                top.push(frame);
                if top.children_remaining == 0 {
                    complete = self.stack.pop().and_then(Aggregate::finish);
                }
            }
        }
    }

    /// Parses and consumes the next frame or aggregate header.
    fn next_item(&mut self, buf: &mut BytesMut) -> Result<Option<Item>, ProtocolError> {
        if let Some((kind, len)) = self.pending_blob {
            return Ok(self.parse_blob(buf, kind, len)?.map(Item::Frame));
        }
        let Some(&type_byte) = buf.first() else {
            return Ok(None);
        };
        if !b"+-:$*_,#!=(%~|>".contains(&type_byte) {
            return Err(ProtocolError::InvalidReplyType(type_byte));
        }
        let Some(cr) = self.find_line(buf)? else {
            return Ok(None);
        };
        let text = &buf[1..cr];
        let item = match type_byte {
            b'+' => Item::Frame(Frame::Simple(lossy(text))),
            b'-' => Item::Frame(Frame::Error(lossy(text))),
            b':' => Item::Frame(Frame::Integer(
                parse_integer(text).ok_or(ProtocolError::InvalidInteger)?,
            )),
            b',' => Item::Frame(Frame::Double(parse_double(text)?)),
            b'#' => Item::Frame(Frame::Boolean(match text {
                b"t" => true,
                b"f" => false,
                _ => return Err(ProtocolError::InvalidBoolean),
            })),
            b'_' if text.is_empty() => Item::Frame(Frame::Null),
            b'_' => return Err(ProtocolError::InvalidNull),
            b'(' => Item::Frame(Frame::BigNumber(parse_big_number(text)?)),
            b'$' | b'=' | b'!' => {
                let len = string2ll(text).ok_or(ProtocolError::InvalidBulkLength)?;
                if type_byte == b'$' && len == -1 {
                    Item::Frame(Frame::Null)
                } else {
                    let len = self.check_blob_len(type_byte, len)?;
                    let kind = match type_byte {
                        b'$' => BlobKind::Bulk,
                        b'=' => BlobKind::Verbatim,
                        _ => BlobKind::Error,
                    };
                    self.line.consume(buf, cr + 2);
                    self.pending_blob = Some((kind, len));
                    return Ok(self.parse_blob(buf, kind, len)?.map(Item::Frame));
                }
            }
            _ => {
                let count = string2ll(text).ok_or(ProtocolError::InvalidMultibulkLength)?;
                if type_byte == b'*' && count == -1 {
                    Item::Frame(Frame::NullArray)
                } else {
                    if count < 0 || count as u64 > self.limits.max_multibulk_len as u64 {
                        return Err(ProtocolError::InvalidMultibulkLength);
                    }
                    Item::Open(Aggregate::new(type_byte, count as usize))
                }
            }
        };
        self.line.consume(buf, cr + 2);
        Ok(Some(item))
    }

    fn check_blob_len(&self, type_byte: u8, len: i64) -> Result<usize, ProtocolError> {
        if len < 0 || len as u64 > self.limits.max_bulk_len_bytes as u64 {
            return Err(ProtocolError::InvalidBulkLength);
        }
        if type_byte == b'=' && len < 4 {
            return Err(ProtocolError::InvalidVerbatim);
        }
        Ok(len as usize)
    }

    /// Finds the CRLF ending the line at the front of `buf`; returns the
    /// index of its `\r`.
    fn find_line(&mut self, buf: &[u8]) -> Result<Option<usize>, ProtocolError> {
        let max_inline_len_bytes = self.limits.max_inline_len_bytes;
        // The line's text starts after the type byte.
        match self.line.find(buf, b'\r') {
            None if buf.len() - 1 > max_inline_len_bytes => Err(ProtocolError::TooBigReplyLine),
            None => Ok(None),
            Some(cr) if cr - 1 > max_inline_len_bytes => Err(ProtocolError::TooBigReplyLine),
            Some(cr) => match buf.get(cr + 1) {
                None => Ok(None),
                Some(b'\n') => Ok(Some(cr)),
                Some(_) => Err(ProtocolError::ExpectedCrlf),
            },
        }
    }

    /// Completes a blob whose header is consumed, once all of it is here.
    fn parse_blob(
        &mut self,
        buf: &mut BytesMut,
        kind: BlobKind,
        len: usize,
    ) -> Result<Option<Frame>, ProtocolError> {
        assert!(len <= self.limits.max_bulk_len_bytes);
        // Nothing is reserved for the payload: a declared length costs no
        // memory until its bytes arrive.
        if buf.len() < len + 2 {
            return Ok(None);
        }
        if &buf[len..len + 2] != b"\r\n" {
            return Err(ProtocolError::ExpectedCrlf);
        }
        let data = buf.split_to(len).freeze();
        buf.advance(2);
        self.pending_blob = None;
        let frame = match kind {
            BlobKind::Bulk => Frame::Bulk(data),
            BlobKind::Error => Frame::Error(lossy(&data)),
            BlobKind::Verbatim => verbatim(data)?,
        };
        Ok(Some(frame))
    }
}

impl Aggregate {
    fn new(type_byte: u8, count: usize) -> Aggregate {
        let capacity = count.min(ELEMENTS_PREALLOC_MAX);
        let (building, children_per_entry) = match type_byte {
            b'*' => (Building::Array(Vec::with_capacity(capacity)), 1),
            b'~' => (Building::Set(Vec::with_capacity(capacity)), 1),
            b'>' => (Building::Push(Vec::with_capacity(capacity)), 1),
            b'%' => (
                Building::Map {
                    pairs: Vec::with_capacity(capacity),
                    key: None,
                },
                2,
            ),
            _ => (Building::Attribute, 2),
        };
        Aggregate {
            // count <= max_multibulk_len <= i32::MAX: cannot overflow.
            children_remaining: count * children_per_entry,
            building,
        }
    }

    fn push(&mut self, frame: Frame) {
        assert!(self.children_remaining > 0);
        self.children_remaining -= 1;
        match &mut self.building {
            Building::Array(items) | Building::Set(items) | Building::Push(items) => {
                items.push(frame)
            }
            Building::Map { pairs, key } => match key.take() {
                Some(key) => pairs.push((key, frame)),
                None => *key = Some(frame),
            },
            Building::Attribute => {}
        }
    }

    /// The finished frame; `None` for an attribute, which is dropped.
    fn finish(self) -> Option<Frame> {
        assert_eq!(self.children_remaining, 0);
        match self.building {
            Building::Array(items) => Some(Frame::Array(items)),
            Building::Set(items) => Some(Frame::Set(items)),
            Building::Push(items) => Some(Frame::Push(items)),
            Building::Map { pairs, key } => {
                assert!(key.is_none());
                Some(Frame::Map(pairs))
            }
            Building::Attribute => None,
        }
    }
}

fn lossy(text: &[u8]) -> String {
    String::from_utf8_lossy(text).into_owned()
}

/// A RESP3 integer: an optional `+` or `-`, then canonical digits.
fn parse_integer(text: &[u8]) -> Option<i64> {
    match text.split_first() {
        Some((b'+', rest)) if rest.first() != Some(&b'-') => string2ll(rest),
        _ => string2ll(text),
    }
}

fn parse_double(text: &[u8]) -> Result<f64, ProtocolError> {
    std::str::from_utf8(text)
        .ok()
        .filter(|s| !s.is_empty())
        .and_then(|s| s.parse::<f64>().ok())
        .ok_or(ProtocolError::InvalidDouble)
}

fn parse_big_number(text: &[u8]) -> Result<String, ProtocolError> {
    let digits = match text.split_first() {
        Some((b'+' | b'-', rest)) => rest,
        _ => text,
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err(ProtocolError::InvalidBigNumber);
    }
    Ok(lossy(text))
}

fn verbatim(data: Bytes) -> Result<Frame, ProtocolError> {
    match &data[..] {
        [a, b, c, b':', ..] => Ok(Frame::Verbatim {
            format: [*a, *b, *c],
            text: data.slice(4..),
        }),
        _ => Err(ProtocolError::InvalidVerbatim),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_one(input: &[u8]) -> Result<Option<Frame>, ProtocolError> {
        let mut buf = BytesMut::from(input);
        let result = ResponseParser::new(Limits::default()).parse(&mut buf);
        if let Ok(Some(_)) = result {
            assert!(buf.is_empty(), "left over: {buf:?}");
        }
        result
    }

    fn ok(input: &[u8]) -> Frame {
        parse_one(input).unwrap().unwrap()
    }

    fn bulk(s: &str) -> Frame {
        Frame::bulk(Bytes::copy_from_slice(s.as_bytes()))
    }

    #[test]
    fn resp2_types() {
        assert_eq!(ok(b"+OK\r\n"), Frame::ok());
        assert_eq!(ok(b"-ERR no\r\n"), Frame::error("ERR no"));
        assert_eq!(ok(b":-12\r\n"), Frame::Integer(-12));
        assert_eq!(ok(b"$3\r\nfoo\r\n"), bulk("foo"));
        assert_eq!(ok(b"$0\r\n\r\n"), bulk(""));
        assert_eq!(ok(b"$-1\r\n"), Frame::Null);
        assert_eq!(ok(b"*-1\r\n"), Frame::NullArray);
        assert_eq!(ok(b"*0\r\n"), Frame::Array(vec![]));
        assert_eq!(
            ok(b"*2\r\n$1\r\na\r\n*1\r\n:1\r\n"),
            Frame::Array(vec![bulk("a"), Frame::Array(vec![Frame::Integer(1)])])
        );
    }

    #[test]
    fn resp3_types() {
        assert_eq!(ok(b"_\r\n"), Frame::Null);
        assert_eq!(ok(b",1.5\r\n"), Frame::Double(1.5));
        assert_eq!(ok(b",-inf\r\n"), Frame::Double(f64::NEG_INFINITY));
        assert_eq!(ok(b",1e+20\r\n"), Frame::Double(1e20));
        assert!(matches!(ok(b",nan\r\n"), Frame::Double(d) if d.is_nan()));
        assert_eq!(ok(b"#t\r\n"), Frame::Boolean(true));
        assert_eq!(ok(b"#f\r\n"), Frame::Boolean(false));
        assert_eq!(ok(b":+7\r\n"), Frame::Integer(7));
        assert_eq!(ok(b"!8\r\nERR x\r\ny\r\n"), Frame::error("ERR x\r\ny"));
        assert_eq!(
            ok(b"=15\r\ntxt:Some string\r\n"),
            Frame::Verbatim {
                format: *b"txt",
                text: Bytes::from_static(b"Some string")
            }
        );
        assert_eq!(
            ok(b"(-123456789012345678901234567890\r\n"),
            Frame::BigNumber("-123456789012345678901234567890".into())
        );
        assert_eq!(
            ok(b"%2\r\n+a\r\n:1\r\n+b\r\n_\r\n"),
            Frame::Map(vec![
                (Frame::simple("a"), Frame::Integer(1)),
                (Frame::simple("b"), Frame::Null)
            ])
        );
        assert_eq!(ok(b"~1\r\n#t\r\n"), Frame::Set(vec![Frame::Boolean(true)]));
        assert_eq!(
            ok(b">2\r\n+message\r\n$2\r\nhi\r\n"),
            Frame::Push(vec![Frame::simple("message"), bulk("hi")])
        );
        assert_eq!(ok(b"%0\r\n"), Frame::Map(vec![]));
    }

    #[test]
    fn attributes_are_skipped_everywhere() {
        let attribute = b"|1\r\n+key-popularity\r\n%1\r\n$1\r\na\r\n,0.19\r\n";
        let mut top = attribute.to_vec();
        top.extend_from_slice(b":42\r\n");
        assert_eq!(ok(&top), Frame::Integer(42));

        let mut nested = b"*2\r\n:1\r\n".to_vec();
        nested.extend_from_slice(attribute);
        nested.extend_from_slice(b":2\r\n");
        assert_eq!(
            ok(&nested),
            Frame::Array(vec![Frame::Integer(1), Frame::Integer(2)])
        );

        assert_eq!(ok(b"|0\r\n+x\r\n"), Frame::simple("x"));
    }

    #[test]
    fn waits_for_complete_attribute_target() {
        let mut parser = ResponseParser::new(Limits::default());
        let mut buf = BytesMut::from(&b"|1\r\n+k\r\n+v\r\n"[..]);
        assert_eq!(parser.parse(&mut buf), Ok(None));
        assert!(buf.is_empty());
        buf.extend_from_slice(b"+OK\r\n");
        assert_eq!(parser.parse(&mut buf), Ok(Some(Frame::ok())));
    }

    #[test]
    fn incremental_blob_is_not_rescanned() {
        let mut parser = ResponseParser::new(Limits::default());
        let mut buf = BytesMut::from(&b"*2\r\n$5\r\nhel"[..]);
        assert_eq!(parser.parse(&mut buf), Ok(None));
        assert_eq!(&buf[..], b"hel");
        assert!(parser.in_reply());
        buf.extend_from_slice(b"lo\r\n:1\r");
        assert_eq!(parser.parse(&mut buf), Ok(None));
        buf.extend_from_slice(b"\n+next\r\n");
        assert_eq!(
            parser.parse(&mut buf),
            Ok(Some(Frame::Array(vec![bulk("hello"), Frame::Integer(1)])))
        );
        assert!(!parser.in_reply());
        assert_eq!(parser.parse(&mut buf), Ok(Some(Frame::simple("next"))));
        assert_eq!(parser.parse(&mut buf), Ok(None));
    }

    #[test]
    fn malformed_replies() {
        let cases: &[(&[u8], ProtocolError)] = &[
            (b"?x\r\n", ProtocolError::InvalidReplyType(b'?')),
            (b"\r\n", ProtocolError::InvalidReplyType(b'\r')),
            (b":1x\r\n", ProtocolError::InvalidInteger),
            (b":\r\n", ProtocolError::InvalidInteger),
            (b":+-1\r\n", ProtocolError::InvalidInteger),
            (b",\r\n", ProtocolError::InvalidDouble),
            (b",1.5x\r\n", ProtocolError::InvalidDouble),
            (b"#x\r\n", ProtocolError::InvalidBoolean),
            (b"_x\r\n", ProtocolError::InvalidNull),
            (b"(\r\n", ProtocolError::InvalidBigNumber),
            (b"(12a\r\n", ProtocolError::InvalidBigNumber),
            (b"$-2\r\n", ProtocolError::InvalidBulkLength),
            (b"$x\r\n", ProtocolError::InvalidBulkLength),
            (b"!-1\r\n", ProtocolError::InvalidBulkLength),
            (b"=3\r\ntxt\r\n", ProtocolError::InvalidVerbatim),
            (b"=4\r\ntxtx\r\n", ProtocolError::InvalidVerbatim),
            (b"~-1\r\n", ProtocolError::InvalidMultibulkLength),
            (b"%-1\r\n", ProtocolError::InvalidMultibulkLength),
            (b"*1048577\r\n", ProtocolError::InvalidMultibulkLength),
            (b"$3\r\nfooXY", ProtocolError::ExpectedCrlf),
            (b"+OK\rX", ProtocolError::ExpectedCrlf),
        ];
        for (input, expected) in cases {
            assert_eq!(
                parse_one(input).as_ref(),
                Err(expected),
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn depth_limit() {
        let limits = Limits {
            max_nesting_depth: 3,
            ..Limits::default()
        };
        let mut buf = BytesMut::from(&b"*1\r\n*1\r\n*1\r\n:1\r\n"[..]);
        let mut parser = ResponseParser::new(limits.clone());
        assert!(parser.parse(&mut buf).unwrap().is_some());
        let mut buf = BytesMut::from(&b"*1\r\n*1\r\n*1\r\n*0\r\n"[..]);
        let mut parser = ResponseParser::new(limits);
        assert_eq!(parser.parse(&mut buf), Err(ProtocolError::TooDeep));
        assert_eq!(parser.parse(&mut buf), Err(ProtocolError::TooDeep));
    }

    #[test]
    fn deep_nesting_within_default_limit_and_beyond() {
        let depth = Limits::default().max_nesting_depth;
        let mut input = b"*1\r\n".repeat(depth);
        input.extend_from_slice(b"+x\r\n");
        assert!(parse_one(&input).unwrap().is_some());
        let mut input = b"*1\r\n".repeat(depth + 1);
        input.extend_from_slice(b"+x\r\n");
        assert_eq!(parse_one(&input), Err(ProtocolError::TooDeep));
    }

    #[test]
    fn long_reply_line_errors_before_its_crlf() {
        let limits = Limits {
            max_inline_len_bytes: 4,
            ..Limits::default()
        };
        let mut parser = ResponseParser::new(limits.clone());
        let mut buf = BytesMut::from(&b"+abcd"[..]);
        assert_eq!(parser.parse(&mut buf), Ok(None));
        buf.extend_from_slice(b"e");
        assert_eq!(parser.parse(&mut buf), Err(ProtocolError::TooBigReplyLine));
        let mut parser = ResponseParser::new(limits);
        let mut buf = BytesMut::from(&b"+abcd\r\n"[..]);
        assert_eq!(parser.parse(&mut buf), Ok(Some(Frame::simple("abcd"))));
    }

    #[test]
    fn invalid_utf8_simple_string_is_lossy() {
        assert_eq!(ok(b"+a\xffb\r\n"), Frame::simple("a\u{fffd}b"));
    }
}
