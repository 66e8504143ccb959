//! The metadata store: the authoritative home of the partition map, the node
//! registry and leases.
//!
//! This crate owns the [`MetaStore`] trait and its contract (every ownership
//! change is a compare-and-set conditional on the expected owner and epoch,
//! invariant 6; watchers get every change after a map version; leases with
//! keep-alive, invariant 4; leader election for the manager seat; durable
//! migration records, each transition a compare-and-set, invariant 7), the
//! embedded durable backend ([`EmbeddedMeta`]: single node, one state
//! file), the etcd backend ([`EtcdMeta`]), the gRPC server
//! ([`serve`]) and client ([`RemoteMeta`]) that let other processes reach an
//! embedded store, and [`connect`], which opens any of them from a URL.
//!
//! It must never be on the request path of a data command: nodes, proxies
//! and clients route from their own copy of the map (refreshed by `watch`,
//! corrected by rejections) and only the control plane calls the store. It
//! never decides who should own a partition (the manager does), and never
//! accepts a map that fails [`keyway_map::PartitionMap::validate`].
//!
//! # Layout
//! - `store.rs`: the [`MetaStore`] trait, [`MapTxn`], [`MapUpdate`],
//!   [`MapWatch`], [`LeaseId`], [`LeaseInfo`], [`StoredMigration`],
//!   [`bootstrap_txn`].
//! - `error.rs`: [`MetaError`].
//! - `embedded.rs`: [`EmbeddedMeta`]: one lock, durable commits, watchers;
//!   `embedded/state.rs`: the state and its file (write-temp, fsync,
//!   rename, fsync dir); `embedded/lease.rs`: the lease table;
//!   `embedded/election.rs`: election queues.
//! - `etcd.rs`: [`EtcdMeta`] on etcd v3 (key layout in `docs/etcd.md`);
//!   `etcd/{conn,layout,map,nodes,lease,watch,election}.rs`, one concept each.
//! - `rpc.rs`: the gRPC surface of `proto/meta.proto`; `rpc/server.rs`:
//!   [`serve`]; `rpc/client.rs`: [`RemoteMeta`]; `rpc/convert.rs`: message
//!   and exact error conversions.
//! - `url.rs`: [`connect`] (`keyway://host:port`, `etcd://h:p[,h:p]/prefix`,
//!   `file:///abs/dir`).
//! - `conformance/`: the tests every backend must pass (hidden; the
//!   backends' integration tests instantiate them).
//!
//! `build.rs` compiles our own `proto/meta.proto` with protox and
//! tonic-prost-build (no `protoc`); so does the etcd-client dependency,
//! built from `vendor/etcd-client` (its build script patched to use protox).

mod embedded;
mod error;
mod etcd;
pub mod rpc;
mod store;
mod url;

#[doc(hidden)]
pub mod conformance;

pub use embedded::{
    EmbeddedMeta, EmbeddedOptions, JOURNAL_FILE, LOCK_FILE, MAX_LEASE_TTL_MS, STATE_FILE,
};
pub use error::MetaError;
pub use etcd::{EtcdMeta, EtcdOptions};
pub use rpc::client::{RemoteMeta, RemoteOptions};
pub use rpc::server::{serve, serve_with_secret};
pub use store::{
    AclRecord, LeaderWatch, Leadership, LeaseId, LeaseInfo, MapTxn, MapUpdate, MapWatch, MetaStore,
    MigrationPut, Replication, StoredMigration, acl_unsupported, bootstrap_txn,
    election_unsupported,
};
pub use url::{connect, connect_with};
