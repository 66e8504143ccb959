//! The replica endpoint: a node's second RESP listener, for its replica role.
//!
//! A Keyway node is usually the primary of some partitions and a replica of
//! others. Redis clients give each *address* one role (redis-py the role of
//! its first appearance in `CLUSTER SLOTS`; ioredis keeps a node that is
//! master of anything as a master connection and never sends it
//! `READONLY`), so a node advertised once for both roles is mislabelled.
//! The replica endpoint gives the replica role its own address and its own
//! Redis node id ([`keyway_map::NodeId::replica_role_id`]): to every client a
//! node is one master process (the main address, its owned slots) plus one
//! replica process (this address, listed after the primaries whose
//! partitions it holds in sync), as in Redis.
//!
//! A connection here starts in `READONLY` mode, so its reads are admitted by
//! [`crate::routing::RoutingGuard::admit_replica_read`] (`READWRITE` turns that
//! off: reads of other nodes' partitions are then `-MOVED`, as on a Redis
//! replica); a write is always `-MOVED` to the partition's primary's main
//! address, even when this node is that primary. The `KW.*` data commands are
//! refused (the smart client uses main addresses only).
//!
//! `--replica-listen` ([`ReplicaListen`]): `auto` (default) binds the main
//! listener's IP on a free port, `off` disables it, `HOST:PORT` binds there.
//! The address registered in the map is the bound one, or, with `--announce`,
//! the announced host with the bound port. The node writes it into its
//! `NodeInfo` after registering, and again whenever its map shows another
//! value ([`keep_advertised`]): registration keeps the previous value, and
//! an unconditional node upsert of a stale copy could drop it.

use crate::server::Shared;
use keyway_map::{MapChange, NodeId};
use keyway_meta::{MapTxn, MetaError, MetaStore};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Where the replica endpoint listens (`--replica-listen`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum ReplicaListen {
    /// The main listener's IP, a free port (default).
    #[default]
    Auto,
    /// No replica endpoint: the node's copies are not advertised as read
    /// targets (clients read from primaries only).
    Off,
    /// This address.
    At(SocketAddr),
}

impl ReplicaListen {
    /// The address to bind, given the main listener's.
    pub fn bind_addr(self, listen: SocketAddr) -> Option<SocketAddr> {
        match self {
            ReplicaListen::Auto => Some(SocketAddr::new(listen.ip(), 0)),
            ReplicaListen::Off => None,
            ReplicaListen::At(addr) => Some(addr),
        }
    }

    /// Start-up check: an explicit address must not be a port the node's
    /// other listeners ask for.
    pub fn validate(self, listen: SocketAddr, admin_listen: SocketAddr) -> Result<(), String> {
        if let ReplicaListen::At(addr) = self
            && addr.port() != 0
            && [listen, admin_listen]
                .iter()
                .any(|other| other.port() == addr.port() && other.ip() == addr.ip())
        {
            return Err(format!(
                "replica_listen {addr} is the address of another listener of this node"
            ));
        }
        Ok(())
    }
}

impl FromStr for ReplicaListen {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(ReplicaListen::Auto),
            "off" => Ok(ReplicaListen::Off),
            addr => addr.parse().map(ReplicaListen::At).map_err(|_| {
                format!("replica_listen '{addr}' is not auto, off or an IP:PORT address")
            }),
        }
    }
}

impl TryFrom<String> for ReplicaListen {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl fmt::Display for ReplicaListen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplicaListen::Auto => f.write_str("auto"),
            ReplicaListen::Off => f.write_str("off"),
            ReplicaListen::At(addr) => write!(f, "{addr}"),
        }
    }
}

impl From<ReplicaListen> for String {
    fn from(r: ReplicaListen) -> String {
        r.to_string()
    }
}

/// The address clients are told for the replica endpoint bound at `bound`:
/// with `announce` (`host:port` of the main listener) its host, else the
/// bound address.
pub fn advertised_addr(bound: SocketAddr, announce: Option<&str>) -> String {
    match announce.and_then(|a| a.rsplit_once(':')) {
        Some((host, _)) => format!("{host}:{}", bound.port()),
        None => bound.to_string(),
    }
}

/// Writes `addr` as `me`'s replica endpoint in the map, if the store's
/// record says otherwise. Returns whether it committed.
pub async fn advertise(
    meta: &dyn MetaStore,
    me: NodeId,
    addr: Option<&str>,
) -> Result<bool, MetaError> {
    let map = meta.get_map().await?;
    let Some(node) = map.nodes.get(&me) else {
        return Err(MetaError::InvalidArgument(format!(
            "node {me} is not registered"
        )));
    };
    if node.replica_addr.as_deref() == addr {
        return Ok(false);
    }
    let mut node = node.clone();
    node.replica_addr = addr.map(str::to_string);
    meta.commit(MapTxn::unconditional(vec![MapChange::UpsertNode(node)]))
        .await?;
    tracing::info!(node = %me, replica_addr = ?addr, "replica endpoint advertised");
    Ok(true)
}

/// Longest wait between two attempts of [`keep_advertised`] after a failure.
const MAX_ADVERTISE_BACKOFF: Duration = Duration::from_secs(2);

/// Keeps this node's replica endpoint in the map: on every routing change
/// (and after a failed attempt, with back-off) where the map names another
/// value, writes it again ([`advertise`]).
pub async fn keep_advertised(shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
    let mut changes = shared.routing.subscribe();
    let mut backoff = Duration::from_millis(50);
    loop {
        let map = shared.routing.map();
        let wanted = shared.replica_addr.as_deref();
        let stale = map
            .nodes
            .get(&shared.me)
            .is_some_and(|n| n.replica_addr.as_deref() != wanted);
        if stale {
            match advertise(&*shared.meta, shared.me, wanted).await {
                Ok(_) => backoff = Duration::from_millis(50),
                Err(e) => {
                    tracing::warn!(%e, "cannot advertise the replica endpoint; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = shutdown.changed() => return,
                    }
                    backoff = (backoff * 2).min(MAX_ADVERTISE_BACKOFF);
                    continue;
                }
            }
        }
        tokio::select! {
            r = changes.changed() => if r.is_err() { return },
            _ = shutdown.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replica_listen_parses_and_prints_its_three_forms() {
        for text in ["auto", "off", "127.0.0.1:17001", "[::1]:6380"] {
            let r: ReplicaListen = text.parse().unwrap();
            assert_eq!(r.to_string(), text);
        }
        assert!("7001".parse::<ReplicaListen>().is_err());
        let listen: SocketAddr = "10.0.0.1:7001".parse().unwrap();
        assert_eq!(
            ReplicaListen::Auto.bind_addr(listen),
            Some("10.0.0.1:0".parse().unwrap())
        );
        assert_eq!(ReplicaListen::Off.bind_addr(listen), None);
    }

    #[test]
    fn an_explicit_address_must_not_be_another_listeners() {
        let listen: SocketAddr = "127.0.0.1:7001".parse().unwrap();
        let admin: SocketAddr = "127.0.0.1:8001".parse().unwrap();
        let at = |a: &str| ReplicaListen::At(a.parse().unwrap());
        assert!(at("127.0.0.1:7001").validate(listen, admin).is_err());
        assert!(at("127.0.0.1:8001").validate(listen, admin).is_err());
        assert!(at("127.0.0.1:17001").validate(listen, admin).is_ok());
        assert!(ReplicaListen::Auto.validate(listen, admin).is_ok());
    }

    #[test]
    fn the_advertised_address_takes_the_announced_host() {
        let bound: SocketAddr = "0.0.0.0:17001".parse().unwrap();
        assert_eq!(advertised_addr(bound, None), "0.0.0.0:17001");
        assert_eq!(
            advertised_addr(bound, Some("db1.example:7001")),
            "db1.example:17001"
        );
    }
}
