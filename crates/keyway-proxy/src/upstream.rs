//! Pipelined connections to the nodes.
//!
//! The proxy keeps `node_connections` connections to each node it has
//! routed to, opened on first use and replaced when they fail. Each is
//! shared by every client: requests from many clients are written one after
//! another on it without waiting for replies (a writer task batches whatever
//! is queued into one write), and a reader task hands each reply to the
//! oldest request still waiting, since a node answers one connection's
//! requests in order. Every connection speaks RESP3 (`HELLO 3` when it
//! opens), so replies carry their full type and are re-encoded for each
//! client in the protocol that client chose.
//!
//! A failure says whether the request can have reached the node
//! ([`UpstreamError`]): a request still queued when its connection died was
//! never written (`NotSent`), one written or being written was (`Ambiguous`):
//! the node may have applied it and its reply was lost.

use crate::metrics::Metrics;
use bytes::{Bytes, BytesMut};
use keyway_resp::{Frame, Limits, ResponseParser, encode_command};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{mpsc, oneshot, watch};

/// Most queued requests written in one batch.
const WRITE_BATCH: usize = 256;
/// Initial read buffer capacity.
const READ_BUFFER_BYTES: usize = 16 * 1024;
/// After a failed connect, further attempts on that slot fail at once for
/// this long (callers back off and wait for the map instead of piling up
/// connect timeouts on a dead node).
const CONNECT_FAILURE_MEMORY: Duration = Duration::from_millis(100);

/// Why a node round trip failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UpstreamError {
    /// The request never left the proxy: retrying it cannot apply it twice.
    #[error("{0} (request not sent)")]
    NotSent(String),
    /// The request may have reached the node, which may have applied it;
    /// its reply was lost.
    #[error("{0} (request sent, no reply)")]
    Ambiguous(String),
}

/// Settings of the node connections.
#[derive(Clone, Debug)]
pub struct UpstreamConfig {
    pub connections_per_node: usize,
    pub max_inflight: usize,
    pub connect_timeout: Duration,
    pub password: Option<String>,
    pub reply_limits: Limits,
}

/// Every node connection of one proxy, by node RESP address.
pub struct Upstreams {
    config: UpstreamConfig,
    pools: Mutex<HashMap<String, Arc<Pool>>>,
    metrics: Arc<Metrics>,
}

struct Pool {
    addr: String,
    slots: Vec<tokio::sync::Mutex<Slot>>,
    next: AtomicUsize,
}

#[derive(Default)]
struct Slot {
    conn: Option<Arc<NodeConn>>,
    failed_at: Option<(Instant, String)>,
}

impl Upstreams {
    pub fn new(config: UpstreamConfig, metrics: Arc<Metrics>) -> Self {
        Upstreams {
            config,
            pools: Mutex::new(HashMap::new()),
            metrics,
        }
    }

    /// Sends `args` to the node at `addr` and waits for its reply. The
    /// caller bounds the wait (a request's deadline covers every retry).
    pub async fn call(&self, addr: &str, args: Vec<Bytes>) -> Result<Frame, UpstreamError> {
        let pool = {
            let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
            pools
                .entry(addr.to_string())
                .or_insert_with(|| {
                    Arc::new(Pool {
                        addr: addr.to_string(),
                        slots: (0..self.config.connections_per_node)
                            .map(|_| tokio::sync::Mutex::new(Slot::default()))
                            .collect(),
                        next: AtomicUsize::new(0),
                    })
                })
                .clone()
        };
        let conn = self.conn(&pool).await?;
        conn.call(args).await
    }

    /// Sends `args` on a connection of its own, closed after the reply (or
    /// when the caller gives up, which drops it): for a blocking command
    /// (BLPOP, ...), which the node answers only when it is served or times
    /// out, and which would hold up every request queued behind it on a
    /// shared pipelined connection. Dropping the call closes the
    /// connection, so the node forgets the waiter of a client that left.
    pub async fn call_dedicated(
        &self,
        addr: &str,
        args: Vec<Bytes>,
    ) -> Result<Frame, UpstreamError> {
        let conn = NodeConn::open(addr, &self.config, self.metrics.clone())
            .await
            .map_err(|why| {
                self.metrics.upstream_errors.inc();
                UpstreamError::NotSent(format!("cannot connect to node {addr}: {why}"))
            })?;
        self.metrics.dedicated_calls.inc();
        let reply = conn.call(args).await;
        conn.state.fail("closed after its one request");
        reply
    }

    /// A live connection of `pool` (round robin), opened if needed.
    async fn conn(&self, pool: &Pool) -> Result<Arc<NodeConn>, UpstreamError> {
        let i = pool.next.fetch_add(1, Ordering::Relaxed) % pool.slots.len();
        let mut slot = pool.slots[i].lock().await;
        if let Some(conn) = &slot.conn
            && !conn.is_dead()
        {
            return Ok(conn.clone());
        }
        slot.conn = None;
        if let Some((at, why)) = &slot.failed_at
            && at.elapsed() < CONNECT_FAILURE_MEMORY
        {
            return Err(UpstreamError::NotSent(why.clone()));
        }
        match NodeConn::open(&pool.addr, &self.config, self.metrics.clone()).await {
            Ok(conn) => {
                let conn = Arc::new(conn);
                slot.conn = Some(conn.clone());
                slot.failed_at = None;
                Ok(conn)
            }
            Err(why) => {
                self.metrics.upstream_errors.inc();
                let why = format!("cannot connect to node {}: {why}", pool.addr);
                slot.failed_at = Some((Instant::now(), why.clone()));
                Err(UpstreamError::NotSent(why))
            }
        }
    }

    /// Open connections (for INFO).
    pub fn open_connections(&self) -> i64 {
        self.metrics.upstream_connections.get()
    }
}

/// One request waiting for its reply.
struct Job {
    args: Vec<Bytes>,
    reply: oneshot::Sender<Result<Frame, UpstreamError>>,
}

/// What the writer and reader of one connection share.
struct ConnState {
    addr: String,
    inner: Mutex<Inflight>,
    closed: watch::Sender<bool>,
    metrics: Arc<Metrics>,
}

struct Inflight {
    dead: bool,
    /// Reply slots of the requests written, oldest first.
    queue: VecDeque<oneshot::Sender<Result<Frame, UpstreamError>>>,
}

impl ConnState {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inflight> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks the connection dead (once) and fails every written request.
    fn fail(&self, why: &str) {
        let mut inflight = self.lock();
        if !inflight.dead {
            inflight.dead = true;
            self.metrics.upstream_connections.dec();
            if !inflight.queue.is_empty() {
                tracing::warn!(addr = %self.addr, why, pending = inflight.queue.len(), "node connection failed");
            }
        }
        for reply in inflight.queue.drain(..) {
            self.metrics.upstream_errors.inc();
            let _ = reply.send(Err(UpstreamError::Ambiguous(format!(
                "node {} connection failed: {why}",
                self.addr
            ))));
        }
        drop(inflight);
        self.closed.send_replace(true);
    }
}

/// One pipelined connection to a node.
struct NodeConn {
    tx: mpsc::Sender<Job>,
    state: Arc<ConnState>,
}

impl NodeConn {
    /// Connects, switches to RESP3 (authenticating if configured), and
    /// starts the writer and reader tasks.
    async fn open(
        addr: &str,
        config: &UpstreamConfig,
        metrics: Arc<Metrics>,
    ) -> Result<NodeConn, String> {
        let opened = tokio::time::timeout(config.connect_timeout, async {
            let mut stream = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
            stream.set_nodelay(true).map_err(|e| e.to_string())?;
            let mut hello: Vec<Bytes> =
                vec![Bytes::from_static(b"HELLO"), Bytes::from_static(b"3")];
            if let Some(pass) = &config.password {
                hello.push(Bytes::from_static(b"AUTH"));
                hello.push(Bytes::from_static(b"default"));
                hello.push(Bytes::copy_from_slice(pass.as_bytes()));
            }
            let mut out = BytesMut::new();
            encode_command(&hello, &mut out);
            // READONLY too (pipelined): the reads the proxy sends to a partition's
            // reads_from replica need it, and it changes nothing for the
            // rest (KW.AT is admitted as the owner's, except a read at the
            // partition's reads_from node; a plain read at the owner is
            // served as any read).
            encode_command(&[Bytes::from_static(b"READONLY")], &mut out);
            stream.write_all(&out).await.map_err(|e| e.to_string())?;
            let mut parser = ResponseParser::new(config.reply_limits.clone());
            let mut buf = BytesMut::with_capacity(READ_BUFFER_BYTES);
            let mut answered = 0;
            loop {
                match parser.parse(&mut buf).map_err(|e| e.to_string())? {
                    Some(Frame::Error(e)) if answered == 0 => {
                        return Err(format!("HELLO 3 refused: {e}"));
                    }
                    // A node that does not know READONLY still serves
                    // everything else; a reads_from read there is -MOVED and
                    // falls back to the owner.
                    Some(Frame::Error(e)) => {
                        tracing::debug!(addr, %e, "READONLY refused; reads_from reads there fall back");
                        return Ok((stream, parser, buf));
                    }
                    Some(_) if answered == 0 => {
                        answered += 1;
                        continue;
                    }
                    Some(_) => return Ok((stream, parser, buf)),
                    None => {}
                }
                if stream.read_buf(&mut buf).await.map_err(|e| e.to_string())? == 0 {
                    return Err("closed during HELLO".to_string());
                }
            }
        })
        .await;
        let (stream, parser, buf) = match opened {
            Ok(result) => result?,
            Err(_) => return Err(format!("timed out after {:?}", config.connect_timeout)),
        };
        metrics.upstream_connections.inc();
        let (rd, wr) = stream.into_split();
        let (tx, rx) = mpsc::channel(config.max_inflight);
        let state = Arc::new(ConnState {
            addr: addr.to_string(),
            inner: Mutex::new(Inflight {
                dead: false,
                queue: VecDeque::new(),
            }),
            closed: watch::channel(false).0,
            metrics,
        });
        tokio::spawn(writer(wr, rx, state.clone()));
        tokio::spawn(reader(rd, parser, buf, state.clone()));
        Ok(NodeConn { tx, state })
    }

    fn is_dead(&self) -> bool {
        self.state.lock().dead
    }

    async fn call(&self, args: Vec<Bytes>) -> Result<Frame, UpstreamError> {
        let (reply, rx) = oneshot::channel();
        if self.tx.send(Job { args, reply }).await.is_err() {
            return Err(UpstreamError::NotSent(format!(
                "node {} connection closed",
                self.state.addr
            )));
        }
        match rx.await {
            Ok(result) => result,
            // Only a task torn down mid-request drops a reply slot unanswered.
            Err(_) => Err(UpstreamError::Ambiguous(format!(
                "node {} connection dropped the request",
                self.state.addr
            ))),
        }
    }
}

/// Writes queued requests in batches, recording each reply slot before its
/// bytes go out.
async fn writer(mut wr: OwnedWriteHalf, mut rx: mpsc::Receiver<Job>, state: Arc<ConnState>) {
    let mut closed = state.closed.subscribe();
    let mut buf = BytesMut::with_capacity(READ_BUFFER_BYTES);
    loop {
        let job = tokio::select! {
            job = rx.recv() => match job {
                Some(job) => job,
                None => break,
            },
            _ = closed.wait_for(|c| *c) => break,
        };
        let mut batch = vec![job];
        while batch.len() < WRITE_BATCH {
            match rx.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        buf.clear();
        {
            let mut inflight = state.lock();
            if inflight.dead {
                drop(inflight);
                not_sent(&state, batch);
                break;
            }
            for job in batch {
                encode_command(&job.args, &mut buf);
                inflight.queue.push_back(job.reply);
            }
        }
        let written = tokio::select! {
            w = wr.write_all(&buf) => w,
            _ = closed.wait_for(|c| *c) => break,
        };
        if let Err(e) = written {
            state.fail(&format!("write: {e}"));
            break;
        }
        if buf.capacity() > 16 * READ_BUFFER_BYTES {
            buf = BytesMut::with_capacity(READ_BUFFER_BYTES);
        }
    }
    state.fail("closed");
    rx.close();
    let mut left = Vec::new();
    while let Ok(job) = rx.try_recv() {
        left.push(job);
    }
    not_sent(&state, left);
    let _ = wr.shutdown().await;
}

fn not_sent(state: &ConnState, jobs: Vec<Job>) {
    for job in jobs {
        let _ = job.reply.send(Err(UpstreamError::NotSent(format!(
            "node {} connection closed",
            state.addr
        ))));
    }
}

/// Hands each reply to the oldest waiting request.
async fn reader(
    mut rd: OwnedReadHalf,
    mut parser: ResponseParser,
    mut buf: BytesMut,
    state: Arc<ConnState>,
) {
    let mut closed = state.closed.subscribe();
    let why = 'conn: loop {
        loop {
            match parser.parse(&mut buf) {
                // Out-of-band data is no request's reply.
                Ok(Some(Frame::Push(_))) => {}
                Ok(Some(frame)) => match state.lock().queue.pop_front() {
                    Some(reply) => {
                        let _ = reply.send(Ok(frame));
                    }
                    None => break 'conn "a reply nobody asked for".to_string(),
                },
                Ok(None) => break,
                Err(e) => break 'conn format!("bad reply: {e}"),
            }
        }
        tokio::select! {
            read = rd.read_buf(&mut buf) => match read {
                Ok(0) => break "closed by the node".to_string(),
                Ok(_) => {}
                Err(e) => break format!("read: {e}"),
            },
            _ = closed.wait_for(|c| *c) => break "closed".to_string(),
        }
    };
    state.fail(&why);
}
