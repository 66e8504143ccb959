//! `keyway-storage`: the storage engine of a Keyway node.
//!
//! A node stores its partitions' keys in one [`Engine`]: a map from *routing
//! key* to [`Value`] plus a per-node **change log** of every write, numbered by
//! a monotonic [`Seq`]. The change log feeds migration catch-up and
//! replication ([`Engine::changes_since`]); records received from other nodes
//! are applied with [`Engine::apply_foreign`] under last-writer-by-source-seq
//! rules ([`versioning`]).
//!
//! Two implementations pass the same [`conformance`] suite:
//! * [`FjallEngine`] — durable, on fjall 3 (LSM tree + journal);
//! * [`MemEngine`] — `BTreeMap`s behind a mutex, for tests and simulations.
//!
//! `FjallEngine` is behind the `fjall` feature (on by default; the workspace
//! dependency turns it off): crates that only carry the record and range
//! types on the wire (`keyway-peer`, the manager) do not link fjall.
//!
//! # Layout
//!
//! * [`value`] — [`Value`], [`Mutation`], [`ChangeRecord`] and their binary encodings;
//! * [`range`] — [`KeyRange`], half-open routing-key ranges;
//! * [`engine`] — the [`Engine`] trait and [`ScanChunk`];
//! * [`versioning`] — how local and foreign writes change a key's version (shared by both engines);
//! * [`digest`] — [`RangeDigest`], the stable content fingerprint of a range;
//! * [`error`] — [`StorageError`];
//! * [`mem`] — [`MemEngine`];
//! * [`faulty`] — [`FaultyEngine`], injected fsync failures and a machine-crash model (tests, `--fault-injection`);
//! * [`fjall_engine`] — [`FjallEngine`], on-disk layout and fjall caveats;
//! * [`fjall_options`] — [`FjallOptions`], its tuning and the limits checked at open;
//! * `conformance` (hidden): the shared test suite, usable by other crates'
//!   tests through [`conformance_tests!`].
//!
//! # What this crate owns, and what it must never do
//!
//! It owns the on-disk format of a node's data directory, seq assignment, the
//! change log and its truncation, and the versioning rules.
//!
//! It must **never**:
//! * interpret routing keys or check slot ownership: keys are opaque bytes
//!   that sort in partition order, ownership is the node's business;
//! * check expiry: expired values are stored and returned as is;
//! * be called from async worker threads: every call is synchronous and may
//!   block on disk I/O (fsync costs milliseconds); the node calls the engine
//!   from dedicated storage threads only;
//! * make a write durable before [`Engine::sync`] is called (group commit is
//!   the node's decision).

// Without the engine, its on-disk encodings (`StoredValue`, `Marker`) go unused.
#![cfg_attr(not(feature = "fjall"), allow(dead_code))]

pub mod change_tail;
pub mod digest;
pub mod engine;
pub mod error;
pub mod faulty;
#[cfg(feature = "fjall")]
pub mod fjall_engine;
#[cfg(feature = "fjall")]
pub mod fjall_options;
pub mod log_marks;
pub mod mem;
pub mod range;
pub mod value;
mod version_bounds;
pub mod versioning;

#[doc(hidden)]
pub mod conformance;

pub use digest::{Digester, RangeDigest};
pub use engine::{
    Engine, EngineMemory, ScanChunk, WrittenDigests, defer_os_flush_on_this_thread,
    os_flush_deferred_here,
};
pub use error::StorageError;
pub use faulty::{FaultState, FaultyEngine, SyncFault};
#[cfg(feature = "fjall")]
pub use fjall_engine::{FjallEngine, FjallOptions};
pub use mem::MemEngine;
pub use range::{KeyRange, prefix_successor};
pub use value::{
    ChangeRecord, MAX_KEY_LEN, Mutation, OP_BATCH_CONTINUES, Seq, Value, ValueKind, whole_batches,
};

#[cfg(all(test, feature = "fjall"))]
mod tests {
    use super::*;

    #[test]
    fn engines_are_usable_as_trait_objects() {
        let engines: Vec<Box<dyn Engine>> = vec![
            Box::new(MemEngine::new()),
            Box::new(FjallEngine::open_temporary(FjallOptions::for_tests()).unwrap()),
        ];
        for e in &engines {
            let k = bytes::Bytes::from_static(b"k");
            assert_eq!(e.apply(&[Mutation::Delete { key: k }]).unwrap(), 1);
        }
        let shared: std::sync::Arc<dyn Engine> = std::sync::Arc::new(MemEngine::new());
        assert_eq!(shared.last_seq(), 0);
    }
}
