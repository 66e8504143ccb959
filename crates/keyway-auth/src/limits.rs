//! The admin HTTP listener's limits ([`AdminLimits`]) and the rule that an
//! admin listener on a non-loopback address needs a cluster secret
//! ([`check_admin_bind`]). Every node, manager and proxy applies both.
//!
//! The limits apply to plain HTTP requests only: gRPC calls on the same port
//! (the node's `Peer` service: replication and change streams that last as
//! long as a replica does, 640 MiB migration messages) keep their own
//! message-size caps and deadlines.

use std::net::SocketAddr;

/// The default `admin_max_body_bytes`: admin requests carry no or tiny bodies.
pub const DEFAULT_ADMIN_MAX_BODY_BYTES: u64 = 64 * 1024;
/// The largest `admin_max_body_bytes` accepted.
pub const MAX_ADMIN_MAX_BODY_BYTES: u64 = 64 * 1024 * 1024;
/// The default `admin_request_timeout_ms`.
pub const DEFAULT_ADMIN_REQUEST_TIMEOUT_MS: u64 = 10_000;
/// The largest `admin_request_timeout_ms` accepted (10 minutes).
pub const MAX_ADMIN_REQUEST_TIMEOUT_MS: u64 = 600_000;
/// The default `admin_max_concurrent_requests`.
pub const DEFAULT_ADMIN_MAX_CONCURRENT_REQUESTS: usize = 64;
/// The largest `admin_max_concurrent_requests` accepted.
pub const MAX_ADMIN_MAX_CONCURRENT_REQUESTS: usize = 65_536;

/// Limits of one admin HTTP listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdminLimits {
    /// Request bodies larger than this are answered 413 (a body of unknown
    /// length, HTTP/1.1 chunked, is answered 411).
    pub max_body_bytes: u64,
    /// An HTTP request not answered within this is answered 408.
    pub request_timeout_ms: u64,
    /// HTTP requests served at once; more are answered 503 at once.
    pub max_concurrent_requests: usize,
}

impl Default for AdminLimits {
    fn default() -> Self {
        AdminLimits {
            max_body_bytes: DEFAULT_ADMIN_MAX_BODY_BYTES,
            request_timeout_ms: DEFAULT_ADMIN_REQUEST_TIMEOUT_MS,
            max_concurrent_requests: DEFAULT_ADMIN_MAX_CONCURRENT_REQUESTS,
        }
    }
}

impl AdminLimits {
    /// Checks every limit; the message names the setting.
    pub fn validate(&self) -> Result<(), String> {
        let ranges = [
            (
                "admin_max_body_bytes",
                self.max_body_bytes,
                MAX_ADMIN_MAX_BODY_BYTES,
            ),
            (
                "admin_request_timeout_ms",
                self.request_timeout_ms,
                MAX_ADMIN_REQUEST_TIMEOUT_MS,
            ),
            (
                "admin_max_concurrent_requests",
                self.max_concurrent_requests as u64,
                MAX_ADMIN_MAX_CONCURRENT_REQUESTS as u64,
            ),
        ];
        for (name, value, max) in ranges {
            if value == 0 || value > max {
                return Err(format!("{name} must be 1..={max}, got {value}"));
            }
        }
        Ok(())
    }
}

/// Everything about one admin listener's protection: the secret it needs
/// (none: open, as before secrets), its limits, and the opt-out of the
/// loopback rule.
#[derive(Clone, Debug, Default)]
pub struct AdminSecurity {
    pub secret: Option<crate::ClusterSecret>,
    pub limits: AdminLimits,
    /// `--admin-allow-unauthenticated`.
    pub allow_unauthenticated: bool,
}

impl AdminSecurity {
    /// Checks the limits and the loopback rule for a listener on `addr`.
    pub fn validate(&self, addr: SocketAddr) -> Result<(), String> {
        self.limits.validate()?;
        check_admin_bind(addr, self.secret.is_some(), self.allow_unauthenticated)
    }

    /// The guard of this listener (metric label `admin`).
    pub fn guard(&self, metrics: crate::AuthMetrics) -> crate::AdminGuard {
        crate::AdminGuard::new("admin", self.secret.clone(), Some(self.limits), metrics)
    }
}

/// Refuses an admin listener on a non-loopback address without a cluster
/// secret, unless `allow_unauthenticated` (`--admin-allow-unauthenticated`).
pub fn check_admin_bind(
    addr: SocketAddr,
    has_secret: bool,
    allow_unauthenticated: bool,
) -> Result<(), String> {
    if addr.ip().is_loopback() || has_secret || allow_unauthenticated {
        return Ok(());
    }
    Err(format!(
        "the admin listener {addr} is not a loopback address: give it a cluster secret \
         (--cluster-secret-file) or accept an unauthenticated admin port \
         (--admin-allow-unauthenticated)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A change that makes the limits invalid, and the setting named.
    type Breakage = (fn(&mut AdminLimits), &'static str);

    #[test]
    fn defaults_are_valid_and_each_limit_is_checked() {
        assert_eq!(AdminLimits::default().validate(), Ok(()));
        let broken: [Breakage; 6] = [
            (|l| l.max_body_bytes = 0, "admin_max_body_bytes"),
            (
                |l| l.max_body_bytes = MAX_ADMIN_MAX_BODY_BYTES + 1,
                "admin_max_body_bytes",
            ),
            (|l| l.request_timeout_ms = 0, "admin_request_timeout_ms"),
            (
                |l| l.request_timeout_ms = MAX_ADMIN_REQUEST_TIMEOUT_MS + 1,
                "admin_request_timeout_ms",
            ),
            (
                |l| l.max_concurrent_requests = 0,
                "admin_max_concurrent_requests",
            ),
            (
                |l| l.max_concurrent_requests = MAX_ADMIN_MAX_CONCURRENT_REQUESTS + 1,
                "admin_max_concurrent_requests",
            ),
        ];
        for (breaks, name) in broken {
            let mut l = AdminLimits::default();
            breaks(&mut l);
            let err = l.validate().unwrap_err();
            assert!(err.starts_with(name), "{name}: {err}");
        }
    }

    #[test]
    fn a_public_admin_listener_needs_a_secret_or_the_opt_out() {
        let lo: SocketAddr = "127.0.0.1:8001".parse().unwrap();
        let lo6: SocketAddr = "[::1]:8001".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:8001".parse().unwrap();
        assert!(check_admin_bind(lo, false, false).is_ok());
        assert!(check_admin_bind(lo6, false, false).is_ok());
        let err = check_admin_bind(any, false, false).unwrap_err();
        assert!(
            err.contains("--cluster-secret-file") && err.contains("--admin-allow-unauthenticated")
        );
        assert!(check_admin_bind(any, true, false).is_ok());
        assert!(check_admin_bind(any, false, true).is_ok());
    }
}
