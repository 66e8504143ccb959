//! The manager's flags, shared by `keyway manager` and `keyway dev`: one
//! flattened group per duty (migrations here; each later duty adds its own).

use keyway_manager::{DriverConfig, ManagerConfig};

#[derive(clap::Args, Clone, Debug)]
pub struct ManagerFlags {
    #[command(flatten)]
    pub migration: MigrationFlags,
    #[command(flatten)]
    pub monitor: crate::monitor_flags::MonitorFlags,
    #[command(flatten)]
    pub split: crate::split_flags::SplitFlags,
    #[command(flatten)]
    pub rebalance: crate::rebalance_flags::RebalanceFlags,
    #[command(flatten)]
    pub replication: crate::replication_flags::ReplicationFlags,
    /// Dashboard (`/ui`): skew samples kept for its sparkline, one per load
    /// round, the oldest dropped first (1-100000).
    #[arg(long, default_value_t = keyway_manager::ui::UiConfig::default().skew_history_samples)]
    pub ui_skew_history_samples: usize,
}

impl ManagerFlags {
    /// The manager configuration; invalid settings are refused here, at start.
    pub fn to_config(&self) -> anyhow::Result<ManagerConfig> {
        let config = ManagerConfig {
            driver: self.migration.to_config()?,
            monitor: self.monitor.to_config()?,
            split: self.split.split_config()?,
            merge: self.split.merge_config()?,
            rebalance: self.rebalance.to_config()?,
            replication: self.replication.to_config()?,
            ui: keyway_manager::ui::UiConfig {
                skew_history_samples: self.ui_skew_history_samples,
            },
            // The admin listener's security: `keyway manager` and `keyway dev`
            // set it from their secret and admin flags.
            admin: keyway_auth::AdminSecurity::default(),
        };
        config
            .validate()
            .map_err(|e| crate::cli_error::UserError(e.to_string()))?;
        Ok(config)
    }
}

#[derive(clap::Args, Clone, Debug)]
pub struct MigrationFlags {
    /// Snapshot copy cap per migration, bytes per second (0 = unlimited).
    #[arg(long, default_value_t = 64 * 1024 * 1024)]
    pub migration_max_bytes_per_sec: u64,
    /// The copy backs off while the slowest recent reply (last 100-200 ms) on
    /// the source or the target took longer than this, microseconds (0 = never).
    #[arg(long, default_value_t = 50_000)]
    pub migration_backoff_latency_us: u64,
    /// CATCHUP → DUAL once the target is within this many change records.
    #[arg(long, default_value_t = 1_000)]
    pub migration_catchup_lag_threshold: u64,
    /// A migration making no progress for this long before the flip aborts.
    #[arg(long, default_value_t = 60_000)]
    pub migration_stuck_timeout_ms: u64,
    /// The longest the source may stay fenced before the flip (bounds the write pause).
    #[arg(long, default_value_t = 5_000)]
    pub migration_fence_timeout_ms: u64,
    /// How long the source keeps a moved range before dropping it.
    #[arg(long, default_value_t = 30_000)]
    pub migration_cleanup_grace_ms: u64,
    /// Attempts (1-16, backing off from 1 s, doubling) at dropping a copy a
    /// migration leaves on a node that fails (the old source after the flip,
    /// the target after an abort) before the migration ends anyway and the
    /// copy is dropped when the node is back (see --migration-stray-retry-ms).
    #[arg(long, default_value_t = 5)]
    pub migration_cleanup_attempts: u32,
    /// How often a copy left behind on an unreachable node is tried again.
    #[arg(long, default_value_t = 30_000)]
    pub migration_stray_retry_ms: u64,
}

impl MigrationFlags {
    /// The driver configuration; invalid combinations are refused here, at start.
    pub fn to_config(&self) -> anyhow::Result<DriverConfig> {
        let mut c = DriverConfig::default();
        c.throttle.max_bytes_per_sec = self.migration_max_bytes_per_sec;
        c.throttle.backoff_latency_us = self.migration_backoff_latency_us;
        c.migration.catchup_lag_threshold = self.migration_catchup_lag_threshold;
        c.migration.stuck_timeout_ms = self.migration_stuck_timeout_ms;
        c.migration.fence_timeout_ms = self.migration_fence_timeout_ms;
        c.migration.cleanup_grace_ms = self.migration_cleanup_grace_ms;
        c.migration.cleanup_attempts = self.migration_cleanup_attempts;
        c.stray_retry_interval_ms = self.migration_stray_retry_ms;
        c.validate()?;
        Ok(c)
    }
}
