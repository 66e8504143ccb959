//! `keyway proxy`: the routing tier for Redis clients without cluster support.

use keyway_proxy::{Proxy, ProxyConfig};
use std::net::SocketAddr;

#[derive(clap::Args)]
pub struct ProxyArgs {
    /// Metadata store URL: keyway://HOST:PORT (a `keyway meta` or `keyway dev`),
    /// etcd://HOST:PORT[,HOST:PORT...]/PREFIX or file:///DIR.
    #[arg(long, env = "KEYWAY_META")]
    meta: String,
    /// RESP listen address clients connect to.
    #[arg(long, default_value = "127.0.0.1:7100")]
    listen: SocketAddr,
    /// Admin HTTP listen address (`/metrics`, `/status`).
    #[arg(long, default_value = "127.0.0.1:8100")]
    admin_listen: SocketAddr,
    /// Most client connections (more are refused, as Redis's maxclients).
    #[arg(long, default_value_t = 10_000)]
    max_clients: usize,
    /// Most requests of one client connection in flight at once.
    #[arg(long, default_value_t = 128)]
    max_pipeline: usize,
    /// Deadline of one client request, every retry included.
    #[arg(long, default_value_t = 5_000)]
    request_timeout_ms: u64,
    /// Pipelined connections to each node.
    #[arg(long, default_value_t = 2)]
    node_connections: usize,
    /// Most requests queued or in flight on one node connection.
    #[arg(long, default_value_t = 4_096)]
    max_node_inflight: usize,
    /// Deadline of opening a node connection.
    #[arg(long, default_value_t = 1_000)]
    connect_timeout_ms: u64,
    /// On shutdown, how long in-flight requests may take to finish.
    #[arg(long, default_value_t = 5_000)]
    drain_timeout_ms: u64,
    /// Largest bulk string a request may carry (Redis proto-max-bulk-len).
    #[arg(long, default_value_t = keyway_resp::DEFAULT_MAX_BULK_LEN_BYTES)]
    max_bulk_len_bytes: usize,
    /// Most arguments in one request.
    #[arg(long, default_value_t = keyway_resp::DEFAULT_MAX_MULTIBULK_LEN)]
    max_multibulk_len: usize,
    /// Longest inline request.
    #[arg(long, default_value_t = keyway_resp::DEFAULT_MAX_INLINE_LEN_BYTES)]
    max_inline_len_bytes: usize,
    /// Password clients must send (AUTH / HELLO AUTH).
    #[arg(long, env = "KEYWAY_PROXY_REQUIREPASS")]
    requirepass: Option<String>,
    /// Password of the nodes (their --requirepass).
    #[arg(long, env = "KEYWAY_REQUIREPASS")]
    node_password: Option<String>,
    /// The cluster secret and the admin listener's limits.
    #[command(flatten)]
    admin: crate::secret_flags::AdminFlags,
    /// Client TLS and protected mode.
    #[command(flatten)]
    tls: crate::tls_flags::TlsFlags,
    /// ACL: how often the metadata store's ACL users are read and applied.
    #[arg(long, default_value_t = 1_000)]
    acl_poll_interval_ms: u64,
}

impl ProxyArgs {
    fn to_config(&self) -> anyhow::Result<ProxyConfig> {
        let mut config = ProxyConfig {
            listen: self.listen,
            admin_listen: self.admin_listen,
            max_clients: self.max_clients,
            max_pipeline: self.max_pipeline,
            request_timeout_ms: self.request_timeout_ms,
            node_connections: self.node_connections,
            max_node_inflight: self.max_node_inflight,
            connect_timeout_ms: self.connect_timeout_ms,
            drain_timeout_ms: self.drain_timeout_ms,
            max_bulk_len_bytes: self.max_bulk_len_bytes,
            max_multibulk_len: self.max_multibulk_len,
            max_inline_len_bytes: self.max_inline_len_bytes,
            requirepass: self.requirepass.clone(),
            node_password: self.node_password.clone(),
            admin: self.admin.to_security()?,
            acl_poll_interval_ms: self.acl_poll_interval_ms,
            ..ProxyConfig::default()
        };
        self.tls.apply_to_proxy(&mut config);
        config
            .validate()
            .map_err(|e| crate::cli_error::UserError(format!("invalid configuration: {e}")))?;
        Ok(config)
    }
}

pub async fn run(args: ProxyArgs) -> anyhow::Result<()> {
    let config = args.to_config()?;
    let meta = keyway_meta::connect(&args.meta).await?;
    // Ready only once the first map is in; Ctrl-C meanwhile just exits.
    let proxy = tokio::select! {
        p = Proxy::start(config, meta) => p?,
        _ = crate::shutdown_signal() => return Ok(()),
    };
    let status = proxy.status();
    println!(
        "keyway proxy serving redis://{} (admin http://{}; map version {}, {} partitions on {} nodes)",
        proxy.resp_addr(),
        proxy.admin_addr(),
        status.map_version,
        status.partitions,
        status.nodes
    );
    if let Some(tls) = proxy.tls_addr() {
        println!("keyway proxy serving rediss://{tls} (TLS)");
    }
    crate::shutdown_signal().await;
    proxy.shutdown().await;
    Ok(())
}
