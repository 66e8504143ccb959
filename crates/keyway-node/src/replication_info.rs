//! INFO's `# Replication` section, built from the map and what this node
//! knows of its own copies, in Redis's field names.
//!
//! A Keyway node can be the primary of some partitions and a replica of
//! others, where a Redis node is one or the other. The section says
//! `role:master` when the node owns any partition (it accepts writes, as a
//! Redis master does) and `role:slave` only when it owns none but holds
//! replicas; the `keyway_replica_*` fields tell the replica side of a
//! mixed node. Fields Redis has but this node cannot know are left out
//! rather than invented: a replica's stream offset lives in its primary's
//! stream state, not in the map (`slaveN` lines carry `offset` only when
//! the caller knows the stream's acknowledged seq, never `lag`; a
//! `role:slave` node reports no `slave_repl_offset`).
//!
//! With a replica endpoint ([`crate::replica_endpoint`]) the two roles have
//! two addresses: INFO on the main address says `role:master` (its slaves
//! listed at their replica endpoints), on the replica endpoint
//! `role:slave` of the owner of the first partition it replicates. A node
//! without one keeps the single-address rule above.

use keyway_map::{DEFAULT_KEYSPACE, Epoch, NodeId, NodeState, PartitionId, PartitionMap};
use std::collections::BTreeMap;
use std::fmt::Write;

/// What the section is built from.
pub struct ReplicationView<'a> {
    pub map: &'a PartitionMap,
    pub me: NodeId,
    /// Asked on the replica endpoint: the section speaks for the replica role.
    pub replica_endpoint: bool,
    /// This node's last change-log seq (`master_repl_offset`: every write
    /// this node applied as a primary has a seq at or below it).
    pub last_seq: u64,
    /// Whether this node holds a valid replica read lease for the
    /// partition at that epoch (its primary's stream vouched for it lately).
    pub read_lease: &'a dyn Fn(PartitionId, Epoch) -> bool,
    /// The seq this node's stream to a replica node has acknowledged, when
    /// the stream is known (`slaveN:...,offset=`); `None` leaves it out.
    pub replica_offset: &'a dyn Fn(NodeId) -> Option<u64>,
}

const NO_REPLID: &str = "0000000000000000000000000000000000000000";

/// The `# Replication` section (header included, blank line after).
pub fn section(v: &ReplicationView<'_>) -> String {
    let map = v.map;
    let partitions: Vec<_> = map.keyspace_partitions(DEFAULT_KEYSPACE).collect();
    let has_endpoint = map
        .nodes
        .get(&v.me)
        .is_some_and(|n| n.replica_addr.is_some());
    // The role this address plays: the replica endpoint is a replica, a
    // main address with a replica endpoint beside it is a master; without
    // one, a node is a master when it owns any partition.
    let as_master = if v.replica_endpoint {
        false
    } else {
        has_endpoint || map.owned_by(v.me).next().is_some()
    };
    // Replica nodes of this node's partitions: in sync for every one of them?
    let mut slaves: BTreeMap<NodeId, bool> = BTreeMap::new();
    for p in map.owned_by(v.me) {
        for r in &p.replicas {
            let in_sync = p.is_in_sync_replica(*r);
            slaves
                .entry(*r)
                .and_modify(|all| *all &= in_sync)
                .or_insert(in_sync);
        }
    }
    slaves.retain(|id, _| map.nodes.get(id).is_some_and(|n| n.state == NodeState::Up));
    let held: Vec<_> = map
        .partitions
        .values()
        .filter(|p| p.replicas.contains(&v.me))
        .collect();
    let in_sync = held.iter().filter(|p| p.is_in_sync_replica(v.me)).count();
    let readable = held
        .iter()
        .filter(|p| p.is_in_sync_replica(v.me) && (v.read_lease)(p.id, p.epoch))
        .count();

    let mut out = String::from("# Replication\r\n");
    let first_master = partitions
        .iter()
        .find(|p| p.replicas.contains(&v.me))
        .map(|p| p.owner);
    match (as_master, first_master) {
        (false, master) => {
            let (host, port) = master
                .and_then(|m| map.nodes.get(&m))
                .map(|n| n.resp_host_port())
                .unwrap_or(("", 0));
            let of_master: Vec<_> = held.iter().filter(|p| Some(p.owner) == master).collect();
            let link_up = of_master
                .iter()
                .any(|p| p.is_in_sync_replica(v.me) && (v.read_lease)(p.id, p.epoch));
            let syncing = of_master.iter().any(|p| !p.is_in_sync_replica(v.me));
            let _ = write!(
                out,
                "role:slave\r\nmaster_host:{host}\r\nmaster_port:{port}\r\nmaster_link_status:{}\r\nmaster_sync_in_progress:{}\r\nslave_read_only:1\r\nreplica_announced:1\r\nconnected_slaves:0\r\nmaster_failover_state:no-failover\r\nmaster_replid:{}\r\nmaster_replid2:{NO_REPLID}\r\n",
                if link_up { "up" } else { "down" },
                u8::from(syncing),
                master.map_or_else(|| NO_REPLID.to_string(), |m| m.to_string()),
            );
        }
        _ => {
            let _ = write!(out, "role:master\r\nconnected_slaves:{}\r\n", slaves.len());
            for (i, (id, all_in_sync)) in slaves.iter().enumerate() {
                // A replica is listed at its replica endpoint, if it has one.
                let (host, port) = map
                    .nodes
                    .get(id)
                    .map(|n| n.replica_host_port().unwrap_or(n.resp_host_port()))
                    .unwrap_or(("", 0));
                let state = if *all_in_sync { "online" } else { "send_bulk" };
                let _ = write!(out, "slave{i}:ip={host},port={port},state={state}");
                if let Some(offset) = (v.replica_offset)(*id) {
                    let _ = write!(out, ",offset={offset}");
                }
                out.push_str("\r\n");
            }
            let _ = write!(
                out,
                "master_failover_state:no-failover\r\nmaster_replid:{}\r\nmaster_replid2:{NO_REPLID}\r\nmaster_repl_offset:{}\r\nsecond_repl_offset:-1\r\n",
                v.me, v.last_seq
            );
        }
    }
    let _ = write!(
        out,
        "keyway_primary_partitions:{}\r\nkeyway_replica_partitions:{}\r\nkeyway_replica_partitions_in_sync:{in_sync}\r\nkeyway_replica_partitions_readable:{readable}\r\n\r\n",
        map.owned_by(v.me).count(),
        held.len(),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyway_map::NodeInfo;

    fn nodes(n: u64) -> Vec<NodeInfo> {
        (1..=n)
            .map(|i| NodeInfo::up(NodeId(i), format!("127.0.0.1:{}", 7000 + i)))
            .collect()
    }

    fn field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
        text.split("\r\n")
            .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':')))
    }

    #[test]
    fn a_mixed_node_is_a_master_with_its_replicas_and_tells_its_replica_side() {
        // 3 nodes, RF 2: node 1 owns the first third, replicated on node 2;
        // node 3's third is replicated on node 1.
        let mut map = PartitionMap::bootstrap_replicated(&nodes(3), 1, 2).unwrap();
        let p3 = map.locate_slot(DEFAULT_KEYSPACE, 16383).unwrap().clone();
        assert_eq!(
            (p3.owner, p3.replicas.clone()),
            (NodeId(3), vec![NodeId(1)])
        );
        let lease = |pid: PartitionId, _e: Epoch| pid == p3.id;
        let offsets = |n: NodeId| (n == NodeId(2)).then_some(40);
        let v = ReplicationView {
            map: &map,
            me: NodeId(1),
            replica_endpoint: false,
            last_seq: 42,
            read_lease: &lease,
            replica_offset: &offsets,
        };
        let text = section(&v);
        assert_eq!(field(&text, "role"), Some("master"));
        assert_eq!(field(&text, "connected_slaves"), Some("1"));
        assert_eq!(
            field(&text, "slave0"),
            Some("ip=127.0.0.1,port=7002,state=online,offset=40")
        );
        assert_eq!(field(&text, "master_repl_offset"), Some("42"));
        assert_eq!(field(&text, "master_replid"), Some(&*NodeId(1).to_string()));
        assert_eq!(field(&text, "keyway_replica_partitions"), Some("1"));
        assert_eq!(
            field(&text, "keyway_replica_partitions_readable"),
            Some("1")
        );

        // Node 2 drops out of node 1's in-sync set: still connected, catching up.
        let p1 = map.locate_slot(DEFAULT_KEYSPACE, 0).unwrap().id;
        map.partitions.get_mut(&p1).unwrap().in_sync.clear();
        let unknown = |_: NodeId| None;
        let text = section(&ReplicationView {
            map: &map,
            me: NodeId(1),
            replica_endpoint: false,
            last_seq: 42,
            read_lease: &lease,
            replica_offset: &unknown,
        });
        assert_eq!(
            field(&text, "slave0"),
            Some("ip=127.0.0.1,port=7002,state=send_bulk")
        );
    }

    #[test]
    fn a_node_owning_nothing_is_a_slave_of_its_first_primary() {
        let mut map = PartitionMap::bootstrap_replicated(&nodes(2), 1, 2).unwrap();
        // Node 2 gives its partition to node 1 and keeps a replica of it.
        let ids: Vec<PartitionId> = map.partitions.keys().copied().collect();
        for id in ids {
            let p = map.partitions.get_mut(&id).unwrap();
            p.owner = NodeId(1);
            p.replicas = vec![NodeId(2)];
            p.in_sync = vec![NodeId(2)];
        }
        map.validate().unwrap();
        let no_lease = |_: PartitionId, _: Epoch| false;
        let v = ReplicationView {
            map: &map,
            me: NodeId(2),
            replica_endpoint: false,
            last_seq: 7,
            read_lease: &no_lease,
            replica_offset: &|_| None,
        };
        let text = section(&v);
        assert_eq!(field(&text, "role"), Some("slave"));
        assert_eq!(field(&text, "master_host"), Some("127.0.0.1"));
        assert_eq!(field(&text, "master_port"), Some("7001"));
        assert_eq!(field(&text, "master_link_status"), Some("down"));
        assert_eq!(field(&text, "master_sync_in_progress"), Some("0"));
        assert_eq!(field(&text, "master_repl_offset"), None);
        let lease = |_: PartitionId, _: Epoch| true;
        let text = section(&ReplicationView {
            read_lease: &lease,
            ..v
        });
        assert_eq!(field(&text, "master_link_status"), Some("up"));
        assert_eq!(
            field(&text, "keyway_replica_partitions_readable"),
            Some("2")
        );
    }

    #[test]
    fn with_replica_endpoints_the_main_address_is_a_master_and_the_endpoint_a_slave() {
        let mut map = PartitionMap::bootstrap_replicated(&nodes(3), 1, 2).unwrap();
        for n in map.nodes.values_mut() {
            n.replica_addr = Some(format!("127.0.0.1:{}", 17000 + n.id.0));
        }
        let lease = |_: PartitionId, _: Epoch| true;
        let main = ReplicationView {
            map: &map,
            me: NodeId(1),
            replica_endpoint: false,
            last_seq: 42,
            read_lease: &lease,
            replica_offset: &|_| None,
        };
        let text = section(&main);
        assert_eq!(field(&text, "role"), Some("master"));
        // Node 1's replica (node 2) is listed at its replica endpoint.
        assert_eq!(
            field(&text, "slave0"),
            Some("ip=127.0.0.1,port=17002,state=online")
        );
        let text = section(&ReplicationView {
            replica_endpoint: true,
            ..main
        });
        // Node 1 replicates node 3's range: its replica role's master.
        assert_eq!(field(&text, "role"), Some("slave"));
        assert_eq!(field(&text, "master_port"), Some("7003"));
        assert_eq!(field(&text, "master_link_status"), Some("up"));
        assert_eq!(field(&text, "master_replid"), Some(&*NodeId(3).to_string()));
    }
}
