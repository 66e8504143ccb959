//! The decision log: every decision the manager's duties take, and every
//! decision *not* to act, with its reason. Each is logged (`tracing`),
//! counted (`keyway_manager_decisions{duty,action,reason}`), and kept in a
//! bounded ring served as JSON on the admin port's `/decisions` (newest
//! last) for `keyway ctl decisions`.
//!
//! A duty records a decision not to act only when the reason changes for
//! that subject (see [`DecisionLog::record_once`]), so a steady "balanced"
//! does not flood the ring while the counter still counts every round.

use crate::Metrics;
use keyway_map::PartitionId;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde::Serialize;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

/// Decisions kept for `/decisions`.
pub const DECISION_LOG_CAPACITY: usize = 1_000;

/// Labels of `keyway_manager_decisions`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabel {
    /// `split`, `merge`, `rebalance`, `node`.
    pub duty: &'static str,
    /// What was decided: `split`, `no_split`, `move`, `no_move`, ...
    pub action: &'static str,
    /// A short machine-readable reason: `size`, `load`, `single_key`, `balanced`, ...
    pub reason: &'static str,
}

/// One decision, as served on `/decisions`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Decision {
    /// Wall-clock milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
    pub duty: &'static str,
    pub action: &'static str,
    pub reason: &'static str,
    /// The partition it concerns, if one.
    pub partition: Option<PartitionId>,
    /// Whether the manager acted (false: a decision not to act).
    pub acted: bool,
    /// Human-readable detail: figures, the chosen key, the target node.
    pub detail: String,
}

/// The shared decision log (cheap to clone).
#[derive(Clone)]
pub struct DecisionLog {
    inner: Arc<Mutex<Inner>>,
    counter: Family<DecisionLabel, Counter>,
}

#[derive(Default)]
struct Inner {
    ring: VecDeque<Decision>,
    /// Last reason recorded per (duty, subject), for `record_once`.
    last: HashMap<(&'static str, String), &'static str>,
}

impl DecisionLog {
    /// A log whose counter is registered in `metrics`.
    pub fn new(metrics: &Metrics) -> Self {
        let counter = Family::<DecisionLabel, Counter>::default();
        metrics.register(
            "decisions",
            "Decisions of the manager's duties, including decisions not to act, by duty, action and reason",
            counter.clone(),
        );
        DecisionLog {
            inner: Arc::default(),
            counter,
        }
    }

    /// Logs, counts and keeps one decision.
    pub fn record(&self, d: Decision) {
        self.count(&d);
        if d.acted {
            tracing::info!(duty = d.duty, action = d.action, reason = d.reason, partition = ?d.partition, detail = %d.detail, "manager decision");
        } else {
            tracing::debug!(duty = d.duty, action = d.action, reason = d.reason, partition = ?d.partition, detail = %d.detail, "manager decision (no action)");
        }
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner.ring.len() == DECISION_LOG_CAPACITY {
            inner.ring.pop_front();
        }
        inner.ring.push_back(d);
    }

    /// Counts every call, but keeps and logs the decision only when its
    /// reason differs from the last one recorded for `subject` of this duty.
    pub fn record_once(&self, subject: impl Into<String>, d: Decision) {
        let key = (d.duty, subject.into());
        let changed = {
            let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            inner.last.insert(key, d.reason) != Some(d.reason)
        };
        if changed {
            self.record(d);
        } else {
            self.count(&d);
        }
    }

    fn count(&self, d: &Decision) {
        self.counter
            .get_or_create(&DecisionLabel {
                duty: d.duty,
                action: d.action,
                reason: d.reason,
            })
            .inc();
    }

    /// The kept decisions, oldest first.
    pub fn recent(&self) -> Vec<Decision> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.ring.iter().cloned().collect()
    }
}

impl Decision {
    /// A decision stamped now.
    pub fn now(
        duty: &'static str,
        action: &'static str,
        reason: &'static str,
        partition: Option<PartitionId>,
        acted: bool,
        detail: impl Into<String>,
    ) -> Self {
        let at_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        Decision {
            at_unix_ms,
            duty,
            action,
            reason,
            partition,
            acted,
            detail: detail.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_once_keeps_only_changes_but_counts_all() {
        let metrics = Metrics::new();
        let log = DecisionLog::new(&metrics);
        let d = |reason| Decision::now("rebalance", "no_move", reason, None, false, "");
        log.record_once("cluster", d("balanced"));
        log.record_once("cluster", d("balanced"));
        log.record_once("cluster", d("cap"));
        let kept: Vec<_> = log.recent().iter().map(|d| d.reason).collect();
        assert_eq!(kept, ["balanced", "cap"]);
        let text = metrics.encode();
        assert!(
            text.contains(
                r#"keyway_manager_decisions_total{duty="rebalance",action="no_move",reason="balanced"} 2"#
            ),
            "{text}"
        );
    }

    #[test]
    fn ring_is_bounded() {
        let log = DecisionLog::new(&Metrics::new());
        for _ in 0..DECISION_LOG_CAPACITY + 5 {
            log.record(Decision::now("split", "split", "size", None, true, ""));
        }
        assert_eq!(log.recent().len(), DECISION_LOG_CAPACITY);
    }
}
