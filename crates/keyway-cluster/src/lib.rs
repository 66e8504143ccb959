//! A whole Keyway cluster in one process: an embedded metadata store served
//! over RPC, N nodes, and (unless turned off) a manager that drives
//! migrations. `keyway dev` runs one for people; the tests run
//! many, starting, stopping and restarting nodes at will.
//!
//! This crate owns process wiring only: it never decides ownership (the
//! metadata store's bootstrap does) and never touches data (the nodes do).
//!
//! # Layout
//! - `lib.rs`: [`ClusterSpec`], [`LocalCluster`].

use keyway_manager::{Manager, ManagerConfig, SeatConfig};
use keyway_map::{NodeId, PartitionMap};
use keyway_meta::{EmbeddedMeta, EmbeddedOptions, MetaError, MetaStore};
use keyway_node::{Node, NodeConfig, NodeError};
use keyway_storage::Engine;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// Why a local cluster could not start or change.
#[derive(thiserror::Error, Debug)]
pub enum ClusterError {
    #[error("metadata store: {0}")]
    Meta(#[from] MetaError),
    #[error("node {index}: {source}")]
    Node { index: usize, source: NodeError },
    #[error("cannot bind the metadata store on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("no node {0}")]
    NoSuchNode(usize),
    #[error("cluster not serving after {0:?}: {1}")]
    NotServing(Duration, String),
}

/// What to start.
#[derive(Clone, Debug)]
pub struct ClusterSpec {
    /// Number of nodes.
    pub nodes: usize,
    /// RESP port of node 1; node i gets `first_port + i - 1`. 0 = ephemeral ports.
    pub first_port: u16,
    /// Admin HTTP port of node 1 (likewise); 0 = ephemeral ports.
    pub first_admin_port: u16,
    /// Metadata store RPC address; port 0 = ephemeral. Unused with `external_meta`.
    pub meta_listen: SocketAddr,
    /// Use this metadata store (a URL such as `etcd://h:p/prefix` or
    /// `keyway://h:p`) instead of starting an embedded one.
    pub external_meta: Option<String>,
    /// Root data directory: `meta/` and `node-<i>/` below it.
    pub data_dir: PathBuf,
    /// Partitions per node at bootstrap.
    pub partitions_per_node: u16,
    /// Replication of keyspace 0 at bootstrap (default: one copy).
    pub replication: keyway_meta::Replication,
    /// Template for every node's configuration (listen, data_dir are overridden).
    pub node: NodeConfig,
    /// Run a manager (leader-elected seat plus migration driver) in-process.
    pub manager: Option<ManagerSpec>,
}

/// The in-process manager of a [`LocalCluster`].
#[derive(Clone, Debug)]
pub struct ManagerSpec {
    /// Its admin HTTP address (`/status`, `/metrics`, `/migrations`); port 0 = ephemeral.
    pub admin_listen: SocketAddr,
    /// Seat lease TTL.
    pub lease_ttl_ms: u64,
    pub config: ManagerConfig,
}

impl Default for ManagerSpec {
    fn default() -> Self {
        ManagerSpec {
            admin_listen: "127.0.0.1:0".parse().expect("literal"),
            lease_ttl_ms: 3_000,
            config: ManagerConfig::default(),
        }
    }
}

impl Default for ClusterSpec {
    fn default() -> Self {
        ClusterSpec {
            nodes: 3,
            first_port: 7001,
            first_admin_port: 8001,
            meta_listen: "127.0.0.1:7000".parse().expect("literal"),
            external_meta: None,
            data_dir: PathBuf::from("./keyway-data"),
            partitions_per_node: 4,
            replication: keyway_meta::Replication::default(),
            node: NodeConfig::default(),
            manager: Some(ManagerSpec::default()),
        }
    }
}

impl ClusterSpec {
    /// A spec for tests: ephemeral ports, the given data directory, and
    /// change records switched off 300 ms after their last reader went
    /// away (`log_keep_idle_ms`, 10 s by default), so tests exercise the
    /// log going off and on again under migrations, replication and
    /// `WATCH`.
    pub fn ephemeral(nodes: usize, data_dir: PathBuf) -> Self {
        ClusterSpec {
            nodes,
            first_port: 0,
            first_admin_port: 0,
            meta_listen: "127.0.0.1:0".parse().expect("literal"),
            data_dir,
            node: NodeConfig {
                log_keep_idle_ms: 300,
                ..NodeConfig::default()
            },
            ..ClusterSpec::default()
        }
    }

    /// Checks the spec before anything starts.
    pub fn validate(&self) -> Result<(), String> {
        if self.nodes == 0 || self.nodes > 1000 {
            return Err("nodes must be between 1 and 1000".into());
        }
        if self.partitions_per_node == 0 {
            return Err("partitions_per_node must be greater than 0".into());
        }
        if self.nodes * self.partitions_per_node as usize > keyway_map::SLOT_COUNT as usize {
            return Err("nodes * partitions_per_node must be at most 16384".into());
        }
        for (name, first) in [
            ("port", self.first_port),
            ("admin port", self.first_admin_port),
        ] {
            if first != 0 && first as usize + self.nodes > 65536 {
                return Err(format!("{name} range {first}+{} exceeds 65535", self.nodes));
            }
        }
        if let Some(m) = &self.manager {
            m.config.validate()?;
            if !(100..=keyway_meta::MAX_LEASE_TTL_MS).contains(&m.lease_ttl_ms) {
                return Err("manager lease_ttl_ms out of range".into());
            }
        }
        self.node.validate()
    }
}

/// A running in-process cluster.
pub struct LocalCluster {
    spec: ClusterSpec,
    meta: Arc<dyn MetaStore>,
    meta_url: String,
    meta_stop: Option<oneshot::Sender<()>>,
    meta_task: Option<tokio::task::JoinHandle<()>>,
    configs: Vec<NodeConfig>,
    nodes: Vec<Option<Node>>,
    manager: Option<Manager>,
}

impl LocalCluster {
    /// Starts the metadata store and every node, bootstraps the map if the
    /// data directory is new, and waits until every node serves.
    pub async fn start(spec: ClusterSpec) -> Result<Self, ClusterError> {
        spec.validate().map_err(|e| ClusterError::Node {
            index: 0,
            source: NodeError::Config(e),
        })?;
        let (meta, meta_url, meta_stop, meta_task) = match &spec.external_meta {
            Some(url) => (keyway_meta::connect(url).await?, url.clone(), None, None),
            None => {
                let (meta, addr, stop, task) = serve_embedded(&spec).await?;
                (meta, format!("keyway://{addr}"), Some(stop), Some(task))
            }
        };
        let configs = (0..spec.nodes).map(|i| node_config(&spec, i)).collect();
        let mut cluster = LocalCluster {
            nodes: (0..spec.nodes).map(|_| None).collect(),
            spec,
            meta,
            meta_url,
            meta_stop,
            meta_task,
            configs,
            manager: None,
        };
        for i in 0..cluster.spec.nodes {
            cluster.start_node(i).await?;
        }
        cluster
            .meta
            .bootstrap_if_empty_with(
                cluster.spec.nodes,
                cluster.spec.partitions_per_node,
                cluster.spec.replication,
            )
            .await?;
        cluster.wait_serving(Duration::from_secs(30)).await?;
        if let Some(m) = cluster.spec.manager.clone() {
            cluster.start_manager(&m).await?;
        }
        Ok(cluster)
    }

    async fn start_manager(&mut self, m: &ManagerSpec) -> Result<(), ClusterError> {
        let seat = SeatConfig::new(
            format!("local-{}", std::process::id()),
            Duration::from_millis(m.lease_ttl_ms),
        );
        let manager =
            Manager::start_with(self.meta.clone(), seat, m.admin_listen, m.config.clone())
                .await
                .map_err(|source| ClusterError::Bind {
                    addr: m.admin_listen,
                    source,
                })?;
        self.manager = Some(manager);
        Ok(())
    }

    /// The in-process manager, if the spec asked for one.
    pub fn manager(&self) -> Option<&Manager> {
        self.manager.as_ref()
    }

    /// What other processes take as `--meta`: `keyway://host:port` for the
    /// embedded store, or the external store's URL.
    pub fn meta_url(&self) -> String {
        self.meta_url.clone()
    }

    /// The metadata store, in process.
    pub fn meta(&self) -> &Arc<dyn MetaStore> {
        &self.meta
    }

    /// RESP addresses of the running nodes (None for stopped ones).
    pub fn resp_addrs(&self) -> Vec<Option<String>> {
        self.nodes
            .iter()
            .map(|n| n.as_ref().map(|n| n.resp_addr().to_string()))
            .collect()
    }

    /// The running node at `index`.
    pub fn node(&self, index: usize) -> Option<&Node> {
        self.nodes.get(index).and_then(|n| n.as_ref())
    }

    /// Number of node slots (running or stopped).
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Starts node `index` (again), on the same port and data directory.
    pub async fn start_node(&mut self, index: usize) -> Result<(), ClusterError> {
        self.start_node_on(index, None).await
    }

    /// Starts node `index` (again) on `engine` instead of opening its own
    /// (tests: a `FaultyEngine` whose crash drops what was not synced).
    pub async fn start_node_with_engine(
        &mut self,
        index: usize,
        engine: Arc<dyn Engine>,
    ) -> Result<(), ClusterError> {
        self.start_node_on(index, Some(engine)).await
    }

    async fn start_node_on(
        &mut self,
        index: usize,
        engine: Option<Arc<dyn Engine>>,
    ) -> Result<(), ClusterError> {
        let config = self
            .configs
            .get(index)
            .cloned()
            .ok_or(ClusterError::NoSuchNode(index))?;
        let started = match engine {
            None => Node::start(config, self.meta.clone()).await,
            Some(engine) => {
                let clock = Arc::new(keyway_node::clock::SystemClock);
                Node::start_with_engine(config, self.meta.clone(), clock, engine).await
            }
        };
        let node = started.map_err(|source| ClusterError::Node { index, source })?;
        // Keep the ports the node actually bound so a restart reuses them.
        let bound = &mut self.configs[index];
        if let Ok(addr) = node.resp_addr().parse() {
            bound.listen = addr;
        }
        if let Ok(addr) = node.admin_addr().parse() {
            bound.admin_listen = addr;
        }
        // The replica endpoint (on by default) keeps its port too.
        if let Some(addr) = node.replica_addr().and_then(|a| a.parse().ok()) {
            bound.replica_listen = keyway_node::replica_endpoint::ReplicaListen::At(addr);
        }
        self.nodes[index] = Some(node);
        Ok(())
    }

    /// Stops node `index` gracefully.
    pub async fn stop_node(&mut self, index: usize) -> Result<(), ClusterError> {
        let node = self
            .nodes
            .get_mut(index)
            .ok_or(ClusterError::NoSuchNode(index))?
            .take();
        if let Some(node) = node {
            node.shutdown().await;
        }
        Ok(())
    }

    /// Stops and starts node `index`.
    pub async fn restart_node(&mut self, index: usize) -> Result<(), ClusterError> {
        self.stop_node(index).await?;
        self.start_node(index).await
    }

    /// Waits until every running node holds a lease and the same map version,
    /// and the map covers every slot.
    pub async fn wait_serving(&self, timeout: Duration) -> Result<(), ClusterError> {
        wait_for(timeout, || self.not_serving_reason()).await
    }

    /// The map, or why it cannot be read (as a not-serving reason).
    async fn map_or_why(&self) -> Result<PartitionMap, String> {
        self.meta
            .get_map()
            .await
            .map_err(|e| format!("metadata store: {e}"))
    }

    async fn not_serving_reason(&self) -> Option<String> {
        let map = match self.map_or_why().await {
            Ok(m) => m,
            Err(why) => return Some(why),
        };
        if map.partitions.is_empty() {
            return Some("map not bootstrapped".into());
        }
        for node in self.nodes.iter().flatten() {
            let shared = node.shared();
            if !shared.routing.lease_valid() {
                return Some(format!("node {} has no lease", node.id()));
            }
            if shared.routing.map().version < map.version {
                return Some(format!("node {} has an old map", node.id()));
            }
        }
        None
    }

    /// Waits until every replica of every partition is in its in-sync set
    /// and serves reads: its primary's stream has caught it up and granted
    /// it a read lease at the partition's epoch. A fresh map lists replicas
    /// in sync before their primaries have confirmed them (a primary takes a
    /// replica it has not streamed to out of the set until it catches up),
    /// so the map alone does not say a cluster is replicated; this does.
    pub async fn wait_replicas_serving(&self, timeout: Duration) -> Result<(), ClusterError> {
        wait_for(timeout, || self.not_replicated_reason()).await
    }

    async fn not_replicated_reason(&self) -> Option<String> {
        let map = match self.map_or_why().await {
            Ok(m) => m,
            Err(why) => return Some(why),
        };
        let nodes: BTreeMap<NodeId, &Node> =
            self.nodes.iter().flatten().map(|n| (n.id(), n)).collect();
        let behind = map
            .partitions
            .values()
            .filter(|p| {
                p.replicas.iter().any(|r| {
                    !p.in_sync.contains(r)
                        || !nodes
                            .get(r)
                            .is_some_and(|n| n.shared().routing.replica_read_valid(p.id, p.epoch))
                })
            })
            .count();
        (behind > 0).then(|| format!("{behind} partitions have a replica not serving yet"))
    }

    /// The map as the metadata store holds it.
    pub async fn map(&self) -> Result<PartitionMap, MetaError> {
        self.meta.get_map().await
    }

    /// Node ids in start order (None for a node never started).
    pub fn node_ids(&self) -> Vec<Option<NodeId>> {
        self.nodes
            .iter()
            .map(|n| n.as_ref().map(|n| n.id()))
            .collect()
    }

    /// Stops the manager, every node, then the metadata store.
    pub async fn shutdown(mut self) {
        if let Some(manager) = self.manager.take() {
            manager.shutdown().await;
        }
        for i in 0..self.nodes.len() {
            let _ = self.stop_node(i).await;
        }
        if let Some(stop) = self.meta_stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.meta_task.take() {
            let _ = task.await;
        }
    }
}

type MetaServer = (
    Arc<dyn MetaStore>,
    SocketAddr,
    oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
);

/// Opens the embedded store under `<data>/meta` and serves it over RPC.
async fn serve_embedded(spec: &ClusterSpec) -> Result<MetaServer, ClusterError> {
    let dir = spec.data_dir.join("meta");
    let store =
        tokio::task::spawn_blocking(move || EmbeddedMeta::open(&dir, EmbeddedOptions::default()))
            .await
            .map_err(|e| MetaError::Internal(format!("open task: {e}")))??;
    let meta: Arc<dyn MetaStore> = Arc::new(store);
    let bind_err = |source| ClusterError::Bind {
        addr: spec.meta_listen,
        source,
    };
    let listener = TcpListener::bind(spec.meta_listen)
        .await
        .map_err(bind_err)?;
    let addr = listener.local_addr().map_err(bind_err)?;
    // The nodes' cluster secret guards the metadata RPC too.
    let secret = spec
        .node
        .cluster_secret()
        .map_err(MetaError::InvalidArgument)?;
    let (stop_tx, stop_rx) = oneshot::channel();
    let served = meta.clone();
    let task = tokio::spawn(async move {
        let stop = async move {
            let _ = stop_rx.await;
        };
        if let Err(err) = keyway_meta::serve_with_secret(served, listener, secret, stop).await {
            tracing::error!(%err, "metadata RPC server failed");
        }
    });
    Ok((meta, addr, stop_tx, task))
}

fn node_config(spec: &ClusterSpec, index: usize) -> NodeConfig {
    let port = |first: u16| if first == 0 { 0 } else { first + index as u16 };
    let mut config = spec.node.clone();
    config.data_dir = spec.data_dir.join(format!("node-{}", index + 1));
    config.listen = SocketAddr::new(spec.meta_listen.ip(), port(spec.first_port));
    config.admin_listen = SocketAddr::new(spec.meta_listen.ip(), port(spec.first_admin_port));
    // One `--tls-port` for the cluster: node i takes that port + i.
    config.tls_port = config.tls_port.map(port);
    config
}

/// Polls `why_not` until it reports nothing (`Ok`) or `timeout` passes
/// (`NotServing` with its last reason).
async fn wait_for<F, Fut>(timeout: Duration, mut why_not: F) -> Result<(), ClusterError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match why_not().await {
            None => return Ok(()),
            Some(why) if Instant::now() >= deadline => {
                return Err(ClusterError::NotServing(timeout, why));
            }
            Some(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}
