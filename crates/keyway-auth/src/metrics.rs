//! [`AuthMetrics`]: what the guard refuses, registered in each process's own
//! registry (so a node shows `keyway_auth_refused`, a manager
//! `keyway_manager_auth_refused`, a proxy `keyway_proxy_auth_refused`).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// Labels: the listener (`admin`, `meta`) and the reason.
pub type RefusalLabels = Vec<(&'static str, &'static str)>;

/// The guard's counters; cheap to clone (clones share the counts).
#[derive(Clone, Debug, Default)]
pub struct AuthMetrics {
    /// Requests refused for their credentials, by listener and reason
    /// (`missing`, `malformed`, `wrong`).
    pub refused: Family<RefusalLabels, Counter>,
    /// HTTP requests refused by an admin limit, by listener and reason
    /// (`body_too_large`, `length_required`, `timeout`, `busy`).
    pub limited: Family<RefusalLabels, Counter>,
}

impl AuthMetrics {
    /// Registers both families in `registry` (under its prefix).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "auth_refused",
            "Requests refused without the right cluster secret, by listener and reason",
            self.refused.clone(),
        );
        registry.register(
            "admin_limited",
            "Admin HTTP requests refused by a limit, by listener and reason",
            self.limited.clone(),
        );
    }

    /// Refusals so far of `listener` for `reason`.
    pub fn refused_count(&self, listener: &'static str, reason: &'static str) -> u64 {
        self.refused
            .get_or_create(&vec![("listener", listener), ("reason", reason)])
            .get()
    }

    pub(crate) fn count_refused(&self, listener: &'static str, reason: &'static str) {
        self.refused
            .get_or_create(&vec![("listener", listener), ("reason", reason)])
            .inc();
    }

    pub(crate) fn count_limited(&self, listener: &'static str, reason: &'static str) {
        self.limited
            .get_or_create(&vec![("listener", listener), ("reason", reason)])
            .inc();
    }
}
