//! The bench's RESP client, over `keyway-resp`'s codec: a [`Conn`] queues
//! commands (`encode_command`) and sends them in one write, so a batch is
//! pipelined, and decodes replies with a [`ResponseParser`]; a [`Pool`] keeps
//! idle connections per address for the foreground load, one command per
//! request. Following a `-MOVED` is the caller's business ([`parse_moved`]).

use bytes::BytesMut;
use keyway_resp::{Frame, Limits, ResponseParser, encode_command};
use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long a connect may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a pooled request waits for its reply.
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);
/// Room made in the read buffer before each read.
const READ_CHUNK: usize = 16 * 1024;

/// One RESP2 connection.
pub(crate) struct Conn {
    stream: TcpStream,
    /// Commands queued and not yet sent.
    out: BytesMut,
    /// Bytes read and not yet parsed.
    buf: BytesMut,
    parser: ResponseParser,
}

impl Conn {
    /// Connects (within 5 s) with Nagle off.
    pub(crate) async fn connect(addr: &str) -> io::Result<Conn> {
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
        stream.set_nodelay(true)?;
        Ok(Conn {
            stream,
            out: BytesMut::new(),
            buf: BytesMut::with_capacity(READ_CHUNK),
            parser: ResponseParser::new(Limits::default()),
        })
    }

    /// Queues one command; nothing is sent until [`Conn::flush`].
    pub(crate) fn push(&mut self, args: &[&[u8]]) {
        encode_command(args, &mut self.out);
    }

    /// Sends every queued command.
    pub(crate) async fn flush(&mut self) -> io::Result<()> {
        self.stream.write_all(&self.out).await?;
        self.out.clear();
        Ok(())
    }

    /// The next reply, read as far as needed.
    pub(crate) async fn read_reply(&mut self) -> io::Result<Frame> {
        loop {
            let parsed = self.parser.parse(&mut self.buf).map_err(|e| {
                io::Error::new(io::ErrorKind::InvalidData, format!("bad reply: {e}"))
            })?;
            if let Some(frame) = parsed {
                return Ok(frame);
            }
            self.buf.reserve(READ_CHUNK);
            if self.stream.read_buf(&mut self.buf).await? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
    }
}

/// Idle connections by address.
#[derive(Default)]
pub(super) struct Pool(Mutex<HashMap<Arc<str>, Vec<Conn>>>);

impl Pool {
    /// One command on a pooled connection to `addr` (a new one if none is
    /// idle). The connection goes back to the pool only after a whole reply
    /// within 30 s; on any error it is dropped.
    pub(super) async fn exec(&self, addr: &Arc<str>, args: &[&[u8]]) -> io::Result<Frame> {
        let pooled = self
            .0
            .lock()
            .expect("pool")
            .get_mut(addr)
            .and_then(|v| v.pop());
        let mut conn = match pooled {
            Some(c) => c,
            None => Conn::connect(addr).await?,
        };
        conn.push(args);
        conn.flush().await?;
        let reply = tokio::time::timeout(REPLY_TIMEOUT, conn.read_reply())
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no reply in 30 s"))??;
        self.0
            .lock()
            .expect("pool")
            .entry(addr.clone())
            .or_default()
            .push(conn);
        Ok(reply)
    }
}

/// `MOVED <slot> <host:port>` → the address.
pub(super) fn parse_moved(error: &str) -> Option<&str> {
    let mut w = error.split_whitespace();
    (w.next()? == "MOVED").then_some(())?;
    w.next()?;
    w.next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moved_errors_name_the_owner() {
        assert_eq!(
            parse_moved("MOVED 7629 127.0.0.1:7002"),
            Some("127.0.0.1:7002")
        );
        assert_eq!(parse_moved("ERR nope"), None);
    }
}
