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
    #[command(flatten)]
    replication: BootstrapReplication,
    /// Recent map versions kept for delta watches.
    #[arg(long, default_value_t = 4096)]
    history_versions: usize,
    /// With it, every RPC call needs the cluster secret.
    #[command(flatten)]
    secret: crate::secret_flags::SecretFlag,
}

pub async fn run(args: MetaArgs) -> anyhow::Result<()> {
    user_ensure!(
        args.bootstrap_nodes > 0,
        "--bootstrap-nodes must be greater than 0"
    );
    user_ensure!(
        args.partitions_per_node > 0,
        "--partitions-per-node must be greater than 0"
    );
    user_ensure!(
        args.history_versions > 0,
        "--history-versions must be greater than 0"
    );
    let replication = args.replication.to_replication()?;
    let secret = args.secret.load()?;
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
        replication,
    ));
    keyway_meta::serve_with_secret(store, listener, secret, crate::shutdown_signal()).await?;
    bootstrapper.abort();
    Ok(())
}

/// Creates the initial map once `nodes` nodes have registered, unless a map
/// exists already. Retries until done; safe to run in several processes.
pub async fn bootstrap_when_ready(
    store: Arc<dyn MetaStore>,
    nodes: usize,
    partitions_per_node: u16,
    replication: keyway_meta::Replication,
) {
    loop {
        match store
            .bootstrap_if_empty_with(nodes, partitions_per_node, replication)
            .await
        {
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

/// `--replication-factor` / `--min-in-sync` of keyspace 0 at bootstrap
/// (`keyway meta`, `keyway dev`).
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct BootstrapReplication {
    /// Copies of each partition of keyspace 0 in the initial map (the
    /// primary and N-1 replicas on distinct nodes, distinct zones first),
    /// 1-5, capped at the node count.
    #[arg(long, default_value_t = 1)]
    pub replication_factor: u8,
    /// In-sync copies (primary included) a write to keyspace 0 needs,
    /// 1..=factor; below it writes get -NOREPLICAS.
    #[arg(long, default_value_t = 1)]
    pub min_in_sync: u8,
}

impl BootstrapReplication {
    /// The checked pair.
    pub fn to_replication(self) -> anyhow::Result<keyway_meta::Replication> {
        keyway_map::check_replication(self.replication_factor, self.min_in_sync).map_err(|e| {
            crate::cli_error::UserError(format!("--replication-factor / --min-in-sync: {e}"))
        })?;
        Ok(keyway_meta::Replication {
            factor: self.replication_factor,
            min_in_sync: self.min_in_sync,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: MetaArgs,
    }

    fn replication(argv: &[&str]) -> anyhow::Result<keyway_meta::Replication> {
        let mut all = vec!["meta"];
        all.extend_from_slice(argv);
        Cli::try_parse_from(all)?.args.replication.to_replication()
    }

    #[test]
    fn replication_flags_are_checked_as_a_pair() {
        let r = replication(&[]).unwrap();
        assert_eq!((r.factor, r.min_in_sync), (1, 1));
        let r = replication(&["--replication-factor", "3", "--min-in-sync", "2"]).unwrap();
        assert_eq!((r.factor, r.min_in_sync), (3, 2));
        for bad in [
            &["--replication-factor", "0"][..],
            &["--replication-factor", "6"],
            &["--replication-factor", "2", "--min-in-sync", "3"],
            &["--min-in-sync", "0"],
        ] {
            let err = replication(bad).unwrap_err().to_string();
            assert!(
                err.contains("--replication-factor / --min-in-sync"),
                "{bad:?}: {err}"
            );
        }
        assert!(
            replication(&["--replication-factor", "300"]).is_err(),
            "not a u8"
        );
    }
}
