//! One RESP connection: connect lazily, send a request (or a pipeline of
//! them in one write), read one reply each.
//!
//! A failure is classified by whether the first request was written whole:
//! before that (connect refused, a write that failed part-way through the
//! first request) the node cannot have run anything, and the error is
//! [`ClientError::Io`] (safe to retry); after it, the node may have run the
//! request, and the error is [`ClientError::UnknownOutcome`].

use crate::ClientError;
use bytes::{Bytes, BytesMut};
use keyway_resp::{Frame, Limits, Protocol, ResponseParser, encode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub struct Conn {
    addr: String,
    stream: Option<TcpStream>,
    buf: BytesMut,
    parser: ResponseParser,
    /// The current request was written whole: a failure from now on leaves
    /// its outcome unknown.
    sent: bool,
    /// This connection sent `READONLY` (since it last connected).
    readonly: bool,
}

impl Conn {
    pub fn new(addr: &str) -> Self {
        Conn {
            addr: addr.into(),
            stream: None,
            buf: BytesMut::new(),
            parser: ResponseParser::new(Limits::default()),
            sent: false,
            readonly: false,
        }
    }

    /// Whether this connection sent `READONLY` since it last connected.
    pub fn readonly(&self) -> bool {
        self.readonly && self.stream.is_some()
    }

    /// The node acknowledged `READONLY` on this connection.
    pub fn set_readonly(&mut self) {
        self.readonly = true;
    }

    /// Whether the current (or last) request was written whole, so a failure
    /// or timeout now leaves its outcome unknown.
    pub fn sent(&self) -> bool {
        self.sent
    }

    /// Drops the socket (after a timeout or error) so the next request reconnects.
    pub fn reset(&mut self) {
        self.stream = None;
        self.readonly = false;
        self.buf.clear();
        self.parser = ResponseParser::new(Limits::default());
    }

    /// Sends every request in one write, then reads one reply each, in order.
    pub async fn pipeline<A: AsRef<[Bytes]>>(
        &mut self,
        requests: &[A],
    ) -> Result<Vec<Frame>, ClientError> {
        let result = self.try_pipeline(requests).await;
        if result.is_err() {
            self.reset();
        }
        result
    }

    async fn try_pipeline<A: AsRef<[Bytes]>>(
        &mut self,
        requests: &[A],
    ) -> Result<Vec<Frame>, ClientError> {
        self.sent = false;
        let addr = self.addr.clone();
        let io = |source| ClientError::Io {
            addr: addr.clone(),
            source,
        };
        let unknown = |source| ClientError::UnknownOutcome {
            addr: addr.clone(),
            source,
        };
        if self.stream.is_none() {
            let stream = TcpStream::connect(&self.addr).await.map_err(io)?;
            let _ = stream.set_nodelay(true);
            self.stream = Some(stream);
        }
        let mut out = BytesMut::new();
        let mut first_len = 0;
        for args in requests {
            encode(
                &Frame::Array(args.as_ref().iter().cloned().map(Frame::Bulk).collect()),
                Protocol::Resp2,
                &mut out,
            );
            if first_len == 0 {
                first_len = out.len();
            }
        }
        let stream = self.stream.as_mut().expect("connected above");
        let mut written = 0;
        while written < out.len() {
            let failed = match stream.write(&out[written..]).await {
                Ok(0) => std::io::ErrorKind::WriteZero.into(),
                Ok(n) => {
                    written += n;
                    self.sent |= written >= first_len;
                    continue;
                }
                Err(e) => e,
            };
            return Err(if self.sent {
                unknown(failed)
            } else {
                io(failed)
            });
        }
        self.sent = true;
        let mut replies = Vec::with_capacity(requests.len());
        while replies.len() < requests.len() {
            match self.parser.parse(&mut self.buf) {
                Ok(Some(frame)) => {
                    replies.push(frame);
                    continue;
                }
                Ok(None) => {}
                Err(e) => {
                    return Err(ClientError::Protocol {
                        addr,
                        why: e.to_string(),
                    });
                }
            }
            let n = stream.read_buf(&mut self.buf).await.map_err(unknown)?;
            if n == 0 {
                return Err(unknown(std::io::ErrorKind::UnexpectedEof.into()));
            }
        }
        Ok(replies)
    }
}
