//! [`ClusterClient`]: a plain Redis Cluster client over the raw RESP codec,
//! as any cluster-aware Redis client behaves: a slot table learned from
//! `CLUSTER SLOTS`, one connection per node, `-MOVED` followed (and the
//! table refreshed when redirects pile up), `-CLUSTERDOWN`/`-TRYAGAIN`
//! retried after a pause.
//!
//! With [`ClusterClient::exec_replica_read`] a read goes instead to one of
//! the slot's replicas as `CLUSTER SLOTS` lists them, on a connection that
//! sent `READONLY` first (redis-py's `read_from_replicas`); a replica that
//! refuses (`-MOVED`: not in sync at its epoch, or its read lease lapsed)
//! sends the read on to the primary, as Redis clients do.
//!
//! Its point is the honesty of [`Exec`]: a request is retried only while
//! every earlier attempt certainly had no effect (refused before it was
//! written, or rejected by a routing/availability error). Once a request
//! was written and its reply did not arrive (timeout, reset, EOF), the
//! outcome is unknown and the call ends there.

use bytes::BytesMut;
use keyway_map::SLOT_COUNT;
use keyway_resp::{Frame, Limits, ResponseParser, encode_command};
use std::collections::HashMap;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Longest wait for a TCP connect to a node.
const CONNECT_TIMEOUT_MS: u64 = 500;
/// Pause before retrying after a rejection that says "not now".
const RETRY_PAUSE_MS: u64 = 50;
/// Longest wait for one node's `CLUSTER SLOTS` during a refresh.
const REFRESH_TIMEOUT_MS: u64 = 500;
/// `-MOVED` replies in a row for one request before the slot table is
/// refreshed from `CLUSTER SLOTS` (a single one just patches the slot).
const MOVED_BEFORE_REFRESH: u32 = 2;

/// How a request ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Exec {
    /// The node's reply (never a routing or availability rejection).
    Reply(Frame),
    /// Certainly not applied: every attempt was refused before it was
    /// written or rejected (`-MOVED`, `-ASK`, `-CLUSTERDOWN`, `-TRYAGAIN`,
    /// `-NOREPLICAS`) until the budget ran out. Why, last.
    Failed(String),
    /// Written, and no reply: applied once or not at all.
    Unknown(String),
}

/// Whether an error reply is a routing or availability rejection, which a
/// node sends only for a request it did not run.
pub fn is_rejection(msg: &str) -> bool {
    ["MOVED ", "ASK ", "CLUSTERDOWN", "TRYAGAIN", "NOREPLICAS"]
        .iter()
        .any(|p| msg.starts_with(p))
}

struct Conn {
    stream: TcpStream,
    buf: BytesMut,
    parser: ResponseParser,
}

/// One attempt's result.
enum Attempt {
    Reply(Frame),
    /// Nothing was written (the connect failed).
    NotSent(String),
    /// Written (or perhaps written) and no reply.
    Lost(String),
}

/// A Redis Cluster client over plain RESP.
pub struct ClusterClient {
    seeds: Vec<String>,
    /// Slot → the node address it was last seen at.
    slots: Vec<Option<String>>,
    /// Slot → its replicas' addresses, per the last `CLUSTER SLOTS`.
    replicas: Vec<Vec<String>>,
    conns: HashMap<String, Conn>,
    /// Connections that sent `READONLY` (replica reads only).
    readonly_conns: HashMap<String, Conn>,
    /// Replica reads pick among a slot's replicas round-robin from here.
    next_replica: usize,
    /// Seeds are tried round-robin from here.
    next_seed: usize,
    /// When the slot table was last reloaded.
    refreshed_at: Option<Instant>,
}

/// A replica read that finds no replica listed for its slot reloads the
/// table when it is older than this (replicas join the in-sync set, and
/// so `CLUSTER SLOTS`, after the table was read; no redirect announces
/// that), as ioredis's `slotsRefreshInterval` does.
const REPLICA_REFRESH: Duration = Duration::from_millis(1_000);

impl ClusterClient {
    /// A client that learns the slot table from `seeds` when it first needs it.
    pub fn new(seeds: Vec<String>) -> ClusterClient {
        assert!(!seeds.is_empty(), "a cluster client needs a seed");
        ClusterClient {
            seeds,
            slots: vec![None; SLOT_COUNT as usize],
            replicas: vec![Vec::new(); SLOT_COUNT as usize],
            conns: HashMap::new(),
            readonly_conns: HashMap::new(),
            next_replica: 0,
            next_seed: 0,
            refreshed_at: None,
        }
    }

    /// Runs `args` (every key in `slot`) within `budget`.
    pub async fn exec(&mut self, slot: u16, args: &[Vec<u8>], budget: Duration) -> Exec {
        let deadline = Instant::now() + budget;
        let mut moved_in_row = 0;
        let mut last = String::from("no attempt");
        loop {
            if Instant::now() >= deadline {
                return Exec::Failed(format!("gave up: {last}"));
            }
            let addr = match self.slots[slot as usize].clone() {
                Some(a) => a,
                None => {
                    self.refresh(deadline).await;
                    match self.slots[slot as usize].clone() {
                        Some(a) => a,
                        None => {
                            last = format!("slot {slot} has no node in CLUSTER SLOTS");
                            pause(deadline).await;
                            continue;
                        }
                    }
                }
            };
            match self.attempt(&addr, args, deadline).await {
                Attempt::Lost(why) => return Exec::Unknown(why),
                Attempt::NotSent(why) => {
                    last = why;
                    self.refresh(deadline).await;
                    pause(deadline).await;
                }
                Attempt::Reply(Frame::Error(msg)) if msg.starts_with("MOVED ") => {
                    moved_in_row += 1;
                    match moved_addr(&msg) {
                        Some(to) => self.slots[slot as usize] = Some(to),
                        None => self.slots[slot as usize] = None,
                    }
                    if moved_in_row >= MOVED_BEFORE_REFRESH {
                        self.refresh(deadline).await;
                        pause(deadline).await;
                    }
                    last = msg;
                }
                Attempt::Reply(Frame::Error(msg)) if is_rejection(&msg) => {
                    last = msg;
                    pause(deadline).await;
                    self.refresh(deadline).await;
                }
                Attempt::Reply(frame) => return Exec::Reply(frame),
            }
        }
    }

    /// A read (`GET`, `MGET`: it changes nothing, so sending it on after a
    /// refusal is always safe) on a replica of `slot` if `CLUSTER SLOTS`
    /// lists one, over a `READONLY` connection; `true` with it if a replica
    /// answered. A replica's refusal, or none being listed, sends the read
    /// to the primary ([`ClusterClient::exec`]) within what is left of `budget`.
    pub async fn exec_replica_read(
        &mut self,
        slot: u16,
        args: &[Vec<u8>],
        budget: Duration,
    ) -> (Exec, bool) {
        let deadline = Instant::now() + budget;
        let stale = self
            .refreshed_at
            .is_none_or(|at| at.elapsed() >= REPLICA_REFRESH);
        if self.slots[slot as usize].is_none() || (self.replicas[slot as usize].is_empty() && stale)
        {
            self.refresh(deadline).await;
        }
        let replicas = &self.replicas[slot as usize];
        if !replicas.is_empty() {
            let addr = replicas[self.next_replica % replicas.len()].clone();
            self.next_replica = self.next_replica.wrapping_add(1);
            match self.attempt_on(&addr, args, deadline, true).await {
                Attempt::Lost(why) => return (Exec::Unknown(why), false),
                Attempt::Reply(Frame::Error(msg)) if is_rejection(&msg) => {
                    // Not served here: the table may be old too.
                    if msg.starts_with("MOVED ") {
                        self.refresh(deadline).await;
                    }
                }
                Attempt::Reply(frame) => return (Exec::Reply(frame), true),
                Attempt::NotSent(_) => {}
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        (self.exec(slot, args, left).await, false)
    }

    /// One request on `addr`'s connection (opened if needed).
    async fn attempt(&mut self, addr: &str, args: &[Vec<u8>], deadline: Instant) -> Attempt {
        self.attempt_on(addr, args, deadline, false).await
    }

    /// One request on `addr`'s ordinary or `READONLY` connection (opened,
    /// and for `readonly` sent `READONLY` first, if needed).
    async fn attempt_on(
        &mut self,
        addr: &str,
        args: &[Vec<u8>],
        deadline: Instant,
        readonly: bool,
    ) -> Attempt {
        let conns = if readonly {
            &mut self.readonly_conns
        } else {
            &mut self.conns
        };
        if !conns.contains_key(addr) {
            let connect = TcpStream::connect(addr);
            let limit = Duration::from_millis(CONNECT_TIMEOUT_MS)
                .min(deadline.saturating_duration_since(Instant::now()));
            match tokio::time::timeout(limit, connect).await {
                Ok(Ok(stream)) => {
                    let _ = stream.set_nodelay(true);
                    let mut conn = Conn {
                        stream,
                        buf: BytesMut::new(),
                        parser: ResponseParser::new(Limits::default()),
                    };
                    if readonly {
                        // READONLY changes nothing: a failure here is "not sent".
                        let hello = [b"READONLY".to_vec()];
                        let reply = tokio::time::timeout_at(deadline, request(&mut conn, &hello));
                        match reply.await {
                            Ok(Ok(Frame::Simple(ok))) if ok == "OK" => {}
                            other => {
                                return Attempt::NotSent(format!("READONLY on {addr}: {other:?}"));
                            }
                        }
                    }
                    conns.insert(addr.to_string(), conn);
                }
                Ok(Err(e)) => return Attempt::NotSent(format!("connect {addr}: {e}")),
                Err(_) => return Attempt::NotSent(format!("connect {addr}: timed out")),
            }
        }
        let conn = conns.get_mut(addr).expect("connected above");
        let result = tokio::time::timeout_at(deadline, request(conn, args)).await;
        match result {
            Ok(Ok(frame)) => Attempt::Reply(frame),
            Ok(Err(e)) => {
                conns.remove(addr);
                Attempt::Lost(format!("{addr}: {e}"))
            }
            Err(_) => {
                conns.remove(addr);
                Attempt::Lost(format!("{addr}: no reply within the operation timeout"))
            }
        }
    }

    /// Reloads the slot table from `CLUSTER SLOTS` of the first node that
    /// answers (known nodes first, then the seeds). Failures are quiet.
    async fn refresh(&mut self, deadline: Instant) {
        let mut candidates: Vec<String> = self.conns.keys().cloned().collect();
        for i in 0..self.seeds.len() {
            candidates.push(self.seeds[(self.next_seed + i) % self.seeds.len()].clone());
        }
        self.next_seed = (self.next_seed + 1) % self.seeds.len();
        let args = [b"CLUSTER".to_vec(), b"SLOTS".to_vec()];
        for addr in candidates {
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            let within = deadline.min(now + Duration::from_millis(REFRESH_TIMEOUT_MS));
            if let Attempt::Reply(frame) = self.attempt(&addr, &args, within).await
                && let Some((table, replicas)) = parse_slots(&frame)
            {
                self.slots = table;
                self.replicas = replicas;
                self.refreshed_at = Some(Instant::now());
                return;
            }
        }
    }
}

async fn request(conn: &mut Conn, args: &[Vec<u8>]) -> std::io::Result<Frame> {
    let mut out = BytesMut::new();
    encode_command(args, &mut out);
    conn.stream.write_all(&out).await?;
    loop {
        match conn.parser.parse(&mut conn.buf) {
            Ok(Some(frame)) => return Ok(frame),
            Ok(None) => {}
            Err(e) => return Err(std::io::Error::other(e.to_string())),
        }
        let n = conn.stream.read_buf(&mut conn.buf).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
}

async fn pause(deadline: Instant) {
    let at = (Instant::now() + Duration::from_millis(RETRY_PAUSE_MS)).min(deadline);
    tokio::time::sleep_until(at).await;
}

/// `host:port` of `MOVED slot host:port`.
fn moved_addr(msg: &str) -> Option<String> {
    let addr = msg.split_whitespace().nth(2)?;
    addr.contains(':').then(|| addr.to_string())
}

/// A slot → address table (slots no entry covers stay `None`), and slot →
/// replica addresses.
type SlotTables = (Vec<Option<String>>, Vec<Vec<String>>);

/// `host:port` of one node entry of a `CLUSTER SLOTS` range.
fn node_addr(node: &Frame) -> Option<String> {
    let Frame::Array(node) = node else {
        return None;
    };
    let host = match node.first()? {
        Frame::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
        _ => return None,
    };
    let Some(Frame::Integer(port)) = node.get(1) else {
        return None;
    };
    Some(format!("{host}:{port}"))
}

/// A `CLUSTER SLOTS` reply as [`SlotTables`]: each range's primary (its
/// first node entry) and replicas (the entries after it).
fn parse_slots(frame: &Frame) -> Option<SlotTables> {
    let Frame::Array(ranges) = frame else {
        return None;
    };
    let mut table = vec![None; SLOT_COUNT as usize];
    let mut replicas = vec![Vec::new(); SLOT_COUNT as usize];
    for range in ranges {
        let Frame::Array(items) = range else {
            return None;
        };
        let (Some(Frame::Integer(first)), Some(Frame::Integer(last)), Some(node)) =
            (items.first(), items.get(1), items.get(2))
        else {
            return None;
        };
        let addr = node_addr(node)?;
        let others: Vec<String> = items[3..].iter().filter_map(node_addr).collect();
        let (first, last) = (*first as usize, *last as usize);
        if first > last || last >= SLOT_COUNT as usize {
            return None;
        }
        for slot in first..=last {
            table[slot] = Some(addr.clone());
            replicas[slot] = others.clone();
        }
    }
    Some((table, replicas))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn slots_parse_and_rejections_are_recognised() {
        let node = |port| {
            Frame::Array(vec![
                Frame::Bulk(Bytes::from_static(b"127.0.0.1")),
                Frame::Integer(port),
                Frame::Bulk(Bytes::from_static(b"id")),
            ])
        };
        let reply = Frame::Array(vec![
            Frame::Array(vec![Frame::Integer(0), Frame::Integer(99), node(7001)]),
            Frame::Array(vec![
                Frame::Integer(100),
                Frame::Integer(16383),
                node(7002),
                node(7003),
            ]),
        ]);
        let (table, replicas) = parse_slots(&reply).unwrap();
        assert_eq!(table[0].as_deref(), Some("127.0.0.1:7001"));
        assert_eq!(table[99].as_deref(), Some("127.0.0.1:7001"));
        assert_eq!(table[100].as_deref(), Some("127.0.0.1:7002"));
        assert!(replicas[99].is_empty());
        assert_eq!(replicas[100], vec!["127.0.0.1:7003".to_string()]);
        assert_eq!(replicas[16383], vec!["127.0.0.1:7003".to_string()]);
        assert!(parse_slots(&Frame::Integer(1)).is_none());
        assert_eq!(
            moved_addr("MOVED 12 127.0.0.1:7003").as_deref(),
            Some("127.0.0.1:7003")
        );
        assert!(is_rejection("CLUSTERDOWN The cluster is down"));
        assert!(is_rejection("MOVED 1 a:1"));
        assert!(!is_rejection("ERR value is not an integer or out of range"));
        assert!(!is_rejection("ERR server is shutting down"));
    }
}
