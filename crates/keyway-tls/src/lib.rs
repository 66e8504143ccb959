//! What the client listeners of the node and the proxy check before they
//! serve a connection: TLS for Redis clients (this file) and protected mode
//! ([`protected_mode`]), with the two counters they share
//! ([`AccessMetrics`]). A crate of its own so the proxy links neither the
//! node nor its engine for them.
//!
//! TLS for Redis clients, with Redis's settings: `tls_port`,
//! `tls_cert_file`, `tls_key_file`, `tls_ca_cert_file`, `tls_auth_clients`
//! (`yes` | `no` | `optional`, default `yes`).
//!
//! The TLS listener serves the same protocol as the plain one, beside it;
//! each accepted connection's handshake runs on that connection's own task
//! (bounded by `tls_handshake_timeout_ms`), so a failed or stalled
//! handshake closes only that connection and is counted
//! (`tls_handshake_failures`).
//!
//! [`TlsSettings::server_config`] is the start-up check: the settings go
//! together (a port with a certificate and a key; a CA whenever client
//! certificates are asked for), each file is readable and holds PEM of
//! the right kind, and the key matches the certificate. Each error is one
//! line naming the setting. rustls with the `ring` provider; client
//! certificates are verified against the CA file by webpki.
//!
//! `tls_auth_clients`, as Redis: `yes` requires a client certificate
//! signed by the CA, `optional` checks one if the client sends it, `no`
//! asks for none.

pub mod protected_mode;

use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ServerConfig, WebPkiClientVerifier};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;

pub use tokio_rustls::TlsAcceptor;
pub use tokio_rustls::server::TlsStream;

/// The default `tls_handshake_timeout_ms`.
pub const DEFAULT_TLS_HANDSHAKE_TIMEOUT_MS: u64 = 10_000;

/// Redis's `tls-auth-clients`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TlsAuthClients {
    /// A client certificate signed by the CA is required (Redis's default).
    #[default]
    Yes,
    /// No client certificate is asked for.
    No,
    /// A client certificate is checked if the client sends one.
    Optional,
}

impl FromStr for TlsAuthClients {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "yes" => Ok(TlsAuthClients::Yes),
            "no" => Ok(TlsAuthClients::No),
            "optional" => Ok(TlsAuthClients::Optional),
            other => Err(format!(
                "unknown tls_auth_clients '{other}' (expected yes, no or optional)"
            )),
        }
    }
}

/// A process's TLS settings as configured (node or proxy).
#[derive(Clone, Copy, Debug)]
pub struct TlsSettings<'a> {
    /// `None`: no TLS listener.
    pub port: Option<u16>,
    pub cert_file: Option<&'a Path>,
    pub key_file: Option<&'a Path>,
    pub ca_cert_file: Option<&'a Path>,
    pub auth_clients: TlsAuthClients,
    pub handshake_timeout_ms: u64,
}

impl TlsSettings<'_> {
    /// Checks the settings and, when TLS is on, loads the files into a
    /// server configuration. `Ok(None)`: TLS is off (and nothing TLS-only
    /// was set). The error is one line naming the setting.
    pub fn server_config(&self) -> Result<Option<Arc<ServerConfig>>, String> {
        if self.handshake_timeout_ms == 0 {
            return Err("tls_handshake_timeout_ms must be greater than 0".into());
        }
        let Some(_port) = self.port else {
            let stray = [
                ("tls_cert_file", self.cert_file.is_some()),
                ("tls_key_file", self.key_file.is_some()),
                ("tls_ca_cert_file", self.ca_cert_file.is_some()),
            ];
            if let Some((name, _)) = stray.iter().find(|(_, set)| *set) {
                return Err(format!(
                    "{name} is set but tls_port is not (the TLS settings go together)"
                ));
            }
            return Ok(None);
        };
        let cert_file = self
            .cert_file
            .ok_or("tls_port is set but tls_cert_file is not (the TLS settings go together)")?;
        let key_file = self
            .key_file
            .ok_or("tls_port is set but tls_key_file is not (the TLS settings go together)")?;
        let certs = read_certs("tls_cert_file", cert_file)?;
        let key = PrivateKeyDer::from_pem_file(key_file).map_err(|e| {
            format!(
                "tls_key_file {}: {}",
                key_file.display(),
                pem_error(&e, "private key")
            )
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?;
        let builder = match (self.auth_clients, self.ca_cert_file) {
            (TlsAuthClients::No, _) => builder.with_no_client_auth(),
            (auth, Some(ca_file)) => {
                let mut roots = RootCertStore::empty();
                for cert in read_certs("tls_ca_cert_file", ca_file)? {
                    roots.add(cert).map_err(|e| {
                        format!(
                            "tls_ca_cert_file {}: not a usable CA certificate: {e}",
                            ca_file.display()
                        )
                    })?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
                let verifier = if auth == TlsAuthClients::Optional {
                    verifier.allow_unauthenticated()
                } else {
                    verifier
                };
                let verifier = verifier
                    .build()
                    .map_err(|e| format!("tls_ca_cert_file {}: {e}", ca_file.display()))?;
                builder.with_client_cert_verifier(verifier)
            }
            (auth, None) => {
                return Err(format!(
                    "tls_auth_clients {} needs tls_ca_cert_file (the CA client certificates are checked against)",
                    auth.as_str()
                ));
            }
        };
        let config = builder.with_single_cert(certs, key).map_err(|e| {
            format!(
                "tls_key_file {} does not go with tls_cert_file {}: {e}",
                key_file.display(),
                cert_file.display()
            )
        })?;
        Ok(Some(Arc::new(config)))
    }

    /// [`TlsSettings::server_config`] as an acceptor.
    pub fn acceptor(&self) -> Result<Option<TlsAcceptor>, String> {
        Ok(self.server_config()?.map(TlsAcceptor::from))
    }
}

impl TlsAuthClients {
    /// The setting's value as written.
    pub fn as_str(self) -> &'static str {
        match self {
            TlsAuthClients::Yes => "yes",
            TlsAuthClients::No => "no",
            TlsAuthClients::Optional => "optional",
        }
    }
}

/// The certificates of a PEM file (at least one).
fn read_certs(setting: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| {
            format!(
                "{setting} {}: {}",
                path.display(),
                pem_error(&e, "certificate")
            )
        })?;
    if certs.is_empty() {
        return Err(format!(
            "{setting} {}: no PEM certificate in it",
            path.display()
        ));
    }
    Ok(certs)
}

/// One line for a PEM reading error.
fn pem_error(e: &rustls::pki_types::pem::Error, what: &str) -> String {
    use rustls::pki_types::pem::Error;
    match e {
        Error::Io(io) => format!("cannot read: {io}"),
        Error::NoItemsFound => format!("no PEM {what} in it"),
        other => format!("not valid PEM: {other:?}"),
    }
}

/// The server side of one connection's handshake, at most `timeout`.
/// The error says why (for the log); the caller counts it.
pub async fn handshake(
    acceptor: &TlsAcceptor,
    stream: TcpStream,
    timeout: Duration,
) -> Result<TlsStream<TcpStream>, String> {
    match tokio::time::timeout(timeout, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => Ok(tls),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no handshake within {} ms", timeout.as_millis())),
    }
}

/// What the client listeners (plain, TLS, replica endpoint; node and proxy
/// alike) close before serving: failed TLS handshakes and protected-mode
/// refusals. One struct so node and proxy export the same two counters.
#[derive(Clone, Debug, Default)]
pub struct AccessMetrics {
    /// TLS handshakes that failed or timed out (each closed only its
    /// connection).
    pub tls_handshake_failures: prometheus_client::metrics::counter::Counter,
    /// Connections refused by protected mode (see [`crate::protected_mode`]).
    pub protected_mode_refused: prometheus_client::metrics::counter::Counter,
}

impl AccessMetrics {
    /// Registers both counters in `registry` (its prefix names the process).
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "tls_handshake_failures",
            "TLS handshakes on the tls_port that failed or timed out (only that connection closed)",
            self.tls_handshake_failures.clone(),
        );
        registry.register(
            "protected_mode_refused_connections",
            "Non-loopback connections refused with -DENIED by protected mode",
            self.protected_mode_refused.clone(),
        );
    }
}
