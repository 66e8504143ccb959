//! One RESP connection: connect lazily, send a request (or a pipeline of
//! them in one write), read one reply each.

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
        let addr = self.addr.clone();
        let io = |source| ClientError::Io {
            addr: addr.clone(),
            source,
        };
        if self.stream.is_none() {
            let stream = TcpStream::connect(&self.addr).await.map_err(io)?;
            let _ = stream.set_nodelay(true);
            self.stream = Some(stream);
        }
        let mut out = BytesMut::new();
        for args in requests {
            encode(
                &Frame::Array(args.as_ref().iter().cloned().map(Frame::Bulk).collect()),
                Protocol::Resp2,
                &mut out,
            );
        }
        let stream = self.stream.as_mut().expect("connected above");
        stream.write_all(&out).await.map_err(io)?;
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
            let n = stream.read_buf(&mut self.buf).await.map_err(io)?;
            if n == 0 {
                return Err(io(std::io::ErrorKind::UnexpectedEof.into()));
            }
        }
        Ok(replies)
    }
}
