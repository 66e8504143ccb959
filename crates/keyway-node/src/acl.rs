//! The node's side of the ACL: the catalog, the key positions and the
//! request check are keyway-command's (shared with the proxy, see
//! [`keyway_command::acl`]); here, the ACL's metrics in the node's registry.

use crate::session::Session;
use bytes::Bytes;
use keyway_acl::{Acl, MetricSink};
use keyway_resp::Frame;

pub use keyway_command::acl::{key_positions, new_acl};

/// [`keyway_command::acl::check_request`], in the connection's `MULTI` context.
pub fn check_request(acl: &Acl, session: &mut Session, args: &[Bytes]) -> Option<Frame> {
    let in_multi = session.tx.in_multi();
    keyway_command::acl::check_request(acl, session, in_multi, args)
}

/// Registers the ACL's metrics into the node's registry (`keyway_acl_*`).
pub fn register_metrics(acl: &Acl, metrics: &crate::metrics::Metrics) {
    struct Sink<'a>(&'a crate::metrics::Metrics);
    impl MetricSink for Sink<'_> {
        fn add<M: prometheus_client::registry::Metric>(
            &mut self,
            name: &str,
            help: &str,
            metric: M,
        ) {
            self.0.register(name, help, metric);
        }
    }
    acl.metrics.register(&mut Sink(metrics));
}
