//! The load monitor's flags (`keyway manager`, `keyway dev`).

use keyway_manager::MonitorConfig;

#[derive(clap::Args, Clone, Debug)]
pub struct MonitorFlags {
    /// How often the leading manager gathers every node's partition load
    /// statistics (the splitter, merger and rebalancer decide from the latest).
    #[arg(long, default_value_t = 5_000)]
    pub stats_interval_ms: u64,
    /// Deadline of one node's answer to that round (at most the interval).
    #[arg(long, default_value_t = 2_000)]
    pub stats_timeout_ms: u64,
}

impl MonitorFlags {
    /// The monitor configuration; invalid settings are refused here, at start.
    pub fn to_config(&self) -> anyhow::Result<MonitorConfig> {
        let c = MonitorConfig {
            stats_interval_ms: self.stats_interval_ms,
            stats_timeout_ms: self.stats_timeout_ms,
        };
        c.validate()
            .map_err(|e| crate::cli_error::UserError(e.to_string()))?;
        Ok(c)
    }
}
