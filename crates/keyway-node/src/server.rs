//! The node process: start, accept loop, graceful shutdown.
//!
//! Start-up order: validate the configuration, open the engine (on a
//! blocking thread), bind the listeners, register with the metadata store
//! (keeping the node id in the data directory), take a lease, load the map,
//! start the storage threads, then accept clients. A node answers nothing
//! before it holds a lease and a map.

use crate::clock::{Clock, SystemClock};
use crate::config::Durability;
use crate::config::{EngineKind, NodeConfig};
use crate::executor::{Executor, ExecutorConfig};
use crate::metrics::Metrics;
use crate::migrate::Migrations;
use crate::routing::Routing;
use crate::scan::ScanCursors;
use crate::storage_health::{FailStopEngine, StorageHealth};
use keyway_map::{DEFAULT_KEYSPACE, Keyspace, NodeId, Routing as KeyRouting};
use keyway_meta::MetaStore;
use keyway_storage::{Engine, FaultyEngine, FjallEngine, FjallOptions, MemEngine};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// Why a node could not start.
#[derive(thiserror::Error, Debug)]
pub enum NodeError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("storage: {0}")]
    Storage(#[from] keyway_storage::StorageError),
    #[error("cannot bind {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("data directory {path}: {source}")]
    DataDir {
        path: String,
        source: std::io::Error,
    },
    #[error("metadata store: {0}")]
    Meta(#[from] keyway_meta::MetaError),
    #[error("shut down before start-up finished")]
    Aborted,
}

/// State shared by every task of one node.
pub struct Shared {
    pub config: NodeConfig,
    pub me: NodeId,
    pub resp_addr: String,
    pub admin_addr: String,
    /// `host:port` of the replica endpoint, if it listens (see
    /// [`crate::replica_endpoint`]).
    pub replica_addr: Option<String>,
    /// `host:port` of the TLS client listener, if TLS is on (see [`crate::tls`]).
    pub tls_addr: Option<String>,
    pub routing: Arc<Routing>,
    /// The engine behind the fail-stop latch (see [`crate::storage_health`]).
    pub engine: Arc<dyn Engine>,
    /// Latched by the first failed fsync: the node then serves no data.
    pub storage_health: Arc<StorageHealth>,
    /// The fault injector, with `fault_injection` on (testing only).
    pub faults: Option<Arc<FaultyEngine>>,
    pub executor: Executor,
    /// Clients blocked by BLPOP and the like (see [`crate::blocking`]).
    pub blocking: Arc<crate::blocking::Blocking>,
    /// The Lua script cache and running scripts (see [`crate::script`]).
    pub scripts: Arc<crate::script::Scripts>,
    /// What KEYS and RANDOMKEY walked (see [`crate::node_keys`]).
    pub key_walks: crate::node_keys::KeyWalks,
    /// The migrations this node is the source of.
    pub migrations: Arc<Migrations>,
    /// Replication: this node's streams as a primary, its replica side.
    pub replication: Arc<crate::replicate::Replication>,
    pub metrics: Arc<Metrics>,
    /// The change-log truncator's metrics.
    pub log_gc: crate::log_gc::GcMetrics,
    /// The active expiry cycle's metrics.
    pub active_expiry: crate::active_expire::ExpiryMetrics,
    /// MULTI/EXEC outcomes ([`crate::multi`]).
    pub tx_metrics: crate::multi::TxMetrics,
    /// FLUSHALL/FLUSHDB counters ([`crate::flush`]).
    pub flush_metrics: crate::flush::FlushMetrics,
    /// Run-time settings, slow log, clients, SHUTDOWN ([`crate::server_cmd`]).
    pub server: crate::server_cmd::ServerState,
    /// Per-partition load statistics (rates, hot keys, sizes, split keys).
    pub stats: Arc<crate::stats::Stats>,
    /// The copies this node sends, with their cost (`crate::copies`).
    pub copies: Arc<crate::copies::Copies>,
    pub clock: Arc<dyn Clock>,
    pub meta: Arc<dyn MetaStore>,
    /// The ACL users in force ([`crate::acl`]; kept in step with the
    /// metadata store by `keyway_acl::sync_loop`).
    pub acl: Arc<keyway_acl::Acl>,
    /// The default (Redis) keyspace, `0`, hash routing.
    pub keyspace: Keyspace,
    pub scan_cursors: Mutex<ScanCursors>,
    /// `Peer` clients for `KW.SCAN`'s `RangeScan` calls, by admin address.
    pub kw_peers: crate::kw::PeerCache,
    /// The lease this node holds in the metadata store, if any.
    pub lease_id: Mutex<Option<keyway_meta::LeaseId>>,
    pub next_client_id: AtomicU64,
    pub clients: AtomicUsize,
    pub started: Instant,
}

/// How often migration roles are checked against their durable records.
const FENCE_RECHECK: Duration = Duration::from_millis(250);
/// How often held requests are re-checked even without a routing change
/// (so they time out).
const HELD_RECHECK: Duration = Duration::from_millis(500);

/// Wakes the storage threads' held requests on every routing change (and
/// periodically).
async fn wake_held(shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
    let mut changes = shared.routing.subscribe();
    loop {
        tokio::select! {
            r = changes.changed() => if r.is_err() { return },
            _ = tokio::time::sleep(HELD_RECHECK) => {}
            _ = shutdown.changed() => return,
        }
        shared.executor.wake();
    }
}

/// A running node.
pub struct Node {
    shared: Arc<Shared>,
    shutdown: watch::Sender<bool>,
    tasks: JoinSet<()>,
    /// The change-log truncator's thread and its stop flag.
    log_gc: Option<(
        Arc<std::sync::atomic::AtomicBool>,
        std::thread::JoinHandle<()>,
    )>,
}

impl Node {
    /// Starts a node against `meta` with the system clock.
    pub async fn start(config: NodeConfig, meta: Arc<dyn MetaStore>) -> Result<Node, NodeError> {
        Self::start_with_clock(config, meta, Arc::new(SystemClock)).await
    }

    /// Starts a node with an explicit clock (simulation, tests).
    pub async fn start_with_clock(
        config: NodeConfig,
        meta: Arc<dyn MetaStore>,
        clock: Arc<dyn Clock>,
    ) -> Result<Node, NodeError> {
        config.validate().map_err(NodeError::Config)?;
        let engine = open_engine(&config).await?;
        Self::start_with_engine(config, meta, clock, engine).await
    }

    /// Starts a node on an engine opened by the caller (tests: a
    /// [`FaultyEngine`] whose crash drops unsynced writes); `config.engine`
    /// is then ignored. The node still keeps its id in `config.data_dir`.
    pub async fn start_with_engine(
        config: NodeConfig,
        meta: Arc<dyn MetaStore>,
        clock: Arc<dyn Clock>,
        engine: Arc<dyn Engine>,
    ) -> Result<Node, NodeError> {
        config.validate().map_err(NodeError::Config)?;
        let cluster_secret = config.cluster_secret().map_err(NodeError::Config)?;
        let faults = config
            .fault_injection
            .then(|| Arc::new(FaultyEngine::wrap(engine.clone())));
        let engine: Arc<dyn Engine> = match &faults {
            Some(f) => {
                tracing::warn!("fault injection is on: POST /fault/* can fail this node's storage");
                f.clone()
            }
            None => engine,
        };
        let storage_health = StorageHealth::new();
        let engine: Arc<dyn Engine> = Arc::new(FailStopEngine::new(engine, storage_health.clone()));
        let listener = bind(config.listen).await?;
        let admin_listener = bind(config.admin_listen).await?;
        let resp_addr = match &config.announce {
            Some(a) => a.clone(),
            None => local_addr(&listener)?,
        };
        let admin_addr = local_addr(&admin_listener)?;
        let tls_listener = bind_tls(&config).await?;
        let tls_addr = match &tls_listener {
            Some((l, _)) => Some(local_addr(l)?),
            None => None,
        };
        let replica_listener = match config.replica_listen.bind_addr(config.listen) {
            Some(addr) => Some(bind(addr).await?),
            None => None,
        };
        let replica_addr = match &replica_listener {
            Some(l) => Some(crate::replica_endpoint::advertised_addr(
                l.local_addr().map_err(|source| NodeError::Bind {
                    addr: config.listen,
                    source,
                })?,
                config.announce.as_deref(),
            )),
            None => None,
        };
        let (shutdown, shutdown_rx) = watch::channel(false);
        let me = register(
            &config,
            &*meta,
            &resp_addr,
            &admin_addr,
            shutdown_rx.clone(),
        )
        .await?;
        if let Err(e) =
            crate::replica_endpoint::advertise(&*meta, me, replica_addr.as_deref()).await
        {
            // `keep_advertised` retries.
            tracing::warn!(%e, "cannot advertise the replica endpoint yet");
        }
        let metrics = Arc::new(Metrics::new());
        metrics.register(
            "storage_failed",
            "1 once an fsync failed: the node then serves no reads or writes, for good",
            storage_health.gauge.clone(),
        );
        let routing = Arc::new(Routing::new(me, clock.clone()));
        routing.set_map_history_versions(config.map_history_versions);
        let executor = Executor::start(
            engine.clone(),
            ExecutorConfig {
                threads: config.executor_threads,
                durability: config.durability,
                periodic_sync_ms: config.periodic_sync_ms,
                max_group_commands: config.max_group_commands,
                max_hold: Duration::from_millis(config.max_hold_ms),
                health: storage_health.clone(),
            },
            routing.subscribe(),
            metrics.clone(),
        );
        let stats = Arc::new(crate::stats::Stats::new(
            me,
            routing.clone(),
            engine.clone(),
            clock.clone(),
            crate::stats::StatsConfig::from_node(&config),
            &metrics,
        ));
        let copies = crate::copies::Copies::new(&metrics, clock.clone(), Some(stats.clone()));
        let holds = crate::log_gc::LogHolds::with_keep_idle(
            engine.clone(),
            (config.log_keep_idle_ms > 0)
                .then(|| std::time::Duration::from_millis(config.log_keep_idle_ms)),
        );
        let migrations = Arc::new(Migrations::new(
            engine.clone(),
            routing.clone(),
            metrics.clone(),
            executor.latency().clone(),
            config.role_limits(),
            holds.clone(),
            copies.clone(),
        ));
        let replication = crate::replicate::Replication::new(
            crate::replicate::ReplicationParts {
                me,
                engine: engine.clone(),
                routing: routing.clone(),
                meta: meta.clone(),
                durable: executor.durable().clone(),
                holds: holds.clone(),
                latency: executor.latency().clone(),
                migrations: migrations.clone(),
                copies: copies.clone(),
            },
            config.replication(),
            &metrics,
        );
        replication.gate_migrations();
        let log_gc = crate::log_gc::GcMetrics::register(&metrics);
        let active_expiry = crate::active_expire::ExpiryMetrics::register(&metrics);
        let tx_metrics = crate::multi::TxMetrics::register(&metrics);
        let flush_metrics = crate::flush::FlushMetrics::register(&metrics);
        let server = crate::server_cmd::ServerState::new(&config, clock.unix_ms() / 1000);
        let acl = crate::acl::new_acl(config.requirepass.as_deref());
        crate::acl::register_metrics(&acl, &metrics);
        if let Err(e) = keyway_acl::sync_once(&acl, &*meta).await {
            tracing::warn!(error = %e, "cannot read the ACL users yet; the default user from requirepass applies until the store answers");
        }
        let shared = Arc::new(Shared {
            stats,
            copies,
            scan_cursors: Mutex::new(ScanCursors::new(config.max_scan_cursors)),
            kw_peers: crate::kw::PeerCache::new(Duration::from_millis(
                config.kw_scan_rpc_timeout_ms,
            )),
            lease_id: Mutex::new(None),
            config,
            me,
            resp_addr,
            admin_addr,
            replica_addr,
            tls_addr,
            routing,
            engine,
            storage_health,
            faults,
            executor,
            blocking: Arc::new(crate::blocking::Blocking::new(&metrics)),
            scripts: Arc::new(crate::script::Scripts::new(&metrics)),
            key_walks: crate::node_keys::KeyWalks::new(&metrics),
            migrations,
            replication,
            metrics,
            log_gc,
            active_expiry,
            tx_metrics,
            flush_metrics,
            server,
            clock,
            meta,
            acl,
            keyspace: Keyspace {
                id: DEFAULT_KEYSPACE,
                name: "default".into(),
                routing: KeyRouting::Hash,
                replication_factor: 1,
                min_in_sync: 1,
            },
            next_client_id: AtomicU64::new(1),
            clients: AtomicUsize::new(0),
            started: Instant::now(),
        });
        let mut tasks = JoinSet::new();
        crate::lease::start(&shared, &mut tasks, shutdown_rx.clone()).await;
        crate::watcher::start(&shared, &mut tasks, shutdown_rx.clone()).await;
        crate::migrate::recover_fences(&shared.migrations, &*shared.meta).await?;
        tasks.spawn(crate::migrate::watch_fences(
            shared.migrations.clone(),
            shared.meta.clone(),
            FENCE_RECHECK,
            shutdown_rx.clone(),
        ));
        tasks.spawn(wake_held(shared.clone(), shutdown_rx.clone()));
        tasks.spawn(keyway_acl::sync_loop(
            shared.acl.clone(),
            shared.meta.clone(),
            Duration::from_millis(shared.config.acl_poll_interval_ms.max(1)),
            shutdown_rx.clone(),
        ));
        tasks.spawn(shared.replication.clone().run(shutdown_rx.clone()));
        tasks.spawn(shared.stats.clone().run(shutdown_rx.clone()));
        tasks.spawn(crate::active_expire::run(
            shared.clone(),
            shared.config.expire_limits(),
            shutdown_rx.clone(),
        ));
        tasks.spawn(crate::stray_sweep::run(
            shared.clone(),
            shared.config.sweep_limits(),
            shutdown_rx.clone(),
        ));
        let gc_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let gc_thread = {
            let (stop, limits) = (gc_stop.clone(), shared.config.gc_limits());
            let metrics = shared.log_gc.clone();
            std::thread::Builder::new()
                .name("kw-log-gc".into())
                .spawn(move || crate::log_gc::run(&holds, limits, &metrics, &stop))
                .map_err(|e| NodeError::Config(format!("cannot start the log truncator: {e}")))?
        };
        tasks.spawn(crate::admin::serve(
            shared.clone(),
            admin_listener,
            cluster_secret,
            shutdown_rx.clone(),
        ));
        if let Some(replica_listener) = replica_listener {
            tasks.spawn(crate::replica_endpoint::keep_advertised(
                shared.clone(),
                shutdown_rx.clone(),
            ));
            tasks.spawn(accept_loop(
                shared.clone(),
                replica_listener,
                Listening::ReplicaEndpoint,
                shutdown_rx.clone(),
            ));
        }
        if let Some((tls_listener, acceptor)) = tls_listener {
            tasks.spawn(accept_loop(
                shared.clone(),
                tls_listener,
                Listening::Tls(acceptor),
                shutdown_rx.clone(),
            ));
        }
        tasks.spawn(accept_loop(
            shared.clone(),
            listener,
            Listening::Clients,
            shutdown_rx,
        ));
        tracing::info!(node = %me, resp = %shared.resp_addr, tls = ?shared.tls_addr, replica = ?shared.replica_addr, admin = %shared.admin_addr, "node started");
        Ok(Node {
            shared,
            shutdown,
            tasks,
            log_gc: Some((gc_stop, gc_thread)),
        })
    }

    pub fn id(&self) -> NodeId {
        self.shared.me
    }

    /// `host:port` clients dial.
    pub fn resp_addr(&self) -> &str {
        &self.shared.resp_addr
    }

    /// `host:port` of the admin HTTP port.
    pub fn admin_addr(&self) -> &str {
        &self.shared.admin_addr
    }

    /// `host:port` of the replica endpoint, if it listens.
    pub fn replica_addr(&self) -> Option<&str> {
        self.shared.replica_addr.as_deref()
    }

    /// `host:port` of the TLS client listener, if TLS is on.
    pub fn tls_addr(&self) -> Option<&str> {
        self.shared.tls_addr.as_deref()
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Waits until the node holds a lease and a map that names it.
    pub async fn wait_serving(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.shared.routing.lease_valid()
                && self
                    .shared
                    .routing
                    .map()
                    .owned_by(self.shared.me)
                    .next()
                    .is_some()
            {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    /// Resolves once a client sent `SHUTDOWN` ([`crate::server_cmd::shutdown`]):
    /// the caller then stops the node with [`Node::shutdown`].
    pub async fn shutdown_requested(&self) {
        self.shared.server.shutdown_requested().await
    }

    /// Graceful shutdown: stop accepting, let connections finish the
    /// pipeline in hand, stop the storage threads (which fsync), release the lease.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        while self.tasks.join_next().await.is_some() {}
        if let Some((stop, thread)) = self.log_gc.take() {
            stop.store(true, Ordering::Release);
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
        let shared = self.shared.clone();
        let _ = tokio::task::spawn_blocking(move || shared.executor.shutdown()).await;
        crate::lease::release(&self.shared).await;
        let engine = self.shared.engine.clone();
        let _ = tokio::task::spawn_blocking(move || engine.sync()).await;
        tracing::info!(node = %self.shared.me, "node stopped");
    }
}

impl Drop for Node {
    /// A node dropped without [`Node::shutdown`] still stops its truncator
    /// (the thread ends within one sleep step).
    fn drop(&mut self) {
        if let Some((stop, _)) = &self.log_gc {
            stop.store(true, Ordering::Release);
        }
    }
}

async fn open_engine(config: &NodeConfig) -> Result<Arc<dyn Engine>, NodeError> {
    match config.engine {
        EngineKind::Memory => Ok(Arc::new(MemEngine::new())),
        EngineKind::Fjall => {
            let dir = config.data_dir.join("engine");
            let options = FjallOptions {
                // Acknowledged without a sync: at least hand each batch to
                // the OS, so a process crash loses none of them.
                flush_journal_each_batch: matches!(
                    config.durability,
                    Durability::Periodic | Durability::None
                ),
                cache_size_bytes: config.storage_cache_bytes,
                max_journaling_size_bytes: Some(config.storage_max_journal_bytes),
                max_memtable_bytes: Some(config.storage_max_memtable_bytes),
                journal_rotation_bytes: Some(config.storage_journal_rotation_bytes),
                // Validated at most 1 GiB, so it fits.
                change_tail_bytes: config.storage_change_tail_bytes as usize,
                ..FjallOptions::default()
            };
            let engine = tokio::task::spawn_blocking(move || FjallEngine::open(&dir, options))
                .await
                .map_err(|e| NodeError::Config(format!("engine open task failed: {e}")))??;
            Ok(Arc::new(engine))
        }
    }
}

/// The TLS client listener on the `listen` IP and `tls_port`, with its
/// acceptor (the files loaded and checked), if TLS is on.
async fn bind_tls(
    config: &NodeConfig,
) -> Result<Option<(TcpListener, crate::tls::TlsAcceptor)>, NodeError> {
    let Some(acceptor) = config.tls().acceptor().map_err(NodeError::Config)? else {
        return Ok(None);
    };
    let port = config.tls_port.unwrap_or(0);
    let listener = bind(SocketAddr::new(config.listen.ip(), port)).await?;
    Ok(Some((listener, acceptor)))
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, NodeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| NodeError::Bind { addr, source })
}

fn local_addr(listener: &TcpListener) -> Result<String, NodeError> {
    listener
        .local_addr()
        .map(|a| a.to_string())
        .map_err(|source| NodeError::Bind {
            addr: "0.0.0.0:0".parse().expect("literal"),
            source,
        })
}

/// Registers with the metadata store, retrying while it is unreachable, and
/// keeps the node id in `<data_dir>/node.id` so a restart keeps its identity.
async fn register(
    config: &NodeConfig,
    meta: &dyn MetaStore,
    resp_addr: &str,
    admin_addr: &str,
    mut shutdown: watch::Receiver<bool>,
) -> Result<NodeId, NodeError> {
    let id_path = config.data_dir.join("node.id");
    let known = read_node_id(&id_path)?;
    let mut backoff = Duration::from_millis(50);
    loop {
        match meta
            .register_node_in_zone(
                known,
                resp_addr.into(),
                admin_addr.into(),
                config.zone.clone(),
            )
            .await
        {
            Ok(id) => {
                write_node_id(&id_path, id)?;
                return Ok(id);
            }
            Err(keyway_meta::MetaError::Unavailable(why)) => {
                tracing::warn!(%why, "metadata store unreachable; retrying registration");
            }
            Err(other) => return Err(other.into()),
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = shutdown.changed() => return Err(NodeError::Aborted),
        }
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

fn read_node_id(path: &Path) -> Result<Option<NodeId>, NodeError> {
    match std::fs::read_to_string(path) {
        Ok(text) => NodeId::parse(&text).map(Some).ok_or_else(|| {
            NodeError::Config(format!("{} does not hold a node id", path.display()))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(NodeError::DataDir {
            path: path.display().to_string(),
            source,
        }),
    }
}

fn write_node_id(path: &Path, id: NodeId) -> Result<(), NodeError> {
    let err = |source| NodeError::DataDir {
        path: path.display().to_string(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, format!("{id}\n")).map_err(err)?;
    std::fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

impl Shared {
    /// Protected mode's one condition (see [`crate::protected_mode`]):
    /// whether a client from `peer` is refused. "The default user has no
    /// password" is `requirepass` unset.
    pub fn protected_mode_refuses(&self, peer: SocketAddr) -> bool {
        crate::protected_mode::refuses(
            self.config.protected_mode,
            // `requirepass`, or an `ACL SETUSER default >pw` since.
            self.acl.default_user_has_password(),
            peer,
        )
    }
}

/// What one listener serves.
#[derive(Clone)]
enum Listening {
    /// The client port.
    Clients,
    /// The replica endpoint's port (see [`crate::replica_endpoint`]).
    ReplicaEndpoint,
    /// The TLS client port (see [`crate::tls`]).
    Tls(crate::tls::TlsAcceptor),
}

async fn accept_loop(
    shared: Arc<Shared>,
    listener: TcpListener,
    listening: Listening,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    // Counted here, not in the connection task, so a burst of
                    // connects cannot overshoot max_clients before tasks run.
                    if shared.clients.fetch_add(1, Ordering::SeqCst) >= shared.config.max_clients {
                        shared.clients.fetch_sub(1, Ordering::SeqCst);
                        shared.metrics.connections_refused.inc();
                        conns.spawn(crate::connection::refuse(stream));
                        continue;
                    }
                    let _ = stream.set_nodelay(true);
                    // Served on a shard thread's event loop (see
                    // `executor.rs`, 6): re-registered with that loop's
                    // reactor, so its readiness wakes no other thread.
                    let stream = match stream.into_std() {
                        Ok(stream) => stream,
                        Err(err) => {
                            shared.clients.fetch_sub(1, Ordering::SeqCst);
                            tracing::warn!(%err, "could not hand a connection to a shard thread");
                            continue;
                        }
                    };
                    let runtime = shared.executor.connection_runtime().clone();
                    let (shared, shutdown) = (shared.clone(), shutdown.clone());
                    let listening = listening.clone();
                    conns.spawn_on(async move {
                        let stream = match TcpStream::from_std(stream) {
                            Ok(stream) => stream,
                            Err(err) => {
                                shared.clients.fetch_sub(1, Ordering::SeqCst);
                                tracing::warn!(%err, "could not register a connection on a shard thread");
                                return;
                            }
                        };
                        match listening {
                            Listening::Tls(acceptor) => {
                                crate::connection::serve_tls(shared, acceptor, stream, peer, shutdown).await
                            }
                            plain => {
                                let replica_endpoint = matches!(plain, Listening::ReplicaEndpoint);
                                let local = stream.local_addr().map(|a| a.to_string()).unwrap_or_default();
                                crate::connection::serve(shared, stream, peer, local, replica_endpoint, shutdown).await
                            }
                        }
                    }, &runtime);
                }
                Err(err) => {
                    tracing::warn!(%err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            _ = shutdown.changed() => break,
        }
    }
    drop(listener);
    while conns.join_next().await.is_some() {}
}
