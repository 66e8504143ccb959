//! Authenticated internal links and a hardened admin API.
//!
//! Every Keyway process that serves or calls an internal link (node admin
//! port with its `Peer` gRPC service, manager and proxy admin HTTP, the
//! metadata server's RPC) can be given one shared **cluster secret**
//! (`--cluster-secret-file`). This crate holds everything about it:
//!
//! - [`secret`]: the [`ClusterSecret`] type, read and checked from its file,
//!   the constant-time comparison, and the process-wide secret a process's
//!   own clients send;
//! - [`header`]: reading `Authorization: Bearer` / `Basic` credentials;
//! - [`layer`]: [`AdminGuard`], the tower layer each listener is wrapped in
//!   (secret check, then the admin limits), with its HTTP 401 and gRPC
//!   `UNAUTHENTICATED` refusals;
//! - [`limits`]: [`AdminLimits`] and the loopback rule for admin listeners;
//! - [`client`]: the gRPC interceptor and HTTP header callers add;
//! - [`metrics`]: [`AuthMetrics`], the refusal counters.
//!
//! The secret is one credential shared by the whole cluster, not a per-caller
//! identity, and it travels in clear unless the link itself is TLS.

pub mod client;
pub mod header;
pub mod layer;
pub mod limits;
pub mod metrics;
pub mod secret;

pub use client::{AuthChannel, SecretInterceptor, auth_channel, authorization, refused_message};
pub use header::{Verdict, basic_value, check};
pub use layer::{AdminGuard, Guarded, HEALTH_PATH};
pub use limits::{AdminLimits, AdminSecurity, check_admin_bind};
pub use metrics::AuthMetrics;
pub use secret::{
    ClusterSecret, MIN_SECRET_BYTES, SECRET_FLAG, SecretError, constant_time_eq,
    install_process_secret, process_secret,
};
