//! [`FjallOptions`]: the tuning of a [`crate::FjallEngine`], with the
//! limits fjall itself enforces checked up front (fjall panics on them).

use crate::error::StorageError;

/// [`FjallOptions::change_tail_bytes`]'s default.
pub const DEFAULT_CHANGE_TAIL_BYTES: usize = 4 * 1024 * 1024;

/// Tuning for [`FjallEngine::open`]. `Default` suits a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FjallOptions {
    /// Block cache capacity in bytes (fjall recommends 20–25 % of RAM, more if
    /// the data set fits). Default 256 MiB.
    pub cache_size_bytes: u64,
    /// fjall background worker threads (flush/compaction); `None` = fjall's
    /// default, min(cores, 4).
    pub worker_threads: Option<usize>,
    /// Cap on the total size of fjall journals before memtables are flushed;
    /// `None` = fjall's default (512 MiB). Must be >= 64 MiB.
    pub max_journaling_size_bytes: Option<u64>,
    /// Memtable size per keyspace before it is flushed to a table; `None` =
    /// fjall's default (64 MiB). Small memtables flush often, which drops
    /// overwritten versions and lets journals go sooner. Applies to
    /// keyspaces created by this open (fjall keeps an existing keyspace's
    /// setting). Must be >= 1 MiB.
    pub max_memtable_bytes: Option<u64>,
    /// Size past which the active journal is sealed so it can be deleted
    /// once flushed; `None` = 64 MB (upstream fjall's fixed value; the
    /// setting comes from Keyway's fjall patch, `vendor/fjall`). Must be
    /// >= 1 MiB.
    pub journal_rotation_bytes: Option<u64>,
    /// Delete the directory when the engine is dropped (tests). Default `false`.
    pub temporary: bool,
    /// Hand every committed batch to the OS before `apply` returns (one
    /// `write(2)` per batch, no fsync), so a process crash loses nothing
    /// applied; `false` = batches wait in fjall's 8 KiB user-space journal
    /// buffer until [`Engine::sync`]. Default `false`.
    pub flush_journal_each_batch: bool,
    /// Bytes of the newest change records kept in memory, so readers that
    /// keep up with the log (replication streams, migration pushes) do not
    /// read it back (`change_tail.rs`); 0 keeps none. Default 4 MiB.
    pub change_tail_bytes: usize,
}

impl Default for FjallOptions {
    fn default() -> Self {
        FjallOptions {
            cache_size_bytes: 256 * 1024 * 1024,
            worker_threads: None,
            max_journaling_size_bytes: None,
            max_memtable_bytes: None,
            journal_rotation_bytes: None,
            temporary: false,
            flush_journal_each_batch: false,
            change_tail_bytes: DEFAULT_CHANGE_TAIL_BYTES,
        }
    }
}

impl FjallOptions {
    /// Small footprint for tests: 8 MiB cache, one worker thread, temporary.
    pub fn for_tests() -> Self {
        FjallOptions {
            cache_size_bytes: 8 * 1024 * 1024,
            worker_threads: Some(1),
            max_journaling_size_bytes: None,
            max_memtable_bytes: None,
            journal_rotation_bytes: None,
            temporary: true,
            flush_journal_each_batch: false,
            change_tail_bytes: DEFAULT_CHANGE_TAIL_BYTES,
        }
    }
}

impl FjallOptions {
    /// The limits fjall asserts, as errors instead of panics.
    pub fn validate(&self) -> Result<(), StorageError> {
        let opts = self;
        if let Some(j) = opts.max_journaling_size_bytes
            && j < 64 * 1024 * 1024
        {
            return Err(StorageError::InvalidArgument(
                "max_journaling_size_bytes must be >= 64 MiB",
            ));
        }
        if let Some(m) = opts.max_memtable_bytes
            && m < 1024 * 1024
        {
            return Err(StorageError::InvalidArgument(
                "max_memtable_bytes must be >= 1 MiB",
            ));
        }
        if let Some(r) = opts.journal_rotation_bytes
            && r < 1024 * 1024
        {
            return Err(StorageError::InvalidArgument(
                "journal_rotation_bytes must be >= 1 MiB",
            ));
        }
        if opts.worker_threads == Some(0) {
            return Err(StorageError::InvalidArgument("worker_threads must be >= 1"));
        }
        Ok(())
    }
}
