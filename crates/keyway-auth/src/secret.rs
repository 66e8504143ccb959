//! [`ClusterSecret`]: the shared secret every internal link carries, read
//! from `--cluster-secret-file` and checked at start; the constant-time
//! comparison; and the process-wide secret a process's own clients send.
//!
//! The file holds the secret itself (e.g. `head -c 32 /dev/urandom | base64`);
//! one trailing newline (`\n` or `\r\n`) is trimmed. It must then hold at
//! least [`MIN_SECRET_BYTES`] bytes of printable ASCII without spaces, so it
//! travels unchanged in an HTTP header. A file readable by group or others
//! is accepted with a warning.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// The fewest bytes a cluster secret may have (after trimming the newline).
pub const MIN_SECRET_BYTES: usize = 16;
/// The most bytes a cluster secret may have.
pub const MAX_SECRET_BYTES: usize = 4096;

/// The flag every process names in its errors about the secret file.
pub const SECRET_FLAG: &str = "--cluster-secret-file";

/// Why a secret file was refused.
#[derive(thiserror::Error, Debug)]
pub enum SecretError {
    #[error("{SECRET_FLAG} {}: cannot read it: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{SECRET_FLAG} {}: {reason}", path.display())]
    Invalid { path: PathBuf, reason: String },
}

/// A cluster secret. Cheap to clone; `Debug` never shows it.
#[derive(Clone)]
pub struct ClusterSecret {
    bytes: Arc<[u8]>,
}

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClusterSecret({} bytes, redacted)", self.bytes.len())
    }
}

impl ClusterSecret {
    /// Reads and checks the secret file at `path`.
    pub fn from_file(path: &Path) -> Result<Self, SecretError> {
        let raw = std::fs::read(path).map_err(|source| SecretError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        warn_if_shared(path);
        Self::from_bytes(&raw).map_err(|reason| SecretError::Invalid {
            path: path.to_path_buf(),
            reason,
        })
    }

    /// `raw` as a secret (one trailing newline trimmed), or why not.
    pub fn from_bytes(raw: &[u8]) -> Result<Self, String> {
        let trimmed = raw
            .strip_suffix(b"\r\n")
            .or_else(|| raw.strip_suffix(b"\n"))
            .unwrap_or(raw);
        if trimmed.len() < MIN_SECRET_BYTES {
            return Err(format!(
                "the secret has {} bytes, at least {MIN_SECRET_BYTES} are needed \
                 (make one with: head -c 32 /dev/urandom | base64 > FILE)",
                trimmed.len()
            ));
        }
        if trimmed.len() > MAX_SECRET_BYTES {
            return Err(format!(
                "the secret has {} bytes, at most {MAX_SECRET_BYTES} are allowed",
                trimmed.len()
            ));
        }
        if !trimmed.iter().all(|b| (0x21..=0x7e).contains(b)) {
            return Err(
                "the secret must be printable ASCII without spaces or inner newlines \
                 (e.g. base64)"
                    .into(),
            );
        }
        Ok(ClusterSecret {
            bytes: trimmed.into(),
        })
    }

    /// Whether `candidate` is this secret, in time independent of where
    /// they differ.
    pub fn matches(&self, candidate: &[u8]) -> bool {
        constant_time_eq(&self.bytes, candidate)
    }

    /// The secret's bytes (printable ASCII).
    pub fn expose(&self) -> &[u8] {
        &self.bytes
    }

    /// `Bearer <secret>`, the `Authorization` value clients send.
    pub fn bearer(&self) -> String {
        format!(
            "Bearer {}",
            std::str::from_utf8(&self.bytes).expect("checked printable ASCII")
        )
    }
}

/// Compares two byte strings in time that depends only on their lengths
/// (the secret's length is not itself secret).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

#[cfg(unix)]
fn warn_if_shared(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    // Once per process: the file is read again by each check at start.
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if let Ok(meta) = std::fs::metadata(path)
        && meta.permissions().mode() & 0o077 != 0
        && !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed)
    {
        tracing::warn!(
            path = %path.display(),
            mode = format!("{:o}", meta.permissions().mode() & 0o777),
            "{SECRET_FLAG} is readable by group or others; chmod 600 it"
        );
    }
}

#[cfg(not(unix))]
fn warn_if_shared(_path: &Path) {}

static PROCESS_SECRET: OnceLock<ClusterSecret> = OnceLock::new();

/// Installs the secret this process's own clients send (peer, metadata and
/// admin calls). Set once at start by the binary; a second call with a
/// different secret is refused.
pub fn install_process_secret(secret: ClusterSecret) -> Result<(), String> {
    let installed = PROCESS_SECRET.get_or_init(|| secret.clone());
    if installed.matches(secret.expose()) {
        Ok(())
    } else {
        Err("a different cluster secret is already installed in this process".into())
    }
}

/// The secret installed by [`install_process_secret`], if any: the default
/// of every client's options.
pub fn process_secret() -> Option<ClusterSecret> {
    PROCESS_SECRET.get().cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_file_is_trimmed_and_checked() {
        let s = ClusterSecret::from_bytes(b"0123456789abcdef\n").unwrap();
        assert_eq!(s.expose(), b"0123456789abcdef");
        let s = ClusterSecret::from_bytes(b"0123456789abcdef\r\n").unwrap();
        assert_eq!(s.expose(), b"0123456789abcdef");
        let short = ClusterSecret::from_bytes(b"0123456789abcde\n").unwrap_err();
        assert!(short.contains("at least 16"), "{short}");
        assert!(ClusterSecret::from_bytes(b"0123456789 abcdef").is_err());
        assert!(ClusterSecret::from_bytes(b"0123456789abcdef\n\n").is_err());
        assert!(ClusterSecret::from_bytes(&[b'a'; MAX_SECRET_BYTES + 1]).is_err());
        assert!(!format!("{s:?}").contains("0123"), "Debug redacts");
    }

    #[test]
    fn from_file_names_the_flag() {
        let dir = tempfile::tempdir().unwrap();
        let missing = ClusterSecret::from_file(&dir.path().join("nope")).unwrap_err();
        assert!(missing.to_string().starts_with("--cluster-secret-file "));
        let path = dir.path().join("short");
        std::fs::write(&path, "abc\n").unwrap();
        let short = ClusterSecret::from_file(&path).unwrap_err().to_string();
        assert!(short.contains("--cluster-secret-file") && short.contains("at least 16"));
        std::fs::write(&path, "0123456789abcdefXYZ\n").unwrap();
        assert!(
            ClusterSecret::from_file(&path)
                .unwrap()
                .matches(b"0123456789abcdefXYZ")
        );
    }

    #[test]
    fn comparison_needs_every_byte() {
        assert!(constant_time_eq(b"abcdef", b"abcdef"));
        assert!(!constant_time_eq(b"abcdef", b"abcdeg"));
        assert!(!constant_time_eq(b"abcdef", b"bbcdef"));
        assert!(!constant_time_eq(b"abcdef", b"abcde"));
        assert!(!constant_time_eq(b"", b"a"));
        let s = ClusterSecret::from_bytes(b"0123456789abcdef").unwrap();
        assert!(s.matches(b"0123456789abcdef"));
        assert!(!s.matches(b"0123456789abcdeF"));
        assert_eq!(s.bearer(), "Bearer 0123456789abcdef");
    }
}
