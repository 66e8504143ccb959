//! The node-to-node migration data plane: the `Peer` gRPC service
//! (`proto/peer.proto`, package `keyway.peer.v1`) that every node serves on
//! its **admin port** (merged into the admin HTTP router, see
//! [`server::merge_routes`]), and [`client::PeerClient`], its typed client.
//!
//! Reads check no ownership. The `Migrate*` calls hand over to the node's
//! migration roles (`crate::migrate`), which hold the volatile migration
//! state; the manager decides *what* to call and *when*. The data-changing
//! calls (`ApplyForeign`, `DropRangeChunk`) name their migration and a node
//! checks them under its routing guard (`crate::migrate::receive`).
//!
//! A live migration's copy and catch-up run **inside the source**
//! (`crate::migrate::push`, reading its own engine and applying at the target
//! with `ApplyForeign`). [`client::copy_range`] and [`client::catch_up`] do
//! the same from outside, over `Snapshot` and `Changes`; today only tests and
//! tools use them (they carry the convergence tests below).
//!
//! # Process overview (copying range R from source S to target T from outside)
//!
//! 1. **Clean target.** `drop_range_chunk(R)` on T until it returns 0, so no
//!    leftovers of an earlier (aborted) attempt survive.
//! 2. **COPYING.** [`client::copy_range`]: page through R on S with
//!    `Snapshot` chunks and apply every entry on T with `ApplyForeign`.
//!    Remember `snapshot_seq`, the seq of the **first** chunk.
//! 3. **CATCHUP.** [`client::catch_up`] from `snapshot_seq`: `Changes` on S
//!    filtered to R, applied on T with `ApplyForeign`; repeat from the
//!    returned seq until the lag (`head_seq - last_seq`) is small. A
//!    [`client::PeerError::LogTruncated`] means S already dropped records the
//!    copy needs: start over at step 1.
//! 4. **DUAL / CUTOVER.** (The node's write path, `crate::migrate`.) At the
//!    fence the source compares digests of R on both sides (`MigrateDigest`).
//! 5. **CLEANUP.** `drop_range_chunk(R)` on S until it returns 0.
//!
//! # Why a fuzzy snapshot plus replay from the first chunk's seq converges
//!
//! Each `Snapshot` call reads from fresh engine snapshots (a long-open
//! snapshot would pin old versions in the LSM tree), so the chunks of one copy
//! reflect different moments: a write between two chunks may or may not be in
//! a later chunk. Every entry carries `as_of`, the source seq of the engine
//! snapshot it was read from: all source records with `seq <= as_of` are
//! reflected in it, none after. The target applies the entry as a foreign
//! `Put` **with seq `as_of`** ([`client::SnapshotEntry::to_change_record`]).
//! Catch-up then replays every source record for R with
//! `seq > snapshot_seq` (the first chunk's seq, `<= every as_of`):
//! * a replayed record with `seq <= as_of` of a copied key is already in the
//!   copied value, and the engine's versioning rule ignores it (its seq is not
//!   newer than the key's base seq / version `as_of`);
//! * a record with `seq > as_of` (a `Put`, a `Delete`, a `SetExpiry`) is
//!   newer than the copied value and wins, as it did on the source;
//! * a key deleted before its chunk was read is simply absent from the copy;
//!   a key written after its chunk was read is covered by the replay, because
//!   `snapshot_seq <= as_of` of every chunk. (Starting catch-up at the *last*
//!   chunk's seq instead would lose every write that landed on an
//!   already-copied key while later chunks were read.)
//!
//! The version is `as_of`, **not** the source value's own `version`: a source
//! that itself received the range by migration holds versions from *another*
//! node's seq space, which are not comparable with the source's log seqs, so a
//! later `Delete` replayed from the source's log could lose against them.
//! `as_of` is always in the source's seq space and is `>=` the seq of every
//! record that shaped the value.
//!
//! Because the final state of `apply_foreign` depends only on the *set* of
//! records received, re-running any step (a retried chunk, an overlapping
//! catch-up) is harmless.
//!
//! # Limits
//!
//! Every call is chunked and bounded; requests above a limit are clamped,
//! zero limits are refused with `INVALID_ARGUMENT` (see the constants below).
//! Every engine call runs under `tokio::task::spawn_blocking`.

pub mod client;
pub mod control;
pub mod server;

pub use crate::migrate::{MigrationRef, RefusalReason};
pub use client::{
    Applied, ChangesChunk, CopyChunk, CopyReport, PeerClient, PeerError, PeerOptions,
    SnapshotChunk, SnapshotEntry, catch_up, copy_range,
};
pub use control::{FenceDigests, PartitionView, PushSpec, PushStatus, Throttle};
pub use server::{NodeRoles, PeerService, merge_routes, serve_engine};

/// Code generated from `proto/peer.proto` by `build.rs` (protox + tonic-prost-build).
#[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
pub mod pb {
    tonic::include_proto!("keyway.peer.v1");
}

/// Most entries one `Snapshot` call returns (larger requests are clamped).
pub const MAX_SNAPSHOT_ENTRIES: u32 = 10_000;
/// Most payload bytes (key + data) one `Snapshot` chunk, or encoded record
/// bytes one `Changes` answer, carries (larger requests are clamped). A single
/// entry or record larger than the cap travels alone.
pub const MAX_CHUNK_BYTES: u64 = 16 * 1024 * 1024;
/// Most log records one `Changes` call examines (larger requests are clamped).
pub const MAX_CHANGES_RECORDS: u32 = 10_000;
/// Most records one `ApplyForeign` call accepts (more is `INVALID_ARGUMENT`:
/// a write cannot be clamped).
pub const MAX_APPLY_RECORDS: usize = 10_000;
/// Most entries one `DropRangeChunk` call deletes (larger requests are clamped).
pub const MAX_DROP_ENTRIES: u32 = 10_000;
/// Largest gRPC message either side sends or accepts. Above the chunk caps
/// because an entry larger than a cap travels alone: this bounds the largest
/// value that can move (the node's default `max_value_bytes` is 512 MiB).
pub const MAX_MESSAGE_BYTES: usize = 640 * 1024 * 1024;
/// How many entries the server reads per engine scan while filling one
/// `Snapshot` chunk (bounds the over-read past the byte cap).
pub(crate) const SCAN_BATCH: usize = 256;
