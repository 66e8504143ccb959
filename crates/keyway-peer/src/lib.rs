//! The node-to-node data plane's vocabulary: the `Peer` gRPC service's
//! contract (`proto/peer.proto`, package `keyway.peer.v1`, compiled by
//! `build.rs` with protox, no `protoc`), [`PeerClient`], its typed client,
//! and the wire types the manager, the proxy and the tools exchange with
//! nodes. Every node serves the service on its **admin port**; the *server*
//! is `keyway_node::peer::server` (it touches the engine and the migration
//! roles). This crate links neither the engine nor the node, so the manager
//! and the proxy can call nodes without them.
//!
//! Reads check no ownership. The `Migrate*` calls hand over to the node's
//! migration roles (`keyway_node::migrate`), which hold the volatile migration
//! state; the manager decides *what* to call and *when*. The data-changing
//! calls (`ApplyForeign`, `DropRangeChunk`) name their migration
//! ([`MigrationRef`]) and a node checks them under its routing guard
//! (`keyway_node::migrate::receive`), refusing with a [`RefusalReason`].
//!
//! # Layout
//! - `client.rs`: [`PeerClient`], [`PeerOptions`], [`PeerError`], and
//!   [`copy_range`]/[`catch_up`], a range copied from outside.
//! - `control.rs`: the migration-role calls ([`PushSpec`], [`Throttle`],
//!   [`PushStatus`], [`FenceDigests`], [`PartitionView`]).
//! - `migration.rs`: [`MigrationRef`], [`RefusalReason`] and their messages.
//! - `stats.rs`: [`stats::NodeReport`], the `PartitionStats` answer.
//! - `copies.rs`: [`copies::CopyReport`], one copy's cost as nodes report it.
//! - `admin.rs`: [`admin::nodelay`], the admin port's listener (node and manager).
//!
//! A live migration's copy and catch-up run **inside the source**
//! (`keyway_node::migrate::push`, reading its own engine and applying at the target
//! with `ApplyForeign`). [`copy_range`] and [`catch_up`] do
//! the same from outside, over `Snapshot` and `Changes`; today only tests and
//! tools use them (`keyway-node/tests/peer.rs` carries their convergence tests).
//!
//! # Process overview (copying range R from source S to target T from outside)
//!
//! 1. **Clean target.** `drop_range_chunk(R)` on T until it returns 0, so no
//!    leftovers of an earlier (aborted) attempt survive.
//! 2. **COPYING.** [`copy_range`]: page through R on S with
//!    `Snapshot` chunks and apply every entry on T with `ApplyForeign`.
//!    Remember `snapshot_seq`, the seq of the **first** chunk.
//! 3. **CATCHUP.** [`catch_up`] from `snapshot_seq`: `Changes` on S
//!    filtered to R, applied on T with `ApplyForeign`; repeat from the
//!    returned seq until the lag (`head_seq - last_seq`) is small. A
//!    [`PeerError::LogTruncated`] means S already dropped records the
//!    copy needs: start over at step 1.
//! 4. **DUAL / CUTOVER.** (The node's write path, `keyway_node::migrate`.) At the
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
//! `Put` **with seq `as_of`** ([`SnapshotEntry::to_change_record`]).
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

pub mod admin;
pub mod client;
pub mod control;
pub mod copies;
pub mod migration;
pub mod replicate_stream;
pub mod stats;

pub use client::{
    Applied, ChangesChunk, CopyChunk, CopyReport, PeerClient, PeerError, PeerOptions,
    SnapshotChunk, SnapshotEntry, catch_up, copy_range,
};
pub use control::{FenceDigests, PartitionView, PushSpec, PushStatus, Throttle};
pub use migration::{MigrationRef, RefusalReason};

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
/// Longest a `PartitionView` call waits for an install (longer waits are
/// clamped; well under every caller's RPC deadline).
pub const MAX_VIEW_WAIT_MS: u64 = 5_000;
/// Most entries one `DropRangeChunk` call deletes (larger requests are clamped).
pub const MAX_DROP_ENTRIES: u32 = 10_000;
/// Largest gRPC message either side sends or accepts. Above the chunk caps
/// because an entry larger than a cap travels alone: this bounds the largest
/// value that can move (the node's default `max_value_bytes` is 512 MiB).
pub const MAX_MESSAGE_BYTES: usize = 640 * 1024 * 1024;
