//! The RESP value model shared by the encoder and the reply parser.

use bytes::Bytes;

/// Which protocol a connection speaks (`HELLO 2` / `HELLO 3`).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum Protocol {
    /// RESP2, the default for a new connection.
    #[default]
    Resp2,
    /// RESP3.
    Resp3,
}

/// One RESP value.
///
/// RESP3-only variants are written with a RESP2 downgrade on a RESP2
/// connection (see [`crate::encode`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Frame {
    /// `+OK`. Must not contain CR or LF; the encoder replaces them with spaces.
    Simple(String),
    /// `-ERR ...`: the text without the leading `-` and without CRLF. Must not
    /// contain CR or LF; the encoder replaces them with spaces.
    Error(String),
    /// `:1`.
    Integer(i64),
    /// `$3\r\nfoo`.
    Bulk(Bytes),
    /// `*N`.
    Array(Vec<Frame>),
    /// The null bulk string. RESP2: `$-1`; RESP3: `_`.
    Null,
    /// The null array. RESP2: `*-1`; RESP3: `_`.
    NullArray,
    /// RESP3 `%`. RESP2: a flat array `k1 v1 k2 v2 ...`.
    Map(Vec<(Frame, Frame)>),
    /// RESP3 `~`. RESP2: an array.
    Set(Vec<Frame>),
    /// Pairs: RESP3 an array of two-element arrays, RESP2 a flat array
    /// `a1 b1 a2 b2 ...` (HRANDFIELD ... WITHVALUES, ZRANGE ... WITHSCORES).
    /// Only replies use it: parsers yield arrays.
    Pairs(Vec<(Frame, Frame)>),
    /// RESP3 `,`. RESP2: a bulk string formatted like Redis (`1.5`, `inf`).
    Double(f64),
    /// RESP3 `#t` / `#f`. RESP2: integer 1 / 0.
    Boolean(bool),
    /// RESP3 `=`: a 3-byte format (`txt`, `mkd`) and the text. RESP2: a bulk
    /// string of the text.
    Verbatim {
        /// The format, e.g. `*b"txt"`.
        format: [u8; 3],
        /// The text, without the `fmt:` prefix.
        text: Bytes,
    },
    /// RESP3 `(`: an optionally signed decimal of any size. RESP2: a bulk
    /// string.
    BigNumber(String),
    /// RESP3 `>`: out-of-band data (pub/sub, invalidation). RESP2: an array.
    Push(Vec<Frame>),
}

impl Frame {
    /// `+OK`.
    pub fn ok() -> Frame {
        Frame::Simple("OK".to_owned())
    }

    /// An error reply; `msg` is the text after `-`, e.g. `"ERR syntax error"`.
    pub fn error(msg: impl Into<String>) -> Frame {
        Frame::Error(msg.into())
    }

    /// A simple string reply.
    pub fn simple(msg: impl Into<String>) -> Frame {
        Frame::Simple(msg.into())
    }

    /// A bulk string reply.
    pub fn bulk(b: impl Into<Bytes>) -> Frame {
        Frame::Bulk(b.into())
    }

    /// An integer reply.
    pub fn integer(n: i64) -> Frame {
        Frame::Integer(n)
    }

    /// An array of bulk strings, e.g. a command's arguments.
    pub fn bulk_array<I, B>(items: I) -> Frame
    where
        I: IntoIterator<Item = B>,
        B: Into<Bytes>,
    {
        Frame::Array(items.into_iter().map(|b| Frame::Bulk(b.into())).collect())
    }

    /// Whether this is an error reply.
    pub fn is_error(&self) -> bool {
        matches!(self, Frame::Error(_))
    }

    /// Whether this is either null.
    pub fn is_null(&self) -> bool {
        matches!(self, Frame::Null | Frame::NullArray)
    }

    /// The bytes of a bulk, simple or verbatim string.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Frame::Bulk(b) => Some(b),
            Frame::Simple(s) => Some(s.as_bytes()),
            Frame::Verbatim { text, .. } => Some(text),
            _ => None,
        }
    }
}

impl From<i64> for Frame {
    fn from(n: i64) -> Frame {
        Frame::Integer(n)
    }
}

impl From<Bytes> for Frame {
    fn from(b: Bytes) -> Frame {
        Frame::Bulk(b)
    }
}

impl From<Vec<Frame>> for Frame {
    fn from(items: Vec<Frame>) -> Frame {
        Frame::Array(items)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers_build_expected_variants() {
        assert_eq!(Frame::ok(), Frame::Simple("OK".into()));
        assert_eq!(Frame::error("ERR x"), Frame::Error("ERR x".into()));
        assert_eq!(Frame::bulk("foo"), Frame::Bulk(Bytes::from_static(b"foo")));
        assert_eq!(Frame::integer(-3), Frame::Integer(-3));
        assert_eq!(
            Frame::bulk_array(["a", "b"]),
            Frame::Array(vec![Frame::bulk("a"), Frame::bulk("b")])
        );
        assert_eq!(Frame::from(7), Frame::Integer(7));
    }

    #[test]
    fn predicates() {
        assert!(Frame::error("ERR").is_error());
        assert!(!Frame::ok().is_error());
        assert!(Frame::Null.is_null());
        assert!(Frame::NullArray.is_null());
        assert!(!Frame::Array(vec![]).is_null());
        assert_eq!(Frame::bulk("x").as_bytes(), Some(&b"x"[..]));
        assert_eq!(Frame::ok().as_bytes(), Some(&b"OK"[..]));
        assert_eq!(Frame::Integer(1).as_bytes(), None);
    }

    #[test]
    fn default_protocol_is_resp2() {
        assert_eq!(Protocol::default(), Protocol::Resp2);
    }
}
