//! One client connection: read requests, forward them concurrently, write
//! the replies in request order.
//!
//! A client may pipeline: the connection parses every complete request it
//! has read and starts each at once (up to `max_pipeline` in flight), each
//! forwarded request on its own task, so requests for different nodes, or
//! different keys of one node, run side by side. Two rules keep a
//! pipeline's meaning:
//! - replies are written in request order, each in the protocol the
//!   connection spoke when the request was read (`HELLO 3` switches later
//!   replies, not earlier ones);
//! - a request waits for every earlier unfinished request of the
//!   connection that touches one of its keys (`DBSIZE` and `KW.SCAN` wait
//!   for every earlier one, and everything after them waits for them) — so
//!   `SET k 1` then `GET k` reads `1` even if the `SET` had to follow a
//!   rejection and retry. Requests on distinct keys are not ordered against
//!   each other and do not wait for each other (as with a cluster client
//!   that pipelines to several nodes).
//!
//! Bad input gets an error reply; input that cannot be resynchronised (a
//! protocol error) gets the error and a closed connection. On shutdown the
//! connection stops reading, finishes what is in flight and closes.

use crate::command::{self, Barrier, Forwarded, Plan};
use crate::server::Core;
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use keyway_command::session::Session;
use keyway_resp::{Frame, Protocol, RequestParser, encode};
use std::collections::{HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

/// Initial read buffer capacity.
const READ_BUFFER_BYTES: usize = 16 * 1024;

/// One request's place in the reply order.
struct Entry {
    state: State,
    /// The protocol its reply is written in.
    proto: Protocol,
    /// Forwarded requests only: what must finish before it starts.
    barrier: Option<Barrier>,
}

enum State {
    /// The reply, waiting for its turn to be written.
    Ready(Frame),
    /// Forwarded, running on its own task.
    Running,
    /// Forwarded, waiting for an earlier request on one of its keys.
    Waiting(Forwarded),
}

/// A running request's reply, by its sequence number on the connection.
type Finished = BoxFuture<'static, (u64, Frame)>;

/// The requests of one connection not yet answered, in order.
struct Pipeline {
    entries: VecDeque<Entry>,
    /// Sequence number of `entries[0]`.
    first_seq: u64,
    running: FuturesUnordered<Finished>,
}

impl Pipeline {
    fn push(&mut self, entry: Entry) {
        self.entries.push_back(entry);
    }

    /// Starts every waiting request that no earlier unfinished request
    /// blocks: one on a key an earlier unfinished request touches, or
    /// anything after an unfinished `Barrier::All`, or a `Barrier::All`
    /// after anything unfinished, waits.
    fn start_waiting(&mut self, core: &Arc<Core>) {
        let mut keys: HashSet<&Bytes> = HashSet::new();
        let mut any_unfinished = false;
        let mut all_before = false;
        for (i, entry) in self.entries.iter_mut().enumerate() {
            let Some(barrier) = &entry.barrier else {
                continue;
            };
            if matches!(entry.state, State::Ready(_)) {
                continue;
            }
            if matches!(entry.state, State::Waiting(_)) {
                let blocked = all_before
                    || match barrier {
                        Barrier::All => any_unfinished,
                        Barrier::Keys(ks) => ks.iter().any(|k| keys.contains(k)),
                    };
                if !blocked
                    && let State::Waiting(request) =
                        std::mem::replace(&mut entry.state, State::Running)
                {
                    let seq = self.first_seq + i as u64;
                    let task_core = core.clone();
                    let handle =
                        tokio::spawn(async move { command::run(&task_core, request).await });
                    self.running.push(Box::pin(async move {
                        let frame = handle.await.unwrap_or_else(|e| {
                            tracing::error!(%e, "a forwarded request's task failed");
                            Frame::Error("ERR keyway proxy: internal error".into())
                        });
                        (seq, frame)
                    }));
                }
            }
            any_unfinished = true;
            match barrier {
                Barrier::All => all_before = true,
                Barrier::Keys(ks) => keys.extend(ks.iter()),
            }
        }
    }

    /// Records a running request's reply.
    fn finish(&mut self, seq: u64, frame: Frame) {
        if let Some(entry) = self.entries.get_mut((seq - self.first_seq) as usize) {
            entry.state = State::Ready(frame);
        }
    }

    /// Encodes the replies at the front that are known, in order.
    fn write_ready(&mut self, out: &mut BytesMut) {
        while let Some(Entry {
            state: State::Ready(_),
            ..
        }) = self.entries.front()
        {
            if let Some(Entry {
                state: State::Ready(frame),
                proto,
                ..
            }) = self.entries.pop_front()
            {
                encode(&frame, proto, out);
                self.first_seq += 1;
            }
        }
    }
}

/// Serves one client until it quits, errs, closes, or the proxy shuts down.
pub async fn serve(
    core: Arc<Core>,
    mut stream: TcpStream,
    peer: SocketAddr,
    shutdown: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    if refused_by_protected_mode(&core, &mut stream, peer).await {
        return;
    }
    let (rd, wr) = stream.into_split();
    serve_halves(core, rd, wr, peer, shutdown).await
}

/// Serves one client of the TLS port: the handshake (bounded by
/// `tls_handshake_timeout_ms`, on this connection's task), then [`serve`]'s
/// loop over the TLS stream. A failed handshake closes only this
/// connection and is counted.
pub async fn serve_tls(
    core: &Arc<Core>,
    acceptor: keyway_tls::TlsAcceptor,
    stream: TcpStream,
    peer: SocketAddr,
    shutdown: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let timeout = std::time::Duration::from_millis(core.config.tls_handshake_timeout_ms);
    let mut tls = match keyway_tls::handshake(&acceptor, stream, timeout).await {
        Ok(tls) => tls,
        Err(why) => {
            core.metrics.access.tls_handshake_failures.inc();
            tracing::debug!(%peer, %why, "TLS handshake failed");
            return;
        }
    };
    if refused_by_protected_mode(core, &mut tls, peer).await {
        return;
    }
    let (rd, wr) = tokio::io::split(tls);
    serve_halves(core.clone(), rd, wr, peer, shutdown).await
}

/// Protected mode (see [`keyway_tls::protected_mode`]): answers `-DENIED`
/// and closes when `peer` is refused.
async fn refused_by_protected_mode<S: AsyncWrite + Unpin>(
    core: &Core,
    stream: &mut S,
    peer: SocketAddr,
) -> bool {
    if !core.protected_mode_refuses(peer) {
        return false;
    }
    core.metrics.access.protected_mode_refused.inc();
    keyway_tls::protected_mode::deny(stream).await;
    true
}

async fn serve_halves<R, W>(
    core: Arc<Core>,
    mut rd: R,
    mut wr: W,
    peer: SocketAddr,
    mut shutdown: watch::Receiver<bool>,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let id = core.next_client_id.fetch_add(1, Ordering::SeqCst);
    let mut session = Session::new(id, core.acl.new_connections_need_auth(), peer.to_string());
    let mut tx = crate::transaction::ProxyTx::default();
    let mut parser = RequestParser::new(core.config.resp_limits());
    let mut inbuf = BytesMut::with_capacity(READ_BUFFER_BYTES);
    let mut outbuf = BytesMut::with_capacity(READ_BUFFER_BYTES);
    let mut pipeline = Pipeline {
        entries: VecDeque::new(),
        first_seq: 0,
        running: FuturesUnordered::new(),
    };
    let mut fatal: Option<Frame> = None;
    let mut reading = true;
    let max = core.config.max_pipeline;
    loop {
        // Plan every complete request read, in order (the window permitting).
        while pipeline.entries.len() < max && !session.closing && fatal.is_none() {
            match parser.parse(&mut inbuf) {
                Ok(Some(args)) => {
                    let proto_before = session.protocol;
                    let planned = if command::is_acl(&core, &session, &tx, &args) {
                        // `ACL ...`: answered here, after the store took a change.
                        Plan::Reply(command::acl(&core, &session, &args).await)
                    } else {
                        command::plan(&core, &mut session, &mut tx, args)
                    };
                    let entry = match planned {
                        // HELLO switches protocol: its own reply is already in the new one.
                        Plan::Reply(frame) => Entry {
                            state: State::Ready(frame),
                            proto: session.protocol,
                            barrier: None,
                        },
                        Plan::Forward(request) => Entry {
                            barrier: Some(request.barrier.clone()),
                            state: State::Waiting(request),
                            proto: proto_before,
                        },
                    };
                    pipeline.push(entry);
                }
                Ok(None) => break,
                Err(e) => {
                    core.metrics.protocol_errors.inc();
                    fatal = Some(Frame::Error(format!("ERR {e}")));
                    break;
                }
            }
        }
        pipeline.start_waiting(&core);
        pipeline.write_ready(&mut outbuf);
        let done = pipeline.entries.is_empty() && (session.closing || fatal.is_some() || !reading);
        if done && let Some(frame) = &fatal {
            encode(frame, session.protocol, &mut outbuf);
        }
        if !outbuf.is_empty() {
            // flush: a TLS stream may keep the end of a large reply in its
            // buffer when the socket was full (a no-op for TCP).
            if wr.write_all(&outbuf).await.is_err() || wr.flush().await.is_err() {
                break;
            }
            outbuf.clear();
            if outbuf.capacity() > 16 * READ_BUFFER_BYTES {
                outbuf = BytesMut::with_capacity(READ_BUFFER_BYTES);
            }
        }
        if done {
            break;
        }
        let may_read =
            reading && pipeline.entries.len() < max && !session.closing && fatal.is_none();
        tokio::select! {
            Some((seq, frame)) = pipeline.running.next(), if !pipeline.running.is_empty() => {
                pipeline.finish(seq, frame);
            }
            read = rd.read_buf(&mut inbuf), if may_read => match read {
                Ok(0) | Err(_) => reading = false,
                Ok(_) => {}
            },
            _ = shutdown.changed(), if reading => reading = false,
        }
        if inbuf.is_empty() && inbuf.capacity() > 4 * READ_BUFFER_BYTES {
            inbuf = BytesMut::with_capacity(READ_BUFFER_BYTES);
        }
    }
    let _ = wr.shutdown().await;
}

/// Answers a connection over `max_clients` and closes it, as Redis does.
pub async fn refuse(mut stream: TcpStream) {
    let _ = stream
        .write_all(b"-ERR max number of clients reached\r\n")
        .await;
    let _ = stream.shutdown().await;
}
