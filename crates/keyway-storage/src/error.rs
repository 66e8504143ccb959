//! The single error type of the storage API.

use crate::value::Seq;

/// Everything that can go wrong in an [`crate::Engine`] call.
///
/// `Fjall`/`Io` errors are environmental (disk full, I/O failure); after a
/// journal write failure fjall poisons the database and every later write
/// fails too, so the node should treat them as fatal for this engine.
#[derive(thiserror::Error, Debug)]
#[non_exhaustive]
pub enum StorageError {
    /// Error reported by fjall.
    #[cfg(feature = "fjall")]
    #[error("fjall: {0}")]
    Fjall(#[from] fjall::Error),
    /// Plain I/O error (e.g. creating the data directory).
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    /// Stored bytes could not be decoded.
    #[error("corrupt {what}: {detail}")]
    Corrupt {
        /// Which kind of record.
        what: &'static str,
        /// What was wrong.
        detail: String,
    },
    /// The data directory was written by an incompatible format version.
    #[error("unsupported on-disk format {found} (this build reads {expected})")]
    UnsupportedFormat {
        /// Format number found in the directory.
        found: u32,
        /// Format number this build understands.
        expected: u32,
    },
    /// [`crate::Engine::changes_since`] asked for records that were already truncated:
    /// the caller must fall back to a full copy (scan) and resume from the scan's seq.
    #[error(
        "change log truncated: records after seq {after} requested, oldest retained seq is {log_start}"
    )]
    LogTruncated {
        /// The `after` argument.
        after: Seq,
        /// Oldest seq still in the log.
        log_start: Seq,
    },
    /// A key that cannot be stored (empty or longer than [`crate::MAX_KEY_LEN`]).
    #[error("invalid key of {len} bytes: {reason}")]
    InvalidKey {
        /// Key length.
        len: usize,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// An argument outside the accepted domain (e.g. `limit == 0`).
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    /// The caller stopped using this engine after a fatal failure (a failed
    /// fsync: see the node's fail-stop); every later call fails the same way.
    /// The text says why and is meant for the client as is.
    #[error("{0}")]
    Failed(String),
    /// An fsync the engine made on its own (not [`crate::Engine::sync`]:
    /// the one that makes a log truncation durable before the log's tables
    /// are dropped) failed. As fatal as a failed `sync`: the node's
    /// fail-stop latches on it.
    #[error("fsync failed: {0}")]
    SyncFailed(String),
}
