//! Test certificates, generated per test (never committed): a CA, a server
//! certificate for 127.0.0.1 and localhost, and a client certificate, all
//! signed by the CA; plus a second, unrelated CA's client certificate.
//! Written as PEM files into a directory the test owns.

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use std::path::{Path, PathBuf};

/// The PEM files of one test's certificates.
pub struct Certs {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// A client certificate signed by another CA (not the server's).
    pub stranger_cert: PathBuf,
    pub stranger_key: PathBuf,
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

fn leaf(
    issuer: &CertifiedIssuer<'static, KeyPair>,
    names: &[&str],
    usage: ExtendedKeyUsagePurpose,
) -> (String, String) {
    let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    let mut params = CertificateParams::new(names).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "keyway test");
    params.extended_key_usages = vec![usage];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

impl Certs {
    /// Generates the certificates into `dir`.
    pub fn generate(dir: &Path) -> Certs {
        std::fs::create_dir_all(dir).unwrap();
        let authority = ca("keyway test CA");
        let other = ca("another CA");
        let (server_cert, server_key) = leaf(
            &authority,
            &["127.0.0.1", "localhost"],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let (client_cert, client_key) =
            leaf(&authority, &["client"], ExtendedKeyUsagePurpose::ClientAuth);
        let (stranger_cert, stranger_key) =
            leaf(&other, &["stranger"], ExtendedKeyUsagePurpose::ClientAuth);
        let write = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        Certs {
            ca: write("ca.pem", &authority.pem()),
            server_cert: write("server.pem", &server_cert),
            server_key: write("server.key", &server_key),
            client_cert: write("client.pem", &client_cert),
            client_key: write("client.key", &client_key),
            stranger_cert: write("stranger.pem", &stranger_cert),
            stranger_key: write("stranger.key", &stranger_key),
        }
    }

    /// `--tls-*` flags for a server on `port` with these files.
    pub fn server_flags(&self, port: u16, auth_clients: &str) -> Vec<String> {
        [
            "--tls-port",
            &port.to_string(),
            "--tls-cert-file",
            &self.server_cert.display().to_string(),
            "--tls-key-file",
            &self.server_key.display().to_string(),
            "--tls-ca-cert-file",
            &self.ca.display().to_string(),
            "--tls-auth-clients",
            auth_clients,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }
}
