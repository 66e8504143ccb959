//! Keyway's RESP2/RESP3 protocol codec.
//!
//! This crate owns the bytes-to-values boundary of every Keyway connection:
//! decoding client requests the way Redis does (same accepted language, same
//! error text byte for byte), encoding replies in RESP2 or RESP3 (with Redis's
//! RESP2 downgrades of RESP3 types), and parsing replies for clients and
//! tests.
//!
//! ```
//! use bytes::BytesMut;
//! use keyway_resp::{Frame, Limits, Protocol, RequestParser, ResponseParser, encode};
//!
//! // Server side: decode pipelined requests, encode a reply.
//! let mut parser = RequestParser::new(Limits::default());
//! let mut buf = BytesMut::from(&b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\nPING\r\n"[..]);
//! assert_eq!(parser.parse(&mut buf)?.unwrap(), ["GET", "k"]);
//! assert_eq!(parser.parse(&mut buf)?.unwrap(), ["PING"]);
//! assert_eq!(parser.parse(&mut buf)?, None); // needs more bytes
//!
//! let mut out = BytesMut::new();
//! encode(&Frame::Map(vec![(Frame::bulk("k"), Frame::Double(1.5))]), Protocol::Resp2, &mut out);
//! assert_eq!(&out[..], b"*2\r\n$1\r\nk\r\n$3\r\n1.5\r\n");
//!
//! // Client side: parse a reply.
//! let mut replies = ResponseParser::new(Limits::default());
//! assert_eq!(replies.parse(&mut out)?, Some(Frame::Array(vec![Frame::bulk("k"), Frame::bulk("1.5")])));
//! # Ok::<(), keyway_resp::ProtocolError>(())
//! ```
//!
//! # Layout
//!
//! - `frame.rs`: [`Frame`], the RESP value model, and [`Protocol`].
//! - `parse.rs`: [`RequestParser`], the server-side request decoder
//!   (multibulk and inline commands), resumable across partial reads.
//! - `response.rs`: [`ResponseParser`], the client-side reply parser for
//!   every RESP2 and RESP3 type, resumable and depth-bounded.
//! - `encode.rs`: [`encode`] (a frame to RESP2/RESP3 bytes),
//!   [`encode_command`] (a request as a multibulk) and [`format_double`]
//!   (Redis's double text).
//! - `limits.rs`: [`Limits`], every size a peer may declare.
//! - `retry.rs`: [`retry_safe`], which requests may be re-sent after a
//!   failure that left their outcome unknown (shared by the proxy and the
//!   smart client).
//! - `error.rs`: [`ProtocolError`], whose text matches Redis's replies.
//!
//! # Rules
//!
//! - No I/O: callers own sockets and buffers; this crate only reads from and
//!   appends to the `BytesMut` it is handed.
//! - No allocation beyond the frame: argument and blob payloads are zero-copy
//!   slices of the read buffer; nothing is reserved from a length the peer
//!   declared (a `$536870912` header costs nothing until its bytes arrive).
//! - Never panic on any input, and never loop: every `parse` call consumes
//!   input, asks for more, or fails, and a failure is final.
//! - No `unsafe`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod encode;
mod error;
mod frame;
mod limits;
mod parse;
mod response;
mod retry;

pub use encode::{DoubleText, encode, encode_command, format_double, format_double_g17};
pub use error::ProtocolError;
pub use frame::{Frame, Protocol};
pub use limits::{
    DEFAULT_MAX_BULK_LEN_BYTES, DEFAULT_MAX_INLINE_LEN_BYTES, DEFAULT_MAX_MULTIBULK_LEN,
    DEFAULT_MAX_NESTING_DEPTH, Limits,
};
pub use parse::RequestParser;
pub use response::ResponseParser;
pub use retry::{READ_COMMANDS, retry_safe};
