//! The proxy process: start, accept loop, graceful shutdown.
//!
//! Start-up order: validate the configuration, bind both listeners, serve
//! the admin port (its `/status` answers 503 until ready), start the map
//! watch, wait for the first map, and only then accept clients: a proxy
//! never answers a data command without a map.
//!
//! Shutdown: stop accepting; every connection stops reading, finishes the
//! requests it has in flight and closes; connections still busy after
//! `drain_timeout_ms` are cut.

use crate::config::ProxyConfig;
use crate::connection;
use crate::metrics::{Metrics, Status};
use crate::router::{Router, watch_loop};
use crate::upstream::{UpstreamConfig, Upstreams};
use keyway_meta::MetaStore;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

/// Why a proxy could not start.
#[derive(thiserror::Error, Debug)]
pub enum ProxyError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("cannot bind {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// State shared by every task of one proxy.
pub struct Core {
    pub config: ProxyConfig,
    pub router: Arc<Router>,
    pub upstreams: Upstreams,
    pub metrics: Arc<Metrics>,
    /// The ACL users in force (kept in step with the metadata store).
    pub acl: Arc<keyway_acl::Acl>,
    /// The metadata store (the map watch, `ACL SETUSER`/`DELUSER`).
    pub meta: Arc<dyn MetaStore>,
    pub resp_addr: String,
    pub admin_addr: String,
    /// The TLS client listener's address, if TLS is on.
    pub tls_addr: Option<String>,
    pub clients: AtomicUsize,
    pub next_client_id: AtomicU64,
    pub started: Instant,
}

/// A running proxy.
pub struct Proxy {
    core: Arc<Core>,
    shutdown: watch::Sender<bool>,
    tasks: JoinSet<()>,
}

impl Proxy {
    /// Starts a proxy routing by `meta`'s map; returns once it accepts
    /// clients (after the first map is loaded, however long that takes).
    pub async fn start(config: ProxyConfig, meta: Arc<dyn MetaStore>) -> Result<Proxy, ProxyError> {
        config.validate().map_err(ProxyError::Config)?;
        let listener = bind(config.listen).await?;
        let admin_listener = bind(config.admin_listen).await?;
        let local = |l: &TcpListener, addr: SocketAddr| {
            l.local_addr()
                .map(|a| a.to_string())
                .map_err(|source| ProxyError::Bind { addr, source })
        };
        let resp_addr = local(&listener, config.listen)?;
        let admin_addr = local(&admin_listener, config.admin_listen)?;
        let tls = match config.tls().acceptor().map_err(ProxyError::Config)? {
            Some(acceptor) => {
                let addr = SocketAddr::new(config.listen.ip(), config.tls_port.unwrap_or(0));
                let l = bind(addr).await?;
                let tls_addr = local(&l, addr)?;
                Some((l, acceptor, tls_addr))
            }
            None => None,
        };
        let metrics = Arc::new(Metrics::new());
        let router = Arc::new(Router::new(metrics.clone()));
        let upstreams = Upstreams::new(
            UpstreamConfig {
                connections_per_node: config.node_connections,
                max_inflight: config.max_node_inflight,
                connect_timeout: Duration::from_millis(config.connect_timeout_ms),
                password: config.node_password.clone(),
                reply_limits: config.reply_limits(),
            },
            metrics.clone(),
        );
        let acl = keyway_command::acl::new_acl(config.requirepass.as_deref());
        metrics.register_acl(&acl.metrics);
        if let Err(e) = keyway_acl::sync_once(&acl, &*meta).await {
            tracing::warn!(error = %e, "cannot read the ACL users yet; the default user from requirepass applies until the store answers");
        }
        let core = Arc::new(Core {
            config,
            router: router.clone(),
            upstreams,
            metrics,
            acl,
            meta: meta.clone(),
            resp_addr,
            admin_addr,
            tls_addr: tls.as_ref().map(|(_, _, a)| a.clone()),
            clients: AtomicUsize::new(0),
            next_client_id: AtomicU64::new(1),
            started: Instant::now(),
        });
        let (shutdown, shutdown_rx) = watch::channel(false);
        let mut tasks = JoinSet::new();
        tasks.spawn(crate::metrics::serve_admin(
            core.clone(),
            admin_listener,
            shutdown_rx.clone(),
        ));
        tasks.spawn(keyway_acl::sync_loop(
            core.acl.clone(),
            meta.clone(),
            Duration::from_millis(core.config.acl_poll_interval_ms),
            shutdown_rx.clone(),
        ));
        tasks.spawn(watch_loop(router.clone(), meta, shutdown_rx.clone()));
        router.wait_ready().await;
        if let Some((tls_listener, acceptor, _)) = tls {
            tasks.spawn(accept_loop(
                core.clone(),
                tls_listener,
                Some(acceptor),
                shutdown_rx.clone(),
            ));
        }
        tasks.spawn(accept_loop(core.clone(), listener, None, shutdown_rx));
        Ok(Proxy {
            core,
            shutdown,
            tasks,
        })
    }

    /// The address clients connect to.
    pub fn resp_addr(&self) -> &str {
        &self.core.resp_addr
    }

    /// The TLS client address, if TLS is on.
    pub fn tls_addr(&self) -> Option<&str> {
        self.core.tls_addr.as_deref()
    }

    /// The admin HTTP address.
    pub fn admin_addr(&self) -> &str {
        &self.core.admin_addr
    }

    /// What `/status` reports.
    pub fn status(&self) -> Status {
        Status::of(&self.core)
    }

    /// Stops accepting, lets in-flight requests finish (at most
    /// `drain_timeout_ms`), and stops every task.
    pub async fn shutdown(mut self) {
        self.shutdown.send_replace(true);
        while self.tasks.join_next().await.is_some() {}
    }
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, ProxyError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ProxyError::Bind { addr, source })
}

impl Core {
    /// Protected mode's one condition (see [`keyway_tls::protected_mode`]):
    /// whether a client from `peer` is refused. "The default user has no
    /// password" is the proxy's `requirepass` unset.
    pub fn protected_mode_refuses(&self, peer: SocketAddr) -> bool {
        keyway_tls::protected_mode::refuses(
            self.config.protected_mode,
            // `requirepass`, or an `ACL SETUSER default >pw` since.
            self.acl.default_user_has_password(),
            peer,
        )
    }
}

/// `tls`: the listener is the TLS client port (each connection's handshake
/// runs on its own task).
async fn accept_loop(
    core: Arc<Core>,
    listener: TcpListener,
    tls: Option<keyway_tls::TlsAcceptor>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut conns = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.changed() => break,
            // Reap finished connections as they end.
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(err) => {
                // Out of file descriptors and the like: back off briefly.
                tracing::warn!(%err, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if core.clients.fetch_add(1, Ordering::SeqCst) >= core.config.max_clients {
            core.clients.fetch_sub(1, Ordering::SeqCst);
            core.metrics.clients_refused.inc();
            conns.spawn(connection::refuse(stream));
            continue;
        }
        core.metrics.clients.inc();
        let conn_core = core.clone();
        let rx = shutdown.clone();
        let tls = tls.clone();
        conns.spawn(async move {
            match tls {
                None => connection::serve(conn_core.clone(), stream, peer, rx).await,
                Some(acceptor) => {
                    connection::serve_tls(&conn_core, acceptor, stream, peer, rx).await
                }
            }
            conn_core.clients.fetch_sub(1, Ordering::SeqCst);
            conn_core.metrics.clients.dec();
        });
    }
    drop(listener);
    let drain = Duration::from_millis(core.config.drain_timeout_ms);
    let drained =
        tokio::time::timeout(drain, async { while conns.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!(
            left = conns.len(),
            "connections still busy after the drain timeout; closing them"
        );
        conns.shutdown().await;
    }
}
