//! The metadata store over gRPC (`proto/meta.proto`, package
//! `keyway.meta.v1`): [`server::serve`] exposes any [`crate::MetaStore`] on a
//! TCP listener, and [`client::RemoteMeta`] is a [`crate::MetaStore`] that
//! calls such a server. Maps and changes cross the wire in `keyway-map`'s
//! compact encoding; errors cross it exactly (see `convert.rs`).

pub mod client;
pub(crate) mod convert;
pub mod server;

/// Code generated from `proto/meta.proto` by `build.rs` (protox + tonic-prost-build).
#[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
pub mod pb {
    tonic::include_proto!("keyway.meta.v1");
}

/// Largest message either side accepts or sends (a map of every hash slot
/// as its own partition is well under 1 MiB).
pub(crate) const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
