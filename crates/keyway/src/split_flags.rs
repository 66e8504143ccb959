//! The manager's split and merge flags (flattened into `ManagerFlags`, so
//! `keyway manager` and `keyway dev` both take them). Defaults are
//! [`SplitConfig::default`] and [`MergeConfig::default`].

use keyway_manager::{MergeConfig, SplitConfig};

#[derive(clap::Args, Clone, Debug)]
pub struct SplitFlags {
    /// Split a partition holding more payload bytes than this, at its middle by bytes.
    #[arg(long, default_value_t = SplitConfig::default().split_max_bytes)]
    pub split_max_bytes: u64,
    /// Split a partition above this many requests/s (reads + writes) for the whole window...
    #[arg(long, default_value_t = SplitConfig::default().split_max_requests_per_sec)]
    pub split_max_requests_per_sec: f64,
    /// ... this long, at the key that halves its sampled load.
    #[arg(long, default_value_t = SplitConfig::default().split_load_window_ms)]
    pub split_load_window_ms: u64,
    /// Never split for load when one key carries more than this share (0..1] of the requests.
    #[arg(long, default_value_t = SplitConfig::default().split_single_key_share)]
    pub split_single_key_share: f64,
    /// A partition born by a split or merge is not split again for this long.
    #[arg(long, default_value_t = SplitConfig::default().split_cooldown_ms)]
    pub split_cooldown_ms: u64,
    /// Never split automatically (`keyway ctl split` still works).
    #[arg(long)]
    pub no_auto_split: bool,
    /// Merge two neighbours only if each stays below this many requests/s...
    #[arg(long, default_value_t = MergeConfig::default().merge_max_requests_per_sec)]
    pub merge_max_requests_per_sec: f64,
    /// ... for this long.
    #[arg(long, default_value_t = MergeConfig::default().merge_cold_window_ms)]
    pub merge_cold_window_ms: u64,
    /// Merge two neighbours only if their payload bytes together stay below this.
    #[arg(long, default_value_t = MergeConfig::default().merge_max_bytes)]
    pub merge_max_bytes: u64,
    /// Never merge a partition born by a split less than this long ago.
    #[arg(long, default_value_t = MergeConfig::default().merge_after_split_cooldown_ms)]
    pub merge_after_split_cooldown_ms: u64,
    /// Never merge a keyspace below this many partitions per Up node.
    #[arg(long, default_value_t = MergeConfig::default().merge_min_partitions_per_node)]
    pub merge_min_partitions_per_node: u32,
    /// Never merge automatically (`keyway ctl merge` still works).
    #[arg(long)]
    pub no_auto_merge: bool,
}

impl SplitFlags {
    /// The split configuration; invalid settings are refused here, at start.
    pub fn split_config(&self) -> anyhow::Result<SplitConfig> {
        let split = SplitConfig {
            enabled: !self.no_auto_split,
            split_max_bytes: self.split_max_bytes,
            split_max_requests_per_sec: self.split_max_requests_per_sec,
            split_load_window_ms: self.split_load_window_ms,
            split_single_key_share: self.split_single_key_share,
            split_cooldown_ms: self.split_cooldown_ms,
        };
        split
            .validate()
            .map_err(|e| crate::cli_error::UserError(e.to_string()))?;
        Ok(split)
    }

    /// The merge configuration (checked against the split thresholds by
    /// `ManagerConfig::validate`).
    pub fn merge_config(&self) -> anyhow::Result<MergeConfig> {
        let merge = MergeConfig {
            enabled: !self.no_auto_merge,
            merge_max_requests_per_sec: self.merge_max_requests_per_sec,
            merge_cold_window_ms: self.merge_cold_window_ms,
            merge_max_bytes: self.merge_max_bytes,
            merge_after_split_cooldown_ms: self.merge_after_split_cooldown_ms,
            merge_min_partitions_per_node: self.merge_min_partitions_per_node,
        };
        merge
            .validate()
            .map_err(|e| crate::cli_error::UserError(e.to_string()))?;
        Ok(merge)
    }
}
