//! `keyway meta`: the embedded metadata store as its own process.

use keyway_meta::{EmbeddedMeta, EmbeddedOptions, MetaStore};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(clap::Args)]
pub struct MetaArgs {
    /// RPC listen address; nodes and tools reach it as keyway://ADDR.
    #[arg(long, default_value = "127.0.0.1:7000")]
    listen: SocketAddr,
    /// Directory for the store's durable state.
    #[arg(long, default_value = "./keyway-data/meta")]
    data: PathBuf,
    /// Create the initial map once this many nodes have registered (if the store is new).
    #[arg(long, default_value_t = 3)]
    bootstrap_nodes: usize,
    /// Partitions per node in the initial map.
    #[arg(long, default_value_t = 4)]
    partitions_per_node: u16,
    /// Recent map versions kept for delta watches.
    #[arg(long, default_value_t = 4096)]
    history_versions: usize,
}

pub async fn run(args: MetaArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.bootstrap_nodes > 0,
        "--bootstrap-nodes must be greater than 0"
    );
    anyhow::ensure!(
        args.partitions_per_node > 0,
        "--partitions-per-node must be greater than 0"
    );
    anyhow::ensure!(
        args.history_versions > 0,
        "--history-versions must be greater than 0"
    );
    let store: Arc<dyn MetaStore> = Arc::new(EmbeddedMeta::open(
        &args.data,
        EmbeddedOptions {
            history_versions: args.history_versions,
            ..EmbeddedOptions::default()
        },
    )?);
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    println!(
        "keyway meta listening: --meta keyway://{}",
        listener.local_addr()?
    );
    let bootstrapper = tokio::spawn(bootstrap_when_ready(
        store.clone(),
        args.bootstrap_nodes,
        args.partitions_per_node,
    ));
    keyway_meta::serve(store, listener, crate::shutdown_signal()).await?;
    bootstrapper.abort();
    Ok(())
}

/// Creates the initial map once `nodes` nodes have registered, unless a map
/// exists already. Retries until done; safe to run in several processes.
pub async fn bootstrap_when_ready(
    store: Arc<dyn MetaStore>,
    nodes: usize,
    partitions_per_node: u16,
) {
    loop {
        match store.bootstrap_if_empty(nodes, partitions_per_node).await {
            Ok(true) => {
                tracing::info!(nodes, "bootstrapped the partition map");
                return;
            }
            Ok(false) => {
                if store
                    .get_map()
                    .await
                    .is_ok_and(|m| !m.partitions.is_empty())
                {
                    return;
                }
            }
            Err(err) => tracing::warn!(%err, "bootstrap check failed"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
