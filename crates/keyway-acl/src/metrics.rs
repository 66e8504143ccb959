//! The ACL's counters on `/metrics` (registered by the node and the proxy
//! into their registries).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Metric, Registry};

/// Where the ACL's metrics are registered (a registry, or a process's own
/// metrics type that adds its prefix).
pub trait MetricSink {
    fn add<M: Metric>(&mut self, name: &str, help: &str, metric: M);
}

impl MetricSink for Registry {
    fn add<M: Metric>(&mut self, name: &str, help: &str, metric: M) {
        self.register(name, help, metric);
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// `command` or `key`.
    pub reason: &'static str,
}

/// What the ACL refused and did.
#[derive(Default, Debug)]
pub struct AclMetrics {
    /// Requests refused `-NOPERM`, by reason.
    pub denied: Family<ReasonLabel, Counter>,
    /// `AUTH`/`HELLO AUTH` refused `-WRONGPASS`.
    pub auth_failures: Counter,
    /// ACL users in force (the default user included).
    pub users: Gauge,
    /// Polls of the metadata store's ACL records that failed (the last
    /// applied ACL stays in force).
    pub sync_errors: Counter,
    /// Changes of the ACL records applied from the metadata store.
    pub applied: Counter,
}

impl AclMetrics {
    /// Registers every metric as `acl_*` (under the sink's prefix: the node's
    /// `keyway_acl_denied`, the proxy's `keyway_proxy_acl_denied`).
    pub fn register(&self, registry: &mut impl MetricSink) {
        registry.add(
            "acl_denied",
            "Requests refused -NOPERM by the ACL, by reason (command, key)",
            self.denied.clone(),
        );
        registry.add(
            "acl_auth_failures",
            "AUTH or HELLO AUTH attempts refused -WRONGPASS",
            self.auth_failures.clone(),
        );
        registry.add(
            "acl_users",
            "ACL users in force, the default user included",
            self.users.clone(),
        );
        registry.add(
            "acl_sync_errors",
            "Polls of the metadata store's ACL records that failed (the last applied ACL stays)",
            self.sync_errors.clone(),
        );
        registry.add(
            "acl_changes_applied",
            "Changes of the ACL records applied from the metadata store",
            self.applied.clone(),
        );
    }
}
