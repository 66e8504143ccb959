//! `keyway ctl recovery`: re-replication at a glance, from the map and the
//! leases: the under-replicated partitions, the nodes without a lease and
//! what they still hold, and the copies in flight (replicas not yet in
//! sync on nodes holding a lease). With `--manager HOST:PORT` (the leading
//! manager's admin address) it adds the manager's own view
//! (`/status` → `replication.recovery`): the nodes dead past the grace, how
//! long each Down node still waits for it, the throttled partitions.

use crate::ctl::print_json;
use keyway_manager::replication::membership::wanted_copies;
use keyway_map::{NodeId, PartitionMap};
use keyway_meta::MetaStore;
use serde::Serialize;
use std::collections::BTreeSet;

#[derive(clap::Args, Debug)]
pub struct RecoveryArgs {
    /// The leading manager's admin address, for the grace wait and the
    /// throttled partitions (only the manager knows them).
    #[arg(long)]
    manager: Option<String>,
}

#[derive(Debug, PartialEq, Eq, Serialize)]
pub(crate) struct UnderReplicated {
    partition: u64,
    in_sync_copies: usize,
    wanted: usize,
    owner: String,
    /// Replicas on nodes without a lease.
    on_leaseless_nodes: Vec<String>,
}

#[derive(Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Leaseless {
    node: String,
    state: keyway_map::NodeState,
    primaries: usize,
    replicas: usize,
}

#[derive(Debug, PartialEq, Eq, Serialize)]
pub(crate) struct CopyInFlight {
    partition: u64,
    target: String,
}

#[derive(Debug, PartialEq, Serialize)]
pub(crate) struct Report {
    under_replicated: Vec<UnderReplicated>,
    leaseless_nodes: Vec<Leaseless>,
    copies_in_flight: Vec<CopyInFlight>,
    /// The manager's `replication.recovery` view, with `--manager`.
    manager: Option<serde_json::Value>,
}

/// The map-and-leases part of the report (pure).
pub(crate) fn report(map: &PartitionMap, leased: &BTreeSet<NodeId>) -> Report {
    let mut under = Vec::new();
    let mut in_flight = Vec::new();
    for p in map.partitions.values() {
        let wanted = wanted_copies(map, p);
        if p.in_sync_copies() < wanted {
            under.push(UnderReplicated {
                partition: p.id.0,
                in_sync_copies: p.in_sync_copies(),
                wanted,
                owner: p.owner.to_string(),
                on_leaseless_nodes: p
                    .replicas
                    .iter()
                    .filter(|r| !leased.contains(r))
                    .map(|r| r.to_string())
                    .collect(),
            });
        }
        for r in p
            .replicas
            .iter()
            .filter(|r| leased.contains(r) && !p.in_sync.contains(r))
        {
            in_flight.push(CopyInFlight {
                partition: p.id.0,
                target: r.to_string(),
            });
        }
    }
    // Fewest in-sync copies first, as the manager plans them.
    under.sort_by_key(|u| (u.in_sync_copies, u.partition));
    let leaseless = map
        .nodes
        .values()
        .filter(|n| !leased.contains(&n.id))
        .map(|n| Leaseless {
            node: n.id.to_string(),
            state: n.state,
            primaries: map.owned_by(n.id).count(),
            replicas: map
                .partitions
                .values()
                .filter(|p| p.replicas.contains(&n.id))
                .count(),
        })
        .collect();
    Report {
        under_replicated: under,
        leaseless_nodes: leaseless,
        copies_in_flight: in_flight,
        manager: None,
    }
}

pub async fn recovery_cmd(
    meta: &dyn MetaStore,
    args: RecoveryArgs,
    json: bool,
) -> anyhow::Result<()> {
    let map = meta.get_map().await?;
    let leased: BTreeSet<NodeId> = meta.leases().await?.iter().map(|l| l.node).collect();
    let mut r = report(&map, &leased);
    if let Some(addr) = &args.manager {
        let body = crate::ctl_split::http_get(addr, "/status").await?;
        let status: serde_json::Value = serde_json::from_str(&body)?;
        r.manager = status.pointer("/replication/recovery").cloned();
        anyhow::ensure!(
            r.manager.is_some(),
            "{addr}/status has no replication.recovery (not a keyway manager of this version?)"
        );
    }
    if json {
        return print_json(&r);
    }
    println!("under-replicated partitions: {}", r.under_replicated.len());
    for u in &r.under_replicated {
        println!(
            "  partition {:>5}  {}/{} in sync  primary {}  replicas without lease {:?}",
            u.partition, u.in_sync_copies, u.wanted, u.owner, u.on_leaseless_nodes
        );
    }
    println!("nodes without a lease: {}", r.leaseless_nodes.len());
    for n in &r.leaseless_nodes {
        println!(
            "  {}  {:?}  primary of {}  replica of {}",
            n.node, n.state, n.primaries, n.replicas
        );
    }
    println!(
        "copies in flight (replicas not yet in sync): {}",
        r.copies_in_flight.len()
    );
    for c in &r.copies_in_flight {
        println!("  partition {:>5} -> {}", c.partition, c.target);
    }
    if let Some(m) = &r.manager {
        println!("manager: dead past the grace {}", m["dead_nodes"]);
        if let Some(waits) = m["waiting_for_grace"].as_array() {
            for w in waits {
                println!(
                    "  node {} waits {} ms more for the grace ({} partitions with a copy)",
                    w["node"], w["left_ms"], w["partitions"]
                );
            }
        }
        println!(
            "  throttled {}  recovered replicas {}",
            m["throttled_partitions"], m["recovered_replicas"]
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyway_map::NodeInfo;

    #[test]
    fn the_report_lists_what_a_leaseless_node_leaves_behind() {
        let nodes: Vec<NodeInfo> = (1..=3)
            .map(|i| NodeInfo::up(NodeId(i), format!("127.0.0.1:{}", 7000 + i)))
            .collect();
        let mut map = PartitionMap::bootstrap_replicated(&nodes, 1, 2).unwrap();
        // Node 3 lost its lease; one replacement is in flight on node 1.
        let hit = map
            .partitions
            .values()
            .find(|p| p.owner != NodeId(3) && p.replicas.contains(&NodeId(3)))
            .unwrap()
            .id;
        let row = map.partitions.get_mut(&hit).unwrap();
        row.in_sync.clear();
        let leased: BTreeSet<NodeId> = [NodeId(1), NodeId(2)].into();
        let r = report(&map, &leased);
        assert_eq!(r.leaseless_nodes.len(), 1);
        assert_eq!(r.leaseless_nodes[0].node, NodeId(3).to_string());
        assert_eq!(r.leaseless_nodes[0].replicas, 1);
        let u: Vec<u64> = r.under_replicated.iter().map(|u| u.partition).collect();
        assert_eq!(u, [hit.0]);
        assert_eq!(
            r.under_replicated[0].on_leaseless_nodes,
            [NodeId(3).to_string()]
        );
        assert!(r.copies_in_flight.is_empty());
    }
}
