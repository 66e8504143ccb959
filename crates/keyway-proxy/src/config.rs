//! Proxy configuration. Every limit is named with its unit last, has a
//! default, and is checked by [`ProxyConfig::validate`] before the proxy
//! starts.

use keyway_resp::Limits;
use keyway_tls::{TlsAuthClients, TlsSettings};
use std::net::SocketAddr;
use std::path::PathBuf;

/// Everything a proxy needs to start (besides its metadata store).
#[derive(Clone, Debug)]
pub struct ProxyConfig {
    /// RESP listener for clients.
    pub listen: SocketAddr,
    /// Admin HTTP listener (`/metrics`, `/status`); port 0 picks a free port.
    pub admin_listen: SocketAddr,
    /// Most concurrent client connections (Redis `maxclients`); more are
    /// answered `-ERR max number of clients reached` and closed.
    pub max_clients: usize,
    /// Most requests of one client connection in flight at once (a deeper
    /// pipeline waits for the oldest replies before more are read).
    pub max_pipeline: usize,
    /// Deadline of one client request, every retry included.
    pub request_timeout_ms: u64,
    /// Pipelined connections the proxy keeps to each node.
    pub node_connections: usize,
    /// Most requests queued or in flight on one node connection (callers
    /// wait for room beyond it).
    pub max_node_inflight: usize,
    /// Deadline of opening one node connection (TCP and `HELLO 3`).
    pub connect_timeout_ms: u64,
    /// Longest a shutdown waits for in-flight requests before closing.
    pub drain_timeout_ms: u64,
    /// Redis `proto-max-bulk-len`: longest bulk string a request may carry.
    pub max_bulk_len_bytes: usize,
    /// Most arguments in one multibulk request.
    pub max_multibulk_len: usize,
    /// Longest inline request.
    pub max_inline_len_bytes: usize,
    /// Password clients must send with AUTH / HELLO AUTH (Redis `requirepass`).
    pub requirepass: Option<String>,
    /// Password the proxy sends to the nodes (their `requirepass`).
    pub node_password: Option<String>,
    /// The admin listener's cluster secret, limits and loopback opt-out
    /// (see `keyway-auth`).
    pub admin: keyway_auth::AdminSecurity,
    /// TLS for clients (see [`keyway_tls`]), Redis's `tls-port`: a
    /// second client listener on the `listen` IP (0 = a free port).
    pub tls_port: Option<u16>,
    /// TLS: the server certificate chain, PEM.
    pub tls_cert_file: Option<PathBuf>,
    /// TLS: the certificate's private key, PEM.
    pub tls_key_file: Option<PathBuf>,
    /// TLS: the CA certificates client certificates are checked against, PEM.
    pub tls_ca_cert_file: Option<PathBuf>,
    /// TLS: `yes` | `no` | `optional` (Redis `tls-auth-clients`).
    pub tls_auth_clients: TlsAuthClients,
    /// TLS: longest one connection's handshake may take.
    pub tls_handshake_timeout_ms: u64,
    /// Redis `protected-mode`: while on and `requirepass` is unset, clients
    /// not on the loopback interface get `-DENIED` and are closed.
    pub protected_mode: bool,
    /// ACL: how often the proxy reads the metadata store's ACL users and
    /// applies a change.
    pub acl_poll_interval_ms: u64,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            listen: "127.0.0.1:7100".parse().expect("literal address"),
            admin_listen: "127.0.0.1:8100".parse().expect("literal address"),
            max_clients: 10_000,
            max_pipeline: 128,
            request_timeout_ms: 5_000,
            node_connections: 2,
            max_node_inflight: 4_096,
            connect_timeout_ms: 1_000,
            drain_timeout_ms: 5_000,
            max_bulk_len_bytes: keyway_resp::DEFAULT_MAX_BULK_LEN_BYTES,
            max_multibulk_len: keyway_resp::DEFAULT_MAX_MULTIBULK_LEN,
            max_inline_len_bytes: keyway_resp::DEFAULT_MAX_INLINE_LEN_BYTES,
            requirepass: None,
            node_password: None,
            admin: keyway_auth::AdminSecurity::default(),
            tls_port: None,
            tls_cert_file: None,
            tls_key_file: None,
            tls_ca_cert_file: None,
            tls_auth_clients: TlsAuthClients::Yes,
            tls_handshake_timeout_ms: keyway_tls::DEFAULT_TLS_HANDSHAKE_TIMEOUT_MS,
            protected_mode: true,
            acl_poll_interval_ms: 1_000,
        }
    }
}

impl ProxyConfig {
    /// Checks every limit; the message names the setting.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("max_clients", self.max_clients as u64),
            ("max_pipeline", self.max_pipeline as u64),
            ("request_timeout_ms", self.request_timeout_ms),
            ("node_connections", self.node_connections as u64),
            ("max_node_inflight", self.max_node_inflight as u64),
            ("connect_timeout_ms", self.connect_timeout_ms),
            ("acl_poll_interval_ms", self.acl_poll_interval_ms),
        ];
        if self.acl_poll_interval_ms > 3_600_000 {
            return Err("acl_poll_interval_ms must be at most 3600000 (one hour)".into());
        }
        for (name, value) in positive {
            if value == 0 {
                return Err(format!("{name} must be greater than 0"));
            }
        }
        if self.node_connections > 64 {
            return Err(format!(
                "node_connections must be at most 64, got {}",
                self.node_connections
            ));
        }
        if self.max_pipeline > 65_536 {
            return Err(format!(
                "max_pipeline must be at most 65536, got {}",
                self.max_pipeline
            ));
        }
        if self.connect_timeout_ms > self.request_timeout_ms {
            return Err(format!(
                "connect_timeout_ms ({}) must not exceed request_timeout_ms ({})",
                self.connect_timeout_ms, self.request_timeout_ms
            ));
        }
        self.admin.validate(self.admin_listen)?;
        if self.requirepass.as_deref() == Some("") {
            return Err("requirepass must not be empty (leave it unset instead)".into());
        }
        self.tls().server_config()?;
        if let Some(port) = self.tls_port.filter(|p| *p != 0)
            && (port == self.listen.port() || port == self.admin_listen.port())
        {
            return Err(format!(
                "tls_port {port} is already the port of listen or admin_listen"
            ));
        }
        self.resp_limits().validate()
    }

    /// The TLS settings (see [`keyway_tls`]).
    pub fn tls(&self) -> TlsSettings<'_> {
        TlsSettings {
            port: self.tls_port,
            cert_file: self.tls_cert_file.as_deref(),
            key_file: self.tls_key_file.as_deref(),
            ca_cert_file: self.tls_ca_cert_file.as_deref(),
            auth_clients: self.tls_auth_clients,
            handshake_timeout_ms: self.tls_handshake_timeout_ms,
        }
    }

    /// The request parser's limits.
    pub fn resp_limits(&self) -> Limits {
        Limits {
            max_bulk_len_bytes: self.max_bulk_len_bytes,
            max_multibulk_len: self.max_multibulk_len,
            max_inline_len_bytes: self.max_inline_len_bytes,
            ..Limits::default()
        }
    }

    /// The limits node replies are parsed with: bulk strings as long as the
    /// clients may send (a GET returns what a SET stored), arrays as long
    /// as an MGET's.
    pub fn reply_limits(&self) -> Limits {
        Limits {
            max_bulk_len_bytes: self.max_bulk_len_bytes,
            max_multibulk_len: self.max_multibulk_len,
            ..Limits::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A change that makes a configuration invalid, and the setting named.
    type Breakage = (fn(&mut ProxyConfig), &'static str);

    #[test]
    fn defaults_are_valid_and_each_limit_is_checked() {
        assert_eq!(ProxyConfig::default().validate(), Ok(()));
        let broken: [Breakage; 8] = [
            (|c| c.max_clients = 0, "max_clients"),
            (|c| c.max_pipeline = 0, "max_pipeline"),
            (|c| c.request_timeout_ms = 0, "request_timeout_ms"),
            (|c| c.node_connections = 0, "node_connections"),
            (|c| c.node_connections = 65, "node_connections"),
            (|c| c.connect_timeout_ms = 10_000, "connect_timeout_ms"),
            (|c| c.max_bulk_len_bytes = 0, "max_bulk_len_bytes"),
            (|c| c.requirepass = Some(String::new()), "requirepass"),
        ];
        for (breaks, name) in broken {
            let mut c = ProxyConfig::default();
            breaks(&mut c);
            let err = c.validate().unwrap_err();
            assert!(err.contains(name), "{name}: {err}");
        }
    }
}
