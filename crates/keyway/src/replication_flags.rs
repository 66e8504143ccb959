//! The manager's replication flags (failover and replica membership),
//! shared by `keyway manager` and `keyway dev`.

use keyway_manager::ReplicationConfig;

#[derive(clap::Args, Clone, Debug)]
pub struct ReplicationFlags {
    /// Do not fail over: a primary whose lease is gone keeps its partitions
    /// (they stay unavailable until it is back).
    #[arg(long)]
    pub no_failover: bool,
    /// How long a primary's lease must have been gone from the metadata
    /// store before an in-sync replica is promoted, ms (1-60000). The node
    /// itself stopped serving `lease_margin_ms` before the store expired its
    /// lease; this covers clock-rate differences on top (default: the
    /// nodes' default lease margin).
    #[arg(long, default_value_t = ReplicationConfig::default().failover_margin_ms)]
    pub failover_margin_ms: u64,
    /// Do not add or remove replicas to keep each partition at its
    /// keyspace's replication factor.
    #[arg(long)]
    pub no_replica_reconcile: bool,
    /// How often the leader checks primaries' leases and copy counts, ms (1-60000).
    #[arg(long, default_value_t = ReplicationConfig::default().interval_ms)]
    pub replication_interval_ms: u64,
    /// Abandon a replica move (`keyway ctl move P --replica X --to Y`, or the
    /// rebalancer's) whose target is not in sync this long after it was
    /// requested: the target is removed again, the source kept, ms
    /// (1-86400000).
    #[arg(long, default_value_t = ReplicationConfig::default().replica_move_timeout_ms)]
    pub replica_move_timeout_ms: u64,
    /// Re-replication (a replica on a node down past
    /// --rebalance-down-grace-ms is replaced): the most replacement copies
    /// in flight (replicas not yet in sync) one target node may have, so
    /// recovery spreads over the survivors and does not starve foreground
    /// traffic (1-1024).
    #[arg(long, default_value_t = ReplicationConfig::default().recovery_max_copies_per_node)]
    pub recovery_max_copies_per_node: usize,
    /// Re-replication: the most replacement copies in flight over the whole
    /// cluster (1-1024).
    #[arg(long, default_value_t = ReplicationConfig::default().recovery_max_copies)]
    pub recovery_max_copies: usize,
    /// Decommission a node automatically once it has held no lease this
    /// long and owns and holds nothing (its copies re-replicated
    /// elsewhere), as `keyway ctl decommission --force` would, ms
    /// (0 = never, the default; at most 604800000).
    #[arg(long, default_value_t = ReplicationConfig::default().auto_decommission_after_ms)]
    pub auto_decommission_after_ms: u64,
}

impl ReplicationFlags {
    /// The replication configuration; invalid settings are refused here, at start.
    pub fn to_config(&self) -> anyhow::Result<ReplicationConfig> {
        let c = ReplicationConfig {
            failover: !self.no_failover,
            failover_margin_ms: self.failover_margin_ms,
            reconcile: !self.no_replica_reconcile,
            interval_ms: self.replication_interval_ms,
            replica_move_timeout_ms: self.replica_move_timeout_ms,
            recovery_max_copies_per_node: self.recovery_max_copies_per_node,
            recovery_max_copies: self.recovery_max_copies,
            auto_decommission_after_ms: self.auto_decommission_after_ms,
            ..ReplicationConfig::default()
        };
        c.validate()
            .map_err(|e| crate::cli_error::UserError(e.to_string()))?;
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        flags: ReplicationFlags,
    }

    fn parse(args: &[&str]) -> anyhow::Result<ReplicationConfig> {
        let mut argv = vec!["t"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv)?.flags.to_config()
    }

    #[test]
    fn defaults_and_bad_margins() {
        assert_eq!(parse(&[]).unwrap(), ReplicationConfig::default());
        let c = parse(&["--failover-margin-ms", "250", "--no-failover"]).unwrap();
        assert_eq!((c.failover, c.failover_margin_ms), (false, 250));
        let err = parse(&["--failover-margin-ms", "0"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("failover_margin_ms"), "{err}");
        let err = parse(&["--replication-interval-ms", "0"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("replication_interval_ms"), "{err}");
        let err = parse(&["--replica-move-timeout-ms", "0"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("replica_move_timeout_ms"), "{err}");
        let err = parse(&["--recovery-max-copies-per-node", "0"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("recovery_max_copies_per_node"), "{err}");
        let err = parse(&["--recovery-max-copies", "5000"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("recovery_max_copies"), "{err}");
    }
}
