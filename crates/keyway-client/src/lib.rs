//! Keyway's smart client, first version.
//!
//! It loads the partition map from any node (`KW.MAP`), routes each command
//! to the owner of its key's partition, and sends it in the epoch-carrying
//! form `KW.AT <partition> <epoch> <command...>`. A node that does not own
//! that partition at that epoch rejects it with the record it knows
//! (`-KWMOVED`), which the client patches into its cache before retrying at
//! once; a bounded number of retries, then an error.
//!
//! It owns nothing but its cache: it never decides ownership and never
//! guesses where a key lives beyond what a map or a rejection told it.
//!
//! # Layout
//! - `lib.rs`: [`Client`], [`ClientError`].
//! - `conn.rs`: one RESP connection (request, reply).
//! - `cache.rs`: the cached map and patching it from a rejection.
//! - `kw.rs`: the keyspace commands (`kw_get`, `kw_set`, `kw_del`,
//!   `kw_scan`), routed by keyspace and key through the same cache.

mod cache;
mod conn;
mod kw;

pub use cache::{KwMoved, parse_kwmoved};
pub use kw::KwScanPage;

use bytes::Bytes;
use keyway_map::{DEFAULT_KEYSPACE, PartitionMap, PartitionRecord, key_hash_slot};
use keyway_resp::Frame;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

/// Errors of the client API.
#[derive(thiserror::Error, Debug)]
pub enum ClientError {
    #[error("cannot reach any node: {0}")]
    Unreachable(String),
    #[error("connection to {addr}: {source}")]
    Io {
        addr: String,
        source: std::io::Error,
    },
    #[error("protocol error from {addr}: {why}")]
    Protocol { addr: String, why: String },
    #[error("server error: {0}")]
    Server(String),
    #[error("gave up after {0} redirects")]
    TooManyRedirects(usize),
    #[error("no partition covers the key (map not loaded?)")]
    Unrouted,
    #[error("unknown keyspace '{0}'")]
    UnknownKeyspace(String),
}

/// Client settings.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Most rejections followed for one command before giving up.
    pub max_redirects: usize,
    /// Timeout of one request.
    pub request_timeout_ms: u64,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            max_redirects: 5,
            request_timeout_ms: 5_000,
        }
    }
}

/// Counters a client keeps about its own routing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClientStats {
    pub requests: u64,
    pub rejections: u64,
    pub map_refreshes: u64,
}

/// A routing client over a Keyway cluster.
pub struct Client {
    seeds: Vec<String>,
    config: ClientConfig,
    map: RwLock<Arc<PartitionMap>>,
    conns: Mutex<HashMap<String, Arc<tokio::sync::Mutex<conn::Conn>>>>,
    stats: Mutex<ClientStats>,
}

impl Client {
    /// Connects to the first reachable seed and loads the map.
    pub async fn connect(seeds: &[&str], config: ClientConfig) -> Result<Client, ClientError> {
        let client = Client {
            seeds: seeds.iter().map(|s| s.to_string()).collect(),
            config,
            map: RwLock::new(Arc::new(PartitionMap::new())),
            conns: Mutex::new(HashMap::new()),
            stats: Mutex::new(ClientStats::default()),
        };
        client.refresh().await?;
        Ok(client)
    }

    /// The cached map.
    pub fn map(&self) -> Arc<PartitionMap> {
        self.map.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn stats(&self) -> ClientStats {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reloads the whole map from the seeds, then from any known node.
    pub async fn refresh(&self) -> Result<(), ClientError> {
        self.stats
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map_refreshes += 1;
        let known: Vec<String> = self
            .map()
            .nodes
            .values()
            .map(|n| n.resp_addr.clone())
            .collect();
        let mut last_err = String::from("no seeds");
        for addr in self.seeds.iter().chain(known.iter()) {
            match self
                .request(addr, vec![Bytes::from_static(b"KW.MAP")])
                .await
            {
                Ok(Frame::Bulk(bytes)) => match keyway_map::decode_map(&bytes) {
                    Ok(map) => {
                        let mut cached = self.map.write().unwrap_or_else(|e| e.into_inner());
                        if map.version >= cached.version {
                            *cached = Arc::new(map);
                        }
                        return Ok(());
                    }
                    Err(e) => last_err = format!("{addr}: bad map: {e}"),
                },
                Ok(other) => last_err = format!("{addr}: unexpected reply {other:?}"),
                Err(e) => last_err = e.to_string(),
            }
        }
        Err(ClientError::Unreachable(last_err))
    }

    /// GET.
    pub async fn get(&self, key: &[u8]) -> Result<Option<Bytes>, ClientError> {
        match self.command(&[b"GET", key]).await? {
            Frame::Bulk(b) => Ok(Some(b)),
            Frame::Null => Ok(None),
            other => Err(ClientError::Server(format!("unexpected reply {other:?}"))),
        }
    }

    /// SET.
    pub async fn set(&self, key: &[u8], value: &[u8]) -> Result<(), ClientError> {
        match self.command(&[b"SET", key, value]).await? {
            Frame::Simple(_) => Ok(()),
            other => Err(ClientError::Server(format!("unexpected reply {other:?}"))),
        }
    }

    /// DEL of one key; true if it existed.
    pub async fn del(&self, key: &[u8]) -> Result<bool, ClientError> {
        match self.command(&[b"DEL", key]).await? {
            Frame::Integer(n) => Ok(n > 0),
            other => Err(ClientError::Server(format!("unexpected reply {other:?}"))),
        }
    }

    /// Runs a single-key data command (`args[1]` is the key) on its owner,
    /// following rejections. Server errors other than rejections come back as frames.
    pub async fn command(&self, args: &[&[u8]]) -> Result<Frame, ClientError> {
        let key = args.get(1).ok_or(ClientError::Unrouted)?;
        let slot = key_hash_slot(key);
        self.send_routed(
            |map| map.locate_slot(DEFAULT_KEYSPACE, slot).cloned(),
            |p| {
                let mut req = vec![
                    Bytes::from_static(b"KW.AT"),
                    Bytes::from(p.id.0.to_string()),
                    Bytes::from(p.epoch.0.to_string()),
                ];
                req.extend(args.iter().map(|a| Bytes::copy_from_slice(a)));
                req
            },
        )
        .await
    }

    /// Sends the request `build` makes for the partition `locate` finds in
    /// the cached map to that partition's owner, following rejections
    /// (`-KWMOVED` patches the cache, `-MOVED` and `-CLUSTERDOWN` reload it).
    async fn send_routed(
        &self,
        locate: impl Fn(&PartitionMap) -> Option<PartitionRecord>,
        build: impl Fn(&PartitionRecord) -> Vec<Bytes>,
    ) -> Result<Frame, ClientError> {
        for _ in 0..=self.config.max_redirects {
            let (p, addr) = {
                let map = self.map();
                match locate(&map).and_then(|p| {
                    let addr = map.nodes.get(&p.owner)?.resp_addr.clone();
                    Some((p, addr))
                }) {
                    Some(route) => route,
                    None => {
                        self.refresh().await?;
                        continue;
                    }
                }
            };
            let req = build(&p);
            self.stats
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .requests += 1;
            let reply = match self.request(&addr, req).await {
                Ok(reply) => reply,
                Err(ClientError::Io { .. }) => {
                    self.forget(&addr);
                    self.refresh().await?;
                    continue;
                }
                Err(e) => return Err(e),
            };
            match &reply {
                Frame::Error(msg) if msg.starts_with("KWMOVED ") => {
                    self.stats
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .rejections += 1;
                    match parse_kwmoved(msg) {
                        Some(moved) => cache::patch(&self.map, moved),
                        None => self.refresh().await?,
                    }
                }
                Frame::Error(msg)
                    if msg.starts_with("MOVED ") || msg.starts_with("CLUSTERDOWN") =>
                {
                    self.stats
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .rejections += 1;
                    if msg.starts_with("CLUSTERDOWN") {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    self.refresh().await?;
                }
                _ => return Ok(reply),
            }
        }
        Err(ClientError::TooManyRedirects(self.config.max_redirects))
    }

    fn forget(&self, addr: &str) {
        self.conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(addr);
    }

    async fn request(&self, addr: &str, args: Vec<Bytes>) -> Result<Frame, ClientError> {
        let conn = {
            let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
            conns
                .entry(addr.to_string())
                .or_insert_with(|| Arc::new(tokio::sync::Mutex::new(conn::Conn::new(addr))))
                .clone()
        };
        let mut conn = conn.lock().await;
        let timeout = Duration::from_millis(self.config.request_timeout_ms);
        match tokio::time::timeout(timeout, conn.request(&args)).await {
            Ok(result) => result,
            Err(_) => {
                conn.reset();
                Err(ClientError::Io {
                    addr: addr.into(),
                    source: std::io::ErrorKind::TimedOut.into(),
                })
            }
        }
    }
}
