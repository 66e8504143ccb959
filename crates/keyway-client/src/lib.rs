//! Keyway's smart client.
//!
//! It caches the partition map, routes each command to the owner of its
//! key's partition, and sends it in the epoch-carrying form
//! `KW.AT <partition> <epoch> <command...>`. A node that does not own that
//! partition at that epoch rejects it with the record it knows
//! (`-KWMOVED <partition> <epoch> <keyspace> <start> <end> <owner> <addr>`).
//! What the client does then is its [`Strategy`] (seed 000's three):
//!
//! | strategy | before sending | on a rejection |
//! |---|---|---|
//! | [`Strategy::Redirect`] | the cached owner | patch the one entry the rejection carries, retry |
//! | [`Strategy::Lookup`] | resolve (`KW.MAP SINCE`) on a miss or once the cache is `lookup_ttl_ms` old | resolve again, retry (patch only when rate-limited) |
//! | [`Strategy::Hybrid`] (default) | the cached owner | patch the entry (a higher epoch wins) and re-resolve the whole map by delta, retry |
//!
//! A refresh asks a node for `KW.MAP SINCE <cache version>`: the changes
//! since (a delta, usually a few bytes per moved partition) or, when the
//! node's history does not reach back that far, the whole map. So a hybrid
//! client idle through fifty moves converges with one rejection and one
//! small refresh; a redirect client needs one rejection per moved partition
//! it touches. Refreshes are single-flight (concurrent callers wait for the
//! one in flight) and rate-limited (`min_refresh_interval_ms`: a rejection
//! inside it patches only). A cache miss always refreshes.
//!
//! The warm cache (`cache_file`) keeps the last refreshed map on disk, so a
//! restarted client catches up by delta. [`Salted`] spreads one hot counter
//! over `n` salted keys (writes spread, reads cost `n`).
//!
//! # Counters
//! [`Client::stats`] returns [`ClientStats`] (atomic loads, cheap): requests
//! and sends, rejections by kind, refreshes (full, delta, coalesced,
//! suppressed), patches, extra round trips (sends after a request's first,
//! plus every map request) and the map version lag (how many versions each
//! refresh advanced the cache by). [`ClientStats::since`] gives the
//! difference between two snapshots, which is what a benchmark reports.
//!
//! # Retries
//! A rejection, or a failure before the request was written (connect
//! refused, say), proves the command did not run: the client re-routes and
//! re-sends it. A failure or timeout after it was written leaves the outcome
//! unknown: only reads ([`keyway_resp::retry_safe`], the rule `keyway
//! proxy` applies too) are re-sent; any write (`SET` too: a second run could
//! bring back a value a later write replaced; `INCR`, `APPEND`, the salted
//! counters, `DEL`, ...) returns [`ClientError::UnknownOutcome`].
//!
//! It owns nothing but its cache: it never decides ownership and never
//! guesses where a key lives beyond what a map or a rejection told it.
//!
//! # Layout
//! - `lib.rs`: [`Client`], [`ClientConfig`], [`Strategy`], [`ClientError`];
//!   the routed send loop and what each strategy does on a rejection.
//! - `conn.rs`: one RESP connection (request, or a pipeline of requests).
//! - `cache.rs`: the cached map (the last refreshed map plus patches) and
//!   patching it from a rejection.
//! - `refresh.rs`: `KW.MAP SINCE` refreshes: single flight, rate limit,
//!   applying a delta.
//! - `stats.rs`: [`ClientStats`] and its atomic counters.
//! - `warm.rs`: the cache file (checksummed, atomic, throttled writes).
//! - `salted.rs`: [`Salted`], the hot-key salting helper.
//! - `reads_from.rs`: where a read of a partition whose reads are switched
//!   ahead of its writes (`reads_from`) goes.
//! - `kw.rs`: the keyspace commands (`kw_get`, `kw_set`, `kw_del`,
//!   `kw_scan`), routed by keyspace and key through the same cache.

mod cache;
mod conn;
mod kw;
mod reads_from;
mod refresh;
mod salted;
mod stats;
mod warm;

pub use cache::{KwMoved, parse_kwmoved};
pub use kw::KwScanPage;
pub use salted::Salted;
pub use stats::ClientStats;

use bytes::Bytes;
use keyway_map::{DEFAULT_KEYSPACE, PartitionMap, PartitionRecord, key_hash_slot};
use keyway_resp::Frame;
use reads_from::{ReadRoute, read_route};
use stats::Counters;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Errors of the client API.
#[derive(thiserror::Error, Debug)]
pub enum ClientError {
    #[error("cannot reach any node: {0}")]
    Unreachable(String),
    /// The request was not written (connect failed, or the write failed
    /// before the request was complete): it did not run, and is retried.
    #[error("connection to {addr}: {source}")]
    Io {
        addr: String,
        source: std::io::Error,
    },
    /// The connection failed or timed out after the request was written:
    /// the node may or may not have applied it. Only reads
    /// ([`keyway_resp::retry_safe`]) are re-sent after this; any other
    /// command surfaces it.
    #[error(
        "connection to {addr} failed after the request was sent ({source}); the command may or may not have been applied, and is not retried because running it twice is not safe"
    )]
    UnknownOutcome {
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
    #[error("invalid client configuration: {0}")]
    Config(String),
}

/// How the client keeps its cached map right (seed 000's three strategies).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// Lookup first: before sending, resolve through a node's map endpoint
    /// (`KW.MAP SINCE`, a delta) when the key's partition is not cached or
    /// the cache is older than `lookup_ttl_ms`; on a rejection resolve again
    /// (not patch) before retrying.
    Lookup,
    /// Send and redirect: send to the cached owner; on a rejection patch
    /// exactly the one entry the rejection carries and retry. Converges one
    /// rejection per moved partition it touches.
    Redirect,
    /// Cache, and on any rejection apply the rejection's record (a higher
    /// epoch wins) and re-resolve the whole map as a delta since the cache's
    /// version, so a client idle through many moves converges in one
    /// refresh.
    #[default]
    Hybrid,
}

impl Strategy {
    /// Every strategy, in the order benchmarks report them.
    pub const ALL: [Strategy; 3] = [Strategy::Lookup, Strategy::Redirect, Strategy::Hybrid];

    /// The lowercase name (`lookup`, `redirect`, `hybrid`).
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Lookup => "lookup",
            Strategy::Redirect => "redirect",
            Strategy::Hybrid => "hybrid",
        }
    }
}

impl std::fmt::Display for Strategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Strategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Strategy::ALL
            .into_iter()
            .find(|st| st.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("unknown strategy '{s}' (expected lookup, redirect or hybrid)"))
    }
}

/// Client settings.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// How the cache is kept right (default [`Strategy::Hybrid`]).
    pub strategy: Strategy,
    /// Most retries of one request (after rejections, connection errors or
    /// cache misses) before giving up.
    pub max_redirects: usize,
    /// Timeout of one request.
    pub request_timeout_ms: u64,
    /// [`Strategy::Lookup`]: the cache is resolved again before a request
    /// once the last refresh is this old (a refresh confirms every entry).
    pub lookup_ttl_ms: u64,
    /// A refresh asked for by a rejection (or a connection error, or the
    /// lookup TTL) within this long of the last refresh's start is skipped;
    /// the rejection's record is patched in instead. Cache misses always
    /// refresh. 0 = no limit (refreshes are still single-flight).
    pub min_refresh_interval_ms: u64,
    /// Pause before retrying after `-CLUSTERDOWN` (a lapsed lease, a slot
    /// not served yet).
    pub clusterdown_retry_ms: u64,
    /// The warm cache: load the map saved here at connect (then refresh it
    /// by delta), save it after refreshes. A missing or corrupt file is
    /// ignored with a warning.
    pub cache_file: Option<PathBuf>,
    /// Fewest milliseconds between two saves of `cache_file` after refreshes.
    pub cache_save_interval_ms: u64,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            strategy: Strategy::Hybrid,
            max_redirects: 5,
            request_timeout_ms: 5_000,
            lookup_ttl_ms: 1_000,
            min_refresh_interval_ms: 100,
            clusterdown_retry_ms: 50,
            cache_file: None,
            cache_save_interval_ms: 1_000,
        }
    }
}

impl ClientConfig {
    /// Checks the settings; the message names the one that is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if self.request_timeout_ms == 0 {
            return Err("request_timeout_ms must be greater than 0".into());
        }
        if self.max_redirects > 1_000 {
            return Err("max_redirects must be at most 1000".into());
        }
        if self.clusterdown_retry_ms > 60_000 {
            return Err("clusterdown_retry_ms must be at most 60000".into());
        }
        if self
            .cache_file
            .as_ref()
            .is_some_and(|p| p.file_name().is_none())
        {
            return Err("cache_file must name a file".into());
        }
        Ok(())
    }
}

/// A routing client over a Keyway cluster.
pub struct Client {
    seeds: Vec<String>,
    config: ClientConfig,
    cache: cache::Cache,
    conns: Mutex<HashMap<String, Arc<tokio::sync::Mutex<conn::Conn>>>>,
    stats: stats::Counters,
    gate: refresh::Gate,
    warm: Option<warm::WarmFile>,
}

/// Why a reply is a rejection.
enum Rejected<'a> {
    KwMoved(&'a str),
    KwReads(&'a str),
    Moved,
    ClusterDown,
}

impl<'a> Rejected<'a> {
    fn of(reply: &'a Frame) -> Option<Self> {
        match reply {
            Frame::Error(msg) if msg.starts_with("KWMOVED ") => Some(Rejected::KwMoved(msg)),
            Frame::Error(msg) if msg.starts_with("KWREADS ") => Some(Rejected::KwReads(msg)),
            Frame::Error(msg) if msg.starts_with("MOVED ") => Some(Rejected::Moved),
            Frame::Error(msg) if msg.starts_with("CLUSTERDOWN") => Some(Rejected::ClusterDown),
            _ => None,
        }
    }
}

impl Client {
    /// Connects: loads the warm cache file if configured (and usable), then
    /// refreshes from the first reachable seed (by delta when a map was
    /// loaded) and saves the file. With a loaded map, an unreachable cluster
    /// is not an error; a cache file that cannot be read or written never is.
    pub async fn connect(seeds: &[&str], config: ClientConfig) -> Result<Client, ClientError> {
        config.validate().map_err(ClientError::Config)?;
        let warm = config
            .cache_file
            .clone()
            .map(|path| warm::WarmFile::new(path, config.cache_save_interval_ms));
        let client = Client {
            seeds: seeds.iter().map(|s| s.to_string()).collect(),
            config,
            cache: cache::Cache::default(),
            conns: Mutex::new(HashMap::new()),
            stats: stats::Counters::default(),
            gate: refresh::Gate::default(),
            warm,
        };
        let loaded = client
            .warm
            .as_ref()
            .and_then(|w| warm::load(w.path()))
            .map(|map| {
                let version = map.version.0;
                client.cache.install(map, None);
                client.stats.map_version.store(version, Relaxed);
            })
            .is_some();
        if let Err(e) = client.refresh().await {
            if !loaded {
                return Err(e);
            }
            tracing::warn!(%e, "cannot refresh the map; starting from the cache file's");
        }
        if let Err(e) = client.save_cache().await {
            tracing::warn!(%e, "cannot save the map cache file; continuing without it");
        }
        Ok(client)
    }

    /// The settings this client runs with.
    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// The strategy this client runs with.
    pub fn strategy(&self) -> Strategy {
        self.config.strategy
    }

    /// The cached map requests route by (the last refresh plus the
    /// rejections patched in since).
    pub fn map(&self) -> Arc<PartitionMap> {
        self.cache.view()
    }

    /// The routing counters (a handful of atomic loads).
    pub fn stats(&self) -> ClientStats {
        self.stats.snapshot()
    }

    /// Saves the last refreshed map to `cache_file` now (no-op without one).
    pub async fn save_cache(&self) -> Result<(), ClientError> {
        let Some(warm) = &self.warm else {
            return Ok(());
        };
        warm.save_now(self.cache.base())
            .await
            .map_err(|source| ClientError::Io {
                addr: warm.path().display().to_string(),
                source,
            })
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

    /// INCRBY; the new value.
    pub async fn incr_by(&self, key: &[u8], delta: i64) -> Result<i64, ClientError> {
        let delta = delta.to_string();
        match self.command(&[b"INCRBY", key, delta.as_bytes()]).await? {
            Frame::Integer(n) => Ok(n),
            Frame::Error(e) => Err(ClientError::Server(e)),
            other => Err(ClientError::Server(format!("unexpected reply {other:?}"))),
        }
    }

    /// Runs a data command (`args[1]` is the key; every key in one slot) on
    /// its owner, following rejections per the strategy. Server errors
    /// other than rejections come back as frames.
    pub async fn command(&self, args: &[&[u8]]) -> Result<Frame, ClientError> {
        let key = args.get(1).ok_or(ClientError::Unrouted)?;
        let slot = key_hash_slot(key);
        let read = keyway_resp::retry_safe(args).then_some(args);
        self.send_routed_read(
            |map| map.locate_slot(DEFAULT_KEYSPACE, slot).cloned(),
            |p| at_request(p, args),
            read,
        )
        .await
    }

    /// The cache to route by; under [`Strategy::Lookup`] resolved first when
    /// the last refresh is older than `lookup_ttl_ms`.
    pub(crate) async fn route_snapshot(&self) -> cache::Snapshot {
        let snap = self.cache.snapshot();
        if self.config.strategy != Strategy::Lookup {
            return snap;
        }
        let ttl = Duration::from_millis(self.config.lookup_ttl_ms);
        if snap.resolved_at.is_some_and(|t| t.elapsed() < ttl) {
            return snap;
        }
        if let Err(e) = self.refresh_from(snap.generation, true, None).await {
            tracing::debug!(%e, "lookup: cannot resolve; routing by the cache");
        }
        self.cache.snapshot()
    }

    /// Sends the request `build` makes for the partition `locate` finds in
    /// the cache to that partition's owner, following rejections per the
    /// strategy (see [`Strategy`]); a cache miss refreshes.
    pub(crate) async fn send_routed(
        &self,
        locate: impl Fn(&PartitionMap) -> Option<PartitionRecord>,
        build: impl Fn(&PartitionRecord) -> Vec<Bytes>,
    ) -> Result<Frame, ClientError> {
        self.send_routed_read(locate, build, None).await
    }

    /// [`Self::send_routed`]; `read`: the plain command when it only reads.
    /// A read of a partition whose `reads_from` the cache names goes there
    /// instead of the owner, epoch-carrying, on a `READONLY` connection
    /// ([`read_route`]; the replica serves it only while that is its
    /// `reads_from` at that epoch, it is in sync and holds a read lease). A
    /// rejection there sends it to the owner, plain (so the owner serves it
    /// rather than answering `-KWREADS`), and corrects the cache.
    pub(crate) async fn send_routed_read(
        &self,
        locate: impl Fn(&PartitionMap) -> Option<PartitionRecord>,
        build: impl Fn(&PartitionRecord) -> Vec<Bytes>,
        read: Option<&[&[u8]]>,
    ) -> Result<Frame, ClientError> {
        Counters::inc(&self.stats.requests);
        let mut sent = 0usize;
        let mut last_err = None;
        let mut owner_only = false;
        for _ in 0..=self.config.max_redirects {
            let snap = self.route_snapshot().await;
            let Some((p, owner_addr)) = route(&snap.view, &locate) else {
                self.refresh_from(snap.generation, false, None).await?;
                last_err = Some(ClientError::Unrouted);
                continue;
            };
            sent += 1;
            Counters::inc(&self.stats.sends);
            if sent > 1 {
                Counters::inc(&self.stats.extra_round_trips);
            }
            let (addr, request, readonly) = match read_route(&snap.view, &p, read, owner_only) {
                ReadRoute::ReadsFrom(addr) => {
                    Counters::inc(&self.stats.reads_from_sends);
                    (addr, build(&p), true)
                }
                ReadRoute::OwnerPlain(args) => (owner_addr, args, false),
                ReadRoute::Owner => (owner_addr, build(&p), false),
            };
            let retry_safe = keyway_resp::retry_safe(&request);
            let reply = match self.pipeline_on(&addr, vec![request], readonly).await {
                Ok(mut replies) => replies.pop().ok_or_else(|| ClientError::Protocol {
                    addr: addr.clone(),
                    why: "no reply".into(),
                }),
                Err(e) => Err(e),
            };
            let reply = match reply {
                Ok(reply) => reply,
                // Not written (safe to re-send anything), or written but
                // safe to run twice: re-route and re-send.
                Err(e @ ClientError::Io { .. }) => {
                    Counters::inc(&self.stats.io_errors);
                    self.forget(&addr);
                    self.refresh_quietly(snap.generation, true, None).await;
                    last_err = Some(e);
                    continue;
                }
                Err(e @ ClientError::UnknownOutcome { .. }) if retry_safe => {
                    Counters::inc(&self.stats.io_errors);
                    self.forget(&addr);
                    self.refresh_quietly(snap.generation, true, None).await;
                    last_err = Some(e);
                    continue;
                }
                Err(e @ ClientError::UnknownOutcome { .. }) => {
                    Counters::inc(&self.stats.io_errors);
                    Counters::inc(&self.stats.unknown_outcomes);
                    self.forget(&addr);
                    return Err(e);
                }
                Err(e) => return Err(e),
            };
            match Rejected::of(&reply) {
                Some(rejected) if readonly => {
                    // The reads-from replica does not serve it (`-MOVED`: not
                    // in sync or no read lease; `-KWMOVED`: its map is at
                    // another epoch, reads_from cleared, say): the owner
                    // does, and the cache is corrected as for any rejection.
                    Counters::inc(&self.stats.reads_from_fallbacks);
                    owner_only = true;
                    self.on_rejection(rejected, snap.generation, &addr).await;
                }
                Some(rejected) => self.on_rejection(rejected, snap.generation, &addr).await,
                None => return Ok(reply),
            }
            last_err = None;
        }
        Err(last_err.unwrap_or(ClientError::TooManyRedirects(self.config.max_redirects)))
    }

    /// Counts a rejection from `addr` of a request routed by cache
    /// generation `seen`, and corrects the cache as the strategy says.
    async fn on_rejection(&self, rejected: Rejected<'_>, seen: u64, addr: &str) {
        let strategy = self.config.strategy;
        match rejected {
            Rejected::KwMoved(msg) => {
                self.stats.rejected(&self.stats.rejections_kwmoved);
                match (strategy, parse_kwmoved(msg)) {
                    (_, None) => {
                        self.refresh_quietly(seen, false, Some(addr)).await;
                    }
                    (Strategy::Redirect, Some(moved)) => self.patch(moved),
                    (Strategy::Hybrid, Some(moved)) => {
                        self.patch(moved);
                        self.refresh_quietly(seen, true, Some(addr)).await;
                    }
                    (Strategy::Lookup, Some(moved)) => {
                        if self.refresh_quietly(seen, true, Some(addr)).await
                            == Some(refresh::Refresh::Suppressed)
                        {
                            self.patch(moved);
                        }
                    }
                }
            }
            Rejected::KwReads(msg) => {
                self.stats.rejected(&self.stats.rejections_kwreads);
                match keyway_map::KwReads::parse(msg) {
                    Some(reads) if self.cache.patch_reads_from(&reads) => {
                        Counters::inc(&self.stats.patches);
                        if strategy != Strategy::Redirect {
                            self.refresh_quietly(seen, true, Some(addr)).await;
                        }
                    }
                    _ => {
                        self.refresh_quietly(seen, false, Some(addr)).await;
                    }
                }
            }
            Rejected::Moved => {
                // No epoch to patch from: every strategy re-resolves.
                self.stats.rejected(&self.stats.rejections_moved);
                let limited = strategy != Strategy::Redirect;
                self.refresh_quietly(seen, limited, Some(addr)).await;
            }
            Rejected::ClusterDown => {
                self.stats.rejected(&self.stats.rejections_clusterdown);
                let pause = Duration::from_millis(self.config.clusterdown_retry_ms);
                tokio::time::sleep(pause).await;
                if strategy != Strategy::Redirect {
                    self.refresh_quietly(seen, true, None).await;
                }
            }
        }
    }

    /// A refresh whose failure is not the request's: the retry may still
    /// succeed from the cache (or the rejection patched into it).
    async fn refresh_quietly(
        &self,
        seen: u64,
        limited: bool,
        prefer: Option<&str>,
    ) -> Option<refresh::Refresh> {
        match self.refresh_from(seen, limited, prefer).await {
            Ok(outcome) => Some(outcome),
            Err(e) => {
                tracing::debug!(%e, "map refresh failed; retrying from the cache");
                None
            }
        }
    }

    fn patch(&self, moved: KwMoved) {
        if self.cache.patch(moved) {
            Counters::inc(&self.stats.patches);
        }
    }

    fn forget(&self, addr: &str) {
        self.conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(addr);
    }

    fn conn(&self, addr: &str) -> Arc<tokio::sync::Mutex<conn::Conn>> {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        conns
            .entry(addr.to_string())
            .or_insert_with(|| Arc::new(tokio::sync::Mutex::new(conn::Conn::new(addr))))
            .clone()
    }

    async fn request(&self, addr: &str, args: Vec<Bytes>) -> Result<Frame, ClientError> {
        let mut replies = self.pipeline(addr, vec![args]).await?;
        replies.pop().ok_or_else(|| ClientError::Protocol {
            addr: addr.into(),
            why: "no reply".into(),
        })
    }

    /// Sends `requests` to `addr` in one write and reads their replies.
    pub(crate) async fn pipeline(
        &self,
        addr: &str,
        requests: Vec<Vec<Bytes>>,
    ) -> Result<Vec<Frame>, ClientError> {
        self.pipeline_on(addr, requests, false).await
    }

    /// [`Self::pipeline`]; `readonly`: on a connection that sent `READONLY`
    /// (sent first if it has not yet). `READONLY` changes nothing for the
    /// client's other requests on that connection: writes and `KW.AT` are
    /// admitted as the owner's (a `KW.AT` read at the partition's
    /// `reads_from` node excepted, which is what the client wants).
    async fn pipeline_on(
        &self,
        addr: &str,
        mut requests: Vec<Vec<Bytes>>,
        readonly: bool,
    ) -> Result<Vec<Frame>, ClientError> {
        let conn = self.conn(addr);
        let mut conn = conn.lock().await;
        let timeout = Duration::from_millis(self.config.request_timeout_ms);
        let prefix = readonly && !conn.readonly();
        if prefix {
            requests.insert(0, vec![Bytes::from_static(b"READONLY")]);
        }
        match tokio::time::timeout(timeout, conn.pipeline(&requests)).await {
            Ok(Ok(mut replies)) if prefix => match replies.first() {
                Some(Frame::Simple(_)) => {
                    conn.set_readonly();
                    replies.remove(0);
                    Ok(replies)
                }
                other => Err(ClientError::Protocol {
                    addr: addr.into(),
                    why: format!("READONLY answered {other:?}"),
                }),
            },
            Ok(result) => result,
            Err(_) => {
                let sent = conn.sent();
                conn.reset();
                let addr = addr.to_string();
                let source = std::io::ErrorKind::TimedOut.into();
                Err(if sent {
                    ClientError::UnknownOutcome { addr, source }
                } else {
                    ClientError::Io { addr, source }
                })
            }
        }
    }
}

/// The cached owner of the partition `locate` finds, and its address.
fn route(
    map: &PartitionMap,
    locate: impl Fn(&PartitionMap) -> Option<PartitionRecord>,
) -> Option<(PartitionRecord, String)> {
    let p = locate(map)?;
    let addr = map.nodes.get(&p.owner)?.resp_addr.clone();
    Some((p, addr))
}

/// `KW.AT <partition> <epoch> <args...>`.
pub(crate) fn at_request(p: &PartitionRecord, args: &[&[u8]]) -> Vec<Bytes> {
    let mut req = Vec::with_capacity(args.len() + 3);
    req.push(Bytes::from_static(b"KW.AT"));
    req.push(Bytes::from(p.id.0.to_string()));
    req.push(Bytes::from(p.epoch.0.to_string()));
    req.extend(args.iter().map(|a| Bytes::copy_from_slice(a)));
    req
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyway_map::{NodeId, NodeInfo};

    #[test]
    fn strategies_parse_and_bad_settings_are_named() {
        for s in Strategy::ALL {
            assert_eq!(s.name().parse::<Strategy>(), Ok(s));
        }
        assert_eq!("HYBRID".parse::<Strategy>(), Ok(Strategy::Hybrid));
        assert!("guess".parse::<Strategy>().is_err());
        assert_eq!(ClientConfig::default().strategy, Strategy::Hybrid);
        ClientConfig::default().validate().unwrap();
        let bad = ClientConfig {
            request_timeout_ms: 0,
            ..ClientConfig::default()
        };
        assert!(bad.validate().unwrap_err().contains("request_timeout_ms"));
        let bad = ClientConfig {
            cache_file: Some(PathBuf::from("/")),
            ..ClientConfig::default()
        };
        assert!(bad.validate().unwrap_err().contains("cache_file"));
    }

    #[test]
    fn a_replicated_map_routes_every_request_to_the_owner() {
        let nodes: Vec<NodeInfo> = (1..=3)
            .map(|i| NodeInfo::up(NodeId(i), format!("127.0.0.1:{}", 7000 + i)))
            .collect();
        let map = PartitionMap::bootstrap_replicated(&nodes, 2, 3).unwrap();
        // The map as the client loads it (KW.MAP), replicas included.
        let map = keyway_map::decode_map(&keyway_map::encode_map(&map)).unwrap();
        for slot in [0, 5000, 9000, 16383] {
            let (p, addr) =
                route(&map, |m| m.locate_slot(DEFAULT_KEYSPACE, slot).cloned()).unwrap();
            assert_eq!(p.replicas.len(), 2);
            assert_eq!(addr, format!("127.0.0.1:{}", 7000 + p.owner.0));
        }
    }

    #[test]
    fn a_kwreads_patches_reads_from_at_the_same_epoch_only() {
        let nodes: Vec<NodeInfo> = (1..=3)
            .map(|i| NodeInfo::up(NodeId(i), format!("127.0.0.1:{}", 7000 + i)))
            .collect();
        let map = PartitionMap::bootstrap_replicated(&nodes, 1, 2).unwrap();
        let p = map.partitions.values().next().unwrap().clone();
        let cache = cache::Cache::default();
        cache.install(map, None);
        let reads = |epoch: u64| keyway_map::KwReads {
            partition: p.id,
            epoch: keyway_map::Epoch(epoch),
            reads_from: p.replicas[0],
            addr: "127.0.0.1:7999".into(),
        };
        assert!(
            !cache.patch_reads_from(&reads(p.epoch.0 + 1)),
            "another epoch"
        );
        assert!(cache.patch_reads_from(&reads(p.epoch.0)));
        assert_eq!(
            cache.view().partitions[&p.id].reads_from,
            Some(p.replicas[0])
        );
        assert!(!cache.patch_reads_from(&reads(p.epoch.0)), "known already");
        assert_eq!(cache.base().partitions[&p.id].reads_from, None);
    }
}
