//! The test's RESP client: a blocking connection that reports failures
//! instead of panicking, and a router that sends each key to its slot's
//! owner and follows `-MOVED` redirects, noting redirect chains (bounces)
//! with what every node's admin endpoint says about the slot.

use super::REDIRECT_PATIENCE;
use crate::common::http_get;
use bytes::{Bytes, BytesMut};
use keyway_map::{DEFAULT_KEYSPACE, PartitionMap, key_hash_slot};
use keyway_resp::{Frame, Limits, Protocol, ResponseParser, encode};
use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// A blocking RESP connection that reports failures instead of panicking.
pub struct Conn {
    stream: TcpStream,
    buf: BytesMut,
    parser: ResponseParser,
}

impl Conn {
    pub fn connect(port: u16) -> std::io::Result<Conn> {
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        stream.set_nodelay(true)?;
        // Longer than a node's longest hold behind a fence (30 s).
        stream.set_read_timeout(Some(Duration::from_secs(40)))?;
        Ok(Conn {
            stream,
            buf: BytesMut::new(),
            parser: ResponseParser::new(Limits::default()),
        })
    }

    fn encode(args: &[&[u8]], out: &mut BytesMut) {
        let frame = Frame::Array(
            args.iter()
                .map(|a| Frame::Bulk(Bytes::copy_from_slice(a)))
                .collect(),
        );
        encode(&frame, Protocol::Resp2, out);
    }

    pub fn request(&mut self, args: &[&[u8]]) -> std::io::Result<Frame> {
        let mut out = BytesMut::new();
        Self::encode(args, &mut out);
        self.stream.write_all(&out)?;
        self.read_reply()
    }

    /// Sends every request, then reads as many replies.
    pub fn pipeline(&mut self, reqs: &[Vec<Vec<u8>>]) -> std::io::Result<Vec<Frame>> {
        let mut out = BytesMut::new();
        for r in reqs {
            let args: Vec<&[u8]> = r.iter().map(|a| a.as_slice()).collect();
            Self::encode(&args, &mut out);
        }
        self.stream.write_all(&out)?;
        (0..reqs.len()).map(|_| self.read_reply()).collect()
    }

    fn read_reply(&mut self) -> std::io::Result<Frame> {
        loop {
            if let Some(frame) = self
                .parser
                .parse(&mut self.buf)
                .map_err(|e| std::io::Error::other(e.to_string()))?
            {
                return Ok(frame);
            }
            let mut chunk = [0u8; 64 * 1024];
            let n = self.stream.read(&mut chunk)?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

/// The port of `-MOVED slot host:port`.
fn moved_port(e: &str) -> Option<u16> {
    let rest = e.strip_prefix("MOVED ")?;
    rest.rsplit(':').next()?.parse().ok()
}

/// A slot → port table (learned from the map, fixed by `-MOVED`) and one
/// connection per port.
pub struct Router {
    pub routes: Vec<u16>,
    conns: HashMap<u16, Conn>,
    /// Redirect chains of two hops or more (bounces), for the report.
    pub redirect_chains: Vec<String>,
    /// RESP port → admin port of every node (to snapshot their maps).
    admin_of: BTreeMap<u16, u16>,
}

impl Router {
    pub fn new(map: &PartitionMap) -> Router {
        let admin_of = map
            .nodes
            .values()
            .map(|n| {
                let port = |addr: &str| addr.rsplit(':').next().unwrap().parse::<u16>().unwrap();
                (port(&n.resp_addr), port(&n.admin_addr))
            })
            .collect();
        let routes = (0..keyway_map::SLOT_COUNT)
            .map(|slot| {
                let p = map.locate_slot(DEFAULT_KEYSPACE, slot).unwrap();
                map.nodes[&p.owner].resp_host_port().1
            })
            .collect();
        Router {
            routes,
            conns: HashMap::new(),
            redirect_chains: Vec::new(),
            admin_of,
        }
    }

    pub fn conn(&mut self, port: u16) -> std::io::Result<&mut Conn> {
        match self.conns.entry(port) {
            std::collections::hash_map::Entry::Occupied(e) => Ok(e.into_mut()),
            std::collections::hash_map::Entry::Vacant(e) => Ok(e.insert(Conn::connect(port)?)),
        }
    }

    /// Sends one request for `key`, following `-MOVED`s (a few at once,
    /// then with growing pauses, as cluster clients do, for about two
    /// seconds). An I/O error drops the connection. A redirect chain of
    /// two hops or more (a bounce between nodes whose maps disagree) is
    /// noted in `redirect_chains`, resolved or not.
    pub fn request(&mut self, key: &str, args: &[&[u8]]) -> std::io::Result<Frame> {
        let slot = key_hash_slot(key.as_bytes()) as usize;
        let started = Instant::now();
        let mut chain: Vec<String> = Vec::new();
        let mut hop = 0u64;
        let reply = loop {
            let port = self.routes[slot];
            let reply = self.conn(port).and_then(|c| c.request(args));
            match &reply {
                Err(e) => {
                    self.conns.remove(&port);
                    chain.push(format!("{port}: {e}"));
                    break reply;
                }
                Ok(Frame::Error(e)) if e.starts_with("MOVED ") => {
                    chain.push(format!("{port}: {e}"));
                    self.routes[slot] = moved_port(e).expect("a MOVED names a port");
                    hop += 1;
                    if started.elapsed() > REDIRECT_PATIENCE {
                        break reply;
                    }
                    if hop >= 3 {
                        std::thread::sleep(Duration::from_millis((10 * hop).min(200)));
                    }
                }
                Ok(other) => {
                    chain.push(format!("{port}: {other:?}"));
                    break reply;
                }
            }
        };
        if hop >= 2 {
            let unresolved = matches!(&reply, Ok(Frame::Error(e)) if e.starts_with("MOVED "));
            let views = if unresolved {
                format!(" [UNRESOLVED; nodes' views: {}]", self.views(slot as u16))
            } else {
                String::new()
            };
            self.redirect_chains.push(format!(
                "{} {key}: {} hops in {:?}: {}{views}",
                wall_clock(),
                hop,
                started.elapsed(),
                chain.join(" -> ")
            ));
        }
        reply
    }

    /// What every node's `/map` and `/status` say about `slot`'s partition now.
    fn views(&self, slot: u16) -> String {
        self.admin_of
            .iter()
            .map(|(resp, admin)| {
                let map = http_get(*admin, "/map").and_then(|body| {
                    let mut map: PartitionMap = serde_json::from_str(&body).ok()?;
                    map.reindex();
                    let p = map.locate_slot(DEFAULT_KEYSPACE, slot)?.clone();
                    Some(format!(
                        "map v{} partition {} owner {} epoch {}",
                        map.version.0, p.id, p.owner, p.epoch
                    ))
                });
                let status = http_get(*admin, "/status");
                format!(
                    "{resp}: {} status {}",
                    map.unwrap_or_else(|| "no map".into()),
                    status.unwrap_or_else(|| "none".into())
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// Now as `HH:MM:SS.mmm` UTC, to line up with the processes' logs.
fn wall_clock() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let s = ms / 1000;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        (s / 3600) % 24,
        (s / 60) % 60,
        s % 60,
        ms % 1000
    )
}
