//! The rebalancer's settings ([`RebalanceConfig`]) and what it balances
//! ([`Objective`]).

use crate::stats::PartitionLoad;
use serde::Serialize;
use std::fmt;
use std::str::FromStr;

/// What the rebalancer spreads over the nodes in proportion to their
/// weights.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Objective {
    /// Payload bytes (key + value) per partition, from the owners' size scans.
    #[default]
    Bytes,
    /// Reads plus writes per second per partition.
    Requests,
    /// One per partition: the partition count.
    Partitions,
}

impl Objective {
    pub const ALL: [Objective; 3] = [Objective::Bytes, Objective::Requests, Objective::Partitions];

    pub fn name(self) -> &'static str {
        match self {
            Objective::Bytes => "bytes",
            Objective::Requests => "requests",
            Objective::Partitions => "partitions",
        }
    }

    /// Whether the objective needs the nodes' load reports (`partitions` does not).
    pub fn needs_load(self) -> bool {
        self != Objective::Partitions
    }

    /// One partition's weight under this objective (`None`: no report).
    pub fn of(self, load: Option<&PartitionLoad>) -> Option<f64> {
        match self {
            Objective::Partitions => Some(1.0),
            Objective::Bytes => load.map(|l| l.bytes as f64),
            Objective::Requests => load.map(|l| l.requests_per_sec().max(0.0)),
        }
    }
}

impl RebalanceConfig {
    /// The least total load worth balancing under the objective.
    pub fn min_total(&self) -> f64 {
        match self.objective {
            Objective::Bytes => self.min_total_bytes as f64,
            Objective::Requests => self.min_total_requests_per_sec,
            Objective::Partitions => 0.0,
        }
    }
}

impl fmt::Display for Objective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Objective {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Objective::ALL
            .into_iter()
            .find(|o| o.name() == s)
            .ok_or_else(|| format!("unknown objective {s:?} (bytes, requests or partitions)"))
    }
}

/// The rebalancer's settings; see the README's "Rebalancer" section.
#[derive(Clone, Debug, PartialEq)]
pub struct RebalanceConfig {
    /// Plan and start moves (false: only node liveness is kept, and every
    /// round records `disabled`).
    pub enabled: bool,
    pub objective: Objective,
    /// A node is balanced while its load is within this fraction of its
    /// fair share (0.05: ±5%); the rebalancer acts only when some node is
    /// outside it.
    pub tolerance: f64,
    /// Live migrations at once, counting every source (operator moves too).
    pub max_moves: usize,
    /// Live migrations per node at once, as source or target.
    pub max_moves_per_node: usize,
    /// A partition moved (or whose move ended) less than this long ago is
    /// not moved again to balance (a drain still moves it).
    pub move_cooldown_ms: u64,
    /// How long a node may be down (its lease gone) before the rebalancer
    /// stops waiting for it: until then it plans nothing at all.
    pub down_grace_ms: u64,
    /// How often the leader runs a round.
    pub interval_ms: u64,
    /// Below this much load in the whole cluster the objective is not
    /// balanced (round reason `too_little_load`): bytes for `bytes`,
    /// requests/s for `requests`, unused for `partitions`. Spreading a few
    /// megabytes or a trickle of requests moves data for nothing; drains
    /// still run.
    pub min_total_bytes: u64,
    pub min_total_requests_per_sec: f64,
    /// A replicated partition's primary moves by replica addition
    /// (`replication/pmoves.rs`); its old primary stays an in-sync replica
    /// this long after the switch, ms.
    pub fail_back_window_ms: u64,
}

impl Default for RebalanceConfig {
    fn default() -> Self {
        RebalanceConfig {
            enabled: true,
            objective: Objective::Bytes,
            tolerance: 0.05,
            max_moves: 2,
            max_moves_per_node: 1,
            move_cooldown_ms: 600_000,
            down_grace_ms: 300_000,
            interval_ms: 5_000,
            min_total_bytes: 64 * 1024 * 1024,
            min_total_requests_per_sec: 1_000.0,
            fail_back_window_ms: crate::replication::pmoves::DEFAULT_FAIL_BACK_WINDOW_MS,
        }
    }
}

/// The longest interval or grace accepted (a day).
const MAX_MS: u64 = 86_400_000;

impl RebalanceConfig {
    /// Checks every field; the error names the first bad setting.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.tolerance > 0.0 && self.tolerance < 1.0) {
            return Err(format!(
                "rebalance_tolerance must be in (0, 1), got {}",
                self.tolerance
            ));
        }
        if self.max_moves == 0 {
            return Err("rebalance_max_moves must be at least 1".into());
        }
        if self.max_moves_per_node == 0 {
            return Err("rebalance_max_moves_per_node must be at least 1".into());
        }
        if self.interval_ms == 0 || self.interval_ms > MAX_MS {
            return Err(format!(
                "rebalance_interval_ms must be in 1..={MAX_MS}, got {}",
                self.interval_ms
            ));
        }
        if !(self.min_total_requests_per_sec >= 0.0 && self.min_total_requests_per_sec.is_finite())
        {
            return Err(format!(
                "rebalance_min_total_requests_per_sec must be a finite number >= 0, got {}",
                self.min_total_requests_per_sec
            ));
        }
        if self.down_grace_ms > MAX_MS {
            return Err(format!(
                "rebalance_down_grace_ms must be at most {MAX_MS}, got {}",
                self.down_grace_ms
            ));
        }
        let max = crate::replication::pmoves::MAX_FAIL_BACK_WINDOW_MS;
        if self.fail_back_window_ms > max {
            return Err(format!(
                "rebalance_fail_back_window_ms must be at most {max}, got {}",
                self.fail_back_window_ms
            ));
        }
        if self.move_cooldown_ms > MAX_MS {
            return Err(format!(
                "rebalance_move_cooldown_ms must be at most {MAX_MS}, got {}",
                self.move_cooldown_ms
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_settings_are_named() {
        RebalanceConfig::default().validate().unwrap();
        let bad = |f: fn(&mut RebalanceConfig)| {
            let mut c = RebalanceConfig::default();
            f(&mut c);
            c.validate().unwrap_err()
        };
        assert!(bad(|c| c.tolerance = 0.0).contains("tolerance"));
        assert!(bad(|c| c.tolerance = f64::NAN).contains("tolerance"));
        assert!(bad(|c| c.tolerance = 1.0).contains("tolerance"));
        assert!(bad(|c| c.max_moves = 0).contains("max_moves"));
        assert!(bad(|c| c.max_moves_per_node = 0).contains("per_node"));
        assert!(bad(|c| c.interval_ms = 0).contains("interval"));
        assert!(bad(|c| c.min_total_requests_per_sec = -1.0).contains("min_total_requests"));
        assert!(bad(|c| c.down_grace_ms = MAX_MS + 1).contains("grace"));
        assert!(bad(|c| c.move_cooldown_ms = MAX_MS + 1).contains("cooldown"));
        assert!(bad(|c| c.fail_back_window_ms = MAX_MS + 1).contains("fail_back_window"));
    }

    #[test]
    fn objectives_parse_by_name() {
        for o in Objective::ALL {
            assert_eq!(o.name().parse::<Objective>(), Ok(o));
        }
        assert!("keys".parse::<Objective>().is_err());
    }
}
