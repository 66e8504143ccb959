//! The manager's Prometheus metrics, served as text on the admin port's
//! `/metrics`.
//!
//! Counters are registered without a `_total` suffix: prometheus-client adds
//! it (and panics in debug builds if the name already ends with it).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::Mutex;

/// Why a leader stopped leading.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

/// Every metric a manager exports.
pub struct Metrics {
    registry: Mutex<Registry>,
    /// 1 while this manager leads (acts), else 0.
    pub leading: Gauge,
    pub elections_won: Counter,
    pub step_downs: Family<ReasonLabel, Counter>,
    pub campaign_errors: Counter,
    pub lease_renewal_failures: Counter,
    pub lease_remaining_ms: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let m = Metrics {
            registry: Mutex::new(Registry::with_prefix("keyway_manager")),
            leading: Gauge::default(),
            elections_won: Counter::default(),
            step_downs: Family::default(),
            campaign_errors: Counter::default(),
            lease_renewal_failures: Counter::default(),
            lease_remaining_ms: Gauge::default(),
        };
        {
            let mut r = m.registry.lock().expect("fresh mutex");
            r.register(
                "leading",
                "1 while this manager holds the seat and acts, else 0",
                m.leading.clone(),
            );
            r.register(
                "elections_won",
                "Times this manager started leading",
                m.elections_won.clone(),
            );
            r.register(
                "step_downs",
                "Times this manager stopped leading, by reason",
                m.step_downs.clone(),
            );
            r.register(
                "campaign_errors",
                "Campaign calls that failed (and were retried)",
                m.campaign_errors.clone(),
            );
            r.register(
                "lease_renewal_failures",
                "Session-lease keep-alives that failed",
                m.lease_renewal_failures.clone(),
            );
            r.register(
                "lease_remaining_ms",
                "Milliseconds left on this manager's session lease, by its own clock",
                m.lease_remaining_ms.clone(),
            );
        }
        m
    }

    /// Counts one step-down for `reason`.
    pub fn stepped_down(&self, reason: &'static str) {
        self.step_downs.get_or_create(&ReasonLabel { reason }).inc();
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        prometheus_client::encoding::text::encode(&mut out, &registry)
            .expect("writing to a String cannot fail");
        out
    }
}
