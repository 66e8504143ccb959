//! The planned switchover, caller side: ask a partition's primary to hand
//! primaryship to an in-sync replica (the node's `Switchover` Peer RPC: it
//! fences the partition, waits until the replica acked its last write,
//! CASes owner → replica at epoch + 1 with in_sync emptied, lifts the
//! fence). For `keyway ctl failover` and `keyway ctl drain`.
//!
//! The choice of replica is checked here against the map before the call
//! (only an in-sync replica, invariant 10); the primary checks it again
//! under its fence, and the CAS is conditional on `(primary, epoch)`.

use keyway_map::{Epoch, NodeId, PartitionId, PartitionMap, PartitionRecord};
use keyway_meta::{MetaError, MetaStore};
use keyway_peer::pb;
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// The default bound on the fence of one switchover, ms.
pub const DEFAULT_SWITCHOVER_TIMEOUT_MS: u64 = 5_000;
/// The longest accepted, ms.
pub const MAX_SWITCHOVER_TIMEOUT_MS: u64 = 60_000;

#[derive(thiserror::Error, Debug)]
pub enum SwitchoverError {
    #[error(transparent)]
    Meta(#[from] MetaError),
    #[error("partition {0} is not in the map")]
    UnknownPartition(PartitionId),
    #[error("partition {partition} has no in-sync replica to switch to (replicas {replicas:?})")]
    NoInSyncReplica {
        partition: PartitionId,
        replicas: Vec<u64>,
    },
    #[error(
        "node {node} is not an in-sync replica of partition {partition} (in sync: {in_sync:?}); \
         only an in-sync replica may become primary"
    )]
    NotInSync {
        partition: PartitionId,
        node: NodeId,
        in_sync: Vec<u64>,
    },
    #[error("the switchover timeout must be 1..={MAX_SWITCHOVER_TIMEOUT_MS} ms, got {0}")]
    BadTimeout(u64),
    #[error("primary node {node} of partition {partition}: {detail}")]
    Rpc {
        partition: PartitionId,
        node: NodeId,
        detail: String,
    },
}

/// What one switchover came to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SwitchoverOutcome {
    pub partition: PartitionId,
    pub from: NodeId,
    pub owner: NodeId,
    pub epoch: Epoch,
    /// How long the partition's requests were held, microseconds.
    pub paused_us: u64,
}

/// The in-sync replica of `p` to switch to: `to` if given (it must be in
/// sync), else the one with the fewest primaries in `map` that is not
/// draining (a draining one only if no other), lowest id on a tie.
pub fn choose_target(
    map: &PartitionMap,
    p: &PartitionRecord,
    to: Option<NodeId>,
) -> Result<NodeId, SwitchoverError> {
    let in_sync: Vec<u64> = p.in_sync.iter().map(|n| n.0).collect();
    if let Some(to) = to {
        if !p.is_in_sync_replica(to) {
            return Err(SwitchoverError::NotInSync {
                partition: p.id,
                node: to,
                in_sync,
            });
        }
        return Ok(to);
    }
    let mut primaries: BTreeMap<NodeId, usize> = BTreeMap::new();
    for q in map.partitions.values() {
        *primaries.entry(q.owner).or_default() += 1;
    }
    p.in_sync
        .iter()
        .copied()
        .min_by_key(|n| {
            let draining = map.nodes.get(n).is_none_or(|i| i.draining);
            (draining, primaries.get(n).copied().unwrap_or(0), *n)
        })
        .ok_or_else(|| SwitchoverError::NoInSyncReplica {
            partition: p.id,
            replicas: p.replicas.iter().map(|n| n.0).collect(),
        })
}

/// Switches `partition`'s primaryship to `to` (or the best in-sync replica).
pub async fn switchover(
    meta: &dyn MetaStore,
    partition: PartitionId,
    to: Option<NodeId>,
    timeout_ms: u64,
) -> Result<SwitchoverOutcome, SwitchoverError> {
    if timeout_ms == 0 || timeout_ms > MAX_SWITCHOVER_TIMEOUT_MS {
        return Err(SwitchoverError::BadTimeout(timeout_ms));
    }
    let map = meta.get_map().await?;
    let p = map
        .partitions
        .get(&partition)
        .ok_or(SwitchoverError::UnknownPartition(partition))?;
    let target = choose_target(&map, p, to)?;
    let from = p.owner;
    let rpc = |detail: String| SwitchoverError::Rpc {
        partition,
        node: from,
        detail,
    };
    let admin = map
        .nodes
        .get(&from)
        .map(|n| n.admin_addr.clone())
        .ok_or_else(|| rpc("not in the map".into()))?;
    let resp = call(
        &admin,
        pb::SwitchoverRequest {
            partition: partition.0,
            epoch: p.epoch.0,
            to: target.0,
            timeout_ms,
        },
        Duration::from_millis(timeout_ms) + RPC_SLACK,
    )
    .await
    .map_err(rpc)?;
    Ok(SwitchoverOutcome {
        partition,
        from,
        owner: NodeId(resp.owner),
        epoch: Epoch(resp.epoch),
        paused_us: resp.paused_us,
    })
}

/// Time allowed on top of the fence bound for the call itself.
const RPC_SLACK: Duration = Duration::from_secs(5);

async fn call(
    admin_addr: &str,
    req: pb::SwitchoverRequest,
    deadline: Duration,
) -> Result<pb::SwitchoverResponse, String> {
    let hostport = admin_addr
        .strip_prefix("http://")
        .unwrap_or(admin_addr)
        .trim_end_matches('/');
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{hostport}"))
        .map_err(|e| format!("bad admin address {admin_addr:?}: {e}"))?
        .connect_timeout(Duration::from_secs(2));
    let channel = keyway_auth::auth_channel(
        endpoint.connect_lazy(),
        keyway_auth::process_secret().as_ref(),
    );
    let mut client = pb::peer_client::PeerClient::new(channel);
    let mut request = tonic::Request::new(req);
    request.set_timeout(deadline);
    match tokio::time::timeout(deadline, client.switchover(request)).await {
        Ok(Ok(resp)) => Ok(resp.into_inner()),
        Ok(Err(status)) if status.code() == tonic::Code::Unauthenticated => Err(
            keyway_auth::refused_message("node", hostport, status.message()),
        ),
        Ok(Err(status)) => Err(format!("{:?}: {}", status.code(), status.message())),
        Err(_) => Err(format!("no answer within {deadline:?}")),
    }
}

/// Switches every partition `node` is primary of that has an in-sync
/// replica (the drain's first step). Partitions without one are left for
/// the rebalancer's moves. Returns each attempt's outcome, in partition order.
pub async fn switch_primaries_away(
    meta: &dyn MetaStore,
    node: NodeId,
    timeout_ms: u64,
) -> Result<Vec<(PartitionId, Result<SwitchoverOutcome, SwitchoverError>)>, MetaError> {
    let map = meta.get_map().await?;
    let mut out = Vec::new();
    for p in map.owned_by(node).filter(|p| !p.in_sync.is_empty()) {
        let r = switchover(meta, p.id, None, timeout_ms).await;
        out.push((p.id, r));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyway_map::NodeInfo;

    fn map() -> PartitionMap {
        let nodes: Vec<NodeInfo> = (1..=3)
            .map(|i| NodeInfo::up(NodeId(i), format!("127.0.0.1:{i}")))
            .collect();
        PartitionMap::bootstrap_replicated(&nodes, 1, 3).unwrap()
    }

    #[test]
    fn only_an_in_sync_replica_is_a_switchover_target() {
        let mut m = map();
        let p = m.owned_by(NodeId(1)).next().unwrap().id;
        m.partitions.get_mut(&p).unwrap().in_sync = vec![NodeId(3)];
        let row = m.partitions[&p].clone();
        assert_eq!(choose_target(&m, &row, None).unwrap(), NodeId(3));
        assert!(matches!(
            choose_target(&m, &row, Some(NodeId(2))),
            Err(SwitchoverError::NotInSync { .. })
        ));
        assert_eq!(choose_target(&m, &row, Some(NodeId(3))).unwrap(), NodeId(3));
        m.nodes.get_mut(&NodeId(3)).unwrap().draining = true;
        let mut row = m.partitions[&p].clone();
        row.in_sync = vec![NodeId(2), NodeId(3)];
        assert_eq!(
            choose_target(&m, &row, None).unwrap(),
            NodeId(2),
            "a draining replica only if no other"
        );
        row.in_sync.clear();
        assert!(matches!(
            choose_target(&m, &row, None),
            Err(SwitchoverError::NoInSyncReplica { .. })
        ));
    }

    #[tokio::test]
    async fn timeouts_are_checked_before_anything_is_asked() {
        let dir = tempfile::tempdir().unwrap();
        let meta = keyway_meta::EmbeddedMeta::open(dir.path(), Default::default()).unwrap();
        for t in [0, MAX_SWITCHOVER_TIMEOUT_MS + 1] {
            assert!(matches!(
                switchover(&meta, PartitionId(1), None, t).await,
                Err(SwitchoverError::BadTimeout(_))
            ));
        }
        assert!(matches!(
            switchover(&meta, PartitionId(1), None, 1_000).await,
            Err(SwitchoverError::UnknownPartition(_))
        ));
    }
}
