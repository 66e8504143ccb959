//! The manager's Prometheus metrics, served as text on the admin port's
//! `/metrics`.
//!
//! Counters are registered without a `_total` suffix: prometheus-client adds
//! it (and panics in debug builds if the name already ends with it).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::Mutex;

/// Why a leader stopped leading.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

/// How a migration ended (`done` or `aborted`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: &'static str,
}

/// A cutover step (`fence`, `digest`, `flip`, `serve`; see
/// `keyway_migration::CutoverSteps`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StepLabel {
    pub step: &'static str,
}

/// Buckets of the cutover step histograms, in milliseconds.
pub const STEP_BUCKETS_MS: [f64; 14] = [
    0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0,
];

/// Buckets of the cutover write pause histogram, in milliseconds.
pub const PAUSE_BUCKETS_MS: [f64; 13] = [
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0,
];

/// Every metric a manager exports.
pub struct Metrics {
    registry: Mutex<Registry>,
    /// The admin guard's refusals (`keyway_manager_auth_refused`, `..._admin_limited`).
    pub auth: keyway_auth::AuthMetrics,
    /// 1 while this manager leads (acts), else 0.
    pub leading: Gauge,
    pub elections_won: Counter,
    pub step_downs: Family<ReasonLabel, Counter>,
    pub campaign_errors: Counter,
    pub lease_renewal_failures: Counter,
    pub lease_remaining_ms: Gauge,
    /// Migrations this manager started (`PENDING` → `COPYING` persisted).
    pub migrations_started: Counter,
    /// Migrations this manager saw to their end, by outcome.
    pub migrations_finished: Family<OutcomeLabel, Counter>,
    /// Non-terminal migrations this manager drives.
    pub migrations_active: Gauge,
    /// Snapshot bytes still to copy, summed over the active migrations.
    pub migration_bytes_remaining: Gauge,
    /// Snapshot copy rate over the last poll, bytes/s, summed.
    pub migration_copy_rate: Gauge,
    /// Largest catch-up lag (change-log records) among the active migrations.
    pub migration_catchup_lag: Gauge,
    /// The measured cutover write pause per migration, milliseconds.
    pub cutover_pause_ms: Histogram,
    /// Each cutover step's duration per migration, milliseconds, by step.
    pub cutover_step_ms: Family<StepLabel, Histogram>,
    /// Migrations over with a copy still left on a node (`stray`).
    pub migration_stray_copies: Gauge,
    /// Times the driver gave up dropping a copy and left it for later.
    pub migration_cleanup_give_ups: Counter,
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
            auth: keyway_auth::AuthMetrics::default(),
            leading: Gauge::default(),
            elections_won: Counter::default(),
            step_downs: Family::default(),
            campaign_errors: Counter::default(),
            lease_renewal_failures: Counter::default(),
            lease_remaining_ms: Gauge::default(),
            migrations_started: Counter::default(),
            migrations_finished: Family::default(),
            migrations_active: Gauge::default(),
            migration_bytes_remaining: Gauge::default(),
            migration_copy_rate: Gauge::default(),
            migration_catchup_lag: Gauge::default(),
            cutover_pause_ms: Histogram::new(PAUSE_BUCKETS_MS),
            cutover_step_ms: Family::new_with_constructor(|| Histogram::new(STEP_BUCKETS_MS)),
            migration_stray_copies: Gauge::default(),
            migration_cleanup_give_ups: Counter::default(),
        };
        {
            let mut r = m.registry.lock().expect("fresh mutex");
            m.auth.register(&mut r);
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
            r.register(
                "migrations_started",
                "Migrations this manager started",
                m.migrations_started.clone(),
            );
            r.register(
                "migrations_finished",
                "Migrations this manager drove to their end, by outcome (done, aborted)",
                m.migrations_finished.clone(),
            );
            r.register(
                "migrations_active",
                "Non-terminal migrations this manager drives",
                m.migrations_active.clone(),
            );
            r.register(
                "migration_bytes_remaining",
                "Snapshot bytes still to copy, summed over the active migrations",
                m.migration_bytes_remaining.clone(),
            );
            r.register(
                "migration_copy_rate_bytes_per_second",
                "Snapshot copy rate over the last status poll, summed over the active migrations",
                m.migration_copy_rate.clone(),
            );
            r.register(
                "migration_catchup_lag_records",
                "Largest catch-up lag (source change-log records) among the active migrations",
                m.migration_catchup_lag.clone(),
            );
            r.register(
                "migration_cutover_pause_ms",
                "Measured cutover write pause per migration (fence asked to target serving), ms",
                m.cutover_pause_ms.clone(),
            );
            r.register(
                "migration_cutover_step_ms",
                "Each cutover step per migration, ms, by step: fence (fence request to the source's \
                 answer, the drain included), digest, flip (flip request persisted and CAS), serve \
                 (until the target serves)",
                m.cutover_step_ms.clone(),
            );
            r.register(
                "migration_stray_copies",
                "Migrations over with a copy of their range still left on a node that could not be reached (dropped when it is back)",
                m.migration_stray_copies.clone(),
            );
            r.register(
                "migration_cleanup_give_ups",
                "Times a migration ended without dropping a copy on an unreachable node (left for a later cleanup)",
                m.migration_cleanup_give_ups.clone(),
            );
        }
        m
    }

    /// Registers a metric of another duty's own (each duty keeps its
    /// metrics in its own file and registers them here once, at start).
    pub fn register(
        &self,
        name: &str,
        help: &str,
        metric: impl prometheus_client::registry::Metric,
    ) {
        self.registry
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .register(name, help, metric);
    }

    /// Counts one step-down for `reason`.
    pub fn stepped_down(&self, reason: &'static str) {
        self.step_downs.get_or_create(&ReasonLabel { reason }).inc();
    }

    /// Records one cutover's steps.
    pub fn cutover_steps(&self, s: &keyway_migration::CutoverSteps) {
        for (step, us) in [
            ("fence", s.fence_us),
            ("digest", s.digest_us),
            ("flip", s.flip_us),
            ("serve", s.serve_us),
        ] {
            self.cutover_step_ms
                .get_or_create(&StepLabel { step })
                .observe(us as f64 / 1000.0);
        }
    }

    /// Counts one finished migration (`done` or `aborted`).
    pub fn migration_finished(&self, outcome: &'static str) {
        self.migrations_finished
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
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
