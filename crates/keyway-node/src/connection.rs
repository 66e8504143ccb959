//! One client connection: read requests, dispatch them, write replies in order.
//!
//! A connection reads whatever bytes arrived, parses every complete request
//! in them (a pipeline), queues each on the storage thread that owns its
//! slot without waiting, and then writes the replies in request order. Bad
//! input gets an error reply; input that cannot be resynchronised (a
//! protocol error) gets the error and a closed connection. A node-wide read
//! (`SCAN`, `DBSIZE`, `INFO`, `KW.SCAN`) is the exception to queueing
//! without waiting: it is queued only after every earlier reply of the
//! pipeline was released, and the next request only after its reply. Nothing a client
//! sends can panic the node or stall another connection.

use crate::node_cmd::{self, Reply};
use crate::server::Shared;
use crate::session::Session;
use bytes::BytesMut;
use keyway_resp::{Frame, Protocol, RequestParser, encode};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, watch};

/// Most requests parsed from one read before their replies are written.
const MAX_PIPELINE_BATCH: usize = 1024;
/// Initial read buffer capacity.
const READ_BUFFER_BYTES: usize = 16 * 1024;

enum Pending {
    Ready(Frame, Protocol),
    Waiting(oneshot::Receiver<Frame>, Protocol),
    /// No reply is written (`CLIENT REPLY OFF|SKIP`, `SHUTDOWN`); a queued
    /// request still runs.
    Silent,
}

/// Serves one client until it quits, errs, or the node shuts down.
/// `replica_endpoint`: it connected to the replica endpoint (see
/// [`crate::replica_endpoint`]): it starts `READONLY`.
/// `local`: the address the client connected to. `stream` is a plain TCP
/// stream or a TLS one (see [`crate::tls`]).
pub async fn serve<S>(
    shared: Arc<Shared>,
    mut stream: S,
    peer: SocketAddr,
    local: String,
    replica_endpoint: bool,
    mut shutdown: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    // The accept loop already counted this connection in `shared.clients`.
    if shared.protected_mode_refuses(peer) {
        shared.metrics.access.protected_mode_refused.inc();
        crate::protected_mode::deny(&mut stream).await;
        shared.clients.fetch_sub(1, Ordering::SeqCst);
        return;
    }
    shared.metrics.connections.inc();
    let id = shared.next_client_id.fetch_add(1, Ordering::SeqCst);
    let mut session = Session::new(id, shared.acl.new_connections_need_auth(), peer.to_string());
    session.replica_endpoint = replica_endpoint;
    session.readonly = replica_endpoint;
    let registration = shared.server.clients.register(id, peer.to_string(), local);
    let handle = registration.handle.clone();
    session.handle = Some(handle.clone());
    if replica_endpoint {
        shared.metrics.replica_endpoint_connections.inc();
    }
    let mut parser = RequestParser::new(shared.config.resp_limits());
    let mut inbuf = BytesMut::with_capacity(READ_BUFFER_BYTES);
    let mut outbuf = BytesMut::with_capacity(READ_BUFFER_BYTES);
    'conn: loop {
        let read = tokio::select! {
            r = stream.read_buf(&mut inbuf) => r,
            _ = shutdown.changed() => break 'conn,
            _ = handle.killed() => break 'conn,
        };
        match read {
            Ok(0) | Err(_) => break,
            Ok(_) => handle.active_now(),
        }
        loop {
            let mut pending = Vec::new();
            let mut fatal = None;
            // Every earlier reply was written: requests may run inline again.
            session.open_inline();
            while pending.len() < MAX_PIPELINE_BATCH && !session.closing {
                match parser.parse(&mut inbuf) {
                    Ok(Some(args)) if node_cmd::is_node_wide(&args) => {
                        // Ordered by the connection: after every earlier
                        // reply was released, before the next request.
                        settle(&mut pending).await;
                        pending.push(dispatch(&shared, &mut session, args).await);
                        settle(&mut pending).await;
                    }
                    Ok(Some(args)) if crate::blocking::is_blocking(&args) => {
                        // A blocked client runs nothing else until its
                        // reply (as in Redis); its waiter goes when it
                        // disconnects (the reply's receiver is dropped).
                        settle(&mut pending).await;
                        pending.push(dispatch(&shared, &mut session, args).await);
                        if !settle_watching(&mut pending, &mut stream, &mut inbuf, &mut shutdown)
                            .await
                        {
                            break 'conn;
                        }
                    }
                    Ok(Some(args)) => pending.push(dispatch(&shared, &mut session, args).await),
                    Ok(None) => break,
                    Err(err) => {
                        shared.metrics.protocol_errors.inc();
                        fatal = Some(Frame::Error(format!("ERR {err}")));
                        break;
                    }
                }
            }
            let more = pending.len() == MAX_PIPELINE_BATCH;
            if pending.is_empty() && fatal.is_none() && !session.closing {
                break;
            }
            for p in pending {
                let (frame, proto) = match p {
                    Pending::Ready(frame, proto) => (frame, proto),
                    Pending::Waiting(rx, proto) => {
                        (rx.await.unwrap_or_else(|_| shutting_down()), proto)
                    }
                    Pending::Silent => continue,
                };
                encode(&frame, proto, &mut outbuf);
            }
            if let Some(frame) = &fatal {
                encode(frame, session.protocol, &mut outbuf);
            }
            // flush: a TLS stream may keep the end of a large reply in its
            // buffer when the socket was full (a no-op for TCP).
            if stream.write_all(&outbuf).await.is_err() || stream.flush().await.is_err() {
                break 'conn;
            }
            outbuf.clear();
            if fatal.is_some() || session.closing || handle.is_killed() {
                break 'conn;
            }
            if !more {
                break;
            }
        }
        if inbuf.capacity() > 4 * READ_BUFFER_BYTES && inbuf.is_empty() {
            inbuf = BytesMut::with_capacity(READ_BUFFER_BYTES);
        }
    }
    let _ = stream.shutdown().await;
    drop(registration);
    shared.clients.fetch_sub(1, Ordering::SeqCst);
    shared.metrics.connections.dec();
    if replica_endpoint {
        shared.metrics.replica_endpoint_connections.dec();
    }
}

async fn dispatch(shared: &Arc<Shared>, session: &mut Session, args: Vec<bytes::Bytes>) -> Pending {
    let proto_before = session.protocol;
    if let Some(name) = args.first() {
        session.touch(name);
    }
    let reply = node_cmd::dispatch(shared, session, args).await;
    if matches!(reply, Reply::Waiting(_)) && !session.take_ran_inline() {
        // Queued (or waiting on something else): the rest of the batch is
        // queued behind it, in order (`executor.rs`, 8).
        session.close_inline();
    }
    if let Some(h) = &session.handle {
        h.set_multi(session.tx.queued());
        h.set_resp(if session.protocol == Protocol::Resp3 {
            3
        } else {
            2
        });
    }
    // CLIENT REPLY OFF|SKIP (as Redis: SKIP hides its own reply and the next).
    let silent = session.reply_off || std::mem::take(&mut session.skip_this);
    if std::mem::take(&mut session.skip_next) {
        session.skip_this = true;
    }
    if silent {
        return Pending::Silent;
    }
    match reply {
        // HELLO switches protocol: its own reply is already in the new one.
        Reply::Frame(frame) => Pending::Ready(frame, session.protocol),
        Reply::Waiting(rx) => Pending::Waiting(rx, proto_before),
    }
}

/// Waits for every queued reply (a node-wide read's ordering, see
/// [`node_cmd::is_node_wide`]); they are still written in request order.
async fn settle(pending: &mut [Pending]) {
    for p in pending.iter_mut() {
        if let Pending::Waiting(rx, proto) = p {
            let frame = rx.await.unwrap_or_else(|_| shutting_down());
            *p = Pending::Ready(frame, *proto);
        }
    }
}

/// [`settle`] for a blocking command: also ends (`false`) when the client
/// closes the connection or the node shuts down while it waits. Once the
/// client sent more requests, only the reply is awaited (the first bytes
/// read wait in `inbuf`, the rest in the socket; the close is seen after
/// the reply). Reading instead of peeking works for TLS streams too.
async fn settle_watching<S: AsyncRead + Unpin>(
    pending: &mut [Pending],
    stream: &mut S,
    inbuf: &mut BytesMut,
    shutdown: &mut watch::Receiver<bool>,
) -> bool {
    let mut watch_close = true;
    for p in pending.iter_mut() {
        if let Pending::Waiting(rx, proto) = p {
            let frame = loop {
                tokio::select! {
                    r = &mut *rx => break r.unwrap_or_else(|_| shutting_down()),
                    n = stream.read_buf(inbuf), if watch_close => match n {
                        Ok(0) | Err(_) => return false,
                        Ok(_) => watch_close = false,
                    },
                    _ = shutdown.changed() => return false,
                }
            };
            *p = Pending::Ready(frame, *proto);
        }
    }
    true
}

fn shutting_down() -> Frame {
    Frame::Error("ERR server is shutting down".into())
}

/// Serves one client of a TLS listener: the handshake (on this
/// connection's task, bounded), then [`serve`] over it. A failed handshake
/// closes this connection only and is counted.
pub async fn serve_tls(
    shared: Arc<Shared>,
    acceptor: crate::tls::TlsAcceptor,
    stream: TcpStream,
    peer: SocketAddr,
    shutdown: watch::Receiver<bool>,
) {
    let local = stream
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let timeout = std::time::Duration::from_millis(shared.config.tls_handshake_timeout_ms);
    match crate::tls::handshake(&acceptor, stream, timeout).await {
        Ok(tls) => serve(shared, tls, peer, local, false, shutdown).await,
        Err(why) => {
            shared.metrics.access.tls_handshake_failures.inc();
            tracing::debug!(%peer, %why, "TLS handshake failed");
            shared.clients.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Answers a connection over `max_clients` and closes it, as Redis does.
pub async fn refuse(mut stream: TcpStream) {
    let _ = stream
        .write_all(b"-ERR max number of clients reached\r\n")
        .await;
    let _ = stream.shutdown().await;
}
