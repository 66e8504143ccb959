//! `--cluster-secret-file` and the admin listener's flags, shared by every
//! command that serves or calls an internal link (see `keyway-auth`).
//!
//! [`SecretFlag`] alone is for callers (`ctl`, `meta`, benches); a process
//! with an admin listener takes [`AdminFlags`] (the secret plus the admin
//! limits and `--admin-allow-unauthenticated`). Either way the secret, once
//! read and checked, is installed as the process's own: every peer, metadata
//! and admin call this process makes carries it.

use keyway_auth::{AdminLimits, ClusterSecret};
use std::path::PathBuf;

/// `--cluster-secret-file`.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct SecretFlag {
    /// File holding the cluster secret (at least 16 bytes; make one with
    /// `head -c 32 /dev/urandom | base64 > FILE; chmod 600 FILE`). Every
    /// internal link (peer calls, admin HTTP, metadata RPC) then needs it,
    /// and this process's own calls send it. Without it: no authentication.
    #[arg(long, env = "KEYWAY_CLUSTER_SECRET_FILE")]
    pub cluster_secret_file: Option<PathBuf>,
}

impl SecretFlag {
    /// Reads and checks the secret (one-line user error naming the flag),
    /// and installs it as this process's own.
    pub fn load(&self) -> anyhow::Result<Option<ClusterSecret>> {
        load_and_install(self.cluster_secret_file.as_deref())
    }
}

/// Reads, checks and installs the secret at `path`, if any.
pub fn load_and_install(path: Option<&std::path::Path>) -> anyhow::Result<Option<ClusterSecret>> {
    let Some(path) = path else {
        return Ok(None);
    };
    let secret =
        ClusterSecret::from_file(path).map_err(|e| crate::cli_error::UserError(e.to_string()))?;
    keyway_auth::install_process_secret(secret.clone()).map_err(crate::cli_error::UserError)?;
    Ok(Some(secret))
}

/// The admin listener's settings (node, manager, proxy).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct AdminFlags {
    #[command(flatten)]
    pub secret: SecretFlag,
    /// Admin HTTP: request bodies over this many bytes get 413 (gRPC calls
    /// on the node's admin port excepted) (default 65536).
    #[arg(long)]
    pub admin_max_body_bytes: Option<u64>,
    /// Admin HTTP: a request not answered within this gets 408; gRPC calls
    /// (long-lived streams) are never timed out here (default 10000).
    #[arg(long)]
    pub admin_request_timeout_ms: Option<u64>,
    /// Admin HTTP: requests served at once; more get 503 (default 64).
    #[arg(long)]
    pub admin_max_concurrent_requests: Option<usize>,
    /// Allow an admin listener on a non-loopback address without a cluster
    /// secret (refused at start otherwise).
    #[arg(long)]
    pub admin_allow_unauthenticated: bool,
}

impl AdminFlags {
    /// The limits given, over `base`.
    pub fn limits(&self, base: AdminLimits) -> AdminLimits {
        AdminLimits {
            max_body_bytes: self.admin_max_body_bytes.unwrap_or(base.max_body_bytes),
            request_timeout_ms: self
                .admin_request_timeout_ms
                .unwrap_or(base.request_timeout_ms),
            max_concurrent_requests: self
                .admin_max_concurrent_requests
                .unwrap_or(base.max_concurrent_requests),
        }
    }

    /// The admin listener's security settings (the secret read, checked
    /// and installed), for a manager or a proxy.
    pub fn to_security(&self) -> anyhow::Result<keyway_auth::AdminSecurity> {
        let security = keyway_auth::AdminSecurity {
            secret: self.secret.load()?,
            limits: self.limits(AdminLimits::default()),
            allow_unauthenticated: self.admin_allow_unauthenticated,
        };
        security
            .limits
            .validate()
            .map_err(|e| crate::cli_error::UserError(format!("invalid configuration: {e}")))?;
        Ok(security)
    }

    /// Sets the node configuration's admin fields that were given.
    pub fn apply_to_node(&self, c: &mut keyway_node::NodeConfig) {
        if let Some(path) = &self.secret.cluster_secret_file {
            c.cluster_secret_file = Some(path.clone());
        }
        let limits = self.limits(c.admin_limits());
        c.admin_max_body_bytes = limits.max_body_bytes;
        c.admin_request_timeout_ms = limits.request_timeout_ms;
        c.admin_max_concurrent_requests = limits.max_concurrent_requests;
        c.admin_allow_unauthenticated |= self.admin_allow_unauthenticated;
    }
}
