//! Protocol errors.
//!
//! The request-side variants render exactly the text Redis puts after `-ERR `
//! (see `processInlineBuffer` and `processMultibulkBuffer` in Redis's
//! `networking.c`), so the server can reply with `Frame::Error(format!("ERR {e}"))`
//! (or [`ProtocolError::to_frame`]) and clients see byte-identical errors.
//!
//! Every protocol error is fatal for the connection: the stream cannot be
//! resynchronised, so the server replies once and closes.

use std::fmt;

use crate::frame::Frame;

/// A malformed RESP stream.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum ProtocolError {
    /// `*<n>` with a non-number, or `n` over `Limits::max_multibulk_len`.
    /// The reply parser also uses it for a bad aggregate count.
    #[error("Protocol error: invalid multibulk length")]
    InvalidMultibulkLength,

    /// `$<n>` with a non-number, a negative `n`, or `n` over
    /// `Limits::max_bulk_len_bytes`. The reply parser also uses it for a bad
    /// blob length.
    #[error("Protocol error: invalid bulk length")]
    InvalidBulkLength,

    /// An argument of a multibulk request did not start with `$`.
    #[error("Protocol error: expected '$', got '{}'", RedisChar(*.0))]
    ExpectedDollar(u8),

    /// An inline request line longer than `Limits::max_inline_len_bytes`.
    #[error("Protocol error: too big inline request")]
    TooBigInlineRequest,

    /// A `*<n>` header line longer than `Limits::max_inline_len_bytes`.
    #[error("Protocol error: too big mbulk count string")]
    TooBigMbulkCount,

    /// A `$<n>` header line longer than `Limits::max_inline_len_bytes`.
    #[error("Protocol error: too big bulk count string")]
    TooBigBulkCount,

    /// An inline request with an unterminated quote, or a closing quote
    /// followed by something other than a space.
    #[error("Protocol error: unbalanced quotes in request")]
    UnbalancedQuotes,

    // ----- Reply-parser-only errors (never sent by a server). -----
    /// A reply started with a byte that is not a RESP2/RESP3 type.
    #[error("Protocol error: invalid reply type byte {0:#04x}")]
    InvalidReplyType(u8),

    /// A reply line (simple string, error, number, length) longer than
    /// `Limits::max_inline_len_bytes`.
    #[error("Protocol error: too big reply line")]
    TooBigReplyLine,

    /// A line or blob that is not terminated by CRLF.
    #[error("Protocol error: expected CRLF")]
    ExpectedCrlf,

    /// A `:` integer that is not a valid signed 64-bit decimal.
    #[error("Protocol error: invalid integer")]
    InvalidInteger,

    /// A `,` double that does not parse.
    #[error("Protocol error: invalid double")]
    InvalidDouble,

    /// A `#` boolean other than `t` or `f`.
    #[error("Protocol error: invalid boolean")]
    InvalidBoolean,

    /// A `_` null with a payload.
    #[error("Protocol error: invalid null")]
    InvalidNull,

    /// A `(` big number that is not an optionally signed run of digits.
    #[error("Protocol error: invalid big number")]
    InvalidBigNumber,

    /// A `=` verbatim string shorter than 4 bytes or without `:` after the
    /// 3-byte format.
    #[error("Protocol error: invalid verbatim string")]
    InvalidVerbatim,

    /// Aggregates nested deeper than `Limits::max_nesting_depth`.
    #[error("Protocol error: nesting too deep")]
    TooDeep,
}

impl ProtocolError {
    /// The error reply a server sends for this error: `-ERR <Display>`.
    pub fn to_frame(&self) -> Frame {
        Frame::Error(format!("ERR {self}"))
    }
}

/// Renders a byte like Redis's `addReplyErrorFormat("%c")`: the byte itself,
/// except that CR and LF become spaces (Redis maps them so the error stays
/// one line). Bytes >= 0x80 render as the Latin-1 char (Redis sends the raw
/// byte, which is not valid UTF-8 on its own).
struct RedisChar(u8);

impl fmt::Display for RedisChar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = match self.0 {
            b'\r' | b'\n' => ' ',
            b => char::from(b),
        };
        write!(f, "{c}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_matches_redis_text() {
        let cases = [
            (
                ProtocolError::InvalidMultibulkLength,
                "Protocol error: invalid multibulk length",
            ),
            (
                ProtocolError::InvalidBulkLength,
                "Protocol error: invalid bulk length",
            ),
            (
                ProtocolError::ExpectedDollar(b'f'),
                "Protocol error: expected '$', got 'f'",
            ),
            (
                ProtocolError::TooBigInlineRequest,
                "Protocol error: too big inline request",
            ),
            (
                ProtocolError::TooBigMbulkCount,
                "Protocol error: too big mbulk count string",
            ),
            (
                ProtocolError::TooBigBulkCount,
                "Protocol error: too big bulk count string",
            ),
            (
                ProtocolError::UnbalancedQuotes,
                "Protocol error: unbalanced quotes in request",
            ),
        ];
        for (error, text) in cases {
            assert_eq!(error.to_string(), text);
        }
    }

    #[test]
    fn expected_dollar_maps_crlf_to_space() {
        assert_eq!(
            ProtocolError::ExpectedDollar(b'\r').to_string(),
            "Protocol error: expected '$', got ' '"
        );
        assert_eq!(
            ProtocolError::ExpectedDollar(b'\n').to_string(),
            "Protocol error: expected '$', got ' '"
        );
    }

    #[test]
    fn to_frame_prefixes_err() {
        assert_eq!(
            ProtocolError::InvalidBulkLength.to_frame(),
            Frame::Error("ERR Protocol error: invalid bulk length".into())
        );
    }
}
