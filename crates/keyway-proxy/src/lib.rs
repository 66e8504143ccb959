//! `keyway proxy`: the intermediate routing tier (seed 000's "proxy nodes").
//!
//! Any Redis client without cluster support connects to a proxy as if it
//! were one Redis server; the proxy routes every command to the owner of
//! its key's partition, carrying the epoch it routed by (`KW.AT <partition>
//! <epoch> <command...>`), follows the nodes' rejections itself and hands
//! back only the answer. Clients never see `MOVED`, `ASK` or `KWMOVED`.
//!
//! The proxy holds the partition map once for all its clients: loaded from
//! the metadata store at start, kept fresh by watching it (deltas, a full
//! reload on a gap), and patched at once from a `-KWMOVED` rejection (the
//! higher epoch wins), so its staleness is a watch's delay, not a client's
//! refresh interval. It owns nothing else: no data, no ownership decision,
//! no state shared with other proxies (several run side by side, each with
//! its own map copy; the metadata store is all they share). It must never
//! act on a guess — a node that disagrees with the epoch rejects, and the
//! proxy retries — and never re-send a command whose first attempt may have
//! applied unless running it twice is harmless ([`forward::retry_safe`]).
//!
//! # Layout
//! - `config.rs`: [`ProxyConfig`], every limit named and validated at start.
//! - `server.rs`: [`Proxy`]: start (ready after the first map), accept loop
//!   with `max_clients`, graceful shutdown; [`server::Core`], the shared state.
//! - `connection.rs`: one client connection: pipelined requests run
//!   concurrently, replies in order, requests on one key in order.
//! - `command.rs`: which commands are forwarded and which answered here
//!   (PING, ECHO, HELLO, AUTH, SELECT 0, CLIENT, COMMAND, INFO, CONFIG GET,
//!   QUIT; CLUSTER and friends are refused: plain mode).
//! - `router.rs`: [`router::Router`], the map (store's map + rejection
//!   patches), the watch loop, locating a key's owner and epoch.
//! - `forward.rs`: one request to one owner, the retry rules, `KWMOVED` parsing.
//! - `upstream.rs`: pipelined node connections (many clients' requests in
//!   flight on one connection, replies matched in order), failures
//!   classified as not-sent or ambiguous.
//! - `multikey.rs`: MGET, MSET, DEL, UNLINK, EXISTS across slots: split by
//!   slot, sent concurrently, reassembled in key order (cross-slot MSET is
//!   not atomic).
//! - `metrics.rs`: Prometheus metrics and the admin port (`/metrics`, `/status`).

pub mod command;
pub mod config;
pub mod connection;
pub mod forward;
pub mod metrics;
pub mod multikey;
pub mod router;
pub mod server;
pub mod transaction;
pub mod upstream;

pub use config::ProxyConfig;
pub use metrics::Status;
pub use server::{Proxy, ProxyError};
