//! The ACL's counters on `/metrics` (registered by the node and the proxy
//! into their registries).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

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
    /// Registers every metric under `keyway_acl_*`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "keyway_acl_denied",
            "Requests refused -NOPERM by the ACL, by reason (command, key)",
            self.denied.clone(),
        );
        registry.register(
            "keyway_acl_auth_failures",
            "AUTH or HELLO AUTH attempts refused -WRONGPASS",
            self.auth_failures.clone(),
        );
        registry.register(
            "keyway_acl_users",
            "ACL users in force, the default user included",
            self.users.clone(),
        );
        registry.register(
            "keyway_acl_sync_errors",
            "Polls of the metadata store's ACL records that failed (the last applied ACL stays)",
            self.sync_errors.clone(),
        );
        registry.register(
            "keyway_acl_changes_applied",
            "Changes of the ACL records applied from the metadata store",
            self.applied.clone(),
        );
    }
}
