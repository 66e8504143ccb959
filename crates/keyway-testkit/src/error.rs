//! [`HarnessError`]: what can go wrong starting or driving test processes.

use std::time::Duration;

/// Why a harness call failed.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// A binary the harness needs is not installed.
    #[error("`{binary}` was not found on PATH: run scripts/setup.sh (it installs {package})")]
    NotInstalled {
        binary: String,
        /// The Debian package that provides it.
        package: String,
    },
    /// An I/O call failed (spawning, creating a directory, ...).
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// A condition did not hold within its deadline.
    #[error("timed out after {after:?} waiting for {what}{}", fmt_tail(.log_tail))]
    Timeout {
        what: String,
        after: Duration,
        /// The end of the relevant log file, if there is one.
        log_tail: String,
    },
    /// The call does not make sense (member index out of range, ...).
    #[error("{0}")]
    Invalid(String),
}

fn fmt_tail(tail: &str) -> String {
    if tail.is_empty() {
        String::new()
    } else {
        format!("\n--- log tail ---\n{tail}")
    }
}

impl HarnessError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        HarnessError::Io {
            what: what.into(),
            source,
        }
    }
}
