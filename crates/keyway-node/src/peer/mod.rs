//! The `Peer` gRPC service as a node serves it on its **admin port**
//! (merged into the admin HTTP router, see [`server::merge_routes`]). The
//! contract, the client and the wire types are the `keyway_peer` crate (see
//! its overview for the copy process and why it converges); the names below
//! are re-exported for the node's own modules.
//!
//! Every engine call runs under `tokio::task::spawn_blocking`.

pub mod replicate_stream;
pub mod server;

pub use keyway_peer::{
    FenceDigests, MAX_APPLY_RECORDS, MAX_CHANGES_RECORDS, MAX_CHUNK_BYTES, MAX_DROP_ENTRIES,
    MAX_MESSAGE_BYTES, MAX_SNAPSHOT_ENTRIES, PeerClient, PeerError, PeerOptions, PushSpec,
    PushStatus, Throttle, pb,
};
pub use server::{NodeRoles, PeerService, merge_routes, serve_engine};

/// How many entries the server reads per engine scan while filling one
/// `Snapshot` chunk (bounds the over-read past the byte cap).
pub(crate) const SCAN_BATCH: usize = 256;
