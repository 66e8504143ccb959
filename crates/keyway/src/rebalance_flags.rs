//! The rebalancer's flags, flattened into the manager's flags (and into
//! `keyway ctl rebalance --plan`, which plans with the same settings).

use keyway_manager::rebalance::{Objective, RebalanceConfig};

#[derive(clap::Args, Clone, Debug)]
pub struct RebalanceFlags {
    /// What to spread over the nodes in proportion to their weights: bytes,
    /// requests (reads + writes per second) or partitions (count).
    #[arg(long, default_value = "bytes", value_parser = parse_objective)]
    pub rebalance_objective: Objective,
    /// A node is balanced within this fraction of its fair share.
    #[arg(long, default_value_t = 0.05)]
    pub rebalance_tolerance: f64,
    /// Live migrations at once, counting every source (operator moves too).
    #[arg(long, default_value_t = 2)]
    pub rebalance_max_moves: usize,
    /// Live migrations per node at once, as source or target.
    #[arg(long, default_value_t = 1)]
    pub rebalance_max_moves_per_node: usize,
    /// A partition moved less than this long ago is not moved again to balance.
    #[arg(long, default_value_t = 600_000)]
    pub rebalance_move_cooldown_ms: u64,
    /// Nothing is rebalanced while a node has been down for less than this.
    #[arg(long, default_value_t = 300_000)]
    pub rebalance_down_grace_ms: u64,
    /// How often the leader plans a round.
    #[arg(long, default_value_t = 5_000)]
    pub rebalance_interval_ms: u64,
    /// Bytes are not balanced while the cluster holds less than this in all.
    #[arg(long, default_value_t = 64 * 1024 * 1024)]
    pub rebalance_min_total_bytes: u64,
    /// Requests are not balanced while the cluster serves fewer per second in all.
    #[arg(long, default_value_t = 1_000.0)]
    pub rebalance_min_total_requests_per_sec: f64,
    /// A replicated partition's primary moves by adding the target as a
    /// replica and switching over; the old primary stays an in-sync replica
    /// this long after the switch, ms (0..=86400000).
    #[arg(long, default_value_t = keyway_manager::replication::pmoves::DEFAULT_FAIL_BACK_WINDOW_MS)]
    pub rebalance_fail_back_window_ms: u64,
    /// Plan and move nothing (node liveness is still kept).
    #[arg(long)]
    pub no_rebalance: bool,
}

fn parse_objective(s: &str) -> Result<Objective, String> {
    s.parse()
}

impl RebalanceFlags {
    /// The rebalancer configuration; invalid settings are refused here.
    pub fn to_config(&self) -> anyhow::Result<RebalanceConfig> {
        let c = RebalanceConfig {
            enabled: !self.no_rebalance,
            objective: self.rebalance_objective,
            tolerance: self.rebalance_tolerance,
            max_moves: self.rebalance_max_moves,
            max_moves_per_node: self.rebalance_max_moves_per_node,
            move_cooldown_ms: self.rebalance_move_cooldown_ms,
            down_grace_ms: self.rebalance_down_grace_ms,
            interval_ms: self.rebalance_interval_ms,
            min_total_bytes: self.rebalance_min_total_bytes,
            min_total_requests_per_sec: self.rebalance_min_total_requests_per_sec,
            fail_back_window_ms: self.rebalance_fail_back_window_ms,
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

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        flags: RebalanceFlags,
    }

    fn parse(args: &[&str]) -> anyhow::Result<RebalanceConfig> {
        let cli = Cli::try_parse_from(std::iter::once("x").chain(args.iter().copied()))?;
        cli.flags.to_config()
    }

    #[test]
    fn defaults_match_the_config_and_flags_set_each_field() {
        assert_eq!(parse(&[]).unwrap(), RebalanceConfig::default());
        let c = parse(&[
            "--rebalance-objective",
            "requests",
            "--rebalance-tolerance",
            "0.1",
            "--rebalance-max-moves",
            "4",
            "--rebalance-max-moves-per-node",
            "2",
            "--rebalance-move-cooldown-ms",
            "1000",
            "--rebalance-down-grace-ms",
            "2000",
            "--rebalance-interval-ms",
            "300",
            "--rebalance-min-total-bytes",
            "1000",
            "--rebalance-min-total-requests-per-sec",
            "5",
            "--rebalance-fail-back-window-ms",
            "700",
            "--no-rebalance",
        ])
        .unwrap();
        let want = RebalanceConfig {
            enabled: false,
            objective: Objective::Requests,
            tolerance: 0.1,
            max_moves: 4,
            max_moves_per_node: 2,
            move_cooldown_ms: 1000,
            down_grace_ms: 2000,
            interval_ms: 300,
            min_total_bytes: 1000,
            min_total_requests_per_sec: 5.0,
            fail_back_window_ms: 700,
        };
        assert_eq!(c, want);
    }

    #[test]
    fn bad_settings_are_refused() {
        assert!(parse(&["--rebalance-objective", "keys"]).is_err());
        assert!(parse(&["--rebalance-tolerance", "0"]).is_err());
        assert!(parse(&["--rebalance-max-moves", "0"]).is_err());
    }
}
