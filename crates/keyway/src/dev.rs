//! `keyway dev`: a whole cluster in one process.

use crate::manager_flags::ManagerFlags;
use crate::server_cmd::NodeFlags;
use keyway_cluster::{ClusterSpec, LocalCluster, ManagerSpec};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args)]
pub struct DevArgs {
    /// Number of nodes.
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// RESP port of the first node; node i listens on PORT+i-1.
    #[arg(long, default_value_t = 7001)]
    port: u16,
    /// Admin HTTP port of the first node (`/metrics`, `/map`, `/status`); 0 picks free ports.
    #[arg(long, default_value_t = 8001)]
    admin_port: u16,
    /// Metadata store RPC port (the `--meta keyway://HOST:PORT` other processes use).
    #[arg(long, default_value_t = 7000)]
    meta_port: u16,
    /// Use an existing metadata store instead of the embedded one, e.g.
    /// `etcd://127.0.0.1:2379,127.0.0.1:22379/keyway/dev` or `keyway://HOST:PORT`.
    #[arg(long, env = "KEYWAY_META")]
    meta: Option<String>,
    /// Address every listener binds.
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// Data directory: `meta/` and `node-<i>/` live below it; a restart finds its data there.
    #[arg(long, default_value = "./keyway-data")]
    data: PathBuf,
    /// Partitions per node when the cluster is first created.
    #[arg(long, default_value_t = 4)]
    partitions_per_node: u16,
    /// Copies of each partition of keyspace 0 when the cluster is first
    /// created (1-5, capped at --nodes): the primary and N-1 replicas.
    #[arg(long, default_value_t = 2)]
    replication_factor: u8,
    /// In-sync copies (primary included) a write needs, 1..=factor.
    #[arg(long, default_value_t = 1)]
    min_in_sync: u8,
    /// Do not run the in-process manager (no migrations are driven).
    #[arg(long)]
    no_manager: bool,
    /// Admin HTTP port of the in-process manager (`/status`, `/metrics`, `/migrations`); 0 picks a free port.
    #[arg(long, default_value_t = 8000)]
    manager_admin_port: u16,
    /// Run without a cluster secret (by default, unless --cluster-secret-file
    /// names one, `keyway dev` creates a random one in `<data>/cluster-secret`
    /// and guards every admin port and the metadata RPC with it).
    #[arg(long, conflicts_with = "cluster_secret_file")]
    no_cluster_secret: bool,
    #[command(flatten)]
    node: NodeFlags,
    #[command(flatten)]
    manager: ManagerFlags,
}

/// How long `keyway dev` waits, before it reports the cluster up, for every
/// replica to be caught up and serving reads (a fresh cluster takes well
/// under a second; a restart over much data may take longer, and then the
/// cluster is reported up with the replicas still catching up).
const DEV_REPLICAS_WAIT: Duration = Duration::from_secs(30);

/// Executor threads per node when `nodes` nodes share `cores` cores in one
/// process and nothing chose the count: the cores divided among the nodes,
/// at least one, at most the node default. More storage threads than cores
/// only adds hand-offs: on 2 cores a 3-node cluster served about 8% more
/// SETs and 10% more GETs with one thread per node than with two
/// (`bench/redis-compare.sh -P 16`, issue 15).
fn shared_executor_threads(nodes: usize, cores: usize, default: usize) -> usize {
    (cores / nodes.max(1)).clamp(1, default.max(1))
}

/// A node's block cache when `nodes` nodes share one process and nothing
/// chose its size: the machine's default divided among them, at least
/// fjall's smallest useful cache. One `keyway dev` then takes about as much
/// memory for caches as one `keyway server` would.
fn shared_storage_cache_bytes(nodes: usize, default_bytes: u64) -> u64 {
    (default_bytes / nodes.max(1) as u64).max(keyway_node::MIN_STORAGE_CACHE_BYTES)
}

pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    let mut node = args.node.to_config()?;
    if node.cluster_secret_file.is_none() && !args.no_cluster_secret {
        node.cluster_secret_file = Some(dev_secret_file(&args.data)?);
    }
    let secret = crate::secret_flags::load_and_install(node.cluster_secret_file.as_deref())?;
    let spec = ClusterSpec {
        nodes: args.nodes,
        first_port: args.port,
        first_admin_port: args.admin_port,
        meta_listen: SocketAddr::new(args.host, args.meta_port),
        external_meta: args.meta.clone(),
        data_dir: args.data.clone(),
        partitions_per_node: args.partitions_per_node,
        replication: crate::meta_cmd::BootstrapReplication {
            replication_factor: args.replication_factor,
            min_in_sync: args.min_in_sync,
        }
        .to_replication()?,
        node: {
            if !args.node.executor_threads_chosen() {
                node.executor_threads = shared_executor_threads(
                    args.nodes,
                    std::thread::available_parallelism().map_or(1, |n| n.get()),
                    node.executor_threads,
                );
            }
            if !args.node.storage_cache_chosen() {
                node.storage_cache_bytes =
                    shared_storage_cache_bytes(args.nodes, node.storage_cache_bytes);
            }
            node
        },
        manager: (!args.no_manager)
            .then(|| -> anyhow::Result<ManagerSpec> {
                let mut config = args.manager.to_config()?;
                config.admin = keyway_auth::AdminSecurity {
                    secret: secret.clone(),
                    limits: args.node.admin.limits(keyway_auth::AdminLimits::default()),
                    allow_unauthenticated: args.node.admin.admin_allow_unauthenticated,
                };
                Ok(ManagerSpec {
                    admin_listen: SocketAddr::new(args.host, args.manager_admin_port),
                    config,
                    ..ManagerSpec::default()
                })
            })
            .transpose()?,
    };
    let cluster_secret_file = spec.node.cluster_secret_file.clone();
    let cluster = LocalCluster::start(spec).await?;
    // Clients read the layout once (redis-py never again unless redirected),
    // so "up" waits for the replicas to serve: a layout read earlier would
    // list none, or list some that then drop out while they catch up.
    if let Err(e) = cluster.wait_replicas_serving(DEV_REPLICAS_WAIT).await {
        eprintln!(
            "keyway dev: replicas are still catching up ({e}); clients that read the \
             layout now will not read from them until they refresh it"
        );
    }
    let map = cluster.map().await?;
    println!(
        "Keyway dev cluster is up: {} nodes, {} partitions, replication factor {}, map version {}",
        cluster.len(),
        map.partitions.len(),
        map.keyspaces
            .get(&keyway_map::DEFAULT_KEYSPACE)
            .map_or(1, |k| k.replication_factor),
        map.version
    );
    println!("  metadata store   --meta {}", cluster.meta_url());
    match &cluster_secret_file {
        Some(path) => println!(
            "  cluster secret   --cluster-secret-file {}   (admin HTTP: curl -H \"Authorization: Bearer $(cat {})\")",
            path.display(),
            path.display()
        ),
        None => println!("  cluster secret   none (--no-cluster-secret): the admin ports are open"),
    }
    for i in 0..cluster.len() {
        if let Some(node) = cluster.node(i) {
            println!(
                "  node {}  redis://{}  replica endpoint redis://{}  admin http://{}",
                node.id(),
                node.resp_addr(),
                node.replica_addr().unwrap_or("(off)"),
                node.admin_addr()
            );
        }
    }
    if let Some(m) = cluster.manager() {
        println!("  manager          admin http://{}", m.admin_addr());
    }
    println!("  data             {}", args.data.display());
    if let Some(Some(first)) = cluster.resp_addrs().first() {
        let port = first.rsplit_once(':').map(|(_, p)| p).unwrap_or("7001");
        println!(
            "Try:  redis-cli -c -p {port} set hello world   then   redis-cli -c -p {port} get hello"
        );
    }
    println!("Ctrl-C stops the cluster; starting it again with the same --data finds the data.");
    // A client's SHUTDOWN to any node stops the whole dev cluster (it is
    // one process).
    let (requested, mut shutdown_rx) = tokio::sync::mpsc::channel::<()>(1);
    for shared in (0..cluster.len()).filter_map(|i| cluster.node(i).map(|n| n.shared().clone())) {
        let requested = requested.clone();
        tokio::spawn(async move {
            shared.server.shutdown_requested().await;
            let _ = requested.send(()).await;
        });
    }
    tokio::select! {
        _ = crate::shutdown_signal() => {}
        Some(()) = shutdown_rx.recv() => println!("SHUTDOWN requested by a client"),
    }
    println!("stopping...");
    cluster.shutdown().await;
    println!("stopped");
    Ok(())
}

/// `<data>/cluster-secret`, created with a random secret (mode 0600) if it
/// does not exist yet; a restart with the same `--data` reuses it.
fn dev_secret_file(data: &std::path::Path) -> anyhow::Result<PathBuf> {
    use std::io::Write;
    let path = data.join("cluster-secret");
    if path.exists() {
        return Ok(path);
    }
    std::fs::create_dir_all(data).map_err(|e| {
        crate::cli_error::UserError(format!("cannot create {}: {e}", data.display()))
    })?;
    let secret: String = rand::random::<[u8; 32]>()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(&path).map_err(|e| {
        crate::cli_error::UserError(format!("cannot create {}: {e}", path.display()))
    })?;
    writeln!(file, "{secret}")?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::{shared_executor_threads, shared_storage_cache_bytes};

    #[test]
    fn executor_threads_share_the_cores() {
        // 3 nodes on 2 cores: one each, not the default two.
        assert_eq!(shared_executor_threads(3, 2, 2), 1);
        // Cores to spare: never above the default.
        assert_eq!(shared_executor_threads(3, 64, 2), 2);
        assert_eq!(shared_executor_threads(2, 4, 2), 2);
        // One node on one core, or more nodes than cores: at least one.
        assert_eq!(shared_executor_threads(1, 1, 2), 1);
        assert_eq!(shared_executor_threads(8, 2, 2), 1);
        assert_eq!(shared_executor_threads(0, 2, 2), 2);
    }

    #[test]
    fn the_block_cache_is_shared_among_the_nodes() {
        const MIB: u64 = 1024 * 1024;
        assert_eq!(shared_storage_cache_bytes(3, 768 * MIB), 256 * MIB);
        assert_eq!(shared_storage_cache_bytes(1, 768 * MIB), 768 * MIB);
        // Never below the smallest cache a node accepts.
        assert_eq!(shared_storage_cache_bytes(8, 2 * MIB), MIB);
        assert_eq!(shared_storage_cache_bytes(0, 16 * MIB), 16 * MIB);
    }
}
