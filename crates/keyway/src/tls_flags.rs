//! The client TLS and protected-mode flags (Redis's names), shared by
//! `keyway server` (and `keyway dev`, through it) and `keyway proxy`: one
//! definition, applied over a node's or a proxy's configuration. Unset
//! flags leave the configuration's value (a `--config` file's, or the
//! default), so the defaults live in one place, the configs.

use keyway_node::NodeConfig;
use keyway_proxy::ProxyConfig;
use keyway_tls::TlsAuthClients;
use std::path::PathBuf;

/// `--tls-*` and `--protected-mode`.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct TlsFlags {
    /// TLS (Redis tls-port): also serve clients over TLS on this port of
    /// the --listen IP (0: a free port), beside the plain port. Needs
    /// --tls-cert-file and --tls-key-file (and --tls-ca-cert-file unless
    /// --tls-auth-clients no).
    #[arg(long)]
    pub tls_port: Option<u16>,
    /// TLS: the server certificate chain, PEM (Redis tls-cert-file).
    #[arg(long)]
    pub tls_cert_file: Option<PathBuf>,
    /// TLS: the certificate's private key, PEM (Redis tls-key-file).
    #[arg(long)]
    pub tls_key_file: Option<PathBuf>,
    /// TLS: CA certificates, PEM, client certificates are checked against
    /// (Redis tls-ca-cert-file).
    #[arg(long)]
    pub tls_ca_cert_file: Option<PathBuf>,
    /// TLS: yes (default: a client certificate signed by the CA is
    /// required), optional (checked if sent) or no (Redis tls-auth-clients).
    #[arg(long)]
    pub tls_auth_clients: Option<TlsAuthClients>,
    /// TLS: longest one client's handshake may take, milliseconds (default 10000).
    #[arg(long)]
    pub tls_handshake_timeout_ms: Option<u64>,
    /// Redis protected-mode, yes (default) or no: while yes and the default
    /// user has no password (--requirepass, ACL), clients not on the
    /// loopback interface get -DENIED and are closed.
    #[arg(long, value_parser = keyway_tls::protected_mode::parse_yes_no)]
    pub protected_mode: Option<bool>,
}

/// The settings these flags set, borrowed from a node's or a proxy's config.
struct Settings<'a> {
    tls_port: &'a mut Option<u16>,
    tls_cert_file: &'a mut Option<PathBuf>,
    tls_key_file: &'a mut Option<PathBuf>,
    tls_ca_cert_file: &'a mut Option<PathBuf>,
    tls_auth_clients: &'a mut TlsAuthClients,
    tls_handshake_timeout_ms: &'a mut u64,
    protected_mode: &'a mut bool,
}

impl TlsFlags {
    /// Sets what was given over `c`.
    pub fn apply_to_node(&self, c: &mut NodeConfig) {
        self.apply(Settings {
            tls_port: &mut c.tls_port,
            tls_cert_file: &mut c.tls_cert_file,
            tls_key_file: &mut c.tls_key_file,
            tls_ca_cert_file: &mut c.tls_ca_cert_file,
            tls_auth_clients: &mut c.tls_auth_clients,
            tls_handshake_timeout_ms: &mut c.tls_handshake_timeout_ms,
            protected_mode: &mut c.protected_mode,
        });
    }

    /// Sets what was given over `c`.
    pub fn apply_to_proxy(&self, c: &mut ProxyConfig) {
        self.apply(Settings {
            tls_port: &mut c.tls_port,
            tls_cert_file: &mut c.tls_cert_file,
            tls_key_file: &mut c.tls_key_file,
            tls_ca_cert_file: &mut c.tls_ca_cert_file,
            tls_auth_clients: &mut c.tls_auth_clients,
            tls_handshake_timeout_ms: &mut c.tls_handshake_timeout_ms,
            protected_mode: &mut c.protected_mode,
        });
    }

    fn apply(&self, s: Settings<'_>) {
        for (flag, setting) in [
            (&self.tls_cert_file, s.tls_cert_file),
            (&self.tls_key_file, s.tls_key_file),
            (&self.tls_ca_cert_file, s.tls_ca_cert_file),
        ] {
            if flag.is_some() {
                setting.clone_from(flag);
            }
        }
        if self.tls_port.is_some() {
            *s.tls_port = self.tls_port;
        }
        if let Some(v) = self.tls_auth_clients {
            *s.tls_auth_clients = v;
        }
        if let Some(v) = self.tls_handshake_timeout_ms {
            *s.tls_handshake_timeout_ms = v;
        }
        if let Some(v) = self.protected_mode {
            *s.protected_mode = v;
        }
    }
}
