//! A Keyway node: one storage server process that serves the partitions it
//! owns over the Redis Cluster protocol (RESP2 and RESP3).
//!
//! The node owns its data directory, its storage engine and its copy of the
//! partition map. It must never accept a write for a partition it does not
//! own at the request's epoch (invariant 1 and 3), never apply a write with
//! authority it checked outside the write's critical section (invariant 2),
//! and never serve once its lease has lapsed (invariant 4). It never decides
//! ownership: the metadata store and the manager do.
//!
//! # Layout
//! - `config.rs`: [`NodeConfig`], every limit named and validated at start.
//! - `server.rs`: [`Node`]: start, accept loop, graceful shutdown.
//! - `connection.rs`: one client connection: read frames, dispatch, write replies.
//! - `session.rs`: per-connection state (protocol, name, auth).
//! - `routing.rs`: [`routing::Routing`], the node's view of the map plus its lease;
//!   the ownership check and the rejections it produces.
//! - `executor.rs`: storage threads; the check and the write's effect run
//!   together on them; group commit of replies behind one fsync.
//! - `db.rs`: the per-command overlay over the storage engine.
//! - `cmd/`: the Redis data commands, one file per family.
//! - `node_cmd.rs`: connection and server commands (PING, HELLO, AUTH, CLIENT, INFO, ...).
//! - `cluster_cmd.rs`: `CLUSTER ...` replies built from the map.
//! - `scan.rs`: SCAN with server-side cursors.
//! - `lease.rs`: the lease keeper (deadline on a monotonic clock).
//! - `watcher.rs`: keeps the map fresh from the metadata store.
//! - `map_history.rs`: the bounded history of map changes behind
//!   `KW.MAP SINCE <version>` (a delta, or the whole map when the history
//!   does not reach back that far).
//! - `admin.rs`: the admin HTTP port: `/metrics`, `/map`, `/status`, and the `Peer` gRPC service.
//! - `peer/`: the migration data plane: the `Peer` gRPC service (snapshot chunks,
//!   change log, digest, foreign apply, range drop, the `Migrate*` role calls) and its
//!   client; `copy_range`/`catch_up` copy a range from outside (tests, tools).
//! - `migrate/`: the migration source role: the push to the target (copy,
//!   catch-up, dual writes), the cutover fence, fences recovered at start.
//! - `stats/`: per-partition load statistics: request rates, sampled hot keys
//!   (space-saving top-k), the load and size split keys, the background size
//!   scan; served by the `PartitionStats` Peer RPC and `/hotkeys`.
//! - `kw/`: the keyspace commands `KW.GET`/`KW.SET`/`KW.DEL`/`KW.SCAN` (any
//!   keyspace by name), the ordered cross-partition `KW.SCAN` walk and the
//!   `RangeScan` Peer call it uses.
//! - `log_gc.rs`: the change log stays bounded: log holds (what migrations
//!   still need) and the background truncator with its retention limit.
//! - `replicate/`: replication, node side: the primary's streams to its
//!   replicas (durable records only), the replica's check and apply, the
//!   catch-up copy, the in-sync rules (pure) and their CASes, switchover.
//! - `active_expire.rs`: the background active expiry cycle.
//! - `metrics.rs`: Prometheus metrics.
//! - `storage_health.rs`: fail-stop after an fsync failure (the latch, the engine wrapper).
//! - `clock.rs`: the clock trait (wall and monotonic time), for simulation.

pub(crate) mod acl;
pub(crate) mod active_expire;
pub(crate) mod admin;
pub(crate) mod blocking;
pub(crate) mod clients;
pub mod clock;
pub(crate) mod cluster_cmd;
pub mod cmd;
pub mod coll;
pub(crate) mod config;
pub(crate) mod connection;
pub(crate) mod copies;
pub mod db;
pub(crate) mod executor;
pub(crate) mod flush;
pub mod info;
pub mod kw;
pub(crate) mod lease;
pub(crate) mod log_gc;
pub mod map_history;
pub(crate) mod memory;
pub mod metrics;
pub(crate) mod migrate;
pub(crate) mod multi;
pub(crate) mod node_cmd;
pub(crate) mod node_keys;
pub mod peer;
pub mod replica_endpoint;
pub mod replicate;
pub(crate) mod replication_info;
pub(crate) mod routing;
pub mod scan;
pub mod script;
pub mod server;
pub(crate) mod server_cmd;
pub(crate) mod session;
pub(crate) mod slowlog;
pub mod stats;
pub(crate) mod storage_health;
pub(crate) mod stray_sweep;
pub(crate) mod watcher;

// TLS and protected mode are keyway-tls (shared with the proxy); the node's
// modules keep naming them `crate::tls` and `crate::protected_mode`.
use keyway_tls as tls;
use keyway_tls::protected_mode;

pub use config::{Durability, EngineKind, MIN_STORAGE_CACHE_BYTES, NodeConfig};
pub use server::{Node, NodeError};
