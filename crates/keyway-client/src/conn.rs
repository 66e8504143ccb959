//! One RESP connection: connect lazily, send a request, read one reply.

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
}

impl Conn {
    pub fn new(addr: &str) -> Self {
        Conn {
            addr: addr.into(),
            stream: None,
            buf: BytesMut::new(),
            parser: ResponseParser::new(Limits::default()),
        }
    }

    /// Drops the socket (after a timeout or error) so the next request reconnects.
    pub fn reset(&mut self) {
        self.stream = None;
        self.buf.clear();
        self.parser = ResponseParser::new(Limits::default());
    }

    pub async fn request(&mut self, args: &[Bytes]) -> Result<Frame, ClientError> {
        let result = self.try_request(args).await;
        if result.is_err() {
            self.reset();
        }
        result
    }

    async fn try_request(&mut self, args: &[Bytes]) -> Result<Frame, ClientError> {
        let io = |source| ClientError::Io {
            addr: self.addr.clone(),
            source,
        };
        if self.stream.is_none() {
            let stream = TcpStream::connect(&self.addr).await.map_err(io)?;
            let _ = stream.set_nodelay(true);
            self.stream = Some(stream);
        }
        let mut out = BytesMut::new();
        encode(
            &Frame::Array(args.iter().cloned().map(Frame::Bulk).collect()),
            Protocol::Resp2,
            &mut out,
        );
        let addr = self.addr.clone();
        let stream = self.stream.as_mut().expect("connected above");
        stream
            .write_all(&out)
            .await
            .map_err(|source| ClientError::Io {
                addr: addr.clone(),
                source,
            })?;
        loop {
            match self.parser.parse(&mut self.buf) {
                Ok(Some(frame)) => return Ok(frame),
                Ok(None) => {}
                Err(e) => {
                    return Err(ClientError::Protocol {
                        addr,
                        why: e.to_string(),
                    });
                }
            }
            let n = stream
                .read_buf(&mut self.buf)
                .await
                .map_err(|source| ClientError::Io {
                    addr: addr.clone(),
                    source,
                })?;
            if n == 0 {
                return Err(ClientError::Io {
                    addr,
                    source: std::io::ErrorKind::UnexpectedEof.into(),
                });
            }
        }
    }
}
